"""multireduce: fast, deterministic reductions on the CPU and on NVIDIA GPUs, across MPI ranks
and Dask chunks.

``import multireduce`` needs only NumPy: CuPy is imported when a CuPy array is first reduced,
and MPI starts only when :mod:`multireduce.mpi` is imported.
"""

from .core import max, min, partial, reduce, sum
from .ops import OPS, SUPPORTED_DTYPES, Op, get_op

__version__ = "0.1.0"

__all__ = [
    "OPS",
    "SUPPORTED_DTYPES",
    "Op",
    "__version__",
    "get_op",
    "max",
    "min",
    "partial",
    "reduce",
    "sum",
]
