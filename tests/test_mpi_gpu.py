"""multireduce.mpi and the CLI with CuPy shards on the GPU (skipped where there is none).

On the project's GPU machine all ranks share one H200 and Open MPI is not CUDA-aware, so
partials are staged through host memory; the device-buffer path is exercised at one rank,
where MPI's Allreduce never reads the buffer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from mpi_scripts.launch import SCRIPTS, run
from test_mpi import FAR_FROM_ZERO
from test_mpi_local import key_test_values

from multireduce import get_op
from multireduce._transport import decode_extreme, encode_extreme

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dt", ["bool", "int8", "uint16", "int64", "uint64", "float16", "float32", "float64"])
def test_device_keys_equal_host_keys(dt):
    # The CUDA-aware path encodes on the device; it must produce the host path's keys.
    cupy = pytest.importorskip("cupy")
    dt = np.dtype(dt)
    values = key_test_values(dt)
    acc = np.dtype(np.float32) if dt == np.float16 else dt
    for positive in (True, False):
        for v in values.astype(acc):
            host = encode_extreme(np.array([v], dtype=acc), positive)
            dev = encode_extreme(cupy.asarray(np.array([v], dtype=acc)), positive, xp=cupy)
            assert dev.get().tobytes() == host.tobytes()
            back = decode_extreme(dev, positive, acc, xp=cupy).get()
            assert back.tobytes() == decode_extreme(host, positive, acc).tobytes()


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_gpu_allreduce_matches_global_reference(mpiexec, tmp_path, ranks):
    done = run(mpiexec, ranks, [str(SCRIPTS / "check_allreduce.py"), str(tmp_path), "--gpu"], timeout=300)
    assert done.returncode == 0, done.output
    assert f"PASS {ranks} " in done.stdout and "'staged': 0" not in done.stdout


def test_gpu_device_buffer_path_at_one_rank(tmp_path):
    done = run(
        None,
        1,
        [str(SCRIPTS / "check_allreduce.py"), str(tmp_path), "--gpu"],
        timeout=300,
        extra_env={"MULTIREDUCE_CUDA_AWARE": "1"},
    )
    assert done.returncode == 0, done.output
    assert "PASS 1 " in done.stdout and "'device': 0" not in done.stdout


@pytest.mark.mpi
def test_gpu_cli_default(mpiexec):
    done = run(mpiexec, 2, ["-m", "multireduce", "--json"], timeout=300)
    assert done.returncode == 0, done.output
    report = json.loads(done.stdout)
    assert report["backend"] == "gpu" and report["check_passed"] is True
    assert report["bytes"] >= 2 * 200 * 2**20  # a few hundred MB per rank
    assert report["transport"]["staged"] + report["transport"]["device"] > 0
    assert report["h2d_s"] is None  # generated on the device


def test_gpu_results_are_cells_reused_only_when_free_and_after_the_stream():
    # Staged results come back as 0-d CuPy arrays over pinned, device-mapped host cells
    # (mpi._ResultCells), at one rank in this process: values bit for bit, usable by kernels,
    # never rewritten while referenced, and rewritten only after the stream's earlier work.
    cupy = pytest.importorskip("cupy")
    mpi = pytest.importorskip("multireduce.mpi")
    if mpi.cuda_aware().enabled:
        pytest.skip("MPI is CUDA-aware here: results stay in device buffers")
    x = cupy.arange(1000, dtype=cupy.float32)
    a = mpi.allreduce(x, "sum")
    b = mpi.allreduce(x * 2, "sum")
    assert isinstance(a, cupy.ndarray) and a.shape == () and a.dtype == np.float32
    assert a.device.id == x.device.id and a.data.ptr != b.data.ptr
    assert float(a) == 499500.0 and float(b) == 999000.0
    assert float((a + b) * 2) == 2997000.0  # read by kernels
    z = mpi.allreduce(cupy.array([-0.0, -0.0], cupy.float32), "max")  # a -0.0 stays, bit for bit
    assert z.get().tobytes() == np.float32(-0.0).tobytes()
    m = mpi.allreduce(cupy.array([1.0, np.nan], cupy.float64), "min")
    assert np.isnan(m.get()) and m.dtype == np.float64
    # The general path (an Op object, dtype=) ends in cells too.
    g = mpi.allreduce(x, get_op("sum"), dtype=np.float64)
    assert g.dtype == np.float64 and float(g) == 499500.0

    # Held results, and views of them, keep their cells; many held results all keep values.
    view = a[...]
    ptr = a.data.ptr
    del a
    held = [mpi.allreduce(x + i, "sum") for i in range(100)]
    assert ptr not in {r.data.ptr for r in held} and float(view) == 499500.0
    assert [float(r) for r in held] == [499500.0 + 1000.0 * i for i in range(100)]

    # A dropped result's cell is rewritten only after the kernels queued before the drop:
    # point the next take at this cell, queue a long kernel that reads it, drop it, reduce.
    stream = cupy.cuda.get_current_stream()
    cells = mpi._Staging.get(x.device.id, stream.ptr).results
    r = mpi.allreduce(x, "sum")
    index = [c[1].ptr for c in cells._cells].index(r.data.ptr)
    big = cupy.zeros(1 << 27, dtype=cupy.float32)
    out = big + r  # reads the cell in every thread, for a while
    del r
    cells._next = index
    again = mpi.allreduce(x * 3, "sum")
    assert [c[1].ptr for c in cells._cells].index(again.data.ptr) == index  # the same cell
    assert float(again) == 1498500.0
    assert bool((out == 499500.0).all())


@pytest.mark.parametrize("aware", [False, True], ids=["staged", "cuda-aware"])
def test_gpu_general_combines_allocate_nothing_after_the_agreement(aware):
    # Once the agreement has passed, a rank must end the call as the others do: a failure of its
    # own after it (an allocation, a CUDA error) would leave the others in their next collective.
    # So the general path reserves its result cells (a new block of pinned memory when all are
    # held), makes the stream's slot and waits for the stream before the agreement. Here every
    # allocation fails once the agreement has run, and every cell is held before each call, so
    # that the call's cells must come from a new block: each call must still give the bits it
    # gives without the failures. At one rank, in this process; "cuda-aware" hands MPI the device
    # buffer (which MPI never reads at one rank) and decodes the combined value on the host.
    import os

    cupy = pytest.importorskip("cupy")
    mpi = pytest.importorskip("multireduce.mpi")
    import multireduce
    from multireduce import _partials

    rng = np.random.default_rng(7)
    x = cupy.asarray(rng.standard_normal(10_001).astype(np.float32))
    x[17] = -0.0
    h = x.get()
    calls = {
        "sum": lambda: mpi.allreduce(x, get_op("sum")),
        "max": lambda: mpi.allreduce(x, get_op("max")),
        "min int8": lambda: mpi.allreduce(x.astype(cupy.int8), get_op("min")),
        "sum dtype=": lambda: mpi.allreduce(x, "sum", dtype=np.float64),
        "mean": lambda: mpi.allreduce(x, "mean"),
        "var": lambda: mpi.allreduce(x, "var", correction=1),
        "argmax": lambda: mpi.allreduce(x, "argmax"),
        "exact": lambda: mpi.allreduce(x, "sum", reproducible=True),
        "stats": lambda: mpi.stats(x),
    }
    numpy = {
        "sum": np.sum(h, dtype=np.float64),
        "max": np.max(h),
        "min int8": np.min(h.astype(np.int8)),
        "sum dtype=": np.sum(h, dtype=np.float64),
        "mean": np.mean(h, dtype=np.float64),
        "var": np.var(h, dtype=np.float64, ddof=1),
        "argmax": np.argmax(h),
        "exact": multireduce.sum(h, reproducible=True),
    }

    def host(result):
        if isinstance(result, multireduce.Stats):
            return [getattr(result, f).get() for f in ("count", "nan_count", "sum", "min", "max", "mean", "var")]
        assert isinstance(result, cupy.ndarray) and result.shape == (), result
        return [result.get()]

    saved = os.environ.get("MULTIREDUCE_CUDA_AWARE")
    os.environ["MULTIREDUCE_CUDA_AWARE"] = "1" if aware else "0"
    armed = []
    real_agree, real_mapped = mpi._agree, _partials.mapped_host_memory

    def refuse(*args, **kwargs):
        raise MemoryError("an allocation after the agreement")

    def agree_then_arm(*args, **kwargs):
        real_agree(*args, **kwargs)
        armed.append(True)
        cupy.cuda.set_allocator(refuse)

    def mapped(*args, **kwargs):
        if armed:
            refuse()
        return real_mapped(*args, **kwargs)

    try:
        assert mpi.cuda_aware(refresh=True).enabled is aware
        want = {name: host(call()) for name, call in calls.items()}  # the same calls, unarmed
        for name, value in numpy.items():
            assert want[name][0].dtype == np.asarray(value).dtype or name in ("sum", "mean", "var"), name
            assert np.allclose(want[name][0], value, rtol=1e-6, atol=0), (name, want[name], value)
        slots = mpi._Staging.get(x.device.id, cupy.cuda.get_current_stream().ptr)
        held = []
        for name, call in calls.items():
            # A new pool of cells (one block), every cell of it held.
            cells = slots.results = mpi._ResultCells(x.device.id, cupy)
            held += [cells.take(np.dtype(np.float64))[0] for _ in range(len(cells._cells))]
            size = len(cells._cells)
            mpi._agree, _partials.mapped_host_memory = agree_then_arm, mapped
            try:
                got = call()
            finally:
                cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
                mpi._agree, _partials.mapped_host_memory = real_agree, real_mapped
            assert armed and len(cells._cells) > size, name  # agreed, and the cells grew first
            armed.clear()
            got = host(got)
            assert [g.dtype for g in got] == [w.dtype for w in want[name]], (name, got, want[name])
            assert [g.tobytes() for g in got] == [w.tobytes() for w in want[name]], (name, got, want[name])
    finally:
        mpi._agree, _partials.mapped_host_memory = real_agree, real_mapped
        if saved is None:
            os.environ.pop("MULTIREDUCE_CUDA_AWARE", None)
        else:
            os.environ["MULTIREDUCE_CUDA_AWARE"] = saved
        mpi.cuda_aware(refresh=True)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_gpu_variance_far_from_zero_across_ranks(mpiexec, ranks):
    # The GPU kernel's states carry the low parts of their means (MomentRecord.mean_lo) into
    # the ranks' merge: var of timestamps near 1.7e9 and int64 near 1e12 keeps one array's
    # accuracy (tests/test_mpi.py runs the same script on NumPy shards).
    done = run(mpiexec, ranks, ["-c", FAR_FROM_ZERO, "gpu"], timeout=120)
    assert done.returncode == 0, done.output
    errors = done.result()
    assert len(errors) == 6 and max(errors) <= 1e-13, errors
