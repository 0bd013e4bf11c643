"""CPU stand-ins for the parts of CuPy that ``multireduce.mpi``'s result cells and slots use.

Shared by ``tests/test_mpi_local.py`` and ``mixed_shards.py`` (which runs under mpiexec on
ranks without a GPU). Pinned memory is host memory here, and a "device" pointer is its host
address, as under unified addressing: what a fake array reads through its pointer is what the
host stored.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np


class FakeUnownedMemory:
    """cupy.cuda.UnownedMemory's shape: a pointer, a size, an owner kept alive, a device."""

    def __init__(self, ptr, size, owner, device_id):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


class FakeMemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset

    def __add__(self, offset):  # as CuPy's: a new pointer holding the memory
        return FakeMemoryPointer(self.mem, self.ptr - self.mem.ptr + offset)


class FakeArray:
    """cupy.ndarray's references: ``data`` (its MemoryPointer) and, for views, ``base``."""

    def __init__(self, shape, dtype, memptr):
        self.shape, self.dtype, self.data, self.base = shape, np.dtype(dtype), memptr, None

    def view(self):
        out = FakeArray(self.shape, self.dtype, self.data)
        out.base = self
        return out

    def get(self):  # reads through the "device" pointer (the host address)
        return np.frombuffer(ctypes.string_at(self.data.ptr, self.dtype.itemsize), dtype=self.dtype)[0]


def _memcpy_async(dst, src, nbytes, kind, stream):
    ctypes.memmove(dst, src, nbytes)


def fake_cupy():
    """A stand-in ``cupy`` for mpi._ResultCells and the device combine's copy back (pinned memory is a bytearray)."""
    runtime = SimpleNamespace(
        hostAllocPortable=1,
        hostAllocMapped=2,
        memcpyDeviceToHost=2,
        pointerGetAttributes=lambda ptr: SimpleNamespace(devicePointer=ptr),
        memcpyAsync=_memcpy_async,
    )
    cuda = SimpleNamespace(
        runtime=runtime,
        PinnedMemory=lambda size, flags: bytearray(size),
        PinnedMemoryPointer=lambda memory, offset: memory,
        UnownedMemory=FakeUnownedMemory,
        MemoryPointer=FakeMemoryPointer,
    )
    return SimpleNamespace(cuda=cuda, ndarray=FakeArray)


class HostSlots:
    """A stand-in for mpi._Slots: an 8-byte host slot (``ptr``, ``host_view``) and result cells."""

    def __init__(self, mpi):
        self._slot = np.zeros(8, dtype=np.uint8)
        self.ptr = self._slot.ctypes.data
        self.results = mpi._ResultCells(0, fake_cupy())

    def device_partial(self, dtype):
        return np.zeros((), dtype)

    def host_view(self, dtype):
        return self._slot[: np.dtype(dtype).itemsize].view(dtype)
