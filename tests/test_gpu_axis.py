"""The GPU row and column kernels (axis reductions of sum, max and min) against the CPU path.

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


def test_non_adjacent_axes_are_refused():
    dev = cupy.ones((2, 3, 4), dtype=cupy.float32)
    with pytest.raises(NotImplementedError, match="non-adjacent axes"):
        multireduce.sum(dev, axis=(0, 2))


def test_every_axis_combination_of_a_4d_array():
    host = make_data("int16", 2 * 3 * 5 * 7, np.random.default_rng(5)).reshape(2, 3, 5, 7)
    dev = cupy.asarray(host)
    for r in range(1, 4):
        for axes in itertools.combinations(range(4), r):
            adjacent = axes == tuple(range(axes[0], axes[-1] + 1))
            if not adjacent:
                with pytest.raises(NotImplementedError):
                    multireduce.sum(dev, axis=axes)
                continue
            assert np.array_equal(multireduce.sum(dev, axis=axes).get(), multireduce.sum(host, axis=axes))
