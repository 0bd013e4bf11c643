"""The Dask layer: :func:`treereduce`, multireduce's reduction as a Dask tree reduction.

Importing this module registers :func:`treereduce` as a method of every Dask array,
``x.treereduce(op, ...)``; ``import multireduce`` alone does not import Dask.

Each chunk is reduced by :func:`multireduce.core.partial` (NumPy chunks on the CPU, CuPy chunks
on their GPU with multireduce's kernels); ``combine`` and ``aggregate`` merge the partials. A
computed result has the chunks' type, as the Dask array's meta says: NumPy values for NumPy
chunks, a CuPy array on the chunks' GPU for CuPy chunks (0-d for a full reduction), for every op.

Where the host waits for the GPU, with CuPy chunks:

* Fold ops (sum, prod, max, min, count_nonzero, any, all, nansum, nanprod, nanmax, nanmin): a partial
  is the chunk's value in the accumulator dtype, on its GPU, and stays there through every
  combine to the final aggregate. Nothing here synchronizes the host with the GPU when all
  work runs on one CUDA stream (CuPy's default stream in every Dask thread, which is CuPy's
  default); a step that reads partials made on other streams synchronizes its own stream
  (:mod:`multireduce._partials`).
* Moments ops (mean, nanmean, var, std, nanvar, nanstd, and :func:`stats`) and argmin/argmax: a partial is
  a small state that is merged on the host, so each chunk's task waits for its own kernel
  (:mod:`multireduce._backend._cupy_stats`): a full reduction's kernel writes its state into
  mapped host memory and the task synchronizes the stream before reading it
  (``_launch_moments_full(...).synchronize()``, ``_launch_arg_full(...).synchronize()``); an
  axis reduction copies its states back (``.get()``). The merged value goes back to the
  chunks' GPU at the end (one small upload); :func:`stats` gives host values.
* ``reproducible=True`` sums and means: each chunk's exact accumulator comes back to the host
  (``exact_sum``'s copy), and the rounded result goes back to the GPU at the end.

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
import numbers
from collections.abc import Callable
from typing import Any

try:
    import dask
    import dask.array as da
except ImportError as exc:
    raise ImportError(
        f"multireduce.dask needs dask[array] ({exc}); install it with: pip install 'multireduce[dask]'"
    ) from exc
import numpy as np
from dask.base import tokenize
from dask.tokenize import normalize_token
from numpy.lib.array_utils import normalize_axis_index

from . import _exact, _partials, _stats, core
from .ops import OPS, Op, cast_result, check_dtype, get_op

__all__ = ["stats", "treereduce"]

# Default fan-in of the combine and aggregate steps of full reductions: at most this many
# partials per task (see _default_split_every).
FULL_SPLIT_EVERY = 64
# Dask's default fan-in (dask.array.reduction without split_every or the config key), kept
# for axis reductions.
DASK_SPLIT_EVERY = 4

_SPLIT_EVERY_ACCEPTED = "None, an int >= 2, or a dict mapping axes of x (negative allowed) to ints >= 2"


@normalize_token.register(Op)
def _normalize_op(op: Op):
    """Dask token of an op: its name for the ops of ``multireduce.OPS`` (one object per name).

    Every graph build tokenizes the chunk, combine and aggregate callables, which hold the op;
    Dask's fallback for a dataclass pickles each field (about 35 µs per op, a fifth of a
    16-chunk graph's build time). Other ``Op`` objects keep that fallback.
    """
    if OPS.get(op.name) is op:
        return ("multireduce.Op", op.name)
    return normalize_token.dispatch(object)(op)


def _fan_in(value: Any, rule: str) -> int:
    # bool is an int to Python, not a fan-in here; NumPy integers are ints.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{rule}; got {value!r}")
    if value < 2:
        raise ValueError(f"{rule}; got {value!r} (a combine step takes at least 2 partials)")
    return int(value)


def _check_split_every(value: Any, ndim: int, what: str = "split_every") -> int | dict[int, int] | None:
    """``value`` validated: None, an int >= 2, or a dict of non-negative axes to ints >= 2.

    Dask's own reduction takes anything here: a fan-in of 1 leaves partials uncombined (a
    wrong sum), an axis key out of range is ignored, a negative int fails with an error
    about complex numbers. ``what`` names the value in the messages.

    Raises
    ------
    TypeError
        For a value, key or fan-in of another type (bool included).
    ValueError
        For a fan-in below 2, or two keys naming one axis.
    numpy.exceptions.AxisError
        For a key that is not an axis of x (a ValueError).
    """
    if value is None:
        return None
    rule = f"{what} accepts {_SPLIT_EVERY_ACCEPTED}"
    if not isinstance(value, dict):
        return _fan_in(value, rule)
    out: dict[int, int] = {}
    for key, fan_in in value.items():
        if isinstance(key, bool) or not isinstance(key, numbers.Integral):
            raise TypeError(f"{rule}; got the key {key!r}")
        if not -ndim <= key < ndim:
            raise np.exceptions.AxisError(f"{what} has the key {key!r}, not an axis of x (ndim {ndim}); {rule}")
        axis = normalize_axis_index(int(key), ndim)
        if axis in out:
            raise ValueError(f"{what} names axis {axis} twice ({value!r}); {rule}")
        out[axis] = _fan_in(fan_in, f"{what}[{key!r}] must be an int >= 2 ({rule})")
    return out


def _default_split_every(split_every: Any, x: da.Array, axes: tuple[int, ...]) -> int | dict[int, int]:
    """The ``split_every`` given to ``dask.array.reduction``, validated (:func:`_check_split_every`).

    The caller's, else the ``dask.config`` key ``split_every`` where set, else
    :data:`FULL_SPLIT_EVERY` for full reductions and Dask's default
    (:data:`DASK_SPLIT_EVERY`) for axis reductions. A dict is Dask's per-axis fan-in (a
    reduced axis it leaves out takes 2). An int ``n`` is the most partials one task takes:
    where the chunks along the reduced axes number at most ``n`` in all, one aggregate takes
    every partial, with no combine level (Dask's own rule would split ``n`` into
    ``int(n ** (1 / len(axes)))`` per axis, and blocks (2, 8) with ``n = 16`` would get a
    combine level); beyond that Dask's rule applies: ``max(int(n ** (1 / k)), 2)`` per each
    of the ``k`` reduced axes, so a task takes up to ``2 ** k`` partials where ``n`` is
    smaller (4 for ``n = 2`` or 3 over two reduced axes).

    Full reductions default to 64: their partials are scalars or small fixed-size states,
    and a task that combines 64 of them takes tens of microseconds on the host (37 µs for
    64 NumPy partials, 8 µs for 4), less than one extra task costs the threaded scheduler
    (about 0.1 ms), and every combine level adds latency. Axis reductions keep Dask's 4:
    their partials are arrays of the kept shape, so a wide fan-in multiplies the memory that
    one task holds and the data it concatenates, and narrower trees overlap combining with
    the chunks still running.
    """
    if split_every is not None:
        value = _check_split_every(split_every, x.ndim)
    else:
        value = _check_split_every(dask.config.get("split_every", None), x.ndim, "the dask.config key 'split_every'")
    blocks = x.numblocks
    if isinstance(value, dict):
        # A reduced axis the dict leaves out takes 2 (the empty dict too: _dask_fan_in). A
        # fan-in past an axis's block count is one step along it, as an int's: Dask's
        # partition_all made a list of that many entries (split_every={0: 10**8}: 3.2 GB).
        return _dask_fan_in({a: min(n, max(blocks[a], 2)) for a, n in value.items()} or {a: 2 for a in axes})
    if value is None:
        value = FULL_SPLIT_EVERY if len(axes) == x.ndim else DASK_SPLIT_EVERY
    if math.prod(blocks[a] for a in axes) <= value:
        # One aggregate: a fan-in of at least the block count along every reduced axis (at
        # least 2, the smallest fan-in Dask's depth rule takes).
        return _dask_fan_in({a: max(blocks[a], 2) for a in axes})
    return value


def _dask_fan_in(fan_in: dict[int, int]) -> dict[int, int] | int:
    """``fan_in`` as given to Dask: an empty dict (no reduced axis) as the int 2.

    Dask reads ``split_every or config.get("split_every", 4)``: an empty dict read the config
    key, unchecked (a fan-in of 1 there left partials uncombined: sum 30.0 for 66.0), or
    failed where it is None ("split_every must be a int or a dict").
    """
    return fan_in or 2


def _check_chunk(x, expected: np.dtype):
    """Chunk ``x`` as an array; raise unless it has the dtype its Dask array declares.

    The plan (result and accumulator dtypes, dtype= conversions) was made for that dtype.
    NumPy and Python scalars (the chunk of a Dask reduction's 0-d result, or of
    ``da.from_delayed`` of a function that returns one), lists and tuples (Dask's own
    reductions take them) go through ``numpy.asarray``, as the core takes them, and their
    dtype is checked as any chunk's.
    """
    if isinstance(x, np.generic | list | tuple | int | float | bool):
        x = np.asarray(x)
    dtype = getattr(x, "dtype", None)
    if not isinstance(dtype, np.dtype):
        kind = f"{type(x).__module__}.{type(x).__qualname__}"
        raise TypeError(
            f"a chunk of type {kind} in a Dask array that declares dtype {expected}; "
            "multireduce reduces NumPy or CuPy chunks"
        )
    if dtype != expected:
        raise TypeError(
            f"a chunk of dtype {dtype} in a Dask array that declares dtype {expected}; "
            "give map_blocks (or whatever made the chunks) the chunks' real dtype"
        )
    return x


def _chunk(x, axis, keepdims, *, op: Op, dtype: np.dtype | None, expected: np.dtype, computing_meta: bool = False):
    if computing_meta:
        # Dask's placeholder call on x._meta (an empty array of the chunks' type): nothing is
        # reduced; the placeholder carries the array type to the next steps.
        return x
    x = _check_chunk(x, expected)
    return _partials.wrap(core.partial(x, op, dtype=dtype), x.size)


def _combine(parts, axis, keepdims, *, op: Op, computing_meta: bool = False):
    if computing_meta:
        return parts
    return _partials.combine(parts, op)


def _aggregate(parts, axis, keepdims, *, op: Op, result: np.dtype, computing_meta: bool = False):
    if computing_meta:
        return parts
    return _partials.finalize(parts, op, result, keepdims_ndim=len(axis) if keepdims else None)


def _normalized_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    return core.normalize_axes(axis, ndim)  # the core's rule, errors and messages


def _check_array(x: Any, function: str = "treereduce", core_function: str = "reduce") -> None:
    """Raise unless ``x`` is a Dask array whose chunks (as its ``_meta`` says) multireduce reduces.

    ``function`` and ``core_function`` name the caller and what it is for NumPy and CuPy arrays.
    """
    if not isinstance(x, da.Array):
        raise TypeError(
            f"{function} takes a dask.array.Array, not {type(x).__module__}.{type(x).__qualname__}; "
            f"use multireduce.{core_function} for NumPy and CuPy arrays"
        )
    # Masked chunks would be reduced with their masks ignored (the core refuses them too, when
    # computed; from the meta it is known at once).
    _refuse_chunk_subclass(x._meta)


def _without_data_in_meta(x: da.Array) -> da.Array:
    """``x``, with a meta that holds no data: the same graph, name and chunks.

    A 0-d Dask array's meta is its data (``da.from_array(np.array(np.nan))._meta`` is
    ``array(nan)``), and Dask's reduction casts the meta to each step's dtype: NaN or inf to
    the int64 of argmax or count_nonzero warned "invalid value encountered in cast" (raised
    under ``np.errstate(invalid="raise")``) when the graph was built. A zero of the same
    array type casts silently.
    """
    if x.ndim or not getattr(x._meta, "size", 0):
        return x
    meta = x._meta.copy()  # a NumPy or CuPy array, as the chunks
    meta.fill(0)
    return da.Array(x.dask, x.name, x.chunks, meta=meta)


def _refuse_chunk_subclass(chunk: Any) -> None:
    """The core's refusal of masked arrays and matrices, worded for a Dask array's chunks."""
    if isinstance(chunk, np.ndarray) and type(chunk) is not np.ndarray:
        error = core._refused_subclass(chunk, "a Dask array of {} chunks", "dask.array.ma.filled(x, v)")
        if error is not None:
            raise error


def _plan(x: Any, op: str | Op, dtype: Any, axes: tuple[int, ...] | None = None) -> tuple[Op, np.dtype, np.dtype]:
    _check_array(x)
    op = get_op(op)
    result = op.result_dtype(x.dtype, dtype)
    acc = op.accumulator_dtype(result)
    axes = tuple(range(x.ndim)) if axes is None else axes
    # A reduced axis known to be empty: at once (others of unknown size do not matter).
    if not op.empty_allowed and any(x.shape[a] == 0 for a in axes):
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
    axes = _normalized_axes(axis, x.ndim)
    return da.reduction(
        x,
        chunk=chunk,
        combine=functools.partial(_combine, op=op),
        aggregate=functools.partial(_aggregate, op=op, result=result),
        axis=axes,
        keepdims=keepdims,
        dtype=result,
        split_every=_default_split_every(split_every, x, axes),
        name=name,
        # Partials are Partial objects, not arrays: combine/aggregate stack them themselves,
        # on the device that holds them. This also makes Dask pass computing_meta=True to
        # combine and aggregate directly instead of through its concatenation step.
        concatenate=False,
    )


# -- partial-axis fold ops: partials are arrays in the accumulator dtype --------------------


def _fold_chunk(x, axis, keepdims, *, op: Op, dtype: np.dtype | None, expected: np.dtype, computing_meta: bool = False):
    if computing_meta:
        return x
    x = _check_chunk(x, expected)
    return core.partial(x, op, axis=axis, keepdims=True, dtype=dtype)


def _fold_combine(x, axis, keepdims, *, op: Op, computing_meta: bool = False):
    if computing_meta:
        return x
    return core.partial(x, op.combiner, axis=axis, keepdims=True)


def _fold_aggregate(x, axis, keepdims, *, op: Op, result: np.dtype, computing_meta: bool = False):
    if computing_meta:
        return x
    # Combined in the partials' dtype, converted once at the end (as _partials.finalize).
    value = core.reduce(x, op.combiner, axis=axis, keepdims=keepdims)
    if _partials._is_cupy(value):  # CuPy chunks: the result stays on their device
        return value.astype(result)
    return cast_result(np.asarray(value), result)


# -- counted partial-axis fold ops: max/min-type ops over axes of unknown size ---------------
#
# The reduced axes' size is known only when the chunks exist, and max, min, nanmax and nanmin
# of zero elements must raise (an empty chunk contributes the identity). Only there the
# partials carry their element count (multireduce._partials.Partial), so that the aggregate
# knows whether anything was reduced; axes of known size take the plain arrays above.


def _counted_chunk(x, axis, keepdims, *, op: Op, expected: np.dtype, computing_meta: bool = False):
    if computing_meta:
        return x
    x = _check_chunk(x, expected)
    count = math.prod(x.shape[a] for a in axis)  # per output element; one for the whole chunk
    return _partials.wrap(core.partial(x, op, axis=axis, keepdims=True), count)


def _counted_combine(parts, axis, keepdims, *, op: Op, computing_meta: bool = False):
    if computing_meta:
        return parts
    # The partials of one task share their kept block: stacked along a new first axis.
    value, n = _partials._gathered(_partials.flatten(parts), lambda s: core.partial(s, op.combiner, axis=0))
    return _partials.wrap(value, n)


def _counted_aggregate(parts, axis, keepdims, *, op: Op, result: np.dtype, computing_meta: bool = False):
    if computing_meta:
        return parts
    parts = _partials.flatten(parts)
    if sum(p.n for p in parts) == 0:  # the reduced axes turned out empty, as NumPy raises
        raise op.empty_error()
    value, _ = _partials._gathered(parts, lambda s: _partials._as_dtype(core.reduce(s, op.combiner, axis=0), result))
    if not keepdims:
        value = value.reshape(tuple(n for i, n in enumerate(value.shape) if i not in axis))
    return value


# -- moments and arg ops: partials are the structured-array form of their _stats state ------
#
# These states are merged on the host: a CuPy chunk's state comes back from the GPU kernel
# (multireduce._backend._cupy_stats). Each travels as a _HostState that remembers the GPU of
# its chunk, so that the final value goes back there: a computed result has the chunks' type,
# as the Dask array's meta says (the core's CuPy results stay on the device too).


class _HostState:
    """A partial state on the host, and the GPU of the chunks it came from (None: NumPy chunks).

    The state is a structured array of a :mod:`multireduce._stats` state, or an
    :class:`multireduce._exact.ExactSum`; the device a frozenset where the chunks merged into
    it lived in several places (see :func:`_common_device`). ``count`` (moments states): the
    number of elements each of its results reduces, known only when the chunks exist where
    a reduced axis has unknown chunk sizes; an empty result's state has no other trace of it.
    """

    __slots__ = ("count", "device", "state")

    def __init__(self, state: Any, device: int | None | frozenset, count: int | None = None) -> None:
        self.state = state
        self.device = device
        self.count = count

    def __reduce__(self):
        return (_HostState, (self.state, self.device, self.count))

    def __repr__(self) -> str:
        return f"_HostState({type(self.state).__name__}, device={self.device})"


def _device_of(x) -> int | None:
    """The GPU of the CuPy chunk ``x``; None for a NumPy chunk."""
    return x.device.id if _partials._is_cupy(x) else None


def _leaves(parts) -> list[_HostState]:
    out = []
    stack = [parts]
    while stack:
        item = stack.pop()
        if isinstance(item, list | tuple):
            stack.extend(reversed(item))
        elif isinstance(item, _HostState):
            out.append(item)
        else:
            kind = f"{type(item).__module__}.{type(item).__qualname__}"
            raise TypeError(f"expected multireduce partial states, got {kind}")
    return out


def _common_device(leaves: list[_HostState]) -> int | None | frozenset:
    """The GPU (None: the host) of the chunks behind ``leaves``; a frozenset of them if they differ.

    Host states merge whatever their chunks' devices; only the final upload needs one
    (:func:`_to_chunks_device` refuses a mixture, as the fold ops refuse to combine one).
    """
    devices: set = set()
    for leaf in leaves:
        devices |= leaf.device if isinstance(leaf.device, frozenset) else {leaf.device}
    return devices.pop() if len(devices) == 1 else frozenset(devices)


def _to_chunks_device(value, device: int | None | frozenset, dtype: np.dtype):
    """A final host value as the chunks' type: itself for NumPy chunks, else a CuPy array.

    The CuPy array is on the chunks' GPU: one small upload, bit for bit (0-d for a full
    reduction).

    Raises
    ------
    TypeError
        For NumPy and CuPy chunks in one array.
    NotImplementedError
        For CuPy chunks on several GPUs (the fold ops' rule, :mod:`multireduce._partials`).
    """
    if device is None:
        return value
    if isinstance(device, frozenset):
        if None in device:
            raise TypeError(
                "cannot combine NumPy and CuPy partials; all chunks of one array must live on the host or all on GPUs"
            )
        raise NotImplementedError(
            f"partials live on GPUs {sorted(device)}; combining across GPUs in one process is not supported. "
            "Use one GPU per process (dask_cuda.LocalCUDACluster starts one worker per GPU)."
        )
    from ._backend import cupy as backend

    with backend.cupy.cuda.Device(device):
        return backend.from_host(value, dtype)


def _moments_chunk(x, axis, keepdims, *, op: Op, expected: np.dtype, computing_meta: bool = False):
    if computing_meta:
        return x
    x = _check_chunk(x, expected)
    state = _stats.to_structured(core.partial(x, op, axis=axis, keepdims=True))
    return _HostState(state, _device_of(x), math.prod(x.shape[a] for a in axis))


def _moments_merged(parts) -> tuple[_stats.Moments, int | None | frozenset, int]:
    # The leaves of one task share their kept block and tile the reduced axes: their counts add.
    leaves = _leaves(parts)
    device = _common_device(leaves)
    count = sum(p.count for p in leaves)
    return _stats.merge_all([_stats.moments_from_structured(p.state) for p in leaves]), device, count


def _moments_combine(parts, axis, keepdims, *, computing_meta: bool = False):
    if computing_meta:
        return parts
    merged, device, count = _moments_merged(parts)
    return _HostState(_stats.to_structured(merged), device, count)


def _kept(value, shape: tuple[int, ...], keepdims: bool):
    if keepdims:
        return value
    value = np.asarray(value).reshape(shape)
    return value[()] if value.ndim == 0 else value


def _moments_aggregate(
    parts,
    axis,
    keepdims,
    *,
    op: Op | None,
    result: np.dtype,
    correction: float,
    integer_mean: np.dtype | None = None,
    computing_meta: bool = False,
):
    if computing_meta:
        return parts
    merged, device, reduced = _moments_merged(parts)
    # NumPy chunks: NumPy's overflow and invalid-value warnings of each whole slice, from its
    # merged state (the chunks' own states are silent about them; the GPU kernels do not warn).
    on_cpu = device is None
    if op is None:  # stats: the merged state itself (host values), finalized by stats()
        if reduced == 0:  # a reduced axis of unknown size turned out empty (the core raises)
            raise _stats.empty_stats_error()
        if on_cpu:
            _stats.warn_arithmetic(merged, quiet_m2=False, skips_nan=False)
        return _stats.to_structured(merged)
    if merged.n.size == 0 and not (op.skips_nan and merged.total.dtype.kind == "f"):
        # An empty result has no state to warn from; NumPy warns by the reduced count (as the core).
        _stats.warn_moments(op, reduced, correction, inexact=False)
    if integer_mean is not None:  # reproducible=True: the core's check, on the whole array's states
        refused = core._integer_mean_error(integer_mean, merged.n, merged.lo, merged.hi)
        if refused is not None:
            raise refused
    value = _stats.finalize_moments(merged, op, result, correction, value_warnings=on_cpu)
    kshape = tuple(n for i, n in enumerate(merged.shape) if i not in axis)
    return _to_chunks_device(_kept(value, kshape, keepdims), device, result)


def _arg_block(block, *, op: Op, axis: int | None, shape: tuple[int, ...], expected: np.dtype, block_info=None):
    block = _check_chunk(block, expected)
    location = block_info[0]["array-location"]
    axes = tuple(range(block.ndim)) if axis is None else (axis,)
    device = _device_of(block)
    if math.prod(block.shape[a] for a in axes) == 0:
        kshape = tuple(1 if i in axes else n for i, n in enumerate(block.shape))
        return _HostState(_stats.to_structured(_stats.empty_arg_state(block.dtype, kshape)), device)
    state = core.partial(block, op, axis=axis, keepdims=True)
    if axis is None:
        # The chunk's flat index -> the global C-order flat index, in int64 throughout.
        local = np.unravel_index(int(state.index.reshape(())), block.shape)
        index = np.ravel_multi_index(tuple(int(i) + lo for i, (lo, _) in zip(local, location, strict=True)), shape)
        state = _stats.ArgState(state.value, np.full(state.index.shape, index, np.int64))
    else:
        state = _stats.ArgState(state.value, state.index + np.int64(location[axis][0]))
    return _HostState(_stats.to_structured(state), device)


def _arg_chunk(x, axis, keepdims, computing_meta: bool = False):
    return x


def _arg_merged(parts, op: Op) -> tuple[_stats.ArgState, int | None | frozenset]:
    leaves = _leaves(parts)
    device = _common_device(leaves)
    states = [_stats.arg_from_structured(p.state) for p in leaves]
    return _stats.arg_merge_all(states, largest=op.largest, nan_wins=op.nan_wins), device


def _arg_combine(parts, axis, keepdims, *, op: Op, computing_meta: bool = False):
    if computing_meta:
        return parts
    merged, device = _arg_merged(parts, op)
    return _HostState(_stats.to_structured(merged), device)


def _arg_aggregate(parts, axis, keepdims, *, op: Op, computing_meta: bool = False):
    if computing_meta:
        return parts
    merged, device = _arg_merged(parts, op)
    if not keepdims:
        merged = merged.map(lambda a: a.reshape(tuple(n for i, n in enumerate(a.shape) if i not in axis)))
    return _HostState(_stats.to_structured(merged), device)


def _arg_finalize(states: _HostState, *, op: Op):
    # Dask's reduction keeps the states' dtype up to here; this step turns them into indices.
    index = _stats.arg_finalize(_stats.arg_from_structured(states.state), op)
    return _to_chunks_device(index, states.device, np.dtype(np.int64))


def _composite_reduction(x, op: Op, result, axes, keepdims, split_every, correction, reproducible=False) -> da.Array:
    name = f"treereduce-{op.name}"
    # Layers named here (not by Dask's reduction, which tokenizes its own) carry a token of the
    # input and every parameter: two calls share a key only when they compute the same thing.
    token = tokenize(x, op.name, axes, keepdims, split_every, correction)
    if op.kind == "moments":
        return da.reduction(
            x,
            chunk=functools.partial(_moments_chunk, op=op, expected=x.dtype),
            combine=_moments_combine,
            aggregate=functools.partial(
                _moments_aggregate,
                op=op,
                result=result,
                correction=correction,
                integer_mean=x.dtype if reproducible and op.name == "mean" and x.dtype.kind in "biu" else None,
            ),
            axis=axes,
            keepdims=keepdims,
            dtype=result,
            split_every=_default_split_every(split_every, x, axes),
            name=name,
            concatenate=False,
        )
    # argmin/argmax: each chunk's state carries global int64 indices, which need the chunk's
    # position; map_blocks knows it (block_info), a reduction's chunk function does not.
    if len(axes) not in (1, x.ndim):
        raise TypeError(f"{op.name} takes axis=None or a single int, not {axes!r}")
    unknown = [a for a in axes if any(math.isnan(c) for c in x.chunks[a])]
    if unknown:
        # The offsets of the chunks along a reduced axis are unknown until the chunks exist,
        # and a global index needs them (Dask's own argmax refuses these too).
        raise ValueError(
            f"{op.name} over axis {unknown[0]} of an array with unknown chunk sizes ({x.chunks[unknown[0]]!r} "
            "along it, e.g. after boolean indexing): the global index needs each chunk's offset. "
            "Compute them first: x.compute_chunk_sizes()"
        )
    axis = None if len(axes) == x.ndim and x.ndim != 1 else axes[0]
    sdt = _stats.arg_dtype(x.dtype)  # (the input's extreme value, int64 index)
    states = x.map_blocks(
        _arg_block,
        op=op,
        axis=axis,
        shape=x.shape,
        expected=x.dtype,
        dtype=sdt,
        chunks=tuple(tuple(1 for _ in c) if i in axes else c for i, c in enumerate(x.chunks)),
        meta=np.empty((0,) * x.ndim, dtype=sdt),
        name=f"{name}-chunk-{token}",
    )
    merged = da.reduction(
        states,
        chunk=_arg_chunk,
        combine=functools.partial(_arg_combine, op=op),
        aggregate=functools.partial(_arg_aggregate, op=op),
        axis=axes,
        keepdims=keepdims,
        dtype=sdt,
        split_every=_default_split_every(split_every, states, axes),
        name=f"{name}-merge",
        concatenate=False,
    )
    # The indices come back as the chunks' type (CuPy chunks: a CuPy array on their GPU).
    meta = da.utils.meta_from_array(x._meta, ndim=merged.ndim, dtype=np.int64)
    # Named after the merge too: its tree follows the fan-in in force (the dask.config key
    # where split_every is None), which the arguments alone do not say.
    final = f"{name}-{tokenize(token, merged.name)}"
    return merged.map_blocks(_arg_finalize, op=op, dtype=np.int64, meta=meta, name=final)


def treereduce(
    x: da.Array,
    op: str | Op = "sum",
    *,
    axis: Any = None,
    keepdims: bool = False,
    dtype: Any = None,
    split_every: int | dict | None = None,
    correction: float = 0.0,
    reproducible: bool = False,
) -> da.Array:
    """Reduce the Dask array ``x`` with ``op`` over ``axis``, as a lazy Dask tree reduction.

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
    op : str or Op
        Any of ``multireduce.OPS``. Fold ops (sum, prod, max, min, count_nonzero, any, all,
        nansum, nanprod, nanmax, nanmin) combine partials in the accumulator dtype; mean, nanmean,
        var, std, nanvar and nanstd merge :class:`multireduce._stats.Moments` states with Chan et al.'s
        update; argmin and argmax merge (value, int64 global index) states.
    axis : None, int or tuple of int, optional
        Axes to reduce, as in :func:`multireduce.reduce` (argmin/argmax: None or one int).
        Every op and axis set runs on CuPy chunks, on multireduce's kernels.
    keepdims : bool, optional
        If true, the reduced axes stay as axes of length one.
    dtype : dtype, optional
        Result dtype, for sum, prod, nansum and nanprod only (as ``numpy.sum``).
    split_every : int, dict or None, optional
        How many partials one combine or aggregate task takes. An int (at least 2) is the
        most per task: where the chunks along the reduced axes number at most that many in
        all, no combine step runs and one aggregate takes every partial (for any number of
        reduced axes); beyond that, Dask's rule (``max(int(n ** (1 / k)), 2)`` per each of
        the ``k`` reduced axes: a task takes up to ``2 ** k`` partials where ``n`` is
        smaller). A dict maps axes of ``x`` (negative allowed) to ints of at least 2, as in
        ``dask.array.reduction`` (a reduced axis it leaves out takes 2; keys of kept axes
        are ignored). Anything else raises when the graph is built (TypeError for another
        type, ValueError for a fan-in below 2 or a key that is not an axis of ``x``).
        ``None`` uses the ``dask.config`` key ``split_every`` where set (validated the same
        way), else: for full reductions (partials are scalars or small states) 64, so that
        up to 64 chunks are reduced by one aggregate with no combine level (a combine task
        costs a scheduler round trip, more than combining 64 scalars at once); for axis
        reductions (partials are arrays of the kept shape) Dask's default, 4.
    correction : float, optional
        For var, std, nanvar and nanstd, as in :func:`multireduce.var`.
    reproducible : bool, optional
        For float sum and mean (full reductions of NumPy chunks): every chunk forms the
        exact sum of its elements (:class:`multireduce._exact.ExactSum`), the combines add
        them exactly, and the aggregate rounds once, so the result has the same bits for
        every chunking and ``split_every``, and equals
        ``multireduce.sum(x.compute(), reproducible=True)``. The mean of integer or bool
        chunks is reproducible as it is (any axes, any chunking: ``float64(exact total) /
        n``), where ``n * max(|x|) < 2**62``; elsewhere the core's NotImplementedError is
        raised when computed. Other ops as in :func:`multireduce.reduce`.

    Returns
    -------
    dask.array.Array
        A lazy array with the kept axes (0-d for a full reduction). Computed, for every op: a
        NumPy scalar (full reduction) or array for NumPy chunks; a CuPy array on the chunks'
        GPU (0-d for a full reduction) for CuPy chunks (moments, arg and reproducible results
        are merged on the host and uploaded once at the end; see the module docstring for
        where the host waits for the GPU).

    Raises
    ------
    TypeError
        If ``x`` is not a Dask array, for an unsupported dtype or chunk type (masked arrays),
        ``dtype=`` given to max/min, or a ``split_every`` of another type than above.
    ValueError
        For an unknown op, or max, min, nanmax, nanmin over zero elements (as NumPy): at once
        when a reduced axis is known to be empty, else (chunk sizes unknown, NaN) when
        computed. argmin/argmax over an axis whose chunk sizes are unknown (NaN, e.g. after
        boolean indexing), at once: the global index needs the chunks' offsets
        (``x.compute_chunk_sizes()`` first). A ``split_every`` below 2, or with a key that is
        not an axis of ``x`` (``numpy.exceptions.AxisError``).
    NotImplementedError
        When computed: CuPy chunks of one array on several GPUs of one process.

    Notes
    -----
    The combination order is fixed by the chunking and ``split_every``, so a given chunking
    gives the same bits every time; another chunking may round float sums differently.

    Partials of CuPy chunks stay on the GPU; each carries a CUDA event. A combine or aggregate
    step that runs on another CUDA stream than a partial's producer waits on that event, and
    then synchronizes its own stream before returning, so that CuPy's memory pool cannot hand
    the partial's memory to its producer stream while it is still being read. With CuPy's
    default stream in every thread (the default) no step of the fold ops synchronizes.

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
    if not isinstance(x, da.Array):
        _plan(x, op, dtype)  # raises the TypeError
    resolved = get_op(op)
    if resolved.kind == "arg":  # None or one int, normalized (and refused) as the core does
        arg_axis = core._arg_axis(axis, x.ndim, resolved)
        axes = tuple(range(x.ndim)) if arg_axis is None else (arg_axis,)
    else:
        axes = _normalized_axes(axis, x.ndim)
    op, result, acc = _plan(x, resolved, dtype, axes)
    x = _without_data_in_meta(x)
    correction = core._check_correction(op, correction)
    keepdims = core._checked_keepdims(keepdims)
    reproducible = core._checked_reproducible(reproducible)
    # Exact partials where the core forms them (float sums of the elements converted as dtype=
    # asks, means of float input); core._needs_exact raises the core's refusals (var, prod,
    # partial axes, ...) and passes the order-free ops unchanged.
    if reproducible and core._needs_exact(x.dtype, op, result, len(axes) == x.ndim):
        return da.reduction(
            x,
            chunk=functools.partial(_exact_chunk, dtype=dtype, expected=x.dtype),
            combine=_exact_combine,
            aggregate=functools.partial(_exact_aggregate, result=result, mean=op.name == "mean"),
            axis=axes,
            keepdims=keepdims,
            dtype=result,
            split_every=_default_split_every(split_every, x, axes),
            name=f"treereduce-exact-{op.name}",
            concatenate=False,  # partials are ExactSum objects, merged by the steps themselves
        )
    if op.kind != "fold":
        return _composite_reduction(x, op, result, axes, keepdims, split_every, correction, reproducible)
    if len(axes) == x.ndim:
        chunk = functools.partial(_chunk, op=op, dtype=dtype, expected=x.dtype)
        name = f"treereduce-{op.name}"
        return _reduction(x, op, result, chunk, axis=axes, keepdims=keepdims, split_every=split_every, name=name)
    if not op.empty_allowed and any(math.isnan(c) for a in axes for c in x.chunks[a]):
        # A reduced axis of unknown size may turn out empty: the partials carry their count.
        steps = {
            "chunk": functools.partial(_counted_chunk, op=op, expected=x.dtype),
            "combine": functools.partial(_counted_combine, op=op),
            "aggregate": functools.partial(_counted_aggregate, op=op, result=result),
            "concatenate": False,  # Partial objects, stacked by the steps themselves
        }
    else:
        steps = {
            "chunk": functools.partial(_fold_chunk, op=op, dtype=dtype, expected=x.dtype),
            "combine": functools.partial(_fold_combine, op=op),
            "aggregate": functools.partial(_fold_aggregate, op=op, result=result),
        }
    return da.reduction(
        x,
        axis=axes,
        keepdims=keepdims,
        dtype=result,
        split_every=_default_split_every(split_every, x, axes),
        name=f"treereduce-{op.name}",
        **steps,
    )


# -- reproducible sums and means: partials are exact accumulators ---------------------------


def _exact_chunk(x, axis, keepdims, *, dtype: np.dtype | None, expected: np.dtype, computing_meta: bool = False):
    if computing_meta:
        return x
    x = _check_chunk(x, expected)
    # A CuPy chunk's exact accumulator comes to the host (as moments and arg states do).
    return _HostState(core.partial(x, "sum", dtype=dtype, reproducible=True).normalize(), _device_of(x))


def _exact_merged(parts) -> tuple[_exact.ExactSum, int | None | frozenset]:
    leaves = _leaves(parts)
    device = _common_device(leaves)
    total = _exact.ExactSum()
    for part in leaves:
        total.merge(part.state)  # integer additions: any grouping gives the same accumulator
    return total, device


def _exact_combine(parts, axis, keepdims, computing_meta: bool = False):
    if computing_meta:
        return parts
    return _HostState(*_exact_merged(parts))


def _exact_aggregate(parts, axis, keepdims, *, result: np.dtype, mean: bool, computing_meta: bool = False):
    if computing_meta:
        return parts
    total, device = _exact_merged(parts)
    value = total.result(result, mean=mean)
    if keepdims and axis:  # (a 0-d array keeps no axis: its value stays a NumPy scalar)
        value = np.asarray(value).reshape((1,) * len(axis))
    return _to_chunks_device(value, device, result)


def stats(x: da.Array, *, axis: Any = None, correction: float = 0.0, split_every: int | dict | None = None):
    """:func:`multireduce.stats` of a Dask array, from one pass over its chunks.

    Each chunk is reduced to a :class:`multireduce._stats.Moments` state, and states are
    merged up the tree with :func:`multireduce._stats.merge` (Chan et al.'s update), the same
    merge as the core's and the MPI layer's.

    Parameters
    ----------
    x : dask.array.Array
        NumPy or CuPy chunks. CuPy chunks go through the GPU moments kernel (other axis sets
        than all axes or the trailing ones are copied with the reduced axes last first), and
        the merged statistics come back as NumPy values.
    axis : None, int or tuple of int, optional
    correction : float, optional
        For the variance, as in :func:`multireduce.var`.
    split_every : int, dict or None, optional
        As in :func:`treereduce` (validated when the graph is built).

    Returns
    -------
    dask.delayed.Delayed
        Computes to a :class:`multireduce.Stats`.

    Raises
    ------
    TypeError
        If ``x`` is not a Dask array, or for an unsupported dtype.
    ValueError
        Over zero elements (min and max are undefined): at once where a reduced axis is
        known to be empty, else (chunk sizes unknown, NaN) when computed.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> import multireduce.dask
    >>> s = multireduce.dask.stats(da.from_array(np.arange(10.0), chunks=3)).compute()
    >>> s.count, s.mean, s.var
    (np.int64(10), np.float64(4.5), np.float64(8.25))
    """
    import dask

    _check_array(x, "multireduce.dask.stats", "stats")
    x = _without_data_in_meta(x)
    dtype = check_dtype(x.dtype)
    correction = core._check_correction(get_op("var"), correction)
    axes = _normalized_axes(axis, x.ndim)
    if any(x.shape[a] == 0 for a in axes):  # NaN (unknown) is not 0: then when computed
        raise _stats.empty_stats_error()
    states = da.reduction(
        x,
        # var's states, whose squares warn where they overflow, as multireduce.stats's.
        chunk=functools.partial(_moments_chunk, op=get_op("var"), expected=x.dtype),
        combine=_moments_combine,
        aggregate=functools.partial(_moments_aggregate, op=None, result=None, correction=correction),
        axis=axes,
        keepdims=True,
        dtype=_stats.moments_dtype(dtype),
        split_every=_default_split_every(split_every, x, axes),
        name="treereduce-stats",
        concatenate=False,
    )
    # A key from the states' (tokenized) name and the finalize's arguments: deterministic, as
    # every other key here (dask.delayed's default is a random one). The task takes the
    # states' blocks themselves: a delayed of the array would add a key of Dask's that is
    # random (finalize-hlgfinalizecompute-<uuid>), so that two builds of one call had the
    # same final key over different tasks (distributed: "Detected different `run_spec`").
    # to_delayed optimizes the states' graph as computing the array would (each chunk's
    # task fused with the tasks that make the chunk).
    key = f"treereduce-stats-finalize-{tokenize(states, dtype, correction, axes)}"
    blocks = states.to_delayed().tolist()
    return dask.delayed(_finalize_stats)(blocks, dtype, correction, axes, dask_key_name=key)


def _finalize_stats(blocks: Any, dtype: np.dtype, correction: float, axes: tuple[int, ...]) -> _stats.Stats:
    states = np.block(blocks)  # nested lists of the blocks, one level per axis (0-d: the block)
    # The kept shape from the states themselves (kept axes of unknown size are known now).
    kshape = tuple(n for i, n in enumerate(states.shape) if i not in axes)
    state = _stats.moments_from_structured(states).map(lambda a: a.reshape(kshape))
    return _stats.finalize_stats(state, dtype, correction)


def _register() -> None:
    existing = getattr(da.Array, "treereduce", None)
    if existing is not None and getattr(existing, "__module__", None) != __name__:
        # Someone else's treereduce: replacing it silently would change their results.
        raise RuntimeError(f"dask.array.Array already has a treereduce attribute ({existing!r}); not replacing it")
    da.Array.treereduce = treereduce  # x.treereduce(...) is treereduce(x, ...)


_register()
