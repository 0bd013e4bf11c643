"""The native copy engine's settings on the GPU host (wall-time medians, ms).

1. ``stream.reduce`` of 2^24 float32 from pageable memory (the seed's case), every variant
   interleaved with the others and with ``np.sum(h)`` and ``cupy.asarray(h).sum()`` in each
   round (as ``bench_stream.py`` interleaves its peers): the Python copy threads
   (``COPY_ENGINE="python"``), and the native engine with its defaults, pieces of 1 and 4 MiB,
   without non-temporal stores, and with 6, 8 and 16 threads (the default: 12).
   The array is made as ``bench_stream.py`` makes it (``cupy.ndarray.get()``); 1b repeats a
   few variants on an array written by the CPU (NumPy's ``astype``).
2. Where one native 2^24 call's time goes (marks at the pipeline's steps).
3. A 1 GiB NumPy-chunked Dask array (16 chunks): ``stream.reduce`` under Dask, with and
   without non-temporal stores; the same chunks streamed by 16 plain threads without Dask
   (the pipeline's own rate); the Python engine; Dask's CPU ``x.sum()``.
4. 1 GiB and 4 GiB from pageable memory: Python threads against the native engine.

Usage: ``python scripts/diag_native.py [--rounds 40]``.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy as cp  # noqa: E402
from _benchutil import interleaved, patched, timed_calls  # noqa: E402

from multireduce import stream  # noqa: E402

MIB = 1 << 20


def variant(h, engine="native", piece=2 * MIB, threads=None, nt=True):
    """``stream.reduce(h)`` with these settings."""

    def call():
        with patched(stream, COPY_ENGINE=engine, NATIVE_PIECE_BYTES=piece, NATIVE_STREAMING_STORES=nt):
            return stream.reduce(h, "sum", threads=threads)

    return call


def table(samples: dict, nbytes: int) -> None:
    print(f"  {'variant':<26} {'median':>8} {'p10':>8} {'p90':>8} {'GB/s':>7}")
    for name, s in samples.items():
        q = statistics.quantiles(s, n=10, method="inclusive")
        med = statistics.median(s)
        print(f"  {name:<26} {med * 1e3:8.3f} {q[0] * 1e3:8.3f} {q[-1] * 1e3:8.3f} {nbytes / med / 1e9:7.1f}")


def phases(h, rounds=31) -> None:
    """Median time from the call's start to each step of one native call, between np.sum calls."""
    n = h.size
    pipeline = stream._cupy_pipeline(cp.cuda.Device().id, stream.make_plan(n * 4, 4).slot_bytes)
    device = pipeline.device
    marks: list[tuple[str, float]] = []
    wrapped = [
        (pipeline, "acquire_all"),
        (device, "host_ready"),
        (device, "cells"),
        (device, "stage_native"),
        (device, "reduce_to_cell"),
        (device, "wait_cell"),
    ]
    saved = []
    for obj, name in wrapped:
        real = getattr(obj, name)
        saved.append((obj, name, real))

        def wrapper(*a, _real=real, _name=name, **k):
            marks.append((f"{_name} in", time.perf_counter()))
            out = _real(*a, **k)
            marks.append((f"{_name} out", time.perf_counter()))
            return out

        setattr(obj, name, wrapper)
    rows: dict[str, list[float]] = {}

    def record(t0, t1):
        for i, (name, t) in enumerate(marks):
            rows.setdefault(f"{i:2d}: {name}", []).append((t - t0) * 1e3)
        rows.setdefault("returned", []).append((t1 - t0) * 1e3)

    try:
        timed_calls(
            lambda: stream.reduce(h, "sum"), rounds, between=lambda: np.sum(h), before=marks.clear, after=record
        )
    finally:
        for obj, name, _ in saved:
            delattr(obj, name)  # back to the class's method
    for name, values in rows.items():
        print(f"  {name:<26} {statistics.median(values[1:]):8.3f}")


def dask_case(sync, rounds=5) -> None:
    import threading

    import dask
    import dask.array as da

    from multireduce.ops import get_op

    n = (1 << 30) // 4
    y = cp.arange(n, dtype=cp.int64) % 1024
    h = y.astype(cp.float32).get()  # as bench_stream.py makes it
    del y
    want = float(np.sum(h, dtype=np.float64))
    x = da.from_array(h, chunks=n // 16)
    chunks = [h[i : i + n // 16] for i in range(0, n, n // 16)]
    op = get_op("sum")
    acc = np.dtype(np.float64)
    plan = stream.make_plan(h.nbytes, 4)
    pipeline = stream._cupy_pipeline(cp.cuda.Device().id, plan.slot_bytes)

    def plain_threads():
        parts = [None] * len(chunks)

        def run(i):
            parts[i] = pipeline.run_native(chunks[i], op, acc, plan, threads=1, group=1)

        ts = [threading.Thread(target=run, args=(i,)) for i in range(len(chunks))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return pipeline.device.finish([p for ps in parts for p in ps], op, np.dtype(np.float32))

    def no_nt(fn):
        def call():
            with patched(stream, NATIVE_STREAMING_STORES=False):
                return fn()

        return call

    with dask.config.set(scheduler="threads"):
        cases = {
            "stream.reduce(dask)": lambda: stream.reduce(x, "sum"),
            "stream.reduce(dask), no NT": no_nt(lambda: stream.reduce(x, "sum")),
            "16 plain threads": plain_threads,
            "python engine (dask)": variant(x, engine="python"),
            "dask-cpu x.sum()": lambda: x.sum().compute(),
        }
        for name, fn in cases.items():
            got = float(fn())
            assert got == want, (name, got, want)
        print(f"\n3. 1 GiB NumPy-chunked Dask array (16 chunks), {rounds} interleaved rounds")
        table(interleaved(cases, 1, rounds, sync), n * 4)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()
    sync = cp.cuda.Device().synchronize
    print("copy engine:", stream.copy_engine())
    print("default plan for 2^24 float32:", stream.make_plan(1 << 26, 4))

    n = 1 << 24
    y = cp.arange(n, dtype=cp.int64) % 1024
    h = y.astype(cp.float32).get()  # as bench_stream.py makes its arrays
    del y
    exact = float(np.sum(h, dtype=np.float64))
    cases = {"numpy": lambda: np.sum(h), "cupy.asarray+sum": lambda: cp.asarray(h).sum()}
    cases["python threads"] = variant(h, engine="python")
    cases["native (defaults)"] = variant(h)
    cases["native 1 MiB"] = variant(h, piece=MIB)
    cases["native 4 MiB"] = variant(h, piece=4 * MIB)
    cases["native, no NT"] = variant(h, nt=False)
    for threads in (6, 8, 16):
        cases[f"native, {threads} threads"] = variant(h, threads=threads)
    for name, fn in cases.items():
        if name not in ("numpy", "cupy.asarray+sum"):
            got = float(fn())
            assert got == exact, (name, got, exact)
    print(f"\n1. 2^24 float32 from pageable memory (made by cupy .get()), {args.rounds} interleaved rounds")
    table(interleaved(cases, 3, args.rounds, sync), n * 4)

    c = (np.arange(n, dtype=np.int64) % 1024).astype(np.float32)  # written by the CPU
    cpu_cases = {
        "numpy": lambda: np.sum(c),
        "python threads": variant(c, engine="python"),
        "native (defaults)": variant(c),
        "native, no NT": variant(c, nt=False),
    }
    print(f"\n1b. 2^24 float32 written by the CPU, {args.rounds} interleaved rounds")
    table(interleaved(cpu_cases, 3, args.rounds, sync), n * 4)

    print("\n2. One native 2^24 call (the cupy-made array), ms from the call's start (median of 30 calls)")
    phases(h)

    dask_case(sync)

    for gib in (1, 4):
        m = (gib << 30) // 4
        big = (np.arange(m, dtype=np.int64) % 1024).astype(np.float32)
        big_cases = {
            "python threads": variant(big, engine="python"),
            "native (defaults)": variant(big),
            "native 1 MiB": variant(big, piece=MIB),
            "native, no NT": variant(big, nt=False),
        }
        want = float(np.sum(big, dtype=np.float64))
        for name, fn in big_cases.items():
            assert float(fn()) == want, name
        print(f"\n4. {gib} GiB float32 from pageable memory, 5 interleaved rounds")
        table(interleaved(big_cases, 1, 5, sync), m * 4)
        del big
    stream.free_staging()


if __name__ == "__main__":
    main()
