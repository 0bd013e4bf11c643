"""Where one ``treereduce("sum").compute()`` of a CuPy-backed Dask array spends its host time.

4 GiB of float32 in 16 chunks (as ``scripts/bench_dask.py``), made on the GPU. Prints the wall
time of the graph build, of ``compute()`` of a prebuilt graph under the synchronous and the
threaded scheduler, and of the pieces of a chunk task run by hand (the getter's slice, the
core's kernel launch, the partial's event), then a cProfile of 200 synchronous computes.
"""

import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy  # noqa: E402
import dask  # noqa: E402
import dask.array as da  # noqa: E402

import multireduce.dask  # noqa: E402, F401
from multireduce import _partials, core  # noqa: E402
from multireduce.ops import get_op  # noqa: E402


def per_call(fn, k=200):
    for _ in range(20):
        fn()
    ts = []
    for _ in range(k):
        t = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


n = (1 << 30) // 16 * 16
x = cupy.arange(n, dtype=cupy.float32)
d = da.from_array(x, chunks=n // 16, asarray=False)
p = d.treereduce("sum")
op = get_op("sum")
acc = np.dtype(np.float64)
chunk = x[: n // 16]
print(f"{'build':<28} {per_call(lambda: d.treereduce('sum')):8.3f} ms")
print(f"{'compute prebuilt, sync':<28} {per_call(lambda: p.compute(scheduler='sync')):8.3f} ms")
print(f"{'compute prebuilt, threads':<28} {per_call(lambda: p.compute(scheduler='threads')):8.3f} ms")
with dask.config.set({"optimization.fuse.active": False}):
    t = per_call(lambda: p.compute(scheduler="sync"))
print(f"{'compute prebuilt, sync, no fuse':<28} {t:8.3f} ms")
print(f"{'16 x slice':<28} {per_call(lambda: [x[i * (n // 16) : (i + 1) * (n // 16)] for i in range(16)]):8.3f} ms")
print(f"{'16 x core.partial':<28} {per_call(lambda: [core.partial(chunk, op) for _ in range(16)]):8.3f} ms")


def wrapped():
    return [_partials.wrap(_partials.of_array(chunk, op, acc), 1) for _ in range(16)]


print(f"{'16 x of_array + wrap':<28} {per_call(wrapped):8.3f} ms")
parts = [_partials.wrap(_partials.of_array(chunk, op, acc), 1) for _ in range(16)]
print(f"{'finalize 16 partials':<28} {per_call(lambda: _partials.finalize(parts, op, np.dtype(np.float32))):8.3f} ms")
prof = cProfile.Profile()
prof.enable()
for _ in range(200):
    p.compute(scheduler="sync")
prof.disable()
text = io.StringIO()
pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
print("--- cProfile: 200 x compute(scheduler='sync'), by own time")
print(text.getvalue())
