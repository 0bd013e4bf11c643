"""Check a ``bench_multigpu.py`` JSON file's GPU results against the CPU, on the host.

    python scripts/check_multigpu_cpu.py bench/results/<dir>/multigpu.json [--n 1073741824]

Regenerates the benchmark's global array for one size ``n`` (default: the smallest in the
file) with ``bench_multigpu.generate_host`` (NumPy, the same bits as the GPU generator), in
pieces, and computes on the CPU its reproducible (exact, correctly rounded) sum, its max and
its min. Every record of that size in the file must match bit for bit: the reproducible sums
at every rank count, max and min. The fast sums must be within one float32 ulp of the exact sum.
Exits 1 on a mismatch. The CPU's exact sum runs at 10-13 M elements/s on 2 cores (4 GiB: 80-103 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_multigpu import _bits, generate_host  # noqa: E402

import multireduce  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", type=Path)
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--piece", type=int, default=1 << 25, help="elements generated and summed at a time")
    args = p.parse_args(argv)
    doc = json.loads(args.file.read_text())
    n = args.n or min(r["n"] for r in doc["records"])
    start = time.time()
    exact = None
    hi, lo = np.float32(-np.inf), np.float32(np.inf)
    for s in range(0, n, args.piece):
        x = generate_host(s, min(args.piece, n - s))
        part = multireduce.partial(x, "sum", reproducible=True)
        if exact is None:
            exact = part
        else:
            exact.merge(part)
        hi, lo = max(hi, multireduce.max(x)), min(lo, multireduce.min(x))
    total = np.float32(exact.result(np.dtype(np.float32)))
    want = {"sum_reproducible": _bits(total), "max": _bits(hi), "min": _bits(lo)}
    seconds = time.time() - start
    print(f"n {n}: CPU exact sum {float(total)!r} ({want['sum_reproducible']}), max {hi}, min {lo}; {seconds:.0f} s")
    failed = 0
    ulp = float(np.spacing(np.float32(abs(total))))
    for r in doc["records"]:
        if r["n"] != n or r["op"] not in (*want, "sum"):
            continue
        if r["op"] == "sum":
            ok = abs(r["value"] - float(total)) <= ulp
            how = f"|fast - exact| = {abs(r['value'] - float(total)):.3g} <= ulp {ulp:.3g}"
        else:
            ok = r["bits"] == want[r["op"]]
            how = f"GPU {r['bits']} vs CPU {want[r['op']]}"
        failed += not ok
        print(f"ranks {r['ranks']} {r['op']:17s} {'ok' if ok else 'MISMATCH'}: {how}")
    print(f"{failed} mismatch(es)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
