"""multireduce.stream: planning and piece cutting (pure), the pipeline's scheduling through the
CPU stand-in (SimulatedDevice: asynchronous, stream-ordered uploads and reductions in threads),
sources (arrays of any layout, memmaps, .npy files, Dask arrays), and on the GPU (marked
``gpu``): values, pinned sources, an 8 GiB array through a 1 GiB budget, and 10,000 calls
without memory growth.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import re
import threading
import warnings
import zlib
from concurrent.futures import Future

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    assert_float_sum,
    assert_same_bits,
    check,
    exact_int_sum,
    ieee_extreme_axes,
    make_data,
    run_in_threads,
)

from multireduce import _partials, core, stream
from multireduce.ops import get_op

OPS = ["sum", "max", "min"]
KIB = 1024
#: The stand-in's copy engines: Python threads, or the native engine (multireduce._hostcopy)
#: with its host-to-host upload.
ENGINES = ["python", "native"]


def sim_reduce(x, op="sum", *, device=None, engine="python", **kw):
    kw.setdefault("budget", 64 * KIB)
    kw.setdefault("slot_bytes", 4 * KIB)
    kw.setdefault("threads", 4)
    device = device or stream.SimulatedDevice(engine=engine)
    return stream.reduce(x, op, _device=device, **kw), device


def fail_on_call(real, when: int, exc: BaseException):
    """``real`` wrapped to raise ``exc`` on its ``when``-th call (counting from 1).

    ``wrapper.calls`` counts every call, the failing one included.
    """

    def wrapper(*args, **kwargs):
        wrapper.calls += 1
        if wrapper.calls == when:
            raise exc
        return real(*args, **kwargs)

    wrapper.calls = 0
    return wrapper


# -- planning ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 7), min_size=0, max_size=4).map(tuple),
    max_elements=st.integers(1, 40),
)
def test_plan_pieces_cover_every_element_once(shape, max_elements):
    count = np.zeros(shape, dtype=np.int64)
    pieces = stream.plan_pieces(shape, max_elements)
    for index in pieces:
        view = count[index]
        assert np.shares_memory(view, count) or view.size == 0  # basic indexing: a view
        assert 1 <= view.size <= max_elements
        view += 1
    assert np.all(count == 1)


def test_plan_pieces_examples():
    assert stream.plan_pieces((10,), 4) == [(slice(0, 4),), (slice(4, 8),), (slice(8, 10),)]
    assert stream.plan_pieces((3, 10), 25) == [(slice(0, 2),), (slice(2, 3),)]
    assert stream.plan_pieces((2, 10), 4)[:3] == [(0, slice(0, 4)), (0, slice(4, 8)), (0, slice(8, 10))]
    assert stream.plan_pieces((), 1) == [(Ellipsis,)]
    assert stream.plan_pieces((3, 0), 5) == []
    with pytest.raises(ValueError):
        stream.plan_pieces((3,), 0)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 5000),
    max_elements=st.integers(1, 300),
    ramp=st.integers(1, 12),
    align=st.sampled_from([1, 2, 8, 16]),
)
def test_ramp_pieces_cover_every_element_once_in_order(n, max_elements, ramp, align):
    pieces = stream.ramp_pieces(n, max_elements, ramp, align)
    sizes = [s.stop - s.start for (s,) in pieces]
    assert [s.start for (s,) in pieces] == [0, *itertools.accumulate(sizes)][:-1]
    assert sum(sizes) == n and all(1 <= k <= max_elements for k in sizes)
    if pieces == stream.plan_pieces((n,), max_elements):
        return  # the uniform fallback (steps below `align`)
    assert all(s.stop % align == 0 for (s,) in pieces[:-1])
    q = sizes[0]
    assert sizes[:ramp] == [q * k for k in range(1, ramp + 1)]  # growing
    assert sizes[-ramp + 1 :][:-1] == [q * k for k in range(ramp - 1, 1, -1)]  # shrinking
    assert q <= sizes[-1] < q + align
    middle = sizes[ramp : len(sizes) - ramp + 1]
    assert not middle or max(middle) - min(middle) <= align


def test_ramp_pieces_examples():
    mib = 1 << 18  # float32 elements per MiB
    sizes = [(s.stop - s.start) / mib for (s,) in stream.ramp_pieces(64 * mib, 4 * mib, 8, 16 * KIB)]
    # The seed's 2^24 float32, 8 threads: 0.5 .. 4 MiB, eight 4 MiB pieces, 3.5 .. 0.5 MiB.
    assert sizes == [0.5 * k for k in range(1, 9)] + [4.0] * 8 + [0.5 * k for k in range(7, 0, -1)]
    assert stream.ramp_pieces(10, 4, 1) == stream.plan_pieces((10,), 4)
    assert stream.ramp_pieces(10, 4, 4, 2) == stream.plan_pieces((10,), 4)  # steps under `align`
    assert stream.ramp_pieces(0, 4, 4) == []
    with pytest.raises(ValueError, match="at least 1"):
        stream.ramp_pieces(10, 4, 0)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 3 << 20),
    itemsize=st.sampled_from([1, 2, 4, 8]),
    slot_kib=st.sampled_from([4, 64, 1000, 32 * 1024]),
    piece_kib=st.sampled_from([4, 512, 2048]),
)
def test_native_pieces_cover_every_element_once_within_segments(n, itemsize, slot_kib, piece_kib):
    slot_bytes, piece_bytes = slot_kib * KIB, piece_kib * KIB
    starts, sizes, segments = stream._native_pieces(n, itemsize, slot_bytes, piece_bytes)
    assert starts[0] == 0 and (sizes > 0).all()
    assert np.array_equal(starts[1:], starts[:-1] + sizes[:-1]) and starts[-1] + sizes[-1] == n
    slot = slot_bytes // itemsize
    assert np.array_equal(segments, starts // slot) and (segments == (starts + sizes - 1) // slot).all()
    assert (sizes <= min(piece_bytes, slot_bytes) // itemsize).all()
    assert len(starts) <= -(-n // (min(piece_bytes, slot_bytes) // itemsize)) + -(-n // slot)


@pytest.mark.parametrize("nbytes", [1, 4 * KIB, 64 << 20, 8 << 30])
@pytest.mark.parametrize("budget", [1 << 30, 256 << 20, 1 << 26])
@pytest.mark.parametrize("threads", [1, 4, 12, 64])
def test_make_plan_respects_the_budget(nbytes, budget, threads):
    p = stream.make_plan(nbytes, 4, budget=budget, threads=threads)
    assert p.n_slots * p.slot_bytes <= budget
    assert p.n_slots >= 2
    assert 1 <= p.threads <= min(threads, p.n_slots)
    assert 4 <= p.piece_bytes <= p.slot_bytes and p.piece_bytes % 4 == 0
    if nbytes >= p.threads * stream.PIECES_PER_THREAD * p.slot_bytes:
        assert p.piece_bytes == p.slot_bytes  # large inputs: full slots


def test_make_plan_small_inputs_are_split_for_all_threads():
    p = stream.make_plan(64 << 20, 4, threads=8)  # the seed's 2^24 float32
    assert p.piece_bytes == (64 << 20) // (8 * stream.PIECES_PER_THREAD) and p.threads == 8
    assert stream.make_plan(100, 8, threads=8).piece_bytes == stream.MIN_PIECE_BYTES


def test_default_threads_grow_with_the_input(monkeypatch):
    monkeypatch.setattr(stream, "_default_threads", lambda: 12)
    assert stream.make_plan(100, 4).threads == 1
    assert stream.make_plan(64 << 20, 4).threads == 8  # the seed's case: 8 was fastest on the H200
    assert stream.make_plan(64 << 20, 4).piece_bytes == (64 << 20) // (8 * stream.PIECES_PER_THREAD)
    assert stream.make_plan(4 << 30, 4).threads == 12
    assert stream.make_plan(4 << 30, 4, threads=2).threads == 2  # an explicit count wins


def test_make_plan_errors():
    with pytest.raises(ValueError, match="two staging buffers"):
        stream.make_plan(100, 4, budget=1000, slot_bytes=600)
    with pytest.raises(ValueError, match="slot_bytes=4 cannot hold one 8-byte element"):
        stream.make_plan(100, 8, budget=1000, slot_bytes=4)
    with pytest.raises(ValueError, match=re.escape(f"{THREADS}, got 0")):
        stream.make_plan(100, 4, threads=0)
    # A budget too small for the default slot names budget, not the slot_bytes it was not given.
    with pytest.raises(ValueError, match=r"budget=31 bytes is too small for 8-byte elements.*budget >= 32 bytes"):
        stream.make_plan(100, 8, budget=31)
    assert stream.make_plan(100, 8, budget=32).slot_bytes == 8
    # The sizes themselves: an itemsize of 0 divided by zero, a negative nbytes made a plan.
    with pytest.raises(ValueError, match="itemsize must be an integer >= 1"):
        stream.make_plan(100, 0)
    with pytest.raises(ValueError, match="nbytes must be an integer >= 0"):
        stream.make_plan(-5, 8)
    with pytest.raises(TypeError, match="nbytes must be an integer >= 0.*of type float"):
        stream.make_plan(10.5, 4)


BUDGET = "budget must be a positive integer number of bytes (default 1 GiB)"
SLOT_BYTES = "slot_bytes must be a positive integer number of bytes, or None for min(32 MiB, budget // 4)"
THREADS = "threads must be an integer from 1 to 256, or None for the default count"


@pytest.mark.parametrize(
    ("kw", "exc", "message"),
    [
        ({"budget": 0}, ValueError, f"{BUDGET}, got 0"),
        ({"budget": -(1 << 20)}, ValueError, f"{BUDGET}, got -1048576"),
        ({"budget": "x"}, TypeError, f"{BUDGET}, got 'x' of type str"),
        ({"budget": "1024"}, TypeError, f"{BUDGET}, got '1024' of type str"),
        ({"budget": 1e9}, TypeError, f"{BUDGET}, got 1000000000.0 of type float"),
        ({"budget": True}, TypeError, f"{BUDGET}, got True of type bool"),
        ({"budget": None}, TypeError, f"{BUDGET}, got None of type NoneType"),
        ({"slot_bytes": 0}, ValueError, f"{SLOT_BYTES}, got 0"),
        ({"slot_bytes": 4.0}, TypeError, f"{SLOT_BYTES}, got 4.0 of type float"),
        ({"threads": 0}, ValueError, f"{THREADS}, got 0"),
        ({"threads": -2}, ValueError, f"{THREADS}, got -2"),
        ({"threads": "4"}, TypeError, f"{THREADS}, got '4' of type str"),
    ],
)
def test_settings_are_checked_and_named(kw, exc, message):
    for nbytes in (4, 0):  # the empty input returns before the plan: checked all the same
        with pytest.raises(exc, match=re.escape(message)):
            sim_reduce(np.ones(nbytes // 4, dtype=np.float32), **kw)
    with pytest.raises(exc, match=re.escape(message)):
        stream.make_plan(100, 4, **kw)
    # NumPy integers are integers.
    plan = stream.make_plan(100, 4, budget=np.int64(1 << 20), slot_bytes=np.int32(4096), threads=np.uint8(2))
    assert (plan.slot_bytes, plan.threads) == (4096, 2) and type(plan.slot_bytes) is int


@pytest.mark.parametrize(
    ("dtype", "requested", "want"),
    [
        ("int32", "float16", 6144.0),  # 2049 -> 2048 first; 6147 if converted to float32
        ("float64", "float32", 1.0),  # 2**-24 + 2**-50 -> 2**-24 first; 1 + 2**-23 if not
        ("float64", "int32", -2147483647),  # [inf, 1.0, 0.5]: inf -> INT32_MIN, 0.5 -> 0 first
    ],
)
def test_partials_convert_each_element_first(dtype, requested, want):
    # The pipeline's partials follow core.partial's dtype= rule, whatever the refusals cover.
    x = {
        "int32": np.array([2049] * 3, np.int32),
        "float64": np.array([1.0, 2**-24 + 2**-50]),
    }[dtype]
    if requested == "int32":
        x = np.array([np.inf, 1.0, 0.5])
    with np.errstate(invalid="ignore"):
        part = _partials.of_array(x, get_op("sum"), np.dtype(requested))
        ref = core.partial(x, "sum", dtype=requested)
    assert part.dtype == ref.dtype and part == ref
    assert np.asarray(part).astype(requested) == np.asarray(want, dtype=requested)


@pytest.mark.parametrize(
    ("dtype", "requested", "refused"),
    [
        ("int32", "float16", True),
        ("int32", "float32", True),
        ("float64", "float32", True),
        ("float64", "float16", True),
        ("int8", "float16", False),  # exact casts: converting first changes nothing
        ("float32", "float64", False),
        ("int32", "float64", False),
        ("int32", "int16", False),  # integers wrap the same either way
    ],
)
def test_dtype_argument_that_would_convert_each_element_is_refused(dtype, requested, refused):
    # dtype= converts each element first (multireduce.reduce's rule), which adding in the
    # accumulator does only where the cast commutes with it; elsewhere each piece would need a
    # converted copy on the device, outside the budget, so those are refused.
    x = np.array([2049, -3, 2049, 77, 2049] * 50).astype(dtype)
    if refused:
        with pytest.raises(NotImplementedError, match=f"cannot sum {dtype} with dtype={requested}"):
            sim_reduce(x, dtype=requested)
        da = pytest.importorskip("dask.array")
        with pytest.raises(NotImplementedError, match=f"cannot sum {dtype} with dtype={requested}"):
            stream.reduce(da.from_array(x, chunks=64), dtype=requested, _device=stream.SimulatedDevice())
        return
    got, _ = sim_reduce(x, dtype=requested)
    want = core.reduce(x, "sum", dtype=requested)
    assert got.dtype == np.dtype(requested) and got == want
    if np.dtype(requested).kind == "f":  # small integers: every partial sum is exact
        assert float(got) == float(sum(int(v) for v in x.astype(requested)))


@pytest.mark.parametrize(
    ("value", "op", "dtype"),
    [(np.nan, "count_nonzero", None), (np.inf, "count_nonzero", None), (np.nan, "nansum", "uint64")],
)
def test_zero_d_dask_array_of_nan_or_inf_streams_silently(value, op, dtype):
    # A 0-d Dask array's meta is its data; Dask's reduction cast it to the int64 of
    # count_nonzero or dtype= when the graph was built: "invalid value encountered in cast"
    # (raised under errstate), where treereduce and multireduce.reduce are silent.
    da = pytest.importorskip("dask.array")
    x = np.array(value)
    with warnings.catch_warnings(), np.errstate(invalid="raise"):
        warnings.simplefilter("error")
        want = core.reduce(x, op, dtype=dtype)
        got = stream.reduce(da.from_array(x), op, dtype=dtype, _device=stream.SimulatedDevice())
    assert got == want == (1 if op == "count_nonzero" else 0) and got.dtype == want.dtype


def test_dense_views():
    a = np.arange(24.0).reshape(2, 3, 4)
    for dense in (a, a.T, a.transpose(1, 0, 2), np.asfortranarray(a)):
        flat = stream._dense_1d(dense)
        assert flat is not None and np.shares_memory(flat, dense) and flat.size == 24
        assert sorted(flat.tolist()) == list(range(24))
    for sparse in (a[:, ::2], a[::-1], a[..., 1:]):
        assert stream._dense_1d(sparse) is None


# -- the pipeline through the CPU stand-in ------------------------------------------------


LAYOUTS = {
    "c": lambda x: x,
    "fortran": lambda x: np.asfortranarray(x.reshape(30, -1)),
    "transposed3d": lambda x: x.reshape(6, 5, -1).transpose(2, 0, 1),
    "strided": lambda x: x.reshape(30, -1)[:, ::3],
    "reversed": lambda x: x[::-1],
    "0d": lambda x: x[7:8].reshape(()),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "uint32", "bool"])
@pytest.mark.parametrize("op", OPS)
def test_values_all_layouts(op, dtype, layout, engine):
    base = make_data(dtype, 30 * 1000, np.random.default_rng(zlib.crc32(repr((op, dtype)).encode())))
    x = LAYOUTS[layout](base)
    got, dev = sim_reduce(x, op, engine=engine)
    check(np.ascontiguousarray(x), op, got)
    assert dev.peak_device_bytes <= 64 * KIB


@pytest.mark.parametrize("op", OPS)
def test_nan_anywhere(op):
    x = make_data("float32", 50_000, np.random.default_rng(1))
    x[49_999] = np.nan
    got, _ = sim_reduce(x, op)
    assert math.isnan(float(got)) and got.dtype == np.float32


def test_empty_inputs():
    got, dev = sim_reduce(np.zeros((0, 3), dtype=np.int16), "sum")
    assert got == 0 and got.dtype == np.int64 and dev.uploads == 0
    for op in ("max", "min"):
        with pytest.raises(ValueError, match="zero-size array"):
            sim_reduce(np.zeros(0, dtype=np.float32), op)


@pytest.mark.parametrize("engine", ENGINES)
def test_sum_dtype_argument(engine):
    x = make_data("int8", 20_000, np.random.default_rng(2))
    got, _ = sim_reduce(x, "sum", dtype=np.int8, engine=engine)
    assert got.dtype == np.int8 and int(got) == exact_int_sum(x, np.int8)
    got, _ = sim_reduce(x, "sum", dtype=np.float32, engine=engine)
    assert got.dtype == np.float32 and float(got) == float(np.float32(int(x.astype(np.int64).sum())))
    with pytest.raises(TypeError, match="does not take dtype"):
        sim_reduce(x, "max", dtype=np.int64)


def test_integer_sum_is_exact_over_many_pieces():
    x = np.random.default_rng(3).integers(-(2**62), 2**62, 40_000, dtype=np.int64)
    got, dev = sim_reduce(x, "sum")
    assert int(got) == exact_int_sum(x, np.int64)
    assert dev.uploads == x.nbytes // (4 * KIB) + (x.nbytes % (4 * KIB) > 0)


@pytest.mark.parametrize("engine", ENGINES)
def test_pieces_are_combined_in_a_fixed_order(engine):
    x = make_data("float32", 200_003, np.random.default_rng(4))
    runs = {sim_reduce(x, "sum", threads=t, engine=engine)[0].tobytes() for t in (1, 2, 4, 4, 8)}
    assert len(runs) == 1


@pytest.mark.parametrize(
    ("elements", "calls"),
    [
        (1, 1),  # one piece
        (3 * KIB, 1),  # three 4 KiB segments: every one fits the 7 slots, one engine call
        (7 * KIB, 1),  # exactly the slots
        (8 * KIB, 3),  # more segments than slots: groups of 3 (half the slots)
        (30 * KIB + 5, 11),  # 31 segments (the last of 5 elements)
    ],
)
def test_the_native_engine_copies_dense_inputs_in_groups_of_segments(elements, calls):
    x = np.arange(elements, dtype=np.int32)
    got, dev = sim_reduce(x, "sum", engine="native")  # 4 threads: 7 slots of 4 KiB
    assert int(got) == exact_int_sum(x, np.int64)
    assert dev.native_calls == calls and dev.uploads == -(-elements // KIB)
    assert dev._pipelines[4 * KIB].in_use == 0 and dev.slots_allocated <= 7


@pytest.mark.parametrize(("engine", "threads"), [("python", 2), ("native", 4)])
def test_default_threads_per_engine(monkeypatch, engine, threads):
    # One copy thread per 8 MiB of a dense input with Python threads, per 4 MiB natively.
    monkeypatch.setattr(stream, "_default_threads", lambda: 12)
    plans = []
    real = stream.make_plan
    monkeypatch.setattr(stream, "make_plan", lambda *a, **k: plans.append(real(*a, **k)) or plans[-1])
    x = np.ones(4 << 20, dtype=np.float32)  # 16 MiB
    got, _ = sim_reduce(x, "sum", engine=engine, threads=None, budget=8 << 20, slot_bytes=1 << 20)
    assert int(got) == x.size and plans[-1].threads == threads


def test_the_native_engine_leaves_strided_inputs_to_the_python_threads():
    x = np.arange(40_000, dtype=np.int64).reshape(200, 200)[:, ::3]
    got, dev = sim_reduce(x, "sum", engine="native")
    assert int(got) == exact_int_sum(x, np.int64)
    assert dev.native_calls == 0 and dev.uploads > 0


@pytest.mark.parametrize("elements", [3 * KIB, 30 * KIB])  # all slots at once, and in groups
def test_a_failing_native_upload_raises_and_releases_every_slot(native_stand_in, elements):
    x = np.arange(elements, dtype=np.int32)
    dev = stream.SimulatedDevice(engine="native")
    native_stand_in.mr_test_configure(2, 1)  # the second upload fails with CUDA_ERROR_INVALID_VALUE's code
    with pytest.raises(RuntimeError, match=r"upload of piece \d+ \(4096 bytes\) failed: error 1"):
        sim_reduce(x, "sum", device=dev)
    assert dev._pipelines[4 * KIB].in_use == 0
    native_stand_in.mr_test_configure(0, 0)
    assert int(sim_reduce(x, "sum", device=dev)[0]) == exact_int_sum(x, np.int64)


def test_staging_waits_for_the_previous_upload():
    # Uploads sleep, so the copying thread runs far ahead of them: without waiting for the
    # slot's previous upload it would overwrite a staging buffer still to be uploaded.
    x = np.arange(20 * 1024, dtype=np.int32)
    dev = stream.SimulatedDevice(upload_delay=0.003)
    got, _ = sim_reduce(x, "sum", device=dev, budget=8 * KIB, slot_bytes=4 * KIB, threads=1)
    assert int(got) == exact_int_sum(x, np.int64)


def test_the_stand_in_catches_a_missing_wait(monkeypatch):
    # The same run with the wait removed must give a wrong sum: the stand-in is able to fail.
    x = np.arange(20 * 1024, dtype=np.int32)
    dev = stream.SimulatedDevice(upload_delay=0.003)
    monkeypatch.setattr(dev, "host_ready", lambda slot: None)
    got, _ = sim_reduce(x, "sum", device=dev, budget=8 * KIB, slot_bytes=4 * KIB, threads=1)
    assert int(got) != exact_int_sum(x, np.int64)


def test_pinned_sources_skip_the_host_copy():
    dev = stream.SimulatedDevice()
    x = dev.pinned_empty(10_000, np.float64)
    x[:] = make_data("float64", 10_000, np.random.default_rng(5))
    got, _ = sim_reduce(x, "sum", device=dev)
    check(x, "sum", got)
    assert dev.direct_uploads == dev.uploads == 80_000 // (4 * KIB) + 1 and dev.host_copies == 0
    # A strided view of pinned memory is not contiguous: it is staged.
    got, _ = sim_reduce(x[::2], "max", device=dev)
    check(x[::2], "max", got)
    assert dev.host_copies > 0


def test_slots_are_reused_across_calls_and_bounded():
    dev = stream.SimulatedDevice()
    x = make_data("float32", 30_000, np.random.default_rng(6))
    sim_reduce(x, "sum", device=dev)
    allocated = dev.slots_allocated
    assert allocated * 4 * KIB <= 64 * KIB
    for _ in range(200):
        sim_reduce(x, "min", device=dev)
    assert dev.slots_allocated == allocated
    assert dev.peak_device_bytes <= 64 * KIB
    pipeline = dev._pipelines[4 * KIB]
    assert pipeline.in_use == 0
    pipeline.free()
    assert dev.slots_freed == allocated and dev.device_bytes == 0


def test_a_failing_upload_raises_and_releases_every_slot(monkeypatch):
    dev = stream.SimulatedDevice()
    real = dev.upload
    monkeypatch.setattr(dev, "upload", fail_on_call(real, 5, RuntimeError("simulated copy failure")))
    with pytest.raises(RuntimeError, match="simulated copy failure"):
        sim_reduce(np.ones(50_000, dtype=np.float32), "sum", device=dev)
    assert dev._pipelines[4 * KIB].in_use == 0
    monkeypatch.setattr(dev, "upload", real)
    assert sim_reduce(np.ones(50_000, dtype=np.float32), "sum", device=dev)[0] == 50_000


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_a_failing_copy_raises_and_releases_every_slot(monkeypatch, threads):
    # A copy thread fails (here: waiting for the slot's previous upload) while the others are
    # copying or waiting for a slot: the error reaches the caller, every slot comes back, and
    # the next call works.
    dev = stream.SimulatedDevice(upload_delay=0.001)
    real = dev.host_ready
    monkeypatch.setattr(dev, "host_ready", fail_on_call(real, 6, OSError("simulated host failure")))
    x = np.arange(50_000, dtype=np.int32)
    with pytest.raises(OSError, match="simulated host failure"):
        sim_reduce(x, "sum", device=dev, budget=16 * KIB, slot_bytes=4 * KIB, threads=threads)
    assert dev._pipelines[4 * KIB].in_use == 0
    monkeypatch.setattr(dev, "host_ready", real)
    got, _ = sim_reduce(x, "sum", device=dev, budget=16 * KIB, slot_bytes=4 * KIB, threads=threads)
    assert int(got) == exact_int_sum(x, np.int64)


def test_kernels_are_launched_by_the_calling_thread_and_uploads_by_the_copy_threads(monkeypatch):
    # The rolling path (more segments than slots): the calling thread only launches kernels.
    import threading

    dev = stream.SimulatedDevice()
    issuers: dict[str, set] = {"upload": set(), "reduce": set()}
    for name in issuers:
        real = getattr(dev, name)

        def record(*args, real=real, name=name):
            issuers[name].add(threading.get_ident())
            return real(*args)

        monkeypatch.setattr(dev, name, record)
    x = make_data("float32", 100_000, np.random.default_rng(11))
    got, _ = sim_reduce(x, "sum", device=dev, threads=4)
    check(x, "sum", got)
    assert issuers["reduce"] == {threading.get_ident()}
    assert issuers["upload"] and threading.get_ident() not in issuers["upload"]


def test_segments_group_consecutive_pieces_into_slots():
    assert stream._segments([], 8) == ([], [], [])
    assert stream._segments([3, 3, 3, 8, 1, 7, 2], 8) == (
        [0, 0, 1, 2, 3, 3, 4],
        [0, 3, 0, 0, 0, 1, 0],
        [6, 3, 8, 8, 2],
    )


MIB = 1 << 20


def sim_segments(x, op, *, threads=4, delay=0.0, monkeypatch=None, **kw):
    """Stream ``x`` with 1 MiB pieces in 4 MiB slots (several pieces per slot), counting kernels."""
    dev = stream.SimulatedDevice(upload_delay=delay)
    kernels = []
    real = dev.reduce

    def reduce(slot, dtype, count, op_, acc):
        kernels.append(count)
        return real(slot, dtype, count, op_, acc)

    dev.reduce = reduce
    kw.setdefault("budget", 16 * MIB)
    got, _ = sim_reduce(x, op, device=dev, slot_bytes=4 * MIB, threads=threads, **kw)
    return got, dev, kernels


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_several_pieces_per_slot(threads):
    # 8 MiB + 12 bytes of int32: pieces of about 1 MiB, four to a 4 MiB slot, one kernel per slot.
    x = np.random.default_rng(12).integers(-(2**31), 2**31, 2 * MIB + 3, dtype=np.int64).astype(np.int32)
    got, dev, kernels = sim_segments(x, "sum", threads=threads)
    assert int(got) == exact_int_sum(x, np.int64)
    assert sum(kernels) == x.size
    # Each copy thread's share comes in PIECES_PER_THREAD (2) pieces: several to a slot, except
    # for one thread, whose 4 MiB pieces fill a slot each.
    assert len(kernels) < dev.uploads if threads > 1 else len(kernels) == dev.uploads
    assert all(k * 4 <= 4 * MIB for k in kernels)
    y = make_data("float32", 3 * MIB + 5, np.random.default_rng(13))
    for op in OPS:
        check(y, op, sim_segments(y, op, threads=threads)[0])
    # A non-dense view: its pieces are C-order blocks of the 2-d array, grouped the same way.
    z = make_data("float64", 2048 * 1100, np.random.default_rng(14)).reshape(2048, 1100)[:, ::3]
    got, _, kernels = sim_segments(z, "sum", threads=threads)
    check(z, "sum", got)
    assert sum(kernels) == z.size


@pytest.mark.parametrize("ramp", ["off", "large", "all"])
@pytest.mark.parametrize("elements", [MIB // 4, 6 * MIB + 3])  # fits the slots; does not
def test_ramped_pieces_through_the_pipeline(monkeypatch, ramp, elements):
    # 1 MiB fits four 4 MiB slots' worth of budget (resident); 24 MiB does not (rolling).
    monkeypatch.setattr(stream, "RAMP", ramp)
    x = np.random.default_rng(15).integers(-(2**31), 2**31, elements, dtype=np.int64).astype(np.int32)
    uploads = []
    dev = stream.SimulatedDevice()
    real = dev.upload
    dev.upload = lambda slot, nbytes, offset=0: (uploads.append(nbytes), real(slot, nbytes, offset))[1]
    got, _ = sim_reduce(x, "sum", device=dev, budget=16 * MIB, slot_bytes=4 * MIB, threads=4)
    assert int(got) == exact_int_sum(x, np.int64)
    plan = stream.make_plan(x.nbytes, 4, budget=16 * MIB, slot_bytes=4 * MIB, threads=4)
    ramped = ramp == "all" or (ramp == "large" and x.nbytes > plan.n_slots * plan.slot_bytes)
    expected = stream.ramp_pieces(x.size, plan.piece_bytes // 4, 4, stream._PIECE_ALIGN // 4) if ramped else None
    expected = expected or stream.plan_pieces(x.shape, plan.piece_bytes // 4)
    assert sorted(uploads) == sorted(4 * (s.stop - s.start) for (s,) in expected)
    assert (len(set(uploads)) > 2) == ramped  # ramped pieces come in several sizes


def test_several_pieces_per_slot_wait_for_the_slots_previous_uploads(monkeypatch):
    # Two slots for six segments, and slow uploads: a slot is refilled only after its last
    # upload. The same run without the wait must come out wrong (the stand-in can fail).
    x = np.arange(6 * MIB, dtype=np.int32)  # 24 MiB
    got, _, _ = sim_segments(x, "sum", threads=4, delay=0.002, budget=8 * MIB)
    assert int(got) == exact_int_sum(x, np.int64)
    monkeypatch.setattr(stream.SimulatedDevice, "host_ready", lambda self, slot: None)
    got, _, _ = sim_segments(x, "sum", threads=4, delay=0.002, budget=8 * MIB)
    assert int(got) != exact_int_sum(x, np.int64)


@pytest.mark.parametrize("when", [1, 2, 5])
def test_a_failure_while_others_wait_for_a_slot(monkeypatch, when):
    # Two slots, many segments, eight copy threads: when a thread fails, others are waiting for
    # a free slot or for the slot another thread is taking. All must end, every slot must come
    # back, and the error must reach the caller.
    x = np.arange(6 * MIB, dtype=np.int32)
    flaky = fail_on_call(stream.SimulatedDevice.host_ready, when, OSError("simulated failure while taking a slot"))
    monkeypatch.setattr(stream.SimulatedDevice, "host_ready", flaky)
    dev = stream.SimulatedDevice(upload_delay=0.001)
    with pytest.raises(OSError, match="simulated failure"):
        sim_reduce(x, "sum", device=dev, budget=8 * MIB, slot_bytes=4 * MIB, threads=8)
    assert dev._pipelines[4 * MIB].in_use == 0
    got, _ = sim_reduce(x, "sum", device=dev, budget=8 * MIB, slot_bytes=4 * MIB, threads=8)
    assert int(got) == exact_int_sum(x, np.int64)


def test_an_interrupt_while_waiting_stops_the_copy_threads(monkeypatch):
    # Ctrl-C in the calling thread while it waits for copied pieces: the copy threads stop,
    # every slot comes back, the interrupt is raised, and the next call works.
    import queue

    class Interrupted(queue.SimpleQueue):
        calls = 0

        def get(self, *args, **kwargs):
            Interrupted.calls += 1
            if Interrupted.calls == 2:
                raise KeyboardInterrupt
            return super().get(*args, **kwargs)

    from types import SimpleNamespace

    # Only the pipeline's queue: concurrent.futures' executors use queue.SimpleQueue too.
    monkeypatch.setattr(stream, "queue", SimpleNamespace(SimpleQueue=Interrupted))
    dev = stream.SimulatedDevice(upload_delay=0.001)
    x = np.arange(6 * MIB, dtype=np.int32)
    with pytest.raises(KeyboardInterrupt):
        sim_reduce(x, "sum", device=dev, budget=8 * MIB, slot_bytes=4 * MIB, threads=8)
    assert dev._pipelines[4 * MIB].in_use == 0
    got, _ = sim_reduce(x, "sum", device=dev, budget=8 * MIB, slot_bytes=4 * MIB, threads=8)
    assert int(got) == exact_int_sum(x, np.int64)


# -- the resident path: every segment in its own slot, taken up front ------------------------


def resident_path_used(monkeypatch):
    """Count calls of each threaded path."""
    used = {"resident": 0, "rolling": 0}
    for name in used:
        real = getattr(stream._Pipeline, f"_run_{name}")

        def wrapped(self, *args, real=real, name=name):
            used[name] += 1
            return real(self, *args)

        monkeypatch.setattr(stream._Pipeline, f"_run_{name}", wrapped)
    return used


def test_small_inputs_take_every_slot_up_front(monkeypatch):
    used = resident_path_used(monkeypatch)
    x = make_data("float32", 5 * KIB, np.random.default_rng(20))  # 20 KiB: five 4 KiB segments
    for threads in (2, 4, 8):  # n_slots = threads + 3 >= 5
        got, dev = sim_reduce(x, "sum", threads=threads)
        check(x, "sum", got)
        assert dev._pipelines[4 * KIB].in_use == 0
    assert used == {"resident": 3, "rolling": 0}
    # More segments than the plan's slots: the rolling path.
    got, _ = sim_reduce(x, "sum", threads=2, budget=8 * KIB)
    check(x, "sum", got)
    assert used["rolling"] == 1


@pytest.mark.parametrize(
    ("method", "when"),
    [("upload", 1), ("upload", 3), ("upload", 5), ("reduce", 1), ("reduce", 2)],
)
def test_a_failure_on_the_resident_path_returns_every_slot(monkeypatch, method, when):
    # A failing upload (in a copy thread) or kernel launch (the calling thread launches the
    # segments' kernels after the copies) stops the call and returns every slot, the
    # launched segments' after their kernel; the pipeline still works afterwards.
    used = resident_path_used(monkeypatch)
    dev = stream.SimulatedDevice(upload_delay=0.001)
    monkeypatch.setattr(dev, method, fail_on_call(getattr(dev, method), when, RuntimeError("simulated failure")))
    x = np.arange(5 * KIB, dtype=np.int32)  # five 4 KiB segments: five uploads and kernels
    with pytest.raises(RuntimeError, match="simulated failure"):
        sim_reduce(x, "sum", device=dev)
    assert dev._pipelines[4 * KIB].in_use == 0
    got, _ = sim_reduce(x, "sum", device=dev)
    assert int(got) == exact_int_sum(x, np.int64)
    assert used == {"resident": 2, "rolling": 0}


def test_each_segments_kernel_follows_its_last_upload_on_the_resident_path(monkeypatch):
    # Every kernel is launched after all of its segment's uploads were issued (the stand-in's
    # streams run them in issue order, so a kernel issued early would reduce missing bytes;
    # a kernel launched at a segment's first piece fails this test).
    used = resident_path_used(monkeypatch)
    dev = stream.SimulatedDevice(upload_delay=0.002)
    # 8 MiB + 12 bytes: three segments of 4 MiB slots, cut into pieces of about 1 MiB.
    x = np.random.default_rng(16).integers(-(2**31), 2**31, 2 * MIB + 3, dtype=np.int64).astype(np.int32)
    for threads in (2, 4):
        got, _ = sim_reduce(x, "sum", device=dev, threads=threads, budget=16 * MIB, slot_bytes=4 * MIB)
        assert int(got) == exact_int_sum(x, np.int64)
    assert used == {"resident": 2, "rolling": 0} and dev.uploads > 3 * 2


def test_the_calling_thread_copies_on_the_resident_path(monkeypatch):
    import threading

    used = resident_path_used(monkeypatch)
    dev = stream.SimulatedDevice()
    uploaders = []
    real = dev.upload

    def record(slot, nbytes, offset=0):
        uploaders.append(threading.get_ident())
        real(slot, nbytes, offset)

    monkeypatch.setattr(dev, "upload", record)
    x = np.arange(5 * KIB, dtype=np.int32)
    for _ in range(20):  # the caller takes at least the first piece of some call
        got, _ = sim_reduce(x, "sum", device=dev, threads=4)
        assert int(got) == exact_int_sum(x, np.int64)
    assert used["resident"] == 20 and threading.get_ident() in uploaders


def test_a_failure_in_the_calling_threads_copy_waits_for_the_others(monkeypatch):
    import threading

    dev = stream.SimulatedDevice(upload_delay=0.002)
    real = dev.upload
    main = threading.get_ident()

    def flaky(slot, nbytes, offset=0):
        if threading.get_ident() == main:
            raise RuntimeError("simulated failure in the calling thread")
        real(slot, nbytes, offset)

    monkeypatch.setattr(dev, "upload", flaky)
    x = np.arange(5 * KIB, dtype=np.int32)
    with pytest.raises(RuntimeError, match="calling thread"):
        sim_reduce(x, "sum", device=dev, threads=4)
    assert dev._pipelines[4 * KIB].in_use == 0
    monkeypatch.setattr(dev, "upload", real)
    got, _ = sim_reduce(x, "sum", device=dev, threads=4)
    assert int(got) == exact_int_sum(x, np.int64)


def test_a_failing_fence_still_returns_every_slot(monkeypatch):
    # A copy fails, so no segment gets a kernel and every slot is fenced before it goes back;
    # the first fence fails too. Every slot still comes back, and both errors are reported.
    dev = stream.SimulatedDevice()
    real_upload = dev.upload
    fence = fail_on_call(dev.fence, 1, OSError("simulated fence failure"))
    monkeypatch.setattr(dev, "upload", fail_on_call(real_upload, 1, RuntimeError("simulated copy failure")))
    monkeypatch.setattr(dev, "fence", fence)
    x = np.arange(5 * KIB, dtype=np.int32)
    with pytest.raises(OSError, match="fence failure") as info:
        sim_reduce(x, "sum", device=dev)
    assert isinstance(info.value.__context__, RuntimeError)  # the copy failure, chained
    assert fence.calls == 5 and dev._pipelines[4 * KIB].in_use == 0
    monkeypatch.setattr(dev, "upload", real_upload)
    got, _ = sim_reduce(x, "sum", device=dev)
    assert int(got) == exact_int_sum(x, np.int64)


def test_an_interrupt_on_the_resident_path_waits_for_the_copy_threads(monkeypatch):
    import threading
    from concurrent import futures
    from types import SimpleNamespace

    wait = fail_on_call(futures.wait, 1, KeyboardInterrupt())
    monkeypatch.setattr(stream, "futures", SimpleNamespace(wait=wait, FIRST_EXCEPTION=futures.FIRST_EXCEPTION))
    dev = stream.SimulatedDevice(upload_delay=0.001)
    # A copy thread is still copying a piece when the calling thread has copied the rest (jobs
    # that have not started by then are cancelled, and nothing would be waited for).
    main, copying, real = threading.get_ident(), threading.Event(), dev.upload

    def upload(slot, nbytes, offset=0):
        if threading.get_ident() == main:
            copying.wait(10)
        else:
            copying.set()
            threading.Event().wait(0.05)
        real(slot, nbytes, offset)

    monkeypatch.setattr(dev, "upload", upload)
    x = np.arange(5 * KIB, dtype=np.int32)
    with pytest.raises(KeyboardInterrupt):
        sim_reduce(x, "sum", device=dev)
    assert wait.calls >= 2  # it waited again for the copy threads before raising
    assert dev._pipelines[4 * KIB].in_use == 0
    monkeypatch.setattr(dev, "upload", real)
    got, _ = sim_reduce(x, "sum", device=dev)
    assert int(got) == exact_int_sum(x, np.int64)


@pytest.mark.parametrize("engine", ENGINES)
def test_concurrent_calls_needing_every_slot_do_not_deadlock(engine):
    # Each call needs both slots of the cache at once; taken one by one, two calls could each
    # hold one and wait forever for the other.
    dev = stream.SimulatedDevice(upload_delay=0.0005, engine=engine)
    x = np.arange(2 * KIB, dtype=np.int32)  # two 4 KiB segments
    results = []

    def call():
        for _ in range(20):
            results.append(int(sim_reduce(x, "sum", device=dev, budget=8 * KIB, threads=2)[0]))

    run_in_threads([call] * 4)
    assert results == [exact_int_sum(x, np.int64)] * 80
    assert dev.slots_allocated == 2


def test_acquire_all():
    dev = stream.SimulatedDevice()
    p = stream._Pipeline(dev, 1024)
    with pytest.raises(ValueError, match="3 staging slots at once with a limit of 2"):
        p.acquire_all(3, 2)
    one = p.acquire(4)
    rest = p.acquire_all(3, 4)
    assert len({id(s) for s in [one, *rest]}) == 4 and p.in_use == 4
    for slot in [one, *rest]:
        p.release(slot)
    again = p.acquire_all(4, 4)
    assert dev.slots_allocated == 4 and p.in_use == 4
    for slot in again:
        p.release(slot)
    p.free()


@pytest.mark.parametrize("take", ["acquire", "acquire_all"])
def test_an_interrupted_wait_for_slots_leaves_the_queue(take):
    # A thread interrupted (Ctrl-C) while waiting for slots left its ticket at the head of the
    # queue: every later call on that slot size then waited forever, with slots free.
    p = stream._Pipeline(stream.SimulatedDevice(), 1024)
    held = p.acquire(1)  # another call holds the only slot
    wait = p._cond.wait

    def interrupted(*args, **kwargs):
        p._cond.wait = wait
        raise KeyboardInterrupt

    p._cond.wait = interrupted
    with pytest.raises(KeyboardInterrupt):
        p.acquire(1) if take == "acquire" else p.acquire_all(1, 1)
    assert len(p._waiting) == 0
    p.release(held)
    got = []
    waiter = threading.Thread(target=lambda: got.append(p.acquire(1)), daemon=True)
    waiter.start()
    waiter.join(10)
    assert got, "the next call waited with a slot free"
    p.release(got[0])
    p.free()


def test_groups_of_segments_take_other_slots_than_the_group_before():
    # The native engine streams an input larger than its slots in groups of half the slots.
    # The group after took the slots the group before had just returned (the most recently
    # returned first), so it waited for their uploads and kernels and no two groups ever
    # overlapped: 3 of the plan's 7 slots were ever made. It takes new slots first, then the
    # longest idle.
    kib = 1024

    class Device(stream.SimulatedDevice):
        def __init__(self):
            super().__init__(engine="native")
            self.used = []

        def host_ready(self, slot):
            super().host_ready(slot)
            self.used.append(id(slot))

    dev = Device()
    x = np.arange(30 * kib, dtype=np.int32)  # 30 segments of 4 KiB
    plan = stream.make_plan(x.nbytes, 4, budget=64 * kib, slot_bytes=4 * kib, threads=4)
    assert plan.n_slots == 7
    for _ in range(3):
        got = stream.reduce(x, "sum", _device=dev, budget=64 * kib, slot_bytes=4 * kib, threads=4)
        assert got == exact_int_sum(x, np.int64)
    assert dev.slots_allocated == 7 and len(set(dev.used)) == 7
    # Consecutive groups (3 segments each) share no slot.
    groups = [set(dev.used[i : i + 3]) for i in range(0, 30, 3)]
    assert all(not (a & b) for a, b in itertools.pairwise(groups)), groups


def test_strided_views_are_cut_in_memory_order():
    # A view with no dense 1-d form is cut into C-order blocks of its axes sorted by stride:
    # a strided view of a Fortran-order array was cut in C order, one element per cache line
    # (84.8 ms against 14.7 ms for the same data transposed, a review's run).
    x = np.asfortranarray(np.arange(64 * 48, dtype=np.float32).reshape(64, 48))
    for view in (x[:-1, :], x[:-1, ::-2], x[::-1, :-1]):
        src, pieces, contiguous = stream._pieces_of(view, 256)
        assert not contiguous and src.size == view.size
        strides = [abs(s) for s in src.strides]
        assert strides == sorted(strides, reverse=True), (view.strides, src.strides)
        got = sorted(np.concatenate([src[index].reshape(-1) for index in pieces]).tolist())
        assert got == sorted(view.reshape(-1).tolist())  # every element once
        dev = stream.SimulatedDevice()
        assert stream.reduce(view, "sum", _device=dev, slot_bytes=1024) == view.astype(np.float64).sum()
        assert stream.reduce(view, "max", _device=dev, slot_bytes=1024) == view.max()


def test_freeing_slots_in_use_is_refused():
    dev = stream.SimulatedDevice()
    p = stream._Pipeline(dev, 1024)
    slot = p.acquire(2)
    with pytest.raises(RuntimeError, match="in use"):
        p.free()
    p.release(slot)
    p.free()
    assert dev.slots_freed == 1


# -- concurrent calls: one cache, one copy pool -----------------------------------------------


def test_concurrent_calls_of_every_kind_never_deadlock(monkeypatch):
    # Calls on one device and slot size, at once: rolling (more segments than slots) and
    # resident (every segment's slot taken up front), dense and strided, through the Python copy
    # threads and the native engine, with small and large budgets. A resident call holding its
    # slots while its copy jobs waited behind rolling calls' jobs (which wait for those slots) on
    # the shared copy threads hung 4 runs in 5 of the first two calls below alone. The calls
    # that use the copy threads ask for 2, and the pool starts empty: 2 threads in all.
    monkeypatch.setattr(stream, "_pool", stream._CopyPool())
    py, native = stream.SimulatedDevice(), stream.SimulatedDevice(engine="native")
    big = np.arange(256 * KIB, dtype=np.int32)  # 1 MiB: 256 segments of 4 KiB
    small = np.arange(5 * KIB, dtype=np.int32)  # five segments
    big_strided = np.arange(512 * KIB, dtype=np.int32)[::2]
    small_strided = np.arange(10 * KIB, dtype=np.int32)[::2]
    want = {id(x): exact_int_sum(x, np.int64) for x in (big, small, big_strided, small_strided)}
    results: list[bool] = []

    def calls(dev, x, budget, threads, rounds):
        def call():
            for _ in range(rounds):
                got = stream.reduce(x, "sum", _device=dev, budget=budget, slot_bytes=4 * KIB, threads=threads)
                results.append(int(got) == want[id(x)])

        return call

    run_in_threads(
        [
            calls(py, big, 8 * KIB, 2, 2),  # deadlock.py's pair: rolling with 2 slots ...
            calls(py, small, 64 * KIB, 2, 40),  # ... and resident with 5
            calls(py, big_strided, 64 * KIB, 2, 2),  # deadlock2.py's: equal budgets
            calls(py, small_strided, 64 * KIB, 2, 40),
            calls(native, big, 64 * KIB, 4, 3),  # native, groups of slots
            calls(native, small, 64 * KIB, 4, 40),  # native, all slots at once
            calls(native, big_strided, 16 * KIB, 2, 2),  # strided: Python threads on the native stand-in
            calls(native, small_strided, 64 * KIB, 2, 40),
        ]
    )
    assert len(results) == 2 * 2 + 3 + 2 + 4 * 40 and all(results)
    for dev in (py, native):
        assert all(p.in_use == 0 for p in dev._pipelines.values())


def test_a_resident_call_does_not_wait_for_copy_threads_busy_elsewhere():
    # Every shared copy thread is taken by a job that cannot end before this call does (here:
    # jobs waiting for an event set after it): a resident call copies on its own thread and
    # must not wait for its own jobs to reach the pool.
    import threading

    pool = stream._executor(16)  # more than the call below asks for: it gets this pool
    release = threading.Event()
    blockers = [pool.submit(release.wait) for _ in range(len(threading.enumerate()) + 64)]
    try:
        x = np.arange(5 * KIB, dtype=np.int32)
        results = []
        run_in_threads([lambda: results.append(int(sim_reduce(x, "sum", threads=4)[0]))], timeout=30)
        assert results == [exact_int_sum(x, np.int64)]
    finally:
        release.set()
    for b in blockers:
        b.result(timeout=30)


def _slow_submits(monkeypatch, delay_thread: str, delay: float = 0.3):
    """Replace ``stream._executor`` so that thread ``delay_thread`` pauses before its 2nd submit."""
    import threading
    import time

    real = stream._executor

    class Slow:
        def __init__(self, pool):
            self.pool, self.n = pool, 0

        def submit(self, fn):
            self.n += 1
            if self.n == 2:
                time.sleep(delay)  # another call grows the pool meanwhile
            return self.pool.submit(fn)

    def executor(n):
        pool = real(n)
        return Slow(pool) if threading.current_thread().name == delay_thread else pool

    monkeypatch.setattr(stream, "_executor", executor)


@pytest.mark.parametrize("elements", [64 * KIB, 5 * KIB])  # rolling; resident
def test_growing_the_copy_pool_under_a_call(monkeypatch, elements):
    # Call A got the copy threads and is between two submits when call B asks for more threads.
    # The pool used to be replaced and the old one shut down: A's next submit failed ("cannot
    # schedule new futures after shutdown"), its slots stayed in use and later calls hung.
    import threading

    monkeypatch.setattr(stream, "_pool", stream._CopyPool())  # A starts it with 3 threads, B wants 16
    _slow_submits(monkeypatch, "A")
    dev = stream.SimulatedDevice()
    x = np.arange(elements, dtype=np.int32)
    want = exact_int_sum(x, np.int64)
    out = {}

    def call(threads):
        got = stream.reduce(x, "sum", _device=dev, budget=64 * KIB, slot_bytes=4 * KIB, threads=threads)
        out[threading.current_thread().name] = int(got)

    a = threading.Thread(target=call, args=(3,), name="A", daemon=True)  # two jobs or more: two submits
    b = threading.Thread(target=call, args=(16,), name="B", daemon=True)
    a.start()
    threading.Event().wait(0.05)
    b.start()
    for t in (a, b):
        t.join(30)
    assert not a.is_alive() and not b.is_alive()
    assert out == {"A": want, "B": want}
    assert dev._pipelines[4 * KIB].in_use == 0
    results = []
    run_in_threads([lambda: results.append(int(sim_reduce(x, "sum", device=dev)[0]))], timeout=30)
    assert results == [want]


class _FailingSecondSubmit:
    """A stand-in for the copy threads: the first job runs (slowly) on its own thread, the second
    submit raises. Records which jobs started and ended."""

    def __init__(self):
        import threading

        self.started, self.ended, self.n = [], [], 0
        self._threading = threading

    def submit(self, fn):
        self.n += 1
        if self.n == 2:
            raise RuntimeError("simulated submit failure")
        future = Future()

        def run():
            if not future.set_running_or_notify_cancel():
                return
            self.started.append(self.n)
            self._threading.Event().wait(0.3)  # still running when the submit fails
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                self.ended.append(self.n)

        self._threading.Thread(target=run, daemon=True).start()
        return future


@pytest.mark.parametrize("elements", [64 * KIB, 5 * KIB])  # rolling; resident
def test_a_failing_submit_waits_for_the_jobs_submitted(monkeypatch, elements):
    # The error is raised only once the job already submitted has ended (it writes into the
    # call's slots), and every slot is back.
    pool = _FailingSecondSubmit()
    monkeypatch.setattr(stream, "_executor", lambda n: pool)
    dev = stream.SimulatedDevice()
    x = np.arange(elements, dtype=np.int32)
    with pytest.raises(RuntimeError, match="simulated submit failure"):
        stream.reduce(x, "sum", _device=dev, budget=64 * KIB, slot_bytes=4 * KIB, threads=4)
    assert len(pool.ended) == len(pool.started) == 1
    assert dev._pipelines[4 * KIB].in_use == 0
    monkeypatch.undo()
    results = []
    run_in_threads([lambda: results.append(int(sim_reduce(x, "sum", device=dev)[0]))], timeout=30)
    assert results == [exact_int_sum(x, np.int64)]


def test_the_copy_pool_grows_without_replacing_its_threads():
    import threading

    pool = stream._executor(1)
    names = {t.name for t in threading.enumerate() if t.name.startswith("multireduce-stream")}
    assert stream._executor(pool._threads + 2) is pool
    grown = {t.name for t in threading.enumerate() if t.name.startswith("multireduce-stream")}
    assert names < grown and len(grown) == pool._threads
    assert pool.submit(lambda: 7).result(timeout=10) == 7


def test_waiting_calls_are_served_in_turn():
    # A call waiting for all the slots at once is not overtaken by one taking them one at a time.
    import threading

    dev = stream.SimulatedDevice()
    p = stream._Pipeline(dev, 1024)
    held = p.acquire_all(2, 2)
    order = []

    def all_at_once():
        slots = p.acquire_all(2, 2)
        order.append("all")
        for s in slots:
            p.release(s)

    def one():
        s = p.acquire(2)
        order.append("one")
        p.release(s)

    first = threading.Thread(target=all_at_once, daemon=True)
    first.start()
    while not p._waiting:
        threading.Event().wait(0.001)
    second = threading.Thread(target=one, daemon=True)
    second.start()
    while len(p._waiting) < 2:
        threading.Event().wait(0.001)
    p.release(held[0])  # one free slot: the second thread could take it, but the first waits longer
    threading.Event().wait(0.05)
    assert order == []
    p.release(held[1])
    first.join(10)
    second.join(10)
    assert order == ["all", "one"] and p.in_use == 0 and not p._waiting


def test_a_cancelled_wait_leaves_the_queue():
    import threading

    p = stream._Pipeline(stream.SimulatedDevice(), 1024)
    held = p.acquire(1)
    cancel = threading.Event()
    got = []
    t = threading.Thread(target=lambda: got.append(p.acquire(1, cancel=cancel)), daemon=True)
    t.start()
    while not p._waiting:
        threading.Event().wait(0.001)
    cancel.set()
    p.wake()
    t.join(10)
    assert got == [None] and not p._waiting
    p.release(held)
    assert p.acquire(1) is held


# -- the cache: within the largest budget asked for ---------------------------------------------


def test_the_cache_holds_at_most_the_largest_budget():
    # Budgets of 256 to 292 KiB give default slot sizes of budget // 4: ten sizes. The cache used
    # to keep every size's slots: 2,805,760 bytes after these ten calls.
    dev = stream.SimulatedDevice()
    x = np.ones(1 << 18, np.float32)  # 1 MiB: more segments than slots
    largest = 0
    for budget in [256 * KIB + 4096 * i for i in range(10)]:
        largest = max(largest, budget)
        got = stream.reduce(x, "sum", _device=dev, budget=budget, threads=2)
        assert got == np.float32(x.size)
        assert dev.device_bytes <= largest and dev.peak_device_bytes <= largest
    # Repeated calls with one setting allocate nothing.
    allocated = dev.slots_allocated
    for _ in range(3):
        assert stream.reduce(x, "max", _device=dev, budget=budget, threads=2) == 1.0
    assert dev.slots_allocated == allocated
    # A smaller budget afterwards keeps the largest as the bound: its slots fit beside the others.
    assert stream.reduce(x, "sum", _device=dev, budget=64 * KIB, threads=2) == np.float32(x.size)
    assert dev.device_bytes <= largest and all(p.in_use == 0 for p in dev._pipelines.values())
    # ... and does not shrink the cache to it: of the largest budget's four slots, only the
    # one that made room for the small ones is made again by a call with that budget (a cache
    # that kept the last budget instead of the largest freed all four).
    allocated = dev.slots_allocated
    assert stream.reduce(x, "max", _device=dev, budget=budget, threads=2) == 1.0
    assert dev.slots_allocated - allocated <= 1, dev.slots_allocated - allocated


@pytest.mark.parametrize("engine", ENGINES)
def test_slots_in_use_are_never_freed_and_the_cache_shrinks_back(engine):
    # Two calls of different slot sizes at once need more than the budget together: neither
    # loses a slot it uses (a freed stand-in slot fails every later upload into it), and once
    # both are done the cache is back within the budget.
    dev = stream.SimulatedDevice(upload_delay=0.0005, engine=engine)
    x = np.arange(40 * KIB, dtype=np.int32)  # 160 KiB
    want = exact_int_sum(x, np.int64)
    results = []

    def call(slot_bytes):
        def run():
            for _ in range(3):
                got = stream.reduce(x, "sum", _device=dev, budget=64 * KIB, slot_bytes=slot_bytes, threads=4)
                results.append(int(got))

        return run

    run_in_threads([call(4 * KIB), call(8 * KIB), call(16 * KIB)])
    assert results == [want] * 9
    assert all(p.in_use == 0 for p in dev._pipelines.values())
    assert dev.device_bytes <= 64 * KIB and dev.slots_allocated - dev.slots_freed == sum(
        p.allocated for p in dev._pipelines.values()
    )


def test_a_call_over_the_budget_keeps_its_slots_until_it_ends():
    # Slots of another size in use fill the budget, so the call's own slots put the cache over
    # it. The call must still reuse its slots: trimming on each release freed the slot just
    # returned, and the call made it again for its next piece (one slot made per piece).
    dev = stream.SimulatedDevice()
    staging = stream._staging_for(None, dev)
    other = staging.pipeline(16 * KIB, 64 * KIB)
    held = other.acquire_all(4, limit=4)  # 64 KiB: the whole budget, in use
    x = np.arange(64 * KIB, dtype=np.int32)  # 256 KiB: 64 pieces of 4 KiB
    plan = stream.make_plan(x.nbytes, x.itemsize, budget=64 * KIB, slot_bytes=4 * KIB, threads=1)
    before = dev.slots_allocated
    got = stream.reduce(x, "sum", _device=dev, budget=64 * KIB, slot_bytes=4 * KIB, threads=1)
    assert int(got) == exact_int_sum(x, np.int64)
    assert dev.slots_allocated - before <= plan.n_slots
    # Once the call ended its slots went (the budget is full of slots in use); the held ones stay.
    assert staging.pipelines[4 * KIB].allocated == 0 and dev.device_bytes == 64 * KIB
    for slot in held:
        other.release(slot)
    assert dev.device_bytes == 64 * KIB and not staging.over


def test_native_tables_are_not_reused_for_remade_slots():
    # A slot freed and made again can get its old pinned buffer back with another device buffer
    # or stream: a table cached by the pinned addresses alone would upload to the old ones.
    from types import SimpleNamespace

    p = stream._Pipeline(stream.SimulatedDevice(), 4 * KIB)
    old = [SimpleNamespace(host_ptr=1 << 20, device_ptr=2 << 20, stream_ptr=7)]
    new = [SimpleNamespace(host_ptr=1 << 20, device_ptr=3 << 20, stream_ptr=9)]
    first = p._native_table(1 << 30, 1024, 4, 4 * KIB, range(0, 1), old)
    again = p._native_table(1 << 30, 1024, 4, 4 * KIB, range(0, 1), new)
    assert set(first["device"]) == {2 << 20} and set(first["stream"]) == {7}
    assert set(again["device"]) == {3 << 20} and set(again["stream"]) == {9}


# -- sources ---------------------------------------------------------------------------------


def test_npy_file_and_memmap(tmp_path):
    x = make_data("float32", 100_000, np.random.default_rng(7)).reshape(100, 1000)
    path = tmp_path / "x.npy"
    np.save(path, x)
    for source in (path, str(path), np.load(path, mmap_mode="r")):
        got, _ = sim_reduce(source, "sum")
        check(x, "sum", got)
    mm = np.memmap(tmp_path / "raw.bin", dtype=np.int16, mode="w+", shape=(3000,))
    mm[:] = np.arange(3000) - 1500
    mm.flush()
    got, _ = sim_reduce(np.memmap(tmp_path / "raw.bin", dtype=np.int16, mode="r"), "min")
    assert got == -1500 and got.dtype == np.int16


def test_npy_file_read_flat_where_its_header_says(tmp_path, monkeypatch):
    # The header is parsed once (by the checks) and the data mapped at its offset: np.load is
    # not needed. Fortran order, format 2.0, an empty shape and an odd header length all read.
    def no_load(*args, **kwargs):
        raise AssertionError("np.load parses the header a second time")

    rng = np.random.default_rng(11)
    x = make_data("float64", 6 * 7 * 5, rng).reshape(6, 7, 5)
    cases = {
        "fortran.npy": (np.asfortranarray(x), (1, 0)),
        "v2.npy": (x[:, ::2], (2, 0)),
        "int16.npy": (np.arange(-500, 501, dtype=np.int16), (1, 0)),
    }
    for name, (a, version) in cases.items():
        with open(tmp_path / name, "wb") as fh:
            np.lib.format.write_array(fh, a, version=version)
    np.save(tmp_path / "empty.npy", np.zeros((0, 3), np.float32))
    monkeypatch.setattr(np, "load", no_load)
    for name, (a, _) in cases.items():
        for op in ("sum", "max", "min"):
            got, _ = sim_reduce(tmp_path / name, op)
            check(np.ascontiguousarray(a), op, got)
    got, _ = sim_reduce(tmp_path / "empty.npy", "sum")
    assert got == 0.0 and got.dtype == np.float32
    with pytest.raises(ValueError, match="zero-size array"):
        sim_reduce(tmp_path / "empty.npy", "max")


def test_a_bytes_path_is_the_same_file_as_its_str_path(tmp_path):
    # numpy.load and multireduce._shards.inspect_npy take bytes paths: so does stream.reduce
    # (it said "cannot stream an object of type builtins.bytes").
    x = make_data("float32", 10_000, np.random.default_rng(3)).reshape(100, 100)
    np.save(tmp_path / "x.npy", x)
    for op in OPS:
        want, _ = sim_reduce(str(tmp_path / "x.npy"), op)
        got, _ = sim_reduce(bytes(tmp_path / "x.npy"), op)
        assert got.tobytes() == want.tobytes() and got.dtype == want.dtype
        check(x, op, got)
    np.save(tmp_path / "good.npy", np.arange(10, dtype=np.float32))
    raw = bytearray((tmp_path / "good.npy").read_bytes())
    raw[10:20] = b"garbage{{{"
    (tmp_path / "corrupt_header.npy").write_bytes(bytes(raw))
    corrupt = r"corrupt_header\.npy: not a valid \.npy file \(truncated or corrupt header\)"
    for source in (str(tmp_path / "corrupt_header.npy"), bytes(tmp_path / "corrupt_header.npy")):
        with pytest.raises(ValueError, match=corrupt):
            sim_reduce(source)
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        sim_reduce(bytes(tmp_path / "missing.npy"))


def npy_with_header(path, shape, data: bytes = b"\0" * 16):
    """A .npy file of float32 whose header claims ``shape``, whatever the data."""
    h = repr({"descr": "<f4", "fortran_order": False, "shape": shape}).encode()
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + data)
    return path


def test_bad_sources(tmp_path):
    # Path sources get the CLI's checks (multireduce._shards.inspect_npy): objects are never
    # unpickled, and a file is named with what is wrong with it.
    np.save(tmp_path / "obj.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    with pytest.raises(TypeError, match=r"obj\.npy holds Python objects \(dtype object\); multireduce never unpickles"):
        sim_reduce(tmp_path / "obj.npy")
    np.savez(tmp_path / "two.npz", a=np.ones(3), b=np.ones(3))
    with pytest.raises(TypeError, match=r"two\.npz is an \.npz archive"):
        sim_reduce(tmp_path / "two.npz")
    (tmp_path / "text.txt").write_text("hello world\n")
    with pytest.raises(ValueError, match=r"text\.txt is not a \.npy file \(no NumPy magic\)"):
        sim_reduce(tmp_path / "text.txt")
    np.save(tmp_path / "good.npy", np.arange(10, dtype=np.float32))
    raw = bytearray((tmp_path / "good.npy").read_bytes())
    raw[10:20] = b"garbage{{{"
    (tmp_path / "corrupt_header.npy").write_bytes(bytes(raw))
    corrupt = r"corrupt_header\.npy: not a valid \.npy file \(truncated or corrupt header\)"
    with pytest.raises(ValueError, match=corrupt):
        sim_reduce(tmp_path / "corrupt_header.npy")
    (tmp_path / "short.npy").write_bytes((tmp_path / "good.npy").read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"short\.npy is truncated.*\(10,\) of float32 \(168 bytes\).* 167 bytes"):
        sim_reduce(tmp_path / "short.npy")
    for shape in ((2**62, 4), (2**62, 3)):  # int64 products wrap to 0 and below
        with pytest.raises(ValueError, match=r"huge\.npy is truncated or its header is corrupt"):
            sim_reduce(npy_with_header(tmp_path / "huge.npy", shape))
    with pytest.raises(ValueError, match=r"neg\.npy: not a valid \.npy file .*negative dimension"):
        sim_reduce(npy_with_header(tmp_path / "neg.npy", (-1,)))
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        sim_reduce(tmp_path / "missing.npy")
    got, _ = sim_reduce(npy_with_header(tmp_path / "ok.npy", (2, 2)), "sum")
    assert got == 0.0 and got.dtype == np.float32
    with pytest.raises(TypeError, match="cannot stream"):
        sim_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match="complex"):
        sim_reduce(np.ones(4, dtype=np.complex64))


def wrapped_int(value: int, dtype) -> int:
    """``value`` modulo 2**bits of ``dtype``, as that integer dtype holds it."""
    bits = np.dtype(dtype).itemsize * 8
    value %= 1 << bits
    return value - (1 << bits) if np.dtype(dtype).kind == "i" and value >= 1 << (bits - 1) else value


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "int64", "bool"])
def test_integer_products_stream_exactly(engine, dtype):
    # Products wrap modulo 2**64 in any order: every cut gives NumPy's bits.
    rng = np.random.default_rng(21)
    x = rng.choice(np.array([1, 3, -1, 7, 1, 1]), 20_000).astype(dtype) if dtype != "bool" else rng.random(9000) > 0.01
    got, _ = sim_reduce(x, "prod", engine=engine)
    result = np.uint64 if np.dtype(dtype).kind == "u" else np.int64
    assert got.dtype == result and int(got) == wrapped_int(math.prod(int(v) for v in x.tolist()), result)
    got, _ = sim_reduce(x, "prod", engine=engine, dtype=np.int16)  # dtype= narrower: the same low bits
    assert got.dtype == np.int16 and int(got) == wrapped_int(math.prod(int(v) for v in x.tolist()), np.int16)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("dtype", "requested"), [("int32", "float64"), ("float64", None), ("float32", None)])
def test_float_products_are_refused(engine, dtype, requested):
    # The review's case: int32 values 0-99 as float64. NumPy multiplies in order and reaches a
    # zero before the product overflows: 0.0. The pipeline's pieces without a zero overflowed
    # to inf, and inf * 0 is nan. Which one comes out depends on the cut, so it is refused.
    x = np.random.default_rng(2).integers(0, 100, 3000).astype(dtype)
    if requested is not None:
        assert np.prod(x, dtype=requested) == 0.0 and core.reduce(x, "prod", dtype=requested) == 0.0
    result = np.dtype(requested or dtype)
    refused = f"cannot prod {dtype} to a {result} result: .* for a float product use multireduce.reduce"
    with pytest.raises(NotImplementedError, match=refused):
        sim_reduce(x, "prod", engine=engine, dtype=requested)
    da = pytest.importorskip("dask.array")
    with pytest.raises(NotImplementedError, match=f"cannot prod {dtype} to a {result} result"):
        stream.reduce(da.from_array(x, chunks=500), "prod", dtype=requested, _device=stream.SimulatedDevice())


@pytest.mark.parametrize("op", ["count_nonzero", "nanmax", "any"])
def test_other_fold_ops_stream_on_the_stand_in(op):
    # 5000 float64 over 4 KiB slots: many pieces, combined with the op's own rule.
    x = np.random.default_rng(11).choice(np.array([0.5, 1.0, 2.0, -1.0]), 5000)
    x[[7, 4000]] = np.nan
    got, _ = sim_reduce(x, op)
    if op == "count_nonzero":
        assert got == 5000
    elif op == "nanmax":
        assert got == 2.0
    else:
        assert got == np.True_


def _core_refusal(x) -> str:
    with pytest.raises(TypeError) as info:
        core.reduce(x, "sum")
    return str(info.value)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("engine", ENGINES)
def test_masked_arrays_and_matrices_are_refused_as_the_core_refuses_them(engine):
    # A masked array was reduced without its mask (107.0 for NumPy's 7.0), and a matrix through
    # the Python threads failed with a reshape error.
    masked = np.ma.masked_greater(np.array([1.0, 2.0, 100.0, 4.0] * 3000), 50)
    assert masked.sum() == 7.0 * 3000
    matrix = np.asmatrix(np.arange(20_000, dtype=np.float32).reshape(100, 200))
    for x in (masked, matrix, matrix[:, ::3]):
        with pytest.raises(TypeError) as info:
            sim_reduce(x, "sum", engine=engine)
        assert str(info.value) == _core_refusal(x)
    with pytest.raises(TypeError, match="numpy.ma.MaskedArray"):
        sim_reduce(np.ma.masked_array(np.zeros(0)), "max", engine=engine)  # empty too


@pytest.mark.parametrize("engine", ENGINES)
def test_dask_arrays_of_masked_chunks_are_refused(engine):
    da = pytest.importorskip("dask.array")
    x = np.arange(10_000, dtype=np.float64)
    # Masked meta: refused when the graph is built (the Dask layer's check).
    with pytest.raises(TypeError, match="Dask array of numpy.ma.MaskedArray chunks"):
        stream.reduce(da.ma.masked_greater(da.from_array(x, chunks=1000), 50), "sum", _device=stream.SimulatedDevice())
    # Masked chunks under a plain meta: refused when a chunk is streamed, as the core refuses them.
    d = da.from_array(x, chunks=1000).map_blocks(lambda b: np.ma.masked_greater(b, 50), meta=np.array((), x.dtype))
    dev = stream.SimulatedDevice(engine=engine)
    refused = "cannot reduce a Dask array of numpy.ma.MaskedArray chunks: .* ignore the mask"
    with pytest.raises(TypeError, match=refused):
        stream.reduce(d, "sum", budget=64 * KIB, slot_bytes=4 * KIB, _device=dev)
    assert dev._pipelines[4 * KIB].in_use == 0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_dask_chunks_of_another_dtype_than_declared_are_refused(engine, op):
    # Chunks really int64, declared int8: the sum came back as an int64 sum, and max said
    # "op 'max' does not take dtype=". The Dask layer's check and message, as treereduce's.
    da = pytest.importorskip("dask.array")
    from multireduce import dask as mdask

    d = da.arange(20_000, chunks=5000, dtype=np.int64).map_blocks(lambda b: b, dtype=np.int8)
    with pytest.raises(TypeError) as want:
        mdask.treereduce(d, op).compute()
    assert "a chunk of dtype int64 in a Dask array that declares dtype int8" in str(want.value)
    with pytest.raises(TypeError) as got:
        stream.reduce(d, op, budget=64 * KIB, slot_bytes=4 * KIB, _device=stream.SimulatedDevice(engine=engine))
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("engine", ENGINES)
def test_dask_chunks_that_are_scalars_or_lists_stream(engine):
    # A Dask reduction's 0-d result has a NumPy scalar for its chunk (from_delayed may give a
    # Python one, or a list): treereduce takes them; stream.reduce raised TypeError.
    da = pytest.importorskip("dask.array")
    import dask

    total = da.arange(10, chunks=3).astype(np.float64).sum()  # chunk: numpy.float64
    counts = da.arange(10, chunks=3, dtype=np.int64).sum()  # chunk: numpy.int64
    listed = da.from_delayed(dask.delayed(lambda: [1.5, -2.0, 4.0])(), shape=(3,), dtype=np.float64)
    for d, op, want in ((total, "sum", 45.0), (counts, "max", 45), (listed, "sum", 3.5), (listed, "min", -2.0)):
        got, _ = sim_reduce(d, op, engine=engine)
        assert got == want and np.asarray(got).dtype == np.asarray(d.treereduce(op).compute()).dtype, (d, op, got)


@pytest.mark.parametrize("engine", ENGINES)
def test_threads_beyond_the_limit_are_refused(engine):
    # 2**40 threads with room for as many slots reached the C engine as a cut C int ("bad
    # arguments to mr_stage"); with the Python threads it passed unchecked.
    x = np.arange(30 * KIB, dtype=np.int32)
    for threads in (2**40, 2**31, 257):
        with pytest.raises(ValueError, match=re.escape(f"{THREADS}, got {threads}")):
            sim_reduce(x, "sum", engine=engine, threads=threads, budget=2**70)
    assert stream.MAX_THREADS == 256
    got, _ = sim_reduce(x, "sum", engine=engine, threads=stream.MAX_THREADS)
    assert int(got) == exact_int_sum(x, np.int64)


@pytest.mark.parametrize("split_every", [0, -3, 1, "x", 2.5, True, {0: 1}, 2, 50, {0: 4}])
def test_split_every_is_refused_for_sources_other_than_dask_arrays(split_every):
    # It sets the fan-in of a Dask array's combine tree; any value for another source was
    # silently ignored, invalid ones too.
    for x in (np.arange(20_000, dtype=np.float32), np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]):
        with pytest.raises(ValueError, match=r"split_every is for a Dask array source only .* takes None, got"):
            sim_reduce(x, "sum", split_every=split_every)
    da = pytest.importorskip("dask.array")
    d = da.from_array(np.arange(20_000, dtype=np.float32), chunks=1000)
    if split_every in (2, 50, {0: 4}):
        dev = stream.SimulatedDevice()
        got = stream.reduce(d, "sum", split_every=split_every, budget=64 * KIB, slot_bytes=4 * KIB, _device=dev)
        assert float(got) == float(sum(range(20_000)))
    else:  # the Dask layer's own check
        with pytest.raises((TypeError, ValueError), match="split_every"):
            stream.reduce(d, "sum", split_every=split_every, _device=stream.SimulatedDevice())


@pytest.mark.parametrize("device", [1.5, True, False, "0", np.float64(0)])
def test_device_must_be_an_integer_ordinal(device):
    # int(device) made 1.5 and True mean device 1. Checked before anything needs CuPy, so also
    # with the stand-in (which ignores device=) and for _cupy_pipeline (Dask tasks, scripts).
    accepted = re.escape("device= must be an integer CUDA device ordinal (0 to the device count - 1), or None")
    with pytest.raises(
        TypeError, match=f"{accepted}.*, got {re.escape(repr(device))} of type {type(device).__name__}$"
    ):
        stream.reduce(np.ones(100, np.float32), "sum", device=device, _device=stream.SimulatedDevice())
    with pytest.raises(TypeError, match=accepted):
        stream._cupy_pipeline(device, 4096)
    da = pytest.importorskip("dask.array")
    with pytest.raises(TypeError, match=accepted):
        stream.reduce(da.ones(10, chunks=5), "sum", device=device, _device=stream.SimulatedDevice())
    # NumPy integers are integers (the stand-in has no device to check them against).
    assert stream.reduce(np.ones(100, np.float32), "sum", device=np.int64(0), _device=stream.SimulatedDevice()) == 100


def test_every_launched_kernel_is_waited_for_after_a_failed_wait(monkeypatch):
    # The native path's partial cells are reused by the thread's next call: a wait that fails
    # must not leave the later kernels running. It used to stop at the first failing wait.
    dev = stream.SimulatedDevice(engine="native")
    waited = []
    real = dev.wait_cell

    def wait_cell(cells, k):
        real(cells, k)
        waited.append(k)
        if k in (1, 5):
            raise RuntimeError(f"simulated failure waiting for cell {k}")

    monkeypatch.setattr(dev, "wait_cell", wait_cell)
    x = np.arange(30 * KIB, dtype=np.int32)  # 30 segments: 30 kernels, in groups of 3
    with pytest.raises(RuntimeError, match="waiting for cell 1"):
        sim_reduce(x, "sum", device=dev)
    assert waited == list(range(30))
    assert dev._pipelines[4 * KIB].in_use == 0
    monkeypatch.setattr(dev, "wait_cell", real)
    assert int(sim_reduce(x, "sum", device=dev)[0]) == exact_int_sum(x, np.int64)


def test_every_launched_kernel_is_waited_for_after_a_failed_copy(native_stand_in, monkeypatch):
    # The 20th upload fails (in the group of segments 18-20): the 18 kernels launched before it
    # are waited for, and the copy's error is raised.
    dev = stream.SimulatedDevice(engine="native")
    waited = []
    real = dev.wait_cell
    monkeypatch.setattr(dev, "wait_cell", lambda cells, k: (real(cells, k), waited.append(k)))
    native_stand_in.mr_test_configure(20, 1)
    with pytest.raises(RuntimeError, match=r"upload of piece \d+ \(4096 bytes\) failed: error 1"):
        sim_reduce(np.arange(30 * KIB, dtype=np.int32), "sum", device=dev)
    assert waited == list(range(18)) and dev._pipelines[4 * KIB].in_use == 0


@pytest.mark.parametrize("size", [0, 3])
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"budget": 8, "slot_bytes": None}, "cannot hold one element"),
        ({"budget": 100, "slot_bytes": 60}, "fewer than two staging buffers"),
        ({"budget": 100, "slot_bytes": 1000}, "fewer than two staging buffers"),
    ],
)
def test_settings_are_checked_before_the_device_and_for_empty_inputs(size, settings, message):
    # A host array met the device (and, without CuPy, its ModuleNotFoundError) before the
    # settings, and an empty one returned the identity whatever they were; a Dask source
    # raised these ValueErrors. Now every source and size does, with or without CuPy.
    with pytest.raises(ValueError, match=message):
        stream.reduce(np.ones(size), "sum", **settings)
    with pytest.raises(ValueError, match=message):
        sim_reduce(np.ones(size), "sum", **settings)


def test_device_and_split_every_are_checked_before_the_device():
    # Without CuPy these were its ModuleNotFoundError: a negative device needs no device
    # count to be refused, and a Dask source's split_every no device at all.
    da = pytest.importorskip("dask.array")
    with pytest.raises(ValueError, match="device= must be an integer CUDA device ordinal .*got -1"):
        stream.reduce(np.ones(4), "sum", device=-1)
    with pytest.raises(ValueError, match="split_every accepts None, an int >= 2.*got 1"):
        stream.reduce(da.ones(10, chunks=5), "sum", split_every=1)
    with pytest.raises(FileNotFoundError, match="an empty path"):  # Path("") is "." (IsADirectoryError)
        stream.reduce("", "sum")


@pytest.mark.parametrize("op", ["mean", "var", "argmax"])
def test_state_ops_are_refused(op):
    with pytest.raises(NotImplementedError, match="has a state"):
        stream.reduce(np.ones(10), op)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="checks the error without CuPy")
def test_without_cupy_nothing_falls_back():
    # The message says what to install, and what to call on the CPU (it was Python's bare
    # "No module named 'cupy'").
    with pytest.raises(ModuleNotFoundError, match=r"needs CuPy .*install multireduce\[gpu\].*multireduce\.reduce"):
        stream.reduce(np.ones(10), "sum")
    # Nothing to move is no exception: the identity used to come back from the CPU.
    for empty in (np.ones(0, np.float32), np.ones((3, 0), np.int8)):
        with pytest.raises(ModuleNotFoundError):
            stream.reduce(empty, "sum")
    da = pytest.importorskip("dask.array")
    with pytest.raises(ModuleNotFoundError):
        stream.reduce(da.ones(0, chunks=1), "sum")
    # The dask.config key that split_every=None falls back to is a setting too, checked
    # first (it met the device's ModuleNotFoundError before).
    dask = pytest.importorskip("dask")
    with dask.config.set(split_every=1), pytest.raises(ValueError, match="the dask.config key 'split_every'"):
        stream.reduce(da.arange(10, chunks=3), "sum")
    assert stream.free_staging() == 0 and stream.staging_info() == []


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("split_every", [None, 2, 50])
@pytest.mark.parametrize("op", OPS)
def test_dask_numpy_chunks(op, split_every, engine):
    da = pytest.importorskip("dask.array")
    x = make_data("float32", 60_000, np.random.default_rng(8)).reshape(200, 300)
    # Blocks larger than a slot (several pieces each): strided (from_array's views of x), and
    # dense (row blocks), which the native engine takes.
    for d in (da.from_array(x, chunks=(33, 70)), da.from_array(x, chunks=(33, 300))):
        dev = stream.SimulatedDevice(engine=engine)
        got = stream.reduce(d, op, budget=64 * KIB, slot_bytes=4 * KIB, split_every=split_every, _device=dev)
        check(x, op, got)
        assert dev.peak_device_bytes <= 64 * KIB
    # Six blocks of 33 x 300 float32 (10 segments each) and one of 2 x 300 (1), one segment a call.
    assert dev.native_calls == (0 if engine == "python" else 6 * 10 + 1)


def test_dask_empty_blocks_and_errors():
    da = pytest.importorskip("dask.array")
    x = -np.arange(1, 11, dtype=np.float64)
    d = da.from_array(x, chunks=((0, 4, 0, 6),))
    dev = stream.SimulatedDevice()
    assert stream.reduce(d, "max", budget=64 * KIB, slot_bytes=4 * KIB, _device=dev) == -1.0
    with pytest.raises(ValueError, match="zero-size"):
        stream.reduce(da.zeros(0, chunks=1), "min", _device=dev)
    unknown = da.from_array(x, chunks=3)
    unknown = unknown[unknown > 0]  # unknown sizes, all empty
    with pytest.raises(ValueError, match="zero-size"):
        stream.reduce(unknown, "max", budget=64 * KIB, slot_bytes=4 * KIB, _device=dev)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("exc", [OSError("simulated chunk failure"), KeyboardInterrupt()])
def test_a_failing_dask_chunk_stops_the_calls_other_chunks_before_raising(monkeypatch, engine, exc):
    # Dask's scheduler raises a task's error at once, while the call's other tasks are still
    # streaming their chunks: they went on after the call had raised, holding slots (so that
    # free_staging refused) and copying chunks nobody wanted.
    import threading
    import time

    da = pytest.importorskip("dask.array")
    dev = stream.SimulatedDevice(engine=engine)
    waits = []
    lock = threading.Lock()
    real = dev.host_ready

    def host_ready(slot):
        with lock:
            waits.append(slot)
            first = len(waits) == 1
        if first:
            raise exc
        time.sleep(0.01)  # the other chunks are slower than the failure
        real(slot)

    monkeypatch.setattr(dev, "host_ready", host_ready)
    x = da.from_array(np.arange(64_000, dtype=np.int64), chunks=8_000)  # 8 chunks of 16 segments
    with pytest.raises(type(exc)):
        stream.reduce(x, "sum", budget=64 * KIB, slot_bytes=4 * KIB, _device=dev)
    done = len(waits)
    assert all(p.in_use == 0 and p.calls == 0 for p in dev._pipelines.values())
    time.sleep(0.5)
    assert len(waits) == done  # nothing streams once the call has raised
    monkeypatch.setattr(dev, "host_ready", real)
    assert stream.reduce(x, "sum", budget=64 * KIB, slot_bytes=4 * KIB, _device=dev) == 64_000 * 63_999 // 2


# -- GPU -------------------------------------------------------------------------------------

GIB = 1 << 30


def _cupy():
    return pytest.importorskip("cupy")


def _pinned(cupy, n, dtype):
    mem = cupy.cuda.alloc_pinned_memory(n * np.dtype(dtype).itemsize)
    return np.frombuffer(mem, dtype=dtype, count=n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "uint64", "bool"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("engine", ["python", "native"])
def test_gpu_values(op, dtype, engine, monkeypatch):
    monkeypatch.setattr(stream, "COPY_ENGINE", engine)
    assert stream.copy_engine()["engine"] == engine
    x = make_data(dtype, 17 * 176_471, np.random.default_rng(10))
    check(x, op, stream.reduce(x, op))
    check(x, op, stream.reduce(x, op, budget=8 << 20, slot_bytes=2 << 20))  # more segments than slots
    check(x.reshape(-1, 17)[:, ::2], op, stream.reduce(x.reshape(-1, 17)[:, ::2], op))  # strided


_NATIVE_FAILURE = """
import numpy as np, cupy
from multireduce import stream
device = stream._CupyDevice(cupy.cuda.Device().id)
src = np.arange(1 << 16, dtype=np.uint8)
staged = np.frombuffer(cupy.cuda.alloc_pinned_memory(src.size), np.uint8, src.size)
buf = cupy.zeros(src.size, dtype=cupy.uint8)
table = np.zeros(2, stream._hostcopy.PIECE_DTYPE)
table["src"] = src.ctypes.data + np.array([0, 1 << 15], np.uint64)
table["staged"] = staged.ctypes.data + np.array([0, 1 << 15], np.uint64)
table["nbytes"] = 1 << 15
table["device"] = 8  # no device memory there
try:
    device.stage_native(table, 2)
except RuntimeError as exc:
    print("raised:", exc)
table["device"] = buf.data.ptr + np.array([0, 1 << 15], np.uint64)
device.stage_native(table, 2)  # the same threads, a good table
cupy.cuda.Device().synchronize()
print("good table:", bool((buf.get() == src).all()))
"""


@pytest.mark.gpu
def test_gpu_native_upload_failure_names_the_cuda_error():
    # In a child process: should the driver take the bad address as a fault instead, the
    # sticky error stays out of this process's context.
    import subprocess
    import sys

    _cupy()
    done = subprocess.run([sys.executable, "-c", _NATIVE_FAILURE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.search(r"raised: .*upload of piece [01] \(32768 bytes\) failed: CUDA_ERROR_\w+ \(\d+\)", done.stdout)
    assert "good table: True" in done.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["prod", "nanprod", "nansum", "nanmax", "nanmin", "any", "all", "count_nonzero"])
def test_gpu_every_fold_op_streams(op):
    # The other fold ops stream through the same pipeline on their own kernels: pieces from
    # several slots (a small budget), NaN in one piece, against independent references: exact
    # for every op but nansum (NumPy's own result, or Python integers for the product; the
    # extremes bit for bit, with IEEE 754-2019's signed-zero order), and nansum within half an
    # ulp plus its float64 accumulation's bound of the exact sum (reference.assert_float_sum).
    rng = np.random.default_rng(13)
    if op in ("prod", "nanprod"):
        # Integers (float products are refused): 60 factors other than one, wrapping in int64.
        x = np.ones(3_000_017, dtype=np.int32)
        x[rng.integers(0, x.size, 60)] = rng.choice(np.array([3, 7, -5], dtype=np.int32), size=60)
        with pytest.raises(NotImplementedError, match=f"cannot {op} float32 to a float32 result"):
            stream.reduce(x.astype(np.float32), op)
    else:
        x = make_data("float32", 3_000_017, rng)
        x[123_456] = np.nan
        x[2_000_003] = -0.0  # a zero (of either sign): all is False, count_nonzero one less
    got = stream.reduce(x, op, budget=8 << 20, slot_bytes=2 << 20)
    if op in ("prod", "nanprod"):
        assert got.dtype == np.int64, got.dtype
        assert int(got) == wrapped_int(math.prod(int(v) for v in x[x != 1].tolist()), np.int64), got
    elif op == "nansum":
        # Each segment's partial is a float64 sum on the GPU, the partials add in float64 and
        # the total is rounded once to float32.
        assert_float_sum(got, x, skip_nan=True)
    elif op in ("nanmax", "nanmin"):
        largest = op == "nanmax"
        want = ieee_extreme_axes(x, largest=largest, skip_nan=True)
        assert want == (np.nanmax(x) if largest else np.nanmin(x))  # NumPy's own value (no zero tie here)
        assert_same_bits(got, want)
        # Zeros only, with the winning zero in the last segment and a NaN in the first: the
        # segments' partials are -0.0 (+0.0 for nanmin) but one, and must combine to it.
        z = np.full(1_000_003, -0.0 if largest else 0.0, dtype=np.float32)
        z[7] = np.nan
        z[-5] = -z[-5]
        assert_same_bits(stream.reduce(z, op, budget=1 << 20, slot_bytes=256 << 10), np.float32(z[-5]))
    else:
        want = {"any": np.any, "all": np.all, "count_nonzero": np.count_nonzero}[op](x)
        assert op != "all" or not want  # the -0.0 makes all False; NaN is true, so any is True
        assert_same_bits(got, np.asarray(want, dtype=np.int64 if op == "count_nonzero" else np.bool_))


@pytest.mark.gpu
def test_gpu_pinned_detection_and_direct_path():
    cupy = _cupy()
    device = stream._CupyDevice(cupy.cuda.Device().id)
    h = _pinned(cupy, 2**24 + 5, np.float32)
    h[:] = make_data("float32", h.size, np.random.default_rng(11))
    assert device.is_pinned(h) and device.is_pinned(h[3:])
    assert not device.is_pinned(np.ones(1000))
    check(h, "sum", stream.reduce(h, "sum"))
    h[77] = np.nan
    assert math.isnan(float(stream.reduce(h, "max")))


@pytest.mark.gpu
def test_gpu_pinned_pieces_reuse_their_slots_in_order():
    # 64 pinned pieces through a 4 MiB budget: each upload into a slot must wait for the
    # kernel that last read it, and each kernel for its upload; a piece overwritten early or
    # read before it arrived changes the exact sums and extremes.
    cupy = _cupy()
    h = _pinned(cupy, 2**24, np.float32)
    rng = np.random.default_rng(21)
    for op in ("sum", "max", "min"):
        h[:] = make_data("float32", h.size, rng)
        for _ in range(3):
            check(h, op, stream.reduce(h, op, budget=4 << 20, slot_bytes=1 << 20))
    # Each 1 MiB piece holds its own index: a piece read before its upload, or overwritten by
    # the next one in its slot, changes the exact sum (2**18 * (0 + 1 + ... + 63) = 63 * 2**23).
    h[:] = np.arange(h.size) // (1 << 18)
    for _ in range(3):
        assert float(stream.reduce(h, "sum", budget=4 << 20, slot_bytes=1 << 20)) == (1 << 18) * sum(range(64))


@pytest.mark.gpu
def test_gpu_write_combined_staging(monkeypatch):
    # The switch allocates the slots write-combined (the CPU only writes them): same results,
    # from fresh slots, on both threaded paths.
    cupy = _cupy()
    stream.free_staging()
    monkeypatch.setattr(stream, "WRITE_COMBINED", True)
    try:
        x = make_data("float32", 2**24 + 3, np.random.default_rng(14))
        check(x, "sum", stream.reduce(x, "sum"))  # resident: every slot taken up front
        check(x, "min", stream.reduce(x, "min", budget=16 << 20, slot_bytes=4 << 20))  # rolling
        import ctypes

        slot = stream._cupy_pipeline(cupy.cuda.Device().id, stream.DEFAULT_SLOT_BYTES)._free[0]
        flags = ctypes.c_uint(0)
        assert ctypes.CDLL("libcuda.so.1").cuMemHostGetFlags(ctypes.byref(flags), ctypes.c_void_p(slot.host_ptr)) == 0
        assert flags.value & cupy.cuda.runtime.hostAllocWriteCombined
    finally:
        stream.free_staging()


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["python", "native"])
def test_gpu_dask_numpy_chunks(engine, monkeypatch):
    monkeypatch.setattr(stream, "COPY_ENGINE", engine)
    da = pytest.importorskip("dask.array")
    x = make_data("float32", 2**24, np.random.default_rng(12))
    d = da.from_array(x, chunks=2**20)
    for split_every in (None, 100):
        check(x, "sum", stream.reduce(d, "sum", split_every=split_every))
    check(x, "max", stream.reduce(d, "max"))


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_8_gib_through_a_1_gib_budget():
    cupy = _cupy()
    n = 2**31  # float32: 8 GiB on the host
    block = 2**24
    pattern = (np.arange(block) % 1024).astype(np.float32)
    x = np.empty(n, dtype=np.float32)
    for i in range(0, n, block):
        x[i : i + block] = pattern
    exact = (n // block) * int(pattern.astype(np.int64).sum())
    pool = cupy.get_default_memory_pool()
    stream.free_staging()
    before = pool.total_bytes()
    got = stream.reduce(x, "sum", budget=GIB)
    assert got.dtype == np.float32 and float(got) == float(np.float32(exact))
    # Staging buffers (within the budget) plus partials and the kernel's workspaces.
    assert pool.total_bytes() - before <= GIB + (64 << 20)
    assert sum(r["device_bytes"] for r in stream.staging_info()) <= GIB
    x[n - 3] = 5000.0
    assert float(stream.reduce(x, "max", budget=GIB)) == 5000.0


@pytest.mark.gpu
def test_gpu_10000_calls_do_not_grow_memory():
    cupy = _cupy()
    x = make_data("float32", 2**18, np.random.default_rng(13))
    h = _pinned(cupy, 2**18, np.float32)
    h[:] = x
    want = stream.reduce(x, "sum")
    for _ in range(10):  # CuPy's pool holds blocks per stream: let every stream in use get its own
        stream.reduce(h, "sum")
        stream.reduce(x, "sum")
    pool, pinned_pool = cupy.get_default_memory_pool(), cupy.get_default_pinned_memory_pool()
    start = (pool.used_bytes(), pool.total_bytes(), pinned_pool.n_free_blocks(), stream.staging_info())
    for i in range(10_000):
        got = stream.reduce(x if i % 2 else h, "sum")
    assert got.tobytes() == want.tobytes()
    end = (pool.used_bytes(), pool.total_bytes(), pinned_pool.n_free_blocks(), stream.staging_info())
    # Nothing in use grows: device memory held, pinned blocks, staging slots. CuPy's pool may
    # cache a block or two more across 10,000 calls (+3 KiB in h200_1580de2, +2.5 KiB in
    # h200_1249179, used bytes unchanged both times): bounded far below what any per-call
    # leak would add (a pool block is at least 512 bytes: 5 MB over these calls).
    assert (end[0], end[2], end[3]) == (start[0], start[2], start[3])
    assert start[1] <= end[1] <= start[1] + (64 << 10), (start[1], end[1])
    freed = stream.free_staging()
    assert freed >= 2 and stream.staging_info() == []


@pytest.mark.gpu
def test_gpu_device_must_exist():
    cupy = _cupy()
    count = cupy.cuda.runtime.getDeviceCount()
    x = np.ones(1000, np.float32)
    expected = f"device={count}: device {count} does not exist; it must be an integer device ordinal from 0 to"
    with pytest.raises(ValueError, match=re.escape(expected)):
        stream.reduce(x, "sum", device=count)
    with pytest.raises(ValueError, match=re.escape(expected)):
        stream._cupy_pipeline(count, 4096)
    # A negative one is refused with the settings, before CuPy is asked for the count.
    for call in (lambda: stream.reduce(x, "sum", device=-1), lambda: stream._cupy_pipeline(-1, 4096)):
        with pytest.raises(ValueError, match="device= must be an integer CUDA device ordinal .*got -1"):
            call()
    with pytest.raises(TypeError, match="device= must be an integer CUDA device ordinal"):
        stream.reduce(x, "sum", device=True)  # used to mean device 1
    assert stream.reduce(x, "sum", device=np.int64(count - 1)) == 1000.0


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["python", "native"])
def test_gpu_concurrent_calls_of_every_kind(engine, monkeypatch):
    # Calls at once on one device: rolling and resident, dense and strided, two slot sizes (the
    # cache frees idle slots of the other size to stay within the largest budget), then the
    # cache freed and made again (remade slots must not reuse stale native piece tables).
    monkeypatch.setattr(stream, "COPY_ENGINE", engine)
    device = _cupy().cuda.Device().id
    stream.free_staging()
    monkeypatch.setattr(stream._cupy_staging(device), "budget", 0)  # as in a new process
    rng = np.random.default_rng(22)
    dense = make_data("int32", 3 * 2**20 + 5, rng)  # 12 MiB
    strided = dense[: dense.size // 5 * 5].reshape(-1, 5)[:, ::2]
    small = dense[: 2**20]  # 4 MiB
    small_strided = small[::3]
    want = {id(a): int(a.astype(np.int64).sum()) for a in (dense, strided, small, small_strided)}
    results = []

    def calls(x, budget, slot_bytes, rounds):
        def run():
            for _ in range(rounds):
                got = stream.reduce(x, "sum", budget=budget, slot_bytes=slot_bytes, threads=4)
                results.append(int(got) == want[id(x)])

        return run

    work = [
        calls(dense, 4 << 20, 1 << 20, 4),  # rolling: 12 segments, 4 slots
        calls(small, 32 << 20, 1 << 20, 20),  # resident: 4 segments
        calls(strided, 4 << 20, 1 << 20, 4),  # Python threads, rolling
        calls(small_strided, 32 << 20, 1 << 20, 20),  # Python threads, resident
        calls(dense, 32 << 20, 2 << 20, 4),  # another slot size
    ]
    run_in_threads(work, timeout=300)
    assert len(results) == 4 + 20 + 4 + 20 + 4 and all(results)
    info = stream.staging_info()
    assert all(r["in_use"] == 0 for r in info)
    assert sum(r["device_bytes"] for r in info if r["device"] == device) <= 32 << 20  # the largest budget
    stream.free_staging()
    for _ in range(3):
        assert int(stream.reduce(dense, "sum", budget=4 << 20, slot_bytes=1 << 20)) == want[id(dense)]
        stream.free_staging()
