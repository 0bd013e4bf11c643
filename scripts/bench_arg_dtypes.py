"""Time GPU argmax of 4 GiB arrays of each element dtype against ``cupy.argmax``, in one run.

The argmin/argmax kernel reads 16-byte vectors and takes each element out of them; how it
does that depends on the element size (``vector_lane`` in ``kernels/multireduce/stats.cuh``).
This measures every dtype, interleaved with CuPy's argmax on the same array, with CUDA
events (median of ``--repeat`` rounds after ``--warmup``), checks each index against CuPy's,
and writes a JSON (``--out``) with the git commit and the GPU name.

Not collected by pytest; run on a GPU machine::

    python scripts/bench_arg_dtypes.py --out bench/results/arg_dtypes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "float16", "float32", "int32", "float64", "int64"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=4.0, help="array size in GiB (default 4)")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--out", type=Path, default=None)
    opts = p.parse_args(argv)

    import cupy as cp

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
        ok = int(mr.argmax(x)) == int(cp.argmax(x))
        cases = {"multireduce.argmax": lambda x=x: mr.argmax(x), "cupy.argmax": lambda x=x: cp.argmax(x)}
        times: dict[str, list[float]] = {k: [] for k in cases}
        for r in range(opts.warmup + opts.repeat):
            for label, fn in cases.items() if r % 2 == 0 else reversed(list(cases.items())):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                fn()
                end.record()
                end.synchronize()
                if r >= opts.warmup:
                    times[label].append(cp.cuda.get_elapsed_time(start, end) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {
            "dtype": name,
            "n": n,
            "index_matches_cupy": ok,
            "median_us": med,
            "ratio_vs_cupy": med["cupy.argmax"] / med["multireduce.argmax"],
        }
        rows.append(row)
        print(
            f"{name:8s} ours {med['multireduce.argmax']:9.1f} us ({nbytes / med['multireduce.argmax'] / 1e3:6.0f} GB/s)"
            f"  cupy {med['cupy.argmax']:9.1f} us  {row['ratio_vs_cupy']:.2f}x cupy  index ok: {ok}",
            flush=True,
        )
        del x
        cp.get_default_memory_pool().free_all_blocks()
    doc = {
        "benchmark": "arg_dtypes",
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
    return 0 if all(r["index_matches_cupy"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
