"""The GPU row and column kernels (axis reductions of every fold op) against the CPU path.

Integer sums and max/min must match the CPU bit for bit; float sums within the rounding of
two float64 (float16: float32) accumulations in different orders.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from reference import make_data

import multireduce

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")

SHAPES = [(5, 7), (3, 1000), (1000, 3), (2, 3, 4, 5), (64, 4099), (4099, 64), (1, 1_000_003), (1_000_003, 2), (7, 1, 5)]
DTYPES = ["float16", "float32", "float64", "int8", "int32", "uint64", "bool"]


def adjacent_axis_sets(shape):
    """Every non-empty, non-full set of adjacent axes."""
    nd = len(shape)
    for start in range(nd):
        for stop in range(start + 1, nd + 1):
            if stop - start < nd:
                yield tuple(range(start, stop))


def assert_close(got: np.ndarray, ref: np.ndarray, op: str, host: np.ndarray, axes) -> None:
    """Bitwise for max/min and integer sums; float sums within two accumulations' error."""
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, ref.dtype, got.shape, ref.shape)
    if op != "sum" or host.dtype.kind != "f":
        if got.dtype.kind == "f":
            same = (got.view(f"u{got.itemsize}") == ref.view(f"u{ref.itemsize}")) | (np.isnan(got) & np.isnan(ref))
        else:
            same = got == ref
        assert np.all(same), (got, ref)
        return
    wide = host.astype(np.float64)
    magnitude = np.nansum(np.abs(wide), axis=axes, keepdims=ref.ndim == host.ndim)
    n = int(np.prod([host.shape[a] for a in np.atleast_1d(axes)]))
    eps = np.finfo(np.float32 if host.dtype == np.float16 else np.float64).eps
    tol = 2 * eps * magnitude * (np.log2(n + 1) + n / 50_000 + 1)
    tol = tol + 2 * np.spacing(np.abs(ref).astype(host.dtype)).astype(np.float64)
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    assert np.all((err <= tol) | (np.isnan(got) & np.isnan(ref)) | (got == ref)), float(np.nanmax(err - tol))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_adjacent_axes_match_the_cpu(shape, dtype, op):
    host = make_data(dtype, int(np.prod(shape)), np.random.default_rng(len(shape) * 31 + shape[0])).reshape(shape)
    dev = cupy.asarray(host)
    for axes in adjacent_axis_sets(shape):
        for keepdims in (False, True):
            ref = np.asarray(multireduce.reduce(host, op, axis=axes, keepdims=keepdims))
            got = multireduce.reduce(dev, op, axis=axes, keepdims=keepdims)
            assert isinstance(got, cupy.ndarray)
            assert_close(got.get(), ref, op, host, axes)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_nansum_adjacent_axes_match_numpy(shape, dtype):
    # float32 nansum has its own column launch shape (256 x 6 rows in flight, _kernels.
    # cols_config): column lengths around the 6-row trip and the slab split, NaN anywhere.
    rng = np.random.default_rng(len(shape) * 17 + shape[-1])
    n = int(np.prod(shape))
    host = make_data(dtype, n, rng)
    host[rng.integers(0, n, size=max(1, n // 7))] = np.nan
    host = host.reshape(shape)
    dev = cupy.asarray(host)
    wide = host.astype(np.float64)
    for axes in adjacent_axis_sets(shape):
        for keepdims in (False, True):
            ref = np.nansum(wide, axis=axes, keepdims=keepdims).astype(host.dtype)
            got = multireduce.nansum(dev, axis=axes, keepdims=keepdims)
            assert isinstance(got, cupy.ndarray)
            assert not np.isnan(got.get()).any(), axes
            assert_close(got.get(), ref, "sum", host, axes)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_layouts_views_and_specials(op):
    rng = np.random.default_rng(3)
    host = rng.standard_normal((300, 257)).astype(np.float32)
    host[17, 5] = np.nan
    host[100, :] = -0.0
    dev = cupy.asarray(host)
    views = {
        "F order": (np.asfortranarray(host), cupy.asfortranarray(dev)),
        "transposed": (host.T, dev.T),
        "offset": (host[3:, 1:], dev[3:, 1:]),
        "strided": (host[::2, ::3], dev[::2, ::3]),
    }
    for name, (h, d) in views.items():
        for axis in (0, 1):
            ref = np.asarray(multireduce.reduce(h, op, axis=axis))
            got = multireduce.reduce(d, op, axis=axis).get()
            try:
                assert_close(got, ref, op, np.ascontiguousarray(h), axis)
            except AssertionError as exc:
                raise AssertionError(f"{name}, axis={axis}: {exc}") from exc


def test_empty_and_identity():
    dev = cupy.zeros((0, 5), dtype=cupy.float32)
    assert multireduce.sum(dev, axis=0).get().tolist() == [0.0] * 5
    assert multireduce.sum(dev, axis=1).shape == (0,)
    with pytest.raises(ValueError, match="zero-size array"):
        multireduce.max(dev, axis=0)


def test_repeated_runs_identical_bits():
    dev = cupy.asarray(np.random.default_rng(4).standard_normal((8, 3_000_001)).astype(np.float32))
    for axis in (0, 1):
        first = multireduce.sum(dev, axis=axis).get()
        for _ in range(20):
            assert np.array_equal(multireduce.sum(dev, axis=axis).get().view(np.uint32), first.view(np.uint32))


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod", "nansum", "nanmax", "count_nonzero", "any"])
@pytest.mark.parametrize("dtype", ["float32", "int16", "float16"])
def test_every_axis_combination_of_a_4d_array(op, dtype):
    # Non-adjacent axes take one launch per run of adjacent reduced axes, the partials in the
    # accumulator dtype; against the CPU (bitwise where the result is exact in any order).
    from multireduce._backend.cupy import layout_copies

    rng = np.random.default_rng(5)
    host = make_data(dtype, 2 * 3 * 5 * 7, rng).reshape(2, 3, 5, 7)
    if op == "prod":
        host = rng.choice(np.array([0.5, 1.0, 2.0, -1.0], dtype=dtype), size=host.shape)
    if host.dtype.kind == "f":
        host[0, 1, 2, 3] = np.nan
    dev = cupy.asarray(host)
    copies = dict(layout_copies)
    for r in range(1, 4):
        for axes in itertools.combinations(range(4), r):
            for keepdims in (False, True):
                ref = np.asarray(multireduce.reduce(host, op, axis=axes, keepdims=keepdims))
                got = multireduce.reduce(dev, op, axis=axes, keepdims=keepdims)
                assert isinstance(got, cupy.ndarray)
                if op in ("sum", "nansum", "prod") and host.dtype.kind == "f":
                    assert got.dtype == ref.dtype and got.shape == ref.shape
                    assert np.allclose(got.get(), ref, rtol=2e-3 if dtype == "float16" else 1e-6, equal_nan=True), axes
                else:
                    assert_close(got.get(), ref, "max", host, axes)
    assert layout_copies == copies  # C-contiguous input: passes over partials, no copy


def test_non_adjacent_axes_of_a_view_and_dtype_argument():
    rng = np.random.default_rng(6)
    host = rng.integers(-1000, 1000, size=(6, 5, 8, 3)).astype(np.int32)
    dev = cupy.asarray(host)
    views = [(host, dev), (host[::2, :, ::-1], dev[::2, :, ::-1])]
    views.append((host.transpose(2, 0, 3, 1), dev.transpose(2, 0, 3, 1)))
    for h, d in views:
        for axes in [(0, 2), (1, 3), (0, 3), (0, 1, 3)]:
            assert np.array_equal(multireduce.sum(d, axis=axes).get(), multireduce.sum(h, axis=axes))
            # dtype=int8 converts each element first (wrapping), as NumPy does.
            got = multireduce.sum(d, axis=axes, dtype=np.int8)
            want = np.sum(h.astype(np.int8), axis=axes, dtype=np.int8)
            assert got.dtype == np.int8 and np.array_equal(got.get(), want)
