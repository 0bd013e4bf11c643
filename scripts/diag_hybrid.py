"""Pinning part of the input in place beside the staging copies: can the link get closer to full?

Streaming pageable memory stages it: each byte is read and written once more by the host (the
copy into pinned memory) before the DMA reads it, three passes over host memory, and the
numpy-chunked Dask case tops out at 36 GB/s with plain threads (bench_stream's 40 GB/s target
is out of reach with staging alone). ``cudaHostRegister`` pins pages in place, after which the
DMA reads them once, but one registration runs at a time, at about 34 GB/s
(``diag_register.py``). A mix could use both: registration lanes pin and upload some pieces
while staging threads copy the others, so that the host's memory carries fewer passes.

On a resident, page-aligned float32 array (default 1 GiB) cut into ``P``-MiB pieces that
threads take from one counter, every case checked against the exact sum:

``staged-S-P``       ``S`` threads, each piece through the native copy engine (one thread per
                     piece, as Dask's chunk tasks stream their chunks)
``hybrid-S-K-P``     ``S`` staging threads and ``K`` registration lanes: a lane registers a
                     piece read-only, uploads it from there (two device buffers, so that the
                     next piece registers while this one's DMA runs), reduces it, and
                     unregisters it once its DMA is done
``registered-K-P``   lanes only
``dense``            ``multireduce.stream.reduce`` of the whole array (the default path)

GB/s = bytes / median wall time over ``--repeat`` interleaved rounds (1 GB = 1e9 B).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _benchutil import exact_pattern_sum, interleaved, stats  # noqa: E402

MIB = 1 << 20
PAGE = 4096
READ_ONLY = 8  # cudaHostRegisterReadOnly


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)

    import cupy as cp

    from multireduce import _partials, stream
    from multireduce.ops import get_op

    rt = cp.cuda.runtime
    op = get_op("sum")
    acc = np.dtype(np.float64)
    n = int(args.gib * (1 << 30)) // 4
    raw = np.empty(n * 4 + PAGE, dtype=np.uint8)
    start = (-raw.ctypes.data) % PAGE
    a = raw[start : start + n * 4].view(np.float32)
    a[:] = np.arange(n, dtype=np.int64) % 1024
    exact = exact_pattern_sum(0, n)
    print(f"diag_hybrid: {a.nbytes / 2**30:.2f} GiB float32, page-aligned, engine {stream.copy_engine()['engine']}")

    def pieces(p_mib: int) -> list[tuple[int, int]]:
        per = p_mib * MIB // 4
        return [(i, min(per, n - i)) for i in range(0, n, per)]

    def staging_worker(plan, pipeline, todo, parts, lock):
        while True:
            with lock:
                if not todo:
                    return
                i, count = todo.pop(0)
            got = pipeline.run_native(a[i : i + count], op, acc, plan, threads=1, group=1)
            with lock:
                parts.extend(got)

    def lane_worker(todo, parts, lock, bufs, streams):
        pending = []  # (pointer, stream) registered, DMA queued, not yet unregistered
        k = 0
        try:
            while True:
                with lock:
                    if not todo:
                        break
                    i, count = todo.pop(0)
                nbytes = count * 4
                ptr = a.ctypes.data + i * 4
                rt.hostRegister(ptr, nbytes, READ_ONLY)
                s = streams[k % 2]
                buf = bufs[k % 2]
                # The buffer's previous piece: its DMA and kernel must be done before reuse.
                while pending and pending[0][1] is s:
                    old_ptr, old_s = pending.pop(0)
                    old_s.synchronize()
                    rt.hostUnregister(old_ptr)
                rt.memcpyAsync(buf.data.ptr, ptr, nbytes, rt.memcpyHostToDevice, s.ptr)
                with s:
                    view = buf[:nbytes].view(np.float32)
                    part = _partials.wrap(_partials.of_array(view, op, acc), count, s)
                with lock:
                    parts.append(part)
                pending.append((ptr, s))
                k += 1
        finally:
            for old_ptr, old_s in pending:
                old_s.synchronize()
                rt.hostUnregister(old_ptr)

    lane_buffers = {}

    def lane_state(j, p_mib):
        key = (j, p_mib)
        if key not in lane_buffers:
            lane_buffers[key] = (
                [cp.empty(p_mib * MIB, dtype=cp.uint8) for _ in range(2)],
                [cp.cuda.Stream(non_blocking=True) for _ in range(2)],
            )
        return lane_buffers[key]

    def case(s_threads: int, k_lanes: int, p_mib: int):
        plan = stream.make_plan(a.nbytes, 4, threads=max(1, s_threads))
        pipeline = stream._cupy_pipeline(0, plan.slot_bytes)

        def run():
            todo = pieces(p_mib)
            parts: list = []
            lock = threading.Lock()
            threads = [
                threading.Thread(target=staging_worker, args=(plan, pipeline, todo, parts, lock))
                for _ in range(s_threads)
            ]
            threads += [
                threading.Thread(target=lane_worker, args=(todo, parts, lock, *lane_state(j, p_mib)))
                for j in range(k_lanes)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            total = float(pipeline.device.finish(parts, op, np.dtype(np.float64)))
            if total != exact:
                raise AssertionError(f"sum {total} != exact {exact}")

        return run

    cases = {"dense": lambda: float(stream.reduce(a, "sum", dtype=np.float64))}
    for p_mib in (16, 64):
        for s in (8, 12, 16):
            cases[f"staged-{s}-{p_mib}"] = case(s, 0, p_mib)
        for k in (1, 2):
            cases[f"registered-{k}-{p_mib}"] = case(0, k, p_mib)
            for s in (4, 8, 12):
                cases[f"hybrid-{s}-{k}-{p_mib}"] = case(s, k, p_mib)
    for name, fn in cases.items():  # a first run of each, checked (errors name the case)
        t = time.perf_counter()
        try:
            fn()
        except Exception as exc:
            print(f"{name}: FAILED {type(exc).__name__}: {exc}")
            raise
        print(f"first run {name:18s} {(time.perf_counter() - t) * 1e3:8.2f} ms")
    samples = interleaved(cases, warmup=1, repeat=args.repeat, sync=cp.cuda.Device().synchronize)
    print(f"{'case':18s} {'median ms':>10s} {'p10':>8s} {'p90':>8s} {'GB/s':>7s}")
    for name, s in samples.items():
        st = stats(s)
        print(
            f"{name:18s} {st['median_ms']:10.2f} {st['p10_ms']:8.2f} {st['p90_ms']:8.2f} "
            f"{a.nbytes / (st['median_ms'] * 1e-3) / 1e9:7.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
