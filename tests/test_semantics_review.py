"""Semantics review: focused checks of defects found by differential testing against NumPy.

Each test asserts values against an independent reference (exact Python integers,
``fractions.Fraction``, ``math.fsum``, or NumPy where the documented rule is NumPy's).
"""

from __future__ import annotations

import numpy as np
import pytest

import multireduce


def _bits(value) -> bytes:
    return np.asarray(value).tobytes()


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_integer_mean_is_the_exact_total_over_the_count_whatever_the_layout(dtype):
    # docs/semantics.md: for integer input the mean is float64(total) / n, the total exact,
    # wherever n * max(|min|, |max|) < 2**62, so mean and stats().mean are the same bits on
    # one array. Values above 2**53 make a float64 sum of the elements round on the way,
    # so a mean formed as that sum over the count depends on the order of the additions.
    rng = np.random.default_rng(0)
    signs = np.array([-1, 1]) if dtype == "int64" else np.array([1])
    # Rows of 7 below 2**57 and 128 elements below 1.5 * 2**53: both under the 2**62 bound.
    x = (rng.integers(2**54, 2**57, (64, 7), dtype=np.int64) * rng.choice(signs, (64, 7))).astype(dtype)
    y = (rng.integers(2**53, 2**53 + 2**52, (16, 8), dtype=np.int64) * rng.choice(signs, (16, 8))).astype(dtype)
    want_rows = np.array([float(sum(r)) / len(r) for r in x.tolist()])  # the exact total, rounded once
    want_all = np.float64(float(sum(y.ravel().tolist())) / y.size)
    for view, axis, want in [
        (x, 1, want_rows),  # trailing axis of a C-contiguous array
        (x[:, ::-1], 1, want_rows),  # the same rows, reversed
        (np.asfortranarray(x), 1, want_rows),
        (y, None, want_all),
        (y, (0, 1), want_all),
        (y[::-1], None, want_all),
        (y.T, None, want_all),
    ]:
        assert _bits(multireduce.mean(view, axis=axis)) == _bits(want), (view.strides, axis)
        assert _bits(multireduce.stats(view, axis=axis).mean) == _bits(want), (view.strides, axis)


def test_integer_mean_beyond_the_bound_is_the_moments_mean_on_every_layout():
    # Where n * max(|min|, |max|) reaches 2**62 the int64 total may wrap (here it does): the
    # mean is the merged moments' mean, close to the exact one, on every layout.
    from fractions import Fraction

    x = np.array([[2**62, 2**62, 2**62 - 8, 2**62 + 8]] * 3, dtype=np.int64)
    exact = Fraction(sum(x[0].tolist()), x.shape[1])
    for view in (x, x[:, ::-1], np.asfortranarray(x)):
        got = multireduce.mean(view, axis=1)
        assert _bits(got) == _bits(multireduce.stats(view, axis=1).mean)
        assert all(abs(Fraction(float(g)) - exact) <= exact * Fraction(2, 2**52) for g in got)


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype(("<f4", {"a": ("<i4", 0)})),  # compares equal to float32
        np.dtype(("<i8", {"lo": ("<i4", 0), "hi": ("<i4", 4)})),  # compares equal to int64
        np.dtype([("a", "<f8")]),
    ],
)
def test_structured_dtypes_are_refused_even_when_equal_to_a_supported_one(dtype):
    # np.dtype(("<f4", {"a": ("<i4", 0)})) == np.float32 is True, so a membership test alone
    # let it through: mpi.allreduce then failed with a bare KeyError and dask.stats with
    # "structures must have the same size". A dtype with fields is refused by the dtype check.
    x = np.zeros(3, dtype)
    for call in (
        lambda: multireduce.sum(x),
        lambda: multireduce.reduce(x, "sum"),
        lambda: multireduce.partial(x, "sum"),
    ):
        with pytest.raises(TypeError, match=r"has fields"):
            call()


def test_registered_ops_pickle_by_name_to_the_same_object():
    # Dask's distributed pickles the Op with every task. Plain pickle refused the ops built from
    # local functions (max, min, any, ...), so cloudpickle sent them by value and a worker's
    # copy was not OPS[name]. They now travel by name.
    import pickle

    from multireduce.ops import OPS

    for name, op in OPS.items():
        data = pickle.dumps(op)
        assert len(data) < 100, (name, len(data))
        assert pickle.loads(data) is op, name
