"""Where the MPI layer's combine phase spends its time, piece by piece, after reductions of
different lengths (a diagnosis: at 2 ranks with 4 GiB per GPU the phase measured 55-150 us,
against about 25 us at 1 rank and after short reductions).

Run with ``mpirun -n 1|2 python scripts/diag_combine.py``. For each shard length and each of
``--repeat`` calls: the GPU sum kernel writes the partial into the pinned slot, the stream is
synchronized, all ranks meet in a ``Barrier``, then each rank times

``sync``        an (idle) stream synchronization, as the layer's staging does
``agree``       the agreement ``Allreduce`` (``mpi._META_SIZE`` x int64, MAX)
``value``       the value ``Allreduce`` (1 x float64, SUM)
``upload``      the result's 0-d device array and its copy from pinned memory (no wait)
``done``        the stream synchronization that waits for that copy

The ``idle 1 ms`` rows replace the long kernel by 1 ms of host busy-waiting before the
``Barrier`` (a one-element shard): whether the wait itself, rather than the GPU, matters.
Prints the median of each piece, the maximum over ranks, in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's multireduce

from multireduce import core, mpi  # noqa: E402
from multireduce.mpi import MPI  # noqa: E402

PIECES = ("sync", "agree", "value", "upload", "done")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,1048576,268435456,1073741824")
    p.add_argument("--repeat", type=int, default=25)
    args = p.parse_args()

    import cupy

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    mpi.select_device(comm)
    stream = cupy.cuda.get_current_stream()
    meta = np.zeros(mpi._META_SIZE, dtype=np.int64)
    value = np.zeros(1, dtype=np.float64)

    def one(x, idle: float) -> list[float]:
        plan, _ = mpi._plan(x, "sum", None)
        slot = mpi._Staging.slot(plan)
        core.partial(x, "sum", out=slot)
        stream.synchronize()
        if idle:
            end = time.perf_counter() + idle
            while time.perf_counter() < end:
                pass
        comm.Barrier()
        t = [time.perf_counter()]
        stream.synchronize()
        t.append(time.perf_counter())
        comm.Allreduce(MPI.IN_PLACE, meta, op=MPI.MAX)
        t.append(time.perf_counter())
        value[0] = mpi._Staging.get(plan.device, stream.ptr).host_view(np.dtype(np.float64))[0]
        comm.Allreduce(MPI.IN_PLACE, value, op=MPI.SUM)
        t.append(time.perf_counter())
        mpi._from_host(np.float32(value[0]), plan)
        t.append(time.perf_counter())
        stream.synchronize()
        t.append(time.perf_counter())
        return [(b - a) * 1e6 for a, b in zip(t, t[1:], strict=False)]

    rows = []
    cases = [(int(s), 0.0) for s in args.sizes.split(",")] + [(1, 1e-3)]
    for n, idle in cases:
        x = cupy.ones(n, dtype=np.float32)
        for _ in range(3):
            one(x, idle)
        samples = [one(x, idle) for _ in range(args.repeat)]
        med = [statistics.median(s[i] for s in samples) for i in range(len(PIECES))]
        worst = np.array(med)
        comm.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
        per_rank = comm.gather(med, root=0)
        label = f"idle 1 ms, n {n}" if idle else f"n {n}"
        rows.append((label, worst, per_rank))
        del x
    if rank == 0:
        print(f"diag_combine: {size} rank(s); median of {args.repeat} calls, max over ranks, us")
        print(f"{'case':22s} " + " ".join(f"{p:>8s}" for p in PIECES) + f" {'total':>8s}")
        for label, worst, per_rank in rows:
            print(f"{label:22s} " + " ".join(f"{v:8.1f}" for v in worst) + f" {sum(worst):8.1f}")
            if size > 1:
                for r, med in enumerate(per_rank):
                    print(f"  rank {r:<15d} " + " ".join(f"{v:8.1f}" for v in med))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
