"""The MPI layer's pure parts, tested in-process without starting MPI.

Sharding, file layouts, the order-independent max/min encoding, and the CUDA-aware decision
with both answers. At the end, a few two-rank jobs (marked ``mpi``): arguments that differ
across ranks must end the call on every rank with an error that names them.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_scripts.fake_cupy import HostSlots, fake_cupy
from mpi_scripts.launch import run

from multireduce import get_op
from multireduce._shards import inspect_file, read_shard, shard_counts, shard_range
from multireduce._transport import (
    CUDA_AWARE_ENV,
    decide_cuda_aware,
    decode_extreme,
    decode_extreme_scalar,
    encode_extreme,
    encode_extreme_scalar,
    mpix_probe,
    openmpi_cvar_probe,
    sum_wire_dtype,
)
from multireduce.ops import KERNEL_OPS, OPS, SUPPORTED_DTYPES

REPO = Path(__file__).resolve().parent.parent


def test_import_multireduce_starts_neither_mpi_nor_cupy():
    code = (
        "import sys, multireduce, multireduce._shards, multireduce._transport, multireduce._cli\n"
        "bad = [m for m in ('mpi4py.MPI', 'cupy', 'multireduce.mpi') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO)


# ---------------------------------------------------------------------------------- sharding


@given(n=st.integers(0, 10**6), size=st.integers(1, 64))
def test_shards_cover_the_range_once_and_balanced(n, size):
    ranges = [shard_range(n, r, size) for r in range(size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    counts = shard_counts(n, size)
    assert counts == [b - a for a, b in ranges]
    assert max(counts) - min(counts) <= 1
    # Same split as NumPy's array_split.
    assert counts == [len(part) for part in np.array_split(np.empty(n, dtype=np.uint8), size)]


def test_fewer_elements_than_ranks():
    assert shard_counts(2, 4) == [1, 1, 0, 0]
    assert shard_range(2, 3, 4) == (2, 2)
    assert shard_counts(0, 3) == [0, 0, 0]


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, None])
def test_shard_rejects_bad_lengths(bad):
    with pytest.raises((TypeError, ValueError), match="non-negative integer"):
        shard_counts(bad, 2)


def test_shard_rejects_bad_rank_and_size():
    with pytest.raises(ValueError, match="at least 1"):
        shard_counts(3, 0)
    with pytest.raises(ValueError, match="out of range"):
        shard_range(3, 2, 2)


# ---------------------------------------------------------------------------------- files


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_npy_shards_concatenate_to_the_file(tmp_path, order, size):
    a = np.asarray(np.arange(24, dtype=np.int16).reshape(4, 6), order=order)
    np.save(tmp_path / "a.npy", a)
    layout = inspect_file(tmp_path / "a.npy")
    assert (layout.kind, layout.dtype, layout.n) == ("npy", np.dtype(np.int16), 24)
    parts = [read_shard(layout, r, size) for r in range(size)]
    # Memory order: a full reduction does not care, and no rank reads more than its slice.
    assert sorted(np.concatenate(parts).tolist()) == list(range(24))
    assert [p.size for p in parts] == shard_counts(24, size)


def test_raw_shards_and_n(tmp_path):
    np.arange(10, dtype=np.float64).tofile(tmp_path / "x.bin")
    layout = inspect_file(tmp_path / "x.bin", dtype="float64")
    assert np.concatenate([read_shard(layout, r, 3) for r in range(3)]).tolist() == list(range(10))
    layout = inspect_file(tmp_path / "x.bin", dtype="float64", n=4)
    assert np.concatenate([read_shard(layout, r, 3) for r in range(3)]).tolist() == [0, 1, 2, 3]
    assert read_shard(inspect_file(tmp_path / "x.bin", dtype="float64", n=0), 0, 2).size == 0


def test_file_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        inspect_file(tmp_path / "nope.npy")
    with pytest.raises(FileNotFoundError, match="an empty path"):  # Path("") is "."
        inspect_file("")
    # A header that does not parse: ast's message without its object's address, so that
    # every rank's message is the same and the CLI prints it once.
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1+1,), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    magic = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
    (tmp_path / "expr.npy").write_bytes(magic + header.encode() + bytes(16))
    with pytest.raises(ValueError, match="malformed node or string") as caught:
        inspect_file(tmp_path / "expr.npy")
    assert " at 0x" not in str(caught.value), caught.value
    np.save(tmp_path / "a.npy", np.arange(100, dtype=np.float32))
    raw = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "short.npy").write_bytes(raw[:-1])
    with pytest.raises(ValueError, match=r"truncated.*\(100,\) of float32"):
        inspect_file(tmp_path / "short.npy")
    (tmp_path / "header.npy").write_bytes(raw[:20])
    with pytest.raises(ValueError, match="not a valid .npy"):
        inspect_file(tmp_path / "header.npy")
    with pytest.raises(TypeError, match="holds float32, but dtype float64"):
        inspect_file(tmp_path / "a.npy", dtype="float64")
    with pytest.raises(ValueError, match="raw files only"):
        inspect_file(tmp_path / "a.npy", n=3)
    (tmp_path / "x.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match="give the dtype"):
        inspect_file(tmp_path / "x.bin")
    with pytest.raises(ValueError, match="not a whole number of 4-byte"):
        inspect_file(tmp_path / "x.bin", dtype="int32")
    with pytest.raises(ValueError, match="30 elements of uint8 requested, the file holds 10"):
        inspect_file(tmp_path / "x.bin", dtype="uint8", n=30)
    with pytest.raises(TypeError, match="does not support"):
        inspect_file(tmp_path / "x.bin", dtype="complex64")
    np.save(tmp_path / "big.npy", np.arange(3, dtype=">i4"))
    with pytest.raises(TypeError, match="does not support"):
        inspect_file(tmp_path / "big.npy")


class _Bomb:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_object_npy_is_refused_and_never_unpickled(tmp_path):
    sentinel = tmp_path / "unpickled"
    obj = np.empty(2, dtype=object)
    obj[:] = [_Bomb(sentinel), 1]
    with open(tmp_path / "o.npy", "wb") as fh:
        np.lib.format.write_array(fh, obj, allow_pickle=True)
    # The file really is a pickle bomb: loading it with pickles allowed would fire it.
    assert pickle.dumps(_Bomb(sentinel))
    with pytest.raises(TypeError, match="Python objects.*never unpickles"):
        inspect_file(tmp_path / "o.npy")
    assert not sentinel.exists()


# ------------------------------------------------------------------- max/min encoding

_FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.sampled_from([0.0, -0.0, math.nan])


def _ieee_combine(values: list[float], op: str) -> float:
    if any(math.isnan(v) for v in values):
        return math.nan
    best = (max if op == "max" else min)(values)
    if best == 0:
        signs = {math.copysign(1.0, v) for v in values if v == 0}
        want = 1.0 if op == "max" else -1.0
        best = math.copysign(0.0, want if want in signs else -want)
    return best


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return bool(np.isnan(a) and np.isnan(b)) if a.dtype.kind == "f" and np.isnan(a) else a.tobytes() == b.tobytes()


@settings(max_examples=300)
@given(
    values=st.lists(_FLOATS, min_size=1, max_size=6),
    op=st.sampled_from(["max", "min"]),
    dt=st.sampled_from(["float64", "float32"]),
)
def test_float_keys_combine_like_ieee_in_any_order(values, op, dt):
    dt = np.dtype(dt)
    with np.errstate(over="ignore"):
        partials = [dt.type(v) for v in values]
    positive = op == "max"
    keys = [encode_extreme_scalar(p, positive) for p in partials]
    # MPI MAX in any order is max() of the keys: one answer for every permutation.
    got = decode_extreme_scalar(max(keys), positive, dt)
    want = dt.type(_ieee_combine([float(p) for p in partials], op))
    assert got.dtype == dt
    assert _same(got, want), (partials, got, want)
    # It is also the combine rule of ops.host_reduce.
    assert _same(got, get_op(op).host_reduce(np.array(partials, dtype=dt), dt))


@settings(max_examples=300)
@given(
    values=st.lists(st.one_of(_FLOATS, st.just(math.nan)), min_size=1, max_size=6),
    op=st.sampled_from(["nanmax", "nanmin"]),
    dt=st.sampled_from(["float64", "float32"]),
)
def test_nan_losing_keys_combine_like_fmax_in_any_order(values, op, dt):
    # nanmax/nanmin partials: NaN takes the smallest key, so it loses to every number, and
    # the combined key is NaN only if every rank's partial was NaN (all-NaN or empty shards).
    dt = np.dtype(dt)
    with np.errstate(over="ignore"):
        partials = [dt.type(v) for v in values]
    positive = op == "nanmax"
    keys = [encode_extreme_scalar(p, positive, nan_wins=False) for p in partials]
    got = decode_extreme_scalar(max(keys), positive, dt, nan_wins=False)
    numbers = [float(p) for p in partials if not math.isnan(p)]
    want = dt.type(_ieee_combine(numbers, op[3:]) if numbers else math.nan)
    assert _same(got, want), (partials, got, want)
    assert _same(got, get_op(op).host_reduce(np.array(partials, dtype=dt), dt))
    array_keys = encode_extreme(np.array(partials, dtype=dt), positive, nan_wins=False)
    assert array_keys.tolist() == keys
    assert _same(decode_extreme(np.array([max(keys)]), positive, dt, nan_wins=False)[0], got)


@given(values=st.lists(st.integers(-(2**63), 2**64 - 1), min_size=1, max_size=5), op=st.sampled_from(["max", "min"]))
def test_integer_keys_combine_exactly(values, op):
    for dt in (np.dtype(np.int64), np.dtype(np.uint64)):
        info = np.iinfo(dt)
        vals = [v for v in values if info.min <= v <= info.max] or [0]
        positive = op == "max"
        keys = [encode_extreme_scalar(dt.type(v), positive) for v in vals]
        assert all(-(2**63) <= k < 2**63 for k in keys)
        got = decode_extreme_scalar(max(keys), positive, dt)
        assert got.dtype == dt and int(got) == (max if positive else min)(vals)


def key_test_values(dt: np.dtype) -> np.ndarray:
    """Values whose ordered keys are worth checking: signed zeros, infinities, NaN, extremes."""
    if dt.kind == "f":
        return np.array([0.0, -0.0, 1.5, -2.5, np.inf, -np.inf, np.nan], dtype=dt)
    if dt.kind == "b":
        return np.array([False, True])
    info = np.iinfo(dt)
    return np.array([info.min, info.max, 0, 1], dtype=dt)


@pytest.mark.parametrize("dt", ["bool", "int8", "int16", "uint8", "uint32", "int64", "uint64", "float32", "float64"])
def test_array_encoding_matches_scalar_encoding(dt):
    # The array form runs on the device for CUDA-aware MPI; it must agree with the host form.
    dt = np.dtype(dt)
    values = key_test_values(dt)
    for positive in (True, False):
        for v in values:
            key = encode_extreme(np.array([v], dtype=dt), positive)
            assert key.dtype == np.int64 and int(key[0]) == encode_extreme_scalar(dt.type(v), positive)
            back = decode_extreme(key, positive, dt)
            assert back.dtype == dt and _same(back[0], decode_extreme_scalar(int(key[0]), positive, dt))


def test_sum_wire_types():
    assert sum_wire_dtype(np.int64) == np.uint64  # defined wrap-around in MPI's C code
    assert sum_wire_dtype(np.uint64) == np.uint64
    assert sum_wire_dtype(np.float32) == np.float32  # float16 partials travel as float32
    assert sum_wire_dtype(np.float64) == np.float64


# ------------------------------------------------------------------- CUDA-aware decision


def _probe(answer, detail="probe said so"):
    calls = []

    def probe():
        calls.append(1)
        return answer, detail

    probe.calls = calls
    return probe


@pytest.mark.parametrize("answer", [True, False])
def test_first_answering_probe_decides(answer):
    silent, first, second = _probe(None, "cannot tell"), _probe(answer), _probe(not answer)
    aware = decide_cuda_aware([("a", silent), ("b", first), ("c", second)], environ={})
    assert aware.enabled is answer and aware.method == "b"
    assert "a: cannot tell" in aware.detail and "b: probe said so" in aware.detail
    assert silent.calls and first.calls and not second.calls


@pytest.mark.parametrize(("value", "enabled"), [("1", True), ("0", False), (" 1 ", True)])
def test_env_override_wins_without_asking_mpi(value, enabled):
    probe = _probe(not enabled)
    aware = decide_cuda_aware([("p", probe)], environ={CUDA_AWARE_ENV: value})
    assert aware.enabled is enabled and aware.method == "env" and not probe.calls


def test_env_override_rejects_other_values():
    with pytest.raises(ValueError, match="must be 0 or 1"):
        decide_cuda_aware([], environ={CUDA_AWARE_ENV: "yes"})


def test_no_answer_means_staging():
    aware = decide_cuda_aware([("p", _probe(None))], environ={})
    assert aware.enabled is False and aware.method == "default"


class _FakeLib:
    def __init__(self, **funcs):
        self.__dict__.update(funcs)


@pytest.mark.parametrize("value", [0, 1])
def test_mpix_probe_reports_the_library_answer(value):
    func = lambda: value  # noqa: E731 - ctypes-like attributes are set on it
    assert mpix_probe(_FakeLib(MPIX_Query_cuda_support=func))() == (bool(value), f"returned {value}")


def test_mpix_probe_without_the_symbol():
    answer, detail = mpix_probe(_FakeLib())()
    assert answer is None and "not exported" in detail


def test_openmpi_probe_only_asks_open_mpi():
    assert openmpi_cvar_probe(_FakeLib(), "MPICH Version: 5")() == (None, "not Open MPI")
    answer, detail = openmpi_cvar_probe(_FakeLib(), "Open MPI v4.1.6, ...")()
    assert answer is None and "MPI_T functions not exported" in detail


_FAST_CASES = [(name, False) for name, op in OPS.items() if op.kind == "fold"] + [(name, True) for name in KERNEL_OPS]


@pytest.mark.parametrize("dt", [np.dtype(d).name for d in SUPPORTED_DTYPES])
@pytest.mark.parametrize(("op", "gpu"), _FAST_CASES, ids=[f"{op}-{'gpu' if g else 'host'}" for op, g in _FAST_CASES])
def test_per_call_path_entry_for_every_fold_op_and_dtype(monkeypatch, op, dt, gpu):
    # mpi._Fast is made on the first call of each (op, dtype) (and device and stream); building
    # it must work for every pair the path accepts, and a GPU entry's sum buffer must carry the
    # accumulator's bits (as _global_value uses it). The GPU entry (kernel ops only) runs here
    # on CPU stand-ins.
    mpi = pytest.importorskip("multireduce.mpi")
    stream = None
    if gpu:
        slots = HostSlots(pytest.importorskip("multireduce.mpi"))
        monkeypatch.setattr(mpi._Staging, "get", classmethod(lambda cls, device, stream: slots))
        stream = SimpleNamespace(ptr=0)
    static = mpi._static(get_op(op), np.dtype(dt), None)
    entry = mpi._Fast(static, 0 if gpu else None, stream)
    assert entry.arith == (get_op(op).mpi_name in ("SUM", "PROD"))
    assert entry.meta[7] == 1 and entry.meta[0] == 0
    assert entry.meta[1:7].tolist() == mpi._meta_template(static.codes)[1:7].tolist()
    # The per-call path has the default reproducible= and correction=, as the general path's
    # agreement encodes them (so that a rank on either path agrees with the other).
    assert entry.meta[9:13].tolist() == list(mpi._option_codes(False, 0.0))
    plan = mpi._Plan(static, 3, gpu, 0 if gpu else None)
    assert mpi._meta(plan, None)[9:].tolist() == entry.meta[9:].tolist()
    if gpu:
        assert entry.partial.dtype == static.acc and entry.host_in.dtype == static.acc
        out, box = entry.results.take(static.result)
        box[0] = 1
        assert out.dtype == static.result and out.get() == 1
    if entry.arith and gpu:
        value = np.array(-3 if static.acc.kind == "i" else 3, dtype=static.acc)[()]
        entry.wire.view(static.acc)[0] = value
        assert entry.wire.dtype == static.wire and entry.wire.view(static.acc)[0] == value


def _cells():
    mpi = pytest.importorskip("multireduce.mpi")
    return mpi._ResultCells(3, fake_cupy())


@pytest.mark.parametrize("dt", [np.dtype(d).name for d in SUPPORTED_DTYPES])
def test_result_cells_hold_each_value_bit_for_bit(dt):
    # The array handed out reads back (through its pointer) exactly the bits stored in its box,
    # for every result dtype, and each held result keeps its own value.
    cells = _cells()
    dt = np.dtype(dt)
    values = np.array([0, 1, -1, 7], dtype=np.int64).astype(dt)
    if dt.kind == "f":
        values = np.array([-0.0, np.nan, -np.inf, np.finfo(dt).tiny], dtype=dt)
    held = []
    for v in values:
        out, box = cells.take(dt)
        box[0] = v
        held.append(out)
        assert out.dtype == dt and out.shape == () and out.data.mem.device_id == 3
    assert len({a.data.ptr for a in held}) == len(held)
    for a, v in zip(held, values, strict=True):
        assert a.get().tobytes() == v.tobytes()


def test_result_cells_reuse_only_cells_nothing_references():
    cells = _cells()
    block = cells.BLOCK
    # Results dropped at once: the cells go round and no block is added.
    for i in range(10 * block):
        out, box = cells.take(np.dtype(np.float64))
        box[0] = i
        assert out.get() == i
        del out
    assert len(cells._cells) == block
    # A held result, a view of one, its MemoryPointer or its memory keeps the cell out.
    keep = []
    for hold in (lambda a: a, lambda a: a.view(), lambda a: a.data, lambda a: a.data.mem, lambda a: a.data + 0):
        out, box = cells.take(np.dtype(np.float64))
        box[0] = 42.0
        keep.append((out.data.ptr, hold(out)))
        del out
    for _ in range(4 * block):
        out, box = cells.take(np.dtype(np.float64))
        box[0] = -1.0
        assert out.data.ptr not in {ptr for ptr, _ in keep}
        del out
    for ptr, _ in keep:
        assert np.frombuffer(__import__("ctypes").string_at(ptr, 8), np.float64)[0] == 42.0
    # Once let go, those cells come back.
    seen = {ptr for ptr, _ in keep}
    keep.clear()
    ptrs = set()
    for _ in range(2 * block):
        out, _ = cells.take(np.dtype(np.float64))
        ptrs.add(out.data.ptr)
        del out
    assert seen <= ptrs


def test_result_cells_grow_to_at_most_twice_the_results_held():
    cells = _cells()
    held = []
    for i in range(1000):
        out, box = cells.take(np.dtype(np.int64))
        box[0] = i
        held.append(out)
    assert 1000 <= len(cells._cells) <= 2 * 1000
    assert [a.get() for a in held] == list(range(1000))
    assert len({a.data.ptr for a in held}) == 1000
    # Dropping every other result frees those cells for the next takes; no new block.
    size = len(cells._cells)
    del held[::2]
    free = {cell[1].ptr for cell in cells._cells} - {a.data.ptr for a in held}
    assert len(free) == size - 500
    for _ in range(300):
        out, box = cells.take(np.dtype(np.int64))
        box[0] = -1
        assert out.data.ptr not in {a.data.ptr for a in held[-3:]}
        held.append(out)
    assert len(cells._cells) == size
    assert {a.data.ptr for a in held[-300:]} <= free
    assert [a.get() for a in held[:500]] == list(range(1, 1000, 2))


def test_per_call_path_taken_for_numpy_shards_and_not_for_others():
    mpi = pytest.importorskip("multireduce.mpi")
    x = np.arange(5, dtype=np.float32)
    entry = mpi._fast_entry(x, "sum")
    assert entry is not None and entry.stream is None and entry.static.acc == np.float64
    assert mpi._fast_entry(x, "mean") is None  # moments: the general path
    assert mpi._fast_entry(x[:0], "sum") is None  # empty shard: the general path
    assert mpi._fast_entry(x.astype(np.complex64), "sum") is None  # refused by the general path
    assert mpi._fast_entry([1.0, 2.0], "sum") is None  # lists are converted by the general path


def test_per_call_path_failure_goes_through_the_agreement(monkeypatch):
    # A local failure on the per-call path is agreed like one on the general path: raised
    # here, marked as this rank's, after the agreement Allreduce (at one rank, in process).
    mpi = pytest.importorskip("multireduce.mpi")
    assert mpi._fast_entry(np.ones(3), "sum") is not None

    def broken(x, op, **kwargs):
        raise MemoryError("injected")

    monkeypatch.setattr(mpi.core, "partial", broken)
    with pytest.raises(MemoryError, match="injected") as info:
        mpi.allreduce(np.ones(3), "sum")
    assert list(mpi.rank_failures(info.value)) == [0]
    monkeypatch.undo()
    assert mpi.allreduce(np.ones(3), "sum") == 3.0  # and the next call works


@pytest.mark.parametrize("reproducible", [False, True])
def test_dtype_argument_converts_each_element_first(reproducible):
    # As multireduce.reduce (at one rank, in process): 2049 is 2048 in float16; 2**-24 + 2**-50
    # is 2**-24 in float32, and then 1 + 2**-24 is a tie, rounded to even.
    mpi = pytest.importorskip("multireduce.mpi")
    x = np.array([2049, 2049, 2049], dtype=np.int32)
    got = mpi.allreduce(x, "sum", dtype=np.float16, reproducible=reproducible)
    assert got.dtype == np.float16 and float(got) == 6144.0 == float(np.sum(x, dtype=np.float16))
    y = np.array([1.0, 2.0**-24 + 2.0**-50])
    got = mpi.allreduce(y, "sum", dtype=np.float32, reproducible=reproducible)
    assert got.dtype == np.float32 and float(got) == 1.0
    got = mpi.allreduce(np.arange(5), "sum", dtype=np.float32, reproducible=reproducible)  # int input
    assert got.dtype == np.float32 and float(got) == 10.0


def test_agree_with_something_that_is_not_an_exception():
    # Still agreed (other ranks must not wait), as a TypeError naming the mistake.
    mpi = pytest.importorskip("multireduce.mpi")
    with pytest.raises(TypeError, match="agree takes an exception or None, not str: 'oops'") as info:
        mpi.agree("oops")
    assert list(mpi.rank_failures(info.value)) == [0]


def test_select_device_without_cupy_says_what_to_install(monkeypatch):
    mpi = pytest.importorskip("multireduce.mpi")
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(ModuleNotFoundError, match=r"select_device needs CuPy .* multireduce\[gpu\]"):
        mpi._device_count()


def test_reproducible_refusals_match_the_core():
    mpi = pytest.importorskip("multireduce.mpi")
    for op in ("prod", "nansum"):
        with pytest.raises(NotImplementedError, match=f"not available for op '{op}'"):
            mpi.allreduce(np.arange(5.0), op, reproducible=True)
    assert mpi.allreduce(np.arange(5), "max", reproducible=True) == 4  # order-free: unchanged


# ------------------------------------------------------------ arguments agreed across ranks


def test_option_codes_compare_correction_exactly():
    # correction= is agreed by its bits (slots 9-12 of the agreement): values that give the
    # same results share a code, any other difference does not.
    mpi = pytest.importorskip("multireduce.mpi")
    codes = mpi._option_codes
    assert codes(False, -0.0) == codes(False, 0.0) == mpi._DEFAULT_OPTION_CODES
    assert codes(False, math.nan) == codes(False, -math.nan) == codes(False, float(np.float32("nan")))
    assert codes(False, 1.0) == codes(False, 1) == codes(False, np.float64(1.0))
    assert codes(False, 1.0) != codes(False, np.nextafter(1.0, 2.0))
    assert codes(False, 0.0) != codes(False, 5e-324) and codes(True, 0.0) != codes(False, 0.0)
    for reproducible, correction in [(True, 1.0), (False, -2.5), (True, math.inf), (False, math.nan)]:
        r, not_r, bits, not_bits = codes(reproducible, correction)
        assert (r, bits) == (~not_r, ~not_bits)
    plan = mpi._Plan(mpi._static(get_op("var"), np.dtype(np.float64), None), 3, False, None, True, 1.0)
    assert mpi._meta(plan, None)[9:13].tolist() == list(codes(True, 1.0))


def test_every_call_has_its_own_op_code():
    # The op's slot of the agreement tells every allreduce op and stats() apart: stats()
    # exchanges mean's moments, but must not pair with a rank in allreduce(x, "mean").
    mpi = pytest.importorskip("multireduce.mpi")
    codes = list(mpi._OP_CODES.values())
    assert len(set(codes)) == len(codes) == len(OPS) + 1 and 0 not in codes
    f64 = np.dtype(np.float64)
    mean = mpi._static(get_op("mean"), f64, None)
    stats, _ = mpi._plan(np.ones(3), "mean", None, mpi._STATS_CALL)
    assert stats.op is mean.op and stats.static.result == mean.result  # the same moments
    assert stats.static.codes[1] != mean.codes[1] and stats.static.call == "mpi.stats()"
    assert mpi._meta(stats, None)[3:5].tolist() != mpi._meta(mpi._Plan(mean, 3, False, None), None)[3:5].tolist()


class _Recorder:
    """MPI.COMM_SELF that records the collectives called on it: (name, element count, dtype)."""

    def __init__(self, mpi):
        self.comm, self.calls = mpi.MPI.COMM_SELF, []

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Allreduce(self, sendbuf, recvbuf, op):
        self.calls.append(("Allreduce", recvbuf.size, recvbuf.dtype.name))
        return self.comm.Allreduce(sendbuf, recvbuf, op=op)

    def Allgather(self, sendbuf, recvbuf):
        self.calls.append(("Allgather", sendbuf.size, sendbuf.dtype.name))
        return self.comm.Allgather(sendbuf, recvbuf)

    def allgather(self, obj):
        self.calls.append(("allgather", 1, "object"))
        return self.comm.allgather(obj)

    def Split_type(self, split_type, key=0):
        self.calls.append(("Split_type", 1, "int"))
        return self.comm.Split_type(split_type, key=key)


def test_every_entry_point_starts_with_the_same_agreement_record(monkeypatch, tmp_path):
    # Every collective entry point's first collective is the agreement Allreduce of one record
    # of one length, so that ranks in different entry points meet in it and learn so (two
    # ranks: test_arguments_that_differ_across_ranks_raise_on_every_rank). agree() sent 1
    # int64, read_shard() 5, allreduce and stats 13, and local_rank/select_device began with
    # their Split_type.
    mpi, _ = _fake_devices(monkeypatch, 1)
    np.arange(4.0).tofile(tmp_path / "x.raw")
    x = np.arange(6.0)
    calls = {
        "agree": lambda c: mpi.agree(None, comm=c),
        "read_shard": lambda c: mpi.read_shard(tmp_path / "x.raw", dtype="float64", comm=c),
        "local_rank": lambda c: mpi.local_rank(c),
        "select_device": lambda c: mpi.select_device(c),
        "stats": lambda c: mpi.stats(x, comm=c),
        "exact": lambda c: mpi.allreduce(x, "sum", comm=c, reproducible=True),
        "general": lambda c: mpi.allreduce(x, get_op("max"), comm=c),
        "var": lambda c: mpi.allreduce(x, "var", comm=c, correction=1.0),
        "dtype": lambda c: mpi.allreduce(x, "sum", comm=c, dtype=np.float32),
        "empty": lambda c: mpi.allreduce(x[:0], "sum", comm=c),
    }
    for op in OPS:
        calls[op] = lambda c, op=op: mpi.allreduce(x, op, comm=c)  # per-call path for fold ops
    first = {}
    for name, call in calls.items():
        recorder = _Recorder(mpi)
        call(recorder)
        first[name] = recorder.calls[0]
    assert set(first.values()) == {("Allreduce", mpi._META_SIZE, "int64")}, first


def _fake_devices(monkeypatch, count):
    """select_device on a node with ``count`` GPUs, without CuPy: returns the devices it used."""
    mpi = pytest.importorskip("multireduce.mpi")
    used = []
    monkeypatch.setattr(mpi, "_device_count", lambda: count)
    monkeypatch.setattr(mpi, "_use_device", used.append)
    monkeypatch.delenv(mpi.DEVICE_ENV, raising=False)
    return mpi, used


@pytest.mark.parametrize(
    ("env", "device", "want"), [(None, None, 0), (" ", None, 0), ("1", None, 1), (" 1 ", None, 1), ("abc", 1, 1)]
)
def test_select_device_takes_device_or_env_or_local_rank(monkeypatch, env, device, want):
    mpi, used = _fake_devices(monkeypatch, 2)
    if env is not None:
        monkeypatch.setenv(mpi.DEVICE_ENV, env)
    assert mpi.select_device(device=device) == want  # one rank: local rank 0
    assert used == [want]
    assert mpi.select_device(device=np.int64(1)) == 1


@pytest.mark.parametrize("env", ["abc", "1.0", "0x1", "one"])
def test_select_device_names_an_unparsable_env_var(monkeypatch, env):
    mpi, used = _fake_devices(monkeypatch, 2)
    monkeypatch.setenv(mpi.DEVICE_ENV, env)
    with pytest.raises(
        ValueError, match=rf"^MULTIREDUCE_DEVICE='{env}': it must be an integer device ordinal from 0 to 1 "
    ):
        mpi.select_device()
    assert not used


@pytest.mark.parametrize("env", ["2", "-1", "99"])
def test_select_device_names_an_env_var_out_of_range(monkeypatch, env):
    mpi, used = _fake_devices(monkeypatch, 2)
    monkeypatch.setenv(mpi.DEVICE_ENV, env)
    with pytest.raises(
        ValueError,
        match=rf"^MULTIREDUCE_DEVICE={env}: device {env} does not exist; it must be an "
        r"integer device ordinal from 0 to 1 \(this node has 2 CUDA device\(s\)\)$",
    ):
        mpi.select_device()
    assert not used


@pytest.mark.parametrize("device", ["1", 2.5, 1.0, True, b"1"])
def test_select_device_refuses_a_device_that_is_not_an_integer(monkeypatch, device):
    mpi, used = _fake_devices(monkeypatch, 2)
    with pytest.raises(
        TypeError,
        match=rf"^select_device: device= must be an integer device ordinal from 0 to 1 .*"
        rf"got {re.escape(repr(device))} of type {type(device).__name__}$",
    ):
        mpi.select_device(device=device)
    assert not used


@pytest.mark.parametrize("device", [2, -1, np.int32(7)])
def test_select_device_names_a_device_argument_out_of_range(monkeypatch, device):
    mpi, used = _fake_devices(monkeypatch, 2)
    with pytest.raises(
        ValueError,
        match=rf"^select_device: device={device}: device {device} does not exist; "
        "it must be an integer device ordinal from 0 to 1",
    ):
        mpi.select_device(device=device)
    assert not used


# Run under mpiexec: ``python SCRIPT CASE TMPDIR``. Each rank calls the case's function; rank 0
# prints ``RESULTS`` and the JSON list of every rank's outcome: the exception (type, message,
# the ranks rank_failures names) or the value.
_RANKS_SCRIPT = r"""
import json
import sys
from pathlib import Path

import numpy as np

import multireduce
from multireduce import mpi

COMM = mpi.MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
FIRST = RANK == 0
x = np.arange(6, dtype=np.float64) + 10 * RANK
# select_device on a node with one GPU, without CuPy (its agreement and Split_type are real).
mpi._device_count = lambda: 1
mpi._use_device = lambda device: None
raw = Path(sys.argv[2]) / "x.raw"
if FIRST:
    np.arange(10, dtype=np.float64).tofile(raw)
COMM.Barrier()


def agreeing():
    stats = mpi.stats(x, correction=1.0)
    return {
        "var1": float(mpi.allreduce(x, "var", correction=1.0)),
        "std1": float(mpi.allreduce(x, "std", correction=1.0)),
        "stats_var1": float(stats.var),
        "signed_zero_var": float(mpi.allreduce(x, "var", correction=0.0 if FIRST else -0.0)),
        "exact_sum": float(mpi.allreduce(x, "sum", reproducible=True)),
        "exact_mean": float(mpi.allreduce(x, "mean", reproducible=True)),
        "max": float(mpi.allreduce(x, "max", reproducible=True)),
        "shard": mpi.read_shard(raw, dtype="float64", n=7).tolist(),
        "shard_n_none": mpi.read_shard(raw, dtype="float64", n=None if FIRST else 10).tolist(),
        "local_rank": list(mpi.local_rank()),
        # The same Split_type: the CLI's GPU ranks call select_device, its CPU ranks local_rank.
        "node": node(),
    }


def node():
    return mpi.select_device() if FIRST else list(mpi.local_rank())


def use_fails(other):
    # Rank 0 cannot make its device current (after the last agreement of select_device, before
    # it had a second one); rank 1 calls ``other``: select_device, or local_rank as the CLI's
    # CPU ranks do.
    if not FIRST:
        return other()

    def fail(device):
        raise RuntimeError(f"cudaErrorDevicesUnavailable: device {device} is busy")

    mpi._use_device = fail
    return mpi.select_device()


class Interrupting:
    # Ctrl-C arriving on one rank while it converts its input (or a path that is not one).
    def __array__(self, *args, **kwargs):
        raise KeyboardInterrupt("interrupted")

    def __fspath__(self):
        raise KeyboardInterrupt("interrupted")


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str")

    def __array__(self, *args, **kwargs):
        raise self


def nan_bits():
    # Rank 0 holds a NaN with the sign bit clear, rank 1 one with it set: MPI's SUM and PROD
    # combine the two partials in a different order on each rank, and the NaN that comes out
    # is the first operand's. Every rank must still get the same bits.
    out = {}
    for dt in ("float16", "float32", "float64"):
        shard = np.array([np.nan if FIRST else -np.nan, 1.0], dtype=dt)
        for op in ("sum", "prod"):
            for path, how in (("per-call", op), ("general", multireduce.get_op(op))):
                out[f"{op} {dt} {path}"] = mpi.allreduce(shard, how).tobytes().hex()
    return out


CASES = {
    "nan-bits": nan_bits,
    "reproducible-mean": lambda: mpi.allreduce(x, "mean", reproducible=FIRST),
    "reproducible-sum": lambda: mpi.allreduce(x, "sum", reproducible=FIRST),
    "reproducible-max": lambda: mpi.allreduce(x, "max", reproducible=not FIRST),
    "correction-var": lambda: mpi.allreduce(x, "var", correction=0.0 if FIRST else 1.0),
    "correction-std": lambda: mpi.allreduce(x, "std", correction=1.0 if FIRST else 1.5),
    "correction-stats": lambda: mpi.stats(x, correction=0.0 if FIRST else 1.0),
    "stats-mean": lambda: mpi.stats(x) if FIRST else mpi.allreduce(x, "mean"),
    "stats-mean-empty": lambda: mpi.stats(x[:0]) if FIRST else mpi.allreduce(x[:0], "mean"),
    "var-stats": lambda: mpi.allreduce(x, "var", correction=1.0) if FIRST else mpi.stats(x, correction=1.0),
    "read_shard-n": lambda: mpi.read_shard(raw, dtype="float64", n=10 if FIRST else 6),
    "read_shard-dtype": lambda: mpi.read_shard(raw, dtype="float64" if FIRST else "int64"),
    # Different entry points: rank 0 calls the first, rank 1 the second.
    "agree-sum": lambda: mpi.agree(None) if FIRST else mpi.allreduce(x, "sum"),
    "agree-max": lambda: mpi.agree(None) if FIRST else mpi.allreduce(x, "max"),
    "agree-mean": lambda: mpi.agree(None) if FIRST else mpi.allreduce(x, "mean"),
    "agree-exact": lambda: mpi.agree(None) if FIRST else mpi.allreduce(x, "sum", reproducible=True),
    "stats-agree": lambda: mpi.stats(x) if FIRST else mpi.agree(None),
    "read_shard-sum": lambda: mpi.read_shard(raw, dtype="float64") if FIRST else mpi.allreduce(x, "sum"),
    "argmax-read_shard": lambda: mpi.allreduce(x, "argmax") if FIRST else mpi.read_shard(raw, dtype="float64"),
    "agree-read_shard": lambda: mpi.agree(None) if FIRST else mpi.read_shard(raw, dtype="float64"),
    "local_rank-sum": lambda: mpi.local_rank() if FIRST else mpi.allreduce(x, "sum"),
    "local_rank-agree": lambda: mpi.local_rank() if FIRST else mpi.agree(None),
    "select_device-stats": lambda: mpi.select_device() if FIRST else mpi.stats(x),
    "read_shard-local_rank": lambda: mpi.read_shard(raw, dtype="float64") if FIRST else mpi.local_rank(),
    # A rank that failed and agrees on it while the other is in another call.
    "agree-error-sum": lambda: mpi.agree(RuntimeError("boom")) if FIRST else mpi.allreduce(x, "sum"),
    "agree-error-local_rank": lambda: mpi.agree(RuntimeError("boom")) if FIRST else mpi.local_rank(),
    # A failure on one rank in a local step, of a kind that used to escape the agreement.
    "interrupt-sum": lambda: mpi.allreduce(Interrupting() if FIRST else x, "sum"),
    "interrupt-stats": lambda: mpi.stats(Interrupting() if FIRST else x),
    "interrupt-read_shard": lambda: mpi.read_shard(Interrupting() if FIRST else raw, dtype="float64"),
    "badstr-sum": lambda: mpi.allreduce(Unprintable() if FIRST else x, "sum"),
    "select_device-range": lambda: mpi.select_device(device=0 if FIRST else 3),
    "select_device-use": lambda: use_fails(lambda: mpi.select_device()),
    "select_device-use-local_rank": lambda: use_fails(lambda: mpi.local_rank()),
    "agreeing": agreeing,
}

try:
    value = CASES[sys.argv[1]]()
except BaseException as exc:
    failures = mpi.rank_failures(exc)
    try:
        message = str(exc)
    except Exception:
        message = "(unprintable)"
    out = {"type": type(exc).__name__, "message": message, "failures": None if failures is None else sorted(failures)}
else:
    out = {"value": value if isinstance(value, dict) else repr(value)}
every = COMM.gather(out, root=0)
if FIRST:
    print("RESULTS", json.dumps(every), flush=True)
"""


def _on_two_ranks(mpiexec, tmp_path, case: str) -> list[dict]:
    """Every rank's outcome of ``case`` in _RANKS_SCRIPT, run by two ranks; the job must end at once."""
    script = tmp_path / "ranks.py"
    script.write_text(_RANKS_SCRIPT)
    done = run(mpiexec, 2, [str(script), case, str(tmp_path)], timeout=60)  # a hang fails here
    assert done.returncode == 0, done.output
    assert done.seconds < 30, done.output
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert len(lines) == 1, done.output
    return json.loads(lines[0].removeprefix("RESULTS "))


_DIFFERING = {
    # The ranks take different paths here: the exact limbs' Allreduce against the moments'
    # Allgather (this hung), the exact path against the per-call path (MPI aborted with
    # "Message truncated"), the general path against the per-call path.
    "reproducible-mean": (ValueError, "reproducible= differs across ranks", ["rank 0: True", "rank 1: False"]),
    "reproducible-sum": (ValueError, "reproducible= differs across ranks", ["rank 0: True", "rank 1: False"]),
    "reproducible-max": (ValueError, "reproducible= differs across ranks", ["rank 0: False", "rank 1: True"]),
    # These gave each rank a different result.
    "correction-var": (ValueError, "correction= differs across ranks", ["rank 0: 0.0", "rank 1: 1.0"]),
    "correction-std": (ValueError, "correction= differs across ranks", ["rank 0: 1.0", "rank 1: 1.5"]),
    "correction-stats": (ValueError, "correction= differs across ranks", ["rank 0: 0.0", "rank 1: 1.0"]),
    # stats() against allreduce(x, "mean"): both agreed as the op "mean" and exchanged the same
    # moments, so each rank returned a different thing (a Stats, a mean) without an error, and
    # for an all-empty global array the stats rank raised while the other waited in the
    # Allgather (a hang). stats() is now a call of its own in the op's slot.
    "stats-mean": (ValueError, "op differs across ranks", ["rank 0: mpi.stats()", "rank 1: mean"]),
    "stats-mean-empty": (ValueError, "op differs across ranks", ["rank 0: mpi.stats()", "rank 1: mean"]),
    # This was caught, but listed the stats rank's op as "mean".
    "var-stats": (ValueError, "op differs across ranks", ["rank 0: var", "rank 1: mpi.stats()"]),
    # These read overlapping shards, or the same bytes as different dtypes.
    "read_shard-n": (
        ValueError,
        "read_shard: the number of elements to split differs across ranks",
        ["rank 0: 10 (n=10, {raw})", "rank 1: 6 (n=6, {raw})"],
    ),
    "read_shard-dtype": (TypeError, "read_shard: dtype differs across ranks", ["rank 0: float64", "rank 1: int64"]),
    # Each entry point agreed in a record of its own length: MPICH aborted the job ("Message
    # truncated") where agree() (1 int64) or read_shard() (5) met allreduce or stats (13), or
    # agree() met read_shard(); local_rank()'s Split_type against any of them hung. Every
    # agreement is now one record with a code for the call.
    "agree-sum": (ValueError, "call differs across ranks", ["rank 0: mpi.agree()", "rank 1: mpi.allreduce(op='sum')"]),
    "agree-max": (ValueError, "call differs across ranks", ["rank 0: mpi.agree()", "rank 1: mpi.allreduce(op='max')"]),
    "agree-mean": (
        ValueError,
        "call differs across ranks",
        ["rank 0: mpi.agree()", "rank 1: mpi.allreduce(op='mean')"],
    ),
    "agree-exact": (
        ValueError,
        "call differs across ranks",
        ["rank 0: mpi.agree()", "rank 1: mpi.allreduce(op='sum')"],
    ),
    "stats-agree": (ValueError, "call differs across ranks", ["rank 0: mpi.stats()", "rank 1: mpi.agree()"]),
    "read_shard-sum": (
        ValueError,
        "call differs across ranks",
        ["rank 0: mpi.read_shard()", "rank 1: mpi.allreduce(op='sum')"],
    ),
    "argmax-read_shard": (
        ValueError,
        "call differs across ranks",
        ["rank 0: mpi.allreduce(op='argmax')", "rank 1: mpi.read_shard()"],
    ),
    "agree-read_shard": (ValueError, "call differs across ranks", ["rank 0: mpi.agree()", "rank 1: mpi.read_shard()"]),
    "local_rank-sum": (
        ValueError,
        "call differs across ranks",
        ["rank 0: mpi.local_rank()", "rank 1: mpi.allreduce(op='sum')"],
    ),
    "local_rank-agree": (ValueError, "call differs across ranks", ["rank 0: mpi.local_rank()", "rank 1: mpi.agree()"]),
    "select_device-stats": (
        ValueError,
        "call differs across ranks",
        ["rank 0: mpi.select_device()", "rank 1: mpi.stats()"],
    ),
    "read_shard-local_rank": (
        ValueError,
        "call differs across ranks",
        ["rank 0: mpi.read_shard()", "rank 1: mpi.local_rank()"],
    ),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(_DIFFERING))
def test_arguments_that_differ_across_ranks_raise_on_every_rank(mpiexec, tmp_path, case):
    exc_type, headline, listing = _DIFFERING[case]
    listing = [line.format(raw=tmp_path / "x.raw") for line in listing]
    outcomes = _on_two_ranks(mpiexec, tmp_path, case)
    assert len(outcomes) == 2
    for got in outcomes:
        assert got.get("type") == exc_type.__name__, outcomes
        assert got["message"].splitlines() == [f"{headline}:", *listing], outcomes
        assert got["failures"] == [0, 1], outcomes  # agreed: every rank raised it (rank_failures)


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["agree-error-sum", "agree-error-local_rank"])
def test_a_failure_agreed_while_another_rank_is_in_another_call(mpiexec, tmp_path, case):
    # The failure comes first, as in every agreement: rank 0 raises its own exception and
    # rank 1 RankError, whatever rank 1 called (before, MPICH aborted the job, or it hung).
    first, second = _on_two_ranks(mpiexec, tmp_path, case)
    assert first == {"type": "RuntimeError", "message": "boom", "failures": [0]}
    assert second == {"type": "RankError", "message": "rank 0 of 2 failed: RuntimeError: boom", "failures": [0]}


_ONE_RANK_FAILS = {
    # case: (rank 0's exception and message, the failure that rank 1's RankError names)
    "interrupt-sum": ("KeyboardInterrupt", "interrupted", "rank 0 of 2 failed: KeyboardInterrupt: interrupted"),
    "interrupt-stats": ("KeyboardInterrupt", "interrupted", "rank 0 of 2 failed: KeyboardInterrupt: interrupted"),
    "interrupt-read_shard": (
        "KeyboardInterrupt",
        "interrupted",
        "rank 0 of 2 failed: KeyboardInterrupt: interrupted",
    ),
    "badstr-sum": ("Unprintable", "(unprintable)", "rank 0 of 2 failed: Unprintable: (its str() raised RuntimeError)"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(_ONE_RANK_FAILS))
def test_a_failure_of_any_kind_on_one_rank_is_agreed(mpiexec, tmp_path, case):
    # A KeyboardInterrupt (a BaseException) escaped the agreement's `except Exception`, and an
    # exception whose str() raised stopped its rank before the failures' allgather: in both,
    # the other rank waited forever.
    kind, message, named = _ONE_RANK_FAILS[case]
    first, second = _on_two_ranks(mpiexec, tmp_path, case)
    assert first == {"type": kind, "message": message, "failures": [0]}
    assert second == {"type": "RankError", "message": named, "failures": [0]}


@pytest.mark.mpi
def test_select_device_errors_are_agreed(mpiexec, tmp_path):
    # Rank 1 asks for a device its node lacks: it raises, and rank 0, which would have gone on
    # to its next collective and waited there, raises RankError.
    first, second = _on_two_ranks(mpiexec, tmp_path, "select_device-range")
    assert second["type"] == "ValueError" and second["failures"] == [1]
    assert second["message"].startswith("select_device: device=3: device 3 does not exist")
    assert first["type"] == "RankError" and first["failures"] == [1]
    assert first["message"].startswith("rank 1 of 2 failed: ValueError: select_device: device=3")


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["select_device-use", "select_device-use-local_rank"])
def test_a_device_that_cannot_be_made_current_is_agreed(mpiexec, tmp_path, case):
    # Rank 0's device cannot be made current. Before, that came after select_device's last
    # collective: rank 0 raised alone and rank 1 returned, to wait in its next collective.
    first, second = _on_two_ranks(mpiexec, tmp_path, case)
    assert first["type"] == "RuntimeError" and first["failures"] == [0], first
    assert first["message"] == "cudaErrorDevicesUnavailable: device 0 is busy"
    assert second["type"] == "RankError" and second["failures"] == [0], second
    assert second["message"].startswith("rank 0 of 2 failed: RuntimeError: cudaErrorDevicesUnavailable")


@pytest.mark.mpi
def test_a_nan_sum_or_product_has_the_same_bits_on_every_rank(mpiexec, tmp_path):
    # Rank 0 got 0x7ff8..., rank 1 0xfff8... (MPICH), though the result is bit-identical on
    # every rank by the README; max and min, whose keys carry one NaN, always were.
    first, second = _on_two_ranks(mpiexec, tmp_path, "nan-bits")
    assert first == second, (first, second)
    for case, bits in first["value"].items():
        value = np.frombuffer(bytes.fromhex(bits), dtype=case.split()[1])[0]
        assert np.isnan(value), (case, value)


@pytest.mark.mpi
def test_arguments_that_agree_across_ranks_still_work(mpiexec, tmp_path):
    everything = np.concatenate([np.arange(6, dtype=np.float64) + 10 * r for r in range(2)])
    outcomes = _on_two_ranks(mpiexec, tmp_path, "agreeing")
    assert all("value" in got for got in outcomes), outcomes
    first, second = (got["value"] for got in outcomes)
    assert first.pop("shard") == [0, 1, 2, 3] and second.pop("shard") == [4, 5, 6]
    assert first.pop("shard_n_none") == [0, 1, 2, 3, 4] and second.pop("shard_n_none") == [5, 6, 7, 8, 9]
    assert first.pop("local_rank") == [0, 2] and second.pop("local_rank") == [1, 2]
    assert first.pop("node") == 0 and second.pop("node") == [1, 2]
    assert first == second
    assert first["var1"] == pytest.approx(np.var(everything, ddof=1), rel=1e-12)
    assert first["std1"] == pytest.approx(np.std(everything, ddof=1), rel=1e-12)
    assert first["stats_var1"] == first["var1"]
    assert first["signed_zero_var"] == pytest.approx(np.var(everything), rel=1e-12)
    assert first["exact_sum"] == everything.sum() and first["exact_mean"] == everything.mean()
    assert first["max"] == everything.max()


def test_comm_must_be_a_communicator():
    # A string raised AttributeError ("'str' object has no attribute 'Allreduce'") from inside.
    import multireduce.mpi as mpi

    for call in (
        lambda: mpi.allreduce(np.ones(3), "sum", comm="notacomm"),
        lambda: mpi.allreduce(np.ones(3), "mean", comm=0),
        lambda: mpi.stats(np.ones(3), comm=[]),
    ):
        with pytest.raises(TypeError, match=r"comm must be an mpi4py\.MPI\.Comm .* got"):
            call()
    assert mpi.allreduce(np.ones(3), "sum", comm=mpi.MPI.COMM_WORLD) == 3.0
