"""What the MPI layer adds per call, on top of the local reduction, for scalar partials.

For each (op, per-rank n) it times, per call and interleaved:

* ``local``: ``core.partial(x, op)`` plus a stream synchronization (the local reduction
  alone, with its result ready);
* ``allreduce``: ``multireduce.mpi.allreduce(x, op)`` plus a stream synchronization (the
  same reduction, the error/dtype agreement, the staging of the partial if MPI is not
  CUDA-aware, one or two MPI_Allreduce calls, and the final cast);
* ``raw``: ``comm.Allreduce(IN_PLACE, 8-byte host buffer, SUM)``, MPI's own floor.

``overhead = allreduce - local`` is what the MPI layer adds. It is measured two ways:

* *free-running* (``overhead``): each repetition runs ``--inner`` calls between ``Barrier``s
  and takes ``MPI.Wtime`` on each rank; the per-call time of a repetition is the maximum over
  ranks, and the table shows the median over ``--repeat`` repetitions (the JSON also keeps
  the minimum and every sample). The local calls of different ranks drift apart, while every
  ``allreduce`` call waits for the slowest rank, so at several ranks this charges the MPI layer
  with the ranks' jitter and with their kernels contending for a shared GPU.
* *lockstep* (``overhead_lockstep``): every call starts right after a ``Barrier`` and is timed
  alone on each rank; a call's time is the maximum over ranks (what a job that synchronizes
  anyway sees), and the table shows the median over ``--repeat`` x ``--inner`` calls. Local
  and combined calls then start alike, and the difference is the combine alone.

Run with ``mpirun -n 1|2|4 python scripts/bench_mpi.py``. Writes one JSON file (one record
per configuration, with the git commit, the GPU name or "cpu", ranks and the MPI library).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # benchmark this checkout, whatever else PYTHONPATH names

from multireduce import _provenance, core, mpi  # noqa: E402
from multireduce.mpi import MPI  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="sum,max,min")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--sizes", default="1,1048576", help="comma-separated elements per rank")
    p.add_argument("--warmup", type=int, default=50, help="untimed calls per configuration")
    p.add_argument("--repeat", type=int, default=7, help="timed repetitions per configuration")
    p.add_argument("--inner", type=int, default=200, help="calls per timed repetition")
    p.add_argument("--cpu", action="store_true", help="NumPy shards even where a GPU exists")
    p.add_argument("--output", type=Path, default=None, help="JSON file (default: bench/results/bench_mpi_<...>.json)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    xp, gpu_name, device = np, "cpu", None
    if not args.cpu:
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None and cupy.cuda.runtime.getDeviceCount() > 0:
            xp = cupy
            device = mpi.select_device(comm)
            name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
            gpu_name = name.decode() if isinstance(name, bytes) else str(name)
    comm.Barrier()

    def sync():
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()

    def per_call(fn, inner: int) -> float:
        comm.Barrier()
        sync()
        start = MPI.Wtime()
        for _ in range(inner):
            fn()
        sync()
        elapsed = (MPI.Wtime() - start) / inner
        return comm.allreduce(elapsed, op=MPI.MAX)

    def lockstep(fn, inner: int) -> list[float]:
        times = np.empty(inner)
        for i in range(inner):
            comm.Barrier()
            start = MPI.Wtime()
            fn()
            times[i] = MPI.Wtime() - start
        comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
        return times.tolist()

    dtype = np.dtype(args.dtype)
    raw_buf = np.zeros(1, dtype=np.float64)
    records = []
    for n in [int(s) for s in args.sizes.split(",")]:
        x = xp.asarray((np.arange(n) % 1000).astype(dtype))
        for op in args.ops.split(","):

            def local(x=x, op=op):
                core.partial(x, op)
                sync()

            def combined(x=x, op=op):
                mpi.allreduce(x, op, comm=comm)
                sync()

            def raw():
                comm.Allreduce(MPI.IN_PLACE, raw_buf, op=MPI.SUM)

            for _ in range(args.warmup):
                local()
                combined()
                raw()
            samples = {"local": [], "allreduce": [], "raw": []}
            steps = {"local": [], "allreduce": []}
            for _ in range(args.repeat):
                # Interleaved, so that drift (clocks, other tenants) hits all three alike.
                samples["local"].append(per_call(local, args.inner))
                samples["allreduce"].append(per_call(combined, args.inner))
                samples["raw"].append(per_call(raw, args.inner))
                steps["local"] += lockstep(local, args.inner)
                steps["allreduce"] += lockstep(combined, args.inner)
            med = {k: statistics.median(v) for k, v in samples.items()}
            step = {k: statistics.median(v) for k, v in steps.items()}
            records.append(
                {
                    "op": op,
                    "dtype": dtype.name,
                    "n_per_rank": n,
                    "ranks": size,
                    "gpu": gpu_name,
                    "local_us_median": med["local"] * 1e6,
                    "allreduce_us_median": med["allreduce"] * 1e6,
                    "overhead_us_median": (med["allreduce"] - med["local"]) * 1e6,
                    "raw_allreduce_8B_us_median": med["raw"] * 1e6,
                    "local_us_min": min(samples["local"]) * 1e6,
                    "allreduce_us_min": min(samples["allreduce"]) * 1e6,
                    "overhead_us_min": (min(samples["allreduce"]) - min(samples["local"])) * 1e6,
                    "samples_us": {k: [s * 1e6 for s in v] for k, v in samples.items()},
                    "local_lockstep_us_median": step["local"] * 1e6,
                    "allreduce_lockstep_us_median": step["allreduce"] * 1e6,
                    "overhead_lockstep_us_median": (step["allreduce"] - step["local"]) * 1e6,
                    "lockstep_us_p10_p90": {
                        k: [float(np.percentile(v, q)) * 1e6 for q in (10, 90)] for k, v in steps.items()
                    },
                }
            )
    transport = comm.gather(mpi.transport_counts(), root=0)
    if rank != 0:
        return 0
    aware = mpi.cuda_aware()
    doc = {
        "benchmark": "bench_mpi",
        "git_commit": _provenance.git_commit(),
        "gpu": gpu_name,
        "ranks": size,
        "mpi_library": " ".join(MPI.Get_library_version().replace("\0", " ").strip().splitlines()[0].split()),
        "mpi4py": __import__("mpi4py").__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cuda_aware": aware.enabled,
        "cuda_aware_decided_by": aware.method,
        "cuda_aware_detail": aware.detail,
        "transport_counts_all_ranks": {k: sum(t[k] for t in transport) for k in transport[0]},
        "warmup": args.warmup,
        "repeat": args.repeat,
        "inner": args.inner,
        "timing": (
            "free-running: Barrier, stream sync, MPI.Wtime around --inner calls, max over ranks per repetition; "
            "lockstep: Barrier before every call, each call timed, max over ranks per call"
        ),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "records": records,
    }
    out = args.output
    if out is None:
        out = REPO / "bench" / "results" / f"bench_mpi_{gpu_name.replace(' ', '_')}_{size}r.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"bench_mpi: {size} rank(s), {gpu_name}, {doc['mpi_library']}, CUDA-aware {aware.enabled} ({aware.method})")
    print(f"{'':<17} {'free-running (us)':^38} {'lockstep (us)':^38}")
    head = f"{'local':>10} {'allreduce':>13} {'overhead':>12}"
    print(f"{'op':<5} {'n/rank':>10} {head} {head} {'raw 8B us':>10}")
    for r in records:
        print(
            f"{r['op']:<5} {r['n_per_rank']:>10} {r['local_us_median']:>10.2f} {r['allreduce_us_median']:>13.2f} "
            f"{r['overhead_us_median']:>12.2f} {r['local_lockstep_us_median']:>10.2f} "
            f"{r['allreduce_lockstep_us_median']:>13.2f} {r['overhead_lockstep_us_median']:>12.2f} "
            f"{r['raw_allreduce_8B_us_median']:>10.2f}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
