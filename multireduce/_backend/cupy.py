"""The GPU backend: multireduce's own reduction kernel, compiled with NVRTC through CuPy.

Kernels are compiled on first use of each (op, dtype, accumulator, result) combination, once
per device, and CuPy keeps the binaries in its on-disk cache. Each (device, stream) pair owns a
small workspace (one partial per block and the last-block counter); launches on one stream are
ordered, so they can share it.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
from typing import Any

import cupy
import numpy as np
from cupy.cuda import driver as _driver
from cupy.cuda import runtime as _runtime

from .. import _exact, _kernels
from .._axes import axis_layout
from .._partials import _PER_THREAD_STREAM, stream_cache, stream_id
from ..ops import Op

_log = logging.getLogger("multireduce")
_get_current_stream = cupy.cuda.get_current_stream

_lock = threading.Lock()
_launchers: dict[tuple, tuple] = {}
#: (device, kernel name) of every kernel compiled in this process, in order.
compiled: list[tuple[int, str]] = []
#: Inputs copied to C order before a kernel could read them, by reason ("dense": a full
#: reduction of a non-dense view; "axis": an axis reduction of a non-contiguous array;
#: "transpose": moments or argmin/argmax whose reduced axes are not the last ones; "exact": a
#: reproducible sum of a non-dense view). Each copy is also logged at debug level.
layout_copies: dict[str, int] = {"dense": 0, "axis": 0, "transpose": 0, "exact": 0}


def copy_to_c_order(x: cupy.ndarray, why: str, message: str) -> cupy.ndarray:
    """``x`` copied to a C-contiguous array (one extra read and write), logged and counted."""
    _log.debug("copying a %s array of shape %s to C order: %s", x.dtype, x.shape, message)
    layout_copies[why] += 1
    return cupy.ascontiguousarray(x)


_workspaces: dict[tuple[int, int], tuple] = stream_cache({})
#: The default, grid-stride launch of one (device, stream, op, dtypes): everything ``_launch``
#: would look up and compute again per call (see :func:`_default_launch`).
_defaults: dict[tuple, tuple] = stream_cache({})


class _LaunchArgs(threading.local):
    """One thread's argument block for ``cuLaunchKernel`` of the fast launches.

    ``reduce_kernel`` takes six arguments of at most 8 bytes each (the moments and arg kernels
    of full reductions, eight and seven; ``_cupy_stats``): ``values`` holds one per 8-byte slot
    (a narrower argument in the slot's low bytes: the driver copies each argument's own size
    from its slot), and ``pointers`` is the array of slot addresses that the driver reads. One
    block per thread, so that threads launching at the same time never share one; the driver
    copies the values at launch, so a block is reused at once.
    """

    SLOTS = 8

    def __init__(self) -> None:
        self.values = np.zeros(self.SLOTS, dtype=np.uint64)
        base = self.values.ctypes.data
        self.pointers = np.array([base + 8 * i for i in range(self.SLOTS)], dtype=np.uint64)
        self.address = int(self.pointers.ctypes.data)
        #: Devices whose CUDA context this thread has made current through the runtime (as
        #: CuPy's own launches ensure): the driver's launch needs one.
        self.contexts: set[int] = set()


_args = _LaunchArgs()
_pack_args = struct.Struct("<6Q").pack_into
_launch_kernel = _driver.launchKernel


def launch_args(device: int) -> _LaunchArgs:
    """The calling thread's argument block, with ``device``'s CUDA context made current here once."""
    args = _args
    if device not in args.contexts:
        _runtime.memGetInfo()  # a runtime call makes the device's context current here
        args.contexts.add(device)
    return args


def _launcher(
    device: int,
    op: Op,
    dtype: np.dtype,
    acc: np.dtype,
    result: np.dtype,
    config: tuple[int, int, int],
    kind: str = "reduce_kernel",
):
    """(kernel function, largest useful grid, identity argument) for one kernel on one device.

    Compiled on first use and cached. ``config`` is (block, unroll, load); ``kind`` is the
    kernel template: ``reduce_kernel``, ``reduce_rows_kernel`` or ``reduce_cols_kernel``
    (which ignores the load policy).
    """
    key = (device, op, dtype, acc, result, config, kind)
    found = _launchers.get(key)
    if found is None:
        if kind == "reduce_cols_kernel":
            name = _kernels.cols_kernel_name(op, dtype, acc, result, config[0], config[1])
        else:
            name = _kernels.kernel_name(op, dtype, acc, result, *config, kernel=kind)
        kernel, max_grid = _kernel(device, name, config[0])
        found = _launchers.setdefault(key, (kernel, max_grid, op.identity(acc)))
    return found


_functions: dict[tuple[int, str, int], tuple] = {}


def _kernel(device: int, name: str, block: int):
    """(driver function, largest useful grid) of one instantiation, compiled once.

    ``name`` on ``device`` for ``block`` threads per block: compiled on first use
    (:func:`_compile`), then cached.
    """
    key = (device, name, block)
    found = _functions.get(key)
    if found is None:
        with _lock:
            found = _functions.get(key)
            if found is None:
                found = _functions[key] = _compile(device, name, block)
    return found


def _compile(device: int, name: str, block: int):
    """(driver function, SMs x resident blocks) for the kernel instantiation ``name``."""
    module = cupy.RawModule(code=_kernels.read_source(), options=("--std=c++17",), name_expressions=(name,))
    # The bare driver function: calling it skips RawKernel's per-call lookups.
    kernel = module.get_function(name).kernel
    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.ptr, block, 0)
    if per_sm < 1:
        raise RuntimeError(f"{name} cannot run with {block} threads per block on device {device}")
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    compiled.append((device, name))
    return kernel, sms * per_sm


def _workspace(device: int, stream: int | tuple[int, int], max_grid: int):
    """Per-(device, stream) partials, and a counter of the stream's zeroed ones (:func:`_counters`).

    ``stream`` is the current stream's :func:`multireduce._partials.stream_id`. Partials are 8
    bytes wide, enough for every accumulator type.
    """
    key = (device, stream)
    ws = _workspaces.get(key)
    if ws is None or ws[0].size < max_grid:
        ws = (cupy.empty(max_grid, dtype=np.uint64), _counters(device, 1)[:1])
        _workspaces[key] = ws
    return ws


def _counters(device: int, count: int) -> cupy.ndarray:
    """At least ``count`` zero counters for the current stream of ``device``.

    Every launch leaves its counters at zero, so launches ordered on one stream share them.
    """
    key = (device, stream_id(_get_current_stream().ptr))
    found = _counter_cache.get(key)
    if found is None or found.size < count:
        found = cupy.zeros(max(count, 1024), dtype=np.uint32)
        _counter_cache[key] = found
    return found


_counter_cache: dict[tuple, cupy.ndarray] = stream_cache({})


def _dense_base(x: cupy.ndarray):
    """A 1-d array over ``x``'s memory if ``x`` covers one dense block of memory, else ``None``.

    Dense blocks are any permutation or reversal of the axes of a contiguous array.

    A full reduction does not depend on element order, so such views need no copy.
    """
    if x.ndim == 1 and x.strides[0] == x.itemsize:
        return x
    if x.flags.c_contiguous:
        return x.ravel()
    itemsize = x.itemsize
    extent = itemsize
    offset = 0
    for length, stride in sorted(zip(x.shape, x.strides, strict=True), key=lambda p: abs(p[1])):
        if length == 1:
            continue
        if abs(stride) != extent:
            return None
        if stride < 0:
            offset += stride * (length - 1)
        extent *= length
    return cupy.ndarray((x.size,), dtype=x.dtype, memptr=x.data + offset)


_DEFAULT_CONFIG = (_kernels.DEFAULT_BLOCK, _kernels.DEFAULT_UNROLL, _kernels.DEFAULT_LOAD)
_TILED_CONFIG = (_kernels.DEFAULT_BLOCK, _kernels.DEFAULT_UNROLL, _kernels.TILED_LOAD)


def reduce_full(
    x: cupy.ndarray,
    op: Op,
    acc: np.dtype,
    result: np.dtype,
    *,
    block: int | None = None,
    unroll: int | None = None,
    load: int | None = None,
    grid: int | None = None,
    out: cupy.ndarray | None = None,
) -> cupy.ndarray:
    """Reduce all of the non-empty CuPy array ``x`` on its device with one kernel launch.

    ``block``, ``unroll``, ``load`` and ``grid`` override the tuned launch configuration (for
    the benchmark's variants); ``grid=0`` launches one block per tile of a tiled ``load``.
    Returns a 0-d CuPy array of dtype ``result`` on ``x``'s device, on the current stream:
    ``out`` if given (a 0-d array of dtype ``result`` whose memory the device can write, which
    the caller checks), else a new one.
    """
    config = _DEFAULT_CONFIG
    if block or unroll or load is not None:
        config = (block or config[0], unroll or config[1], config[2] if load is None else load)
    device = x.data.device_id
    if device != _runtime.getDevice():
        with x.device:
            return _launch(x, op, acc, result, config, device, out, grid)
    return _launch(x, op, acc, result, config, device, out, grid)


def _launch(
    x: cupy.ndarray,
    op: Op,
    acc: np.dtype,
    result: np.dtype,
    config: tuple[int, int, int],
    device: int,
    out: cupy.ndarray | None = None,
    grid_override: int | None = None,
):
    # Every step here is on the path of every call: tiny reductions are dominated by it.
    flat = _dense_base(x)
    if flat is None:
        flat = copy_to_c_order(x, "dense", "a non-dense view, before a full reduction").ravel()
    n = flat.size
    if config is _DEFAULT_CONFIG and grid_override is None:
        if n * flat.itemsize < _kernels.TILED_MIN_BYTES:
            stream = _get_current_stream().ptr
            sid = stream if stream != _PER_THREAD_STREAM else stream_id(stream)
            found = _defaults.get((device, sid, op, flat.dtype, acc, result))
            if found is None:
                found = _default_launch(device, sid, op, flat.dtype, acc, result)
            function, max_grid, identity, per_block, partials, counter, _, _ = found
            if out is None:
                out = cupy.ndarray((), dtype=result)
            args = launch_args(device)
            _pack_args(args.values, 0, flat.data.ptr, n, identity, partials, counter, out.data.ptr)
            grid = min(max_grid, -(-n // per_block))
            _launch_kernel(function, grid, 1, 1, _DEFAULT_CONFIG[0], 1, 1, 0, stream, args.address, 0)
            return out
        config, grid_override = _TILED_CONFIG, 0  # large inputs: one block per 512 KiB tile
    kernel, max_grid, identity = _launcher(device, op, x.dtype, acc, result, config)
    per_block = _kernels.elements_per_trip(flat.itemsize, config[0], config[1])
    grid = min(max_grid, -(-n // per_block))
    if grid_override is not None:  # large inputs, and benchmark variants
        tiling = config[2] >> 2
        tile = per_block << (tiling - 1) if tiling else per_block
        grid = grid_override or max(1, -(-n // tile))
        max_grid = max(max_grid, grid)
    partials, counter = _workspace(device, stream_id(_get_current_stream().ptr), max_grid)
    if out is None:
        out = cupy.empty((), dtype=result)
    kernel((grid,), (config[0],), (flat, n, identity, partials, counter, out))
    return out


def _default_launch(device: int, stream, op: Op, dtype: np.dtype, acc: np.dtype, result: np.dtype) -> tuple:
    """The default configuration's launch on ``stream`` (a :func:`stream_id`), made once and cached.

    A tuple: the driver function's address, the largest grid, the identity's bits (as the
    kernel's ``Acc`` argument, zero-extended to 8 bytes), the elements per block and loop
    trip, the partials' and the counter's device addresses, and then the workspace's arrays,
    which keep those addresses alive. The workspace is the stream's at the time; if a later,
    larger launch replaces the stream's workspace, this one stays valid (every launch leaves
    its counter at zero, and the stream orders launches).
    """
    kernel, max_grid, identity = _launcher(device, op, dtype, acc, result, _DEFAULT_CONFIG)
    per_block = _kernels.elements_per_trip(dtype.itemsize, _DEFAULT_CONFIG[0], _DEFAULT_CONFIG[1])
    partials, counter = _workspace(device, stream, max_grid)
    found = _defaults[(device, stream, op, dtype, acc, result)] = (
        kernel.ptr,
        max_grid,
        int.from_bytes(np.asarray(identity, dtype=acc).tobytes(), "little"),
        per_block,
        partials.data.ptr,
        counter.data.ptr,
        partials,
        counter,
    )
    return found


def constant(value: np.generic, dtype: np.dtype, shape: tuple[int, ...] = (), like: Any = None) -> cupy.ndarray:
    """A CuPy array of ``shape`` (0-d by default) holding ``value`` on ``like``'s device (else the current one).

    The value travels as its bits, so that a -0.0 stays -0.0: creating a CuPy array from a
    zero scalar may take a memset path that writes +0.0. A result made from the input's
    identity or host values lives where the input lives (it was made on the current device:
    a Dask chunk on GPU 1, empty after a mask, gave a partial on GPU 0).
    """
    dt = np.dtype(dtype)
    host = np.asarray(value, dtype=dt).reshape(1)
    with like.device if like is not None else contextlib.nullcontext():
        if dt.kind == "f":
            one = cupy.asarray(host.view(f"u{dt.itemsize}")).view(dt)
        else:
            one = cupy.asarray(host)
        return cupy.broadcast_to(one.reshape(()), shape).copy() if shape else one.reshape(())


def from_host(value, dtype: np.dtype, like: Any = None) -> cupy.ndarray:
    """A NumPy scalar or array as a CuPy array of ``dtype`` on ``like``'s device (else the current one), bit for bit."""
    value = np.asarray(value, dtype=dtype)
    if value.ndim == 0:
        return constant(value[()], dtype, like=like)
    with like.device if like is not None else contextlib.nullcontext():
        return cupy.asarray(np.ascontiguousarray(value))


def _missing(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{what} on CuPy arrays needs a multireduce GPU kernel that does not exist yet "
        "(docs/axis-kernels.md). multireduce does not fall back to CuPy's reductions or to the "
        "host; convert with cupy.asnumpy(x) to reduce on the CPU."
    )


def reduce(x: cupy.ndarray, op: Op, acc: np.dtype, result: np.dtype, axes: tuple[int, ...]) -> cupy.ndarray:
    """Reduce ``x`` over ``axes`` with the fold op ``op`` (one that has a C++ functor).

    Full reductions go to ``reduce_kernel``. Others view the array as (outer, reduced,
    inner) (:func:`multireduce._axes.axis_layout`): rows (``inner == 1``) go to
    ``reduce_rows_kernel`` and the rest to ``reduce_cols_kernel``; each reads the input once.
    Reduced axes that are not adjacent take one such launch per run of adjacent reduced axes
    (:func:`_reduce_in_passes`). An F-contiguous array is reduced as its C-contiguous
    transpose; any other layout is copied to C order first (:func:`copy_to_c_order`).

    Raises
    ------
    NotImplementedError
        For an op without a GPU kernel.
    """
    if op.functor is None:
        raise _missing(f"op {op.name!r}")
    if len(axes) == x.ndim:  # the full reduction: the per-call path of tiny reductions
        return reduce_full(x, op, acc, result)
    kept = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    with x.device:
        if x.size == 0:
            return cupy.full(kept, op.identity(acc), dtype=result)
        if not x.flags.c_contiguous and x.flags.f_contiguous:
            # The transpose is C-contiguous; its kept axes come out reversed.
            flipped = tuple(sorted(x.ndim - 1 - a for a in axes))
            return reduce(x.T, op, acc, result, flipped).T
        if not x.flags.c_contiguous:
            x = copy_to_c_order(x, "axis", "a non-contiguous array, before an axis reduction")
        layout = axis_layout(x.shape, axes)
        if layout is None:
            return _reduce_in_passes(x, op, acc, result, axes)
        return _reduce_adjacent(x, op, acc, result, layout, kept)


def _reduce_adjacent(x, op: Op, acc: np.dtype, result: np.dtype, layout, kept: tuple[int, ...]) -> cupy.ndarray:
    """One launch of the row or the column kernel over the C-contiguous, non-empty ``x``."""
    outer, length, inner = layout
    out = cupy.empty(kept, dtype=result)
    if inner == 1:
        _launch_rows(x, op, acc, result, outer, length, out)
    else:
        _launch_cols(x, op, acc, result, outer, length, inner, out)
    return out


def _reduce_in_passes(x, op: Op, acc: np.dtype, result: np.dtype, axes: tuple[int, ...]) -> cupy.ndarray:
    """Reduce the C-contiguous, non-empty ``x`` over non-adjacent ``axes``, one run at a time.

    The last run of adjacent reduced axes goes first, then the next run of the (smaller)
    partials, and so on: each pass is one row or column launch, and every pass after the
    first reads only the partials, so the input is read once. The partials stay in the
    accumulator dtype (combined by ``op.combiner``: nansum's and count_nonzero's partials
    add up as sums) and become ``result`` at the end. The kernels convert each element to the
    result dtype before accumulating (``dtype=``, as NumPy does); where that conversion is not
    exact, the input is converted once first, so that the partials may skip it.
    """
    axes = tuple(sorted(axes))
    if result != op.result_dtype(x.dtype) and not np.can_cast(x.dtype, result, "safe"):
        if op.skips_nan and x.dtype.kind == "f":
            x = cupy.where(cupy.isnan(x), op.identity(x.dtype), x)  # NaN drops out before converting
        x = x.astype(result)
    step = op
    while True:
        layout = axis_layout(x.shape, axes)
        if layout is not None:
            kept = tuple(n for i, n in enumerate(x.shape) if i not in axes)
            out = _reduce_adjacent(x, step, acc, acc, layout, kept)
            return out if result == acc else out.astype(result)
        stop = axes[-1]
        start = stop
        while start - 1 in axes:
            start -= 1
        run = tuple(range(start, stop + 1))
        kept = x.shape[:start] + x.shape[stop + 1 :]
        x = _reduce_adjacent(x, step, acc, acc, axis_layout(x.shape, run), kept)
        axes = tuple(a for a in axes if a < start)
        step = op.combiner


_MAX_GRID_Y = 65535  # gridDim.y and gridDim.z limits; the kernels stride over the rest


def _launch_rows(x, op: Op, acc: np.dtype, result: np.dtype, rows: int, length: int, out: cupy.ndarray) -> None:
    block, unroll, waves, load, split = _kernels.rows_config()
    config = (block, unroll, load)
    kernel, max_grid, identity = _launcher(x.data.device_id, op, x.dtype, acc, result, config, "reduce_rows_kernel")
    per_block = _kernels.elements_per_trip(x.itemsize, block, unroll)
    # Few long rows: several blocks share each row (last-block-done per row); many rows:
    # one block each (or, with waves, a few waves of blocks that loop over the rows).
    per_row = split or (1 if rows >= max_grid else max(1, min(-(-length // per_block), -(-max_grid // rows))))
    # Block partials only where blocks share a row (one block per row never touches them: a
    # 4 GiB float32 sum over rows of 4 allocated 8 GiB of them), as _launch_cols's slabs.
    partials = cupy.empty(rows * per_row if per_row > 1 else 1, dtype=acc)
    counters = _counters(x.data.device_id, rows if per_row > 1 else 1)
    grid_y = min(rows, _MAX_GRID_Y) if per_row > 1 or not waves else min(rows, _MAX_GRID_Y, waves * max_grid)
    grid = (per_row, grid_y)
    kernel(grid, (block,), (x, rows, length, identity, partials, counters, out))


def _launch_cols(x, op: Op, acc: np.dtype, result: np.dtype, outer: int, length: int, inner: int, out) -> None:
    block, unroll = _kernels.cols_config(op, x.dtype, acc)
    kernel, max_grid, identity = _launcher(
        x.data.device_id, op, x.dtype, acc, result, (block, unroll, 0), "reduce_cols_kernel"
    )
    blocks_x = -(-inner // block)
    blocks_y = min(outer, _MAX_GRID_Y)
    # Too few column strips to fill the GPU: split the reduced axis into slabs, combined
    # in slab order by the last slab to finish. Each slab keeps at least 4 loop trips.
    want = 4 * max_grid
    slabs = 1
    if blocks_x * blocks_y < want:
        slabs = max(1, min(-(-want // (blocks_x * blocks_y)), length // (4 * unroll), _MAX_GRID_Y))
    partials = cupy.empty(outer * slabs * inner if slabs > 1 else 1, dtype=acc)
    counters = _counters(x.data.device_id, outer * blocks_x if slabs > 1 else 1)
    kernel((blocks_x, blocks_y, slabs), (block,), (x, outer, length, inner, identity, partials, counters, out))


_EXACT_PER_BLOCK = 1 << 29  # elements one block may add before its int64 slots could overflow
_EXACT_PER_LAUNCH = 1 << 30  # elements per launch: the sum over blocks stays below 2**63 too


def _exact_launch(x: cupy.ndarray):
    """Launch the exact-sum kernel over the float CuPy array ``x`` (inside ``with x.device``).

    Returns ``(outs, parts)``: a device array of ``parts`` exact accumulators of
    ``EXACT_SLOTS`` slots each (one per launch of at most 2**30 elements), in stream order,
    without waiting; ``outs`` is None for an empty ``x``.
    """
    flat = _dense_base(x)
    if flat is None:
        flat = copy_to_c_order(x, "exact", "a non-dense view, before an exact sum").ravel()
    n = flat.size
    if n == 0:
        return None, 0
    device = flat.data.device_id
    block = _kernels.EXACT_BLOCK
    kernel, max_grid = _kernel(device, _kernels.exact_kernel_name(flat.dtype), block)
    slots = _exact.LIMBS + 3
    parts = -(-n // _EXACT_PER_LAUNCH)
    _, counter = _workspace(device, stream_id(_get_current_stream().ptr), 1)  # 0 on entry and exit
    outs = cupy.empty(parts * slots, dtype=np.uint64)
    for i, start in enumerate(range(0, n, _EXACT_PER_LAUNCH)):
        part = flat[start : start + _EXACT_PER_LAUNCH]
        m = part.size
        grid = max(min(max_grid, -(-m // (4 * block))), -(-m // _EXACT_PER_BLOCK))
        partials = cupy.empty(grid * slots, dtype=np.uint64)
        kernel((grid,), (block,), (part, m, partials, counter, outs[i * slots : (i + 1) * slots]))
    return outs, parts


def exact_sum(x: cupy.ndarray) -> _exact.ExactSum:
    """The exact sum of a float CuPy array (reproducible mode), as a host ExactSum.

    Bitwise the same accumulator as the CPU's :func:`multireduce._exact.exact_sum`, so the
    final rounding (on the host) gives the same bits. Waits for the kernel (the limbs come
    back to the host). Arrays of more than 2**30 elements take one launch per 2**30.
    """
    acc = _exact.ExactSum()
    with x.device:
        outs, parts = _exact_launch(x)
        if outs is None:
            return acc
        packed = outs.get().view(np.int64).reshape(parts, _exact.LIMBS + 3)
    for p in packed:
        acc.merge(_exact.ExactSum(p[: _exact.LIMBS].copy(), p[_exact.LIMBS :].copy(), 0))  # normalizes
    acc.count = x.size
    return acc


#: Whether :func:`exact_sum_rounded` rounds on the device (``exact_round_kernel``: nothing
#: waits and nothing goes through the host) or brings the accumulator to the host and rounds
#: it there. Both give the same bits (``tests/test_reproducible.py`` runs both on the GPU);
#: on the H200 at 2^30 float32 the device rounding runs at 0.95x the fast sum and the host
#: rounding at 0.66x (``scripts/bench_axis.py --skip-axis`` times both).
ROUND_ON_DEVICE = True


def exact_sum_rounded(x: cupy.ndarray, result: np.dtype, *, on_device: bool | None = None) -> cupy.ndarray:
    """The reproducible sum of the float CuPy array ``x``, rounded once to ``result``.

    Bit for bit ``exact_sum(x).result(result)``. With ``on_device`` (default
    :data:`ROUND_ON_DEVICE`) the rounding runs in ``exact_round_kernel`` after the exact-sum
    kernel, so nothing waits for the device and nothing goes through the host; otherwise the
    accumulator comes to the host and is rounded there. A 0-d CuPy array on ``x``'s device.
    """
    if not (ROUND_ON_DEVICE if on_device is None else on_device):
        with x.device:
            return constant(exact_sum(x).result(result), result)
    with x.device:
        outs, parts = _exact_launch(x)
        if outs is None:
            return constant(result.type(0.0), result)  # the sum of nothing is +0.0
        kernel, _ = _kernel(x.data.device_id, _kernels.exact_round_kernel_name(result), 32)
        out = cupy.empty((), dtype=result)
        kernel((1,), (32,), (outs, np.int32(parts), out))
        return out


def moments(x: cupy.ndarray, axes: tuple[int, ...], op: Op):
    """The moments state of ``x`` over ``axes``: one fused pass (:mod:`._cupy_stats`)."""
    from . import _cupy_stats

    return _cupy_stats.moments(x, axes, op)


def moments_result(x: cupy.ndarray, axes: tuple[int, ...], op: Op, result: np.dtype, correction: float):
    """mean, var or std of the non-empty ``x`` over ``axes``, finalized on the device, no wait."""
    from . import _cupy_stats

    return _cupy_stats.moments_result(x, axes, op, result, correction)


def stats(x: cupy.ndarray, axes: tuple[int, ...], correction: float):
    """:func:`multireduce.stats` finalized on the device (:mod:`._cupy_stats`): CuPy fields."""
    from . import _cupy_stats

    return _cupy_stats.stats(x, axes, correction)


def arg(x: cupy.ndarray, axis: int | None, op: Op):
    """The argmin/argmax state of ``x`` along ``axis`` (None: flattened) (:mod:`._cupy_stats`)."""
    from . import _cupy_stats

    return _cupy_stats.arg(x, axis, op)


def arg_result(x: cupy.ndarray, axis: int | None, op: Op) -> cupy.ndarray:
    """argmin/argmax of ``x`` along ``axis``: the kernel's int64 indices on the device, no wait."""
    from . import _cupy_stats

    return _cupy_stats.arg_index(x, axis, op)
