"""The CPU backend: NumPy, with the same accumulators and combine rules as the GPU kernel.

It is the reference that GPU results are tested against, and the path CI and laptops run.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _exact, _stats
from ..ops import OPS, Op


def _as_result(value, result: np.dtype):
    out = np.asarray(value).astype(result)
    return out[()] if out.ndim == 0 else out


def reduce(x: np.ndarray, op: Op, acc: np.dtype, result: np.dtype, axes: tuple[int, ...]):
    """Reduce ``x`` over ``axes`` with the fold op ``op`` on the CPU.

    Partials are formed in ``acc``; the result has dtype ``result`` and the shape of the kept
    axes (a NumPy scalar when every axis is reduced).
    """
    if op.accepts_dtype and result != x.dtype and result != op._result(x.dtype):
        # dtype= converts each element first (the Array API's rule, and NumPy's): the
        # accumulator must see the converted values, e.g. 1.7 -> 1 for dtype=int32, or
        # 1e5 -> inf for dtype=float16. nansum and nanprod drop NaN (as their identity)
        # before converting. A value out of range warns, as in NumPy's reduction.
        if op.skips_nan and x.dtype.kind == "f":
            x = np.where(np.isnan(x), op.identity(x.dtype), x)
        x = x.astype(result)
    return _as_result(op.host_reduce(x, acc, axes), result)


def reduce_full(x: np.ndarray, op: Op, acc: np.dtype, result: np.dtype) -> np.generic:
    """Reduce all of ``x`` on the CPU; see the package docstring for the contract."""
    return reduce(x, op, acc, result, tuple(range(x.ndim)))


def moments(x: np.ndarray, axes: tuple[int, ...], op: Op) -> _stats.Moments:
    """The moments state of ``x`` over ``axes`` (:func:`multireduce._stats.moments`).

    For a mean (``op.statistic``), the state's deviations and squares (which overflow for
    float64 elements beyond about 1.3e154) do not warn: the mean does not use M2, and NumPy's
    mean, which squares nothing, is silent there. The total's overflow warns, as NumPy's
    mean's sum does. (The MPI and Dask layers' means, whose partials are moments states,
    warned "overflow encountered in multiply" for elements NumPy's mean takes silently.)
    """
    return _stats.moments(x, axes, quiet_m2=op.statistic == "mean")


def sums_pairwise(x: np.ndarray, axes: tuple[int, ...]) -> bool:
    """Whether NumPy sums ``x`` over ``axes`` pairwise: the reduced axes are the trailing axes of a C-contiguous array.

    Along other axes NumPy adds sequentially, which the blocked moments (pairwise sums merged
    by Chan's update) beat in accuracy, so :func:`mean_result` is used only here.
    """
    return x.flags.c_contiguous and axes == tuple(range(x.ndim - len(axes), x.ndim))


def mean_result(x: np.ndarray, axes: tuple[int, ...], result: np.dtype):
    """The mean of the non-empty ``x`` over ``axes``: the float64 sum over the count, rounded once.

    As the GPU's mean (the fold kernel's float64 sum, then ``mean_from_sum_kernel``): one pass
    of the sum, without the M2 that a moments state costs (three more passes over float64
    copies: float32 input took 5.7 ms against 1.2 ms for 2**22 elements). For the reductions
    that :func:`sums_pairwise` names; the others, and var and std, are finalized from
    :func:`moments`.

    Integer and bool input: the exact integer total over the count, ``float64(total) / n``,
    as a moments state's mean (:func:`multireduce._stats.state_mean`), wherever its bound
    shows that the total cannot have wrapped; else the moments state's mean. A float64 sum of
    integers above 2**53 rounds on the way, so its mean depended on the layout and differed
    from ``stats().mean``.
    """
    count = math.prod(x.shape[a] for a in axes)
    if x.dtype.kind in "biu":
        if not _exact_total_bound(x, axes, count):
            return _stats.finalize_moments(_stats.moments(x, axes), OPS["mean"], result, invalid_warnings=True)
        total = np.add.reduce(x, axis=axes, dtype=OPS["sum"].accumulator_dtype(OPS["sum"].result_dtype(x.dtype)))
        return _as_result(np.asarray(total).astype(np.float64) / np.float64(count), result)
    total = OPS["sum"].host_reduce(x, np.dtype(np.float64), axes)
    return _as_result(total / count, result)


def _exact_total_bound(x: np.ndarray, axes: tuple[int, ...], count: int) -> bool:
    """Whether no integer total of ``x`` over ``axes`` can have wrapped (:func:`multireduce._stats.total_cannot_wrap`).

    From the dtype's range where that suffices (narrow integers), else from the data's extremes.
    """
    if _stats.dtype_total_bound(x.dtype, count):
        return True
    if x.dtype.kind == "b":
        return False
    return bool(np.all(_stats.total_cannot_wrap(count, np.min(x, axis=axes), np.max(x, axis=axes))))


def stats(x: np.ndarray, axes: tuple[int, ...], correction: float) -> _stats.Stats:
    """:func:`multireduce.stats` of the non-empty ``x`` over ``axes``: NumPy scalars or arrays."""
    return _stats.finalize_stats(_stats.moments(x, axes), x.dtype, correction, invalid_warnings=True)


def arg(x: np.ndarray, axis: int | None, op: Op) -> _stats.ArgState:
    """The argmin/argmax state of the non-empty ``x`` along ``axis`` (None: flattened)."""
    return _stats.arg_state(x, axis, largest=op.largest, nan_wins=op.nan_wins)


def arg_result(x: np.ndarray, axis: int | None, op: Op):
    """argmin/argmax of the non-empty ``x`` along ``axis`` (None: flattened): int64 indices."""
    return _stats.arg_finalize(arg(x, axis, op), op)


def constant(value: np.generic, dtype: np.dtype, shape: tuple[int, ...] = ()):
    """``value`` as a NumPy scalar of ``dtype`` (an array of ``shape`` if one is given)."""
    if shape:
        return np.full(shape, value, dtype=dtype)
    return np.dtype(dtype).type(value)


def exact_sum(x: np.ndarray) -> _exact.ExactSum:
    """The exact sum of a float array (reproducible mode): :func:`multireduce._exact.exact_sum`."""
    return _exact.exact_sum(x)
