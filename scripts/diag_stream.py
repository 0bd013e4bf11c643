"""Diagnose the pageable streaming path on the GPU host (wall-time medians).

1. The host copy alone: ``np.copyto`` of 64 MiB pageable -> pinned by 8 threads, in pieces of
   0.5-8 MiB (the copy rate bounds every pageable case).
2. ``stream.reduce`` of 2^24 float32 (the seed's case) for copy threads x pieces per thread,
   back to back and with ``np.sum`` and ``cupy.asarray(h).sum()`` of the same array in
   between (as ``bench_stream.py`` interleaves them); then the default after an idle pause as
   long as those peers, and after each peer alone.
3. One call's timeline: when each piece's upload was issued (copy threads) and each kernel
   launched (calling thread).
4. The one-buffer prototype (copy threads fill one pinned buffer, the caller uploads each
   finished piece, one kernel) and 1 GiB pageable for reference.
5. Write-combined staging buffers (``stream.WRITE_COMBINED``): the copy rate into them, and
   2^24 and 1 GiB through ``stream.reduce`` with them.
6. ``cudaMemcpy`` straight from pageable memory, 64 MiB split over 1-16 threads (one call
   each, so no Python per piece): does the driver's own staging scale with threads?
"""

import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy as cp  # noqa: E402
from _benchutil import median_time as med  # noqa: E402
from _benchutil import timed_calls  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce import stream  # noqa: E402

# These diagnostics study the Python copy threads; scripts/diag_native.py the native engine.
stream.COPY_ENGINE = "python"

print("affinity", len(os.sched_getaffinity(0)), "cpu_count", os.cpu_count())
print("default plan 64 MiB", stream.make_plan(1 << 26, 4))
print("default plan 1 GiB", stream.make_plan(1 << 30, 4))
n = 1 << 24
host = (np.arange(n, dtype=np.int64) % 1024).astype(np.float32)
exact = float(np.sum(host, dtype=np.float64))
mem = cp.cuda.alloc_pinned_memory(host.nbytes)
pinned = np.frombuffer(mem, dtype=np.float32, count=n)


def peers():
    np.sum(host)
    float(cp.asarray(host).sum())


# -- 1. the host copy alone --------------------------------------------------------------------
pool = ThreadPoolExecutor(8)
for piece_mib in (0.5, 1, 2, 4, 8):
    step = int(piece_mib * (1 << 20)) // 4
    bounds = [(i, min(i + step, n)) for i in range(0, n, step)]

    def copy(bounds=bounds):
        list(pool.map(lambda b: np.copyto(pinned[b[0] : b[1]], host[b[0] : b[1]]), bounds))

    t = med(copy, 9)
    rate = host.nbytes / t / 1e9
    print(f"copyto 64MiB pageable->pinned 8 threads pieces={piece_mib:4} MiB: {t * 1e3:7.3f} ms {rate:6.1f} GB/s")
pool.shutdown()

# -- 2. stream.reduce, threads x pieces per thread --------------------------------------------
default_ppt = stream.PIECES_PER_THREAD
for threads in (6, 8, 12):
    for ppt in (2, 4, 8):
        stream.PIECES_PER_THREAD = ppt
        assert float(stream.reduce(host, "sum", threads=threads)) == exact
        fn = lambda: float(stream.reduce(host, "sum", threads=threads))  # noqa: E731, B023
        t = med(fn)
        ti = med(fn, between=peers)
        print(
            f"stream.reduce 64MiB threads={threads:2d} pieces/thread={ppt}: back to back {t * 1e3:7.3f} ms, "
            f"between peers {ti * 1e3:7.3f} ms"
        )
stream.PIECES_PER_THREAD = default_ppt
t = med(lambda: float(stream.reduce(host, "sum")))
ti = med(lambda: float(stream.reduce(host, "sum")), between=peers)
print(f"stream.reduce 64MiB default {stream.make_plan(host.nbytes, 4)}:")
print(f"  back to back {t * 1e3:7.3f} ms, between peers {ti * 1e3:7.3f} ms")
t = med(lambda: float(stream.reduce(pinned, "sum")))
print(f"stream.reduce 64MiB pinned: {t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s")


# What between-call work costs: an idle pause of the same length as the peers' calls (the
# copy threads' CPUs go idle: wake-up latency) against numpy's and cupy's passes over the data.
t_peers = med(peers, 5)
for label, between in (
    ("nothing", None),
    (f"a {t_peers * 1e3:.0f} ms sleep", lambda: time.sleep(t_peers)),
    ("np.sum(host) only", lambda: np.sum(host)),
    ("cupy.asarray(host).sum() only", lambda: float(cp.asarray(host).sum())),
    ("both peers", peers),
):
    t = med(lambda: float(stream.reduce(host, "sum")), 21, between=between)
    print(f"stream.reduce 64MiB default after {label}: {t * 1e3:7.3f} ms")


# -- 3. one call's timeline ----------------------------------------------------------------------
def timeline(between=None) -> None:
    events = []
    real_upload, real_reduce = stream._CupyDevice.upload, stream._CupyDevice.reduce

    def upload(self, slot, nbytes, offset=0):
        t0 = time.perf_counter()
        real_upload(self, slot, nbytes, offset)
        events.append((f"upload {threading.get_ident() % 1000:3d}", t0, time.perf_counter()))

    def reduce(self, slot, dtype, count, op, acc):
        t0 = time.perf_counter()
        out = real_reduce(self, slot, dtype, count, op, acc)
        events.append(("kernel    ", t0, time.perf_counter()))
        return out

    stream._CupyDevice.upload, stream._CupyDevice.reduce = upload, reduce
    try:
        start, end = timed_calls(lambda: float(stream.reduce(host, "sum")), 3, between=between, before=events.clear)
    finally:
        stream._CupyDevice.upload, stream._CupyDevice.reduce = real_upload, real_reduce
    label = "between peers" if between else "back to back"
    print(f"timeline, default plan, {label}: total {1e3 * (end - start):.3f} ms (last of 3 calls; ms from its start)")
    for kind, t0, t1 in sorted(events, key=lambda e: e[1]):
        print(f"  {kind} {1e3 * (t0 - start):7.3f} -> {1e3 * (t1 - start):7.3f}")
    print(f"  after the last event: {1e3 * (end - max(e[2] for e in events)):.3f} ms")


timeline()
timeline(between=peers)

# -- 4. references -------------------------------------------------------------------------------
dev = cp.empty(n, cp.float32)
s_one = cp.cuda.Stream(non_blocking=True)


def one_buffer(pool, pieces: int) -> float:
    bounds = np.linspace(0, n, pieces + 1).astype(np.int64)
    done: queue.SimpleQueue = queue.SimpleQueue()

    def copy(i):
        a, b = bounds[i], bounds[i + 1]
        np.copyto(pinned[a:b], host[a:b])
        done.put(i)

    for i in range(pieces):
        pool.submit(copy, i)
    for _ in range(pieces):
        i = done.get()
        a, b = int(bounds[i]), int(bounds[i + 1])
        dev[a:b].data.copy_from_host_async(pinned[a:].ctypes.data, (b - a) * 4, s_one)
    with s_one:
        r = mr.sum(dev)
    return float(r)


proto_pool = ThreadPoolExecutor(8)
assert one_buffer(proto_pool, 16) == exact
t = med(lambda: one_buffer(proto_pool, 16))
print(f"prototype one pinned buffer threads=8 pieces=16: {t * 1e3:7.3f} ms")
proto_pool.shutdown()


def h2d():
    dev.data.copy_from_host_async(pinned.ctypes.data, host.nbytes, s_one)
    s_one.synchronize()


t = med(h2d)
print(f"raw H2D pinned 64MiB: {t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s")
big = (np.arange(1 << 28, dtype=np.int64) % 1024).astype(np.float32)
for threads in (None, 16):
    t = med(lambda: float(stream.reduce(big, "sum", threads=threads)), 5)  # noqa: B023
    print(f"stream.reduce 1GiB pageable threads={threads}: {t * 1e3:7.3f} ms {big.nbytes / t / 1e9:6.1f} GB/s")


# -- 5. write-combined staging ---------------------------------------------------------------------
wc_mem = cp.cuda.PinnedMemoryPointer(cp.cuda.PinnedMemory(host.nbytes, cp.cuda.runtime.hostAllocWriteCombined), 0)
wc = np.frombuffer(wc_mem, dtype=np.float32, count=n)
pool = ThreadPoolExecutor(8)
for dst, label in ((pinned, "pinned"), (wc, "write-combined")):
    for piece_mib in (2, 4, 8):
        step = (piece_mib << 20) // 4
        bounds = [(i, min(i + step, n)) for i in range(0, n, step)]

        def copy(bounds=bounds, dst=dst):
            list(pool.map(lambda b: np.copyto(dst[b[0] : b[1]], host[b[0] : b[1]]), bounds))

        t = med(copy, 9)
        rate = host.nbytes / t / 1e9
        print(f"copyto 64MiB pageable->{label} 8 threads pieces={piece_mib} MiB: {t * 1e3:7.3f} ms {rate:6.1f} GB/s")
pool.shutdown()
for flag in (False, True, False, True):
    stream.free_staging()
    stream.WRITE_COMBINED = flag
    assert float(stream.reduce(host, "sum")) == exact
    t = med(lambda: float(stream.reduce(host, "sum")))
    ti = med(lambda: float(stream.reduce(host, "sum")), between=peers)
    tb = med(lambda: float(stream.reduce(big, "sum")), 5)
    print(
        f"WRITE_COMBINED={flag!s:5}: 64MiB back to back {t * 1e3:7.3f} ms, between peers {ti * 1e3:7.3f} ms; "
        f"1GiB {tb * 1e3:7.3f} ms {big.nbytes / tb / 1e9:6.1f} GB/s"
    )
stream.free_staging()
stream.WRITE_COMBINED = False

# -- 6. cudaMemcpy from pageable memory, several threads ------------------------------------------
rt = cp.cuda.runtime
for threads in (1, 2, 4, 8, 16):
    pool = ThreadPoolExecutor(threads)
    step = n // threads

    def pageable(pool=pool, step=step, threads=threads):
        def one(i):
            rt.memcpy(dev.data.ptr + i * step * 4, host.ctypes.data + i * step * 4, step * 4, rt.memcpyHostToDevice)

        list(pool.map(one, range(threads)))

    t = med(pageable, 9)
    rate = host.nbytes / t / 1e9
    print(f"cudaMemcpy 64MiB pageable->device {threads:2d} threads: {t * 1e3:7.3f} ms {rate:6.1f} GB/s")
    pool.shutdown()
