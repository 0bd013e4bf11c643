"""Under mpiexec -n N: reproducible sums and means are bitwise equal to the one-rank result.

Every rank builds the same adversarial global array (huge dynamic range, cancellation,
subnormals), takes an uneven slice of it whose cut points depend on N, and checks
``mpi.allreduce(..., reproducible=True)`` against ``multireduce.sum(global, reproducible=True)``
computed locally: the two must have the same bits, at any N.
"""

from __future__ import annotations

import numpy as np

import multireduce
from multireduce import mpi


def global_array(dtype: str, rng: np.random.Generator) -> np.ndarray:
    info = np.finfo(dtype)
    big = float(info.max) / 8
    with np.errstate(over="ignore"):
        g = np.concatenate(
            [
                np.array([big, 1.0, -big] * 3),
                rng.standard_normal(10_007) * np.exp(rng.uniform(-8, 8, 10_007)),
                np.full(5, float(info.smallest_subnormal)),
            ]
        ).astype(dtype)
    g[~np.isfinite(g)] = 0
    return rng.permutation(g)


def main() -> None:
    comm = mpi.MPI.COMM_WORLD
    rng = np.random.default_rng(11)
    for dtype in ("float16", "float32", "float64"):
        g = global_array(dtype, rng)
        # Uneven cuts, some shards possibly empty, different for every rank count.
        cuts = np.sort(np.random.default_rng(comm.size).integers(0, g.size, comm.size - 1))
        local = np.split(g, cuts)[comm.rank]
        for op, kwargs in (("sum", {}), ("mean", {}), ("sum", {"dtype": np.float64})):
            got = mpi.allreduce(local, op, reproducible=True, **kwargs)
            expected = multireduce.reduce(g, op, reproducible=True, **kwargs)
            assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes(), (dtype, op, got, expected)
        nan_shard = local.copy()
        if comm.rank == comm.size - 1:
            nan_shard = np.append(nan_shard, np.array(np.nan, dtype=dtype))
        assert np.isnan(mpi.allreduce(nan_shard, "sum", reproducible=True))
    if comm.rank == 0:
        print(f"reproducible: ok at {comm.size} ranks")


if __name__ == "__main__":
    main()
