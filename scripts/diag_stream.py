"""Diagnose the pageable streaming path: CPU affinity, parallel copy rate into pinned memory,
and stream.reduce of 2^24 float32 with 1..16 copy threads (wall time, medians)."""

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy as cp  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce import stream  # noqa: E402

print(
    "affinity", len(os.sched_getaffinity(0)), "cpu_count", os.cpu_count(), "default plan", stream.make_plan(1 << 26, 4)
)
n = 1 << 24
host = (np.arange(n, dtype=np.int64) % 1024).astype(np.float32)
mem = cp.cuda.alloc_pinned_memory(host.nbytes)
pinned = np.frombuffer(mem, dtype=np.float32, count=n)
big = np.ones(1 << 28, np.float32)
bigp = np.frombuffer(cp.cuda.alloc_pinned_memory(big.nbytes), dtype=np.float32, count=big.size)


def med(fn, k=15):
    fn()
    ts = []
    for _ in range(k):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


for threads in (1, 2, 4, 8, 12, 16):
    pool = ThreadPoolExecutor(threads)
    for src, dst, label in ((host, pinned, "64MiB"), (big, bigp, "1GiB")):
        parts = np.array_split(np.arange(src.size), threads)

        def copy(src=src, dst=dst, parts=parts, pool=pool):
            list(pool.map(lambda p: np.copyto(dst[p[0] : p[-1] + 1], src[p[0] : p[-1] + 1]), parts))

        t = med(copy, 5)
        print(
            f"copyto pageable->pinned {label} threads={threads:2d}: {t * 1e3:8.3f} ms {src.nbytes / t / 1e9:6.1f} GB/s"
        )
    pool.shutdown()
for threads in (1, 2, 4, 6, 8, 12, 16):
    t = med(lambda: float(stream.reduce(host, "sum", threads=threads)))  # noqa: B023
    print(f"stream.reduce 64MiB pageable threads={threads:2d}: {t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s")
for threads, slot in ((4, 4 << 20), (6, 4 << 20), (8, 4 << 20), (8, 2 << 20), (12, 2 << 20), (16, 2 << 20)):
    t = med(lambda: float(stream.reduce(host, "sum", threads=threads, slot_bytes=slot)))  # noqa: B023
    print(
        f"stream.reduce 64MiB pageable threads={threads:2d} slot={slot >> 20} MiB: "
        f"{t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s"
    )
print(f"stream.reduce 64MiB pageable default plan {stream.make_plan(host.nbytes, 4)}")
t = med(lambda: float(stream.reduce(host, "sum")))
print(f"stream.reduce 64MiB pageable default: {t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s")
big_pageable = (np.arange(1 << 28, dtype=np.int64) % 1024).astype(np.float32)
for threads in (8, 12, 16):
    t = med(lambda: float(stream.reduce(big_pageable, "sum", threads=threads)), 5)  # noqa: B023
    rate = big_pageable.nbytes / t / 1e9
    print(f"stream.reduce 1GiB pageable threads={threads:2d}: {t * 1e3:7.3f} ms {rate:6.1f} GB/s")


def registered():
    # Page-lock the pageable array in place, copy it over the link, unlock it.
    rt = cp.cuda.runtime
    rt.hostRegister(host.ctypes.data, host.nbytes, 0)
    try:
        dev.data.copy_from_host_async(host.ctypes.data, host.nbytes, s_reg)
        r = mr.sum(dev)
        s_reg.synchronize()
    finally:
        rt.hostUnregister(host.ctypes.data)
    return float(r)


dev = cp.empty(n, cp.float32)
s_reg = cp.cuda.Stream(non_blocking=True)
try:
    with s_reg:
        t = med(registered)
    print(f"hostRegister+H2D+sum+unregister 64MiB: {t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s")
except Exception as exc:  # a diagnostic: report and go on
    print(f"hostRegister path failed: {exc!r}")
t = med(lambda: float(stream.reduce(pinned, "sum")))
print(f"stream.reduce 64MiB pinned: {t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s")
t = med(lambda: float(cp.asarray(host).sum()))
print(f"cupy.asarray(h).sum() 64MiB: {t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s")
d = cp.empty(n, cp.float32)
s = cp.cuda.Stream(non_blocking=True)


def h2d():
    d.data.copy_from_host_async(pinned.ctypes.data, host.nbytes, s)
    s.synchronize()


t = med(h2d)
print(f"raw H2D pinned 64MiB: {t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s")


# -- where one 64 MiB call's time goes -------------------------------------------------------
def timeline(threads: int) -> None:
    """One stream.reduce call with each upload and kernel launch (calling thread) timed."""
    events = []
    real_upload, real_reduce = stream._CupyDevice.upload, stream._CupyDevice.reduce

    def upload(self, slot, nbytes, offset=0):
        t0 = time.perf_counter()
        real_upload(self, slot, nbytes, offset)
        events.append(("upload", t0, time.perf_counter()))

    def reduce(self, slot, dtype, count, op, acc):
        t0 = time.perf_counter()
        out = real_reduce(self, slot, dtype, count, op, acc)
        events.append(("kernel", t0, time.perf_counter()))
        return out

    stream._CupyDevice.upload, stream._CupyDevice.reduce = upload, reduce
    try:
        for _ in range(3):
            events.clear()
            start = time.perf_counter()
            float(stream.reduce(host, "sum", threads=threads))
            end = time.perf_counter()
    finally:
        stream._CupyDevice.upload, stream._CupyDevice.reduce = real_upload, real_reduce
    print(f"timeline threads={threads}: total {1e3 * (end - start):.3f} ms (last of 3 calls; ms from the call's start)")
    for kind, t0, t1 in sorted(events, key=lambda e: e[1]):
        print(f"  {kind:6s} {1e3 * (t0 - start):7.3f} -> {1e3 * (t1 - start):7.3f}")
    print(f"  after the last event: {1e3 * (end - max(e[2] for e in events)):.3f} ms")


def one_buffer(threads: int, pieces: int) -> float:
    """Prototype: copy threads fill one pinned buffer; the caller uploads each finished piece on
    one stream, then one reduction of the whole device buffer."""
    bounds = np.linspace(0, n, pieces + 1).astype(np.int64)
    done: queue.SimpleQueue = queue.SimpleQueue()

    def copy(i):
        a, b = bounds[i], bounds[i + 1]
        np.copyto(pinned[a:b], host[a:b])
        done.put(i)

    for i in range(pieces):
        proto_pool.submit(copy, i)
    for _ in range(pieces):
        i = done.get()
        a, b = int(bounds[i]), int(bounds[i + 1])
        dev[a:b].data.copy_from_host_async(pinned[a:].ctypes.data, (b - a) * 4, s_reg)
    with s_reg:
        r = mr.sum(dev)
    return float(r)


import queue  # noqa: E402

for threads in (4, 8, 12):
    timeline(threads)
for threads, pieces in ((8, 8), (8, 16), (8, 32), (12, 24), (16, 32)):
    proto_pool = ThreadPoolExecutor(threads)
    assert one_buffer(threads, pieces) == float(np.sum(host, dtype=np.float64))
    t = med(lambda: one_buffer(threads, pieces))  # noqa: B023
    print(f"prototype one pinned buffer threads={threads:2d} pieces={pieces:2d}: {t * 1e3:7.3f} ms")
    proto_pool.shutdown()
