"""Strong and weak scaling under MPI and Dask, one JSON document of per-phase records.

Parts (``--parts``, default all):

``mpi``       For each rank count, ``mpiexec -n R python -m multireduce run --json`` (the
              CLI's own code path: ``multireduce.mpi._timed_allreduce``). Phases, each the
              maximum over ranks: ``load`` (read this rank's shard from a ``.npy`` file into
              host memory, or generate it with ``--source synthetic``), ``copy`` (host to
              device, GPU and file source only), ``kernel`` (the local partial plus a stream
              sync) and ``combine`` (the error/dtype agreement and the MPI_Allreduce); kernel
              and combine are the best of ``--repeat``. Weak scaling keeps the elements per
              rank fixed (every rank reads the whole of one shared file through
              ``{rank}``-named links); strong scaling splits a fixed total.
``dask``      For each worker count, a ``distributed.LocalCluster`` (CPU, one thread per
              worker process) or ``dask_cuda.LocalCUDACluster`` (GPU): ``load`` persists the
              generated chunks in the workers, ``copy`` (GPU) persists their CuPy copies,
              ``reduce`` is ``multireduce.dask.treereduce(x, op).compute()`` (kernel, tree
              combine and scheduling together; median of ``--repeat``). Also the per-task
              overhead: the slope of treereduce time over the number of tasks, on tiny arrays
              of 4..256 chunks.
``sweep``     ``python -m multireduce bench`` on one rank: kernel GB/s against size.
``bandwidth`` The copy ceilings for the roofline: host memory copy (NumPy) and, on a GPU,
              device-to-device, pinned and pageable host-to-device (CuPy, CUDA events).
``latency``   ``MPI_Allreduce`` latency against rank count (1..16 by default): an 8-byte and
              a 74 x int64 payload (the reproducible sum's exact accumulator), and
              ``multireduce.mpi.allreduce`` of a one-element float32 shard. ``Barrier`` +
              ``MPI.Wtime`` around ``--latency-inner`` calls; max over ranks; median of
              ``--repeat``. On a machine with fewer cores than ranks the ranks are
              oversubscribed (recorded as ``oversubscribed``): those figures measure the
              operating system's scheduler as much as MPI.

Every record carries the git commit, host, GPU model and count (or ``"cpu"``), the rank or
worker count, dtype, n and op. Every data value is ``i % 1024`` in the array's dtype, so that
the driver checks each result against exact integers. mpiexec is ``$MULTIREDUCE_MPIEXEC``, else
the one next to this interpreter (the PyPI mpich wheel puts it there), else the one on PATH;
``$MULTIREDUCE_MPIEXEC_ARGS`` adds launcher options (Open MPI as root needs
``--allow-run-as-root --oversubscribe``). Every launch has a timeout (``--timeout``) after
which its whole process group is killed and the script fails.

Run ``python scripts/bench_scaling.py`` (CPU defaults finish in a few minutes on 2 cores),
then ``python scripts/plot_scaling.py bench/results/scaling_<tag>_<commit>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from multireduce._provenance import git_state  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _mpiexec  # noqa: E402

PARTS = ("mpi", "dask", "sweep", "bandwidth", "latency")
PATTERN_PERIOD = 1024
#: The reproducible sum's packed exact accumulator: ``ExactSum.normalize().to_array()``.
EXACT_PAYLOAD_INT64 = 74

# Defaults per backend: GPU sizes are those of the multi-GPU run (issue 8), CPU sizes keep a
# 2-core machine to a few minutes.
DEFAULTS = {
    "cpu": {
        "weak_per_rank": 2**22,
        "strong_n": 2**24,
        "sweep_sizes": [2**10, 2**14, 2**18, 2**20, 2**22, 2**24],
        "bandwidth_bytes": 2**27,
    },
    "gpu": {
        "weak_per_rank": 2**30,
        "strong_n": 2**32,
        "sweep_sizes": [2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28, 2**30],
        "bandwidth_bytes": 2**30,
    },
}


# --------------------------------------------------------------------------------------------
# Arguments


def _int_list(text: str) -> list[int]:
    try:
        values = [int(float(part)) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _parts(text: str) -> list[str]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    return parts


def build_parser() -> argparse.ArgumentParser:
    """The command line of the driver (and of the hidden MPI latency worker)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", type=_parts, default=list(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--cpu", action="store_true", help="CPU backend even where a GPU exists")
    p.add_argument(
        "--ranks", type=_int_list, default=None, help="MPI rank counts (default: 1,2,4,.. up to the GPUs; CPU 1,2,4)"
    )
    p.add_argument("--workers", type=_int_list, default=None, help="Dask worker counts (default: as --ranks; CPU 1,2)")
    p.add_argument("--latency-ranks", type=_int_list, default=[1, 2, 4, 8, 16])
    p.add_argument("--ops", default="sum,max,min")
    p.add_argument(
        "--dask-stats",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time multireduce.dask.stats in the dask part (default on)",
    )
    p.add_argument("--dtype", default="float32")
    p.add_argument("--weak-per-rank", type=int, default=None, help="elements per rank or worker (weak scaling)")
    p.add_argument("--strong-n", type=int, default=None, help="total elements (strong scaling)")
    p.add_argument("--sweep-sizes", type=_int_list, default=None, help="elements, for the one-rank size sweep")
    p.add_argument("--bandwidth-bytes", type=int, default=None)
    p.add_argument("--source", choices=("file", "synthetic"), default="file", help="MPI data: .npy file or generated")
    p.add_argument("--chunks-per-worker", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--latency-inner", type=int, default=100, help="calls per timed latency repetition")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per mpiexec launch or Dask cluster")
    p.add_argument("--data-dir", type=Path, default=None, help="where the .npy inputs go (default: a temp dir)")
    p.add_argument(
        "--output", type=Path, default=None, help="JSON file (default: bench/results/scaling_<tag>_<commit>.json)"
    )
    p.add_argument("--latency-worker", action="store_true", help=argparse.SUPPRESS)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and validate the driver's arguments; sizes stay None until the backend is known."""
    args = build_parser().parse_args(argv)
    args.ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    bad = [op for op in args.ops if op not in ("sum", "max", "min")]
    if bad:
        raise SystemExit(f"bench_scaling: --ops takes sum, max, min (the CLI's ops), not {bad}")
    if args.repeat < 1 or args.warmup < 0 or args.latency_inner < 1 or args.chunks_per_worker < 1:
        raise SystemExit("bench_scaling: --repeat, --latency-inner, --chunks-per-worker >= 1 and --warmup >= 0")
    return args


def powers_of_two_upto(n: int) -> list[int]:
    """``[1, 2, 4, ..., n]``: powers of two below ``n``, then ``n`` itself."""
    if n < 1:
        raise ValueError(f"need at least one rank, got {n}")
    out = [1]
    while out[-1] * 2 < n:
        out.append(out[-1] * 2)
    if out[-1] != n:
        out.append(n)
    return out


def resolve_defaults(args: argparse.Namespace, backend: str, gpu_count: int) -> argparse.Namespace:
    """Fill the sizes and counts that depend on the backend (``"cpu"`` or ``"gpu"``)."""
    d = DEFAULTS[backend]
    for name in ("weak_per_rank", "strong_n", "sweep_sizes", "bandwidth_bytes"):
        if getattr(args, name) is None:
            setattr(args, name, d[name])
    if args.ranks is None:
        args.ranks = powers_of_two_upto(gpu_count) if backend == "gpu" else [1, 2, 4]
    if args.workers is None:
        args.workers = list(args.ranks) if backend == "gpu" else [1, 2]
    return args


# --------------------------------------------------------------------------------------------
# Records


def common_fields(state: dict, host: str, gpu: str, gpu_count: int) -> dict:
    """Fields every record carries."""
    return {
        "git_commit": state["commit"],
        "git_dirty": state["dirty"],
        "host": host,
        "gpu": gpu,
        "gpu_count": gpu_count,
    }


def expected(op: str, n: int) -> int:
    """Exact result of ``op`` over ``i % 1024`` for i in [0, n) (n >= 1)."""
    if op == "sum":
        full, rest = divmod(n, PATTERN_PERIOD)
        return full * (PATTERN_PERIOD * (PATTERN_PERIOD - 1) // 2) + rest * (rest - 1) // 2
    if op == "max":
        return min(n, PATTERN_PERIOD) - 1
    if op == "min":
        return 0
    raise ValueError(f"no exact reference for op {op!r}")


def result_matches(value: float, op: str, n_per_shard: int, shards: int, dtype: str) -> bool:
    """Whether ``value`` equals the exact result of ``shards`` copies of the pattern, rounded once.

    Exact comparison is right: values are integers and the accumulators (float64 for float32,
    int64 for ints) hold every partial sum exactly below 2**53, so only the final cast rounds.
    """
    exact = expected(op, n_per_shard) * (shards if op == "sum" else 1)
    return float(np.asarray(value, dtype=dtype)) == float(np.asarray(exact).astype(dtype))


def mpi_records(common: dict, report: dict, *, scaling: str, source: str, shards: int, n_per_shard: int) -> list[dict]:
    """One record per op from the JSON of ``python -m multireduce run --json``.

    ``shards`` copies of ``n_per_shard`` pattern elements make up the data (weak scaling: one
    per rank; strong scaling: one shard of the total). Phase times are the CLI's maxima over
    ranks; ``reduce_s = kernel_s + combine_s`` is the time of one distributed reduction.
    """
    nbytes = report["bytes"]
    out = []
    for row in report["results"]:
        kernel, combine = row["kernel_s"], row["allreduce_s"]
        copy = report["h2d_s"]
        out.append(
            {
                **common,
                "kind": "mpi",
                "scaling": scaling,
                "ranks": report["ranks"],
                "backend": report["backend"],
                "device": report["device"],
                "mpi_library": report["mpi_library"],
                "source": source,
                "dtype": report["dtype"],
                "n": report["n"],
                "n_per_rank": -(-report["n"] // report["ranks"]),
                "bytes": nbytes,
                "op": row["op"],
                "load_s": report["load_s"],
                "copy_s": copy,
                "kernel_s": kernel,
                "combine_s": combine,
                "reduce_s": kernel + combine,
                "kernel_gbps": nbytes / kernel / 1e9 if kernel > 0 else None,
                "copy_gbps": nbytes / copy / 1e9 if copy else None,
                "result": row["result"],
                "correct": result_matches(row["result"], row["op"], n_per_shard, shards, report["dtype"]),
                "cli_check": report["check_passed"],
                "timing": f"max over ranks; kernel and combine best of {report['repeat']}",
            }
        )
    return out


def add_efficiency(records: list[dict], time_key: str = "reduce_s") -> list[dict]:
    """Add ``speedup`` and ``efficiency`` to mpi/dask records, against the 1-rank/worker record.

    Weak scaling: efficiency = T(1) / T(p); strong: T(1) / (p T(p)). Groups are (kind, scaling,
    op, dtype, and for weak scaling the per-rank size). Records without a 1-count peer get None.
    """

    def count(r):
        return r["ranks"] if r["kind"] == "mpi" else r["workers"]

    def group(r):
        return (r["kind"], r["scaling"], r["op"], r["dtype"], r.get("n_per_rank") if r["scaling"] == "weak" else r["n"])

    base = {group(r): r[time_key] for r in records if r["kind"] in ("mpi", "dask") and count(r) == 1}
    for r in records:
        if r["kind"] not in ("mpi", "dask"):
            continue
        t1 = base.get(group(r))
        p = count(r)
        if t1 is None or not r[time_key]:
            r["speedup"] = r["efficiency"] = None
            continue
        ratio = t1 / r[time_key]
        r["speedup"] = ratio if r["scaling"] == "strong" else ratio * p
        r["efficiency"] = ratio if r["scaling"] == "weak" else ratio / p
    return records


def fit_slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line ``y = a + b x``; returns ``(a, b)``."""
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError("need at least two distinct x values")
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def output_path(args: argparse.Namespace, tag: str, commit: str) -> Path:
    """``--output``, else ``bench/results/scaling_<tag>_<commit[:7]>.json``."""
    if args.output is not None:
        return args.output
    return REPO / "bench" / "results" / f"scaling_{tag}_{commit[:7]}.json"


# --------------------------------------------------------------------------------------------
# Launching


def find_mpiexec() -> str:
    """``$MULTIREDUCE_MPIEXEC``, else mpiexec next to the interpreter, else on PATH.

    Raises
    ------
    FileNotFoundError
        If none is found.
    """
    found = _mpiexec.find_mpiexec()
    if found is None:
        raise FileNotFoundError("mpiexec: not in $MULTIREDUCE_MPIEXEC, next to the interpreter, or on PATH")
    return found


mpiexec_command = _mpiexec.command


def launch(cmd: list[str], timeout: float) -> str:
    """Run ``cmd`` in its own process group; return stdout.

    Raises
    ------
    RuntimeError
        On a non-zero exit or a timeout (the whole group is killed first).
    """
    try:
        returncode, stdout, stderr = _mpiexec.run_group(cmd, cwd=REPO, env=_mpiexec.repo_env(REPO), timeout=timeout)
    except TimeoutError as exc:
        raise RuntimeError(str(exc)) from None
    if returncode != 0:
        raise RuntimeError(f"exit status {returncode}: {shlex.join(cmd)}\n{stdout}{stderr}")
    return stdout


# --------------------------------------------------------------------------------------------
# Environment


def detect_backend(force_cpu: bool) -> tuple[str, str, int, str]:
    """``(backend, why, gpu_count, gpu_name)``; the reason is recorded, never hidden."""
    if force_cpu:
        return "cpu", "forced by --cpu", 0, "cpu"
    try:
        import cupy
    except ImportError as exc:
        return "cpu", f"CuPy is not importable ({exc})", 0, "cpu"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return "cpu", f"CuPy finds no usable CUDA device ({exc})", 0, "cpu"
    if count == 0:
        return "cpu", "CuPy finds no CUDA device", 0, "cpu"
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return "gpu", f"CuPy {cupy.__version__} finds {count} CUDA device(s)", count, name


def write_pattern_npy(path: Path, n: int, dtype: str) -> None:
    """Write ``i % 1024`` for i in [0, n) as a .npy file, 2**24 elements at a time."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype), shape=(n,))
    step = 2**24
    for start in range(0, n, step):
        stop = min(n, start + step)
        out[start:stop] = (np.arange(start, stop, dtype=np.int64) % PATTERN_PERIOD).astype(dtype)
    out.flush()
    del out


# --------------------------------------------------------------------------------------------
# Parts


def run_mpi(args, common, backend, mpiexec, data_dir: Path) -> list[dict]:
    records = []
    cli = ["-m", "multireduce", "run", "--json", "--dtype", args.dtype, "--repeat", str(args.repeat)]
    cli += [a for op in args.ops for a in ("--op", op)]
    if backend == "cpu":
        cli.append("--cpu")
    if args.source == "file":
        weak_file = data_dir / "weak.npy"
        strong_file = data_dir / "strong.npy"
        write_pattern_npy(weak_file, args.weak_per_rank, args.dtype)
        write_pattern_npy(strong_file, args.strong_n, args.dtype)
        for r in range(max(args.ranks)):
            link = data_dir / f"weak_{r}.npy"
            if not link.exists():
                link.symlink_to(weak_file.name)
    for ranks in args.ranks:
        for scaling in ("weak", "strong"):
            if args.source == "file":
                data = ["--input", str(data_dir / ("weak_{rank}.npy" if scaling == "weak" else "strong.npy"))]
            else:
                data = ["--per-rank", str(args.weak_per_rank)] if scaling == "weak" else ["--n", str(args.strong_n)]
            report = json.loads(launch(mpiexec_command(mpiexec, ranks, [*cli, *data]), args.timeout))
            shards, per = (ranks, args.weak_per_rank) if scaling == "weak" else (1, args.strong_n)
            if args.source == "synthetic":
                # The CLI's data is (i * 7919) % 2001 - 1000: its own check is the reference.
                recs = mpi_records(common, report, scaling=scaling, source="synthetic", shards=1, n_per_shard=1)
                for rec in recs:
                    rec["correct"] = report["check_passed"]
            else:
                recs = mpi_records(common, report, scaling=scaling, source="file", shards=shards, n_per_shard=per)
            records += recs
            for rec in recs:
                print(
                    f"mpi  {scaling:<6} ranks {ranks:>2} {rec['op']:<4} n {rec['n']:>12,}"
                    f"  load {rec['load_s'] * 1e3:8.2f} ms"
                    f"  copy {'-' if rec['copy_s'] is None else format(rec['copy_s'] * 1e3, '.2f')} ms"
                    f"  kernel {rec['kernel_s'] * 1e3:8.3f} ms  combine {rec['combine_s'] * 1e6:8.1f} us"
                    f"  correct {rec['correct']}",
                    flush=True,
                )
    return records


def run_sweep(args, common, backend, mpiexec, data_dir: Path) -> list[dict]:
    out_json = data_dir / "sweep.json"
    cli = ["-m", "multireduce", "bench", "--dtype", args.dtype, "--sizes", ",".join(map(str, args.sweep_sizes))]
    cli += ["--repeat", str(max(args.repeat, 5)), "--warmup", str(args.warmup), "--output", str(out_json)]
    cli += [a for op in args.ops for a in ("--op", op)]
    if backend == "cpu":
        cli.append("--cpu")
    launch(mpiexec_command(mpiexec, 1, cli), args.timeout)
    doc = json.loads(out_json.read_text())
    records = []
    for rec in doc["records"]:
        records.append(
            {
                **common,
                "kind": "sweep",
                "ranks": doc["ranks"],
                "backend": doc["backend"],
                "dtype": rec["dtype"],
                "n": rec["n"],
                "bytes": rec["n"] * np.dtype(rec["dtype"]).itemsize,
                "op": rec["op"],
                "kernel_s": rec["kernel_s_median"],
                "kernel_s_min": rec["kernel_s_min"],
                "combine_s": rec["allreduce_s_median"],
                "kernel_gbps": rec["kernel_gbps"],
                "timing": doc["timing"],
            }
        )
    print(f"sweep: {len(records)} records from python -m multireduce bench", flush=True)
    return records


def run_bandwidth(args, common, backend) -> list[dict]:
    nbytes = args.bandwidth_bytes
    records = []
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    times = []
    for _ in range(args.warmup + args.repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    t = statistics.median(times[args.warmup :])
    records.append(
        {
            **common,
            "kind": "bandwidth",
            "link": "host_memcpy",
            "bytes": src.nbytes,
            "seconds": t,
            "gbps": 2 * src.nbytes / t / 1e9,
            "counted": "bytes read + written",
            "timing": "perf_counter, median",
        }
    )
    del src, dst
    if backend == "gpu":
        import cupy

        records += _gpu_bandwidth(args, common, nbytes)
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    for r in records:
        print(f"bandwidth {r['link']:<16} {r['gbps']:9.1f} GB/s ({r['counted']})", flush=True)
    return records


def _gpu_bandwidth(args, common, nbytes) -> list[dict]:
    import cupy

    def timed(fn) -> float:
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        samples = []
        for i in range(args.warmup + args.repeat):
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            if i >= args.warmup:
                samples.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        return statistics.median(samples)

    out = []
    a = cupy.empty(nbytes, dtype=cupy.uint8)
    b = cupy.empty_like(a)
    t = timed(lambda: b.data.copy_from_device_async(a.data, nbytes))
    out.append(
        {"link": "device_to_device", "seconds": t, "gbps": 2 * nbytes / t / 1e9, "counted": "bytes read + written"}
    )
    pageable = np.ones(nbytes, dtype=np.uint8)
    t = timed(lambda: a.data.copy_from_host_async(pageable.ctypes.data, nbytes))
    out.append({"link": "h2d_pageable", "seconds": t, "gbps": nbytes / t / 1e9, "counted": "bytes moved"})
    pinned_mem = cupy.cuda.alloc_pinned_memory(nbytes)
    pinned = np.frombuffer(pinned_mem, dtype=np.uint8, count=nbytes)
    pinned[:] = 1
    t = timed(lambda: a.data.copy_from_host_async(pinned.ctypes.data, nbytes))
    out.append({"link": "h2d_pinned", "seconds": t, "gbps": nbytes / t / 1e9, "counted": "bytes moved"})
    # The buffers are freed when this function returns (the lambdas above hold them until then).
    return [{**common, "kind": "bandwidth", "bytes": nbytes, "timing": "CUDA events, median", **r} for r in out]


def run_latency(args, common, mpiexec) -> list[dict]:
    records = []
    cores = os.cpu_count()
    for ranks in args.latency_ranks:
        cmd = mpiexec_command(
            mpiexec,
            ranks,
            [
                str(Path(__file__).resolve()),
                "--latency-worker",
                "--repeat",
                str(args.repeat),
                "--warmup",
                str(args.warmup),
                "--latency-inner",
                str(args.latency_inner),
            ],
        )
        doc = json.loads(launch(cmd, args.timeout))
        for rec in doc["records"]:
            records.append(
                {
                    **common,
                    "kind": "latency",
                    "ranks": ranks,
                    "cpu_cores": cores,
                    "oversubscribed": ranks > cores,
                    "mpi_library": doc["mpi_library"],
                    "timing": doc["timing"],
                    **rec,
                }
            )
            print(
                f"latency ranks {ranks:>2} {rec['payload']:<22} {rec['us_median']:9.2f} us (min {rec['us_min']:.2f})",
                flush=True,
            )
    return records


def latency_worker(args) -> int:
    """Under mpiexec: time Allreduce payloads; rank 0 prints one JSON document."""
    from multireduce import mpi
    from multireduce.mpi import MPI

    comm = MPI.COMM_WORLD
    small = np.zeros(1, dtype=np.float64)
    exact = np.zeros(EXACT_PAYLOAD_INT64, dtype=np.int64)
    shard = np.ones(1, dtype=np.float32)
    cases = {
        "allreduce_8B": lambda: comm.Allreduce(MPI.IN_PLACE, small, op=MPI.SUM),
        f"allreduce_{EXACT_PAYLOAD_INT64}xint64": lambda: comm.Allreduce(MPI.IN_PLACE, exact, op=MPI.SUM),
        "multireduce_allreduce_sum_1": lambda: mpi.allreduce(shard, "sum", comm=comm),
    }
    inner = args.latency_inner
    samples = {k: [] for k in cases}
    for _ in range(args.warmup):
        for fn in cases.values():
            for _ in range(inner):
                fn()
    for _ in range(args.repeat):
        for name, fn in cases.items():  # interleaved, so that drift hits every case alike
            comm.Barrier()
            start = MPI.Wtime()
            for _ in range(inner):
                fn()
            per_call = (MPI.Wtime() - start) / inner
            samples[name].append(comm.allreduce(per_call, op=MPI.MAX))
    if comm.Get_rank() == 0:
        records = [
            {
                "payload": name,
                "bytes": {"allreduce_8B": 8}.get(name, EXACT_PAYLOAD_INT64 * 8 if "int64" in name else 4),
                "us_median": statistics.median(s) * 1e6,
                "us_min": min(s) * 1e6,
                "samples_us": [v * 1e6 for v in s],
                "inner": inner,
            }
            for name, s in samples.items()
        ]
        doc = {
            "mpi_library": " ".join(MPI.Get_library_version().replace("\0", " ").strip().splitlines()[0].split()),
            "timing": "Barrier + MPI.Wtime around --latency-inner calls; max over ranks; median over --repeat",
            "records": records,
        }
        print(json.dumps(doc))
    return 0


def run_dask(args, common, backend) -> list[dict]:
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import multireduce.dask  # noqa: F401  (registers x.treereduce)
    from multireduce.dask import stats, treereduce

    def reduce_once(x, op):
        return stats(x).compute() if op == "stats" else treereduce(x, op).compute()

    def as_float(value):
        return float(value.get()) if hasattr(value, "get") else float(value)

    records = []
    for workers in args.workers:
        if backend == "gpu":
            from dask_cuda import LocalCUDACluster  # a missing dask_cuda is an error, not a CPU run

            cluster = LocalCUDACluster(n_workers=workers, dashboard_address=None)
        else:
            cluster = LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None, memory_limit=None
            )
        with cluster, Client(cluster, timeout=args.timeout) as client:
            client.wait_for_workers(workers, timeout=args.timeout)
            for scaling in ("weak", "strong"):
                n = args.weak_per_rank * workers if scaling == "weak" else args.strong_n
                chunks = -(-n // (args.chunks_per_worker * workers))
                host = (da.arange(n, chunks=chunks, dtype=np.int64) % PATTERN_PERIOD).astype(args.dtype)
                t = time.perf_counter()
                x = client.persist(host)
                wait(x, timeout=args.timeout)
                load_s = time.perf_counter() - t
                copy_s = None
                if backend == "gpu":
                    import cupy

                    t = time.perf_counter()
                    dev = client.persist(x.map_blocks(cupy.asarray, dtype=x.dtype, meta=cupy.empty(0, x.dtype)))
                    wait(dev, timeout=args.timeout)
                    copy_s = time.perf_counter() - t
                    del x
                    x = dev
                for op in [*args.ops, *(["stats"] if args.dask_stats else [])]:
                    for _ in range(args.warmup):
                        reduce_once(x, op)
                    times, value = [], None
                    for _ in range(args.repeat):
                        t = time.perf_counter()
                        value = reduce_once(x, op)
                        times.append(time.perf_counter() - t)
                    if op == "stats":  # every field that has an exact integer reference
                        fields = {f: as_float(getattr(value, f)) for f in ("count", "sum", "min", "max")}
                        correct = fields["count"] == n and all(
                            result_matches(fields[f], f, n, 1, args.dtype) for f in ("sum", "min", "max")
                        )
                        value = fields["sum"]
                    else:
                        value = as_float(value)
                        correct = result_matches(value, op, n, 1, args.dtype)
                    reduce_s = statistics.median(times)
                    nbytes = n * np.dtype(args.dtype).itemsize
                    records.append(
                        {
                            **common,
                            "kind": "dask",
                            "scaling": scaling,
                            "workers": workers,
                            "backend": backend,
                            "cluster": type(cluster).__name__,
                            "chunks": x.numblocks[0],
                            "dtype": args.dtype,
                            "n": n,
                            "n_per_rank": -(-n // workers),
                            "bytes": nbytes,
                            "op": op,
                            "load_s": load_s,
                            "copy_s": copy_s,
                            "kernel_s": None,
                            "combine_s": None,
                            "reduce_s": reduce_s,
                            "reduce_s_min": min(times),
                            "reduce_gbps": nbytes / reduce_s / 1e9,
                            "copy_gbps": nbytes / copy_s / 1e9 if copy_s else None,
                            "result": value,  # for stats: its sum field
                            "correct": correct,
                            "timing": "wall time of treereduce(x, op).compute() (stats: "
                            "multireduce.dask.stats(x).compute()) on persisted chunks; "
                            "median of --repeat; "
                            "kernel and combine are not separable under Dask",
                        }
                    )
                    print(
                        f"dask {scaling:<6} workers {workers:>2} {op:<4} n {n:>12,}  load {load_s * 1e3:8.2f} ms"
                        f"  reduce {reduce_s * 1e3:8.3f} ms  correct {records[-1]['correct']}",
                        flush=True,
                    )
                del x
            records.append(_dask_task_overhead(args, common, client, workers, backend))
    return records


def _dask_task_overhead(args, common, client, workers, backend) -> dict:
    import dask.array as da
    from distributed import wait

    from multireduce.dask import stats, treereduce

    def reduce_once(x, op):
        return stats(x).compute() if op == "stats" else treereduce(x, op).compute()

    def as_float(value):
        return float(value.get()) if hasattr(value, "get") else float(value)

    points = []
    for nchunks in (4, 16, 64, 256):
        x = client.persist(da.ones(nchunks * 16, chunks=16, dtype=np.float32))
        wait(x, timeout=args.timeout)
        graph = treereduce(x, "sum").__dask_graph__()
        tasks = len(dict(graph)) - nchunks  # the persisted chunks are data, not work
        for _ in range(max(2, args.warmup)):
            treereduce(x, "sum").compute()
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            treereduce(x, "sum").compute()
            times.append(time.perf_counter() - t)
        points.append({"chunks": nchunks, "tasks": tasks, "s_median": statistics.median(times)})
        del x
    fixed, per_task = fit_slope([p["tasks"] for p in points], [p["s_median"] for p in points])
    print(
        f"dask workers {workers}: {per_task * 1e6:.1f} us per task, {fixed * 1e3:.2f} ms fixed per compute()",
        flush=True,
    )
    return {
        **common,
        "kind": "dask_task_overhead",
        "workers": workers,
        "backend": backend,
        "points": points,
        "per_task_s": per_task,
        "fixed_s": fixed,
        "timing": "least-squares slope of treereduce(...).compute() median time over task count (16-element "
        "float32 chunks, CPU NumPy)",
    }


# --------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.latency_worker:
        return latency_worker(args)
    backend, reason, gpu_count, gpu_name = detect_backend(args.cpu)
    resolve_defaults(args, backend, gpu_count)
    state = git_state()
    host = platform.node()
    common = common_fields(state, host, gpu_name, gpu_count)
    tag = "cpu" if backend == "cpu" else f"{gpu_name.split()[-1].lower()}x{gpu_count}"
    out = output_path(args, tag, state["commit"])
    print(
        f"bench_scaling: backend {backend} ({reason}); parts {','.join(args.parts)}; commit {state['commit'][:10]}",
        flush=True,
    )
    mpiexec = find_mpiexec() if {"mpi", "sweep", "latency"} & set(args.parts) else None
    records: list[dict] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    own_dir = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="mr_scaling_")) if own_dir else args.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        if "bandwidth" in args.parts:
            records += run_bandwidth(args, common, backend)
        if "sweep" in args.parts:
            records += run_sweep(args, common, backend, mpiexec, data_dir)
        if "mpi" in args.parts:
            records += run_mpi(args, common, backend, mpiexec, data_dir)
        if "latency" in args.parts:
            records += run_latency(args, common, mpiexec)
        if "dask" in args.parts:
            records += run_dask(args, common, backend)
    finally:
        if own_dir:
            shutil.rmtree(data_dir)
    add_efficiency(records)
    doc = {
        "benchmark": "bench_scaling",
        "git_commit": state["commit"],
        "git_dirty": state["dirty"],
        "git_source": state["source"],
        "host": host,
        "backend": backend,
        "backend_reason": reason,
        "gpu": gpu_name,
        "gpu_count": gpu_count,
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mpiexec": mpiexec,
        "mpiexec_args": os.environ.get("MULTIREDUCE_MPIEXEC_ARGS", ""),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "records": records,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    wrong = [r for r in records if r.get("correct") is False]
    print(f"wrote {out} ({len(records)} records)")
    if wrong:
        print(f"bench_scaling: {len(wrong)} result(s) did not match the exact reference", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
