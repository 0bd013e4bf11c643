"""One rank fails, the others carry on: the job must end quickly with the message printed once.

``agreed``: the last rank passes an object array to ``allreduce`` while the others reduce
floats; every rank learns of it in the combine, rank 0 prints it, all exit with status 1.
``abort``: the last rank raises outside any collective while the others wait in a Barrier;
only MPI_Abort (through the CLI's ``guarded``) can end the job.
``interrupt``: Ctrl-C (KeyboardInterrupt) on the last rank while it converts its input inside
``allreduce``: agreed as in ``agreed``. The launcher combines the ranks' statuses (MPICH ORs
them), so here each rank's status from ``guarded`` is gathered and rank 0 prints
``STATUSES [...]`` in rank order; the job itself then exits 0.
"""

import sys

import numpy as np

from multireduce import _cli, mpi

COMM = mpi.MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def agreed() -> int:
    x = np.array(["not", "numbers"]) if RANK == SIZE - 1 else np.ones(10)
    mpi.allreduce(x, "sum")
    return 0


class Interrupting:
    def __array__(self, *args, **kwargs):
        raise KeyboardInterrupt("interrupted")


def interrupt() -> int:
    mpi.allreduce(Interrupting() if RANK == SIZE - 1 else np.ones(10), "sum")
    return 0


def abort() -> int:
    if RANK == SIZE - 1:
        raise RuntimeError(f"injected failure on rank {RANK}")
    COMM.Barrier()  # never completes: the failing rank does not come
    return 0


if __name__ == "__main__":
    status = _cli.guarded({"agreed": agreed, "abort": abort, "interrupt": interrupt}[sys.argv[1]], COMM, mpi)
    if sys.argv[1] == "interrupt":
        statuses = COMM.gather(status, root=0)
        if RANK == 0:
            print("STATUSES", statuses, flush=True)
        sys.exit(0)
    sys.exit(status)
