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
for threads in (1, 2, 4, 8, 12, 16):
    t = med(lambda: float(stream.reduce(host, "sum", threads=threads)))  # noqa: B023
    print(f"stream.reduce 64MiB pageable threads={threads:2d}: {t * 1e3:7.3f} ms {host.nbytes / t / 1e9:6.1f} GB/s")
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
