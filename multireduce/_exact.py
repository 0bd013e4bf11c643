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
dtype's largest finite value. Special values follow IEEE 754: any NaN, or +inf together with
-inf, gives NaN; otherwise an infinity gives that infinity.

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
from .ops import OPS

__all__ = ["LIMBS", "ExactSum", "exact_sum", "round_to_dtype"]

SCALE = 1074  # the unit is 2**-SCALE
DIGIT = 32
LIMBS = 70  # 70 * 32 = 2240 bits >= 1074 + 1024 + 64 + sign
_MASK = (1 << DIGIT) - 1
# Elements per vectorised block: each limb receives < 2**32 per element, and float64
# bincount sums stay exact below 2**53, so at most 2**21 elements per block.
_BLOCK = 1 << 20


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
        for start in range(0, flat.size, _BLOCK):
            self._add_block(flat[start : start + _BLOCK])
        return self

    def _add_block(self, block: np.ndarray) -> None:
        v = block.astype(np.float64)  # exact for float16/float32
        finite = np.isfinite(v)
        if not finite.all():
            self.flags[0] += int(np.isnan(v).sum())
            self.flags[1] += int((v == np.inf).sum())
            self.flags[2] += int((v == -np.inf).sum())
            v = v[finite]
        v = v[v != 0]
        if v.size == 0:
            return
        mantissa, exponent = np.frexp(v)  # v = mantissa * 2**exponent, 0.5 <= |mantissa| < 1
        m = np.ldexp(mantissa, 53).astype(np.int64)  # exact: |m| < 2**53
        position = exponent.astype(np.int64) - 53 + SCALE  # v = m * 2**(position - SCALE), position >= 0
        sign = np.where(m < 0, -1, 1)
        m = np.abs(m)
        # float64 subnormals: the low bits of m are zero, so shifting them out is exact.
        below = position < 0
        if below.any():
            m = np.where(below, m >> np.where(below, -position, 0), m)
            position = np.maximum(position, 0)
        limb = position >> 5
        shift = position & 31
        low = (m & _MASK) << shift  # < 2**63
        high = (m >> DIGIT) << shift  # < 2**52
        parts = (
            (limb, low & _MASK),
            (limb + 1, (low >> DIGIT) + (high & _MASK)),  # < 2**31 + 2**32
            (limb + 2, high >> DIGIT),
        )
        for index, digits in parts:
            # float64 weights are exact here: < 2**33 per element, at most 2**20 elements.
            sums = np.bincount(index, weights=(sign * digits).astype(np.float64), minlength=LIMBS)
            self.limbs += sums[:LIMBS].astype(np.int64)

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

        The mean of no elements is NaN, with NumPy's RuntimeWarning.
        """
        dt = np.dtype(dtype)
        if mean and self.count == 0:
            _stats.warn_moments(OPS["mean"], 0, 0.0)  # NumPy's "Mean of empty slice"
            return dt.type(np.nan)
        divide_by = self.count if mean else 1
        nan, pos_inf, neg_inf = (int(f) for f in self.flags)
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
    subnormals and overflow to infinity handled as IEEE 754 does.
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
        return dt.type(-np.inf if negative else np.inf)
    value = math.ldexp(float(q), e)  # exact: q has at most `precision` bits
    return dt.type(-value if negative else value)
