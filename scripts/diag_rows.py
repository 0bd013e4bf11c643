"""Row kernel occupancy experiment: ``reduce_rows_kernel`` with other minimum-blocks launch bounds.

The shipped row kernel is declared ``__launch_bounds__(BLOCK, 1)``, which lets ptxas use up
to 65536 / BLOCK registers per thread, and so decides how many blocks share an SM. For the
issue's row case (2^15 x 2^15 float32 -> 2^15, one block per row, each block four loop trips
of 512 x 4 16-byte loads) a block's end (its block reduction and the next block's start)
leaves the SM's loads to the other resident blocks. This script compiles the kernel from
the shipped headers with the bound's second argument replaced (``BLOCKxUNROLLmMINB``
variants), prints each one's registers and resident blocks per SM, and times it
interleaved with the shipped ``multireduce.sum(x, axis=-1)`` and ``cupy.sum(x, axis=-1)``
(CUDA events around ``--inner`` launches queued behind ``bench_kernel``'s spin kernel, so
that the host's launch latency is hidden; rounds alternate over the variants).
Every variant's result is compared with the shipped one (bit for bit where only the bound
differs, else to 1e-6 relative).

    python scripts/diag_rows.py --variants 512x4m1,512x4m2,512x4m3,512x4m4,256x8m4,512x4m1a32 --rounds 15
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kernel as bk  # noqa: E402  (the spin kernel that hides the host's launch latency)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", type=int, default=1 << 15)
    p.add_argument("--op", choices=("sum", "max"), default="sum")
    p.add_argument("--variants", default="512x4m1,512x4m2,512x4m3,512x4m4,256x4m4,256x8m4,256x8m2,1024x4m2")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--inner", type=int, default=10)
    p.add_argument("--spin-us", type=float, default=3000.0, help="spin queued before each batch")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


BOUND = "__global__ void __launch_bounds__(BLOCK, 1)\nreduce_rows_kernel("


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy as cp
    import numpy as np

    import multireduce as mr
    from multireduce import _kernels, _provenance
    from multireduce.ops import get_op

    source = _kernels.read_source()
    if source.count(BOUND) != 1:
        raise SystemExit("reduce_rows_kernel's declaration changed: update BOUND")
    side = args.side
    x = cp.random.default_rng(0).random((side, side), dtype=cp.float32) * 2 - 1
    shipped = mr.reduce(x, args.op, axis=-1)
    op = get_op(args.op)
    acc = op.accumulator_dtype(np.dtype(np.float32))
    props = cp.cuda.runtime.getDeviceProperties(0)
    sms = props["multiProcessorCount"]
    load = _kernels.rows_config()[3]
    runs = {}
    info = {}
    outs = {}
    for text in filter(None, args.variants.split(",")):
        m = re.fullmatch(r"(\d+)x(\d+)m(\d+)(a32)?", text)
        if m is None:
            raise SystemExit(f"bad variant {text!r}: expected BLOCKxUNROLLmMINB[a32]")
        block, unroll, minb = (int(g) for g in m.groups()[:3])
        # a32: a float32 accumulator (cupy's for float32 input), to measure what the shipped
        # float64 accumulation of sums costs; never shipped (its error grows with the row).
        v_acc = np.dtype(np.float32) if m.group(4) else acc
        v_identity = op.identity(v_acc)
        code = source.replace(BOUND, f"__global__ void __launch_bounds__(BLOCK, {minb})\nreduce_rows_kernel(")
        name = _kernels.kernel_name(
            op,
            np.dtype(np.float32),
            v_acc,
            np.dtype(np.float32),
            block,
            unroll,
            load,
            kernel="reduce_rows_kernel",
        )
        module = cp.RawModule(code=code, options=("--std=c++17",), name_expressions=(name,))
        kernel = module.get_function(name)
        per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, 0)
        out = cp.empty(side, dtype=cp.float32)
        partials = cp.empty(side, dtype=v_acc)
        counters = cp.zeros(1024, dtype=cp.uint32)

        def launch(k=kernel, b=block, o=out, p=partials, c=counters, i=v_identity):
            k((1, side), (b,), (x, np.int64(side), np.int64(side), i, p, c, o))

        launch()
        same_shape = (block, unroll) == _kernels.rows_config()[:2] and v_acc == acc
        if same_shape:
            ok = bool(cp.array_equal(out, shipped))
        else:  # another order of float64 adds; float32 adds (a32) round at float32's ulp of the running sum
            tol = (1e-4, 1e-3) if m.group(4) else (1e-6, 1e-5)
            ok = bool(cp.allclose(out, shipped, rtol=tol[0], atol=tol[1]))
        info[text] = {
            "regs": kernel.num_regs,
            "blocks_per_sm": per_sm,
            "resident_threads": per_sm * block,
            "matches_shipped": ok,
        }
        outs[text] = out
        runs[text] = launch
    runs["shipped"] = lambda: mr.reduce(x, args.op, axis=-1)
    runs["cupy"] = lambda: getattr(cp, args.op)(x, axis=-1)
    samples = {k: [] for k in runs}
    timer = bk.DeviceTimer(cp, bk.compile_seed_module(cp).get_function("spin_kernel"))
    timer.calibrate()
    for fn in runs.values():  # warm-up
        fn()
    cp.cuda.runtime.deviceSynchronize()
    late = 0
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for k in order:
            us, enqueue_us = timer.batch(runs[k], args.inner, args.spin_us)
            late += enqueue_us > 0.8 * args.spin_us
            samples[k].append(us)
    cupy_us = statistics.median(samples["cupy"])
    shipped_us = statistics.median(samples["shipped"])
    print(
        f"diag_rows: {props['name'].decode()}, {sms} SMs, {side} x {side} float32 {args.op} over the last axis, "
        f"{args.rounds} rounds x {args.inner} launches; batches queued after their spin ended: {late}"
    )
    print(
        f"{'variant':<12} {'regs':>5} {'blk/SM':>7} {'median us':>10} {'p10':>8} {'p90':>8} "
        f"{'vs cupy':>8} {'vs shipped':>10}  match"
    )
    records = []
    for k, s in samples.items():
        s_sorted = sorted(s)
        med = statistics.median(s)
        p10 = s_sorted[len(s) // 10]
        p90 = s_sorted[(9 * len(s)) // 10]
        i = info.get(k, {})
        print(
            f"{k:<12} {i.get('regs', ''):>5} {i.get('blocks_per_sm', ''):>7} {med:10.1f} {p10:8.1f} {p90:8.1f} "
            f"{cupy_us / med:8.4f} {shipped_us / med:10.4f}  {i.get('matches_shipped', '')}"
        )
        records.append(
            {
                "variant": k,
                "median_us": med,
                "p10_us": p10,
                "p90_us": p90,
                "vs_cupy": cupy_us / med,
                "vs_shipped": shipped_us / med,
                "samples_us": s,
                **i,
            }
        )
    if args.out:
        result = {
            "benchmark": "diag_rows",
            "git": _provenance.git_state(),
            "device": props["name"].decode(),
            "side": side,
            "records": records,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    return 0 if all(i["matches_shipped"] for i in info.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
