"""The seed's end-to-end table (16M float32, transfers included) on this machine's GPU.

The seed document measured 2^24 float32 values on a Tesla T4, end to end with the transfers
included: CPU 52 ms, GPU with one atomicAdd per element 47.5 ms, GPU tree kernel 14.8 ms
(3.52x). This script measures the same rows, with the same method (host wall-clock time of
one whole reduction from host memory, median of --repeat after --warmup), plus multireduce:

- numpy on the host CPU (``np.sum``);
- the atomicAdd-per-element kernel (``scripts/seed_kernels.cu``): copy to the device,
  zero the output, launch, copy the result back;
- the seed's tree kernel (256 threads, shared-memory tree, one atomicAdd per block), same;
- multireduce from ordinary pageable memory (``multireduce.stream.reduce``);
- multireduce from pinned memory (``multireduce.stream.reduce`` of a pinned array).

Every row's relative error against the exact sum is recorded (the data are small integers, so
the exact sum is known). multireduce's rows must be within 1e-7 of it (a failure otherwise);
the seed's kernels accumulate in float32 (a running float32 sum per block, and float32
atomicAdds) and are off by 1e-4 to 1e-3 here: they are reported as they are, not failed.
Writes JSON and a bar chart like the seed's figure (matplotlib, the ``bench`` extra) next to
the seed's T4 figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_kernel as bk  # noqa: E402  (seed kernels, device info, JSON helpers)

T4_MS = {"numpy (host CPU)": 52.0, "seed atomicAdd per element": 47.5, "seed tree kernel": 14.8}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1 << 24)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--atomic-repeat", type=int, default=5, help="repeats of the slow atomic-per-element row")
    p.add_argument("--out", type=Path, default=None, help="JSON path (the PNG goes beside it)")
    return p.parse_args(argv)


def wall_ms(fn, warmup: int, repeat: int) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples), samples


def plot(rows: list[dict], png: Path, gpu: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["row"] for r in rows]
    ours = [r["ms"] for r in rows]
    t4 = [T4_MS.get(label) for label in labels]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    y = np.arange(len(labels))
    ax.barh(y + 0.2, ours, height=0.4, label=gpu)
    ax.barh(y - 0.2, [np.nan if v is None else v for v in t4], height=0.4, label="Tesla T4 (the seed)", alpha=0.6)
    for yi, v in zip(y, ours, strict=True):
        ax.text(v, yi + 0.2, f" {v:.2f} ms", va="center", fontsize=8)
    ax.set_yticks(y, labels)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("ms, end to end with transfers (log scale)")
    ax.set_title("Sum of 16M float32 values, end to end")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy as cp

    from multireduce import _provenance, stream

    n = args.n
    device = bk.device_info(cp)
    host = (np.arange(n, dtype=np.int64) % 1024).astype(np.float32)  # small integers: exact sum known
    exact = int((np.arange(n, dtype=np.int64) % 1024).sum())
    module = bk.compile_seed_module(cp)
    tree = module.get_function(bk.seed_name(bk.SEED_TEMPLATES["seed-tree"], "float32"))
    atomic = module.get_function(bk.seed_name(bk.SEED_TEMPLATES["seed-atomic"], "float32"))

    def seed(kernel):
        def run():
            d = cp.asarray(host)  # pageable host-to-device copy, as the seed's cudaMemcpy
            out = cp.zeros(1, dtype=cp.float32)
            blocks = (n + 255) // 256
            kernel((blocks,), (256,), (d, out, np.int32(n)))
            return float(out.get()[0])

        return run

    pinned_mem = cp.cuda.alloc_pinned_memory(host.nbytes)
    pinned = np.frombuffer(pinned_mem, dtype=np.float32, count=n)
    pinned[...] = host
    cases = {
        "numpy (host CPU)": (lambda: float(np.sum(host)), args.repeat),
        "seed atomicAdd per element": (seed(atomic), args.atomic_repeat),
        "seed tree kernel": (seed(tree), args.repeat),
        "multireduce, pageable memory": (lambda: float(stream.reduce(host, "sum")), args.repeat),
        "multireduce, pinned memory": (lambda: float(stream.reduce(pinned, "sum")), args.repeat),
    }
    rows, failures = [], []
    for label, (fn, repeat) in cases.items():
        value = fn()
        # float32 sums of 2^24 values may round; the tree and multireduce must be within
        # float32 rounding of the exact sum, the atomic kernel is reported as it is.
        rel = abs(value - exact) / exact
        ms, samples = wall_ms(fn, args.warmup, repeat)
        rows.append({"row": label, "ms": ms, "samples_ms": samples, "value": value, "rel_err": rel})
        if label.startswith("multireduce") and rel > 1e-7:
            failures.append(f"{label}: relative error {rel:.2e}")
        bk.say(f"{label:<32} {ms:9.3f} ms  (T4: {T4_MS.get(label, '-')})  value {value:.6g}  rel.err {rel:.1e}")
    numpy_ms = rows[0]["ms"]
    for r in rows:
        r["speedup_vs_numpy"] = numpy_ms / r["ms"]

    git = _provenance.git_state()
    slug = "".join(c if c.isalnum() else "-" for c in device["name"].lower()).strip("-")
    path = args.out or REPO / "bench" / "results" / f"seed_table_{slug}_{git['commit'][:7]}.json"
    meta = {"git_commit": git["commit"], "git": git, "gpu": device, "n": n, "t4_ms": T4_MS}
    bk.write_json(path, {"meta": meta, "rows": rows, "failures": failures})
    try:
        plot(rows, path.with_suffix(".png"), device["name"])
    except ModuleNotFoundError as exc:  # matplotlib is the optional `bench` extra
        bk.say(f"no bar chart: {exc} (pip install -e '.[bench]')")
    for f in failures:
        bk.say(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
