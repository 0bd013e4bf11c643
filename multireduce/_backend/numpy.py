"""The CPU backend: NumPy, with the same accumulators and combine rules as the GPU kernel.

It is the reference that GPU results are tested against, and the path CI and laptops run.
"""

from __future__ import annotations

import numpy as np

from ..ops import Op


def reduce_full(x: np.ndarray, op: Op, acc: np.dtype, result: np.dtype) -> np.generic:
    """Reduce all of ``x`` on the CPU; see the package docstring for the contract."""
    if result.kind in "iu" and x.dtype.kind == "f":
        # NumPy's sum(dtype=int) converts each element first; the accumulator must see
        # the converted values, not the floats.
        x = x.astype(result)
    return op.host_reduce(x, acc).astype(result)


def constant(value: np.generic, dtype: np.dtype) -> np.generic:
    """``value`` as a NumPy scalar of ``dtype``."""
    return np.dtype(dtype).type(value)
