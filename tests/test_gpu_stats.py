"""The GPU moments and argmin/argmax kernels (kernels/multireduce/stats.cuh) against the CPU.

Moments states: counts, integer sums, lo and hi must match the CPU bit for bit; float sums,
means and M2 within float64 rounding (float16 sums: float32). Arg states must match exactly.
"""

from __future__ import annotations

import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from reference import make_data

import multireduce
from multireduce.ops import SUPPORTED_DTYPES

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")

DTYPES = [dt.name for dt in SUPPORTED_DTYPES]
SIZES = [1, 2, 31, 32, 33, 511, 512, 513, 4095, 4096, 4097, 2**20 + 3]


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":  # the sign of zero counts; NaN payloads do not
        return bool(np.all((a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")) | (np.isnan(a) & np.isnan(b))))
    return bool(np.all(a == b))


def close(got: np.ndarray, ref: np.ndarray, scale: np.ndarray, rtol: float) -> bool:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    both_nan = np.isnan(got) & np.isnan(ref)
    same_inf = np.isinf(got) & (got == ref)
    with np.errstate(invalid="ignore"):  # inf - inf where both are the same infinity (accepted above)
        err = np.abs(got - ref)
    return bool(np.all(both_nan | same_inf | (err <= rtol * (np.abs(scale) + np.abs(ref)) + 1e-300)))


def assert_moments_match(host: np.ndarray, axis=None) -> None:
    gpu = multireduce.partial(cupy.asarray(host), "mean", axis=axis)
    with np.errstate(invalid="ignore"):  # inf + -inf: the CPU warns as NumPy's sum does
        cpu = multireduce.partial(host, "mean", axis=axis)
    assert bits_equal(gpu.n, cpu.n) and bits_equal(gpu.nan, cpu.nan), (gpu.n, cpu.n, gpu.nan, cpu.nan)
    assert bits_equal(gpu.lo, cpu.lo) and bits_equal(gpu.hi, cpu.hi), (gpu.lo, cpu.lo, gpu.hi, cpu.hi)
    assert gpu.total.dtype == cpu.total.dtype
    if cpu.total.dtype.kind in "iu":
        assert bits_equal(gpu.total, cpu.total), (gpu.total, cpu.total)
    wide = np.where(np.isnan(host), 0, host).astype(np.float64) if host.dtype.kind == "f" else host.astype(np.float64)
    axes = None if axis is None else axis
    count = max(1, host.size if axis is None else math.prod(np.atleast_1d(host.shape)[list(np.atleast_1d(axis))]))
    grow = math.log2(count + 1) + 4
    eps = 2.0**-52
    magnitude = np.sum(np.abs(wide), axis=axes)
    if cpu.total.dtype.kind == "f":
        teps = 2.0**-23 if cpu.total.dtype == np.float32 else eps
        assert close(gpu.total, cpu.total, magnitude, teps * grow), (gpu.total, cpu.total)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_scale = magnitude / np.maximum(np.asarray(cpu.n), 1)
    assert close(gpu.mean, cpu.mean, mean_scale, eps * grow * 4), (gpu.mean, cpu.mean)
    with np.errstate(invalid="ignore"):  # inf - inf with infinite data: a NaN scale, as the M2 itself
        sq = np.sum(
            (wide - np.expand_dims(np.asarray(cpu.mean), axis) if axis is not None else wide - cpu.mean) ** 2,
            axis=axes,
        )
    # Each side's M2 is sum((x - m)**2) about its own rounded mean m, which adds n * (m - mean)**2
    # to the exact M2: with equal values (exact M2 0) one side may get 0 and the other ~1e-31.
    rtol = eps * grow * 16
    mean_err = eps * grow * 4 * np.nan_to_num(mean_scale, nan=0.0, posinf=0.0)
    assert close(gpu.m2, cpu.m2, sq + np.asarray(cpu.n) * mean_err**2 / rtol, rtol), (gpu.m2, cpu.m2)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_moments_sizes(dtype, n):
    host = make_data(dtype, n + 5, np.random.default_rng(n))
    assert_moments_match(host[:n])
    assert_moments_match(host[1 : n + 1])  # offset views: the head and tail paths
    assert_moments_match(host[3 : n + 3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_moments_values_match_numpy_float64(dtype):
    host = make_data(dtype, 100_003, np.random.default_rng(5))
    x = cupy.asarray(host)
    ref = host.astype(np.float64)
    for got, want in [
        (multireduce.mean(x), ref.mean()),
        (multireduce.var(x), ref.var()),
        (multireduce.std(x, correction=1), ref.std(ddof=1)),
    ]:
        rtol = {"float16": 1e-3, "float32": 1e-6}.get(dtype, 1e-12)  # the result dtype's rounding
        assert np.isclose(float(got), want, rtol=rtol, atol=0), (got, want)
    s = multireduce.stats(x)
    cpu = multireduce.stats(host)
    assert int(s.count) == cpu.count and int(s.nan_count) == cpu.nan_count
    assert bits_equal(cupy.asnumpy(s.min), np.asarray(cpu.min)) and bits_equal(cupy.asnumpy(s.max), np.asarray(cpu.max))


def test_moments_empty():
    x = cupy.zeros(0, dtype=cupy.float32)
    with pytest.warns(RuntimeWarning):
        assert math.isnan(float(multireduce.mean(x)))
    with pytest.raises(ValueError):
        multireduce.stats(x)
    state = multireduce.partial(x, "mean")
    assert int(state.n) == 0 and int(state.nan) == 0


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_moments_special_values(dtype):
    rng = np.random.default_rng(11)
    base = make_data(dtype, 10_001, rng)
    cases = {}
    x = base.copy()
    x[[3, 777, 9000]] = np.nan
    cases["nan"] = x
    x = base.copy()
    x[4242] = np.inf
    cases["inf"] = x
    x = base.copy()
    x[0] = np.inf  # a thread's shift candidate
    x[1] = -np.inf
    cases["both_inf"] = x
    x = base.copy()
    x[0] = np.nan
    cases["nan_first"] = x
    cases["all_nan"] = np.full(4099, np.nan, dtype=dtype)
    cases["neg_zeros"] = np.full(5000, -0.0, dtype=dtype)
    z = np.full(5000, -0.0, dtype=dtype)
    z[2500] = 0.0
    cases["mixed_zeros"] = z
    z = np.abs(base)
    z[[10, 20]] = [-0.0, 0.0]
    cases["min_zero"] = z
    for name, host in cases.items():
        assert_moments_match(host)
        gpu = multireduce.stats(cupy.asarray(host))
        with np.errstate(invalid="ignore"):  # inf + -inf: the CPU warns as NumPy's sum does
            cpu = multireduce.stats(host)
        for field in ("count", "nan_count", "min", "max"):
            assert bits_equal(cupy.asnumpy(getattr(gpu, field)), np.asarray(getattr(cpu, field))), (name, field)
        for field in ("sum", "mean", "var"):
            g, c = float(getattr(gpu, field)), float(getattr(cpu, field))
            assert (math.isnan(g) and math.isnan(c)) or math.isclose(g, c, rel_tol=1e-3, abs_tol=1e-6), (name, field)


def assert_device_stats_match_host_finalize(x, axis, correction: float) -> None:
    """multireduce.stats on the GPU (stats_finalize_kernel) against the host's finalize_stats
    of the very same GPU moments state: every field bit for bit."""
    from multireduce import _stats

    got = multireduce.stats(x, axis=axis, correction=correction)
    state = multireduce.partial(x, "mean", axis=axis)  # the GPU kernel's state, on the host
    want = _stats.finalize_stats(state, x.dtype, correction)
    # std is the float64 root of the variance, rounded once, on both sides (the kernel's and
    # the host's), as multireduce.std's: the same bits for every dtype.
    for field in ("count", "nan_count", "sum", "min", "max", "mean", "var", "std"):
        g, w = getattr(got, field), np.asarray(getattr(want, field))
        assert isinstance(g, cupy.ndarray) and g.device == x.device, field
        assert g.dtype == w.dtype and g.shape == w.shape, (field, g.dtype, w.dtype, g.shape, w.shape)
        assert bits_equal(cupy.asnumpy(g), w), (field, g, w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # std's "Degrees of freedom" (stats has none)
        single = multireduce.std(x, axis=axis, correction=correction)
    assert bits_equal(cupy.asnumpy(got.std), cupy.asnumpy(single))


def assert_device_moments_match_host_finalize(x, axis, correction: float) -> None:
    """multireduce.var/std on the GPU (moments_finalize_kernel, no host round trip) against the
    host's finalize_moments of the very same GPU moments state, bit for bit; the mean (float64
    sums over the count, mean_from_sum_kernel) against the same, up to the order of additions."""
    import warnings

    from multireduce import _stats
    from multireduce.ops import OPS

    state = multireduce.partial(x, "mean", axis=axis)  # the GPU kernel's state, on the host
    for op in ("mean", "var", "std"):
        kw = {} if op == "mean" else {"correction": correction}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN results where N - correction <= 0
            got = multireduce.reduce(x, op, axis=axis, **kw)
            want = np.asarray(_stats.finalize_moments(state, OPS[op], OPS[op].result_dtype(x.dtype), correction))
        assert isinstance(got, cupy.ndarray) and got.device == x.device, op
        assert got.dtype == want.dtype and got.shape == want.shape, (op, got.dtype, want.dtype, got.shape, want.shape)
        if op != "mean":
            assert bits_equal(cupy.asnumpy(got), want), (op, correction, got, want)
            continue
        # The two float64 means differ by the order of their additions: at most a few float64
        # ulps of the mean of |x|, then one rounding to the result dtype.
        g, w = cupy.asnumpy(got).astype(np.float64), want.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            scale = cupy.asnumpy(cupy.abs(x.astype(cupy.float64)).mean(axis=axis))
            tol = 64 * np.finfo(np.float64).eps * scale + np.spacing(np.abs(want)).astype(np.float64)
            ok = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= tol)
        assert np.all(ok), (correction, got, want, tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 33, 4097, 2**20 + 3])
def test_stats_finalized_on_the_device(dtype, n):
    host = make_data(dtype, n + 3, np.random.default_rng(n + 5))[3:]  # an offset view
    x = cupy.asarray(host)
    for correction in (0.0, 1.0, 2.5, float(n), float(n) + 1):
        assert_device_stats_match_host_finalize(x, None, correction)
        assert_device_moments_match_host_finalize(x, None, correction)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_stats_finalized_on_the_device_special_values(dtype):
    base = make_data(dtype, 5003, np.random.default_rng(13))
    cases = [np.full(17, np.nan, dtype=dtype), np.full(9, -0.0, dtype=dtype), np.array([np.inf, 1.0], dtype=dtype)]
    x = base.copy()
    x[[4, 4000]] = np.nan
    cases.append(x)
    x = base.copy()
    x[10], x[20] = np.inf, -np.inf
    cases.append(x)
    for host in cases:
        for correction in (0.0, 1.0):
            assert_device_stats_match_host_finalize(cupy.asarray(host), None, correction)
            assert_device_moments_match_host_finalize(cupy.asarray(host), None, correction)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "uint8", "bool"])
@pytest.mark.parametrize("shape, axis", [((7, 1000), 1), ((3, 4, 5), (1, 2)), ((1, 2**20 + 3), -1), ((0, 5), 1)])
def test_stats_finalized_on_the_device_over_axes(dtype, shape, axis):
    host = make_data(dtype, math.prod(shape), np.random.default_rng(math.prod(shape))).reshape(shape)
    if host.size and dtype.startswith("float"):
        host[0, 0] = np.nan  # one row with a NaN
    assert_device_stats_match_host_finalize(cupy.asarray(host), axis, 1.0)
    if host.size:
        assert_device_moments_match_host_finalize(cupy.asarray(host), axis, 1.0)


def test_stats_all_nan():
    s = multireduce.stats(cupy.full(1000, np.nan, dtype=cupy.float32))
    assert int(s.count) == 1000 and int(s.nan_count) == 1000
    assert all(math.isnan(float(v)) for v in (s.sum, s.min, s.max, s.mean, s.var))


def _far_from_zero(data: str, shape, seed: int):
    # (host array, offset): float64 near 1.7e9 (timestamps), float32 near 1e6, int64 near
    # 1e12, each with a spread of about 1 to 20; the array less the offset is exact in float64.
    rng = np.random.default_rng(seed)
    offset = {"float64": 1.7e9, "float32": 1e6, "int64": 10**12}[data]
    if data == "int64":
        return offset + rng.integers(0, 20, shape), offset
    return (offset + rng.standard_normal(shape)).astype(data), offset


@pytest.mark.parametrize("data", ["float64", "float32", "int64"])
@pytest.mark.parametrize(("shape", "axis"), [((2**20 + 7,), None), ((1000, 1000), 1), ((4, 2**18 + 5), 1)])
def test_moments_large_offset_accuracy(data, shape, axis):
    # Timestamps near 1.7e9 with unit spread, int64 near 1e12, float32 near 1e6: var is
    # shift-invariant and x less the offset is exact, so its float64 variance is the
    # reference. Thread and block means are merged less the row's first element (the base):
    # rounded at 1.7e9's ulp, their differences in Chan's update lost digits.
    host, offset = _far_from_zero(data, shape, sum(shape))
    shifted = host.astype(np.float64) - offset  # exact
    want = np.var(shifted, axis=axis)
    x = cupy.asarray(host)
    for got in (multireduce.var(x, axis=axis), multireduce.stats(x, axis=axis).var):
        got = cupy.asnumpy(cupy.asarray(got)).astype(np.float64)
        if data == "float32":  # a float32 result: its rounding
            assert np.all(np.abs(got - want) <= 2.0**-23 * want), np.max(np.abs(got - want) / want)
        else:
            assert np.all(np.abs(got - want) <= 1e-13 * want), np.max(np.abs(got - want) / want)
    state = multireduce.partial(x, "mean", axis=axis)  # the float64 state itself
    m2 = np.asarray(state.m2)
    exact_m2 = want * (x.size if axis is None else shape[axis])
    assert np.all(np.abs(m2 - exact_m2) <= 1e-13 * exact_m2), np.max(np.abs(m2 - exact_m2) / exact_m2)


@pytest.mark.parametrize("data", ["float64", "float32", "int64"])
@pytest.mark.parametrize(
    ("shape", "axis", "parts"), [((2**20 + 7,), None, 2), ((2**20 + 7,), None, 13), ((600, 2000), 1, 5)]
)
def test_moments_large_offset_accuracy_across_parts(data, shape, axis, parts):
    # The kernel writes each row's low part of its mean (MomentRecord.mean_lo): GPU states of
    # parts merged on the host (as MPI ranks and Dask chunks merge them) keep one state's
    # accuracy. With float64 means alone, Chan's d was rounded at 1.7e9's ulp.
    from multireduce import _stats

    host, offset = _far_from_zero(data, shape, sum(shape) + parts)
    shifted = host.astype(np.float64) - offset  # exact
    want = np.var(shifted, axis=axis)
    pieces = np.array_split(host, parts, axis=-1)
    states = [multireduce.partial(cupy.asarray(p), "var", axis=axis) for p in pieces]
    merged = _stats.merge_all(states)
    got = np.asarray(merged.m2) / shape[-1]
    assert np.all(np.abs(got - want) <= 1e-13 * want), np.max(np.abs(got - want) / want)
    # A GPU state's mean and low part against the exact mean of one piece (a row of it).
    first = pieces[0] if axis is None else pieces[0][0]
    state = states[0] if axis is None else states[0].map(lambda a: np.asarray(a)[0])
    exact = Fraction(offset) + Fraction(math.fsum((first.astype(np.float64) - offset).tolist()) / first.size)
    error = Fraction(float(state.mean)) + Fraction(float(state.mean_lo)) - exact
    assert abs(error) <= 1e-13, (float(error), float(Fraction(float(state.mean)) - exact))


def test_moments_base_skips_leading_nans_and_means_ignore_low_parts():
    # The row's base is its first finite element among the first 32 (shift_base), and a
    # thread whose first element is NaN shifts its sums by that base: it shifted them by 0,
    # and nanvar of timestamps whose NaNs fell on threads' first elements was off by 40%
    # (its M2 = s2 - s1**2 / n of sums near n * 2.9e18 lost every digit).
    # And the merged mean across parts is the update of the float64 means alone: with an
    # outlier first, the low parts are rounded at its scale (mean 3.8e-14 off on the CPU).
    import dataclasses

    from multireduce import _stats

    rng = np.random.default_rng(21)
    for dtype, offset, scale in (("float64", 1.7e9, 1.0), ("float32", 1e6, 1.0), ("float16", 1000.0, 0.5)):
        flat = (offset + scale * rng.standard_normal(2**22 + 9)).astype(dtype)
        flat[rng.random(flat.size) < 0.01] = np.nan  # missing samples, some on threads' first elements
        want = np.nanvar(flat.astype(np.float64) - offset)
        state = multireduce.partial(cupy.asarray(flat), "nanvar")  # float64 M2, whatever the dtype
        got = float(state.m2) / int(state.n)
        assert abs(got - want) <= 1e-13 * want, (dtype, abs(got - want) / want)
        if dtype == "float64":
            assert abs(float(multireduce.nanvar(cupy.asarray(flat))) - want) <= 1e-13 * want
    # Such a thread shifts by its own first finite element, not by the row's base, which may
    # be an outlier far from it (a review's case: 1e8 first among standard normals with 10%
    # NaN, 5.4e-11 relative in an emulation of the kernel that shifted by the base).
    z = rng.standard_normal(2**23)
    z[rng.random(z.size) < 0.1] = np.nan
    z[0] = 1e8
    state = multireduce.partial(cupy.asarray(z), "nanvar")
    want = np.nanvar(z)
    assert abs(float(state.m2) / int(state.n) - want) <= 1e-13 * want, abs(float(state.m2) / int(state.n) - want) / want
    assert abs(float(state.mean) - np.nanmean(z)) <= 1e-14 * np.nanmean(np.abs(z))
    host = 1.7e9 + rng.standard_normal((8, 2**17 + 3))
    for i in range(8):
        host[i, : 4 * i] = np.nan  # 0 to 28 leading NaNs
    want = np.nanvar(host - 1.7e9, axis=1)
    got = cupy.asnumpy(multireduce.nanvar(cupy.asarray(host), axis=1))
    assert np.all(np.abs(got - want) <= 1e-13 * want), np.max(np.abs(got - want) / want)
    state = multireduce.partial(cupy.asarray(host), "nanvar", axis=1)
    assert np.all(np.abs(np.asarray(state.m2) / np.asarray(state.n) - want) <= 1e-13 * want)
    y = rng.random(4000)
    y[0] = 1e6
    states = [multireduce.partial(cupy.asarray(p), "mean") for p in np.array_split(y, 3)]
    plain = [dataclasses.replace(st, mean_lo=np.zeros_like(st.mean_lo)) for st in states]
    assert float(_stats.merge_all(states).mean) == float(_stats.merge_all(plain).mean)
    assert abs(float(_stats.merge_all(states).mean) - math.fsum(y.tolist()) / y.size) <= 1e-15 * np.mean(y)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_moments_far_from_zero_behind_a_run_of_nans(dtype):
    # A series that starts with a run of missing samples. A thread whose first four vectors
    # held only NaN shifted its sums by the row's base, and behind 32 NaN the row had none
    # (0): its M2 of values near the offset lost every digit (the session's starting kernel:
    # 8.7e-11 behind 32 NaN, 1.6e-9 to NaN over rows, h200_cfafc41). Now such a thread skips
    # its NaN-only vectors (counting them) and shifts by its first value after them (or by
    # its tail element), and a row without a base among its first 32 elements takes one per
    # block (block_base), moved to the first block's that has one in the last block's merge.
    # (lead n - 100: thread 0 holds only NaN vectors and one timestamp in the tail; shifted
    # by 0 its M2 was that timestamp's x*x rounding, and the variance 3x too large; block 0
    # has no base there, and the float32 means moved to 0 kept 6.6e-13.)
    rng = np.random.default_rng(31)
    offset, scale = {"float64": (1.7e9, 1.0), "float32": (1e6, 1.0), "float16": (1000.0, 8.0)}[dtype]
    n = 2**22 + 9
    flat = (offset + scale * rng.standard_normal(n)).astype(dtype)
    flat[rng.random(n) < 0.01] = np.nan
    for lead, start in ((32, 0), (33, 3), (5000, 1), (2**20 + 3, 0), (3 * 2**20, 5), (n - 100, 0)):
        whole = flat.copy()
        whole[:lead] = np.nan
        host = whole[start:]
        state = multireduce.partial(cupy.asarray(whole)[start:], "nanvar")  # an offset view: a scalar head
        values = host[~np.isnan(host)].astype(np.float64)
        assert int(state.nan) == host.size - values.size and int(state.n) == values.size, (dtype, lead)
        assert float(state.lo) == values.min() and float(state.hi) == values.max()
        want = np.var(values - offset)
        got = float(state.m2) / int(state.n)
        assert abs(got - want) <= 1e-13 * want, (dtype, lead, abs(got - want) / want)
        exact = offset + math.fsum((values - offset).tolist()) / values.size
        assert abs(float(state.mean) + float(state.mean_lo) - exact) <= 1e-13 * max(1.0, scale), (dtype, lead)
    # Across parts, as MPI ranks and Dask chunks merge them: every part but the last starts with NaN.
    from multireduce import _stats

    host = flat.copy()
    host[: 3 * 2**20] = np.nan
    merged = _stats.merge_all([multireduce.partial(cupy.asarray(p), "nanvar") for p in np.array_split(host, 5)])
    want = np.nanvar(host.astype(np.float64) - offset)
    got = float(merged.m2) / int(merged.n)
    assert abs(got - want) <= 1e-13 * want, abs(got - want) / want


@pytest.mark.parametrize(("rows", "length"), [(4, 2**20 + 5), (64, 40_000), (8192, 1000)])
def test_moment_rows_behind_runs_of_nans(rows, length):
    # Rows with runs of NaN first, of every length up to the whole row: few long rows (many
    # blocks per row: block bases merged), and many short ones (one block per row).
    rng = np.random.default_rng(rows)
    host = 1.7e9 + rng.standard_normal((rows, length))
    host[rng.random(host.shape) < 0.01] = np.nan
    runs = [0, 31, 32, 33, 700, length // 2, length - 1, length]
    for i in range(rows):
        host[i, : runs[i % len(runs)]] = np.nan
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanvar(host - 1.7e9, axis=1)
        got = cupy.asnumpy(multireduce.nanvar(cupy.asarray(host), axis=1))
    state = multireduce.partial(cupy.asarray(host), "nanvar", axis=1)
    assert np.array_equal(np.asarray(state.nan), np.isnan(host).sum(axis=1))
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want).any() == (rows >= 8)
    ok = ~np.isnan(want)
    assert np.all(np.abs(got[ok] - want[ok]) <= 1e-13 * want[ok]), np.max(np.abs(got[ok] - want[ok]) / want[ok])


def test_integer_states_hold_the_mean_rounded_once():
    # The kernel writes an integer row's mean as its exact total over n where it cannot have
    # wrapped: base + shifted mean erred at the base's distance (-9 first among zeros, a
    # hypothesis case of test_property_matches_cpu: 1.7e-14 relative, the CPU exact).
    x = np.zeros((9, 14), np.int16)
    x[0, :2] = [-9, -2]
    assert float(multireduce.partial(cupy.asarray(x), "mean").mean) == -11 / 126
    y = x.astype(np.int64) * 10**12 + 7
    rows = multireduce.partial(cupy.asarray(y), "var", axis=1)
    assert [float(m) for m in rows.mean] == [int(t) / 14 for t in y.sum(axis=1)]


def test_integer_means_beyond_the_exact_bound_keep_their_accuracy():
    # Past n * max|x| >= 2**62 the exact sum is the one near n * the state's mean with the
    # total's residue modulo 2**64 (stats.cuh state_mean, as the host): with a base of 2**62
    # mean([2**62, -2**62, 1, 2]) was 0.0.
    x = cupy.asarray(np.array([2**62, -(2**62), 1, 2], dtype=np.int64))
    assert float(multireduce.mean(x)) == 0.75 and float(multireduce.stats(x).mean) == 0.75
    assert float(multireduce.mean(cupy.asarray(np.array([-(2**63), 2**63 - 2], dtype=np.int64)))) == -1.0
    rng = np.random.default_rng(2)
    for y in (
        rng.integers(-(2**62), 2**62, 2**18 + 3, dtype=np.int64),
        rng.integers(0, 2**64 - 1, 2**17, dtype=np.uint64, endpoint=True),
        (3 * 10**17 + 64 * rng.integers(-1000, 1000, 2**18)).astype(np.int64),
    ):
        exact = sum(int(v) for v in y.tolist()) / y.size  # Python's int / int: correctly rounded
        for got in (multireduce.mean(cupy.asarray(y)), multireduce.stats(cupy.asarray(y)).mean):
            assert abs(float(got) - exact) <= 2.0**-51 * abs(exact), (float(got), exact)
    # Their variance far from zero: within float64's accuracy, as any (3e17: above 2**53).
    z = (3 * 10**17 + 64 * rng.integers(-1000, 1000, (4, 2**16 + 1))).astype(np.int64)
    want = np.var((z - 3 * 10**17).astype(np.float64), axis=1)
    got = cupy.asnumpy(multireduce.var(cupy.asarray(z), axis=1))
    assert np.all(np.abs(got - want) <= 1e-13 * want), np.max(np.abs(got - want) / want)


def test_moments_with_an_outlier_for_the_base():
    # A row's first element is the base of its means: an outlier there (1e30 among standard
    # normals) must cost neither the state's mean (float64 input: the total over n) nor M2.
    rng = np.random.default_rng(12)
    host = rng.standard_normal((3, 300_001))
    host[:, 0] = [1e30, -1e30, 1e6]
    state = multireduce.partial(cupy.asarray(host), "mean", axis=1)
    for i in range(3):
        values = host[i].tolist()
        mean = math.fsum(values) / len(values)
        m2 = math.fsum((v - mean) ** 2 for v in values)
        scale = math.fsum(abs(v) for v in values) / len(values)
        assert abs(float(state.mean[i]) - mean) <= 2.0**-52 * 32 * scale, (state.mean[i], mean)
        assert abs(float(state.m2[i]) - m2) <= 1e-13 * m2, (state.m2[i], m2)


SMALL_INTEGERS = ["int8", "uint8", "int16", "uint16", "bool"]


@pytest.mark.parametrize("dtype", SMALL_INTEGERS)
def test_small_integer_extremes_in_every_lane(dtype):
    # 1- and 2-byte elements are folded a 16-byte vector at a time, their extremes in packed
    # 16-bit lanes (even and odd bytes apart): a single minimum or maximum at each position
    # of the first vectors, of the head (offset views) and of the tail must be found.
    dt = np.dtype(dtype)
    n = 4096 + 77
    rng = np.random.default_rng(21)
    if dt.kind == "b":
        low, high, background = False, True, None
    else:
        info = np.iinfo(dt)
        low, high = info.min, info.max
        background = rng.integers(info.min + 1, info.max, n + 3, dtype=dt)  # never an extreme
    for pos in [*range(48), *range(n - 48, n)]:  # the first and the last 48 elements
        for offset in (0, 1, 3):
            for value, fill in ((low, high), (high, low)):
                host = np.full(n + 3, fill, dtype=dt) if background is None else background.copy()
                host[offset + pos] = value
                view = host[offset : offset + n]
                assert_moments_match(view)
                s = multireduce.stats(cupy.asarray(view))
                ref = view.astype(np.int64)
                assert int(s.min) == ref.min() and int(s.max) == ref.max(), (pos, offset, s.min, s.max)


def test_float16_extremes_and_nan_in_every_lane():
    # float16 is folded a word (two elements) at a time: NaN lanes from one packed compare,
    # extremes as packed order keys (-0.0 below +0.0). At each position of the first vectors,
    # of the head (offset views) and of the tail, one element must decide the extreme, the
    # sign of a zero, or the NaN count, as on the CPU (bit for bit).
    n = 4096 + 77
    rng = np.random.default_rng(23)
    background = rng.uniform(-100, 100, n + 3).astype(np.float16)
    cases = [  # (background, value at the position)
        (background, np.float16(-65504)),
        (background, np.float16(65504)),
        (background, np.float16(-np.inf)),
        (background, np.float16(np.inf)),
        (background, np.float16(np.nan)),
        (np.full(n + 3, 0.0, np.float16), np.float16(-0.0)),  # min -0.0, max +0.0
        (np.full(n + 3, -0.0, np.float16), np.float16(0.0)),  # min -0.0, max +0.0
        (np.full(n + 3, np.nan, np.float16), np.float16(-0.0)),  # the one non-NaN element
        (np.full(n + 3, np.nan, np.float16), np.float16(2.5)),
    ]
    for pos in [*range(40), *range(n - 40, n)]:
        for offset in (0, 1, 3):
            for fill, value in cases:
                host = fill.copy()
                host[offset + pos] = value
                view = host[offset : offset + n]
                assert_moments_match(view)
    s = multireduce.stats(cupy.asarray(view))  # NaN propagates, as in NumPy
    assert int(s.nan_count) == n - 1 and math.isnan(float(s.min)) and math.isnan(float(s.max))
    assert float(multireduce.nanmin(cupy.asarray(view))) == 2.5 == float(multireduce.nanmax(cupy.asarray(view)))


@pytest.mark.parametrize("dtype", SMALL_INTEGERS)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 4097, 2**26 + 5])
def test_small_integer_constant_arrays_have_exact_moments(dtype, n):
    # The largest magnitudes fill the packed sums (dp4a, uint16 squares of 2**32 - 2**17); a
    # constant array's variance is exactly 0 and its sum and mean exact.
    dt = np.dtype(dtype)
    values = [False, True] if dt.kind == "b" else [np.iinfo(dt).min, np.iinfo(dt).max]
    for value in values:
        x = cupy.full(n, value, dtype=dt)
        assert float(multireduce.var(x)) == 0.0
        assert float(multireduce.std(x, correction=1 if n > 1 else 0)) == 0.0
        assert float(multireduce.mean(x)) == float(int(value))
        s = multireduce.stats(x)
        assert int(s.sum) == n * int(value) and float(s.var) == 0.0
        assert int(s.min) == int(value) == int(s.max)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8", "int64", "bool"])
@pytest.mark.parametrize("shape", [(5, 7), (3, 1000), (1000, 3), (64, 4099), (2, 3, 4, 5), (1, 2**20 + 3), (7, 1, 5)])
def test_moments_rows(dtype, shape):
    host = make_data(dtype, math.prod(shape), np.random.default_rng(sum(shape))).reshape(shape)
    assert_moments_match(host, axis=len(shape) - 1)
    if len(shape) >= 3:
        assert_moments_match(host, axis=(len(shape) - 2, len(shape) - 1))


def test_moments_over_leading_and_non_adjacent_axes():
    # The reduced axes are moved last by one counted copy, then the rows kernel runs.
    from multireduce._backend.cupy import layout_copies

    host = make_data("float32", 4 * 5 * 6, np.random.default_rng(9)).reshape(4, 5, 6)
    before = layout_copies["transpose"]
    for axis in (0, 1, (0, 1), (0, 2)):
        assert_moments_match(host, axis=axis)
    assert layout_copies["transpose"] == before + 4


def test_moments_non_contiguous_views():
    host = make_data("float32", 60_000, np.random.default_rng(8)).reshape(200, 300)
    x = cupy.asarray(host)
    for view, hview in [(x.T, host.T), (x[:, ::2], host[:, ::2]), (x[::-1], host[::-1])]:
        assert_moments_match(np.ascontiguousarray(hview))
        gpu = multireduce.partial(view, "mean")
        cpu = multireduce.partial(hview, "mean")
        assert int(gpu.n) == int(cpu.n) and bits_equal(gpu.lo, cpu.lo) and bits_equal(gpu.hi, cpu.hi)
        assert math.isclose(float(gpu.mean), float(cpu.mean), rel_tol=1e-12, abs_tol=1e-15)


# ----------------------------------------------------------------------------------------
# argmin / argmax


def assert_arg_match(host: np.ndarray, axis=None) -> None:
    for op in ("argmax", "argmin"):
        gpu = multireduce.partial(cupy.asarray(host), op, axis=axis)
        cpu = multireduce.partial(host, op, axis=axis)
        assert bits_equal(gpu.index, cpu.index), (op, gpu.index, cpu.index)
        assert bits_equal(gpu.value, cpu.value), (op, gpu.value, cpu.value)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_arg_sizes(dtype, n):
    host = make_data(dtype, n + 5, np.random.default_rng(n + 1))
    assert_arg_match(host[:n])
    assert_arg_match(host[1 : n + 1])
    assert_arg_match(host[3 : n + 3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_arg_ties_first_occurrence(dtype):
    host = np.zeros(100_000, dtype=dtype)
    host[[17, 5000, 99_999]] = 1
    x = cupy.asarray(host)
    assert int(multireduce.argmax(x)) == 17
    assert int(multireduce.argmin(x)) == 0
    assert int(multireduce.argmin(x[17:])) == 1


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_arg_special_values(dtype):
    host = make_data(dtype, 70_001, np.random.default_rng(2))
    x = host.copy()
    x[[40_000, 123, 60_000]] = np.nan
    assert int(multireduce.argmax(cupy.asarray(x))) == 123
    assert int(multireduce.argmin(cupy.asarray(x))) == 123
    x = host.copy()
    x[[500, 900]] = [np.inf, np.inf]
    x[[50, 60_000]] = [-np.inf, -np.inf]
    assert int(multireduce.argmax(cupy.asarray(x))) == 500
    assert int(multireduce.argmin(cupy.asarray(x))) == 50
    z = np.array([-0.0] * 3000 + [0.0] + [-0.0] * 3000, dtype=dtype)
    assert int(multireduce.argmax(cupy.asarray(z))) == 3000  # +0.0 above -0.0
    assert int(multireduce.argmin(cupy.asarray(z))) == 0
    z = np.array([0.0] * 3000 + [-0.0] + [0.0] * 3000, dtype=dtype)
    assert int(multireduce.argmin(cupy.asarray(z))) == 3000
    assert int(multireduce.argmax(cupy.asarray(z))) == 0
    for case in (x, z, np.full(5000, np.nan, dtype=dtype)):
        assert_arg_match(case)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint64", "bool", "float16"])
@pytest.mark.parametrize("shape", [(5, 7), (3, 1000), (1000, 3), (64, 4099), (2, 3, 4, 5), (7, 1, 5), (4, 6, 1)])
def test_arg_rows(dtype, shape):
    host = make_data(dtype, math.prod(shape), np.random.default_rng(sum(shape))).reshape(shape)
    assert_arg_match(host)
    axis = max(i for i, n in enumerate(shape) if n != 1)
    assert_arg_match(host, axis=axis)
    got = multireduce.argmax(cupy.asarray(host), axis=axis)
    assert np.array_equal(cupy.asnumpy(got), multireduce.argmax(host, axis=axis))


def test_arg_other_layouts():
    host = make_data("float32", 20 * 30, np.random.default_rng(4)).reshape(20, 30)
    x = cupy.asarray(host)
    assert_arg_match(host, axis=0)  # the axis is moved last by one copy
    # Full reductions index the C-order flattening, whatever the memory order.
    for view, hview in [(x.T, host.T), (x[::-1, ::3], host[::-1, ::3])]:
        assert int(multireduce.argmax(view)) == int(multireduce.argmax(hview))
        assert int(multireduce.argmin(view)) == int(multireduce.argmin(hview))


# ----------------------------------------------------------------------------------------
# Properties


def elements(dtype: np.dtype):
    if dtype == np.float64:  # bounded: squares of 1e300 overflow on both sides, differently
        return st.one_of(st.floats(-1e150, 1e150), st.just(np.nan), st.just(-0.0))
    if dtype.kind == "f":
        return hnp.from_dtype(dtype, allow_nan=True, allow_infinity=True)
    return hnp.from_dtype(dtype)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_property_matches_cpu(data):
    dtype = np.dtype(data.draw(st.sampled_from(["float32", "float64", "int16", "uint32", "bool"])))
    x = data.draw(
        hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=40), elements=elements(dtype))
    )
    offset = data.draw(st.integers(0, 3))
    flat = x.ravel()[offset:]
    if flat.size == 0:
        return
    assert_arg_match(flat)
    gpu = multireduce.partial(cupy.asarray(flat), "mean")
    with np.errstate(invalid="ignore"):  # +inf with -inf: the CPU warns, as NumPy's mean
        cpu = multireduce.partial(flat, "mean")
    assert bits_equal(gpu.n, cpu.n) and bits_equal(gpu.nan, cpu.nan)
    assert bits_equal(gpu.lo, cpu.lo) and bits_equal(gpu.hi, cpu.hi)
    assert_moments_match(flat)


def test_full_reduction_states_from_threads_share_host_records():
    # A full reduction's moments or arg state is written into a pinned, device-mapped host
    # record taken from a shared pool (_cupy_stats._HostRecords). Threads on CuPy's default
    # stream run concurrently (as Dask's do); each must read its own state, and the pool
    # must not grow past the records held at once.
    from concurrent.futures import ThreadPoolExecutor

    from multireduce._backend import _cupy_stats

    rng = np.random.default_rng(17)
    hosts = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(1, 300_000, size=48)]
    devices = [cupy.asarray(h) for h in hosts]

    def work(k: int):
        return multireduce.partial(devices[k], "mean"), int(multireduce.argmax(devices[k]))

    for _ in range(3):
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(work, range(len(hosts))))
        for h, (state, index) in zip(hosts, results, strict=True):
            assert int(state.n) == h.size and float(state.hi) == float(h.max()) and float(state.lo) == float(h.min())
            assert math.isclose(float(state.mean), math.fsum(h.astype(np.float64).tolist()) / h.size, rel_tol=1e-12)
            assert index == int(np.argmax(h))
    held = sum(len(free) for free in _cupy_stats._records._free.values())
    assert held == len(_cupy_stats._records._blocks) * _cupy_stats._HostRecords.BLOCK  # all given back
    assert len(_cupy_stats._records._blocks) <= 2  # 8 threads hold at most 8 records at once


def test_argmin_argmax_results_stay_on_the_device():
    # multireduce.argmax/argmin of a CuPy array return the kernel's int64 indices on the
    # device (0-d for axis=None), queued on the current stream with no host round trip; the
    # values are NumPy's, NaN first and -0.0 below +0.0.
    host = np.array([3.0, -0.0, 7.0, 0.0, 7.0, np.nan, 1.0, np.nan], dtype=np.float32)
    x = cupy.asarray(host)
    for op, want in (("argmax", 5), ("argmin", 5)):
        got = getattr(multireduce, op)(x)
        assert isinstance(got, cupy.ndarray) and got.shape == () and got.dtype == np.int64
        assert got.device.id == x.device.id and int(got) == want
    finite = cupy.asarray(host[~np.isnan(host)])
    assert int(multireduce.argmax(finite)) == 2 and int(multireduce.argmin(finite)) == 1  # -0.0 < +0.0
    rng = np.random.default_rng(23)
    grid = rng.integers(-50, 50, size=(37, 129)).astype(np.int16)
    for axis in (0, 1, -1):
        for op in ("argmax", "argmin"):
            got = getattr(multireduce, op)(cupy.asarray(grid), axis=axis, keepdims=True)
            want = getattr(np, op)(grid, axis=axis, keepdims=True)
            assert isinstance(got, cupy.ndarray) and got.dtype == np.int64 and got.shape == want.shape
            assert np.array_equal(cupy.asnumpy(got), want), (op, axis)
    assert multireduce.argmax(cupy.zeros((0, 4), np.float32), axis=1).shape == (0,)
    # Stream order: the kernel reads what earlier work on the same stream wrote.
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for n in (1, 1000, 3 * 2**20 + 5):
            y = cupy.zeros(n, dtype=np.float32)
            y[n // 3] = 1.0
            assert int(multireduce.argmax(y)) == n // 3


def test_gpu_moments_warnings_come_from_the_shape():
    # mean/var/std of a CuPy array are finalized on the device, so their warnings are decided
    # from the shape on the host, as NumPy decides them (NaN counted); nanmean's depend on
    # the data and still come from the state. Values as NumPy's.
    import warnings

    cases = [
        ("var", np.array([np.nan, np.nan]), {}, None),
        ("var", np.array([1.0, np.nan]), {"correction": 1}, None),
        ("var", np.array([np.nan]), {"correction": 1}, "Degrees of freedom"),
        ("std", np.ones((2, 3)), {"axis": 1, "correction": 3}, "Degrees of freedom"),
        ("mean", np.zeros(0), {}, "Mean of empty slice"),
        ("nanmean", np.array([np.nan, np.nan]), {}, "Mean of empty slice"),
        ("nanmean", np.array([np.nan, 2.0]), {}, None),
        ("nanvar", np.array([np.nan, np.nan]), {}, "Degrees of freedom <= 0 for slice."),
        ("nanstd", np.array([np.nan, 2.0]), {"correction": 1}, "Degrees of freedom <= 0 for slice."),
        ("nanvar", np.array([np.nan, 2.0, 4.0]), {"correction": 1}, None),
    ]
    for op, host, kw, message in cases:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = multireduce.reduce(cupy.asarray(host), op, **kw)
        texts = [str(w.message) for w in caught]
        assert (texts == []) if message is None else (len(texts) == 1 and message in texts[0]), (op, texts)
        assert all(w.filename == __file__ for w in caught)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            want = multireduce.reduce(host, op, **kw)
        assert bits_equal(cupy.asnumpy(got), np.asarray(want)), (op, got, want)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint16", "bool"])
@pytest.mark.parametrize("n", [1, 4097, 2**20 + 3])
def test_integer_stats_mean_is_numpys(dtype, n):
    # The state's mean for integer input is float64(total) / n (stats_finalize_kernel's
    # state_mean), as NumPy's, where the total cannot have wrapped: bit for bit, also over
    # rows, and exactly 0 where the sum is 0.
    rng = np.random.default_rng(n)
    host = rng.integers(0, 2, n).astype(bool) if dtype == "bool" else rng.integers(-100, 100, n).astype(dtype)
    if dtype in ("int32", "int64") and n > 1:
        host[-1] = 0
        host[-1] = -host.sum()
    got = multireduce.stats(cupy.asarray(host)).mean
    assert bits_equal(cupy.asnumpy(got), np.mean(host)), (got, np.mean(host))
    rows = host[: n - n % 3].reshape(3, -1) if n >= 3 else host.reshape(1, -1)
    got = multireduce.stats(cupy.asarray(rows), axis=1).mean
    assert bits_equal(cupy.asnumpy(got), np.mean(rows, axis=1)), (got, np.mean(rows, axis=1))


@pytest.mark.parametrize("dtype", ["int64", "uint64", "int32", "uint32", "int8", "bool"])
@pytest.mark.parametrize("n", [2, 6, 19, 4097])
def test_integer_mean_is_the_cpus_and_stats_mean(dtype, n):
    # The mean of integers is float64(exact total) / n wherever no total can have wrapped
    # (count * max(|lo|, |hi|) < 2**62), on both backends (the CPU's since db25b85): there
    # mean(x), the mean of a reversed view, stats(x).mean and the CPU's mean are the same bits.
    # int64/uint64 values in 2**54..2**57 make a float64 sum round (the old GPU mean, a float64
    # sum over the count, differed from stats().mean in the last bits for most such arrays).
    # Beyond the bound (n = 19 and 4097 here, and totals that wrap) the mean is the moments
    # state's merged float64 mean, whose bits depend on the merge order: the GPU's mean is
    # then its stats().mean, bit for bit, and within 1e-12 of the CPU's.
    rng = np.random.default_rng(n)
    if dtype in ("int64", "uint64"):
        host = rng.integers(2**54, 2**57, (3, n), dtype=np.int64)
        signs = np.where(rng.random((3, n)) < 0.5, -1, 1) if dtype == "int64" else 1
        host = (host * signs).astype(dtype)
    elif dtype == "bool":
        host = rng.random((3, n)) < 0.5
    else:
        info = np.iinfo(dtype)
        host = rng.integers(info.min, int(info.max) + 1, (3, n), dtype=np.int64).astype(dtype)

    def check(host, axis):
        count = host.size if axis is None else host.shape[axis]
        largest = np.maximum(
            np.abs(host.min(axis=axis).astype(np.float64)), np.abs(host.max(axis=axis).astype(np.float64))
        )
        exact = bool(np.all(count * largest < 2.0**62))
        x = cupy.asarray(host)
        want = np.asarray(multireduce.mean(host, axis=axis))
        got = cupy.asnumpy(multireduce.mean(x, axis=axis))
        assert bits_equal(got, cupy.asnumpy(multireduce.stats(x, axis=axis).mean)), axis
        if exact:
            assert bits_equal(got, want), (axis, got, want)
        else:
            assert got.dtype == want.dtype and np.allclose(got, want, rtol=1e-12, atol=0), (axis, got, want)
        return exact

    regimes = set()
    for axis in (None, 0, 1):
        regimes.add(check(host, axis))
        regimes.add(check(host[:, ::-1], axis))
    if dtype not in ("int64", "uint64") or n <= 6:
        assert regimes == {True}, regimes  # the bound holds for these
    if dtype in ("int64", "uint64"):  # totals that wrap: the moments state's mean
        assert check(np.full((1, n), np.iinfo(dtype).max // 3, dtype=dtype), None) is False


# ----------------------------------------------------------------------------------------
# float64 near the overflow threshold: NumPy's rules (var inf where the squared deviations
# overflow; the mean the float64 sum over the count), and no NaN var from finite elements.
# A thread whose shifted sums overflow forms its state again from its elements (the RESCAN
# of stats.cuh); merges and the finalize kernels keep M2 from becoming NaN.

_EPS = float(np.finfo(np.float64).eps)


def on_device(host: np.ndarray, offset: int = 0):
    """A CuPy copy of the 1-d ``host`` that starts ``offset`` elements past a 16-byte boundary.

    ``cupy.asarray`` of an offset NumPy view makes an aligned copy; a view into a larger
    device buffer keeps the offset, so the kernel's head and tail elements are exercised.
    """
    buf = cupy.zeros(host.size + offset, dtype=host.dtype)
    buf[offset:] = cupy.asarray(host)
    return buf[offset:]


def numpy_float64(host: np.ndarray, axis=None, correction: float = 0.0) -> dict:
    """NumPy's float64 sum, mean, var and std (NaN where count - correction <= 0, the standard's rule)."""
    count = host.size if axis is None else host.shape[axis]
    with np.errstate(all="ignore"):
        var = np.var(host, axis=axis, ddof=correction) if count - correction > 0 else np.float64(np.nan)
        return {"sum": np.sum(host, axis=axis), "mean": np.mean(host, axis=axis), "var": var, "std": np.sqrt(var)}


def assert_overflow_matches_numpy(dev, host: np.ndarray, correction: float, exact: bool) -> None:
    """var, std and stats of the float64 device array ``dev`` (the values of ``host``) against NumPy.

    var and std (both kernels) and stats' var, min and max: NumPy's bits. stats' sum and
    mean: NumPy's bits with ``exact`` (all elements in one thread whose shifted sum s1
    overflowed, so that its rescan adds them in NumPy's order, or sums that are exact in any
    order), else within rounding: the sum within n**2 * eps of the largest magnitude (each
    thread adds its shifted elements in float64 before the merges), the mean (merged states)
    within 64 ulps of the largest magnitude, as the mean op (the fold kernel's float64 sum
    over the count, in its own order: for [1e200, -1e200, 3.0] its accumulators give 0.0
    where NumPy's sum gives 3.0); within n ulps of it for more than 64 elements.
    """
    import warnings

    ref = numpy_float64(host, None, correction)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # degrees of freedom <= 0, as NumPy's
        var = cupy.asnumpy(multireduce.var(dev, correction=correction))
        std = cupy.asnumpy(multireduce.std(dev, correction=correction))
        mean = cupy.asnumpy(multireduce.mean(dev))
    s = multireduce.stats(dev, correction=correction)
    assert bits_equal(var, np.asarray(ref["var"])), (var, ref["var"])
    assert bits_equal(std, np.asarray(ref["std"])), (std, ref["std"])
    assert bits_equal(cupy.asnumpy(s.var), np.asarray(ref["var"])), (s.var, ref["var"])
    scale = np.max(np.abs(host))
    if exact:
        assert bits_equal(cupy.asnumpy(s.sum), np.asarray(ref["sum"])), (s.sum, ref["sum"])
    else:
        got_sum = float(s.sum)
        assert abs(got_sum - float(ref["sum"])) <= host.size**2 * _EPS * scale, (s.sum, ref["sum"])
    assert bits_equal(cupy.asnumpy(s.min), np.min(host)) and bits_equal(cupy.asnumpy(s.max), np.max(host))
    assert int(s.count) == host.size and int(s.nan_count) == 0
    for got in (mean, cupy.asnumpy(s.mean)):
        tol = max(64, host.size) * _EPS * scale  # a thread's shifted sum of up to n elements
        assert np.isfinite(got) and abs(float(got) - float(ref["mean"])) <= tol, (got, ref["mean"])
    if exact:
        assert bits_equal(cupy.asnumpy(s.mean), np.asarray(ref["mean"])), (s.mean, ref["mean"])


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize(
    "data, exact",
    [
        ([1e308, -1e308], True),
        ([-1e308, 1e308, 0.5], True),
        ([1e200, -1e200, 3.0], False),
        ([1.7e308, -1.7e308, 1.7e308], True),
    ],
)
def test_float64_overflow_in_one_thread_is_numpys(data, exact, offset):
    # Two or three elements, all in thread 0 (head, a vector, tail): c = x[0], and x - c or
    # its square overflows, so s1 or s2 does (the var was NaN; for +-1e308 the mean and sum
    # -inf too). Where s1 overflowed (+-1e308, +-1.7e308) the rescan adds them in NumPy's
    # order: stats' sum and mean are NumPy's bits (0.0 for +-1e308). [1e200, -1e200, 3.0]
    # overflows s2 only, with hi - lo > 1.9e154: M2 is inf without a rescan, and the sum
    # and mean come from the shifted sums (0.0 where NumPy's sum is 3.0, within rounding of
    # 1e200). var and std are NumPy's inf throughout.
    host = np.array(data)
    dev = on_device(host, offset)
    for correction in (0.0, 1.0):
        assert_overflow_matches_numpy(dev, host, correction, exact=exact)
    assert float(multireduce.stats(dev).var) == math.inf


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("n", [1, 2, 3, 33, 1023, 1024, 1025, 4097, 70_000, 2**20 + 3])
def test_float64_alternating_1e300_is_numpys(n, offset):
    # +-1e300 alternating: every thread's s2 overflows ((2e300)**2) with hi - lo = 2e300, so
    # its M2 is inf without a rescan; many threads and blocks merge. var and std are inf (0
    # for one element); the sums within rounding (exact for one or two elements: 0.0).
    host = np.where(np.arange(n) % 2 == offset, 1e300, -1e300)
    dev = on_device(host, offset)
    for correction in (0.0, 1.0):
        assert_overflow_matches_numpy(dev, host, correction, exact=n <= 2)
    if n > 1:
        assert math.isinf(float(multireduce.var(dev))) and math.isinf(float(multireduce.std(dev, correction=1)))


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("n", [33, 4097, 2**20])
def test_float64_pair_of_1e308_at_any_position(n, offset):
    # +1e308 and -1e308 among zeros, in one thread, in one vector, in two threads or two
    # blocks, as a thread's first element (its shift c) or not. NumPy: sum and mean 0.0
    # (every partial sum is exact, in any order), var inf. The mean op (the fold kernel's
    # sum over n) and stats' sum are 0.0 exactly; stats' mean, from merged states, within
    # rounding of 1e308.
    for p, q in [(0, n - 1), (1, 2), (0, 1), (n // 2, n // 3), (n - 2, 5), (2 * 1024 + 1, 7)]:
        if max(p, q) >= n:
            continue
        host = np.zeros(n)
        host[p], host[q] = 1e308, -1e308
        dev = on_device(host, offset)
        assert_overflow_matches_numpy(dev, host, 0.0, exact=False)
        assert bits_equal(cupy.asnumpy(multireduce.mean(dev)), np.float64(0.0)), (p, q)
        assert bits_equal(cupy.asnumpy(multireduce.stats(dev).sum), np.float64(0.0)), (p, q)
        assert math.isinf(float(multireduce.std(dev, correction=1))), (p, q)


@pytest.mark.parametrize("n", [33, 4097, 2**20 + 5])
def test_float64_one_huge_element_among_ordinary_ones(n):
    # One element near DBL_MAX among standard normals (bench_dtypes' data): the thread that
    # holds it overflows s2 with a finite mean and hi - lo > 1.9e154, so its M2 is set to inf
    # without reading its elements again (a rescan of its ~4,000 elements at 4 GiB cost 0.35
    # ms). NumPy: var and std inf; the sum and mean finite, within rounding of DBL_MAX.
    rng = np.random.default_rng(n)
    for position in (0, 1, n // 2, n - 3):
        host = rng.standard_normal(n)
        host[position] = np.finfo(np.float64).max
        dev = cupy.asarray(host)
        assert_overflow_matches_numpy(dev, host, 0.0, exact=False)
        assert math.isinf(float(multireduce.std(dev, correction=1))), position
        s = multireduce.stats(dev)
        assert math.isfinite(float(s.sum)) and math.isfinite(float(s.mean)), (position, s.sum, s.mean)


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("n, value", [(4, 1e308), (33, 1e307), (4097, 1e305), (2**20 + 3, 1e303)])
def test_float64_total_that_overflows_gives_numpys_inf_mean_and_var(n, value, offset):
    # Every thread's (and block's) sum is finite, the total is not: the merged means are
    # finite (value, M2 0), but NumPy's sum, mean and var are inf, and so are ours at any
    # split (the finalize takes the total over the count, and var inf).
    host = np.full(n, value)
    dev = on_device(host, offset)
    s = multireduce.stats(dev)
    assert (float(s.sum), float(s.mean), float(s.var)) == (math.inf, math.inf, math.inf), s
    for op in ("mean", "var", "std"):
        assert float(getattr(multireduce, op)(dev)) == math.inf, op
    assert np.all(np.isinf(cupy.asnumpy(multireduce.var(dev.reshape(1, n), axis=1)))), n


@pytest.mark.parametrize("n, value", [(33, 1.2e154), (4097, 6e153), (2**20, 5e153)])
def test_float64_outlier_shift_keeps_a_finite_var(n, value):
    # One large element first, zeros after it: it is thread 0's shift c, and its m elements
    # give s2 = (m - 1) * value**2 > DBL_MAX, though no squared deviation overflows and
    # NumPy's var is finite. The rescan's M2 is that thread's own sum of squares: NumPy's var
    # within rounding (it was NaN).
    host = np.zeros(n)
    host[0] = value
    want = np.var(host)
    assert np.isfinite(want)
    dev = cupy.asarray(host)
    for got in (multireduce.var(dev), multireduce.stats(dev).var):
        assert math.isclose(float(got), float(want), rel_tol=1e-12), (got, want)
    assert math.isclose(float(multireduce.std(dev, correction=1)), float(np.std(host, ddof=1)), rel_tol=1e-12)


@pytest.mark.parametrize("center", [3.5e150, 1e153, 1e160])
def test_variance_of_data_beyond_2_to_the_500_keeps_its_digits_on_the_gpu(center):
    # Elements beyond 2**500 could not be a thread's shift or a row's base (the limit is now
    # 2**960, as the host's): their sums were unshifted, and far from zero the variance kept
    # 8-10 digits. Against the host's variance (tests/test_semantics.py checks it against
    # exact Fractions), and the device stats against the host's finalize of the same state.
    rng = np.random.default_rng(5)
    for shape, axis in [(((1 << 20) + 3,), None), ((64, 40001), 1), ((40001, 64), 0)]:
        host = center + rng.standard_normal(shape) * (center * 1e-10)
        dev = cupy.asarray(host)
        want = np.asarray(multireduce.var(host, axis=axis))
        got = cupy.asnumpy(multireduce.var(dev, axis=axis))
        np.testing.assert_allclose(got, want, rtol=1e-13)
        np.testing.assert_allclose(cupy.asnumpy(multireduce.stats(dev, axis=axis).var), want, rtol=1e-13)
        assert_device_stats_match_host_finalize(dev, axis, 0.0)


@pytest.mark.parametrize("shape", [(6, 4099), (6, 2**17 + 1)])
def test_float64_overflow_over_rows_leaves_the_other_rows_unchanged(shape):
    # Rows 1 and 4 overflow (alternating +-1e300; a +-1e308 pair among zeros): their var
    # and std are inf, stats' sum NumPy's. Every other row has the bits it has when no row
    # overflows (the rows are reduced apart, with the same grid for the same shape). The
    # same rows reduced as axis 0 of the transpose: the same values.
    rng = np.random.default_rng(shape[1])
    clean = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, (shape[0], 1))
    host = clean.copy()
    host[1] = np.where(np.arange(shape[1]) % 2 == 0, 1e300, -1e300)
    host[4] = 0.0
    host[4, [3, shape[1] - 2]] = [1e308, -1e308]  # every partial sum exact: NumPy's sum 0.0
    bad = [1, 4]
    good = [0, 2, 3, 5]
    dev, dev_clean = cupy.asarray(host), cupy.asarray(clean)
    ref = numpy_float64(host, 1)
    for correction in (0.0, 1.0):
        var = cupy.asnumpy(multireduce.var(dev, axis=1, correction=correction))
        std = cupy.asnumpy(multireduce.std(dev, axis=1, correction=correction))
        s = multireduce.stats(dev, axis=1, correction=correction)
        assert np.all(np.isinf(var[bad])) and np.all(np.isinf(std[bad])), (var, std)
        assert np.all(np.isinf(cupy.asnumpy(s.var)[bad]))
        sums = cupy.asnumpy(s.sum)[bad]
        assert np.all(np.abs(sums - ref["sum"][bad]) <= shape[1] ** 2 * _EPS * 1e308), (sums, ref["sum"][bad])
        mean = cupy.asnumpy(s.mean)[bad]
        assert np.all(np.abs(mean - ref["mean"][bad]) <= shape[1] * _EPS * 1e308), (mean, ref["mean"][bad])
        assert bits_equal(var[good], cupy.asnumpy(multireduce.var(dev_clean, axis=1, correction=correction))[good])
        assert bits_equal(std[good], cupy.asnumpy(multireduce.std(dev_clean, axis=1, correction=correction))[good])
        want = multireduce.stats(dev_clean, axis=1, correction=correction)
        for field in ("sum", "min", "max", "mean", "var"):
            got_field = cupy.asnumpy(getattr(s, field))[good]
            assert bits_equal(got_field, cupy.asnumpy(getattr(want, field))[good]), field
        transposed = cupy.asarray(np.ascontiguousarray(host.T))
        var_t = cupy.asnumpy(multireduce.var(transposed, axis=0, correction=correction))
        np.testing.assert_allclose(var_t, var, rtol=1e-12)  # inf where var is inf
        s_t = multireduce.stats(transposed, axis=0, correction=correction)
        np.testing.assert_allclose(cupy.asnumpy(s_t.var), cupy.asnumpy(s.var), rtol=1e-12)


def test_float64_infinite_or_nan_elements_keep_numpys_nan_var():
    # With an infinity or a NaN among the elements var stays NaN and the mean is NumPy's
    # (+-inf or NaN), as before: only finite elements take the overflow rules.
    alternating = np.where(np.arange(4097) % 2 == 0, 1e300, -1e300)
    cases = [np.array(c) for c in ([np.inf, 1e308, -1e308], [1e308, -1e308, -np.inf], [np.inf, -np.inf, 1e308])]
    cases.append(np.array([1e308, np.nan, -1e308]))
    for k, value in enumerate((np.inf, -np.inf, np.nan)):
        x = alternating.copy()
        x[7 + 1000 * k] = value
        cases.append(x)
    for host in cases:
        ref = numpy_float64(host)
        for offset in (0, 1):
            dev = on_device(host, offset)
            s = multireduce.stats(dev)
            for got in (multireduce.var(dev), multireduce.std(dev, correction=1), s.var):
                assert math.isnan(float(got)), (host[:4], got)
            assert bits_equal(cupy.asnumpy(s.mean), np.asarray(ref["mean"])), (host[:4], s.mean, ref["mean"])
    x = on_device(np.array([1e308, np.nan, -1e308]), 1)
    assert float(multireduce.nanmean(x)) == 0.0  # the non-NaN elements' sum, 0, over 2


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_nanvar_nanstd_against_numpy(dtype, axis):
    # nanvar/nanstd of a CuPy array: the moments kernel's state of the non-NaN elements,
    # finalized on the host (the warnings count them), the result back on the device. Rows
    # with NaN at the ends of the kernel's vectors, an all-NaN row and one with one element.
    import warnings

    rng = np.random.default_rng(5)
    host = (rng.standard_normal((7, 4099)) * 3 + 1).astype(dtype)
    host[0, [0, 1, 7, 8, 4095, 4098]] = np.nan
    host[1] = np.nan
    host[2, 1:] = np.nan
    host[3, rng.integers(0, 4099, 2000)] = np.nan
    wide = host.astype(np.float64)
    for op, ref in (("nanvar", np.nanvar), ("nanstd", np.nanstd)):
        for correction in (0, 1):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = multireduce.reduce(cupy.asarray(host), op, axis=axis, correction=correction)
            with warnings.catch_warnings(record=True) as theirs, np.errstate(all="ignore"):
                warnings.simplefilter("always")
                want = ref(wide, axis=axis, ddof=correction)
            assert isinstance(got, cupy.ndarray) and got.dtype == np.dtype(dtype), (type(got), got.dtype)
            assert [str(w.message) for w in caught] == [str(w.message) for w in theirs if "Degrees" in str(w.message)]
            got = cupy.asnumpy(got).astype(np.float64)
            assert np.array_equal(np.isnan(got), np.isnan(want)), (op, axis, correction)
            eps = float(np.finfo(dtype).eps)
            ok = np.isnan(want) | np.isclose(got, want, rtol=2 * eps, atol=1e-12)
            assert np.all(ok), (op, axis, correction, got[~ok], np.asarray(want)[~ok])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_nanargmax_nanargmin_pass_over_nan_in_the_kernel(dtype, offset):
    # arg_rows_kernel<..., NAN_WINS=false>: NaN is the smallest key. NaN before, at and
    # after the extreme, at the head and tail of the 16-byte vectors (offset views), in one
    # row of many blocks (2**20 + 5 elements) and in rows of a matrix; an all-NaN row
    # raises NumPy's ValueError, and NaN-free data gives argmax's index.
    rng = np.random.default_rng(offset)
    n = 2**20 + 5
    host = rng.standard_normal(n + offset).astype(dtype)[offset:]
    for pos in (0, 1, 7, 8, n // 2, n - 2, n - 1):
        host[pos] = np.nan
    host[n // 3] = 50.0  # the maximum, after NaN
    host[n // 3 + 1] = np.nan
    host[2 * n // 3] = -50.0
    dev = cupy.asarray(host)
    for op, ref in (("nanargmax", np.nanargmax), ("nanargmin", np.nanargmin)):
        got = multireduce.reduce(dev, op)
        assert isinstance(got, cupy.ndarray) and int(got) == ref(host) == (n // 3 if op == "nanargmax" else 2 * n // 3)
    rows = rng.standard_normal((6, 4099)).astype(dtype)
    rows[rng.random(rows.shape) < 0.5] = np.nan
    rows[:, 0] = np.nan
    rows[5, 4098] = 9.0
    cols = rows[:, 1:300].copy()
    cols[4] = rng.standard_normal(299)  # no column of NaN only
    for op, ref in (("nanargmax", np.nanargmax), ("nanargmin", np.nanargmin)):
        for axis, data in ((1, rows), (0, cols), (1, rows[:, ::-1])):
            got = multireduce.reduce(cupy.asarray(data), op, axis=axis)
            assert np.array_equal(cupy.asnumpy(got), ref(data, axis=axis)), (op, axis)
        bad = rows.copy()
        bad[2] = np.nan
        with pytest.raises(ValueError, match="All-NaN slice encountered"):
            multireduce.reduce(cupy.asarray(bad), op, axis=1)
        clean = np.nan_to_num(rows, nan=0.25)
        assert np.array_equal(
            cupy.asnumpy(multireduce.reduce(cupy.asarray(clean), op, axis=1)),
            cupy.asnumpy(multireduce.reduce(cupy.asarray(clean), op[3:], axis=1)),
        )


@pytest.mark.parametrize("n_each", [1, 2])
def test_merge_of_a_single_element_far_from_the_rest(n_each):
    # Chan's update computed delta * delta * w: delta**2 overflowed (1.6e154**2) where the term
    # delta**2 * w does not (w = 0.5 for two single elements): var was inf, NumPy's 6.4e307.
    x = np.array([8e153] * n_each + [-8e153] * n_each)
    with np.errstate(over="ignore"):  # NumPy's own sum of squares overflows for two of each
        want = np.var(x)
    assert math.isfinite(want) == (n_each == 1)
    got = float(multireduce.var(cupy.asarray(x)))
    assert got == want or (math.isinf(want) and math.isinf(got)), (got, want)
    if n_each == 1:
        assert float(multireduce.std(cupy.asarray(x))) == np.std(x)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_mean_of_fortran_order_arrays_over_any_axes(dtype):
    # The fold of a Fortran-order array is Fortran-ordered (the transpose's), and
    # mean_from_sum_kernel read it in memory order into a C-order result: a mean over an
    # axis of 3 or more dimensions had its values scrambled.
    host = np.arange(3 * 4 * 5 * 2, dtype=dtype).reshape(3, 4, 5, 2) * 3 % 17
    dev = cupy.asfortranarray(cupy.asarray(host))
    for r in range(1, host.ndim + 1):
        for axes in itertools.combinations(range(host.ndim), r):
            got = cupy.asnumpy(multireduce.mean(dev, axis=axes))
            np.testing.assert_allclose(got, np.mean(host.astype(np.float64), axis=axes), rtol=1e-6, err_msg=str(axes))
            assert bits_equal(got, cupy.asnumpy(multireduce.mean(cupy.ascontiguousarray(dev), axis=axes))), axes


def test_full_variances_from_threads_on_one_stream_are_their_own():
    # A full reduction's moments state went to the stream's one device record, which the
    # finalize kernel read later: another thread's moments launch, queued between the two
    # on the same (legacy default) stream, overwrote it, and var() returned another array's
    # variance. Each call now has its own record.
    import concurrent.futures

    xs = [cupy.random.default_rng(k).standard_normal(1 << 16, dtype=cupy.float32) * (k + 1) for k in range(16)]
    want = [float(multireduce.var(a)) for a in xs]
    want_stats = [float(multireduce.stats(a).var) for a in xs]

    def run(k: int) -> tuple[float, float]:
        return float(multireduce.var(xs[k])), float(multireduce.stats(xs[k]).var)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for _ in range(30):
            got = list(pool.map(run, range(16)))
            assert [g[0] for g in got] == want and [g[1] for g in got] == want_stats
