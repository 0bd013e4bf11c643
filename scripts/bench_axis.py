"""Axis reductions and reproducible sums on the GPU, side by side with their peers.

Measures, in one run and with ``bench_kernel.py``'s method (device time of calls queued
behind a spin kernel, medians):

- row reductions (``axis=-1`` of a 2^15 x 2^15 float32 array, 4 GiB) and column reductions
  (``axis=0``) with multireduce's row/column kernels, against ``cupy.sum(x, axis=...)``
  (and max/min) and against multireduce's full reduction of the same array (issue 5's
  targets: >= 0.9x the full-reduction bandwidth and >= 1.0x cupy);
- the reproducible sum (``reproducible=True``) of 4 GiB float32 against the fast path
  (issue 6's target: >= 0.8x), with the library's default rounding of the exact sum (on the
  device; the host rounding is timed too, under ``round_modes``), and its bits against the
  CPU's;
- each result is checked against the CPU path before it is timed.

Writes JSON (``bench/results/axis_<gpu>_<commit>.json`` by default) with the git commit
(``MULTIREDUCE_GIT_COMMIT`` where the checkout has no history) and the GPU name, and prints
a table with PASS/MISS per target.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_kernel as bk  # noqa: E402  (the timing method and JSON helpers)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", type=int, default=1 << 15, help="the array is side x side float32 (default 2^15)")
    p.add_argument("--repro-n", type=int, default=1 << 30, help="elements of the reproducible-sum case (2^30)")
    p.add_argument("--ops", default="sum,max,min", help="fold ops, each against cupy's function of that name")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--skip-repro", action="store_true", help="skip the reproducible-sum case")
    p.add_argument("--skip-axis", action="store_true", help="skip the row and column cases")
    p.add_argument(
        "--exact-variants",
        default="",
        help="extra UNROLLxSUMS shapes (SUMS 2 to 4) of the exact-sum kernel to time on the uniform case, e.g. 2x4,4x2 "
        "(each compared bit for bit with the CPU; the shipped one is multireduce._kernels.EXACT_UNROLL/EXACT_SUMS)",
    )
    p.add_argument(
        "--cols-variants",
        default="",
        help="extra BLOCKxUNROLL launch shapes of the column kernel to time, e.g. 512x8,256x16 "
        "(each is checked against the CPU; the shipped ones are multireduce._kernels.cols_config)",
    )
    p.add_argument(
        "--rows-variants",
        default="",
        help="extra BLOCKxUNROLL[wWAVES][lLOAD][sSPLIT] launches of the row kernel to time, e.g. 256x4,512x4w4,"
        "512x4l1,512x4s2 (waves, load policy 0-3, blocks per row) "
        "(each is checked against the CPU; the shipped one is multireduce._kernels.rows_config)",
    )
    p.add_argument(
        "--round-modes",
        default="host,device",
        help="where the reproducible sum is rounded, each timed and checked bit for bit: host (the accumulator "
        "comes back and is rounded by multireduce._exact) and/or device (exact_round_kernel); the shipped "
        "default is multireduce._backend.cupy.ROUND_ON_DEVICE",
    )
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def _rows_variant(text: str):
    """BLOCKxUNROLL[wWAVES][lLOAD][sSPLIT] -> a stand-in for multireduce._kernels.rows_config."""
    from multireduce import _kernels

    m = re.fullmatch(r"(\d+)x(\d+)(?:w(\d+))?(?:l(\d))?(?:s(\d+))?", text)
    if m is None:
        raise SystemExit(f"bad --rows-variants entry {text!r}: expected BLOCKxUNROLL[wWAVES][lLOAD][sSPLIT]")
    block, unroll, waves, load, split = m.groups()
    shipped = _kernels.rows_config()
    config = (int(block), int(unroll), int(waves or 0), shipped[3] if load is None else int(load), int(split or 0))
    return lambda: config


def timing_options(args) -> SimpleNamespace:
    """The options bench_kernel.measure reads."""
    return SimpleNamespace(
        max_inner=5,
        target_batch_us=5000.0,
        min_spin_us=1000.0,
        warmup=args.warmup,
        budget=2.0,
        min_repeat=3,
        repeat=args.repeat,
    )


def timed(timer, fn, opts) -> dict:
    return bk.measure(timer, fn, opts).summary()


def check_against_cpu(cp, mr, got, host, op, axis) -> bool:
    ref = np.asarray(mr.reduce(host, op, axis=axis))
    got = cp.asnumpy(got)
    if op in ("sum", "nansum", "prod", "nanprod"):
        return bool(np.allclose(got, ref, rtol=1e-6, atol=1e-3))
    return bool(np.array_equal(got, ref))


def time_variant(ctx, op: str, case: str, variant: str, attr: str, config, axis: int, full: dict) -> dict:
    """Time ``mr.reduce(x, op, axis=axis)`` with ``multireduce._kernels.<attr>`` set to ``config``.

    The launch reads that function at each call; the shipped one is put back afterwards. The
    result is checked against the CPU (a mismatch goes to ``ctx.failures``), and the record,
    appended to ``ctx.variants``, is returned.
    """
    from multireduce import _kernels

    shipped = getattr(_kernels, attr)
    setattr(_kernels, attr, config)
    try:
        ok = check_against_cpu(ctx.cp, ctx.mr, ctx.mr.reduce(ctx.x, op, axis=axis), ctx.host, op, axis)
        t = timed(ctx.timer, lambda: ctx.mr.reduce(ctx.x, op, axis=axis), ctx.opts)
    finally:
        setattr(_kernels, attr, shipped)
    if not ok:
        ctx.failures.append(f"{op} {case} {variant}: does not match the CPU")
    us = t["median_us"]
    rec = {"op": op, "case": case, "variant": variant, "us": us, "vs_full": full["median_us"] / us}
    ctx.variants.append(rec)
    return rec


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy as cp

    import multireduce as mr
    from multireduce import _provenance

    device = bk.device_info(cp)
    timer = bk.DeviceTimer(cp, bk.compile_seed_module(cp).get_function("spin_kernel"))
    timer.calibrate()
    opts = timing_options(args)
    side = args.side
    nbytes = side * side * 4
    x = cp.random.default_rng(0).random((side, side), dtype=cp.float32) * 2 - 1
    host = cp.asnumpy(x)
    records, failures = [], []
    from multireduce import _kernels

    variants = []
    ctx = SimpleNamespace(cp=cp, mr=mr, x=x, host=host, timer=timer, opts=opts, failures=failures, variants=variants)
    for op in [] if args.skip_axis else args.ops.split(","):
        peer_fn = getattr(cp, op)  # cupy.sum, cupy.nanmax, cupy.count_nonzero, ...
        full = timed(timer, lambda op=op, a=x: mr.reduce(a, op), opts)
        if not check_against_cpu(cp, mr, mr.reduce(x, op), host, op, None):
            failures.append(f"{op} full: does not match the CPU")
        full_cupy = timed(timer, lambda f=peer_fn, a=x: f(a), opts)
        records.append(
            {
                "op": op,
                "case": "full (axis=None)",
                "shape": [side, side],
                "dtype": "float32",
                "ours_us": full["median_us"],
                "cupy_us": full_cupy["median_us"],
                "ours_gbps": nbytes / full["median_us"] / 1e3,
                "vs_cupy": full_cupy["median_us"] / full["median_us"],
                "timing": {"ours": full, "cupy": full_cupy},
            }
        )
        bk.say(
            f"{op:>4} {'full (axis=None)':<17} ours {full['median_us']:9.1f} us "
            f"({records[-1]['ours_gbps']:6.0f} GB/s)  cupy {full_cupy['median_us']:9.1f} us  "
            f"{records[-1]['vs_cupy']:.2f}x cupy"
        )
        cases = {"rows (axis=-1)": -1, "columns (axis=0)": 0}
        for label, axis in cases.items():
            ours = mr.reduce(x, op, axis=axis)
            if not check_against_cpu(cp, mr, ours, host, op, axis):
                failures.append(f"{op} {label}: does not match the CPU")
            t_ours = timed(timer, lambda op=op, axis=axis, a=x: mr.reduce(a, op, axis=axis), opts)
            t_cupy = timed(timer, lambda f=peer_fn, axis=axis, a=x: f(a, axis=axis), opts)
            rec = {
                "op": op,
                "case": label,
                "shape": [side, side],
                "dtype": "float32",
                "ours_us": t_ours["median_us"],
                "cupy_us": t_cupy["median_us"],
                "full_us": full["median_us"],
                "ours_gbps": nbytes / t_ours["median_us"] / 1e3,
                "vs_full": full["median_us"] / t_ours["median_us"],
                "vs_cupy": t_cupy["median_us"] / t_ours["median_us"],
                "timing": {"ours": t_ours, "cupy": t_cupy, "full": full},
            }
            rec["status"] = "PASS" if rec["vs_full"] >= 0.9 and rec["vs_cupy"] >= 1.0 else "MISS"
            records.append(rec)
            if axis == -1:
                rows_cupy_us = rec["cupy_us"]
            bk.say(
                f"{op:>4} {label:<17} ours {rec['ours_us']:9.1f} us ({rec['ours_gbps']:6.0f} GB/s)  "
                f"cupy {rec['cupy_us']:9.1f} us  full {rec['full_us']:9.1f} us  "
                f"{rec['vs_full']:.2f}x full, {rec['vs_cupy']:.2f}x cupy  {rec['status']}"
            )
        for v in filter(None, args.rows_variants.split(",")):
            config = _rows_variant(v)
            rec = time_variant(ctx, op, "rows", v, "rows_config", config, -1, full)
            rec["vs_cupy"] = rows_cupy_us / rec["us"]
            bk.say(
                f"{op:>4} rows variant {v:<10} {rec['us']:9.1f} us  {rec['vs_full']:.2f}x full, "
                f"{rec['vs_cupy']:.2f}x cupy"
            )
        for v in filter(None, args.cols_variants.split(",")):
            block, unroll = (int(k) for k in v.split("x"))
            config = lambda op, dtype, acc, b=block, u=unroll: (b, u)  # noqa: E731
            rec = time_variant(ctx, op, "columns", v, "cols_config", config, 0, full)
            bk.say(f"{op:>4} columns variant {v:<8} {rec['us']:9.1f} us  {rec['vs_full']:.2f}x full")
    del x
    bk.release_memory(cp)

    repro = None
    if not args.skip_repro:
        n = args.repro_n
        y = cp.random.default_rng(1).random(n, dtype=cp.float32)
        # GPU vs CPU bits on the first 2^26 elements (the CPU's exact sum of 2^30 takes a
        # minute; tests/test_reproducible.py compares many more cases).
        head = y[: min(n, 1 << 26)]
        exact_gpu = mr.sum(head, reproducible=True)
        exact_cpu = mr.sum(cp.asnumpy(head), reproducible=True)
        same = exact_gpu.get().tobytes() == np.asarray(exact_cpu).tobytes()
        if not same:
            failures.append("reproducible sum: GPU and CPU bits differ")
        exact_gpu_full = mr.sum(y, reproducible=True).get().tobytes()
        fast = timed(timer, lambda: mr.sum(y), opts)
        slow = timed(timer, lambda: mr.sum(y, reproducible=True), opts)
        repro = {
            "n": n,
            "fast_us": fast["median_us"],
            "reproducible_us": slow["median_us"],
            "ratio": fast["median_us"] / slow["median_us"],
            "gpu_equals_cpu_bits": same,
            "bits_compared_on": int(head.size),
            "timing": {"fast": fast, "reproducible": slow},
        }
        repro["status"] = "PASS" if repro["ratio"] >= 0.8 and same else "MISS"
        repro["variants"] = []
        for v in filter(None, args.exact_variants.split(",")):
            unroll, sums = (int(k) for k in v.split("x"))
            shipped_exact = (_kernels.EXACT_UNROLL, _kernels.EXACT_SUMS)
            _kernels.EXACT_UNROLL, _kernels.EXACT_SUMS = unroll, sums  # read at each call
            try:
                v_same = mr.sum(head, reproducible=True).get().tobytes() == np.asarray(exact_cpu).tobytes()
                v_full = mr.sum(y, reproducible=True).get().tobytes() == exact_gpu_full
                t = timed(timer, lambda: mr.sum(y, reproducible=True), opts)
            finally:
                _kernels.EXACT_UNROLL, _kernels.EXACT_SUMS = shipped_exact
            ratio = fast["median_us"] / t["median_us"]
            ok = v_same and v_full
            repro["variants"].append({"variant": v, "us": t["median_us"], "ratio": ratio, "bits_ok": ok})
            bk.say(
                f"reproducible sum variant {v}: {t['median_us']:.1f} us = {ratio:.2f}x fast; "
                f"bits equal to the CPU (2^26) and to the shipped kernel (2^30): {ok}"
            )
            if not (v_same and v_full):
                failures.append(f"reproducible sum variant {v}: bits differ")
        # Where the rounding runs: on the host (the limbs come back, the stream waits) or in
        # exact_round_kernel (nothing waits). Both are checked against the CPU's bits.
        from multireduce._backend import cupy as gpu

        repro["round_modes"] = {}
        for mode in filter(None, args.round_modes.split(",")):
            shipped_round = gpu.ROUND_ON_DEVICE
            gpu.ROUND_ON_DEVICE = mode == "device"
            try:
                m_same = mr.sum(head, reproducible=True).get().tobytes() == np.asarray(exact_cpu).tobytes()
                m_full = mr.sum(y, reproducible=True).get().tobytes() == exact_gpu_full
                t = timed(timer, lambda: mr.sum(y, reproducible=True), opts)
            finally:
                gpu.ROUND_ON_DEVICE = shipped_round
            ratio = fast["median_us"] / t["median_us"]
            repro["round_modes"][mode] = {"us": t["median_us"], "ratio": ratio, "bits_ok": m_same and m_full}
            bk.say(
                f"reproducible sum, rounded on the {mode}: {t['median_us']:.1f} us = {ratio:.2f}x fast; "
                f"bits equal to the CPU (2^26) and to the shipped path (2^30): {m_same and m_full}"
            )
            if not (m_same and m_full):
                failures.append(f"reproducible sum rounded on the {mode}: bits differ")
        # The exact kernel alone (no rounding, no result): what the rounding costs on top.
        with y.device:
            repro["kernel_only_us"] = timed(timer, lambda: gpu._exact_launch(y), opts)["median_us"]
        bk.say(f"exact-sum kernel alone: {repro['kernel_only_us']:.1f} us")
        repro["round_on_device_shipped"] = gpu.ROUND_ON_DEVICE
        # The exact kernel's speed depends on the data's dynamic range: also a normal sample
        # (values near 0 fall below a thread's window) and a +-1e+-30 mix (the slow path).
        z = cp.random.default_rng(2).standard_normal(n, dtype=cp.float32)
        repro["normal_us"] = timed(timer, lambda: mr.sum(z, reproducible=True), opts)["median_us"]
        del z
        w = cp.random.default_rng(3).random(1 << 24, dtype=cp.float32)
        w *= cp.where(cp.arange(w.size) % 3 == 0, cp.float32(1e30), cp.float32(1e-30))
        repro["wide_2_24_us"] = timed(timer, lambda: mr.sum(w, reproducible=True), opts)["median_us"]
        repro["fast_2_24_us"] = timed(timer, lambda: mr.sum(w), opts)["median_us"]
        del w, y
        # Random signs and exponents over 33 binades (2^-24 .. 2^8): wider than one thread's
        # window (20), inside the window and the low window below it (20 + 19).
        rs = cp.random.RandomState(5)
        s33 = (1 + rs.random_sample(n, dtype=cp.float32)) * cp.exp2(rs.randint(-24, 9, size=n).astype(cp.float32))
        s33 *= cp.where(rs.random_sample(n, dtype=cp.float32) < 0.5, cp.float32(-1), cp.float32(1))
        repro["spread33_us"] = timed(timer, lambda: mr.sum(s33, reproducible=True), opts)["median_us"]
        repro["spread33_fast_us"] = timed(timer, lambda: mr.sum(s33), opts)["median_us"]
        head33 = s33[: 1 << 24]
        repro["spread33_bits_ok"] = bool(
            mr.sum(head33, reproducible=True).get().tobytes()
            == np.asarray(mr.sum(head33.get(), reproducible=True)).tobytes()
        )
        del s33, head33
        if not repro["spread33_bits_ok"]:
            failures.append("reproducible sum of the 33-binade spread: GPU bits differ from the CPU's")
        bk.say(
            f"reproducible sum, normal 2^{n.bit_length() - 1}: {repro['normal_us']:.1f} us; +-1e+-30 mix 2^24: "
            f"{repro['wide_2_24_us']:.1f} us (fast {repro['fast_2_24_us']:.1f} us); 33-binade spread "
            f"2^{n.bit_length() - 1}: {repro['spread33_us']:.1f} us (fast {repro['spread33_fast_us']:.1f} us), "
            f"GPU == CPU bits (2^24 head): {repro['spread33_bits_ok']}"
        )
        bk.say(
            f"reproducible sum 2^{n.bit_length() - 1} float32: {slow['median_us']:.1f} us vs fast "
            f"{fast['median_us']:.1f} us = {repro['ratio']:.2f}x (target >= 0.8x); GPU == CPU bits: {same}  "
            f"{repro['status']}"
        )

    git = _provenance.git_state()
    slug = "".join(c if c.isalnum() else "-" for c in device["name"].lower()).strip("-")
    path = args.out or REPO / "bench" / "results" / f"axis_{slug}_{git['commit'][:7]}.json"
    meta = {"git_commit": git["commit"], "git": git, "gpu": device, "argv": sys.argv}
    bk.write_json(
        path, {"meta": meta, "axis": records, "cols_variants": variants, "reproducible": repro, "failures": failures}
    )
    for f in failures:
        bk.say(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
