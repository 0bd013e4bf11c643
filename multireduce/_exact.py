"""Exact, order-independent floating-point sums: the reproducible mode's accumulator.

Method
------
Every finite float16, float32 or float64 value is an integer multiple of 2**-1074 (the
smallest float64 subnormal). :class:`ExactSum` holds the sum of its inputs *exactly*, as an
integer number of those units, split into 32-bit digits ("limbs") kept in int64 slots
(a Kulisch-style superaccumulator, as in Collange, Defour, Graillat and Iakymchuk's ExBLAS).
Integer addition is associative, so adding values or merging accumulators in any order, on any
number of ranks, chunks or devices gives the same integer, and the final result is that
integer rounded once, correctly (round half to even), to the result dtype.

Error bound: none beyond the one final rounding. The result is the correctly rounded exact
sum (|error| <= half an ulp of the result), or +-inf when the exact sum rounds beyond the
dtype's largest finite value; that rounding raises NumPy's floating-point overflow as the
ordinary sum's does (a ``RuntimeWarning``, under the caller's ``numpy.errstate``; see
:func:`round_to_dtype`). Special values follow IEEE 754: any NaN, or +inf together with
-inf, gives NaN; otherwise an infinity gives that infinity, whatever the finite elements
add up to. Only +inf with -inf and no NaN warns, as NumPy's sum of them does ("invalid value
encountered in reduce": :meth:`ExactSum.result`).

Layout
------
``limbs[k]`` weighs ``2**(32*k - 1074)``; :data:`LIMBS` digits cover every float64 magnitude
times 2**64 elements. Between normalisations each slot may hold any int64; ``normalize()``
carries every slot but the last into [0, 2**32), after which at least 2**31 accumulators can
be added slot by slot without overflow (this is what MPI's integer SUM and the Dask combine
do). ``flags`` counts NaNs, +infs and -infs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import _stats
from .ops import OPS, warn_as_reduction

__all__ = ["LIMBS", "ExactSum", "exact_sum", "round_to_dtype"]

SCALE = 1074  # the unit is 2**-SCALE
DIGIT = 32
LIMBS = 70  # 70 * 32 = 2240 bits >= 1074 + 1024 + 64 + sign
_MASK = (1 << DIGIT) - 1
# Elements per vectorised block: float64 bincount sums of significands below 2**27 stay
# exact below 2**53, so at most 2**26 elements per block; smaller blocks stay in cache.
_BLOCK = 1 << 16
# Significand bits that one bincount takes (float16 and float32 whole, float64 in halves).
_SIGNIFICAND_BITS = 27
_SPLIT = 26
# Per float dtype: the unsigned integer of its width, the stored significand bits, the
# exponent bits and the exponent bias.
_FORMATS = {
    np.dtype(np.float16): (np.uint16, 10, 5, 15),
    np.dtype(np.float32): (np.uint32, 23, 8, 127),
    np.dtype(np.float64): (np.uint64, 52, 11, 1023),
}


def _digits(value: int) -> np.ndarray:
    """The non-negative ``value`` < 2**(32 * LIMBS) as LIMBS 32-bit digits in int64 slots."""
    return np.frombuffer(value.to_bytes(4 * LIMBS, "little"), dtype="<u4").astype(np.int64)


@dataclass
class ExactSum:
    """The exact sum of a multiset of floats, mergeable in any order.

    Attributes
    ----------
    limbs : numpy.ndarray
        int64[LIMBS]; the sum is ``sum(limbs[k] * 2**(32*k)) * 2**-1074``.
    flags : numpy.ndarray
        int64[3]: counts of NaN, +inf and -inf inputs.
    count : int
        Number of inputs (for the mean).
    """

    limbs: np.ndarray = field(default_factory=lambda: np.zeros(LIMBS, dtype=np.int64))
    flags: np.ndarray = field(default_factory=lambda: np.zeros(3, dtype=np.int64))
    count: int = 0

    def add(self, x: np.ndarray) -> ExactSum:
        """Add every element of the float array ``x``; returns ``self``."""
        flat = np.asarray(x).reshape(-1)
        if flat.dtype.kind != "f":
            raise TypeError(f"ExactSum adds float16, float32 or float64 values, not {flat.dtype}")
        self.count += flat.size
        total = 0
        for start in range(0, flat.size, _BLOCK):
            total += self._block_total(flat[start : start + _BLOCK])
        if total:
            self.limbs += _digits(abs(total)) * (1 if total > 0 else -1)
        return self

    def _block_total(self, block: np.ndarray) -> int:
        """The exact sum of the block's finite elements in 2**-1074 units; counts its NaN and infinities.

        The elements are bucketed by their exponent field: every element of one bucket is
        its integer significand times the same power of two, so ``numpy.bincount`` adds the
        signed significands of each bucket, exactly (float64 sums of integers below 2**53:
        significands below 2**27, float64's in two halves, and at most :data:`_BLOCK` of them),
        and the few non-empty buckets are shifted into place as Python integers. (The first
        version took each element apart with ``frexp`` and spread it over three limbs with
        three ``bincount`` calls: 210 ms for 2**22 float32, against 15 ms now.)
        """
        uint, mbits, ebits, bias = _FORMATS[block.dtype]
        if not block.flags.c_contiguous:
            block = np.ascontiguousarray(block)
        bits = block.view(uint)
        exponent = (bits >> uint(mbits)) & uint((1 << ebits) - 1)
        finite = exponent != uint((1 << ebits) - 1)
        if not finite.all():
            special = block[~finite]
            self.flags[0] += int(np.isnan(special).sum())
            self.flags[1] += int((special == np.inf).sum())
            self.flags[2] += int((special == -np.inf).sum())
            block, bits, exponent = block[finite], bits[finite], exponent[finite]
        significand = bits & uint((1 << mbits) - 1)
        significand |= (exponent != 0).astype(uint) << uint(mbits)  # the hidden bit of normal numbers
        bucket = exponent.astype(np.intp)
        halves = [(significand, 0)]
        if mbits + 1 > _SIGNIFICAND_BITS:  # float64: two halves of at most 27 bits
            low = significand & uint((1 << _SPLIT) - 1)
            halves = [(low, 0), (significand >> uint(_SPLIT), _SPLIT)]
        total = 0
        for part, shift in halves:
            weights = part.astype(np.float64)
            np.copysign(weights, block, out=weights)  # the element's sign (zeros add nothing)
            sums = np.bincount(bucket, weights=weights, minlength=1 << ebits)
            for b in np.flatnonzero(sums).tolist():
                # The bucket's elements are significand * 2**(max(b, 1) - bias - mbits):
                # exponent field 0 (subnormals) has the spacing of field 1.
                total += int(sums[b]) << (max(b, 1) - bias - mbits + shift + SCALE)
        return total

    def merge(self, other: ExactSum) -> ExactSum:
        """Add another accumulator into this one; returns ``self``."""
        self.limbs += other.limbs
        self.flags += other.flags
        self.count += other.count
        return self.normalize()

    def normalize(self) -> ExactSum:
        """Carry every slot but the last into [0, 2**32), keeping the value; returns ``self``."""
        total = self.value()
        for k in range(LIMBS - 1):
            self.limbs[k] = total & _MASK
            total >>= DIGIT
        self.limbs[LIMBS - 1] = total  # the signed top; raises OverflowError if out of range
        return self

    def value(self) -> int:
        """The exact sum, as an integer number of 2**-1074 units."""
        return sum(int(d) << (DIGIT * k) for k, d in enumerate(self.limbs.tolist()))

    def to_array(self) -> np.ndarray:
        """int64[LIMBS + 4]: limbs, flags and count, the form that travels through MPI."""
        return np.concatenate([self.limbs, self.flags, np.array([self.count], dtype=np.int64)])

    @classmethod
    def from_array(cls, packed: np.ndarray) -> ExactSum:
        """Inverse of :meth:`to_array`."""
        packed = np.asarray(packed, dtype=np.int64)
        return cls(packed[:LIMBS].copy(), packed[LIMBS : LIMBS + 3].copy(), int(packed[LIMBS + 3]))

    def result(self, dtype: np.dtype, *, mean: bool = False) -> np.generic:
        """The sum, or with ``mean=True`` the mean, rounded once to ``dtype``.

        The mean of no elements is NaN, with NumPy's RuntimeWarning. A finite exact sum that
        rounds past ``dtype``'s range is +-inf with NumPy's overflow (:func:`round_to_dtype`);
        the mean is the exact sum over the count, rounded once, so it lies within the range
        of its finite elements and never overflows (10 float16 60000.0: the sum is inf with
        the warning, the mean 60000.0 without). A NaN or an infinity among the elements gives
        NaN or that infinity without a warning; +inf with -inf (and no NaN) gives NaN with
        NumPy's "invalid value encountered in reduce" (its sum adds them: inf - inf), under
        the caller's ``numpy.errstate``. (NumPy's own sum warns there only where the two
        infinities meet before a NaN in its order of additions; the rule here, the moments'
        too, does not depend on the order.)
        """
        dt = np.dtype(dtype)
        if mean and self.count == 0:
            _stats.warn_moments(OPS["mean"], 0, 0.0)  # NumPy's "Mean of empty slice"
            return dt.type(np.nan)
        divide_by = self.count if mean else 1
        nan, pos_inf, neg_inf = (int(f) for f in self.flags)
        if pos_inf and neg_inf and not nan:
            warn_as_reduction(invalid=True)  # NumPy's invalid value, under the caller's errstate
        if nan or (pos_inf and neg_inf):
            return dt.type(np.nan)
        if pos_inf or neg_inf:
            return dt.type(np.inf if pos_inf else -np.inf)
        return round_to_dtype(self.value(), SCALE, dt, divide_by)


def exact_sum(x: np.ndarray) -> ExactSum:
    """An :class:`ExactSum` of the elements of ``x``."""
    return ExactSum().add(x)


def round_to_dtype(numerator: int, scale: int, dtype: np.dtype, divide_by: int = 1) -> np.generic:
    """``numerator * 2**-scale / divide_by`` rounded to nearest, ties to even, in ``dtype``.

    One rounding, straight to the target format (no double rounding through float64), with
    subnormals and overflow to infinity handled as IEEE 754 does: a value that rounds to
    ``2**maxexp`` or beyond (float16: from 65520 up; 65519 is 65504) is +-inf, and raises
    NumPy's floating-point overflow under the caller's ``numpy.errstate``, as the ordinary
    sum's does (:func:`_overflow`).

    Raises
    ------
    FloatingPointError
        Where the result overflows under ``numpy.errstate(over="raise")``.
    ZeroDivisionError
        For ``divide_by == 0``.
    """
    dt = np.dtype(dtype)
    info = np.finfo(dt)
    precision = info.nmant + 1  # significand bits, hidden bit included
    if numerator == 0 or divide_by == 0:
        if divide_by == 0:
            raise ZeroDivisionError("round_to_dtype: divide_by is 0")
        return dt.type(0.0)
    negative = (numerator < 0) != (divide_by < 0)
    num, den = abs(numerator), abs(divide_by) << scale  # the value is num / den > 0
    # floor(log2(num / den)): the bit lengths give it to within one.
    top = num.bit_length() - den.bit_length()
    if (num >= den << top) if top >= 0 else (num << -top >= den):
        floor_log2 = top
    else:
        floor_log2 = top - 1
    # The exponent of the last significand bit; below the normal range the spacing stays at
    # that of the smallest normal (subnormals).
    e = max(floor_log2 - (precision - 1), info.minexp - (precision - 1))
    if e >= 0:
        q, r = divmod(num, den << e)
        divisor = den << e
    else:
        q, r = divmod(num << -e, den)
        divisor = den
    if 2 * r > divisor or (2 * r == divisor and q & 1):
        q += 1
    if q.bit_length() > precision:  # rounding carried into a new bit: q == 2**precision
        q >>= 1
        e += 1
    if e + q.bit_length() - 1 >= info.maxexp:  # beyond the largest finite exponent
        return _overflow(dt, negative)
    value = math.ldexp(float(q), e)  # exact: q has at most `precision` bits
    return dt.type(-value if negative else value)


def _overflow(dt: np.dtype, negative: bool) -> np.generic:
    """+-inf of the float dtype ``dt``, from a NumPy operation that overflows as the ordinary sum's does.

    NumPy reports a floating-point overflow by the flag that its operation raised, under the
    caller's ``numpy.errstate`` and warning filters: by default ``RuntimeWarning: overflow
    encountered in <operation>``, ``FloatingPointError`` under ``over="raise"``, nothing under
    ``over="ignore"`` (and ``"call"``, ``"print"``, ``"log"`` as NumPy does them). So the
    overflow is made by a NumPy operation rather than imitated: a reduction, ``overflow
    encountered in reduce`` (here the sum of float64's largest finite value with itself),
    as NumPy's own sum of every float dtype, and the ordinary sum's
    (:func:`multireduce.ops.cast_result`). It gives the correctly rounded result, +-inf.
    """
    top = np.finfo(np.float64).max
    return np.add.reduce(np.full(2, -top if negative else top)).astype(dt)[()]
