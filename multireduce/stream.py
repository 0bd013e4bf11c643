"""Streaming host data through the GPU.

:func:`reduce` reduces a NumPy array, ``np.memmap``, ``.npy`` file or NumPy-chunked Dask array
on a GPU, at the speed of the host link, through a bounded amount of device memory.

The pipeline
------------
The input is cut into *pieces* of at most one staging buffer each, and consecutive pieces that
fit one staging buffer form a *segment*. A *slot* is one staging unit: a pinned host buffer, a
device buffer of the same size, a non-blocking CUDA stream, and an event recorded after the
slot's last kernel (so after its last host-to-device copy). Each segment gets a slot, waits on
its event (the previous copy out of the pinned buffer has finished), and then:

1. copy threads take the segment's pieces in order from a shared counter and copy each into
   the pinned buffer at the piece's offset with NumPy (``np.copyto`` drops the GIL, so several
   threads copy pageable memory in parallel: one thread alone reaches only a fraction of the
   link, and ``cudaMemcpy`` from pageable memory gets 5.5-8.7 GB/s on the H200 host with any
   number of threads);
2. the same thread issues the piece's asynchronous copy to the same offset of the slot's
   device buffer, on the slot's stream (CuPy's ``memcpyAsync`` drops the GIL too);
3. once every piece of the segment is issued, the calling thread launches
   :func:`multireduce.core.partial` on the segment's device bytes, on the slot's stream (so
   after every copy into it), records the slot's event and returns the slot.

With the *native copy engine* (:data:`COPY_ENGINE`, :mod:`multireduce._hostcopy`; the
default where a C compiler builds it), steps 1 and 2 run in C instead: the calling thread
hands every piece of a group of segments (:func:`_native_pieces`) to a pool of C threads in
one call that releases the GIL, and launches the segments' kernels when it returns. For a
dense input, each kernel writes its partial into pinned, device-mapped host memory
(:class:`_Cells`), and the partials are combined on the host once
their events have completed: no combine kernel and no copy back. Python's copy threads remain
for the ``"python"`` engine and for sources with no dense 1-d view.

Inputs whose segments all fit the plan's slots take them together, up front
(:meth:`_Pipeline.acquire_all`); the calling thread copies pieces too (idle pool threads may
take up to a millisecond to wake) and launches the kernels at the end. Larger inputs take a
slot when the copy threads reach a segment, and the thread that issues a segment's last copy
hands it to the calling thread for its kernel. Copies into pinned memory, copies over the
link and kernels of different pieces and segments overlap. Source arrays that are already
pinned skip the host copy: they go straight over the link, a slot at a time.

Each segment's partial (accumulator dtype, on the device) carries an event; at the end the
caller's stream waits on them, stacks them in input order and reduces them with the core, so
the result does not depend on thread timing. The device memory used is the slots' buffers
(``n_slots * slot_bytes``, within ``budget``) plus a few bytes per segment.

Slots are cached per (device, slot size) and reused by later calls: no call allocates pinned
or device memory once the cache holds enough slots. The cache of a device holds at most as
many bytes as the largest ``budget`` asked for on it: a call that makes slots of one size
first frees idle slots of other sizes (never slots in use; calls of several sizes at once may
need more, and the cache shrinks back as each size's calls end). :func:`free_staging`
releases them.

Calls from several threads share the slots and the copy threads. Threads waiting for slots
are served in turn; a call never waits for a copy job that has not started while it holds
slots (a resident call copies on its own thread too and cancels its jobs that have not
started once every piece is taken), so no interleaving of calls can deadlock. The copy
threads are started once, grown when a call asks for more, and never replaced.

The scheduling is written against a small device interface (``alloc_slot``, ``host_ready``,
``upload``, ``reduce``, ...). :class:`SimulatedDevice` implements it on the CPU with NumPy and
one thread per "stream", so that copies and reductions really run asynchronously and in stream
order; the CPU tests run the same pipeline through it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import math
import os
import queue
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _devices, _hostcopy, _partials, _settings, core
from .ops import OPS, Op, get_op

__all__ = [
    "BYTES_PER_THREAD",
    "DEFAULT_BUDGET",
    "DEFAULT_SLOT_BYTES",
    "MAX_THREADS",
    "SimulatedDevice",
    "StreamPlan",
    "copy_engine",
    "free_staging",
    "make_plan",
    "plan_pieces",
    "ramp_pieces",
    "reduce",
    "staging_info",
]

#: Default device-memory budget for the staging buffers of one device.
DEFAULT_BUDGET = 1 << 30
#: Default size of one staging buffer (pinned and device). Large enough that the per-piece
#: Python work (about 30 us) is small against the copy (0.6 ms at 55 GB/s).
DEFAULT_SLOT_BYTES = 32 << 20
#: Smaller inputs are still cut into pieces of at least this size, so that several workers
#: copy in parallel without the per-piece overhead taking over.
MIN_PIECE_BYTES = 1 << 20
_MAX_DEFAULT_THREADS = 12
#: The most copy threads one call may ask for (``threads=``): the native engine's limit
#: (:data:`multireduce._hostcopy.MAX_THREADS`), for both engines.
MAX_THREADS = _hostcopy.MAX_THREADS
#: Input bytes per default copy thread (see :func:`make_plan`).
BYTES_PER_THREAD = 8 << 20
#: Pieces per copy thread for inputs smaller than ``threads`` full slots (see :func:`make_plan`).
#: On the H200 host, 2^24 float32 with 8 threads took 2.78 ms back to back with 2 pieces per
#: thread, 2.92 with 4 and 4.04 with 8 (bench/results/h200_c8a4677/diag_stream.txt): every
#: piece costs GIL hand-offs among the copy threads.
PIECES_PER_THREAD = 2
#: Which dense inputs are cut into pieces that grow over the first ``threads`` pieces and
#: shrink over the last ones (:func:`ramp_pieces`), so that the link starts after a small first
#: piece and the copy threads finish together: ``"large"`` (inputs larger than the slots),
#: ``"all"`` or ``"off"`` (uniform pieces, :func:`plan_pieces`). On the H200 host, 1 GiB of
#: pageable float32 took 32.4 and 31.6 ms ramped against 33.4 and 33.1 ms in uniform
#: slot-sized pieces (bench/results/h200_6befd12/diag_ramp.txt). Inputs that fit the slots
#: keep uniform pieces: there the extra pieces' GIL hand-offs cost more than the ramp saves
#: (2^24 float32 between other work: 4.3-4.4 ms ramped, 3.7 ms uniform). Ramping a Dask
#: task's chunk (streamed by that task's thread alone) was slower too: 47-52 ms against 46.
RAMP = "large"
#: Allocate the pinned staging buffers write-combined (``cudaHostAllocWriteCombined``): CPU
#: writes skip the caches (no read for ownership), and the CPU never reads them.
WRITE_COMBINED = False
#: Largest piece where one thread copies and uploads a chunk alone (a Dask task's chunk): a
#: whole slot. With 4 MiB pieces the 1 GiB Dask case ran at 21.9 GB/s against 26.5 with whole
#: slots (16 Dask threads contending for the GIL per piece).
SERIAL_PIECE_BYTES = DEFAULT_SLOT_BYTES
_PIECE_ALIGN = 64 << 10
#: Who copies pageable memory into the pinned buffers and queues the uploads: ``"native"``
#: (the C engine of :mod:`multireduce._hostcopy`, built with the system C compiler on first
#: use; an error if it cannot be built), ``"python"`` (Python threads around ``np.copyto``
#: and ``memcpyAsync``), or ``"auto"``: native if it can be built, else Python, with a
#: :class:`RuntimeWarning` that says why (once per process). :func:`copy_engine` reports the
#: choice. Sources whose pieces are not contiguous (strided views with no dense 1-d view)
#: always use the Python threads.
COPY_ENGINE = "auto"
_COPY_ENGINES = ("auto", "native", "python")
#: Bytes per piece for the native engine: its per-piece cost is one driver call, so pieces
#: are small, the link starts early and the threads end together. On the H200 host, 2^24
#: float32 took 1.90 ms with 2 MiB pieces and 1.96 with 1 MiB (non-temporal stores; 2.03 and
#: 2.07 in another run), and 1 GiB the same with 1 and 4 MiB (bench/results/h200_73e49ad and
#: h200_1580de2, diag_native.txt). Pieces that shrink toward the end of the input measured
#: slower (2.08-2.14 ms against 1.90-1.96 without them).
NATIVE_PIECE_BYTES = 2 << 20
#: Input bytes per default copy thread with the native engine (the Python threads:
#: :data:`BYTES_PER_THREAD`): a piece costs it no GIL hand-offs. On four H200 hosts, 2^24
#: float32 took 1.84, 1.95, 1.83 and 2.07 ms with 12 threads against 1.89, 2.28, 1.70 and
#: 1.80 ms with 8 (bench/results/h200_bf79116, h200_1961900, h200_de7728f, h200_947b549,
#: diag_native.txt): even in total; 12 is kept for the slowest host (0.33 ms better there),
#: where 2.3 ms is at stake.
NATIVE_BYTES_PER_THREAD = 4 << 20
#: Whether the native engine copies with non-temporal (streaming) stores: the pinned buffers
#: are only read by the GPU, so the CPU's caches keep the source instead. On the H200 host,
#: 2^24 float32 took 2.07 ms with them against 2.36 (1 MiB pieces), 1 GiB 27.5 ms against
#: 29.5, 4 GiB 110.8 against 116.3 (bench/results/h200_1580de2/diag_native.txt).
NATIVE_STREAMING_STORES = True
# cudaMemoryTypeHost in CUDA's cudaMemoryType enum: page-locked host memory.
_CUDA_MEMORY_TYPE_HOST = 1


# --------------------------------------------------------------------------------------------
# Planning (pure; tested on the CPU)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamPlan:
    """How one input is streamed.

    Attributes
    ----------
    slot_bytes : int
        Size of each staging buffer (pinned host and device).
    n_slots : int
        Staging slots in flight at most; ``n_slots * slot_bytes <= budget``.
    threads : int
        Threads copying pageable memory into pinned buffers (the calling thread issues the
        uploads and kernels).
    piece_bytes : int
        Bytes per piece (at most ``slot_bytes``), a multiple of the item size.
    """

    slot_bytes: int
    n_slots: int
    threads: int
    piece_bytes: int


def _default_threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))  # the CPUs this process may use, not the host's
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, _MAX_DEFAULT_THREADS))


def _check_settings(budget: Any, slot_bytes: Any, threads: Any) -> tuple[int, int | None, int | None]:
    """Check the sizes :func:`reduce` and :func:`make_plan` take; return them as ints (or None)."""
    budget = _settings.integer(budget, "budget", "a positive integer number of bytes (default 1 GiB)", low=1)
    if slot_bytes is not None:
        accepted = "a positive integer number of bytes, or None for min(32 MiB, budget // 4)"
        slot_bytes = _settings.integer(slot_bytes, "slot_bytes", accepted, low=1)
    if threads is not None:
        threads = _settings.integer(threads, "threads", _THREADS_ACCEPTED, low=1, high=MAX_THREADS)
    return budget, slot_bytes, threads


_THREADS_ACCEPTED = f"an integer from 1 to {MAX_THREADS}, or None for the default count"


def make_plan(
    nbytes: int,
    itemsize: int,
    *,
    budget: int = DEFAULT_BUDGET,
    slot_bytes: int | None = None,
    threads: int | None = None,
) -> StreamPlan:
    """Choose slot size, slot count, threads and piece size for ``nbytes`` of input.

    Parameters
    ----------
    nbytes, itemsize : int
        Size of the input in bytes, and of one element.
    budget : int, optional
        Device memory the staging buffers may use, in bytes.
    slot_bytes : int, optional
        Size of one staging buffer; default ``min(DEFAULT_SLOT_BYTES, budget // 4)``.
    threads : int, optional
        Copy threads, from 1 to :data:`MAX_THREADS`; default the number of usable CPUs, at
        most 12, and at most one per :data:`BYTES_PER_THREAD` of input.

    Returns
    -------
    StreamPlan

    Raises
    ------
    TypeError
        If ``budget`` is not an integer, or ``slot_bytes`` or ``threads`` neither an integer
        nor None.
    ValueError
        If ``budget`` or ``slot_bytes`` is not positive, ``threads`` not from 1 to
        :data:`MAX_THREADS`, ``nbytes`` negative or ``itemsize`` below 1 (TypeError if
        either is not an integer), if the budget does not hold two staging buffers (no
        double buffering), or if a staging buffer cannot hold one element.
    """
    budget, slot_bytes, threads = _check_settings(budget, slot_bytes, threads)
    nbytes = _settings.integer(nbytes, "nbytes", "an integer >= 0 (the input's size in bytes)", low=0)
    itemsize = _settings.integer(itemsize, "itemsize", "an integer >= 1 (one element's size in bytes)", low=1)
    if slot_bytes is None:
        slot_bytes = min(DEFAULT_SLOT_BYTES, budget // 4)
        if slot_bytes < itemsize:
            raise ValueError(
                f"budget={budget} bytes is too small for {itemsize}-byte elements: its default staging buffer "
                f"(slot_bytes = budget // 4 = {slot_bytes} bytes) cannot hold one element; give budget >= "
                f"{4 * itemsize} bytes"
            )
    if slot_bytes < itemsize:
        raise ValueError(f"slot_bytes={slot_bytes} cannot hold one {itemsize}-byte element")
    if budget < 2 * slot_bytes:
        raise ValueError(
            f"budget={budget} bytes holds fewer than two staging buffers of {slot_bytes} bytes; "
            "double buffering needs two (lower slot_bytes or raise budget)"
        )
    if threads is None:
        # At most one copy thread per BYTES_PER_THREAD of input: below a few MiB per thread the
        # per-piece work outweighs the extra copy rate. On the H200 host, 2^24 float32 (64 MiB)
        # copied into one pinned buffer and uploaded piece by piece took 1.66 ms with 8 threads
        # and 16 pieces, 1.90 with 8 pieces, 2.25 ms with 12 threads and 2.74 with 16
        # (bench/results/h200_4aad948/diag_stream.txt, "prototype").
        threads = max(1, min(_default_threads(), nbytes // BYTES_PER_THREAD))
    # A few more slots than copy threads, so that slots whose copy over the link or kernel is
    # still running do not stall the copying threads.
    n_slots = min(budget // slot_bytes, threads + 3)
    threads = min(threads, n_slots)
    # Cut small inputs into PIECES_PER_THREAD pieces per thread, so that all threads copy and
    # the link starts early and ends soon after the last copy; large ones into full slots.
    target = -(-max(nbytes, 1) // (PIECES_PER_THREAD * threads))
    target = -(-target // _PIECE_ALIGN) * _PIECE_ALIGN  # aligned sources copy faster
    piece = min(slot_bytes, max(MIN_PIECE_BYTES, target))
    piece = max(itemsize, piece - piece % itemsize)
    return StreamPlan(slot_bytes=slot_bytes, n_slots=n_slots, threads=threads, piece_bytes=piece)


def plan_pieces(shape: tuple[int, ...], max_elements: int) -> list[tuple]:
    """Index tuples that cut an array of ``shape`` into pieces of at most ``max_elements``.

    Every element lies in exactly one piece; each piece is a basic-slicing index (so indexing
    gives a view), and pieces follow C order. Whole rows (along axis 0) are grouped while they
    fit; a row that does not fit is cut along the next axis, recursively.

    Examples
    --------
    >>> plan_pieces((10,), 4)
    [(slice(0, 4, None),), (slice(4, 8, None),), (slice(8, 10, None),)]
    >>> plan_pieces((2, 3), 4)
    [(slice(0, 1, None),), (slice(1, 2, None),)]
    """
    if max_elements < 1:
        raise ValueError(f"max_elements must be at least 1, not {max_elements}")
    if any(n == 0 for n in shape):
        return []
    if not shape:
        return [(Ellipsis,)]  # a[...] of a 0-d array is a view; a[()] would be a scalar
    inner = math.prod(shape[1:])
    if inner <= max_elements:
        rows = max_elements // inner
        return [(slice(i, min(i + rows, shape[0])),) for i in range(0, shape[0], rows)]
    sub = plan_pieces(shape[1:], max_elements)
    return [(i, *rest) for i in range(shape[0]) for rest in sub]


def ramp_pieces(n: int, max_elements: int, ramp: int, align: int = 1) -> list[tuple]:
    """1-d slices that cut ``n`` elements into pieces growing, level, then shrinking.

    With ``q = max_elements // ramp`` (rounded down to a multiple of ``align``): the first
    ``ramp`` pieces have ``q, 2q, ..., ramp*q`` elements, the middle ones at most
    ``max_elements`` (made equal), and the last ``ramp - 1`` pieces ``(ramp-1)q, ..., q``
    (the very last takes what is left over). Taken in order by ``ramp`` copy threads, the
    first piece is done after a ``ramp``-th of a full piece's copy, so the link starts early,
    and the threads finish together instead of one full piece apart. If ``n`` is smaller
    than ``ramp * max_elements`` the steps shrink to fit; if a step would be below ``align``,
    the uniform :func:`plan_pieces` cut is returned instead.

    Every boundary but the last is a multiple of ``align`` (not so in the uniform cut
    returned instead), and every piece has at most ``max_elements`` elements.

    Examples
    --------
    >>> [s.stop - s.start for (s,) in ramp_pieces(100, 16, 4)]
    [4, 8, 12, 16, 12, 12, 12, 12, 8, 4]
    """
    if max_elements < 1 or ramp < 1 or align < 1:
        raise ValueError(f"max_elements, ramp and align must be at least 1, not {max_elements}, {ramp}, {align}")
    q = min(max_elements // ramp, n // (ramp * ramp))
    q -= q % align
    if ramp == 1 or q < 1:
        return plan_pieces((n,), max_elements)
    up = [q * k for k in range(1, ramp + 1)]
    down = [q * k for k in range(ramp - 1, 0, -1)]
    rest = n - sum(up) - sum(down)  # >= 0, since ramp * ramp * q <= n
    # The middle: as few pieces as hold `rest` at `max_elements` each, of equal aligned sizes
    # (they differ by at most one `align`).
    full = max_elements - max_elements % align
    units = rest // align
    m = -(-units // (full // align))
    middle = [align * (units // m + (i < units % m)) for i in range(m)] if m else []
    # Under one `align` more for the last piece: q >= align and q <= max_elements // 2, so it
    # stays below 2q <= max_elements.
    down[-1] += rest - units * align
    bounds = list(itertools.accumulate(up + middle + down, initial=0))
    return [(slice(a, b),) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _dense_1d(a: np.ndarray) -> np.ndarray | None:
    """Return a 1-d view of all of ``a``'s elements in memory order, or None.

    That view exists if ``a`` covers one dense block (C or F order, or any permutation of
    axes). A full reduction does not depend on the element order, and 1-d pieces are plain
    contiguous copies.
    """
    if a.flags.c_contiguous:
        return a.reshape(-1)
    if a.flags.f_contiguous:
        return a.T.reshape(-1)
    order = sorted(range(a.ndim), key=lambda i: -abs(a.strides[i]))
    b = a.transpose(order)
    return b.reshape(-1) if b.flags.c_contiguous else None


def _pieces_of(a: np.ndarray, piece_bytes: int, ramp: int = 1) -> tuple[np.ndarray, list[tuple], bool]:
    """Return (array to index, piece indexes, whether the pieces are contiguous) for ``a``.

    The pieces are 1-d slices of ``a``'s dense view if it has one (:func:`ramp_pieces` over
    ``ramp`` pieces, uniform for ``ramp=1``), else uniform C-order blocks of ``a`` with its
    axes in the order of their strides (largest first), so that a block is read in memory
    order: a strided view of a Fortran-order array was cut in C order, one element per cache
    line (4096 x 4096 float32, max: 84.8 ms against 14.7 for its transpose on a 2-core VM).
    A full reduction does not depend on the element order.
    """
    per_piece = max(1, piece_bytes // a.itemsize)
    flat = _dense_1d(a)
    if flat is not None:
        align = max(1, _PIECE_ALIGN // a.itemsize)
        return flat, ramp_pieces(flat.size, per_piece, ramp, align), True
    a = a.transpose(sorted(range(a.ndim), key=lambda i: -abs(a.strides[i])))
    return a, plan_pieces(a.shape, per_piece), False


# --------------------------------------------------------------------------------------------
# Devices: CuPy, and the CPU stand-in
# --------------------------------------------------------------------------------------------


_engine_warned = False


def copy_engine() -> dict:
    """Which copy engine :func:`reduce` uses for pageable memory, and why.

    Returns
    -------
    dict
        ``setting`` (:data:`COPY_ENGINE`), ``engine`` ("native" or "python"), and ``library``
        (the compiled engine's path) or ``reason`` (why the Python threads are used).

    Raises
    ------
    ValueError
        For a :data:`COPY_ENGINE` that is not one of "auto", "native", "python".
    multireduce._hostcopy.NativeUnavailable
        If it is "native" and the engine cannot be built or loaded.
    """
    if COPY_ENGINE not in _COPY_ENGINES:
        accepted = ", ".join(map(repr, _COPY_ENGINES))
        raise ValueError(f"multireduce.stream.COPY_ENGINE must be one of {accepted}, not {COPY_ENGINE!r}")
    info = {"setting": COPY_ENGINE}
    if COPY_ENGINE == "python":
        return {**info, "engine": "python", "reason": "COPY_ENGINE is 'python'"}
    try:
        path = _hostcopy.loaded_path()
    except _hostcopy.NativeUnavailable as exc:
        if COPY_ENGINE == "native":
            raise
        return {**info, "engine": "python", "reason": str(exc)}
    return {**info, "engine": "native", "library": str(path)}


def _native_enabled() -> bool:
    """Whether :func:`copy_engine` chooses the native engine; under "auto", warn once if not."""
    global _engine_warned
    engine = copy_engine()
    if engine["engine"] == "native":
        return True
    if COPY_ENGINE == "auto" and not _engine_warned:
        _engine_warned = True
        warnings.warn(
            f"multireduce.stream copies with Python threads (slower from pageable memory): {engine['reason']}",
            RuntimeWarning,
            stacklevel=4,
        )
    return False


class _Driver:
    """The CUDA driver functions the native engine calls, and the primary context of each device."""

    def __init__(self):
        import ctypes

        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(f"the native copy engine needs the CUDA driver library libcuda.so.1: {exc}") from exc
        self.lib = lib
        self.upload = _hostcopy.address(lib, "cuMemcpyHtoDAsync_v2")
        self.setctx = _hostcopy.address(lib, "cuCtxSetCurrent")
        self._contexts: dict[int, int] = {}
        self._lock = threading.Lock()

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed: {self.describe(rc)}")

    def describe(self, rc: int) -> str:
        import ctypes

        name = ctypes.c_char_p()
        if self.lib.cuGetErrorName(rc, ctypes.byref(name)) != 0 or not name.value:
            return f"CUDA error {rc}"
        return f"{name.value.decode()} ({rc})"

    def context(self, device: int) -> int:
        """The primary context of ``device`` (the one CuPy's runtime calls use)."""
        import ctypes

        with self._lock:
            found = self._contexts.get(device)
            if found is None:
                self.check(self.lib.cuInit(0), "cuInit")
                dev = ctypes.c_int()
                self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), f"cuDeviceGet({device})")
                ctx = ctypes.c_void_p()
                # Retained for the life of the process, as CuPy's runtime keeps it too.
                self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
                found = self._contexts[device] = ctx.value
            return found


@functools.cache
def _driver() -> _Driver:
    return _Driver()


class _Cells:
    """Host memory where the segments' kernels write their partials: 8 bytes per segment.

    For the GPU, pinned and mapped into the device's address space, so that a kernel's result
    reaches the host with no combine kernel and no copy back; each cell has an event recorded
    after its kernel. One set per (host thread, device), since a thread runs one call at a
    time; it grows by doubling. (The CPU stand-in uses plain memory and futures.)
    """

    def __init__(self, host: np.ndarray, mapped: int, events: list):
        self.host = host
        self.mapped = mapped
        self.events = events
        self.count = host.size // 8
        self._views: dict[tuple[int, np.dtype], Any] = {}

    def value(self, k: int, dtype: np.dtype) -> np.generic:
        """Cell ``k`` as a NumPy scalar of ``dtype`` (after its event)."""
        return self.host[8 * k : 8 * k + dtype.itemsize].view(dtype)[0]


class _Slot:
    """One staging unit. ``copied`` guards ``host``: set after the last copy out of it."""

    __slots__ = ("copied", "device_buffer", "device_ptr", "host", "host_ptr", "keep", "stream", "stream_ptr")

    def __init__(self, host: np.ndarray, device_buffer: Any, stream: Any, copied: Any, keep: Any = None):
        self.host = host
        self.device_buffer = device_buffer
        self.stream = stream
        self.copied = copied
        self.keep = keep  # what owns ``host``'s memory (CuPy's PinnedMemoryPointer)
        # Raw addresses, so that an upload from a copy thread is one runtime call.
        self.host_ptr = host.ctypes.data
        self.device_ptr = device_buffer.data.ptr if keep is not None else 0
        self.stream_ptr = stream.ptr if keep is not None else 0


class _CupyDevice:
    """The real device: pinned staging buffers, CuPy device buffers, non-blocking streams."""

    def __init__(self, device: int):
        import cupy

        self.cupy = cupy
        self.device = int(device)
        self.name = f"cuda:{self.device}"
        self._local = threading.local()

    def alloc_slot(self, nbytes: int) -> _Slot:
        cupy = self.cupy
        with cupy.cuda.Device(self.device):
            if WRITE_COMBINED:
                # The CPU only ever writes a staging buffer, so it may bypass the caches.
                flags = cupy.cuda.runtime.hostAllocWriteCombined
                pinned = cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(nbytes, flags), 0)
            else:
                pinned = cupy.cuda.alloc_pinned_memory(nbytes)
            host = np.frombuffer(pinned, dtype=np.uint8, count=nbytes)
            device_buffer = cupy.empty(nbytes, dtype=cupy.uint8)
            stream = cupy.cuda.Stream(non_blocking=True)
            copied = cupy.cuda.Event(disable_timing=True)
        return _Slot(host, device_buffer, stream, copied, keep=pinned)

    def free_slot(self, slot: _Slot) -> None:
        # Pending copies and kernels must end before the buffers go back to CuPy's pools.
        slot.stream.synchronize()
        # The kernels' per-stream caches (partials, counters) of this stream go with it: each
        # new slot's stream added entries that stayed for ever.
        _partials.forget_streams({_partials.stream_id(slot.stream.ptr)})

    def host_ready(self, slot: _Slot) -> None:
        slot.copied.synchronize()  # returns at once for an event never recorded

    def bind(self) -> Any:
        """A context in which the calling thread's CUDA calls go to this device."""
        return self.cupy.cuda.Device(self.device)

    def upload(self, slot: _Slot, nbytes: int, offset: int = 0) -> None:
        # Called from copy threads (inside bind()): one runtime call, which drops the GIL while
        # CUDA queues the copy. Each extra GIL hand-off per piece costs tens of microseconds
        # when eight threads contend for it (bench/results/h200_*/diag_stream.txt).
        runtime = self.cupy.cuda.runtime
        runtime.memcpyAsync(
            slot.device_ptr + offset, slot.host_ptr + offset, nbytes, runtime.memcpyHostToDevice, slot.stream_ptr
        )

    @property
    def native(self) -> bool:
        """Whether the native copy engine stages pageable memory (:data:`COPY_ENGINE`)."""
        return _native_enabled()

    def stage_native(self, table: np.ndarray, threads: int) -> None:
        """Copy and upload the pieces of ``table`` (``_hostcopy.PIECE_DTYPE``) with the native engine."""
        driver = _driver()
        flags = _hostcopy.STREAMING_STORES if NATIVE_STREAMING_STORES else 0
        _hostcopy.stage(
            table,
            threads,
            driver.upload,
            setctx=driver.setctx,
            ctx=driver.context(self.device),
            flags=flags,
            describe=driver.describe,
        )

    def fence(self, slot: _Slot) -> None:
        with self.cupy.cuda.Device(self.device):
            slot.copied.record(slot.stream)

    def upload_from(self, slot: _Slot, source: np.ndarray) -> None:
        """Copy the pinned, contiguous ``source`` straight into the slot's device buffer."""
        raw = source.reshape(-1).view(np.uint8)
        with self.cupy.cuda.Device(self.device):
            slot.device_buffer[: raw.size].set(raw, stream=slot.stream)

    def reduce(self, slot: _Slot, dtype: np.dtype, count: int, op: Op, result: np.dtype) -> _partials.Partial:
        cupy = self.cupy
        with cupy.cuda.Device(self.device), slot.stream:
            view = slot.device_buffer[: count * dtype.itemsize].view(dtype)
            part = _partials.wrap(_partials.of_array(view, op, result), count, slot.stream)
            slot.copied.record(slot.stream)  # after the uploads before it, in stream order
            return part

    def cells(self, count: int) -> _Cells:
        """Return the calling thread's partial cells on this device, at least ``count`` of them."""
        found = getattr(self._local, "cells", None)
        if found is None or found.count < count:
            cupy = self.cupy
            n = max(count, 2 * found.count if found is not None else 64)
            with cupy.cuda.Device(self.device):
                host, mapped = _partials.mapped_host_memory(cupy, 8 * n)
                events = [cupy.cuda.Event(disable_timing=True) for _ in range(n)]
            found = self._local.cells = _Cells(host, mapped, events)
        return found

    def reduce_to_cell(
        self, slot: _Slot, dtype: np.dtype, count: int, op: Op, result: np.dtype, cells: _Cells, k: int
    ) -> None:
        """Reduce the slot's first ``count`` elements into cell ``k``, on the slot's stream."""
        cupy = self.cupy
        with cupy.cuda.Device(self.device), slot.stream:
            view = slot.device_buffer[: count * dtype.itemsize].view(dtype)
            acc = op.accumulator_dtype(result)
            out = cells._views.get((k, acc))
            if out is None:
                address = cells.mapped + 8 * k
                out = cells._views[k, acc] = _partials.mapped_scalar(cupy, address, cells.host, self.device, acc)
            if result == op.result_dtype(dtype):
                core.partial(view, op, out=out)
            else:
                out[...] = _partials.of_array(view, op, result)  # dtype=: each element converted first
            cells.events[k].record(slot.stream)
            slot.copied.record(slot.stream)  # after the uploads before it, in stream order

    def wait_cell(self, cells: _Cells, k: int) -> None:
        cells.events[k].synchronize()

    def empty_partial(self, op: Op, result: np.dtype) -> _partials.Partial:
        with self.cupy.cuda.Device(self.device):
            acc = op.accumulator_dtype(result)
            return _partials.wrap(self.cupy.full((), op.identity(acc), dtype=acc), 0)

    def ready(self, parts: list[_partials.Partial]) -> list[_partials.Partial]:
        return parts  # device partials are combined on the device, guarded by their events

    def finish(self, parts: Any, op: Op, result: np.dtype) -> np.generic:
        with self.cupy.cuda.Device(self.device):
            value = _partials.finalize(parts, op, result)
            return self.to_host(value)

    def to_host(self, value: Any) -> np.generic:
        return value.get()[()]

    def is_pinned(self, a: np.ndarray) -> bool:
        if a.size == 0:
            return False
        attrs = self.cupy.cuda.runtime.pointerGetAttributes(a.ctypes.data)
        # The field is ``type`` in CUDA 11+ (``memoryType`` before); CuPy exposes one of them.
        kind = getattr(attrs, "type", None)
        if kind is None:
            kind = getattr(attrs, "memoryType", None)
        if kind is None:
            raise RuntimeError("cannot tell whether host memory is pinned: CuPy's PointerAttributes has no type field")
        return kind == _CUDA_MEMORY_TYPE_HOST


class SimulatedDevice:
    """A CPU stand-in for the GPU, for testing the pipeline's scheduling without one.

    Each slot's "stream" is a one-thread executor: uploads (``host -> device`` buffer copies)
    and reductions run asynchronously and in order, as on a CUDA stream, and the "event" of an
    upload is its future. A pipeline that refilled a staging buffer before the previous upload
    out of it had finished would therefore upload the wrong bytes, more so with
    ``upload_delay``. Reductions use :func:`multireduce.core.partial` on NumPy views of the
    device buffer, as the real device does on CuPy views. It counts allocations and uploads.

    Parameters
    ----------
    upload_delay : float, optional
        Seconds each upload sleeps before copying, to widen races (Python engine).
    engine : {"python", "native"}, optional
        Who copies into the staging buffers and uploads: Python threads through :meth:`upload`,
        or the native engine of :mod:`multireduce._hostcopy` with its host-to-host stand-in for
        the upload (synchronous; the "device" buffer is host memory). Independent of
        :data:`COPY_ENGINE`.
    """

    def __init__(self, upload_delay: float = 0.0, engine: str = "python"):
        if engine not in ("python", "native"):
            raise ValueError(f"engine must be 'python' or 'native', not {engine!r}")
        self.upload_delay = float(upload_delay)
        self.native = engine == "native"
        self.native_calls = 0
        self.name = "simulated"
        self._lock = threading.Lock()
        self.slots_allocated = 0
        self.slots_freed = 0
        self.device_bytes = 0
        self.peak_device_bytes = 0
        self.uploads = 0
        self.direct_uploads = 0
        self.host_copies = 0
        self._pinned: list[np.ndarray] = []

    def pinned_empty(self, shape: Any, dtype: Any) -> np.ndarray:
        """An array this device treats as pinned host memory (direct uploads, no staging)."""
        a = np.empty(shape, dtype=dtype)
        self._pinned.append(a)
        return a

    def is_pinned(self, a: np.ndarray) -> bool:
        """Whether ``a`` lies in memory from :meth:`pinned_empty`."""
        start = a.__array_interface__["data"][0]
        for p in self._pinned:
            base = p.__array_interface__["data"][0]
            if base <= start < base + p.nbytes:
                return True
        return False

    def alloc_slot(self, nbytes: int) -> _Slot:
        """Allocate a staging slot: host and "device" buffers and a one-thread "stream"."""
        with self._lock:
            self.slots_allocated += 1
            self.device_bytes += nbytes
            self.peak_device_bytes = max(self.peak_device_bytes, self.device_bytes)
        stream = ThreadPoolExecutor(max_workers=1, thread_name_prefix="simulated-stream")
        slot = _Slot(np.empty(nbytes, np.uint8), np.empty(nbytes, np.uint8), stream, copied=None)
        slot.device_ptr = slot.device_buffer.ctypes.data  # the native stand-in copies to it
        return slot

    def stage_native(self, table: np.ndarray, threads: int) -> None:
        """Copy and "upload" the pieces of ``table`` with the native engine and its stand-in."""
        lib = _hostcopy.load()
        with self._lock:
            self.native_calls += 1
            self.uploads += table.size
            self.host_copies += table.size
        _hostcopy.stage(table, threads, _hostcopy.address(lib, "mr_test_upload"))

    def free_slot(self, slot: _Slot) -> None:
        """Free a slot after its pending work."""
        slot.stream.shutdown(wait=True)
        with self._lock:
            self.slots_freed += 1
            self.device_bytes -= slot.device_buffer.nbytes

    def bind(self) -> Any:
        """No device to select."""
        return contextlib.nullcontext()

    def host_ready(self, slot: _Slot) -> None:
        """Block until the last upload out of the slot's host buffer has finished."""
        if slot.copied is not None:
            futures.wait([slot.copied])  # its outcome belongs to the call that issued it

    def _copy(self, slot: _Slot, source: np.ndarray, offset: int = 0) -> None:
        if self.upload_delay:
            threading.Event().wait(self.upload_delay)
        slot.device_buffer[offset : offset + source.size] = source

    def upload(self, slot: _Slot, nbytes: int, offset: int = 0) -> None:
        """Start copying bytes ``offset:offset + nbytes`` of the host buffer, on the slot's stream.

        They go to the same bytes of the device buffer.
        """
        with self._lock:
            self.uploads += 1
            self.host_copies += 1
        slot.stream.submit(self._copy, slot, slot.host[offset : offset + nbytes], offset)

    def fence(self, slot: _Slot) -> None:
        """Mark the slot's host buffer free once the stream's work so far is done."""
        slot.copied = slot.stream.submit(lambda: None)

    def upload_from(self, slot: _Slot, source: np.ndarray) -> None:
        """Start copying the pinned ``source`` to the device buffer, on the slot's stream."""
        with self._lock:
            self.uploads += 1
            self.direct_uploads += 1
        slot.stream.submit(self._copy, slot, source.reshape(-1).view(np.uint8))

    def reduce(self, slot: _Slot, dtype: np.dtype, count: int, op: Op, result: np.dtype) -> _partials.Partial:
        """Start reducing the device buffer on the slot's stream; the value is a future."""
        view = slot.device_buffer[: count * dtype.itemsize].view(dtype)
        slot.copied = slot.stream.submit(_partials.of_array, view, op, result)  # after the uploads
        return _partials.Partial(slot.copied, count)

    def cells(self, count: int) -> _Cells:
        """Cells for ``count`` partials (new ones each call: futures are not reusable)."""
        return _Cells(np.zeros(8 * count, np.uint8), 0, [None] * count)

    def reduce_to_cell(
        self, slot: _Slot, dtype: np.dtype, count: int, op: Op, result: np.dtype, cells: _Cells, k: int
    ) -> None:
        """Start reducing the device buffer into cell ``k``, on the slot's stream."""
        view = slot.device_buffer[: count * dtype.itemsize].view(dtype)

        def run() -> None:
            acc = op.accumulator_dtype(result)
            cells.host[8 * k : 8 * k + acc.itemsize].view(acc)[0] = _partials.of_array(view, op, result)

        slot.copied = cells.events[k] = slot.stream.submit(run)  # after the uploads

    def wait_cell(self, cells: _Cells, k: int) -> None:
        """Wait for cell ``k``'s reduction (raising its error)."""
        cells.events[k].result()

    def empty_partial(self, op: Op, result: np.dtype) -> _partials.Partial:
        """The partial of zero elements."""
        return _partials.Partial(op.identity(op.accumulator_dtype(result)), 0)

    def ready(self, parts: list[_partials.Partial]) -> list[_partials.Partial]:
        """Wait for the partials' futures: the host-side combine needs values."""
        return [
            _partials.Partial(p.value.result(), p.n) if isinstance(p.value, Future) else p
            for p in _partials.flatten(parts)
        ]

    def finish(self, parts: Any, op: Op, result: np.dtype) -> np.generic:
        """Combine the partials into the result."""
        return self.to_host(_partials.finalize(self.ready(parts), op, result))

    def to_host(self, value: Any) -> np.generic:
        """Return the value: it is already on the host."""
        return value


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------


class _Pipeline:
    """Staging slots of one size on one device, shared by every call (and thread) using them.

    Threads waiting for slots are served first come, first served: a call waiting for several
    slots at once (:meth:`acquire_all`) is not overtaken forever by calls taking one at a time.
    Every waiting thread holds no slot of this pipeline that it waits on itself, and every
    slot in use is returned without waiting for a slot (see :meth:`_run_threads`), so the queue
    always moves.
    """

    def __init__(self, device: Any, slot_bytes: int, staging: _Staging | None = None):
        self.device = device
        self.slot_bytes = int(slot_bytes)
        self._free: collections.deque[_Slot] = collections.deque()
        self._cond = threading.Condition()
        self._waiting: collections.deque[object] = collections.deque()  # one ticket per waiting thread, in order
        self.allocated = 0
        self.in_use = 0
        self.calls = 0  # calls between call()'s entry and exit
        self._staging = staging
        self._tables: collections.OrderedDict[tuple, np.ndarray] = collections.OrderedDict()
        self._tables_lock = threading.Lock()

    def _leave(self, ticket: object | None) -> None:
        """Under ``_cond``: leave the queue of waiting threads; the next one may be served."""
        if ticket is not None:
            self._waiting.remove(ticket)
            self._cond.notify_all()

    def _wait_turn(self, ready: Callable[[], bool], cancel: threading.Event | None = None) -> bool:
        """Under ``_cond``: wait until ``ready()`` holds and no thread waited longer; False if cancelled.

        Waiting threads are served in the order they came (one ticket each in ``_waiting``).
        The ticket leaves the queue however the wait ends, also where it raised (Ctrl-C): a
        ticket left at the head of the queue kept every later call on these slots waiting
        forever, with slots free.
        """
        ticket = None
        try:
            while True:
                if cancel is not None and cancel.is_set():
                    return False
                if ready() and (not self._waiting or self._waiting[0] is ticket):
                    return True
                if ticket is None:
                    ticket = object()
                    self._waiting.append(ticket)
                self._cond.wait()
        finally:
            self._leave(ticket)

    def acquire(self, limit: int, cancel: threading.Event | None = None) -> _Slot | None:
        """Take a slot: a free one, oldest first (most likely idle), else a new one.

        New slots are made while fewer than ``limit`` exist; beyond that this waits for a
        release (in turn with other waiting threads), or until ``cancel`` is set (then returns
        ``None``; :meth:`wake` makes waiting threads look at it).
        """
        with self._cond:
            if not self._wait_turn(lambda: bool(self._free) or self.allocated < limit, cancel):
                return None
            self.in_use += 1
            if self._free:
                return self._free.popleft()
            self.allocated += 1
        return self._allocate(1)[0]

    def acquire_all(self, count: int, limit: int, spread: bool = False) -> list[_Slot]:
        """Take ``count`` slots at once (never some of them while waiting for the rest).

        Waits (in turn with other waiting threads) until ``count`` slots are free or may be
        made (fewer than ``limit`` exist), so that calls taking several slots each cannot hold
        some and wait for each other's. Free slots go most recently returned first (a small
        input's calls keep reusing the same few pinned buffers, which stay in the CPU's caches
        and TLB); with ``spread`` (a group that follows another at once), new slots first while
        fewer than ``limit`` exist, then the longest idle: the most recently returned are the
        previous group's, whose uploads and kernels are still running, and taking them made
        each group wait for the one before it (``host_ready``), so groups never overlapped.
        """
        if count > limit:
            raise ValueError(f"cannot take {count} staging slots at once with a limit of {limit}")
        with self._cond:
            self._wait_turn(lambda: len(self._free) + max(0, limit - self.allocated) >= count)
            if spread:
                fresh = min(count, max(0, limit - self.allocated))
                taken = [self._free.popleft() for _ in range(count - fresh)]
            else:
                taken = [self._free.pop() for _ in range(min(count, len(self._free)))]
            new = count - len(taken)
            self.allocated += new
            self.in_use += count
        if not new:
            return taken
        try:
            made = self._allocate(new)
        except BaseException:
            with self._cond:
                self.in_use -= len(taken)
                self._free.extend(taken)
                self._cond.notify_all()
            raise
        return taken + made

    def _allocate(self, count: int) -> list[_Slot]:
        """Make ``count`` slots, already counted in ``allocated`` and ``in_use``.

        First frees idle slots of other sizes on the device where the cache would outgrow the
        largest budget asked for (:class:`_Staging`). On a failure the slots made are freed and
        the counts undone.
        """
        made: list[_Slot] = []
        try:
            if self._staging is not None:
                self._staging.make_room(self)
            for _ in range(count):
                made.append(self.device.alloc_slot(self.slot_bytes))
        except BaseException:
            try:
                for slot in made:
                    self.device.free_slot(slot)
            finally:
                with self._cond:
                    self.allocated -= count
                    self.in_use -= count
                    self._cond.notify_all()
            raise
        return made

    def release(self, slot: _Slot) -> None:
        with self._cond:
            self._free.append(slot)
            self.in_use -= 1
            if self._waiting:
                self._cond.notify_all()  # the first in the queue must see it

    @contextlib.contextmanager
    def call(self) -> Iterator[_Pipeline]:
        """One call's use of the pipeline (a :func:`reduce` call, or a Dask task's chunk).

        Where calls of several sizes at once put the cache over the budget, it shrinks back
        when this pipeline's last call ends (:meth:`_Staging.trim`). Trimming as each slot came
        back freed the slot just returned (waiting for its stream) while its call still
        wanted it, and the call then made it again for its next piece.
        """
        with self._cond:
            self.calls += 1
        try:
            yield self
        finally:
            with self._cond:
                self.calls -= 1
                last = not self.calls
            if last and self._staging is not None and self._staging.over:
                self._staging.trim()

    def wake(self) -> None:
        """Wake every thread waiting in :meth:`acquire`, to look at its ``cancel`` event."""
        with self._cond:
            self._cond.notify_all()

    def take_idle(self, nbytes: int) -> list[_Slot]:
        """Remove idle slots holding at least ``nbytes`` (or all idle ones) from the cache; return them.

        The caller frees them (``device.free_slot``). Slots in use are never taken.
        """
        with self._cond:
            taken = []
            while self._free and len(taken) * self.slot_bytes < nbytes:
                taken.append(self._free.popleft())  # the longest idle first
            self.allocated -= len(taken)
            if taken:
                self._cond.notify_all()  # waiters may make new slots now
        if taken:
            with self._tables_lock:
                self._tables.clear()
        return taken

    def free(self) -> None:
        with self._cond:
            if self.in_use:
                raise RuntimeError(
                    f"{self.in_use} staging slot(s) on {self.device.name} are in use; cannot free them now"
                )
            slots = list(self._free)
            self._free.clear()
            self.allocated = 0
        with self._tables_lock:
            self._tables.clear()
        _free_slots(self.device, slots)

    @staticmethod
    def fill(slot: _Slot, piece: np.ndarray, offset: int = 0) -> None:
        """Copy ``piece`` into ``slot``'s pinned buffer at byte ``offset``.

        The caller has waited for the slot's last upload out of it (``host_ready``).
        """
        staged = slot.host[offset : offset + piece.nbytes].view(piece.dtype).reshape(piece.shape)
        np.copyto(staged, piece, casting="no")

    def put(self, slot: _Slot, piece: np.ndarray, offset: int = 0) -> None:
        """Copy ``piece`` into ``slot``'s pinned buffer at ``offset`` and start its upload there."""
        self.fill(slot, piece, offset)
        self.device.upload(slot, piece.nbytes, offset)

    def direct(self, slot: _Slot, piece: np.ndarray, op: Op, result: np.dtype) -> _partials.Partial:
        """Copy the pinned ``piece`` straight to the device and reduce it there."""
        self.device.upload_from(slot, piece)
        return self.device.reduce(slot, piece.dtype, piece.size, op, result)

    def run(self, a: np.ndarray, op: Op, result: np.dtype, plan: StreamPlan) -> np.generic:
        flat = _dense_1d(a)
        if flat is not None and self.device.is_pinned(flat):
            # No host copy to parallelize: one thread keeps the link busy, a slot at a time.
            # (Three slots in turn, so that an upload need not wait in its stream for the
            # previous piece's kernel, measured 53.4 and 49.5 GB/s at 4 GiB against 53.1 with
            # one, bench/results/h200_f72a15e; with their uploads on one stream, 53.4 and 52.3
            # against 53.2 and 52.9, h200_527f732. Not kept: cupy.asarray's single copy and a
            # sum take 54.7.)
            parts = []
            for index in plan_pieces(flat.shape, max(1, plan.slot_bytes // a.itemsize)):
                slot = self.acquire(plan.n_slots)
                try:
                    parts.append(self.direct(slot, flat[index], op, result))
                finally:
                    self.release(slot)
        elif flat is not None and self.device.native:
            cells, counts = self.device.cells(_native_segments(flat, plan)), []
            error: BaseException | None = None
            try:
                self.run_native(flat, op, result, plan, plan.threads, cells=(cells, counts))
            except BaseException as exc:  # raised below, once every launched kernel has ended
                error = exc
            # Every launched kernel is waited for, also after a failure (of the call or of a
            # wait): this thread's next call reuses the cells.
            for k in range(len(counts)):
                try:
                    self.device.wait_cell(cells, k)
                except BaseException as exc:  # raised below, once every other kernel has ended
                    error = error or exc
            if error is not None:
                raise error
            acc = op.accumulator_dtype(result)
            parts = [_partials.Partial(cells.value(k, acc), n) for k, n in enumerate(counts)]
            return _partials.finalize(parts, op, result)[()]
        else:
            large = a.nbytes > plan.n_slots * plan.slot_bytes
            ramp = plan.threads if RAMP == "all" or (RAMP == "large" and large) else 1
            src, pieces, _ = _pieces_of(a, plan.piece_bytes, ramp)
            parts = self._run_threads(src, pieces, op, result, plan)
        return self.device.finish(parts, op, result)

    def run_native(
        self,
        flat: np.ndarray,
        op: Op,
        result: np.dtype,
        plan: StreamPlan,
        threads: int,
        group: int | None = None,
        cells: tuple[_Cells, list[int]] | None = None,
    ) -> list[_partials.Partial]:
        """Stream the dense 1-d ``flat`` with the native engine; return the segments' partials.

        With ``cells=(cells, counts)`` the segment kernels write their partials into the host
        cells instead (segment ``k`` into cell ``k``), each segment's element count is appended
        to ``counts`` as its kernel is launched, and the list returned is empty.

        ``flat`` is cut into pieces of :data:`NATIVE_PIECE_BYTES` (at most a slot), and the
        pieces into slot-sized segments. Segments go in groups of ``group`` (default: all of
        them if the plan's slots hold them, else half the slots, so that the next group finds
        free slots while this one's uploads and kernels finish): the group's slots are taken
        together, the engine copies and uploads every piece of the group on ``threads``
        threads (the calling thread among them) without the GIL, and the calling thread then
        launches one kernel per segment, on the segment's stream after its uploads.
        """
        itemsize = flat.itemsize
        slot_elems = max(1, plan.slot_bytes // itemsize)
        nseg = _native_segments(flat, plan)
        # A group given (Dask's chunks, one call each) or several groups: the next group's
        # slots are not the ones this group is still using (acquire_all's spread).
        spread = group is not None or nseg > plan.n_slots
        if group is None:
            group = nseg if nseg <= plan.n_slots else max(1, plan.n_slots // 2)
        base = flat.ctypes.data
        parts: list[_partials.Partial] = []
        with self.device.bind():
            for first in range(0, nseg, group):
                segs = range(first, min(nseg, first + group))
                slots = self.acquire_all(len(segs), plan.n_slots, spread)
                launched = 0
                try:
                    for slot in slots:
                        self.device.host_ready(slot)
                    table = self._native_table(base, flat.size, itemsize, plan.slot_bytes, segs, slots)
                    self.device.stage_native(table, threads)
                    for k, slot in zip(segs, slots, strict=True):
                        count = min(slot_elems, flat.size - k * slot_elems)
                        if cells is None:
                            parts.append(self.device.reduce(slot, flat.dtype, count, op, result))
                        else:
                            self.device.reduce_to_cell(slot, flat.dtype, count, op, result, cells[0], k)
                            cells[1].append(count)
                        launched += 1
                finally:
                    _settle_all(self, [(slot, i < launched) for i, slot in enumerate(slots)])
        return parts

    def _native_table(self, base: int, n: int, itemsize: int, slot_bytes: int, segs: range, slots: list) -> np.ndarray:
        """The engine's piece table for segments ``segs`` of ``n`` elements at ``base`` into ``slots``.

        Everything in it follows from the arguments, so tables are cached (a few, most recent
        first): repeated calls on one array, which take the same slots, skip building it. The
        key holds each slot's three addresses: a slot freed and made again may get its old
        pinned buffer back with another device buffer or stream.
        """
        piece_bytes = NATIVE_PIECE_BYTES
        addresses = tuple((s.host_ptr, s.device_ptr, s.stream_ptr) for s in slots)
        key = (base, n, itemsize, slot_bytes, piece_bytes, segs.start, segs.stop, addresses)
        with self._tables_lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
                return table
        starts, sizes, seg_of = _native_pieces(n, itemsize, slot_bytes, piece_bytes)
        lo, hi = np.searchsorted(seg_of, [segs.start, segs.stop])
        which = seg_of[lo:hi] - segs.start  # the group's slot of each piece
        offset = (starts[lo:hi] - seg_of[lo:hi] * (slot_bytes // itemsize)) * itemsize
        table = np.empty(hi - lo, _hostcopy.PIECE_DTYPE)
        table["src"] = base + starts[lo:hi] * itemsize
        table["staged"] = np.array([s.host_ptr for s in slots], np.int64)[which] + offset
        table["device"] = np.array([s.device_ptr for s in slots], np.int64)[which] + offset
        table["nbytes"] = sizes[lo:hi] * itemsize
        table["stream"] = np.array([s.stream_ptr for s in slots], np.int64)[which]
        table.flags.writeable = False
        with self._tables_lock:
            self._tables[key] = table
            while len(self._tables) > 64:
                self._tables.popitem(last=False)
        return table

    def run_serial(self, src: np.ndarray, pieces: list[tuple], op: Op, result: np.dtype, plan: StreamPlan) -> list:
        """Stream ``src``'s pieces from the calling thread alone (a Dask task's chunk).

        The pieces of each segment are copied and uploaded one after the other, so that the
        link starts after the first piece, and each segment gets one kernel.
        """
        views, seg_of, offset_of, seg_bytes = _segmented(src, pieces, plan.slot_bytes)
        parts = []
        with self.device.bind():
            i = 0
            for k, nbytes in enumerate(seg_bytes):
                slot = self.acquire(plan.n_slots)
                kernel = False
                try:
                    self.device.host_ready(slot)
                    while i < len(views) and seg_of[i] == k:
                        self.put(slot, views[i], offset_of[i])
                        i += 1
                    parts.append(self.device.reduce(slot, src.dtype, nbytes // src.dtype.itemsize, op, result))
                    kernel = True
                finally:
                    _settle(self, slot, kernel)
        return parts

    def _run_threads(self, src, pieces, op, result, plan: StreamPlan) -> list[_partials.Partial]:
        """Copy threads fill slots and upload them; the calling thread launches the kernels.

        Consecutive pieces that fit one slot form a *segment*. If every segment can have its
        own slot, the slots are taken up front (:meth:`_run_resident`), else as the copy threads
        reach their segments (:meth:`_run_rolling`).

        The copy threads are shared by every call (:func:`_executor`), and a job of a rolling
        call may wait for a slot that another call holds. So no call waits for a job that has
        not started while it holds slots: a resident call copies on its own thread too and
        cancels its jobs that have not started once every piece is taken, and a rolling call
        holds a slot only for a segment whose pieces running jobs have taken (and cancels its
        jobs that have not started once every segment is done, or on a failure).
        """
        views, seg_of, offset_of, seg_bytes = _segmented(src, pieces, plan.slot_bytes)
        args = (views, seg_of, offset_of, seg_bytes, src.dtype, op, result, plan)
        if len(seg_bytes) <= plan.n_slots:
            return self._run_resident(*args)
        return self._run_rolling(*args)

    def _run_resident(self, views, seg_of, offset_of, seg_bytes, dtype, op, result, plan) -> list[_partials.Partial]:
        """Every segment in its own slot, taken up front; kernels once every piece is uploaded.

        The copy threads, the calling thread among them, take pieces in order from a shared
        counter; each copies its piece into the segment's pinned buffer and issues the piece's
        upload (:meth:`put`: ``np.copyto`` and one ``memcpyAsync``, both without the GIL).
        Nothing passes between threads per piece. The calling thread then waits for the
        others and launches one kernel per segment, on the segment's stream after its uploads.
        (With the calling thread issuing every upload, 2^24 float32 took 2.85 ms back to back
        and 4.4 ms between other work on the H200 host, bench/results/h200_c70c854; with
        per-piece hand-offs to it, 3.9-4.3 ms. With the copy thread that issues a segment's
        last upload launching its kernel, 4.45-4.62 ms between other work against 4.16-4.27
        for this order in the same run, bench/results/h200_f1b4112/diag_ramp.txt: the launch
        holds up that thread's next copy and competes for the GIL.)
        """
        slots = self.acquire_all(len(seg_bytes), plan.n_slots)
        parts: list[_partials.Partial] = []
        try:
            for slot in slots:
                self.device.host_ready(slot)
            counter = itertools.count()  # next() on it is atomic under the GIL
            stop = threading.Event()

            def copy() -> None:
                with self.device.bind():
                    while not stop.is_set():
                        i = next(counter)
                        if i >= len(views):
                            return
                        self.put(slots[seg_of[i]], views[i], offset_of[i])

            # The calling thread copies too: it is running already, while a pool thread that
            # has been idle can take a millisecond to wake (h200_7ad4740/diag_stream.txt: the
            # same call took 2.75 ms back to back and 3.72 ms after a 16 ms pause).
            workers = min(plan.threads, len(views))
            _join(_executor(workers), [copy] * (workers - 1), stop, inline=copy)
            for k, slot in enumerate(slots):
                parts.append(self.device.reduce(slot, dtype, seg_bytes[k] // dtype.itemsize, op, result))
        finally:
            _settle_all(self, [(slot, k < len(parts)) for k, slot in enumerate(slots)])
        return parts

    def _run_rolling(self, views, seg_of, offset_of, seg_bytes, dtype, op, result, plan) -> list[_partials.Partial]:
        """More segments than slots: each slot is taken when the copy threads reach a segment.

        The first copy thread to reach a segment takes a slot for it (and waits for the slot's
        last upload); the threads copy the segment's pieces into it side by side, each issuing
        its piece's upload right after its copy (:meth:`put`). The thread that issues a
        segment's last upload hands the segment to the calling thread, which reduces it with
        one kernel on the same stream (after every upload, in stream order) and returns its
        slot. Pieces are whole slots here (large inputs), so the hand-offs are few.

        Returns the segments' partials, in input order.
        """
        nseg = len(seg_bytes)
        left = [0] * nseg  # pieces of each segment not uploaded yet
        for k in seg_of:
            left[k] += 1
        slots: list[_Slot | None] = [None] * nseg
        usable: list[_Slot | None] = [None] * nseg
        claimed = [False] * nseg
        have_slot = [threading.Event() for _ in range(nseg)]
        parts: list[_partials.Partial | None] = [None] * nseg
        lock = threading.Lock()
        ready: queue.SimpleQueue = queue.SimpleQueue()  # a segment index, an exception, or _DONE
        counter = itertools.count()  # next() on it is atomic under the GIL
        stop = threading.Event()

        def slot_for(k: int) -> _Slot | None:
            with lock:
                mine = not claimed[k]
                claimed[k] = True
            if not mine:
                have_slot[k].wait()
                return usable[k]  # None if the call is being stopped
            try:
                slot = self.acquire(plan.n_slots, cancel=stop)
                if slot is not None:
                    slots[k] = slot  # released by the calling thread, whatever happens next
                    self.device.host_ready(slot)
                    usable[k] = slot  # only once its previous uploads are over
                return slot
            finally:
                have_slot[k].set()

        def copy() -> None:
            try:
                with self.device.bind():
                    while not stop.is_set():
                        i = next(counter)
                        if i >= len(views):
                            return
                        k = seg_of[i]
                        slot = slot_for(k)
                        if slot is None:
                            return
                        self.put(slot, views[i], offset_of[i])
                        with lock:
                            left[k] -= 1
                            last = not left[k]
                        if last:
                            ready.put(k)
            except BaseException as exc:
                ready.put(exc)
            finally:
                ready.put(_DONE)

        def fail(exc: BaseException) -> BaseException:
            stop.set()
            self.wake()  # copy threads waiting for a slot see ``stop``
            for event in have_slot:
                event.set()  # ... and so do those waiting for another thread's slot
            return exc

        workers = min(plan.threads, len(views))
        jobs: list[Future] = []
        error: BaseException | None = None
        try:
            pool = _executor(workers)
            for _ in range(workers):
                jobs.append(pool.submit(copy))
        except BaseException as exc:  # the jobs submitted already are stopped and waited for below
            error = fail(exc)
        running = len(jobs)  # jobs that will still send _DONE
        cancelled = False

        def cancel_unstarted() -> None:
            # A job that has not started has nothing left to do (every segment is done, or the
            # call is stopping); one that has started sends _DONE.
            nonlocal running, cancelled
            if not cancelled:
                cancelled = True
                running -= sum(job.cancel() for job in jobs)

        if error is not None:
            cancel_unstarted()
        reduced = 0
        itemsize = dtype.itemsize
        # Every copy thread that started ends with _DONE; only then are the slots of unfinished
        # segments returned (no thread writes into them any more).
        while running > 0:
            try:
                item = ready.get()
            except BaseException as exc:  # KeyboardInterrupt while waiting: stop, drain, raise
                error = error or fail(exc)
                cancel_unstarted()
                continue
            if item is _DONE:
                running -= 1
            elif isinstance(item, BaseException):
                error = error or fail(item)
                cancel_unstarted()
            elif error is None:
                k = item
                try:
                    parts[k] = self.device.reduce(slots[k], dtype, seg_bytes[k] // itemsize, op, result)
                    self.release(slots[k])
                    reduced += 1
                    if reduced == nseg:
                        cancel_unstarted()
                except BaseException as exc:
                    error = fail(exc)
                    cancel_unstarted()
        try:  # the segments without a kernel
            _settle_all(self, [(slots[k], False) for k in range(nseg) if slots[k] is not None and parts[k] is None])
        finally:
            if error is not None:
                raise error
        return parts


def _native_segments(flat: np.ndarray, plan: StreamPlan) -> int:
    """The number of slot-sized segments of ``flat`` (the native engine's)."""
    return -(-flat.size // max(1, plan.slot_bytes // flat.itemsize))


@functools.lru_cache(maxsize=64)
def _native_pieces(
    n: int, itemsize: int, slot_bytes: int, piece_bytes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first element, element count, segment) of each native piece of ``n`` elements, in order.

    Pieces have ``piece_bytes`` (:data:`NATIVE_PIECE_BYTES`; at most a slot), and segments are the slot-sized
    ranges of elements; a piece never crosses a segment's boundary. Cached (read-only arrays):
    repeated calls on inputs of one size skip the planning.
    """
    slot = max(1, slot_bytes // itemsize)
    per = max(1, min(piece_bytes, slot_bytes) // itemsize)
    starts = np.unique(np.concatenate([np.arange(0, n, per, dtype=np.int64), np.arange(0, n, slot, dtype=np.int64)]))
    sizes = np.diff(starts, append=n)
    segments = starts // slot
    for a in (starts, sizes, segments):
        a.flags.writeable = False
    return starts, sizes, segments


def _settle(pipeline: _Pipeline, slot: _Slot, kernel: bool) -> None:
    """Return ``slot``; without a kernel after its last uploads, first mark where they end.

    (Uploads out of its pinned buffer may still be queued: the next user of the slot waits
    for them.)
    """
    try:
        if not kernel:
            pipeline.device.fence(slot)
    finally:
        pipeline.release(slot)


def _settle_all(pipeline: _Pipeline, slots: list[tuple[_Slot, bool]]) -> None:
    """:func:`_settle` every (slot, kernel) pair; a failure is raised after all are returned."""
    error: BaseException | None = None
    for slot, kernel in slots:
        try:
            _settle(pipeline, slot, kernel)
        except BaseException as exc:  # raised below, once every slot is back
            error = error or exc
    if error is not None:
        raise error


def _join(pool: _CopyPool, jobs: list, stop: threading.Event, inline) -> None:
    """Run ``jobs`` on ``pool`` and ``inline()`` here, wait for them; raise the first failure.

    Once ``inline()`` has returned (it takes pieces until none is left) or anything failed,
    the jobs that have not started are cancelled: this waits only for jobs that are running,
    never for the pool to reach one (its threads may be busy with jobs of other calls that
    wait for slots this call holds). On a failure (a job's, ``inline()``'s, a ``submit``'s,
    or an interrupt of this thread) ``stop`` is set, and this still waits for every running
    job to end before raising the first error, so that no job touches the caller's slots
    afterwards.
    """
    submitted: list[Future] = []
    error: BaseException | None = None
    try:
        for job in jobs:
            submitted.append(pool.submit(job))
    except BaseException as exc:  # raised below, once the jobs submitted have ended
        stop.set()
        error = exc
    if error is None:
        try:
            inline()
        except BaseException as exc:  # raised below, once every job has ended
            stop.set()
            error = exc
    pending = {f for f in submitted if not f.cancel()}
    while pending:
        try:
            done, pending = futures.wait(pending, return_when=futures.FIRST_EXCEPTION)
        except BaseException as exc:  # KeyboardInterrupt while waiting: stop, drain, raise
            stop.set()
            error = error or exc
            continue
        for f in done:
            if f.exception() is not None:
                stop.set()
                error = error or f.exception()
    if error is not None:
        raise error


def _segmented(src: np.ndarray, pieces: list[tuple], slot_bytes: int) -> tuple[list, list[int], list[int], list[int]]:
    """``src``'s pieces as views, and their segments (:func:`_segments`) after them."""
    views = [src[index] for index in pieces]
    return (views, *_segments([v.nbytes for v in views], slot_bytes))


def _segments(sizes: list[int], slot_bytes: int) -> tuple[list[int], list[int], list[int]]:
    """Group consecutive pieces of ``sizes`` bytes into segments of at most ``slot_bytes``.

    Returns (segment of each piece, byte offset of each piece in its segment, bytes of each
    segment). Every piece is at most ``slot_bytes`` (the plan makes them so).
    """
    seg_of, offset_of, seg_bytes = [], [], []
    for size in sizes:
        if not seg_bytes or seg_bytes[-1] + size > slot_bytes:
            seg_bytes.append(0)
        seg_of.append(len(seg_bytes) - 1)
        offset_of.append(seg_bytes[-1])
        seg_bytes[-1] += size
    return seg_of, offset_of, seg_bytes


_DONE = object()  # a copy thread's last message to the issuing thread


class _CopyPool:
    """The shared copy threads: started once, reused by every call, grown but never shut down.

    A thread start costs about 50 us, which matters against a 2 ms call. Jobs run in the order
    submitted, each on whichever thread is free; :meth:`submit` returns a
    :class:`concurrent.futures.Future`, which a caller may cancel while its job has not
    started. A call that asks for more threads than there are starts the missing ones; the
    threads already running, and the jobs queued for them, are untouched (replacing the pool
    under calls that had it, as an earlier version did, made their ``submit`` fail).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: Any = _JobQueue()
        self._threads = 0

    def ensure(self, n: int) -> None:
        """Start threads until there are at least ``n``."""
        with self._lock:
            while self._threads < n:
                thread = threading.Thread(
                    target=self._work, args=(self._jobs,), name=f"multireduce-stream_{self._threads}", daemon=True
                )
                thread.start()  # may raise (no more threads): the ones started stay
                self._threads += 1

    def submit(self, fn) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn))
        return future

    @staticmethod
    def _work(jobs) -> None:
        while True:
            future, fn = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it started
            try:
                result = fn()
            except BaseException as exc:  # the submitter's to handle, through the future
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, fn

    def _after_fork(self) -> None:
        # A forked child has none of the parent's threads: it starts its own.
        self._lock = threading.Lock()
        self._jobs = _JobQueue()
        self._threads = 0


# Bound here: a test replaces this module's ``queue`` with one that raises on ``get``.
_JobQueue = queue.SimpleQueue
_pool = _CopyPool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool._after_fork)


def _executor(n: int) -> _CopyPool:
    """Return the shared copy threads (:class:`_CopyPool`), at least ``n`` of them."""
    _pool.ensure(max(n, 1))
    return _pool


def _free_slots(device: Any, slots: list[_Slot]) -> None:
    """Free every slot (after its pending work); a failure is raised once all were tried."""
    error: BaseException | None = None
    for slot in slots:
        try:
            device.free_slot(slot)
        except BaseException as exc:  # raised below, once every slot was tried
            error = error or exc
    if error is not None:
        raise error


class _Staging:
    """The staging cache of one device: a :class:`_Pipeline` per slot size.

    Its slots hold at most as many bytes as the largest ``budget`` asked for on the device
    (while no call uses more at once): a pipeline that makes a slot first frees idle slots of
    other sizes until the cache fits that budget (:meth:`make_room`). Slots in use are never
    freed; if calls of several sizes at once need more than the budget, the cache shrinks
    back as each size's calls end (:meth:`trim`, when a pipeline has no slot in use).
    """

    def __init__(self, device: Any):
        self.device = device
        self.pipelines: dict[int, _Pipeline] = {}
        self.budget = 0  # the largest budget asked for
        self.over = False  # holds more than ``budget`` (slots of other sizes were in use)
        self._lock = threading.Lock()

    def pipeline(self, slot_bytes: int, budget: int) -> _Pipeline:
        """The pipeline of ``slot_bytes`` slots, for a call with ``budget`` bytes of staging."""
        with self._lock:
            self.budget = max(self.budget, int(budget))
            found = self.pipelines.get(slot_bytes)
            if found is None:
                found = self.pipelines[slot_bytes] = _Pipeline(self.device, slot_bytes, self)
            return found

    def nbytes(self) -> int:
        """Bytes of the slots made (in use or idle), over every slot size."""
        return sum(p.allocated * p.slot_bytes for p in list(self.pipelines.values()))

    def make_room(self, asking: _Pipeline) -> None:
        """Free idle slots of sizes other than ``asking``'s until the cache fits the budget.

        Called once ``asking`` has counted the slots it is about to make.
        """
        self._shrink([p for p in list(self.pipelines.values()) if p is not asking])

    def trim(self) -> None:
        """Free idle slots of any size until the cache fits the budget."""
        self._shrink(list(self.pipelines.values()))

    def _shrink(self, candidates: list[_Pipeline]) -> None:
        idle: list[_Slot] = []
        with self._lock:
            excess = self.nbytes() - self.budget
            for p in candidates:
                if excess <= 0:
                    break
                taken = p.take_idle(excess)
                idle += taken
                excess -= len(taken) * p.slot_bytes
            self.over = excess > 0
        _free_slots(self.device, idle)


_stagings_lock = threading.Lock()
_stagings: dict[int, _Staging] = {}  # per CUDA device


def _check_device(device: Any) -> int | None:
    """``device=`` as an int (or None), refusing what is not a device ordinal (bools, floats, strings)."""
    if device is None:
        return None
    accepted = "an integer CUDA device ordinal (0 to the device count - 1), or None for CuPy's current device"
    return _settings.integer(device, "device=", accepted, low=0)  # the upper bound needs CuPy


def _cupy():
    """CuPy, or a ModuleNotFoundError that says what to install or call instead (no CPU fallback)."""
    return _devices.import_cupy(
        "multireduce.stream (it streams host data through a CUDA GPU)",
        "; on the CPU, reduce the array with multireduce.reduce (or a Dask array with multireduce.dask.treereduce)",
    )


@functools.cache
def _device_count() -> int:
    return _cupy().cuda.runtime.getDeviceCount()


def _device_ordinal(device: Any) -> int:
    """The CUDA device that ``device=`` names (None: CuPy's current one), checked to exist."""
    device = _check_device(device)
    cupy = _cupy()  # nothing falls back to the CPU

    if device is None:
        return cupy.cuda.Device().id
    return _devices.ordinal_in_range(device, _device_count(), "device=")


def _cupy_staging(device: Any) -> _Staging:
    device = _device_ordinal(device)
    with _stagings_lock:
        found = _stagings.get(device)
        if found is None:
            found = _stagings[device] = _Staging(_CupyDevice(device))
        return found


def _cupy_pipeline(device: Any, slot_bytes: int, budget: int = DEFAULT_BUDGET) -> _Pipeline:
    """The cached pipeline of ``slot_bytes`` slots on CUDA device ``device``, for a call with ``budget``."""
    return _cupy_staging(device).pipeline(int(slot_bytes), budget)


def _resolve(ref: Any) -> _Pipeline:
    # Dask tasks name the pipeline by key so that they can run in worker processes, each of
    # which has its own slots; the CPU stand-in is passed as the object itself.
    if isinstance(ref, _Pipeline):
        return ref
    _, device, slot_bytes, budget = ref
    return _cupy_pipeline(device, slot_bytes, budget)


def free_staging(*, release: bool = True) -> int:
    """Free every cached staging slot (pinned host and device buffers, streams).

    Parameters
    ----------
    release : bool, optional
        Also return CuPy's free pooled blocks (device and pinned) to the driver, so that the
        memory is really given back. Only blocks that nothing uses are released.

    Returns
    -------
    int
        The number of slots freed.

    Raises
    ------
    RuntimeError
        If a reduction is using staging slots right now.
    """
    with _stagings_lock:
        pipelines = [p for staging in _stagings.values() for p in list(staging.pipelines.values())]
    freed = 0
    error: BaseException | None = None
    for p in pipelines:
        count = p.allocated
        try:
            p.free()
        except BaseException as exc:  # raised below, once every other pipeline is freed
            error = error or exc
        else:
            freed += count
    if error is not None:
        raise error
    cupy = sys.modules.get("cupy")
    if release and cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    return freed


def staging_info() -> list[dict]:
    """Describe the cached staging slots.

    Returns one record per (device, slot size) that holds slots: the slot count, the slots in
    use, and the pinned and device bytes they hold.
    """
    with _stagings_lock:
        items = [(device, p) for device, staging in _stagings.items() for p in list(staging.pipelines.values())]
    return [
        {
            "device": device,
            "slot_bytes": p.slot_bytes,
            "slots": p.allocated,
            "in_use": p.in_use,
            "pinned_bytes": p.allocated * p.slot_bytes,
            "device_bytes": p.allocated * p.slot_bytes,
        }
        for device, p in items
        if p.allocated or p.in_use
    ]


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def _is_dask_array(x: Any) -> bool:
    if not type(x).__module__.startswith("dask"):
        return False
    import dask.array as da

    return isinstance(x, da.Array)


def _as_host_array(source: Any) -> np.ndarray:
    if isinstance(source, str | bytes | os.PathLike):
        from ._shards import inspect_npy

        source = os.fsdecode(source)  # a bytes path too, as numpy.load and inspect_npy take it

        # The CLI's checks: a file without the NumPy magic, an .npz archive, a corrupt or
        # truncated header or one of objects is named as such (np.load would call a text file
        # "pickled data" and let a header's shape overflow). The header is parsed once, here:
        # the data are mapped where it says, flat (a full reduction needs no shape or order).
        layout = inspect_npy(source)
        if not layout.n:
            return np.empty(0, layout.dtype)  # mmap refuses a length of 0
        return np.memmap(layout.path, dtype=layout.dtype, mode="r", offset=layout.offset, shape=(layout.n,))
    if isinstance(source, np.ndarray):
        if type(source) is not np.ndarray and (error := core._refused_subclass(source)) is not None:
            raise error  # a masked array (its mask would be ignored) or a matrix: the core's refusal
        return source
    if type(source).__module__.startswith("cupy"):
        raise TypeError("the array is already on a GPU; reduce it with multireduce.reduce")
    raise TypeError(
        f"cannot stream an object of type {type(source).__module__}.{type(source).__qualname__}; expected a "
        "numpy.ndarray (np.memmap too), a path to a .npy file, or a dask array of NumPy chunks"
    )


class _DaskCall:
    """The chunk tasks of one Dask-array call that run in the calling process.

    Dask's local schedulers raise a task's error at once, while the call's other tasks are
    still streaming their chunks. :func:`_reduce_dask` then stops the call (:meth:`stop`): tasks
    that have not started stream nothing, and it waits for the running ones, so that no slot
    is in use and nothing streams once the call has raised (as :func:`_join` does for the
    copy threads).
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.running = 0
        self.stopped = False

    @contextlib.contextmanager
    def task(self) -> Iterator[None]:
        with self.cond:
            if self.stopped:
                raise RuntimeError("stream.reduce: not streaming this chunk, another chunk of its call failed")
            self.running += 1
        try:
            yield
        finally:
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

    def stop(self) -> None:
        """Stream no more chunks; wait for the running ones (an interrupt does not stop the wait)."""
        with self.cond:
            self.stopped = True
            while self.running:
                try:
                    self.cond.wait()
                except BaseException:  # the call's own error is raised once they have ended
                    continue


_dask_calls: dict[tuple[int, int], _DaskCall] = {}  # (pid, number): the calls running in this process
_dask_call_numbers = itertools.count()


def _dask_chunk(
    block,
    axis,
    keepdims,
    *,
    ref,
    op: Op,
    result: np.dtype,
    plan: StreamPlan,
    expected: np.dtype,
    call: tuple[int, int] | None = None,
    computing_meta: bool = False,
):
    if computing_meta:
        return block  # Dask's placeholder: nothing to stream
    state = _dask_calls.get(call) if call is not None else None
    if state is None and call is not None and call[0] == os.getpid():
        # A task that Dask runs after its call has raised (and ended): nothing to stream for.
        raise RuntimeError("stream.reduce: not streaming this chunk, its call has ended")
    with state.task() if state is not None else contextlib.nullcontext():  # none in another process
        return _stream_chunk(block, ref=ref, op=op, result=result, plan=plan, expected=expected)


def _stream_chunk(block, *, ref, op: Op, result: np.dtype, plan: StreamPlan, expected: np.dtype):
    from .dask import _check_chunk, _refuse_chunk_subclass

    if type(block).__module__.startswith("cupy"):
        _check_chunk(block, expected)  # the Dask layer's check and message
        return _partials.wrap(_partials.of_array(block, op, result), block.size)  # already on a GPU
    # A masked chunk of an array whose meta is a plain ndarray (a masked meta is refused when
    # the graph is built).
    _refuse_chunk_subclass(block)
    # The plan (accumulator, dtype= checks) was made for the declared dtype; scalars and lists
    # become arrays, as the Dask layer takes them.
    block = _check_chunk(block, expected)
    if not isinstance(block, np.ndarray):
        raise TypeError(
            f"cannot stream a chunk of type {type(block).__module__}.{type(block).__qualname__}; "
            "stream.reduce takes NumPy (or CuPy) chunks, NumPy and Python scalars and lists"
        )
    pipeline = _resolve(ref)
    flat = _dense_1d(block)
    if flat is not None and flat.size and pipeline.device.native:
        # This task's thread alone, without the GIL: one segment (slot) at a time, as below.
        with pipeline.call():
            return pipeline.device.ready(pipeline.run_native(flat, op, result, plan, threads=1, group=1))
    # Pieces of at most SERIAL_PIECE_BYTES (smaller ones start this task's uploads earlier,
    # several to a slot, but cost GIL hand-offs among Dask's threads).
    src, pieces, _ = _pieces_of(block, min(plan.piece_bytes, SERIAL_PIECE_BYTES))
    if not pieces:
        return pipeline.device.empty_partial(op, result)
    with pipeline.call():
        return pipeline.device.ready(pipeline.run_serial(src, pieces, op, result, plan))


def reduce(
    source: Any,
    op: str | Op = "sum",
    *,
    dtype: Any = None,
    device: int | None = None,
    budget: int = DEFAULT_BUDGET,
    slot_bytes: int | None = None,
    threads: int | None = None,
    split_every: int | dict | None = None,
    _device: SimulatedDevice | None = None,
) -> np.generic:
    """Reduce a host-resident array on a GPU, streaming it through pinned staging buffers.

    The input never needs to fit in device memory: it moves in pieces of ``slot_bytes``
    through at most ``budget`` bytes of device buffers, copied by ``threads`` host threads
    into pinned buffers while earlier pieces cross the link and are reduced with
    :func:`multireduce.core.partial` on their own CUDA streams. Input that is already pinned
    goes over the link directly. See the module docstring for the pipeline.

    Parameters
    ----------
    source : numpy.ndarray, numpy.memmap, str, bytes or os.PathLike, or dask.array.Array
        A host array (any shape and layout), a ``.npy`` file (memory-mapped, read-only,
        ``allow_pickle=False``), or a Dask array of NumPy chunks (CuPy chunks are reduced where
        they are). Supported dtypes as for :func:`multireduce.reduce`; as there, a
        ``numpy.ma.MaskedArray`` (its mask would be ignored) and a ``numpy.matrix`` are
        refused, and so is a Dask array of masked chunks. A file or memory map must not shrink
        while it is streamed: reading a page past its new end kills the process (SIGBUS).
    op : str or Op
        A fold op (sum, prod, max, min, nansum, nanprod, nanmax, nanmin, any, all, count_nonzero).
        prod and nanprod only with an integer (or bool) result: see Raises.
    dtype : dtype, optional
        Result dtype, for the ops that take one (sum, prod, nansum, nanprod), as in :func:`multireduce.reduce`.
    device : int, optional
        The CUDA device, an integer from 0 to the device count - 1; default CuPy's current
        device.
    budget : int, optional
        Device memory for staging buffers, in bytes, positive (default 1 GiB). As much pinned host memory
        is used. Staging slots are cached per (device, slot size) and shared by calls; the
        cache of a device holds at most as many bytes as the largest budget asked for on it
        (idle slots of other sizes are freed first; see the module docstring).
    slot_bytes : int, optional
        Bytes per staging buffer; default ``min(32 MiB, budget // 4)``.
    threads : int, optional
        Host threads that copy into pinned buffers (the calling thread among them for inputs
        that fit the slots), from 1 to :data:`MAX_THREADS` (256); default the usable CPUs, at
        most 12 and at most one per 8 MiB of input (4 MiB with the native copy engine). For a
        Dask array, Dask's own threads copy and this only sizes the slots.
    split_every : int or dict, optional
        For a Dask array only, as in :func:`multireduce.dask.treereduce` (and checked as
        there); other sources take None.

    Returns
    -------
    numpy.generic
        The result on the host, with the dtype and rounding rules of :func:`multireduce.reduce`.
        Pieces are combined in a fixed order, so the same input and settings give the same bits.

    Raises
    ------
    TypeError
        For an unsupported source type or dtype, a masked array or matrix (the core's error),
        a Dask chunk of a masked array or of another dtype than the Dask array declares (the
        Dask layer's error), an ``.npz`` archive, a ``.npy`` file of Python objects (never
        unpickled), ``dtype=`` given to max/min, a ``budget``, ``slot_bytes`` or ``threads``
        that is not an integer (or None, for the last two), or a ``device`` that is not an
        integer (a bool or a float is not a device ordinal).
    ValueError
        For an unknown op, a ``budget`` or ``slot_bytes`` that is not positive, ``threads``
        not from 1 to 256, a budget that holds fewer than two staging buffers, a ``device``
        that does not exist, ``split_every`` given for a source that is not a Dask array (or
        one that treereduce refuses), a path that is not a ``.npy`` file (no NumPy magic) or
        one whose header is corrupt or promises more data than the file holds, or max/min of
        an empty input.
    NotImplementedError
        For the ops with a state (mean, var, ...), for a ``dtype=`` that converts every
        element with rounding first (a float32 sum of float64), and for a product with a float
        result: a product that overflows to inf in one piece and is 0 in another combines to
        nan where NumPy's order may give 0.0 (or the reverse). Use :func:`multireduce.reduce`.
    FileNotFoundError, IsADirectoryError, PermissionError
        If a path source cannot be opened.
    ModuleNotFoundError
        If CuPy is not installed, also for an empty input (nothing falls back to the CPU: use
        :func:`multireduce.reduce` there); the message says so. The settings are checked
        first: their errors come with or without CuPy.

    Examples
    --------
    >>> import numpy as np
    >>> from multireduce import stream
    >>> h = np.ones(2**24, dtype=np.float32)             # doctest: +SKIP
    >>> stream.reduce(h, "sum")                          # doctest: +SKIP
    np.float32(16777216.0)
    >>> stream.reduce("big.npy", "max", budget=1 << 30)  # doctest: +SKIP
    """
    _check_settings(budget, slot_bytes, threads)  # also for inputs that return before make_plan
    op = get_op(op)
    if op.kind != "fold":
        raise NotImplementedError(
            f"stream.reduce streams the fold ops, whose partial is one value "
            f"({', '.join(repr(name) for name, o in OPS.items() if o.kind == 'fold')}); {op.name!r} has a state "
            "(multireduce._stats) that the pipeline does not merge. Use multireduce.reduce or multireduce.stats."
        )
    device = _check_device(device)
    if _is_dask_array(source):
        return _reduce_dask(source, op, dtype, device, budget, slot_bytes, threads, split_every, _device)
    if split_every is not None:
        raise ValueError(
            f"split_every is for a Dask array source only (the fan-in of its combine tree, as in "
            f"multireduce.dask.treereduce); a {type(source).__module__}.{type(source).__qualname__} source takes "
            f"None, got {split_every!r}"
        )
    a = _as_host_array(source)
    result = op.result_dtype(a.dtype, dtype)
    acc = op.accumulator_dtype(result)
    _check_streamable(op, a.dtype, result, acc)
    # The settings against this input (before the device: the same errors with or without
    # CuPy, for empty inputs too, as for a Dask source).
    plan = make_plan(a.nbytes, a.itemsize, budget=budget, slot_bytes=slot_bytes, threads=threads)
    staging = _staging_for(device, _device)  # without CuPy: ModuleNotFoundError, empty input too
    if a.size == 0:
        # Nothing to move: the identity (sum) or NumPy's error (max/min), from the core.
        return core.reduce(a, op, dtype=dtype)
    if threads is None and _dense_1d(a) is not None and staging.device.native:
        threads = max(1, min(_default_threads(), a.nbytes // NATIVE_BYTES_PER_THREAD))
        plan = make_plan(a.nbytes, a.itemsize, budget=budget, slot_bytes=slot_bytes, threads=threads)
    pipeline = staging.pipeline(plan.slot_bytes, budget)
    with pipeline.call():
        return pipeline.run(a, op, result, plan)


def _check_streamable(op: Op, dtype: np.dtype, result: np.dtype, acc: np.dtype) -> None:
    """Refuse what the pipeline would answer differently from :func:`multireduce.reduce`.

    ``dtype=`` converts each element first (as in :func:`multireduce.reduce`), and so do the
    pipeline's partials (:func:`_partials.of_array`). Where that conversion does not commute
    with adding in the accumulator (:func:`core._converts`: a float16 sum of int32, a float32
    sum of float64, an int32 sum of floats), each piece would need a converted copy on the
    device beside its slot, outside the staging budget (up to twice the slot for float16 to
    int32); those are refused rather than let the budget be exceeded.

    A product with a float result is refused too: where it overflows to inf before reaching a
    zero in one piece and meets a zero in another, the partials combine to ``inf * 0 = nan``,
    while multiplying in NumPy's order may reach the zero first and give 0.0 (or the
    reverse), so the answer would depend on how the input is cut (the int32 values 0-99
    with ``dtype=float64``: NumPy 0.0, the pipeline nan). Integer and bool products wrap
    modulo 2**64 in any order and stream.
    """
    if op.mpi_name == "PROD" and result.kind == "f":  # prod and nanprod
        raise NotImplementedError(
            f"stream.reduce cannot {op.name} {dtype} to a {result} result: a product that overflows to inf in one "
            "piece and is 0 in another combines to nan, where multiplying in NumPy's order may give 0.0 (or "
            "the reverse), so the result would depend on how the input is cut. Integer and bool products "
            "stream; for a float product use multireduce.reduce"
        )
    if core._converts(dtype, result, acc):
        raise NotImplementedError(
            f"stream.reduce cannot {op.name} {dtype} with dtype={result}: that converts every element to "
            f"{result} first, which adding in {acc} does not do, and a converted copy of each piece would not "
            f"fit the staging budget. Convert the source to {result} first, or use multireduce.reduce"
        )


def _staging_for(device: int | None, simulated: SimulatedDevice | None) -> _Staging:
    """The staging cache of the CUDA device ``device`` (None: CuPy's current one), or of the stand-in."""
    if simulated is not None:
        # One cache per stand-in, kept on it (tests make many); ``_pipelines`` is its pipelines.
        found = simulated.__dict__.get("_staging")
        if found is None:
            found = simulated.__dict__["_staging"] = _Staging(simulated)
            simulated.__dict__["_pipelines"] = found.pipelines
        return found
    return _cupy_staging(device)


def _reduce_dask(x, op: Op, dtype, device, budget, slot_bytes, threads, split_every, simulated) -> np.generic:
    from . import dask as mdask

    op, result, acc = mdask._plan(x, op, dtype)
    x = mdask._without_data_in_meta(x)  # as treereduce: a 0-d meta's NaN cast to int64 warned
    _check_streamable(op, x.dtype, result, acc)
    # Before the device, as every setting: the argument, or the dask.config key it falls back to.
    mdask._default_split_every(split_every, x, tuple(range(x.ndim)))
    nbytes = 0 if math.isnan(x.nbytes) else int(x.nbytes)
    plan = make_plan(nbytes, x.dtype.itemsize, budget=budget, slot_bytes=slot_bytes, threads=threads)
    staging = _staging_for(device, simulated)
    pipeline = staging.pipeline(plan.slot_bytes, budget)
    ref = pipeline if simulated is not None else ("cuda", pipeline.device.device, plan.slot_bytes, budget)
    call = (os.getpid(), next(_dask_call_numbers))
    state = _dask_calls[call] = _DaskCall()
    try:
        chunk = functools.partial(_dask_chunk, ref=ref, op=op, result=result, plan=plan, expected=x.dtype, call=call)
        name = f"stream-{op.name}"
        lazy = mdask._reduction(x, op, result, chunk, axis=None, keepdims=False, split_every=split_every, name=name)
        try:
            return pipeline.device.to_host(lazy.compute())
        except BaseException:
            state.stop()  # Dask raises while other tasks of the call may still be streaming
            raise
    finally:
        del _dask_calls[call]
