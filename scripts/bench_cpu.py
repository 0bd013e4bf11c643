"""The CPU backend (NumPy input) against NumPy's own functions, in one run.

For each dtype and size: multireduce's sum, max, argmax, mean, var, std and stats against
NumPy's sum, max, argmax, mean, var, std and, for stats, sum + min + max + mean + var. Data:
``standard_normal * 100`` in the dtype (bool: ``> 0``), generated once per size and dtype.
``var0`` is var over axis 0 of the data as rows of 1,024 columns, against ``np.var(axis=0)``;
``var1f`` is var over axis 1 of the data as a Fortran-order matrix of 1,024 columns (made
before the timing); ``sum_repro`` is ``multireduce.sum(x, reproducible=True)`` (exact,
correctly rounded) against NumPy's ``sum``.

Method: wall time of each call, the cases interleaved in each repetition so that drift hits
all of them alike; median, p10 and p90 over ``--repeat`` repetitions after ``--warmup``. GB/s
= bytes of the input / time. Every multireduce result is checked against NumPy in float64
(relative 1e-6 for float32/float16 results, 1e-12 for float64; exact for integers and extremes)
before timing; a mismatch exits with status 1.

``--fresh`` also times multireduce's and NumPy's mean, var and stats each in a new process
whose data was made without freeing a large array: glibc raises its threshold for returning
freed memory to the system only once a large block is freed, so a process that never did
(a short script, a CLI run) pays a page fault per fresh page for every large temporary. The
interleaved runs above, in one long process, never see that.

No target is set by an issue. This is the measurement behind the README's "CPU backend" rows:
``python scripts/bench_cpu.py --output bench/results/cpu_<commit>/bench_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout first: an older one on PYTHONPATH must not be measured

from _benchutil import interleaved, stats  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce._provenance import git_state  # noqa: E402

OPS = ("sum", "max", "argmax", "mean", "var", "std", "stats", "var0", "var1f", "sum_repro")
#: ``var0``: var over axis 0 of the data viewed as rows of this many columns (per-column
#: variance of a data matrix).
COLUMNS = 1024


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default="float32,float64,float16,int32,int8,bool")
    p.add_argument("--sizes", default="16,22,25", help="log2 of the element counts, comma-separated")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--fresh", action="store_true", help="also time mean, var and stats in new processes")
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


def numpy_stats(x):
    return (np.sum(x), np.min(x), np.max(x), np.mean(x), np.var(x))


def peers(op: str):
    """(multireduce's call, NumPy's call) for ``op``."""
    if op == "stats":
        return mr.stats, numpy_stats
    if op == "var0":
        return (lambda x: mr.var(x.reshape(-1, COLUMNS), axis=0)), (lambda x: np.var(x.reshape(-1, COLUMNS), axis=0))
    if op == "var1f":  # x: the Fortran-order matrix (made once, outside the timing)
        return (lambda x: mr.var(x, axis=1)), (lambda x: np.var(x, axis=1))
    if op == "sum_repro":
        return (lambda x: mr.sum(x, reproducible=True)), np.sum
    return getattr(mr, op), getattr(np, op)


def _close(got, want: float) -> bool:
    """``got`` against the float64 reference ``want`` rounded to ``got``'s dtype: within a few ulps."""
    g = np.asarray(got)
    with np.errstate(over="ignore"):
        w = np.float64(want).astype(g.dtype)
    if np.isinf(w) or np.isinf(g):
        return bool(g == w)
    finfo = np.finfo(g.dtype)
    rtol = (64 if g.dtype == np.float64 else 4) * float(finfo.eps)
    return abs(float(g) - float(w)) <= rtol * abs(float(w)) + float(finfo.smallest_subnormal)


def check(op: str, x: np.ndarray) -> str | None:
    """None if multireduce's ``op`` of ``x`` matches the reference, else what differs.

    Extremes and argmax exactly (NumPy's), integer sums exactly (Python integers), the rest
    against NumPy in float64 rounded to the result dtype, within a few ulps.
    """
    f = x.astype(np.float64)
    exact_sum = int(x.astype(np.int64).sum()) if x.dtype.kind in "biu" else None
    if op == "var1f":  # x is the Fortran-order matrix; the reference sums each row pairwise
        got, want = peers(op)[0](x), np.var(np.ascontiguousarray(f), axis=1)
        ok = all(_close(g, float(w)) for g, w in zip(np.asarray(got), want, strict=True))
        return None if ok else f"var1f: {got!r} against {want!r}"
    if op == "var0":
        # The reference sums each column pairwise (a contiguous copy of the transpose): NumPy's
        # own var over axis 0 adds the rows one after another and is off by up to 9e-13 here.
        got, want = peers(op)[0](x), np.var(np.ascontiguousarray(f.reshape(-1, COLUMNS).T), axis=1)
        ok = all(_close(g, float(w)) for g, w in zip(np.asarray(got), want, strict=True))
        return None if ok else f"var0: {got!r} against {want!r}"
    if op == "sum_repro":  # the correctly rounded exact sum: within an ulp of the float64 sum of exact values
        got = peers(op)[0](x)
        ok = int(got) == exact_sum if exact_sum is not None else _close(got, math.fsum(f.tolist()))
        return None if ok else f"sum_repro: {got!r}"
    got = mr.stats(x) if op == "stats" else getattr(mr, op)(x)
    if op == "stats":
        checks = [("sum", got.sum, f.sum()), ("mean", got.mean, f.mean()), ("var", got.var, f.var())]
        checks += [("min", got.min, np.min(x)), ("max", got.max, np.max(x))]
    else:
        want = {"argmax": np.argmax(x), "max": np.max(x)}.get(op)
        checks = [(op, got, getattr(np, op)(f) if want is None else want)]
    for name, g, want in checks:
        if name in ("min", "max", "argmax"):
            ok = bool(np.asarray(g) == np.asarray(want))
        elif name == "sum" and exact_sum is not None:
            ok = int(g) == exact_sum
        else:
            ok = _close(g, float(want))
        if not ok:
            return f"{op} ({name}): {g!r} against {want!r}"
    return None


_FRESH = """
import statistics, sys, time
sys.path.insert(0, {repo!r})
import numpy as np
import multireduce as mr
n, dt = {n}, np.dtype({dtype!r})
x = np.empty(n, dt)
step = 1 << 14  # small blocks: no large array is freed before the timed calls
for i in range(0, n, step):
    x[i : i + step] = (np.arange(i, min(n, i + step)) % 251 - 125).astype(dt)
fn = {call}
fn(x)
times = []
for _ in range({repeat}):
    t = time.perf_counter()
    fn(x)
    times.append(time.perf_counter() - t)
print(statistics.median(times) * 1e3)
"""

_FRESH_CALLS = {
    ("mean", "multireduce"): "mr.mean",
    ("mean", "numpy"): "np.mean",
    ("var", "multireduce"): "mr.var",
    ("var", "numpy"): "np.var",
    ("stats", "multireduce"): "mr.stats",
    ("stats", "numpy"): "lambda x: (np.sum(x), np.min(x), np.max(x), np.mean(x), np.var(x))",
}


def fresh_records(dtypes, n: int, repeat: int) -> list[dict]:
    """Median ms of each op of ``_FRESH_CALLS`` in a new process per (dtype, op, library)."""
    import subprocess

    records = []
    for dt in dtypes:
        for (op, lib), call in _FRESH_CALLS.items():
            code = _FRESH.format(repo=str(REPO), n=n, dtype=dt.name, call=call, repeat=repeat)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            ms = float(done.stdout.strip().splitlines()[-1])
            records.append({"dtype": dt.name, "n": n, "op": op, "library": lib, "median_ms": ms})
            print(f"fresh {dt.name:>8} 2^{n.bit_length() - 1:<2} {op:<6} {lib:<11} {ms:9.3f} ms", flush=True)
    return records


def main(argv=None) -> int:
    args = parse_args(argv)
    dtypes = [np.dtype(d) for d in args.dtypes.split(",") if d]
    sizes = [1 << int(s) for s in args.sizes.split(",") if s]
    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        print(f"unknown ops {unknown}; choose from {', '.join(OPS)}", file=sys.stderr)
        return 2
    print(f"multireduce from {Path(mr.__file__).parent}", flush=True)
    rng = np.random.default_rng(0)
    records, failures = [], []
    for n in sizes:
        for dt in dtypes:
            base = rng.standard_normal(n) * 100
            x = base > 0 if dt == np.bool_ else base.astype(dt)
            cases = {}
            fortran = np.asfortranarray(x.reshape(-1, COLUMNS))
            for op in ops:
                arg = fortran if op == "var1f" else x
                problem = check(op, arg)
                if problem is not None:
                    failures.append(f"{dt} n={n} {problem}")
                ours, theirs = peers(op)
                cases[f"{op}/multireduce"] = lambda ours=ours, x=arg: ours(x)
                cases[f"{op}/numpy"] = lambda theirs=theirs, x=arg: theirs(x)
            with np.errstate(all="ignore"):  # NumPy's float16 var overflows its squares; not ours to report
                samples = interleaved(cases, args.warmup, args.repeat, lambda: None)
            for op in ops:
                a, b = stats(samples[f"{op}/multireduce"]), stats(samples[f"{op}/numpy"])
                rec = {
                    "dtype": dt.name,
                    "n": n,
                    "op": op,
                    "multireduce": a,
                    "numpy": b,
                    "speedup_vs_numpy": b["median_ms"] / a["median_ms"],
                    "multireduce_GBps": x.nbytes / a["median_ms"] / 1e6,
                }
                records.append(rec)
                print(
                    f"{dt.name:>8} 2^{n.bit_length() - 1:<2} {op:<7} multireduce {a['median_ms']:9.3f} ms"
                    f"  numpy {b['median_ms']:9.3f} ms  {rec['speedup_vs_numpy']:5.2f}x",
                    flush=True,
                )
    fresh = fresh_records([d for d in dtypes if d != np.bool_], max(sizes), args.repeat) if args.fresh else []
    doc = {
        "git": git_state(),
        "host": {"machine": platform.machine(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "versions": {"python": platform.python_version(), "numpy": np.__version__},
        "method": {"warmup": args.warmup, "repeat": args.repeat, "interleaved": True},
        "records": records,
        "fresh_process": fresh,
        "check_failures": failures,
    }
    out = args.output or REPO / "bench" / "results" / "bench_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    for f in failures:
        print(f"CHECK FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
