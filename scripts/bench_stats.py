"""Benchmark the fused GPU moments and argmin/argmax kernels against their peers, in one run.

On one float32 array (4 GiB and 2**24 elements by default; ``--quick``: 2**24 and 2**20), times
with CUDA events, each case interleaved with the others round after round:

* multireduce: ``stats(x)`` (one fused pass), ``sum(x)`` (the bandwidth reference), ``mean``,
  ``var``, ``argmax``;
* CuPy: ``x.sum(), x.min(), x.max(), x.mean(), x.var()`` (five calls, what ``stats`` replaces),
  ``x.var()`` alone, ``cupy.argmax(x)``;
* PyTorch, if importable, on the same memory: ``torch.var_mean`` and ``torch.aminmax``.

``stats``, ``mean``, ``var`` and ``argmax`` on a CuPy array finalize on the device (CuPy
results, no wait), as ``sum`` does; ``stats, var to host`` and ``sum to host`` add the copy
of one value back (the synchronization), and ``partial(mean)`` returns its state on the host.
GB/s counts the input bytes once per call. The ratio stats/sum (target: >= 0.9) compares the
two calls without a copy back; ``stats_over_sum_to_host`` compares the two with one. The result
of ``stats`` is checked first (mean and var against CuPy's float64 ones within 1e-6, min, max
and argmax equal); a failed check makes the exit status 1. Writes a JSON (``--out``, default
``bench/results/stats_<gpu>_<commit>.json``) with the git commit, the GPU, sizes, times, GB/s,
the checks and the ratios.

Not collected by pytest; run on a GPU machine::

    python scripts/bench_stats.py            # 4 GiB and 2**24 float32
    python scripts/bench_stats.py --quick    # 2**24 and 2**20
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchutil import stats as summarize  # noqa: E402

TARGET_RATIO = 0.9


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2**24 and 2**20 elements instead of 4 GiB and 2**24")
    p.add_argument("--repeat", type=int, default=None, help="timed rounds (default 20; --quick 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    p.add_argument("--out", type=Path, default=None, help="JSON output path")
    return p.parse_args(argv)


def event_time(cp: Any, fn) -> float:
    """Seconds of one call of ``fn``, between CUDA events on the current stream."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e-3


def cases_for(cp: Any, mr: Any, torch: Any, x: Any) -> dict:
    from multireduce._backend import _cupy_stats

    def cupy_five():
        return x.sum(), x.min(), x.max(), x.mean(), x.var()

    cases = {
        "multireduce.stats": lambda: mr.stats(x),
        "multireduce.stats, var to host": lambda: mr.stats(x).var.get(),
        # The fused kernel alone (no copy back, no host finalization).
        "multireduce moments kernel": lambda: _cupy_stats.launch_moments(x, 1, x.size),
        "multireduce.sum": lambda: mr.sum(x),
        # One value copied back (a synchronization): the peer of "stats, var to host".
        "multireduce.sum to host": lambda: mr.sum(x).get(),
        "moments kernel + copy back": lambda: _cupy_stats.launch_moments(x, 1, x.size).get(),
        "multireduce.partial(mean) (state on host)": lambda: mr.partial(x, "mean"),
        "multireduce.mean": lambda: mr.mean(x),
        "multireduce.var": lambda: mr.var(x),
        "multireduce.argmax": lambda: mr.argmax(x),
        "cupy.sum+min+max+mean+var": cupy_five,
        "cupy.var": lambda: x.var(),
        "cupy.argmax": lambda: cp.argmax(x),
    }
    if torch is not None:
        t = torch.as_tensor(x, device="cuda")  # the same memory (__cuda_array_interface__)
        cases["torch.var_mean"] = lambda: torch.var_mean(t, correction=0)
        cases["torch.aminmax"] = lambda: torch.aminmax(t)
    return cases


def run_size(cp: Any, mr: Any, torch: Any, n: int, opts: argparse.Namespace) -> dict:
    rng = cp.random.default_rng(n % 1000)
    x = rng.standard_normal(n, dtype=cp.float32)
    cases = cases_for(cp, mr, torch, x)
    # Correctness first: the fused pass against CuPy's separate passes (float64 accumulation).
    s = mr.stats(x)
    ref_mean = float(x.mean(dtype=cp.float64))
    ref_var = float(x.var(dtype=cp.float64))
    check = {
        "mean_rel_err": abs(float(s.mean) - ref_mean) / max(abs(ref_mean), 1e-30),
        "var_rel_err": abs(float(s.var) - ref_var) / ref_var,
        "min_ok": float(s.min) == float(x.min()),
        "max_ok": float(s.max) == float(x.max()),
        "argmax_ok": int(mr.argmax(x)) == int(cp.argmax(x)),
    }
    for _ in range(opts.warmup):
        for fn in cases.values():
            fn()
    cp.cuda.Device().synchronize()
    samples = {name: [] for name in cases}
    # A new random order every round (seeded), so that no case always follows the same one:
    # a rotation kept each case's predecessor fixed, and in the H200 runs stats() (always
    # after torch.aminmax) took 0.1-0.2 ms more than stats() plus a copy back (always after
    # stats()).
    names = list(cases)
    order = random.Random(n)
    for _ in range(opts.repeat):
        order.shuffle(names)
        for name in names:
            samples[name].append(event_time(cp, cases[name]))
    nbytes = n * 4
    timings = {}
    for name, secs in samples.items():
        summary = summarize(secs)
        timings[name] = summary | {"gbps": nbytes / (summary["median_ms"] * 1e-3) / 1e9}
    ratio = timings["multireduce.sum"]["median_ms"] / timings["multireduce.stats"]["median_ms"]
    host_ratio = (
        timings["multireduce.sum to host"]["median_ms"] / timings["multireduce.stats, var to host"]["median_ms"]
    )
    kernel_ratio = timings["multireduce.sum"]["median_ms"] / timings["multireduce moments kernel"]["median_ms"]
    del x, cases
    cp.get_default_memory_pool().free_all_blocks()
    return {
        "n": n,
        "bytes": nbytes,
        "timings": timings,
        "stats_over_sum_bandwidth": ratio,
        "stats_over_sum_to_host_bandwidth": host_ratio,
        "moments_kernel_over_sum_bandwidth": kernel_ratio,
        "check": check,
        "check_ok": check["mean_rel_err"] <= 1e-6
        and check["var_rel_err"] <= 1e-6
        and check["min_ok"]
        and check["max_ok"]
        and check["argmax_ok"],
    }


def main(argv=None) -> int:
    opts = parse_args(argv)
    if opts.repeat is None:
        opts.repeat = 10 if opts.quick else 20
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # benchmark this checkout, installed or not
    import cupy as cp

    import multireduce as mr
    from multireduce import _provenance

    try:
        import torch

        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    sizes = [2**24, 2**20] if opts.quick else [(4 << 30) // 4, 2**24]
    git = _provenance.git_state()
    results = []
    for n in sizes:
        r = run_size(cp, mr, torch, n, opts)
        results.append(r)
        verdict = "ok" if r["check_ok"] else "FAILED"
        print(f"n = {n} ({r['bytes'] / 2**30:.3f} GiB float32): check {r['check']} ({verdict})")
        for case, t in r["timings"].items():
            print(f"  {case:44s} {t['median_ms']:9.3f} ms  {t['gbps']:8.0f} GB/s")
        verdict = "meets" if r["stats_over_sum_bandwidth"] >= TARGET_RATIO else "MISSES"
        print(f"  stats/sum bandwidth ratio {r['stats_over_sum_bandwidth']:.3f} ({verdict} the {TARGET_RATIO} target)")
        print(f"  moments kernel alone / sum: {r['moments_kernel_over_sum_bandwidth']:.3f}")
        print(f"  stats, var to host / sum to host bandwidth ratio: {r['stats_over_sum_to_host_bandwidth']:.3f}")
    document = {
        "meta": {
            "git": git,
            "gpu": name.strip("\x00 "),
            "cupy": cp.__version__,
            "torch": None if torch is None else torch.__version__,
            "repeat": opts.repeat,
            "warmup": opts.warmup,
            "quick": opts.quick,
            "target_ratio": TARGET_RATIO,
        },
        "results": results,
    }
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"
    out = opts.out or REPO / "bench" / "results" / f"stats_{slug}_{(git['commit'] or 'unknown')[:7]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all(r["check_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
