"""The CPU backend: NumPy, with the same accumulators and combine rules as the GPU kernel.

It is the reference that GPU results are tested against, and the path CI and laptops run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _axes, _exact, _stats
from ..ops import OPS, Op, as_reduction_warnings, cast_result


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
        # before converting. A value out of range warns as in NumPy's reduction ("... in
        # reduce": cast_result).
        if op.skips_nan and x.dtype.kind == "f":
            x = np.where(np.isnan(x), op.identity(x.dtype), x)
        x = cast_result(x, result)
    out = cast_result(np.asarray(op.host_reduce(x, acc, axes)), result)
    return out[()] if out.ndim == 0 else out


def reduce_full(x: np.ndarray, op: Op, acc: np.dtype, result: np.dtype) -> np.generic:
    """Reduce all of ``x`` on the CPU; see the package docstring for the contract."""
    return reduce(x, op, acc, result, tuple(range(x.ndim)))


def moments(x: np.ndarray, axes: tuple[int, ...], op: Op) -> _stats.Moments:
    """The moments state of ``x`` over ``axes`` (:func:`multireduce._stats.moments`), for ``op``.

    Silent about overflows and invalid values: the finalize of the whole slice's state
    decides NumPy's warnings (:func:`multireduce._stats.warn_arithmetic`), a mean's without
    those of the squares, which NumPy's mean does not make.
    """
    return _stats.moments(x, axes)


def mean_by_sum(x: np.ndarray, axes: tuple[int, ...]) -> bool:
    """Whether :func:`mean_result` takes the mean of ``x`` over ``axes`` (else :func:`moments` does).

    Integer and bool input: always (the exact total). Float input: where the reduced axes
    are adjacent in a C- or Fortran-contiguous array and the moments would take the same
    one pass in memory order: trailing axes (NumPy's pairwise sum), or leading and middle
    ones whose kept run holds a cache line (:func:`_column_total`, the moments' column
    blocks). Elsewhere (narrower columns, non-adjacent axes of a strided array) the blocked
    moments, whose sums are pairwise along rows moved last.
    """
    if x.dtype.kind in "biu":
        return True
    x, axes = _axes.fortran_as_c(x, axes) or (x, axes)
    layout = _axes.axis_layout(x.shape, axes) if x.flags.c_contiguous else None
    return layout is not None and (layout[2] == 1 or layout[2] * x.itemsize >= _stats.COLUMN_MIN_INNER_BYTES)


def mean_result(x: np.ndarray, axes: tuple[int, ...], result: np.dtype):
    """The mean of the non-empty ``x`` over ``axes``: the float64 sum over the count, rounded once.

    As the GPU's mean (the fold kernel's float64 sum, then ``mean_from_sum_kernel``): one pass
    of the sum, without the M2 that a moments state costs (three more passes over float64
    copies: float32 input took 5.7 ms against 1.2 ms for 2**22 elements). For the reductions
    that :func:`mean_by_sum` names; the others, and var and std, are finalized from
    :func:`moments`. The sums are those of the moments' totals, in the same order, so the
    mean has the bits that the state's total over the count gave before.

    Integer and bool input: the exact integer total over the count, ``float64(total) / n``,
    as a moments state's mean (:func:`multireduce._stats.state_mean`), wherever its bound
    shows that the total cannot have wrapped; else the moments state's mean. A float64 sum of
    integers above 2**53 rounds on the way, so its mean depended on the layout and differed
    from ``stats().mean``.
    """
    count = math.prod(x.shape[a] for a in axes)
    if x.dtype.kind in "biu":
        if not _exact_total_bound(x, axes, count):
            return _stats.finalize_moments(_stats.moments(x, axes), OPS["mean"], result, value_warnings=True)
        total = np.add.reduce(x, axis=axes, dtype=OPS["sum"].accumulator_dtype(OPS["sum"].result_dtype(x.dtype)))
        return _as_result(np.asarray(total).astype(np.float64) / np.float64(count), result)
    transposed = _axes.fortran_as_c(x, axes)
    if transposed is not None:  # the C-order transpose's
        return _as_result(np.asarray(mean_result(*transposed, np.dtype(result))).T, result)
    outer, reduced, inner = _axes.axis_layout(x.shape, axes)
    if inner == 1:  # the trailing axes: NumPy's pairwise sum
        total = OPS["sum"].host_reduce(x, np.dtype(np.float64), axes)
    else:
        kshape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
        total = _column_total(x.reshape(outer, reduced, inner)).reshape(kshape)
    return _as_result(total / count, result)


def _column_total(y: np.ndarray) -> np.ndarray:
    """The float64 sums over axis 1 of the C-contiguous ``(outer, reduced, inner)`` array ``y``.

    NumPy adds the rows of a column reduction one after another (its error grows with the
    row count, and a float32 mean accumulates in float32); here blocks of
    :func:`multireduce._stats.column_block_rows` rows are summed in float64 and the block
    sums added in turn, in memory order: the moments' column totals, the same bits. NumPy's
    warnings of a sum (overflow; +inf with -inf: "... encountered in reduce") are given once,
    as its one reduction gives them, under the caller's ``numpy.errstate``. The moments
    state did these sums with the squares and extremes besides: 12-40x NumPy's time for
    ``mean(x, axis=0)`` of 4096 x 512 float64 and other shapes.
    """
    outer, reduced, inner = y.shape
    rows = _stats.column_block_rows(reduced, inner)
    total = None
    with as_reduction_warnings():
        for r0 in range(0, reduced, rows):
            part = np.add.reduce(y[:, r0 : r0 + rows], axis=1, dtype=np.float64)
            total = part if total is None else np.add(total, part, out=total)
    return total


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
    return _stats.finalize_stats(_stats.moments(x, axes), x.dtype, correction, value_warnings=True)


def arg(x: np.ndarray, axis: int | None, op: Op) -> _stats.ArgState:
    """The argmin/argmax state of the non-empty ``x`` along ``axis`` (None: flattened)."""
    return _stats.arg_state(x, axis, largest=op.largest, nan_wins=op.nan_wins)


def arg_result(x: np.ndarray, axis: int | None, op: Op):
    """argmin/argmax of the non-empty ``x`` along ``axis`` (None: flattened): int64 indices."""
    return _stats.arg_finalize(arg(x, axis, op), op)


def constant(value: np.generic, dtype: np.dtype, shape: tuple[int, ...] = (), like: Any = None):
    """``value`` as a NumPy scalar of ``dtype`` (an array of ``shape`` if one is given).

    ``like``: unused here (the GPU backend makes the value on ``like``'s device).
    """
    if shape:
        return np.full(shape, value, dtype=dtype)
    return np.dtype(dtype).type(value)


def exact_sum(x: np.ndarray) -> _exact.ExactSum:
    """The exact sum of a float array (reproducible mode): :func:`multireduce._exact.exact_sum`."""
    return _exact.exact_sum(x)
