"""The exact accumulator behind reproducible sums, against Fraction arithmetic."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from multireduce import _exact
from multireduce._exact import LIMBS, ExactSum, exact_sum, round_to_dtype

FLOATS = [np.float16, np.float32, np.float64]
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def correctly_rounded(exact: Fraction, dt) -> np.generic:
    """Round an exact rational to ``dt`` by comparing neighbours (independent of _exact)."""
    info = np.finfo(dt)
    overflow = Fraction(float(info.max)) + Fraction(2) ** (info.maxexp - 1 - info.nmant) / 2
    if abs(exact) >= overflow:
        return dt(np.inf if exact > 0 else -np.inf)
    with np.errstate(over="ignore"):
        f = np.array(float(exact)).astype(dt)
        if not np.isfinite(f):
            f = np.array(info.max * np.sign(float(exact)), dtype=dt)
        neighbours = (f, np.nextafter(f, dt(-np.inf)), np.nextafter(f, dt(np.inf)))
    candidates = [c for c in neighbours if np.isfinite(c)]
    even = lambda c: int(np.array(c, dt).view(UINT[np.dtype(dt).itemsize])) & 1  # noqa: E731
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), even(c)))


def fraction_sum(x) -> Fraction:
    return sum((Fraction(float(v)) for v in np.asarray(x).ravel()), Fraction(0))


def assert_bits(got, expected, case=""):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, case
    assert got.view(UINT[got.itemsize]) == expected.view(UINT[got.itemsize]) or (
        np.isnan(got) and np.isnan(expected)
    ), (
        case,
        got,
        expected,
    )


@st.composite
def float_arrays(draw):
    dt = draw(st.sampled_from(FLOATS))
    elements = st.floats(allow_nan=False, allow_infinity=False, width=np.dtype(dt).itemsize * 8)
    return draw(hnp.arrays(dt, st.integers(0, 60), elements=elements))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # inf past the range, warned as NumPy's
@settings(max_examples=400, deadline=None)
@given(x=float_arrays())
def test_correctly_rounded(x):
    dt = x.dtype.type
    got = exact_sum(x).result(x.dtype)
    assert_bits(got, dt(0.0) if x.size == 0 else correctly_rounded(fraction_sum(x), dt))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # inf past the range, warned as NumPy's
@settings(max_examples=200, deadline=None)
@given(x=float_arrays(), data=st.data())
def test_any_order_and_any_split_gives_the_same_bits(x, data):
    whole = exact_sum(x).result(x.dtype)
    order = data.draw(st.permutations(range(x.size)))
    shuffled = x[list(order)]
    cuts = sorted(data.draw(st.lists(st.integers(0, x.size), max_size=6)))
    parts = np.split(shuffled, cuts)
    acc = ExactSum()
    for part in data.draw(st.permutations(parts)):
        acc.merge(ExactSum.from_array(exact_sum(part).normalize().to_array()))
    assert_bits(acc.result(x.dtype), whole)
    assert acc.count == x.size


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # inf past the range, warned as NumPy's
@pytest.mark.parametrize("dt", FLOATS)
def test_adversarial(dt):
    big = np.finfo(dt).max / 4
    cases = {
        "cancellation": [big, 1.0, -big],
        "cancellation repeated": [big, 1.0, -big] * 1000,
        "dynamic range": [big, 1.0, np.finfo(dt).smallest_subnormal, -big, 1.0],
        "subnormals": [np.finfo(dt).smallest_subnormal] * 7 + [-np.finfo(dt).smallest_subnormal * 2],
        "signed zeros": [-0.0, -0.0],
        "overflow": [np.finfo(dt).max, np.finfo(dt).max],
        "overflow then back": [np.finfo(dt).max, np.finfo(dt).max, -np.finfo(dt).max],
    }
    if dt is not np.float16:
        cases["1e30 and 1"] = [1e30, 1.0, -1e30, 1e-30] * 100
    for name, values in cases.items():
        x = np.array(values, dtype=dt)
        expected = correctly_rounded(fraction_sum(x), dt) if fraction_sum(x) else dt(0.0)
        assert_bits(exact_sum(x).result(np.dtype(dt)), expected, name)
    assert float(exact_sum(np.array([big, 1.0, -big], dtype=dt)).result(np.dtype(dt))) == 1.0


@pytest.mark.parametrize("dt", FLOATS)
def test_special_values(dt):
    def s(values):
        return float(exact_sum(np.array(values, dtype=dt)).result(np.dtype(dt)))

    assert s([1.0, np.inf]) == np.inf
    assert s([-np.inf, 1.0, -np.inf]) == -np.inf
    assert np.isnan(s([np.inf, -np.inf]))
    assert np.isnan(s([1.0, np.nan, np.inf]))
    assert s([]) == 0.0


def test_large_input_blocks_and_mean():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(3 * 2**20 + 5).astype(np.float32)
    acc = exact_sum(x)
    exact = Fraction(acc.value(), 2**1074)
    assert exact == fraction_sum(x[: 2**20]) + fraction_sum(x[2**20 :])
    assert_bits(acc.result(np.dtype(np.float32), mean=True), correctly_rounded(exact / x.size, np.float32))


def test_normalized_limbs_survive_many_merges():
    acc = exact_sum(np.array([np.finfo(np.float64).max / 2] * 4 + [-1e-300]))
    acc.normalize()
    assert (acc.limbs[:-1] >= 0).all() and (acc.limbs[:-1] < 2**32).all()
    total = ExactSum()
    for _ in range(64):
        total.merge(ExactSum.from_array(acc.to_array()))
    assert total.value() == 64 * acc.value()
    assert acc.limbs.size == LIMBS


def test_round_to_dtype_ties_to_even():
    one = 2**1074
    assert round_to_dtype(one + (one >> 24), 1074, np.dtype(np.float32)) == np.float32(1.0)  # tie, to even
    assert round_to_dtype(one + 3 * (one >> 24), 1074, np.dtype(np.float32)) == np.float32(1 + 2**-22)
    assert round_to_dtype(-one, 1074, np.dtype(np.float16)) == np.float16(-1.0)


def test_rejects_non_floats():
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        exact_sum(np.arange(3))


@pytest.mark.parametrize("dt", FLOATS)
def test_every_bit_pattern_across_blocks_and_views(dt):
    # The accumulator buckets elements by their exponent field: random bit patterns reach
    # every field (subnormals, the largest exponents, NaN and infinities), over more than one
    # block (_exact._BLOCK) and through strided and reversed views, against Fraction sums.
    uint = UINT[np.dtype(dt).itemsize]
    rng = np.random.default_rng(np.dtype(dt).itemsize)
    x = rng.integers(0, np.iinfo(uint).max, _exact._BLOCK + 7, dtype=uint, endpoint=True).view(dt)
    x[[5, _exact._BLOCK + 2]] = [np.inf, -np.inf]  # random patterns seldom hit the two infinities
    finite = x[np.isfinite(x)]
    for view in (finite, finite[::3], finite[::-1]):
        acc = exact_sum(view)
        assert Fraction(acc.value(), 2**1074) == fraction_sum(view)
        assert acc.flags.tolist() == [0, 0, 0] and acc.count == view.size
    acc = exact_sum(x)
    assert Fraction(acc.value(), 2**1074) == fraction_sum(finite)
    specials = x[~np.isfinite(x)]
    want = [int(np.isnan(specials).sum()), int((specials == np.inf).sum()), int((specials == -np.inf).sum())]
    assert acc.flags.tolist() == want and min(want) > 0
