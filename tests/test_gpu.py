"""GPU-only checks: large sizes, determinism, streams, and that our kernel is what ran.

The size and value checks shared with the CPU live in test_core.py (its ``xp`` fixture runs
them on CuPy too).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from reference import (
    assert_float_sum,
    assert_rounded_once,
    assert_same_bits,
    check,
    ieee_extreme_axes,
    make_data,
    same_float,
    sum_result_dtype,
)

import multireduce

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def uniform_float32(n: int, seed: int):
    """n uniform [0, 1) float32 values k * 2**-24 and their exact sum as a Fraction."""
    k = cupy.random.default_rng(seed).integers(0, 2**24, n, dtype=cupy.int32)
    x = k.astype(cupy.float32) * cupy.float32(2.0**-24)  # exact
    exact = Fraction(int(k.sum(dtype=cupy.int64)), 2**24)
    del k
    return x, exact


def assert_float32_sum(got, exact: Fraction, n: int) -> None:
    """A float32 sum of n non-negative elements: accumulated in float64 within the README's
    bound (eps64 * sum|x| * (log2(n + 1) + n / 50000 + 1), sum|x| being the sum itself) and
    rounded once, so within half an ulp of that of the exact sum. At 2**30 elements the
    accumulation term is 3e-3 against a half ulp of 16 or 32: one ulp off fails."""
    assert got.dtype == np.float32
    accumulation = float(np.finfo(np.float64).eps) * float(exact) * (math.log2(n + 1) + n / 50_000 + 1)
    assert_rounded_once(got.get(), exact, accumulation)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int32", "uint64", "bool"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_2_24_plus_3(op, dtype):
    x = make_data(dtype, 2**24 + 3, np.random.default_rng(24))
    check(x, op, multireduce.reduce(cupy.asarray(x), op).get()[()])


def test_2_30_float32():
    n = 2**30
    x, exact = uniform_float32(n, seed=30)
    got = multireduce.sum(x)
    assert_float32_sum(got, exact, n)
    x[12345] = 2.0
    x[n - 7] = -1.0
    assert float(multireduce.max(x)) == 2.0
    assert float(multireduce.min(x)) == -1.0
    x[n // 2] = np.nan
    assert math.isnan(float(multireduce.max(x))) and math.isnan(float(multireduce.sum(x)))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "uint64"])
@pytest.mark.parametrize("tiling", [1, 5])
def test_tiled_launches_at_small_sizes(dtype, tiling):
    # The tiled mode (one block per tile) that inputs of TILED_MIN_BYTES and more use, forced
    # here on small and misaligned inputs: partial last tiles, scalar heads and tails, and a
    # grid of more than 4 * 512 blocks (the finish's four-loads path). Against exact references
    # (reference.check: Python integers, math.fsum, element-by-element extremes).
    from multireduce import _kernels
    from multireduce._backend import cupy as gpu

    load = _kernels.DEFAULT_LOAD | (tiling << 2)
    rng = np.random.default_rng(tiling)
    sizes = [1, 3, 5, 33, 257, 2**20 + 1] + ([2**24 + 2**20 + 3] if tiling == 1 else [2**22 + 3])
    for n in sizes:
        host = make_data(dtype, n + 3, rng)
        device = cupy.asarray(host)
        for offset in (0, 3):
            x, xd = host[offset:], device[offset:]
            for op in ("sum", "max", "min"):
                o = multireduce.get_op(op)
                result = o.result_dtype(x.dtype)
                got = gpu.reduce_full(xd, o, o.accumulator_dtype(result), result, load=load, grid=0)
                check(x, op, got.get()[()])


def test_inputs_of_2_gib_take_the_tiled_launch(monkeypatch):
    from multireduce import _kernels
    from multireduce._backend import cupy as gpu

    configs = []
    real = gpu._launcher

    def launcher(device, op, dtype, acc, result, config, *args):
        configs.append(config)
        return real(device, op, dtype, acc, result, config, *args)

    monkeypatch.setattr(gpu, "_launcher", launcher)
    # The default launch is cached whole per (device, stream, op, dtypes): start without one,
    # so that the grid-stride call below looks its kernel up whatever ran before this test.
    monkeypatch.setattr(gpu, "_defaults", {})
    n = _kernels.TILED_MIN_BYTES // 4
    x, exact = uniform_float32(n, seed=31)
    got = multireduce.sum(x)
    assert_float32_sum(got, exact, n)
    multireduce.sum(x[1:])  # just under the threshold: the grid-stride launch
    assert [c[2] for c in configs] == [_kernels.TILED_LOAD, _kernels.DEFAULT_LOAD]
    assert multireduce.sum(x).tobytes() == got.tobytes()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_100_runs_identical_bits(dtype):
    base = cupy.asarray(make_data(dtype, 2**24 + 3 + 5, np.random.default_rng(100)))
    x = base[5:]  # an offset view, so the head and tail paths run too
    uint = {2: cupy.uint16, 4: cupy.uint32, 8: cupy.uint64}[x.itemsize]
    first = multireduce.sum(x).view(uint).get()
    runs = cupy.stack([multireduce.sum(x).view(uint) for _ in range(100)]).get()
    assert (runs == first).all()
    x[777] = np.nan
    maxima = cupy.stack([multireduce.max(x) for _ in range(100)]).get()
    assert np.isnan(maxima).all()


def test_non_default_streams():
    host = make_data("float32", 3_000_001, np.random.default_rng(7))
    x = cupy.asarray(host)
    cupy.cuda.Device().synchronize()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(3)]
    results = []
    for _ in range(5):
        for s in streams:
            with s:
                results.append(multireduce.sum(x))
    for s in streams:
        s.synchronize()
    # Within half an ulp (plus 3e-8 of float64 accumulation) of the exact sum, and the same
    # bits from every stream: one sum racing another on the shared workspace would differ.
    first = results[0].get()
    assert_float_sum(first, host)
    assert all(r.get().tobytes() == first.tobytes() for r in results)


def test_result_on_device_and_launch_is_ours():
    from multireduce._backend import cupy as backend

    x = cupy.arange(1000, dtype=cupy.int32)
    r = multireduce.sum(x)
    assert isinstance(r, cupy.ndarray) and r.shape == () and r.device == x.device
    assert int(r) == 999 * 1000 // 2
    names = [name for (_, name) in backend.compiled]
    assert any("multireduce::reduce_kernel<int, long long, long long, multireduce::Sum" in n for n in names), names


def test_gpu_matches_cpu_bitwise_where_exact():
    rng = np.random.default_rng(5)
    for dtype in [
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
        "float16",
        "float32",
        "float64",
    ]:
        x = make_data(dtype, 1_000_003, rng)
        ops = ["max", "min"] + (["sum"] if np.dtype(dtype).kind != "f" else [])
        for op in ops:
            gpu = multireduce.reduce(cupy.asarray(x), op).get()[()]
            # Independently: NumPy's exact result (integer sums wrap modulo 2**64 in any order;
            # extremes in IEEE 754-2019's signed-zero order).
            if op == "sum":
                want = np.sum(x, dtype=sum_result_dtype(x.dtype))
            else:
                want = ieee_extreme_axes(x, largest=op == "max")
            assert_same_bits(gpu, want)
            # And the same bits as the CPU backend, as the README promises for these ops.
            cpu = multireduce.reduce(x, op)
            assert gpu.dtype == cpu.dtype, (dtype, op)
            if np.dtype(dtype).kind == "f":
                assert same_float(gpu, cpu), (dtype, op, gpu, cpu)
            else:
                assert gpu == cpu, (dtype, op, gpu, cpu)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(), (1,), (2,), (9,)])
def test_negative_zero_made_on_device(dtype, shape):
    # -0.0 produced by a kernel (0 * -1), so that no host-to-device transfer is involved;
    # the max and the min of all -0.0 are -0.0, and one +0.0 makes the max +0.0.
    x = cupy.zeros(shape, dtype=dtype) * cupy.asarray(-1, dtype=dtype)
    assert bool(cupy.signbit(x).all())
    assert same_float(multireduce.max(x).get()[()], -0.0)
    assert same_float(multireduce.min(x).get()[()], -0.0)
    assert same_float(multireduce.sum(x).get()[()], 0.0)
    if x.size > 1:
        x[-1] = 0.0
        assert same_float(multireduce.max(x).get()[()], 0.0)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_transfer_of_single_negative_zero(dtype):
    # Observed on the GPU machine: the reduction of a one-element -0.0 array that came from
    # the host gave +0.0. Whichever side loses the sign, this pins it down.
    host = np.array([-0.0], dtype=dtype)
    dev = cupy.asarray(host)
    on_device = bool(cupy.signbit(dev).get()[0])
    got = multireduce.max(dev).get()[()]
    # Whatever the transfer did, the reduction must report what is on the device.
    assert same_float(got, -0.0 if on_device else 0.0), (on_device, got)
    # A bit-exact transfer keeps the sign, and so does the reduction.
    exact = cupy.asarray(host.view(UINT[host.itemsize])).view(host.dtype)
    assert bool(cupy.signbit(exact).get()[0])
    assert same_float(multireduce.max(exact).get()[()], -0.0)
    assert same_float(multireduce.min(exact[0]).get()[()], -0.0)


def test_float32_subnormals_as_documented():
    """docs/semantics.md: CuPy compiles with -ftz=true, so the float32 fast paths treat
    subnormal inputs as zero (as CuPy's own reductions do), float16/float64 keep them, and the
    reproducible sum keeps them exactly. This pins the documented difference from the CPU."""
    sub = np.finfo(np.float32).smallest_subnormal
    host = np.full(1000, sub, dtype=np.float32)
    dev = cupy.asarray(host)
    assert float(multireduce.sum(host)) == 1000 * float(sub)  # the CPU keeps them
    assert float(multireduce.sum(dev)) == 0.0  # flushed
    assert float(multireduce.sum(dev, reproducible=True)) == float(np.float32(1000 * float(sub)))
    # max/min still return one of the elements (bitwise), never a value not in the input
    # (-0.0 is not in it either).
    pair = cupy.asarray(np.array([sub, 0.0], dtype=np.float32))
    for extreme in (multireduce.max, multireduce.min):
        assert int(extreme(pair).get().view(np.uint32)) in (0, 1)  # +0.0 or the subnormal's bits
    for dtype in ("float16", "float64"):
        # Exact: 1000 subnormals are a subnormal of the dtype, accumulated exactly (float16 in
        # float32, where they are normal; float64 in float64, which -ftz does not flush).
        tiny = np.full(1000, np.finfo(dtype).smallest_subnormal, dtype=dtype)
        exact = np.dtype(dtype).type(1000 * float(np.finfo(dtype).smallest_subnormal))
        assert float(exact) == 1000 * float(np.finfo(dtype).smallest_subnormal) > 0.0
        assert_same_bits(multireduce.sum(cupy.asarray(tiny)).get(), np.asarray(exact))
        assert_same_bits(np.asarray(multireduce.sum(tiny)), np.asarray(exact))  # the CPU too


@pytest.mark.parametrize("n", [1, 2, 33, 4099, 2**20 + 3])
def test_float32_subnormals_are_nonzero_for_truth_values(n):
    # Under -ftz=true, x != 0.0f counted a subnormal as zero: count_nonzero([1e-40]) was 0,
    # any([1e-40]) False, all([1.0, 1e-40]) False (NumPy: 1, True, True). -0.0 stays zero and
    # NaN nonzero. Full reductions, rows and columns.
    sub = np.float32(1e-40)
    host = np.zeros(n, np.float32)
    host[n // 2] = sub
    host[0] = -0.0 if n > 1 else sub
    ones = np.ones(n, np.float32)
    ones[n - 1] = -sub
    for data in (host, ones, np.full(n, np.nan, np.float32), np.full(n, sub, np.float32)):
        dev = cupy.asarray(data)
        for op in ("count_nonzero", "any", "all"):
            want = getattr(np, op)(data)
            assert getattr(multireduce, op)(dev).get()[()] == want, (op, n, data[:3])
            grid = np.stack([data, data[::-1]])
            for axis in (0, 1):
                got = getattr(multireduce, op)(cupy.asarray(grid), axis=axis).get()
                assert np.array_equal(got, getattr(np, op)(grid, axis=axis)), (op, n, axis)


@pytest.mark.parametrize("op", ["sum", "mean", "nansum", "nanmean"])
def test_float32_result_that_is_subnormal_is_not_flushed(op):
    # The float64 total of normal float32 elements, converted to float32 under -ftz=true
    # (cvt.rn.ftz.f32.f64), was flushed to +-0.0 where it is subnormal: sum([1.5e-38,
    # -1.4e-38]) was 0.0, not 1e-39. Now one correct rounding, as NumPy's float32 result.
    rng = np.random.default_rng(3)
    tiny = float(np.finfo(np.float32).tiny)  # 2**-126: the smallest normal (every input is normal)
    cases = [[1.5e-38, -1.4e-38], [-1.5e-38, 1.4e-38], [1.2e-38, -tiny, 0.0]]
    cases += [(rng.integers(-5, 6, 100) * np.float32(2**-120)).tolist()]  # its mean is subnormal
    for values in cases:
        x = np.array(values, np.float32)
        if op.startswith("nan"):
            x = np.append(x, np.float32(np.nan))
        want = getattr(np, op)(x.astype(np.float64)).astype(np.float32)  # one rounding of the exact value
        assert abs(want) < np.finfo(np.float32).tiny or values is cases[-1], values  # subnormal results
        assert_same_bits(getattr(multireduce, op)(cupy.asarray(x)).get(), np.asarray(want))
        grid = np.stack([x, x])
        got = getattr(multireduce, op)(cupy.asarray(grid), axis=1).get()
        assert_same_bits(got, np.array([want, want]))
        got = getattr(multireduce, op)(cupy.asarray(np.ascontiguousarray(grid.T)), axis=0).get()
        assert_same_bits(got, np.array([want, want]))


def test_tiny_reductions_from_many_threads():
    """The default launch packs its arguments in a per-thread block: threads launching at
    the same time, each on its own stream and its own first call, get their own results."""
    import threading

    sizes = [1, 3, 33, 257, 1025, 4099, 65537, 2**20 + 1]
    errors: list[str] = []
    start = threading.Barrier(len(sizes))

    def work(i: int, n: int) -> None:
        stream = cupy.cuda.Stream(non_blocking=True)
        start.wait()
        with stream:
            for k in range(200):
                x = cupy.full(n, i + k % 7, dtype=cupy.int32)
                want = n * (i + k % 7)
                got = int(multireduce.sum(x))
                if got != want:
                    errors.append(f"thread {i}, call {k}: {got} != {want}")
                    return

    threads = [threading.Thread(target=work, args=(i, n)) for i, n in enumerate(sizes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


_PER_THREAD_STREAM_SCRIPT = r"""
import sys, threading
import cupy, numpy as np
import multireduce

assert cupy.cuda.get_current_stream().ptr == 2, "not the per-thread default stream"
THREADS, ROUNDS, LAUNCHES = 6, 8, 40
sizes = [2**20 + 3, 2**26 + 7, 2**28 + 1]  # the default launch and the tiled one, up to 1 GiB
errors = []
start = threading.Barrier(THREADS)

def work(i):
    # Each thread queues many reductions on its own per-thread stream without waiting; the
    # large ones (a tiled launch has more blocks than the GPU holds at once) take long
    # enough for the threads' kernels to run at the same time on the GPU.
    xs = [cupy.full(n, i + 1, dtype=cupy.int32) for n in sizes]
    cupy.cuda.get_current_stream().synchronize()
    start.wait()
    for r in range(ROUNDS):
        results = [multireduce.sum(xs[k % len(xs)]) for k in range(LAUNCHES)]
        cupy.cuda.get_current_stream().synchronize()
        for k, got in enumerate(results):
            want = sizes[k % len(xs)] * (i + 1)
            if int(got) != want:
                errors.append(f"thread {i}, round {r}, sum {k}: {int(got)} != {want}")
                return
        others = (
            (float(multireduce.mean(xs[r % 3])), float(i + 1)),
            (int(multireduce.argmax(xs[r % 3])), 0),
            (int(multireduce.stats(xs[r % 3]).count), sizes[r % 3]),
        )
        for got, want in others:
            if got != want:
                errors.append(f"thread {i}, round {r}: {got} != {want}")
                return

    # Deterministic: the workspace and the counters this thread's launches used are its own.
    from multireduce import _partials
    from multireduce._backend import cupy as backend

    sid = _partials.stream_id(cupy.cuda.get_current_stream().ptr)
    owned.append((backend._workspace(0, sid, 1)[0].data.ptr, backend._counters(0, 1).data.ptr))

owned = []
threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if not errors and len({w for w, _ in owned}) + len({c for _, c in owned}) != 2 * THREADS:
    errors.append(f"threads share per-stream workspaces or counters: {owned}")

# Threads that end with their last reduction still queued: a new thread (which may get an
# ended one's ident) never takes over their workspaces, and their entries are dropped (after a
# device synchronize) instead of staying for ever.
from multireduce._backend import cupy as backend

brief_results = []

def brief(i):
    brief_results.append((i, multireduce.sum(cupy.full(2**22 + 3, i, dtype=cupy.int32))))

for i in range(60):
    t = threading.Thread(target=brief, args=(i,))
    t.start()
    t.join()
cupy.cuda.Device().synchronize()
wrong = [(i, int(r)) for i, r in brief_results if int(r) != (2**22 + 3) * i]
if wrong:
    errors.append(f"sums of threads that ended in turn: {wrong[:5]}")
kept = [k for k in backend._workspaces if isinstance(k[1], tuple)]
if len(kept) > 2:  # the last brief thread's, and at most one other's
    errors.append(f"{len(kept)} per-thread workspaces kept after 60 threads ended")
print("\n".join(errors[:10]) or "OK")
sys.exit(1 if errors else 0)
"""


def test_per_thread_default_streams_do_not_share_workspaces():
    """Under CuPy's per-thread default stream every thread's stream has the handle 2, yet the
    threads' kernels may run concurrently: the per-stream workspaces (block partials, counters,
    cached launches) must be the thread's own (``_partials.stream_id``).

    Whether kernels of different threads overlap on the GPU depends on timing (with one Python
    thread launching at a time they rarely do: the version before ``stream_id`` passed the
    values part on an H200), so the script also checks that each thread's workspace and
    counters are distinct objects."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _PER_THREAD_STREAM_SCRIPT], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stdout + done.stderr


_TWO_GPUS = pytest.mark.skipif(
    cupy.cuda.runtime.getDeviceCount() < 2, reason="needs two GPUs (results must live on the input's device)"
)


@_TWO_GPUS
def test_results_made_from_identities_or_host_values_live_on_the_inputs_device():
    # The sum of an empty array, nanvar's host-finalized state, a reproducible mean and a
    # partial over empty axes were made on the current device: a Dask chunk on GPU 1, empty
    # after a mask, gave a partial on GPU 0, and the combine refused the mixed devices.
    with cupy.cuda.Device(1):
        empty = cupy.zeros(0, cupy.float32)
        values = cupy.arange(10.0)
        columns = cupy.zeros((0, 3), cupy.float32)
    for got in (
        multireduce.sum(empty),
        multireduce.nanvar(values),
        multireduce.mean(values, reproducible=True),
        multireduce.nanargmax(values),
        multireduce.partial(columns, "sum", axis=0),
    ):
        assert got.device.id == 1, got


@_TWO_GPUS
def test_an_out_on_another_device_is_refused():
    with cupy.cuda.Device(1):
        x = cupy.ones(10)
    out = cupy.empty((), cupy.float64)  # on device 0
    with pytest.raises(ValueError, match="out= must be on the input's device"):
        multireduce.partial(x, "sum", out=out)
