"""NumPy and CuPy shards in one ``allreduce`` with a CUDA-aware MPI, on ranks without a GPU.

Run as ``mpiexec -n N python mixed_shards.py DEVICE_RANKS`` (comma-separated ranks). With
``MULTIREDUCE_CUDA_AWARE=1`` (set here), a CuPy shard's partial goes to MPI as a device buffer
(``mpi._combine_on_device``) while a NumPy shard's takes the host path, so the two kinds of rank
must still run the same collectives. There is no GPU here: the ranks in DEVICE_RANKS pass a
stand-in for a CuPy array (a NumPy array whose type claims the module ``cupy``), a stand-in
``cupy`` module (NumPy's functions, no-op devices and streams) serves the device path's array
code, and the local partial is NumPy's. What runs for real: every line of ``multireduce.mpi``
that decides the path and every MPI collective of both kinds of rank (their buffers are host
memory). What does not: CuPy, its kernels, and an MPI reading device memory.

Every case's result must equal ``multireduce.reduce`` of the whole global array, bit for bit,
on every rank. Rank 0 prints ``PASS <ranks> <cases>``; a failed assertion ends the job
through the CLI's ``guarded`` (MPI_Abort), and a hang ends at the launcher's timeout.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types

import numpy as np
from fake_cupy import HostSlots
from fake_cupy import fake_cupy as cells_cupy

os.environ["MULTIREDUCE_CUDA_AWARE"] = "1"

import multireduce  # noqa: E402
from multireduce import _cli, core, get_op, mpi  # noqa: E402

COMM = mpi.MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
DEVICE_RANKS = {int(r) for r in sys.argv[1].split(",")}
ON_DEVICE = RANK in DEVICE_RANKS


class FakeCupyArray(np.ndarray):
    """What multireduce.mpi takes for a CuPy array: its type's module is ``cupy``, and it has
    ``.data.device_id`` and ``.data.ptr`` (its host address, standing for device memory)."""

    @property
    def data(self):
        return types.SimpleNamespace(device_id=0, ptr=self.ctypes.data)


FakeCupyArray.__module__ = "cupy"

fake_cupy = types.ModuleType("cupy")
fake_cupy.where = lambda *args: np.where(*args).view(FakeCupyArray)
fake_cupy.isnan = np.isnan
fake_cupy.cuda = types.SimpleNamespace(
    Device=lambda device: contextlib.nullcontext(),
    get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None, ptr=0),
    runtime=cells_cupy().cuda.runtime,
)
sys.modules["cupy"] = fake_cupy
# The stream's slot and result cells: host memory standing for pinned, device-mapped memory.
_SLOTS = HostSlots(mpi)
mpi._Staging.get = classmethod(lambda cls, device, stream: _SLOTS)

_real_local_partial = mpi._local_partial


def local_partial(x, plan):
    if isinstance(x, FakeCupyArray):  # the "kernel": NumPy's partial, as a "device" array
        return np.asarray(core.partial(x.view(np.ndarray), plan.op)).view(FakeCupyArray)
    return _real_local_partial(x, plan)


mpi._local_partial = local_partial

NAN = float("nan")
CASES = [
    # (op, dtype, global values): shards are mpi.shard's blocks of the values
    ("max", "float64", [-5.0, -3.0, -4.0, -2.0, -7.0, -1.5]),
    ("max", "float64", [-1.5, -3.0, -4.0, -2.0, -7.0, -5.0]),
    ("min", "float64", [5.0, 3.0, 4.0, 2.0, 7.0, 1.5]),
    ("min", "float64", [1.5, 3.0, 4.0, 2.0, 7.0, 5.0]),
    ("max", "float64", [-0.0, -1.0, 0.0, -2.0, -0.0, -3.0]),
    ("min", "float32", [0.0, 1.0, -0.0, 2.0, 0.0, 3.0]),
    ("max", "float64", [1.0, 2.0, 3.0, NAN, 4.0, 5.0]),
    ("min", "float64", [NAN, 2.0, 3.0, 1.0, 4.0, 5.0]),
    ("nanmax", "float64", [NAN, -2.0, NAN, -3.0, NAN, -4.0]),
    ("nanmin", "float64", [NAN, NAN, NAN, 3.0, NAN, 2.0]),
    ("max", "int64", [-9, -8, -7, -6, -5, -4]),
    ("min", "uint64", [2**64 - 1, 2**63, 7, 2**64 - 2, 9, 8]),
    ("max", "int8", [-128, -100, -99, -127, -120, -110]),
    ("any", "bool", [False, False, False, True, False, False]),
    ("all", "bool", [True, True, True, True, False, True]),
    ("max", "float64", [-3.0]),  # only rank 0 holds an element
    ("min", "float64", [-3.0, -1.0]),
    ("sum", "float64", [0.5, 1.25, -3.0, 4.0, 8.5, -0.25]),
    ("sum", "int64", [2**62, 2**62, 2**62, 2**62, 1, -1]),
    ("prod", "float64", [1.5, -2.0, 3.0, 0.5, 2.0, -1.0]),
    ("count_nonzero", "float64", [0.0, 1.0, 0.0, 2.0, NAN, 0.0]),
    ("nansum", "float64", [NAN, 1.0, 2.0, NAN, 3.0, 4.0]),
]


def shard_of(values: np.ndarray):
    local = values[mpi.shard(values.size)]
    return local.view(FakeCupyArray) if ON_DEVICE else local


def host_value(got):
    """A result as a NumPy array: a device rank's is a result cell (read through its pointer)."""
    return np.asarray(got.get() if hasattr(got, "get") else got)


def same_value(got, want: np.generic) -> bool:
    got = host_value(got)
    if got.dtype != want.dtype or got.shape != ():
        return False
    if want.dtype.kind == "f" and np.isnan(want):
        return bool(np.isnan(got))
    return got.tobytes() == np.asarray(want).tobytes()


def main() -> int:
    assert mpi.cuda_aware().enabled, mpi.cuda_aware()
    count = 0
    for op, dtype, values in CASES:
        everything = np.array(values, dtype=dtype)
        want = multireduce.reduce(everything, op)
        local = shard_of(everything)
        # By name (a NumPy shard's per-call path) and as an Op (the general path).
        for how in (op, get_op(op)):
            got = mpi.allreduce(local, how)
            count += 1
            assert same_value(got, want), (RANK, op, dtype, values, got, want)
            bits = COMM.allgather(host_value(got).tobytes())
            assert all(b == bits[0] for b in bits), (op, dtype, values, bits)
    # An all-empty global array: max's error on every rank, agreed before any path is taken.
    for op in ("max", "nanmin"):
        try:
            mpi.allreduce(shard_of(np.zeros(0)), op)
        except ValueError as exc:
            assert "zero-size array" in str(exc) and mpi.rank_failures(exc) is not None, exc
            count += 1
        else:
            raise AssertionError(f"rank {RANK}: no error for {op} of an empty array")
    counts = mpi.transport_counts()
    if ON_DEVICE:
        assert counts["device"] > 0 and counts["host"] == counts["staged"] == 0, counts
    else:
        assert counts["device"] == counts["staged"] == 0 and counts["host"] > 0, counts
    total = COMM.allreduce(count, op=mpi.MPI.MIN)
    if RANK == 0:
        print(f"PASS {SIZE} {total} device ranks {sorted(DEVICE_RANKS)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_cli.guarded(main, COMM, mpi))
