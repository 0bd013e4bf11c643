"""The Dask layer: :func:`treereduce`, multireduce's reduction as a Dask tree reduction.

Importing this module registers :func:`treereduce` as a method of every Dask array,
``x.treereduce(op, ...)``; ``import multireduce`` alone does not import Dask.

Each chunk is reduced by :func:`multireduce.core.partial` (NumPy chunks on the CPU, CuPy chunks
on their GPU with multireduce's kernel) to a partial in the op's accumulator dtype; ``combine``
and ``aggregate`` reduce stacked partials with the core again. Partials of CuPy chunks stay on
the GPU until the final aggregate, whose result is a 0-d CuPy array: nothing here synchronizes
the host with the GPU when all work runs on one CUDA stream (CuPy's default stream in every
Dask thread, which is CuPy's default).

Progress of long reductions is Dask's own business::

    from dask.diagnostics import ProgressBar        # local schedulers
    with ProgressBar():
        total = x.treereduce("sum").compute()

    from distributed import progress                # distributed
    future = client.compute(x.treereduce("sum"))
    progress(future)
    total = future.result()
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from . import _partials
from .ops import Op, get_op

__all__ = ["treereduce"]


def _chunk(x, axis, keepdims, *, op: Op, acc: np.dtype, computing_meta: bool = False):
    if computing_meta:
        # Dask's placeholder call on x._meta (an empty array of the chunks' type): nothing is
        # reduced; the placeholder carries the array type to the next steps.
        return x
    return _partials.wrap(_partials.of_array(x, op, acc), x.size)


def _combine(parts, axis, keepdims, *, op: Op, computing_meta: bool = False):
    if computing_meta:
        return parts
    return _partials.combine(parts, op)


def _aggregate(parts, axis, keepdims, *, op: Op, result: np.dtype, computing_meta: bool = False):
    if computing_meta:
        return parts
    return _partials.finalize(parts, op, result, keepdims_ndim=len(axis) if keepdims else None)


def _full_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    """The normalized axes; only full reductions are accepted until the core has axes."""
    axes = tuple(range(ndim)) if axis is None else normalize_axis_tuple(axis, ndim)
    if sorted(axes) != list(range(ndim)):
        raise NotImplementedError(
            f"axis={axis!r} reduces only some axes of a {ndim}-d array; multireduce's core supports full "
            "reductions only (axis=None, or a tuple of every axis), and treereduce follows it"
        )
    return axes


def _plan(x: Any, op: str | Op, dtype: Any) -> tuple[Op, np.dtype, np.dtype]:
    if not isinstance(x, da.Array):
        raise TypeError(
            f"treereduce takes a dask.array.Array, not {type(x).__module__}.{type(x).__qualname__}; "
            "use multireduce.reduce for NumPy and CuPy arrays"
        )
    op = get_op(op)
    result = op.result_dtype(x.dtype, None if dtype is None else np.dtype(dtype))
    acc = op.accumulator_dtype(result)
    if not op.empty_allowed and not math.isnan(x.size) and x.size == 0:
        raise op.empty_error()
    return op, result, acc


def _reduction(
    x: da.Array,
    op: Op,
    result: np.dtype,
    chunk: Callable,
    *,
    axis: Any,
    keepdims: bool,
    split_every: Any,
    name: str,
) -> da.Array:
    """Build the tree reduction around ``chunk``, which returns partials or lists of them.

    Shared with :mod:`multireduce.stream`.
    """
    axes = _full_axes(axis, x.ndim)
    return da.reduction(
        x,
        chunk=chunk,
        combine=functools.partial(_combine, op=op),
        aggregate=functools.partial(_aggregate, op=op, result=result),
        axis=axes,
        keepdims=keepdims,
        dtype=result,
        split_every=split_every,
        name=name,
        # Partials are Partial objects, not arrays: combine/aggregate stack them themselves,
        # on the device that holds them. This also makes Dask pass computing_meta=True to
        # combine and aggregate directly instead of through its concatenation step.
        concatenate=False,
    )


def treereduce(
    x: da.Array,
    op: str | Op = "sum",
    *,
    axis: Any = None,
    keepdims: bool = False,
    dtype: Any = None,
    split_every: int | dict | None = None,
) -> da.Array:
    """Reduce every element of the Dask array ``x`` with ``op``, as a lazy Dask tree reduction.

    Every chunk is reduced with :func:`multireduce.core.partial` on the CPU (NumPy chunks) or on
    its GPU (CuPy chunks), the partials are combined in the op's accumulator dtype, and the
    final aggregate produces the result with :func:`multireduce.core.reduce`. The result has
    the same dtype as ``multireduce.reduce`` on the whole array, and the same NaN, signed-zero
    and integer wrap-around rules. Empty chunks contribute the op's identity.

    Importing :mod:`multireduce.dask` also makes this function available as a method,
    ``x.treereduce(op, ...)``, on every Dask array.

    Parameters
    ----------
    x : dask.array.Array
        Chunks must be NumPy or CuPy arrays of a supported dtype (see :func:`multireduce.reduce`).
    op : {"sum", "max", "min"} or Op
        The reduction.
    axis : None or tuple of int, optional
        Only full reductions are supported, as in the core: ``None`` or a tuple naming every axis.
    keepdims : bool, optional
        If true, the result has ``x.ndim`` axes of length one.
    dtype : dtype, optional
        Result dtype, for ``"sum"`` only (as ``numpy.sum``).
    split_every : int or dict, optional
        How many partials one combine step takes, as in ``dask.array.reduction``: with at least
        as many as there are chunks, no combine step runs and one aggregate takes every partial.
        ``None`` uses Dask's default (``dask.config`` key ``split_every``, else 4).

    Returns
    -------
    dask.array.Array
        A lazy 0-d array (``x.ndim``-d with ``keepdims``). Computed, it is a NumPy scalar
        (NumPy chunks) or a 0-d CuPy array on the chunks' GPU (CuPy chunks).

    Raises
    ------
    TypeError
        If ``x`` is not a Dask array, for an unsupported dtype, or ``dtype=`` given to max/min.
    ValueError
        For an unknown op, or max/min of an array with no elements: at once when the size is
        known, else when computed (as NumPy).
    NotImplementedError
        For an ``axis`` that leaves some axes unreduced, and when computed, if CuPy chunks of
        one array live on several GPUs of one process.

    Notes
    -----
    The combination order is fixed by the chunking and ``split_every``, so a given chunking
    gives the same bits every time; another chunking may round float sums differently.

    Partials of CuPy chunks stay on the GPU; each carries a CUDA event. A combine or aggregate
    step that runs on another CUDA stream than a partial's producer waits on that event, and
    then synchronizes its own stream before returning, so that CuPy's memory pool cannot hand
    the partial's memory to its producer stream while it is still being read. With CuPy's
    default stream in every thread (the default) no step synchronizes.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> import multireduce.dask  # registers x.treereduce
    >>> x = da.from_array(np.arange(10, dtype=np.int8), chunks=3)
    >>> x.treereduce("sum").compute()
    np.int64(45)
    >>> multireduce.dask.treereduce(x, "max", split_every=2).compute()
    np.int8(9)
    """
    op, result, acc = _plan(x, op, dtype)
    chunk = functools.partial(_chunk, op=op, acc=acc)
    name = f"treereduce-{op.name}"
    return _reduction(x, op, result, chunk, axis=axis, keepdims=keepdims, split_every=split_every, name=name)


def _treereduce_method(
    self: da.Array,
    op: str | Op = "sum",
    *,
    axis: Any = None,
    keepdims: bool = False,
    dtype: Any = None,
    split_every: int | dict | None = None,
) -> da.Array:
    return treereduce(self, op, axis=axis, keepdims=keepdims, dtype=dtype, split_every=split_every)


_treereduce_method.__doc__ = treereduce.__doc__
_treereduce_method.__name__ = "treereduce"
_treereduce_method.__qualname__ = "Array.treereduce"


def _register() -> None:
    existing = getattr(da.Array, "treereduce", None)
    if existing is not None and getattr(existing, "__module__", None) != __name__:
        # Someone else's treereduce: replacing it silently would change their results.
        raise RuntimeError(f"dask.array.Array already has a treereduce attribute ({existing!r}); not replacing it")
    da.Array.treereduce = _treereduce_method


_register()
