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
from test_mpi_local import key_test_values

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
