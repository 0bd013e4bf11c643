"""multireduce.dask.treereduce: against NumPy-independent references and against Dask's own
reductions, over chunkings, split_every values, NaN, empty chunks, the threaded and sync
schedulers, a distributed LocalCluster (threads), and a worker killed mid-reduction (processes).

GPU tests (CuPy-backed Dask arrays) are at the end, marked ``gpu``.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

da = pytest.importorskip("dask.array")
import dask  # noqa: E402
from reference import check, exact_int_sum, ieee_extreme, make_data, numpy_var_warnings, same_float  # noqa: E402

import multireduce  # noqa: E402
import multireduce.dask as mdask  # noqa: E402
from multireduce import _partials  # noqa: E402

OPS = ["sum", "max", "min"]
DTYPES = ["float32", "float64", "float16", "int8", "uint16", "int64", "bool"]


def _dask_own(x, op):
    return {"sum": x.sum, "max": x.max, "min": x.min}[op]()


# -- values against independent references and against Dask ---------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("chunks", [1000, 333, 64, 7])
def test_1d_against_reference_and_dask(op, dtype, chunks):
    # crc32, not hash(): str hashes change with every process (PYTHONHASHSEED).
    x = make_data(dtype, 1000, np.random.default_rng(zlib.crc32(repr((op, dtype, chunks)).encode())))
    d = da.from_array(x, chunks=chunks)
    got = mdask.treereduce(d, op).compute(scheduler="sync")
    check(x, op, got)
    theirs = _dask_own(d, op).compute(scheduler="sync")
    if np.dtype(dtype).kind == "f":
        # Dask accumulates float32/float16 sums in their own dtype, we in a wider one: compare
        # to Dask within its own error, and exactly for max/min.
        if op == "sum":
            # Dask's float16 partials round at every step: up to ~n * eps16 / 2 of |x| <= 1.
            rel_tol, abs_tol = (1e-2, 0.5) if dtype == "float16" else (1e-5, 1e-3)
            assert math.isclose(float(got), float(theirs), rel_tol=rel_tol, abs_tol=abs_tol)
        else:
            assert same_float(got, theirs)
    else:
        assert got == theirs and got.dtype == np.asarray(theirs).dtype


@pytest.mark.parametrize("split_every", [None, 2, 3, 4, 100, {0: 2, 1: 5}])
@pytest.mark.parametrize("op", OPS)
def test_2d_uneven_chunks_and_split_every(op, split_every):
    x = make_data("float32", 37 * 53, np.random.default_rng(7)).reshape(37, 53)
    d = da.from_array(x, chunks=((5, 1, 20, 11), (13, 13, 27)))
    got = d.treereduce(op, split_every=split_every).compute(scheduler="threads")
    check(x, op, got)


def test_integer_sums_are_exact_and_wrap_like_numpy():
    x = np.random.default_rng(3).integers(-(2**62), 2**62, 5000, dtype=np.int64)
    d = da.from_array(x, chunks=300)
    assert int(d.treereduce("sum").compute()) == exact_int_sum(x, np.int64)
    u = np.full(4000, np.iinfo(np.uint64).max, dtype=np.uint64)
    got = da.from_array(u, chunks=333).treereduce("sum", split_every=3).compute()
    assert got.dtype == np.uint64 and int(got) == exact_int_sum(u, np.uint64)


@pytest.mark.parametrize(
    ("dtype", "requested"),
    [("int8", "int8"), ("int8", "float32"), ("float32", "float64"), ("float64", "int32"), ("bool", "uint8")],
)
def test_sum_dtype_argument(dtype, requested):
    x = make_data(dtype, 3001, np.random.default_rng(11))
    if np.dtype(dtype).kind == "f" and np.dtype(requested).kind in "iu":
        x = (x * 100).astype(dtype)
    d = da.from_array(x, chunks=250)
    got = d.treereduce("sum", dtype=requested).compute()
    want = multireduce.reduce(x, "sum", dtype=requested)  # the core on the whole array
    assert got.dtype == np.dtype(requested)
    if np.dtype(requested).kind in "iu":
        assert got == want
        if np.dtype(dtype).kind in "biu":
            assert int(got) == exact_int_sum(x, requested)
    else:
        assert math.isclose(float(got), math.fsum(x.astype(np.float64).tolist()), rel_tol=1e-6, abs_tol=1e-6)


@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("reproducible", [False, True])
def test_dtype_argument_converts_each_element_first(chunks, reproducible):
    # dtype= converts each element before it is added, in every chunk's partial as in the
    # core (and NumPy): 2049 is 2048 in float16, and 2**-24 + 2**-50 is 2**-24 in float32,
    # after which 1 + 2**-24 is a tie, rounded to even.
    x = np.array([2049, 2049, 2049], dtype=np.int32)
    assert float(np.sum(x, dtype=np.float16)) == 6144.0
    got = da.from_array(x, chunks=chunks).treereduce("sum", dtype=np.float16, reproducible=reproducible).compute()
    assert got.dtype == np.float16 and float(got) == 6144.0
    y = np.array([1.0, 2.0**-24 + 2.0**-50, 0.0])
    got = da.from_array(y, chunks=chunks).treereduce("sum", dtype=np.float32, reproducible=reproducible).compute()
    assert got.dtype == np.float32 and float(got) == 1.0
    if not reproducible:  # partial axes
        cols = da.from_array(np.stack([x, x]).T, chunks=chunks).treereduce("sum", axis=0, dtype=np.float16)
        assert cols.compute().tolist() == [6144.0, 6144.0]


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # as NumPy warns
@pytest.mark.parametrize(("op", "reproducible"), [("sum", False), ("sum", True), ("prod", False), ("nansum", False)])
def test_dtype_argument_converts_float_elements_to_integers_first(op, reproducible):
    # Each chunk's partial skipped the conversion for integer results: [inf, 1.0] summed as
    # int32 gave 1 (NumPy and the core: -2147483647), [3e9, 1.0, -5e9, 2.5] gave -1999999997
    # (NumPy: 3). The reference is NumPy's own reduction with dtype= (its casts of inf, NaN
    # and out-of-range values are this CPU's), and the core on the whole array.
    ref = {"sum": np.sum, "prod": np.prod, "nansum": np.nansum}[op]
    for values in ([np.inf, 1.0], [3e9, 1.0, -5e9, 2.5], [1.7, np.nan, 2.7, -0.5, 3e9, -np.inf]):
        x = np.array(values)
        for requested in (np.int32, np.uint16, np.int8):
            with np.errstate(invalid="ignore", over="ignore"):
                want = ref(x, dtype=requested)
            assert multireduce.reduce(x, op, dtype=requested) == want
            for chunks in (1, 2, x.size):
                d = da.from_array(x, chunks=chunks)
                got = d.treereduce(op, dtype=requested, reproducible=reproducible).compute(scheduler="sync")
                assert got.dtype == np.dtype(requested) and got == want, (values, requested, chunks)
    x = np.array([[np.inf, 1.0, 3e9], [2.5, -5e9, 1.0]])
    with np.errstate(invalid="ignore", over="ignore"):
        want = ref(x, axis=0, dtype=np.int32)
    got = da.from_array(x, chunks=1).treereduce(op, axis=0, dtype=np.int32).compute(scheduler="sync")
    assert got.dtype == np.int32 and got.tolist() == want.tolist()


@pytest.mark.parametrize(
    ("op", "kwargs"),
    [("sum", {}), ("max", {}), ("sum", {"axis": 0}), ("mean", {}), ("argmax", {}), ("sum", {"reproducible": True})],
)
def test_chunks_of_another_dtype_than_declared_are_refused(op, kwargs):
    d = da.ones((4, 2), chunks=2, dtype=np.float32).map_blocks(lambda b: b.astype(np.float64), dtype=np.float32)
    with pytest.raises(TypeError, match="chunk of dtype float64 in a Dask array that declares dtype float32"):
        d.treereduce(op, **kwargs).compute(scheduler="sync")


PYTHON_CHUNK_OPS = [
    ("sum", {}),
    ("max", {}),
    ("nanmin", {"axis": 0}),
    ("mean", {}),
    ("var", {"axis": 0, "correction": 1}),
    ("argmax", {}),
    ("argmin", {"axis": 0}),
    ("sum", {"reproducible": True}),
    ("prod", {"axis": 0}),
]


# Dask's meta of a 0-d da.from_delayed array is an uninitialized np.empty(()), whose bits
# Dask's reduction cast to the result dtype (int64 for argmax): where they happened to be a
# NaN, NumPy warned "invalid value encountered in cast" at random (seen once in a CI-like
# run). treereduce now gives a 0-d array a zero meta (dask._without_data_in_meta; the
# deterministic case: test_a_0d_array_of_nan_or_inf_builds_its_graph_silently).
@pytest.mark.parametrize(("op", "kwargs"), PYTHON_CHUNK_OPS)
def test_python_scalar_and_list_chunks_are_reduced_as_the_core_takes_them(op, kwargs):
    # A chunk that is a Python float or list (da.from_delayed of a function returning one;
    # Dask's own reductions take them) failed when computed with "AttributeError: 'float'
    # object has no attribute 'dtype'". The core takes them through numpy.asarray: so do the
    # chunk steps, and the declared dtype is checked against the converted chunk.
    for value, declared in ((3.5, np.float64), ([1.5, -2.0, 7.25], np.float64), ([4, 1, 9], np.int64)):
        x = np.asarray(value, dtype=declared)
        axis = kwargs.get("axis")
        d = da.from_delayed(dask.delayed(lambda v=value: v)(), shape=x.shape, dtype=declared)
        if x.ndim == 0 and axis is not None:
            continue
        got = d.treereduce(op, **kwargs).compute(scheduler="sync")
        want = multireduce.reduce(x, op, **kwargs)
        assert got.dtype == want.dtype and np.shape(got) == np.shape(want), (value, op)
        assert got == want, (value, op, got, want)
        if op in ("sum", "max", "argmax"):
            assert got == {"sum": np.sum, "max": np.max, "argmax": np.argmax}[op](x)
    # A Python float in an array that declares float32: the declared dtype is not the chunk's.
    lying = da.from_delayed(dask.delayed(lambda: [1.0, 2.0])(), shape=(2,), dtype=np.float32)
    with pytest.raises(TypeError, match="chunk of dtype float64 in a Dask array that declares dtype float32"):
        lying.treereduce(op, **kwargs).compute(scheduler="sync")
    # Anything else is not a chunk multireduce reduces: a TypeError naming its type.
    text = da.from_delayed(dask.delayed(lambda: "ab")(), shape=(2,), dtype=np.float64)
    with pytest.raises(TypeError, match="a chunk of type builtins.str in a Dask array"):
        text.treereduce(op, **kwargs).compute(scheduler="sync")


def test_keepdims_and_full_axis_tuples():
    x = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    d = da.from_array(x, chunks=2)
    kept = d.treereduce("max", keepdims=True)
    assert kept.shape == (1, 1, 1)
    out = kept.compute()
    assert out.shape == (1, 1, 1) and out.dtype == np.int32 and out[0, 0, 0] == 59
    assert d.treereduce("sum", axis=(0, 1, 2)).compute() == 1770
    assert d.treereduce("sum", axis=(-1, 0, 1)).compute() == 1770


# -- NaN, signed zeros, empty chunks, empty arrays -------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("where", [0, 499, 999])
def test_nan_in_one_chunk_propagates(op, where):
    x = make_data("float32", 1000, np.random.default_rng(where))
    x[where] = np.nan
    got = da.from_array(x, chunks=100).treereduce(op, split_every=2).compute()
    assert math.isnan(float(got)) and got.dtype == np.float32


def test_signed_zeros_follow_ieee_across_chunks():
    x = np.array([-0.0, -0.0, 0.0, -0.0], dtype=np.float64)
    d = da.from_array(x, chunks=1)
    assert same_float(d.treereduce("max").compute(), 0.0)
    assert same_float(d.treereduce("min").compute(), -0.0)
    assert same_float(d.treereduce("max").compute(), ieee_extreme(x, largest=True))


@pytest.mark.parametrize("op", OPS)
def test_empty_chunks_contribute_the_identity(op):
    x = make_data("int16", 10, np.random.default_rng(5))
    d = da.from_array(x, chunks=((0, 3, 0, 0, 5, 2, 0),))
    assert 0 in d.chunks[0]
    got = d.treereduce(op, split_every=2).compute()
    check(x, op, got)
    # All negative values: an identity of 0 instead of the lowest value would show for max.
    neg = -np.arange(1, 9, dtype=np.float32)
    dn = da.from_array(neg, chunks=((0, 4, 0, 4, 0),))
    assert float(dn.treereduce("max").compute()) == -1.0


@pytest.mark.parametrize("dtype", [dt.name for dt in multireduce.ops.SUPPORTED_DTYPES])
def test_arg_ops_with_empty_chunks_keep_the_value_dtype(dtype):
    # An empty chunk's state had an int64 value: merged with uint64 values, np.where made them
    # float64 (argmax of uint64 [3, 5] with an empty first chunk gave 0).
    a = np.array([3, 5], dtype=np.uint64)
    assert da.from_array(a, chunks=((0, 1, 1),)).treereduce("argmax").compute() == 1
    rng = np.random.default_rng(zlib.crc32(dtype.encode()))
    if dtype == "bool":
        x = np.zeros((5, 7), dtype=bool)
        x[3, 2] = x[1, 5] = True
    else:
        # Distinct values (no ties, no signed zeros): np.argmax is the reference.
        top = 2**64 - 1 if dtype == "uint64" else (2**63 - 1 if dtype == "int64" else 35)
        x = np.array([top - int(k) for k in rng.permutation(35)], dtype=dtype).reshape(5, 7)
    d = da.from_array(x, chunks=((0, 2, 0, 3), (3, 0, 4, 0)))
    for op, ref in (("argmax", np.argmax), ("argmin", np.argmin)):
        got = d.treereduce(op).compute(scheduler="sync")
        assert got == ref(x), (op, dtype)
        for axis in (0, 1):
            got = d.treereduce(op, axis=axis, split_every=2).compute(scheduler="sync")
            assert got.dtype == np.int64 and got.tolist() == ref(x, axis=axis).tolist(), (op, axis, dtype)


def test_empty_array():
    d = da.zeros((0, 4), dtype=np.float32, chunks=2)
    got = d.treereduce("sum").compute()
    assert got == 0 and got.dtype == np.float32
    for op in ("max", "min"):
        with pytest.raises(ValueError, match="zero-size array"):
            d.treereduce(op)  # the size is known: at once, as NumPy


def test_unknown_chunk_sizes_empty_raises_when_computed():
    x = da.from_array(np.arange(20, dtype=np.float64), chunks=5)
    none = x[x > 100]  # unknown chunk sizes, all empty
    assert math.isnan(none.size)
    lazy = none.treereduce("max")  # cannot know yet
    with pytest.raises(ValueError, match="zero-size array to reduction operation maximum"):
        lazy.compute()
    assert none.treereduce("sum").compute() == 0.0
    some = x[x > 12]
    assert some.treereduce("min").compute() == 13.0
    assert some.treereduce("sum").compute() == sum(range(13, 20))


@pytest.mark.parametrize(
    ("op", "name"), [("max", "maximum"), ("min", "minimum"), ("nanmax", "fmax"), ("nanmin", "fmin")]
)
def test_max_min_over_an_axis_of_unknown_size_raise_when_it_turns_out_empty(op, name):
    # The reduced axis' size is known only when computed; when it turned out empty the
    # result was the identity (-9223372036854775808 for max of int64) instead of NumPy's
    # error. axis=None raised already.
    message = f"zero-size array to reduction operation {name} which has no identity"
    z = da.from_array(np.arange(6).reshape(2, 3), chunks=1)
    empty = z[z[:, 0] > 100]  # shape (nan, 3): no row left
    for keepdims in (False, True):
        for split_every in (None, 2):
            lazy = empty.treereduce(op, axis=0, keepdims=keepdims, split_every=split_every)
            with pytest.raises(ValueError, match=message):
                lazy.compute(scheduler="sync")
    with pytest.raises(ValueError, match=message):
        empty.treereduce(op).compute(scheduler="sync")
    # Rows of unknown count that are there: NumPy's values, over one and two axes.
    x = np.random.default_rng(3).permutation(120).reshape(4, 6, 5).astype(np.float32) - 60
    x[1, 2, 3] = np.nan
    d = da.from_array(x, chunks=(1, 4, 2))
    keep = np.array([True, False, True, True])
    some = d[da.from_array(keep, chunks=1)]  # shape (nan, 6, 5)
    y = x[keep]
    ref = getattr(np, op)
    for axis in (0, (0, 2), (0, 1), 1, (1, 2)):
        for keepdims in (False, True):
            got = some.treereduce(op, axis=axis, keepdims=keepdims, split_every=2).compute(scheduler="sync")
            want = ref(y, axis=axis, keepdims=keepdims)
            assert got.dtype == np.float32 and got.shape == want.shape, (axis, keepdims)
            assert np.array_equal(got, want, equal_nan=True), (axis, keepdims)
    none = d[da.from_array(np.zeros(4, bool), chunks=1)]
    with pytest.raises(ValueError, match=message):
        none.treereduce(op, axis=(0, 2)).compute(scheduler="sync")
    assert none.treereduce(op, axis=(1, 2)).compute(scheduler="sync").shape == (0,)  # nothing reduced over 0
    # A reduced axis known to be empty next to one of unknown size: at once.
    with pytest.raises(ValueError, match=message):
        some[:, :0].treereduce(op, axis=(0, 1))


def test_unknown_chunk_sizes_arg_ops_refused_at_build_time_stats_work():
    # argmin/argmax over an axis of unknown chunk sizes failed when computed ("cannot convert
    # float NaN to integer", a TypeError for axis=None); stats over a kept axis of unknown
    # size failed in its final reshape. The global index needs the chunks' offsets: refused
    # at once, naming the remedy; everything else works.
    x = np.arange(24.0).reshape(6, 4) % 7
    d = da.from_array(x, chunks=2)
    rows = d[d[:, 0] > 1]  # shape (nan, 4)
    y = x[x[:, 0] > 1]
    assert math.isnan(rows.shape[0])
    for op in ("argmax", "argmin"):
        for axis in (None, 0, -2):
            with pytest.raises(ValueError, match=r"unknown chunk sizes .*x\.compute_chunk_sizes\(\)"):
                rows.treereduce(op, axis=axis)
        ref = getattr(np, op)
        # Along the known axis the offsets are known: per-row indices.
        got = rows.treereduce(op, axis=1).compute(scheduler="sync")
        assert got.dtype == np.int64 and got.tolist() == ref(y, axis=1).tolist()
        known = d[d[:, 0] > 1].compute_chunk_sizes()  # (in place: a new array, not rows)
        assert known.treereduce(op).compute() == ref(y)
        assert known.treereduce(op, axis=0).compute().tolist() == ref(y, axis=0).tolist()
    for axis in (None, 0, 1, (0, 1)):
        got = mdask.stats(rows, axis=axis, correction=1).compute(scheduler="sync")
        with np.errstate(all="ignore"):
            want = {
                "count": np.sum(np.ones_like(y), axis=axis).astype(np.int64),
                "sum": np.sum(y, axis=axis),
                "min": np.min(y, axis=axis),
                "max": np.max(y, axis=axis),
                "mean": np.mean(y, axis=axis),
                "var": np.var(y, axis=axis, ddof=1),
            }
        for name, value in want.items():
            assert np.shape(getattr(got, name)) == np.shape(value), (axis, name)
            np.testing.assert_allclose(getattr(got, name), value, rtol=1e-12, err_msg=f"{axis} {name}")
    np.testing.assert_allclose(rows.treereduce("var", axis=1).compute(), np.var(y, axis=1), rtol=1e-12)
    with pytest.raises(ValueError, match="zero-size array to stats"):  # all rows dropped: as the core
        mdask.stats(d[d[:, 0] > 100], axis=0).compute(scheduler="sync")


# -- errors --------------------------------------------------------------------------------


def test_errors():
    d = da.ones((4, 4), chunks=2)
    with pytest.raises(TypeError, match="argmax takes axis=None or a single int"):
        d.treereduce("argmax", axis=(0, 1))
    with pytest.raises(TypeError, match="does not take correction"):
        d.treereduce("mean", correction=1)
    with pytest.raises(ValueError, match="attempt to get argmin of an empty sequence"):
        da.ones((3, 0), chunks=2).treereduce("argmin", axis=1)
    with pytest.raises(np.exceptions.AxisError):
        d.treereduce("sum", axis=(0, 5))
    with pytest.raises(TypeError, match="dask.array.Array"):
        mdask.treereduce(np.ones(3), "sum")
    with pytest.raises(TypeError, match="does not take dtype"):
        d.treereduce("max", dtype=np.float64)
    with pytest.raises(TypeError, match="complex128"):
        da.ones(3, dtype=np.complex128, chunks=1).treereduce("sum")
    with pytest.raises(ValueError, match="unknown op"):
        d.treereduce("median")


def test_masked_chunks_are_refused_when_the_graph_is_built(tmp_path):
    # Masked chunks were reduced with their masks ignored: a sum of 1003.0 for NumPy's 3.0.
    m = np.ma.masked_array([1.0, 2.0, 1000.0], mask=[0, 0, 1])
    xm = da.ma.masked_array(da.from_array(m.data, chunks=2), mask=m.mask)
    assert float(xm.sum().compute()) == float(np.sum(m)) == 3.0  # Dask's own masked sum
    message = r"cannot reduce a Dask array of numpy\.ma\.MaskedArray chunks: .* ignore the mask"
    for op, kw in (("sum", {}), ("max", {"axis": 0}), ("mean", {}), ("argmax", {}), ("sum", {"reproducible": True})):
        with pytest.raises(TypeError, match=message):
            xm.treereduce(op, **kw)
    with pytest.raises(TypeError, match=message):
        mdask.stats(xm)
    # Chunks that turn out masked under a plain meta: the core refuses each one when computed.
    lying = da.from_array(m.data, chunks=2).map_blocks(
        lambda b: np.ma.masked_array(b, mask=b > 100), meta=np.empty((0,), np.float64)
    )
    with pytest.raises(TypeError, match=r"cannot reduce a numpy\.ma\.MaskedArray"):
        lying.treereduce("sum").compute(scheduler="sync")
    # Memmap chunks (an ndarray subclass of plain elements) are reduced as before.
    np.arange(10.0).tofile(tmp_path / "data.bin")
    mapped = da.from_array(np.memmap(tmp_path / "data.bin", dtype=np.float64, mode="r"), chunks=3, asarray=False)
    assert mapped.treereduce("sum").compute() == 45.0 and mapped.treereduce("argmax").compute() == 9


BAD_AXES = [1.0, 2, -3, "1", (0, 0)]


@pytest.mark.parametrize(
    ("op", "axis"),
    [(op, axis) for op in ("argmax", "argmin", "sum", "max", "mean") for axis in BAD_AXES]
    + [(op, axis) for op in ("argmax", "argmin") for axis in ((1,), [1], (0, 1))],
)
def test_bad_axes_raise_the_cores_errors(op, axis):
    # argmax with axis=1.0 said "'float' object is not iterable"; the core (and NumPy) say
    # "'float' object cannot be interpreted as an integer". Same exception, same message.
    x = np.arange(6.0).reshape(2, 3)
    with pytest.raises((TypeError, ValueError)) as core_error:
        multireduce.reduce(x, op, axis=axis)
    with pytest.raises(type(core_error.value)) as dask_error:
        da.from_array(x, chunks=1).treereduce(op, axis=axis)
    assert str(dask_error.value) == str(core_error.value)


def test_the_core_stats_docstring_names_the_dask_function():
    # It said treereduce(x, "stats"), which raises "unknown op 'stats'".
    doc = multireduce.stats.__doc__
    assert 'treereduce(x, "stats")' not in doc and "``multireduce.dask.stats``" in doc
    x = np.arange(10.0)
    assert mdask.stats(da.from_array(x, chunks=3)).compute().var == multireduce.stats(x).var == 8.25
    with pytest.raises(ValueError, match="unknown op 'stats'"):
        da.from_array(x, chunks=3).treereduce("stats")


def test_importing_multireduce_does_not_import_dask_and_the_import_registers_the_method():
    code = (
        "import sys, multireduce, multireduce.stream; assert 'dask' not in sys.modules and 'cupy' not in sys.modules;"
        "import dask.array as da; assert not hasattr(da.Array, 'treereduce');"
        "import multireduce.dask; assert da.ones(4, chunks=2).treereduce().compute() == 4; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_method_docstring_and_identity():
    assert da.Array.treereduce.__doc__ == mdask.treereduce.__doc__
    mdask._register()  # registering again is fine


# -- graph shape, determinism, meta ----------------------------------------------------------


def test_split_every_controls_the_tree():
    d = da.ones(64, chunks=4)  # 16 chunks
    one_level = dict(d.treereduce("sum", split_every=16).__dask_graph__())
    two_level = dict(d.treereduce("sum", split_every=4).__dask_graph__())
    assert not any("partial" in str(k) for k in one_level)
    assert any("partial" in str(k) for k in two_level)


def _tree_shape(lazy):
    """(combine tasks, aggregate tasks) in the graph of a treereduce result."""
    names = [k[0] if isinstance(k, tuple) else k for k in dict(lazy.__dask_graph__())]
    keys = [k for k in names if k.startswith("treereduce-")]
    return sum("-partial-" in k for k in keys), sum("-aggregate-" in k for k in keys)


def _fan_ins(lazy) -> list[int]:
    """The number of partials each combine and aggregate task of a treereduce result takes."""

    def count(arg) -> int:
        if isinstance(arg, list):
            return sum(count(a) for a in arg)
        return 1  # a key

    out = []
    for key, task in dict(lazy.__dask_graph__()).items():
        name = key[0] if isinstance(key, tuple) else key
        if name.startswith("treereduce-") and ("-partial-" in name or "-aggregate-" in name):
            out.append(count(task[1]))
    return out


@pytest.mark.parametrize(
    ("shape", "chunks", "axis", "n", "tree"),
    [
        ((2, 16), (1, 2), None, 16, (0, 1)),  # blocks (2, 8): Dask's rule gave 4 per axis
        ((2, 16), (1, 2), None, 15, None),
        ((2, 3, 4), 1, None, 24, (0, 1)),
        ((2, 3, 4), 1, None, 23, None),
        ((4, 6, 10), (1, 2, 5), (0, 1), 12, (0, 2)),  # 12 partials for each of 2 kept blocks
        ((4, 6, 10), (1, 2, 5), (0, 1), 11, None),
        ((4, 6, 10), (1, 2, 5), (1, 2), 6, (0, 4)),
        ((4, 6, 10), (1, 2, 5), 2, None, (0, 12)),  # the default of axis reductions, 4
        ((4, 6, 10), (1, 2, 5), (1, 2), None, None),  # 6 partials each: more than 4
    ],
)
def test_an_int_split_every_of_at_least_the_reduced_chunks_takes_one_aggregate(shape, chunks, axis, n, tree):
    # An int n is the most partials one task takes; where the chunks along the reduced axes
    # number at most n, one aggregate takes them all (Dask's own rule splits n into
    # int(n ** (1 / len(axes))) per axis and added a combine level). Beyond, Dask's rule.
    x = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    d = da.from_array(x, chunks=chunks)
    limit = n or mdask.DASK_SPLIT_EVERY
    for op in ("sum", "max", "mean", "argmax"):
        if op == "argmax" and isinstance(axis, tuple):
            continue
        lazy = d.treereduce(op, axis=axis, split_every=n)
        combines, aggregates = _tree_shape(lazy)
        if tree is not None:
            assert (combines, aggregates) == tree, op
        else:
            assert combines > 0, op
        assert max(_fan_ins(lazy)) <= limit, op
        want = multireduce.reduce(x, op, axis=axis)
        assert np.array_equal(lazy.compute(scheduler="sync"), want), op
    if n is not None:  # the dask.config key is read the same way
        given = _tree_shape(d.treereduce("sum", axis=axis, split_every=n))
        with dask.config.set(split_every=n):
            assert _tree_shape(d.treereduce("sum", axis=axis)) == given


# chunks -> combine tasks with the default fan-in of full reductions (64 partials per task)
DEFAULT_FULL_TREE = {1: 0, 15: 0, 16: 0, 17: 0, 64: 0, 65: 2, 200: 4}


@pytest.mark.parametrize(("n_chunks", "combines"), sorted(DEFAULT_FULL_TREE.items()))
def test_default_split_every_of_full_reductions(n_chunks, combines):
    d = da.ones(n_chunks * 3, chunks=3)
    assert mdask.FULL_SPLIT_EVERY == 64
    for op in ("sum", "max", "mean", "var", "argmax"):
        assert _tree_shape(d.treereduce(op)) == (combines, 1), op
    assert _tree_shape(d.treereduce("sum", reproducible=True)) == (combines, 1)
    # The caller's split_every and the dask.config key still decide when given.
    assert (_tree_shape(d.treereduce("sum", split_every=4))[0] > 0) == (n_chunks > 4)
    with dask.config.set(split_every=4):
        assert _tree_shape(d.treereduce("sum")) == _tree_shape(d.treereduce("sum", split_every=4))


def test_default_split_every_over_several_axes():
    # Full reductions: up to 64 blocks in all, one aggregate whatever their layout.
    for shape in ((16, 4), (64, 1), (1, 64), (4, 4, 4), (2, 3, 5, 2)):
        d = da.ones(shape, chunks=1)
        assert _tree_shape(d.treereduce("sum")) == (0, 1), shape
        assert _tree_shape(d.treereduce("argmin")) == (0, 1), shape
    big = da.ones((9, 9), chunks=1)  # 81 blocks: Dask's rule with 64, int(64 ** 0.5) = 8 per axis
    assert _tree_shape(big.treereduce("sum")) == _tree_shape(big.treereduce("sum", split_every=64)) == (4, 1)
    # Axis reductions keep Dask's default of 4: their partials are arrays.
    d = da.ones((48, 6), chunks=(3, 3))  # 16 x 2 blocks
    assert _tree_shape(d.treereduce("sum", axis=0)) == (8, 2)
    assert _tree_shape(d.treereduce("mean", axis=0)) == (8, 2)


@pytest.mark.parametrize("n_chunks", sorted(DEFAULT_FULL_TREE))
def test_default_split_every_values(n_chunks):
    rng = np.random.default_rng(n_chunks)
    sizes = rng.integers(0, 5, n_chunks)
    sizes[0] += 1
    n = int(sizes.sum())
    chunks = (tuple(int(s) for s in sizes),)
    # float32 integers: every partial sum is exact, so any tree gives the exact sum.
    exact = (rng.integers(-1000, 1000, n)).astype(np.float32)
    d = da.from_array(exact, chunks=chunks)
    got = d.treereduce("sum").compute(scheduler="threads")
    assert got.dtype == np.float32 and float(got) == sum(int(v) for v in exact.tolist())
    x = make_data("float64", n, rng)
    x[rng.integers(n)] = -0.0
    dx = da.from_array(x, chunks=chunks)
    for op in OPS:
        check(x, op, dx.treereduce(op).compute(scheduler="sync"))
    assert same_float(dx.treereduce("max").compute(), np.max(x))
    assert same_float(dx.treereduce("min").compute(), np.min(x))
    assert dx.treereduce("argmin").compute() == np.argmin(x)
    assert dx.treereduce("sum", reproducible=True).compute() == multireduce.sum(x, reproducible=True)
    assert math.isclose(float(dx.treereduce("mean").compute()), float(np.mean(x)), rel_tol=1e-12, abs_tol=1e-15)
    assert math.isclose(float(dx.treereduce("var").compute()), float(np.var(x)), rel_tol=1e-12)
    got, want = mdask.stats(dx).compute(), multireduce.stats(x)
    assert (got.count, got.min, got.max) == (want.count, want.min, want.max)
    i = make_data("int64", n, rng)
    di = da.from_array(i, chunks=chunks)
    assert int(di.treereduce("sum").compute()) == exact_int_sum(i, np.int64)
    assert di.treereduce("max").compute() == np.max(i)


_TOKENIZED = re.compile(r"-[0-9a-f]{32}$")


def _layer_names(lazy) -> list[str]:
    return [name for name in lazy.__dask_graph__().layers if not name.startswith("array-")]


def test_every_key_carries_a_token_of_the_input_and_every_parameter():
    # Two calls share keys only when they compute the same thing: argmin/argmax named two of
    # their layers without a token, so two arrays' argmax computed together gave one answer.
    x = da.from_array(np.array([5.0, 1.0, 9.0, 3.0]), chunks=2)
    y = da.from_array(np.array([0.0, 7.0, 2.0, 1.0]), chunks=2)
    assert dask.compute(x.treereduce("argmax"), y.treereduce("argmax"), scheduler="sync") == (2, 1)
    assert dask.compute(x.treereduce("argmin"), x.treereduce("argmax"), scheduler="sync") == (1, 2)
    z = da.from_array(np.arange(12.0).reshape(3, 4) % 5, chunks=2)
    variants = [
        (z, "argmax", {}),
        (z, "argmax", {"axis": 0}),
        (z, "argmax", {"axis": 1}),
        (z, "argmax", {"axis": 1, "keepdims": True}),
        (z, "argmax", {"axis": 1, "split_every": 2}),
        (z, "argmin", {"axis": 1}),
        (z.T, "argmax", {"axis": 1}),
        (z, "var", {"axis": 1}),
        (z, "var", {"axis": 1, "correction": 1}),
        (z, "std", {"axis": 1}),
        (z, "mean", {}),
        (z, "sum", {}),
        (z, "sum", {"dtype": np.float32}),
        (z, "sum", {"axis": 0}),
        (z, "sum", {"reproducible": True}),
    ]
    lazies = [a.treereduce(op, **kw) for a, op, kw in variants]
    for lazy in lazies:
        for name in _layer_names(lazy):
            assert _TOKENIZED.search(name), name
    assert len({lazy.name for lazy in lazies}) == len(lazies)
    # The same call gives the same keys (deterministic: distributed reuses them).
    assert [a.treereduce(op, **kw).name for a, op, kw in variants] == [lazy.name for lazy in lazies]
    got = dask.compute(*lazies, scheduler="sync")
    for (a, op, kw), value in zip(variants, got, strict=True):
        want = multireduce.reduce(a.compute(), op, **{k: v for k, v in kw.items() if k != "split_every"})
        np.testing.assert_allclose(np.asarray(value), np.asarray(want), rtol=1e-12)
        assert np.shape(value) == np.shape(want)
    stats = [mdask.stats(z, axis=1), mdask.stats(z, axis=0), mdask.stats(z, axis=0, correction=1), mdask.stats(z.T)]
    keys = [s.key for s in stats]
    assert len(set(keys)) == len(keys) and all(_TOKENIZED.search(k) for k in keys)
    assert mdask.stats(z, axis=1).key == keys[0]


_GRAPH_KEYS_CODE = """
import numpy as np, dask.array as da, multireduce.dask as mdask
x = da.from_array(np.arange(60.0).reshape(6, 10) % 7, chunks=(4, 3))
calls = [x.treereduce(op, axis=axis) for op in multireduce.OPS for axis in (None, 1)]
calls += [x.treereduce("sum", reproducible=True), x.treereduce("sum", dtype=np.float32, split_every=2)]
calls += [mdask.stats(x), mdask.stats(x, axis=0, correction=1)]
print(sorted(map(str, set().union(*(c.__dask_graph__().keys() for c in calls)))))
"""


def test_the_same_calls_in_two_processes_give_the_same_keys():
    # distributed reuses keys across clients and calls: every key of a call's graph (stats'
    # too) depends only on the call, not on the process or its hash seed.
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        code = "import multireduce" + _GRAPH_KEYS_CODE
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        outs.append(out.stdout)
    assert outs[0] == outs[1] and "treereduce-stats-finalize-" in outs[0]


@pytest.mark.parametrize("axis", [None, 0, (0, 1)])
def test_the_same_stats_call_gives_the_same_graph(axis):
    # stats' last key was a token, but it depended on a key that Dask's delayed of an array
    # names at random (finalize-hlgfinalizecompute-<uuid>): two builds of one call had one
    # final key over different tasks (distributed: "Detected different `run_spec`").
    from dask.base import tokenize

    z = da.from_array(np.arange(60.0).reshape(6, 10) % 7, chunks=(4, 3))
    a, b = dict(mdask.stats(z, axis=axis).__dask_graph__()), dict(mdask.stats(z, axis=axis).__dask_graph__())
    assert a.keys() == b.keys()
    assert all(tokenize(a[key]) == tokenize(b[key]) for key in a)
    # and the graph is optimized as the array's would be: the input's tasks fused into the chunks'
    assert not [key for key in a if isinstance(key, tuple) and key[0] == z.name]


@pytest.mark.parametrize("op", ["argmax", "argmin", "sum", "var", "max"])
def test_a_shared_key_is_the_same_task_whatever_the_config_split_every(op):
    # argmin/argmax's last layer was named from the split_every argument, not the fan-in in
    # force: under another dask.config split_every the same call made a different tree whose
    # last key was the same name (one of the two graphs' task won when computed together).
    from dask.core import get_dependencies

    x = da.from_array(np.arange(64.0) % 7, chunks=4)
    with dask.config.set(split_every=2):
        narrow = x.treereduce(op)
    wide = x.treereduce(op)
    a, b = dict(narrow.__dask_graph__()), dict(wide.__dask_graph__())
    assert narrow.name != wide.name
    for key in a.keys() & b.keys():  # shared keys (the input's, argmin's chunk states) depend on the same keys
        assert get_dependencies(a, key) == get_dependencies(b, key), key
    got = dask.compute(narrow, wide, scheduler="sync")
    want = multireduce.reduce(x.compute(), op)
    assert got[0] == got[1] == want


def test_same_chunking_gives_the_same_bits_on_every_scheduler():
    x = make_data("float32", 100_000, np.random.default_rng(9))
    d = da.from_array(x, chunks=3000)
    results = {
        s: d.treereduce("sum", split_every=3).compute(scheduler=s).tobytes() for s in ("sync", "threads", "sync")
    }
    assert len(set(results.values())) == 1


def test_meta_is_not_reduced():
    # The placeholder call must not reach the core (it would reduce an empty placeholder).
    d = da.from_array(np.arange(6, dtype=np.uint8), chunks=2)
    r = d.treereduce("max")
    assert r.dtype == np.uint8 and r.shape == ()
    assert isinstance(r._meta, np.ndarray)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("reproducible", [False, True])
def test_results_of_0d_arrays_are_numpy_scalars_as_numpys(reproducible):
    # A 0-d array's full reduction with keepdims=True is a NumPy scalar in NumPy and the
    # core; the reproducible sum and mean gave a 0-d ndarray (every other op a scalar).
    x = np.array(2.5)
    for op in ("sum", "mean", "max", "var", "argmax", "any", "nansum", "prod"):
        for keepdims in (False, True):
            try:
                want = multireduce.reduce(x, op, keepdims=keepdims, reproducible=reproducible)
            except NotImplementedError:  # reproducible=True of var, prod, nansum: the core refuses
                continue
            ref = getattr(np, op)(x, keepdims=keepdims)
            got = da.from_array(x).treereduce(op, keepdims=keepdims, reproducible=reproducible).compute()
            assert type(got) is type(ref) is type(want), (op, keepdims, type(got), type(ref))
            assert got == ref and np.shape(got) == np.shape(ref) == ()


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 300),
    chunk=st.integers(1, 50),
    split_every=st.integers(2, 6),
    op=st.sampled_from(OPS),
    seed=st.integers(0, 2**16),
)
def test_property_matches_reference(n, chunk, split_every, op, seed):
    x = make_data("float64", n, np.random.default_rng(seed))
    d = da.from_array(x, chunks=chunk)
    if n == 0 and op != "sum":
        with pytest.raises(ValueError):
            d.treereduce(op)
        return
    check(x, op, d.treereduce(op, split_every=split_every).compute(scheduler="sync"))


# -- progress ------------------------------------------------------------------------------


def test_progress_bar(capsys):
    from dask.diagnostics import ProgressBar

    d = da.ones(1000, chunks=10)
    with ProgressBar(dt=0.001):
        assert d.treereduce().compute(scheduler="threads") == 1000
    assert "100%" in capsys.readouterr().out


# -- partials ------------------------------------------------------------------------------


def test_stream_id_tells_per_thread_default_streams_apart():
    # cudaStreamPerThread (handle 2) names a different stream in each thread: per-stream
    # caches (the backend's workspaces, the MPI slots, the partials' stream keys) key it by
    # thread as well; every other handle is one stream for all threads.
    from concurrent.futures import ThreadPoolExecutor

    here = _partials.stream_id(2)
    assert here == _partials.stream_id(2) and here != 2
    with ThreadPoolExecutor(1) as pool:
        there = pool.submit(_partials.stream_id, 2).result()
        others = pool.submit(lambda: [_partials.stream_id(h) for h in (0, 1, 0x7F00DEAD)]).result()
    assert there != here
    assert others == [0, 1, 0x7F00DEAD] == [_partials.stream_id(h) for h in (0, 1, 0x7F00DEAD)]


def test_partials_pickle_and_flatten():
    p = _partials.wrap(np.float64(1.5), 3)
    q = pickle.loads(pickle.dumps(p))
    assert q.value == 1.5 and q.n == 3 and q.event is None
    assert [r.n for r in _partials.flatten([[p, [q]], (p,)])] == [3, 3, 3]
    with pytest.raises(TypeError, match="expected multireduce partials"):
        _partials.flatten([p, 1.0])


# -- distributed --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thread_client():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.mark.parametrize("op", OPS)
def test_local_cluster(thread_client, op):
    x = make_data("float32", 50_000, np.random.default_rng(21))
    x[123] = -5.0
    d = da.from_array(x, chunks=4096)
    got = thread_client.compute(d.treereduce(op, split_every=3)).result(timeout=60)
    check(x, op, got)
    assert got == d.treereduce(op, split_every=3).compute(scheduler="sync")


def test_local_cluster_argmax_of_two_arrays_at_once(thread_client):
    # Distributed refused the shared keys ("Detected different run_spec") or mixed the results.
    x = np.arange(24.0).reshape(4, 6) % 7
    y = x[::-1, ::-1].copy()
    dx, dy = da.from_array(x, chunks=(2, 4)), da.from_array(y, chunks=(3, 2))
    futures = thread_client.compute([dx.treereduce("argmax", axis=1), dy.treereduce("argmax", axis=1)])
    got = [f.result(timeout=60) for f in futures]
    assert got[0].tolist() == np.argmax(x, axis=1).tolist() and got[1].tolist() == np.argmax(y, axis=1).tolist()


def test_local_cluster_progress(thread_client, capsys):
    from distributed import progress

    d = da.ones(200, chunks=10)
    fut = thread_client.compute(d.treereduce())
    progress(fut, notebook=False)
    assert fut.result(timeout=60) == 200
    # The bar was drawn, to its end (the test checked only the result).
    assert "100% Completed" in capsys.readouterr().out
    fut = thread_client.compute(mdask.stats(d))
    progress(fut, notebook=False)
    assert fut.result(timeout=60).sum == 200
    assert "100% Completed" in capsys.readouterr().out


def test_local_cluster_stats_twice_is_one_task(thread_client):
    # The second compute of the same stats call reused the final key over another dependency
    # (a randomly named one): the scheduler warned "Detected different `run_spec`".
    x = np.arange(120.0).reshape(12, 10) % 11
    d = da.from_array(x, chunks=(5, 4))
    first = thread_client.compute(mdask.stats(d, axis=0))
    np.testing.assert_allclose(first.result(timeout=60).mean, x.mean(axis=0), rtol=1e-14)
    second = thread_client.compute(mdask.stats(d, axis=0))
    assert second.key == first.key
    np.testing.assert_allclose(second.result(timeout=60).var, x.var(axis=0), rtol=1e-14)
    logs = [msg for _, msg in thread_client.get_scheduler_logs(n=1000) if str(first.key) in msg]
    assert not [msg for msg in logs if "different `run_spec`" in msg], logs[0]


def test_process_cluster_every_op_gives_the_threaded_bits_and_chunk_errors_arrive_whole():
    # The thread cluster above never pickles: here partials, states and Op objects cross
    # process boundaries (Ops by value: most hold local functions), for every op.
    distributed = pytest.importorskip("distributed")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((20, 13)).astype(np.float32)
    d = da.from_array(x, chunks=((8, 0, 12), (5, 0, 8)))  # empty chunks
    u = d[d[:, 0] > 0]  # unknown chunk sizes along axis 0
    lazies = [
        a.treereduce(op, axis=axis)
        for op in multireduce.OPS
        for a in (d, u)
        for axis in (None, 1)
        if not (a is u and multireduce.OPS[op].kind == "arg" and axis is None)
    ]
    lazies += [d.astype(np.int8).treereduce("sum", axis=0), d.treereduce("sum", reproducible=True), mdask.stats(u)]
    bad = d.map_blocks(lambda b: b.astype(np.float64), dtype=np.float32)
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        distributed.Client(cluster, timeout=60) as client,
    ):
        got = client.gather(client.compute(lazies), errors="raise")
        for op in ("sum", "max", "var", "argmax"):
            with pytest.raises(TypeError, match="a chunk of dtype float64 in a Dask array that declares dtype float32"):
                client.compute(bad.treereduce(op, axis=0)).result(timeout=60)
    want = dask.compute(*lazies, scheduler="threads")
    for g, w in zip(got[:-1], want[:-1], strict=True):
        _bits_equal(np.asarray(g), np.asarray(w))
    for name in ("count", "sum", "min", "max", "mean", "var"):
        _bits_equal(np.asarray(getattr(got[-1], name)), np.asarray(getattr(want[-1], name)))


def test_worker_killed_mid_reduction_gives_the_correct_result(tmp_path):
    distributed = pytest.importorskip("distributed")
    n_chunks, delay = 12, 0.4
    runs = str(tmp_path)

    def slow(block, block_info=None):
        # One file per start: a chunk that runs twice was lost with the killed worker.
        open(os.path.join(runs, f"{block_info[0]['chunk-location'][0]}-{time.monotonic_ns()}"), "w").close()
        time.sleep(delay)
        return block

    x = np.arange(n_chunks * 1000, dtype=np.int64) % 977
    d = da.from_array(x, chunks=1000).map_blocks(slow, dtype=x.dtype)
    # Every kind of partial crosses the workers' process boundary and is recomputed: fold
    # values, moments and arg states, exact accumulators. (Not stats: its Delayed's graph is
    # optimized apart from the arrays', so it would run the chunks a second time anyway.)
    lazies = [
        d.treereduce("sum", split_every=3),
        d.treereduce("argmax", split_every=3),
        d.treereduce("var", split_every=3),
        d.astype(np.float64).treereduce("sum", reproducible=True, split_every=3),
    ]
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        distributed.Client(cluster, timeout=60) as client,
    ):
        client.wait_for_workers(2, timeout=60)
        pids = client.run(os.getpid)
        futures = client.compute(lazies)
        # Kill a worker once it has finished some chunks (their results die with it) while
        # others are still to come. (A chunk of d, not any key: the input's pieces are done at
        # once, before any chunk has started.)
        deadline = time.monotonic() + 30
        victim = next(iter(pids))
        while time.monotonic() < deadline:
            if client.run_on_scheduler(
                lambda dask_scheduler, w=victim, name=d.name: (
                    w in dask_scheduler.workers and any(ts.key[0] == name for ts in dask_scheduler.workers[w].has_what)
                )
            ):
                break
            time.sleep(0.05)
        else:
            pytest.fail("no chunk finished within 30 s")
        assert not any(f.done() for f in futures)
        os.kill(pids[victim], signal.SIGKILL)
        total, argmax, var, exact = (f.result(timeout=90) for f in futures)
    # The kill cost work: some chunk started again (the test checked only the result; each
    # chunk runs once where no worker is lost).
    started = [name.split("-")[0] for name in os.listdir(runs)]
    assert len(started) > n_chunks and set(started) == {str(i) for i in range(n_chunks)}
    assert int(total) == exact_int_sum(x, np.int64) and total.dtype == np.int64
    plain = da.from_array(x, chunks=1000)  # the same chunks and tree, no worker lost: the same bits
    assert argmax == np.argmax(x) and var == plain.treereduce("var", split_every=3).compute(scheduler="sync")
    np.testing.assert_allclose(var, np.var(x), rtol=1e-14)
    assert exact == multireduce.sum(x.astype(np.float64), reproducible=True)


# -- GPU -------------------------------------------------------------------------------------


def _cupy():
    return pytest.importorskip("cupy")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "uint8", "bool"])
@pytest.mark.parametrize("op", OPS)
def test_gpu_cupy_chunks(op, dtype):
    cupy = _cupy()
    x = make_data(dtype, 100_003, np.random.default_rng(4))
    d = da.from_array(cupy.asarray(x), chunks=7000, asarray=False)
    for split_every in (None, 2, 100):
        got = d.treereduce(op, split_every=split_every).compute(scheduler="threads")
        assert isinstance(got, cupy.ndarray) and got.shape == ()
        check(x, op, got.get()[()])


@pytest.mark.gpu
def test_gpu_cupy_chunks_stats():
    """multireduce.dask.stats over CuPy chunks: each chunk's state from the GPU moments kernel,
    merged on the host; the same values as the core on the whole array (NumPy)."""
    cupy = _cupy()
    x = make_data("float32", 100_003, np.random.default_rng(6))
    x[777] = np.nan
    d = da.from_array(cupy.asarray(x), chunks=7000, asarray=False)
    got = mdask.stats(d, correction=1).compute(scheduler="threads")
    want = multireduce.stats(x, correction=1)
    assert int(got.count) == want.count and int(got.nan_count) == want.nan_count == 1
    assert all(math.isnan(float(v)) for v in (got.sum, got.min, got.max, got.mean, got.var))
    clean = np.nan_to_num(x, nan=0.5)
    got = mdask.stats(da.from_array(cupy.asarray(clean), chunks=7000, asarray=False)).compute()
    want = multireduce.stats(clean)
    assert float(got.min) == float(want.min) and float(got.max) == float(want.max)
    for field in ("sum", "mean", "var"):
        assert math.isclose(float(getattr(got, field)), float(getattr(want, field)), rel_tol=1e-5), field


@pytest.mark.gpu
def test_gpu_cupy_nan_empty_chunks_and_keepdims():
    cupy = _cupy()
    x = make_data("float64", 1000, np.random.default_rng(8))
    d = da.from_array(cupy.asarray(x), chunks=((0, 400, 0, 600),), asarray=False)
    check(x, "min", d.treereduce("min").compute().get()[()])
    kept = d.reshape(10, 100).treereduce("sum", keepdims=True).compute()
    assert kept.shape == (1, 1)
    x[500] = np.nan
    dn = da.from_array(cupy.asarray(x), chunks=100, asarray=False)
    assert math.isnan(float(dn.treereduce("max").compute()))
    empty = da.from_array(cupy.zeros(0, dtype=cupy.float32), chunks=1, asarray=False)
    with pytest.raises(ValueError):
        empty.treereduce("max")


@pytest.mark.gpu
def test_gpu_cupy_chunks_max_over_an_axis_of_unknown_size():
    # The counted path of max/min over axes of unknown size: partials stay on the GPU.
    cupy = _cupy()
    x = np.random.default_rng(5).permutation(60).reshape(6, 10).astype(np.float32)
    d = da.from_array(cupy.asarray(x), chunks=(2, 4), asarray=False)
    keep = np.array([True, False, True, True, False, True])
    some = d[da.from_array(cupy.asarray(keep), chunks=2, asarray=False)]
    assert math.isnan(some.shape[0])
    for op in ("max", "nanmin"):
        got = some.treereduce(op, axis=0).compute(scheduler="threads")
        assert isinstance(got, cupy.ndarray)
        assert cupy.asnumpy(got).tolist() == getattr(np, op)(x[keep], axis=0).tolist()
    none = d[da.from_array(cupy.zeros(6, dtype=bool), chunks=2, asarray=False)]
    with pytest.raises(ValueError, match="zero-size array to reduction operation maximum"):
        none.treereduce("max", axis=0).compute(scheduler="threads")


@pytest.mark.gpu
def test_gpu_partials_from_other_streams_are_waited_for():
    # Partials made on busy non-blocking streams, combined on the default stream: without the
    # event wait the combine would read unwritten memory.
    cupy = _cupy()
    op = multireduce.get_op("sum")
    parts, expected = [], 0
    for k in range(8):
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            big = cupy.full(2**26, k + 1, dtype=cupy.int32)  # keeps the stream busy
            parts.append(_partials.wrap(_partials.of_array(big, op, np.dtype(np.int64)), big.size, s))
        expected += (k + 1) * 2**26
    got = _partials.finalize(parts, op, np.dtype(np.int64))
    assert int(got) == expected
    q = pickle.loads(pickle.dumps(parts[0]))  # waits for the event, then drops it
    assert q.event is None and int(q.value) == 2**26


@pytest.mark.gpu
def test_gpu_local_cluster_cupy_chunks(thread_client):
    cupy = _cupy()
    x = make_data("float32", 200_000, np.random.default_rng(12))
    d = da.from_array(cupy.asarray(x), chunks=20_000, asarray=False)
    got = thread_client.compute(d.treereduce("sum")).result(timeout=120)
    check(x, "sum", cupy.asnumpy(got)[()])


BAD_SPLIT_EVERY = [
    ({0: 1, 1: 1}, ValueError, r"split_every\[0\] must be an int >= 2"),  # 45.0: partials left uncombined
    ({0: 1}, ValueError, r"split_every\[0\] must be an int >= 2"),  # 123.0
    ({7: 2}, np.exceptions.AxisError, "split_every has the key 7, not an axis of x"),  # ignored
    ({-3: 2}, np.exceptions.AxisError, "split_every has the key -3"),
    ({0: 2, -2: 3}, ValueError, "split_every names axis 0 twice"),
    (-1, ValueError, "got -1 .*at least 2 partials"),  # an error about complex numbers
    (0, ValueError, "got 0"),
    (1, ValueError, "got 1"),
    (True, TypeError, "got True"),
    (2.0, TypeError, "got 2.0"),
    ("4", TypeError, "got '4'"),
    ([2, 2], TypeError, r"got \[2, 2\]"),
    ({0: True}, TypeError, r"split_every\[0\] must be an int >= 2"),
    ({0: 2.5}, TypeError, "got 2.5"),
    ({"a": 2}, TypeError, "got the key 'a'"),
]


@pytest.mark.parametrize(("split_every", "error", "match"), BAD_SPLIT_EVERY)
def test_split_every_is_validated_when_the_graph_is_built(split_every, error, match):
    d = da.from_array(np.arange(24.0).reshape(4, 6), chunks=(1, 2))  # sum 276
    accepted = r"accepts None, an int >= 2, or a dict mapping axes of x \(negative allowed\) to ints >= 2"
    calls = [
        lambda **kw: d.treereduce("sum", **kw),
        lambda **kw: d.treereduce("sum", axis=0, **kw),
        lambda **kw: d.treereduce("max", axis=(0, 1), **kw),
        lambda **kw: d.treereduce("var", **kw),
        lambda **kw: d.treereduce("argmin", axis=1, **kw),
        lambda **kw: d.treereduce("sum", reproducible=True, **kw),
        lambda **kw: mdask.stats(d, axis=1, **kw),
    ]
    for call in calls:
        with pytest.raises(error, match=match) as info:
            call(split_every=split_every)
        assert re.search(accepted, str(info.value))
    if not isinstance(split_every, dict):  # the dask.config key, named as such
        with dask.config.set(split_every=split_every), pytest.raises(error, match="the dask.config key 'split_every'"):
            d.treereduce("sum")


def test_valid_split_every_values():
    x = np.arange(24.0).reshape(4, 6)
    d = da.from_array(x, chunks=(1, 2))
    for split_every in ({-1: 3}, {0: 2}, {0: 2, 1: 2}, 3, np.int64(5), {0: np.int32(2), -1: 2}, 100):
        assert d.treereduce("sum", split_every=split_every).compute() == 276.0, split_every
        assert d.treereduce("argmax", split_every=split_every).compute() == 23, split_every
        got = d.treereduce("sum", axis=0, split_every=split_every).compute()
        assert got.tolist() == x.sum(axis=0).tolist(), split_every
    # A key of an axis that is not reduced is a valid axis: Dask ignores it.
    assert d.treereduce("sum", axis=0, split_every={1: 2}).compute().tolist() == x.sum(axis=0).tolist()


def test_a_huge_fan_in_in_a_dict_is_one_step_along_its_axis():
    # An int past the block count is one aggregate; a dict's value went to Dask unchanged, and
    # its partition_all made a list of that many entries when the graph was built:
    # {0: 10**8} took 15 s and 3.2 GB for a 6 x 4 array, {0: 2**62} raised MemoryError and
    # {0: 2**63} OverflowError.
    x = np.arange(24.0).reshape(6, 4)
    d = da.from_array(x, chunks=2)
    for split_every in ({0: 10**8}, {0: 2**62}, {-2: 2**63}, {0: 10**30, 1: 10**30}):
        # What Dask is given: the block count along axis 0, not the huge fan-in (deterministic;
        # this was a wall-clock limit, and speed is not a unit test's business).
        given = mdask._default_split_every(split_every, d, (0,))
        assert given[0] == d.numblocks[0] == 3 and all(v <= max(d.numblocks[a], 2) for a, v in given.items())
        lazy = d.treereduce("sum", axis=0, split_every=split_every)
        assert lazy.compute().tolist() == x.sum(axis=0).tolist(), split_every
        # The tree of the smallest such fan-in: one aggregate along axis 0.
        same = d.treereduce("sum", axis=0, split_every={0: 3})
        assert len(dict(lazy.__dask_graph__())) == len(dict(same.__dask_graph__()))
    assert d.treereduce("max", split_every={0: 10**9, 1: 10**9}).compute() == 23.0
    assert mdask.stats(d, axis=0, split_every={0: 10**9}).compute().sum.tolist() == x.sum(axis=0).tolist()


def test_stats_of_another_array_names_stats():
    # It named treereduce and multireduce.reduce.
    with pytest.raises(TypeError, match=r"multireduce\.dask\.stats takes a dask\.array\.Array.*multireduce\.stats for"):
        mdask.stats(np.arange(3.0))
    with pytest.raises(TypeError, match=r"^treereduce takes a dask\.array\.Array.*multireduce\.reduce for"):
        mdask.treereduce(np.arange(3.0))


def test_dask_config_split_every_is_honoured():
    d = da.ones(64, chunks=4)
    with dask.config.set(split_every=16):
        graph = dict(d.treereduce("sum").__dask_graph__())
    assert not any("partial" in str(k) for k in graph)


# -- every op over any axes: the same merges as the core -------------------------------------

from test_semantics import ALL_OPS, _bits_equal, axes_for, cases, close  # noqa: E402


def _core_or_error(x, op, **kw):
    try:
        return multireduce.reduce(x, op, **kw), None
    except ValueError as exc:
        return None, exc


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=150, deadline=None)
@given(data=st.data(), op=st.sampled_from(ALL_OPS))
def test_every_op_over_axes_matches_the_core(data, op):
    x = data.draw(cases(max_side=6))
    axis = data.draw(axes_for(x.ndim, single=multireduce.OPS[op].kind == "arg"))
    keepdims = data.draw(st.booleans())
    chunks = tuple(data.draw(st.integers(1, 3)) for _ in range(x.ndim))
    d = da.from_array(x, chunks=chunks or ())
    kw = {"correction": 1} if op in ("var", "std", "nanvar", "nanstd") else {}
    expected, error = _core_or_error(x, op, axis=axis, keepdims=keepdims, **kw)
    split_every = data.draw(st.sampled_from([None, 2]))
    if error is not None:
        # Raised when the graph is built (an empty reduced axis) or when it is computed (a
        # slice of NaN only for nanargmax/nanargmin, known from the data).
        with pytest.raises(ValueError):
            d.treereduce(op, axis=axis, keepdims=keepdims, split_every=split_every, **kw).compute(scheduler="sync")
        return
    got = d.treereduce(op, axis=axis, keepdims=keepdims, split_every=split_every, **kw)
    got = got.compute(scheduler="sync")
    assert np.shape(got) == np.shape(expected)
    if multireduce.OPS[op].kind == "moments":
        # Another merge tree rounds differently; both are float64 to the last step.
        dt = np.asarray(expected).dtype
        eps = float(np.finfo(dt).eps)
        scale = 1 + float(np.nanmax(np.abs(np.where(np.isinf(x), 0, x)), initial=0)) ** 2
        close(got, expected, dt, atol=1e-12 * scale, rtol=2 * eps)
        assert np.asarray(got).dtype == dt
    else:
        _bits_equal(np.asarray(got), np.asarray(expected))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_stats_matches_the_core(data):
    x = data.draw(cases(max_side=6))
    axis = data.draw(axes_for(x.ndim))
    chunks = tuple(data.draw(st.integers(1, 3)) for _ in range(x.ndim))
    d = da.from_array(x, chunks=chunks or ())
    try:
        expected = multireduce.stats(x, axis=axis)
    except ValueError:
        with pytest.raises(ValueError):
            mdask.stats(d, axis=axis).compute(scheduler="sync")
        return
    got = mdask.stats(d, axis=axis).compute(scheduler="sync")
    for name in ("count", "nan_count", "sum", "min", "max"):
        _bits_equal(np.asarray(getattr(got, name)), np.asarray(getattr(expected, name)))
    for name in ("mean", "var"):
        dt = np.asarray(getattr(expected, name)).dtype
        scale = 1 + float(np.nanmax(np.abs(np.where(np.isinf(x), 0, x)), initial=0)) ** 2
        close(getattr(got, name), getattr(expected, name), dt, atol=1e-12 * scale, rtol=2 * float(np.finfo(dt).eps))


def test_argmax_global_index_is_int64_across_chunks():
    x = np.zeros((3, 5, 4), dtype=np.float32)
    x[2, 4, 1] = 7
    x[1, 0, 3] = np.nan
    d = da.from_array(x, chunks=(2, 2, 3))
    assert d.treereduce("argmax").compute(scheduler="sync") == np.ravel_multi_index((1, 0, 3), x.shape)
    x[1, 0, 3] = 0
    d = da.from_array(x, chunks=(2, 2, 3))
    got = d.treereduce("argmax").compute(scheduler="sync")
    assert got == np.ravel_multi_index((2, 4, 1), x.shape) and got.dtype == np.int64
    along = d.treereduce("argmax", axis=1).compute(scheduler="sync")
    assert along.dtype == np.int64 and along[2, 1] == 4


@pytest.mark.gpu
@pytest.mark.parametrize(
    "op", ["sum", "prod", "nansum", "max", "nanmin", "any", "count_nonzero", "mean", "var", "argmax", "argmin"]
)
def test_gpu_cupy_chunks_every_op_over_axes(op):
    # Partial-axis reductions of CuPy chunks (adjacent and non-adjacent axes, keepdims, uneven
    # chunks, NaN) against the same reduction of NumPy chunks: every op runs on the GPU kernels.
    cupy = _cupy()
    rng = np.random.default_rng(11)
    x = (rng.integers(-4, 5, size=(12, 10, 9)) / 2).astype(np.float32)
    if op == "prod":
        x = rng.choice(np.array([0.5, 1.0, 2.0, -1.0], dtype=np.float32), size=x.shape)
    x[3, 4, 5] = np.nan
    chunks = ((5, 7), (4, 6), (9,))
    host = da.from_array(x, chunks=chunks)
    dev = da.from_array(cupy.asarray(x), chunks=chunks, asarray=False)
    axes = [0, 2, -1] if multireduce.OPS[op].kind == "arg" else [0, 1, 2, (0, 1), (1, 2), (0, 2)]
    for axis in axes:
        for keepdims in (False, True):
            want = np.asarray(host.treereduce(op, axis=axis, keepdims=keepdims).compute(scheduler="sync"))
            lazy = dev.treereduce(op, axis=axis, keepdims=keepdims)
            got = lazy.compute(scheduler="threads")
            # Every op's result is a CuPy array on the chunks' GPU, as the meta says (moments and
            # arg states are merged on the host and came back as NumPy arrays).
            assert isinstance(got, cupy.ndarray) and isinstance(lazy._meta, cupy.ndarray), (op, axis, type(got))
            assert got.device.id == cupy.cuda.Device().id  # where the chunks were made
            got = cupy.asnumpy(got)
            assert got.dtype == want.dtype and got.shape == want.shape, (op, axis, got.dtype, want.dtype)
            if got.dtype.kind == "f":
                assert np.allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True), (op, axis, got, want)
            else:
                assert np.array_equal(got, want), (op, axis, got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ALL_OPS)
def test_gpu_cupy_chunks_full_reductions_are_cupy_arrays_of_the_meta(op):
    # Full reductions of every op (and reproducible sums and means) over CuPy chunks compute
    # to a 0-d CuPy array (keepdims: (1, 1)) on the chunks' GPU, of the lazy result's type and
    # dtype, with the value of the same reduction over NumPy chunks.
    cupy = _cupy()
    rng = np.random.default_rng(13)
    x = (rng.integers(-8, 9, size=(9, 14)) / 4).astype(np.float32)
    x[4, 6] = np.nan
    host = da.from_array(x, chunks=(4, 5))
    dev = da.from_array(cupy.asarray(x), chunks=(4, 5), asarray=False)
    kw = {"correction": 1} if op in ("var", "std", "nanvar", "nanstd") else {}
    variants = [{}, {"keepdims": True}]
    if op in ("sum", "mean"):
        variants.append({"reproducible": True})
    for extra in variants:
        want = np.asarray(host.treereduce(op, **kw, **extra).compute(scheduler="sync"))
        lazy = dev.treereduce(op, **kw, **extra)
        got = lazy.compute(scheduler="threads")
        assert type(got) is type(lazy._meta) is cupy.ndarray, (op, extra, type(got))
        assert got.dtype == lazy.dtype == want.dtype and got.shape == lazy.shape == want.shape, (op, extra)
        assert got.device.id == cupy.cuda.Device().id
        assert np.array_equal(cupy.asnumpy(got), want, equal_nan=True) or np.allclose(
            cupy.asnumpy(got), want, rtol=1e-6, equal_nan=True
        ), (op, extra, got, want)


@pytest.mark.gpu
def test_gpu_cupy_chunks_on_a_second_gpu_give_results_there():
    # The final upload of host-merged states goes to the chunks' GPU. Checked on the tasks'
    # own outputs: compute() then hands blocks to Dask's finalize, which copies them to the
    # current device.
    import dask.core
    import dask.threaded

    cupy = _cupy()
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    x = np.arange(40.0).reshape(5, 8)
    with cupy.cuda.Device(1):
        dev = da.from_array(cupy.asarray(x), chunks=(2, 3), asarray=False)
    cases = [("mean", {}), ("var", {"axis": 0}), ("argmax", {}), ("argmin", {"axis": 1}), ("sum", {})]
    cases.append(("sum", {"reproducible": True}))
    for op, kw in cases:
        lazy = dev.treereduce(op, **kw)
        blocks = dask.threaded.get(lazy.__dask_graph__(), list(dask.core.flatten(lazy.__dask_keys__())))
        assert all(isinstance(b, cupy.ndarray) and b.device.id == 1 for b in blocks), (op, kw)
        got = np.concatenate([cupy.asnumpy(b).reshape(-1) for b in blocks])
        want = np.ravel(multireduce.reduce(x, op, **{k: v for k, v in kw.items() if k != "reproducible"}))
        assert np.allclose(got, want, rtol=1e-12), (op, kw)


def test_host_states_remember_the_chunks_device():
    # Moments, arg and exact states are merged on the host; the final value goes back to the
    # chunks' GPU. Here with stand-in device numbers: NumPy chunks stay NumPy (no upload),
    # NumPy and CuPy chunks mixed, or CuPy chunks on several GPUs, are refused at the end as
    # the fold ops refuse them, and stats (host values) merges them all.
    f64 = np.dtype(np.float64)
    mean = multireduce.get_op("mean")
    part = mdask._moments_chunk(np.arange(4.0), (0,), True, op=mean, expected=f64)
    assert isinstance(part, mdask._HostState) and part.device is None
    again = pickle.loads(pickle.dumps(part))  # distributed's transfers
    assert again.device is None and again.state.tobytes() == part.state.tobytes()
    value = mdask._moments_aggregate([part, part], (0,), False, op=mean, result=f64, correction=0.0)
    assert type(value) is np.float64 and value == 1.5
    assert part.count == again.count == 4  # the elements each result reduces
    on_gpu = [mdask._HostState(part.state, 1, part.count), mdask._HostState(part.state, 2, part.count)]
    mixed = mdask._moments_combine([part, on_gpu[0]], (0,), True)
    assert mixed.device == frozenset({None, 1}) and mixed.count == 8
    with pytest.raises(TypeError, match="cannot combine NumPy and CuPy partials"):
        mdask._moments_aggregate([mixed], (0,), False, op=mean, result=f64, correction=0.0)
    with pytest.raises(NotImplementedError, match=r"partials live on GPUs \[1, 2\]"):
        mdask._moments_aggregate(on_gpu, (0,), False, op=mean, result=f64, correction=0.0)
    merged = mdask._moments_aggregate([mixed, *on_gpu], (0,), True, op=None, result=None, correction=0.0)
    assert int(merged["n"].reshape(())) == 16  # stats: host values, whatever the devices
    exact = mdask._exact_chunk(np.array([0.5, 0.25]), (0,), False, dtype=None, expected=f64)
    assert mdask._exact_aggregate([exact, exact], (0,), False, result=f64, mean=False) == 1.5
    with pytest.raises(NotImplementedError, match="GPUs"):
        mdask._exact_aggregate(
            [mdask._HostState(exact.state, 0), mdask._HostState(exact.state, 3)], (0,), False, result=f64, mean=False
        )
    with pytest.raises(TypeError, match="expected multireduce partial states"):
        mdask._moments_combine([part, 1.0], (0,), True)


@pytest.mark.parametrize("dtype", ["int16", "int64", "uint32", "bool"])
def test_integer_means_are_numpys_whatever_the_chunks(dtype):
    # Integer chunks' moments merge by Chan's update, which gave -4e-16 where the mean is 0;
    # the mean comes from the exact integer total now (_stats.state_mean), as NumPy's does.
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2, 1003).astype(bool) if dtype == "bool" else rng.integers(-300, 300, 1003).astype(dtype)
    if dtype in ("int16", "int64"):
        x[-1] = 0
        x[-1] = -x.sum()  # the mean is exactly 0
    for chunks in (1003, 250, 7):
        d = da.from_array(x, chunks=chunks)
        got = [
            d.treereduce("mean").compute(scheduler="sync"),
            mdask.stats(d).compute(scheduler="sync").mean,
            d.reshape(1, -1).treereduce("mean", axis=1).compute(scheduler="sync")[0],
        ]
        for value in got:
            assert np.float64(value).tobytes() == np.mean(x).tobytes(), (chunks, got, np.mean(x))


@pytest.mark.parametrize(
    ("shape", "op", "axis", "correction", "dtype"),
    [
        ((2, 0), "var", 0, 2, "float64"),
        ((2, 0), "std", 0, 3, "float64"),
        ((2, 0), "var", 0, 1, "float64"),
        ((0, 0), "mean", 0, 0, "float64"),
        ((2, 0), "mean", 0, 0, "float64"),
        # np.nanvar of floats does not warn here; of integers it is np.var, which does.
        ((2, 0), "nanvar", 0, 1, "float64"),
        ((2, 0), "nanstd", 0, 3, "int32"),
    ],
)
def test_empty_results_warn_as_numpy(shape, op, axis, correction, dtype):
    # An empty result has no state to warn from: NumPy (and the core) warn by the count of
    # the reduced axes. The Dask aggregate gave [] with no warning.
    import warnings

    x = np.ones(shape, dtype)
    kwargs = {"correction": correction} if op != "mean" else {}
    found = []
    for call in (
        lambda: da.from_array(x, chunks=1).treereduce(op, axis=axis, **kwargs).compute(scheduler="sync"),
        lambda: getattr(np, op)(x, axis=axis, **({"ddof": correction} if op != "mean" else {})),
    ):
        with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
            warnings.simplefilter("always")
            assert np.shape(call()) == (0,)
        found.append([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
    assert found[0] == found[1], found


@pytest.mark.parametrize("op", ["var", "std", "nanvar", "nanstd", "mean", "nanmean", "stats"])
def test_invalid_value_warnings_across_chunks_are_numpys_of_the_whole_array(op):
    # NumPy's invalid-value warnings are decided from each slice's merged state at the
    # aggregate, not per chunk: a NaN in one chunk and +inf in another warned "in subtract"
    # from the infinity's chunk where NumPy's var is silent, and +inf and -inf in two chunks
    # warned "in add" (the merge) and "in subtract" where NumPy warns "in reduce". stats
    # warns as var (silent where a NaN is: its fields are NaN there); its reference is the
    # core's stats of the whole array. (NaN with both infinities is left out: NumPy's order
    # of additions decides.)
    import warnings

    patterns = [
        [1.0, np.nan, np.inf, 2.0],
        [np.inf, 1.0, -np.inf, 2.0],
        [np.inf, 1.0, 2.0, 3.0],
        [1.0, 2.0, np.nan, -np.inf],
        [np.inf, 2.0, 3.0, np.nan],
        [1.0, 2.0, 3.0, 4.0],
    ]
    reference = (lambda x: multireduce.stats(x).var) if op == "stats" else getattr(np, op)
    checked = 0
    for pattern in patterns:
        x = np.array(pattern)
        for chunks in (1, 2, 3, 4):
            d = da.from_array(x, chunks=chunks)
            found = []
            for call in (
                lambda d=d: (
                    mdask.stats(d).compute(scheduler="sync").var
                    if op == "stats"
                    else d.treereduce(op).compute(scheduler="sync")
                ),
                lambda x=x: reference(x),
            ):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    value = call()
                found.append((repr(value), [str(w.message) for w in caught]))
            assert found[0] == found[1], (pattern, chunks, found)
            checked += any("invalid value" in m for m in found[1][1])
    assert checked >= (3 if op in ("mean", "nanmean") else 8)  # NumPy warns in these cases
    # Over an axis: a slice is merged from the chunks along it; the other slices are silent.
    x = np.ones((4, 3))
    x[0, 1], x[3, 1], x[2, 2] = np.nan, np.inf, np.inf
    d = da.from_array(x, chunks=(1, 3))
    if op != "stats":
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            d.treereduce(op, axis=0).compute(scheduler="sync")
        with warnings.catch_warnings(record=True) as numpys:
            warnings.simplefilter("always")
            getattr(np, op)(x, axis=0)
        assert [str(w.message) for w in ours] == [str(w.message) for w in numpys]


@pytest.mark.parametrize("op", ["var", "std", "nanvar", "nanstd", "mean", "nanmean"])
def test_overflow_warnings_across_chunks_are_numpys_of_the_whole_array(op):
    # Decided from each slice's merged state at the aggregate: an overflow only in the merge
    # of two chunks (Chan's update) warned nothing; a NaN in another chunk silenced the sum's
    # overflow, which NumPy's pairwise sum gives; squares that fit, whose sum overflows,
    # said "in square" where NumPy says "in reduce".
    import warnings

    patterns = [
        [1e200, 1.0, -1e200, 2.0, 3.0, 4.0],  # squares past the range
        [1.2e154, 1.0, -1.2e154, 2.0, 3.0, 4.0],  # squares that fit, their sum past it
        [1.0, np.nan] + [1e308] * 6,  # the sum past the range, and a NaN
        [1.0, np.nan, 1e200, 2.0, 3.0, 4.0],  # squares past the range, and a NaN: var is silent
    ]
    checked = 0
    for pattern in patterns:
        x = np.array(pattern)
        for chunks in (1, 2, 3, len(pattern)):
            found = []
            for call in (
                lambda c=chunks, x=x: da.from_array(x, chunks=c).treereduce(op).compute(scheduler="sync"),
                lambda x=x: getattr(np, op)(x),
            ):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    value = call()
                found.append((bool(np.isnan(value)), bool(np.isinf(value)), [str(w.message) for w in caught]))
            assert found[0] == found[1], (pattern, chunks, found)
            checked += bool(found[1][2])
    assert checked >= (4 if op in ("mean", "nanmean") else 12)


def test_float32_means_across_chunks_are_the_cores_bits():
    # A merged state's mean was Chan's update of the chunks' float64 means, an ulp off the
    # float64 total over n at times, which rounded a float32 mean at a tie the other way
    # than multireduce.mean (8 of 12,000 cases here; a review found 0.4% of 10-element
    # arrays in chunks of 3). The finite float64 total over n is the mean of every path now.
    rng = np.random.default_rng(1)
    known = [  # sums of exactly 0: Chan's update gave -2.2e-16, 5.6e-17, ... in chunks of 3
        [-2, 21, 10, 49, 3, -28, -6, 10, -17, -40],
        [-50, 42, 25, -1, -40, 46, -7, 26, -16, -25],
        [7, 4, -34, 9, 27, -36, 12, 38, -44, 17],
    ]
    cases = [np.array(k) for k in known] + [rng.integers(-50, 50, 10) for _ in range(60)]
    for k in cases:
        x = (k / 8).astype(np.float32)
        want = multireduce.mean(x)
        for chunks in (1, 2, 3, 4):
            d = da.from_array(x, chunks=chunks)
            got = d.treereduce("mean").compute(scheduler="sync")
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), (x, chunks, got, want)
            assert mdask.stats(d).compute(scheduler="sync").mean.tobytes() == np.asarray(want).tobytes()


def test_stats_warns_where_a_chunks_squares_overflow_as_the_core():
    # multireduce.dask.stats took mean's chunk states, which leave the squares' overflow
    # warning out: np.errstate(over="raise") raised in multireduce.stats, not here.
    import warnings

    x = np.array([1e200, -1e200, 1.0])
    found = []
    for call in (
        lambda: mdask.stats(da.from_array(x, chunks=3)).compute(scheduler="sync"),
        lambda: multireduce.stats(x),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = call()
        found.append((repr(value.var), [str(w.message) for w in caught]))
    assert found[0] == found[1] == ("np.float64(inf)", numpy_var_warnings(x)), found


def _unknown_empty_rows():
    # Shape (nan, 0) until computed, then (0, 0): boolean indexing leaves axis 0's size unknown.
    return da.from_array(np.zeros((2, 0)), chunks=1)[da.from_array(np.array([False, False]), chunks=1)]


@pytest.mark.parametrize("op", ["mean", "var", "std", "nanmean", "nanvar", "nanstd"])
def test_empty_results_over_axes_of_unknown_size_warn_as_numpy(op):
    # The aggregate warned only where the reduced count was known when the graph was built:
    # over an axis of unknown size that turned out empty, mean and var gave [] silently where
    # NumPy warns. The chunks' states now carry their reduced count.
    import warnings

    y = _unknown_empty_rows()
    assert math.isnan(y.shape[0])
    found = []
    for call in (
        lambda: y.treereduce(op, axis=0).compute(scheduler="sync"),
        lambda: getattr(np, op)(np.zeros((0, 0)), axis=0),
    ):
        with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
            warnings.simplefilter("always")
            assert np.shape(call()) == (0,)
        found.append([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
    assert found[0] == found[1], found
    if not op.startswith("nan"):
        assert found[0], found  # NumPy warns here: the comparison is not vacuous


def test_stats_over_an_axis_of_unknown_size_that_turns_out_empty_raises():
    # As the core's stats (min and max of zero elements): the empty result gave a Stats of
    # empty arrays. A non-empty unknown axis still works.
    with pytest.raises(ValueError, match="zero-size array to stats"):
        mdask.stats(_unknown_empty_rows(), axis=0).compute(scheduler="sync")
    x = np.arange(12.0).reshape(4, 3)
    d = da.from_array(x, chunks=2)
    kept = d[d[:, 0] > 2]  # rows 1-3, their count unknown until computed
    got = mdask.stats(kept, axis=0).compute(scheduler="sync")
    np.testing.assert_array_equal(got.count, [3, 3, 3])
    np.testing.assert_array_equal(got.mean, x[1:].mean(axis=0))
    np.testing.assert_array_equal(got.var, x[1:].var(axis=0))


@pytest.mark.parametrize("xp", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("op", ["argmax", "argmin", "count_nonzero", "sum", "mean", "max", "stats"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_0d_array_of_nan_or_inf_builds_its_graph_silently(op, value, xp):
    # A 0-d Dask array's meta is its data, which Dask's reduction cast to each step's dtype:
    # NaN or inf to int64 warned "invalid value encountered in cast" when the graph was built,
    # and raised under errstate(invalid="raise"). Dask's own reductions are silent there.
    # (CuPy chunks: the zeroed meta stays a CuPy array, so results stay on the device.)
    import warnings

    if xp == "cupy":
        cupy = _cupy()
        x = da.from_array(cupy.asarray(value), asarray=False)
        assert isinstance(x._meta, cupy.ndarray)
    else:
        x = da.from_array(np.array(value))
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        y = mdask.stats(x) if op == "stats" else x.treereduce(op)
        if op == "sum":
            x.treereduce("sum", dtype=np.int64)
    if op == "stats":
        with np.errstate(invalid="ignore"):  # var of an infinity: "in subtract", as np.nanvar
            got = y.compute(scheduler="sync")
        assert got.count == 1 and same_float(got.max, value)
        return
    assert y.dtype == multireduce.reduce(np.array(1.0), op).dtype
    assert type(y._meta) is type(x._meta)
    with np.errstate(all="ignore"):
        got, want = y.compute(scheduler="sync"), multireduce.reduce(np.array(value), op)
    assert type(got) is (np.dtype(y.dtype).type if xp == "numpy" else type(x._meta)), type(got)
    got = got.get()[()] if xp == "cupy" else got
    assert same_float(got, want) if np.asarray(want).dtype.kind == "f" else got == want


@pytest.mark.parametrize("op", ["sum", "mean", "max", "var"])
def test_an_empty_split_every_dict_leaves_every_reduced_axis_at_two(op):
    # Dask reads `split_every or config.get("split_every", 4)`: the empty dict read the config
    # key without the check the README promises, and a fan-in of 1 there left partials
    # uncombined (sum 30.0 for 66.0).
    x = np.arange(24.0).reshape(12, 2)
    d = da.from_array(x, chunks=3)
    with dask.config.set(split_every={0: 1}):
        for axis in (None, 0):
            got = d.treereduce(op, axis=axis, split_every={}).compute(scheduler="sync")
            np.testing.assert_allclose(got, getattr(np, op)(x, axis=axis), rtol=1e-15)
            assert len(d.treereduce(op, axis=axis, split_every={}).dask) == len(
                d.treereduce(op, axis=axis, split_every=dict.fromkeys(range(x.ndim), 2)).dask
            )
        with pytest.raises(ValueError, match="split_every"):
            d.treereduce(op)  # the config key itself is still checked
    # No reduced axis (axis=()): the fan-in given to Dask was {}, which read a config key of
    # None ("split_every must be a int or a dict") when the graph was built.
    with dask.config.set(split_every=None):
        got = d.treereduce(op, axis=()).compute(scheduler="sync")
        np.testing.assert_array_equal(got, multireduce.reduce(x, op, axis=()))
        if op == "sum":
            np.testing.assert_array_equal(mdask.stats(d, axis=()).compute(scheduler="sync").sum, x)


def test_variance_of_two_single_elements_far_apart():
    # Chan's update computed delta * delta * w: delta**2 overflowed (1.6e154**2) where the term
    # does not (w = 0.5): var was inf over two chunks of one element, NumPy's 6.4e307.
    x = np.array([8e153, -8e153])
    d = da.from_array(x, chunks=1)
    assert float(mdask.treereduce(d, "var").compute()) == np.var(x) == 6.4e307
    assert float(mdask.treereduce(d, "std").compute()) == np.std(x)
    assert float(multireduce.stats(x).var) == np.var(x)


@pytest.mark.parametrize("xp", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("data", ["float64", "int64"])
@pytest.mark.parametrize(
    ("chunks", "axis", "split_every"), [(2**17, None, 4), (100_003, None, None), ((256, 300), 0, 3)]
)
def test_variance_far_from_zero_across_chunks(data, chunks, axis, split_every, xp):
    # Timestamps near 1.7e9 (spread 1) and int64 ids near 1e12: the chunks' states carry the
    # low parts of their means (Moments.mean_lo; on the GPU the moments kernel's), so var
    # over chunks keeps one array's accuracy. Before, Chan's d of float64 means rounded at
    # 1.7e9's ulp: 2e-10 to 1e-8.
    rng = np.random.default_rng(7)
    shape = (2**20 + 5,) if axis is None else (2000, 300)
    offset = 1.7e9 if data == "float64" else 10**12
    x = offset + (rng.standard_normal(shape) if data == "float64" else rng.integers(0, 20, shape))
    want = np.var(x.astype(np.float64) - offset, axis=axis)
    d = da.from_array(x, chunks=chunks)
    if xp == "cupy":
        d = da.from_array(_cupy().asarray(x), chunks=chunks, asarray=False)
    got_var = d.treereduce("var", axis=axis, split_every=split_every).compute()
    got_stats = mdask.stats(d, axis=axis, split_every=split_every).compute().var
    for got in (got_var, got_stats):
        got = got.get() if type(got).__module__.startswith("cupy") else np.asarray(got)
        assert np.all(np.abs(got - want) <= 1e-13 * want), np.max(np.abs(got - want) / want)
