"""Time GPU reductions of 4 GiB arrays of each element dtype against CuPy's, in one run.

The kernels read 16-byte vectors and take each element out of them; how they do that
depends on the element size (the arg kernel's ``vector_lane`` in
``kernels/multireduce/stats.cuh``). For each dtype and op (``--ops``, default argmax), this
times multireduce's op, interleaved with the same CuPy function on the same array, with
CUDA events (median of ``--repeat`` rounds after ``--warmup``), checks the result against
CuPy's (argmax, max, min: equal; sum, mean: within one unit in the last place of the result
of CuPy's float64-accumulated value; var, std of integers and bool: within 1e-12 of the
exact value from integer sums of x and x**2 (CuPy's float64 var of 4 GiB of uint8 is off by
more than that); of floats: as sum), and writes a JSON (``--out``) with the git commit and
the GPU name.

Not collected by pytest; run on a GPU machine::

    python scripts/bench_dtypes.py --ops argmax,sum,max,mean --out bench/results/dtypes.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from fractions import Fraction
from pathlib import Path

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "float16", "float32", "int32", "float64", "int64"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=4.0, help="array size in GiB (default 4)")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--ops", default="argmax", help="comma-separated, of argmax, sum, max, min, mean, var, std")
    p.add_argument(
        "--peer-repeat",
        type=int,
        default=None,
        help="time CuPy's op in only this many rounds (cupy.var of 4 GiB of int8 takes seconds)",
    )
    p.add_argument("--out", type=Path, default=None)
    opts = p.parse_args(argv)

    import cupy as cp
    import numpy as np

    import multireduce as mr
    from multireduce import _provenance

    nbytes = int(opts.gib * 2**30)
    rows = []
    for name in opts.dtypes.split(","):
        dt = cp.dtype(name)
        n = nbytes // dt.itemsize
        rng = cp.random.default_rng(7)
        noise = rng.standard_normal(n, dtype=cp.float32)
        if dt.kind == "b":
            x = noise > 0
            x[: n // 2] = False  # the first True is in the second half
        elif dt.kind == "f":
            x = noise.astype(dt)
        else:
            info = cp.iinfo(dt)
            x = (noise * (min(info.max, 2**24) / 8)).astype(dt)
        del noise
        top = True if dt.kind == "b" else (cp.finfo(dt).max if dt.kind == "f" else cp.iinfo(dt).max)
        x[n - 3] = cp.asarray(top, dtype=dt)
        for op in opts.ops.split(","):
            ours, theirs = getattr(mr, op), getattr(cp, op)
            got = ours(x)
            if op in ("var", "std") and dt.kind in "biu":
                ref = exact_var(cp, x)
                ref = math.sqrt(ref) if op == "std" else ref
                ok = abs(float(got) - ref) <= 1e-12 * abs(ref)
            elif op in ("sum", "mean", "var", "std"):
                # Against CuPy's in float64, rounded to the result dtype: equal within one unit
                # in the last place of the result (float16 sums round coarsely). var and std
                # of a float64 copy: CuPy squares float32 elements in float32 even with
                # dtype=float64, and this array's largest element (3.4e38) overflows there.
                wide = x.astype(cp.float64) if op in ("var", "std") else x
                ref = float(theirs(wide, dtype=cp.float64))
                del wide
                with np.errstate(over="ignore"):  # a float16 sum beyond 65504 rounds to inf
                    rounded = np.asarray(ref).astype(np.dtype(str(got.dtype)))
                    if np.isfinite(rounded):
                        rtol = 1e-9 if op in ("var", "std") else 1e-6
                        ok = abs(float(got) - ref) <= max(rtol * abs(ref), float(np.spacing(np.abs(rounded))))
                    else:
                        ok = float(got) == float(rounded)
            else:
                ref = theirs(x)
                ok = bool(got == ref)
            cases = {f"multireduce.{op}": lambda x=x, f=ours: f(x), f"cupy.{op}": lambda x=x, f=theirs: f(x)}
            times: dict[str, list[float]] = {k: [] for k in cases}
            peer_rounds = opts.warmup + (opts.repeat if opts.peer_repeat is None else opts.peer_repeat)
            for r in range(opts.warmup + opts.repeat):
                for label, fn in cases.items() if r % 2 == 0 else reversed(list(cases.items())):
                    if label.startswith("cupy.") and r >= peer_rounds:
                        continue
                    start, end = cp.cuda.Event(), cp.cuda.Event()
                    start.record()
                    fn()
                    end.record()
                    end.synchronize()
                    if r >= opts.warmup:
                        times[label].append(cp.cuda.get_elapsed_time(start, end) * 1e3)
            med = {k: statistics.median(v) for k, v in times.items()}
            a, b = med[f"multireduce.{op}"], med[f"cupy.{op}"]
            row = {
                "dtype": name,
                "op": op,
                "n": n,
                "value": float(got),
                "reference": float(ref),
                "matches_reference": ok,
                "median_us": med,
                "ratio_vs_cupy": b / a,
            }
            rows.append(row)
            print(
                f"{name:8s} {op:6s} ours {a:9.1f} us ({nbytes / a / 1e3:6.0f} GB/s)"
                f"  cupy {b:9.1f} us  {row['ratio_vs_cupy']:.2f}x cupy  value {float(got):.17g}"
                f" reference {float(ref):.17g} matches: {ok}",
                flush=True,
            )
        del x
        cp.get_default_memory_pool().free_all_blocks()
    doc = {
        "benchmark": "dtypes",
        "git_commit": _provenance.git_commit(),
        "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "nvrtc": list(cp.cuda.nvrtc.getVersion()),
        "gib": opts.gib,
        "repeat": opts.repeat,
        "rows": rows,
    }
    if opts.out is not None:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {opts.out}")
    return 0 if all(r["matches_reference"] for r in rows) else 1


def exact_var(cp, x) -> float:
    """The population variance of integer or bool ``x``, exact then rounded once: Python
    integer totals of x and x**2 (int64 sums of 2**26-element pieces, which cannot wrap)."""
    s1 = s2 = 0
    step = 2**26
    for start in range(0, x.size, step):
        piece = x[start : start + step].astype(cp.int64)
        s1 += int(piece.sum())
        s2 += int((piece * piece).sum(dtype=cp.uint64))
    n = x.size
    return float(Fraction(n * s2 - s1 * s1, n * n))


if __name__ == "__main__":
    sys.exit(main())
