"""multireduce: fast, deterministic reductions on the CPU, NVIDIA GPUs, MPI ranks and Dask chunks.

``import multireduce`` needs only NumPy: CuPy is imported when a CuPy array is first reduced,
and MPI starts only when :mod:`multireduce.mpi` is imported.
"""

from ._stats import Stats
from .core import (  # noqa: A004  sum, max, min, any, all are the Array API's names
    all,  # noqa: A004
    any,  # noqa: A004
    argmax,
    argmin,
    count_nonzero,
    max,  # noqa: A004
    mean,
    min,  # noqa: A004
    nanargmax,
    nanargmin,
    nanmax,
    nanmean,
    nanmin,
    nanprod,
    nanstd,
    nansum,
    nanvar,
    partial,
    prod,
    reduce,
    stats,
    std,
    sum,  # noqa: A004
    var,
)
from .ops import OPS, SUPPORTED_DTYPES, Op, get_op

__version__ = "0.1.0"

__all__ = [
    "OPS",
    "SUPPORTED_DTYPES",
    "Op",
    "Stats",
    "__version__",
    "all",
    "any",
    "argmax",
    "argmin",
    "count_nonzero",
    "get_op",
    "max",
    "mean",
    "min",
    "nanargmax",
    "nanargmin",
    "nanmax",
    "nanmean",
    "nanmin",
    "nanprod",
    "nanstd",
    "nansum",
    "nanvar",
    "partial",
    "prod",
    "reduce",
    "stats",
    "std",
    "sum",
    "var",
]
