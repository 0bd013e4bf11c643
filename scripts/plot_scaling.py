"""PNG plots of a bench_scaling JSON: time and efficiency vs ranks, a roofline, MPI vs Dask, latency.

``python scripts/plot_scaling.py bench/results/scaling_<tag>_<commit>.json [--outdir DIR]``
writes, next to the JSON unless ``--outdir`` is given:

``<stem>_time.png``       reduce time (kernel + combine, max over ranks) and efficiency vs
                          rank count, weak and strong scaling, one line per op;
``<stem>_roofline.png``   kernel GB/s vs size (one rank) with the measured copy bandwidths as
                          horizontal ceilings;
``<stem>_mpi_dask.png``   MPI vs Dask reduce time per rank/worker count (sum);
``<stem>_latency.png``    MPI_Allreduce latency vs rank count (marked where oversubscribed).

Needs matplotlib (``pip install 'multireduce[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", type=Path, help="output of scripts/bench_scaling.py")
    p.add_argument("--outdir", type=Path, default=None, help="directory for the PNGs (default: the JSON's)")
    return p.parse_args(argv)


def series(records: list[dict], kind: str, scaling: str, op: str, key: str) -> tuple[list[int], list[float]]:
    """Sorted (count, value) of mpi or dask records for one scaling mode and op; None values dropped."""
    count = "ranks" if kind == "mpi" else "workers"
    pts = sorted(
        (r[count], r[key])
        for r in records
        if r["kind"] == kind and r["scaling"] == scaling and r["op"] == op and r.get(key) is not None
    )
    return [c for c, _ in pts], [v for _, v in pts]


def title(doc: dict) -> str:
    where = "CPU" if doc["backend"] == "cpu" else f"{doc['gpu_count']} x {doc['gpu']}"
    return f"{where}, {doc['host']}, commit {doc['git_commit'][:7]}"


def plot_time(doc: dict, plt, out: Path) -> Path:
    recs = doc["records"]
    ops = sorted({r["op"] for r in recs if r["kind"] in ("mpi", "dask")})
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for col, scaling in enumerate(("weak", "strong")):
        for op in ops:
            x, t = series(recs, "mpi", scaling, op, "reduce_s")
            if x:  # the Dask part also has stats, the MPI part (the CLI's ops) does not
                axes[0][col].plot(x, [v * 1e3 for v in t], "o-", label=f"MPI {op}")
                x, e = series(recs, "mpi", scaling, op, "efficiency")
                axes[1][col].plot(x, e, "o-", label=f"MPI {op}")
            x, t = series(recs, "dask", scaling, op, "reduce_s")
            if x:
                axes[0][col].plot(x, [v * 1e3 for v in t], "s--", label=f"Dask {op}")
                x, e = series(recs, "dask", scaling, op, "efficiency")
                axes[1][col].plot(x, e, "s--", label=f"Dask {op}")
        axes[0][col].set_title(f"{scaling} scaling: time per reduction (kernel + combine)")
        axes[0][col].set_ylabel("ms (max over ranks)")
        axes[0][col].set_yscale("log")
        axes[1][col].axhline(1.0, color="grey", lw=0.8)
        axes[1][col].set_ylabel("efficiency")
        axes[1][col].set_xlabel("ranks / workers")
        axes[1][col].set_xscale("log", base=2)
        axes[0][col].legend(fontsize=7)
    fig.suptitle(title(doc))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_roofline(doc: dict, plt, out: Path) -> Path:
    recs = doc["records"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for op in sorted({r["op"] for r in recs if r["kind"] == "sweep"}):
        pts = sorted((r["bytes"], r["kernel_gbps"]) for r in recs if r["kind"] == "sweep" and r["op"] == op)
        ax.plot([b for b, _ in pts], [g for _, g in pts], "o-", label=f"kernel {op} (1 rank)")
    for r in recs:
        if r["kind"] == "bandwidth":
            ax.axhline(r["gbps"], ls=":", color="k" if r["link"] in ("host_memcpy", "device_to_device") else "tab:red")
            ax.annotate(f"{r['link']} {r['gbps']:.0f} GB/s", (ax.get_xlim()[0], r["gbps"]), fontsize=7, va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes reduced")
    ax.set_ylabel("GB/s (bytes read / kernel time)")
    ax.set_title(f"Roofline: kernel vs measured copy bandwidth\n{title(doc)}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_mpi_dask(doc: dict, plt, out: Path) -> Path:
    recs = doc["records"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, scaling in zip(axes, ("weak", "strong"), strict=True):
        for kind, style in (("mpi", "o-"), ("dask", "s--")):
            x, t = series(recs, kind, scaling, "sum", "reduce_s")
            if x:
                ax.plot(x, [v * 1e3 for v in t], style, label=f"{kind.upper() if kind == 'mpi' else 'Dask'} sum")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks / workers")
        ax.set_ylabel("ms per reduction")
        ax.set_title(f"{scaling} scaling, sum")
        if ax.get_lines():
            ax.legend(fontsize=8)
    fig.suptitle(f"MPI (multireduce.mpi) vs Dask (treereduce): {title(doc)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_latency(doc: dict, plt, out: Path) -> Path:
    recs = [r for r in doc["records"] if r["kind"] == "latency"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for payload in sorted({r["payload"] for r in recs}):
        pts = sorted((r["ranks"], r["us_median"], r["oversubscribed"]) for r in recs if r["payload"] == payload)
        line = ax.plot([p for p, _, _ in pts], [u for _, u, _ in pts], "o-", label=payload)[0]
        over = [(p, u) for p, u, o in pts if o]
        if over:
            ax.plot([p for p, _ in over], [u for _, u in over], "x", ms=12, color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (x: more ranks than cores, oversubscribed)")
    ax.set_ylabel("us per call (median, max over ranks)")
    lib = recs[0]["mpi_library"] if recs else ""
    ax.set_title(f"Allreduce latency vs ranks, {lib[:40]}\n{title(doc)}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_all(doc: dict, outdir: Path, stem: str) -> list[Path]:
    """Write every plot for which ``doc`` has records; return the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    kinds = {r["kind"] for r in doc["records"]}
    written = []
    if kinds & {"mpi", "dask"}:
        written.append(plot_time(doc, plt, outdir / f"{stem}_time.png"))
        written.append(plot_mpi_dask(doc, plt, outdir / f"{stem}_mpi_dask.png"))
    if "sweep" in kinds:
        written.append(plot_roofline(doc, plt, outdir / f"{stem}_roofline.png"))
    if "latency" in kinds:
        written.append(plot_latency(doc, plt, outdir / f"{stem}_latency.png"))
    return written


def main(argv=None) -> int:
    args = parse_args(argv)
    doc = json.loads(args.json.read_text())
    for path in plot_all(doc, args.outdir or args.json.parent, args.json.stem):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
