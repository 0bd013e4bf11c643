"""The variance of data far from zero when its states are merged across parts.

What MPI ranks and Dask chunks do: each part's moments state comes from one reduction
(``multireduce.partial(part, "nanvar")``: the NumPy blocks, or the GPU moments kernel for a CuPy
part) and the states are merged on the host with Chan et al.'s update
(``multireduce._stats.merge_all``, as ``mpi.allreduce`` and the Dask combine do). Cases:

``timestamps``  float64 near 1.7e9 with a spread of 1 (seconds since 1970, jittered)
``ids``         int64 near 1e12, uniform in [0, 20)
``float32``     float32 near 1e6 with a spread of 1
``gappy``       the timestamps with 1% of them NaN (missing samples), reduced with nanvar
``late``        the gappy timestamps behind a run of NaN over their first 60% (a series that
                starts with missing samples; every part but the last starts with NaN)

The reference is the float64 variance of the data less the offset, which is exact there (NumPy's
two passes over data near 0: within a few ulps). The script prints and writes (``--out``, JSON
with the git commit and the GPU) the relative error of the merged variance for each number of
parts; 1 part is one state, the accuracy the merges should keep. The states' ``mean_lo`` (the
low part of their means) is what keeps it; with float64 means alone the error was 1e-13 to
2e-8 (and on the GPU, before 666c5da, nanvar of the gappy case was off by 200%: a thread
whose first element was NaN shifted its sums by 0; before 2026-11-30, the late case kept 1e-10
on the CPU, and on the GPU its threads whose first four vectors held only NaN shifted by 0).
Runs on the CPU alone (NumPy parts) or,
with CuPy, on both::

    python scripts/diag_variance_parts.py --n 16777216 --out bench/results/variance_parts.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import multireduce  # noqa: E402
from multireduce import _provenance, _stats  # noqa: E402

CASES = {
    "timestamps": (np.float64, 1.7e9),
    "ids": (np.int64, 10**12),
    "float32": (np.float32, 1e6),
    "gappy": (np.float64, 1.7e9),
    "late": (np.float64, 1.7e9),
}


def make(case: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    dtype, offset = CASES[case]
    if case == "ids":
        return offset + rng.integers(0, 20, n), offset
    x = (offset + rng.standard_normal(n)).astype(dtype)
    if case in ("gappy", "late"):
        x[rng.random(n) < 0.01] = np.nan
    if case == "late":
        x[: n * 3 // 5] = np.nan
    return x, offset


def merged_error(x: np.ndarray, offset: float, parts: int, to_device) -> float:
    want = float(np.nanvar(x.astype(np.float64) - offset))
    states = [multireduce.partial(to_device(p), "nanvar") for p in np.array_split(x, parts)]
    merged = _stats.merge_all(states)
    got = float(merged.m2) / int(merged.n)
    return abs(got - want) / want


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1 << 24, help="elements per case")
    p.add_argument("--parts", default="1,2,3,7,16,64,256")
    p.add_argument("--out", type=Path, help="JSON file to write")
    args = p.parse_args(argv)
    parts = [int(v) for v in args.parts.split(",")]

    backends = {"numpy": lambda a: a}
    gpu = None
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None and cupy.cuda.runtime.getDeviceCount() > 0:
        backends["cupy"] = cupy.asarray
        gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()

    rng = np.random.default_rng(2026)
    rows = []
    print(f"relative error of var, {args.n} elements, merged over parts (1 part: one state)")
    print(f"{'case':<11} {'backend':<7} " + " ".join(f"{k:>9}" for k in parts))
    for case in CASES:
        x, offset = make(case, args.n, rng)
        for name, to_device in backends.items():
            errors = [merged_error(x, offset, k, to_device) for k in parts]
            rows.append({"case": case, "backend": name, "parts": parts, "relative_error": errors})
            print(f"{case:<11} {name:<7} " + " ".join(f"{e:9.1e}" for e in errors))
    has_low_part = "mean_lo" in _stats._MOMENTS_FIELDS
    print(f"states carry mean_lo: {has_low_part}")
    if args.out:
        document = {
            "git": _provenance.git_state(),
            "gpu": gpu,
            "n": args.n,
            "numpy": np.__version__,
            "states_carry_mean_lo": has_low_part,
            "rows": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
