"""The pure logic of scripts/bench_scaling.py, plot_scaling.py and scaling_model.py (no timing, no MPI)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_scaling as bs  # noqa: E402
import plot_scaling as ps  # noqa: E402
import scaling_model as sm  # noqa: E402

GiB = 2**30
COMMON = {"git_commit": "abc1234def", "git_dirty": False, "host": "h", "gpu": "cpu", "gpu_count": 0}


def test_parse_args_defaults_and_resolution():
    args = bs.parse_args([])
    assert args.parts == list(bs.PARTS) and args.ops == ["sum", "max", "min"] and args.ranks is None
    bs.resolve_defaults(args, "cpu", 0)
    assert args.ranks == [1, 2, 4] and args.workers == [1, 2] and args.weak_per_rank == 2**22
    gpu = bs.resolve_defaults(bs.parse_args(["--parts", "mpi,latency"]), "gpu", 8)
    assert gpu.ranks == [1, 2, 4, 8] and gpu.workers == [1, 2, 4, 8]
    assert gpu.weak_per_rank * 4 == 4 * GiB and gpu.strong_n * 4 == 16 * GiB and gpu.parts == ["mpi", "latency"]


def test_parse_args_rejects_bad_input():
    with pytest.raises(SystemExit):
        bs.parse_args(["--parts", "mpi,nonsense"])
    with pytest.raises(SystemExit):
        bs.parse_args(["--ops", "sum,argmax"])
    with pytest.raises(SystemExit):
        bs.parse_args(["--ranks", "0,2"])


def test_powers_of_two():
    assert bs.powers_of_two_upto(1) == [1]
    assert bs.powers_of_two_upto(8) == [1, 2, 4, 8]
    assert bs.powers_of_two_upto(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError):
        bs.powers_of_two_upto(0)


def test_expected_matches_numpy():
    for n in (1, 5, 1024, 3000):
        x = np.arange(n) % 1024
        assert bs.expected("sum", n) == int(x.sum())
        assert bs.expected("max", n) == int(x.max()) and bs.expected("min", n) == 0
    assert bs.result_matches(float(3 * bs.expected("sum", 3000)), "sum", 3000, 3, "float32")
    assert not bs.result_matches(1.0, "sum", 3000, 3, "float32")


def cli_report(ranks, n, kernel=0.01, combine=20e-6):
    return {
        "ranks": ranks,
        "backend": "cpu",
        "device": "cpu",
        "mpi_library": "MPICH",
        "dtype": "float32",
        "n": n,
        "bytes": 4 * n,
        "load_s": 0.1,
        "h2d_s": None,
        "repeat": 3,
        "check_passed": None,
        "results": [
            {
                "op": "sum",
                "result": float(bs.expected("sum", n // ranks) * ranks),
                "kernel_s": kernel,
                "allreduce_s": combine,
            },
            {"op": "max", "result": 1023.0, "kernel_s": kernel, "allreduce_s": combine},
        ],
    }


def test_mpi_records_and_efficiency():
    recs = []
    for ranks, kernel in ((1, 0.010), (2, 0.0105), (4, 0.0125)):
        recs += bs.mpi_records(
            COMMON,
            cli_report(ranks, 4096 * ranks, kernel),
            scaling="weak",
            source="file",
            shards=ranks,
            n_per_shard=4096,
        )
    sums = [r for r in recs if r["op"] == "sum"]
    assert all(r["correct"] for r in recs) and sums[0]["git_commit"] == "abc1234def"
    assert sums[1]["reduce_s"] == pytest.approx(0.0105 + 20e-6) and sums[1]["copy_gbps"] is None
    assert sums[1]["kernel_gbps"] == pytest.approx(4 * 8192 / 0.0105 / 1e9)
    bs.add_efficiency(recs)
    assert sums[0]["efficiency"] == pytest.approx(1.0)
    assert sums[2]["efficiency"] == pytest.approx((0.010 + 20e-6) / (0.0125 + 20e-6))
    strong = bs.mpi_records(
        COMMON, cli_report(1, 8192, 0.02), scaling="strong", source="file", shards=1, n_per_shard=8192
    )
    strong += bs.mpi_records(
        COMMON, cli_report(4, 8192, 0.005), scaling="strong", source="file", shards=1, n_per_shard=8192
    )
    assert all(r["correct"] for r in strong)
    wrong = cli_report(2, 8192)
    wrong["results"][0]["result"] += 1.0
    assert [
        r["correct"] for r in bs.mpi_records(COMMON, wrong, scaling="strong", source="file", shards=1, n_per_shard=8192)
    ] == [False, True]
    bs.add_efficiency(strong)
    assert strong[2]["efficiency"] == pytest.approx((0.02 + 20e-6) / (4 * (0.005 + 20e-6)))


def test_fit_slope_and_output_path():
    a, b = bs.fit_slope([5, 21, 85], [1.0 + 5e-3, 1.0 + 21e-3, 1.0 + 85e-3])
    assert a == pytest.approx(1.0) and b == pytest.approx(1e-3)
    with pytest.raises(ValueError):
        bs.fit_slope([1, 1], [2, 3])
    args = bs.parse_args([])
    assert bs.output_path(args, "cpu", "abcdef0123").name == "scaling_cpu_abcdef0.json"


def test_mpiexec_command_reads_env(monkeypatch):
    monkeypatch.setenv("MULTIREDUCE_MPIEXEC", "/opt/x/mpiexec")
    monkeypatch.setenv("MULTIREDUCE_MPIEXEC_ARGS", "--oversubscribe --allow-run-as-root")
    assert bs.find_mpiexec() == "/opt/x/mpiexec"
    cmd = bs.mpiexec_command(bs.find_mpiexec(), 4, ["-m", "multireduce"])
    assert cmd[:5] == ["/opt/x/mpiexec", "--oversubscribe", "--allow-run-as-root", "-n", "4"]
    assert cmd[5:] == [sys.executable, "-m", "multireduce"]


# -- the model ------------------------------------------------------------------------------


def toy_inputs(**kw):
    base = dict(
        kernel_sizes=(2**10, 4 * GiB),
        kernel_times=(2.5e-6, 931e-6),
        latency_a=1e-6,
        latency_b=1e-6,
        layer_overhead_1=60e-6,
        dask_fixed=20e-3,
        dask_per_task=0.5e-3,
    )
    base.update(kw)
    return sm.Inputs(**base)


def test_model_formulas():
    inp = toy_inputs()
    assert sm.kernel_time(inp, 4 * GiB) == pytest.approx(931e-6)
    assert sm.kernel_time(inp, 16 * GiB) == pytest.approx(4 * 931e-6)
    assert 2.5e-6 < sm.kernel_time(inp, 2**20) < 931e-6
    assert sm.latency(inp, 8) == pytest.approx(4e-6)
    assert sm.latency(inp, 8, nodes=4, hop=10e-6) == pytest.approx(24e-6)
    assert sm.combine_time(inp, 8) == pytest.approx(60e-6 + 2 * 3e-6)
    r = sm.predict(inp, 4 * GiB, 8, link=55e9)
    assert r["reduce_s"] == pytest.approx(931e-6 + 66e-6) and r["copy_s"] == pytest.approx(4 * GiB / 55e9)
    assert sm.weak_efficiency(inp, 4 * GiB, 8) == pytest.approx((931 + 60) / (931 + 66))
    assert sm.strong_efficiency(inp, 16 * GiB, 1) == pytest.approx(1.0)
    assert 0 < sm.strong_efficiency(inp, 16 * GiB, 8, nodes=4, hop=10e-6) < sm.strong_efficiency(inp, 16 * GiB, 8)


def test_treereduce_task_count_matches_dask():
    da = pytest.importorskip("dask.array")
    from multireduce.dask import treereduce

    for chunks in (1, 4, 16, 64, 65, 300):
        x = da.ones(chunks * 2, chunks=2)
        graph = dict(treereduce(x, "sum").__dask_graph__())
        assert sm.treereduce_tasks(chunks) == len(graph) - chunks, chunks
        graph = dict(treereduce(x, "sum", split_every=4).__dask_graph__())
        assert sm.treereduce_tasks(chunks, split_every=4) == len(graph) - chunks, chunks
    assert sm.dask_time(toy_inputs(), 4 * GiB, 1) == pytest.approx(20e-3 + 5 * 0.5e-3 + 931e-6)


@pytest.mark.skipif(not (REPO / "bench" / "results").is_dir(), reason="bench/results is not in this tree (an sdist)")
def test_model_loads_the_committed_measurements():
    inp = sm.load_inputs(REPO)
    assert math.isclose(sm.kernel_time(inp, 4 * GiB), 931.1e-6, rel_tol=0.01)
    assert 0.5e-6 < sm.latency(inp, 1) < 2e-6 and 15e-6 < inp.layer_overhead_1 < 80e-6
    assert "bench/results" in inp.sources["kernel"]
    assert "| 8 |" in sm.tables(inp)


@pytest.mark.skipif(not (REPO / "bench" / "results").is_dir(), reason="bench/results is not in this tree (an sdist)")
def test_model_loads_the_gpu_machine_scaling_run():
    run = REPO / "bench" / "results" / "scaling_h200x1_877b12b.json"
    inp = sm.load_inputs(REPO, gpu_scaling=run)
    # Open MPI 4.1.6 on the H200 host: 0.88, 2.07, 3.02, 4.14 us at 1, 2, 4, 8 ranks.
    assert sm.fit_log2([1, 2, 4, 8], [0.88e-6, 2.07e-6, 3.02e-6, 4.14e-6]) == pytest.approx(
        (inp.latency_a, inp.latency_b), rel=0.01
    )
    assert inp.dask_fixed == pytest.approx(22.07e-3, rel=0.01) and inp.dask_per_task == pytest.approx(
        1.233e-3, rel=0.01
    )
    assert inp.link_pinned == pytest.approx(55.05e9, rel=0.01) and inp.link_pageable == pytest.approx(6.23e9, rel=0.01)
    assert "scaling_h200x1_877b12b.json" in inp.sources["latency"]


# -- plotting ---------------------------------------------------------------------------------


def test_plot_all_writes_pngs(tmp_path):
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (pip install 'multireduce[bench]')")
    recs = []
    for ranks, kernel in ((1, 0.010), (2, 0.011)):
        recs += bs.mpi_records(
            COMMON,
            cli_report(ranks, 4096 * ranks, kernel),
            scaling="weak",
            source="file",
            shards=ranks,
            n_per_shard=4096,
        )
    recs.append(
        {
            **COMMON,
            "kind": "dask",
            "scaling": "weak",
            "workers": 1,
            "op": "sum",
            "dtype": "float32",
            "n": 4096,
            "n_per_rank": 4096,
            "reduce_s": 0.03,
        }
    )
    recs.append({**COMMON, "kind": "sweep", "op": "sum", "bytes": 4096, "kernel_gbps": 1.0})
    recs.append({**COMMON, "kind": "sweep", "op": "sum", "bytes": 2**20, "kernel_gbps": 9.0})
    recs.append({**COMMON, "kind": "bandwidth", "link": "host_memcpy", "gbps": 30.0})
    for ranks in (1, 2, 4):
        recs.append(
            {
                **COMMON,
                "kind": "latency",
                "ranks": ranks,
                "payload": "allreduce_8B",
                "us_median": ranks * 1.0,
                "oversubscribed": ranks > 2,
                "mpi_library": "MPICH",
            }
        )
    bs.add_efficiency(recs)
    doc = {"backend": "cpu", "gpu": "cpu", "gpu_count": 0, "host": "h", "git_commit": "abc1234", "records": recs}
    written = ps.plot_all(doc, tmp_path, "t")
    assert sorted(p.name for p in written) == ["t_latency.png", "t_mpi_dask.png", "t_roofline.png", "t_time.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written)


def test_multigpu_generator_is_the_documented_hash():
    import bench_multigpu as bm

    x = bm.generate_host(0, 1 << 16)
    assert x.dtype == np.float32 and np.all(np.isfinite(x))
    exponents = np.frexp(x)[1] - 1  # floor(log2 |x|)
    assert exponents.min() == -24 and exponents.max() == 8  # 33 binades, as the GPU kernel's
    assert 0.4 < np.mean(x < 0) < 0.6
    # Element i depends on i alone: a piece starting at 1000 is the same as the whole's slice.
    np.testing.assert_array_equal(bm.generate_host(1000, 50).view(np.uint32), x[1000:1050].view(np.uint32))
    # The first element, worked out by hand from the splitmix64 steps of _GENERATE.
    z = (0 * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    z ^= z >> 31
    bits = ((z >> 63) << 31) | ((127 - 24 + (z >> 32) % 33) << 23) | (z & 0x7FFFFF)
    assert int(x[:1].view(np.uint32)[0]) == bits


@pytest.mark.mpi
def test_multigpu_bench_runs_on_the_cpu(mpiexec, tmp_path, monkeypatch):
    """bench_multigpu.py end to end with NumPy shards: every check against one rank passes."""
    import json
    import subprocess

    monkeypatch.setenv("MULTIREDUCE_MPIEXEC", mpiexec)
    out = tmp_path / "multigpu.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_multigpu.py"), "--cpu", "--ranks", "1,2,3"]
        + ["--weak-per-rank", "4099", "--strong-n", "10007", "--repeat", "2", "--warmup", "1"]
        + ["--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["checks_failed"] == 0 and doc["gpu"] == "cpu"
    checked = [r for r in doc["records"] if "check_passed" in r]
    # Every op at ranks 2 and 3 (weak and strong), and the fast sum at rank 1.
    assert {(r["ranks"], r["op"]) for r in checked} >= {(3, "sum_reproducible"), (2, "stats"), (1, "sum")}
    assert all(r["check_passed"] for r in checked)
    repro = {r["ranks"]: r["bits"] for r in doc["records"] if r["n"] == 10007 and r["op"] == "sum_reproducible"}
    assert len(set(repro.values())) == 1 and set(repro) == {1, 2, 3}
