"""multireduce.mpi under mpiexec at 1, 2, 3 and 4 ranks (CPU).

The assertions live in mpi_scripts/check_allreduce.py and compare with references built from
the whole global array, so they hold at any rank count: uneven shards (3 ranks), n < ranks,
NaN on any rank, signed zeros, empty global arrays, integer wrap-around, files, and errors.
"""

from __future__ import annotations

import pytest
from mpi_scripts.launch import SCRIPTS, run
from reference import numpy_var_warnings

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_allreduce_matches_global_reference(mpiexec, tmp_path, ranks):
    done = run(mpiexec, ranks, [str(SCRIPTS / "check_allreduce.py"), str(tmp_path)], timeout=120)
    assert done.returncode == 0, done.output
    assert f"PASS {ranks} " in done.stdout
    assert done.stdout.count("PASS") == 1  # rank 0 only


def test_without_mpiexec(tmp_path):
    # A plain `python script.py` is a one-rank MPI job (singleton init).
    done = run(None, 1, [str(SCRIPTS / "check_allreduce.py"), str(tmp_path)], timeout=120)
    assert done.returncode == 0, done.output
    assert "PASS 1 " in done.stdout


def test_one_failing_rank_is_reported_by_every_rank(mpiexec):
    done = run(mpiexec, 3, [str(SCRIPTS / "fail_one_rank.py"), "agreed"], timeout=60)
    # Agreed: every rank returns guarded's status itself (no MPI_Abort), so the launcher's is
    # exactly 1 (an error), not 2 (usage), 3 (a failed check) or 130 (interrupted).
    assert done.returncode == 1, done.output
    assert done.seconds < 30
    message = "rank 2 of 3 failed: TypeError: multireduce does not support input dtype <U7"
    assert done.stderr.count(message) == 1, done.output


def test_an_interrupt_on_one_rank_is_agreed_with_status_130(mpiexec):
    # Ctrl-C on one rank inside allreduce's local step: every rank learns of it in the
    # agreement, rank 0 prints it once, and every rank's status is 130 (as the shell reports
    # SIGINT): the others returned 1, and mpiexec ORed 130 and 1 into 131.
    done = run(mpiexec, 3, [str(SCRIPTS / "fail_one_rank.py"), "interrupt"], timeout=60)
    assert done.returncode == 0, done.output
    assert done.seconds < 30
    assert done.stderr.count("multireduce: error: rank 2 of 3 failed: KeyboardInterrupt: interrupted") == 1, done.output
    assert "Traceback" not in done.stderr, done.output
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("STATUSES ")]
    statuses = [int(s) for s in line.removeprefix("STATUSES ").strip("[]").split(",")]
    assert statuses == [130, 130, 130], statuses


def test_one_rank_failing_outside_a_collective_aborts_the_job(mpiexec):
    done = run(mpiexec, 3, [str(SCRIPTS / "fail_one_rank.py"), "abort"], timeout=60)
    assert done.returncode != 0
    assert done.seconds < 30
    assert done.stderr.count("rank 2 of 3 failed: RuntimeError: injected failure on rank 2") == 1, done.output


@pytest.mark.parametrize(("ranks", "device_ranks"), [(2, "1"), (2, "0"), (3, "0,2")])
def test_numpy_and_cupy_shards_with_a_cuda_aware_mpi(mpiexec, ranks, device_ranks):
    # A CuPy rank with a CUDA-aware MPI sent max/min keys in a second Allreduce that a NumPy
    # rank never made: the CuPy rank waited, the NumPy rank decoded a key without the CuPy
    # rank's partial (0 in its slot) and went on to its next call. Without a GPU here, the
    # device ranks run mpi.py's device path on a stand-in for CuPy (see the script).
    done = run(mpiexec, ranks, [str(SCRIPTS / "mixed_shards.py"), device_ranks], timeout=60)
    assert done.returncode == 0, done.output
    assert f"PASS {ranks} 46 device ranks" in done.stdout, done.output


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_allreduce_and_stats_match_the_core_on_random_cases(mpiexec, ranks):
    # mpi_scripts/check_semantics.py: random dtypes, values (NaN, signed zeros, infinities,
    # extremes), uneven splits into shards of mixed shapes and layouts (empty, 0-d), every op
    # and its arguments, each rank choosing the per-call or the general path; then arguments
    # that differ across ranks and one rank's failure, for every kind of combine.
    seed, cases = 1000 + ranks, 700
    done = run(mpiexec, ranks, [str(SCRIPTS / "check_semantics.py"), str(seed), str(cases)], timeout=180)
    assert done.returncode == 0, done.output
    assert f"PASS {ranks} " in done.stdout, done.output
    assert int(done.stdout.split(f"PASS {ranks} ")[1].split()[0]) >= cases


# Every rank's share of a float16 sum past float16's range (65504): the float32 accumulator
# holds it, and the final cast to float16, which every rank makes alike, overflows.
OVERFLOW_ON_EVERY_RANK = """
import json
import warnings
import numpy as np
from multireduce import mpi
from multireduce.ops import get_op

x = np.full(3, 60000.0, dtype=np.float16)
seen = []
for op in ("sum", get_op("sum")):  # the per-call path (op by name) and the general one
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert np.isposinf(mpi.allreduce(x, op))
    seen.append([f"{w.category.__name__}: {w.message}" for w in caught])
with np.errstate(over="raise"):
    try:
        mpi.allreduce(x, "sum")
        raised = None
    except FloatingPointError as exc:
        raised = str(exc)
mpi.agree(None)  # every rank is still in step after its FloatingPointError
everything = mpi.MPI.COMM_WORLD.gather([seen, raised])
if mpi.MPI.COMM_WORLD.rank == 0:
    print("RESULT " + json.dumps(everything))
"""


@pytest.mark.parametrize("ranks", [1, 3])
def test_an_overflowing_cast_warns_on_every_rank_as_numpy(mpiexec, ranks):
    # The library keeps NumPy's semantics: every rank computes the same result and makes the
    # same cast, so each warns (or raises, under np.errstate(over="raise")) by its own
    # settings, alike; a rank that raised alone would leave the others in its next collective.
    # Printing it once is the program's choice (python -m multireduce: tests/test_cli.py).
    done = run(mpiexec, ranks, ["-c", OVERFLOW_ON_EVERY_RANK], timeout=60)
    assert done.returncode == 0, done.output
    # The float32 partial's conversion to float16 overflows: NumPy's sum, in float16, warns
    # "in reduce", and so does this (not "in cast").
    over = "RuntimeWarning: overflow encountered in reduce"
    assert done.result() == [[[[over], [over]], "overflow encountered in reduce"]] * ranks


# NaN, +inf and -inf on different ranks: each rank decides NumPy's invalid-value warnings from
# the merged state of the whole array (all ranks alike), as NumPy's var of the concatenation.
INVALID_ACROSS_RANKS = """
import json
import warnings
import numpy as np
import multireduce
from multireduce import mpi

comm = mpi.MPI.COMM_WORLD
patterns = [
    [1.0, np.nan, np.inf, 2.0],
    [np.inf, 1.0, -np.inf, 2.0],
    [np.inf, 1.0, 2.0, 3.0],
    [np.inf, 2.0, 3.0, np.nan],
]
mismatches, warned = [], 0
for op in ("var", "std", "nanvar", "nanstd", "mean", "nanmean", "stats"):
    for pattern in patterns:
        x = np.array(pattern)
        cuts = np.linspace(0, x.size, comm.size + 1).astype(int)
        shard = x[cuts[comm.rank] : cuts[comm.rank + 1]]
        found = []
        for call in (
            lambda: mpi.stats(shard).var if op == "stats" else mpi.allreduce(shard, op),
            lambda: multireduce.stats(x).var if op == "stats" else getattr(np, op)(x),
        ):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = call()
            found.append([repr(value), [str(w.message) for w in caught]])
        if found[0] != found[1]:
            mismatches.append([op, pattern, found])
        warned += any("invalid value" in m for m in found[1][1])
everything = comm.gather([mismatches, warned])
if comm.rank == 0:
    print("RESULT " + json.dumps(everything))
"""


@pytest.mark.parametrize("ranks", [2, 3])
def test_invalid_value_warnings_across_ranks_are_numpys_of_the_whole_array(mpiexec, ranks):
    # Before, each rank decided for its own shard: the rank with +inf warned "in subtract"
    # where NumPy's var of the whole array is silent (a NaN on another rank), and +inf and -inf
    # on two ranks warned "in add" in the merge where NumPy warns "in reduce".
    done = run(mpiexec, ranks, ["-c", INVALID_ACROSS_RANKS], timeout=60)
    assert done.returncode == 0, done.output
    per_rank = done.result()
    assert len(per_rank) == ranks
    for mismatches, warned in per_rank:
        assert mismatches == [], mismatches
        assert warned >= 15  # the cases where NumPy warns (so the comparison is not vacuous)


# mpi.stats of a shard whose squares overflow: the rank warns as multireduce.stats does.
STATS_SQUARES_OVERFLOW = """
import json
import warnings
import numpy as np
import multireduce
from multireduce import mpi

comm = mpi.MPI.COMM_WORLD
x = np.array([1e200, -1e200])
shard = x if comm.rank == 0 else x[:0]
found = []
for call in (lambda: mpi.stats(shard), lambda: multireduce.stats(x)):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = call()
    found.append([repr(value.var), [str(w.message) for w in caught]])
everything = comm.gather(found)
if comm.rank == 0:
    print("RESULT " + json.dumps(everything))
"""


@pytest.mark.parametrize("ranks", [1, 2])
def test_stats_warns_where_a_shards_squares_overflow_as_the_core(mpiexec, ranks):
    # mpi.stats took the state of mean, which leaves the squares' overflow warning out
    # (NumPy's mean squares nothing): np.errstate(over="raise") raised in multireduce.stats
    # but not in mpi.stats. It takes var's state now.
    done = run(mpiexec, ranks, ["-c", STATS_SQUARES_OVERFLOW], timeout=60)
    assert done.returncode == 0, done.output
    ours, core = done.result()[0]
    assert ours == core == ["np.float64(inf)", numpy_var_warnings([1e200, -1e200])], (ours, core)


# An intercommunicator given as comm= on every rank of it.
INTERCOMM = """
import json
import time
import numpy as np
from multireduce import mpi

world = mpi.MPI.COMM_WORLD
half = world.rank % 2
local = world.Split(half, world.rank)
inter = local.Create_intercomm(0, world, 1 - half, tag=7)
found = []
for call in (
    lambda: mpi.allreduce(np.ones(3), "sum", comm=inter),
    lambda: mpi.allreduce(np.ones(3), "argmax", comm=inter),
    lambda: mpi.stats(np.ones(3), comm=inter),
    lambda: mpi.agree(None, comm=inter),
):
    try:
        call()
        found.append("no error")
    except TypeError as exc:
        found.append(str(exc))
found.append(mpi.allreduce(np.ones(3), "sum", comm=local).item())  # an intracommunicator still works
everything = world.gather(found)
if world.rank == 0:
    print("RESULT " + json.dumps(everything))
"""


@pytest.mark.parametrize("ranks", [2, 4])
def test_an_intercommunicator_is_refused_on_every_rank(mpiexec, ranks):
    # It failed inside MPI with "sendbuf cannot be MPI_IN_PLACE" (MPICH's words).
    done = run(mpiexec, ranks, ["-c", INTERCOMM], timeout=60)
    assert done.returncode == 0, done.output
    for found in done.result():
        *errors, local_sum = found
        assert local_sum == 3.0 * (ranks // 2)
        for message in errors:
            assert message.startswith("comm must be an mpi4py.MPI.Comm (an intracommunicator") and message.endswith(
                "got an intercommunicator"
            ), found


# Timestamps near 1.7e9 (spread 1) and int64 ids near 1e12 split over the ranks unevenly: the
# ranks' states carry the low parts of their means, so var keeps one array's accuracy.
# With the argument "gpu", the shards are CuPy arrays (tests/test_mpi_gpu.py).
FAR_FROM_ZERO = """
import json
import sys
import numpy as np
from multireduce import mpi

xp = __import__("cupy") if sys.argv[1:] == ["gpu"] else np

comm = mpi.MPI.COMM_WORLD
rng = np.random.default_rng(5)
errors = []
for offset, x in ((1.7e9, 1.7e9 + rng.standard_normal(2**20 + 3)), (10**12, 10**12 + rng.integers(0, 20, 2**20 + 3))):
    want = np.var(x.astype(np.float64) - offset)
    cuts = np.linspace(0, x.size, comm.size + 1).astype(int) + np.arange(comm.size + 1) * 1009
    cuts[-1] = x.size
    shard = xp.asarray(x[cuts[comm.rank] : cuts[comm.rank + 1]])
    for got in (mpi.allreduce(shard, "var"), mpi.stats(shard).var, mpi.allreduce(shard, "std") ** 2):
        errors.append(abs(float(got) - want) / want)
if comm.rank == 0:
    print("RESULT " + json.dumps(errors))
"""


@pytest.mark.parametrize("ranks", [2, 3])
def test_variance_far_from_zero_across_ranks(mpiexec, ranks):
    # Before, each rank's state carried a float64 mean rounded at 1.7e9's ulp, and Chan's
    # update in the merge of the ranks' states kept 1e-10 (timestamps) to 1e-8 (int64).
    done = run(mpiexec, ranks, ["-c", FAR_FROM_ZERO], timeout=60)
    assert done.returncode == 0, done.output
    errors = done.result()
    assert len(errors) == 6 and max(errors) <= 1e-13, errors
