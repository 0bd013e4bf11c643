"""``python -m multireduce``: run (default), info and bench, alone and under mpiexec (CPU).

Results are compared with references computed here from the synthetic formula or the file's
contents in exact integers / math.fsum, independent of multireduce.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from mpi_scripts import launch
from mpi_scripts.launch import run
from reference import float_sum, ieee_extreme, same_float, ulp

from multireduce._cli import main

CLI = ["-m", "multireduce"]


def synthetic(n: int, low: int = -1000, period: int = 2001) -> np.ndarray:
    # The documented default data: x[i] = (i * 7919) % period + low.
    return (np.arange(n, dtype=np.int64) * 7919) % period + low


def results(report: dict) -> dict[str, object]:
    return {row["op"]: row["result"] for row in report["results"]}


def run_json(mpiexec, ranks, *args, timeout=60):
    # --cpu: these tests pin the CPU backend, so that they also pass on a GPU machine.
    done = run(mpiexec, ranks, [*CLI, *args, "--json", "--cpu"], timeout=timeout)
    assert done.returncode == 0, done.output
    return json.loads(done.stdout)


# ------------------------------------------------------------------ usage errors, in-process


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--op", "median"], "unknown op 'median'; the CLI runs: 'sum', 'max', 'min', 'prod', 'count_nonzero', "),
        (["--n", "-5"], "must be a non-negative integer, got '-5' (negative)"),
        (["--n", "1.5"], "must be a non-negative integer, got '1.5'"),
        (["--n", "ten"], "must be a non-negative integer, got 'ten'"),
        (["--per-rank", "nan"], "must be a non-negative integer"),
        (["--dtype", "complex64"], "does not support input dtype complex64"),
        (["--n", "5", "--per-rank", "3"], "not allowed with argument"),
        (["--input", "x.npy", "--per-rank", "3"], "--per-rank applies to synthetic data"),
        # Each rank took the first 5 elements of its own file: n = 10 on 2 ranks, not the global 5.
        (["--input", "x_{rank}.raw", "--dtype", "f8", "--n", "5"], "--n (a global length) does not apply to"),
        (["bench", "--sizes", "10,-1"], "non-negative integer"),
        # int() of these took minutes (or ran out of memory) building their digits.
        (["--n", "1e1000000000"], "must be a non-negative integer of at most 2**63 - 1, got '1e1000000000'"),
        (["--per-rank", "9_223_372_036_854_775_808"], "of at most 2**63 - 1"),
        (["bench", "--sizes", "10,1e999999999"], "of at most 2**63 - 1, got '1e999999999'"),
        (["--repeat", "1e999999999"], "of at most 2**63 - 1"),
        # An empty list ran the default sweep.
        (["bench", "--sizes", ","], "argument --sizes: must list at least one global length (e.g. 1000,1e6), got ','"),
        (["bench", "--sizes", ""], "must list at least one global length"),
        (["frobnicate"], "unrecognized arguments"),
        # Path("") is ".": every rank failed with "IsADirectoryError: '.'".
        (["--input", ""], "argument --input: must name a file, got an empty path"),
        # An option before the command: "unrecognized arguments: info".
        (["--cpu", "info"], "the command comes first: python -m multireduce info [options]"),
        (["run", "--cpu", "info"], "unrecognized arguments: info"),  # the command was first
        (["--json", "bench", "--sizes", "10"], "the command comes first: python -m multireduce bench"),
    ],
)
def test_usage_errors_exit_2_without_starting_mpi(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "info", "bench"])
def test_negative_device_is_a_usage_error(command, tmp_path):
    # It was ignored wherever the backend is the CPU (the job ran), and on a GPU refused as
    # "select_device: device=", which the command line does not have.
    small = {"run": ["--n", "10"], "info": [], "bench": ["--sizes", "10", "--output", str(tmp_path / "b.json")]}
    done = run(None, 1, [*CLI, command, "--cpu", "--device", "-1", *small[command]])
    assert done.returncode == 2 and done.stdout == "", done.output
    assert done.stderr.count("argument --device: must be a non-negative integer, got '-1' (negative)") == 1


def test_device_without_a_gpu_is_an_error(capsys):
    # --device was ignored on the CPU backend: the job ran on the CPU and exited 0.
    assert main(["--cpu", "--device", "0", "--n", "10"]) == 2
    assert "--device picks a GPU, and --cpu asks for none" in capsys.readouterr().err
    if importlib.util.find_spec("cupy") is None:  # the CPU backend by detection
        done = run(None, 1, [*CLI, "--device", "0", "--n", "10"])
        assert done.returncode == 1, done.output
        assert "--device 0 asks for a GPU, but this rank runs on the CPU (CuPy is not importable" in done.stderr


def test_a_malformed_device_variable_is_an_error_on_the_cpu_too():
    # The CPU backend did not read MULTIREDUCE_DEVICE at all: "abc" passed without a word.
    done = run(None, 1, [*CLI, "--cpu", "--n", "10", "--op", "sum"], extra_env={"MULTIREDUCE_DEVICE": "abc"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.output
    assert "MULTIREDUCE_DEVICE='abc': it must be a non-negative integer device ordinal" in done.stderr, done.output
    done = run(None, 1, [*CLI, "--cpu", "--n", "10", "--op", "sum"], extra_env={"MULTIREDUCE_DEVICE": "-3"})
    assert done.returncode == 1 and "MULTIREDUCE_DEVICE='-3': it must be a non-negative" in done.stderr, done.output
    # A valid ordinal is not used there (an exported setting), and is no error.
    done = run(None, 1, [*CLI, "--cpu", "--n", "10", "--op", "sum"], extra_env={"MULTIREDUCE_DEVICE": " 1 "})
    assert done.returncode == 0 and "backend cpu" in done.stdout, done.output


def test_a_closed_standard_output_ends_the_job_with_one_line():
    # `python -m multireduce | head -1`: the report's print raised BrokenPipeError, printed
    # with a full traceback as a failure of rank 0.
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, *CLI, "--cpu", "--n", "1000", "--op", "sum", "--op", "mean"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=launch.REPO,
        env=launch.env(),
    )
    proc.stdout.close()  # the reader is gone before the report is written
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1, stderr
    assert stderr == "multireduce: rank 0 of 1: standard output was closed; output stopped\n", stderr


def test_help_and_accepted_lengths(capsys):
    assert main(["--help"]) == 0
    assert "run" in capsys.readouterr().out
    assert main(["run", "--help"]) == 0
    assert "--per-rank" in capsys.readouterr().out
    from multireduce._cli import _length

    assert [_length(s) for s in ("0", "1_000", "1e6", "2E3")] == [0, 1000, 10**6, 2000]
    for bad in ("1_000_", "_1", "1__0", "1_e6"):  # Python's rule: one underscore between digits
        with pytest.raises(argparse.ArgumentTypeError, match="an underscore goes between two digits"):
            _length(bad)
    assert _length("9_223_372_036_854_775_807") == 2**63 - 1


@pytest.mark.mpi
def test_usage_error_is_printed_once(mpiexec):
    done = run(mpiexec, 3, [*CLI, "--op", "median"])
    assert done.returncode == 2
    assert done.stderr.count("unknown op 'median'") == 1, done.output


@pytest.mark.mpi
@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_usage_error_on_one_rank_of_an_mpmd_launch_ends_the_job(mpiexec, bad_rank):
    # mpiexec -n 1 A : -n 1 B, one of them with a bad --op: that rank joins the first
    # agreement of the valid one with its usage error (before, it exited alone with status 2
    # and the other rank waited in that agreement forever). Rank 0 prints the error once.
    extra = shlex.split(os.environ.get("MULTIREDUCE_MPIEXEC_ARGS", ""))
    good, bad = [*CLI, "--cpu", "--n", "1000"], [*CLI, "--op", "median"]
    first, second = (bad, good) if bad_rank == 0 else (good, bad)
    cmd = [mpiexec, *extra, "-n", "1", sys.executable, *first, ":", "-n", "1", sys.executable, *second]
    returncode, stdout, stderr = launch._mpiexec.run_group(cmd, cwd=launch.REPO, env=launch.env(), timeout=60)
    # Every rank exits 2, the valid one too: mpiexec ORs the statuses, and 1 | 2 gave 3.
    assert returncode == 2, stdout + stderr
    assert stderr.count("unknown op 'median'") == 1, stdout + stderr
    if bad_rank == 1:
        assert "rank 1 of 2 failed: UsageError" in stderr, stderr


@pytest.mark.mpi
def test_rank_0s_usage_error_does_not_hide_the_other_ranks(mpiexec):
    # An MPMD launch whose rank 0 and rank 1 have different bad command lines: rank 0 printed
    # its own error only (rank 1's bad --dtype was never shown, nor that it failed).
    extra = shlex.split(os.environ.get("MULTIREDUCE_MPIEXEC_ARGS", ""))
    lines = [[*CLI, "--cpu", "--n", "-1"], [*CLI, "--cpu", "--dtype", "complex64"], [*CLI, "--cpu", "--n", "5"]]
    cmd = [mpiexec, *extra]
    for k, argv in enumerate(lines):
        cmd += ([":"] if k else []) + ["-n", "1", sys.executable, *argv]
    returncode, stdout, stderr = launch._mpiexec.run_group(cmd, cwd=launch.REPO, env=launch.env(), timeout=60)
    assert returncode == 2, stdout + stderr
    assert stderr.count("argument --n: must be a non-negative integer, got '-1' (negative)") == 1, stderr
    assert stderr.count("multireduce: error: rank 1 of 3 failed: UsageError: ") == 1, stderr
    assert "does not support input dtype complex64" in stderr and "rank 0 of 3" not in stderr, stderr


@pytest.mark.mpi
@pytest.mark.parametrize("help_rank", [0, 1])
@pytest.mark.parametrize(("flag", "printed"), [("--version", "multireduce 0.1.0"), ("--help", "usage: ")])
def test_help_on_one_rank_of_an_mpmd_launch_ends_the_job(mpiexec, flag, printed, help_rank):
    # mpiexec -n 1 A : -n 1 python -m multireduce --version: that rank printed and exited 0
    # without MPI, and rank 0 waited in the first agreement for it forever. With the help on
    # rank 0, the job ended with status 2 and no message: the other rank leaves the printing
    # of an agreed failure to rank 0, which now prints it after its help or version.
    extra = shlex.split(os.environ.get("MULTIREDUCE_MPIEXEC_ARGS", ""))
    good = [*CLI, "--cpu", "--n", "1000", "--repeat", "1"]
    first, second = ([*CLI, flag], good) if help_rank == 0 else (good, [*CLI, flag])
    cmd = [mpiexec, *extra, "-n", "1", sys.executable, *first, ":", "-n", "1", sys.executable, *second]
    returncode, stdout, stderr = launch._mpiexec.run_group(cmd, cwd=launch.REPO, env=launch.env(), timeout=60)
    assert returncode == 2, stdout + stderr
    message = f"error: rank {help_rank} of 2 failed: UsageError: python -m multireduce {flag} prints help or a version"
    assert stderr.count(message) == 1, stdout + stderr
    assert "Traceback" not in stderr, stdout + stderr
    assert stdout.count(printed) == (help_rank == 0) and (help_rank == 0 or stdout == ""), stdout + stderr
    # Alone, and on every rank, they print once and end with status 0.
    for ranks in (1, 2):
        done = run(mpiexec if ranks > 1 else None, ranks, [*CLI, flag])
        assert done.returncode == 0 and done.stderr == "" and done.stdout.count(printed) == 1, done.output


@pytest.mark.mpi
def test_a_process_that_fails_before_mpi_starts_ends_the_job(mpiexec):
    # MPI_Init waits for every process of the launch: where one exits before starting MPI
    # (here a plain failing Python; or mpi4py missing in its environment), MPICH's Hydra left
    # the CLI's rank waiting in MPI_Init forever. The CLI arms SIGALRM around its MPI start
    # (MULTIREDUCE_MPI_START_TIMEOUT, 60 s by default), so the job ends. (Open MPI's mpirun
    # may end it at once; either way it ends, and with an error.)
    extra = shlex.split(os.environ.get("MULTIREDUCE_MPIEXEC_ARGS", ""))
    failing = ["-c", "import sys; print('failed before MPI', file=sys.stderr); sys.exit(1)"]
    cmd = [mpiexec, *extra, "-n", "1", sys.executable, *failing, ":", "-n", "1", sys.executable, *CLI, "--n", "10"]
    environment = {**launch.env(), "MULTIREDUCE_MPI_START_TIMEOUT": "3"}
    start = time.monotonic()
    returncode, stdout, stderr = launch._mpiexec.run_group(cmd, cwd=launch.REPO, env=environment, timeout=60)
    assert returncode != 0, stdout + stderr
    assert time.monotonic() - start < 30, stdout + stderr
    assert "failed before MPI" in stderr, stdout + stderr
    # A bad value is a usage error naming the variable; 0 turns the alarm off.
    done = run(mpiexec, 2, [*CLI, "--n", "10"], extra_env={"MULTIREDUCE_MPI_START_TIMEOUT": "soon"})
    assert done.returncode == 2, done.output
    assert done.stderr.count("MULTIREDUCE_MPI_START_TIMEOUT='soon': expected seconds") == 1, done.output
    done = run(mpiexec, 2, [*CLI, "--n", "10"], extra_env={"MULTIREDUCE_MPI_START_TIMEOUT": "0"})
    assert done.returncode == 0, done.output


ALARM_AROUND_MPI_START = """
import os, signal, threading
from multireduce import _cli

os.environ["PMI_SIZE"] = "2"  # as under a launcher: the alarm is armed
handler = lambda *args: None
signal.signal(signal.SIGALRM, handler)
signal.alarm(100)
_cli._import_mpi(5.0)
restored = signal.getsignal(signal.SIGALRM) is handler
pending = signal.alarm(0)
done = []
worker = threading.Thread(target=lambda: done.append(_cli._import_mpi(5.0)))  # signals: main thread only
worker.start()
worker.join()
print("RESULT", restored, 90 <= pending <= 100, bool(done))
"""


def test_the_mpi_start_alarm_leaves_the_callers_alarm_and_handler_as_they_were():
    # The caller's SIGALRM handler and pending alarm are put back; from another thread than
    # the main one (where signals cannot be set) MPI starts without the alarm, as before it.
    done = run(None, 1, ["-c", ALARM_AROUND_MPI_START], timeout=60)
    assert done.returncode == 0, done.output
    assert "RESULT True True True" in done.stdout, done.output
    # A value past what signal.alarm takes is a usage error, as other bad values.
    done = run(None, 1, [*CLI, "info"], extra_env={"MULTIREDUCE_MPI_START_TIMEOUT": "2147483648", "PMI_SIZE": "2"})
    assert done.returncode == 2, done.output
    assert "a number from 0 to 2147483647" in done.stderr and "Traceback" not in done.stderr, done.output


@pytest.mark.parametrize(
    ("environment", "size"),
    [
        ({}, 1),
        ({"OMPI_COMM_WORLD_SIZE": "4"}, 4),
        ({"PMI_SIZE": "3"}, 3),
        # srun sets SLURM_STEP_NUM_TASKS in each task of a step, and neither of the others
        # under PMIx: such a rank with a usage error left the others in the first agreement.
        ({"SLURM_STEP_NUM_TASKS": "2"}, 2),
        # A batch script outside any step has SLURM_NTASKS: that is no launch.
        ({"SLURM_NTASKS": "8"}, 1),
        ({"OMPI_COMM_WORLD_SIZE": "4", "SLURM_STEP_NUM_TASKS": "2"}, 4),
        ({"PMI_SIZE": " ", "SLURM_STEP_NUM_TASKS": "x"}, 1),
    ],
)
def test_the_launchers_process_count_before_mpi_starts(monkeypatch, environment, size):
    from multireduce import _cli

    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert _cli._env_size() == size


# ------------------------------------------------------------------ run


@pytest.mark.mpi
def test_default_run_needs_no_arguments(mpiexec):
    done = run(mpiexec, 2, CLI, timeout=120)
    assert done.returncode == 0, done.output
    out = done.stdout
    assert "2 rank(s), backend cpu (CuPy" in out or "2 rank(s), backend gpu" in out
    assert "check: all results match the reference" in out
    for word in ("sum", "max", "min", "load", "kernel ms", "GB/s", "allreduce us", "staged through host"):
        assert word in out
    assert out.count("multireduce 0.1.0") == 1  # once, from rank 0


def test_run_without_mpiexec():
    done = run(None, 1, [*CLI, "--cpu", "--n", "5000", "--repeat", "1"])
    assert done.returncode == 0, done.output
    assert "1 rank(s), backend cpu (forced by --cpu)" in done.stdout


@pytest.mark.parametrize("command", ["run", "bench"])
def test_synthetic_length_too_large_for_one_rank(command, tmp_path):
    # NumPy's arange(0, 2**63 - 1) is an empty array, not an error: --n 2**63 - 1 (accepted, as
    # documented) reduced no data, and --check passed a sum of 0.0 against its reference 3320.
    n = str(2**63 - 1)
    size = ["--n", n, "--op", "sum"] if command == "run" else ["--sizes", n, "--output", str(tmp_path / "b.json")]
    done = run(None, 1, [*CLI, command, "--cpu", "--repeat", "1", *size])
    assert done.returncode == 1, done.output
    assert done.stdout == "" and "Traceback" not in done.stderr, done.output
    message = "rank 0 of 1 failed: MemoryError: cannot make 9,223,372,036,854,775,807 elements of synthetic data"
    assert done.stderr.count(message) == 1, done.output
    # Other lengths past what an array's bytes can count got NumPy's "array is too big"
    # ValueError, which names neither the option nor the remedy.
    for option, value in (("--n", "4e18"), ("--per-rank", "2e18"), ("--n", str(2**60 - 1))):
        done = run(None, 1, [*CLI, "run", "--cpu", "--repeat", "1", option, value, "--op", "sum", "--dtype", "int8"])
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.output
        elements = f"{int(value) if value.isdigit() else int(float(value)):,}"
        message = f"MemoryError: cannot make {elements} elements of synthetic data"
        assert done.stderr.count(message) == 1 and "give a smaller length" in done.stderr, done.output


def test_mpi4py_without_an_mpi_library_gets_the_install_hint(tmp_path):
    # mpi4py 4 installed without an MPI library raises "RuntimeError: cannot load MPI library"
    # at its import: the command printed a traceback, not the hint to install the mpi extra
    # (which now brings MPICH on Linux).
    fake = tmp_path / "mpi4py"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "MPI.py").write_text("raise RuntimeError('cannot load MPI library')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parent.parent)])}
    done = subprocess.run(
        [sys.executable, "-m", "multireduce", "--n", "10", "--cpu"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "needs mpi4py and an MPI library (cannot load MPI library)" in done.stderr, done.stderr
    assert "pip install 'multireduce[mpi]'" in done.stderr, done.stderr


def test_synthetic_data_takes_about_its_own_memory():
    # The generator made the whole range's int64 indices before the cast: 9 bytes per int8
    # element (a rank of --n 3e9 --dtype int8 was killed by the kernel, with no message).
    # In a fresh process: its peak resident size for 2**28 int8 (256 MiB) stays well under
    # the 2.25 GiB that took.
    code = (
        "import resource, numpy as np\n"
        "from multireduce import _cli\n"
        "p = _cli._Pattern.for_dtype(np.dtype('int8'))\n"
        "x = p.values(0, 2**28, np.dtype('int8'), np)\n"
        "i = np.arange(2**20, dtype=np.int64)\n"
        "assert np.array_equal(x[:2**20], (i * _cli._MULT % p.period + p.low).astype(np.int8))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    peak_kib = int(done.stdout)
    assert peak_kib < 700 * 1024, peak_kib


@pytest.mark.mpi
def test_per_rank_length_past_the_global_limit(mpiexec):
    # --per-rank 2**63 - 1 on 2 ranks: a global length of 2**64 - 2, past the documented limit,
    # printed as n = 18,446,744,073,709,551,614 with an empty shard on each rank and sum 0.0 "ok".
    done = run(mpiexec, 2, [*CLI, "--cpu", "--per-rank", str(2**63 - 1), "--op", "sum", "--repeat", "1"])
    assert done.returncode == 1 and done.stdout == "", done.output
    message = (
        "ranks 0, 1 of 2 failed: ValueError: --per-rank 9,223,372,036,854,775,807 on 2 ranks makes a global "
        "length of 18,446,744,073,709,551,614, more than 2**63 - 1"
    )
    assert done.stderr.count(message) == 1, done.output


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_run_results_at_any_rank_count(mpiexec, ranks):
    n = 10_007  # uneven over 2, 3 and 4 ranks
    report = run_json(mpiexec, ranks, "--n", str(n), "--repeat", "1", "--all-ranks")
    g = synthetic(n)
    assert report["ranks"] == ranks and report["n"] == n and report["backend"] == "cpu"
    assert results(report) == {"sum": float(sum(g.tolist())), "max": 1000.0, "min": -1000.0}
    assert report["check_passed"] is True
    assert sum(r["n_local"] for r in report["per_rank"]) == n
    for row in report["results"]:
        assert row["kernel_s"] >= 0 and row["allreduce_us"] > 0
    assert report["transport"]["host"] > 0 and report["transport"]["staged"] == 0


@pytest.mark.mpi
def test_fewer_elements_than_ranks_and_dtypes(mpiexec):
    report = run_json(mpiexec, 4, "--n", "2", "--repeat", "1")
    g = synthetic(2)  # [-1000, 916]: two ranks hold one element, two hold none
    assert results(report) == {"sum": float(g.sum()), "max": float(g.max()), "min": float(g.min())}
    for dtype, low, period in (("int8", -100, 201), ("uint8", 0, 201), ("uint64", 0, 2001), ("float16", -1000, 2001)):
        report = run_json(mpiexec, 3, "--n", "5003", "--dtype", dtype, "--repeat", "1")
        g = synthetic(5003, low, period)
        assert report["check_passed"] is True, report
        assert results(report)["max"] == g.max() and results(report)["min"] == g.min()
    report = run_json(mpiexec, 3, "--per-rank", "7", "--dtype", "bool", "--repeat", "1")
    assert report["n"] == 21 and results(report) == {"sum": 10, "max": True, "min": False}


def test_bool_references_are_bools():
    # The synthetic bool data's max/min references were the integers 1 and 0 ("reference": 1
    # next to "result": true in JSON, "1" next to "True" in the table); file data gave bools.
    done = run(None, 1, [*CLI, "--cpu", "--dtype", "bool", "--n", "7", "--repeat", "1", "--json"])
    assert done.returncode == 0, done.output
    rows = {row["op"]: row for row in json.loads(done.stdout)["results"]}
    assert (rows["max"]["result"], rows["max"]["reference"]) == (True, True)
    assert (rows["min"]["result"], rows["min"]["reference"]) == (False, False)
    assert all(type(rows[op]["reference"]) is bool for op in ("max", "min")), rows
    assert type(rows["sum"]["result"]) is type(rows["sum"]["reference"]) is int, rows


@pytest.mark.mpi
def test_empty_global_array(mpiexec):
    report = run_json(mpiexec, 3, "--n", "0", "--op", "sum")
    assert results(report) == {"sum": 0.0}
    done = run(mpiexec, 3, [*CLI, "--n", "0", "--cpu"])
    assert done.returncode == 1
    # The message names the ops, the option and the way out (it was NumPy's "zero-size
    # array to reduction operation maximum which has no identity", from inside allreduce).
    message = (
        "ranks 0-2 of 3 failed: ValueError: max and min need at least one element, as in NumPy, and there are "
        "none (--n 0); give at least one element, or only ops that take an empty input with --op (sum, prod, "
        "count_nonzero, any, all, nansum, nanprod, mean, nanmean, var, std, nanvar, nanstd)"
    )
    assert done.stderr.count(message) == 1, done.output
    done = run(mpiexec, 2, [*CLI, "--n", "0", "--cpu", "--op", "min", "--op", "sum"])
    assert done.returncode == 1, done.output
    assert done.stderr.count("failed: ValueError: min needs at least one element") == 1, done.output
    done = run(mpiexec, 2, [*CLI, "--per-rank", "0", "--cpu", "--op", "min"])
    assert done.returncode == 1 and "there are none (--per-rank 0)" in done.stderr, done.output


def test_empty_input_file_names_the_files(tmp_path):
    np.save(tmp_path / "empty.npy", np.zeros(0, np.float32))
    done = run(None, 1, [*CLI, "--cpu", "--input", str(tmp_path / "empty.npy")])
    assert done.returncode == 1, done.output
    assert (
        "max and min need at least one element, as in NumPy, and there are none (the input files hold no elements)"
        in (done.stderr)
    ), done.output
    report = json.loads(
        run(None, 1, [*CLI, "--cpu", "--input", str(tmp_path / "empty.npy"), "--op", "sum", "--json"]).stdout
    )
    assert results(report) == {"sum": 0.0}
    # --n 0 with a file that holds elements: the message blamed the file.
    raw = tmp_path / "ten.bin"
    np.arange(10, dtype=np.int32).tofile(raw)
    done = run(None, 1, [*CLI, "--cpu", "--input", str(raw), "--dtype", "int32", "--n", "0"])
    assert done.returncode == 1 and "there are none (--n 0)" in done.stderr, done.output


@pytest.mark.mpi
def test_input_files(mpiexec, tmp_path):
    rng = np.random.default_rng(5)
    data = rng.standard_normal((37, 101)).astype(np.float32)
    np.save(tmp_path / "a.npy", data)
    report = run_json(mpiexec, 3, "--input", str(tmp_path / "a.npy"), "--check", "--repeat", "1")
    assert report["n"] == data.size and report["dtype"] == "float32" and report["check_passed"] is True
    got = results(report)
    assert abs(got["sum"] - math.fsum(data.astype(np.float64).ravel().tolist())) < 1e-3
    assert got["max"] == float(data.max()) and got["min"] == float(data.min())

    ints = rng.integers(-(2**31), 2**31 - 1, 10_001, dtype=np.int64).astype(np.int32)
    ints.tofile(tmp_path / "x.raw")
    report = run_json(mpiexec, 4, "--input", str(tmp_path / "x.raw"), "--dtype", "int32", "--check", "--repeat", "1")
    assert results(report) == {"sum": sum(ints.tolist()), "max": int(ints.max()), "min": int(ints.min())}
    assert report["check_passed"] is True

    with_nan = np.arange(10.0)
    with_nan[7] = np.nan
    np.save(tmp_path / "nan.npy", with_nan)
    report = run_json(mpiexec, 3, "--input", str(tmp_path / "nan.npy"), "--check", "--repeat", "1")
    assert results(report) == {"sum": "nan", "max": "nan", "min": "nan"} and report["check_passed"] is True


@pytest.mark.mpi
def test_per_rank_files_with_one_missing(mpiexec, tmp_path):
    for rank in (0, 2):
        np.save(tmp_path / f"part_{rank}.npy", np.ones(4))
    done = run(mpiexec, 3, [*CLI, "--cpu", "--input", str(tmp_path / "part_{rank}.npy")], timeout=60)
    assert done.returncode == 1
    assert done.seconds < 30
    assert done.stderr.count("rank 1 of 3 failed: FileNotFoundError") == 1, done.output
    assert "part_1.npy" in done.stderr
    np.save(tmp_path / "part_1.npy", np.ones(5))
    report = run_json(mpiexec, 3, "--input", str(tmp_path / "part_{rank}.npy"), "--check")
    assert results(report) == {"sum": 13.0, "max": 1.0, "min": 1.0} and report["n"] == 13


# The CLI with the global result of some ops changed after the reduction: --check must see it.
# argv[1] is "op:how" (how: "ulp" one float step up or integer up, "elem" plus the last element of the data
# file argv[2] again, a float to replace the result), the rest the CLI's arguments.
WRONG_RESULT = """
import sys
import numpy as np
import multireduce.mpi as mpi
from multireduce._cli import main
changes = dict(c.split(":") for c in sys.argv[1].split(","))
timed = mpi._timed_allreduce
def wrong(x, name, comm, **options):
    value, kernel_s, allreduce_s = timed(x, name, comm, **options)
    how = changes.get(name)
    if how == "ulp":  # integers: plus one
        value = np.nextafter(value, value.dtype.type(np.inf)) if value.dtype.kind == "f" else value + 1
    elif how is not None and how.startswith("as_"):  # the same value in another dtype
        value = np.dtype(how[3:]).type(value)
    elif how == "elem":
        value = value + np.load(sys.argv[2]).ravel()[-1]
    elif how is not None:
        value = value.dtype.type(float(how))
    return value, kernel_s, allreduce_s
mpi._timed_allreduce = wrong
sys.exit(main(sys.argv[3:]))
"""


def run_wrong(mpiexec, ranks, changes, path, *args):
    argv = ["-c", WRONG_RESULT, changes, str(path), "--input", str(path), "--check", "--json", "--cpu", "--repeat", "1"]
    return run(mpiexec, ranks, [*argv, *args], timeout=60)


def float_data():
    rng = np.random.default_rng(11)
    return {
        "uniform64": rng.random(100_000),  # the reviewer's r64.npy: the result is 1 ulp from fsum
        "normal64": rng.standard_normal(30_001) * 1e3,  # cancellation: the sum is small against sum |x|
        "normal32": rng.standard_normal(50_000).astype(np.float32),
        "uniform16": (rng.random(20_000) * 2 - 1).astype(np.float16),
        "wide64": rng.standard_normal(5_000) * 2.0 ** rng.integers(-1070, 1000, 5_000),
    }


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_check_of_float_file_sums(mpiexec, tmp_path, ranks):
    # The "exact" branch of the check assumed integer-valued elements (true of the synthetic
    # data only): a correct float64 sum 1 ulp from math.fsum was reported as FAIL, exit 3.
    for name, data in float_data().items():
        np.save(tmp_path / f"{name}.npy", data)
        report = run_json(mpiexec, ranks, "--input", str(tmp_path / f"{name}.npy"), "--check", "--repeat", "1")
        assert report["check_passed"] is True, (name, report)
        rows = {row["op"]: row for row in report["results"]}
        exact = float_sum(data)  # math.fsum: the exact sum, rounded once
        assert rows["sum"]["reference"] == exact, name
        assert rows["sum"]["check_how"].startswith("|err| <= "), name
        # The result is within reference.check's bound of the exact sum (plus the ranks'
        # roundings), and the check is no looser (its bound printed to 3 digits).
        magnitude = math.fsum(abs(v) for v in data.astype(np.float64).tolist())
        acc_eps = np.finfo(np.float32 if data.dtype == np.float16 else np.float64).eps
        bound = acc_eps * magnitude * (math.log2(data.size + 1) + data.size / 50_000 + ranks + 1)
        assert abs(rows["sum"]["result"] - exact) <= bound + ulp(exact, data.dtype), name
        assert float(rows["sum"]["check_how"][len("|err| <= ") :]) <= (bound + ulp(exact, data.dtype)) * 1.005, name
        for op in ("max", "min"):
            expected = ieee_extreme(data, largest=op == "max")
            assert rows[op]["result"] == expected and rows[op]["reference"] == expected
            assert rows[op]["check"] is True and rows[op]["check_how"] == "identical"


@pytest.mark.mpi
def test_check_fails_on_wrong_file_results(mpiexec, tmp_path):
    # The check is not made loose: an extra element's worth, or one ulp where the sum is exact.
    data = float_data()
    np.save(tmp_path / "uniform64.npy", data["uniform64"])
    np.save(tmp_path / "normal32.npy", data["normal32"])
    np.save(tmp_path / "ints64.npy", np.arange(-5000, 100_000, dtype=np.float64))  # integers: exact
    np.save(tmp_path / "ints16.npy", np.arange(-300, 301, 2, dtype=np.float16))
    np.save(tmp_path / "ints.npy", np.arange(-5000, 100_000, dtype=np.int32))
    np.save(tmp_path / "specials.npy", np.array([np.inf, -np.inf, 1.0, -0.0, 0.0]))
    cases = [
        ("uniform64.npy", "sum:elem", "sum"),
        ("normal32.npy", "sum:elem", "sum"),
        ("ints64.npy", "sum:ulp", "sum"),
        ("ints16.npy", "sum:ulp", "sum"),
        ("ints.npy", "sum:ulp,max:ulp", "sum max"),
        ("uniform64.npy", "max:ulp,min:ulp", "max min"),
        ("specials.npy", "sum:inf", "sum"),  # NaN expected
        ("specials.npy", "max:-inf", "max"),
    ]
    for name, changes, failing in cases:
        done = run_wrong(mpiexec, 2, changes, tmp_path / name)
        assert done.returncode == 3, (name, changes, done.output)
        report = json.loads(done.stdout)
        assert report["check_passed"] is False
        assert {row["op"] for row in report["results"] if not row["check"]} == set(failing.split()), (name, report)
    np.save(tmp_path / "zeros.npy", np.array([-0.0, 0.0, -0.0]))
    done = run_wrong(mpiexec, 2, "max:-0.0,min:0.0", tmp_path / "zeros.npy")  # max +0.0, min -0.0 (IEEE)
    assert done.returncode == 3 and {r["op"] for r in json.loads(done.stdout)["results"] if not r["check"]} == {
        "max",
        "min",
    }, done.output
    # Integer sums that wrap modulo 2**64, as NumPy's do.
    wraps = np.array([2**62, 2**62, 2**62, -5], dtype=np.int64)
    np.save(tmp_path / "wraps.npy", wraps)
    report = run_json(mpiexec, 3, "--input", str(tmp_path / "wraps.npy"), "--check", "--repeat", "1")
    assert report["check_passed"] is True and results(report)["sum"] == 3 * 2**62 - 5 - 2**64
    done = run_wrong(mpiexec, 3, "sum:ulp", tmp_path / "wraps.npy")
    assert done.returncode == 3 and json.loads(done.stdout)["results"][0]["check"] is False, done.output
    # Integer-valued floats are checked exactly: no tolerance.
    report = run_json(mpiexec, 2, "--input", str(tmp_path / "ints64.npy"), "--check", "--repeat", "1")
    assert [row["check_how"] for row in report["results"]] == ["exact", "identical", "identical"]
    assert report["results"][0]["result"] == report["results"][0]["reference"] == sum(range(-5000, 100_000))
    # The synthetic main job stays exact: one ulp off its float32 sum fails.
    done = run(mpiexec, 2, ["-c", WRONG_RESULT, "sum:ulp", "-", "--n", "100003", "--json", "--cpu", "--repeat", "1"])
    assert done.returncode == 3, done.output
    assert [row["check"] for row in json.loads(done.stdout)["results"]] == [False, True, True]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_check_fails_on_wrong_sums_near_the_top_of_the_range(tmp_path, dtype):
    # The bound's ulp was np.spacing(finfo.max), which is inf: any finite sum passed the check
    # where the exact sum is within the tolerance of the largest float (here a sum of 1.0).
    top = np.finfo(dtype).max
    path = tmp_path / "top.npy"
    np.save(path, np.array([top, 0.5], dtype=dtype))  # not integral: the tolerance branch
    done = run(None, 1, [*CLI, "--input", str(path), "--check", "--json", "--cpu", "--repeat", "1", "--op", "sum"])
    assert done.returncode == 0 and json.loads(done.stdout)["check_passed"] is True, done.output
    done = run_wrong(None, 1, "sum:1.0", path, "--op", "sum")
    assert done.returncode == 3, done.output
    row = json.loads(done.stdout)["results"][0]
    assert row["result"] == 1.0 and row["check"] is False, row
    assert "inf" not in row["check_how"], row


SPECIAL_FILES = {
    "inf_minus_inf": np.array([np.inf, -np.inf, 1.0]),  # ValueError: -inf + inf in fsum
    "overflow": np.array([1.7e308, 1.7e308]),  # OverflowError: intermediate overflow in fsum
    "overflow_back": np.array([1.7e308, 1.7e308, -1.7e308, 1.0]),  # inf in NumPy's order
    "one_inf": np.array([1.0, 2.0, 3.0, -np.inf]),  # on the last rank only
    "nan": np.array([1.0, np.nan, np.inf]),
    "zeros": np.array([-0.0, 0.0, -0.0, -0.0]),
    "f32_overflow": np.array([3e38, 3e38, 1.0], dtype=np.float32),  # float64 sum 6e38, float32 result inf
    "f16_overflow": np.full(3, 60000.0, dtype=np.float16),
    "f16_inf": np.array([1.0, np.inf, 2.0], dtype=np.float16),
}


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_check_with_special_values(mpiexec, tmp_path, ranks):
    # The reference raised fsum's ValueError / OverflowError on one rank: a traceback, and
    # MPI_Abort under mpiexec. Specials follow IEEE: NaN and infinities propagate, +inf and
    # -inf make NaN, a sum past the range is an infinity of its sign.
    expected_sum = {
        "inf_minus_inf": math.nan,
        "overflow": math.inf,
        "overflow_back": math.inf,
        "one_inf": -math.inf,
        "nan": math.nan,
        "zeros": 0.0,
        "f32_overflow": math.inf,
        "f16_overflow": math.inf,
        "f16_inf": math.inf,
    }
    for name, data in SPECIAL_FILES.items():
        np.save(tmp_path / f"{name}.npy", data)
        done = run(mpiexec, ranks, [*CLI, "--input", str(tmp_path / f"{name}.npy"), "--check", "--json", "--cpu"])
        assert done.returncode == 0, (name, done.output)
        assert "Traceback" not in done.stderr and "Abort" not in done.output, (name, done.output)
        report = json.loads(done.stdout)
        assert report["check_passed"] is True, (name, report)
        rows = {row["op"]: row for row in report["results"]}
        got = {op: float(row["result"]) for op, row in rows.items()}  # "nan", "inf" in JSON
        assert same_float(got["sum"], expected_sum[name]), (name, got)
        assert same_float(got["max"], ieee_extreme(data, True)) and same_float(got["min"], ieee_extreme(data, False))
        if name in ("inf_minus_inf", "one_inf", "nan", "f16_inf"):
            assert same_float(float(rows["sum"]["reference"]), float_sum(data)), (name, rows)
            assert rows["sum"]["check_how"] in ("NaN", "same infinity")
    assert float(rows["sum"]["reference"]) == math.inf  # the float64 sum of f16_inf


@pytest.mark.mpi
def test_check_with_special_values_prints_one_report(mpiexec, tmp_path):
    np.save(tmp_path / "x.npy", SPECIAL_FILES["inf_minus_inf"])
    done = run(mpiexec, 2, [*CLI, "--input", str(tmp_path / "x.npy"), "--check", "--cpu"])
    assert done.returncode == 0 and done.stderr.count("Traceback") == 0, done.output
    assert done.stdout.count("check: all results match the reference") == 1, done.output
    assert re.search(r"^sum +nan +nan +ok ", done.stdout, re.M), done.stdout


@pytest.mark.parametrize("name", ["overflow", "overflow_back", "f32_overflow", "f16_overflow"])
def test_check_of_sums_past_the_range_warns_nothing(tmp_path, name):
    # The check's own bound took np.spacing of the largest float: "RuntimeWarning: overflow
    # encountered in spacing" from _cli.py on every rank, about nothing the user did.
    np.save(tmp_path / "x.npy", SPECIAL_FILES[name])
    done = run(None, 1, [*CLI, "--input", str(tmp_path / "x.npy"), "--check", "--cpu", "--repeat", "1"])
    assert done.returncode == 0, done.output
    assert "_cli.py" not in done.stderr, done.stderr


# ------------------------------------------------------------------ NumPy's warnings, once

#: A float16 sum past 65504: accumulated in float32, then converted, warning as NumPy's sum.
CAST_WARNING = "RuntimeWarning: overflow encountered in reduce"


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_overflow_warning_is_printed_once_and_the_report_says_so(mpiexec, tmp_path, ranks):
    # A float16 sum past 65504 (accumulated in float32, then cast): NumPy's warning came from
    # that cast on every rank, and from both allreduce paths (untimed and timed calls), so 2
    # copies alone and 8 at -n 4, on top of a report that did not say the sum overflowed.
    np.save(tmp_path / "x.npy", np.full(12, 60000.0, dtype=np.float16))
    launcher = None if ranks == 1 else mpiexec  # one process alone: the plain command
    for extra in (["--check"], ["--no-check"], ["--json"]):
        done = run(launcher, ranks, [*CLI, "--input", str(tmp_path / "x.npy"), "--cpu", "--repeat", "2", *extra])
        assert done.returncode == 0, (extra, done.output)  # a warning, not an error
        # Once on stderr; the JSON document lists it too.
        assert done.stderr.count(CAST_WARNING) == 1, (extra, done.output)
        assert done.stdout.count(CAST_WARNING) == (extra == ["--json"]), (extra, done.output)
        where = "" if ranks == 1 else f" (ranks {'0, 1' if ranks == 2 else '0-3'} of {ranks})"
        assert f"multireduce: warning: sum: {CAST_WARNING}{where}\n" in done.stderr, (extra, done.stderr)
        assert "Traceback" not in done.stderr and "mpi.py" not in done.stderr, (extra, done.stderr)
        if extra == ["--json"]:
            rows = {row["op"]: row for row in json.loads(done.stdout)["results"]}
            assert rows["sum"]["result"] == "inf" and rows["sum"]["overflow"] is True, rows
            assert rows["sum"]["warnings"] == [{"warning": CAST_WARNING, "ranks": list(range(ranks))}], rows
            assert rows["max"]["overflow"] is False and rows["max"]["warnings"] == [], rows
        else:
            note = "overflow: the sum went past the range of float16 (largest 65504), so it is inf"
            assert [ln for ln in done.stdout.splitlines() if ln.startswith("overflow")] == [note], done.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_a_warning_made_an_error_stops_every_rank_with_one_message(mpiexec, tmp_path, ranks):
    # PYTHONWARNINGS=error makes the final cast's overflow warning an exception on every rank
    # after the combine: it escaped unagreed, each rank printed a traceback and the job ended
    # in MPI_Abort. Now it is agreed: one message, exit status 1 on every rank.
    np.save(tmp_path / "x.npy", np.full(12, 60000.0, dtype=np.float16))
    launcher = None if ranks == 1 else mpiexec
    done = run(
        launcher, ranks, [*CLI, "--input", str(tmp_path / "x.npy"), "--cpu"], extra_env={"PYTHONWARNINGS": "error"}
    )
    assert done.returncode == 1, done.output
    who = "rank 0" if ranks == 1 else f"ranks {'0, 1' if ranks == 2 else '0-3'}"
    assert done.stderr.count(f"multireduce: error: {who} of {ranks} failed: {CAST_WARNING}") == 1, done.output
    assert "Traceback" not in done.stderr and "Abort" not in done.output, done.output


@pytest.mark.mpi
def test_a_warning_made_an_error_on_one_rank_alone_stops_the_job(mpiexec, tmp_path):
    # Only rank 0's own float64 partial overflows, under PYTHONWARNINGS=error everywhere: the
    # library's agreement raised the warning on rank 0 and a RankError on rank 1, which left;
    # rank 0 then waited in the CLI's second agreement forever.
    np.save(tmp_path / "x.npy", np.array([1e308, 1e308, 1.0, 1.0]))
    args = [*CLI, "--input", str(tmp_path / "x.npy"), "--cpu", "--op", "sum"]
    done = run(mpiexec, 2, args, extra_env={"PYTHONWARNINGS": "error"})
    assert done.returncode == 1, done.output
    message = "multireduce: error: rank 0 of 2 failed: RuntimeWarning: overflow encountered in reduce"
    assert done.stderr.count(message) == 1 and "Traceback" not in done.stderr, done.output


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("args", "warning"),
    [
        (["--n", "10", "--op", "var", "--correction", "20"], "RuntimeWarning: Degrees of freedom <= 0 for slice"),
        (["--n", "0", "--op", "mean"], "RuntimeWarning: Mean of empty slice"),
    ],
)
def test_warning_filters_that_differ_between_ranks_end_the_job(mpiexec, args, warning):
    # mpiexec -n 1 A : -n 1 python -W error A: the second rank's warning raised inside the
    # block and it went to the block's agreement, while the first went on to the timed
    # loop's Barrier (a hang). Now every warning is recorded in the block and meets each
    # rank's own filters at its end.
    extra = shlex.split(os.environ.get("MULTIREDUCE_MPIEXEC_ARGS", ""))
    argv = [*CLI, "--cpu", *args]
    cmd = [mpiexec, *extra, "-n", "1", sys.executable, *argv, ":", "-n", "1", sys.executable, "-W", "error", *argv]
    returncode, stdout, stderr = launch._mpiexec.run_group(cmd, cwd=launch.REPO, env=launch.env(), timeout=60)
    assert returncode == 1, stdout + stderr
    assert stderr.count(f"multireduce: error: rank 1 of 2 failed: {warning}") == 1, stdout + stderr


@pytest.mark.parametrize(("action", "returncode"), [("error", 1), ("ignore", 0)])
def test_warning_filters_that_name_a_module_still_apply(tmp_path, action, returncode):
    # The block's warnings meet the user's filters again at its end; without the module that
    # warnings.warn had named, "-W error::RuntimeWarning:multireduce.mpi" matched nothing.
    np.save(tmp_path / "x.npy", np.full(12, 60000.0, dtype=np.float16))
    args = ["-W", f"{action}::RuntimeWarning:multireduce.ops", *CLI, "--input", str(tmp_path / "x.npy"), "--cpu"]
    done = run(None, 1, [*args, "--op", "sum"])
    assert done.returncode == returncode, done.output
    assert ("multireduce: warning:" in done.stderr) is False, done.output


@pytest.mark.mpi
def test_a_warning_on_one_rank_alone_is_reported_by_rank_0(mpiexec, tmp_path):
    # Rank 2's own float64 partial overflows (NumPy: "overflow encountered in reduce", on that
    # rank only): rank 0 reports it, naming the rank, and rank 2 prints nothing of its own.
    np.save(tmp_path / "x.npy", np.array([1.0, 1.0, 1.0, 1.0, 1.7e308, 1.7e308]))
    done = run(mpiexec, 3, [*CLI, "--input", str(tmp_path / "x.npy"), "--cpu", "--op", "sum", "--json"])
    assert done.returncode == 0, done.output
    message = "RuntimeWarning: overflow encountered in reduce"
    assert done.output.count(message) == 2, done.output  # the line on stderr, the JSON's entry
    assert f"multireduce: warning: sum: {message} (rank 2 of 3)\n" in done.stderr, done.stderr
    (row,) = json.loads(done.stdout)["results"]
    assert row["overflow"] is True and row["warnings"] == [{"warning": message, "ranks": [2]}], row


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 4])
def test_an_overflow_without_a_numpy_warning_is_reported(mpiexec, tmp_path, ranks):
    # One element per rank at -n 4: the partials only overflow in MPI's addition, where NumPy
    # cannot warn (float64 results are not cast either). The report must still say so; alone,
    # NumPy's reduction warns, once.
    np.save(tmp_path / "x.npy", np.full(4, 1.7e308))
    done = run(None if ranks == 1 else mpiexec, ranks, [*CLI, "--input", str(tmp_path / "x.npy"), "--cpu", "--json"])
    assert done.returncode == 0, done.output
    rows = {row["op"]: row for row in json.loads(done.stdout)["results"]}
    assert rows["sum"]["result"] == "inf" and rows["sum"]["overflow"] is True, rows
    assert done.stderr.count("multireduce: warning: ") == (1 if ranks == 1 else 0), done.stderr
    # An infinity in the data is no overflow.
    np.save(tmp_path / "y.npy", np.array([1.0, np.inf, 2.0, 3.0]))
    done = run(None if ranks == 1 else mpiexec, ranks, [*CLI, "--input", str(tmp_path / "y.npy"), "--cpu", "--json"])
    rows = {row["op"]: row for row in json.loads(done.stdout)["results"]}
    assert done.returncode == 0 and rows["sum"]["overflow"] is False and "warning" not in done.stderr, done.output


@pytest.mark.mpi
def test_an_integer_sum_that_wraps_is_reported_where_checked(mpiexec, tmp_path):
    # Integer sums wrap modulo 2**64 as NumPy's, without a warning: the exact reference of the
    # check tells; without the check it is unknown (null), unless the dtype's range rules it out.
    np.save(tmp_path / "x.npy", np.full(3, 2**62, dtype=np.int64))
    args = [*CLI, "--input", str(tmp_path / "x.npy"), "--cpu", "--op", "sum"]
    done = run(mpiexec, 3, [*args, "--check"])
    assert done.returncode == 0, done.output
    assert "overflow: the exact sum is outside the range of int64: it wrapped modulo 2**64" in done.stdout
    for check, overflow in (("--check", True), ("--no-check", None)):
        (row,) = run_json(mpiexec, 3, *args[len(CLI) :], check)["results"]
        assert row["result"] == -(2**62) and row["overflow"] is overflow, row
    (row,) = run_json(mpiexec, 3, "--n", "1000", "--dtype", "int32", "--op", "sum", "--no-check")["results"]
    assert row["overflow"] is False, row  # 1000 int32 values cannot leave int64's range


# bench's synthetic data never leaves float16's range (its partial sums stay within 5,862):
# values of 60000 instead, through the same loop.
BENCH_PAST_FLOAT16 = """
import sys
from multireduce import _cli
_cli._Pattern.for_dtype = staticmethod(lambda dt: _cli._Pattern(1, 60000))
sys.exit(_cli.main(sys.argv[1:]))
"""


@pytest.mark.mpi
def test_bench_reports_a_warning_once(mpiexec, tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "--cpu", "--dtype", "float16", "--sizes", "1000", "--warmup", "1", "--repeat", "2"]
    done = run(mpiexec, 2, ["-c", BENCH_PAST_FLOAT16, *args, "--output", str(out)])
    assert done.returncode == 0, done.output
    assert done.output.count(CAST_WARNING) == 1, done.output
    assert f"multireduce: warning: sum, n = 1,000: {CAST_WARNING} (ranks 0, 1 of 2)\n" in done.stderr
    records = {r["op"]: r for r in json.loads(out.read_text())["records"]}
    assert records["sum"]["warnings"] == [{"warning": CAST_WARNING, "ranks": [0, 1]}]
    assert records["max"]["warnings"] == []


# The file reference fails on rank 1 only (as converting a large shard can run out of memory).
REFERENCE_FAILS_ON_RANK_1 = """
import sys
from multireduce import _cli
reference = _cli._file_reference
def failing(x, op):
    if _cli._env_rank() == 1:
        raise MemoryError("no memory for the reference")
    return reference(x, op)
_cli._file_reference = failing
sys.exit(_cli.main(sys.argv[1:]))
"""


@pytest.mark.mpi
def test_reference_error_on_one_rank_is_agreed(mpiexec, tmp_path):
    # Rank 1 raised while rank 0 waited in the allgather of the parts: MPI_Abort and a traceback.
    np.save(tmp_path / "x.npy", np.arange(100.0))
    done = run(mpiexec, 2, ["-c", REFERENCE_FAILS_ON_RANK_1, "--input", str(tmp_path / "x.npy"), "--check", "--cpu"])
    assert done.returncode == 1 and done.seconds < 30, done.output
    assert done.stderr.count("multireduce: error: rank 1 of 2 failed: MemoryError: no memory for the reference") == 1
    assert "Traceback" not in done.stderr and "Abort" not in done.output and done.stdout == "", done.output


def test_exact_float_sum_of_the_reference():
    # The file reference's sum: exact, whatever the exponents (subnormals, values near the top
    # of the range, sums past it), compared with Python's exact rationals.
    from multireduce._cli import _exact_float_sum, _to_float

    rng = np.random.default_rng(4)
    tiny = np.array([5e-324, -5e-324, 1e-310, 2.2250738585072014e-308, -0.0, 0.0])
    sets = [
        tiny,
        np.array([1.7e308, 1.7e308, -1e308]),
        np.array([np.finfo(np.float64).max] * 3),
        rng.standard_normal(3000) * 2.0 ** rng.integers(-1074, 1000, 3000),
        np.concatenate([rng.random(5000), -rng.random(5000)]),
        rng.standard_normal(1 << 21),  # more than one 2**20 chunk
        (rng.random(4097) * 2 - 1).astype(np.float16),
        rng.standard_normal(999).astype(np.float32),
    ]
    for data in sets:
        values = data.astype(np.float64).tolist()
        exact = sum((Fraction(v) for v in values), Fraction(0))
        assert _exact_float_sum(data) == exact
        try:
            assert _to_float(exact) == math.fsum(values)
        except OverflowError:  # fsum's intermediate overflow
            assert _to_float(exact) == (math.inf if exact > 0 else _to_float(exact))
    assert _to_float(_exact_float_sum(np.array([1.7e308, 1.7e308]))) == math.inf
    assert _to_float(_exact_float_sum(np.array([-1.7e308, -1.7e308]))) == -math.inf
    assert _to_float(_exact_float_sum(np.array([1.7e308, 1.7e308, -1.7e308]))) == 1.7e308


def npy_with_header(path, shape, data: bytes = b"\0" * 16):
    """A .npy file of float32 whose header claims ``shape``, whatever the data."""
    h = repr({"descr": "<f4", "fortran_order": False, "shape": shape}).encode()
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + data)
    return path


class _Payload:
    """Unpickling an instance creates the file ``marker`` (as a malicious pickle could)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.mpi
def test_bad_files(mpiexec, tmp_path):
    obj = np.empty(3, dtype=object)
    obj[:] = [1, "a", None]
    np.save(tmp_path / "obj.npy", obj, allow_pickle=True)
    np.save(tmp_path / "ok.npy", np.arange(100.0))
    (tmp_path / "short.npy").write_bytes((tmp_path / "ok.npy").read_bytes()[:-9])
    (tmp_path / "x.raw").write_bytes(b"\0" * 10)
    # Corrupt headers: shapes whose int64 element count wraps to 0 (once read as an empty
    # array, sum 0.0) or below, a negative one, and bytes 10..20 overwritten (a bare
    # tokenize.TokenError, once).
    npy_with_header(tmp_path / "wrap0.npy", (2**62, 4))
    npy_with_header(tmp_path / "wrapneg.npy", (2**62, 3))
    npy_with_header(tmp_path / "neg.npy", (-1,))
    garbled = bytearray((tmp_path / "ok.npy").read_bytes())
    garbled[10:20] = b"garbage{{{"
    (tmp_path / "garbled.npy").write_bytes(bytes(garbled))
    np.savez(tmp_path / "z.npz", a=np.arange(1000.0))  # was summed as raw int8 bytes with --dtype int8
    marker = tmp_path / "unpickled"
    payload = np.empty(1, dtype=object)
    payload[0] = _Payload(marker)
    np.save(tmp_path / "payload.npy", payload, allow_pickle=True)
    corrupt = "not a valid .npy file (truncated or corrupt header)"
    npz = f"{tmp_path / 'z.npz'} is an .npz archive (a zip of arrays), not a .npy file; give one .npy file"
    cases = [
        ([str(tmp_path / "obj.npy")], "holds Python objects (dtype object); multireduce never unpickles data"),
        ([str(tmp_path / "short.npy")], "short.npy is truncated"),
        ([str(tmp_path / "wrap0.npy")], "wrap0.npy is truncated or its header is corrupt: the header promises shape"),
        ([str(tmp_path / "wrapneg.npy")], "wrapneg.npy is truncated or its header is corrupt"),
        ([str(tmp_path / "neg.npy")], f"neg.npy: {corrupt}: shape (-1,) has a negative dimension"),
        ([str(tmp_path / "garbled.npy")], f"garbled.npy: {corrupt}: TokenError"),
        ([str(tmp_path / "missing.npy")], "FileNotFoundError"),
        ([str(tmp_path / "x.raw")], "is not a .npy file; give the dtype"),
        ([str(tmp_path / "x.raw"), "--dtype", "float32"], "not a whole number of 4-byte elements"),
        ([str(tmp_path / "ok.npy"), "--dtype", "float32"], "holds float64, but dtype float32 was requested"),
        ([str(tmp_path / "payload.npy")], "payload.npy holds Python objects (dtype object); multireduce never"),
        ([str(tmp_path / "z.npz")], f"TypeError: {npz}"),
        ([str(tmp_path / "z.npz"), "--dtype", "int8"], f"TypeError: {npz}"),
    ]
    for args, message in cases:
        done = run(mpiexec, 2, [*CLI, "--cpu", "--input", *args])
        assert done.returncode == 1, done.output
        assert "ranks 0, 1 of 2 failed" in done.stderr and done.stderr.count(message) == 1, done.output
        assert "Traceback" not in done.stderr and done.stdout == "", done.output
    assert not marker.exists()  # payload.npy was never unpickled


# ------------------------------------------------------------------ info and bench


@pytest.mark.mpi
def test_info(mpiexec):
    done = run(mpiexec, 2, [*CLI, "info", "--cpu"])
    assert done.returncode == 0, done.output
    out = done.stdout
    for text in ("backend: cpu (forced by --cpu)", "MPI: ", "ranks: 2", "rank 1:", "node-local rank 1"):
        assert text in out, out
    # The test machines have a C compiler: the streaming layer's native copy engine builds.
    assert re.search(r"stream copy engine: native \(.*hostcopy-\w+-.*\.so\)", out), out
    if "MPICH" in out:  # the PyPI wheel of CI; Open MPI elsewhere answers through either source
        assert (
            "CUDA-aware MPI: no (staged through host memory), decided by MPIX_Query_cuda_support "
            "[MPIX_Query_cuda_support: returned 0]"
        ) in out, out
    else:
        assert "CUDA-aware MPI: " in out and "decided by " in out
    done = run(mpiexec, 2, [*CLI, "info", "--json"], extra_env={"MULTIREDUCE_CUDA_AWARE": "1"})
    report = json.loads(done.stdout)
    assert report["ranks"] == 2 and report["cuda_aware"] is True and report["cuda_aware_decided_by"] == "env"
    assert report["stream_copy_engine"]["setting"] == "auto" and report["stream_copy_engine"]["engine"] == "native"
    assert "MULTIREDUCE_CUDA_AWARE=1" in report["cuda_aware_detail"]
    done = run(mpiexec, 2, [*CLI, "info"], extra_env={"MULTIREDUCE_CUDA_AWARE": "maybe"})
    assert done.returncode == 1 and done.stderr.count("MULTIREDUCE_CUDA_AWARE must be 0 or 1") == 1, done.output


# The CLI on every rank, with MULTIREDUCE_CUDA_AWARE set to a bad value on rank 1 only (the
# launcher's rank variable, read as the CLI reads it, before MPI starts).
BAD_ENV_ON_RANK_1 = (
    "import os, sys\n"
    "from multireduce._cli import _env_rank, main\n"
    "if _env_rank() == 1:\n"
    "    os.environ['MULTIREDUCE_CUDA_AWARE'] = 'yes'\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.mpi
@pytest.mark.parametrize(
    "argv", [["run", "--n", "10", "--repeat", "1"], ["info"], ["bench", "--sizes", "10"]], ids=["run", "info", "bench"]
)
def test_error_on_one_rank_before_the_first_collective(mpiexec, argv, tmp_path):
    # Rank 1 failed its local check before the node-local Split_type and waited in the error
    # agreement while rank 0 waited in the Split_type: the job hung.
    output = ["--output", str(tmp_path / "b.json")] if argv[0] == "bench" else []
    done = run(mpiexec, 2, ["-c", BAD_ENV_ON_RANK_1, *argv, *output, "--cpu"], timeout=60)
    assert done.returncode == 1, done.output
    assert done.seconds < 30
    message = "multireduce: error: rank 1 of 2 failed: ValueError: MULTIREDUCE_CUDA_AWARE must be 0 or 1, got 'yes'"
    assert done.stderr.count(message) == 1, done.output
    assert "Traceback" not in done.stderr and done.stdout == "", done.output


# The CLI with rank 1 started differently: CHANGE runs on rank 1 only, before main().
ON_RANK_1 = (
    "import os, sys\n"
    "import multireduce._cli as cli\n"
    "argv = sys.argv[1:]\n"
    "if cli._env_rank() == 1:\n"
    "    exec(os.environ['CHANGE'])\n"
    "sys.exit(cli.main(argv))\n"
)


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("change", "argv"),
    [
        ("argv[argv.index('--n') + 1] = '1000'", ["run", "--n", "10"]),  # a wrong sum, silently
        ("argv += ['--repeat', '1']", ["run", "--n", "10"]),  # a hang (one more Barrier on rank 0)
        ("argv += ['--op', 'max']", ["run", "--n", "10", "--op", "sum"]),  # MPI aborted: message truncated
    ],
    ids=["n", "repeat", "op"],
)
def test_ranks_started_with_different_arguments(mpiexec, change, argv):
    done = run(mpiexec, 2, ["-c", ON_RANK_1, *argv, "--cpu"], timeout=60, extra_env={"CHANGE": change})
    assert done.returncode == 1, done.output
    assert done.seconds < 30
    assert done.stderr.count("the command line differs across ranks") == 1, done.output
    assert "Traceback" not in done.stderr and done.stdout == "", done.output


@pytest.mark.mpi
def test_one_input_file_seen_with_different_lengths(mpiexec, tmp_path):
    # The same relative path names node-local copies that differ: the shards overlapped (a sum
    # of 8 elements that was neither file's, and --check agreed with it).
    for name, n in (("a", 10), ("b", 6)):
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "x.npy", np.arange(n, dtype=np.float64))
    change = f"os.chdir({str(tmp_path / 'b')!r})"
    script = ON_RANK_1.replace("import os, sys\n", f"import os, sys\nos.chdir({str(tmp_path / 'a')!r})\n")
    done = run(mpiexec, 2, ["-c", script, "run", "--cpu", "--input", "x.npy", "--check"], extra_env={"CHANGE": change})
    assert done.returncode == 1, done.output
    assert done.stderr.count("read_shard: the number of elements to split differs across ranks") == 1, done.output


@pytest.mark.mpi
def test_interrupt_on_one_rank_ends_the_job(mpiexec):
    # Ctrl-C reaching one rank outside a collective: that rank aborts the job (exit 130) instead
    # of leaving the others in their next collective.
    change = "def interrupted(*a, **k):\n    raise KeyboardInterrupt\ncli._load = interrupted"
    done = run(mpiexec, 2, ["-c", ON_RANK_1, "run", "--cpu", "--n", "10"], timeout=60, extra_env={"CHANGE": change})
    assert done.returncode != 0, done.output
    assert done.seconds < 30
    assert "multireduce: rank 1 of 2 failed: KeyboardInterrupt" in done.stderr, done.output


def test_interrupt_alone_exits_130():
    # The status that Ctrl-C gives (the README's "130 interrupted"), not 1 for an error: one
    # process, no launcher, so the status is guarded's own.
    interrupted = (
        "import sys\nimport multireduce._cli as cli\n"
        "def interrupted(*a, **k):\n    raise KeyboardInterrupt\n"
        "cli._load = interrupted\nsys.exit(cli.main(sys.argv[1:]))\n"
    )
    done = run(None, 1, ["-c", interrupted, "run", "--cpu", "--n", "10"], timeout=60)
    assert done.returncode == 130, done.output
    assert done.stderr.count("multireduce: rank 0 of 1 failed: KeyboardInterrupt") == 1, done.output
    assert done.stdout == "", done.output


@pytest.mark.mpi
def test_bench_writes_json(mpiexec, tmp_path):
    out = tmp_path / "sub" / "bench.json"
    done = run(
        mpiexec,
        2,
        [*CLI, "bench", "--cpu", "--sizes", "0,1000,4099", "--warmup", "1", "--repeat", "2", "--output", str(out)],
    )
    assert done.returncode == 0, done.output
    doc = json.loads(out.read_text())
    assert doc["ranks"] == 2 and doc["backend"] == "cpu" and doc["repeat"] == 2
    # Size 0 has only sum: max/min of nothing is an error, not a timing.
    assert [(r["n"], r["op"]) for r in doc["records"]] == [
        (0, "sum"),
        (1000, "sum"),
        (1000, "max"),
        (1000, "min"),
        (4099, "sum"),
        (4099, "max"),
        (4099, "min"),
    ]
    assert all(r["allreduce_s_median"] > 0 for r in doc["records"])
    assert f"wrote {out}" in done.stdout


@pytest.mark.mpi
def test_bench_output_that_cannot_be_written(mpiexec, tmp_path):
    # Checked on rank 0 before the benchmark and agreed: one line, exit status 1 (an error,
    # like a missing --input), no traceback or MPI_Abort after a whole benchmark.
    (tmp_path / "file").write_text("")
    cases = [
        (tmp_path, f"IsADirectoryError: --output must name a file that can be written; {tmp_path}: Is a directory"),
        (
            tmp_path / "file" / "b.json",
            f"NotADirectoryError: --output must name a file that can be written; {tmp_path / 'file' / 'b.json'}: "
            f"{tmp_path / 'file'} is not a directory",
        ),
    ]
    sizes = "1000,4099,16384"
    for output, message in cases:
        done = run(mpiexec, 2, [*CLI, "bench", "--cpu", "--sizes", sizes, "--output", str(output)], timeout=60)
        assert done.returncode == 1, done.output
        assert done.stderr.count(f"multireduce: error: rank 0 of 2 failed: {message}") == 1, done.output
        assert "Traceback" not in done.stderr and "MPI_Abort" not in done.output and done.stdout == "", done.output
    done = run(None, 1, [*CLI, "bench", "--cpu", "--sizes", sizes, "--output", str(tmp_path)])
    assert done.returncode == 1 and done.stderr.count("rank 0 of 1 failed: IsADirectoryError: --output") == 1
    assert done.stdout == "" and "Traceback" not in done.stderr, done.output
    # A good path still gets its file (the check removes the empty file it made).
    out = tmp_path / "new" / "b.json"
    done = run(mpiexec, 2, [*CLI, "bench", "--cpu", "--sizes", "100", "--repeat", "1", "--output", str(out)])
    assert done.returncode == 0 and json.loads(out.read_text())["ranks"] == 2, done.output


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_nan_mean_of_finite_elements_is_reported_as_an_overflow(mpiexec, tmp_path, ranks):
    # The float64 sum overflows both ways (inf - inf): the mean is NaN, which the README says
    # is reported as an overflow; NaN of a statistic was taken as "no overflow" throughout.
    both = np.zeros(16)
    if ranks == 1:  # NumPy's pairwise sum: lanes 0 and 1 (elements 0, 8 and 1, 9) reach inf and -inf
        both[[0, 8, 1, 9]] = [1e308, 1e308, -1e308, -1e308]
    else:  # each rank's own sum overflows, one each way
        both[:4] = [1e308, 1e308, -1e308, -1e308]
        both = both[[0, 1, 4, 5, 6, 7, 8, 9, 2, 3, 10, 11, 12, 13, 14, 15]]
    cases = {
        "both ways": (both, True),
        "all NaN": (np.array([np.nan, np.nan]), False),  # no element counted: not an overflow
    }
    launcher = None if ranks == 1 else mpiexec
    for name, (data, overflowed) in cases.items():
        np.save(tmp_path / "x.npy", data)
        args = [*CLI, "--input", str(tmp_path / "x.npy"), "--cpu", "--op", "mean", "--op", "nanmean", "--json"]
        done = run(launcher, ranks, args)
        assert done.returncode == 0, done.output
        rows = {row["op"]: row for row in json.loads(done.stdout)["results"]}
        assert rows["mean"]["result"] == rows["nanmean"]["result"] == "nan", (name, rows)
        assert rows["mean"]["overflow"] is rows["nanmean"]["overflow"] is overflowed, (name, rows)
    done = run(launcher, ranks, [*CLI, "--cpu", "--n", "0", "--op", "mean", "--json"])
    assert done.returncode == 0 and json.loads(done.stdout)["results"][0]["overflow"] is False, done.output


@pytest.mark.mpi
def test_bench_output_that_is_a_pipe_is_refused_at_once(mpiexec, tmp_path):
    # A FIFO: rank 0's check opened it and waited for a reader (every rank with it); with one,
    # the check's close ended the reader's input and the final write waited for ever.
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    message = f"OSError: --output must name a file that can be written; {fifo}: a pipe (FIFO) or socket"
    for launcher, ranks in ((None, 1), (mpiexec, 2)):
        done = run(launcher, ranks, [*CLI, "bench", "--cpu", "--sizes", "10", "--output", str(fifo)], timeout=60)
        assert done.returncode == 1 and done.seconds < 30, done.output
        assert done.stderr.count(f"rank 0 of {ranks} failed: {message}") == 1, done.output
    from multireduce._cli import _check_output

    _check_output(Path(os.devnull))  # a character device is written to as before
    # This process's own standard output, a pipe here (the test's capture), as under a
    # launcher: written to as before (/dev/stdout was refused by the first version).
    done = run(
        None, 1, [*CLI, "bench", "--cpu", "--sizes", "10", "--op", "sum", "--repeat", "1", "--output", "/dev/stdout"]
    )
    assert done.returncode == 0 and '"records"' in done.stdout, done.output


def test_bench_output_through_a_dangling_symbolic_link_writes_its_target(tmp_path):
    # The check opened the link's target (creating it), then removed the new file by the
    # link's name: the link went, an empty target stayed, and the JSON became a file there.
    link, target = tmp_path / "link.json", tmp_path / "target.json"
    link.symlink_to(target)
    args = [*CLI, "bench", "--cpu", "--sizes", "10", "--op", "sum", "--repeat", "1", "--output", str(link)]
    done = run(None, 1, args)
    assert done.returncode == 0, done.output
    assert link.is_symlink() and os.readlink(link) == str(target), done.output
    assert '"records"' in target.read_text()


@pytest.mark.mpi
def test_bench_size_zero_with_ops_that_need_an_element_is_an_error(mpiexec, tmp_path):
    # Named by --op, they were left out of the records silently: an empty table, exit status
    # 0. (Of the default ops, max and min are left out at size 0: test_bench_writes_json.)
    out = tmp_path / "b.json"
    done = run(
        mpiexec, 2, [*CLI, "bench", "--cpu", "--sizes", "0,10", "--op", "max", "--op", "argmin", "--output", str(out)]
    )
    assert done.returncode == 1 and not out.exists(), done.output
    assert (
        done.stderr.count("max and argmin need at least one element, as in NumPy, and there are none (--sizes 0)") == 1
    )
    done = run(
        mpiexec, 2, [*CLI, "bench", "--cpu", "--sizes", "0,10", "--op", "sum", "--repeat", "1", "--output", str(out)]
    )
    assert done.returncode == 0, done.output
    assert [(r["n"], r["op"]) for r in json.loads(out.read_text())["records"]] == [(0, "sum"), (10, "sum")]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--n", "-1e3"], "--n"),
        (["--per-rank", "-2E3"], "--per-rank"),
        (["--device", "-1e0"], "--device"),
        (["bench", "--sizes", "-1e3,10"], "--sizes"),
        (["bench", "--warmup", "-1e1"], "--warmup"),
    ],
)
def test_negative_counts_in_exponent_form_get_the_options_message(args, option):
    # argparse took "-1e3" for an option: "argument --n: expected one argument".
    first = [] if args[0] != "bench" else ["bench"]
    done = run(None, 1, [*CLI, *first, "--cpu", *args[len(first) :]])
    assert done.returncode == 2, done.output
    assert (
        f"argument {option}: must be a non-negative integer, got '{args[-1].split(',')[0]}' (negative)" in done.stderr
    )


def test_output_check_leaves_no_file(tmp_path):
    from multireduce._cli import _check_output

    _check_output(tmp_path / "a" / "b.json")  # parents made, as the final write makes them
    assert (tmp_path / "a").is_dir() and not (tmp_path / "a" / "b.json").exists()
    (tmp_path / "old.json").write_text("kept")
    _check_output(tmp_path / "old.json")
    assert (tmp_path / "old.json").read_text() == "kept"
    with pytest.raises(IsADirectoryError, match="--output must name a file that can be written"):
        _check_output(tmp_path)


def test_mpi_library_line_drops_the_c_strings_nul():
    # Open MPI's MPI_Get_library_version ends in the C string's NUL; the JSON report carried it
    # as "\u0000" (seen on the H200 machine, h200_4979725/main_job_n3_json.txt).
    from types import SimpleNamespace

    from multireduce._cli import _mpi_library_line

    version = "Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, Sep 30, 2023\0"
    fake = SimpleNamespace(MPI=SimpleNamespace(Get_library_version=lambda: version))
    assert _mpi_library_line(fake) == version[:-1]
    mpich = "MPICH Version:  4.3.0\nMPICH Release date: x\n"
    fake = SimpleNamespace(MPI=SimpleNamespace(Get_library_version=lambda: mpich))
    assert _mpi_library_line(fake) == "MPICH Version: 4.3.0"
