"""Partials that travel between tasks, and how they are combined.

A partial is one value in the accumulator dtype, an element count, and, for CuPy values, the
CUDA event that says when the value is ready.

The Dask layer and the streaming pipeline both produce partials on one thread (and CUDA
stream) and combine them on another. On one CUDA stream everything is ordered; across streams
two hazards need care, and this module is the one place that handles both:

* read after write: the consumer's stream waits on the producer's event before it reads;
* write after read: CuPy's memory pool hands a freed block back to the stream that allocated
  it, which may overwrite it before another stream has finished reading it. So a consumer that
  read partials produced on other streams synchronizes its own stream before it returns (and
  with that, before the inputs can be freed). Consumers on the producers' stream, the usual
  case of Dask's threads on CuPy's default stream, never synchronize.

The element count lets max/min of an empty *global* array raise as NumPy does, while empty
chunks contribute the op's identity.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import core
from .ops import Op, cast_result

__all__ = ["Partial", "combine", "finalize", "flatten", "of_array", "wrap"]

# cudaStreamPerThread: the same handle names a different stream in each host thread.
_PER_THREAD_STREAM = 2


def _cupy():
    return sys.modules["cupy"]


def _is_cupy(value: Any) -> bool:
    return type(value).__module__.startswith("cupy")


def mapped_host_memory(cupy: Any, nbytes: int) -> tuple[np.ndarray, int]:
    """``nbytes`` of pinned host memory mapped into every device's address space.

    Returns its bytes as a NumPy uint8 array (which keeps the allocation alive) and its
    device address. Kernels store partials there that the host then reads without a copy
    back (the streaming pipeline's cells, the MPI layer's slots), and the MPI layer's GPU
    results live there.
    """
    runtime = cupy.cuda.runtime
    flags = runtime.hostAllocPortable | runtime.hostAllocMapped
    pinned = cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(nbytes, flags), 0)
    host = np.frombuffer(pinned, dtype=np.uint8, count=nbytes)
    # Under unified addressing this is the host address itself; asked, not assumed.
    return host, runtime.pointerGetAttributes(host.ctypes.data).devicePointer


def mapped_scalar(cupy: Any, address: int, owner: Any, device: int, dtype: np.dtype):
    """A 0-d CuPy array of ``dtype`` on ``device`` over the mapped host memory at ``address``.

    ``owner`` (the bytes of :func:`mapped_host_memory`) is kept alive by the array.
    """
    memory = cupy.cuda.UnownedMemory(address, 8, owner, device)
    return cupy.ndarray((), dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))


#: The caches keyed by stream (each key holds a :func:`stream_id` and a device at known
#: positions), registered by their modules (:func:`stream_cache`) so that the entries of a
#: stream that has ended can be dropped (:func:`forget_streams`).
_stream_caches: list[tuple[dict, int, int]] = []


class _ThreadToken(threading.local):
    """A number of the calling thread's own, never given to another thread.

    ``threading.get_ident()`` is reused once a thread has ended: a new thread then shared the
    ended one's per-stream caches (partials, last-block counter) while its own per-thread
    default stream ran beside the old one's last kernels, and :func:`_gathered` took a
    partial of the old stream for one of its own, without waiting for it.
    """

    def __init__(self) -> None:
        self.value = next(_token_numbers)
        _token_threads[self.value] = weakref.ref(threading.current_thread())
        _forget_ended_threads()


_token_numbers = itertools.count(1)
_token_threads: dict[int, weakref.ref] = {}


def stream_cache(cache: dict, stream_at: int = 1, device_at: int = 0) -> dict:
    """Register ``cache``, whose keys hold a device at ``device_at`` and a :func:`stream_id` at ``stream_at``."""
    _stream_caches.append((cache, stream_at, device_at))
    return cache


def forget_streams(ids: set) -> None:
    """Drop every registered cache's entries for the streams ``ids`` (:func:`stream_id` values).

    The caller has made sure that no work of those streams is still running (their buffers go
    back to CuPy's pools).
    """
    for cache, at, _ in _stream_caches:
        for key in [k for k in list(cache) if k[at] in ids]:
            cache.pop(key, None)


def _forget_ended_threads() -> None:
    # The per-thread default streams of threads that have ended: their entries would stay for
    # ever (a process that starts threads in turn grew by each one's partials and counters).
    # Their last kernels may still be running, so each device concerned is synchronized first.
    ended = {t for t, ref in list(_token_threads.items()) if (ref() is None or not ref().is_alive())}
    if not ended:
        return
    ids = {(_PER_THREAD_STREAM, t) for t in ended}
    devices = {k[dev] for cache, at, dev in _stream_caches for k in list(cache) if k[at] in ids}
    if devices:
        _synchronize_devices(sorted(devices))
        forget_streams(ids)
    for t in ended:
        _token_threads.pop(t, None)


def _synchronize_devices(devices: list[int]) -> None:
    cupy = sys.modules.get("cupy")
    if cupy is None:  # never imported: no GPU work can be in flight (CPU stand-ins' keys)
        return
    for device in devices:
        with cupy.cuda.Device(device):
            cupy.cuda.runtime.deviceSynchronize()


def stream_id(ptr: int) -> int | tuple[int, int]:
    """A stream handle as a cache key, equal for two threads' handles exactly when they name one stream.

    Under CuPy's per-thread default stream, every thread's current stream has the handle
    ``cudaStreamPerThread`` and yet each thread's is its own stream; per-stream caches (the
    backend's workspaces) key those by thread as well, by a number no other thread gets
    (:class:`_ThreadToken`).
    """
    return (ptr, _thread_token.value) if ptr == _PER_THREAD_STREAM else ptr


_thread_token = _ThreadToken()


def _stream_key(cupy, device: int, stream) -> tuple:
    """A key equal for two (device, stream, thread) triples exactly when they name one stream."""
    return (device, stream_id(stream.ptr))


class Partial:
    """A partial result of ``n`` input elements.

    ``value`` is a NumPy scalar or a 0-d CuPy array in the accumulator dtype; for CuPy,
    ``event`` was recorded after it on the stream named by ``stream_key``.

    Pickling (distributed's transfers between workers) first waits for the event, then drops
    it: a CUDA event means nothing in another process, and the pickled value is complete.
    """

    __slots__ = ("event", "n", "stream_key", "value")

    def __init__(self, value: Any, n: int, event: Any = None, stream_key: tuple | None = None):
        self.value = value
        self.n = int(n)
        self.event = event
        self.stream_key = stream_key

    def __reduce__(self):
        if self.event is not None:
            self.event.synchronize()
        return (Partial, (self.value, self.n))

    def __repr__(self) -> str:
        return f"Partial(n={self.n}, dtype={self.value.dtype}, {type(self.value).__module__})"


def of_array(x: Any, op: Op, result: np.dtype):
    """Reduce ``x`` to its partial for a reduction to ``result`` with the core.

    The partial is in ``result``'s accumulator dtype. A ``result`` other than the op's own
    for ``x`` is ``dtype=``: each element is converted to it first, as :func:`core.partial`
    does. The work runs on ``x``'s device and, for CuPy, on the current stream.
    """
    if result == op.result_dtype(x.dtype):
        return core.partial(x, op)
    return core.partial(x, op, dtype=result)


def wrap(value: Any, n: int, stream: Any = None) -> Partial:
    """Make a :class:`Partial` of ``value``.

    A CuPy value gets an event recorded on ``stream`` (default: the current stream of the
    value's device), after the work that produced it.
    """
    if not _is_cupy(value):
        return Partial(value, n)
    cupy = _cupy()
    device = value.device.id
    with cupy.cuda.Device(device):
        if stream is None:
            stream = cupy.cuda.get_current_stream()
        event = cupy.cuda.Event(disable_timing=True)
        event.record(stream)
    return Partial(value, n, event, _stream_key(cupy, device, stream))


def flatten(parts: Any) -> list[Partial]:
    """List the partials in ``parts``, in order.

    ``parts`` is one partial or nested lists/tuples of them: what Dask hands ``combine`` and
    ``aggregate`` with ``concatenate=False``.
    """
    if isinstance(parts, Partial):
        return [parts]
    out: list[Partial] = []
    stack = [iter(parts)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, Partial):
                out.append(item)
            elif isinstance(item, list | tuple):
                stack.append(iter(item))
                break
            else:
                raise TypeError(f"expected multireduce partials, got {type(item).__module__}.{type(item).__qualname__}")
        else:
            stack.pop()
    return out


def _gathered(parts: Iterable[Partial], reduce_fn):
    """Stack the values of ``parts`` on their device and apply ``reduce_fn``.

    The stacking waits for producers on other streams first. Returns ``(result, n)``.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("no partials to combine")
    n = sum(p.n for p in parts)
    values = [p.value for p in parts]
    on_gpu = [_is_cupy(v) for v in values]
    if not any(on_gpu):
        # np.array of scalars: a twentieth of np.stack's time for 64 of them (a full reduction's
        # partials); np.stack for arrays, which it checks to have one shape.
        stacked = np.stack(values) if np.ndim(values[0]) else np.array(values)
        return reduce_fn(stacked), n
    if not all(on_gpu):
        raise TypeError(
            "cannot combine NumPy and CuPy partials; all chunks of one array must live on the host or all on GPUs"
        )
    cupy = _cupy()
    device = values[0].device.id
    if any(v.device.id != device for v in values):
        devices = sorted({v.device.id for v in values})
        raise NotImplementedError(
            f"partials live on GPUs {devices}; combining across GPUs in one process is not supported. "
            "Use one GPU per process (dask_cuda.LocalCUDACluster starts one worker per GPU)."
        )
    with cupy.cuda.Device(device):
        stream = cupy.cuda.get_current_stream()
        here = _stream_key(cupy, device, stream)
        foreign = False
        for p in parts:
            if p.stream_key != here:
                foreign = True
                if p.event is not None:
                    stream.wait_event(p.event)
        result = reduce_fn(cupy.stack(values))
        if foreign:
            # Write-after-read guard (see the module docstring): the inputs may be freed, and
            # their blocks reused by their own streams, as soon as this function returns.
            stream.synchronize()
    return result, n


def combine(parts: Any, op: Op) -> Partial:
    """Combine partials into one, in the accumulator dtype, on their device."""
    # Some ops combine with another op's rule (nansum and count_nonzero partials add up).
    value, n = _gathered(flatten(parts), lambda stacked: core.partial(stacked, op.combiner))
    return wrap(value, n)


def _as_dtype(value, dtype: np.dtype):
    # Only when needed: on the GPU every astype is a kernel launch.
    return value if value.dtype == dtype else cast_result(value, dtype)


def finalize(parts: Any, op: Op, result: np.dtype, *, keepdims_ndim: int | None = None):
    """The final value of dtype ``result`` from partials, on their device.

    Raises
    ------
    ValueError
        For max/min when the partials cover zero elements in total, as NumPy does.
    """
    parts = flatten(parts)
    total = sum(p.n for p in parts)
    if total == 0 and not op.empty_allowed:
        raise op.empty_error()
    # The partials are combined in their own (accumulator) dtype and converted once at the
    # end: dtype= would convert each partial first. max/min of float16 travel as float32
    # partials; converting back is exact.
    combiner = op.combiner
    value, _ = _gathered(parts, lambda stacked: _as_dtype(core.reduce(stacked, combiner), result))
    if keepdims_ndim is not None:
        value = value.reshape((1,) * keepdims_ndim)
    return value
