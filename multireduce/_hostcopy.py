"""The native copy engine (``_native/hostcopy.c``): copy pieces into pinned memory and upload them.

The engine runs a whole job (every piece of one call) with the GIL released, on a pool of C
threads that take pieces from one atomic counter: each copies its piece from pageable memory
into a pinned staging buffer and queues its upload with the CUDA driver's
``cuMemcpyHtoDAsync_v2``. :mod:`multireduce.stream` uses it in place of its Python copy threads
(``stream.COPY_ENGINE``).

The C source ships with the package and is compiled on first use with the system C compiler
(``$CC``, else ``cc``) into a cache directory (``$MULTIREDUCE_CACHE_DIR``, else
``$XDG_CACHE_HOME/multireduce`` or ``~/.cache/multireduce``), under a name that includes a hash
of the source and the compile command, so that a changed source is rebuilt. Nothing is
downloaded and nothing but that file is loaded. :func:`load` raises :class:`NativeUnavailable`
with the compiler's message when it cannot be built.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

__all__ = [
    "PIECE_DTYPE",
    "STREAMING_STORES",
    "NativeUnavailable",
    "address",
    "cache_dir",
    "library_path",
    "loaded_path",
    "load",
    "stage",
]

SOURCE = Path(__file__).resolve().parent / "_native" / "hostcopy.c"
#: One piece, as the C engine reads it (``mr_piece``): source, pinned and device addresses,
#: byte count and CUDA stream.
PIECE_DTYPE = np.dtype([("src", "<u8"), ("staged", "<u8"), ("device", "<u8"), ("nbytes", "<u8"), ("stream", "<u8")])
#: ``flags`` bit: copy into pinned memory with non-temporal (streaming) stores.
STREAMING_STORES = 1
_CFLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-std=c11")
# The engine's own error codes (hostcopy.c's MR_ERR_*).
_ENGINE_ERRORS = {-1: "a copy thread could not be started", -2: "bad arguments to mr_stage"}


class NativeUnavailable(RuntimeError):
    """The native copy engine could not be built or loaded; the message says why."""


def cache_dir() -> Path:
    """Where the compiled engine is kept."""
    explicit = os.environ.get("MULTIREDUCE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "multireduce"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def library_path() -> Path:
    command = [*_compiler(), *_CFLAGS]
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update("\0".join(command).encode())
    name = f"hostcopy-{digest.hexdigest()[:16]}-{sys.platform}-{platform.machine()}.so"
    return cache_dir() / name


def _build(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a temporary name in the same directory and rename: concurrent first uses (MPI
    # ranks, Dask workers) never load a half-written file.
    fd, tmp = tempfile.mkstemp(prefix=target.stem + "-", suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    command = [*_compiler(), *_CFLAGS, "-o", tmp, str(SOURCE)]
    try:
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise NativeUnavailable(
                f"cannot build the native copy engine: running {shlex.join(command)!r} failed ({exc}); "
                "install a C compiler or set CC, or set multireduce.stream.COPY_ENGINE = 'python'"
            ) from exc
        if done.returncode != 0:
            raise NativeUnavailable(
                f"cannot build the native copy engine: {shlex.join(command)!r} exited with {done.returncode}:\n"
                f"{done.stderr.strip()}"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: Path | None = None  # where _lib was loaded from


def load() -> ctypes.CDLL:
    """Return the engine's library, building it first if the cache does not hold it.

    Raises
    ------
    NativeUnavailable
        If the library cannot be built or loaded.
    """
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not path.exists():
            _build(path)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise NativeUnavailable(f"cannot load the native copy engine {str(path)!r}: {exc}") from exc
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        lib.mr_stage.restype = ctypes.c_int
        lib.mr_stage.argtypes = [vp, sz, ctypes.c_int, ctypes.c_uint, vp, vp, vp, ctypes.POINTER(sz)]
        lib.mr_pool_workers.restype = ctypes.c_int
        lib.mr_pool_workers.argtypes = []
        lib.mr_test_configure.restype = None
        lib.mr_test_configure.argtypes = [ctypes.c_long, ctypes.c_int]
        lib.mr_test_calls.restype = ctypes.c_long
        lib.mr_test_calls.argtypes = []
        _lib, _lib_path = lib, path
        return lib


def loaded_path() -> Path:
    """The file :func:`load` loaded the engine from (loading it first if needed)."""
    load()
    return _lib_path


def address(lib: ctypes.CDLL, name: str) -> int:
    """The address of function ``name`` of ``lib``, to pass as a function pointer."""
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def stage(
    pieces: np.ndarray,
    threads: int,
    upload: int,
    *,
    setctx: int = 0,
    ctx: int = 0,
    flags: int = 0,
    describe=None,
) -> None:
    """Copy and upload every piece of ``pieces`` (a :data:`PIECE_DTYPE` array) on ``threads`` threads.

    Returns once every piece has been copied into its pinned buffer and its upload queued.
    ``upload`` is the address of a ``cuMemcpyHtoDAsync_v2``-like function, ``setctx`` and
    ``ctx`` make the caller's CUDA context current on the engine's threads (0: leave them).
    The GIL is released for the whole call.

    Raises
    ------
    RuntimeError
        On the first failed upload (later pieces are not copied); the message names the piece
        and the error, through ``describe(code)`` if given (a CUDA error name).
    """
    if pieces.dtype != PIECE_DTYPE or not pieces.flags.c_contiguous:
        raise TypeError("pieces must be a C-contiguous array of _hostcopy.PIECE_DTYPE")
    lib = load()
    failed = ctypes.c_size_t(0)
    rc = lib.mr_stage(
        pieces.ctypes.data,
        pieces.size,
        int(threads),
        int(flags),
        upload,
        setctx or None,
        ctx or None,
        ctypes.byref(failed),
    )
    if rc == 0:
        return
    if rc < 0:
        raise RuntimeError(f"native copy engine: {_ENGINE_ERRORS.get(rc, f'error {rc}')}")
    what = describe(rc) if describe is not None else f"error {rc}"
    if failed.value == ctypes.c_size_t(-1).value:
        raise RuntimeError(f"native copy engine: making the CUDA context current on a copy thread failed: {what}")
    p = pieces[failed.value]
    raise RuntimeError(
        f"native copy engine: the upload of piece {failed.value} ({int(p['nbytes'])} bytes) failed: {what}"
    )
