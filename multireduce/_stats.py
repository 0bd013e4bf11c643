"""Mergeable partial states for the ops that are not a single fold: moments and arg ops.

Defined once here and used by the CPU core, the MPI layer and the Dask layer, which all
combine partial states with the same :func:`merge` / :func:`arg_merge`:

:class:`Moments`
    Count of non-NaN elements, NaN count, their sum (in the sum accumulator dtype of the input,
    so integer sums stay exact), mean and sum of squared deviations M2 (float64), and minimum
    and maximum. It serves mean, nanmean, var, std and :func:`multireduce.stats`. Two states
    merge with Chan, Golub and LeVeque's pairwise update::

        n = na + nb;  d = mean_b - mean_a
        mean = mean_a + d * nb / n
        M2 = M2_a + M2_b + d**2 * na * nb / n

    which keeps the variance accurate where the textbook ``E[x**2] - E[x]**2`` cancels. Within
    one :func:`moments` call the block means are merged less a base element of their slice
    (:func:`_shift_base`), so that ``d`` is rounded at the spread's scale, not the mean's.
    Across calls (MPI ranks, Dask chunks) the state carries the low part of its mean
    (``mean_lo``, from that shifted mean), and a merge forms ``d`` from both parts: data far
    from zero keep float64's accuracy when their parts are merged too.
    Float64 data near the overflow threshold follow NumPy's rules, and finite data never
    give a NaN variance: M2 is inf where the squared deviations overflow (NumPy's var is
    then inf), and a mean that cannot be formed in float64 is the sum over the count, as
    NumPy's (:func:`merge`, :func:`state_mean`).

:class:`ArgState`
    The extreme value and its int64 index, for argmin and argmax. The index is global (the
    distributed layers add each shard's offset), and it is never packed into a float.

The CPU computes a state in one pass over memory: blocks of about :data:`BLOCK_BYTES` along the
reduced axes are read once into cache, reduced there, and merged into the running state.
"""

from __future__ import annotations

import functools
import math
import operator
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from . import _axes
from ._transport import encode_extreme, encode_extreme_scalar
from .ops import OPS, Op, cast_result, warn_as_reduction

__all__ = [
    "BLOCK_BYTES",
    "ArgState",
    "Moments",
    "Stats",
    "arg_finalize",
    "arg_merge",
    "arg_merge_pairs",
    "arg_state",
    "empty_arg_state",
    "empty_moments",
    "empty_stats_error",
    "finalize_moments",
    "finalize_stats",
    "merge",
    "merge_all",
    "merge_records",
    "merge_stacked",
    "moments",
    "warn_arithmetic",
    "warn_moments",
]

#: Bytes of float64 work per block of the CPU's one-pass moments.
BLOCK_BYTES = 1 << 20
_BLOCK_ELEMENTS = BLOCK_BYTES // 8


@functools.cache
def _sum_acc(dtype: np.dtype) -> np.dtype:
    op = OPS["sum"]
    return op.accumulator_dtype(op.result_dtype(dtype))


@functools.cache
def _extreme_acc(dtype: np.dtype) -> np.dtype:
    op = OPS["max"]
    return op.accumulator_dtype(op.result_dtype(dtype))


@dataclass(frozen=True)
class Moments:
    """Partial state of the moments ops; every field has the shape of the kept axes.

    Attributes
    ----------
    n : numpy.ndarray of int64
        Elements that are not NaN.
    nan : numpy.ndarray of int64
        NaN elements.
    total : numpy.ndarray
        Sum of the non-NaN elements in the sum accumulator dtype of the input.
    mean, m2 : numpy.ndarray of float64
        Mean of the non-NaN elements, and the sum of their squared deviations from it
        (0 where ``n == 0``). Where ``lo`` and ``hi`` are finite (no infinite element), M2
        is never NaN: it is inf where the squares overflowed, and the mean is +-inf or NaN
        only where a float64 sum of a block of elements overflowed (:func:`state_mean`
        then takes ``total / n``). With an infinite element the mean is +-inf or NaN and
        M2 is NaN, as in NumPy.
    lo, hi : numpy.ndarray
        Minimum and maximum of the non-NaN elements (IEEE 754-2019: -0.0 < +0.0), in the
        max/min accumulator dtype; the op's identity where ``n == 0``.
    mean_lo : numpy.ndarray of float64
        The low part of the mean: ``mean + mean_lo`` is the mean to about float64's precision
        at the scale of the elements' distance from the base of their means (the spread,
        unless the base is an outlier: :func:`_shift_base`), where ``mean`` alone is rounded
        at the mean's own (and, for float input, carries the float64 total's error). It is
        0 where the mean is not finite. Only :func:`merge` reads it, for M2: the difference of two means in
        Chan's update is formed from both parts, so that states merged across parts (MPI
        ranks, Dask chunks) keep the accuracy of one state. No result is computed from it.
    """

    n: np.ndarray
    nan: np.ndarray
    total: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    mean_lo: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.n.shape

    def map(self, func) -> Moments:
        """Apply ``func`` to every field (reshaping, indexing)."""
        return Moments(*(func(getattr(self, name)) for name in _MOMENTS_FIELDS))


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


_MOMENTS_FIELDS = _field_names(Moments)


def empty_moments(dtype: np.dtype, shape: tuple[int, ...] = ()) -> Moments:
    """The state of zero elements of ``dtype``: the neutral element of :func:`merge`."""
    dtype = np.dtype(dtype)
    ext = _extreme_acc(dtype)
    return Moments(
        n=np.zeros(shape, np.int64),
        nan=np.zeros(shape, np.int64),
        total=np.zeros(shape, _sum_acc(dtype)),
        mean=np.zeros(shape, np.float64),
        m2=np.zeros(shape, np.float64),
        lo=np.full(shape, OPS["min"].identity(ext), ext),
        hi=np.full(shape, OPS["max"].identity(ext), ext),
        mean_lo=np.zeros(shape, np.float64),
    )


def _ieee_pair(a: np.ndarray, b: np.ndarray, largest: bool) -> np.ndarray:
    # Neither holds NaN (states keep NaN out of lo/hi), so fmax/fmin only need the zero rule.
    value = np.fmax(a, b) if largest else np.fmin(a, b)
    if value.dtype.kind != "f":
        return value
    both_zero = (a == 0) & (b == 0)
    if not np.any(both_zero):
        return value
    sa, sb = np.signbit(a), np.signbit(b)
    negative = (sa & sb) if largest else (sa | sb)
    zero = np.where(negative, value.dtype.type(-0.0), value.dtype.type(0.0))
    return np.where(both_zero, zero, value)


def merge(a: Moments, b: Moments, low_parts: bool = True) -> Moments:
    """Merge two moments states of the same shape (Chan et al.'s pairwise update).

    The mean is the update of the float64 means, ``mean_a + (mean_b - mean_a) * nb / n``.
    M2's difference of the means ``d`` is formed from both parts of each mean: ``mean_b -
    mean_a`` exactly (Knuth's TwoSum) plus the difference of the low parts, so that means
    rounded at 1.7e9's scale give ``d`` at the spread's (see :class:`Moments`). The merged
    low part is the rounding of the mean's update (TwoSum again), plus ``mean_lo_a``, plus
    what the refined ``d`` adds to it. (The mean itself does not take the low parts: with
    an outlier for a base they are rounded at the outlier's scale, coarser than the mean.)
    ``low_parts`` false: states whose means are taken less one base (the blocks of one
    :func:`moments` call), whose ``d`` needs no refinement; the merged low part is 0.
    Merging with :func:`empty_moments` returns the other state unchanged, bit for bit (with
    ``low_parts`` false, all but its low part).
    Where the update cannot be formed in float64:

    * finite means whose difference overflows (opposite signs near the float64 limit): the
      mean is the weighted mean ``mean_a * (na / n) + mean_b * (nb / n)``, which cannot
      overflow; M2 is inf (the ``d**2`` term overflows, and so do NumPy's squares);
    * an infinite or NaN mean: the mean is the same weighted mean (inf, or NaN for inf and
      -inf, as NumPy's mean; ``(na * mean_a + nb * mean_b) / n`` overflowed a finite side's
      term near the float64 limit first and gave NaN), and M2 is NaN where an element was infinite (the
      merged ``lo`` or ``hi`` is), else inf: finite elements have such a mean only where a
      float64 sum of a block of them overflowed, and their variance is then inf, as
      NumPy's where its own sum overflows to +-inf (:func:`_overflowed_m2`).

    So the M2 of finite elements is never NaN, and the low part is 0 wherever the mean is
    not finite. ``_merge_values`` makes the same operations on Python values.
    """
    n = a.n + b.n
    lo = _ieee_pair(a.lo, b.lo, largest=False)
    hi = _ieee_pair(a.hi, b.hi, largest=True)
    total = _add_totals(a.total, b.total)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        nf = n.astype(np.float64)
        wa = a.n.astype(np.float64)
        wb = b.n.astype(np.float64)
        high = b.mean - a.mean
        w = wb / nf
        coarse = high * w
        mean = a.mean + coarse  # the update of the float64 means alone
        if low_parts:
            back = high - b.mean  # TwoSum(mean_b, -mean_a): high + rounding == mean_b - mean_a
            rounding = (b.mean - (high - back)) - (a.mean + back)
            delta = np.where(np.isfinite(high), high + (rounding + (b.mean_lo - a.mean_lo)), high)
            back = mean - a.mean  # TwoSum(mean_a, coarse), and what the refined delta adds
            mean_lo = a.mean_lo + (((a.mean - (mean - back)) + (coarse - back)) + (delta - high) * w)
        else:
            delta = high
        m2 = a.m2 + b.m2 + delta * (delta * (wa * wb / nf))  # delta**2 alone may overflow
        ok = np.isfinite(mean)
        if not np.all(ok):  # the update overflowed, or computed inf - inf
            finite = np.isfinite(a.mean) & np.isfinite(b.mean)
            # The weighted mean, which cannot overflow: also with an infinite or NaN mean (inf,
            # or NaN for inf and -inf), where (na * mean_a + nb * mean_b) / n overflowed the
            # finite side's term first (3 * (max / 3) is inf: max, 0, 0 with -inf gave NaN).
            mean = np.where(ok, mean, a.mean * (wa / nf) + b.mean * (wb / nf))
            m2 = np.where(finite, m2, np.where(np.isfinite(lo) & np.isfinite(hi), np.inf, np.nan))
        if low_parts:
            mean_lo = np.where(ok & np.isfinite(mean_lo), mean_lo, 0.0)
    # Where one side is empty, the other is taken as it is: the update above would turn an
    # infinite mean into NaN (inf - 0) for nothing.
    only_a = b.n == 0
    only_b = a.n == 0
    mean = np.where(only_a, a.mean, np.where(only_b, b.mean, mean))
    m2 = np.where(only_a, a.m2, np.where(only_b, b.m2, m2))
    if low_parts:
        mean_lo = np.where(only_a, a.mean_lo, np.where(only_b, b.mean_lo, mean_lo))
    else:
        mean_lo = np.zeros_like(mean)
    return Moments(n=n, nan=a.nan + b.nan, total=total, mean=mean, m2=m2, lo=lo, hi=hi, mean_lo=mean_lo)


def _add_totals(a: Any, b: Any) -> Any:
    """Two states' totals added, silently: integer totals wrap, as NumPy's integer sums.

    A float total that overflows where parts merge (Dask chunks, MPI ranks), and +inf with
    -inf, are warned of for the whole slice at finalize (:func:`warn_arithmetic`).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        return a + b


def _pick_value(a: Any, b: Any, largest: bool) -> Any:
    # _ieee_pair for two Python values (neither NaN): -0.0 < +0.0.
    if a == 0 and b == 0 and type(a) is float:
        sa, sb = math.copysign(1.0, a) < 0, math.copysign(1.0, b) < 0
        return -0.0 if ((sa and sb) if largest else (sa or sb)) else 0.0
    if largest:
        return b if b > a else a
    return b if b < a else a


@functools.cache
def _adder(dtype: np.dtype) -> Callable[[Any, Any], Any]:
    """Addition of two Python values as NumPy adds two scalars of the total's ``dtype``."""
    if dtype == np.float64:
        return operator.add
    if dtype.kind == "f":
        # float32 totals (of float16 input): the double sum of two float32 values, rounded to
        # float32, is their correctly rounded float32 sum (53 >= 2 * 24 + 2 bits).
        round_to = dtype.type

        def add_rounded(a: float, b: float) -> float:
            with np.errstate(over="ignore"):  # past float32's range: inf (warned at finalize)
                return float(round_to(a + b))

        return add_rounded
    bits = 8 * dtype.itemsize
    mask = (1 << bits) - 1
    if dtype.kind == "u":
        return lambda a, b: (a + b) & mask
    half = 1 << (bits - 1)
    return lambda a, b: ((a + b + half) & mask) - half  # two's-complement wrap-around


def _merge_values(a: tuple, b: tuple, add: Callable[[Any, Any], Any]) -> tuple:
    # merge() of two 0-d states given as tuples of Python values in _MOMENTS_FIELDS order, with
    # the same IEEE float64 operations in the same order (Python floats are IEEE doubles) and
    # the total added as in its dtype, without the per-call cost of NumPy's array functions:
    # MPI's combine of full reductions runs this for every rank.
    na, nan_a, total_a, mean_a, m2_a, lo_a, hi_a, low_a = a
    nb, nan_b, total_b, mean_b, m2_b, lo_b, hi_b, low_b = b
    lo = _pick_value(lo_a, lo_b, largest=False)
    hi = _pick_value(hi_a, hi_b, largest=True)
    if nb == 0:
        mean, m2, low = mean_a, m2_a, low_a
    elif na == 0:
        mean, m2, low = mean_b, m2_b, low_b
    else:
        nf, wa, wb = float(na + nb), float(na), float(nb)
        low = 0.0
        if math.isfinite(mean_a) and math.isfinite(mean_b):
            high = mean_b - mean_a  # Python floats overflow to inf, as NumPy's
            w = wb / nf
            coarse = high * w
            mean = mean_a + coarse
            if math.isfinite(high):
                back = high - mean_b
                delta = high + (((mean_b - (high - back)) - (mean_a + back)) + (low_b - low_a))
            else:
                delta = high
            m2 = m2_a + m2_b + delta * (delta * (wa * wb / nf))
            if math.isfinite(mean):
                back = mean - mean_a
                low = low_a + (((mean_a - (mean - back)) + (coarse - back)) + (delta - high) * w)
                if not math.isfinite(low):
                    low = 0.0
            else:  # delta overflowed: the weighted mean
                mean = mean_a * (wa / nf) + mean_b * (wb / nf)
        else:
            mean = mean_a * (wa / nf) + mean_b * (wb / nf)  # as merge's: no overflow of the finite side
            m2 = math.inf if math.isfinite(lo) and math.isfinite(hi) else math.nan
    return (na + nb, nan_a + nan_b, add(total_a, total_b), mean, m2, lo, hi, low)


def _merge_tree_values(rows: list[tuple], total: np.dtype, extreme: np.dtype) -> Moments:
    # merge_all's tree over 0-d states given as tuples of Python values (see _merge_values);
    # the result as NumPy scalars of the state's dtypes.
    add = _adder(total)
    while len(rows) > 1:
        paired = [_merge_values(rows[i], rows[i + 1], add) for i in range(0, len(rows) - 1, 2)]
        rows = paired + rows[len(paired) * 2 :]
    n, nan, t, mean, m2, lo, hi, low = rows[0]
    return Moments(
        np.int64(n),
        np.int64(nan),
        total.type(t),
        np.float64(mean),
        np.float64(m2),
        extreme.type(lo),
        extreme.type(hi),
        np.float64(low),
    )


def merge_all(states: Sequence[Moments]) -> Moments:
    """Merge states of one shape pairwise in a balanced tree, in the given order (deterministic bits).

    Level by level: states 0 and 1, 2 and 3, ... are merged, and an odd last state moves up
    as it is. The states are stacked first (:func:`merge_stacked`), so that each level is
    one vectorized :func:`merge` of all its pairs; ``merge`` is elementwise, so the bits are
    those of merging pair by pair. 0-d states (full reductions) are merged pair by pair in
    Python values instead, with the same operations (no NumPy calls for a few values).
    """
    states = list(states)
    if not states:
        raise ValueError("no moments states to merge")
    if len(states) == 1:
        return states[0]
    if states[0].n.ndim == 0:
        rows = [tuple(getattr(s, name).item() for name in _MOMENTS_FIELDS) for s in states]
        return _merge_tree_values(rows, np.asarray(states[0].total).dtype, np.asarray(states[0].lo).dtype)
    return merge_stacked(
        Moments(*(np.stack([np.asarray(getattr(s, name)) for s in states]) for name in _MOMENTS_FIELDS))
    )


def merge_stacked(stacked: Moments) -> Moments:
    """Merge the states stacked along the first axis of every field, as :func:`merge_all` does."""
    while stacked.n.shape[0] > 1:
        count = stacked.n.shape[0]
        even = count - count % 2
        merged = merge(
            stacked.map(operator.itemgetter(slice(0, even, 2))), stacked.map(operator.itemgetter(slice(1, even, 2)))
        )
        if count % 2:
            merged = Moments(
                *(np.concatenate([np.asarray(getattr(merged, n)), getattr(stacked, n)[even:]]) for n in _MOMENTS_FIELDS)
            )
        stacked = merged
    return stacked.map(lambda a: np.asarray(a)[0, ...])


def merge_records(records: np.ndarray) -> Moments:
    """Merge 0-d states held as the records of a 1-D structured array, in :func:`merge_all`'s order.

    The records have the fields of :func:`to_structured` first, in its order (and may have
    others after them); MPI gathers one per rank. They merge in Python values, as
    :func:`merge_all` merges 0-d states.
    """
    if records.size == 0:
        raise ValueError("no moments states to merge")
    fields = records.dtype.fields
    if records.dtype.names[: len(_MOMENTS_FIELDS)] != _MOMENTS_FIELDS:
        raise ValueError(f"moments records need the fields {_MOMENTS_FIELDS} first, got {records.dtype.names}")
    rows = [row[: len(_MOMENTS_FIELDS)] for row in records.tolist()]
    return _merge_tree_values(rows, fields["total"][0], fields["lo"][0])


def _split_axes(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...]]:
    """``x`` with the kept axes first and the reduced axes flattened into one last axis."""
    kept = [a for a in range(x.ndim) if a not in axes]
    kshape = tuple(x.shape[a] for a in kept)
    reduced = math.prod(x.shape[a] for a in axes)
    return np.transpose(x, kept + list(axes)).reshape(kshape + (reduced,)), kshape


def _like(buffer: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The first ``b.size`` elements of ``buffer`` as an array of ``b``'s shape, in ``b``'s memory order.

    As ``b.astype(...)`` lays out its copy (order "K"): a copy into a C-order buffer from a
    block laid out otherwise transposed it element by element, and the float64 sums over it
    would add in another order than the temporaries this buffer replaces.
    """
    order = sorted(range(b.ndim), key=lambda k: -abs(b.strides[k]))  # outermost axis first
    laid = buffer[: b.size].reshape([b.shape[k] for k in order])
    return laid.transpose(np.argsort(order))


def _block_moments(
    b: np.ndarray,
    work: tuple[np.ndarray, np.ndarray],
    axis: int = -1,
    base: Any = 0.0,
    pairwise: bool = False,
) -> Moments:
    """The moments state of the block ``b`` over its axis ``axis``, its mean less ``base``.

    The mean is ``(total / n - base) + sum(d) / n`` with ``d = x - total / n``: the residual
    ``sum(d)`` recovers what the float64 total lost to rounding, and the difference from the
    base (:func:`_shift_base`) is formed before the mean is rounded at its own magnitude.
    M2 is ``sum(d**2) - n * (sum(d) / n)**2``, the squared deviations from the exact mean.

    ``work`` is two flat buffers (float64 and bool) of at least ``b.size`` elements, reused by
    every block of one :func:`moments` call: a new 1 MiB temporary per block went back to the
    system when freed (glibc returns large blocks at once) and came back as fresh pages, whose
    faults took 6x the arithmetic (float32 var of 2**22 elements: 41 ms, 6.5 ms with reuse).
    The values are those of the temporaries they replace. The arithmetic is silent about
    floating-point errors: NumPy's overflow and invalid-value warnings are decided for each
    whole slice at finalize (:func:`warn_arithmetic`), and the underflows of these internal
    steps are none of NumPy's (``errstate(under="raise")`` raised for float64 data holding
    a subnormal, where NumPy's var does not).

    ``pairwise``: ``b`` is the transpose of short rows (``axis`` 0), and its float64 sums
    take NumPy's order along a row (:func:`_pairwise_sum0`), so that the state has the bits
    of the rows reduced in place.
    """
    m = b.shape[axis]

    def fsum(a: np.ndarray) -> np.ndarray:  # the float64 sums along the reduced axis
        return _pairwise_sum0(a) if pairwise else np.add.reduce(a, axis=axis)

    f = _like(work[0], b)
    acc = _sum_acc(b.dtype)
    # A float64 total is the sum of the float64 values: ``b`` itself for float64 input, else
    # its float64 copy ``f`` (float32 input: one pass fewer than summing through NumPy's
    # buffered cast, and pairwise over the whole block). ``f`` is laid out as ``b``
    # (:func:`_like`), so NumPy adds in the same order, except where ``b`` repeats elements
    # (a stride of 0, a broadcast view: NumPy orders such an axis otherwise), which is
    # copied. The total leaves NaN out (the count holds it); +inf with -inf: NaN; an
    # overflow: inf. A slice holding a NaN has a NaN sum, so the NaN are looked for only where
    # a sum is NaN (two passes fewer for every block without one), and the sums are then
    # taken again without them, from the copy.
    nanmask = total = None
    copied = False  # whether ``f`` holds the float64 values of ``clean``
    in_place = b.dtype == np.float64 and all(s != 0 for s, k in zip(b.strides, b.shape, strict=True) if k > 1)
    if acc == np.float64:
        if not in_place:
            np.copyto(f, b, casting="safe")
            copied = True
        with np.errstate(all="ignore"):
            total = fsum(f if copied else b)
        if b.dtype.kind == "f" and np.isnan(total).any():
            nanmask = np.isnan(b, out=_like(work[1], b))
            if nanmask.any():
                total = None
                copied = False
            else:
                nanmask = None  # +inf with -inf, or sums that overflowed both ways
    elif b.dtype.kind == "f":  # float16 (a float32 total)
        nanmask = np.isnan(b, out=_like(work[1], b))
        if not nanmask.any():
            nanmask = None
    if nanmask is not None:
        nan = np.add.reduce(nanmask, axis=axis, dtype=np.int64)
        clean = np.where(nanmask, b.dtype.type(0), b)
    else:
        nan = np.zeros(np.delete(b.shape, axis), np.int64)
        clean = b
    n = m - nan
    if not copied and not (in_place and nanmask is None):
        np.copyto(f, clean, casting="safe")  # the float64 values (clean.astype(np.float64))
        copied = True
    values = f if copied else b  # the float64 values; a float64 block without NaN is not copied
    if total is None:
        with np.errstate(all="ignore"):
            if acc == np.float64:
                total = fsum(values)
            else:
                total = np.add.reduce(clean, axis=axis, dtype=acc)
    ext = _extreme_acc(b.dtype)
    # NumPy's float16 min and max run without SIMD (about 10x float64's time): without NaN,
    # the extremes of the exact float64 copy are the same values, -0.0 and +0.0 included.
    src = f if b.dtype == np.float16 and nanmask is None else b
    lo = OPS["nanmin"].host_reduce(src, ext, (axis % b.ndim,))
    hi = OPS["nanmax"].host_reduce(src, ext, (axis % b.ndim,))
    with np.errstate(all="ignore"):
        mean = (total if acc == np.float64 else fsum(f)) / n
        mean = np.where(n > 0, mean, 0.0)
    # An infinite element less an infinite mean: NaN.
    with np.errstate(all="ignore"):
        d = np.subtract(values, np.expand_dims(mean, axis), out=f)
    with np.errstate(all="ignore"):
        if nanmask is not None:
            d[nanmask] = 0.0
        residual = fsum(d) / np.where(n > 0, n, 1)
        # The residual corrects the mean only where every deviation x - mean is exact: by
        # Sterbenz's lemma, where the elements lie within a factor of 2 of the mean (data far
        # from zero, whose float64 total rounds at the mean's scale). Elsewhere the
        # deviations' own roundings (at the elements' scale) would make it worse: mean([2**62,
        # -2**62, 1, 2]) became 1.125. Nor where the block's sums overflowed.
        low, high, half = np.asarray(lo, np.float64), np.asarray(hi, np.float64), mean / 2
        # (x <= 2 * mean as x / 2 <= mean: 2 * mean may overflow; x / 2 is exact for normal x.)
        exact = np.where(mean > 0, (low >= half) & (high / 2 <= mean), (high <= half) & (low / 2 >= mean) & (mean < 0))
        residual = np.where(exact & np.isfinite(residual), residual, 0.0)
        mean = np.where(n > 0, (mean - base) + residual, 0.0)
        m2 = fsum(np.multiply(d, d, out=d))
        # Deviations from the rounded mean: their squares exceed those from the exact mean
        # by n * residual**2 (float64 totals of int64 near 1e12 are off by about 1e-4).
        excess = n * (residual * residual)
        m2 = np.where(np.isfinite(excess), np.maximum(m2 - excess, 0.0), m2)
    if b.dtype == np.float64:  # narrower floats cannot overflow their float64 sums
        # A float64 sum that overflowed to NaN (inf - inf) makes a NaN mean and M2 of finite
        # elements: their squares overflow (the state's rule, see Moments).
        m2 = _overflowed_m2(m2, lo, hi)
    if nanmask is not None:  # slices that were all NaN hold NaN: make them the identity
        lo = np.where(n > 0, lo, OPS["min"].identity(ext))
        hi = np.where(n > 0, hi, OPS["max"].identity(ext))
    zeros = np.zeros(np.shape(mean))
    return Moments(n=n, nan=nan, total=total, mean=mean, m2=m2, lo=np.asarray(lo), hi=np.asarray(hi), mean_lo=zeros)


def _overflowed_m2(m2: Any, lo: Any, hi: Any, total: Any = None) -> Any:
    """``m2`` with inf for NaN where ``lo`` and ``hi`` are finite: the M2 of finite elements.

    With no infinite element, a NaN M2 can only come from float64 squares or sums that
    overflowed (inf - inf). The variance is then inf, as NumPy's var wherever its own
    squares or sum overflow to inf (it squares a deviation above ``sqrt(DBL_MAX)``, or its
    mean is inf). NumPy's is NaN where its sum overflows both ways (inf - inf); here finite
    elements never get a NaN variance. With a float ``total`` (at finalize): inf also where
    the total of finite elements is not finite, as the mean is then ``total / n``
    (:func:`state_mean`) and NumPy's var of such elements is inf.
    """
    bad = np.isnan(m2)
    if total is not None and total.dtype.kind == "f":
        bad = bad | ~np.isfinite(total)
    if not np.any(bad):
        return m2
    return np.where(bad & np.isfinite(lo) & np.isfinite(hi), np.float64(np.inf), m2)


def _work_buffers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The float64 and bool work buffers of one :func:`moments` call, for blocks of up to ``size`` elements."""
    return np.empty(size, np.float64), np.empty(size, np.bool_)


def _merged_blocks(blocks, work: tuple[np.ndarray, np.ndarray], axis: int = -1, pairwise: bool = False) -> Moments:
    """The merged moments state of ``blocks`` (consecutive pieces along the reduced axis ``axis``).

    Every block's mean is taken less its slice's base (:func:`_shift_base`): the first
    element of the slice that is finite and at most :data:`_BASE_LIMIT` in magnitude. A
    slice whose first blocks hold none (only NaN, infinities or huge values: a long run of
    missing samples) takes the first such element of a later block, and its state so far
    moves to that base (its means are NaN, infinite, huge or of no element: nothing is
    rounded that matters). The first block needs no merge (merging with the empty state is
    neutral).
    """
    state = base = missing = None
    for b in blocks:
        if base is None:
            base, missing = _shift_base(b, axis, work=work)
        elif missing is not None:
            later, none = _shift_base(b, axis, missing, work)
            found = missing if none is None else missing & ~none
            if found.any():
                with np.errstate(invalid="ignore", over="ignore"):
                    moved = np.where(found & (state.n > 0), state.mean - later, state.mean)
                state = replace(state, mean=moved)
                base = np.where(found, later, base)
                missing = none
        block = _block_moments(b, work, axis, base, pairwise)
        state = block if state is None else merge(state, block, low_parts=False)
    return _from_base(state, base)


def _from_base(state: Moments, base: np.ndarray) -> Moments:
    """``state`` (means less ``base``, merged without low parts) with its mean and the mean's low part.

    The base added back; or, for a float64 total that is finite (float32 and float64
    input), the total over n: NumPy's mean, whose error scales with the mean of |x|; or, for
    an integer total that cannot have wrapped (:func:`total_cannot_wrap`), that exact total
    over n, the mean rounded once. Base + mean is exact to the spread's scale, which an
    outlier for a base makes far coarser (-9 first among zeros: 1.7e-14 relative). The low part
    is what ``base + mean`` (the two summed exactly: TwoSum) adds to the mean chosen; 0 where
    that is not finite. The moments kernel's ``from_base`` does the same.

    (With an outlier for a base the low part is as coarse as the shifted mean, at the scale
    ``R`` of the elements' distance from the base; the state's M2 is then at least ``R**2 /
    2``, so the merges' ``d`` errs by float64's precision relative to it, as before.)
    """
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        shifted = state.mean
        high = shifted + base
        back = high - shifted  # TwoSum(shifted, base): high + rounding == shifted + base
        rounding = (shifted - (high - back)) + (base - back)
        mean = high
        if state.total.dtype == np.float64:
            by_total = state.total / np.where(state.n > 0, state.n, 1)
            mean = np.where(np.isfinite(state.total), by_total, mean)
        elif state.total.dtype.kind in "iu":  # the exact total over n, where it cannot have wrapped
            by_total = state.total.astype(np.float64) / np.where(state.n > 0, state.n, 1)
            mean = np.where(total_cannot_wrap(state.n, state.lo, state.hi), by_total, mean)
        mean = np.where(state.n > 0, mean, 0.0)
        mean_lo = (high - mean) + rounding
        mean_lo = np.where(np.isfinite(mean_lo) & (state.n > 0), mean_lo, 0.0)
    return Moments(state.n, state.nan, state.total, mean, state.m2, state.lo, state.hi, mean_lo)


#: Largest |base| of :func:`_shift_base`: below half an ulp of float64's largest values
#: (2**970), so that no ``x - base`` or ``mean + base`` of finite values overflows (it rounds
#: to at most the largest float64). (A base far from the mean rounds the means less it at the
#: base's scale: harmless to M2; an integer mean past :data:`EXACT_TOTAL_BOUND` comes from the
#: exact total, by :func:`_unwrapped_mean`, not from that mean.) It was 2**500: data beyond
#: 3.3e150 (1e153 plus normals times 1e143) had base 0, and its merged variance kept 8 to 10
#: digits where NumPy's keeps 13; beyond 2**564 a variance of distinct values overflows anyway.
_BASE_LIMIT = 2.0**960


#: :func:`_shift_base` first looks for the base among this many first elements of a slice.
_BASE_CANDIDATES = 32


def _shift_base(
    b: np.ndarray, axis: int, only: np.ndarray | None = None, work: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The base of the block means of each slice of the block ``b`` along ``axis``, and where it has none.

    Chan's update adds ``d**2 * na * nb / n`` for the difference d of two means; a mean
    rounded at its own magnitude (float64 elements near 1.7e9 with a spread of 1: about
    1e-7) makes d wrong by that much, and the variance of many merged blocks kept only 7 to
    10 digits. Block means taken less one element of their slice are rounded at the
    spread's magnitude instead. The base is the slice's first element that is finite and at
    most :data:`_BASE_LIMIT` in magnitude (a NaN first element, a missing sample, left
    nanvar with the absolute means); without one in ``b``, 0.

    Returns ``(base, none)``: the bases as float64, of the shape of a slice's result, and a
    bool array that is true where ``b`` holds no such element, or None where every slice has
    one. ``only``: a bool mask of the slices to look at (the others count as found; their
    base is not looked at). ``work``: :func:`moments`' work buffers, free before the block's
    :func:`_block_moments` (a fresh block-sized temporary per block faulted its pages in
    again: all-NaN nanvar of 2**24 float64 took 2.8x the time).
    """
    finite = None
    if only is not None:
        # Slices that earlier blocks left without a base: a run of missing samples sends
        # every block of it here, so the test comes first, one pass into the bool work buffer.
        finite = np.isfinite(b, out=None if work is None else _like(work[1], b))
        if not (only & finite.any(axis=axis)).any():
            return np.zeros(only.shape), only
    first = np.take(b, 0, axis=axis).astype(np.float64)
    if b.dtype.kind != "f":
        return first, None  # integers and bool: always within the limit
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(first) <= _BASE_LIMIT)  # NaN, inf or huge (NaN compares false)
        if only is not None:
            bad &= only
        if not bad.any():
            return first, None  # the common case: every slice's first element
        left = bad.copy()  # the slices without a base yet
        whole = True
        if only is None and np.count_nonzero(bad) * _BASE_CANDIDATES * 8 <= b.size:
            # The first 32 elements of a few slices whose first one fails, only (data with
            # NaN in places send some slices of every block here); many such slices (a run
            # of missing samples over a block of columns), and slices that earlier blocks
            # left without a base (``only``), go to the pass over the block.
            head = np.moveaxis(b, axis, -1)[..., :_BASE_CANDIDATES][bad].astype(np.float64)
            ok = np.isfinite(head) & (np.abs(head) <= _BASE_LIMIT)
            hit = ok.any(axis=-1)
            first[bad] = np.where(hit, head[np.arange(head.shape[0]), np.argmax(ok, axis=-1)], 0.0)
            left[bad] = ~hit
            whole = b.shape[axis] > _BASE_CANDIDATES
        if whole and left.any():
            # A run of missing samples: the rest of the block, in one pass of one byte per
            # element (into the bool work buffer), for every slice at once; the first finite
            # element of each, or where that is huge (rare), the first within the limit.
            if finite is None:
                finite = np.isfinite(b, out=None if work is None else _like(work[1], b))
            found = left & finite.any(axis=axis)  # in memory order, without a temporary
            value = first
            if found.any():  # (argmax along a leading axis copies: only in the block with the base)
                at = np.expand_dims(np.argmax(finite, axis=axis), axis)
                value = np.take_along_axis(b, at, axis=axis).squeeze(axis).astype(np.float64)
            huge = found & ~(np.abs(value) <= _BASE_LIMIT)
            first[found] = value[found]
            if huge.any():
                rows = np.moveaxis(b, axis, -1)[huge].astype(np.float64)
                ok = np.abs(rows) <= _BASE_LIMIT
                first[huge] = np.where(ok.any(axis=-1), rows[np.arange(rows.shape[0]), np.argmax(ok, axis=-1)], 0.0)
                found &= ~huge
                found[huge] = ok.any(axis=-1)
            left &= ~found
            first[left] = 0.0
    if not left.any():
        return first, None
    return first, left


#: Reduced positions per block of the column path (:func:`_column_moments`): NumPy sums a
#: block's columns one row after another, so this bounds that sequential part of each sum.
_COLUMN_BLOCK_ROWS = 1024
#: Kept positions per block of the column path, at most.
_COLUMN_BLOCK_COLS = 4096


def _column_moments(y: np.ndarray) -> Moments:
    """The moments state of the C-contiguous ``(outer, reduced, inner)`` array ``y`` over axis 1.

    Blocks of up to :data:`_COLUMN_BLOCK_ROWS` reduced positions by whole runs of the inner
    axis are read in memory order and merged along the reduced axis. Moving the reduced axis
    last instead read it ``inner`` elements apart, a cache line per element once the inner
    axis is long (float32 var over axis 0 of 1024 x 4096: 51 ms, NumPy 2.3 ms).
    """
    outer, reduced, inner = y.shape
    # Runs of at most _COLUMN_BLOCK_COLS kept elements: whole runs of a very long kept axis
    # left a block only a few rows, and the merges of long states (one per block) cost more
    # than the blocks (2**25 float32 as a 1024 x 32768 column reduction: 126 ms in blocks of 4
    # rows). Shorter runs than that read memory in pieces too short for the prefetchers.
    cols = min(inner, _COLUMN_BLOCK_COLS)
    rows = column_block_rows(reduced, inner)
    if rows == reduced:
        # One block holds the whole reduced axis: no merges, so the runs fill the block (8 x
        # 262144 float64 over axis 0 took 64 blocks of a quarter of it). Each column's values
        # do not depend on the runs' length.
        cols = min(inner, max(cols, _BLOCK_ELEMENTS // rows))
    depth = min(outer, max(1, _BLOCK_ELEMENTS // (rows * cols)))
    work = _work_buffers(depth * rows * cols)  # the largest block
    out = empty_moments(y.dtype, (outer, inner))
    for o0 in range(0, outer, depth):
        for c0 in range(0, inner, cols):
            tile = y[o0 : o0 + depth, :, c0 : c0 + cols]
            blocks = (tile[:, r0 : r0 + rows] for r0 in range(0, reduced, rows))
            state = _merged_blocks(blocks, work, axis=1)
            for name in _MOMENTS_FIELDS:
                getattr(out, name)[o0 : o0 + depth, c0 : c0 + cols] = getattr(state, name)
    return out


def column_block_rows(reduced: int, inner: int) -> int:
    """Reduced positions per block of the column path (:func:`_column_moments`).

    At most 1,024, and a block of about :data:`BLOCK_BYTES` of float64 work by runs of up to
    :data:`_COLUMN_BLOCK_COLS` kept positions. NumPy adds a block's rows one after another:
    this bounds that sequential part of each column's sum (131 rows for 1,000 columns),
    which the CPU mean's column sums (``_backend.numpy._column_total``) share, with the
    same bits as these states' totals.
    """
    return min(reduced, _COLUMN_BLOCK_ROWS, max(1, _BLOCK_ELEMENTS // min(inner, _COLUMN_BLOCK_COLS)))


#: The column path takes reductions whose inner axis holds at least this many bytes (a cache
#: line): below it, moving the reduced axis last reads memory nearly in order, and the row
#: blocks' pairwise sums are the more accurate.
COLUMN_MIN_INNER_BYTES = 64


#: Whether NumPy's var squares the deviations with ``square`` (from NumPy 2.4; ``multiply``
#: before, and in its nan functions): the ufunc its overflow warning names.
_VAR_SQUARES_WITH_SQUARE = np.lib.NumpyVersion(np.__version__) >= "2.4.0"


def warn_arithmetic(state: Moments, quiet_m2: bool, skips_nan: bool) -> None:
    """NumPy's overflow and invalid-value warnings of the slices of ``state``, under the caller's errstate.

    Decided from the merged state of each whole slice, wherever its parts were reduced
    (blocks of one call, Dask chunks, MPI ranks), as NumPy's var and mean decide them for the
    slice: :func:`moments` and :func:`merge` themselves are silent. Called by
    :func:`finalize_moments` and :func:`finalize_stats` for data reduced on the CPU (the GPU
    kernels do not warn).

    NumPy's mean sums the slice: finite elements whose sum overflows one way give "overflow
    encountered in reduce" (the state's total is inf); +inf and -inf give "invalid value
    encountered in reduce" (so do finite float64 elements whose sum overflows both ways: the
    total is NaN). Its var then subtracts that mean: an infinity of one sign makes it
    infinite, and the infinite elements less it give "invalid value encountered in
    subtract"; finite elements whose squared deviations overflow (M2 inf, the sum finite)
    give "overflow encountered in square" (NumPy 2.4 on; "in multiply" before it, and in
    the nan functions) where the largest deviation's square overflows, else "in reduce"
    (their sum does), wherever the overflow happened here (a block's squares, or Chan's
    update of two parts). A NaN in the slice makes the sum NaN: its deviations are NaN, so
    var (``skips_nan`` false) is silent about squares and infinities, unless two infinities
    meet before the NaN in NumPy's order of additions (not followed: silent); the finite
    elements' sum overflows in NumPy's lanes without the NaN, and warns here whatever NaN
    the slice holds. nanvar, nanstd and nanmean leave the NaN out. ``quiet_m2``: a mean,
    which subtracts and squares nothing.
    The warnings come from NumPy's own operations on values that raise them, in NumPy's
    order (each operation's overflow before its invalid value), so that ``numpy.errstate``
    (``ignore``, ``raise``, ``call``) applies as to NumPy's.
    """
    if state.lo.dtype.kind != "f":
        return  # integer totals wrap silently, as NumPy's integer sums; nothing else overflows
    total = np.asarray(state.total, dtype=np.float64)
    undefined = np.isnan(total)
    overflowed = np.isinf(total)
    infinite = (np.asarray(state.hi) == np.inf) | (np.asarray(state.lo) == -np.inf)
    squares = np.zeros((), bool) if quiet_m2 else np.isinf(np.asarray(state.m2))
    if not (undefined.any() or overflowed.any() or infinite.any() or squares.any()):
        return  # the common case
    clean = True if skips_nan else np.asarray(state.nan) == 0
    # The total leaves NaN out: where it overflowed with no infinite element, the finite
    # elements' sum did, which NumPy's pairwise sum does in the lanes without the NaN too
    # (all but the smallest arrays with the NaN first). An infinite element makes the total
    # infinite, or NaN with one of the other sign: no overflow of finite values is told then
    # (NumPy's inf + x raises no flag; its finite lanes' overflow is not in the state).
    warn_as_reduction(overflow=bool(np.any(overflowed & ~infinite)), invalid=bool(np.any(undefined & clean)))
    if quiet_m2:
        return
    if np.any(infinite & ~undefined & clean):
        np.subtract(np.array([np.inf]), np.array([np.inf]))
    # Squared deviations of finite elements that overflow (the deviations from a NaN mean are
    # NaN, and square silently): NumPy's square (or multiply) where the largest deviation's
    # square does, else its sum of the squares ("in reduce").
    squared = squares & np.isfinite(total) & ~infinite & clean
    if np.any(squared):
        mean = state_mean(state).astype(np.float64)
        with np.errstate(all="ignore"):
            lo, hi = np.asarray(state.lo, np.float64), np.asarray(state.hi, np.float64)
            largest = np.maximum(hi - mean, mean - lo)
            square = squared & ~np.isfinite(largest * largest)
        if np.any(squared & ~np.isfinite(largest)):  # the deviation itself overflows first
            _warn_overflow("subtract")
        if np.any(square):
            _warn_overflow("square" if _VAR_SQUARES_WITH_SQUARE and not skips_nan else "multiply")
        warn_as_reduction(overflow=bool(np.any(squared & ~square)))


def _warn_overflow(ufunc: str) -> None:
    """NumPy's "overflow encountered in ``ufunc``" (subtract, square, multiply, divide, cast), raised by it."""
    big = np.array([1e300])
    if ufunc == "subtract":
        np.subtract(big * 1e8, -big * 1e8)
    elif ufunc == "square":
        np.square(big)
    elif ufunc == "multiply":
        np.multiply(big, big)
    elif ufunc == "divide":
        np.divide(big, np.array([1e-300]))
    else:  # cast
        big.astype(np.float32)


def _narrowed(value: Any, dtype: np.dtype, state: Moments, skips_nan: bool, warn: bool, scalar: bool = False) -> Any:
    """The float64 var or std ``value`` as ``dtype``, with NumPy's warnings where only that narrowing overflows.

    NumPy's var of float16 and float32 input computes in that dtype, so where the float64
    value is finite but past the dtype's range, NumPy's own arithmetic overflowed: its
    subtraction where a deviation is past the range, else its square (or multiply, as
    :func:`warn_arithmetic` names them) where a squared deviation is, else its sum of the
    squares ("in reduce"), else its division by N - correction ("in divide"; for a full
    reduction, ``scalar``, NumPy divides in float64 and casts: "in cast"). ``warn``: the
    state was reduced on the CPU (the GPU's warn nothing).
    """
    with np.errstate(over="ignore"):
        out = np.asarray(value).astype(dtype)
    if warn and dtype.kind == "f" and dtype.itemsize < 8:
        with np.errstate(invalid="ignore"):
            narrowed = np.isinf(out) & np.isfinite(value)
        if np.any(narrowed):
            top = float(np.finfo(dtype).max)
            with np.errstate(all="ignore"):
                mean = np.asarray(state_mean(state), np.float64)
                lo, hi = np.asarray(state.lo, np.float64), np.asarray(state.hi, np.float64)
                largest = np.maximum(hi - mean, mean - lo)
                m2 = np.asarray(state.m2, np.float64)
            deviation = narrowed & (largest > top)
            square = narrowed & (largest > math.sqrt(top))
            total = narrowed & ~square & (m2 > top)
            if np.any(deviation):
                _warn_overflow("subtract")
            if np.any(square):
                _warn_overflow("square" if _VAR_SQUARES_WITH_SQUARE and not skips_nan else "multiply")
            warn_as_reduction(overflow=bool(np.any(total)))
            if np.any(narrowed & ~square & ~total):
                _warn_overflow("cast" if scalar else "divide")
    return out[()] if out.ndim == 0 else out


#: Rows of at most this many elements are reduced as their transpose (:func:`moments`), where
#: there are at least :data:`_SHORT_ROWS_KEPT` of them (fewer: the transposed path's fixed
#: Python cost per tile, 15-35 µs, was more than it saves; near 64 elements its gain falls to
#: 5-15%).
_SHORT_ROWS = 48
_SHORT_ROWS_KEPT = 256


def _pairwise_sum0(t: np.ndarray) -> np.ndarray:
    """The float64 sums of ``t`` (shape ``(n, R)``, ``n`` at most 128) along axis 0, in NumPy's order along a row.

    NumPy's add.reduce of a row of ``n <= 128`` contiguous elements starts from 0 and adds
    the row's pairwise sum: below 8 elements one after another; else 8 accumulators take
    elements ``j, j + 8, ...`` of the whole groups of 8, are added as ``((r0 + r1) + (r2 +
    r3)) + ((r4 + r5) + (r6 + r7))``, and the rest follow one by one. Here each step adds
    whole rows of ``t`` (the transposed elements), so the sums have the bits of
    ``np.add.reduce(t.T, axis=-1)`` (:func:`_pairwise_order_holds` checks it once), up to
    the payload of a NaN where two different NaN meet (NumPy's loop keeps the first; the
    moments' sums never add an input NaN: its elements are zeroed first).
    """
    n = t.shape[0]
    with np.errstate(all="ignore"):
        if n < 8:
            res = np.zeros(t.shape[1:])
            for i in range(n):
                res += t[i]
            return res
        r = t[:8].copy()
        whole = n - n % 8
        for i in range(8, whole, 8):
            r += t[i : i + 8]
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for i in range(whole, n):
            res += t[i]
        return 0.0 + res


@functools.cache
def _pairwise_order_holds() -> bool:
    """Whether :func:`_pairwise_sum0` has the bits of this NumPy's add.reduce along rows (checked once).

    Rows of every length up to :data:`_SHORT_ROWS` with magnitudes over 16 binades (each sum
    rounds at many places) and signed zeros. Another NumPy with another order: the short rows
    go the usual way, with NumPy's own sums.
    """
    rng = np.random.default_rng(20261201)
    for n in range(1, _SHORT_ROWS + 1):
        rows = rng.standard_normal((16, n)) * 2.0 ** rng.integers(-8, 8, (16, n))
        rows[0] = -0.0
        want = np.add.reduce(rows, axis=-1)
        if _pairwise_sum0(np.ascontiguousarray(rows.T)).tobytes() != want.tobytes():
            return False
    return True


def moments(x: np.ndarray, axes: tuple[int, ...]) -> Moments:
    """The moments state of the NumPy array ``x`` over ``axes`` (normalized, non-negative).

    Without NumPy's overflow and invalid-value warnings: they are decided for each whole
    slice from its merged state when it is finalized (:func:`warn_arithmetic`), so that a
    NaN in one block, chunk or rank and an overflow or an infinity in another warn as
    NumPy's var of the whole slice does (per part, "overflow encountered in multiply" and
    "invalid value encountered in subtract" where NumPy is silent).

    One pass over ``x``: blocks of about :data:`BLOCK_BYTES` of float64 work are reduced in
    cache and merged. Reduced axes that are adjacent in a C-contiguous array and followed by
    kept axes of at least a cache line are read in memory order (:func:`_column_moments`);
    otherwise the reduced axes are moved last (a view that cannot be reshaped without copying
    is copied first) and each row is read in blocks. A Fortran-order array is reduced as its
    (C-order) transpose.
    """
    transposed = _axes.fortran_as_c(x, axes)
    if transposed is not None:
        # The transpose is C-contiguous: reduce it over the same axes (numbered from the other
        # end), then put the kept axes back in order. Reducing the last axis of a Fortran-order
        # matrix read it a cache line per element (float32 var over axis 1 of 8192 x 1024:
        # 99 ms, NumPy 7.4).
        return moments(*transposed).map(lambda a: np.asarray(a).T)
    layout = _axes.axis_layout(x.shape, axes) if x.flags.c_contiguous and x.size else None
    if layout is not None and layout[2] > 1 and layout[2] * x.itemsize >= COLUMN_MIN_INNER_BYTES:
        kshape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
        return _column_moments(x.reshape(layout)).map(lambda a: a.reshape(kshape))
    y, kshape = _split_axes(x, axes)
    kept = math.prod(kshape)
    reduced = y.shape[-1]
    y = y.reshape(kept, reduced)
    # Tiles of at most about _BLOCK_ELEMENTS: whole rows when they are short, else one row
    # in pieces, so that the float64 temporaries stay in cache whatever the shape.
    rows = max(1, _BLOCK_ELEMENTS // max(reduced, 1))
    cols = max(1, _BLOCK_ELEMENTS // rows)
    if reduced == 0 or kept == 0:
        return empty_moments(x.dtype, kshape)
    out = None if kept <= rows else empty_moments(x.dtype, (kept,))
    work = _work_buffers(min(rows, kept) * min(cols, reduced))  # the largest block
    # Short rows are reduced as their transpose (one copy per tile): NumPy's reductions along
    # a short axis pay per row (float64 var of 262144 x 8 over its rows: 49 ms, NumPy's 13),
    # while along the transpose's leading axis each step is one pass over a whole tile; the
    # sums keep NumPy's pairwise order along each row (_pairwise_sum0), so the bits too. (Only
    # for contiguous rows: NumPy adds strided rows, whose kept axis is the inner one, in turn.)
    short = 2 <= reduced <= _SHORT_ROWS and kept >= _SHORT_ROWS_KEPT and y.flags.c_contiguous and x.dtype != np.float16
    short = short and _pairwise_order_holds()
    rows_t = np.empty((reduced, min(rows, kept)), y.dtype) if short else None
    for r0 in range(0, kept, rows):
        r1 = min(kept, r0 + rows)
        if short:
            t = rows_t[:, : r1 - r0]
            np.copyto(t, y[r0:r1].T)
            state = _merged_blocks(iter([t]), work, axis=0, pairwise=True)
        else:
            blocks = (y[r0:r1, c0 : c0 + cols] for c0 in range(0, reduced, cols))
            state = _merged_blocks(blocks, work)
        if out is None:  # one tile holds every row
            return state.map(lambda a: np.asarray(a).reshape(kshape))
        for name in _MOMENTS_FIELDS:
            getattr(out, name)[r0:r1] = getattr(state, name)
    return out.map(lambda a: a.reshape(kshape))


def _nan_where(mask: np.ndarray, value: np.ndarray) -> np.ndarray:
    return np.where(mask, np.float64(np.nan), value) if np.any(mask) else value


def _as_result(value: np.ndarray, dtype: np.dtype) -> Any:
    out = np.asarray(value).astype(dtype)
    return out[()] if out.ndim == 0 else out


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _outside_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside multireduce, for a warning issued by the caller.

    Warnings then point at the line that called multireduce, whichever entry point it used.
    """
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        level, frame = level + 1, frame.f_back
    return level


def warn_moments(op: Op, count: Any, correction: float, inexact: bool = True) -> None:
    """NumPy's RuntimeWarnings for the moments op ``op`` over ``count`` elements per result.

    ``count`` (an int or an array) is the number of elements each result reduces, NaN
    included, except for nanmean, nanvar and nanstd, whose count is that of the non-NaN ones
    (so only their warnings depend on the data). As NumPy: "Mean of empty slice" where the
    count is 0 (mean, nanmean), "Degrees of freedom <= 0 for slice" where ``count -
    correction <= 0`` (var, std, nanvar, nanstd). The warning points at the caller's line
    outside multireduce. ``inexact``: the input is float; NumPy's nan functions of integer
    and bool input are its plain ones (``np.nanvar`` calls ``np.var``), with their words.
    """
    mean = op.statistic == "mean"
    limit = 0 if mean else correction  # a count at most this warns
    if count <= limit if isinstance(count, int) else np.any(np.asarray(count) <= limit):
        # NumPy's words: np.nanvar and np.nanstd of floats end theirs with a period, np.var's does not.
        period = "." if op.skips_nan and inexact else ""
        message = "Mean of empty slice" if mean else "Degrees of freedom <= 0 for slice" + period
        warnings.warn(message, RuntimeWarning, stacklevel=_outside_stacklevel())


#: Below this bound on ``n * max(|lo|, |hi|)`` an integer state's total cannot have wrapped
#: (int64 and uint64 totals hold 2**63 at least), so its mean is that total over n.
EXACT_TOTAL_BOUND = 2.0**62


def total_cannot_wrap(n: Any, lo: Any, hi: Any) -> np.ndarray:
    """Where an integer total of ``n`` elements from ``lo`` to ``hi`` cannot have wrapped (elementwise).

    ``n * max(|lo|, |hi|) < EXACT_TOTAL_BOUND``, in float64: :func:`state_mean`'s test, which
    the CPU and GPU means and ``reproducible=True``'s check of integer means share.
    """
    largest = np.maximum(np.abs(np.asarray(lo).astype(np.float64)), np.abs(np.asarray(hi).astype(np.float64)))
    return np.asarray(n).astype(np.float64) * largest < EXACT_TOTAL_BOUND


def state_mean(state: Moments) -> np.ndarray:
    """The mean a moments state stands for (where ``n > 0``; the state's own mean elsewhere).

    For integer and bool input the total is an exact integer unless it wrapped, which it
    cannot where ``n * max(|lo|, |hi|) < 2**62`` (tested in float64): there the mean is
    ``float64(total) / float64(n)``, NumPy's formula (its float64 sum is exact below 2**53).
    So a mean does not depend on how the elements were split into merged states (Chan's
    update gives -4e-16 where the exact mean is 0); elsewhere the state's float64 mean.

    For float32 input, the float64 total over n where it is finite: a state of one part
    holds it as its mean (``_from_base``, and the GPU's row records), and a merged one (Dask
    chunks, MPI ranks) then gives the same, not Chan's update of the parts' means, which can
    be an ulp off and round the float32 result at a tie otherwise (:func:`_total_is_the_mean`).
    Otherwise (float64 input, whose merged means are the more accurate; float16 input, whose
    float32 total rounds) the state's mean, except where it or the total is +-inf or NaN though
    ``lo`` and ``hi`` are finite (no infinite element): a float64 sum of the elements, or of
    some block of them, overflowed, and the mean is ``float64(total) / float64(n)``,
    NumPy's formula (inf where the sum itself overflows, as NumPy's; NaN where it overflowed
    both ways). The total decides even where every merged part's mean is finite, so the
    mean does not depend on the split: Chan's update of four parts of 1e308 gives 1e308,
    where the sum, NumPy's mean and one part of all four give inf. With an infinite element
    the state's mean (+-inf, or NaN for inf and -inf) is NumPy's.

    ``stats_finalize_kernel`` (``kernels/multireduce/stats.cuh``) finalizes only the records
    of one part (whose mean is already the total over n for float32 input) and applies the other rules
    with the same float64 operations.
    """
    if state.total.dtype.kind not in "iu":
        mean = state.mean
        if _total_is_the_mean(state):
            # float32 input: the finite float64 total over n (exact, or nearly: float32 elements
            # in float64 sums), as one state's mean (_from_base) and a GPU row's record hold it.
            # A merged state's own mean (Chan's update of the parts' means) can be an ulp off
            # it, which rounds the float32 mean at a tie the other way than the core's (Dask
            # chunks of 3 of 10 elements: 0.4% of arrays).
            usable = np.isfinite(state.total) & (state.n > 0)
            with np.errstate(all="ignore"):
                mean = np.where(usable, state.total / np.where(state.n > 0, state.n, 1), mean)
        if np.all(np.isfinite(mean)) and np.all(np.isfinite(state.total)):
            return mean
        finite = np.isfinite(mean) & np.isfinite(state.total)
        overflowed = ~finite & np.isfinite(state.lo) & np.isfinite(state.hi) & (state.n > 0)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return np.where(overflowed, state.total.astype(np.float64) / state.n.astype(np.float64), mean)
    exact = total_cannot_wrap(state.n, state.lo, state.hi)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        by_total = state.total.astype(np.float64) / state.n.astype(np.float64)
    if not np.all(exact | (state.n == 0)):  # some total may have wrapped
        by_total = np.where(exact, by_total, _unwrapped_mean(state))
    return np.where(state.n > 0, by_total, state.mean)


#: The bound on a merged integer state's float64 mean error that :func:`_unwrapped_mean`
#: assumes, relative to the largest |x|: every merge rounds at that scale or below (about
#: 2**-53 each, a few per level of a tree of at most 2**64 states), far below this.
_MEAN_ERROR_BOUND = 2.0**-40


def _unwrapped_mean(state: Moments) -> np.ndarray:
    """The mean of an integer state whose total may have wrapped: the exact total over n.

    The int64/uint64 total is the exact sum modulo 2**64, and n times the state's float64
    mean is within ``n * largest * 2**-40`` of it (:data:`_MEAN_ERROR_BOUND`): where that is
    below 2**61 the exact sum is the one near ``round(n * mean)`` with the total's residue,
    and the mean is that sum over n (two roundings: within about an ulp). Elsewhere, or where
    the correction found is not small (a bound that did not hold), the state's mean.
    Before, past ``n * max|x| >= 2**62`` the state's mean decided: ``mean([2**62, -2**62, 1,
    2])`` over Dask chunks or MPI ranks of 1 and 3 elements was 0.0, not 0.75.
    ``state_mean`` in ``kernels/multireduce/stats.cuh`` makes the same float64 and 64-bit
    integer operations.
    """
    n = state.n.astype(np.float64)
    largest = np.maximum(np.abs(np.asarray(state.lo, np.float64)), np.abs(np.asarray(state.hi, np.float64)))
    with np.errstate(invalid="ignore", over="ignore"):
        approx = np.rint(n * state.mean)  # an integer-valued float64 near the exact sum
        small = np.abs(approx) < 2.0**63
        residue = np.fmod(approx, 2.0**64)  # exact; and exact below 2**64 after the shift (a multiple of 2**11)
        residue = np.where(residue < 0, residue + 2.0**64, residue)
        approx_bits = np.where(
            small,
            np.where(small, approx, 0.0).astype(np.int64).view(np.uint64),
            np.where(small, 0.0, residue).astype(np.uint64),
        )
        # The exact sum less approx, from the residues modulo 2**64 (uint64 arithmetic wraps).
        correction = (np.asarray(state.total).astype(np.uint64) - approx_bits).view(np.int64).astype(np.float64)
        trusted = (n * (largest * _MEAN_ERROR_BOUND + 1.0) < 2.0**61) & (np.abs(correction) < 2.0**62)
        trusted &= np.isfinite(approx)
        return np.where(trusted, (approx + correction) / n, state.mean)


def dtype_total_bound(dtype: np.dtype, count: int) -> bool:
    """Whether ``count`` elements of the integer or bool ``dtype`` pass :func:`state_mean`'s bound, whatever they are.

    ``n * max(|min|, |max|) < EXACT_TOTAL_BOUND`` (in float64) over the dtype's range: their
    exact total cannot have wrapped, and their mean is ``float64(total) / n``. Where this is
    false the data's own extremes decide (:func:`state_mean`).
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return float(count) < EXACT_TOTAL_BOUND
    info = np.iinfo(dtype)
    return float(count) * max(abs(float(info.min)), float(info.max)) < EXACT_TOTAL_BOUND


def _total_is_the_mean(state: Moments) -> bool:
    """Whether :func:`state_mean` takes a finite total over n: a float64 total of float32 input.

    Not for float64 input: a merged state's mean (Chan's update of the parts' float64 means)
    is the more accurate there for data far from zero (timestamps near 1.7e9 over 16 Dask
    chunks: 0.22 ulp on average against 0.50 for the total over n), and its result has no
    narrower dtype to round a tie in.
    """
    return state.total.dtype == np.float64 and np.asarray(state.lo).dtype == np.float32


def _state_mean_scalar(state: Moments) -> float:
    # state_mean for a 0-d state with n > 0, in Python floats (the same IEEE operations).
    total = state.total[()]
    if total.dtype.kind in "iu":
        n = float(int(state.n))
        if n * max(abs(float(state.lo[()])), abs(float(state.hi[()]))) < EXACT_TOTAL_BOUND:
            return float(total) / n
        return float(_unwrapped_mean(state.map(np.asarray)))
    if _total_is_the_mean(state) and math.isfinite(float(total)):
        return float(total) / float(int(state.n))  # as state_mean: float32 input's float64 total over n
    mean = float(state.mean)
    if not (math.isfinite(mean) and math.isfinite(float(total))) and _finite_extremes(state):
        return float(total) / float(int(state.n))
    return mean


def _finite_extremes(state: Moments) -> bool:
    # Whether a 0-d float state's elements are all finite (its lo and hi are).
    return math.isfinite(float(state.lo[()])) and math.isfinite(float(state.hi[()]))


def _state_m2_scalar(state: Moments) -> float:
    # The M2 of a 0-d state with the rule of _overflowed_m2, in Python floats.
    m2 = float(state.m2)
    total = state.total[()]
    overflowed = math.isnan(m2) or (total.dtype.kind == "f" and not math.isfinite(float(total)))
    if overflowed and _finite_extremes(state):
        return math.inf
    return m2


def finalize_moments(
    state: Moments,
    op: Op,
    result: np.dtype,
    correction: float = 0.0,
    value_warnings: bool = False,
    count_warnings: bool = True,
) -> Any:
    """The value of the moments op ``op`` (mean, nanmean, var, std, nanvar, nanstd) from a state.

    NaN propagates, except for the ops that skip it (nanmean, nanvar, nanstd: the state's n,
    mean and M2 are those of the non-NaN elements). Following the Array API, the mean of zero elements
    is NaN, and var/std are NaN where ``N - correction <= 0`` (NumPy divides by the
    non-positive count instead, giving inf or NaN). NumPy's RuntimeWarnings for these cases
    are emitted too (:func:`warn_moments`: decided by the number of elements, NaN included,
    as NumPy decides them). The mean is :func:`state_mean`'s. var and std of finite elements
    are never NaN: they are inf where the float64 squares overflowed (M2 inf, or NaN from
    inf - inf), as NumPy's var; with an infinite element they are NaN, as NumPy's.

    ``value_warnings``: the state's elements were reduced on the CPU, and NumPy's overflow
    and invalid-value warnings are decided here for each whole slice
    (:func:`warn_arithmetic`), in NumPy's order: var and std warn "Degrees of freedom" first,
    the nan functions last. ``count_warnings``: :func:`warn_moments`' (``stats()``' var has
    none: NaN where ``N - correction <= 0``, silently).
    """
    if state.n.ndim == 0:
        return _finalize_moments_scalar(state, op, result, correction, value_warnings, count_warnings)
    skipna = op.skips_nan
    n = state.n
    nan = state.nan
    _warn_finalize(state, op, n if skipna else n + nan, correction, value_warnings, count_warnings)
    if op.statistic == "mean":
        value = np.where(n > 0, state_mean(state), np.float64(np.nan))
        if not skipna:
            value = _nan_where(nan > 0, value)
        return _as_result(value, result)
    dof = n - correction
    with np.errstate(invalid="ignore", divide="ignore"):
        value = _overflowed_m2(state.m2, state.lo, state.hi, state.total) / np.where(dof > 0, dof, 1.0)
    no_dof = ~(dof > 0)  # N - correction <= 0, or NaN (correction=nan)
    value = _nan_where(no_dof | (nan > 0) if not skipna else no_dof, value)
    if op.statistic == "std":
        value = np.sqrt(value)
    return _narrowed(value, result, state, skipna, value_warnings)


def _warn_finalize(
    state: Moments, op: Op, count: Any, correction: float, value_warnings: bool, count_warnings: bool
) -> None:
    # finalize_moments' warnings, in NumPy's order: np.var warns "Degrees of freedom" before
    # it sums, np.nanvar and np.nanmean warn about the count after theirs.
    quiet_m2 = op.statistic == "mean"
    if value_warnings and op.skips_nan:
        warn_arithmetic(state, quiet_m2, True)
    if count_warnings:
        warn_moments(op, count, correction, inexact=state.total.dtype.kind == "f")
    if value_warnings and not op.skips_nan:
        warn_arithmetic(state, quiet_m2, False)


def _finalize_moments_scalar(
    state: Moments, op: Op, result: np.dtype, correction: float, value_warnings: bool, count_warnings: bool = True
) -> np.generic:
    # finalize_moments for a 0-d state, in Python floats: the same IEEE operations (float64
    # division, sqrt) as the array code, without its per-call NumPy overhead, which is what a
    # full GPU reduction would otherwise pay on the host after its kernel.
    n, nan = int(state.n), int(state.nan)
    skipna = op.skips_nan
    _warn_finalize(state, op, n if skipna else n + nan, correction, value_warnings, count_warnings)
    if op.statistic == "mean":
        value = _state_mean_scalar(state) if n > 0 and (nan == 0 or skipna) else math.nan
        return result.type(value)
    dof = n - correction
    value = _divide_m2(_state_m2_scalar(state), dof) if dof > 0 and (nan == 0 or skipna) else math.nan
    if op.statistic == "std":
        value = math.sqrt(value) if value >= 0 else math.nan
    if result.itemsize < 8:
        return _narrowed(value, result, state, skipna, value_warnings, scalar=True)
    return result.type(value)


def _divide_m2(m2: float, dof: float) -> float:
    """``m2 / dof`` (``dof > 0``) in Python floats, with NumPy's warning where a finite M2 overflows.

    A fractional ``correction`` just below N makes ``dof`` tiny: NumPy's var of a full
    reduction divides a float64 scalar and warns "overflow encountered in scalar divide"
    (or raises, under ``numpy.errstate``), as the array path's division does; Python's
    division is silent.
    """
    value = m2 / dof
    if math.isinf(value) and math.isfinite(m2):
        _ = np.float64(m2) / np.float64(dof)  # NumPy's own warning, under the caller's errstate
    return value


@dataclass(frozen=True)
class Stats:
    """What :func:`multireduce.stats` returns: several statistics from one pass.

    Every field is a NumPy scalar (axis=None) or an array with the shape of the kept axes; for
    CuPy input to :func:`multireduce.stats`, a CuPy array (0-d for axis=None) on its device.

    Attributes
    ----------
    count : int64
        Number of elements reduced (NaN included).
    nan_count : int64
        Number of NaN elements.
    sum : dtype of :func:`multireduce.sum`
    min, max : the input's dtype
        IEEE 754-2019 order for signed zeros.
    mean : dtype of :func:`multireduce.mean`
    var : dtype of :func:`multireduce.var`
        With the ``correction`` given to :func:`multireduce.stats`.
    std : dtype of :func:`multireduce.std`
        :func:`multireduce.std`'s value: the square root of the float64 variance, rounded
        once (not the square root of ``var``, which for float16 and float32 input is
        rounded already, and is infinite or zero where the variance leaves their range).
        A field since 2026-12-01 (a property, ``sqrt(var)``, before); a ``Stats`` made with
        seven fields takes ``sqrt(var)`` for it, as before.

    NaN propagates into sum, min, max, mean and var exactly as in the single ops; the counts
    say how many elements were NaN (``count - nan_count`` are numbers).
    """

    count: Any
    nan_count: Any
    sum: Any
    min: Any
    max: Any
    mean: Any
    var: Any
    std: Any = None

    def __post_init__(self) -> None:
        if self.std is None:  # made with the seven fields of the earlier Stats
            object.__setattr__(self, "std", np.sqrt(self.var))


def empty_stats_error() -> ValueError:
    """The error of :func:`multireduce.stats` over zero elements."""
    return ValueError("zero-size array to stats: min and max of zero elements are undefined (as numpy.min/max)")


def finalize_stats(state: Moments, dtype: np.dtype, correction: float = 0.0, value_warnings: bool = False) -> Stats:
    """A :class:`Stats` from a moments state of input dtype ``dtype``.

    ``value_warnings``: the state's elements were reduced on the CPU; NumPy's overflow and
    invalid-value warnings of var are decided for each whole slice (:func:`warn_arithmetic`):
    as var's, none where the slice holds a NaN (its fields are NaN there).

    Raises
    ------
    ValueError
        If some output covers zero elements: min and max have no identity (as NumPy's).
    """
    dtype = np.dtype(dtype)
    if state.n.ndim == 0:
        return _finalize_stats_scalar(state, dtype, correction, value_warnings)
    count = state.n + state.nan
    if np.any(count == 0):
        raise empty_stats_error()
    if value_warnings:
        warn_arithmetic(state, quiet_m2=False, skips_nan=False)
    nan = state.nan > 0
    total = state.total
    if total.dtype.kind == "f":
        total = _nan_where(nan, total + total.dtype.type(0))  # sums of zeros are +0.0
    lo, hi = state.lo, state.hi
    if dtype.kind == "f":
        lo, hi = _nan_where(nan, lo), _nan_where(nan, hi)
    mean_dt = OPS["mean"].result_dtype(dtype)
    # NaN where N - correction <= 0, as var's, without its warning (only that one: a
    # warnings filter here hid the cast's overflow too, and in every thread).
    var = finalize_moments(state, OPS["var"], np.dtype(np.float64), correction, count_warnings=False)
    # std's value: the float64 root, rounded once; it overflows its dtype only where var
    # does, whose narrowing warns.
    std = _narrowed(np.sqrt(var), mean_dt, state, False, False)
    return Stats(
        count=_as_result(count, np.int64),
        nan_count=_as_result(state.nan, np.int64),
        sum=cast_result(np.asarray(total), OPS["sum"].result_dtype(dtype))[()],
        min=_as_result(lo, dtype),
        max=_as_result(hi, dtype),
        mean=finalize_moments(state, OPS["mean"], mean_dt),
        var=_narrowed(var, mean_dt, state, False, value_warnings),
        std=std,
    )


def _finalize_stats_scalar(state: Moments, dtype: np.dtype, correction: float, value_warnings: bool) -> Stats:
    # finalize_stats for a 0-d state (a full reduction), in Python scalars; see
    # _finalize_moments_scalar.
    n, nan = int(state.n), int(state.nan)
    if n + nan == 0:
        raise empty_stats_error()
    if value_warnings:
        warn_arithmetic(state, quiet_m2=False, skips_nan=False)
    total, lo, hi = state.total[()], state.lo[()], state.hi[()]
    if total.dtype.kind == "f":
        total = total.dtype.type(math.nan) if nan else total + total.dtype.type(0)  # sums of zeros are +0.0
    if dtype.kind == "f" and nan:
        lo = hi = math.nan
    mean_dt = OPS["mean"].result_dtype(dtype)
    dof = n - correction
    var = _divide_m2(_state_m2_scalar(state), dof) if dof > 0 and not nan else math.nan
    # std overflows its dtype only where var does, whose narrowing warns.
    std = _narrowed(math.sqrt(var) if var >= 0 else math.nan, mean_dt, state, False, False)
    return Stats(
        count=np.int64(n + nan),
        nan_count=np.int64(nan),
        sum=cast_result(np.asarray(total), OPS["sum"].result_dtype(dtype))[()],
        min=np.asarray(lo).astype(dtype)[()],
        max=np.asarray(hi).astype(dtype)[()],
        mean=mean_dt.type(_state_mean_scalar(state) if n > 0 and not nan else math.nan),
        var=_narrowed(var, mean_dt, state, False, value_warnings, scalar=True),
        std=std,
    )


# ----------------------------------------------------------------------------------------
# argmin / argmax


@dataclass(frozen=True)
class ArgState:
    """Partial state of argmin/argmax: the extreme value and its int64 index (-1: none yet)."""

    value: np.ndarray
    index: np.ndarray

    def map(self, func) -> ArgState:
        return ArgState(func(self.value), func(self.index))


def empty_arg_state(dtype: np.dtype, shape: tuple[int, ...] = ()) -> ArgState:
    """The state of zero elements of input ``dtype``: the neutral element of :func:`arg_merge`.

    Its value has the dtype of a non-empty state's (``_extreme_acc(dtype)``, the ``value``
    field of :func:`arg_dtype`; given that dtype itself, the same), so that merging it with
    one keeps that dtype: a placeholder of another dtype made ``numpy.where`` promote uint64
    and int64 values to float64, which rounds large values and mixes up their keys.
    """
    return ArgState(np.zeros(shape, _extreme_acc(np.dtype(dtype))), np.full(shape, -1, np.int64))


def _arg_keys(value: np.ndarray, largest: bool, nan_wins: bool = True) -> np.ndarray:
    # Ordered int64 keys: IEEE total order (-0.0 < +0.0), complemented for argmin, with NaN
    # the largest key for both, so that the first NaN wins as in NumPy (``nan_wins``), or
    # the smallest (nanargmax, nanargmin: a NaN only where there is nothing else).
    return encode_extreme(np.asarray(value), largest, nan_wins=nan_wins)


def arg_state(x: np.ndarray, axis: int | None, largest: bool, offset: int = 0, nan_wins: bool = True) -> ArgState:
    """The state of argmax (``largest``) or argmin of the non-empty NumPy array ``x``.

    ``axis=None`` indexes the C-order flattening of ``x``; ``offset`` is added to the
    indices (a shard's position in the global flattening). ``nan_wins`` false: nanargmax or
    nanargmin (NaN elements lose to every number; an all-NaN slice gets its first NaN).
    """
    if axis is None:
        x = x.reshape(-1)
        axis = 0
    elif x.ndim >= 64:
        # take_along_axis indexes with one array per axis: at NumPy's 64 axes that is one
        # too many (IndexError). The kept axes as one (a view where x allows it).
        moved = np.moveaxis(x, axis, -1)
        flat = arg_state(moved.reshape(-1, moved.shape[-1]), 1, largest, offset, nan_wins)
        return flat.map(lambda a: a.reshape(moved.shape[:-1]))
    find = np.argmax if largest else np.argmin
    index = find(x, axis=axis)
    value = np.take_along_axis(x, np.expand_dims(index, axis), axis).squeeze(axis)
    # NumPy takes the first of -0.0 and +0.0; the IEEE order of max/min picks +0.0 for
    # argmax (and -0.0 for argmin) wherever both occur. And NumPy's argmax finds the first
    # NaN of a slice that holds one, which nanargmax passes over. Only then are keys formed.
    if x.dtype.kind == "f" and (np.any(value == 0) or (not nan_wins and np.any(np.isnan(value)))):
        index = np.argmax(_arg_keys(x, largest, nan_wins), axis=axis)
        value = np.take_along_axis(x, np.expand_dims(index, axis), axis).squeeze(axis)
    acc = _extreme_acc(x.dtype)
    return ArgState(np.asarray(value).astype(acc), np.asarray(index, dtype=np.int64) + np.int64(offset))


def arg_merge(a: ArgState, b: ArgState, largest: bool, nan_wins: bool = True) -> ArgState:
    """Merge two states: the extreme wins, equal values go to the smaller index.

    NaN beats every number (``nan_wins``, argmax/argmin) or loses to every number.
    """
    ka = _arg_keys(a.value, largest, nan_wins)
    kb = _arg_keys(b.value, largest, nan_wins)
    b_wins = (a.index < 0) | ((b.index >= 0) & ((kb > ka) | ((kb == ka) & (b.index < a.index))))
    return ArgState(np.where(b_wins, b.value, a.value), np.where(b_wins, b.index, a.index))


def arg_merge_all(states: Iterable[ArgState], largest: bool, nan_wins: bool = True) -> ArgState:
    """Merge states in order (the result does not depend on the order)."""
    it = iter(states)
    try:
        out = next(it)
    except StopIteration:
        raise ValueError("no arg states to merge") from None
    for s in it:
        out = arg_merge(out, s, largest, nan_wins)
    return out


def arg_merge_pairs(pairs: Sequence[tuple[np.generic, int]], largest: bool, nan_wins: bool = True) -> ArgState:
    """:func:`arg_merge_all` of 0-d states given as ``(value, index)`` pairs, in Python scalars.

    ``value`` is a NumPy scalar of the accumulator dtype, ``index`` an int (-1: none). The
    keys are :func:`multireduce._transport.encode_extreme_scalar`'s, the integers of the array
    merge's keys, so the winner is the same (the MPI layer merges one pair per rank).
    """
    if not pairs:
        raise ValueError("no arg states to merge")
    value, index = pairs[0]
    key = encode_extreme_scalar(value, largest, nan_wins)
    for v, i in pairs[1:]:
        k = encode_extreme_scalar(v, largest, nan_wins)
        if index < 0 or (i >= 0 and (k > key or (k == key and i < index))):
            value, index, key = v, i, k
    return ArgState(value, np.int64(index))


def arg_finalize(state: ArgState, op: Op) -> Any:
    """The int64 index (array or scalar) from a state.

    Raises
    ------
    ValueError
        If some output covers zero elements, or (nanargmax, nanargmin) only NaN: NumPy's
        messages.
    """
    if np.any(state.index < 0):
        raise op.empty_error()
    if op.skips_nan and np.asarray(state.value).dtype.kind == "f" and np.any(np.isnan(state.value)):
        raise ValueError("All-NaN slice encountered")
    return _as_result(state.index, np.int64)


# ----------------------------------------------------------------------------------------
# States as NumPy structured arrays: how they travel through MPI and Dask.


@functools.cache
def moments_dtype(dtype: np.dtype) -> np.dtype:
    """The structured dtype of a :class:`Moments` state for input dtype ``dtype``."""
    dtype = np.dtype(dtype)
    ext = _extreme_acc(dtype)
    return np.dtype(
        [
            ("n", np.int64),
            ("nan", np.int64),
            ("total", _sum_acc(dtype)),
            ("mean", np.float64),
            ("m2", np.float64),
            ("lo", ext),
            ("hi", ext),
            ("mean_lo", np.float64),
        ]
    )


@functools.cache
def arg_dtype(dtype: np.dtype) -> np.dtype:
    """The structured dtype of an :class:`ArgState` for input dtype ``dtype``."""
    return np.dtype([("value", _extreme_acc(np.dtype(dtype))), ("index", np.int64)])


def to_structured(state: Moments | ArgState) -> np.ndarray:
    """A state as one structured array (fields named as the dataclass's)."""
    names = _field_names(type(state))
    parts = [np.asarray(getattr(state, name)) for name in names]
    out = np.empty(parts[0].shape, dtype=[(name, p.dtype) for name, p in zip(names, parts, strict=True)])
    for name, p in zip(names, parts, strict=True):
        out[name] = p
    return out


def moments_from_structured(a: np.ndarray) -> Moments:
    """Invert :func:`to_structured` for a moments state."""
    return Moments(*(np.array(a[name]) for name in _MOMENTS_FIELDS))


def arg_from_structured(a: np.ndarray) -> ArgState:
    """Invert :func:`to_structured` for an arg state."""
    return ArgState(np.array(a["value"]), np.array(a["index"]))
