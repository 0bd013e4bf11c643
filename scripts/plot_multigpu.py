"""Plot a ``bench_multigpu.py`` JSON file: time per call and combine phase against GPU count.

    python scripts/plot_multigpu.py bench/results/<dir>/multigpu.json [more.json ...]

Writes ``<file>.png`` next to each input: per op, the median time of one distributed call
(weak and strong scaling) and the combine phase (distributed call minus the local reduction),
both against the rank count, with the weak-scaling efficiency in the legend.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(path.read_text())
    summary = doc["summary"]
    ops = list(dict.fromkeys(s["op"] for s in summary))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    for op in ops:
        rows = [s for s in summary if s["op"] == op]
        ranks = [s["ranks"] for s in rows]
        eff = rows[-1]["weak_efficiency"]
        axes[0].plot(ranks, [s["weak_total_us"] / 1e3 for s in rows], "o-", label=f"{op} (eff {eff:.2f})")
        axes[1].plot(ranks, [s["strong_total_us"] / 1e3 for s in rows], "o-", label=op)
        axes[2].plot(ranks, [s["weak_combine_us"] for s in rows], "o-", label=f"{op}, weak")
    titles = (
        f"weak: {doc['weak_per_rank'] * 4 / 2**30:g} GiB float32 per GPU",
        f"strong: {doc['strong_n'] * 4 / 2**30:g} GiB float32 in total",
        "combine phase (call - local reduction)",
    )
    for ax, t, unit in zip(axes, titles, ("ms", "ms", "us"), strict=True):
        ax.set_title(t)
        ax.set_xlabel("GPUs (one MPI rank each)")
        ax.set_ylabel(f"{unit} per call (median, max over ranks)")
        ax.set_xticks(sorted({s["ranks"] for s in summary}))
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(f"bench_multigpu: {doc['gpus_visible']} x {doc['gpu']}, commit {doc['git_commit'][:7]}")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv:
        print(f"wrote {plot(Path(name))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
