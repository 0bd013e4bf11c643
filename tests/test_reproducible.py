"""Reproducible sums and means: the same bits for any order, split, layout, rank count,
chunking or device.

The CPU cases run everywhere; the mpiexec cases (1-8 ranks) need an MPI launcher; the GPU
cases compare the GPU exact-sum kernel (and the device rounding) with the CPU bit for bit.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from mpi_scripts.launch import SCRIPTS, run
from test_exact import assert_bits, correctly_rounded, fraction_sum

import multireduce

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
    with pytest.raises(NotImplementedError, match="reproducible mean takes float16"):
        multireduce.mean(np.arange(3), reproducible=True)


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
