"""multireduce._shards: damaged ``.npy`` headers are reported as such, naming the file.

inspect_file (the CLI's and mpi.read_shard's) and inspect_npy (stream.reduce's) share the
header checks: a header that does not parse, or whose shape is negative or promises more bytes
than the file holds (an int64 product of such a shape can wrap to 0 or below), raises one
ValueError that names the file, never NumPy's or the tokenizer's bare exception.
"""

from __future__ import annotations

import io
import os
import random
import re
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from multireduce._shards import inspect_file, inspect_npy, read_shard, shard_counts, shard_range

CORRUPT = "not a valid .npy file (truncated or corrupt header)"


def write_npy(path, header: str | bytes, data: bytes = b"\0" * 16, version: int = 1):
    """Write a .npy file with the given header text (padded as NumPy pads it) and data."""
    h = header.encode("latin1") if isinstance(header, str) else header
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + len(h).to_bytes(2, "little") + h + data)
    return path


def header(shape, descr="<f4") -> str:
    return repr({"descr": descr, "fortran_order": False, "shape": shape})


@pytest.mark.parametrize("inspect", [inspect_file, inspect_npy], ids=["inspect_file", "inspect_npy"])
@pytest.mark.parametrize(
    "shape",
    [
        (2**62, 4),  # 2**64 elements: the int64 product wraps to 0
        (2**62, 3),  # wraps to a negative count
        (2**31, 2**31, 2**2),
        (2**40,),  # no overflow, just far more than the file
        (5,),  # 20 bytes of float32, 16 in the file
    ],
)
def test_shape_larger_than_the_file(tmp_path, inspect, shape):
    path = write_npy(tmp_path / "big.npy", header(shape))
    expected = 128 + int(np.prod(shape, dtype=object)) * 4
    with pytest.raises(ValueError) as info:
        inspect(path)
    message = str(info.value)
    assert message.startswith(f"{path} is truncated or its header is corrupt: "), message
    assert f"the header promises shape {shape} of float32 ({expected} bytes), but the file has 144 bytes" in message


@pytest.mark.parametrize("inspect", [inspect_file, inspect_npy], ids=["inspect_file", "inspect_npy"])
@pytest.mark.parametrize("shape", [(-1,), (4, -1), (-2, -2), (0, -1)])
def test_negative_dimension(tmp_path, inspect, shape):
    path = write_npy(tmp_path / "neg.npy", header(shape))
    with pytest.raises(ValueError, match=r"neg\.npy: not a valid \.npy file \(truncated or corrupt header\): shape"):
        inspect(path)


def test_header_that_fits_the_file_is_accepted(tmp_path):
    path = write_npy(tmp_path / "ok.npy", header((2, 2)))
    for inspect in (inspect_file, inspect_npy):
        layout = inspect(path)
        assert (layout.kind, layout.dtype, layout.n, layout.offset) == ("npy", np.dtype("<f4"), 4, 128)
    # The largest empty shape np.load takes (the other dimensions' bytes fit an intp).
    assert inspect_file(write_npy(tmp_path / "zero.npy", header((0, 2**61 - 1)), b"")).n == 0


def _numpy_refuses(path) -> bool:
    try:
        np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, TypeError, OverflowError):
        return True
    return False


@pytest.mark.parametrize("inspect", [inspect_file, inspect_npy], ids=["inspect_file", "inspect_npy"])
@pytest.mark.parametrize(
    ("shape", "descr"),
    [
        ((True, 4), "<f4"),  # bool is an int to Python, not to np.load ("an integer is required")
        ((4, False), "<f4"),  # read as 0 elements
        ((0, 2**61), "<f4"),  # 2**63 bytes beside the zero: "array is too big"
        ((0, 2**63 - 1), "<f4"),
        ((2**64, 0), "|u1"),  # more than an intp
        ((0, 2**62, 2**62), "|u1"),
    ],
)
def test_shapes_numpy_refuses_are_refused(tmp_path, inspect, shape, descr):
    # An empty shape whose other dimensions are absurd was read as 0 elements (n=0), and
    # bool dimensions as 1 and 0; np.load refuses all of them.
    path = write_npy(tmp_path / "odd.npy", header(shape, descr))
    assert _numpy_refuses(path)
    with pytest.raises(ValueError, match=rf"^{re.escape(f'{path}: {CORRUPT}: shape {shape}')}"):
        inspect(path)


@pytest.mark.parametrize(
    ("shape", "descr"), [((0, 2**61 - 1), "<f4"), ((0, 2**63 - 1), "|u1"), ((2**62 - 1, 0), "<f2")]
)
def test_largest_empty_shapes_numpy_takes_are_taken(tmp_path, shape, descr):
    path = write_npy(tmp_path / "empty.npy", header(shape, descr), b"")
    assert np.load(path, mmap_mode="r", allow_pickle=False).shape == shape
    for inspect in (inspect_file, inspect_npy):
        assert inspect(path).n == 0


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "(" * 500, "TokenError"),
        ("(" * 500, "TokenError"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': " + "1+" * 4000 + "1}", "RecursionError"),
        ("-" * 9000 + "1", "MemoryError|RecursionError"),  # the parser's limit, by Python version
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (4,)", "TokenError"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (04,)}", "SyntaxError|ValueError"),
        ("{'descr': 5, 'fortran_order': False, 'shape': (4,)}", "ValueError"),
        ("[1, 2]", "ValueError"),
    ],
)
def test_garbled_header(tmp_path, text, cause):
    path = write_npy(tmp_path / "garbled.npy", text)
    for inspect in (inspect_file, inspect_npy):
        with pytest.raises(ValueError, match=rf"^{re.escape(f'{path}: {CORRUPT}: ')}({cause}): "):
            inspect(path)


def test_overwritten_header_bytes(tmp_path):
    # The reviewer's case: bytes 10..20 of a good file overwritten; NumPy's Python 2 header
    # filter then raised a bare tokenize.TokenError without the file name.
    np.save(tmp_path / "good.npy", np.arange(10, dtype=np.float32))
    raw = bytearray((tmp_path / "good.npy").read_bytes())
    raw[10:20] = b"garbage{{{"
    path = tmp_path / "corrupt_header.npy"
    path.write_bytes(bytes(raw))
    for inspect in (inspect_file, inspect_npy):
        with pytest.raises(ValueError, match=r"corrupt_header\.npy: not a valid \.npy file .*TokenError"):
            inspect(path)


@pytest.mark.parametrize("version", [2, 3])
def test_a_header_length_past_the_limit_is_refused_before_it_is_read(tmp_path, version):
    # A corrupt 4-byte length made the 3.0 path read the rest of the file twice (NumPy's
    # reader once more), so each rank of a job held up to 8 GiB before the error.
    path = tmp_path / f"long_header_v{version}.npy"
    path.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + (0xFFFFFFF0).to_bytes(4, "little") + bytes(64))
    reads = []
    real_open = open

    class Counting(io.FileIO):
        def read(self, size=-1):
            reads.append(size)
            return super().read(size)

    def counting_open(file, mode="r", *args, **kwargs):
        return Counting(file, "rb") if Path(file) == path and "b" in mode else real_open(file, mode, *args, **kwargs)

    for inspect in (inspect_file, inspect_npy):
        reads.clear()
        with mock.patch("builtins.open", counting_open), pytest.raises(ValueError) as caught:
            inspect(path)
        assert f"{path}: {CORRUPT}: " in str(caught.value), caught.value
        assert "its header says it is 4,294,967,280 bytes long" in str(caught.value), caught.value
        assert all(0 <= size <= 64 for size in reads), reads
    # An ordinary file is still read.
    np.save(tmp_path / "good.npy", np.arange(3.0))
    assert inspect_file(tmp_path / "good.npy").n == 3


# Damaged headers make NumPy warn (Python 2 header filter) and the parser (escape sequences).
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::SyntaxWarning")
@pytest.mark.parametrize("version", [(1, 0), (3, 0)])
def test_random_header_damage_is_always_named(tmp_path, version):
    # Whatever a damaged header holds, the answer is the layout or a ValueError / TypeError
    # (unsupported dtype) that names the file: never another exception type.
    with open(tmp_path / "good.npy", "wb") as fh:
        np.lib.format.write_array(fh, np.arange(10, dtype=np.float32), version=version)
    good = (tmp_path / "good.npy").read_bytes()
    end = (10 if version == (1, 0) else 12) + int.from_bytes(good[8 : 10 if version == (1, 0) else 12], "little")
    alphabet = b"(){}[]'\",:-0123456789abcdefLjx <>|\\\n#."
    rng = random.Random(20240611)
    path = tmp_path / "damaged.npy"
    for _ in range(400):
        raw = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(8, end)] = rng.choice(alphabet) if rng.random() < 0.8 else rng.randrange(256)
        path.write_bytes(bytes(raw))
        for inspect in (inspect_file, inspect_npy):
            try:
                inspect(path)
            except (ValueError, TypeError) as exc:
                assert "damaged.npy" in str(exc) and "\n" not in str(exc), (bytes(raw[:end]), exc)


def test_inspect_npy_needs_a_npy_file(tmp_path):
    (tmp_path / "text.txt").write_text("hello world\n")
    with pytest.raises(ValueError, match=r"text\.txt is not a \.npy file \(no NumPy magic\)"):
        inspect_npy(tmp_path / "text.txt")
    np.savez(tmp_path / "two.npz", a=np.ones(3))
    with pytest.raises(TypeError, match=r"two\.npz is an \.npz archive"):
        inspect_npy(tmp_path / "two.npz")
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        inspect_npy(tmp_path / "missing.npy")
    np.save(tmp_path / "obj.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    with pytest.raises(TypeError, match="holds Python objects"):
        inspect_npy(tmp_path / "obj.npy")
    np.save(tmp_path / "f8.npy", np.arange(3.0))
    with pytest.raises(TypeError, match="holds float64, but dtype float32 was requested"):
        inspect_npy(tmp_path / "f8.npy", dtype="float32")


@pytest.mark.parametrize("inspect", [lambda p: inspect_file(p, dtype="float32"), inspect_npy])
def test_files_that_are_not_regular_are_refused(tmp_path, inspect):
    # A FIFO would block the open until a writer came; /dev/zero has size 0 and never ends.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        if not os.path.exists(path):
            continue
        with pytest.raises(ValueError, match=r"is not a regular file \(a pipe, device or socket\)"):
            inspect(path)
    with pytest.raises(IsADirectoryError):
        inspect(tmp_path)


# ---------------------------------------------------------------------------------- archives


@pytest.mark.parametrize("dtype", [None, "int8", "float64"])
def test_npz_archives_are_refused_with_or_without_dtype(tmp_path, dtype):
    # The bytes of an archive were summed as raw int8 data (exit status 0); without a dtype
    # the error asked for the dtype of its "raw binary data".
    np.savez(tmp_path / "z.npz", a=np.arange(1000.0))
    np.savez_compressed(tmp_path / "c.npz", a=np.ones(3))
    (tmp_path / "renamed.bin").write_bytes((tmp_path / "z.npz").read_bytes())  # np.load goes by the magic
    (tmp_path / "empty.npz").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: the other magic
    (tmp_path / "broken.npz").write_bytes(b"\0" * 64)  # named .npz, no zip magic
    for name in ("z.npz", "c.npz", "renamed.bin", "empty.npz"):
        path = tmp_path / name
        with pytest.raises(TypeError) as info:
            inspect_file(path, dtype=dtype)
        assert str(info.value) == (
            f"{path} is an .npz archive (a zip of arrays), not a .npy file; "
            "give one .npy file (save one array of it with numpy.save)"
        )
        with pytest.raises(TypeError, match=rf"^{re.escape(str(path))} is an \.npz archive .*pass one array"):
            inspect_npy(path)
    with pytest.raises(TypeError, match=r"broken\.npz is named as an \.npz archive but is not a zip file"):
        inspect_file(tmp_path / "broken.npz", dtype=dtype)
    # Raw data and .npy files are still read whatever their names.
    np.arange(8, dtype=np.int8).tofile(tmp_path / "raw.bin")
    assert inspect_file(tmp_path / "raw.bin", dtype="int8").n == 8
    np.save(tmp_path / "a.npy", np.arange(5.0))
    (tmp_path / "a.npy").rename(tmp_path / "npy_named.npz")
    assert inspect_file(tmp_path / "npy_named.npz").n == 5


class _Payload:
    """Unpickling an instance creates the file ``marker`` (as a malicious pickle could)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("dtype", [object, [("a", "<i4"), ("b", object)]], ids=["object", "struct-with-object"])
def test_pickled_objects_are_refused_without_unpickling(tmp_path, dtype):
    marker = tmp_path / "unpickled"
    arr = np.empty(2, dtype=dtype)
    if arr.dtype.names:
        arr["b"] = [_Payload(marker), _Payload(marker)]
    else:
        arr[:] = [_Payload(marker), _Payload(marker)]
    np.save(tmp_path / "obj.npy", arr, allow_pickle=True)
    for inspect in (inspect_file, inspect_npy, lambda p: inspect_file(p, dtype="int8")):
        with pytest.raises(TypeError, match=r"obj\.npy holds Python objects .*multireduce never unpickles data"):
            inspect(tmp_path / "obj.npy")
    assert not marker.exists()
    np.load(tmp_path / "obj.npy", allow_pickle=True)  # the payload works: loading it would run it
    assert marker.exists()


# ---------------------------------------------------------------------------------- reading


def test_read_shard_reads_the_slices_of_npy_and_raw_files(tmp_path):
    rng = np.random.default_rng(3)
    for dtype in ("float16", "float64", "int8", "uint64", "bool"):
        data = rng.integers(0, 100, (7, 11)).astype(dtype)
        for order in ("C", "F"):
            np.save(tmp_path / "a.npy", np.asarray(data, order=order))
            layout = inspect_file(tmp_path / "a.npy")
            parts = [read_shard(layout, r, 4) for r in range(4)]
            assert all(p.dtype == np.dtype(dtype) and p.flags.owndata for p in parts)
            # Memory order: C order, or the transpose's C order for a Fortran-order file.
            expected = data.ravel() if order == "C" else data.T.ravel()
            assert np.concatenate(parts).tolist() == expected.tolist()
        data.tofile(tmp_path / "a.raw")
        layout = inspect_file(tmp_path / "a.raw", dtype=dtype, n=60)
        assert np.concatenate([read_shard(layout, r, 3) for r in range(3)]).tolist() == data.ravel()[:60].tolist()


# The file shrinks after inspect_file checked its size: before read_shard (np.load's memory map
# then failed with mmap's "mmap length is greater than file size", naming no file) or while
# read_shard copies it (the copy from the memory map touched a page past the new end: SIGBUS
# killed the process). Subprocesses, so that a signal fails the test instead of pytest.
TRUNCATE_AFTER_INSPECT = """
import os, sys
import numpy as np
from multireduce._shards import inspect_file, read_shard
path, kind = sys.argv[1], sys.argv[2]
if kind == "npy":
    np.save(path, np.ones(1 << 20))
    layout = inspect_file(path)
else:
    np.ones(1 << 20).tofile(path)
    layout = inspect_file(path, dtype="float64")
os.truncate(path, 4096)
failed = 0
for rank in (0, 1):  # rank 0's slice ends past the new end, rank 1's starts past it
    try:
        read_shard(layout, rank, 2)
    except ValueError as exc:
        print(exc)
        failed += 1
sys.exit(7 if failed == 2 else 1)
"""


@pytest.mark.parametrize("kind", ["npy", "raw"])
def test_file_truncated_after_inspection_names_the_file(tmp_path, kind):
    import subprocess
    import sys

    path = tmp_path / f"t.{kind}"
    done = subprocess.run(
        [sys.executable, "-c", TRUNCATE_AFTER_INSPECT, str(path), kind], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 7, (done.returncode, done.stdout, done.stderr)  # -7: SIGBUS
    half = (1 << 19) * 8
    offset = 128 if kind == "npy" else 0
    assert done.stdout.splitlines() == [
        f"{path} is truncated: this rank reads bytes {start} to {start + half}, but the file now has 4096 bytes "
        "(it shrank after its size was checked)"
        for start in (offset, offset + half)
    ]


TRUNCATE_WHILE_READING = """
import os, sys, threading, time
import numpy as np
from multireduce._shards import inspect_file, read_shard
path, kind = sys.argv[1], sys.argv[2]
data = np.arange(8 << 20, dtype=np.float64)  # 64 MiB: the read takes milliseconds
outcomes = []
for attempt in range(5):
    if kind == "npy":
        np.save(path, data)
        layout = inspect_file(path)
    else:
        data.tofile(path)
        layout = inspect_file(path, dtype="float64")
    go = threading.Event()
    def shrink():
        go.wait()
        time.sleep(0.001 * (attempt + 1))
        os.truncate(path, 4096)
    thread = threading.Thread(target=shrink)
    thread.start()
    go.set()
    try:
        x = read_shard(layout, 0, 1)
    except ValueError as exc:
        assert str(exc).startswith(f"{path} is truncated: this rank reads bytes "), exc
        outcomes.append("error")
    else:  # the read was done before the file shrank
        assert np.array_equal(x, data)
        outcomes.append("read")
    thread.join()
print(outcomes)
"""


@pytest.mark.parametrize("kind", ["npy", "raw"])
def test_file_truncated_while_it_is_read_is_an_error_not_sigbus(tmp_path, kind):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", TRUNCATE_WHILE_READING, str(tmp_path / f"t.{kind}"), kind],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)  # -7: SIGBUS (the old memory map)


# ---------------------------------------------------------------------------------- names


@pytest.mark.parametrize("dtype", [None, "float32", "int8"])
@pytest.mark.parametrize("name", ["data.npy", "DATA.NPY"])
@pytest.mark.parametrize(
    "content",
    [
        b"",  # an empty (never written) .npy
        np.arange(8, dtype=np.float32).tobytes(),  # raw data under a .npy name
        b"\0NUMPY\x01\x00" + b"\0" * 120,  # a damaged magic
    ],
    ids=["empty", "raw", "damaged-magic"],
)
def test_npy_named_file_without_the_magic_is_refused(tmp_path, dtype, name, content):
    # With a dtype, its bytes (the header's too) were summed as raw data, exit status 0; np.load
    # refuses such a file. Without one, the error asked for the dtype of its raw data.
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises((ValueError, EOFError)):
        np.load(path, mmap_mode="r", allow_pickle=False)
    message = (
        f"{path} is named as a .npy file but does not start with the NumPy magic string (damaged, or raw "
        "data under a .npy name?); give raw binary data a name that does not end in .npy"
    )
    with pytest.raises(ValueError) as info:
        inspect_file(path, dtype=dtype)
    assert str(info.value) == message
    with pytest.raises(ValueError) as info:
        inspect_npy(path, dtype=dtype)
    assert str(info.value) == f"{path} is not a .npy file (no NumPy magic)"


# ---------------------------------------------------------------------------------- versions


def write_npy_version(path, text: bytes, version: int, data: bytes = b"\0" * 16):
    """A .npy file of format ``version`` (1, 2 or 3) with the header ``text``, padded as NumPy pads it."""
    prefix = 10 if version == 1 else 12
    text += b" " * ((64 - (prefix + len(text) + 1) % 64) % 64) + b"\n"
    length = len(text).to_bytes(2 if version == 1 else 4, "little")
    path.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + length + text + data)
    return path


@pytest.mark.filterwarnings("ignore:Reading `.npy` or `.npz` file required additional header parsing:UserWarning")
@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize(
    "text",
    [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), } # \u00e9\u20ac".encode(),  # UTF-8
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), } # \xff",  # not UTF-8
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4L,), }",  # Python 2's long
        "{'descr': [('\u00e9\u20ac', '<f4')], 'fortran_order': False, 'shape': (4,), }".encode(),
    ],
    ids=["utf8-comment", "latin1-comment", "python2-long", "utf8-field"],
)
def test_each_format_version_is_read_as_numpy_reads_it(tmp_path, version, text):
    # Version 3.0 headers are UTF-8 (2.0's are Latin-1) and never Python 2's: they were read
    # with read_array_header_2_0, so a 3.0 file np.load refuses (bytes that are not UTF-8, a
    # Python 2 header) was read, and UTF-8 field names came out garbled in the refusal.
    path = write_npy_version(tmp_path / "v.npy", text, version, np.arange(4, dtype="<f4").tobytes())
    try:
        expected = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:  # UnicodeDecodeError included
        with pytest.raises(ValueError, match=rf"^{re.escape(f'{path}: {CORRUPT}: {type(exc).__name__}: ')}"):
            inspect_file(path)
        return
    if expected.dtype.names:
        with pytest.raises(TypeError, match=re.escape(f"dtype {expected.dtype}")):
            inspect_file(path)
        return
    layout = inspect_file(path)
    assert (layout.dtype, layout.n) == (expected.dtype, expected.size)
    assert read_shard(layout, 0, 1).tolist() == expected.ravel().tolist()


def test_unknown_format_version_names_the_known_ones(tmp_path):
    path = write_npy_version(tmp_path / "v4.npy", b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 4)
    with pytest.raises(ValueError):
        np.load(path, mmap_mode="r", allow_pickle=False)
    with pytest.raises(ValueError, match=r": unsupported \.npy format version \(4, 0\) \(1\.0, 2\.0 and 3\.0 are"):
        inspect_file(path)


# ---------------------------------------------------------------------------------- byte order


@pytest.mark.parametrize("descr", [">f4", ">f8", ">f2", ">i8", ">u2", ">i4"])
def test_big_endian_npy_is_refused_with_the_way_to_convert_it(tmp_path, descr):
    # np.load reads these; the error said "does not support PATH: dtype >f4" and listed dtypes
    # (float32 among them), without saying that the byte order was the problem or what to do.
    path = tmp_path / "be.npy"
    np.save(path, np.arange(7).astype(descr))
    assert np.load(path, allow_pickle=False).tolist() == list(range(7))  # NumPy reads it
    native = np.dtype(descr).newbyteorder("=")
    message = (
        f"{path} holds big-endian {native} data ({descr}), which multireduce does not support (it reads "
        f"little-endian data): convert the file once, e.g. numpy.save(path, numpy.load(path).astype('{native.str}'))"
    )
    for inspect in (inspect_file, inspect_npy):
        with pytest.raises(TypeError) as info:
            inspect(path)
        assert str(info.value) == message


# ---------------------------------------------------------------------------------- paths


def test_paths_as_str_path_and_bytes(tmp_path):
    # np.load takes bytes paths (os.fspath's); Path(bytes) raised "argument should be a str".
    np.save(tmp_path / "a.npy", np.arange(5, dtype=np.int16))
    np.arange(6, dtype=np.float64).tofile(tmp_path / "a.raw")
    for path in (tmp_path / "a.npy", str(tmp_path / "a.npy"), os.fsencode(tmp_path / "a.npy")):
        expected = np.load(path, allow_pickle=False)
        for inspect in (inspect_file, inspect_npy):
            layout = inspect(path)
            assert layout.path == tmp_path / "a.npy"
            assert read_shard(layout, 0, 1).tolist() == expected.tolist()
    for path in (tmp_path / "a.raw", str(tmp_path / "a.raw"), os.fsencode(tmp_path / "a.raw")):
        layout = inspect_file(path, dtype="float64")
        assert read_shard(layout, 1, 2).tolist() == [3.0, 4.0, 5.0]
    for inspect in (inspect_file, inspect_npy):
        with pytest.raises(TypeError, match="not int"):
            inspect(3)


@pytest.mark.parametrize("dtype", ["bogus", 3.5])
def test_a_dtype_that_is_not_one_gets_the_same_error_for_npy_and_raw_files(tmp_path, dtype):
    # For a .npy file, np.dtype's bare "data type 'bogus' not understood" came out (the raw
    # files' error names the setting and lists the supported dtypes).
    np.save(tmp_path / "a.npy", np.arange(4.0))
    np.arange(4.0).tofile(tmp_path / "a.raw")
    message = f"input dtype {dtype!r} is not a NumPy dtype; supported dtypes: bool, int8"
    for path in (tmp_path / "a.npy", tmp_path / "a.raw"):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}"):
            inspect_file(path, dtype=dtype)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}"):
        inspect_npy(tmp_path / "a.npy", dtype=dtype)


# ---------------------------------------------------------------------------------- plan


def test_every_element_is_read_once_in_rank_order(tmp_path):
    data = np.arange(53, dtype=np.int32)
    data.tofile(tmp_path / "a.raw")
    for n in (0, 1, 2, 7, 52, 53):
        layout = inspect_file(tmp_path / "a.raw", dtype="int32", n=n)
        for size in range(1, 12):
            counts = shard_counts(n, size)
            ranges = [shard_range(n, r, size) for r in range(size)]
            parts = [read_shard(layout, r, size) for r in range(size)]
            assert [len(p) for p in parts] == counts == [b - a for a, b in ranges]
            assert [a for a, _ in ranges] == [0] + [b for _, b in ranges[:-1]] and ranges[-1][1] == n
            assert max(counts) - min(counts) <= 1 and sorted(counts, reverse=True) == counts
            assert np.concatenate(parts).tolist() == data[:n].tolist()
            # np.array_split's blocks, which the docstring promises
            assert [len(p) for p in np.array_split(np.arange(n), size)] == counts


SHARD_OF_MANY_RANKS = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from multireduce._shards import shard_range
size = 2**62
print([shard_range(10, r, size) for r in (0, 9, 10, size - 1)], shard_range(2**63 + 5, size - 1, size))
"""


def test_shard_range_takes_constant_time_in_the_rank_count():
    # shard_range built the list of every rank's count: size 2**62 ran out of memory (a plain
    # int size argument; 10**7 ranks took 0.5 s a call).
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", SHARD_OF_MANY_RANKS],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == f"[(0, 1), (9, 10), (10, 10), (10, 10)] ({2**63 + 3}, {2**63 + 5})"


# ---------------------------------------------------------------------------------- structured


@pytest.mark.parametrize(
    "descr",
    [
        "('<f4', {'a': ('<i4', 0)})",  # float32 with a field over its bytes: equal to float32
        "('<i8', {'lo': ('<u4', 0), 'hi': ('<u4', 4)})",
        "[('a', '<f4')]",
        "[('', '<i8')]",
    ],
)
def test_structured_npy_is_refused(tmp_path, descr):
    # A dtype with fields that compares equal to float32 passed the dtype check: the layout's
    # dtype then failed mpi.read_shard and the CLI with a bare KeyError (its dtype code).
    path = write_npy(tmp_path / "s.npy", "{'descr': " + descr + ", 'fortran_order': False, 'shape': (2,)}")
    loaded = np.load(path, allow_pickle=False)  # NumPy reads it
    message = f"{path} holds a structured dtype {loaded.dtype} (fields {', '.join(loaded.dtype.names)})"
    for inspect in (inspect_file, inspect_npy, lambda p: inspect_file(p, dtype=loaded.dtype)):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}, which multireduce does not support"):
            inspect(path)


def test_structured_dtype_for_a_raw_file_is_refused(tmp_path):
    # float32 with a field over its bytes compares equal to float32; the layout failed
    # mpi.read_shard and the CLI with a bare KeyError. check_dtype refuses it (f47b68d).
    np.arange(4, dtype=np.float32).tofile(tmp_path / "a.raw")
    union = np.dtype((np.float32, [("a", "<i4")]))
    with pytest.raises(TypeError, match=r"input dtype \(numpy\.float32, \[\('a', '<i4'\)\]\): it has fields"):
        inspect_file(tmp_path / "a.raw", dtype=union)
    assert inspect_file(tmp_path / "a.raw", dtype=np.float32).dtype.names is None
