"""The GPU moments kernel on data with runs of NaN: time and accuracy of nanvar.

Cases, float32 near 1e6 with a spread of 1 (``--gib`` GiB, default 4) and the same for float64
near 1.7e9 (timestamps) at half the elements:

``plain``     no NaN
``gappy``     1% of the elements NaN, scattered
``late``      the gappy data behind a run of NaN over the first 60% (a series that starts with
              missing samples: each thread of the kernel skips its NaN-only vectors first)
``all-nan``   every element NaN (the result is NaN; the time is what the skipping costs)

Each case is timed with CUDA events around ``multireduce.nanvar(x)`` on the device (median of
``--repeat`` calls after a warm-up), against ``cupy.nanvar(x)`` in the same run (``--peer-repeat``
calls: about a second each at 4 GiB), and its
relative error is taken against the float64 variance of the data less the offset (exact
there). Writes a JSON (``--out``) with the git commit and the GPU. Needs CuPy and a GPU, or
with ``--cpu`` the same on NumPy arrays (the CPU backend, timed by the wall clock, against
``np.nanvar``)::

    python scripts/diag_nan_runs.py --gib 4 --out bench/results/nan_runs.json
    python scripts/diag_nan_runs.py --cpu --gib 0.125 --repeat 7 --peer-repeat 3
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import multireduce  # noqa: E402
from multireduce import _provenance  # noqa: E402

CASES = ("plain", "gappy", "late", "all-nan")


def make(xp, case: str, n: int, dtype, offset: float):
    """The case's array, made by ``xp`` (NumPy or CuPy: 4 GiB is slow to copy from the host)."""
    rng = xp.random.default_rng(7)
    x = (offset + rng.standard_normal(n, dtype=xp.float64)).astype(dtype)
    if case in ("gappy", "late"):
        x[rng.random(n) < 0.01] = xp.nan
    if case == "late":
        x[: n * 3 // 5] = xp.nan
    if case == "all-nan":
        x[:] = xp.nan
    return x


def timed_gpu(cupy, fn, x, repeat: int) -> float:
    """Median milliseconds of ``fn(x)`` over ``repeat`` calls (CUDA events), after one untimed one."""
    fn(x)
    times = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn(x)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def timed_cpu(fn, x, repeat: int) -> float:
    """Median milliseconds of ``fn(x)`` over ``repeat`` calls (wall clock), after one untimed one."""
    fn(x)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=4.0, help="float32 GiB per case (float64: the same bytes)")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--peer-repeat", type=int, default=2, help="timed peer nanvar calls (1 s each on the GPU); 0: none")
    p.add_argument("--cpu", action="store_true", help="NumPy arrays on the host (the CPU backend; peer np.nanvar)")
    p.add_argument("--out", type=Path, help="JSON file to write")
    args = p.parse_args(argv)
    if args.cpu:
        xp, device = np, platform.processor() or platform.machine()

        def timed(fn, x, repeat):
            return timed_cpu(fn, x, repeat)
    else:
        import cupy as xp

        device = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["name"].decode()

        def timed(fn, x, repeat):
            return timed_gpu(xp, fn, x, repeat)

    rows = []
    for dtype, offset in ((np.float32, 1e6), (np.float64, 1.7e9)):
        n = int(args.gib * 2**30) // np.dtype(dtype).itemsize
        for case in CASES:
            x = make(xp, case, n, dtype, offset)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                ours = timed(multireduce.nanvar, x, args.repeat)
                theirs = timed(xp.nanvar, x, args.peer_repeat) if args.peer_repeat else float("nan")
                got = float(np.asarray(multireduce.nanvar(x).tolist()))
                want = float(xp.nanvar(x.astype(xp.float64) - offset).tolist())
            error = abs(got - want) / want if want == want else (0.0 if got != got else float("inf"))
            rows.append(
                {
                    "dtype": np.dtype(dtype).name,
                    "case": case,
                    "n": n,
                    "ours_ms": ours,
                    "peer_nanvar_ms": theirs,
                    "ours_GBps": x.nbytes / ours / 1e6,
                    "relative_error": error,
                }
            )
            r = rows[-1]
            peer = "np.nanvar" if args.cpu else "cupy.nanvar"
            print(
                f"{r['dtype']:8} {case:8} ours {ours:8.3f} ms ({r['ours_GBps']:7.1f} GB/s)  "
                f"{peer} {theirs:8.3f} ms  relative error {error:.1e}",
                flush=True,
            )
            del x
            if not args.cpu:
                xp.get_default_memory_pool().free_all_blocks()
    if args.out:
        record = {"benchmark": "diag_nan_runs", "git": _provenance.git_state(), "device": device, "gib": args.gib}
        record["backend"] = "numpy" if args.cpu else "cupy"
        record["results"] = rows
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
