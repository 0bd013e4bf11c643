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
when it cannot be built or loaded, with the compiler's message or the file-system error
(chained) and the setting to change; a failure is remembered for the rest of the process,
per compiler and cache directory, so that a failing build is not run again on every call.
"""

from __future__ import annotations

import contextlib
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

from . import _settings

__all__ = [
    "MAX_THREADS",
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
#: byte count and CUDA stream. Aligned as the C struct (8 bytes), so that ``flags.aligned``
#: tells whether C may read a table in place.
PIECE_DTYPE = np.dtype(
    [("src", "<u8"), ("staged", "<u8"), ("device", "<u8"), ("nbytes", "<u8"), ("stream", "<u8")], align=True
)
#: ``flags`` bit: copy into pinned memory with non-temporal (streaming) stores.
STREAMING_STORES = 1
#: The most threads one :func:`stage` call takes (``MR_MAX_THREADS`` in the C source).
MAX_THREADS = 256
_CFLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-std=c11")
# The engine's own error codes (hostcopy.c's MR_ERR_*).
_ENGINE_ERRORS = {-2: "bad arguments to mr_stage"}


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
    cc = os.environ.get("CC") or "cc"
    try:
        return shlex.split(cc)
    except ValueError as exc:  # an unclosed quote
        raise NativeUnavailable(
            f"cannot build the native copy engine: CC={cc!r} is not a command line ({exc}); "
            "fix CC, or set multireduce.stream.COPY_ENGINE = 'python'"
        ) from exc


def library_path() -> Path:
    """Where the engine built from this source with this compiler is kept (:func:`cache_dir`).

    Raises
    ------
    NativeUnavailable
        If the C source cannot be read (a broken install).
    """
    command = [*_compiler(), *_CFLAGS]
    try:
        digest = hashlib.sha256(SOURCE.read_bytes())
    except OSError as exc:
        raise NativeUnavailable(
            f"cannot build the native copy engine: its C source {str(SOURCE)!r} cannot be read ({exc}); "
            "reinstall multireduce, or set multireduce.stream.COPY_ENGINE = 'python'"
        ) from exc
    digest.update("\0".join(command).encode())
    name = f"hostcopy-{digest.hexdigest()[:16]}-{sys.platform}-{platform.machine()}.so"
    return cache_dir() / name


def _cache_dir_error(what: str, path: Path, exc: OSError) -> NativeUnavailable:
    """The error for a cache directory that cannot hold the engine, naming the setting to change."""
    default = (
        ""
        if os.environ.get("MULTIREDUCE_CACHE_DIR")
        else " (it is not set: the default is under XDG_CACHE_HOME or ~/.cache)"
    )
    return NativeUnavailable(
        f"cannot build the native copy engine: {what} {str(path)!r} failed ({exc}); set MULTIREDUCE_CACHE_DIR to "
        f"a writable directory{default}, or set multireduce.stream.COPY_ENGINE = 'python'"
    )


def _build(target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cache_dir_error("making the cache directory", target.parent, exc) from exc
    # Compile to a temporary name in the same directory and rename: concurrent first uses (MPI
    # ranks, Dask workers) never load a half-written file.
    try:
        fd, tmp = tempfile.mkstemp(prefix=target.stem + "-", suffix=".so.tmp", dir=target.parent)
    except OSError as exc:
        raise _cache_dir_error("writing into the cache directory", target.parent, exc) from exc
    os.close(fd)
    command = [*_compiler(), *_CFLAGS, "-o", tmp, str(SOURCE)]
    try:
        try:
            done = subprocess.run(command, capture_output=True, text=True, errors="replace", check=False)
        except OSError as exc:
            raise NativeUnavailable(
                f"cannot build the native copy engine: running {shlex.join(command)!r} failed ({exc}); "
                "install a C compiler or set CC, or set multireduce.stream.COPY_ENGINE = 'python'"
            ) from exc
        if done.returncode != 0:
            raise NativeUnavailable(
                f"cannot build the native copy engine: {shlex.join(command)!r} exited with {done.returncode}:\n"
                f"{done.stderr.strip()}\n(fix the compiler or set CC, or set multireduce.stream.COPY_ENGINE = 'python')"
            )
        try:
            # Readable by every user of a shared cache (mkstemp made it 0600; 0755, as an
            # installed extension module), on disk before its name (a short file after a crash
            # made the loader fault: SIGBUS), and its digest beside it, which _open checks.
            os.chmod(tmp, 0o755)
            with open(tmp, "rb") as built:
                digest = hashlib.sha256(built.read()).hexdigest()
                os.fsync(built.fileno())
            _write_atomically(_digest_path(target), digest)
            os.replace(tmp, target)
        except OSError as exc:
            raise _cache_dir_error("renaming the built library to", target, exc) from exc
    finally:
        _discard(tmp)


def _discard(tmp: str) -> None:
    """Remove the temporary file ``tmp``, unless it was renamed into place."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


def _digest_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + "-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        _discard(tmp)


def _intact(path: Path) -> bool:
    """Whether the library at ``path`` has the digest written beside it when it was built.

    A file cut short (a crash before it reached the disk, a partial copy of the cache) made
    the dynamic loader map pages past its end, and the process died of SIGBUS before any
    Python error; one without its digest (another version's, or a foreign file) is rebuilt too.
    """
    try:
        want = _digest_path(path).read_text().strip()
        got = hashlib.sha256(path.read_bytes()).hexdigest()
    except (OSError, UnicodeDecodeError):
        return False
    return got == want


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: Path | None = None  # where _lib was loaded from
# The first failure of each configuration (compiler command, cache directory), remembered for the
# rest of the process: a build that failed is not run again on every call.
_failures: dict[tuple, NativeUnavailable] = {}


def _configuration() -> tuple:
    return (os.environ.get("CC") or "cc", str(cache_dir()))


def load() -> ctypes.CDLL:
    """Return the engine's library, building it first if the cache does not hold it.

    A failure is remembered: later calls in this process with the same compiler (``$CC``) and
    cache directory raise the same error at once, without building again; changing either
    setting tries again.

    Raises
    ------
    NativeUnavailable
        If the library cannot be built or loaded (the cause chained), or could not earlier in
        this process with the same settings.
    """
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        key = _configuration()
        first = _failures.get(key)
        if first is not None:
            again = NativeUnavailable(*first.args)
            raise again from first.__cause__
        try:
            lib, path = _open()
        except NativeUnavailable as exc:
            _failures[key] = exc
            raise
        _lib, _lib_path = lib, path
        return lib


def _open() -> tuple[ctypes.CDLL, Path]:
    path = library_path()
    try:
        present = path.exists()
    except OSError as exc:
        raise _cache_dir_error("looking up the library in the cache directory at", path, exc) from exc
    if not present or not _intact(path):
        _build(path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeUnavailable(
            f"cannot load the native copy engine {str(path)!r}: {exc}; delete the file to rebuild it, set "
            "MULTIREDUCE_CACHE_DIR to another directory, or set multireduce.stream.COPY_ENGINE = 'python'"
        ) from exc
    try:
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        lib.mr_stage.restype = ctypes.c_int
        lib.mr_stage.argtypes = [vp, sz, ctypes.c_int, ctypes.c_uint, vp, vp, vp, ctypes.POINTER(sz)]
        lib.mr_pool_workers.restype = ctypes.c_int
        lib.mr_pool_workers.argtypes = []
        lib.mr_test_configure.restype = None
        lib.mr_test_configure.argtypes = [ctypes.c_long, ctypes.c_int]
        lib.mr_test_calls.restype = ctypes.c_long
        lib.mr_test_calls.argtypes = []
        lib.mr_max_threads.restype = ctypes.c_int
        lib.mr_max_threads.argtypes = []
    except AttributeError as exc:  # a file of that name that is not this engine
        raise NativeUnavailable(
            f"cannot load the native copy engine {str(path)!r}: it lacks a function ({exc}); delete the file to "
            "rebuild it, or set MULTIREDUCE_CACHE_DIR to another directory"
        ) from exc
    return lib, path


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
    TypeError
        If ``pieces`` is not a 1-d, C-contiguous :data:`PIECE_DTYPE` array, or ``threads``,
        ``flags``, ``upload``, ``setctx`` or ``ctx`` not an integer.
    ValueError
        If ``threads`` is not from 1 to :data:`MAX_THREADS`, ``flags`` has a bit other than
        :data:`STREAMING_STORES`, ``upload`` is not positive, or ``setctx`` or ``ctx`` negative.
    RuntimeError
        On the first failed upload (later pieces are not copied); the message names the piece
        and the error, through ``describe(code)`` if given (a CUDA error name).
    """
    if (
        not isinstance(pieces, np.ndarray)
        or pieces.dtype != PIECE_DTYPE
        or not pieces.flags.c_contiguous
        or not pieces.flags.aligned
    ):
        # C reads the uint64 fields in place: a table at an odd address is undefined behaviour there.
        raise TypeError("pieces must be a C-contiguous, 8-byte aligned array of _hostcopy.PIECE_DTYPE")
    if pieces.ndim != 1:
        raise TypeError(f"pieces must be a 1-d array of _hostcopy.PIECE_DTYPE, got {pieces.ndim} dimensions")
    # ctypes would pass a str's characters (or a float's bits) as a function's address.
    upload = _settings.integer(upload, "upload", "the address of an upload function (a positive integer)", low=1)
    setctx = _settings.integer(
        0 if setctx is None else setctx, "setctx", "the address of a context function, or 0 for none", low=0
    )
    ctx = _settings.integer(0 if ctx is None else ctx, "ctx", "the address of a CUDA context, or 0 for none", low=0)
    # Checked here: ctypes would cut a larger Python int to the C int's low bits.
    threads = _settings.integer(threads, "threads", f"an integer from 1 to {MAX_THREADS}", low=1, high=MAX_THREADS)
    accepted = f"0 or STREAMING_STORES ({STREAMING_STORES})"
    flags = _settings.integer(flags, "flags", accepted)
    if flags not in (0, STREAMING_STORES):
        raise ValueError(f"flags must be {accepted}, got {flags}")
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
