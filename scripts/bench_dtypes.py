"""Time GPU reductions of 4 GiB arrays of each element dtype against CuPy's, in one run.

The kernels read 16-byte vectors and take each element out of them; how they do that
depends on the element size (the arg kernel's ``vector_lane`` in
``kernels/multireduce/stats.cuh``). For each dtype and op (``--ops``, default argmax), this
times multireduce's op, interleaved with the same CuPy function on the same array, with
CUDA events (median of ``--repeat`` rounds after ``--warmup``; CuPy's in only
``--peer-repeat`` of them if given), checks the result (:func:`check`), and writes a JSON
(``--out``) with the git commit and the GPU name.

The checks: argmax, nanargmax, nanargmin, max, min equal CuPy's. Integer and bool inputs against exact integer
totals of x and x**2 (:func:`exact_totals`): sums exactly (modulo 2**64, as the int64 or
uint64 result wraps), mean within the float64 summation bound below, var and std within
1e-12 of the exact value (CuPy's float64 var of 4 GiB of uint8 is off by more than that).
Float inputs against CuPy's float64 result (var and std of a float64 copy: CuPy squares
float32 elements in float32 even with ``dtype=float64``): within one unit in the last place
of the result or the float64 summation bound ``(log2(n) + 4) * 2**-52 * sum(|x|)`` (for
var and std, that bound relative to the value), whichever is larger.

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

import numpy as np

REPO = Path(__file__).resolve().parent.parent

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "float16", "float32", "int32", "float64", "int64"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=4.0, help="array size in GiB (default 4)")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument(
        "--ops",
        default="argmax",
        help="comma-separated, of argmax, nanargmax, nanargmin, sum, max, min, mean, var, std",
    )
    p.add_argument(
        "--peer-repeat",
        type=int,
        default=None,
        help="time CuPy's op in only this many rounds (cupy.var of 4 GiB of int8 takes seconds)",
    )
    p.add_argument("--out", type=Path, default=None)
    opts = p.parse_args(argv)

    # This checkout's multireduce first: a copy of older code run beside the tree (a `git
    # archive` under the checkout, PYTHONPATH naming the tree) measured the tree's instead.
    sys.path.insert(0, str(REPO))
    import cupy as cp

    import multireduce as mr
    from multireduce import _provenance

    print(f"multireduce from {Path(mr.__file__).parent}", flush=True)  # which checkout is measured

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
        totals, totals_ops = None, set()
        top = True if dt.kind == "b" else (cp.finfo(dt).max if dt.kind == "f" else cp.iinfo(dt).max)
        x[n - 3] = cp.asarray(top, dtype=dt)
        for op in opts.ops.split(","):
            ours, theirs = getattr(mr, op), getattr(cp, op)
            got = ours(x)
            if dt.kind in "biu" and op not in totals_ops:
                totals = exact_totals(cp, x)
                totals_ops = {"sum", "mean", "var", "std"}
            ref, ok = check(cp, x, op, got, theirs, totals if dt.kind in "biu" else None)
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
                "reference": ref if isinstance(ref, int) else float(ref),
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
        "multireduce_path": str(Path(mr.__file__).parent),
        "gib": opts.gib,
        "repeat": opts.repeat,
        "warmup": opts.warmup,
        "peer_repeat": opts.peer_repeat,
        "rows": rows,
    }
    if opts.out is not None:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {opts.out}")
    return 0 if all(r["matches_reference"] for r in rows) else 1


def exact_totals(cp, x) -> tuple[int, int, float]:
    """(sum of x, sum of x**2, sum of |x|) of integer or bool ``x``; the first two exact.

    Each element is split into 16-bit limbs (the low ones from its bits, the top one keeping
    its sign), so that every product of two limbs is below 2**32 in magnitude and the int64
    sums of 2**26-element pieces of them (below 2**58) cannot wrap; the pieces' totals are
    added as Python ints. (Without the limbs, the squares of int32 and int64 elements wrapped.)
    The sum of |x| is a float64 magnitude for error bounds.
    """
    bits = 8 * x.itemsize
    count = max(1, bits // 16)
    raw = {32: cp.uint32, 64: cp.uint64}.get(bits)
    s1 = s2 = 0
    sa = 0.0
    step = 2**26
    for start in range(0, x.size, step):
        piece = x[start : start + step]
        if count == 1:
            limbs = [piece.astype(cp.int64)]
        else:
            u = piece.view(raw)
            limbs = [((u >> (16 * i)) & 0xFFFF).astype(cp.int64) for i in range(count - 1)]
            limbs.append((piece >> (16 * (count - 1))).astype(cp.int64))  # signed for signed x
        for i, a in enumerate(limbs):
            s1 += int(a.sum()) << (16 * i)
            for j in range(i, count):
                term = int((a * limbs[j]).sum()) << (16 * (i + j))
                s2 += term if i == j else 2 * term
        sa += float(cp.abs(piece.astype(cp.float64)).sum())
    return s1, s2, sa


def check(cp, x, op: str, got, theirs, totals) -> tuple[float | int, bool]:
    """(reference, whether ``got`` matches it) for ``op`` of ``x`` (the module docstring's rules)."""
    n = x.size
    eps_bound = (math.log2(max(n, 1)) + 4) * 2.0**-52
    result = np.dtype(str(got.dtype))
    if op in ("argmax", "nanargmax", "nanargmin", "max", "min"):
        ref = theirs(x)
        return ref.item(), bool(got == ref)
    if totals is not None:  # integer or bool input
        s1, s2, sa = totals
        if op == "sum":
            ref = s1 % 2**64
            if result.kind == "i" and ref >= 2**63:
                ref -= 2**64  # the int64 result wraps as NumPy's does
            return ref, int(got) == ref
        if op == "mean":
            ref = float(Fraction(s1, n))
            bound = max(float(np.spacing(abs(ref))), eps_bound * sa / n)
            return ref, abs(float(got) - ref) <= bound
        var = float(Fraction(n * s2 - s1 * s1, n * n))
        ref = math.sqrt(var) if op == "std" else var
        return ref, abs(float(got) - ref) <= 1e-12 * abs(ref)
    # Float input: CuPy in float64 (var and std of a float64 copy), rounded to the result dtype.
    wide = x.astype(cp.float64) if op in ("var", "std") else x
    ref = float(theirs(wide, dtype=cp.float64))
    del wide
    with np.errstate(over="ignore"):  # a float16 sum beyond 65504 rounds to inf
        rounded = np.asarray(ref).astype(result)
    if not np.isfinite(rounded):
        return ref, float(got) == float(rounded)
    a = np.abs(rounded)
    # One unit in the last place of the result (the gap below the largest finite value, whose
    # spacing would be inf and accept anything).
    ulp = float(a - np.nextafter(a, a.dtype.type(0))) if a == np.finfo(result).max else float(np.spacing(a))
    if op in ("var", "std"):
        return ref, abs(float(got) - ref) <= max(ulp, 4 * eps_bound * abs(ref))
    mag = float(cp.abs(x).sum(dtype=cp.float64)) / (n if op == "mean" else 1)
    return ref, abs(float(got) - ref) <= max(ulp, eps_bound * mag)


if __name__ == "__main__":
    sys.exit(main())
