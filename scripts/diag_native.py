"""The native copy engine's settings on the GPU host (wall-time medians, ms).

1. ``stream.reduce`` of 2^24 float32 from pageable memory (the seed's case), every variant
   interleaved with the others and with ``np.sum(h)`` and ``cupy.asarray(h).sum()`` in each
   round (as ``bench_stream.py`` interleaves its peers): the Python copy threads
   (``COPY_ENGINE="python"``), and the native engine with pieces of 256 KiB to 4 MiB, with 4
   to 16 threads, and with non-temporal stores.
2. Where one native 2^24 call's time goes: entering the engine, the engine's call (copies and
   upload calls), the kernel launches, and the finish (final combine, wait, copy to host).
3. 1 GiB and 4 GiB from pageable memory: Python threads against the native engine with 1 and
   4 MiB pieces.

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
from _benchutil import interleaved  # noqa: E402

from multireduce import stream  # noqa: E402

MIB = 1 << 20


def variant(h, engine="native", piece=MIB, threads=None, nt=False):
    def call():
        saved = stream.COPY_ENGINE, stream.NATIVE_PIECE_BYTES, stream.NATIVE_STREAMING_STORES
        stream.COPY_ENGINE, stream.NATIVE_PIECE_BYTES, stream.NATIVE_STREAMING_STORES = engine, piece, nt
        try:
            return stream.reduce(h, "sum", threads=threads)
        finally:
            stream.COPY_ENGINE, stream.NATIVE_PIECE_BYTES, stream.NATIVE_STREAMING_STORES = saved

    return call


def table(samples: dict, nbytes: int) -> None:
    print(f"  {'variant':<26} {'median':>8} {'p10':>8} {'p90':>8} {'GB/s':>7}")
    for name, s in samples.items():
        q = statistics.quantiles(s, n=10)
        med = statistics.median(s)
        print(f"  {name:<26} {med * 1e3:8.3f} {q[0] * 1e3:8.3f} {q[-1] * 1e3:8.3f} {nbytes / med / 1e9:7.1f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()
    sync = cp.cuda.Device().synchronize
    print("copy engine:", stream.copy_engine())
    print("default plan for 2^24 float32:", stream.make_plan(1 << 26, 4))

    n = 1 << 24
    h = (np.arange(n, dtype=np.int64) % 1024).astype(np.float32)
    exact = float(np.sum(h, dtype=np.float64))
    cases = {"numpy": lambda: np.sum(h), "cupy.asarray+sum": lambda: cp.asarray(h).sum()}
    cases["python threads"] = variant(h, engine="python")
    for piece in (256 << 10, 512 << 10, MIB, 2 * MIB, 4 * MIB):
        cases[f"native {piece >> 10} KiB"] = variant(h, piece=piece)
    for threads in (4, 12, 16):
        cases[f"native 1 MiB, {threads} threads"] = variant(h, threads=threads)
    cases["native 1 MiB, NT stores"] = variant(h, nt=True)
    cases["native 4 MiB, NT stores"] = variant(h, piece=4 * MIB, nt=True)
    for name, fn in cases.items():
        if name not in ("numpy", "cupy.asarray+sum"):
            got = float(fn())
            assert got == exact, (name, got, exact)
    print(f"\n1. 2^24 float32 from pageable memory, {args.rounds} interleaved rounds")
    table(interleaved(cases, 3, args.rounds, sync), n * 4)

    print("\n2. One native 2^24 call, phases (median of 30 calls between np.sum calls; ms from the call)")
    marks: list[tuple[str, float]] = []
    device = stream._cupy_pipeline(cp.cuda.Device().id, stream.make_plan(n * 4, 4).slot_bytes).device
    real_stage, real_reduce, real_finish = device.stage_native, device.reduce, device.finish

    def stage(*a, **k):
        marks.append(("engine in", time.perf_counter()))
        real_stage(*a, **k)
        marks.append(("engine out", time.perf_counter()))

    def reduce(*a, **k):
        part = real_reduce(*a, **k)
        marks.append(("kernel launched", time.perf_counter()))
        return part

    def finish(*a, **k):
        marks.append(("finish in", time.perf_counter()))
        return real_finish(*a, **k)

    device.stage_native, device.reduce, device.finish = stage, reduce, finish
    rows: dict[str, list[float]] = {}
    try:
        for _ in range(31):
            np.sum(h)
            marks.clear()
            t0 = time.perf_counter()
            stream.reduce(h, "sum")
            t1 = time.perf_counter()
            for i, (name, t) in enumerate(marks):
                rows.setdefault(f"{i}: {name}", []).append((t - t0) * 1e3)
            rows.setdefault("returned", []).append((t1 - t0) * 1e3)
    finally:
        device.stage_native, device.reduce, device.finish = real_stage, real_reduce, real_finish
    for name, values in rows.items():
        print(f"  {name:<22} {statistics.median(values[1:]):8.3f}")

    for gib in (1, 4):
        m = (gib << 30) // 4
        big = (np.arange(m, dtype=np.int64) % 1024).astype(np.float32)
        big_cases = {
            "python threads": variant(big, engine="python"),
            "native 1 MiB": variant(big),
            "native 4 MiB": variant(big, piece=4 * MIB),
        }
        want = float(np.sum(big, dtype=np.float64))
        for name, fn in big_cases.items():
            assert float(fn()) == want, name
        print(f"\n3. {gib} GiB float32 from pageable memory, 5 interleaved rounds")
        table(interleaved(big_cases, 1, 5, sync), m * 4)
        del big
    stream.free_staging()


if __name__ == "__main__":
    main()
