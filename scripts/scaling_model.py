"""The scaling model of docs/scaling.md: predicted time per distributed reduction from measured parts.

One distributed reduction on ``p`` ranks (one GPU each), ``B`` bytes per rank::

    T(p, B)      = t_kernel(B) + t_combine(p)
    t_combine(p) = O_1 + 2 * (L(p) - L(1))          # two MPI_Allreduce calls per sum
    L(p)         = a + b * log2(p)                  # one node, fitted to measured latencies
    L(g x N)     = L(g) + ceil(log2 N) * h          # g GPUs per node, N nodes, h per hop
    t_copy(B)    = B / link bandwidth               # host to device, if the data starts on the host

Weak scaling efficiency is ``T(1, B) / T(p, B)``; strong scaling efficiency is
``T(1, B_total) / (p T(p, B_total / p))``. Dask::

    T_dask(w) = F + tasks(w) * c + t_kernel(B_total / w)

with ``F`` the fixed cost of one ``compute()``, ``c`` the cost of one task and
``tasks(w)`` the tasks of a ``treereduce`` over ``k w`` chunks (treereduce's default fan-in:
one aggregate up to 64 chunks). ``t_kernel`` interpolates the committed H200 kernel times (log-log between
measured sizes, proportional to bytes beyond the largest).

``python scripts/scaling_model.py [--gpu-scaling FILE] [--cpu-scaling FILE]`` prints the tables of
docs/scaling.md. ``--gpu-scaling`` takes a ``bench_scaling.py`` JSON from the GPU machine: its
8-byte ``MPI_Allreduce`` latencies (1-8 ranks) replace the Open MPI figures of
``bench_mpi_n{1,2,4}.json``, and its Dask task overhead replaces the CPU run's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
KERNEL_JSON = "bench/results/kernel_h200_adcb0f5.json"
MPI_H200_DIR = "bench/results/mpi_h200_cf98947"
#: The latest 1-rank bench_mpi run on the H200 (after the pinned staging of the MPI layer).
LAYER_OVERHEAD_JSON = "bench/results/h200_9a51d59/bench_mpi_n1.json"
GiB = 2**30


@dataclass(frozen=True)
class Inputs:
    """Every measured number the model uses, in seconds, bytes and bytes/s, with its source."""

    kernel_sizes: tuple[float, ...]  # bytes, ascending
    kernel_times: tuple[float, ...]  # seconds at those sizes
    latency_a: float  # L(p) = a + b log2 p, seconds
    latency_b: float
    layer_overhead_1: float  # O_1: MPI layer per call over the local reduction, 1 rank
    link_pinned: float = 55e9
    link_pageable: float = 7e9
    dask_fixed: float = 0.0
    dask_per_task: float = 0.0
    sources: dict = field(default_factory=dict)


def kernel_time(inputs: Inputs, nbytes: float) -> float:
    """Interpolated kernel time for ``nbytes`` (log-log; linear in bytes beyond the largest size)."""
    xs, ys = inputs.kernel_sizes, inputs.kernel_times
    if nbytes <= 0:
        raise ValueError("nbytes must be positive")
    if nbytes >= xs[-1]:
        return ys[-1] * nbytes / xs[-1]
    if nbytes <= xs[0]:
        return ys[0]
    return float(np.exp(np.interp(np.log(nbytes), np.log(xs), np.log(ys))))


def latency(inputs: Inputs, ranks_per_node: int, nodes: int = 1, hop: float = 0.0) -> float:
    """MPI_Allreduce latency: intra-node fit, then ``ceil(log2 nodes)`` inter-node hops of ``hop`` s."""
    if ranks_per_node < 1 or nodes < 1:
        raise ValueError("need at least one rank and one node")
    intra = inputs.latency_a + inputs.latency_b * math.log2(ranks_per_node)
    return intra + math.ceil(math.log2(nodes)) * hop


def combine_time(inputs: Inputs, ranks_per_node: int, nodes: int = 1, hop: float = 0.0) -> float:
    """Per-call combine: the 1-rank layer overhead plus two allreduces' extra latency."""
    return inputs.layer_overhead_1 + 2 * (latency(inputs, ranks_per_node, nodes, hop) - latency(inputs, 1))


def predict(
    inputs: Inputs,
    bytes_per_rank: float,
    ranks_per_node: int,
    nodes: int = 1,
    hop: float = 0.0,
    link: float | None = None,
) -> dict:
    """Predicted phases of one distributed reduction (seconds).

    Parameters
    ----------
    inputs : Inputs
    bytes_per_rank : float
    ranks_per_node, nodes : int
        One rank per GPU.
    hop : float, optional
        Inter-node latency per hop, seconds.
    link : float, optional
        Host-to-device bytes/s; None: the data is already on the GPU (no copy phase).

    Returns
    -------
    dict
        ``kernel_s``, ``combine_s``, ``reduce_s`` (their sum), ``copy_s`` (None without
        ``link``), ``total_s`` (reduce plus copy), ``ranks``.
    """
    kernel = kernel_time(inputs, bytes_per_rank)
    combine = combine_time(inputs, ranks_per_node, nodes, hop)
    copy = None if link is None else bytes_per_rank / link
    return {
        "ranks": ranks_per_node * nodes,
        "kernel_s": kernel,
        "combine_s": combine,
        "reduce_s": kernel + combine,
        "copy_s": copy,
        "total_s": kernel + combine + (copy or 0.0),
    }


def weak_efficiency(
    inputs: Inputs, bytes_per_rank: float, ranks_per_node: int, nodes: int = 1, hop: float = 0.0
) -> float:
    """``T(1, B) / T(p, B)`` for the reduction (kernel + combine)."""
    return (
        predict(inputs, bytes_per_rank, 1)["reduce_s"]
        / predict(inputs, bytes_per_rank, ranks_per_node, nodes, hop)["reduce_s"]
    )


def strong_efficiency(
    inputs: Inputs, total_bytes: float, ranks_per_node: int, nodes: int = 1, hop: float = 0.0
) -> float:
    """``T(1, B) / (p T(p, B / p))`` for the reduction (kernel + combine)."""
    p = ranks_per_node * nodes
    t1 = predict(inputs, total_bytes, 1)["reduce_s"]
    return t1 / (p * predict(inputs, total_bytes / p, ranks_per_node, nodes, hop)["reduce_s"])


#: treereduce's default fan-in for full reductions (``multireduce.dask.FULL_SPLIT_EVERY``; the
#: CI test of this model checks the count against the graph Dask builds).
TREEREDUCE_SPLIT_EVERY = 64


def treereduce_tasks(chunks: int, split_every: int | None = None) -> int:
    """Tasks of a 1-D ``treereduce`` over ``chunks`` chunks: one per chunk plus the tree levels.

    ``split_every=None`` is treereduce's default: up to 64 chunks, one aggregate; beyond,
    levels of 64. (The committed measurements in ``docs/scaling.md`` were made with Dask's
    default then, 4: pass ``split_every=4`` to model them.)
    """
    if chunks < 1:
        raise ValueError("need at least one chunk")
    if split_every is None:
        split_every = max(chunks, 2) if chunks <= TREEREDUCE_SPLIT_EVERY else TREEREDUCE_SPLIT_EVERY
    tasks, level = chunks, chunks
    while level > 1:
        level = -(-level // split_every)
        tasks += level
    return tasks if chunks > 1 else tasks + 1  # one chunk still gets its aggregate


def dask_time(inputs: Inputs, total_bytes: float, workers: int, chunks_per_worker: int = 4) -> float:
    """Predicted ``treereduce(...).compute()`` time on ``workers`` workers (one GPU each)."""
    tasks = treereduce_tasks(workers * chunks_per_worker)
    return inputs.dask_fixed + tasks * inputs.dask_per_task + kernel_time(inputs, total_bytes / workers)


# --------------------------------------------------------------------------------------------
# Loading the measured inputs from committed files


def load_kernel_points(path: Path, dtype: str = "float32", op: str = "sum") -> tuple[list[float], list[float]]:
    """(bytes, seconds) of ``peer == "ours"`` records in a bench_kernel JSON, ascending."""
    doc = json.loads(path.read_text())
    rows = sorted(
        (r["bytes_read"], r["median_us"] * 1e-6)
        for r in doc["records"]
        if r["peer"] == "ours" and r["dtype"] == dtype and r["op"] == op and r["status"] == "ok"
    )
    if len(rows) < 2:
        raise ValueError(f"{path}: fewer than two {dtype} {op} kernel records")
    return [b for b, _ in rows], [t for _, t in rows]


def load_openmpi_latency(directory: Path) -> tuple[list[int], list[float]]:
    """(ranks, median 8-byte MPI_Allreduce seconds) from bench_mpi_n*.json (Open MPI, H200 host)."""
    ranks, lat = [], []
    for path in sorted(directory.glob("bench_mpi_n*.json")):
        doc = json.loads(path.read_text())
        ranks.append(doc["ranks"])
        lat.append(statistics.median(r["raw_allreduce_8B_us_median"] for r in doc["records"]) * 1e-6)
    if len(ranks) < 2:
        raise ValueError(f"{directory}: fewer than two bench_mpi_n*.json files")
    return ranks, lat


def load_layer_overhead(path: Path) -> float:
    """Median ``overhead_us_median`` of a 1-rank bench_mpi JSON, in seconds."""
    doc = json.loads(path.read_text())
    if doc["ranks"] != 1:
        raise ValueError(f"{path}: expected a 1-rank run, got {doc['ranks']} ranks")
    return statistics.median(r["overhead_us_median"] for r in doc["records"]) * 1e-6


def fit_log2(ranks: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least-squares ``a + b log2(p)``; returns ``(a, b)``."""
    b, a = np.polyfit(np.log2(np.asarray(ranks, float)), np.asarray(seconds, float), 1)
    return float(a), float(b)


def load_dask_overhead(scaling_json: Path, workers: int = 1) -> tuple[float, float, int]:
    """(fixed s, per-task s, workers) from the ``dask_task_overhead`` record of ``workers`` workers.

    One worker by default: on a small machine more workers compete with the scheduler for the
    cores, which inflates the per-task cost.
    """
    doc = json.loads(scaling_json.read_text())
    recs = [r for r in doc["records"] if r["kind"] == "dask_task_overhead" and r["workers"] == workers]
    if not recs:
        raise ValueError(f"{scaling_json}: no dask_task_overhead record for {workers} worker(s)")
    r = recs[0]
    return r["fixed_s"], r["per_task_s"], r["workers"]


def load_scaling_latency(scaling_json: Path, max_ranks: int = 8) -> tuple[list[int], list[float]]:
    """(ranks, median 8-byte MPI_Allreduce seconds) of the ``latency`` records of a bench_scaling
    JSON, up to ``max_ranks`` ranks and never oversubscribed."""
    doc = json.loads(scaling_json.read_text())
    rows = sorted(
        (r["ranks"], r["us_median"] * 1e-6)
        for r in doc["records"]
        if r["kind"] == "latency"
        and r["payload"] == "allreduce_8B"
        and r["ranks"] <= max_ranks
        and not r["oversubscribed"]
    )
    if len(rows) < 2:
        raise ValueError(f"{scaling_json}: fewer than two 8-byte latency records up to {max_ranks} ranks")
    return [p for p, _ in rows], [t for _, t in rows]


def _shown(path: Path, repo: Path) -> str:
    return str(path.relative_to(repo) if path.is_absolute() and path.is_relative_to(repo) else path)


def load_inputs(repo: Path = REPO, cpu_scaling: Path | None = None, gpu_scaling: Path | None = None) -> Inputs:
    """Build :class:`Inputs` from the committed results.

    ``gpu_scaling``: a bench_scaling JSON from the GPU machine, for the MPI latency and the Dask
    overhead; ``cpu_scaling``: one from a CPU machine, for the Dask overhead where
    ``gpu_scaling`` is not given.
    """
    sizes, times = load_kernel_points(repo / KERNEL_JSON)
    overhead = load_layer_overhead(repo / LAYER_OVERHEAD_JSON)
    sources = {
        "kernel": f"{KERNEL_JSON} (float32 sum, peer ours, median_us)",
        "layer_overhead_1": f"{LAYER_OVERHEAD_JSON} overhead_us_median",
        "links": "../shared/BASELINES.md (55 GB/s pinned, 7-8.7 GB/s pageable)",
    }
    if gpu_scaling is not None:
        ranks, lat = load_scaling_latency(gpu_scaling)
        sources["latency"] = f"{_shown(gpu_scaling, repo)} latency allreduce_8B, ranks {ranks}"
    else:
        ranks, lat = load_openmpi_latency(repo / MPI_H200_DIR)
        sources["latency"] = f"{MPI_H200_DIR}/bench_mpi_n{{1,2,4}}.json raw_allreduce_8B_us_median (Open MPI 4.1.6)"
    a, b = fit_log2(ranks, lat)
    links = {"h2d_pinned": 55e9, "h2d_pageable": 7e9}
    if gpu_scaling is not None:
        measured = {
            r["link"]: r["gbps"] * 1e9
            for r in json.loads(gpu_scaling.read_text())["records"]
            if r["kind"] == "bandwidth" and r["link"] in links
        }
        if measured:
            links.update(measured)
            sources["links"] = f"{_shown(gpu_scaling, repo)} bandwidth {sorted(measured)}"
    fixed = per_task = 0.0
    dask_source = gpu_scaling if gpu_scaling is not None else cpu_scaling
    if dask_source is not None:
        fixed, per_task, workers = load_dask_overhead(dask_source)
        sources["dask"] = f"{_shown(dask_source, repo)} dask_task_overhead, {workers} workers"
    return Inputs(
        tuple(sizes),
        tuple(times),
        a,
        b,
        overhead,
        link_pinned=links["h2d_pinned"],
        link_pageable=links["h2d_pageable"],
        dask_fixed=fixed,
        dask_per_task=per_task,
        sources=sources,
    )


# --------------------------------------------------------------------------------------------


def tables(inputs: Inputs) -> str:
    """The Markdown tables of docs/scaling.md."""
    us = 1e6
    lines = [
        f"Fitted intra-node latency: L(p) = {inputs.latency_a * us:.2f} + {inputs.latency_b * us:.2f} log2(p) us; "
        f"O_1 = {inputs.layer_overhead_1 * us:.1f} us.",
        "",
    ]
    lines += [
        "Weak scaling, 4 GiB float32 per GPU, data on the GPU:",
        "",
        "| GPUs | kernel us | combine us | reduce us | efficiency |",
        "|---|---|---|---|---|",
    ]
    for p in (1, 2, 4, 8):
        r = predict(inputs, 4 * GiB, p)
        lines.append(
            f"| {p} | {r['kernel_s'] * us:,.0f} | {r['combine_s'] * us:.1f} | {r['reduce_s'] * us:,.0f} | "
            f"{weak_efficiency(inputs, 4 * GiB, p):.1%} |"
        )
    lines += [
        "",
        "Strong scaling, 16 GiB float32 in total, data on the GPU:",
        "",
        "| GPUs | GiB per GPU | kernel us | combine us | reduce us | speedup | efficiency |",
        "|---|---|---|---|---|---|---|",
    ]
    t1 = predict(inputs, 16 * GiB, 1)["reduce_s"]
    for p in (1, 2, 4, 8):
        r = predict(inputs, 16 * GiB / p, p)
        lines.append(
            f"| {p} | {16 / p:g} | {r['kernel_s'] * us:,.0f} | {r['combine_s'] * us:.1f} | "
            f"{r['reduce_s'] * us:,.0f} | {t1 / r['reduce_s']:.2f} | {strong_efficiency(inputs, 16 * GiB, p):.1%} |"
        )
    lines += [
        "",
        "4 nodes x 8 GPUs (32 GPUs), per hop h:",
        "",
        "| case | h us | L us | combine us | reduce us | efficiency |",
        "|---|---|---|---|---|---|",
    ]
    for label, nbytes, strong in (("weak, 4 GiB per GPU", 4 * GiB, False), ("strong, 16 GiB total", 16 * GiB, True)):
        for hop in (2e-6, 10e-6):
            per = nbytes / 32 if strong else nbytes
            r = predict(inputs, per, 8, 4, hop)
            eff = strong_efficiency(inputs, nbytes, 8, 4, hop) if strong else weak_efficiency(inputs, nbytes, 8, 4, hop)
            lines.append(
                f"| {label} | {hop * us:.0f} | {latency(inputs, 8, 4, hop) * us:.1f} | {r['combine_s'] * us:.1f} | "
                f"{r['reduce_s'] * us:,.0f} | {eff:.1%} |"
            )
    lines += [
        "",
        "End to end from host memory, 4 GiB per GPU (copy + reduce), one link per GPU:",
        "",
        "| link | copy ms | total ms | reduce share |",
        "|---|---|---|---|",
    ]
    for kind, link in (("pinned", inputs.link_pinned), ("pageable", inputs.link_pageable)):
        name = f"{kind} {link / 1e9:.1f} GB/s"
        r = predict(inputs, 4 * GiB, 8, link=link)
        lines.append(
            f"| {name} | {r['copy_s'] * 1e3:.1f} | {r['total_s'] * 1e3:.1f} | {r['reduce_s'] / r['total_s']:.1%} |"
        )
    if inputs.dask_per_task:
        lines += [
            "",
            f"Dask (F = {inputs.dask_fixed * 1e3:.1f} ms, c = {inputs.dask_per_task * us:.0f} us per task, "
            "4 chunks per worker), 4 GiB per GPU weak scaling:",
            "",
            "| workers | tasks | predicted ms | kernel share | weak efficiency |",
            "|---|---|---|---|---|",
        ]
        t1 = dask_time(inputs, 4 * GiB, 1)
        for w in (1, 2, 4, 8):
            t = dask_time(inputs, 4 * GiB * w, w)
            lines.append(
                f"| {w} | {treereduce_tasks(4 * w)} | {t * 1e3:.1f} | "
                f"{kernel_time(inputs, 4 * GiB) / t:.1%} | {t1 / t:.1%} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-scaling", type=Path, default=None, help="bench_scaling JSON with dask_task_overhead records")
    p.add_argument(
        "--gpu-scaling",
        type=Path,
        default=None,
        help="bench_scaling JSON from the GPU machine: its latency and dask_task_overhead records",
    )
    args = p.parse_args(argv)
    inputs = load_inputs(REPO, args.cpu_scaling, args.gpu_scaling)
    print("Sources: " + "; ".join(f"{k}: {v}" for k, v in inputs.sources.items()))
    print()
    print(tables(inputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
