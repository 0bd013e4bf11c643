"""Reproducible sums and means: the same bits for any order, split, layout, rank count,
chunking or device.

The CPU cases run everywhere; the mpiexec cases (1-8 ranks) need an MPI launcher; the GPU
cases compare the GPU exact-sum kernel (and the device rounding) with the CPU bit for bit.
"""

from __future__ import annotations

import functools
import json
import warnings
from fractions import Fraction

import numpy as np
import pytest
from mpi_scripts.launch import SCRIPTS, run
from test_exact import assert_bits, correctly_rounded, fraction_sum

import multireduce
from multireduce import _exact

FLOATS = ["float16", "float32", "float64"]


def adversarial(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Huge dynamic range, cancellation, subnormals, and ordinary values, shuffled."""
    dt = np.dtype(dtype)
    info = np.finfo(dt)
    big = float(info.max) / 8
    pieces = [
        np.array([big, 1.0, -big] * 5),
        np.full(7, float(info.smallest_subnormal)),
        rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n)),
    ]
    if dt.itemsize >= 4:
        pieces.append(np.array([1e30, 1.0, -1e30, 1e-30] * 5))
    with np.errstate(over="ignore"):
        x = np.concatenate(pieces).astype(dt)
    x[~np.isfinite(x)] = 0
    return rng.permutation(x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_sum_is_correctly_rounded_and_order_free(dtype):
    rng = np.random.default_rng(6)
    x = adversarial(dtype, 5000, rng)
    expected = correctly_rounded(fraction_sum(x), np.dtype(dtype).type)
    assert_bits(multireduce.sum(x, reproducible=True), expected)
    for _ in range(5):
        assert_bits(multireduce.sum(rng.permutation(x), reproducible=True), expected)
    assert_bits(multireduce.sum(x[::-1], reproducible=True), expected)
    two_d = np.ascontiguousarray(np.resize(x, (x.size // 7, 7)))
    assert_bits(multireduce.sum(two_d.T, reproducible=True), multireduce.sum(two_d.ravel(), reproducible=True))


@pytest.mark.parametrize("dtype", FLOATS)
def test_mean_is_the_exact_sum_over_the_count(dtype):
    rng = np.random.default_rng(7)
    x = adversarial(dtype, 999, rng)
    expected = correctly_rounded(fraction_sum(x) / x.size, np.dtype(dtype).type)
    assert_bits(multireduce.mean(x, reproducible=True), expected)
    assert_bits(multireduce.mean(rng.permutation(x), reproducible=True), expected)


@pytest.mark.parametrize("dtype", FLOATS)
def test_mean_in_the_subnormal_range_is_rounded_once(dtype):
    # A sum's exact total lies on the dtype's grid, so only a mean (the total over the count)
    # is rounded below the smallest normal: there the grid is the smallest subnormal, and a
    # wrong precision there rounded twice (mean([2**-149, 2**-149, 0]) as float32 was 0.0,
    # not 2**-149); no test saw it.
    info = np.finfo(dtype)
    sub = info.smallest_subnormal
    cases = [[sub, sub, 0], [sub, 0, 0], [sub] * 3 + [0], [3 * sub, 0, 0, 0], [info.tiny, sub, -sub, 0, 0, 0, 0]]
    cases += [[info.tiny] + [0] * k for k in (2, 3, 5, 7, 1000)]
    cases += [[-v for v in c] for c in cases]
    for values in cases:
        x = np.array(values, dtype=dtype)
        expected = correctly_rounded(fraction_sum(x) / x.size, np.dtype(dtype).type)
        assert_bits(multireduce.mean(x, reproducible=True), expected, values[:4])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS)
def test_gpu_mean_in_the_subnormal_range_is_rounded_once(dtype):
    # As above, through the device's exact sum and rounding (float32 subnormals go to the
    # kernel's integer limbs; CuPy's -ftz=true flushes them in float arithmetic).
    cupy = pytest.importorskip("cupy")
    info = np.finfo(dtype)
    sub = info.smallest_subnormal
    for values in ([sub, sub, 0], [sub, 0, 0], [-3 * sub, 0, 0, 0], [info.tiny] + [0] * 7):
        x = np.array(values, dtype=dtype)
        expected = correctly_rounded(fraction_sum(x) / x.size, np.dtype(dtype).type)
        assert_bits(multireduce.mean(cupy.asarray(x), reproducible=True).get(), expected, values[:4])


@pytest.mark.parametrize("dtype", FLOATS)
def test_full_reductions_by_axis_tuple_keepdims_views_and_0d(dtype):
    # Every other test here reduces with axis=None and keepdims=False: the reproducible
    # path's own axis and keepdims handling was untested (dropping keepdims there passed).
    # A tuple of every axis (negative ones too) is a full reduction: the correctly rounded
    # exact sum, in NumPy's shape, on offset, reversed and transposed views.
    rng = np.random.default_rng(13)
    dt = np.dtype(dtype)
    base = adversarial(dtype, 200, rng)[:97]
    views = {
        "c": base[1:].reshape(4, 4, 6),  # offset
        "transposed": base[:96].reshape(4, 4, 6).transpose(2, 0, 1),
        "reversed, strided": base[::-1][:96].reshape(6, 16)[:, ::2],
    }
    for name, x in views.items():
        exact = fraction_sum(x)
        for op, want in (("sum", exact), ("mean", exact / x.size)):
            want = correctly_rounded(want, dt.type)
            for axis in (None, tuple(range(x.ndim)), tuple(range(-1, -x.ndim - 1, -1))):
                for keepdims in (False, True):
                    got = multireduce.reduce(x, op, axis=axis, keepdims=keepdims, reproducible=True)
                    shape = (1,) * x.ndim if keepdims else ()
                    assert np.shape(got) == shape and isinstance(got, np.generic) != keepdims, (name, op, axis)
                    assert_bits(np.asarray(got).reshape(()), want)
    # 0-d input: a full reduction, and a zero sum is +0.0 (the bits, not just == 0).
    for x in (np.array(-0.0, dtype), np.array([-0.0, -0.0, 0.0], dtype)[::-1], np.array([-0.0], dtype)):
        for axis in (None, tuple(range(x.ndim))):
            assert_bits(multireduce.sum(x, axis=axis, reproducible=True), dt.type(0.0))
            assert_bits(multireduce.mean(x, axis=axis, reproducible=True), dt.type(0.0))
    assert_bits(multireduce.sum(np.array(2.5, dtype), keepdims=True, reproducible=True).reshape(()), dt.type(2.5))


def test_cancellation_that_the_fast_path_gets_wrong():
    x = np.array([1e30, 1.0, -1e30], dtype=np.float32)
    assert float(multireduce.sum(x, reproducible=True)) == 1.0
    assert float(multireduce.mean(x, reproducible=True)) == float(np.float32(1 / 3))


def test_special_values_and_empty():
    f = np.float64
    assert multireduce.sum(np.array([1.0, np.inf]), reproducible=True) == np.inf
    assert np.isnan(multireduce.sum(np.array([np.inf, -np.inf]), reproducible=True))
    assert np.isnan(multireduce.sum(np.array([np.nan, 1.0]), reproducible=True))
    empty = multireduce.sum(np.array([], dtype=np.float32), reproducible=True)
    assert empty == 0 and empty.dtype == np.float32 and not np.signbit(empty)
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):  # as the fast path and NumPy
        assert np.isnan(multireduce.mean(np.array([], dtype=f), reproducible=True))
    zero = multireduce.sum(np.array([-0.0, -0.0]), reproducible=True)
    assert zero == 0 and not np.signbit(zero)  # a zero sum is +0.0, as the fast path's


def test_dtype_argument_rounds_once_to_the_requested_dtype():
    x = np.array([1.0, 2.0**-30, 2.0**-30], dtype=np.float32)
    got = multireduce.sum(x, dtype=np.float64, reproducible=True)
    assert got.dtype == np.float64 and float(got) == 1.0 + 2.0**-29
    assert float(multireduce.sum(x, reproducible=True)) == 1.0


def _convertible_data(dtype: str, requested: str, rng: np.random.Generator) -> np.ndarray:
    """Values whose conversion to ``requested`` rounds, plus a tie once converted."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, 999).astype(bool)
    if dt.kind in "iu":
        big = {"float16": 3000, "float32": 2**40, "float64": 2**60}[requested]
        lo = 0 if dt.kind == "u" else -big
        return rng.integers(lo, min(big, np.iinfo(dt).max), 200, endpoint=True).astype(dt)
    tie = {"float32": [1.0, 2.0**-24 + 2.0**-50], "float16": [1.0, 2.0**-11 + 2.0**-30]}[requested]
    return np.concatenate([tie, rng.standard_normal(300) * 50]).astype(dt)


@pytest.mark.parametrize(
    ("dtype", "requested"),
    [
        ("float64", "float32"),
        ("float64", "float16"),
        ("float32", "float16"),
        ("int64", "float32"),
        ("int64", "float64"),
        ("int32", "float16"),
        ("uint8", "float64"),
        ("uint64", "float32"),
        ("bool", "float32"),
    ],
)
def test_dtype_argument_converts_each_element_first(dtype, requested):
    # dtype= converts every element to the requested dtype before it is added (the standard's
    # rule, as the fast path): the result is the correctly rounded sum of the converted values.
    x = _convertible_data(dtype, requested, np.random.default_rng(21))
    rt = np.dtype(requested).type
    want = correctly_rounded(fraction_sum(x.astype(requested)), rt)
    assert_bits(multireduce.sum(x, dtype=requested, reproducible=True), want)
    # The partials that the MPI and Dask layers merge: the same conversion, the same bits.
    parts = [multireduce.partial(p, "sum", dtype=requested, reproducible=True) for p in np.array_split(x, 5)]
    for p in parts[1:]:
        parts[0].merge(p)
    assert_bits(parts[0].result(np.dtype(requested)), want)


def test_dtype_argument_tie_after_conversion():
    # 2**-24 + 2**-50 becomes 2**-24 in float32; 1 + 2**-24 is then a tie, rounded to even (1.0).
    # Summing the float64 values exactly first would give the next float32 above 1.
    x = np.array([1.0, 2.0**-24 + 2.0**-50])
    for reproducible in (False, True):
        got = multireduce.sum(x, dtype=np.float32, reproducible=reproducible)
        assert got.dtype == np.float32 and float(got) == 1.0
    assert float(np.sum(x, dtype=np.float32)) == 1.0


def test_order_free_ops_accept_it_unchanged():
    x = np.array([3, 1, 2], dtype=np.int32)
    assert multireduce.sum(x, reproducible=True) == 6
    assert multireduce.reduce(x, "max", reproducible=True) == 3
    assert multireduce.reduce(x, "argmin", reproducible=True) == 1


def test_partial_is_mergeable():
    rng = np.random.default_rng(8)
    x = adversarial("float32", 3000, rng)
    parts = np.array_split(x, 7)
    acc = multireduce.partial(parts[0], "sum", reproducible=True)
    for p in parts[1:]:
        acc.merge(multireduce.partial(p, "sum", reproducible=True))
    assert_bits(acc.result(np.dtype(np.float32)), multireduce.sum(x, reproducible=True))
    assert Fraction(acc.value(), 2**1074) == fraction_sum(x)


def test_unsupported_requests_are_explicit():
    x = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(NotImplementedError, match="full reductions only"):
        multireduce.sum(x, axis=0, reproducible=True)
    with pytest.raises(NotImplementedError, match="not available for op 'var'"):
        multireduce.reduce(x, "var", reproducible=True)
    with pytest.raises(NotImplementedError, match="not available for op 'nanmean'"):
        multireduce.reduce(x, "nanmean", reproducible=True)
    for op in ("nanvar", "nanstd"):
        with pytest.raises(NotImplementedError, match=f"not available for op '{op}'"):
            multireduce.reduce(x, op, reproducible=True)


# -- a finite total past the result's range: NumPy's overflow, as the ordinary sum's ----------

#: What the ordinary CPU sum reports (checked below against it), as NumPy's sum: float16 and
#: float32 sums accumulate in a wider float and overflow in the final conversion, which warns
#: as NumPy's reduction in the narrow dtype does; float64 sums in the reduction itself.
OVERFLOW_MESSAGE = {
    "float16": "overflow encountered in reduce",
    "float32": "overflow encountered in reduce",
    "float64": "overflow encountered in reduce",
}
#: (value, count) whose exact total is past the dtype's range.
PAST_THE_RANGE = {"float16": (60000.0, 10), "float32": (3e38, 10), "float64": (1.7e308, 2)}


def recorded(call):
    """``call()`` and every warning it emitted, as (category, message) pairs (none deduplicated)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        value = call()
    return value, [(w.category, str(w.message)) for w in seen]


def overflow_calls(x: np.ndarray):
    """Every way a reproducible sum of the 1-d ``x`` is rounded on the host, by name."""
    dt = x.dtype
    parts = [multireduce.partial(p, "sum", reproducible=True) for p in np.array_split(x, 3)]
    return {
        "sum": lambda: multireduce.sum(x, reproducible=True),
        "reduce, every axis, keepdims": lambda: multireduce.reduce(
            x.reshape(1, -1), "sum", axis=(0, 1), keepdims=True, reproducible=True
        ),
        "partial": lambda: multireduce.partial(x, "sum", reproducible=True).result(dt),
        "merged partials": lambda: functools.reduce(lambda a, b: a.merge(b), parts, _exact.ExactSum()).result(dt),
        # The MPI layer's final step on every rank: the summed limbs, unpacked and rounded.
        "packed, as MPI": lambda: _exact.ExactSum.from_array(
            multireduce.partial(x, "sum", reproducible=True).to_array()
        ).result(dt),
    }


@pytest.mark.parametrize("dtype", FLOATS)
def test_overflow_warns_once_as_the_ordinary_sum(dtype):
    # The exact total was rounded to +-inf without a warning, where the ordinary sum warns.
    dt = np.dtype(dtype)
    value, n = PAST_THE_RANGE[dtype]
    for sign in (1.0, -1.0):
        x = np.full(n, sign * value, dtype=dt)
        ordinary, seen = recorded(lambda: multireduce.sum(x))  # noqa: B023
        assert seen == [(RuntimeWarning, OVERFLOW_MESSAGE[dtype])] and ordinary == sign * np.inf, (sign, seen)
        for name, call in overflow_calls(x).items():
            got, seen = recorded(call)
            assert seen == [(RuntimeWarning, OVERFLOW_MESSAGE[dtype])], (sign, name, seen)
            assert_bits(np.asarray(got).reshape(()), dt.type(sign * np.inf), (sign, name))
        # dtype= rounds to the requested dtype: float16 from float64 elements that convert.
        got, seen = recorded(lambda: multireduce.sum(np.full(10, sign * 60000.0), dtype=np.float16, reproducible=True))  # noqa: B023
        assert seen == [(RuntimeWarning, OVERFLOW_MESSAGE["float16"])] and got == sign * np.inf, (sign, seen)


@pytest.mark.parametrize("dtype", FLOATS)
def test_overflow_follows_numpy_errstate(dtype):
    x = np.full(PAST_THE_RANGE[dtype][1], PAST_THE_RANGE[dtype][0], dtype=dtype)
    for name, call in overflow_calls(x).items():
        with np.errstate(over="raise"), pytest.raises(FloatingPointError, match=OVERFLOW_MESSAGE[dtype]):
            call()
        with np.errstate(over="ignore"):
            got, seen = recorded(call)
        assert seen == [] and np.asarray(got).reshape(()) == np.inf, (name, seen)
        calls = []
        with np.errstate(over="call", call=lambda kind, flag: calls.append(kind)):  # noqa: B023
            got, seen = recorded(call)
        assert calls == ["overflow"] and seen == [], (name, calls, seen)
    with np.errstate(over="raise"), pytest.raises(FloatingPointError, match=OVERFLOW_MESSAGE[dtype]):
        multireduce.sum(x)  # the ordinary sum alike


@pytest.mark.parametrize("dtype", FLOATS)
def test_inf_and_nan_inputs_do_not_warn_whatever_the_finite_total(dtype):
    # NumPy warns for no single infinity or NaN in the input; the finite elements here alone
    # overflow (and warn: the first line), but the special value decides the result,
    # silently. (+inf with -inf: the next test.)
    dt = np.dtype(dtype)
    top = float(np.finfo(dt).max)
    with np.errstate(all="raise"):
        with pytest.raises(FloatingPointError, match=OVERFLOW_MESSAGE[dtype]):
            multireduce.sum(np.array([top, top], dtype=dt), reproducible=True)
        for values, want in (
            ([top, top, np.inf], np.inf),
            ([-top, -top, np.inf], np.inf),
            ([top, top, -np.inf], -np.inf),
            ([top, top, np.nan], np.nan),
            ([top, top, np.inf, -np.inf, np.nan], np.nan),
            ([np.inf, 1.0], np.inf),
            ([np.nan, np.inf, -np.inf], np.nan),
        ):
            x = np.array(values, dtype=dt)
            for op in ("sum", "mean"):
                got, seen = recorded(lambda: multireduce.reduce(x, op, reproducible=True))  # noqa: B023
                assert seen == [], (values, op, seen)
                assert_bits(got, dt.type(want), (values, op))


@pytest.mark.parametrize("dtype", FLOATS)
def test_plus_and_minus_infinity_warn_as_numpys_sum(dtype):
    # +inf with -inf (and no NaN) gave NaN silently, where NumPy's sum (and the ordinary
    # one) warns "invalid value encountered in reduce", or raises under errstate; on every
    # path that rounds an exact sum (the core, merged partials, MPI's packed limbs).
    dt = np.dtype(dtype)
    x = np.array([np.inf, 1.0, -np.inf], dtype=dt)
    with np.errstate(invalid="raise"):
        with pytest.raises(FloatingPointError, match="invalid value encountered in reduce"):
            np.sum(x)
        for op in ("sum", "mean"):
            with pytest.raises(FloatingPointError, match="invalid value encountered in reduce"):
                multireduce.reduce(x, op, reproducible=True)
        for call in overflow_calls(x).values():
            with pytest.raises(FloatingPointError, match="invalid value encountered in reduce"):
                call()
    got, seen = recorded(lambda: multireduce.sum(x, reproducible=True))
    assert np.isnan(got) and seen == [(RuntimeWarning, "invalid value encountered in reduce")], seen


def _adds_up_to_the_largest(dt: np.dtype) -> list[float]:
    """Powers of two that add up exactly to the largest finite value (float16: 2**15 + ... + 2**5 = 65504)."""
    info = np.finfo(dt)
    return [2.0 ** (info.maxexp - 1 - k) for k in range(info.nmant + 1)]


@pytest.mark.parametrize("dtype", FLOATS)
def test_overflow_boundary_rounds_as_ieee_and_warns_only_for_inf(dtype):
    # The largest finite value has an odd significand, so a total of it plus half its ulp (the
    # tie) rounds to even, up: inf, with the warning. Anything below the tie rounds to it.
    dt = np.dtype(dtype)
    info = np.finfo(dt)
    top, half_ulp, tiny = float(info.max), 2.0 ** (info.maxexp - 2 - info.nmant), float(info.smallest_subnormal)
    cases = {
        "the largest finite value": ([top], False),
        "powers of two that add up to it": (_adds_up_to_the_largest(dt), False),
        "an ulp past it and back": ([top, 2 * half_ulp, -2 * half_ulp], False),
        "just below the tie": ([top, half_ulp, -tiny], False),
        "the tie": ([top, half_ulp], True),
        "the tie in pieces": ([top, half_ulp / 2, half_ulp / 2], True),
        "just above the tie": ([top, half_ulp, tiny], True),
        "an ulp past it": ([top, 2 * half_ulp], True),
    }
    for name, (values, overflows) in cases.items():
        for sign in (1.0, -1.0):
            x = np.array(values, dtype=dt) * dt.type(sign)
            want = correctly_rounded(fraction_sum(x), dt.type)  # independent of _exact
            assert bool(np.isinf(want)) == overflows, (name, want)
            got, seen = recorded(lambda: multireduce.sum(x, reproducible=True))  # noqa: B023
            assert_bits(got, want, (name, sign))
            assert seen == ([(RuntimeWarning, OVERFLOW_MESSAGE[dtype])] if overflows else []), (name, sign, seen)
            if not overflows:
                with np.errstate(over="raise"):
                    assert_bits(multireduce.sum(x, reproducible=True), want, (name, sign))
    if dtype == "float16":
        # 65519 rounds to 65504; 65520, the tie, to inf.
        for extra, want in ((15.0, 65504.0), (16.0, np.inf), (8.0, 65504.0)):
            got, seen = recorded(lambda: multireduce.sum(np.array([65504.0, extra], dtype=dt), reproducible=True))  # noqa: B023
            assert got == want and seen == ([(RuntimeWarning, OVERFLOW_MESSAGE[dtype])] if want == np.inf else []), (
                extra
            )
        got, seen = recorded(lambda: multireduce.sum(np.array([65504.0, 8.0, 8.0], dtype=dt), reproducible=True))
        assert got == np.inf and seen == [(RuntimeWarning, OVERFLOW_MESSAGE[dtype])]


@pytest.mark.parametrize("dtype", FLOATS)
def test_mean_of_a_total_past_the_range_does_not_overflow(dtype):
    # The mean is the exact total over the count, rounded once: it lies between the smallest
    # and the largest element, so it never overflows, and does not warn, where the sum does
    # (float16: 10 x 60000.0 sum to 600000, inf in float16; their mean is 60000.0). The
    # ordinary float64 mean is the float64 sum over the count: inf there, with the warning.
    dt = np.dtype(dtype)
    value, n = PAST_THE_RANGE[dtype]
    for sign in (1.0, -1.0):
        x = np.full(n, sign * value, dtype=dt)
        got, seen = recorded(lambda: multireduce.sum(x, reproducible=True))  # noqa: B023
        assert got == sign * np.inf and seen == [(RuntimeWarning, OVERFLOW_MESSAGE[dtype])]
        with np.errstate(over="raise"):
            for mean in (
                multireduce.mean(x, reproducible=True),
                multireduce.partial(x, "mean", reproducible=True).result(dt, mean=True),
            ):
                assert_bits(mean, dt.type(sign * value))
            top = np.full(7, np.finfo(dt).max, dtype=dt) * dt.type(sign)
            assert_bits(multireduce.mean(top, reproducible=True), dt.type(sign * np.finfo(dt).max))
            mixed = np.array([value, value, value / 2], dtype=dt) * dt.type(sign)
            assert_bits(multireduce.mean(mixed, reproducible=True), correctly_rounded(fraction_sum(mixed) / 3, dt.type))


def test_dask_overflow_warns_once_and_the_mean_does_not():
    da = pytest.importorskip("dask.array")
    import multireduce.dask  # noqa: F401

    for dtype in FLOATS:
        value, n = PAST_THE_RANGE[dtype]
        x = da.from_array(np.full(n, value, dtype=dtype), chunks=1)
        got, seen = recorded(lambda: x.treereduce("sum", reproducible=True, split_every=2).compute(scheduler="sync"))  # noqa: B023
        assert got == np.inf and seen == [(RuntimeWarning, OVERFLOW_MESSAGE[dtype])], (dtype, seen)
        got, seen = recorded(lambda: x.treereduce("mean", reproducible=True).compute(scheduler="sync"))  # noqa: B023
        assert got == np.dtype(dtype).type(value) and seen == [], (dtype, seen)


MPI_OVERFLOW = """
import warnings
import numpy as np
from multireduce import mpi

comm = mpi.MPI.COMM_WORLD
for dtype, value, n, message in (
    ("float16", 60000.0, 10, "overflow encountered in reduce"),
    ("float32", 3e38, 10, "overflow encountered in reduce"),
    ("float64", 1.7e308, 2, "overflow encountered in reduce"),  # an empty shard from 3 ranks on
):
    local = np.array_split(np.full(n, value, dtype=dtype), comm.size)[comm.rank]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        total = mpi.allreduce(local, "sum", reproducible=True)
        mean = mpi.allreduce(local, "mean", reproducible=True)
    assert total == np.inf and total.dtype == dtype, (dtype, total)
    assert mean == np.dtype(dtype).type(value), (dtype, mean)
    seen = [(w.category, str(w.message)) for w in seen]
    assert seen == [(RuntimeWarning, message)], (comm.rank, dtype, seen)
    with np.errstate(over="raise"):
        try:
            mpi.allreduce(local, "sum", reproducible=True)
        except FloatingPointError as exc:  # on every rank alike, after the collectives
            assert message in str(exc), exc
        else:
            raise AssertionError(f"{dtype}: over='raise' did not raise")
    assert mpi.allreduce(np.ones(1), "sum") == comm.size  # the ranks are still in step
print(f"overflow: ok on rank {comm.rank} of {comm.size}", flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_mpi_overflow_warns_on_every_rank(mpiexec, ranks):
    # Every rank rounds the same exact total: each warns once, as the ordinary final cast does
    # (allreduce's Notes). The float64 sum warns too, where the ordinary path, whose partials
    # overflow only in MPI's addition, cannot.
    done = run(mpiexec, ranks, ["-c", MPI_OVERFLOW], timeout=120)
    assert done.returncode == 0, done.output
    for rank in range(ranks):
        assert f"overflow: ok on rank {rank} of {ranks}" in done.stdout, done.output


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS)
def test_gpu_gives_the_cpu_bits(dtype):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(10)
    host = adversarial(dtype, 3_000_000, rng)
    host[12345] = np.inf
    base = cupy.asarray(np.concatenate([np.zeros(3, dtype=dtype), host]))
    dev = base[3:]  # an offset view
    for op in ("sum", "mean"):
        got = multireduce.reduce(dev, op, reproducible=True)
        assert isinstance(got, cupy.ndarray) and got.shape == ()
        assert_bits(got.get()[()], multireduce.reduce(dev.get(), op, reproducible=True))
    dev[777] = -np.inf
    assert np.isnan(float(multireduce.sum(dev, reproducible=True)))
    exact = multireduce.partial(dev[:1000], "sum", reproducible=True)
    assert exact.value() == multireduce.partial(dev[:1000].get(), "sum", reproducible=True).value()


@pytest.mark.gpu
@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize(
    "case",
    ["one", "minus one", "cancelled max", "many", "tiny mix", "subnormals among normals", "subnormal then normal"],
)
def test_gpu_float32_subnormals_are_exact(case, on_device):
    """CuPy compiles every kernel with -ftz=true: the exact-sum kernel must not let float32
    subnormals near float arithmetic (they compared and converted as zero there: the H200 run
    at 877b12b summed [2**-149] to 0.0)."""
    cupy = pytest.importorskip("cupy")
    from multireduce import _exact
    from multireduce._backend import cupy as gpu

    info = np.finfo(np.float32)
    sub = float(info.smallest_subnormal)
    rng = np.random.default_rng(12)
    host = {
        "one": [sub],
        "minus one": [-sub],
        "cancelled max": [float(info.max), -float(info.max), sub],
        "many": [sub] * 100_003,  # the vector body, every thread
        "tiny mix": [1e-40, -3e-41, 2e-45, 5e-39, 2.0**-126, -(2.0**-127)],
        "subnormals among normals": np.where(rng.random(50_001) < 0.3, rng.random(50_001) * 1e-38, rng.random(50_001)),
        "subnormal then normal": [1e-45, 1e-40, 2.0**-126, 1e-44, 2.0**-125],
    }[case]
    host = np.asarray(host, dtype=np.float32)
    dev = cupy.asarray(host)
    for result in (np.dtype(np.float32), np.dtype(np.float64)):
        got = gpu.exact_sum_rounded(dev, result, on_device=on_device)
        assert_bits(got.get()[()], correctly_rounded(fraction_sum(host), result.type))
    assert gpu.exact_sum(dev).value() == _exact.exact_sum(host).value()


def spread_float32(n: int, binades: int, rng) -> np.ndarray:
    """Random signs and mantissas, exponents uniform over ``binades`` binades (2**-20 and up)."""
    exponents = rng.integers(-20, -20 + binades, size=n)
    return (rng.choice([-1.0, 1.0], size=n) * (1 + rng.random(n)) * np.exp2(exponents)).astype(np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("binades", [5, 19, 21, 33, 39, 40, 45, 70])
@pytest.mark.parametrize("n", [33, 4099, 1_000_003])
def test_gpu_exact_across_dynamic_ranges(n, binades):
    """Data inside one thread's window (20 exponents), inside its low window too (39), and beyond
    (the slots' atomics): every path must give the exact sum, bit for bit."""
    cupy = pytest.importorskip("cupy")
    from multireduce import _exact
    from multireduce._backend import cupy as gpu

    host = spread_float32(n, binades, np.random.default_rng(binades * 7919 + n))
    if n > 4099:
        host[::4096] *= np.float32(2.0**40)  # windows move up mid-stream, after folds
    dev = cupy.asarray(host)
    assert gpu.exact_sum(dev).value() == _exact.exact_sum(host).value()
    # Fractions for the small sizes; the CPU's exact accumulator (checked against Fractions in
    # test_exact.py) for the large one.
    want = correctly_rounded(fraction_sum(host), np.float32) if n <= 4099 else _exact.exact_sum(host).result(np.float32)
    assert_bits(multireduce.sum(dev, reproducible=True).get()[()], want)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:invalid value encountered in reduce:RuntimeWarning")  # +inf with -inf, as NumPy
@pytest.mark.parametrize("dtype", FLOATS)
def test_device_rounding_matches_the_host(dtype):
    """exact_round_kernel against round_to_dtype, whatever ROUND_ON_DEVICE says."""
    cupy = pytest.importorskip("cupy")
    from multireduce import _exact
    from multireduce._backend import cupy as gpu

    rng = np.random.default_rng(11)
    cases = [adversarial(dtype, n, rng) for n in (1, 2, 31, 1000, 100_003)]
    info = np.finfo(dtype)
    cases += [
        np.array([info.max, info.max], dtype=dtype),  # overflows to inf
        np.array([info.max, -info.max, info.smallest_subnormal], dtype=dtype),
        np.array([-info.smallest_subnormal], dtype=dtype),
        np.array([-0.0, -0.0], dtype=dtype),  # a zero sum is +0.0
        np.array([1.0, info.eps / 2], dtype=dtype),  # a tie: rounds to even
        np.array([1.0, info.eps / 2, info.smallest_subnormal], dtype=dtype),  # just above the tie
        np.array([np.nan, 1.0], dtype=dtype),
        np.array([np.inf, -np.inf], dtype=dtype),
        np.array([-np.inf, 1.0], dtype=dtype),
    ]
    for host in cases:
        dev = cupy.asarray(host)
        for result in {np.dtype(dtype), np.dtype(np.float64), np.dtype(np.float32)}:
            with np.errstate(over="ignore"):  # [max, max]: the host's rounding warns, the device's does not
                want = _exact.exact_sum(host).result(result)
            got = gpu.exact_sum_rounded(dev, result, on_device=True)
            assert got.dtype == result and got.shape == ()
            assert_bits(got.get()[()], want)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_mpi_ranks_give_the_one_rank_bits(mpiexec, ranks):
    done = run(mpiexec, ranks, [str(SCRIPTS / "check_reproducible.py")], timeout=120)
    assert done.returncode == 0, done.output
    assert f"reproducible: ok at {ranks} ranks" in done.stdout


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # inf past the range, warned as NumPy's
@pytest.mark.parametrize("dtype", FLOATS)
def test_dask_chunkings_give_the_same_bits(dtype):
    da = pytest.importorskip("dask.array")
    import multireduce.dask  # noqa: F401  (registers x.treereduce)

    rng = np.random.default_rng(9)
    g = adversarial(dtype, 20_000, rng)
    expected_sum = multireduce.sum(g, reproducible=True)
    expected_mean = multireduce.mean(g, reproducible=True)
    seen = set()
    for chunks in (1, 997, 4096, g.size):
        for split_every in (2, 3, 16, None):
            x = da.from_array(g, chunks=chunks) if chunks > 1 else da.from_array(g[:500], chunks=1)
            if chunks == 1:  # one element per chunk: the deepest tree, on a prefix
                assert_bits(
                    x.treereduce("sum", reproducible=True, split_every=split_every).compute(),
                    multireduce.sum(g[:500], reproducible=True),
                )
                continue
            got = x.treereduce("sum", reproducible=True, split_every=split_every).compute(scheduler="threads")
            assert_bits(got, expected_sum)
            seen.add(got.tobytes())
            assert_bits(x.treereduce("mean", reproducible=True, split_every=split_every).compute(), expected_mean)
    assert len(seen) == 1


def test_dask_refusals_match_the_core():
    da = pytest.importorskip("dask.array")
    import multireduce.dask  # noqa: F401

    x = da.ones((4, 4), chunks=2, dtype=np.float32)
    with pytest.raises(NotImplementedError, match="full reductions only"):
        x.treereduce("sum", axis=0, reproducible=True)
    with pytest.raises(NotImplementedError, match="not available for op 'var'"):
        x.treereduce("var", reproducible=True)
    assert x.treereduce("max", reproducible=True).compute() == 1


# -- integer and bool means: float64(exact total) / n, reproducible as they are ---------------

INTEGERS = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
# Around the GPU's blocks and the CPU's moments blocks (2**17 elements): where a split of the
# work, and with it the order of a float64 sum, changes.
SIZES = [0, 1, 2, 1023, 1024, 1025, 4095, 4096, 4097, 131_071, 131_073]


def integer_data(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n values over the dtype's range; int64 and uint64 as large as the bound lets them be.

    64-bit values reach about 2**61 / n: n * max|x| stays below 2**62 (where the mean is
    exact), and the totals pass 2**53, where a float64 sum of the elements rounds, so its
    mean would depend on the split.
    """
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    info = np.iinfo(dt)
    if dt.itemsize == 8:
        limit = 2**61 // max(n, 1)
        lo = 0 if dt.kind == "u" else -limit
        return rng.integers(lo, limit, n, endpoint=True, dtype=dt)
    return rng.integers(int(info.min), int(info.max), n, endpoint=True, dtype=dt)


def mean_of_ints(values) -> np.float64:
    """The documented integer mean, from Python integers: float(exact total) / n.

    float() rounds the exact total to float64 once and the division rounds once more:
    ``float64(total) / n`` is what NumPy's mean of integers computes wherever its float64 sum
    is exact, and what multireduce computes wherever the total cannot wrap, so it is the
    reference bit for bit (not the correctly rounded total / n, which can differ in the last
    bit). Independent of multireduce: a plain sum of Python ints.
    """
    values = np.asarray(values).ravel().tolist()
    if not values:
        return np.float64(np.nan)
    return np.float64(float(sum(int(v) for v in values)) / len(values))


def same_bits(got, expected) -> bool:
    got, expected = np.asarray(got), np.asarray(expected)
    return got.dtype == expected.dtype and got.shape == expected.shape and got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_mean_is_the_exact_total_over_the_count(dtype):
    # reproducible=True raised NotImplementedError ("reproducible mean takes float16, ...")
    # though the integer mean is exact wherever its total cannot wrap.
    rng = np.random.default_rng(31)
    for n in SIZES:
        base = integer_data(dtype, n + 3, rng)
        x = base[3:]  # an offset view
        views = {"offset": x, "reversed": x[::-1], "copy": np.ascontiguousarray(x), "strided": base[::2]}
        for name, v in views.items():
            want = mean_of_ints(v)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # "Mean of empty slice" for n == 0
                for got in (
                    multireduce.mean(v, reproducible=True),
                    multireduce.reduce(v, "mean", reproducible=True),
                    multireduce.reduce(v, "mean", axis=0, keepdims=True, reproducible=True).reshape(()),
                    multireduce.mean(v),  # the same bits: reproducible already
                ):
                    assert same_bits(got, want), (dtype, n, name, got, want)
    # Over some axes (rows and columns of a C-order array, and its transpose): per result.
    m = integer_data(dtype, 4097 * 3, rng).reshape(3, 4097)
    for a, axis in ((m, 1), (m, 0), (m.T, 0), (m[:, ::-3], 1)):
        want = np.array([mean_of_ints(np.take(a, i, axis=1 - axis)) for i in range(a.shape[1 - axis])])
        assert same_bits(multireduce.mean(a, axis=axis, reproducible=True), want), (dtype, a.shape, axis)
    # Empty: NaN with NumPy's warning, as without reproducible=True.
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        assert np.isnan(multireduce.mean(np.zeros(0, dtype), reproducible=True))


@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_mean_partials_merge_to_the_same_bits(dtype):
    # partial(..., reproducible=True) gives the moments state, whose merge keeps the exact
    # total, count and extremes: any split finalizes to float64(total) / n.
    from multireduce import _stats
    from multireduce.ops import OPS

    x = integer_data(dtype, 4097, np.random.default_rng(32))
    want = mean_of_ints(x)
    for parts in (1, 2, 7, 4097):
        states = [multireduce.partial(p, "mean", reproducible=True) for p in np.array_split(x, parts)]
        for merged in (_stats.merge_all(states), _stats.merge_all(states[::-1])):
            assert same_bits(_stats.finalize_moments(merged, OPS["mean"], np.dtype(np.float64)), want), parts


@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_sum_is_accepted_and_exact(dtype):
    # Integer sums are exact modulo 2**64 (NumPy's wrap-around), so reproducible=True takes
    # them unchanged, over any axes.
    x = integer_data(dtype, 4097, np.random.default_rng(33))
    total = sum(int(v) for v in x.tolist())
    result = np.dtype(np.uint64 if np.dtype(dtype).kind == "u" else np.int64)
    wrapped = result.type(np.array(total % 2**64, dtype=np.uint64).view(np.int64 if result.kind == "i" else np.uint64))
    assert same_bits(multireduce.sum(x, reproducible=True), wrapped)
    assert same_bits(multireduce.sum(x[::-1], reproducible=True), wrapped)
    assert same_bits(multireduce.partial(x, "sum", reproducible=True), wrapped)


@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_mean_dask_chunkings_give_the_same_bits(dtype):
    da = pytest.importorskip("dask.array")
    import multireduce.dask  # noqa: F401  (registers x.treereduce)

    g = integer_data(dtype, 4097, np.random.default_rng(34))
    for chunks in (1, 3, 1023, 1024, 4096, g.size):
        v = g[:300] if chunks < 4 else g  # tiny chunks (the deepest trees) on a prefix
        want = mean_of_ints(v)
        for split_every in (2, 3, 16, None):
            x = da.from_array(v, chunks=chunks)
            got = x.treereduce("mean", reproducible=True, split_every=split_every).compute(scheduler="sync")
            assert same_bits(got, want), (dtype, chunks, split_every)
    m = da.from_array(g[:4096].reshape(64, 64), chunks=(7, 10))
    want_rows = np.array([mean_of_ints(row) for row in g[:4096].reshape(64, 64)])
    assert same_bits(m.treereduce("mean", axis=1, reproducible=True, split_every=2).compute(), want_rows)
    assert same_bits(da.from_array(g, chunks=100).treereduce("sum", reproducible=True).compute(), multireduce.sum(g))


def test_integer_mean_that_could_wrap_is_refused_everywhere():
    # 8 * 2**59 = 2**62: the int64 total may have wrapped, and the mean (Chan's update of the
    # merged states) would depend on the split. Each part alone passes; the whole does not.
    da = pytest.importorskip("dask.array")
    import multireduce.dask  # noqa: F401

    x = np.full(8, 2**59, dtype=np.int64)
    message = r"the mean of 8 int64 elements of magnitude up to 576,460,752,303,423,488 cannot be given reproducibly"
    for call in (
        lambda: multireduce.mean(x, reproducible=True),
        lambda: multireduce.reduce(x.reshape(2, 4), "mean", axis=(0, 1), reproducible=True),
        lambda: multireduce.partial(x, "mean", reproducible=True),
        lambda: da.from_array(x, chunks=2).treereduce("mean", reproducible=True).compute(),
    ):
        with pytest.raises(NotImplementedError, match=message) as info:
            call()
        assert "could wrap" in str(info.value) and "Accepted: float input" in str(info.value)
    assert multireduce.partial(x[:4], "mean", reproducible=True).n == 4  # a part alone passes
    with pytest.raises(NotImplementedError, match="the mean of 2 uint64 elements"):  # per result, over an axis
        multireduce.mean(np.array([[1, 2**61], [2**62, 1]], dtype=np.uint64), axis=0, reproducible=True)
    assert multireduce.mean(x[:7], reproducible=True) == 2.0**59  # 7 * 2**59 < 2**62
    with pytest.raises(NotImplementedError, match="not available for op 'nanmean'"):
        multireduce.reduce(np.arange(3), "nanmean", reproducible=True)


MPI_INTEGER_MEANS = """
import json, sys
import numpy as np
import multireduce
from multireduce import mpi

comm = mpi.MPI.COMM_WORLD
arrays = np.load(sys.argv[1] + "/g.npz")  # the same global arrays on every rank
with open(sys.argv[1] + "/want.json") as f:
    want = json.load(f)
for dtype, g in arrays.items():
    cuts = np.sort(np.random.default_rng(comm.size).integers(0, g.size, comm.size - 1))  # uneven, maybe empty
    local = np.split(g, cuts)[comm.rank]
    got = mpi.allreduce(local, "mean", reproducible=True)
    assert got.tobytes() == np.float64(want[dtype]).tobytes(), (dtype, got, want[dtype])
    assert mpi.allreduce(local, "sum", reproducible=True) == multireduce.sum(g), dtype
big = np.array_split(np.full(8, 2**59, dtype=np.int64), comm.size)[comm.rank]  # 2**62 in all
try:
    mpi.allreduce(big, "mean", reproducible=True)
except NotImplementedError as exc:
    assert mpi.rank_failures(exc) is not None, "not agreed"
    assert "the mean of 8 int64 elements" in str(exc), exc
else:
    raise AssertionError("the mean of 8 * 2**59 was not refused")
if comm.rank == 0:
    print(f"integer means: ok at {comm.size} ranks")
"""


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_mpi_integer_means_give_the_exact_bits(mpiexec, tmp_path, ranks):
    # mpi.allreduce(..., "mean", reproducible=True) raised on every rank for integer shards.
    rng = np.random.default_rng(35)
    data = {dtype: integer_data(dtype, 4097, rng) for dtype in INTEGERS}
    np.savez(tmp_path / "g.npz", **data)
    (tmp_path / "want.json").write_text(json.dumps({d: float(mean_of_ints(v)) for d, v in data.items()}))
    done = run(mpiexec, ranks, ["-c", MPI_INTEGER_MEANS, str(tmp_path)], timeout=120)
    assert done.returncode == 0, done.output
    assert f"integer means: ok at {ranks} ranks" in done.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", INTEGERS)
def test_gpu_integer_mean_gives_the_cpu_bits(dtype):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(36)
    for n in (1, 1023, 1025, 4097, 3_000_001):
        host = integer_data(dtype, n + 3, rng)
        dev = cupy.asarray(host)[3:]  # an offset view
        for v, h in ((dev, host[3:]), (dev[::-1], host[3:][::-1]), (dev[::3], host[3:][::3])):
            got = multireduce.mean(v, reproducible=True)
            assert isinstance(got, cupy.ndarray) and got.shape == ()
            assert same_bits(got.get(), mean_of_ints(h)), (dtype, n)
    m = cupy.asarray(integer_data(dtype, 4097 * 3, rng).reshape(3, 4097))
    for axis in (0, 1):
        assert same_bits(multireduce.mean(m, axis=axis, reproducible=True).get(), multireduce.mean(m.get(), axis=axis))
    if np.dtype(dtype).itemsize == 8:
        with pytest.raises(NotImplementedError, match="cannot be given reproducibly"):
            multireduce.mean(cupy.full(8, 2**59, dtype=dtype), reproducible=True)


@pytest.mark.parametrize("value", ["false", "yes", None, 1, 0.0])
def test_reproducible_takes_a_bool_only(value):
    # Any object was taken by its truth: reproducible="false" took the exact path, and under
    # MPI a mismatch listed True/False instead of what was passed.
    pytest.importorskip("mpi4py")
    import dask.array as da

    import multireduce.dask as mdask
    import multireduce.mpi as mpi

    x = np.arange(6, dtype=np.float32)
    calls = [
        lambda: multireduce.sum(x, reproducible=value),
        lambda: multireduce.reduce(x, "mean", reproducible=value),
        lambda: multireduce.core.partial(x, "sum", reproducible=value),
        lambda: mdask.treereduce(da.from_array(x, chunks=2), "sum", reproducible=value),
        lambda: mpi.allreduce(x, "sum", reproducible=value),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=rf"reproducible must be True or False, got {value!r} of type"):
            call()
    assert multireduce.sum(x, reproducible=np.bool_(True)) == 15.0
