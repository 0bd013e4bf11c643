"""Independent references for the CLI's check of the ops beyond sum, max and min.

``python -m multireduce --check`` compares every result with a reference computed without
multireduce. sum, max and min have theirs in :mod:`multireduce._cli`; this module holds the
others, in four families:

- counts (``count_nonzero``, ``any``, ``all``): exact integers;
- moments (``mean``, ``var``, ``std`` and their nan forms): the exact sums of the elements
  and of their squares as rationals (:class:`Moments`), and a bound on the error of a
  summation in the accumulator dtype;
- arg ops (``argmax``, ``argmin`` and their nan forms): the exact global index
  (:class:`Extreme`);
- products (``prod``, ``nanprod``): the sign, zeros and special values exactly, the magnitude
  in float64 (:class:`Product`), integers modulo 2**64 exactly.

``nansum``, ``nanmax`` and ``nanmin`` use sum's, max's and min's references over the elements
that are not NaN. Each rank makes a *part* of its shard (``part(x, op)``), the parts of all
ranks are combined in rank order (``combine(op, parts)``), and the result is compared with
``check(op, reference, result, ...)``, which returns ``(passed, how)``. The synthetic data
(``x[i] = (i * 7919) % period + low``) gets the same reference types from closed forms
(:func:`synthetic`), so a check does not depend on where its data came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from .ops import OPS as _LIBRARY_OPS
from .ops import get_op

#: Elements converted to Python numbers at a time (bounds a reference's memory).
CHUNK = 1 << 16

COUNT_OPS = ("count_nonzero", "any", "all")
MOMENT_OPS = tuple(name for name, op in _LIBRARY_OPS.items() if op.kind == "moments")
ARG_OPS = tuple(name for name, op in _LIBRARY_OPS.items() if op.kind == "arg")
PRODUCT_OPS = tuple(name for name, op in _LIBRARY_OPS.items() if op.mpi_name == "PROD")
#: The ops this module checks.
OPS = COUNT_OPS + MOMENT_OPS + ARG_OPS + PRODUCT_OPS


def to_float(value: Fraction) -> float:
    """``value`` rounded once to float64; past float64's range, an infinity of its sign."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def same_float(a: float, b: float) -> bool:
    """Identity of floats: NaN is NaN, infinities and zeros have the same sign."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _sqrt(value: Fraction) -> Fraction:
    """The square root of a non-negative rational, to 64 significant bits or better (rounded down)."""
    if value == 0:
        return Fraction(0)
    p, q = value.numerator, value.denominator
    k = max(0, 66 - (p.bit_length() - q.bit_length()) // 2)
    return Fraction(math.isqrt((p << (2 * k)) // q), 1 << k)


def _not_nan(x: np.ndarray) -> np.ndarray:
    return x[~np.isnan(x)] if x.dtype.kind == "f" else x


# --------------------------------------------------------------------------------------------
# Exact sums of floats and of their squares


#: frexp gives float64 values as m * 2**e with e >= -1073: m * 2**53 is an integer, and
#: x * 2**_EXP_BIAS = (m * 2**53) * 2**(e - 53 + _EXP_BIAS) an integer too. The margin of 60
#: takes the low parts of squares (:func:`exact_sum_of_squares`), which reach 2**-1127.
_EXP_BIAS = 1126 + 60


def exact_sum(x: np.ndarray) -> Fraction:
    """The exact sum of the finite float elements ``x``, as a Fraction (no rounding, no overflow).

    Each element is the integer m * 2**53 times a power of two; the integers are added per
    power of two (their 32-bit halves in float64 bincounts of 2**20 elements, exact below
    2**53), and the sums per power in Python integers.
    """
    total = 0
    for start in range(0, x.size, 1 << 20):
        m, e = np.frexp(x[start : start + (1 << 20)].astype(np.float64))
        digits = (m * 2.0**53).astype(np.int64)
        shift = e + (_EXP_BIAS - 53)  # >= 0
        low = np.bincount(shift, weights=digits & 0xFFFFFFFF)
        high = np.bincount(shift, weights=digits >> 32)  # arithmetic shift keeps the sign
        for b in np.flatnonzero((low != 0) | (high != 0)).tolist():
            total += (int(low[b]) + (int(high[b]) << 32)) << b
    return Fraction(total, 1 << _EXP_BIAS)


#: Dekker's splitter for float64: hi holds the top 26 bits of a value, lo the rest.
_SPLIT = 2.0**27 + 1


def exact_sum_of_squares(x: np.ndarray) -> Fraction:
    """The exact sum of the squares of the finite float64 values ``x``.

    A square p + e, with p = fl(x * x) and e its exact rounding error (Dekker's product), is
    exact where neither part over- or underflows: for |x| in [2**-400, 2**500]. Elements
    below are scaled by 2**700 and those above by 2**-600 first (exact: powers of two, into
    that range, subnormals included), and their sums scaled back as rationals. (Before, each
    such element was squared as a Fraction: a million elements near 1e-300 took seconds.)
    """
    a = np.abs(x)
    small = (a < 2.0**-400) & (a != 0)
    large = a > 2.0**500
    total = _dekker_squares(x[~small & ~large])
    if small.any():
        total += _dekker_squares(x[small] * 2.0**700) / (1 << 1400)
    if large.any():
        total += _dekker_squares(x[large] * 2.0**-600) * (1 << 1200)
    return total


def _dekker_squares(y: np.ndarray) -> Fraction:
    """The exact sum of the squares of ``y``, whose magnitudes lie in [2**-400, 2**500] or are 0."""
    p = y * y
    t = y * _SPLIT
    hi = t - (t - y)
    lo = y - hi
    e = ((hi * hi - p) + 2.0 * hi * lo) + lo * lo
    return exact_sum(p) + exact_sum(e)


_LIMB_BITS = 22
_LIMB_MASK = (1 << _LIMB_BITS) - 1


def _magnitudes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|x| as uint64, x < 0) of integers or bools: exact for every int64 and uint64 value."""
    u = x.astype(np.uint64)  # two's complement: a negative v becomes v + 2**64
    negative = x < 0 if x.dtype.kind == "i" else np.zeros(x.shape, dtype=bool)
    return np.where(negative, ~u + np.uint64(1), u), negative


def _int_sums(x: np.ndarray) -> tuple[int, int, int]:
    """Exact sum, sum of squares and sum of |x| of integers or bools, as Python ints.

    Chunks whose elements are below 2**26 in magnitude are summed in int64. Elsewhere each
    |x| (below 2**64) is split into three 22-bit limbs; per chunk of :data:`CHUNK` elements,
    the sums of the limbs (below 2**38) and of the limbs' pairwise products (below 2**60) are
    exact in uint64, and the powers of 2**22 are applied in Python integers.
    """
    total = squares = magnitude = 0
    for start in range(0, x.size, CHUNK):
        chunk = x[start : start + CHUNK]
        if chunk.size and float(np.max(np.abs(chunk.astype(np.float64)))) < 2**26:
            wide = chunk.astype(np.int64)
            total += int(wide.sum())
            magnitude += int(np.abs(wide).sum())
            # Squares below 2**52, summed 2**11 at a time in int64 (below 2**63): exact.
            squares += sum(np.add.reduceat(wide * wide, np.arange(0, wide.size, 1 << 11)).tolist())
            continue
        mag, negative = _magnitudes(chunk)
        limbs = [(mag >> np.uint64(_LIMB_BITS * k)) & np.uint64(_LIMB_MASK) for k in range(3)]
        for k, limb in enumerate(limbs):
            positive_sum, all_sum = int(limb[~negative].sum()), int(limb.sum())
            total += (2 * positive_sum - all_sum) << (_LIMB_BITS * k)
            magnitude += all_sum << (_LIMB_BITS * k)
            for j in range(k, 3):
                pair = int((limb * limbs[j]).sum()) << (_LIMB_BITS * (k + j))
                squares += pair if j == k else 2 * pair
    return total, squares, magnitude


def _wrapped_product(x: np.ndarray) -> int:
    """The product of the integers or bools ``x`` modulo 2**64, exactly.

    Modular products do not depend on their order: a pairwise tree of uint64 multiplications
    (which wrap modulo 2**64) gives the one value a Python loop would.
    """
    wrapped = 1
    for start in range(0, x.size, CHUNK):
        w = x[start : start + CHUNK].astype(np.uint64)  # a negative v becomes v + 2**64: the same residue
        while w.size > 1:
            half = w.size // 2
            w = np.concatenate((w[:half] * w[half : 2 * half], w[2 * half :]))
        if w.size:
            wrapped = wrapped * int(w[0]) % (1 << 64)
    return wrapped


# --------------------------------------------------------------------------------------------
# Moments: mean, var, std


@dataclass(frozen=True)
class Moments:
    """Exact sums over the counted elements (the finite ones; NaN and infinities are flagged)."""

    count: int  # the elements counted: all, or those not NaN for the nan ops
    total: Fraction  # exact sum of the finite counted elements
    squares: Fraction  # exact sum of their squares
    nan: bool
    pos_inf: bool
    neg_inf: bool
    lo: Any = None  # the least and greatest finite counted element (None: there is none)
    hi: Any = None
    positive: float = 0.0  # sums of the positive elements and of the negative ones' |x| (float64,
    negative: float = 0.0  # inf past its range): every partial sum, in any order, lies between
    # The largest mean of |x| of one part (a rank's shard): merging the parts' float64 means
    # (Chan's update, float64 input across ranks) errs on that scale, which an uneven split
    # makes far larger than the whole's mean of |x| ([3.0] on one rank, 9,999 zeros on another).
    # A bound's helper, not part of the reference: not compared (a closed form has the whole's).
    # Unset: this part's own mean of |x|.
    part_scale: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.part_scale is None:
            object.__setattr__(self, "part_scale", self.magnitude / self.count if self.count else 0.0)

    @property
    def magnitude(self) -> float:
        """The sum of the |x| (float64; inf past its range): the mean's error scale."""
        return self.positive + self.negative

    def __add__(self, other: Moments) -> Moments:
        los = [v for v in (self.lo, other.lo) if v is not None]
        his = [v for v in (self.hi, other.hi) if v is not None]
        return Moments(
            self.count + other.count,
            self.total + other.total,
            self.squares + other.squares,
            self.nan or other.nan,
            self.pos_inf or other.pos_inf,
            self.neg_inf or other.neg_inf,
            min(los) if los else None,
            max(his) if his else None,
            self.positive + other.positive,
            self.negative + other.negative,
            max(self.part_scale, other.part_scale),
        )

    def sum_may_overflow(self, margin: float) -> tuple[bool, bool]:
        """Whether a float64 partial sum, in some order, may pass float64's top; and its bottom.

        Partial sums lie between -negative and +positive; ``margin`` (relative) takes the
        summation's rounding.
        """
        largest = float(np.finfo(np.float64).max)
        return not self.positive * (1 + margin) < largest, not self.negative * (1 + margin) < largest

    def spread(self) -> Fraction:
        """The spread of the finite elements, hi - lo, exactly (0 where there is none)."""
        return Fraction(0) if self.lo is None else Fraction(self.hi) - Fraction(self.lo)

    def mean_scale(self) -> float:
        """The mean's error scale: the mean of |x| (or a part's, if larger); the largest |x| past float64's range."""
        if self.lo is None:
            return 0.0
        if math.isfinite(self.magnitude):
            return max(self.magnitude / self.count, self.part_scale)
        return float(max(abs(Fraction(self.lo)), abs(Fraction(self.hi))))

    def denominator(self, correction: float) -> Fraction:
        """The variance's divisor, N - correction."""
        return self.count - Fraction(correction)

    def exact(self, statistic: str, correction: float = 0.0) -> Fraction | float:
        """The exact mean, or variance with ``correction``, as a rational; or NaN / an infinity.

        As docs/semantics.md: NaN where N - correction <= 0 (the Array API standard's rule),
        and 0 for no elements with a negative correction (NumPy's ``var([], ddof=-1)``).
        """
        if self.nan or (self.pos_inf and self.neg_inf):
            return math.nan
        if self.pos_inf or self.neg_inf:
            return (math.inf if self.pos_inf else -math.inf) if statistic == "mean" else math.nan
        if statistic == "mean":
            return math.nan if self.count == 0 else self.total / self.count
        if self.denominator(correction) <= 0:
            return math.nan
        m2 = self.squares - self.total * self.total / self.count if self.count else Fraction(0)
        return m2 / self.denominator(correction)

    def value(self, statistic: str, correction: float = 0.0) -> float:
        exact = self.exact(statistic, correction)
        if not isinstance(exact, Fraction):
            return exact
        return to_float(_sqrt(exact) if statistic == "std" else exact)


def _moments_part(x: np.ndarray, skips_nan: bool) -> Moments:
    if x.dtype.kind != "f":
        total, squares, magnitude = _int_sums(x)
        lo, hi = (int(x.min()), int(x.max())) if x.size else (None, None)  # bools as 0 and 1
        positive, negative = (magnitude + total) // 2, (magnitude - total) // 2  # exact
        return Moments(
            int(x.size),
            Fraction(total),
            Fraction(squares),
            False,
            False,
            False,
            lo,
            hi,
            float(positive),
            float(negative),
        )
    nan = bool(np.isnan(x).any())
    counted = _not_nan(x) if skips_nan else x
    finite = counted[np.isfinite(counted)].astype(np.float64)
    with np.errstate(over="ignore"):
        positive = float(np.add.reduce(finite[finite > 0], dtype=np.float64))
        negative = -float(np.add.reduce(finite[finite < 0], dtype=np.float64))
    return Moments(
        count=int(counted.size),
        total=exact_sum(finite),
        squares=exact_sum_of_squares(finite),
        nan=nan and not skips_nan,
        pos_inf=bool(np.isposinf(counted).any()),
        neg_inf=bool(np.isneginf(counted).any()),
        lo=float(finite.min()) if finite.size else None,
        hi=float(finite.max()) if finite.size else None,
        positive=positive,
        negative=negative,
    )


# --------------------------------------------------------------------------------------------
# argmax, argmin


def ieee_key(value) -> tuple:
    # IEEE 754-2019 maximum/minimum order: -0.0 below +0.0 (ints and bools sort as they are).
    return (value, math.copysign(1.0, value)) if isinstance(value, float) else (value, 0)


@dataclass(frozen=True)
class Extreme:
    """The first element at the extreme of an arg op: its value and global index.

    ``index`` is None where there is no candidate (no elements; for the nan ops, no element
    that is not NaN). ``size`` is the number of elements the part covers (its offset for the
    parts after it). A NaN value (non-nan ops) is the extreme, as in NumPy.
    """

    value: Any
    index: int | None
    size: int


def _extreme_part(x: np.ndarray, op) -> Extreme:
    """The extreme of ``x`` under the project's rule, and its first index.

    NaN first (non-nan ops), else the greatest (argmax) or least (argmin) element in IEEE
    order (-0.0 < +0.0).
    """
    size = int(x.size)
    if x.dtype.kind == "f":
        nan_at = np.flatnonzero(np.isnan(x))
        if nan_at.size and not op.skips_nan:
            return Extreme(math.nan, int(nan_at[0]), size)
        candidates = np.flatnonzero(~np.isnan(x))
    else:
        candidates = np.arange(size)
    if candidates.size == 0:
        return Extreme(None, None, size)
    values = x[candidates]
    best = values.max() if op.largest else values.min()
    at = candidates[values == best]
    if x.dtype.kind == "f" and best == 0:  # both zeros compare equal: +0.0 is the max, -0.0 the min
        signs = np.signbit(x[at])
        wanted = at[~signs] if op.largest else at[signs]
        at = wanted if wanted.size else at
    first = int(at[0])
    value = x[first]
    return Extreme(value.item() if x.dtype.kind != "f" else float(value), first, size)


def _combine_extremes(op, parts: list[Extreme]) -> Extreme:
    best, offset = None, 0
    for p in parts:
        if p.index is not None:
            candidate = Extreme(p.value, offset + p.index, 0)
            if best is None:
                best = candidate
            elif isinstance(best.value, float) and math.isnan(best.value):
                pass  # the first NaN stays
            elif isinstance(p.value, float) and math.isnan(p.value):
                best = candidate
            else:
                ahead = ieee_key(p.value) > ieee_key(best.value)
                if ahead if op.largest else ieee_key(p.value) < ieee_key(best.value):
                    best = candidate
        offset += p.size
    return Extreme(None, None, offset) if best is None else replace(best, size=offset)


# --------------------------------------------------------------------------------------------
# prod, nanprod


@dataclass(frozen=True)
class Product:
    """A product's exact sign, zeros and special values, and its magnitude in float64.

    Integers: ``wrapped`` is the exact product modulo 2**64 (NumPy's integer products wrap),
    ``log2`` the log2 of the product of the |x| > 1 (it decides whether the exact product
    fits). Floats: ``mantissa * 2**exponent`` is |the product of the finite nonzero counted
    elements|, within a relative 2 * count * eps of float64; ``log2`` and ``log2_small`` are
    the log2 of the products of the |x| > 1 and of the 0 < |x| < 1, the largest and smallest
    magnitude that any partial product of nonzero elements can have.
    """

    count: int
    negative: bool  # an odd number of counted elements with the sign bit set
    zero: bool
    nan: bool
    inf: bool
    log2: float
    log2_small: float = 0.0
    mantissa: float = 1.0
    exponent: int = 0
    wrapped: int | None = None

    @property
    def sign(self) -> float:
        return -1.0 if self.negative else 1.0

    def value(self) -> Fraction:
        """The float product of the finite nonzero elements, signed (float64 magnitude)."""
        return Fraction(self.mantissa) * Fraction(2) ** self.exponent * int(self.sign)

    def wrapped_as(self, res_dt: np.dtype) -> int:
        """The integer product modulo 2**64 as the result dtype's value."""
        return int(np.array(self.wrapped, dtype=np.uint64).astype(res_dt))

    def _log2_margin(self) -> float:
        # The log2 sums' own error (float64 logs, fsum'd) and the products' roundings (about
        # count * eps relative): far below 2**-30 for any count a file holds. A margin of a
        # factor of 2 took products such as [1e308, 0.5] (5e307: no partial product past the
        # range) for ones that may overflow, and passed any value of their sign.
        return (self.count + 1) * 2.0**-36

    def may_overflow(self, acc: np.finfo) -> bool:
        """Whether some partial product of the elements can reach the accumulator's infinity."""
        return self.log2 >= math.log2(float(acc.max)) - self._log2_margin()

    def may_underflow(self, acc: np.finfo) -> bool:
        """Whether some partial product of the elements can fall below the accumulator's normal range."""
        return self.log2_small <= math.log2(float(acc.tiny)) + self._log2_margin()

    def may_flush_to_zero(self, acc: np.finfo) -> bool:
        """Whether some partial product of the elements can round to 0 (below half the smallest subnormal)."""
        return self.log2_small <= math.log2(float(acc.smallest_subnormal)) - 1 + self._log2_margin()

    def __add__(self, other: Product) -> Product:
        m, e = math.frexp(self.mantissa * other.mantissa)
        wrapped = None
        if self.wrapped is not None and other.wrapped is not None:
            wrapped = self.wrapped * other.wrapped % (1 << 64)
        return Product(
            self.count + other.count,
            self.negative != other.negative,
            self.zero or other.zero,
            self.nan or other.nan,
            self.inf or other.inf,
            self.log2 + other.log2,
            self.log2_small + other.log2_small,
            m,
            self.exponent + other.exponent + e,
            wrapped,
        )


def _log2_sums(a: np.ndarray) -> tuple[float, float]:
    """(sum of log2 of the values > 1, sum of log2 of the values in (0, 1)) of |x| values ``a``."""
    with np.errstate(divide="ignore"):
        logs = np.log2(a.astype(np.float64))
    return math.fsum(logs[a > 1].tolist()), math.fsum(logs[(a > 0) & (a < 1)].tolist())


def _product_part(x: np.ndarray, skips_nan: bool) -> Product:
    if x.dtype.kind != "f":
        wrapped = _wrapped_product(x)
        a = np.abs(x.astype(np.float64))
        return Product(
            count=int(x.size),
            negative=bool(np.count_nonzero(x < 0) % 2) if x.dtype.kind == "i" else False,
            zero=bool((x == 0).any()),
            nan=False,
            inf=False,
            log2=_log2_sums(a)[0],
            wrapped=wrapped,
        )
    nan = np.isnan(x)
    counted = x[~nan] if skips_nan else x
    finite = counted[np.isfinite(counted)]
    nonzero = finite[finite != 0].astype(np.float64)
    m, e = np.frexp(np.abs(nonzero))  # m in [0.5, 1): 1,000 of them multiply to 2**-1000 at least
    mantissa, exponent = 1.0, int(e.astype(np.int64).sum())
    for start in range(0, m.size, 1000):
        part, shift = math.frexp(mantissa * float(np.prod(m[start : start + 1000])))
        mantissa, exponent = part, exponent + shift
    big, small = _log2_sums(np.abs(finite.astype(np.float64)))
    return Product(
        count=int(counted.size),
        negative=bool(np.count_nonzero(np.signbit(counted[~np.isnan(counted)])) % 2),
        zero=bool((finite == 0).any()),
        nan=bool(nan.any()) and not skips_nan,
        inf=bool(np.isinf(counted).any()),
        log2=big,
        log2_small=small,
        mantissa=mantissa,
        exponent=exponent,
    )


# --------------------------------------------------------------------------------------------
# Parts, combination, synthetic closed forms


def part(x: np.ndarray, op_name: str):
    """The part of the reference of ``op_name`` over one rank's shard ``x`` (a 1-d NumPy array)."""
    op = get_op(op_name)
    if op_name in COUNT_OPS:
        return (int(np.count_nonzero(x)), int(x.size))
    if op_name in MOMENT_OPS:
        return _moments_part(x, op.skips_nan)
    if op_name in ARG_OPS:
        return _extreme_part(x, op)
    if op_name in PRODUCT_OPS:
        return _product_part(x, op.skips_nan)
    raise ValueError(f"no reference here for op {op_name!r}; this module checks: {', '.join(OPS)}")


def combine(op_name: str, parts: list):
    """Combine the ranks' parts (in rank order) into the global reference."""
    if op_name in COUNT_OPS:
        return (sum(p[0] for p in parts), sum(p[1] for p in parts))
    if op_name in ARG_OPS:
        return _combine_extremes(get_op(op_name), parts)
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def synthetic(op_name: str, window: list[int], full: int, rest: int, kind: str):
    """The reference of ``op_name`` over the CLI's synthetic data, in closed form.

    The data is ``full`` periods of ``window`` and its first ``rest`` values; ``kind`` is the
    dtype's kind.
    """
    n = full * len(window) + rest
    tail = window[:rest]

    def total(f) -> int:
        return full * sum(f(v) for v in window) + sum(f(v) for v in tail)

    seen = window if full else tail
    op = get_op(op_name)
    if op_name in COUNT_OPS:
        return (total(lambda v: v != 0), n)
    if op_name in MOMENT_OPS:
        squares = Fraction(total(lambda v: v * v))
        lo, hi = (min(seen), max(seen)) if seen else (None, None)
        positive, negative = float(total(lambda v: max(v, 0))), float(total(lambda v: max(-v, 0)))
        return Moments(n, Fraction(total(int)), squares, False, False, False, lo, hi, positive, negative)
    if op_name in ARG_OPS:
        if not seen:
            return Extreme(None, None, n)
        best = max(seen) if op.largest else min(seen)
        value = float(best) if kind == "f" else (bool(best) if kind == "b" else best)
        return Extreme(value, seen.index(best), n)
    if op_name in PRODUCT_OPS:
        log2 = full * sum(math.log2(abs(v)) for v in window if abs(v) > 1)
        log2 += sum(math.log2(abs(v)) for v in tail if abs(v) > 1)
        zero = 0 in seen
        negative = bool(total(lambda v: v < 0) % 2) if kind in "if" else False
        wrapped = pow(math.prod(window) % (1 << 64), full, 1 << 64) * math.prod(tail) % (1 << 64)
        mantissa, exponent = 1.0, 0
        if not zero and log2 < 1200:  # the exact product is small: take its float64 magnitude
            exact = abs(math.prod(window)) ** full * abs(math.prod(tail))
            exponent = exact.bit_length()
            mantissa = float(Fraction(exact, 1 << exponent))
            if mantissa == 1.0:
                mantissa, exponent = 0.5, exponent + 1
        return Product(n, negative, zero, False, False, log2, 0.0, mantissa, exponent, wrapped)
    raise ValueError(f"no reference here for op {op_name!r}; this module checks: {', '.join(OPS)}")


# --------------------------------------------------------------------------------------------
# Checks


def bound_factor(n: int, ranks: int) -> float:
    # The error bound's growth with the count, as the sum's check: a pairwise or blocked
    # summation (log2(n + 1)), sequential blocks of 50,000 and the combine across ranks.
    return math.log2(n + 1) + n / 50_000 + ranks + 1


def within(
    res: float,
    exact: Fraction,
    tol: float,
    res_dt: np.dtype,
    may_overflow: bool,
    why: str = "intermediate values may pass the accumulator's range",
) -> tuple[bool, str]:
    """Whether ``res`` lies within ``tol`` plus one ulp of the result of ``exact``; and the rule, in words.

    Near the top of the result's range an infinity of the reference's sign passes too (the
    rounding to the result dtype may overflow). ``may_overflow``: intermediate values may
    pass the accumulator's range (``why``), so any infinity or NaN is also correct.
    """
    value = to_float(exact)
    largest = float(np.finfo(res_dt).max)
    # Rounding to nearest overflows from half an ulp past the largest value (float16: 65520),
    # not at it: 65504 + 15.5 rounds to 65504, never to inf.
    top_ulp = Fraction(float(np.spacing(np.nextafter(res_dt.type(largest), res_dt.type(0)))))
    near_top = not math.isfinite(tol) or abs(exact) + Fraction(tol) >= Fraction(largest) + top_ulp / 2
    # One ulp of the result: that of the top binade at most (np.spacing of the largest float is inf).
    top = np.nextafter(res_dt.type(largest), res_dt.type(0))
    bound = tol + float(np.spacing(min(res_dt.type(largest if near_top else abs(value)), top)))
    how = f"|err| <= {bound:.3g}"
    if may_overflow:
        how = "any overflow" + (f", or |err| <= {bound:.3g}" if math.isfinite(bound) else ", or any value")
        how += f": {why}"
        if not math.isfinite(res):
            return True, how
    if math.isnan(res):
        return False, how
    if math.isinf(res):  # past or near the top of the range, rounding may overflow to infinity
        # (either infinity where the exact value is 0 and the bound itself passes the range)
        return near_top and (exact == 0 or res == (math.inf if exact > 0 else -math.inf)), how
    return to_float(abs(Fraction(res) - exact)) <= bound, how


def _check_moments(op, ref: Moments, res: float, res_dt: np.dtype, ranks: int, correction: float) -> tuple[bool, str]:
    statistic = op.statistic
    exact = ref.exact(statistic, correction)
    if not isinstance(exact, Fraction):
        if statistic == "mean" and math.isinf(exact) and math.isnan(res):
            # An infinity among finite elements whose float64 sum may overflow the other way
            # first ([max, max, -inf]: NaN, as NumPy's mean).
            up, down = ref.sum_may_overflow(float(np.finfo(np.float64).eps) * bound_factor(ref.count, ranks))
            if down if exact > 0 else up:
                return True, "the infinity, or NaN: the finite elements' sum may overflow the other way first"
        return same_float(res, exact), "NaN" if math.isnan(exact) else "same infinity"
    acc = np.finfo(op.accumulator_dtype(res_dt))
    factor = bound_factor(ref.count, ranks)
    eps = float(acc.eps) * factor
    # Below the normal range the accumulator's operations err by up to half its smallest
    # subnormal each, whatever the relative precision: a variance of elements near 1e-160
    # underflows to a few subnormal ulps (or to zero), and its square root keeps only those.
    floor = float(acc.smallest_subnormal) * factor
    # The mean's error: a float64 summation's, on the scale of the mean of |x| (or of the
    # largest |x| where their sum passes float64's range). There a part's float64 sum may
    # overflow, and the mean is then that sum over the count, an infinity (or NaN for both
    # signs), as NumPy's: docs/semantics.md.
    mean_error = eps * ref.mean_scale()
    up, down = ref.sum_may_overflow(float(np.finfo(np.float64).eps) * factor)
    total_may_overflow = up or down
    # Where a partial sum may overflow, the mean is that sum over the count: +inf only where a
    # partial sum may pass the top, -inf the bottom, NaN where both; var and std +inf (their
    # elements are finite here: never NaN, never negative).
    if not math.isfinite(res) and total_may_overflow:
        if statistic == "mean":
            ok = (up and down) if math.isnan(res) else (up if res > 0 else down)
        else:
            ok = res == math.inf
        how = "an infinity of a sign a partial sum may overflow to (NaN: both), for the mean; +inf for var and std"
        return ok, how
    if statistic == "mean":
        why = "a float64 sum of the elements may overflow (the mean is then that sum over the count)"
        return within(res, exact, mean_error + floor, res_dt, total_may_overflow, why)
    if res < 0:  # a variance or standard deviation is never negative (-0.0 aside)
        return False, "a negative result"
    # var: every algorithm in use sums squares of deviations from a point within the
    # elements' range (a block's mean, or one of its elements: the GPU's shifted sums), so a
    # summation's error is on the scale of M2 + N * spread**2; a mean's error e adds up to
    # N * (2 * spread * e + e**2) (the deviations from a rounded mean, and Chan's update).
    # In rationals: n * spread**2 (and the mean error's square) pass float64's range where the
    # bound itself does not ([1e153, -1e153] * 50: an infinite bound passed any finite value).
    n, spread, e = ref.count, ref.spread(), Fraction(mean_error)
    denominator = ref.denominator(correction)
    sums = exact * denominator + n * spread * spread
    # Each square of an element below the normal range errs by up to half a subnormal: N of
    # them over N - correction (a correction near N made a flat floor too small).
    floor_var = floor * max(1.0, to_float(n / denominator))
    tol = to_float((Fraction(eps) * sums + n * (2 * spread * e + e * e)) / denominator) + floor_var
    # Squares past the accumulator's range, or a float64 sum of the elements (whose mean is
    # then infinite, and the variance with it, as NumPy's: docs/semantics.md).
    may_overflow = not sums < Fraction(float(acc.max)) or total_may_overflow
    if math.isnan(res) or res == -math.inf:  # finite elements: NaN never (an overflow gives +inf)
        return False, "finite elements: a variance or standard deviation is never NaN or negative"
    if statistic == "var":
        return within(res, exact, tol, res_dt, may_overflow)
    # std = sqrt(var): |sqrt(a) - sqrt(b)| <= min(sqrt(|a - b|), |a - b| / sqrt(b)); plus the
    # reference root's own error (below 2**-64 relative).
    root = _sqrt(exact)
    # Fraction(tol): a float over a Fraction is float division, and a root below float64's
    # smallest subnormal is 0.0 there (ZeroDivisionError for a std of subnormals).
    if root == 0 or not math.isfinite(tol):
        tol_std = math.sqrt(tol)
    else:
        tol_std = min(math.sqrt(tol), to_float(Fraction(tol) / root))
    tol_std += to_float(root) * 2.0**-60
    return within(res, root, tol_std, res_dt, may_overflow)


def _check_product(op, ref: Product, res, res_dt: np.dtype, ranks: int) -> tuple[bool, str]:
    if res_dt.kind in "iu":
        return int(res) == ref.wrapped_as(res_dt), "exact (modulo 2**64)"
    res = float(res)
    sign = ref.sign
    acc = np.finfo(op.accumulator_dtype(res_dt))
    overflows, underflows = ref.may_overflow(acc), ref.may_underflow(acc)
    if ref.nan or (ref.inf and ref.zero):
        return math.isnan(res), "NaN"
    if ref.inf:
        if ref.may_flush_to_zero(acc):  # a partial product of the others may reach 0 first: inf * 0
            return math.isnan(res) or res == sign * math.inf, "the infinity of the product's sign, or NaN (inf * 0)"
        return res == sign * math.inf, "same infinity"
    if ref.zero:
        if not overflows:  # no partial product of the nonzero elements reaches infinity
            return same_float(res, sign * 0.0), "identical (a zero element, the sign of the product)"
        how = "NaN, or a zero of the product's sign: partial products may overflow (inf * 0)"
        return math.isnan(res) or same_float(res, sign * 0.0), how
    if overflows or underflows:
        how = "NaN or any value of the product's sign: partial products may overflow or underflow"
        return math.isnan(res) or math.copysign(1.0, res) == sign, how
    exact = ref.value()
    # Each multiplication rounds once in the accumulator (ref.count of them, and the ranks'
    # combine); the reference's float64 magnitude is within 2 * count * eps64.
    rel = float(acc.eps) * (ref.count + ranks + 1) + 2.0**-52 * 2 * (ref.count + 1)
    return within(res, exact, rel * abs(to_float(exact)), res_dt, False)


def _count(op_name: str, ref: tuple[int, int]) -> int | bool:
    """count_nonzero, any or all from a (nonzero count, element count) reference."""
    count, size = ref
    return {"count_nonzero": count, "any": count > 0, "all": count == size}[op_name]


def check(op_name: str, ref, result, res_dt: np.dtype, ranks: int, correction: float = 0.0) -> tuple[bool, str]:
    """Compare a global result of ``op_name`` with its combined reference. Returns (passed, how).

    ``correction``: var's and std's (and their nan forms'), as given to the reduction.
    """
    op = get_op(op_name)
    if op_name in COUNT_OPS:
        expected = _count(op_name, ref)
        return bool(np.asarray(result) == expected) and type(np.asarray(result).item()) is type(expected), "exact"
    if op_name in ARG_OPS:
        return int(result) == ref.index, "exact"
    if op_name in MOMENT_OPS:
        return _check_moments(op, ref, float(result), res_dt, ranks, correction)
    return _check_product(op, ref, result, res_dt, ranks)


def reference_value(op_name: str, ref, res_dt: np.dtype, correction: float = 0.0):
    """What the report shows as the reference: the exact value, rounded to float64 for floats."""
    if op_name in COUNT_OPS:
        return _count(op_name, ref)
    if op_name in ARG_OPS:
        return ref.index
    if op_name in MOMENT_OPS:
        return ref.value(get_op(op_name).statistic, correction)
    if res_dt.kind in "iu":
        return ref.wrapped_as(res_dt)
    sign = ref.sign
    if ref.nan or (ref.inf and ref.zero):
        return math.nan
    acc = np.finfo(get_op(op_name).accumulator_dtype(res_dt))
    if ref.inf:
        return f"{sign * math.inf} or nan" if ref.may_underflow(acc) else sign * math.inf
    if ref.zero:
        return f"nan or {sign * 0.0}" if ref.may_overflow(acc) else sign * 0.0
    if ref.may_overflow(acc) or ref.may_underflow(acc):
        return f"nan or any {'negative' if ref.negative else 'positive'} value"
    return to_float(ref.value())


def wrapped_past_range(ref: Product, res_dt: np.dtype) -> bool | None:
    """Whether an integer product's exact value is outside ``res_dt`` (it wrapped); None: unknown."""
    if ref.zero:
        return False
    bits = 64 if res_dt.kind == "u" else 63
    if ref.log2 < bits - 1e-6 * bits:
        return False
    if ref.log2 > bits + 1e-6 * bits:
        return True
    return None
