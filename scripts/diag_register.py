"""Can pageable memory be pinned in place fast enough to skip the host copy? (GPU host, wall time.)

``cudaHostRegister`` pins the pages of an existing allocation, after which the GPU's copy
engine reads them directly (no ``np.copyto`` into a staging buffer, no copy threads). This
measures, on resident (already touched) NumPy memory:

1. register and unregister time for 4-256 MiB, flags 0 and read-only (where supported),
   page-aligned and not;
2. the link's rate from registered memory;
3. the seed's case end to end (2^24 float32: register, copy, reduce, unregister), whole and
   in 8 pipelined chunks, back to back and between ``np.sum`` and ``cupy.asarray(h).sum()``;
4. registration from 1-8 threads at once (does pinning scale?).
"""

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy as cp  # noqa: E402
from _benchutil import median_time  # noqa: E402

import multireduce as mr  # noqa: E402

rt = cp.cuda.runtime
MIB = 1 << 20
READ_ONLY = 8  # cudaHostRegisterReadOnly
try:
    ro_ok = bool(rt.deviceGetAttribute(rt.cudaDevAttrReadOnlyHostRegisterSupported, 0))
except AttributeError:
    ro_ok = bool(rt.deviceGetAttribute(113, 0))
print("read-only registration supported:", ro_ok)
print("pageable memory access:", rt.deviceGetAttribute(88, 0), "(cudaDevAttrPageableMemoryAccess)")
try:
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
except OSError:
    thp = "unknown"
print("transparent hugepages:", thp)


flag_sets = [0, READ_ONLY] if ro_ok else [0]
for mib in (4, 16, 64, 256):
    a = np.ones(mib * MIB // 4, dtype=np.float32)
    for offset_label, view in (("aligned?", a), ("offset 4 B", a[1:])):
        ptr, nbytes = view.ctypes.data, view.nbytes
        for flags in flag_sets:
            regs, unregs = [], []
            try:
                for _ in range(7):
                    t0 = time.perf_counter()
                    rt.hostRegister(ptr, nbytes, flags)
                    t1 = time.perf_counter()
                    rt.hostUnregister(ptr)
                    t2 = time.perf_counter()
                    regs.append(t1 - t0)
                    unregs.append(t2 - t1)
            except rt.CUDARuntimeError as exc:
                print(f"register {mib:4d} MiB ({offset_label}) flags={flags}: failed: {exc}")
                continue
            r, u = statistics.median(regs), statistics.median(unregs)
            print(
                f"register {mib:4d} MiB ({offset_label:10s} ptr % 4096 = {ptr % 4096:4d}) flags={flags}: "
                f"register {r * 1e3:7.3f} ms ({nbytes / r / 1e9:6.1f} GB/s), unregister {u * 1e3:7.3f} ms"
            )
    del a

n = 1 << 24
host = (np.arange(n, dtype=np.int64) % 1024).astype(np.float32)
exact = float(np.sum(host, dtype=np.float64))
dev = cp.empty(n, cp.float32)
s = cp.cuda.Stream(non_blocking=True)

rt.hostRegister(host.ctypes.data, host.nbytes, 0)


def h2d():
    rt.memcpyAsync(dev.data.ptr, host.ctypes.data, host.nbytes, rt.memcpyHostToDevice, s.ptr)
    s.synchronize()


t = median_time(h2d, 9)
print(f"H2D from registered 64 MiB: {t * 1e3:.3f} ms {host.nbytes / t / 1e9:.1f} GB/s")
rt.hostUnregister(host.ctypes.data)


def whole():
    ptr = host.ctypes.data
    rt.hostRegister(ptr, host.nbytes, 0)
    try:
        rt.memcpyAsync(dev.data.ptr, ptr, host.nbytes, rt.memcpyHostToDevice, s.ptr)
        with s:
            r = float(mr.sum(dev))
    finally:
        rt.hostUnregister(ptr)
    return r


def chunked(k=8, flags=0):
    ptr, step = host.ctypes.data, host.nbytes // k
    done = []
    try:
        for i in range(k):
            rt.hostRegister(ptr + i * step, step, flags)
            done.append(ptr + i * step)
            rt.memcpyAsync(dev.data.ptr + i * step, ptr + i * step, step, rt.memcpyHostToDevice, s.ptr)
        with s:
            r = float(mr.sum(dev))
    finally:
        for p in done:
            rt.hostUnregister(p)
    return r


def peers():
    np.sum(host)
    float(cp.asarray(host).sum())


assert whole() == exact and chunked() == exact
for label, fn in (("whole", whole), ("8 chunks", chunked), ("16 chunks", lambda: chunked(16))):
    t = median_time(fn, 9)
    ti = median_time(fn, 9, between=peers)
    print(f"seed case registered in place, {label:9s}: back to back {t * 1e3:.3f} ms, between peers {ti * 1e3:.3f} ms")

for threads in (1, 2, 4, 8):
    pool = ThreadPoolExecutor(threads)
    step = host.nbytes // threads

    def reg_all(pool=pool, step=step, threads=threads):
        ptrs = [host.ctypes.data + i * step for i in range(threads)]
        list(pool.map(lambda p: rt.hostRegister(p, step, 0), ptrs))
        list(pool.map(rt.hostUnregister, ptrs))

    t = median_time(reg_all, 9)
    print(f"register + unregister 64 MiB from {threads} threads: {t * 1e3:.3f} ms")
    pool.shutdown()
