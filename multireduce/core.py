"""The one core reduction: :func:`reduce`, and :func:`partial` for the distributed layers.

Both dispatch on the array's library: NumPy arrays reduce on the CPU (``_backend.numpy``),
CuPy arrays on their GPU with multireduce's own kernel (``_backend.cupy``). CuPy is imported
only when a CuPy array is passed, and MPI is never touched here.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .ops import Op, check_dtype, get_op

__all__ = ["max", "min", "partial", "reduce", "sum"]

_ACCEPTED_INPUTS = "numpy.ndarray, a NumPy scalar, a Python list/tuple/scalar, or cupy.ndarray"


def _is_cupy_array(x: Any) -> bool:
    # Checking the module name first keeps CuPy unimported until a CuPy array shows up.
    if not type(x).__module__.startswith("cupy"):
        return False
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


_cupy_backend = None  # the CuPy backend module, once a CuPy array has been seen


def _backend_and_array(x: Any):
    global _cupy_backend
    if _cupy_backend is not None and type(x) is _cupy_backend.cupy.ndarray:
        return _cupy_backend, x  # the first test, so that tiny GPU reductions pay least
    if isinstance(x, np.ndarray):
        from ._backend import numpy as backend

        return backend, x
    if _is_cupy_array(x):
        from ._backend import cupy as backend

        _cupy_backend = backend
        return backend, x
    if isinstance(x, np.generic | list | tuple | int | float | bool):
        from ._backend import numpy as backend

        return backend, np.asarray(x)
    raise TypeError(f"cannot reduce an object of type {type(x).__module__}.{type(x).__qualname__}; expected {_ACCEPTED_INPUTS}")


def _check_axis(axis: Any, ndim: int) -> None:
    # Partial (axis) reductions arrive with the "Array API semantics" issue. Until then the
    # signature already takes axis/keepdims, and anything but a full reduction is refused.
    if axis is None:
        return
    axes = normalize_axis_tuple(axis, ndim)  # NumPy's own AxisError/ValueError on bad axes
    if sorted(axes) != list(range(ndim)):
        raise NotImplementedError(
            f"axis={axis!r} reduces only some axes of a {ndim}-d array; multireduce supports full reductions only "
            "(axis=None, or a tuple of every axis)"
        )


_plans: dict[tuple, tuple[Op, np.dtype, np.dtype]] = {}


def _plan(arr, op: str | Op, dtype) -> tuple[Op, np.dtype, np.dtype]:
    """(op, result dtype, accumulator dtype), validated once per combination and cached:
    this is on the path of every call, including tiny ones where Python overhead dominates."""
    try:
        return _plans[op, arr.dtype, dtype]
    except (KeyError, TypeError):  # TypeError: an unhashable dtype= argument
        pass
    resolved = get_op(op)
    result = resolved.result_dtype(check_dtype(arr.dtype), None if dtype is None else np.dtype(dtype))
    plan = (resolved, result, resolved.accumulator_dtype(result))
    try:
        _plans[op, arr.dtype, dtype] = plan
    except TypeError:
        pass
    return plan


def reduce(x: Any, op: str | Op, *, axis: Any = None, keepdims: bool = False, dtype: Any = None):
    """Reduce every element of ``x`` with ``op``.

    NumPy arrays reduce on the CPU, CuPy arrays on their own GPU with multireduce's
    tree-reduction kernel; the result lives where the input lives.

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray
        Input of any shape and layout (views, offsets and negative strides are fine). Python
        lists and scalars are converted with ``numpy.asarray``. Supported dtypes: bool,
        int8-int64, uint8-uint64, float16, float32, float64.
    op : {"sum", "max", "min"} or Op
        The reduction.
    axis : None or tuple of int, optional
        Only full reductions are supported: ``None`` or a tuple naming every axis.
    keepdims : bool, optional
        If true, the result has ``x.ndim`` axes of length one.
    dtype : dtype, optional
        Result dtype, for ``"sum"`` only (as ``numpy.sum``).

    Returns
    -------
    numpy.generic, numpy.ndarray or cupy.ndarray
        For NumPy input a NumPy scalar (an ndarray with ``keepdims``); for CuPy input a 0-d
        CuPy array (``x.ndim``-d with ``keepdims``). The dtype follows NumPy: sums of bool
        and signed integers are int64, of unsigned integers uint64, of floats the input's
        dtype; max and min keep the input's dtype.

    Raises
    ------
    TypeError
        For an unsupported input type or dtype (object, str, complex, ...), or ``dtype=``
        given to max/min.
    ValueError
        For an unknown op, or max/min of an empty array (as NumPy).
    NotImplementedError
        For an ``axis`` that leaves some axes unreduced.

    Notes
    -----
    Integer sums wrap modulo 2**64 (then to the result dtype) exactly as NumPy's do.
    float16 sums accumulate in float32 and float32 sums in float64, each rounded once at the
    end; float64 sums accumulate in float64. max/min propagate NaN as NumPy does and follow
    IEEE 754-2019 for signed zeros (+0.0 is larger than -0.0), so that the result does not
    depend on element order. On the GPU the same input always gives the same bits.

    Examples
    --------
    >>> import numpy as np, multireduce
    >>> multireduce.reduce(np.arange(10, dtype=np.int8), "sum")
    np.int64(45)
    >>> multireduce.reduce(np.array([1.0, np.nan, 3.0]), "max")
    np.float64(nan)
    """
    backend, arr = _backend_and_array(x)
    op, result, acc = _plan(arr, op, dtype)
    _check_axis(axis, arr.ndim)
    if arr.size == 0:
        if not op.empty_allowed:
            raise op.empty_error()
        value = backend.constant(op.identity(acc), result)
    else:
        value = backend.reduce_full(arr, op, acc, result)
    if keepdims:
        value = value.reshape((1,) * arr.ndim)
    return value


def partial(x: Any, op: str | Op):
    """Reduce ``x`` to a partial result in the op's accumulator dtype.

    This is what the distributed layers exchange: float32 sums travel in float64, integer
    sums in int64/uint64, float16 in float32. An empty ``x`` gives the op's identity (also
    for max/min), so that empty shards and chunks combine correctly.

    Returns
    -------
    numpy.generic or cupy.ndarray
        A scalar of ``op.accumulator_dtype(...)`` on the input's device.
    """
    backend, arr = _backend_and_array(x)
    op, _, acc = _plan(arr, op, None)
    if arr.size == 0:
        return backend.constant(op.identity(acc), acc)
    return backend.reduce_full(arr, op, acc, acc)


def sum(x: Any, *, axis: Any = None, keepdims: bool = False, dtype: Any = None):  # noqa: A001
    """Sum of all elements; :func:`reduce` with ``op="sum"``."""
    return reduce(x, "sum", axis=axis, keepdims=keepdims, dtype=dtype)


def max(x: Any, *, axis: Any = None, keepdims: bool = False):  # noqa: A001
    """Largest element (NaN if any element is NaN); :func:`reduce` with ``op="max"``."""
    return reduce(x, "max", axis=axis, keepdims=keepdims)


def min(x: Any, *, axis: Any = None, keepdims: bool = False):  # noqa: A001
    """Smallest element (NaN if any element is NaN); :func:`reduce` with ``op="min"``."""
    return reduce(x, "min", axis=axis, keepdims=keepdims)
