"""Host side of the GPU moments and argmin/argmax kernels (``kernels/multireduce/stats.cuh``).

Both kernels reduce ``rows`` contiguous rows of ``length`` elements each, in one launch and one
read of the input: a full reduction is one row (any dense view, in memory order, for moments;
the C-order flattening for argmin/argmax), and an axis reduction reads rows where the
reduced axes are the last ones of C order (``inner == 1`` in
:func:`multireduce._axes.axis_layout`); other axis sets are copied with the reduced axes moved
last first (one extra read and write, logged and counted).

The states come back to the host as the NumPy arrays of :class:`multireduce._stats.Moments`
and :class:`multireduce._stats.ArgState`, so the call waits for the kernel (a full reduction's
kernel writes its state straight into mapped host memory, :class:`_HostRecords`); :func:`stats`
instead finalizes the states on the device (``stats_finalize_kernel``) and waits for nothing.
"""

from __future__ import annotations

import functools
import logging
import math
import struct

import cupy
import numpy as np

from .. import _kernels, _partials, _stats
from .._axes import axis_layout
from ..ops import OPS, Op
from .cupy import _MAX_GRID_Y, _counters, _dense_base, _kernel, _launch_kernel, copy_to_c_order, launch_args
from .cupy import reduce as _fold

__all__ = ["arg", "arg_index", "launch_moments", "moments", "moments_result", "state_dtype", "stats"]

_log = logging.getLogger("multireduce")
_BLOCK = _kernels.STATS_BLOCK
_ARG_PARTIAL_BYTES = 16  # struct ArgPartial { long long key, index; }


def state_dtype(dtype: np.dtype) -> np.dtype:
    """The NumPy dtype of the kernel's ``MomentRecord<S, E>`` (a row's state) for input ``dtype``.

    ``align=True`` lays the fields out by the C rules that nvcc and NVRTC follow.
    """
    dtype = np.dtype(dtype)
    return np.dtype(
        [
            ("n", np.int64),
            ("nan", np.int64),
            ("total", _stats._sum_acc(dtype)),
            ("mean", np.float64),
            ("m2", np.float64),
            ("lo", _stats._extreme_acc(dtype)),
            ("hi", _stats._extreme_acc(dtype)),
            ("mean_lo", np.float64),
        ],
        align=True,
    )


def _grid(rows: int, length: int, itemsize: int, unroll: int, max_grid: int) -> tuple[int, int]:
    """(blocks per row, blocks over rows), as ``_launch_rows`` in cupy.py chooses them."""
    per_block = _kernels.elements_per_trip(itemsize, _BLOCK, unroll)
    per_row = 1 if rows >= max_grid else max(1, min(-(-length // per_block), -(-max_grid // rows)))
    return per_row, min(rows, _MAX_GRID_Y)


@functools.cache
def _moments_constants(dtype: np.dtype) -> tuple[np.dtype, np.generic, np.generic]:
    """(state dtype, lo identity, hi identity) of the moments kernel for input ``dtype``."""
    ext = _stats._extreme_acc(dtype)
    return state_dtype(dtype), OPS["min"].identity(ext), OPS["max"].identity(ext)


@functools.cache
def _identity_bits(dtype: np.dtype) -> tuple[int, int]:
    """The moments kernel's lo and hi identities as launch-slot values (:func:`_bits`)."""
    _, lo, hi = _moments_constants(dtype)
    return _bits(lo), _bits(hi)


def _rows_view(x: cupy.ndarray, axes: tuple[int, ...], what: str, order_free: bool):
    """``(data, rows, length)``: ``x`` as rows of contiguous elements to reduce.

    ``order_free``: a full reduction may read a dense view in memory order. A non-contiguous
    input, or one whose reduced axes are not the last ones in C order, is copied first (the
    reduced axes moved last, the kept ones in their order; :func:`copy_to_c_order` logs and
    counts it).
    """
    if len(axes) == x.ndim or math.prod(x.shape[a] for a in range(x.ndim) if a not in axes) == 1:
        flat = _dense_base(x) if order_free else (x.ravel() if x.flags.c_contiguous else None)
        if flat is None:
            flat = copy_to_c_order(x, "dense", f"a non-dense view, before {what}").ravel()
        return flat, 1, x.size
    layout = axis_layout(x.shape, axes)
    if layout is None or layout[2] != 1:
        # The kernels reduce trailing axes: move the reduced axes last (argmin/argmax have one,
        # so its indices are unchanged), at the cost of one copy.
        order = [a for a in range(x.ndim) if a not in axes] + sorted(axes)
        x = copy_to_c_order(x.transpose(order), "transpose", f"reduced axes {axes} moved last, before {what}")
        axes = tuple(range(x.ndim - len(axes), x.ndim))
        layout = axis_layout(x.shape, axes)
    elif not x.flags.c_contiguous:
        x = copy_to_c_order(x, "axis", f"a non-contiguous array, before {what}")
    return x, layout[0], layout[1]


class _HostRecords:
    """Pinned, device-mapped host records that full reductions' kernels write their state into.

    A full reduction's moments or arg state is one small record that the call reads on the
    host right after its kernel: the kernel stores it straight into host memory that the
    device maps (:func:`multireduce._partials.mapped_host_memory`), and the call reads it
    there once its stream is synchronized, with no device buffer and no copy back. A record
    is taken for one call and given back after it is read. ``list.pop`` and ``list.append``
    are atomic, so threads (Dask's) share the records of a device; the memory is never freed.
    """

    SIZE = 64  # bytes: a moments record (at most 64) or an arg pair (value, index)
    BLOCK = 32  # records per allocation

    def __init__(self) -> None:
        self._free: dict[int, list[tuple[np.ndarray, int]]] = {}
        self._blocks: list[np.ndarray] = []

    def take(self, device: int) -> tuple[np.ndarray, int]:
        """A record of ``device``: ``(its SIZE host bytes, its device address)``."""
        free = self._free.setdefault(device, [])
        while True:
            try:
                return free.pop()
            except IndexError:
                host, mapped = _partials.mapped_host_memory(cupy, self.SIZE * self.BLOCK)
                self._blocks.append(host)
                free.extend((host[k : k + self.SIZE], mapped + k) for k in range(0, host.size, self.SIZE))

    def give(self, device: int, record: tuple[np.ndarray, int]) -> None:
        """Return a record whose contents have been read."""
        self._free[device].append(record)


_records = _HostRecords()

#: The fast launch of a full reduction's moments or arg kernel, per (device, stream id, kernel).
_full_launches: dict[tuple, tuple] = _partials.stream_cache({})
_pack_moments = struct.Struct("<8Q").pack_into
_pack_arg = struct.Struct("<7Q").pack_into


def _full_launch(device: int, stream: int, name: str, dtype: np.dtype, unroll: int, partial_bytes: int) -> tuple:
    """What a full reduction's launch of kernel ``name`` on the stream ``stream`` needs, made once.

    A tuple: the driver function's address, the largest grid, the elements per block and loop
    trip, the block partials' and the counter's device addresses (the stream's own: launches
    on one stream are ordered, and each leaves its counter at zero), then the arrays that keep
    those addresses alive, and a device record of :class:`_HostRecords`'s size for a state
    that stays on the device until a later kernel on the stream reads it (:func:`stats`).
    """
    key = (device, _partials.stream_id(stream), name)
    found = _full_launches.get(key)
    if found is None:
        kernel, max_grid = _kernel(device, name, _BLOCK)
        partials = cupy.empty(max_grid * partial_bytes, dtype=np.uint8)
        counters = _counters(device, 1)
        per_block = _kernels.elements_per_trip(dtype.itemsize, _BLOCK, unroll)
        record = cupy.empty(_HostRecords.SIZE, dtype=np.uint8)
        found = (kernel.ptr, max_grid, per_block, partials.data.ptr, counters.data.ptr, partials, counters, record)
        found = _full_launches.setdefault(key, found)
    return found


def _bits(value: np.generic) -> int:
    """A scalar kernel argument as the 8-byte slot value of :class:`cupy._LaunchArgs` (zero-extended)."""
    return int.from_bytes(np.asarray(value).tobytes(), "little")


def launch_moments(data: cupy.ndarray, rows: int, length: int) -> cupy.ndarray:
    """Launch ``moments_rows_kernel`` on ``rows`` contiguous rows of ``length`` elements.

    Returns the states as a device byte array of ``rows`` :func:`state_dtype` records (no
    wait). ``data`` is C-contiguous and non-empty; call inside ``with data.device``.
    """
    device = data.data.device_id
    kernel, max_grid = _kernel(device, _kernels.moments_kernel_name(data.dtype), _BLOCK)
    per_row, grid_y = _grid(rows, length, data.itemsize, _kernels.MOMENTS_UNROLL, max_grid)
    sdt, lo, hi = _moments_constants(data.dtype)
    # The block partials (BlockPartial: a state and its base) have the rows' records' size (MomentRecord).
    partials = cupy.empty((rows * per_row if per_row > 1 else 1) * sdt.itemsize, dtype=np.uint8)  # see _launch_rows
    counters = _counters(device, rows if per_row > 1 else 1)
    out = cupy.empty(rows * sdt.itemsize, dtype=np.uint8)
    args = (data, np.int64(rows), np.int64(length), lo, hi, partials, counters, out)
    kernel((per_row, grid_y), (_BLOCK,), args)
    return out


def _launch_moments_full(data: cupy.ndarray, length: int, out: int) -> cupy.cuda.Stream:
    """Launch ``moments_rows_kernel`` over one row of ``length`` elements (a full reduction).

    One driver launch with a packed argument block (as the fold kernel's default launch), so
    that the kernel is queued a few microseconds sooner than through CuPy's kernel call; the
    state record goes to the device address ``out``, which belongs to the caller's call alone
    (a record shared by the stream let another thread's launch, queued between this one and
    the read, overwrite it). Returns the current stream, with no wait. ``data`` is
    C-contiguous and non-empty; call inside ``with data.device``.
    """
    device = data.data.device_id
    stream = cupy.cuda.get_current_stream()
    sdt = _moments_constants(data.dtype)[0]
    name = _kernels.moments_kernel_name(data.dtype)
    function, max_grid, per_block, partials, counter, _, _, _ = _full_launch(
        device, stream.ptr, name, data.dtype, _kernels.MOMENTS_UNROLL, sdt.itemsize
    )
    args = launch_args(device)
    lo, hi = _identity_bits(data.dtype)
    _pack_moments(args.values, 0, data.data.ptr, 1, length, lo, hi, partials, counter, out)
    grid = min(max_grid, -(-length // per_block))  # _grid's blocks for one row
    _launch_kernel(function, grid, 1, 1, _BLOCK, 1, 1, 0, stream.ptr, args.address, 0)
    return stream


def moments(x: cupy.ndarray, axes: tuple[int, ...], op: Op) -> _stats.Moments:
    """The :class:`multireduce._stats.Moments` of ``x`` over ``axes`` (normalized, sorted).

    One fused pass (``moments_rows_kernel``); the state comes back as host NumPy arrays.
    Other axis sets are copied first (:func:`_rows_view`).
    """
    kshape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    with x.device:
        data, rows, length = _rows_view(x, axes, op.name, order_free=True)
        if rows * length == 0:
            return _stats.empty_moments(x.dtype, kshape)
        sdt = _moments_constants(x.dtype)[0]
        if kshape:
            host = launch_moments(data, rows, length).get().view(sdt)
            return _stats.Moments(*(np.ascontiguousarray(host[name]).reshape(kshape) for name in sdt.names))
        # A full reduction: the kernel writes the one record into mapped host memory, and its
        # fields come out as NumPy scalars (0-d, typed; copies) with as few NumPy calls as
        # possible; this runs on the host around the kernel, on every call.
        device = data.data.device_id
        record = _records.take(device)
        _launch_moments_full(data, length, record[1]).synchronize()
        fields = record[0][: sdt.itemsize].view(sdt)[0]
        state = _stats.Moments(*(fields[name] for name in sdt.names))
        _records.give(device, record)
    return state


@functools.cache
def _stats_dtypes(dtype: np.dtype) -> tuple[np.dtype, ...]:
    """The dtypes of the fields of :class:`multireduce._stats.Stats` for ``dtype`` input."""
    mean = OPS["mean"].result_dtype(dtype)
    i8 = np.dtype(np.int64)
    return (i8, i8, OPS["sum"].result_dtype(dtype), dtype, dtype, mean, mean, mean)


_FINALIZE_BLOCK = 128


def stats(x: cupy.ndarray, axes: tuple[int, ...], correction: float) -> _stats.Stats:
    """:func:`multireduce.stats` of the non-empty ``x`` over ``axes``, on the device.

    One pass of ``moments_rows_kernel``, then ``stats_finalize_kernel`` turns the states into
    the seven fields (CuPy arrays with the shape of the kept axes, on ``x``'s device) by the
    rules of :func:`multireduce._stats.finalize_stats`. Nothing waits for the device.
    Other axis sets are copied first (:func:`_rows_view`).
    """
    if x.size == 0:  # kept axes of length 0 (the caller raises where a reduced axis is)
        kshape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
        with x.device:
            return _stats.Stats(*(cupy.empty(kshape, dtype=dt) for dt in _stats_dtypes(x.dtype)))
    name = _kernels.stats_finalize_kernel_name(x.dtype)
    return _stats.Stats(*_finalized(x, axes, "stats", name, _stats_dtypes(x.dtype), correction))


def _finalized(x: cupy.ndarray, axes: tuple[int, ...], what: str, name: str, dtypes: tuple, correction: float):
    """One pass of ``moments_rows_kernel`` over the non-empty ``x``, then the finalize kernel ``name``.

    The finalize kernel (``stats_finalize_kernel`` or ``moments_finalize_kernel``) turns each
    kept position's state into its outputs: new CuPy arrays of ``dtypes``, with the shape of the
    kept axes, on ``x``'s device, returned as a tuple. ``what`` names the reduction in
    :func:`_rows_view`'s errors. Nothing waits for the device.
    """
    kshape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    with x.device:
        data, rows, length = _rows_view(x, axes, what, order_free=True)
        # First: the host work below overlaps the kernel. A full reduction's state goes to a
        # record of this call's own, which the finalize reads in stream order (the stream's
        # shared record let another thread's moments launch, queued between the two on the
        # same stream, overwrite it: var() returned another array's variance).
        if rows == 1:
            states = cupy.empty(_HostRecords.SIZE, dtype=np.uint8)
            _launch_moments_full(data, length, states.data.ptr)
        else:
            states = launch_moments(data, rows, length)
        outs = tuple(cupy.empty(kshape, dtype=dt) for dt in dtypes)
        kernel, max_grid = _kernel(data.data.device_id, name, _FINALIZE_BLOCK)
        grid = min(max_grid, -(-rows // _FINALIZE_BLOCK))
        kernel((grid,), (_FINALIZE_BLOCK,), (states, np.int64(rows), np.float64(correction), *outs))
    return outs


_SUM = OPS["sum"]
_F64 = np.dtype(np.float64)


def _mean(x: cupy.ndarray, axes: tuple[int, ...], result: np.dtype) -> cupy.ndarray:
    """The mean of the non-empty ``x`` over ``axes``: float64 sums, divided and rounded once.

    The fold kernels sum the elements converted to float64 (any axis set, as
    :func:`multireduce._backend.cupy.reduce`), and ``mean_from_sum_kernel`` divides each sum by
    the count and rounds it once to ``result``: the definition of the moments' mean (their
    float64 sum over the count), up to the order of the additions, at the sum's bandwidth.
    Nothing waits for the device.

    Integer and bool input, as on the host (``_backend.numpy.mean_result``): the exact totals
    (the sum's int64 or uint64 accumulator) converted to float64, over the count, which is
    :func:`multireduce._stats.state_mean`'s ``float64(total) / n``, where the dtype's range
    shows that no total can have wrapped (:func:`multireduce._stats.dtype_total_bound`).
    Elsewhere (int64 and uint64, or a narrower dtype over very many elements) the mean of
    :func:`stats`, whose finalize applies the same rule with the data's extremes. So ``mean``
    and ``stats().mean`` of integers are the same bits, and the CPU's: a float64 sum of
    integers above 2**53 rounds on the way.
    """
    count = math.prod(x.shape[a] for a in axes)
    exact = x.dtype.kind in "biu"
    if exact and not _stats.dtype_total_bound(x.dtype, count):
        mean = stats(x, axes, 0.0).mean
        return mean if mean.dtype == result else mean.astype(result)
    with x.device:
        if exact:
            acc = _SUM.accumulator_dtype(_SUM.result_dtype(x.dtype))
            sums = _fold(x, _SUM, acc, acc, axes).astype(_F64)
        else:
            sums = _fold(x, _SUM, _F64, _F64, axes)
        # The kernel reads the sums in memory order into a C-order result: the fold of a
        # Fortran-order array is Fortran-ordered (the transpose's), and a mean over an axis of
        # one of 3 or more dimensions had its values scrambled. (Not cupy.ascontiguousarray
        # for every result: it makes a 0-d array 1-d.)
        if not sums.flags.c_contiguous:
            sums = cupy.ascontiguousarray(sums)
        out = cupy.empty(sums.shape, dtype=result)
        kernel, max_grid = _kernel(x.data.device_id, _kernels.mean_from_sum_kernel_name(result), _FINALIZE_BLOCK)
        grid = min(max_grid, -(-sums.size // _FINALIZE_BLOCK))  # x is not empty: sums.size >= 1
        kernel((grid,), (_FINALIZE_BLOCK,), (sums, np.int64(sums.size), np.float64(count), out))
    return out


def moments_result(x: cupy.ndarray, axes: tuple[int, ...], op: Op, result: np.dtype, correction: float):
    """mean, var or std of the non-empty ``x`` over ``axes`` as a CuPy array of ``result`` on ``x``'s device.

    var and std: one pass of ``moments_rows_kernel``, then ``moments_finalize_kernel`` turns the
    states into the op's values by the rules of :func:`multireduce._stats.finalize_moments` (the
    caller emits its warnings, which depend on the shape alone); other axis sets are copied
    first (:func:`_rows_view`). mean: float64 sums (:func:`_mean`). Nothing waits for the device.
    """
    if op.name == "mean":
        return _mean(x, axes, result)
    name = _kernels.moments_finalize_kernel_name(x.dtype, op.name, result)
    return _finalized(x, axes, op.name, name, (result,), correction)[0]


def _launch_arg_rows(data: cupy.ndarray, rows: int, length: int, name: str, acc: np.dtype, index: cupy.ndarray):
    """Launch the arg kernel ``name`` on ``rows`` contiguous rows of ``length`` elements.

    The indices go to ``index`` (``rows`` int64 on the device); returns the values (``rows``
    of ``acc``), with no wait. ``data`` is C-contiguous and non-empty; call inside ``with
    data.device``.
    """
    device = data.data.device_id
    kernel, max_grid = _kernel(device, name, _BLOCK)
    per_row, grid_y = _grid(rows, length, data.itemsize, _kernels.ARG_UNROLL, max_grid)
    partials = cupy.empty((rows * per_row if per_row > 1 else 1) * _ARG_PARTIAL_BYTES, dtype=np.uint8)
    counters = _counters(device, rows if per_row > 1 else 1)
    value = cupy.empty(rows, dtype=acc)
    kernel((per_row, grid_y), (_BLOCK,), (data, np.int64(rows), np.int64(length), partials, counters, value, index))
    return value


def _launch_arg_full(data: cupy.ndarray, length: int, name: str, value: int | None, index: int):
    """Launch the arg kernel ``name`` over one row of ``length`` elements (a full reduction).

    One driver launch (as :func:`_launch_moments_full`); the value goes to the device address
    ``value`` (without one, to the stream's device record) and the index to ``index``.
    Returns the current stream, with no wait.
    """
    device = data.data.device_id
    stream = cupy.cuda.get_current_stream()
    function, max_grid, per_block, partials, counter, _, _, record = _full_launch(
        device, stream.ptr, name, data.dtype, _kernels.ARG_UNROLL, _ARG_PARTIAL_BYTES
    )
    if value is None:
        value = record.data.ptr
    args = launch_args(device)
    _pack_arg(args.values, 0, data.data.ptr, 1, length, partials, counter, value, index)
    grid = min(max_grid, -(-length // per_block))
    _launch_kernel(function, grid, 1, 1, _BLOCK, 1, 1, 0, stream.ptr, args.address, 0)
    return stream


def arg_index(x: cupy.ndarray, axis: int | None, op: Op) -> cupy.ndarray:
    """argmin/argmax of ``x`` along ``axis`` as the kernel's int64 indices on ``x``'s device.

    The same pass as :func:`arg`, but nothing comes to the host: the result is the kernel's
    index output (0-d for a full reduction), and the call does not wait for the device. The
    caller has checked that the reduced axis is not empty, so every index exists.
    """
    axes = tuple(range(x.ndim)) if axis is None else (axis,)
    kshape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    with x.device:
        data, rows, length = _rows_view(x, axes, op.name, order_free=False)
        index = cupy.empty(kshape, dtype=np.int64)
        if rows * length == 0:
            return index  # kept axes of length 0
        name = _kernels.arg_kernel_name(x.dtype, largest=op.largest, nan_wins=op.nan_wins)
        if rows == 1:  # the value goes to the stream's device record
            _launch_arg_full(data, length, name, None, index.data.ptr)
        else:
            _launch_arg_rows(data, rows, length, name, _stats._extreme_acc(x.dtype), index)
    return index


def arg(x: cupy.ndarray, axis: int | None, op: Op) -> _stats.ArgState:
    """The :class:`multireduce._stats.ArgState` of argmin/argmax of ``x`` along ``axis``.

    ``axis=None`` indexes the C-order flattening (a non-C-contiguous ``x`` is copied first).
    One pass (``arg_rows_kernel``); the state comes back to the host.
    Other axis sets are copied first (:func:`_rows_view`).
    """
    axes = tuple(range(x.ndim)) if axis is None else (axis,)
    kshape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    acc = _stats._extreme_acc(x.dtype)
    with x.device:
        data, rows, length = _rows_view(x, axes, op.name, order_free=False)
        if rows * length == 0:
            return _stats.empty_arg_state(acc, kshape)
        name = _kernels.arg_kernel_name(x.dtype, largest=op.largest, nan_wins=op.nan_wins)
        if kshape:
            index = cupy.empty(rows, dtype=np.int64)
            value = _launch_arg_rows(data, rows, length, name, acc, index)
            return _stats.ArgState(value.get().reshape(kshape), index.get().reshape(kshape))
        # A full reduction: value and index go straight into a mapped host record (see moments).
        host, mapped = record = _records.take(data.data.device_id)
        _launch_arg_full(data, length, name, mapped, mapped + 8).synchronize()
        state = _stats.ArgState(host[: acc.itemsize].view(acc)[0], host[8:16].view(np.int64)[0])
        _records.give(data.data.device_id, record)
    return state
