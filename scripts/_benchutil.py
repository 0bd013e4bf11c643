"""Helpers shared by the wall-clock benchmarks (bench_dask.py, bench_stream.py) and diagnostics."""

from __future__ import annotations

import contextlib
import statistics
import time


def exact_pattern_sum(start: int, n: int) -> int:
    """The exact sum of ``(start + i) % 1024`` for i in [0, n): the benchmarks' test data."""

    def upto(m: int) -> int:  # sum of k % 1024 for k in [0, m)
        full, rest = divmod(m, 1024)
        return full * (1023 * 1024 // 2) + rest * (rest - 1) // 2

    return upto(start + n) - upto(start)


def stats(samples: list[float]) -> dict:
    """Median, p10, p90 and min of wall-clock samples in seconds, as milliseconds.

    The deciles interpolate between samples ("inclusive"): with few samples the default
    method extrapolated past the smallest and largest one.
    """
    s = sorted(samples)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) >= 2 else [s[0]] * 9
    return {"median_ms": statistics.median(s) * 1e3, "p10_ms": q[0] * 1e3, "p90_ms": q[-1] * 1e3, "min_ms": s[0] * 1e3}


def interleaved(cases: dict, warmup: int, repeat: int, sync) -> dict[str, list[float]]:
    """Time every case once per round, round after round, so that drift hits all alike."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
            sync()
    samples = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            sync()
            t = time.perf_counter()
            fn()
            sync()
            samples[name].append(time.perf_counter() - t)
    return samples


def median_time(fn, k: int = 15, between=None) -> float:
    """Median wall time of ``fn()`` in seconds over ``k`` calls after one warm-up call.

    ``between()``, if given, runs before each timed call, untimed (other work in between, as
    the interleaved benchmarks have).
    """
    fn()
    ts = []
    for _ in range(k):
        if between is not None:
            between()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


@contextlib.contextmanager
def patched(target, **values):
    """Set attributes of ``target`` (a module's settings, say) for the ``with`` block only."""
    saved = {name: getattr(target, name) for name in values}
    for name, value in values.items():
        setattr(target, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(target, name, value)


def timed_calls(fn, calls: int, *, between=None, before=None, after=None) -> tuple[float, float]:
    """Call ``fn()`` ``calls`` times and return the last call's (start, end) ``perf_counter`` times.

    Before each call ``between()`` runs (other work, untimed), then ``before()`` (reset the
    caller's records); after it, ``after(start, end)`` (read them).
    """
    start = end = 0.0
    for _ in range(calls):
        if between is not None:
            between()
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        if after is not None:
            after(start, end)
    return start, end
