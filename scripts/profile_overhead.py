"""Where the host time of a tiny GPU reduction goes: cProfile of ``float(multireduce.sum(x))``
and ``multireduce.sum(x)`` against ``cupy.sum`` on 1024 float32 (per-call means and the top
functions by internal time)."""

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy as cp  # noqa: E402

import multireduce as mr  # noqa: E402

x = cp.random.default_rng(0).random(1024, dtype=cp.float32)
cases = {
    "float(mr.sum(x))": lambda: float(mr.sum(x)),
    "float(cp.sum(x))": lambda: float(cp.sum(x)),
    "mr.sum(x)": lambda: mr.sum(x),
    "cp.sum(x)": lambda: cp.sum(x),
    "cp.empty(())": lambda: cp.empty((), cp.float32),
    "x.get()": lambda: x[:1].get(),
}
for name, fn in cases.items():
    for _ in range(2000):
        fn()
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(5000):
            fn()
        cp.cuda.Device().synchronize()
        best = min(best, (time.perf_counter() - t) / 5000 * 1e6)
    print(f"{name:<20} {best:7.2f} us per call (best of 5 x 5000)")
for name in ("mr.sum(x)", "cp.sum(x)"):
    prof = cProfile.Profile()
    fn = cases[name]
    prof.enable()
    for _ in range(20000):
        fn()
    prof.disable()
    cp.cuda.Device().synchronize()
    print(f"--- {name}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)

# The host part of multireduce.stats on a GPU array (2^20 float32): where it goes.
y = cp.random.default_rng(1).standard_normal(1 << 20, dtype=cp.float32)
for _ in range(200):
    mr.stats(y)
prof = cProfile.Profile()
prof.enable()
for _ in range(2000):
    mr.stats(y)
prof.disable()
print("--- mr.stats(y), 2^20 float32, 2000 calls")
pstats.Stats(prof).sort_stats("tottime").print_stats(15)
