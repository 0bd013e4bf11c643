"""Independent references for the tests: exact integers, math.fsum, and ulp helpers.

Nothing here calls multireduce or NumPy's reductions on the values under test.
"""

from __future__ import annotations

import math

import numpy as np


def exact_int_sum(x: np.ndarray, result: np.dtype) -> int:
    """The sum of integer/bool elements in Python integers, wrapped into ``result``."""
    total = sum(int(v) for v in x.ravel().tolist())
    bits = np.dtype(result).itemsize * 8
    total %= 1 << bits
    if np.dtype(result).kind == "i" and total >= 1 << (bits - 1):
        total -= 1 << bits
    return total


def float_sum(x: np.ndarray) -> float:
    """The correctly rounded float64 sum of the elements (math.fsum), with IEEE special
    values handled the way any summation order would produce them."""
    values = x.astype(np.float64).ravel().tolist()
    if any(math.isnan(v) for v in values):
        return math.nan
    pos_inf = any(v == math.inf for v in values)
    neg_inf = any(v == -math.inf for v in values)
    if pos_inf and neg_inf:
        return math.nan
    if pos_inf:
        return math.inf
    if neg_inf:
        return -math.inf
    return math.fsum(values)


def ulp(value: float, dtype) -> float:
    """The spacing of ``dtype`` at ``value``."""
    dt = np.dtype(dtype)
    return float(np.spacing(dt.type(abs(value)) if math.isfinite(value) else dt.type(0)))


def ieee_extreme(x: np.ndarray, largest: bool) -> float:
    """max/min with NaN propagation and -0.0 < +0.0, computed one element at a time."""
    values = x.astype(np.float64).ravel().tolist()
    if any(math.isnan(v) for v in values):
        return math.nan
    key = lambda v: (v, math.copysign(1.0, v))  # noqa: E731  -0.0 sorts below +0.0
    return max(values, key=key) if largest else min(values, key=key)


def same_float(a, b) -> bool:
    """Equal as floats, NaN equal to NaN, and the sign of zero must match."""
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def make_data(dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random test data of ``dtype``: full-range integers (so that integer sums wrap), and
    floats in [-1, 1) (float16 too, so that sums of a million stay finite)."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    return (rng.random(n) * 2 - 1).astype(dt)


def check(x: np.ndarray, op: str, got) -> None:
    """Assert that ``got`` (a NumPy scalar) is ``op`` over ``x`` within the error bound of
    multireduce's accumulation rules; see the README's accuracy notes."""
    dt = x.dtype
    if op == "sum":
        expected_dtype = np.dtype(np.uint64) if dt.kind == "u" else np.dtype(np.int64) if dt.kind in "bi" else dt
        assert got.dtype == expected_dtype, (got.dtype, expected_dtype)
        if dt.kind in "biu":
            assert int(got) == exact_int_sum(x, expected_dtype)
            return
        ref = float_sum(x)
        if not math.isfinite(ref):
            assert same_float(got, ref), (got, ref)
            return
        acc_eps = np.finfo(np.float32).eps if dt == np.float16 else np.finfo(np.float64).eps
        magnitude = math.fsum(abs(v) for v in x.astype(np.float64).ravel().tolist())
        n = x.size
        tol = acc_eps * magnitude * (math.log2(n + 1) + n / 50_000 + 1)
        largest = float(np.finfo(dt).max)
        if abs(ref) + tol >= largest:
            # Near or past the top of the range, rounding may overflow to infinity.
            assert float(got) == math.copysign(math.inf, ref) or abs(float(got) - ref) <= tol + ulp(largest, dt), (
                got,
                ref,
            )
            return
        tol += ulp(ref, dt)
        assert abs(float(got) - ref) <= tol, (float(got), ref, tol)
        if ref == 0:
            assert not math.copysign(1.0, float(got)) < 0, "a zero sum is +0.0, as in NumPy"
        return
    assert got.dtype == dt, (got.dtype, dt)
    if dt.kind in "biu":
        values = [int(v) for v in x.ravel().tolist()]
        assert int(got) == (max(values) if op == "max" else min(values))
        return
    assert same_float(got, ieee_extreme(x, largest=(op == "max"))), (got, x)


def run_in_threads(calls, timeout: float = 60.0) -> None:
    """Run each of ``calls`` (no-argument callables) on its own daemon thread; wait for all.

    Fails if a thread is still running ``timeout`` seconds after the start (a hang or
    deadlock), naming where each stuck thread and each ``multireduce-stream`` copy thread is;
    the threads are daemons, so the process still exits. Raises the first exception a call
    raised.
    """
    import sys
    import threading
    import time
    import traceback

    errors: list[BaseException] = []

    def guarded(call):
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=guarded, args=(c,), daemon=True) for c in calls]
    for w in workers:
        w.start()
    deadline = time.monotonic() + timeout
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    stuck = [w for w in workers if w.is_alive()]
    if stuck:
        frames = sys._current_frames()
        where = {
            t.name: "".join(traceback.format_stack(frames[t.ident])[-4:])
            for t in threading.enumerate()
            if t.ident in frames and (t in stuck or t.name.startswith("multireduce-stream"))
        }
        raise AssertionError(
            f"{len(stuck)} of {len(workers)} calls still running after {timeout} s (hang or deadlock): {where}"
        )
    if errors:
        raise errors[0]
