"""Array API semantics of every op against NumPy and independent references (hypothesis).

Shapes up to 4-D (empty axes included), every axis combination, keepdims, every supported
dtype, NaN/inf/signed zeros, non-contiguous and transposed views. References:

* integer, bool and counting results: NumPy's own, which must match exactly (both wrap
  modulo 2**64 the same way);
* float sums and products: values drawn so that the float64 reference is exact (small
  multiples of 1/2; powers of two for products), so the result must match bit for bit;
* max/min (and nan*, arg*): a total-order integer key of the float64 bits, which orders
  -0.0 < +0.0 as IEEE 754-2019 does, independently of the ufunc-plus-fix-up the library uses;
* mean/var/std: NumPy in float64, within rounding to the result dtype; where N - correction
  <= 0 the standard's NaN replaces NumPy's inf.

The GPU variants (marked gpu) run the same checks on CuPy copies of the same views: every op,
every axis set (non-adjacent ones too), on multireduce's kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from reference import same_float

import multireduce
from multireduce import _axes, _stats
from multireduce.ops import OPS, SUPPORTED_DTYPES

DTYPES = [dt.name for dt in SUPPORTED_DTYPES]
FOLD_EXACT = ["sum", "prod", "nansum", "nanprod", "count_nonzero", "any", "all"]
PRODUCTS = ("prod", "nanprod")
EXTREMES = ["max", "min", "nanmax", "nanmin"]
MOMENTS = ["mean", "var", "std", "nanmean", "nanvar", "nanstd"]
#: The moments ops that take correction=.
CORRECTED = ("var", "std", "nanvar", "nanstd")
ARGS = ["argmax", "argmin", "nanargmax", "nanargmin"]
ALL_OPS = FOLD_EXACT + EXTREMES + MOMENTS + ARGS
SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0]
_MAGNITUDE = np.int64(0x7FFF_FFFF_FFFF_FFFF)


# -- strategies ------------------------------------------------------------------------------


@st.composite
def cases(draw, *, powers_of_two: bool = False, max_side: int = 5, recipe: bool = False):
    """An array view with planted specials, a random view and layout.

    With ``recipe``, ``(base, index, order)`` instead, for :func:`view_of` (to make the same
    view of a device copy).
    """
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=max_side))
    if dtype.kind == "f":
        if powers_of_two:
            elements = st.sampled_from([0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 0.0, -0.0])
        else:
            # Small multiples of 1/2: every sum of up to 625 of them is exact in float32
            # accumulation and in float64, so references are exact too.
            elements = st.integers(-16, 16).map(lambda k: k / 2.0)
    elif dtype.kind == "b":
        elements = None
    elif draw(st.booleans()):
        info = np.iinfo(dtype)
        elements = st.integers(max(info.min, -20), min(info.max, 20))
    else:
        elements = None  # the full range: sums and products wrap
    base = draw(hnp.arrays(dtype, shape, elements=elements))
    if dtype.kind == "f" and base.size and draw(st.booleans()):
        flat = base.reshape(-1)
        for _ in range(draw(st.integers(1, 3))):
            flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from(SPECIALS))
    index, order = (), None
    if base.ndim:
        index = tuple(slice(None, None, draw(st.sampled_from([1, 1, 2, -1]))) for _ in range(base.ndim))
        if base.ndim > 1 and draw(st.booleans()):
            order = draw(st.permutations(range(base.ndim)))
    if recipe:
        return base, index, order
    return view_of(base, index, order)


def view_of(base, index, order):
    """``base[index]``, transposed to ``order`` if given: the same view of a NumPy or CuPy array."""
    view = base[index] if index else base  # a 0-d array stays an array
    return view if order is None else view.transpose(order)


@st.composite
def axes_for(draw, ndim: int, single: bool = False):
    """None, an int or a tuple of (possibly negative) axes: every combination reachable."""
    if single:
        if ndim == 0 or draw(st.booleans()):
            return None
        return draw(st.integers(-ndim, ndim - 1))
    choice = draw(st.integers(0, 2))
    if choice == 0 or ndim == 0:
        return None
    subset = draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim))
    subset = [a - ndim if draw(st.booleans()) else a for a in subset]
    if choice == 1 and len(subset) == 1:
        return subset[0]
    return tuple(subset)


# -- references ------------------------------------------------------------------------------


def _norm_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if isinstance(axis, int) else axis
    return tuple(sorted(a % ndim for a in axis))


def _keys(f: np.ndarray) -> np.ndarray:
    """float64 -> int64 whose integer order is IEEE 754's total order (-0.0 < +0.0)."""
    bits = f.view(np.int64)
    return np.where(bits < 0, bits ^ _MAGNITUDE, bits)


def _unkey(k: np.ndarray) -> np.ndarray:
    return np.where(k < 0, k ^ _MAGNITUDE, k).astype(np.int64).view(np.float64)


def ref_extreme(x: np.ndarray, op: str, axes: tuple[int, ...]) -> np.ndarray:
    f = np.ascontiguousarray(x, dtype=np.float64)
    nan = np.isnan(f)
    largest = op in ("max", "nanmax")
    k = _keys(f)
    k = np.where(nan, np.iinfo(np.int64).min if largest else np.iinfo(np.int64).max, k)
    best = np.max(k, axis=axes) if largest else np.min(k, axis=axes)
    value = _unkey(np.asarray(best))
    if op in ("max", "min"):
        value = np.where(np.any(nan, axis=axes), np.nan, value)
    else:
        value = np.where(np.all(nan, axis=axes), np.nan, value)
    return value.astype(x.dtype)


def ref_arg(x: np.ndarray, op: str, axis) -> np.ndarray:
    largest = op in ("argmax", "nanargmax")
    if x.dtype.kind != "f":  # exact in NumPy (float64 keys would tie distinct 64-bit integers)
        return (np.argmax if largest else np.argmin)(x.reshape(-1) if axis is None else x, axis=axis)
    f = np.array(x, dtype=np.float64)
    if axis is None:
        f = f.reshape(-1)
        axis = 0
    k = _keys(f)
    if not largest:
        k = ~k
    # argmax/argmin: NaN wins, first NaN first; nanargmax/nanargmin: NaN loses to every number.
    nan_key = np.iinfo(np.int64).min if op.startswith("nan") else np.iinfo(np.int64).max
    k = np.where(np.isnan(f), nan_key, k)
    return np.argmax(k, axis=axis)


def close(got, ref, dtype: np.dtype, atol: float, rtol: float) -> None:
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    both_nan = np.isnan(got) & np.isnan(ref)
    same_inf = np.isinf(ref) & (got == ref)
    with np.errstate(invalid="ignore"):
        near = np.abs(got - ref) <= atol + rtol * np.abs(ref)
    ok = both_nan | same_inf | (np.isfinite(ref) & near)
    assert np.all(ok), (got[~ok], ref[~ok])


def _bits_equal(got, ref) -> None:
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, ref.dtype, got.shape, ref.shape)
    if got.dtype.kind == "f":
        same = (got.view(f"u{got.itemsize}") == ref.view(f"u{ref.itemsize}")) | (np.isnan(got) & np.isnan(ref))
        assert np.all(same), (got, ref)
    else:
        assert np.array_equal(got, ref), (got, ref)


def numpy_result(x, op, axis, keepdims, **kw):
    fn = {"count_nonzero": np.count_nonzero}.get(op, getattr(np, op))
    with _quiet_ctx():
        return fn(x, axis=axis, keepdims=keepdims, **kw)


class _quiet_ctx:
    def __enter__(self):
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)
        self._err = np.errstate(all="ignore")
        self._err.__enter__()

    def __exit__(self, *exc):
        self._err.__exit__(*exc)
        return self._ctx.__exit__(*exc)


def check_op(x: np.ndarray, op: str, axis, keepdims: bool, correction: float = 0.0, device=None) -> None:
    """Assert multireduce.reduce(x, op, axis, keepdims) against the references above.

    With ``device`` (a CuPy array holding the same view as ``x``), reduce that instead: the
    result must be a CuPy array on its device, and its values pass the same checks.
    """
    kw = {"correction": correction} if op in CORRECTED else {}
    axes = _norm_axes(axis, x.ndim)
    reduced = math.prod(x.shape[a] for a in axes)
    subject = x if device is None else device
    if reduced == 0 and not OPS[op].empty_allowed:
        with pytest.raises(ValueError):
            multireduce.reduce(subject, op, axis=axis, keepdims=keepdims)
        with pytest.raises(ValueError):  # NumPy raises too
            numpy_result(x, op, axis, keepdims)
        return
    if op in ("nanargmax", "nanargmin") and x.dtype.kind == "f" and np.any(np.all(np.isnan(x), axis=axis)):
        with pytest.raises(ValueError, match="All-NaN slice encountered"):
            multireduce.reduce(subject, op, axis=axis, keepdims=keepdims)
        with pytest.raises(ValueError, match="All-NaN slice encountered"):  # NumPy raises too
            numpy_result(x, op, axis, keepdims)
        return
    with _quiet_ctx():
        got = multireduce.reduce(subject, op, axis=axis, keepdims=keepdims, **kw)
    np_kw = {"ddof": correction} if kw else {}
    theirs = numpy_result(x, op, axis, keepdims, **np_kw)
    if device is not None:
        assert type(got) is type(device) and got.data.device_id == device.data.device_id, type(got)
        got = got.get()
        got = got[()] if isinstance(theirs, np.generic) else got
    # Shape, dtype and scalar-ness as NumPy's.
    assert np.shape(got) == np.shape(theirs), (op, axis, np.shape(got), np.shape(theirs))
    assert got.dtype == np.asarray(theirs).dtype, (op, x.dtype, got.dtype, np.asarray(theirs).dtype)
    assert isinstance(got, np.generic) == isinstance(theirs, np.generic), (type(got), type(theirs))
    kept_shape = np.shape(theirs)
    if op in ("count_nonzero", "any", "all") or (op in FOLD_EXACT and x.dtype.kind in "biu"):
        _bits_equal(got, theirs)
    elif op in ("sum", "prod", "nansum", "nanprod"):
        f = np.asarray(x, dtype=np.float64)
        if op in ("nansum", "nanprod"):
            f = np.where(np.isnan(f), 0.0 if op == "nansum" else 1.0, f)
        with _quiet_ctx():
            ref = (np.prod if op in PRODUCTS else np.sum)(f, axis=axis, keepdims=keepdims)
            ref = np.asarray(ref if op in PRODUCTS else ref + 0.0).astype(x.dtype)  # sums of zeros: +0.0
        _bits_equal(got, ref)
    elif op in EXTREMES:
        if x.dtype.kind in "biu":
            _bits_equal(got, theirs)
        else:
            ref = ref_extreme(x, op, axes).reshape(kept_shape)
            _bits_equal(got, ref)
            # NumPy agrees wherever no zero of either sign decides the result.
            mask = np.asarray(ref) != 0
            _bits_equal(np.asarray(got)[mask], np.asarray(theirs, dtype=x.dtype)[mask])
    elif op in ARGS:
        ref = ref_arg(x, op, axis)
        if keepdims:
            ref = ref.reshape(kept_shape)
        _bits_equal(np.asarray(got), np.asarray(ref))
        if x.dtype.kind in "biu":
            _bits_equal(got, theirs)
    else:
        f = np.asarray(x, dtype=np.float64)
        with _quiet_ctx():
            if op == "mean":
                ref = np.mean(f, axis=axis, keepdims=keepdims)
            elif op == "nanmean":
                ref = np.nanmean(f, axis=axis, keepdims=keepdims)
            elif op in ("nanvar", "nanstd"):
                # NaN where the non-NaN count - correction <= 0, NumPy's rule too.
                ref = np.nanvar(f, axis=axis, keepdims=keepdims, ddof=correction)
                counts = np.sum(~np.isnan(f), axis=axis, keepdims=keepdims)
                ref = np.where(counts - correction <= 0, np.nan, ref)
                if op == "nanstd":
                    ref = np.sqrt(ref)
            else:
                ref = np.var(f, axis=axis, keepdims=keepdims, ddof=correction)
                ref = np.where(reduced - correction <= 0, np.nan, ref)  # the standard's rule
                if op == "std":
                    ref = np.sqrt(ref)
        dt = np.asarray(got).dtype
        eps = float(np.finfo(dt).eps)
        finite = np.abs(f[np.isfinite(f)])
        scale = float(finite.max()) if finite.size else 1.0
        squared = op in ("var", "nanvar")
        atol = (1e-13 + eps) * (scale * scale if squared else scale) + float(np.finfo(dt).smallest_subnormal)
        close(got, ref, dt, atol=atol, rtol=2 * eps)


# -- CPU property tests ------------------------------------------------------------------------

_SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(data=st.data(), op=st.sampled_from([o for o in ALL_OPS if o not in PRODUCTS]))
def test_ops_against_numpy(data, op):
    x = data.draw(cases())
    axis = data.draw(axes_for(x.ndim, single=op in ARGS))
    keepdims = data.draw(st.booleans())
    correction = data.draw(st.sampled_from([0, 1, 0.5, 2])) if op in CORRECTED else 0.0
    check_op(x, op, axis, keepdims, correction)


NAN_OPS = ["nansum", "nanprod", "nanmax", "nanmin", "nanmean", "nanvar", "nanstd", "nanargmax", "nanargmin"]


@st.composite
def nan_dense(draw, recipe: bool = False, powers_of_two: bool = False):
    """A float array view with NaN at a random set of positions (often most of them).

    With ``recipe``, ``(base, index, None)`` for :func:`view_of`, as :func:`cases`; with
    ``powers_of_two``, products are exact in any order (as in :func:`cases`).
    """
    dtype = np.dtype(draw(st.sampled_from(["float16", "float32", "float64"])))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    if powers_of_two:
        elements = st.sampled_from([0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 0.0, -0.0])
    else:
        elements = st.integers(-8, 8).map(lambda k: k / 2.0)
    base = draw(hnp.arrays(dtype, shape, elements=elements))
    nan = draw(hnp.arrays(np.bool_, shape))
    base[nan] = np.nan
    index = tuple(slice(None, None, draw(st.sampled_from([1, 2, -1]))) for _ in range(base.ndim))
    return (base, index, None) if recipe else view_of(base, index, None)


@settings(max_examples=600, deadline=None)
@given(data=st.data(), op=st.sampled_from(NAN_OPS))
def test_nan_ops_against_numpy_on_nan_dense_data(data, op):
    # The property test above plants a NaN in few of its arrays; here NaN is everywhere,
    # with all-NaN slices (nanargmax/nanargmin raise there, as NumPy's) and NaN before the
    # extreme (which argmax would pick and nanargmax must pass over).
    x = data.draw(nan_dense(powers_of_two=op == "nanprod"))
    axis = data.draw(axes_for(x.ndim, single=op in ARGS))
    keepdims = data.draw(st.booleans())
    correction = data.draw(st.sampled_from([0, 1])) if op in CORRECTED else 0.0
    check_op(x, op, axis, keepdims, correction)


@pytest.mark.parametrize("op", ["nanargmax", "nanargmin"])
def test_nan_arg_ops_pass_over_nan(op):
    x = np.array([np.nan, 1.0, np.nan, 3.0, -3.0, np.nan])
    want = {"nanargmax": 3, "nanargmin": 4}[op]
    assert multireduce.reduce(x, op) == want == getattr(np, op)(x)
    rows = np.array([[np.nan, 2.0, 2.0], [1.0, np.nan, -0.0], [np.nan, np.nan, 0.0]])
    got = multireduce.reduce(rows, op, axis=1)
    assert got.tolist() == ([1, 0, 2] if op == "nanargmax" else [1, 2, 2])
    assert multireduce.reduce(np.array([-0.0, np.nan, 0.0]), op) == (2 if op == "nanargmax" else 0)  # IEEE order
    assert multireduce.reduce(np.arange(5, dtype=np.int16), op) == (4 if op == "nanargmax" else 0)
    # The only numbers are the extreme infinity: NumPy replaces NaN by it and returns the
    # NaN's index (0); ours is the infinity's (docs/semantics.md, differences from NumPy).
    edge = np.array([np.nan, -np.inf if op == "nanargmax" else np.inf, np.nan])
    assert multireduce.reduce(edge, op) == 1 and getattr(np, op)(edge) == 0
    with pytest.raises(ValueError, match="All-NaN slice encountered"):
        multireduce.reduce(np.array([[np.nan, 1.0], [np.nan, 2.0]]), op, axis=0)  # column 0: NaN only
    with pytest.raises(ValueError, match=f"attempt to get {op[3:]} of an empty sequence"):
        multireduce.reduce(np.zeros(0), op)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), op=st.sampled_from(PRODUCTS))
def test_prod_against_numpy(data, op):
    x = data.draw(cases(powers_of_two=True, max_side=3))
    check_op(x, op, data.draw(axes_for(x.ndim)), data.draw(st.booleans()))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), op=st.sampled_from(["sum", "prod", "nansum", "nanprod"]), requested=st.sampled_from(DTYPES[1:]))
def test_dtype_argument_against_numpy(data, op, requested):
    x = data.draw(cases(powers_of_two=True, max_side=3))
    axis = data.draw(axes_for(x.ndim))
    with _quiet_ctx():
        got = multireduce.reduce(x, op, axis=axis, dtype=requested)
        # Elements are converted first; NumPy's answer is exact for these values except where
        # NaN reaches an integer (unspecified), so compare only where NumPy's is finite.
        converted = x
        if op in ("nansum", "nanprod") and x.dtype.kind == "f":
            converted = np.where(np.isnan(x), 0 if op == "nansum" else 1, x)
        theirs = (np.prod if op in PRODUCTS else np.sum)(converted.astype(requested), axis=axis, dtype=requested)
    assert got.dtype == np.dtype(requested)
    assert np.shape(got) == np.shape(theirs)
    # (converted, not x: nansum and nanprod of data with NaN into an integer dtype= are
    # compared too, their NaN replaced as NumPy's nan functions replace them.)
    if np.dtype(requested).kind == "f" or not (converted.dtype.kind == "f" and np.isnan(converted).any()):
        if np.dtype(requested).kind == "f":
            # NaN only where NumPy's is NaN (a NaN element, inf - inf, 0 * inf): it was
            # accepted for any value, so a dtype= path that dropped NaN passed.
            ok = np.isclose(got, theirs, rtol=0, atol=0, equal_nan=True)
            if x.dtype.kind in "iub":
                # Integer elements need not keep float results exact (27 threes multiply to
                # 3**27, which float32 cannot hold; NumPy rounds at every step, multireduce
                # once). Where the exact result is representable, every partial product or
                # sum is too (it divides, or is bounded by, the result), so both are exact.
                exact = (np.prod if op in PRODUCTS else np.sum)(x.astype(object), axis=axis)
                ok = ok | ~np.vectorize(lambda v: _representable(v, np.dtype(requested)), otypes=[bool])(exact)
            assert np.all(ok), (got, theirs)
        else:
            _bits_equal(got, theirs)


@pytest.mark.parametrize(
    ("values", "dtype", "requested", "word"),
    [
        ([1e39, 1.0], "float64", "float32", "overflow"),
        ([70000, 1], "int32", "float16", "overflow"),
        ([1e20, 1.0], "float64", "int64", "invalid value"),
        ([-np.inf, 2.0], "float32", "int32", "invalid value"),
    ],
)
@pytest.mark.parametrize("op", ["sum", "prod", "nansum", "nanprod"])
def test_dtype_conversion_out_of_range_warns_as_numpy(values, dtype, requested, word, op):
    # NumPy's reductions warn where a dtype= conversion leaves the requested dtype's range,
    # and raise under np.errstate; the CPU's conversion ran silenced (a wrong comment said
    # NumPy was silent too).
    x = np.array(values, dtype=dtype)
    options = [{}, {"axis": 0}] + ([{"reproducible": True}] if op == "sum" else [])
    for kwargs in options:
        with pytest.warns(RuntimeWarning, match=word):
            multireduce.reduce(x, op, dtype=requested, **kwargs)
        with np.errstate(over="raise", invalid="raise"), pytest.raises(FloatingPointError):
            multireduce.reduce(x, op, dtype=requested, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        multireduce.reduce(np.array([1e38, 1.0]), op, dtype="float32")  # in range: silent


@settings(max_examples=150, deadline=None)
@given(data=st.data(), op=st.sampled_from(["sum", "prod", "nansum", "nanprod"]), requested=st.sampled_from(DTYPES[1:]))
def test_partial_with_dtype_then_one_cast_is_reduce(data, op, requested):
    # What the Dask and MPI layers do with dtype=: each chunk's or shard's core.partial in the
    # accumulator dtype, one cast to the result at the end. That must be reduce's answer for
    # every input kind and requested dtype (float elements to integer results included: each
    # element converted first, NaN, inf and out-of-range values as the cast makes them).
    x = data.draw(cases(max_side=4))
    if x.dtype.kind == "f" and data.draw(st.booleans()):
        scale = data.draw(st.sampled_from([1e3, 3e4, 1e9]))
        with np.errstate(over="ignore", invalid="ignore"):  # float16: inf (and inf * 0: NaN)
            x = x * x.dtype.type(scale)  # beyond the range of narrow integers
    axis = data.draw(axes_for(x.ndim))
    requested = np.dtype(requested)
    with _quiet_ctx():
        want = multireduce.reduce(x, op, axis=axis, dtype=requested)
        got = np.asarray(multireduce.partial(x, op, axis=axis, dtype=requested)).astype(requested)
    _bits_equal(got, want)


def _representable(value: int, dt: np.dtype) -> bool:
    """Whether the Python integer ``value`` is exactly a finite value of the float dtype ``dt``."""
    with np.errstate(over="ignore"):
        f = dt.type(float(value)) if abs(value) < 2**1000 else dt.type(np.inf)
    return bool(np.isfinite(f)) and int(f) == value


@pytest.mark.parametrize(
    "axis",
    [True, False, np.True_, (0, True), [0, 1], [0], 1.0, (0, 1.0), "0"]
    + [np.array([0, 1]), np.array([1]), (0, np.array([1])), np.array(1.0)],
)
def test_axis_that_is_not_an_int_or_a_tuple_of_ints_is_refused(axis):
    # NumPy refuses these with TypeError; its normalize_axis_tuple (which the core uses) took a
    # bool as 0 or 1 and a list as a tuple, so sum(x, axis=True) reduced axis 1.
    x = np.arange(6.0).reshape(2, 3)
    with pytest.raises(TypeError):
        np.sum(x, axis=axis)
    for call in (
        lambda: multireduce.sum(x, axis=axis),
        lambda: multireduce.reduce(x, "max", axis=axis),
        lambda: multireduce.var(x, axis=axis),
        lambda: multireduce.stats(x, axis=axis),
        lambda: multireduce.partial(x, "sum", axis=axis),
    ):
        with pytest.raises(TypeError, match="axis must be None, an int or a tuple of ints"):
            call()
    if not isinstance(axis, tuple | list):
        with pytest.raises(TypeError, match="axis must be None, an int or a tuple of ints"):
            multireduce.argmax(x, axis=axis)
    # What NumPy accepts as an int stays accepted.
    assert multireduce.sum(x, axis=np.array(1)).tolist() == [3.0, 12.0]
    assert multireduce.sum(x, axis=(np.int64(0), 1)) == 15.0


@pytest.mark.parametrize("keepdims", ["yes", None, 1.0])
def test_keepdims_must_be_a_bool(keepdims):
    x = np.arange(6.0).reshape(2, 3)
    with pytest.raises(TypeError):
        np.sum(x, axis=0, keepdims=keepdims)
    with pytest.raises(TypeError, match="keepdims must be a bool"):
        multireduce.sum(x, axis=0, keepdims=keepdims)
    with pytest.raises(TypeError, match="keepdims must be a bool"):
        multireduce.partial(x, "max", axis=0, keepdims=keepdims)
    assert multireduce.sum(x, axis=0, keepdims=np.True_).shape == (1, 3)  # NumPy refuses np.True_; a bool here


def test_every_axis_combination_4d():
    # Exhaustively: every subset and order of the axes of a 4-d view, with and without keepdims.
    rng = np.random.default_rng(7)
    base = rng.integers(-8, 8, (3, 4, 2, 5)).astype(np.float64) / 2
    base[1, 2, 0, 3] = -0.0
    x = base.transpose(2, 0, 3, 1)[:, ::-1]
    for r in range(0, 5):
        for axes in itertools.permutations(range(4), r):
            for op in ("sum", "max", "nanmin", "mean", "var", "count_nonzero", "all"):
                for keepdims in (False, True):
                    check_op(x, op, axes, keepdims)
    for axis in (None, 0, 1, 2, 3, -1, -4):
        for op in ARGS:
            check_op(x, op, axis, keepdims=False)
            check_op(x, op, axis, keepdims=True)


# -- explicit rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ALL_OPS)
def test_bad_axes_raise_numpys_exceptions(op):
    x = np.ones((2, 3))
    for axis in (2, -3):
        with pytest.raises(np.exceptions.AxisError):
            multireduce.reduce(x, op, axis=axis)
    if op in ARGS:
        with pytest.raises(TypeError, match="axis=None or a single int"):
            multireduce.reduce(x, op, axis=(0, 1))
    else:
        with pytest.raises(ValueError, match="repeated axis"):
            multireduce.reduce(x, op, axis=(0, -2))
        with pytest.raises(ValueError):
            np.sum(x, axis=(0, -2))


def test_zero_d_inputs():
    # The values too (only the types were checked): one element is the whole reduction.
    want = {"count_nonzero": 1, "any": True, "all": True}
    want.update({op: 0 for op in ARGS})
    want.update({op: 0.0 for op in CORRECTED})
    for op in ALL_OPS:
        x = np.array(3.0, dtype=np.float32)
        kw = {"axis": None}
        got = multireduce.reduce(x, op, **kw)
        assert isinstance(got, np.generic)
        assert got == want.get(op, 3.0), (op, got)
        assert got.dtype == {"count_nonzero": np.int64, "any": np.bool_, "all": np.bool_}.get(
            op, np.int64 if op in ARGS else np.float32
        ), (op, got.dtype)
        assert np.shape(multireduce.reduce(x, op, keepdims=True)) == ()
        assert multireduce.reduce(x, op, keepdims=True) == got
    for op, value in (("sum", 0.0), ("nansum", 0.0), ("max", -0.0), ("min", -0.0), ("prod", -0.0)):
        assert same_float(multireduce.reduce(np.array(-0.0), op), value), op  # sums of zeros are +0.0
    assert multireduce.argmax(np.array(5)) == 0
    assert multireduce.var(np.array(5.0)) == 0.0
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):  # as NumPy warns
        assert math.isnan(multireduce.var(np.array(5.0), correction=1))
    assert multireduce.sum(np.array(5.0), axis=()) == 5.0


def test_empty_results_follow_the_standard():
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        assert math.isnan(multireduce.mean(np.zeros(0)))
    assert multireduce.sum(np.zeros(0, np.float32)).dtype == np.float32
    assert multireduce.prod(np.zeros((2, 0)), axis=1).tolist() == [1.0, 1.0]
    assert multireduce.any(np.zeros(0)) == np.False_ and multireduce.all(np.zeros(0)) == np.True_
    assert multireduce.count_nonzero(np.zeros((0, 3)), axis=0).tolist() == [0, 0, 0]
    assert multireduce.max(np.zeros((0, 3)), axis=1).shape == (0,)  # nothing to reduce
    for op, message in [("max", "maximum"), ("nanmin", "fmin")]:
        with pytest.raises(ValueError, match=f"zero-size array to reduction operation {message} which has no identity"):
            multireduce.reduce(np.zeros((3, 0)), op, axis=1)
    with pytest.raises(ValueError, match="attempt to get argmax of an empty sequence"):
        multireduce.argmax(np.zeros((3, 0)), axis=1)
    with pytest.raises(ValueError, match="zero-size array to stats"):
        multireduce.stats(np.zeros(0))


def test_var_correction_follows_the_standard_not_numpy():
    x = np.array([1.0, 2.0])
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        assert math.isnan(multireduce.var(x, correction=2))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert np.var(x, ddof=2) == np.inf  # NumPy's answer, which the standard replaces
    assert multireduce.var(x, correction=1) == 0.5
    assert multireduce.std(x, correction=0.5) == math.sqrt(0.5 / 1.5)  # M2 = 0.5
    with pytest.raises(TypeError, match="does not take correction"):
        multireduce.reduce(x, "mean", correction=1)
    with pytest.raises(TypeError, match="correction must be a real number"):
        multireduce.var(x, correction="1")
    # correction=nan: NaN, as NumPy's ddof=nan, on every path (the array path divided by 1).
    m = np.arange(10.0).reshape(2, 5)
    for op in ("var", "std", "nanvar", "nanstd"):
        for axis in (None, 1, 0):
            got = np.asarray(multireduce.reduce(m, op, axis=axis, correction=math.nan))
            assert got.shape == np.shape(getattr(np, op)(m, axis=axis)) and np.all(np.isnan(got)), (op, axis, got)
        state = multireduce.partial(m, "var", axis=1)  # the Dask and MPI layers' finalize
        assert np.all(np.isnan(_stats.finalize_moments(state, OPS[op], np.dtype(np.float64), math.nan)))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_moments_of_narrow_floats_are_float64_rounded_once(dtype):
    # A documented difference: NumPy squares float32 (and float16) elements in their dtype,
    # where 3.4e38 (65504) overflows; the moments here are float64, rounded once at the end.
    x = np.random.default_rng(3).standard_normal(1000).astype(dtype)
    x[3] = np.finfo(dtype).max
    wide = x.astype(np.float64)
    want_std = math.sqrt(math.fsum((wide - math.fsum(wide) / wide.size) ** 2) / wide.size)
    assert multireduce.std(x) == np.asarray(want_std).astype(dtype) and math.isfinite(float(multireduce.std(x)))
    with np.errstate(over="ignore"):
        assert np.std(x) == np.inf  # NumPy's answer
        assert multireduce.mean(x) == np.asarray(math.fsum(wide) / wide.size).astype(dtype)


def test_moments_warnings_follow_numpy_and_point_at_the_caller():
    # NumPy decides var's "Degrees of freedom" warning by the number of elements, NaN
    # included (the value is NaN either way), and mean's "Mean of empty slice" by the shape;
    # only nanmean's depends on the data. Each case runs NumPy's own call beside ours: the
    # same warnings, and ours point at the caller's line.
    nan2, one_nan, row = np.array([np.nan, np.nan]), np.array([1.0, np.nan]), np.array([[np.nan, 2.0]])
    cases = [
        (lambda: multireduce.var(nan2), lambda: np.var(nan2)),
        (lambda: multireduce.var(one_nan, correction=1), lambda: np.var(one_nan, ddof=1)),
        (lambda: multireduce.std(row, axis=1, correction=1), lambda: np.std(row, axis=1, ddof=1)),
        (lambda: multireduce.var(np.array([np.nan]), correction=1), lambda: np.var(np.array([np.nan]), ddof=1)),
        (
            lambda: multireduce.std(np.ones((2, 3)), axis=1, correction=3),
            lambda: np.std(np.ones((2, 3)), axis=1, ddof=3),
        ),
        (lambda: multireduce.mean(np.zeros(0)), lambda: np.mean(np.zeros(0))),
        (lambda: multireduce.mean(np.zeros((0, 2)), axis=0), lambda: np.mean(np.zeros((0, 2)), axis=0)),
        (lambda: multireduce.nanmean(nan2), lambda: np.nanmean(nan2)),
        (lambda: multireduce.nanmean(one_nan), lambda: np.nanmean(one_nan)),
        # nanvar and nanstd count the non-NaN elements, and NumPy's message ends with a period.
        (lambda: multireduce.nanvar(nan2), lambda: np.nanvar(nan2)),
        (lambda: multireduce.nanvar(one_nan), lambda: np.nanvar(one_nan)),
        (lambda: multireduce.nanstd(one_nan, correction=1), lambda: np.nanstd(one_nan, ddof=1)),
        (lambda: multireduce.nanvar(row, axis=1, correction=1), lambda: np.nanvar(row, axis=1, ddof=1)),
        (lambda: multireduce.nanvar(np.zeros(0)), lambda: np.nanvar(np.zeros(0))),
        (lambda: multireduce.nanstd(np.ones((0, 2)), axis=0), lambda: np.nanstd(np.ones((0, 2)), axis=0)),
        (
            lambda: multireduce.nanvar(np.ones((2, 0)), axis=0, correction=1),
            lambda: np.nanvar(np.ones((2, 0)), axis=0, ddof=1),
        ),
        # Integer input: NumPy's nanvar is its var, words and empty results included.
        (
            lambda: multireduce.nanvar(np.array([1, 3], np.int8), correction=2),
            lambda: np.nanvar(np.array([1, 3], np.int8), ddof=2),
        ),
        (
            lambda: multireduce.nanstd(np.ones((2, 0), np.int32), axis=0, correction=3),
            lambda: np.nanstd(np.ones((2, 0), np.int32), axis=0, ddof=3),
        ),
        (
            lambda: multireduce.nanvar(np.zeros(0, np.int8), axis=(), correction=1),
            lambda: np.nanvar(np.zeros(0, np.int8), axis=(), ddof=1),
        ),
        # Empty results: NumPy still warns by the count of the reduced axes.
        (
            lambda: multireduce.var(np.ones((2, 0)), axis=0, correction=2),
            lambda: np.var(np.ones((2, 0)), axis=0, ddof=2),
        ),
        (
            lambda: multireduce.std(np.ones((2, 0)), axis=0, correction=3),
            lambda: np.std(np.ones((2, 0)), axis=0, ddof=3),
        ),
        (
            lambda: multireduce.var(np.ones((2, 0)), axis=0, correction=1),
            lambda: np.var(np.ones((2, 0)), axis=0, ddof=1),
        ),
        (lambda: multireduce.mean(np.ones((2, 0)), axis=0), lambda: np.mean(np.ones((2, 0)), axis=0)),
        (lambda: multireduce.var(np.ones((0, 2, 0)), axis=(0, 1)), lambda: np.var(np.ones((0, 2, 0)), axis=(0, 1))),
    ]
    for ours, theirs in cases:
        found = []
        for call in (ours, theirs):
            with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
                warnings.simplefilter("always")
                call()
            found.append([w for w in caught if issubclass(w.category, RuntimeWarning)])
        assert [str(w.message) for w in found[0]] == [str(w.message) for w in found[1]], found
        assert all(w.filename == __file__ for w in found[0]), [w.filename for w in found[0]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert math.isnan(multireduce.var(one_nan, correction=1)) and math.isnan(multireduce.nanmean(nan2))
    assert multireduce.nanmean(one_nan) == 1.0
    assert multireduce.nanvar(one_nan) == 0.0 and multireduce.nanstd(np.array([1.0, np.nan, 3.0])) == 1.0


def test_infinite_elements_warn_in_var_as_numpy_and_not_in_mean():
    # var of an infinite element subtracts an infinite mean from it: NumPy warns "invalid
    # value encountered in subtract" (the CPU's moments computed it silenced); its mean
    # subtracts nothing and is silent. With a NaN beside the infinity, NumPy's var subtracts
    # a NaN mean and is silent, and its nanvar warns.
    for values in ([np.inf, 1.0], [-np.inf, -np.inf], [np.inf, 0.0, np.nan], [np.nan, np.inf, -np.inf], [1.0, 2.0]):
        x = np.array(values)
        for ours, theirs, axis in [
            (multireduce.var, np.var, None),
            (multireduce.std, np.std, None),
            (multireduce.nanvar, np.nanvar, None),
            (multireduce.var, np.var, 0),
            (multireduce.mean, np.mean, 0),
        ]:
            found = []
            for call in (ours, theirs):
                view = x.reshape(-1, 1) if axis == 0 else x  # axis 0 of a column: the moments' other path
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    call(view, axis=axis)
                found.append(sorted({str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)}))
            assert found[0] == found[1], (values, ours, axis, found)


@pytest.mark.parametrize("name", ["var", "std", "nanvar", "nanstd", "mean", "nanmean"])
def test_invalid_value_warnings_are_decided_per_slice_as_numpy(name):
    # The CPU's moments decide NumPy's invalid-value warnings from each slice's merged state,
    # not per 1 MiB block: a NaN in one block and +inf in another warned "in subtract" where
    # NumPy's var is silent (a review's case); +inf and -inf in two blocks warned "in add" and
    # "in subtract" where NumPy warns "in reduce"; over axis 0, a NaN in another column of the
    # same block silenced the infinity's column, where NumPy warns. (NaN with both infinities
    # in one slice is left out: NumPy's own warning depends on its order of additions.)
    n = 262144 + 7  # two CPU blocks and a bit
    patterns = {
        "nan, then inf in the next block": {5: np.nan, 200_000: np.inf},
        "+inf, then -inf in the next block": {5: np.inf, 200_000: -np.inf},
        "+inf in two blocks": {5: np.inf, 200_000: np.inf},
        "-inf in the second block": {200_000: -np.inf},
        "inf and nan in one block": {5: np.inf, 7: np.nan},
        "finite": {},
        # finite elements whose float64 sum overflows both ways (a review's case): NaN total
        "sums past the range both ways": {5: 1e308, 6: 1e308, 200_000: -1e308, 200_001: -1e308},
    }
    for pattern, values in patterns.items():
        x = np.ones(n)
        for i, v in values.items():
            x[i] = v
        for axis, view in ((None, x), (0, x[:262144].reshape(-1, 64)), (1, x[:262144].reshape(64, -1))):
            found = []
            for call in (getattr(multireduce, name), getattr(np, name)):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    call(view, axis=axis)
                # (the overflow of squares says "in multiply" here, "in square" in NumPy)
                found.append(sorted({str(w.message) for w in caught if "invalid value" in str(w.message)}))
            assert found[0] == found[1], (pattern, axis, found)
    # NumPy's errstate applies to them as to NumPy's own.
    x = np.ones(n)
    x[200_000] = np.inf
    call = getattr(multireduce, name)
    with np.errstate(invalid="raise"):
        if name in ("mean", "nanmean"):
            assert call(x) == np.inf  # subtracts nothing: nothing raised
        else:
            with pytest.raises(FloatingPointError, match="invalid value encountered in subtract"):
                call(x)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("error")
        call(x)


@pytest.mark.parametrize("name", ["var", "std", "nanvar", "nanstd", "mean", "nanmean", "stats"])
def test_overflow_warnings_are_decided_per_slice_as_numpy(name):
    # The CPU's moments decide NumPy's overflow warnings from each slice's merged state too,
    # not per block with whatever overflowed there: var([1.0, nan, 1e200]) warned "overflow
    # encountered in multiply" where NumPy's var is NaN and silent (its deviations from a
    # NaN mean are NaN), and mean over axis 0 of [[1.7e308, nan, 1.7e308]].T warned "in
    # reduce" where the same data over axis 1 (NumPy's sum) did not. An overflow in Chan's
    # update of two blocks' states warned nothing. stats warns as var (its var is NaN where
    # a NaN is); its reference is var's warnings and value. (An infinity with a one-way
    # overflow of the finite elements' sum is left out: the state's total holds the
    # infinity, and NumPy's warning depends on its order of additions there.)
    n = 262144 + 7  # two CPU blocks and a bit
    patterns = {
        "squares past the range in two blocks": {5: 1e200, 200_000: -1e200},
        "squares past the range in one block": {5: 1e200, 6: -1e200},
        "squares past the range, NaN in the next block": {5: 1e200, 6: -1e200, 200_000: np.nan},
        "squares past the range, NaN before them": {3: np.nan, 5: 1e200, 6: -1e200},
        "the sum past the range one way": {5: 1.7e308, 6: 1.7e308},
        # NumPy's pairwise sum overflows in the lanes without the NaN: every op warns
        "the sum past the range, NaN in the next block": {5: 1.7e308, 6: 1.7e308, 200_000: np.nan},
        # squares that fit, whose sum does not: NumPy's "in reduce", not "in square"
        "squares that fit, their sum past the range": {5: 1.2e154, 200_000: -1.2e154},
        "finite": {5: 1e150, 200_000: -1e150},
    }
    ours = (lambda v, axis: multireduce.stats(v, axis=axis).var) if name == "stats" else getattr(multireduce, name)
    theirs = np.var if name == "stats" else getattr(np, name)
    checked = 0
    for pattern, values in patterns.items():
        x = np.ones(n)
        for i, v in values.items():
            x[i] = v
        for axis, view in (
            (None, x),
            (0, x[:262144].reshape(-1, 64)),
            (1, x[:262144].reshape(64, -1)),
            (0, x[:, None]),
        ):
            found = []
            for call in (ours, theirs):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    value = call(view, axis=axis)
                found.append(
                    (np.isnan(value).tolist(), np.isinf(value).tolist(), sorted({str(w.message) for w in caught}))
                )
            assert found[0] == found[1], (pattern, axis, found)
            checked += any("overflow" in m for m in found[1][2])
    assert checked >= (3 if name in ("mean", "nanmean") else 10)
    # NumPy's errstate applies to them as to NumPy's own.
    x = np.ones(n)
    x[5], x[200_000] = 1e200, -1e200
    call = (lambda v: multireduce.stats(v).var) if name == "stats" else getattr(multireduce, name)
    with np.errstate(over="raise"):
        if name in ("mean", "nanmean"):
            assert np.isfinite(call(x))  # squares nothing: nothing raised
        else:
            with pytest.raises(FloatingPointError, match="overflow encountered in"):
                call(x)
    with np.errstate(over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("error")
        call(x)


def test_column_means_give_numpys_sum_warnings_once():
    # The column mean's block sums ran under errstate(all="call"), and NumPy names the
    # invalid flag "invalid value": +inf with -inf in a column gave NaN without the warning,
    # and errstate(invalid="raise") did not raise.
    x = np.array([[1.0, 1.0], [np.inf, 1.0], [-np.inf, 1.0]] * 700)  # two blocks of rows
    for view, axis in ((x, 0), (np.asfortranarray(x.T), 1), (x.reshape(3, 700, 2), 1)):
        found = []
        for call in (multireduce.mean, np.mean):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = call(view, axis=axis)
            found.append((np.isnan(value).tolist(), [str(w.message) for w in caught]))
        assert found[0] == found[1], found
        assert found[0][1] == ["invalid value encountered in reduce"]
        with np.errstate(invalid="raise"), pytest.raises(FloatingPointError, match="invalid value"):
            multireduce.mean(view, axis=axis)
    y = np.full((3000, 4), 1e308)  # one way, over several blocks: once, as NumPy's one reduction
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert np.isinf(multireduce.mean(y, axis=0)).all()
    assert [str(w.message) for w in caught] == ["overflow encountered in reduce"]


@pytest.mark.parametrize("name", ["var", "std", "nanvar", "nanstd", "mean", "nanmean", "stats"])
def test_no_underflow_of_the_moments_own_steps(name):
    # Under errstate(under="raise") (or all="raise"), float64 data holding a subnormal raised
    # "underflow encountered in divide" from an internal test of the block's mean, where
    # NumPy's var and mean give their values.
    y = np.array([1e-310, 3.0, 3.0, 1.0])
    ours = (lambda v, axis: multireduce.stats(v, axis=axis).var) if name == "stats" else getattr(multireduce, name)
    theirs = np.var if name == "stats" else getattr(np, name)
    with np.errstate(all="raise"):
        for view, axis in ((y, None), (y[:, None], 0), (np.stack([y, y]), 1)):
            np.testing.assert_allclose(ours(view, axis=axis), theirs(view, axis=axis), rtol=1e-15)


def test_stats_keeps_the_overflow_of_its_var():
    # stats over an axis silenced every RuntimeWarning of its var with a warnings filter (to
    # drop "Degrees of freedom", which stats does not give), the overflow too, which the full
    # reduction and var warn; and the filter was process-wide, not this call's.
    z = np.array([[3e38, -3e38]], np.float32)
    for axis in (1, None):
        found = []
        calls = (
            lambda a=axis: multireduce.stats(z, axis=a).var,
            lambda a=axis: multireduce.var(z, axis=a),
            lambda a=axis: np.var(z, axis=a),
        )
        for call in calls:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = call()
            found.append((np.isinf(value).tolist(), [str(w.message) for w in caught]))
        assert found[0] == found[1] == found[2] and len(found[0][1]) == 1, (axis, found)
    with warnings.catch_warnings():  # N - correction <= 0: NaN, silently, as before
        warnings.simplefilter("error")
        assert np.isnan(multireduce.stats(np.ones((2, 1)), axis=1, correction=1).var).all()


@pytest.mark.parametrize("name", ["var", "std", "nanvar", "nanstd"])
@pytest.mark.parametrize("axis", [None, 1])
def test_degrees_of_freedom_and_invalid_value_warnings_in_numpys_order(name, axis):
    # np.var warns "Degrees of freedom <= 0 for slice" before it sums (then "invalid value
    # encountered in reduce/subtract"); np.nanvar warns it last. Ours warned the invalid value
    # first for var and std, which mattered under simplefilter("error") or
    # errstate(invalid="raise"): the first warning is the exception raised.
    for values, correction in (([np.inf], 1), ([1.0, np.inf], 2), ([np.inf, -np.inf], 2), ([np.nan, np.inf], 3)):
        x = np.array([values, values]) if axis == 1 else np.array(values)
        found = []
        for call in (
            lambda x=x, c=correction: getattr(multireduce, name)(x, axis=axis, correction=c),
            lambda x=x, c=correction: getattr(np, name)(x, axis=axis, ddof=c),
        ):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                call()
            found.append([str(w.message) for w in caught])
        assert found[0] == found[1], (values, correction, found)
        silenced = np.isnan(values).any() and not name.startswith("nan")  # NaN: var is silent
        assert len(found[1]) == (1 if silenced else 2), found
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning) as ours:
                getattr(multireduce, name)(x, axis=axis, correction=correction)
            with pytest.raises(RuntimeWarning) as numpys:
                getattr(np, name)(x, axis=axis, ddof=correction)
        assert str(ours.value) == str(numpys.value)


def test_signed_zeros_and_nan_rules():
    x = np.array([0.0, -0.0, 1.0, -1.0])[[1, 0, 1]]  # -0.0, +0.0, -0.0
    assert same_float(multireduce.max(x), 0.0) and same_float(multireduce.min(x), -0.0)
    assert multireduce.argmax(x) == 1 and multireduce.argmin(x) == 0
    assert np.argmax(x) == 0  # NumPy takes the first zero of either sign
    assert multireduce.argmax(x[::-1]) == 1 and multireduce.argmin(x[::-1]) == 0
    assert same_float(multireduce.sum(np.array([-0.0, -0.0])), 0.0)
    assert same_float(multireduce.prod(np.array([-0.0])), -0.0)
    y = np.array([1.0, np.nan, 3.0, np.nan])
    assert multireduce.argmax(y) == 1 and multireduce.argmin(y) == 1  # first NaN, as NumPy
    assert multireduce.nanmax(y) == 3.0 and multireduce.nanmin(y) == 1.0
    assert multireduce.nansum(y) == 4.0 and multireduce.nanmean(y) == 2.0
    assert math.isnan(multireduce.nanmax(np.array([np.nan, np.nan])))
    with pytest.warns(RuntimeWarning, match="invalid value"):  # inf - inf, as NumPy warns
        assert math.isnan(multireduce.nansum(np.array([np.inf, -np.inf, np.nan])))
    assert multireduce.count_nonzero(y) == 4 and multireduce.all(y)
    assert same_float(multireduce.nanmax(np.array([np.nan, -0.0, 0.0])), 0.0)


def test_integer_and_bool_inputs():
    b = np.array([[True, False, True], [True, True, True]])
    assert multireduce.sum(b, axis=1).tolist() == [2, 3] and multireduce.sum(b).dtype == np.int64
    assert multireduce.prod(b).dtype == np.int64
    assert multireduce.mean(b).dtype == np.float64 and multireduce.mean(b) == 5 / 6
    assert multireduce.max(b).dtype == np.bool_
    assert multireduce.argmin(b) == 1
    u = np.array([2**63, 2**63, 3], dtype=np.uint64)
    assert multireduce.sum(u) == 3 and multireduce.sum(u).dtype == np.uint64  # wraps as NumPy
    assert multireduce.prod(np.array([2**32, 2**32 + 1], np.int64)) == np.prod(np.array([2**32, 2**32 + 1]))
    big = np.array([2**62, 2**62, 2**62], dtype=np.int64)
    s = multireduce.stats(big)
    assert s.sum == -(2**62) and s.sum.dtype == np.int64  # the sum field is multireduce.sum's


# -- stats -----------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_stats_fields_equal_the_single_ops(data):
    x = data.draw(cases())
    axis = data.draw(axes_for(x.ndim))
    correction = data.draw(st.sampled_from([0, 1]))
    axes = _norm_axes(axis, x.ndim)
    if math.prod(x.shape[a] for a in axes) == 0:
        with pytest.raises(ValueError):
            multireduce.stats(x, axis=axis)
        return
    with _quiet_ctx():
        s = multireduce.stats(x, axis=axis, correction=correction)
        expected = {
            "sum": multireduce.sum(x, axis=axis),
            "min": multireduce.min(x, axis=axis),
            "max": multireduce.max(x, axis=axis),
        }
    for name in ("sum", "min", "max"):
        _bits_equal(getattr(s, name), expected[name])
    n = math.prod(x.shape[a] for a in axes)
    assert np.all(s.count == n) and s.count.dtype == np.int64
    nan_ref = np.sum(np.isnan(x), axis=axis) if x.dtype.kind == "f" else np.zeros(np.shape(s.count), np.int64)
    _bits_equal(np.asarray(s.nan_count), np.asarray(nan_ref, dtype=np.int64))
    check_stats_moments(x, axis, s, correction)


def check_stats_moments(x, axis, s, correction):
    f = np.asarray(x, dtype=np.float64)
    with _quiet_ctx():
        mean = np.mean(f, axis=axis)
        var = np.var(f, axis=axis, ddof=correction)
    n = np.asarray(s.count)
    var = np.where(n - correction <= 0, np.nan, var)
    dt = np.asarray(s.mean).dtype
    eps = float(np.finfo(dt).eps)
    finite = np.abs(f[np.isfinite(f)])
    scale = float(finite.max()) if finite.size else 1.0
    close(s.mean, mean, dt, atol=(1e-13 + eps) * scale, rtol=2 * eps)
    close(s.var, var, dt, atol=(1e-13 + eps) * scale * scale + 1e-300, rtol=2 * eps)


def test_stats_variance_is_accurate_where_the_textbook_formula_cancels():
    # Mean 1e9, spread 1: E[x^2] - E[x]^2 loses every digit in float64; Chan's merge of
    # 1 MiB blocks, their means taken less a base element, keeps float64's accuracy.
    rng = np.random.default_rng(3)
    x = 1e9 + rng.standard_normal(3 * _stats.BLOCK_BYTES // 8 + 17)
    s = multireduce.stats(x)
    values = x.tolist()
    mean = math.fsum(values) / x.size
    exact = math.fsum((v - mean) ** 2 for v in values) / x.size
    assert abs(float(s.var) - exact) <= 1e-13 * exact
    assert abs(float(multireduce.var(x)) - exact) <= 1e-13 * exact
    textbook = float(np.mean(x * x) - np.mean(x) ** 2)
    assert abs(textbook - exact) > 1e-3 * exact  # the case is one where cancellation bites


@pytest.mark.parametrize("data", ["float64", "int64"])
@pytest.mark.parametrize(("shape", "axis"), [((10**6,), None), ((1000, 1000), 0), ((1000, 1000), 1), ((2000, 8), 0)])
def test_variance_far_from_zero_is_as_accurate_as_near_zero(data, shape, axis):
    # Timestamps (1.7e9 s, spread 1 s) and int64 ids near 1e12: var is shift-invariant, and x
    # less the offset is exact here, so its float64 variance is the reference. The block means
    # were rounded at 1.7e9's ulp (2.4e-7) before Chan's merges: 2e-11 relative over the whole
    # array, 1.2e-7 over axis 0 (int64: 2.5e-6), where NumPy's own error is 6e-15 to 1e-10.
    rng = np.random.default_rng(sum(shape))
    if data == "float64":
        offset, x = 1.7e9, 1.7e9 + rng.standard_normal(shape)
    else:
        offset, x = 10**12, 10**12 + rng.integers(0, 20, shape)
    shifted = (x - offset).astype(np.float64)  # exact
    want = np.var(shifted, axis=axis)
    for got in (multireduce.var(x, axis=axis), multireduce.stats(x, axis=axis).var):
        assert np.all(np.abs(np.asarray(got) - want) <= 1e-13 * want), np.max(np.abs(got - want) / want)
    # The mean: NumPy's formula (the float64 total over n), within its rounding.
    mean = np.asarray(multireduce.mean(x, axis=axis), np.float64) - offset
    count = x.size if axis is None else x.shape[axis]
    assert np.all(np.abs(mean - np.mean(shifted, axis=axis)) <= 2.0**-52 * math.log2(count) * offset)


def _far_from_zero(data, shape, seed):
    # (x, offset): timestamps near 1.7e9 s with a spread of 1 s, int64 ids near 1e12, float32
    # near 1e4; x less the offset is exact in float64.
    rng = np.random.default_rng(seed)
    offset = {"float64": 1.7e9, "int64": 10**12, "float32": 1e4}[data]
    if data == "int64":
        return offset + rng.integers(0, 20, shape), offset
    return (offset + rng.standard_normal(shape)).astype(data), offset


@pytest.mark.parametrize("data", ["float64", "int64", "float32"])
@pytest.mark.parametrize("parts", [2, 3, 7, 16, 64])
def test_variance_far_from_zero_keeps_its_accuracy_across_parts(data, parts):
    # States merged across parts (what MPI ranks and Dask chunks merge) carried float64 means:
    # Chan's d = mean_b - mean_a was rounded at 1.7e9's ulp, and the variance of those
    # timestamps in 2 to 64 parts kept 1e-10 to 4e-10 relative, int64 near 1e12 1e-9 to
    # 1.3e-8. With the states' low parts (Moments.mean_lo) within 1e-13, as one state.
    x, offset = _far_from_zero(data, 2**20 + 3, parts)
    want = np.var(x.astype(np.float64) - offset)
    states = [multireduce.partial(p, "var") for p in np.array_split(x, parts)]
    records = np.concatenate([_stats.to_structured(s).astype(_stats.moments_dtype(x.dtype)).reshape(1) for s in states])
    stacked = _stats.merge_stacked(
        _stats.Moments(*(np.stack([getattr(s, f) for s in states]) for f in _stats._MOMENTS_FIELDS))
    )
    for merged in (_stats.merge_all(states), _stats.merge_records(records), stacked):
        got = float(merged.m2) / x.size
        assert abs(got - want) <= 1e-13 * want, (abs(got - want) / want, parts)
        assert math.isfinite(float(merged.mean_lo)) and abs(float(merged.mean_lo)) <= 1e-6 * abs(float(merged.mean))


@pytest.mark.parametrize("data", ["float64", "int64"])
@pytest.mark.parametrize(("shape", "axis"), [((3000, 500), 0), ((500, 3000), 1)])
def test_variance_far_from_zero_over_an_axis_keeps_its_accuracy_across_parts(data, shape, axis):
    # The same for states over an axis (arrays of states, merged by the vectorized merge), the
    # parts split along the reduced axis, one of them with a NaN that nanvar skips.
    x, offset = _far_from_zero(data, shape, sum(shape) + axis)
    want = np.var(x.astype(np.float64) - offset, axis=axis)
    for op in ("var", "nanvar"):
        y = x.astype(np.float64) if op == "nanvar" else x
        if op == "nanvar":
            np.moveaxis(y, axis, 0)[5] = np.nan  # not the base (each slice's first element)
            want = np.nanvar(y - offset, axis=axis)
        states = [multireduce.partial(p, op, axis=axis) for p in np.array_split(y, 7, axis=axis)]
        merged = _stats.merge_all(states)
        got = _stats.finalize_moments(merged, OPS[op], np.dtype(np.float64))
        assert np.all(np.abs(got - want) <= 1e-13 * want), np.max(np.abs(got - want) / want)


def test_means_across_parts_do_not_take_the_low_parts():
    # The merged mean is the update of the float64 means alone: the low parts are rounded at
    # the scale of the elements' distance from the base, coarser than the mean where the
    # base is an outlier or the data sit near zero (a review's cases: [1, 3] | [0] | [-3]
    # gave 0.2500000000000002 where NumPy and the exact mean give 0.25; an outlier of 1e6
    # first among 2000 uniforms, 3.8e-14 relative where the update of the means is 1.8e-16).
    rng = np.random.default_rng(0)
    outlier = rng.random(2000)
    outlier[0] = 1e6
    stamps = 1.7e9 + rng.random(10**5)
    stamps[0] = 1.7e15
    cases = [
        (np.array([1.0, 3.0, 0.0, -3.0]), [2, 3]),
        (outlier, [1000]),
        (stamps, [25_000, 50_000, 75_000]),
        (rng.standard_normal(10_000), list(range(1250, 10_000, 1250))),
        (np.array([1.0, 1e17, 1.0, -1e17]), [2, 3]),
    ]
    for x, cuts in cases:
        states = [multireduce.partial(p, "mean") for p in np.split(x, cuts)]
        plain = [dataclasses.replace(st, mean_lo=np.zeros_like(st.mean_lo)) for st in states]
        got, without = _stats.merge_all(states), _stats.merge_all(plain)
        assert float(got.mean) == float(without.mean), (x[:4], float(got.mean), float(without.mean))
        exact = Fraction(sum(Fraction(v) for v in x.tolist()), x.size)
        assert abs(Fraction(float(got.mean)) - exact) <= 2.0**-50 * max(1.0, float(np.mean(np.abs(x)))), x[:4]
    assert float(_stats.merge_all([multireduce.partial(p, "mean") for p in np.split(cases[0][0], [2, 3])]).mean) == 0.25


def test_nanvar_far_from_zero_with_a_nan_first():
    # The base is the first finite element among a slice's first 32: a NaN first (a missing
    # sample) left the means absolute (base 0), and nanvar of timestamps kept 4e-11 in one
    # reduction and 2e-10 across parts.
    rng = np.random.default_rng(8)
    x = 1.7e9 + rng.standard_normal(2**20)
    x[:3] = np.nan
    x[2**19 : 2**19 + 20] = np.nan  # the second part's first 20: its base is its 21st element
    want = np.nanvar(x - 1.7e9)
    assert abs(float(multireduce.nanvar(x)) - want) <= 1e-13 * want
    merged = _stats.merge_all([multireduce.partial(p, "nanvar") for p in np.array_split(x, 2)])
    got = float(merged.m2) / int(merged.n)
    assert abs(got - want) <= 1e-13 * want, abs(got - want) / want
    rows = x.reshape(64, -1)
    rows[:, 0] = np.nan
    want = np.nanvar(rows - 1.7e9, axis=1)
    got = multireduce.nanvar(rows, axis=1)
    assert np.all(np.abs(got - want) <= 1e-13 * want), np.max(np.abs(got - want) / want)


@pytest.mark.parametrize("lead", [32, 33, 1000, 2**17 + 5, 3 * 2**20])
def test_nanvar_far_from_zero_behind_a_run_of_nans(lead):
    # A series that starts with a run of missing samples: the base is the slice's first
    # finite element wherever it is (a later CPU block's, 2**17 + 5: past the first block).
    # Among the first 32 only, the means stayed absolute behind such a run, and nanvar of
    # timestamps kept 4e-11 to 2e-10 in one reduction.
    rng = np.random.default_rng(lead)
    x = 1.7e9 + rng.standard_normal(2**22)
    x[rng.random(x.size) < 0.01] = np.nan
    x[:lead] = np.nan
    want = np.nanvar(x - 1.7e9)
    for got in (multireduce.nanvar(x), multireduce.nanstd(x) ** 2):
        assert abs(float(got) - want) <= 1e-13 * want, abs(float(got) - want) / want
    merged = _stats.merge_all([multireduce.partial(p, "nanvar") for p in np.array_split(x, 5)])
    assert abs(float(merged.m2) / int(merged.n) - want) <= 1e-13 * want
    # Rows with runs of every length up to the whole row (all NaN: NaN, with NumPy's warning).
    rows = x[: 64 * 8192].reshape(64, 8192).copy()
    for i in range(64):
        rows[i, : [0, 31, 32, 33, 500, 4000, 8191, 8192][i % 8] + i] = np.nan
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanvar(rows - 1.7e9, axis=1)
        got = np.asarray(multireduce.nanvar(rows, axis=1))
        # and as columns (the column path, blocks of 1024 rows: runs past the first block)
        cols = np.ascontiguousarray(rows.T)
        got_cols = np.asarray(multireduce.nanvar(cols, axis=0))
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want).sum() >= 7
    ok = ~np.isnan(want)
    assert np.all(np.abs(got[ok] - want[ok]) <= 1e-13 * want[ok]), np.max(np.abs(got[ok] - want[ok]) / want[ok])
    assert np.array_equal(np.isnan(got_cols), np.isnan(want))
    assert np.all(np.abs(got_cols[ok] - want[ok]) <= 1e-13 * want[ok])


def test_base_search_reaches_past_the_first_block():
    # _shift_base over the whole block, and _merged_blocks moving a slice's state to a base
    # found in a later block: the state of the NaN-only blocks (n = 0) is unchanged, and an
    # infinite or huge element before the first base leaves the result as NumPy's.
    b = np.full((3, 100), np.nan)
    b[0, 50] = 7.0
    b[1, 0] = 2.0
    b[2, 10] = np.inf
    b[2, 20] = 2.0**961
    base, none = _stats._shift_base(b, 1)
    assert base.tolist() == [7.0, 2.0, 0.0] and none.tolist() == [False, False, True]
    base, none = _stats._shift_base(b, 1, only=np.array([True, False, False]))
    assert base[0] == 7.0 and none is None  # the others are not looked at
    work = _stats._work_buffers(b.size)
    assert _stats._shift_base(b, 1, work=work)[0].tolist() == [7.0, 2.0, 0.0]
    c = np.ascontiguousarray(b.T)  # along a leading axis, and a huge first finite element
    c[5, 2] = 2.0**1000
    c[30, 2] = 3.0
    base, none = _stats._shift_base(c, 0, work=work)
    assert base.tolist() == [7.0, 2.0, 3.0] and none is None
    c[30, 2] = np.nan
    base, none = _stats._shift_base(c, 0, work=work)
    assert base.tolist() == [7.0, 2.0, 0.0] and none.tolist() == [False, False, True]
    y = np.full(3 * 2**17, np.nan)
    y[2**17 + 9 :] = 1.7e9 + np.random.default_rng(3).standard_normal(2**18 - 9)
    want = np.nanvar(y - 1.7e9)
    assert abs(float(multireduce.nanvar(y)) - want) <= 1e-13 * want
    y[5] = np.inf
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert np.isnan(float(multireduce.nanvar(y))) and np.isnan(np.nanvar(y))
        assert float(multireduce.nanmean(y)) == np.inf == np.nanmean(y)


def test_integer_states_hold_the_mean_rounded_once():
    # An integer state's mean is its exact total over n where the total cannot have wrapped
    # (the finalized mean's rule), not the base added back to the shifted mean, which errs
    # at the base's distance: -9 first among zeros gave 1.7e-14 relative on the GPU (a
    # hypothesis case), where this is exact.
    x = np.zeros((9, 14), np.int16)
    x[0, :2] = [-9, -2]
    for state in (multireduce.partial(x, "mean"), multireduce.partial(x, "var", axis=(0, 1))):
        assert float(state.mean) == -11 / 126
    rows = multireduce.partial(x.astype(np.int64) * 10**12 + 7, "var", axis=1)
    totals = (x.astype(np.int64) * 10**12 + 7).sum(axis=1)
    assert [float(m) for m in rows.mean] == [int(t) / 14 for t in totals]


def test_the_low_part_of_a_mean():
    # mean + mean_lo is the mean at the spread's precision: 1.7e9 + [0.1, 0.2, 0.3] has the
    # exact mean 1.7e9 + 0.2 (up to the elements' own roundings), which float64 rounds at 2.4e-7.
    x = 1.7e9 + np.array([0.1, 0.2, 0.3])
    exact = Fraction(sum(Fraction(v) for v in x.tolist()), 3)
    halves = _stats.merge_all([multireduce.partial(p, "mean") for p in (x[:1], x[1:])])
    for state in (multireduce.partial(x, "mean"), halves):
        assert abs(Fraction(float(state.mean)) + Fraction(float(state.mean_lo)) - exact) < 1e-15
        assert abs(Fraction(float(state.mean)) - exact) > 1e-9  # the mean alone cannot
    # 0 where there is no mean to refine: no element, an infinite one, NaN
    for values in ([], [np.inf, 1.0], [np.inf, -np.inf], [np.nan]):
        with np.errstate(invalid="ignore"):
            assert float(multireduce.partial(np.array(values, dtype=np.float64), "nanvar").mean_lo) == 0.0
    empty = _stats.empty_moments(np.dtype(np.float64))
    state = multireduce.partial(x, "mean")
    assert _stats.merge(state, empty).mean_lo == state.mean_lo == _stats.merge(empty, state).mean_lo


def test_integer_means_beyond_the_exact_bound_keep_their_accuracy():
    # Past n * max|x| >= 2**62 an integer mean is the state's float64 mean. A base of 2**62
    # (the first element) rounded the means less it at 2**62's scale: mean([2**62, -2**62,
    # 1, 2]) was 0.0 (then 1.125, from a residual of inexact deviations), not 0.75.
    x = np.array([2**62, -(2**62), 1, 2], dtype=np.int64)
    assert multireduce.mean(x) == 0.75 and multireduce.stats(x).mean == 0.75
    assert multireduce.mean(x.reshape(1, 4), axis=1)[0] == 0.75 and multireduce.mean(x.reshape(4, 1), axis=0)[0] == 0.75
    rng = np.random.default_rng(2)
    y = rng.integers(-(2**62), 2**62, 393_216, dtype=np.int64)
    exact = Fraction(sum(int(v) for v in y.tolist()), y.size)
    for got in (multireduce.mean(y), multireduce.stats(y).mean, multireduce.mean(y.reshape(-1, 3), axis=(0, 1))):
        assert abs(Fraction(float(got)) - exact) <= 1e-14 * abs(exact), (float(got), float(exact))


def test_variance_and_mean_with_an_outlier_for_the_base():
    # The base of the block means is a slice's first element: an outlier there (1e30 among
    # standard normals) must cost neither the mean (the total over n) nor the variance.
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 400_001))
    x[:, 0] = [1e30, -1e30, 1e6]
    for axis in (1, None):
        values = [x[i].tolist() for i in range(3)] if axis == 1 else [x.ravel().tolist()]
        means = [math.fsum(v) / len(v) for v in values]
        exact = [math.fsum((e - m) ** 2 for e in v) / len(v) for v, m in zip(values, means, strict=True)]
        got_mean = np.atleast_1d(np.asarray(multireduce.mean(x, axis=axis)))
        got_var = np.atleast_1d(np.asarray(multireduce.var(x, axis=axis)))
        scale = np.array([math.fsum(abs(e) for e in v) / len(v) for v in values])
        assert np.all(np.abs(got_mean - means) <= 2.0**-52 * 32 * scale), (got_mean, means)
        assert np.all(np.abs(got_var - exact) <= 1e-13 * np.array(exact)), (got_var, exact)


@pytest.mark.parametrize(("shape", "axis"), [((3, 200_003), 1), ((200_003, 3), 0), ((2, 70_001, 3), (0, 1))])
def test_moments_over_many_blocks_along_any_axis(shape, axis):
    # Several 1 MiB blocks per output element (and a transposing copy for axis 0).
    rng = np.random.default_rng(17)
    x = rng.standard_normal(shape) * 5 + 1e4
    x[(0,) * x.ndim] = -0.0
    # Exact references per output element (math.fsum), not NumPy's: NumPy sums along axis 0
    # sequentially and is less accurate here than the blocked pairwise sums merged by Chan.
    axes = _norm_axes(axis, x.ndim)
    kept = [a for a in range(x.ndim) if a not in axes]
    rows = np.transpose(x, kept + list(axes)).reshape(-1, math.prod(x.shape[a] for a in axes))
    means = [math.fsum(r.tolist()) / r.size for r in rows]
    vars_ = [math.fsum((v - m) ** 2 for v in r.tolist()) / (r.size - 1) for r, m in zip(rows, means, strict=True)]
    ref_mean = np.array(means).reshape([x.shape[a] for a in kept])
    close(multireduce.mean(x, axis=axis), ref_mean, np.dtype(np.float64), atol=0, rtol=1e-14)  # ~eps * log2(n)
    ref_var = np.array(vars_).reshape(ref_mean.shape)
    close(multireduce.var(x, axis=axis, correction=1), ref_var, np.dtype(np.float64), atol=0, rtol=1e-12)
    s = multireduce.stats(x, axis=axis)
    _bits_equal(s.min, ref_extreme(x, "min", _norm_axes(axis, x.ndim)))
    _bits_equal(s.max, np.max(x, axis=axis))
    assert np.all(s.count == x.size // np.asarray(ref_mean).size)


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # inf - inf, as NumPy
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int16", "bool"])
@pytest.mark.parametrize(
    ("shape", "axis"),
    [
        ((3000, 70), 0),
        ((2, 2500, 66), 1),
        ((5, 300, 70), (0, 1)),
        ((1100, 1, 80), 0),
        # A short reduced axis under a long kept run: one block's rows, runs past 4096 columns.
        ((3, 9000), 0),
        ((4, 2, 17000), (0, 1)),
    ],
)
def test_moments_over_leading_axes_read_in_memory_order(monkeypatch, dtype, shape, axis):
    # A C-contiguous array reduced over adjacent axes followed by a kept run of at least 64
    # bytes goes through the column path (blocks read in memory order; moving the reduced
    # axes last read them a cache line per element). Against exact references per column,
    # with NaN, infinities and signed zeros at block edges; extremes bit for bit.
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 50 + 3).astype(dtype) if dtype != "bool" else rng.random(shape) < 0.4
    axes = _norm_axes(axis, x.ndim)
    flat = x.reshape(-1)
    if dtype.startswith("float"):
        flat[[0, (1025 * shape[-1]) % flat.size, flat.size - 1]] = [-0.0, np.inf, np.nan]
    monkeypatch.setattr(_stats, "_split_axes", lambda *a: pytest.fail("took the row path"))
    s = multireduce.stats(x, axis=axis, correction=1)
    monkeypatch.undo()
    kept = [a for a in range(x.ndim) if a not in axes]
    rows = np.transpose(x, kept + list(axes)).reshape(-1, math.prod(x.shape[a] for a in axes)).astype(np.float64)
    ref_mean, ref_var = [], []
    for r in rows:
        if np.isnan(r).any() or np.isinf(r).any():
            ref_mean.append(np.mean(r))
            ref_var.append(np.nan)
            continue
        m = math.fsum(r.tolist()) / r.size
        ref_mean.append(m)
        ref_var.append(math.fsum((v - m) ** 2 for v in r.tolist()) / (r.size - 1))
    kshape = s.count.shape
    dt = np.asarray(s.mean).dtype
    eps = float(np.finfo(dt).eps)
    scale = 60.0 if dtype != "bool" else 1.0
    close(s.mean, np.array(ref_mean).reshape(kshape), dt, atol=1e-14 * scale, rtol=2 * eps)
    close(s.var, np.array(ref_var).reshape(kshape), dt, atol=1e-12 * scale * scale, rtol=4 * eps)
    _bits_equal(s.min, ref_extreme(x, "min", axes))
    _bits_equal(s.max, ref_extreme(x, "max", axes))
    # A transposed view of the same data takes the row path: the same values within rounding.
    t = multireduce.stats(np.asfortranarray(x), axis=axis, correction=1)
    close(t.var, s.var, dt, atol=1e-12 * scale * scale, rtol=8 * eps)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16"])
def test_moments_of_fortran_order_arrays_reduce_the_transpose(monkeypatch, dtype):
    # A Fortran-order array is reduced as its C-order transpose, for every axis set; the kept
    # axes come back in order. Same counts and extremes as the C-order copy, bit for bit, and
    # the same moments within rounding; a matrix's rows go through the column path.
    rng = np.random.default_rng(7)
    c = (rng.standard_normal((3, 40, 5, 70)) * 20 + 1).astype(dtype)
    f = np.asfortranarray(c)
    for nax in range(1, 5):
        for axes in itertools.combinations(range(4), nax):
            got, want = _stats.moments(f, axes), _stats.moments(c, axes)
            for name in ("n", "nan", "lo", "hi"):
                _bits_equal(getattr(got, name), getattr(want, name))
            scale = float(np.abs(c).max())
            close(got.mean, want.mean, np.dtype(np.float64), atol=1e-14 * scale, rtol=1e-14)
            close(got.m2, want.m2, np.dtype(np.float64), atol=1e-11 * scale * scale, rtol=1e-13)
    m = np.asfortranarray(c.reshape(-1, 70)[:, :64])
    monkeypatch.setattr(_stats, "_split_axes", lambda *a: pytest.fail("took the row path"))
    s = multireduce.stats(m, axis=1, correction=1)
    monkeypatch.undo()
    dt = np.dtype(s.var.dtype)
    close(s.var, np.var(m.astype(np.float64), axis=1, ddof=1), dt, atol=0, rtol=max(1e-12, 2 * float(np.finfo(dt).eps)))


@pytest.mark.filterwarnings("ignore:invalid value encountered in (scalar )?(add|reduce):RuntimeWarning")  # inf + -inf
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # inf - inf, as NumPy
@pytest.mark.filterwarnings("ignore:overflow encountered in reduce:RuntimeWarning")  # float16 sums, as NumPy's
@pytest.mark.parametrize("case", ["zeros", "infinities", "nan"])
@pytest.mark.parametrize("shape, axis", [((300_001,), None), ((3, 100_003), 1), ((100_003, 3), 0)])
def test_float16_stats_extremes_over_many_blocks(case, shape, axis):
    # Without NaN the CPU takes float16 extremes from the block's exact float64 copy (NumPy's
    # float16 min/max have no SIMD); with NaN from the elements. Signed zeros as extremes and
    # infinities, at block edges, bit for bit against the IEEE reference.
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 10).astype(np.float16)
    flat = x.reshape(-1)
    if case == "zeros":  # every element <= -0.0 or >= +0.0 with both zeros as the extremes' ties
        x = np.where(x > 0, -x, x)
        flat = x.reshape(-1)
        flat[[0, 131_071, 131_072, flat.size - 1]] = [-0.0, 0.0, -0.0, 0.0]
    elif case == "infinities":
        flat[[5, 131_073]] = [np.inf, -np.inf]
    else:
        flat[[7, 262_144]] = np.nan
    axes = _norm_axes(axis, x.ndim)
    s = multireduce.stats(x, axis=axis)
    _bits_equal(s.min, ref_extreme(x, "min", axes))
    _bits_equal(s.max, ref_extreme(x, "max", axes))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "uint8", "bool"])
@pytest.mark.parametrize(
    "shape, axis",
    [
        ((1,), None),
        ((1001,), None),
        ((5, 333), 1),
        ((2, 3, 400), (1, 2)),
        ((40, 70), 0),
        ((3000, 40), 0),  # several blocks of rows
        ((2, 2100, 40), 1),
        ((2100, 2, 40), (0, 1)),
    ],
)
def test_cpu_mean_is_the_float64_sum_over_the_count(monkeypatch, dtype, shape, axis):
    # The CPU's mean is the GPU's wherever the reduced axes are adjacent in memory (and, over
    # leading or middle axes, the kept run holds a cache line): the float64 sum over the
    # count, rounded once, in one pass (no moments state, no M2). Along trailing axes the sum
    # is NumPy's pairwise one; along leading or middle axes, the moments' column blocks of
    # rows summed in turn (the moments state took 12-40x NumPy's time there). A Fortran-order
    # array and a transposed view are reductions of the C-order transpose (either path: the
    # values are checked).
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 100 + 3).astype(dtype) if dtype != "bool" else rng.random(shape) < 0.3
    axes = _norm_axes(axis, x.ndim)
    count = math.prod(x.shape[a] for a in axes)
    result = np.dtype(OPS["mean"].result_dtype(x.dtype))
    # The reference: each mean from the exact sum (math.fsum of the float64 values), rounded
    # to the result dtype; the float64 sums here err by far less than float32's half ulp,
    # and by at most a few float64 ulps.
    moved = np.moveaxis(x.astype(np.float64), axes, tuple(range(-len(axes), 0)))
    rows = moved.reshape(-1, count)
    exact = np.array([math.fsum(row) / count for row in rows]).reshape(moved.shape[: moved.ndim - len(axes)])
    want = np.asarray(exact).astype(result)
    transposed = x.T
    for view, view_axis in ((x, axis), (np.asfortranarray(x), axis), (transposed, tuple(x.ndim - 1 - a for a in axes))):
        with monkeypatch.context() as m:  # one pass of the sum: no moments state (M2) made
            if view is x:
                m.setattr(_stats, "moments", lambda *args: pytest.fail("the mean made a moments state"))
            got = np.asarray(multireduce.mean(view, axis=view_axis))
        if view is transposed:
            got = got.T
        if result == np.float64:  # sums that cancel err relative to the elements' magnitude
            close(got, want, result, atol=1e-14 * float(np.abs(moved).max()), rtol=4e-15)
        else:
            _bits_equal(got, want)


def test_a_float_total_that_overflows_only_in_a_merge_warns_at_finalize():
    # Parts whose own float64 sums are finite, whose sum is not: the merge of the parts'
    # states (Dask chunks, MPI ranks) is silent, as every state's arithmetic; the finalize of
    # the merged state warns as NumPy's mean and var of the elements: "overflow encountered
    # in reduce", under np.errstate. (The merge warned "in add" or "in scalar add" before.)
    x = np.array([1e308, 1e308])
    scalar_parts = [_stats.moments(x[i : i + 1], (0,)) for i in range(2)]
    column_parts = [_stats.moments(x[i : i + 1].reshape(1, 1), (0,)) for i in range(2)]
    for merge in (lambda: _stats.merge_all(scalar_parts), lambda: _stats.merge(*column_parts)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            merged = merge()
        assert np.all(np.isinf(merged.total)) and np.all(np.isinf(_stats.state_mean(merged)))
        for name in ("mean", "var", "nanvar", "nanmean"):
            found = []
            for call in (
                lambda m=merged, n=name: _stats.finalize_moments(m, OPS[n], np.dtype(np.float64), value_warnings=True),
                lambda n=name: getattr(np, n)(x),
            ):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    value = call()
                found.append((np.isinf(value).all(), [str(w.message) for w in caught]))
            assert found[0] == found[1] == (True, ["overflow encountered in reduce"]), (name, found)
            # NumPy's own warning: np.errstate governs it, as any of NumPy's.
            finalize = lambda m=merged, n=name: _stats.finalize_moments(  # noqa: E731
                m, OPS[n], np.dtype(np.float64), value_warnings=True
            )
            with np.errstate(over="raise"), pytest.raises(FloatingPointError, match="overflow encountered in reduce"):
                finalize()
            with np.errstate(over="ignore"), warnings.catch_warnings():
                warnings.simplefilter("error")
                finalize()
    with warnings.catch_warnings():  # finite totals, and integer totals (which wrap as NumPy's), are silent
        warnings.simplefilter("error")
        _stats.finalize_moments(
            _stats.merge_all([_stats.moments(np.array([1e307]), (0,))] * 2), OPS["var"], np.dtype(np.float64), 0.0, True
        )
        big = np.array([2**62], np.int64)
        _stats.finalize_moments(
            _stats.merge_all([_stats.moments(big, (0,))] * 4), OPS["var"], np.dtype(np.float64), 0.0, True
        )


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # inf - inf, as NumPy
def test_moments_merge_is_chan_and_empty_is_neutral():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(1000) * 3 + 7, rng.standard_normal(37) - 2
    merged = _stats.merge(_stats.moments(a, (0,)), _stats.moments(b, (0,)))
    both = np.concatenate([a, b])
    assert int(merged.n) == both.size
    assert math.isclose(float(merged.mean), math.fsum(both.tolist()) / both.size, rel_tol=1e-14)
    m2 = math.fsum((v - float(np.mean(both))) ** 2 for v in both.tolist())
    assert math.isclose(float(merged.m2), m2, rel_tol=1e-12)
    empty = _stats.empty_moments(np.float64)
    for s in (_stats.merge(empty, merged), _stats.merge(merged, empty)):
        for f in s.__dataclass_fields__:
            assert np.asarray(getattr(s, f)).tobytes() == np.asarray(getattr(merged, f)).tobytes(), f
    inf_state = _stats.moments(np.array([np.inf, 1.0]), (0,))
    assert float(_stats.merge(inf_state, empty).mean) == np.inf  # not inf - 0 * ... = NaN


def _pairwise_tree(states):
    # merge_all's tree, one pair at a time: the reference for its vectorized levels.
    states = list(states)
    while len(states) > 1:
        paired = [_stats.merge(states[i], states[i + 1]) for i in range(0, len(states) - 1, 2)]
        states = paired + states[len(paired) * 2 :]
    return states[0]


@pytest.mark.filterwarnings("ignore:invalid value encountered in (scalar )?(add|reduce):RuntimeWarning")  # inf + -inf
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # inf - inf, as NumPy
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 7, 8, 16, 33, 64])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_merge_all_equals_pair_by_pair_merges_bit_for_bit(count, shape):
    # merge_all merges each level of its tree in one vectorized merge; the bits must be those
    # of merging the same pairs one by one, with empty states, NaN, infinities, -0.0 and
    # integer inputs among them.
    rng = np.random.default_rng(count)
    pieces = [
        np.array([1.5, -2.0, 3.25]),
        np.array([np.inf, 1.0, 2.0]),
        np.array([-np.inf, 0.0, np.nan]),
        np.array([-0.0, -0.0, -0.0]),
        np.array([np.nan, np.nan, np.nan]),
        np.array([0.0, 1e150, -1e150]),
    ]
    states = []
    for _ in range(count):
        kind = rng.integers(0, len(pieces) + 2)
        if kind == len(pieces):
            states.append(_stats.empty_moments(np.float64, shape))
            continue
        block = pieces[kind] if kind < len(pieces) else rng.standard_normal(3) * 10.0 ** rng.integers(-3, 4)
        x = np.stack([np.roll(block, j) for j in range(shape[0])]) if shape else block
        states.append(_stats.moments(x, (x.ndim - 1,)))
    got = _stats.merge_all(states)
    want = _pairwise_tree(states)
    for f in got.__dataclass_fields__:
        g, w = np.asarray(getattr(got, f)), np.asarray(getattr(want, f))
        assert g.shape == w.shape == shape and g.dtype == w.dtype, f
        assert g.tobytes() == w.tobytes(), f
    ints = [_stats.moments(np.arange(i, i + 5, dtype=np.int32), (0,)) for i in range(count)]
    got, want = _stats.merge_all(ints), _pairwise_tree(ints)
    for f in got.__dataclass_fields__:
        assert np.asarray(getattr(got, f)).tobytes() == np.asarray(getattr(want, f)).tobytes(), f
    assert int(got.total) == 5 * count * (count - 1) // 2 + 10 * count  # sum over i of i + (i+1) + ... + (i+4)
    assert int(got.n) == 5 * count


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint16", "uint64", "bool"])
@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_integer_means_do_not_depend_on_the_split(dtype, parts):
    # An integer state's mean is float64(total) / n wherever the total cannot have wrapped
    # (_stats.state_mean), so merged states give NumPy's mean bit for bit: Chan's update alone
    # gave -4e-16 where the mean is 0. Both finalize paths (0-d states in Python floats, and
    # arrays) and the mean op.
    rng = np.random.default_rng(parts)
    for n in (1, 2, 10, 1001):
        if dtype == "bool":
            x = rng.integers(0, 2, n).astype(bool)
        else:
            info = np.iinfo(dtype)
            x = rng.integers(max(info.min, -1000), min(info.max, 1000), n, endpoint=True).astype(dtype)
        if dtype in ("int32", "int64") and n > 1:
            x[-1] = 0
            x[-1] = -x.sum()  # the mean is exactly 0
        states = [_stats.moments(p, (0,)) for p in np.array_split(x, parts) if p.size]
        merged = _stats.merge_all(states)
        want = np.mean(x)  # float64(sum) / n, exact here
        row = merged.map(lambda a: np.asarray(a).reshape(1))  # the array finalize paths
        f64 = np.dtype(np.float64)
        for got in (
            _stats.finalize_stats(merged, x.dtype).mean,
            _stats.finalize_moments(merged, OPS["mean"], f64),
            _stats.finalize_stats(row, x.dtype).mean[0],
            _stats.finalize_moments(row, OPS["mean"], f64)[0],
        ):
            assert np.float64(got).tobytes() == want.tobytes(), (dtype, parts, n, got, want)


def test_integer_mean_after_a_wrapped_total_is_the_merged_mean():
    # Where n * max(|lo|, |hi|) reaches 2**62 the int64 total may have wrapped (here it has):
    # the mean is then Chan's merged mean, close to the exact one, not the wrapped total's.
    x = np.array([2**62, 2**62, 2**62 - 8, 2**62 + 8], dtype=np.int64)
    merged = _stats.merge_all([_stats.moments(p, (0,)) for p in np.array_split(x, 2)])
    assert int(merged.total) != sum(x.tolist())  # wrapped, as NumPy's int64 sum does
    exact = Fraction(sum(x.tolist()), x.size)
    f64 = np.dtype(np.float64)
    for got in (_stats.finalize_stats(merged, x.dtype).mean, _stats.finalize_moments(merged, OPS["mean"], f64)):
        assert abs(Fraction(float(got)) - exact) <= exact * Fraction(2, 2**52), got


_SCALAR_MERGE_BLOCKS = {
    "f": [
        [1.5, -2.0, 3.25],
        [np.inf, 1.0, 2.0],
        [-np.inf, -1.0],
        [np.inf, np.inf],
        [-0.0, -0.0, -0.0],
        [0.0, -0.0],
        [np.nan, 2.0],
        [np.nan, np.nan],
        [0.0, 6e4, -6e4],
        [-1e-3, 5e-4],
        [3.0],
    ],
    "i": [[1, 2, 3], [-7], [0, 0], [100, -100, 5]],
    "b": [[True, False], [False], [True, True, True]],
}


def _scalar_merge_states(dtype: np.dtype, count: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    blocks = _SCALAR_MERGE_BLOCKS["i" if dtype.kind in "iu" else dtype.kind]
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    states = []
    for _ in range(count):
        kind = int(rng.integers(0, len(blocks) + 2))
        if kind == len(blocks):
            states.append(_stats.empty_moments(dtype))
            continue
        if kind < len(blocks):
            block = np.array(blocks[kind]) if dtype.kind != "u" else np.abs(np.array(blocks[kind]))
        elif info is not None:  # near the top of the range: integer totals wrap
            block = np.array([info.max, info.max - int(rng.integers(0, 9))])
        else:
            block = rng.standard_normal(int(rng.integers(1, 6))) * 10.0 ** int(rng.integers(-3, 4))
        states.append(_stats.moments(block.astype(dtype), (0,)))
    return states


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # inf - inf, as NumPy
@pytest.mark.parametrize(
    "dtype", [np.float64, np.float32, np.float16, np.int8, np.int64, np.uint8, np.uint64, np.bool_]
)
@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 13])
def test_scalar_merges_equal_array_merges_bit_for_bit(dtype, count):
    # merge_all and merge_records merge 0-d states (full reductions: what MPI ranks combine)
    # in NumPy scalars. Every field must have the bits and dtype of the array
    # merge() pair by pair: NaN, infinities of both signs (inf - inf), signed zeros in lo/hi,
    # empty states, float16/float32 totals and integer totals that wrap.
    dtype = np.dtype(dtype)
    states = _scalar_merge_states(dtype, count, seed=count * 31 + dtype.num)
    with np.errstate(over="ignore", invalid="ignore"):  # the array reference: the same wraps
        want = _pairwise_tree([s.map(np.asarray) for s in states])
    layout = _stats.moments_dtype(dtype)  # as MPI gathers them: one record per rank
    records = np.concatenate([_stats.to_structured(s).astype(layout).reshape(1) for s in states])
    with warnings.catch_warnings(), np.errstate(over="ignore", invalid="ignore"):
        # The totals' float additions warn as NumPy's do, under np.errstate (silenced here, as
        # for the reference); nothing else warns (NumPy's scalar integer overflow included).
        warnings.simplefilter("error")
        got_all, got_records = _stats.merge_all(states), _stats.merge_records(records)
    for got in (got_all, got_records):
        for f in _stats._MOMENTS_FIELDS:
            g, w = np.asarray(getattr(got, f)), np.asarray(getattr(want, f))
            assert g.shape == w.shape == () and g.dtype == w.dtype, f
            assert g.tobytes() == w.tobytes(), (f, g, w)
    if dtype.kind in "iub":  # the exact total, modulo 2**64 for the wrapping ones
        exact = sum(int(np.asarray(s.total)) for s in states)
        bits = np.dtype(np.int64 if dtype.kind in "ib" else np.uint64)
        assert int(got_all.total) == (exact % 2**64 if bits.kind == "u" else (exact + 2**63) % 2**64 - 2**63)


@pytest.mark.filterwarnings("ignore:invalid value encountered in (scalar )?(add|reduce):RuntimeWarning")  # inf + -inf
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # inf - inf, as NumPy
def test_scalar_merge_of_infinities_and_signed_zeros():
    # Named cases of the scalar merge next to NumPy float64 arithmetic.
    inf = _stats.moments(np.array([np.inf, 1.0]), (0,))
    ninf = _stats.moments(np.array([-np.inf]), (0,))
    merged = _stats.merge_all([inf, ninf])
    assert math.isnan(float(merged.mean)) and math.isnan(float(merged.m2)) and math.isnan(float(merged.total))
    assert float(_stats.merge_all([inf, _stats.moments(np.array([2.0]), (0,))]).mean) == np.inf
    zeros = _stats.merge_all([_stats.moments(np.array([-0.0]), (0,)), _stats.moments(np.array([0.0]), (0,))])
    assert math.copysign(1, zeros.lo) == -1 and math.copysign(1, zeros.hi) == 1
    a, b = np.arange(1000.0), np.arange(1000.0, 1037.0)
    m = _stats.merge_all([_stats.moments(a, (0,)), _stats.moments(b, (0,))])
    both = np.concatenate([a, b])
    assert float(m.mean) == math.fsum(both.tolist()) / both.size
    assert math.isclose(float(m.m2), math.fsum(((both - both.mean()) ** 2).tolist()), rel_tol=1e-14)


# -- float64 near the overflow threshold ---------------------------------------------------------
# NumPy's rules: the mean is the float64 sum over the count; var is inf where the squared
# deviations overflow. Here finite elements never give a NaN variance (nor a NaN mean where
# NumPy's sum does not overflow); an infinite or NaN element gives NumPy's NaN.

_EPS = float(np.finfo(np.float64).eps)


def _alternating(n: int, value: float = 1e300) -> np.ndarray:
    return np.where(np.arange(n) % 2 == 0, value, -value)


def _numpy_moments(x: np.ndarray, axis=None, ddof: float = 0.0) -> dict:
    with _quiet_ctx():
        return {
            "sum": np.sum(x, axis=axis),
            "mean": np.mean(x, axis=axis),
            "var": np.var(x, axis=axis, ddof=ddof),
            "std": np.std(x, axis=axis, ddof=ddof),
        }


def _check_overflow_moments(x: np.ndarray, axis=None, ddof: float = 0.0, exact_mean: bool = True) -> None:
    """var, std, mean and every field of stats of ``x`` against NumPy's float64 results.

    var and std (and stats' var) must be NumPy's bits (inf where NumPy's squares overflow).
    The mean op, and stats' sum, min and max, must be NumPy's bits too; stats' mean as well
    with ``exact_mean``, else (states merged by Chan's update over several blocks) within a
    few float64 ulps of the largest magnitude.
    """
    ref = _numpy_moments(x, axis, ddof)
    with _quiet_ctx():
        got = {
            "var": multireduce.var(x, axis=axis, correction=ddof),
            "std": multireduce.std(x, axis=axis, correction=ddof),
            "mean": multireduce.mean(x, axis=axis),
        }
        s = multireduce.stats(x, axis=axis, correction=ddof)
    for name in ("var", "std", "mean"):
        _bits_equal(got[name], ref[name])
    _bits_equal(s.var, ref["var"])
    _bits_equal(s.sum, ref["sum"])
    _bits_equal(s.min, np.min(x, axis=axis))
    _bits_equal(s.max, np.max(x, axis=axis))
    _bits_equal(s.count, np.int64(x.size if axis is None else x.shape[axis]) + np.zeros_like(s.count))
    if exact_mean:
        _bits_equal(s.mean, ref["mean"])
    else:
        scale = np.max(np.abs(x), axis=axis)
        assert np.all(np.abs(np.asarray(s.mean) - ref["mean"]) <= 64 * _EPS * scale), (s.mean, ref["mean"])


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
@pytest.mark.parametrize("ddof", [0.0, 1.0])
@pytest.mark.parametrize(
    "data",
    [
        [1e308, -1e308],
        [-1e308, 1e308, 0.5],
        [1e200, -1e200, 3.0],
        [1.7e308, -1.7e308, 1.7e308],
        [0.0, 1e155, -1e155, 2.0],
    ],
)
def test_float64_overflow_small_arrays_match_numpy(data, ddof):
    x = np.array(data)
    _check_overflow_moments(x, ddof=ddof)
    assert math.isinf(float(multireduce.var(x, correction=ddof)))


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
@pytest.mark.parametrize("n", [1, 2, 3, 1023, 1024, 1025, 70_000, 300_001])
def test_float64_alternating_1e300_match_numpy(n):
    # Up to _BLOCK_ELEMENTS (131072) one CPU block: NumPy's own sums, bit for bit; 300_001
    # elements are three blocks merged (Chan), whose mean is within rounding of NumPy's.
    x = _alternating(n)
    for ddof in (0.0, 1.0):
        if n - ddof <= 0:
            continue
        _check_overflow_moments(x, ddof=ddof, exact_mean=n <= 131_072)
        assert math.isinf(float(multireduce.var(x, correction=ddof))) == (n > 1)


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
@pytest.mark.parametrize("n", [70_000, 300_001])
@pytest.mark.parametrize("where", [(0, -1), (1, 2), (-2, 7)])
def test_float64_one_pair_of_1e308_among_zeros(n, where):
    # One +1e308 and one -1e308 among zeros, in one block or in two: NumPy's mean is 0.0 and
    # its var inf (the deviations 1e308 square to inf).
    x = np.zeros(n)
    x[where[0]], x[where[1]] = 1e308, -1e308
    _check_overflow_moments(x, exact_mean=n <= 131_072)
    assert float(multireduce.mean(x)) == 0.0 and float(multireduce.stats(x).sum) == 0.0


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
def test_float64_block_sums_that_overflow_give_an_infinite_var_not_nan():
    # A CPU block of 131072 x 1e308 has the float64 sum inf (its mean inf, as NumPy's): Chan's
    # update with the next block computed inf - inf, and var was NaN. NumPy: mean and var inf.
    x = np.concatenate([np.full(131_072, 1e308), np.ones(10)])
    for ddof in (0.0, 1.0):
        _check_overflow_moments(x, ddof=ddof)
    # Both signs (each block's sum overflows, and so does NumPy's, to inf - inf): NumPy's mean
    # and var are NaN; the var of finite elements is inf here, the mean is still the sum over n.
    x = np.concatenate([np.full(150_000, 1e308), np.full(150_000, -1e308)])
    s = multireduce.stats(x)
    assert math.isinf(float(multireduce.var(x))) and math.isinf(float(s.var)) and math.isinf(float(multireduce.std(x)))
    assert math.isnan(float(s.sum)) and math.isnan(float(s.mean)) and math.isnan(float(multireduce.mean(x)))


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
@pytest.mark.parametrize("layout", ["C", "F"])
def test_float64_overflow_over_an_axis_leaves_the_other_slices_unchanged(layout):
    # Columns reduced over 3000 rows (the column path: blocks of 1024 rows merged; of the
    # Fortran-order copy, rows read in one block each), and the rows of the transpose:
    # overflowing slices get NumPy's inf, and every other slice has the bits it has when no
    # slice overflows.
    rng = np.random.default_rng(3)
    normal = rng.standard_normal((3000, 10)) * 10.0 ** rng.integers(-3, 4, 10)  # 80-byte rows
    x = normal.copy()
    x[:, 0] = 1e308  # each block's sum overflows to inf: mean and var inf
    x[:, 1] = _alternating(3000)  # deviations 1e300 square to inf
    x[[5, 2999], 2] = [1e308, -1e308]  # one pair among the normal values
    if layout == "F":
        x, normal = np.asfortranarray(x), np.asfortranarray(normal)
    for axis, view, clean in ((0, x, normal), (1, x.T, normal.T)):
        ref = _numpy_moments(view, axis)
        var = multireduce.var(view, axis=axis)
        std = multireduce.std(view, axis=axis, correction=1)
        s = multireduce.stats(view, axis=axis)
        assert np.all(np.isinf(var[:3])) and np.all(np.isinf(std[:3])) and np.all(np.isinf(s.var[:3]))
        _bits_equal(var[:3], ref["var"][:3])
        _bits_equal(s.sum[:3], ref["sum"][:3])
        assert float(s.mean[0]) == math.inf == float(multireduce.mean(view, axis=axis)[0])
        assert abs(float(s.mean[2]) - float(ref["mean"][2])) <= 64 * _EPS * 1e308
        want = multireduce.stats(clean, axis=axis)
        for name in ("sum", "min", "max", "mean", "var"):
            _bits_equal(getattr(s, name)[3:], getattr(want, name)[3:])
        _bits_equal(var[3:], multireduce.var(clean, axis=axis)[3:])
        _bits_equal(std[3:], multireduce.std(clean, axis=axis, correction=1)[3:])


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
def test_float64_rows_over_many_blocks_with_overflow():
    # Rows of 300_001 elements: three CPU blocks each, merged by Chan's update.
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 300_001))
    clean = x.copy()
    x[1] = _alternating(300_001)
    x[2, :140_000] = 1e308  # the first block's sum overflows: mean and var inf (as NumPy's)
    x[3, [0, 200_000]] = [1e308, -1e308]  # in two blocks
    ref = _numpy_moments(x, 1)
    for ddof in (0.0, 1.0):
        var = multireduce.var(x, axis=1, correction=ddof)
        s = multireduce.stats(x, axis=1, correction=ddof)
        _bits_equal(var[1:], np.full(3, np.inf))
        _bits_equal(s.var[1:], np.full(3, np.inf))
        _bits_equal(var[0], multireduce.var(clean, axis=1, correction=ddof)[0])
        _bits_equal(s.var[0], multireduce.stats(clean, axis=1, correction=ddof).var[0])
    assert float(s.mean[2]) == math.inf == float(ref["mean"][2])
    assert np.all(np.abs(s.mean[[1, 3]] - ref["mean"][[1, 3]]) <= 64 * _EPS * 1e308)


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
def test_float64_infinite_or_nan_elements_keep_numpys_nan_var():
    cases = [
        [np.inf, 1e308, -1e308],
        [1e308, -1e308, -np.inf],
        [np.inf, -np.inf, 1e308],
        [1e308, np.nan, -1e308],
        np.concatenate([np.full(131_072, 1e308), [np.inf, 1.0]]),  # an overflowing block, then inf
        np.concatenate([_alternating(200_000), [-np.inf]]),
    ]
    for data in cases:
        x = np.asarray(data, dtype=np.float64)
        ref = _numpy_moments(x)
        with _quiet_ctx():
            s = multireduce.stats(x)
            got = (multireduce.var(x), multireduce.std(x), s.var, s.std)
            mean = (multireduce.mean(x), s.mean)
        assert all(math.isnan(float(v)) for v in got), (x[:4], got)
        assert math.isnan(float(ref["var"]))
        for m in mean:
            assert same_float(float(m), float(ref["mean"])), (x[:4], m, ref["mean"])
    with _quiet_ctx():
        assert float(multireduce.nanmean(np.array([1e308, np.nan, -1e308]))) == 0.0


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
def test_moments_merge_of_overflowing_means():
    # Two states whose means are +-1e308: their difference overflows, and Chan's update gave
    # -inf for the mean; now the weighted mean (NumPy: 0.0). M2 is inf, never NaN.
    one = _stats.moments(np.array([1e308]), (0,))
    neg = _stats.moments(np.array([-1e308]), (0,))
    three = _stats.moments(np.array([3.0]), (0,))
    for merged in (_stats.merge(one, neg), _stats.merge_all([one, neg]), _stats.merge(neg, one)):
        assert float(merged.mean) == 0.0 and float(merged.m2) == math.inf and float(merged.total) == 0.0
    merged = _stats.merge_all([one, neg, three])
    assert float(merged.mean) == 1.0 and float(merged.m2) == math.inf
    f64 = np.dtype(np.float64)
    assert float(_stats.finalize_moments(merged, OPS["var"], f64)) == math.inf
    assert float(_stats.finalize_moments(merged, OPS["std"], f64, 1.0)) == math.inf
    stats = _stats.finalize_stats(merged, f64)
    assert (float(stats.mean), float(stats.var), float(stats.sum)) == (1.0, math.inf, 3.0)
    # A state whose mean is inf (its block's sum overflowed) merged with a finite one: M2 inf
    # (its elements are finite), not NaN; with an infinite element, NaN as before.
    big = _stats.moments(np.full(4, 1e308), (0,))
    assert float(big.mean) == math.inf and float(big.m2) == math.inf
    for a, b in ((big, three), (three, big)):
        assert float(_stats.merge(a, b).m2) == math.inf and float(_stats.merge_all([a, b]).m2) == math.inf
    inf = _stats.moments(np.array([np.inf, 1.0]), (0,))
    assert math.isnan(float(_stats.merge(big, inf).m2)) and math.isnan(float(_stats.merge_all([inf, big]).m2))
    # Both signs overflowed (inf and -inf means): the mean is the total over n (NaN here, the
    # total is inf - inf as NumPy's sum), the var inf.
    both = _stats.merge(big, _stats.moments(np.full(4, -1e308), (0,)))
    assert math.isnan(float(both.mean)) and float(both.m2) == math.inf
    assert math.isnan(float(_stats.finalize_stats(both, f64).mean))
    assert float(_stats.finalize_stats(both, f64).var) == math.inf


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
def test_a_total_that_overflows_decides_the_mean_at_any_split():
    # Parts whose own sums and means are finite, whose total overflows: Chan's update of four
    # parts of 1e308 gave a mean of 1e308 (var 0) where one part of all four, NumPy and the
    # sum give inf; the mean and var depended on the split (Dask chunks, MPI ranks, the CPU's
    # blocks). The finalize takes the total over the count, and var inf, as NumPy's.
    f64 = np.dtype(np.float64)
    x = np.full(4, 1e308)
    parts = [_stats.moments(x[i : i + 1], (0,)) for i in range(4)]
    assert float(_stats.merge_all(parts).mean) == 1e308
    for merged in (_stats.merge_all(parts), _stats.merge_all([parts[0], _stats.moments(x[1:], (0,))])):
        assert math.isinf(float(merged.total)), merged  # (the four parts' merged mean is 1e308)
        stats = _stats.finalize_stats(merged, f64)
        assert (float(stats.mean), float(stats.var), float(stats.sum)) == (math.inf, math.inf, math.inf)
        assert float(_stats.finalize_moments(merged, OPS["mean"], f64)) == math.inf
        assert float(_stats.finalize_moments(merged, OPS["std"], f64, 1.0)) == math.inf
    wide = np.full((2**18, 2), 1e303)  # the CPU's blocks, each with a finite sum
    with np.errstate(over="ignore"):
        want_mean = np.mean(wide, axis=0)
    assert np.array_equal(multireduce.mean(wide, axis=0), want_mean) and np.all(np.isinf(want_mean))
    assert np.all(np.isinf(multireduce.var(wide, axis=0))) and np.all(np.isinf(multireduce.std(wide, axis=0)))
    s = multireduce.stats(wide[:, 0].copy())
    assert (float(s.sum), float(s.mean), float(s.var)) == (math.inf, math.inf, math.inf)
    da = pytest.importorskip("dask.array")
    mrdask = importlib.import_module("multireduce.dask")
    for chunks in (1, 2, 4):
        d = da.from_array(x, chunks=chunks)
        got = [float(mrdask.treereduce(d, op).compute()) for op in ("mean", "var", "std")]
        assert got == [math.inf] * 3, (chunks, got)


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
def test_finalize_of_overflowed_states():
    # States as a GPU thread or another layer may hand them over: M2 NaN (inf - inf) and a
    # mean of +-inf or NaN with finite lo and hi. var and std are inf, the mean total / n;
    # with an infinite lo or hi, or a NaN element, NumPy's NaN. Array and 0-d paths alike.
    f64 = np.dtype(np.float64)

    def state(mean, m2, lo, hi, nan=0, total=0.0, n=2):
        return _stats.Moments(
            np.int64(n),
            np.int64(nan),
            np.float64(total),
            np.float64(mean),
            np.float64(m2),
            np.float64(lo),
            np.float64(hi),
            np.float64(0.0),
        )

    for state_, var, mean in [
        (state(-np.inf, np.nan, -1e308, 1e308), math.inf, 0.0),
        (state(np.nan, np.nan, -1e308, 1e308, total=3.0, n=3), math.inf, 1.0),
        (state(1.0, np.nan, -1e200, 1e200, total=3.0, n=3), math.inf, 1.0),  # mean finite: kept
        (state(np.inf, np.nan, 1.0, np.inf, total=np.inf), math.nan, math.inf),
        (state(np.nan, np.nan, -np.inf, np.inf, total=np.nan), math.nan, math.nan),
        (state(-np.inf, np.nan, -1e308, 1e308, nan=1), math.nan, math.nan),
    ]:
        for s in (state_, state_.map(lambda a: np.asarray(a).reshape(1))):
            got_var = np.asarray(_stats.finalize_moments(s, OPS["var"], f64)).reshape(-1)[0]
            got_std = np.asarray(_stats.finalize_moments(s, OPS["std"], f64)).reshape(-1)[0]
            got_mean = np.asarray(_stats.finalize_moments(s, OPS["mean"], f64)).reshape(-1)[0]
            fields = _stats.finalize_stats(s, f64)
            assert same_float(float(got_var), var) and same_float(float(got_std), math.sqrt(var)), (state_, got_var)
            assert same_float(float(np.asarray(fields.var).reshape(-1)[0]), var), state_
            assert same_float(float(got_mean), mean) and same_float(float(np.asarray(fields.mean).reshape(-1)[0]), mean)


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
def test_dask_merges_of_overflowing_chunks():
    # Chunks of one element: the tree merges states whose means are +-1e308 (their
    # difference overflows). Chunks of 2 over rows: each row's positive and negative halves.
    da = pytest.importorskip("dask.array")
    mdask = pytest.importorskip("multireduce.dask")
    for data in ([1e308, -1e308, 3.0], [1e308, -1e308] * 4, [-1e308, 1e308, 1.0, 2.0]):
        host = np.array(data)
        ref = _numpy_moments(host)
        for chunks in (1, 2):
            x = da.from_array(host, chunks=chunks)
            for op in ("mean", "var", "std"):
                _bits_equal(mdask.treereduce(x, op, split_every=2).compute(), ref[op])
            s = mdask.stats(x, split_every=2)
            s = s.compute() if hasattr(s, "compute") else s
            _bits_equal(s.mean, ref["mean"])
            _bits_equal(s.var, ref["var"])
            _bits_equal(s.sum, ref["sum"])
    host = np.array([[1e308, -1e308, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0]])
    x = da.from_array(host, chunks=(1, 1))
    ref = _numpy_moments(host, 1)
    var = mdask.treereduce(x, "var", axis=1, split_every=2).compute()
    _bits_equal(var, ref["var"])
    _bits_equal(mdask.treereduce(x, "mean", axis=1, split_every=2).compute(), ref["mean"])


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
@pytest.mark.parametrize("count", [2, 3, 5, 8, 13])
def test_scalar_merges_of_overflowing_states_equal_array_merges(count):
    # merge_all's Python-value merges (0-d states, MPI's merge_records) against the array
    # merge() pair by pair, bit for bit, with states whose means overflow.
    rng = np.random.default_rng(count)
    blocks = [
        [1e308],
        [-1e308],
        [1e308, 1e308],  # mean inf (the block's sum), M2 inf
        [-1.5e308, -1e308],
        [1e200, -1e200, 3.0],
        [np.inf, 1.0],
        [1e308, np.nan],
        [2.0, -0.5],
    ]
    with _quiet_ctx():
        picks = [0, 1, *rng.integers(0, len(blocks), count - 2).tolist()]  # +1e308 and -1e308 first
        states = [_stats.moments(np.array(blocks[k]), (0,)) for k in picks]
        want = _pairwise_tree([s.map(np.asarray) for s in states])
    records = np.concatenate([_stats.to_structured(s).reshape(1) for s in states])
    for got in (_stats.merge_all(states), _stats.merge_records(records)):
        for f in _stats._MOMENTS_FIELDS:
            g, w = np.asarray(getattr(got, f)), np.asarray(getattr(want, f))
            assert g.tobytes() == w.tobytes(), (f, g, w)
    if all(np.isfinite(np.asarray(s.lo)) and np.isfinite(np.asarray(s.hi)) for s in states):
        assert not math.isnan(float(want.m2))


@pytest.mark.filterwarnings("ignore:(overflow|invalid value):RuntimeWarning")  # as NumPy warns
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int8, np.int64, np.uint64, np.bool_])
def test_arg_merge_pairs_equals_arg_merge_all(dtype):
    # The MPI layer merges one (value, index) pair per rank in Python scalars; the winner and
    # its value must be those of the array merge, with NaN, signed zeros, ties (the smaller
    # index wins), empty states (index -1) and the extremes of integer ranges.
    dtype = np.dtype(dtype)
    acc = _stats._extreme_acc(dtype)
    if dtype.kind == "f":
        values = [1.0, -0.0, 0.0, np.nan, np.inf, -np.inf, 3.0, -2.5, 3.0]
    elif dtype.kind == "b":
        values = [False, True, True, False]
    else:
        info = np.iinfo(dtype)
        values = [0, info.max, info.min, 5, info.max, 1]
    rng = np.random.default_rng(dtype.num)
    for largest in (True, False):
        for _ in range(60):
            count = int(rng.integers(1, 7))
            pairs = []
            for _ in range(count):
                if rng.random() < 0.2:
                    pairs.append((acc.type(0), -1))
                else:
                    pairs.append(
                        (np.asarray(values[int(rng.integers(0, len(values)))], dtype=acc)[()], int(rng.integers(0, 9)))
                    )
            states = [_stats.ArgState(np.asarray(v, dtype=acc), np.asarray(i, dtype=np.int64)) for v, i in pairs]
            want = _stats.arg_merge_all(states, largest)
            got = _stats.arg_merge_pairs(pairs, largest)
            assert int(got.index) == int(want.index), (largest, pairs)
            if int(want.index) >= 0:
                assert np.asarray(got.value).dtype == acc
                assert np.asarray(got.value).tobytes() == np.asarray(want.value).tobytes(), (largest, pairs)
    with pytest.raises(ValueError, match="no arg states"):
        _stats.arg_merge_pairs([], True)


@pytest.mark.parametrize("op", ["argmax", "argmin", "nanargmax", "nanargmin"])
def test_arg_ops_over_an_axis_of_a_64_dimensional_array(op):
    # NumPy allows 64 axes; the CPU's take_along_axis had one index array too many there.
    x = np.random.default_rng(4).standard_normal((1,) * 61 + (3, 1, 2))
    x[(0,) * 61 + (1, 0, 0)] = -0.0
    x[(0,) * 61 + (2, 0, 1)] = np.nan
    for axis in (-1, -3, 0):
        for keepdims in (False, True):
            if op.startswith("nan") and axis == 0:  # slices of one element: the NaN's is all NaN
                for reduce in (functools.partial(multireduce.reduce, x, op), functools.partial(getattr(np, op), x)):
                    with pytest.raises(ValueError, match="All-NaN slice encountered"):
                        reduce(axis=axis, keepdims=keepdims)
                continue
            got = multireduce.reduce(x, op, axis=axis, keepdims=keepdims)
            want = getattr(np, op)(x, axis=axis, keepdims=keepdims)
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), (axis, got, want)


def test_empty_uint64_arg_state_merges_without_losing_the_value():
    # The core's state of an empty shard or chunk, merged with non-empty ones as the Dask
    # layer (arg_merge_all) and the MPI layer (arg_merge_pairs over arg_dtype records) merge
    # them. 2**64 - 2 and 2**64 - 1 are one float64: the empty state's int64 placeholder made
    # the array merge promote the values to float64 and pick the wrong index.
    big = np.array([2**64 - 2, 7, 2**64 - 1, 2**64 - 1], dtype=np.uint64)
    empty = multireduce.partial(np.zeros(0, np.uint64), "argmax")
    first = multireduce.partial(big[:2], "argmax")
    second = _stats.ArgState(*(np.asarray(a) for a in (multireduce.partial(big[2:], "argmax").value, 2)))
    for order in itertools.permutations([empty, first, second]):
        merged = _stats.arg_merge_all(order, largest=True)
        assert merged.value.dtype == np.uint64 and int(merged.value) == 2**64 - 1 and int(merged.index) == 2
    layout = _stats.arg_dtype(np.uint64)
    records = np.concatenate([_stats.to_structured(s).reshape(1) for s in (empty, first, second)])
    assert records.dtype == layout  # one layout for empty and non-empty states
    pairs = [(r["value"], int(r["index"])) for r in records]
    for order in itertools.permutations(pairs):
        merged = _stats.arg_merge_pairs(list(order), largest=True)
        assert np.asarray(merged.value).dtype == np.uint64 and int(merged.value) == 2**64 - 1
        assert int(merged.index) == 2
    smallest = _stats.arg_merge_all([empty, multireduce.partial(big, "argmin")], largest=False)
    assert smallest.value.dtype == np.uint64 and int(smallest.value) == 7 and int(smallest.index) == 1


def test_arg_merge_is_order_independent():
    x = np.array([3.0, -0.0, 7.0, 0.0, 7.0, np.nan, 1.0, np.nan])
    for largest in (True, False):
        parts = [_stats.arg_state(x[i : i + 3], None, largest, offset=i) for i in range(0, x.size, 3)]
        for order in itertools.permutations(parts):
            assert int(_stats.arg_merge_all(order, largest).index) == 5
        y = x[~np.isnan(x)]
        parts = [_stats.arg_state(y[i : i + 2], None, largest, offset=i) for i in range(0, y.size, 2)]
        expected = 2 if largest else 1  # 7.0 first at 2; -0.0 (below +0.0) at 1
        for order in itertools.permutations(parts):
            assert int(_stats.arg_merge_all(order, largest).index) == expected


def test_axis_layout():
    assert _axes.axis_layout((4, 5, 6), (2,)) == (20, 6, 1)  # rows
    assert _axes.axis_layout((4, 5, 6), (0,)) == (1, 4, 30)  # columns
    assert _axes.axis_layout((4, 5, 6), (0, 1)) == (1, 20, 6)
    assert _axes.axis_layout((4, 1, 6), (0, 2)) == (1, 24, 1)  # length-1 axes do not count
    assert _axes.axis_layout((4, 5, 6), (0, 2)) is None
    assert _axes.axis_layout((4, 5, 6), ()) == (120, 1, 1)


def test_public_functions_and_docstrings():
    for name in ALL_OPS + ["stats"]:
        fn = getattr(multireduce, name)
        assert name in multireduce.__all__
        assert fn.__doc__ and fn.__module__ == "multireduce.core"


# -- GPU: every op, every axis set, on multireduce's kernels, against the same references -------------------


def _device_view(base, index, order):
    """(host view, device view) of the same data: the host copy is what reached the device
    (CuPy's transfer may turn a 0-d -0.0 into +0.0)."""
    import cupy

    dev = cupy.asarray(base)
    return view_of(dev.get(), index, order), view_of(dev, index, order)


_GPU_AXES = [None, 0, 1, 2, -1, (0, 1), (1, 2), (0, 2), (2, 0), (0, 1, 2)]


@pytest.mark.gpu
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), op=st.sampled_from(NAN_OPS))
def test_gpu_nan_ops_against_numpy_on_nan_dense_data(data, op):
    base, index, order = data.draw(nan_dense(recipe=True, powers_of_two=op == "nanprod"))
    x, dev = _device_view(base, index, order)
    axis = data.draw(axes_for(x.ndim, single=op in ARGS))
    correction = data.draw(st.sampled_from([0, 1])) if op in CORRECTED else 0.0
    check_op(x, op, axis, data.draw(st.booleans()), correction, device=dev)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint64", "bool"])
def test_gpu_ops(op, dtype):
    # Every axis set of a 3-d array (non-adjacent ones too) with and without keepdims, on a
    # C-contiguous array, a transposed view and a strided view; floats with NaN, inf and -0.0
    # planted. Each result must be a CuPy array on the device with the CPU's semantics.
    rng = np.random.default_rng(7)
    base = (rng.integers(-8, 9, size=(4, 6, 10)) / 2).astype(dtype)
    if base.dtype.kind == "f":
        base[0, 0, 0], base[1, 2, 3], base[2, 5, 9], base[3, 1, 4] = np.nan, np.inf, -0.0, -np.inf
        base[:, 3, :] = -0.0  # a whole row of -0.0 next to +0.0
        base[:, 4, :] = 0.0
    for index, order in [((), None), ((), (2, 0, 1)), ((slice(None), slice(None, None, 2), slice(1, None)), None)]:
        x, dev = _device_view(base, index, order)
        for axis in _GPU_AXES:
            if op in ARGS and isinstance(axis, tuple):
                continue
            for keepdims in (False, True):
                check_op(x, op, axis, keepdims, correction=1 if op in CORRECTED else 0.0, device=dev)


@pytest.mark.gpu
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), op=st.sampled_from(ALL_OPS))
def test_gpu_ops_against_numpy(data, op):
    # The CPU property test's cases on the device: shapes up to 4-D (empty axes included),
    # every axis combination, keepdims, every dtype, NaN/inf/signed zeros, strided, reversed
    # and transposed views made on the device.
    prod = op in PRODUCTS
    base, index, order = data.draw(cases(powers_of_two=prod, max_side=3 if prod else 5, recipe=True))
    x, dev = _device_view(base, index, order)
    axis = data.draw(axes_for(x.ndim, single=op in ARGS))
    keepdims = data.draw(st.booleans())
    correction = data.draw(st.sampled_from([0, 1, 0.5, 2])) if op in CORRECTED else 0.0
    check_op(x, op, axis, keepdims, correction, device=dev)


@pytest.mark.gpu
def test_gpu_stats_matches_the_cpu_on_every_axis_set():
    import cupy

    host = np.arange(120, dtype=np.float32).reshape(4, 5, 6) - 59.5
    dev = cupy.asarray(host)
    for axis in _GPU_AXES:
        s, ref = multireduce.stats(dev, axis=axis), multireduce.stats(host, axis=axis)
        for name in ("count", "nan_count", "sum", "min", "max"):
            _bits_equal(getattr(s, name).get(), np.asarray(getattr(ref, name)))
        for name in ("mean", "var"):
            assert np.allclose(getattr(s, name).get(), getattr(ref, name), rtol=1e-6), (axis, name)


@pytest.mark.filterwarnings("ignore:overflow encountered in:RuntimeWarning")  # var past float16/float32
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32"])
@pytest.mark.parametrize("axis", [None, 1])
def test_stats_std_is_stds_value(dtype, axis):
    # Stats.std was sqrt(var) of the var already rounded to float16/float32: inf where the
    # variance leaves the dtype's range ([0, 600] as float16: var 90000 -> inf, std 300), 0
    # where it underflows ([0, 1e-4]: std 5e-05), and an ulp off std elsewhere.
    rng = np.random.default_rng(7)
    rows = [[0, 600], [0, 1e-4], [0, 3e38], [1, np.nan]] + (rng.standard_normal((300, 2)) * 3).tolist()
    with np.errstate(over="ignore"):
        x = np.array(rows).astype(dtype)
    for correction in (0, 1, 2):
        for case in [x[i] for i in range(len(x))] if axis is None else [x]:
            s = multireduce.stats(case, axis=axis, correction=correction)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # std's "Degrees of freedom" (stats has none)
                want = multireduce.std(case, axis=axis, correction=correction)
            _bits_equal(s.std, want)
    if dtype in ("float16", "float32"):  # the reviewer's cases: finite where var is not
        s = multireduce.stats(x[:3], axis=1)
        assert np.all(np.isfinite(s.std[:2])) and s.std[1] > 0, s.std


@pytest.mark.parametrize("name", ["var", "std", "nanvar", "nanstd", "stats"])
def test_a_full_variance_that_overflows_in_the_division_warns_as_numpy(name):
    # M2 / (N - correction) with a fractional correction just below N: NumPy's full var
    # divides a float64 scalar ("overflow encountered in scalar divide"); the 0-d finalize
    # divided Python floats, silently, while the axis path warned.
    x = np.array([0.0, 1e150, -1e150])
    c = 3 - 2**-40
    call = (
        (lambda a: multireduce.stats(x if a is None else x[None], axis=a, correction=c).var)
        if name == "stats"
        else (lambda a: multireduce.reduce(x if a is None else x[None], name, axis=a, correction=c))
    )
    numpy_op = getattr(np, "var" if name == "stats" else name)
    for axis, words in ((None, "overflow encountered in scalar divide"), (1, "overflow encountered in divide")):
        with np.errstate(over="raise"):
            with pytest.raises(FloatingPointError, match=words):
                numpy_op(x if axis is None else x[None], axis=axis, ddof=c)  # NumPy's own, as asserted
            with pytest.raises(FloatingPointError, match=words):
                call(axis)
        with np.errstate(over="ignore"):
            assert np.all(np.isinf(call(axis)))


@pytest.mark.parametrize(
    ("name", "values", "dtype", "correction"),
    [
        ("var", [3e38, -3e38], "float32", 0),  # the squares overflow
        ("std", [3e38, -3e38], "float32", 1.99),
        ("var", [5.9e4, -5.9e4], "float16", 0),
        ("nanvar", [3e38, -3e38, np.nan], "float32", 0),  # "in multiply", as NumPy's nan functions
        ("var", [3.4e38, -3.4e38, -3.4e38], "float32", 0),  # the deviation overflows first
        ("var", [1e19, -1e19], "float32", 1.999999),  # only the division: "in cast" (full), "in divide"
        ("var", [1.7e308, -1e308, -1e308], "float64", 0),  # float64: "in subtract", then "in square"
        ("nanvar", [1.7e308, -1e308, -1e308, np.nan], "float64", 0),
    ],
)
def test_a_variance_past_its_dtypes_range_warns_as_numpys(name, values, dtype, correction):
    # A float16/float32 variance is computed in float64 and overflowed only in its last
    # conversion, which warned "overflow encountered in cast" where NumPy's (in the narrow
    # dtype) warns about its subtraction, square, or division; and no float64 variance
    # warned NumPy's "overflow encountered in subtract" for a deviation past the range.
    x = np.array(values, dtype=dtype)
    for axis in (None, 1):
        data = x if axis is None else x[None]
        found = []
        for fn in (getattr(np, name), getattr(multireduce, name)):
            kw = {"ddof": correction} if fn is getattr(np, name) else {"correction": correction}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = fn(data, axis=axis, **kw)
            found.append((np.isinf(got).tolist(), [str(w.message) for w in caught]))
        assert found[0] == found[1], (axis, found)
        assert found[0][0] in (True, [True]), found
        first = found[0][1][0].removeprefix("overflow encountered in ")
        with np.errstate(over="raise"), pytest.raises(FloatingPointError, match=f"overflow encountered in {first}"):
            getattr(multireduce, name)(data, axis=axis, correction=correction)


@pytest.mark.parametrize("name", ["sum", "prod", "nansum", "nanprod"])
@pytest.mark.parametrize(("dtype", "value"), [("float16", 60000.0), ("float32", 3e38)])
def test_a_narrow_float_sum_past_its_range_warns_as_numpys(name, dtype, value):
    # float16 and float32 sums and products accumulate in a wider float and overflow in the
    # last conversion: that warned "overflow encountered in cast", where NumPy's (in the
    # narrow dtype) warns "in reduce".
    x = np.full((2, 3), value, dtype=dtype)
    for axis in (None, 1):
        found = []
        for fn in (getattr(np, name), getattr(multireduce, name)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = fn(x, axis=axis)
            found.append((np.isinf(got).tolist(), [str(w.message) for w in caught]))
        assert found[0] == found[1], (axis, found)
        with np.errstate(over="raise"), pytest.raises(FloatingPointError, match="overflow encountered in reduce"):
            getattr(multireduce, name)(x, axis=axis)
    with np.errstate(over="ignore"):
        s = multireduce.stats(x)  # the sum field alike
    with np.errstate(over="raise"), pytest.raises(FloatingPointError, match="overflow encountered in reduce"):
        multireduce.stats(x)
    assert np.isinf(s.sum)


def _exact_variance(x: np.ndarray, axis: int) -> np.ndarray:
    # The exact variance of each slice (Fractions), rounded once.
    rows = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
    out = []
    for r in rows.tolist():
        values = [Fraction(v) for v in r]
        m = sum(values) / len(values)
        out.append(float(sum((v - m) ** 2 for v in values) / len(values)))
    return np.array(out)


@pytest.mark.parametrize("center", [3.5e150, 1e153, 1e160])
def test_variance_of_data_beyond_2_to_the_500_keeps_its_digits(center):
    # Elements beyond 2**500 could not be the base of the block means (the limit is now 2**960):
    # merged unshifted, 1e153 plus normals times 1e143 kept 8-10 digits of its variance.
    # Columns of 64 bytes: blocks of 1,024 rows, merged; the flat array: blocks of 131,072.
    rng = np.random.default_rng(3)
    x = center + rng.standard_normal((5000, 8)) * (center * 1e-10)
    want = _exact_variance(x, 0)
    np.testing.assert_allclose(multireduce.var(x, axis=0), want, rtol=1e-13)
    np.testing.assert_allclose(multireduce.var(np.ascontiguousarray(x.T), axis=1), want, rtol=1e-13)
    flat = center + rng.standard_normal(140_000) * (center * 1e-10)
    np.testing.assert_allclose(multireduce.var(flat), _exact_variance(flat[:, None], 0)[0], rtol=1e-13)


def test_a_correction_that_is_not_a_number_is_refused_for_fold_ops_as_in_the_other_layers():
    # None or "" passed the core's truth test and were taken for 0, where the Dask and MPI
    # layers (and var) raise TypeError.
    x = np.arange(5.0)
    for value in (None, ""):
        with pytest.raises(TypeError, match="op 'sum' does not take correction="):
            multireduce.reduce(x, "sum", correction=value)
    assert multireduce.reduce(x, "sum", correction=0) == 10.0  # zero is no correction


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # inf - inf, as NumPy
@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "bool"])
@pytest.mark.parametrize("n", [2, 3, 7, 8, 9, 16, 17, 33, 48])
def test_short_rows_reduced_as_their_transpose_have_the_rows_bits(monkeypatch, dtype, n):
    # Rows of at most 48 elements are reduced as their transpose (NumPy's reductions along a
    # short axis pay per row: float64 var of 262144 x 8 took 49 ms, now 19), with NumPy's
    # pairwise order along each row: every field of the state has the bits of the rows
    # reduced in place, with NaN, infinities and signed zeros among them.
    assert _stats._pairwise_order_holds()  # this NumPy adds a row as _pairwise_sum0 does
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3000, n)) * 10.0 ** rng.integers(-6, 6, (3000, n)) + 1e3
    x = x.astype(dtype) if dtype != "bool" else x > 1e3
    if dtype.startswith("float"):
        x[5, 0], x[6, n - 1], x[7, :] = np.nan, np.inf, -0.0
        x[8, 0], x[8, -1] = np.inf, -np.inf
    calls = []
    real = _stats._pairwise_sum0
    monkeypatch.setattr(_stats, "_pairwise_sum0", lambda t: calls.append(t.shape) or real(t))
    short = _stats.moments(x, (1,))
    assert calls and all(shape[0] == n for shape in calls), calls  # the transposed path ran
    monkeypatch.setattr(_stats, "_SHORT_ROWS", 0)
    rows = _stats.moments(x, (1,))
    for name in _stats._MOMENTS_FIELDS:
        _bits_equal(getattr(short, name), getattr(rows, name))
    block = np.ascontiguousarray(x.astype(np.float64).T)
    with np.errstate(invalid="ignore"):  # inf + -inf in row 8
        _bits_equal(_stats._pairwise_sum0(block), np.add.reduce(x.astype(np.float64), axis=-1))


def test_broadcast_views_keep_their_sums_order():
    # A float64 block is summed in place unless it repeats elements (a stride of 0): NumPy
    # orders such an axis otherwise than the block's copy, and the in-place sums of a
    # broadcast column changed stats().sum and mean() in the last bit (they equal NumPy's).
    rng = np.random.default_rng(3)
    col = rng.standard_normal((300, 1)) * 10 ** rng.uniform(-3, 3, (300, 1))
    x = np.broadcast_to(col, (300, 4))
    _bits_equal(multireduce.stats(x, axis=0).sum, np.sum(x, axis=0))
    _bits_equal(multireduce.mean(x, axis=0), np.mean(x, axis=0))
    _bits_equal(multireduce.var(x, axis=0), multireduce.var(np.ascontiguousarray(x), axis=0))


@pytest.mark.parametrize(
    ("name", "values", "dtype"),
    [
        ("sum", [1e5, 1.0], "float16"),
        ("nansum", [1e5, np.nan], "float16"),
        ("prod", [1e39, 1.0], "float32"),
        ("sum", [np.nan, 1.0], "int32"),
        ("sum", [70000, 1], "float16"),
    ],
)
def test_dtype_conversions_warn_as_numpys_reduction(name, values, dtype):
    # dtype= converts each element; NumPy converts inside its reduction and says "... in
    # reduce" where the conversion overflows or is invalid: this said "... in cast".
    x = np.array(values, dtype=np.int64 if isinstance(values[0], int) else np.float64)
    found = []
    for fn in (getattr(np, name), getattr(multireduce, name)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(x, dtype=dtype)
        found.append([str(w.message) for w in caught])
    assert found[0] == found[1] and found[0][0].endswith("encountered in reduce"), found


def test_stats_warns_once_where_var_and_std_leave_float16():
    # std's conversion overflows only where var's did: one warning, as var's or std's alone,
    # and NumPy's var's (its division's: "in cast" for a full reduction, else "in divide").
    x = np.array([100, -100, 0], np.float16)
    for axis, data in ((None, x), (1, x[None])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            np.var(data, axis=axis, ddof=3 - 1e-6)
        want = [str(w.message) for w in caught]
        assert want == ["overflow encountered in " + ("cast" if axis is None else "divide")], want
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            s = multireduce.stats(data, axis=axis, correction=3 - 1e-6)
        assert [str(w.message) for w in caught] == want, caught
        assert np.all(np.isinf(s.var)) and np.all(np.isinf(s.std))


def test_a_stats_of_seven_fields_still_takes_sqrt_var_for_std():
    s = multireduce.Stats(np.int64(3), np.int64(0), 6.0, 1.0, 3.0, 2.0, 4.0)
    assert s.std == 2.0 and dataclasses.astuple(s)[-1] == 2.0


def test_merging_an_infinite_mean_with_one_near_the_limit_is_that_infinity():
    # (na * mean_a + nb * mean_b) / n: 3 * (max / 3) overflowed to inf, and inf + -inf gave a
    # NaN mean where NumPy's mean of the whole, and every order of the parts, is -inf.
    top = float(np.finfo(np.float64).max)
    whole = np.array([top, 0.0, 0.0, -np.inf])
    with np.errstate(all="ignore"):
        want = np.mean(whole)
    assert want == -np.inf
    a, b = _stats.moments(whole[:3], (0,)), _stats.moments(whole[3:], (0,))
    records = np.stack([_stats.to_structured(a), _stats.to_structured(b)])
    for state in (_stats.merge(a, b), _stats.merge(b, a), _stats.merge_records(records)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert _stats.finalize_moments(state, OPS["mean"], np.dtype(np.float64)) == want, state
    a2, b2 = (s.map(lambda v: np.asarray(v).reshape(1)) for s in (a, b))  # the array merge
    assert _stats.merge(a2, b2).mean[0] == -np.inf
