"""Sharding of a global length across ranks, and reading one rank's shard of a file.

Nothing here imports MPI: the functions take ``rank`` and ``size`` as plain integers, so that
the CLI and the tests can use them without starting MPI. :mod:`multireduce.mpi` re-exports
them with ``comm=`` conveniences.
"""

from __future__ import annotations

import ast
import errno
import math
import os
import re
import stat
import tokenize
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import _settings
from .ops import check_dtype

__all__ = [
    "FileLayout",
    "inspect_file",
    "inspect_npy",
    "read_shard",
    "shard_counts",
    "shard_range",
]

_NPY_MAGIC = b"\x93NUMPY"
# The longest header text np.load parses (its default max_header_size, read_array_header_*'s
# too): ast.literal_eval of longer text can take a long time or crash.
_MAX_HEADER_CHARS = 10_000
# np.load takes a file that starts with either as an .npz archive (a zip file).
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
# The most bytes a NumPy array may span (np.load refuses a shape beyond, even an empty one).
_MAX_BYTES = int(np.iinfo(np.intp).max)
# What parsing a damaged header can raise besides ValueError (NumPy's own complaints) and
# EOFError (a short file): ast.literal_eval's SyntaxError, the Python 2 header filter's
# tokenize.TokenError, TypeError from odd literals, and RecursionError or MemoryError from
# deeply nested ones (the header is at most NumPy's 10,000 characters, so these come from
# the parser's limits, not from a lack of memory).
_HEADER_ERRORS = (ValueError, EOFError, SyntaxError, TypeError, tokenize.TokenError, RecursionError, MemoryError)


def _check_length(n, what: str = "n") -> int:
    return _settings.integer(n, what, "a non-negative integer", low=0)


def _split(n, size) -> tuple[int, int, int]:
    """The checked split of ``n`` over ``size`` ranks: each holds ``base``, the first ``extra`` one more."""
    n = _check_length(n)
    size = _check_length(size, "size")
    if size == 0:
        raise ValueError("size must be at least 1")
    return *divmod(n, size), size


def shard_counts(n: int, size: int) -> list[int]:
    """Count the elements each of ``size`` ranks holds of a global length ``n``.

    The split is the block distribution of NumPy's ``array_split``: the first ``n % size``
    ranks hold one element more than the others.
    With ``n < size`` the last ``size - n`` ranks hold nothing.

    Raises
    ------
    TypeError, ValueError
        If ``n`` is not a non-negative integer or ``size`` not a positive one.

    Examples
    --------
    >>> shard_counts(10, 4)
    [3, 3, 2, 2]
    >>> shard_counts(2, 3)
    [1, 1, 0]
    """
    base, extra, size = _split(n, size)
    return [base + (r < extra) for r in range(size)]


def shard_range(n: int, rank: int, size: int) -> tuple[int, int]:
    """Return the half-open range ``[start, stop)`` of global indices that ``rank`` holds.

    The ranges of ranks ``0 .. size-1`` are contiguous, in rank order, and cover
    ``[0, n)`` exactly once; see :func:`shard_counts` for the split.

    Examples
    --------
    >>> [shard_range(10, r, 4) for r in range(4)]
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    base, extra, size = _split(n, size)  # without shard_counts's list of every rank's count
    rank = _check_length(rank, "rank")
    if rank >= size:
        raise ValueError(f"rank {rank} is out of range for {size} ranks")
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


@dataclass(frozen=True)
class FileLayout:
    """Where the elements of an array file are and what they are.

    Attributes
    ----------
    path : Path
    kind : {"npy", "raw"}
    dtype : numpy.dtype
    n : int
        Number of elements (all axes flattened: a full reduction does not need the shape).
    offset : int
        Byte offset of the first element.
    """

    path: Path
    kind: str
    dtype: np.dtype
    n: int
    offset: int


def _npy_header(fh) -> tuple[tuple[int, ...], np.dtype, int]:
    version = np.lib.format.read_magic(fh)
    # The header is a Python literal parsed with ast.literal_eval, never unpickled, so it is
    # safe to read even when the data would be pickled objects.
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        _check_header_length(fh, _MAX_HEADER_CHARS)  # Latin-1: a byte per character
        shape, _, dtype = np.lib.format.read_array_header_2_0(fh, max_header_size=_MAX_HEADER_CHARS)
    elif version == (3, 0):
        _check_header_length(fh, 4 * _MAX_HEADER_CHARS)  # UTF-8: up to 4 bytes per character
        shape, dtype = _npy_header_3_0(fh)
    else:
        raise ValueError(
            f"unsupported .npy format version {version} (1.0, 2.0 and 3.0 are; save the array again with numpy.save)"
        )
    return shape, dtype, fh.tell()


def _check_header_length(fh, limit: int) -> None:
    """Refuse a 2.0 or 3.0 header whose 4-byte length is past ``limit`` bytes, before reading it.

    NumPy reads the whole header (up to 4 GiB) before its own limit refuses it, and the 3.0
    path read it twice: a corrupt length made each rank hold the rest of the file.
    """
    start = fh.tell()
    size = fh.read(4)
    fh.seek(start)
    length = int.from_bytes(size, "little")
    if len(size) == 4 and length > limit:
        raise ValueError(
            f"its header says it is {length:,} bytes long, past the {limit:,} bytes of the longest header "
            f"read ({_MAX_HEADER_CHARS:,} characters; numpy.save writes a few hundred)"
        )


def _npy_header_3_0(fh) -> tuple[tuple[int, ...], np.dtype]:
    """Read a format 3.0 header as np.load does: 2.0's, but UTF-8 text, never Python 2's.

    NumPy has no public reader of it (read_array_header_2_0 decodes Latin-1 and retries a
    header that does not parse with its Python 2 filter, where np.load refuses such a 3.0
    file). The text is checked here, then read_array_header_2_0 makes NumPy's other checks:
    text that parses as UTF-8 parses the same as Latin-1, but for the characters in its
    strings and comments (the bytes of UTF-8's other characters are not quotes, backslashes
    or line ends), so the dtype is made from the UTF-8 reading (field names).
    """
    start = fh.tell()
    size = fh.read(4)
    raw = fh.read(int.from_bytes(size, "little"))
    header = None
    if len(size) == 4 and len(raw) == int.from_bytes(size, "little"):  # else read_array_header_2_0 says EOF
        text = raw.decode("utf-8")  # UnicodeDecodeError: np.load's error for such a file
        if len(text) <= _MAX_HEADER_CHARS:  # else read_array_header_2_0 refuses it unparsed
            try:
                header = ast.literal_eval(text)
            except SyntaxError as exc:
                raise ValueError(f"Cannot parse header: {text!r}") from exc
    fh.seek(start)
    shape, _, dtype = np.lib.format.read_array_header_2_0(fh, max_header_size=_MAX_HEADER_CHARS)
    if isinstance(header, dict):  # it is, with NumPy's keys, since read_array_header_2_0 took it
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    return shape, dtype


def _regular_size(path: Path) -> int:
    """The size of ``path``, which must be a regular file (checked before it is opened).

    Shards are read by offset and length, so a pipe (whose open would wait for a writer), a
    device (``/dev/zero`` has size 0) or a socket is refused rather than read as an empty or
    endless array. A directory raises :class:`IsADirectoryError`, as opening it would.
    """
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"{path} is not a regular file (a pipe, device or socket); multireduce reads input files "
            "by offset and size: save the data to a .npy or raw file first"
        )
    return st.st_size


def _npy_layout(path: Path, fh, size: int, dtype) -> FileLayout:
    """Check the header of the ``.npy`` file open as ``fh`` (at its start) against its size."""
    try:
        shape, file_dtype, offset = _npy_header(fh)
    except _HEADER_ERRORS as exc:
        detail = " ".join(str(exc).split()) or "(no detail)"  # one line, even for NumPy's long messages
        # ast's "malformed node or string: <ast.BinOp object at 0x7f...>": without the address,
        # every rank's message is the same, and rank 0 prints it once.
        detail = re.sub(r" object at 0x[0-9a-fA-F]+>", " object>", detail)
        raise ValueError(
            f"{path}: not a valid .npy file (truncated or corrupt header): {type(exc).__name__}: {detail}"
        ) from exc
    if file_dtype.hasobject:
        raise TypeError(
            f"{path} holds Python objects (dtype {file_dtype}); multireduce never unpickles data. "
            "Save a numeric array instead."
        )
    if file_dtype.names is not None:  # even one equal to a supported dtype (fields over its bytes)
        raise TypeError(
            f"{path} holds a structured dtype {file_dtype} (fields {', '.join(file_dtype.names)}), which "
            "multireduce does not support: save a plain numeric array (one field: numpy.load(path)[name])"
        )
    if file_dtype.byteorder == ">":  # a dtype multireduce supports in the other byte order?
        native = check_dtype(file_dtype.newbyteorder("="), what=f"{path}:")
        raise TypeError(
            f"{path} holds big-endian {native} data ({file_dtype.str}), which multireduce does not support (it "
            f"reads little-endian data): convert the file once, e.g. "
            f"numpy.save(path, numpy.load(path).astype('{native.str}'))"
        )
    file_dtype = check_dtype(file_dtype, what=f"{path}:")
    if dtype is not None and check_dtype(dtype) != file_dtype:  # checked as a raw file's dtype
        raise TypeError(f"{path} holds {file_dtype}, but dtype {np.dtype(dtype)} was requested")
    # NumPy's header check takes bools and negative numbers as dimensions, which np.load then
    # refuses; the products are taken in Python ints, which cannot overflow (an int64 product of
    # a corrupt shape can wrap to 0).
    corrupt = f"{path}: not a valid .npy file (truncated or corrupt header): shape {shape}"
    if any(type(d) is not int for d in shape):
        raise ValueError(f"{corrupt} has a dimension that is not an integer")
    if any(d < 0 for d in shape):
        raise ValueError(f"{corrupt} has a negative dimension")
    count = math.prod(shape)
    # np.load's limit: the bytes of the nonzero dimensions must fit an intp. A shape with
    # elements beyond it is longer than any file (below); an empty one is checked here.
    if not count and math.prod(d for d in shape if d) * file_dtype.itemsize > _MAX_BYTES:
        raise ValueError(f"{corrupt} is too big: its nonzero dimensions span more than {_MAX_BYTES} bytes")
    expected = offset + count * file_dtype.itemsize
    if size < expected:
        raise ValueError(
            f"{path} is truncated or its header is corrupt: the header promises shape {shape} of {file_dtype} "
            f"({expected} bytes), but the file has {size} bytes"
        )
    return FileLayout(path, "npy", file_dtype, count, offset)


def _probe(path: Path, dtype) -> tuple[FileLayout | None, bytes, int]:
    """Open the regular file ``path`` once: its checked ``.npy`` layout, its first bytes, its size.

    The layout is None for a file without the NumPy magic.
    """
    size = _regular_size(path)
    with open(path, "rb") as fh:
        head = fh.read(len(_NPY_MAGIC))
        fh.seek(0)
        return (_npy_layout(path, fh, size, dtype) if head == _NPY_MAGIC else None), head, size


def _refuse_archive(path: Path, head: bytes, advice: str) -> None:
    """Raise TypeError if the file ``path`` (without the NumPy magic) is an ``.npz`` archive.

    np.load takes a file that starts with a zip magic as an ``.npz`` archive, whatever its
    name; a file named ``*.npz`` is refused too (a damaged archive), rather than read as raw
    binary data.
    """
    if head.startswith(_ZIP_MAGICS):
        raise TypeError(f"{path} is an .npz archive (a zip of arrays), not a .npy file; {advice}")
    if path.suffix.lower() == ".npz":
        raise TypeError(f"{path} is named as an .npz archive but is not a zip file (damaged?); {advice}")


def _named_path(path: str | bytes | os.PathLike) -> Path:
    """``path`` (str, bytes or path-like, as np.load takes) as a Path; an empty one raises FileNotFoundError.

    ``Path("")`` is ".", a directory: ``read_shard("")`` raised ``IsADirectoryError: '.'``.
    """
    name = os.fsdecode(path)
    if not name:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory (an empty path)", name)
    return Path(name)


def inspect_npy(path: str | bytes | os.PathLike, dtype=None) -> FileLayout:
    """Read and check the layout of a ``.npy`` file without reading its data.

    The checks of :func:`inspect_file` for ``.npy`` files, for a file that must be one
    (:func:`multireduce.stream.reduce` opens its path sources with them).

    Parameters
    ----------
    path : str, bytes or path-like
    dtype : dtype, optional
        If given, it must equal the file's dtype.

    Returns
    -------
    FileLayout

    Raises
    ------
    FileNotFoundError, IsADirectoryError, PermissionError
        If the file cannot be opened.
    TypeError
        If the file is an ``.npz`` archive (a zip magic, or named ``*.npz``), holds Python
        objects (it is never unpickled) or a dtype multireduce does not support (big-endian
        data: the message says how to convert it), or ``dtype`` differs from the file's.
    ValueError
        If the file does not start with the NumPy magic string, its header is corrupt (a
        negative, bool or too big dimension included), or it is shorter than its header says.
    """
    path = _named_path(path)
    layout, head, _ = _probe(path, dtype)
    if layout is not None:
        return layout
    _refuse_archive(path, head, "pass one array or a .npy file")
    raise ValueError(f"{path} is not a .npy file (no NumPy magic)")


def inspect_file(path: str | bytes | os.PathLike, dtype=None, n: int | None = None) -> FileLayout:
    """Read the layout of a ``.npy`` or raw binary file without reading its data.

    A file is taken as ``.npy`` if it starts with the NumPy magic string, whatever its name;
    an ``.npz`` archive (a file that starts with a zip magic, or one named ``*.npz``) and a
    file named ``*.npy`` without the magic (damaged, or raw data misnamed) are refused;
    anything else is raw binary of ``dtype`` in native byte order.

    Parameters
    ----------
    path : str, bytes or path-like
    dtype : dtype, optional
        Required for raw files. For ``.npy`` files, if given, it must equal the file's dtype.
    n : int, optional
        For raw files, the number of elements to use (the file must hold at least ``n``);
        by default the whole file.

    Returns
    -------
    FileLayout

    Raises
    ------
    FileNotFoundError, IsADirectoryError, PermissionError
        If the file cannot be opened.
    TypeError
        If the file is an ``.npz`` archive (with or without ``dtype``), the ``.npy`` holds
        Python objects (it is never unpickled) or a dtype multireduce does not support
        (big-endian data: the message says how to convert it), or ``dtype`` differs from the
        ``.npy`` file's.
    ValueError
        If the file is truncated (shorter than its header says, or, for raw files, not a
        whole number of elements or shorter than ``n``), if a ``.npy`` header is corrupt (it
        does not parse, or its shape has a negative or bool dimension, more bytes than the
        file, or, empty, more than NumPy allows in its other dimensions), or if a raw file
        comes without ``dtype``, or if a file named ``*.npy`` does not start with the NumPy
        magic string.
    """
    path = _named_path(path)
    layout, head, size = _probe(path, dtype)
    if layout is not None:
        if n is not None:
            raise ValueError(
                f"{path} is a .npy file, which knows its length; n= (--n on the command line) applies to raw files only"
            )
        return layout
    _refuse_archive(path, head, "give one .npy file (save one array of it with numpy.save)")
    if path.suffix.lower() == ".npy":  # as for *.npz: not read as raw data, header bytes and all
        raise ValueError(
            f"{path} is named as a .npy file but does not start with the NumPy magic string (damaged, or raw "
            "data under a .npy name?); give raw binary data a name that does not end in .npy"
        )
    if dtype is None:
        raise ValueError(f"{path} is not a .npy file; give the dtype of its raw binary data (--dtype)")
    dt = check_dtype(dtype)  # refuses structured dtypes too, also one equal to a supported dtype
    if size % dt.itemsize:
        raise ValueError(
            f"{path} is truncated or not {dt} data: {size} bytes is not a whole number of {dt.itemsize}-byte elements"
        )
    available = size // dt.itemsize
    if n is None:
        n = available
    n = _check_length(n)
    if n > available:
        raise ValueError(f"{path} is truncated: {n} elements of {dt} requested, the file holds {available}")
    return FileLayout(path, "raw", dt, n, 0)


def read_shard(layout: FileLayout, rank: int, size: int) -> np.ndarray:
    """Read the elements ``rank`` holds (see :func:`shard_range`) into a new 1-d array.

    Only that slice is read from disk, with ``read`` calls straight into the new array (never
    through ``np.load``, so never unpickling, and never through a memory map: a file that
    shrinks after :func:`inspect_file` checked its size would kill a process that touches a
    mapped page past its new end with SIGBUS). Elements come in the file's memory order, which
    for a Fortran-order ``.npy`` is not C order; a full reduction does not depend on it.

    Raises
    ------
    OSError
        If the file cannot be opened or read.
    ValueError
        If the file ends before the slice does (it was truncated after it was inspected).
    """
    start, stop = shard_range(layout.n, rank, size)
    out = np.empty(stop - start, dtype=layout.dtype)
    if out.size:
        # Reading now makes it the "load" phase, and lets the file go.
        _read_exactly(layout.path, layout.offset + start * layout.dtype.itemsize, out.view(np.uint8))
    return out


def _read_exactly(path: Path, offset: int, buffer: np.ndarray) -> None:
    """Fill ``buffer`` (uint8) with the bytes of ``path`` from ``offset``, or raise ValueError."""
    view = memoryview(buffer)
    done = 0
    with open(path, "rb", buffering=0) as fh:
        fh.seek(offset)
        while done < len(view):
            got = fh.readinto(view[done:])  # Linux reads at most 2 GiB - 4 KiB per call
            if not got:
                raise ValueError(
                    f"{path} is truncated: this rank reads bytes {offset} to {offset + len(view)}, but the file now "
                    f"has {os.fstat(fh.fileno()).st_size} bytes (it shrank after its size was checked)"
                )
            done += got
