"""The one core reduction, :func:`reduce`; :func:`partial` for the layers; :func:`stats`.

:func:`partial` gives what the distributed layers combine, and :func:`stats` several
statistics from one pass.

Both dispatch on the array's library: NumPy arrays reduce on the CPU (``_backend.numpy``),
CuPy arrays on their GPU with multireduce's own kernel (``_backend.cupy``). CuPy is imported
only when a CuPy array is passed, and MPI is never touched here.
"""

from __future__ import annotations

import math
import operator
import sys
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from . import _stats
from .ops import OPS, Op, cast_result, check_dtype, get_op

__all__ = [
    "all",
    "any",
    "argmax",
    "argmin",
    "count_nonzero",
    "max",
    "mean",
    "min",
    "nanargmax",
    "nanargmin",
    "nanmax",
    "nanmean",
    "nanmin",
    "nanprod",
    "nanstd",
    "nansum",
    "nanvar",
    "normalize_axes",
    "partial",
    "prod",
    "reduce",
    "stats",
    "std",
    "sum",
    "var",
]

_ACCEPTED_INPUTS = "numpy.ndarray, a NumPy scalar, a Python list/tuple/scalar, or cupy.ndarray"


def _is_cupy_array(x: Any) -> bool:
    # Checking the module name first keeps CuPy unimported until a CuPy array shows up.
    if not type(x).__module__.startswith("cupy"):
        return False
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


_cupy_backend = None  # the CuPy backend module, once a CuPy array has been seen


def _refused_subclass(x: np.ndarray, what: str = "a {}", fill: str = "x.filled(v)") -> TypeError | None:
    """The error for an ndarray subclass whose reductions mean something else, or None.

    ``numpy.ma.MaskedArray``: its mask would be ignored (every element reduced).
    ``numpy.matrix``: NumPy's reductions of it keep two dimensions (an axis reduction of it
    is a 1xN or Nx1 matrix), which ndarray results would silently change. Other subclasses
    (``numpy.memmap``, a ``numpy.recarray`` of a supported dtype) hold plain elements and
    are reduced as ndarrays. ``what`` names the input (``{}``: the type), ``fill`` how to
    fill a masked one.
    """
    ma = sys.modules.get("numpy.ma")  # imported wherever a masked array exists
    if ma is not None and isinstance(x, ma.MaskedArray):
        return TypeError(
            f"cannot reduce {what.format('numpy.ma.MaskedArray')}: multireduce reduces every element "
            f"and would ignore the mask. Fill the masked elements with a value v neutral for the op "
            f"first ({fill}), or use the masked array's own reductions"
        )
    if isinstance(x, np.matrix):
        return TypeError(
            f"cannot reduce {what.format('numpy.matrix')}: NumPy's reductions of a matrix keep two "
            "dimensions (numpy.sum(m, axis=0) is a 1xN matrix), which multireduce's results would "
            "not; convert with numpy.asarray first"
        )
    return None


def _backend_and_array(x: Any):
    global _cupy_backend
    if _cupy_backend is not None and type(x) is _cupy_backend.cupy.ndarray:
        return _cupy_backend, x  # the first test, so that tiny GPU reductions pay least
    if isinstance(x, np.ndarray):
        if type(x) is not np.ndarray and (error := _refused_subclass(x)) is not None:
            raise error
        from ._backend import numpy as backend

        return backend, x
    if _is_cupy_array(x):
        from ._backend import cupy as backend

        _cupy_backend = backend
        return backend, x
    if isinstance(x, np.generic | list | tuple | int | float | bool):
        from ._backend import numpy as backend

        return backend, np.asarray(x)
    kind = f"{type(x).__module__}.{type(x).__qualname__}"
    raise TypeError(f"cannot reduce an object of type {kind}; expected {_ACCEPTED_INPUTS}")


def normalize_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (None, an int or a tuple of ints, negative allowed) as sorted non-negative axes.

    Raises
    ------
    numpy.exceptions.AxisError
        For an axis out of range (NumPy's exception and message).
    ValueError
        For a repeated axis (NumPy's message).
    TypeError
        For an axis that is not an integer.
    """
    if axis is None:
        return tuple(range(ndim))
    return tuple(sorted(normalize_axis_tuple(_checked_axis(axis), ndim)))


def _checked_axis(axis: Any) -> Any:
    """``axis`` (not None) if it is an int or a tuple of ints; else NumPy's TypeError, with what is accepted.

    NumPy's ``normalize_axis_tuple`` takes a bool as 0 or 1 (``operator.index(True)`` is 1)
    and a list as a tuple, where NumPy's reductions refuse both. Ints are anything
    ``operator.index`` takes (NumPy integers, 0-d integer arrays), bools excepted. An ndarray
    has ``__index__`` whatever its shape and dtype, and ``normalize_axis_tuple`` iterated a
    1-D array as a list of axes: only ``operator.index`` itself tells.
    """
    for item in axis if isinstance(axis, tuple) else (axis,):
        if isinstance(item, bool | np.bool_) or not _is_index(item):
            raise TypeError(
                f"axis must be None, an int or a tuple of ints, got {axis!r} (an element of type {type(item).__name__})"
            )
    return axis


def _is_index(item: Any) -> bool:
    if type(item) is int:
        return True  # the common case, without the call
    try:
        operator.index(item)
    except TypeError:
        return False
    return True


def _checked_keepdims(keepdims: Any) -> bool:
    # NumPy takes ints too (nonzero is True); a string or None is an error there as well.
    if not isinstance(keepdims, bool | np.bool_ | int | np.integer):
        raise TypeError(f"keepdims must be a bool, got {keepdims!r} of type {type(keepdims).__name__}")
    return bool(keepdims)


def _checked_reproducible(reproducible: Any) -> bool:
    # Our own flag, so no truthiness: reproducible="false" took the exact path.
    if not isinstance(reproducible, bool | np.bool_):
        raise TypeError(
            f"reproducible must be True or False, got {reproducible!r} of type {type(reproducible).__name__}"
        )
    return bool(reproducible)


def _arg_axis(axis: Any, ndim: int, op: Op) -> int | None:
    if axis is None:
        return None
    if isinstance(axis, tuple | list):
        raise TypeError(f"{op.name} takes axis=None or a single int (as numpy.{op.name}), not {axis!r}")
    return normalize_axis_index(operator.index(_checked_axis(axis)), ndim)


_plans: dict[tuple, tuple[Op, np.dtype, np.dtype]] = {}
#: (op name, dtype) -> (op, accumulator, result) of every fold op with a GPU kernel planned
#: without ``dtype=``: what the per-call paths of tiny GPU reductions need (``_reduce_all``,
#: and :func:`partial` into ``out=``).
_gpu_plans: dict[tuple[str, np.dtype], tuple[Op, np.dtype, np.dtype]] = {}


def _plan(arr, op: str | Op, dtype) -> tuple[Op, np.dtype, np.dtype]:
    """(op, result dtype, accumulator dtype), validated once per combination and cached.

    This is on the path of every call, including tiny ones where Python overhead dominates.
    """
    try:
        return _plans[op, arr.dtype, dtype]
    except (KeyError, TypeError):  # TypeError: an unhashable dtype= argument
        pass
    resolved = get_op(op)
    result = resolved.result_dtype(check_dtype(arr.dtype), dtype)
    plan = (resolved, result, resolved.accumulator_dtype(result))
    try:
        _plans[op, arr.dtype, dtype] = plan
    except TypeError:
        pass
    if type(op) is str and dtype is None and resolved.kind == "fold":  # every fold op has a kernel
        _gpu_plans[op, arr.dtype] = (resolved, plan[2], plan[1])
    return plan


def _converts(dtype: np.dtype, result: np.dtype, acc: np.dtype, exact: bool = False) -> bool:
    """Whether a partial of ``dtype`` elements under ``dtype=`` needs them converted first.

    ``dtype=`` converts every element to the result dtype before it is accumulated (as the
    Array API standard and NumPy do). A reduction straight to the result converts on the fly
    (the kernels' and the CPU path's loads); a partial, accumulated and returned in the wider
    accumulator dtype ``acc`` (float16 sums in float32, float32 in float64), converts to
    ``acc`` instead, which differs where the cast to the result is not the cast to ``acc``
    followed by the final cast to the result; the exact accumulator (``exact``) takes float
    elements only.

    * A result that is the accumulator dtype (int64, uint64, float64): accumulating in it
      converts each element to it on the way in.
    * Narrower integer results of integer or bool elements: the conversion wraps modulo
      2**bits, which commutes with adding and multiplying in the 64-bit accumulator.
    * Narrower integer results of float elements: each element is truncated (an infinity,
      a NaN or a value out of range becomes whatever the cast makes of it), which does not
      commute: ``[inf, 1.0]`` summed as int32 is -2147483647 in NumPy, not 1.
    * Narrower float results: where the cast to them rounds (int32 or float64 elements to
      float32 or float16).
    """
    if dtype == result:
        return False
    if exact:  # float elements only; a widening float conversion changes no value
        return not (dtype.kind == "f" and np.can_cast(dtype, result, "safe"))
    if result == acc:
        return False
    if result.kind in "iu":
        return dtype.kind == "f"
    return not np.can_cast(dtype, result, "safe")


def _converted(arr, op: Op, result: np.dtype, acc: np.dtype, exact: bool):
    """``arr`` with each element converted to ``result`` where :func:`_converts` says so (a copy).

    As the backends' reductions with ``dtype=`` convert: nansum and nanprod drop NaN (as
    their identity, 0 or 1) before an integer conversion; a NaN, an infinity or a value out
    of range converts to whatever the cast gives, with NumPy's RuntimeWarning on the CPU
    ("overflow" or "invalid value encountered in reduce", as NumPy's reduction converts
    inside the reduction: :func:`multireduce.ops.cast_result`; ``np.errstate`` governs it).
    """
    if not _converts(arr.dtype, result, acc, exact):
        return arr
    if op.skips_nan and arr.dtype.kind == "f" and result.kind in "iu":
        xp = sys.modules["cupy"] if _is_cupy_array(arr) else np
        arr = xp.where(xp.isnan(arr), op.identity(arr.dtype), arr)
    return cast_result(arr, result)


def _check_correction(op: Op, correction: Any) -> float:
    if op.statistic in ("var", "std"):
        if isinstance(correction, bool) or not isinstance(correction, int | float | np.integer | np.floating):
            raise TypeError(f"correction must be a real number (int or float), got {correction!r}")
        return float(correction)
    if correction != 0:
        raise TypeError(f"op {op.name!r} does not take correction=; only 'var', 'std', 'nanvar' and 'nanstd' do")
    return 0.0


#: ``tuple(range(ndim))`` for every ndim NumPy allows.
_ALL_AXES = tuple(tuple(range(n)) for n in range(65))


def _keep(value, shape: tuple[int, ...], axes: tuple[int, ...]):
    kept = tuple(1 if i in axes else n for i, n in enumerate(shape))
    return value.reshape(kept)


#: reduce()'s default correction, compared by identity on the fast path.
_NO_CORRECTION = 0.0


def reduce(
    x: Any,
    op: str | Op,
    *,
    axis: Any = None,
    keepdims: bool = False,
    dtype: Any = None,
    correction: float = _NO_CORRECTION,
    reproducible: bool = False,
):
    """Reduce ``x`` with ``op`` over ``axis``.

    NumPy arrays reduce on the CPU, CuPy arrays on their own GPU with multireduce's kernels;
    the result lives where the input lives. The semantics are the Python Array API standard's
    (2023.12), and NumPy's where the standard leaves a choice; ``docs/semantics.md`` lists
    where multireduce differs from NumPy.

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray
        Input of any shape (0-d included) and layout (views, offsets and negative strides are
        fine). Python lists and scalars are converted with ``numpy.asarray``. Supported
        dtypes: bool, int8-int64, uint8-uint64, float16, float32, float64. ndarray
        subclasses such as ``numpy.memmap`` are reduced as ndarrays, except
        ``numpy.ma.MaskedArray`` (the mask would be ignored) and ``numpy.matrix`` (its
        reductions keep two dimensions), which are refused.
    op : str or Op
        One of ``multireduce.OPS``: sum, prod, max, min, mean, var, std, count_nonzero, any,
        all, argmin, argmax, nansum, nanprod, nanmax, nanmin, nanmean, nanvar, nanstd,
        nanargmin, nanargmax.
    axis : None, int or tuple of int, optional
        Axes to reduce (negative counts from the end); None reduces all. argmin, argmax,
        nanargmin and nanargmax take None or one int; None indexes the C-order flattening,
        as in NumPy.
    keepdims : bool, optional
        If true, the reduced axes stay as axes of length one.
    dtype : dtype, optional
        Result dtype, for sum, prod, nansum and nanprod only. Elements are converted to it
        first.
    correction : float, optional
        For var, std, nanvar and nanstd: the divisor is ``N - correction`` (``ddof`` in
        NumPy; N counts the non-NaN elements for nanvar and nanstd).
    reproducible : bool, optional
        For float sum and mean: the correctly rounded result of the exact sum, the same bits
        whatever the order, chunking, rank count or device (see :mod:`multireduce._exact`).
        Ops whose results never depend on order (integer sums, max, min, nanmax, nanmin,
        any, all, count_nonzero, argmin, argmax, nanargmin, nanargmax) accept it and are
        unchanged, over any axes;
        so does the mean of integer and bool input, ``float64(exact total) / n`` (see
        Notes), wherever ``n * max(|x|) < 2**62`` (computed in float64, as the GPU kernel
        does: within its rounding of 2**62 it counts as reaching it) for every result, so
        that its int64 or uint64 total cannot wrap.

    Returns
    -------
    numpy.generic, numpy.ndarray or cupy.ndarray
        For NumPy input a NumPy scalar when every axis is reduced without ``keepdims`` (and
        for a 0-d input, as NumPy), else an ndarray; for CuPy input a CuPy array. Result
        dtypes: sum, prod, nansum, nanprod: int64 for bool and signed integers, uint64 for
        unsigned integers, the input's dtype for floats;
        max, min, nanmax, nanmin: the input's; mean, var, std, nanmean, nanvar, nanstd: the
        input's float dtype, float64 for bool and integers; any, all: bool; count_nonzero,
        argmin, argmax, nanargmin, nanargmax: int64.

    Raises
    ------
    TypeError
        For an unsupported input type (a masked array or a matrix included) or dtype,
        ``dtype=`` given to an op that does not take it, ``correction=`` given to an op other
        than var/std/nanvar/nanstd, or a tuple axis for the arg ops.
    ValueError
        For an unknown op, a repeated axis, or max, min, nanmax, nanmin and the arg ops over
        zero elements; nanargmin and nanargmax over a slice of NaN only (NumPy's messages).
    numpy.exceptions.AxisError
        For an axis out of range.
    NotImplementedError
        With ``reproducible=True``: prod, var, std, nansum, nanprod, nanmean, nanvar and nanstd; a
        float sum or mean over an ``axis`` that leaves axes unreduced; an integer or bool mean where ``n *
        max(|x|)`` reaches 2**62 (the message gives the count and the largest magnitude).

    Notes
    -----
    Integer sums and products wrap modulo 2**64 (then to the result dtype) exactly as NumPy's
    do. float16 sums accumulate in float32 and float32 sums in float64, each rounded once at
    the end. max/min propagate NaN as NumPy does and follow IEEE 754-2019 for signed zeros
    (+0.0 is larger than -0.0), so that the result does not depend on element order; nanmax
    and nanmin ignore NaN and return NaN only where every element is NaN. Sums of zeros are
    +0.0. mean, var and std accumulate in float64 from one pass (Chan et al.'s update; a GPU
    mean, and a CPU mean over axes adjacent in a C- or Fortran-contiguous array, is the
    float64 sum over the count; the mean of integers is their exact total over the count wherever the
    total cannot wrap, on every path); the mean of zero elements is NaN, and var/std
    are NaN where ``N - correction <= 0`` (the standard's rule; NumPy gives inf there).
    argmin/argmax return the first index of the extreme in the same order as min/max, NaN
    first; nanargmin/nanargmax pass over NaN.

    Examples
    --------
    >>> import numpy as np, multireduce
    >>> multireduce.reduce(np.arange(10, dtype=np.int8), "sum")
    np.int64(45)
    >>> multireduce.reduce(np.array([1.0, np.nan, 3.0]), "max")
    np.float64(nan)
    >>> multireduce.reduce(np.arange(6).reshape(2, 3), "sum", axis=0)
    array([3, 5, 7])
    """
    if axis is None and dtype is None and keepdims is False and reproducible is False and correction is _NO_CORRECTION:
        return _reduce_all(x, op)
    return _reduce(x, op, axis, keepdims, dtype, correction, reproducible)


def _reduce_all(x: Any, op: str | Op):
    """``reduce(x, op)`` with no other argument: first, the per-call path of tiny GPU reductions.

    A non-empty CuPy array and a fold op with a GPU kernel, planned before (``_gpu_plans``),
    go straight to the kernel launch.
    """
    if _cupy_backend is not None and type(x) is _cupy_backend.cupy.ndarray and type(op) is str:
        plan = _gpu_plans.get((op, x.dtype))
        if plan is not None and x.size:
            return _cupy_backend.reduce_full(x, *plan)
    return _reduce(x, op, None, False, None, _NO_CORRECTION, False)


def _reduce(x: Any, op: str | Op, axis: Any, keepdims: bool, dtype: Any, correction: float, reproducible: bool):
    """:func:`reduce`, all arguments given."""
    backend, arr = _backend_and_array(x)
    op, result, acc = _plan(arr, op, dtype)
    keepdims = _checked_keepdims(keepdims)
    reproducible = _checked_reproducible(reproducible)
    # Checked unless it is the default (None and "" passed a truth test here and were taken
    # for 0, where the MPI and Dask layers refuse them).
    corr = _check_correction(op, correction) if correction is not _NO_CORRECTION or op.kind == "moments" else 0.0
    ndim = arr.ndim
    if op.kind == "arg":
        arg_axis = _arg_axis(axis, ndim, op)
        axes = _ALL_AXES[ndim] if arg_axis is None else (arg_axis,)
    elif axis is None:
        axes = _ALL_AXES[ndim]  # the common case, on the per-call path of tiny GPU reductions
    else:
        axes = normalize_axes(axis, ndim)
    # A non-empty array has no empty axis: the product is only formed for empty ones.
    if not op.empty_allowed and arr.size == 0 and math.prod(arr.shape[a] for a in axes) == 0:
        raise op.empty_error()
    full = len(axes) == ndim
    if reproducible and _needs_exact(arr.dtype, op, result, full):
        # The exact sum is formed where the data lives, and rounded once: a GPU sum by
        # exact_sum_rounded (see its ROUND_ON_DEVICE), a mean or a CPU sum on the host.
        if dtype is not None:
            arr = _converted(arr, op, result, acc, exact=True)
        if backend is _cupy_backend and op.name == "sum" and arr.dtype.kind == "f" and result.kind == "f":
            value = backend.exact_sum_rounded(arr, result)
        else:
            value = backend.exact_sum(arr).result(result, mean=op.name == "mean")
            if backend is _cupy_backend:
                value = backend.constant(value, result, like=arr)
        return _keep(value, arr.shape, axes) if keepdims else value
    if reproducible and op.name == "mean" and arr.dtype.kind in "biu":
        _check_integer_mean(arr, axes)  # then the ordinary mean, which is exact there
    if op.kind == "fold":
        if full and arr.size == 0 and op.functor is not None:
            value = backend.constant(op.identity(acc), result, like=arr)
        else:
            value = backend.reduce(arr, op, acc, result, axes)
    elif op.kind == "moments":
        float_nan_op = op.skips_nan and arr.dtype.kind == "f"
        if arr.size == 0 and not float_nan_op and math.prod(n for i, n in enumerate(arr.shape) if i not in axes) == 0:
            # An empty result has no state to warn from, but NumPy warns by the count of the
            # reduced axes: var(ones((2, 0)), axis=0, correction=2) is [] with "Degrees of
            # freedom <= 0 for slice". (np.nanvar of floats does not; of integers it is np.var.)
            _stats.warn_moments(op, math.prod(arr.shape[a] for a in axes), corr, inexact=False)
        if backend is _cupy_backend and not op.skips_nan and arr.size:
            # Finalized on the device (nothing waits for the GPU): the warnings depend on the
            # shape alone, except those of nanmean, nanvar and nanstd, which count the non-NaN
            # elements (their states come to the host, below).
            _stats.warn_moments(op, math.prod(arr.shape[a] for a in axes), corr)
            value = backend.moments_result(arr, axes, op, result, corr)
        elif backend is not _cupy_backend and op.name == "mean" and arr.size and backend.mean_by_sum(arr, axes):
            # The CPU's mean, as the GPU's: the float64 sum over the count (no warning: every
            # reduced slice has elements).
            value = backend.mean_result(arr, axes, result)
        else:
            on_cpu = backend is not _cupy_backend  # the GPU kernels do not warn
            value = _stats.finalize_moments(backend.moments(arr, axes, op), op, result, corr, value_warnings=on_cpu)
            if not on_cpu:  # the state came to the host; the result lives on the device
                value = backend.from_host(value, result, like=arr)
    else:
        arg_axis = None if full and (axis is None or ndim <= 1) else axes[0]
        if backend is _cupy_backend and op.skips_nan and arr.dtype.kind == "f":
            # nanargmax, nanargmin: an all-NaN slice raises (NumPy's ValueError), so the state
            # comes to the host to be checked; the indices go back to the device.
            indices = _stats.arg_finalize(backend.arg(arr, arg_axis, op), op)
            value = backend.from_host(indices, np.dtype(np.int64), like=arr)
        else:
            # The reduced axis is not empty (checked above), so every index exists: a GPU
            # result stays on the device, with nothing to decide on the host.
            value = backend.arg_result(arr, arg_axis, op)
    if keepdims:
        value = _keep(value, arr.shape, axes)
    return value


#: Ops whose result does not depend on the order of the elements: reproducible already.
_ORDER_FREE = frozenset(
    {"max", "min", "nanmax", "nanmin", "any", "all", "count_nonzero", "argmin", "argmax", "nanargmin", "nanargmax"}
)


def _needs_exact(dtype: np.dtype, op: Op, result: np.dtype, full: bool) -> bool:
    """Whether ``reproducible=True`` needs the exact accumulator here.

    Raises where it is asked for and cannot be given. The mean of integer or bool input
    needs none: it is ``float64(exact total) / n`` wherever its total cannot wrap, which
    depends on the data (:func:`_integer_mean_error`, checked where the counts and extremes
    are known: :func:`reduce`, :func:`partial`, and the MPI and Dask layers' merged states).
    """
    if op.name in _ORDER_FREE or (op.name == "sum" and result.kind in "iu"):
        return False  # exact or order-free already: the ordinary path is reproducible
    if op.name not in ("sum", "mean"):
        raise NotImplementedError(
            f"reproducible=True is not available for op {op.name!r}; it covers sum and mean, "
            f"and the order-free ops {', '.join(sorted(_ORDER_FREE))}"
        )
    if op.name == "mean" and dtype.kind != "f":
        return False  # exact where the total cannot wrap, over any axes (_integer_mean_error)
    if not full:
        raise NotImplementedError("reproducible=True supports full reductions only (axis=None or every axis)")
    return True


def _integer_mean_error(dtype: np.dtype, count: Any, lo: Any, hi: Any) -> NotImplementedError | None:
    """Why ``reproducible=True`` cannot be given for a mean of integer or bool input; None where it can.

    ``count``, ``lo`` and ``hi`` are each result's number of elements and extremes (host
    scalars or arrays of one shape). The mean of integers is ``float64(total) / n`` with the
    total exact, on every path and layer, where ``n * max(|lo|, |hi|) < 2**62`` in float64
    (:func:`multireduce._stats.state_mean`'s test): the count, the extremes and the exact
    total are the same however the elements are ordered or split, so its bits are too.
    Elsewhere the int64 or uint64 total may have wrapped, and the mean is that of Chan's
    update of the merged states, which depends on the split: refused, with the count and the
    largest magnitude of the first such result.
    """
    n, lo, hi = np.broadcast_arrays(np.asarray(count), np.asarray(lo), np.asarray(hi))
    ok = (n == 0) | _stats.total_cannot_wrap(n, lo, hi)
    if np.all(ok):
        return None
    k = np.unravel_index(int(np.argmin(ok)), ok.shape)
    low, high = abs(int(lo[k])), abs(int(hi[k]))
    magnitude = high if high > low else low  # (max is this module's)
    total = OPS["sum"].result_dtype(dtype)
    return NotImplementedError(
        f"reproducible=True: the mean of {int(n[k]):,} {dtype} elements of magnitude up to {magnitude:,} cannot be "
        f"given reproducibly: their {total} total could wrap (n * max|x|, computed in float64, is not below "
        "2**62), and the mean would "
        "then depend on how the elements are split. Accepted: float input, and integer or bool input with "
        "n * max|x| < 2**62 (bool, int8, uint8, int16 and uint16 below 2**46 elements, int32 below 2**31, uint32 up "
        "to 2**30); convert to float64 first for the reproducible mean of the converted values"
    )


def _check_integer_mean(arr: Any, axes: tuple[int, ...]) -> None:
    """Raise :func:`_integer_mean_error`'s error for the mean of the integer or bool ``arr`` over ``axes``.

    The dtype's range decides where it can (:func:`multireduce._stats.dtype_total_bound`);
    elsewhere the data's extremes, at the cost of a min and a max.
    """
    count = math.prod(arr.shape[a] for a in axes)
    if arr.size == 0 or _stats.dtype_total_bound(arr.dtype, count):
        return
    lo, hi = (_reduce(arr, op, axes, False, None, _NO_CORRECTION, False) for op in ("min", "max"))
    if _is_cupy_array(lo):
        lo, hi = lo.get(), hi.get()
    error = _integer_mean_error(arr.dtype, count, lo, hi)
    if error is not None:
        raise error


def partial(
    x: Any,
    op: str | Op,
    *,
    axis: Any = None,
    keepdims: bool = False,
    dtype: Any = None,
    reproducible: bool = False,
    out: Any = None,
):
    """Reduce ``x`` to a partial result: what the distributed layers exchange and combine.

    Fold ops give values in the op's accumulator dtype (float32 sums as float64, integer
    sums as int64/uint64, float16 as float32). An empty ``x`` gives the op's identity (also
    for max/min), so that empty shards and chunks combine correctly. Moments ops (mean,
    nanmean, var, std) give a :class:`multireduce._stats.Moments` state, arg ops an
    :class:`multireduce._stats.ArgState` (indices relative to ``x``'s C-order flattening for
    ``axis=None``).

    ``dtype=`` (sum, prod, nansum and nanprod, as in :func:`reduce`) converts each element to that
    dtype first; the partial is then in that dtype's accumulator (a float32 request gives a
    float64 partial of the float32-converted elements), so that combining partials and
    converting once at the end gives what :func:`reduce` gives.

    Returns
    -------
    numpy.generic, numpy.ndarray, cupy.ndarray, Moments or ArgState
        With the shape of the kept axes (kept as length one with ``keepdims``).

    With ``reproducible=True``, float sums and means give an
    :class:`multireduce._exact.ExactSum` (exact, mergeable in any order) instead. Means of
    integer and bool input give their moments state as without it, whose merged total,
    count and extremes are exact, after the check of :func:`reduce` on this part (a part
    whose total could wrap raises; the merged state needs the same check).

    ``out``, for a full reduction of a fold op only, is a 0-d array of the accumulator dtype
    from the input's library (NumPy or CuPy) that receives the partial and is returned. For
    CuPy input the kernel writes it directly, so ``out`` may be pinned host memory mapped into
    the device's address space: the MPI layer receives partials that way, without a copy.

    Raises
    ------
    NotImplementedError
        With ``reproducible=True``, as :func:`reduce`.
    TypeError, ValueError
        For an ``out`` of the wrong library, dtype or shape, or with an op or axis it does not
        take.
    """
    if (
        out is not None
        and dtype is None
        and _cupy_backend is not None
        and type(x) is type(out) is _cupy_backend.cupy.ndarray
    ):
        # The MPI layer's per-call path: a GPU shard's partial into its pinned slot.
        fast = axis is None and keepdims is False and reproducible is False
        plan = _gpu_plans.get((op, x.dtype)) if fast else None
        same_device = out.data.device_id == x.data.device_id  # else _partial_into refuses it
        if plan is not None and x.size and out.shape == () and out.dtype == plan[1] and same_device:
            return _cupy_backend.reduce_full(x, plan[0], plan[1], plan[1], out=out)
    backend, arr = _backend_and_array(x)
    op, result, acc = _plan(arr, op, dtype)
    keepdims = _checked_keepdims(keepdims)
    reproducible = _checked_reproducible(reproducible)
    if dtype is not None:
        exact = reproducible and op.name == "sum" and result.kind == "f"
        arr = _converted(arr, op, result, acc, exact=exact)
    if out is not None:
        return _partial_into(backend, arr, op, acc, axis, keepdims, reproducible, out)
    ndim = arr.ndim
    if reproducible:  # the axes are normalized below too; only this path needs them first
        full = axis is None or len(normalize_axes(axis, ndim)) == ndim
        if _needs_exact(arr.dtype, op, result, full):
            return backend.exact_sum(arr)
    if op.kind == "arg":
        arg_axis = _arg_axis(axis, ndim, op)
        axes = tuple(range(ndim)) if arg_axis is None else (arg_axis,)
    else:
        axes = normalize_axes(axis, ndim)
    full = len(axes) == ndim
    if op.kind == "fold":
        if arr.size == 0 and full:
            value = backend.constant(op.identity(acc), acc, like=arr)
        elif math.prod(arr.shape[a] for a in axes) == 0:
            # Empty along the reduced axes: the identity (max/min have one here too).
            kshape = tuple(n for i, n in enumerate(arr.shape) if i not in axes)
            value = backend.constant(op.identity(acc), acc, kshape, like=arr)
        else:
            value = backend.reduce(arr, op, acc, acc, axes)
        return _keep(value, arr.shape, axes) if keepdims else value
    if op.kind == "moments":
        state = backend.moments(arr, axes, op)
        if reproducible and op.name == "mean" and arr.dtype.kind in "biu":
            error = _integer_mean_error(arr.dtype, state.n, state.lo, state.hi)
            if error is not None:
                raise error
    elif math.prod(arr.shape[a] for a in axes) == 0:
        kshape = tuple(n for i, n in enumerate(arr.shape) if i not in axes)
        state = _stats.empty_arg_state(arr.dtype, kshape)  # the value in the input's extreme dtype
    else:
        state = backend.arg(arr, None if full and (axis is None or ndim <= 1) else axes[0], op)
    if keepdims:
        state = state.map(lambda a: _keep(np.asarray(a), arr.shape, axes))
    return state


def _partial_into(backend, arr, op: Op, acc: np.dtype, axis, keepdims: bool, reproducible: bool, out):
    """:func:`partial` with ``out=``: a full fold partial written into the 0-d array ``out``."""
    if op.kind != "fold" or reproducible:
        raise ValueError(f"out= takes a fold op without reproducible=True, not op {op.name!r}")
    if keepdims or len(normalize_axes(axis, arr.ndim)) != arr.ndim:
        raise ValueError("out= takes full reductions only (axis=None or every axis, keepdims=False)")
    if type(out) is not type(arr) or out.shape != () or out.dtype != acc:
        raise TypeError(
            f"out= must be a 0-d {type(arr).__module__}.ndarray of the accumulator dtype {acc} "
            f"(op {op.name!r} on {arr.dtype}), not {type(out).__name__} of shape "
            f"{getattr(out, 'shape', None)} and dtype {getattr(out, 'dtype', None)}"
        )
    if backend is _cupy_backend and out.device != arr.device:
        raise ValueError(f"out= must be on the input's device (GPU {arr.device.id}), not on GPU {out.device.id}")
    if arr.size and backend is _cupy_backend and op.functor is not None:
        return backend.reduce_full(arr, op, acc, acc, out=out)
    if arr.size == 0:
        out[...] = backend.constant(op.identity(acc), acc, like=arr)
    else:
        out[...] = backend.reduce(arr, op, acc, acc, _ALL_AXES[arr.ndim])
    return out


# ----------------------------------------------------------------------------------------
# The public functions, one per op. Their parameters are those of the Array API standard
# (2023.12), plus dtype= for nansum as for sum.


def sum(x: Any, *, axis: Any = None, keepdims: bool = False, dtype: Any = None, reproducible: bool = False):  # noqa: A001
    """Sum of the elements over ``axis``; :func:`reduce` with ``op="sum"``.

    Bool and signed integers sum to int64, unsigned integers to uint64, floats keep their
    dtype (or ``dtype=``). The sum of zero elements is 0, and a sum of zeros is +0.0. With
    ``reproducible=True`` a float sum is the correctly rounded exact sum: the same bits for
    any order, chunking, rank count or device.
    """
    if axis is None and dtype is None and keepdims is False and reproducible is False:
        return _reduce_all(x, "sum")
    return _reduce(x, "sum", axis, keepdims, dtype, _NO_CORRECTION, reproducible)


def prod(x: Any, *, axis: Any = None, keepdims: bool = False, dtype: Any = None):
    """Product of the elements over ``axis``; :func:`reduce` with ``op="prod"``.

    Result dtypes as :func:`sum`; the product of zero elements is 1.
    """
    return reduce(x, "prod", axis=axis, keepdims=keepdims, dtype=dtype)


def max(x: Any, *, axis: Any = None, keepdims: bool = False):  # noqa: A001
    """Largest element over ``axis`` (NaN if any element is NaN; +0.0 > -0.0); :func:`reduce` with ``op="max"``."""
    if axis is None and keepdims is False:
        return _reduce_all(x, "max")
    return _reduce(x, "max", axis, keepdims, None, _NO_CORRECTION, False)


def min(x: Any, *, axis: Any = None, keepdims: bool = False):  # noqa: A001
    """Smallest element over ``axis`` (NaN if any element is NaN; -0.0 < +0.0); :func:`reduce` with ``op="min"``."""
    if axis is None and keepdims is False:
        return _reduce_all(x, "min")
    return _reduce(x, "min", axis, keepdims, None, _NO_CORRECTION, False)


def mean(x: Any, *, axis: Any = None, keepdims: bool = False, reproducible: bool = False):
    """Arithmetic mean over ``axis``; :func:`reduce` with ``op="mean"``.

    Accumulates in float64; the result has the input's float dtype (float64 for bool and
    integers). The mean of zero elements is NaN (with NumPy's RuntimeWarning). With
    ``reproducible=True``, for float input the exact sum divided by the count, rounded once;
    for integer and bool input the usual ``float64(exact total) / n``, which is reproducible
    already, accepted wherever ``n * max(|x|) < 2**62`` (elsewhere NotImplementedError, as
    its total could wrap).
    """
    return reduce(x, "mean", axis=axis, keepdims=keepdims, reproducible=reproducible)


def var(x: Any, *, axis: Any = None, correction: float = 0.0, keepdims: bool = False):
    """Variance over ``axis`` with divisor ``N - correction``; :func:`reduce` with ``op="var"``.

    One pass, merged with Chan et al.'s update in float64. NaN where ``N - correction <= 0``
    (the Array API rule; NumPy returns inf or NaN there), or where any element is NaN.
    """
    return reduce(x, "var", axis=axis, keepdims=keepdims, correction=correction)


def std(x: Any, *, axis: Any = None, correction: float = 0.0, keepdims: bool = False):
    """Standard deviation, ``sqrt(var(x, ...))``; :func:`reduce` with ``op="std"``."""
    return reduce(x, "std", axis=axis, keepdims=keepdims, correction=correction)


def count_nonzero(x: Any, *, axis: Any = None, keepdims: bool = False):
    """Number of nonzero elements over ``axis`` as int64 (NaN counts as nonzero)."""
    return reduce(x, "count_nonzero", axis=axis, keepdims=keepdims)


def any(x: Any, *, axis: Any = None, keepdims: bool = False):  # noqa: A001
    """Whether any element over ``axis`` is nonzero (NaN is nonzero); False for zero elements."""
    return reduce(x, "any", axis=axis, keepdims=keepdims)


def all(x: Any, *, axis: Any = None, keepdims: bool = False):  # noqa: A001
    """Whether every element over ``axis`` is nonzero (NaN is nonzero); True for zero elements."""
    return reduce(x, "all", axis=axis, keepdims=keepdims)


def argmax(x: Any, *, axis: int | None = None, keepdims: bool = False):
    """Index (int64) of the first maximum along ``axis``, or of the C-order flattening.

    The maximum is :func:`max`'s: a NaN wins (the first NaN), and +0.0 beats -0.0.

    Raises
    ------
    ValueError
        Over zero elements (NumPy's message).
    """
    return reduce(x, "argmax", axis=axis, keepdims=keepdims)


def argmin(x: Any, *, axis: int | None = None, keepdims: bool = False):
    """Index (int64) of the first minimum along ``axis``, or of the C-order flattening.

    The minimum is :func:`min`'s: a NaN wins (the first NaN), and -0.0 beats +0.0.

    Raises
    ------
    ValueError
        Over zero elements (NumPy's message).
    """
    return reduce(x, "argmin", axis=axis, keepdims=keepdims)


def nanargmax(x: Any, *, axis: int | None = None, keepdims: bool = False):
    """Index (int64) of the first maximum of the non-NaN elements, as :func:`numpy.nanargmax`.

    :func:`argmax`'s order (+0.0 beats -0.0) among the elements that are not NaN.

    Raises
    ------
    ValueError
        Over zero elements, or where a slice holds only NaN (NumPy's messages).
    """
    return reduce(x, "nanargmax", axis=axis, keepdims=keepdims)


def nanargmin(x: Any, *, axis: int | None = None, keepdims: bool = False):
    """Index (int64) of the first minimum of the non-NaN elements, as :func:`numpy.nanargmin`.

    :func:`argmin`'s order (-0.0 beats +0.0) among the elements that are not NaN.

    Raises
    ------
    ValueError
        Over zero elements, or where a slice holds only NaN (NumPy's messages).
    """
    return reduce(x, "nanargmin", axis=axis, keepdims=keepdims)


def nansum(x: Any, *, axis: Any = None, keepdims: bool = False, dtype: Any = None):
    """Sum treating NaN as zero; :func:`sum`'s dtypes. ``inf + -inf`` is still NaN."""
    return reduce(x, "nansum", axis=axis, keepdims=keepdims, dtype=dtype)


def nanprod(x: Any, *, axis: Any = None, keepdims: bool = False, dtype: Any = None):
    """Product treating NaN as one; :func:`prod`'s dtypes. ``inf * 0`` is still NaN."""
    return reduce(x, "nanprod", axis=axis, keepdims=keepdims, dtype=dtype)


def nanmax(x: Any, *, axis: Any = None, keepdims: bool = False):
    """Largest non-NaN element over ``axis`` (NaN where all are NaN; +0.0 > -0.0)."""
    return reduce(x, "nanmax", axis=axis, keepdims=keepdims)


def nanmin(x: Any, *, axis: Any = None, keepdims: bool = False):
    """Smallest non-NaN element over ``axis`` (NaN where all are NaN; -0.0 < +0.0)."""
    return reduce(x, "nanmin", axis=axis, keepdims=keepdims)


def nanmean(x: Any, *, axis: Any = None, keepdims: bool = False):
    """Mean of the non-NaN elements over ``axis`` (NaN where there are none)."""
    return reduce(x, "nanmean", axis=axis, keepdims=keepdims)


def nanvar(x: Any, *, axis: Any = None, correction: float = 0.0, keepdims: bool = False):
    """Variance of the non-NaN elements over ``axis``, with divisor ``N - correction`` (N: their count).

    :func:`var`'s one pass and merge. NaN where ``N - correction <= 0`` (all NaN, for
    example), with NumPy's "Degrees of freedom" warning, as :func:`numpy.nanvar`.
    """
    return reduce(x, "nanvar", axis=axis, keepdims=keepdims, correction=correction)


def nanstd(x: Any, *, axis: Any = None, correction: float = 0.0, keepdims: bool = False):
    """Standard deviation of the non-NaN elements, ``sqrt(nanvar(x, ...))``; see :func:`nanvar`."""
    return reduce(x, "nanstd", axis=axis, keepdims=keepdims, correction=correction)


def stats(x: Any, *, axis: Any = None, correction: float = 0.0) -> _stats.Stats:
    """count, NaN count, sum, min, max, mean, variance and standard deviation of ``x`` over ``axis``, from one pass.

    Parameters
    ----------
    x : numpy.ndarray
        As for :func:`reduce`.
    axis : None, int or tuple of int, optional
    correction : float, optional
        For the variance, as in :func:`var`.

    Returns
    -------
    Stats
        Fields ``count``, ``nan_count``, ``sum``, ``min``, ``max``, ``mean``, ``var`` and
        ``std``, each with the dtype of the single op of that name and its value up
        to the order of floating-point accumulation (integer sums, min and max are exact). NaN
        propagates into all but the counts. For NumPy input the fields are NumPy scalars
        (``axis=None``) or arrays; for CuPy input they are CuPy arrays (0-d for ``axis=None``)
        on the input's device, computed there without waiting for the device.

    Raises
    ------
    ValueError
        Over zero elements (min and max are undefined there).

    Notes
    -----
    The state behind it (:class:`multireduce._stats.Moments`) is the one the MPI layer
    (``multireduce.mpi.stats``) and the Dask layer (``multireduce.dask.stats``) merge.

    Examples
    --------
    >>> import numpy as np, multireduce
    >>> s = multireduce.stats(np.array([1.0, 2.0, 4.0]))
    >>> s.count, s.sum, s.min, s.max, s.mean
    (np.int64(3), np.float64(7.0), np.float64(1.0), np.float64(4.0), np.float64(2.3333333333333335))
    """
    backend, arr = _backend_and_array(x)
    check_dtype(arr.dtype)
    _check_correction(OPS["var"], correction)
    axes = normalize_axes(axis, arr.ndim)
    if math.prod(arr.shape[a] for a in axes) == 0:
        raise _stats.empty_stats_error()
    return backend.stats(arr, axes, float(correction))
