"""``python -m multireduce`` with every op (CPU): results against NumPy in float64 or exact
integers, the check against wrong results, and the CLI's own references
(:mod:`multireduce._cli_checks`) against the data they describe.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from fractions import Fraction

import numpy as np
import pytest
from mpi_scripts.launch import run
from test_cli import CLI, WRONG_RESULT, synthetic

import multireduce
from multireduce import _cli_checks as checks
from multireduce import core
from multireduce.ops import OPS, get_op

ALL = [arg for name in OPS for arg in ("--op", name)]


def run_all(mpiexec, ranks, *args, ops=ALL, backend="cpu"):
    # --cpu pins the CPU backend, so that these tests also pass on a GPU machine; the gpu
    # tests below leave the choice to the CLI and assert that it took the GPU.
    flags = ["--cpu"] if backend == "cpu" else []
    done = run(mpiexec, ranks, [*CLI, *args, *ops, "--json", *flags, "--repeat", "1"], timeout=180)
    assert done.returncode == 0, done.output
    report = json.loads(done.stdout)
    assert report["backend"] == backend, report
    return report


def rows(report: dict) -> dict[str, dict]:
    return {row["op"]: row for row in report["results"]}


def ieee_arg(x: np.ndarray, largest: bool, skip_nan: bool) -> int:
    """The project's argmax/argmin: the first NaN (unless skipped), else the first element at
    the extreme in IEEE order (-0.0 < +0.0). Written with Python comparisons only."""
    values = x.tolist()
    if not skip_nan:
        for i, v in enumerate(values):
            if isinstance(v, float) and math.isnan(v):
                return i
    best = None
    for i, v in enumerate(values):
        if isinstance(v, float) and math.isnan(v):
            continue
        key = (v, math.copysign(1.0, v)) if isinstance(v, float) else (v, 0)
        if best is None or (key > best[0] if largest else key < best[0]):
            best = (key, i)
    return best[1]


def expected_value(x: np.ndarray, name: str):
    """NumPy in float64 (or exact integers) for each op over all of ``x``: the value, and the
    absolute tolerance on it (None where a test only trusts the CLI's own check)."""
    op = get_op(name)
    res = op.result_dtype(x.dtype)
    values = x[~np.isnan(x)] if (op.skips_nan and x.dtype.kind == "f") else x
    wide = values.astype(np.float64)
    if name in ("count_nonzero", "any", "all"):
        count = int(np.count_nonzero(x))
        return {"count_nonzero": count, "any": count > 0, "all": count == x.size}[name], 0
    if name in ("argmax", "argmin", "nanargmax", "nanargmin"):
        return ieee_arg(x, op.largest, op.skips_nan), 0
    if name in ("prod", "nanprod"):
        if res.kind in "iu":
            total = 1
            for v in values.tolist():
                total = total * int(v) % 2**64
            return int(np.array(total, dtype=np.uint64).astype(res)), 0
        if wide.size > 64 or not np.isfinite(wide).all():  # partial products may overflow
            return None, None
        exact = math.prod(Fraction(v) for v in wide.tolist())
        if exact != 0 and not 1e-300 < abs(exact) < 1e300:
            return None, None
        return float(exact), abs(float(exact)) * 1e-12 + np.finfo(res).eps * abs(float(exact))
    if name in ("sum", "nansum", "max", "min", "nanmax", "nanmin"):
        return None, None  # test_cli.py checks these
    if not np.isfinite(wide).all() or wide.size == 0 or float(np.max(np.abs(wide))) < 1e-150:
        return None, None  # (float64 squares of the tiny files underflow: the CLI's check decides)
    with np.errstate(over="ignore"):
        if not np.isfinite(np.sum(np.abs(wide))):
            return None, None  # a float64 sum may overflow (big_pair: the test asserts that case)
    mean = math.fsum(wide.tolist()) / wide.size
    eps = float(np.finfo(res).eps)
    if op.statistic == "mean":
        return mean, 1e-12 * float(np.mean(np.abs(wide))) + 2 * eps * abs(mean)
    with np.errstate(over="ignore"):
        var = math.fsum(((wide - mean) ** 2).tolist()) / wide.size
        square_mean = float(np.mean(wide**2))
    if op.statistic == "var":
        value, tol = var, 1e-12 * square_mean + 2 * eps * var
    else:
        value, tol = math.sqrt(var), 1e-6 * math.sqrt(square_mean) + 2 * eps * math.sqrt(var)
    if value > float(np.finfo(res).max):
        return math.inf, 0
    return value, tol


def assert_rows(report: dict, x: np.ndarray) -> None:
    assert report["check_passed"] is True, report
    for name, row in rows(report).items():
        value, tol = expected_value(x, name)
        if value is None:
            continue
        got = row["result"]
        if isinstance(got, str):  # JSON's "inf", "nan"
            got = float(got)
        if tol == 0:
            assert got == value and type(got) is type(value), (name, got, value)
        else:
            assert abs(got - value) <= tol, (name, got, value, tol)


# ------------------------------------------------------------------ synthetic data, every op

PATTERNS = {"int8": (-100, 201), "uint8": (0, 201), "bool": (0, 2), "uint64": (0, 2001)}


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("ranks", "dtype", "n"),
    [
        (1, "float32", 1),
        (3, "float32", 1283),  # the first zero of the pattern is element 1283
        (3, "float32", 1284),
        (2, "float32", 10_007),
        (3, "float16", 10_007),  # var past float16's range: inf
        (3, "float64", 2_002),
        (3, "int8", 1_283),
        (2, "uint8", 333),
        (3, "bool", 7),
        (3, "int64", 5_003),
        (2, "uint64", 99),
        (4, "int32", 3),  # a rank without elements
    ],
)
def test_every_op_on_synthetic_data(mpiexec, ranks, dtype, n):
    report = run_all(mpiexec, ranks, "--n", str(n), "--dtype", dtype)
    low, period = PATTERNS.get(dtype, (-1000, 2001))  # README: the documented data
    x = synthetic(n, low, period).astype(dtype)
    assert [row["op"] for row in report["results"]] == list(OPS)
    assert_rows(report, x)
    got = rows(report)
    if dtype == "float16":
        assert got["var"]["result"] == "inf" and got["var"]["overflow"] is True
        assert got["std"]["overflow"] is False and math.isfinite(got["std"]["result"])


@pytest.mark.mpi
def test_empty_input_names_every_op_that_needs_an_element(mpiexec):
    done = run(mpiexec, 2, [*CLI, "--cpu", "--n", "0", *ALL])
    assert done.returncode == 1, done.output
    message = "max, min, nanmax, nanmin, argmax, argmin, nanargmax and nanargmin need at least one element"
    assert done.stderr.count(message) == 1, done.output
    empty = [arg for name in OPS if get_op(name).empty_allowed for arg in ("--op", name)]
    report = run_all(mpiexec, 2, "--n", "0", ops=empty)
    got = rows(report)
    assert report["check_passed"] is True
    assert (got["prod"]["result"], got["count_nonzero"]["result"], got["any"]["result"], got["all"]["result"]) == (
        1.0,
        0,
        False,
        True,
    )
    assert got["mean"]["result"] == got["var"]["result"] == "nan" and got["var"]["overflow"] is False


# ------------------------------------------------------------------ file data, every op


def special_files(tmp_path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    specials = rng.standard_normal(1_001) * 1e3 + 5e3
    specials[[3, 500]] = np.nan
    specials[[7, 9]] = [-0.0, 0.0]
    data = {
        "specials": specials,
        "infs": np.array([1.0, -np.inf, 2.0, np.inf, -0.0]),
        "pos_inf": np.array([1.0, np.inf, 3.0, -2.0]),
        "zeros": np.array([-0.0, 0.0, -0.0, 0.0]),
        "normal32": rng.standard_normal(20_000).astype(np.float32),
        "half": (rng.random(5_000) * 2 - 1).astype(np.float16),
        "small": np.array([0.5, 1.5, 2.0, -0.25, 3.0]),
        "wide": rng.standard_normal(300) * 2.0 ** rng.integers(-600, 600, 300),
        "int32": rng.integers(-1000, 1000, 4_001).astype(np.int32),
        "int64big": rng.integers(-(2**62), 2**62, 301, dtype=np.int64),
        "uint64": rng.integers(0, 2**64 - 1, 301, dtype=np.uint64),
        "bools": rng.random(101) < 0.5,
        "two": np.array([np.nan, -np.inf]),  # fewer elements than ranks; nanargmax is 1 here
        # Variances that underflow float64 (to subnormals, or to zero): the square root keeps
        # only a few bits, and the check took these right results for wrong ones (exit 3).
        "tiny": np.array([0.0, 1e-160]),
        "tinier": np.array([1e-170, -3e-171, 2e-170, 0.0]),
        "subnormal": np.array([5e-324, 5e-324, -1e-310, 2e-308]),
        # A partial product of the others may underflow to 0 before the infinity: NaN (was FAIL).
        "inf_underflow": np.array([1e-200, 1e-200, np.inf]),
        # Two single elements far apart: Chan's update overflowed in delta**2 (var was inf at
        # 2 and 3 ranks, NumPy's 6.4e307 at one).
        "far_pair": np.array([8e153, -8e153]),
        # A float64 sum that overflows: the mean is that sum over the count, inf, as NumPy's
        # (the check failed it against 1e308); var and std inf with it.
        "big_pair": np.array([1e308, 1e308]),
        # The std's reference root is below float64's smallest subnormal: the check divided
        # by it as a float (ZeroDivisionError on every rank).
        "sub3": np.array([5e-324, 1e-323, 5e-324]),
    }
    for name, x in data.items():
        np.save(tmp_path / f"{name}.npy", x)
    return data


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 3])
def test_every_op_on_file_data(mpiexec, tmp_path, ranks):
    for name, x in special_files(tmp_path).items():
        report = run_all(mpiexec, ranks, "--input", str(tmp_path / f"{name}.npy"), "--check")
        assert_rows(report, x)
        got = rows(report)
        if name == "wide":  # the squares pass float64's range: var and std overflow to inf
            assert got["var"]["result"] == got["std"]["result"] == "inf", got
            assert got["std"]["check_how"].startswith("any overflow"), got
        if name == "specials":
            assert got["mean"]["result"] == got["var"]["result"] == "nan"
            assert got["argmax"]["result"] == got["argmin"]["result"] == 3  # the first NaN
            assert got["nanargmax"]["result"] == int(np.nanargmax(x))
        if name == "zeros":  # the project's rule: +0.0 is the max, -0.0 the min
            assert (got["argmax"]["result"], got["argmin"]["result"]) == (1, 0)
            assert got["prod"]["result"] == 0.0 and got["prod"]["check_how"].startswith("identical")
        if name == "infs":
            assert got["prod"]["result"] == "nan" and got["mean"]["result"] == "nan"
        if name == "far_pair":
            assert got["var"]["result"] == 6.4e307 and got["std"]["result"] == 8e153, got
        if name == "big_pair":
            assert got["mean"]["result"] == got["var"]["result"] == "inf" and got["mean"]["overflow"] is True, got
            assert got["mean"]["check_how"].startswith("an infinity of a sign a partial sum may overflow to"), got
        if name == "pos_inf":
            assert got["prod"]["result"] == "-inf" and got["mean"]["result"] == "inf"
            assert got["std"]["result"] == "nan"


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize(("ranks", "dtype", "n"), [(3, "float32", 10_007), (2, "float16", 3_001), (3, "int8", 1_283)])
def test_every_op_on_synthetic_data_on_the_gpu(mpiexec, ranks, dtype, n):
    report = run_all(mpiexec, ranks, "--n", str(n), "--dtype", dtype, backend="gpu")
    low, period = PATTERNS.get(dtype, (-1000, 2001))
    assert_rows(report, synthetic(n, low, period).astype(dtype))


@pytest.mark.gpu
@pytest.mark.mpi
def test_every_op_on_file_data_on_the_gpu(mpiexec, tmp_path):
    for name, x in special_files(tmp_path).items():
        report = run_all(mpiexec, 2, "--input", str(tmp_path / f"{name}.npy"), "--check", backend="gpu")
        assert_rows(report, x)


@pytest.mark.mpi
def test_a_nan_mean_of_no_elements_is_no_overflow(mpiexec, tmp_path):
    # An all-NaN file's nanmean is NaN (no elements): not an overflow of its sum, whereas an
    # infinite mean of finite elements is.
    np.save(tmp_path / "nan.npy", np.full(6, np.nan))
    ops = ["--op", "nanmean", "--op", "mean"]
    report = run_all(mpiexec, 2, "--input", str(tmp_path / "nan.npy"), "--check", ops=ops)
    assert [(r["result"], r["overflow"]) for r in report["results"]] == [("nan", False)] * 2, report


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["nanargmax", "nanargmin"])
def test_nan_arg_ops_of_nan_only_input_name_the_op(mpiexec, tmp_path, op):
    # NumPy raises "All-NaN slice encountered" there; the CLI printed only that, naming
    # neither the op nor what to do.
    np.save(tmp_path / "nan.npy", np.full(6, np.nan))
    done = run(mpiexec, 2, [*CLI, "--cpu", "--input", str(tmp_path / "nan.npy"), "--op", "sum", "--op", op])
    assert done.returncode == 1, done.output
    message = f"ranks 0, 1 of 2 failed: ValueError: {op}: every element is NaN (NumPy's 'All-NaN slice encountered')"
    assert done.stderr.count(message) == 1, done.output
    assert "Traceback" not in done.stderr, done.output


@pytest.mark.mpi
@pytest.mark.parametrize("correction", ["1", "2", "-1", "0.5"])
def test_correction_of_var_and_std(mpiexec, correction):
    n, c = 1_001, float(correction)
    ops = [arg for name in ("var", "std", "nanvar", "nanstd", "mean") for arg in ("--op", name)]
    report = run_all(mpiexec, 2, "--n", str(n), "--correction", correction, ops=ops)
    assert report["check_passed"] is True
    x = synthetic(n).astype(np.float64)
    want = math.fsum(((x - math.fsum(x.tolist()) / n) ** 2).tolist()) / (n - c)
    got = rows(report)
    for name in ("var", "nanvar"):
        assert got[name]["correction"] == c and abs(got[name]["result"] - want) <= 1e-6 * want, got[name]
    for name in ("std", "nanstd"):
        assert abs(got[name]["result"] - math.sqrt(want)) <= 1e-6 * math.sqrt(want), got[name]
    assert "correction" not in got["mean"]


@pytest.mark.mpi
def test_correction_edges_and_errors(mpiexec, capsys):
    # N - correction <= 0: NaN (docs/semantics.md), with NumPy's warning; no op to correct: a
    # usage error; a result of the wrong correction fails the check.
    report = run_all(mpiexec, 2, "--n", "2", "--correction", "2", ops=["--op", "var", "--op", "std"])
    assert [(r["result"], r["reference"], r["check"]) for r in report["results"]] == [("nan", "nan", True)] * 2
    from multireduce._cli import main

    assert main(["--cpu", "--correction", "1", "--op", "mean"]) == 2
    assert "--correction applies to var, std, nanvar, nanstd" in capsys.readouterr().err
    assert main(["--cpu", "--correction", "nan", "--op", "var"]) == 2
    assert "must be a finite real number" in capsys.readouterr().err
    # A negative correction in exponent form is a value, not an option (argparse alone would
    # say "expected one argument"); what is not a number after it still is.
    from multireduce._cli import _parse

    assert _parse(["--op", "var", "--correction", "-1e+3"]).correction == -1000.0
    assert _parse(["--correction", "-2E-1", "--op", "std"]).correction == -0.2
    assert _parse(["--op", "var", "--correction=-1e3"]).correction == -1000.0
    for abbreviation in ("--co", "--cor", "--corr"):  # argparse's abbreviations
        assert _parse(["--op", "var", abbreviation, "-1e3"]).correction == -1000.0
    assert main(["--op", "var", "--correction", "--cpu"]) == 2
    assert "--correction: expected one argument" in capsys.readouterr().err
    x = synthetic(1_001).astype(np.float64)
    ddof0 = float(np.var(x))  # the value of correction 0, where 1 was asked for
    argv = ["-c", WRONG_RESULT, f"var:{ddof0!r}", "-", "--n", "1001", "--correction", "1", "--op", "var"]
    done = run(mpiexec, 2, [*argv, "--op", "std", "--json", "--cpu", "--repeat", "1"], timeout=120)
    assert done.returncode == 3, done.output
    assert [r["check"] for r in json.loads(done.stdout)["results"]] == [False, True]


# ------------------------------------------------------------------ the check fails on wrong results


@pytest.mark.mpi
def test_check_fails_on_wrong_results_of_every_kind(mpiexec, tmp_path):
    ints = np.arange(-50, 950, dtype=np.int32)
    np.save(tmp_path / "ints.npy", ints)
    floats = np.array([1.5, -2.25, 3.0, 0.5, 7.0, -1.0])
    np.save(tmp_path / "floats.npy", floats)
    cases = [
        ("ints.npy", "mean:449.6,var:83333.0,argmax:998,count_nonzero:998", "mean var argmax count_nonzero"),
        ("ints.npy", "std:288.6,any:0,all:1,argmin:ulp,nanargmin:ulp,prod:ulp", "std any all argmin nanargmin prod"),
        ("floats.npy", "prod:-17.0,nanprod:ulp,nanmean:ulp,nanvar:8.0", "prod nanvar"),  # ulps are within the bound
        ("floats.npy", "mean:1.2916,nanstd:2.8", "mean nanstd"),
    ]
    # Data with a large mean and a small spread (timestamps): the variance's bound is on the
    # scale of the spread, not of sum(x**2); a negative variance never passes.
    np.save(tmp_path / "offset.npy", 1.7e9 + np.random.default_rng(0).standard_normal(10_000))
    np.save(tmp_path / "level.npy", np.full(1_000, 1e153))
    np.save(tmp_path / "opposite.npy", np.array([1e308, -1e308]))
    np.save(tmp_path / "big_pair.npy", np.array([1e308, 1e308]))
    cases += [
        ("offset.npy", "var:1.05,std:-30,nanvar:-0.5", "var std nanvar"),
        ("level.npy", "var:inf,std:nan,nanvar:-7", "var std nanvar"),
        ("opposite.npy", "mean:nan,nanmean:-inf", "mean nanmean"),
        # Where a partial sum may overflow, only the infinity of its sign passes for the mean,
        # and a variance of finite elements is never NaN (both passed as "any overflow").
        ("big_pair.npy", "mean:-inf,nanmean:nan,var:nan", "mean nanmean var"),
        ("opposite.npy", "var:nan,std:-inf", "var std"),
        # The value's dtype is part of the result: an index as a float, a count as uint8.
        ("ints.npy", "argmax:as_float64,count_nonzero:as_uint8,prod:as_float64", "argmax count_nonzero prod"),
    ]
    for name, changes, failing in cases:
        argv = ["-c", WRONG_RESULT, changes, str(tmp_path / name), "--input", str(tmp_path / name), "--check"]
        done = run(mpiexec, 2, [*argv, "--json", "--cpu", "--repeat", "1", *ALL], timeout=120)
        assert done.returncode == 3, (name, changes, done.output)
        report = json.loads(done.stdout)
        assert {row["op"] for row in report["results"] if not row["check"]} == set(failing.split()), (name, report)


# ------------------------------------------------------------------ the references themselves


def exact_squares(x: np.ndarray) -> Fraction:
    return sum((Fraction(v) ** 2 for v in x.tolist()), Fraction(0))


def test_exact_sums_of_squares():
    rng = np.random.default_rng(8)
    cases = [
        rng.standard_normal(2_000),
        rng.standard_normal(500) * 2.0 ** rng.integers(-1074, 1000, 500),  # subnormal to huge
        np.array([2.0**-1074, 5e-324 * 3, 1.7976931348623157e308, -(2.0**600)]),
        np.array([1.0 + 2.0**-52] * 3),  # squares that float64 rounds
        # the edges of the range squared in place, and the scaled ones on either side
        np.array([2.0**-400, np.nextafter(2.0**-400, 0), -(2.0**500), np.nextafter(2.0**500, np.inf), 0.0, -0.0]),
        1e-300 * rng.random(20_000) * np.where(rng.random(20_000) < 0.5, -1, 1),  # scaled as a block
        np.array([], dtype=np.float64),
    ]
    for x in cases:
        assert checks.exact_sum_of_squares(x) == exact_squares(x)
        assert checks.exact_sum(x) == sum((Fraction(v) for v in x.tolist()), Fraction(0))
    for value in (Fraction(2), Fraction(1, 3), Fraction(10) ** 700, Fraction(1, 10**700), Fraction(0)):
        root = checks._sqrt(value)
        assert root * root <= value and (root * (1 + Fraction(1, 2**64))) ** 2 >= value


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64", "bool"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, checks.CHUNK - 1, checks.CHUNK + 3])
def test_integer_references_match_python_integers(dtype, n):
    # The vectorized exact integer references (sums, squares and |x| in 22-bit limbs, the
    # product modulo 2**64 as a tree of uint64 products) against Python ints one by one.
    dt = np.dtype(dtype)
    rng = np.random.default_rng(n)
    if dt.kind == "b":
        x = rng.integers(0, 2, n).astype(bool)
    else:
        info = np.iinfo(dt)
        x = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        x[: min(n, 2)] = [info.min, info.max][: min(n, 2)]  # the extremes, -2**63 and 2**64 - 1 included
    values = [int(v) for v in x.tolist()]
    assert checks._int_sums(x) == (sum(values), sum(v * v for v in values), sum(abs(v) for v in values))
    for factors in (x, x if dt.kind == "b" else x | 1):  # odd factors keep the residue off 0
        want = 1
        for v in factors.tolist():
            want = want * int(v) % (1 << 64)
        assert checks._wrapped_product(factors) == want


@pytest.mark.parametrize("op", ["max", "min"])
def test_file_references_of_max_and_min(op):
    # The signed zero by IEEE 754-2019's order (-0.0 below +0.0), ints and bools as Python's.
    from multireduce._cli import _file_reference

    cases = [
        (np.array([0.0, -0.0, -1.0]), {"max": 0.0, "min": -1.0}),
        (np.array([-0.0, 0.0, 1.0]), {"max": 1.0, "min": -0.0}),
        (np.array([-0.0, -0.0], dtype=np.float16), {"max": -0.0, "min": -0.0}),
        (np.array([0.0, -0.0, 0.0], dtype=np.float32), {"max": 0.0, "min": -0.0}),
        (np.array([2**64 - 1, 2**63], dtype=np.uint64), {"max": 2**64 - 1, "min": 2**63}),
        (np.array([-(2**63), 5], dtype=np.int64), {"max": 5, "min": -(2**63)}),
        (np.array([False, True]), {"max": True, "min": False}),
    ]
    for x, want in cases:
        got = _file_reference(x, op)
        assert type(got) is type(want[op]) and got == want[op], (x, got)
        if isinstance(got, float):
            assert math.copysign(1.0, got) == math.copysign(1.0, want[op]), (x, got)
    assert math.isnan(_file_reference(np.array([1.0, np.nan]), op))
    assert _file_reference(np.array([], dtype=np.float32), op) is None


@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8", "bool", "int64"])
@pytest.mark.parametrize("n", [0, 1, 2, 1283, 1284, 2001, 2002, 4003])
def test_closed_forms_match_the_data(dtype, n):
    # The synthetic data's closed forms against the parts of the data itself, split in two
    # shards (an independent derivation: NumPy over the elements, in exact arithmetic).
    from multireduce._cli import _Pattern

    dt = np.dtype(dtype)
    pattern = _Pattern.for_dtype(dt)
    x = pattern.values(0, n, dt, np)
    full, rest = divmod(n, pattern.period)
    window = pattern._window(pattern.period if full else rest)
    for name in checks.OPS:
        closed = checks.synthetic(name, window, full, rest, dt.kind)
        parts = checks.combine(name, [checks.part(x[: n // 3], name), checks.part(x[n // 3 :], name)])
        if name in checks.PRODUCT_OPS:
            assert (closed.count, closed.negative, closed.zero) == (parts.count, parts.negative, parts.zero)
            assert math.isclose(closed.log2, parts.log2, rel_tol=1e-12, abs_tol=1e-9)
            if dt.kind != "f":
                assert closed.wrapped == parts.wrapped
            elif not closed.zero and closed.log2 < 1200:
                got = Fraction(parts.mantissa) * 2**parts.exponent
                want = Fraction(closed.mantissa) * 2**closed.exponent
                assert abs(got - want) <= want * n * 2**-51
        else:
            assert closed == parts, name


def test_a_wrong_reference_fails_the_check():
    # Each family's check rejects a result one step past its bound (it cannot pass anything).
    x = np.array([1.0, 2.0, 4.0, -3.0])
    f64 = np.dtype(np.float64)
    for name, wrong in [("mean", 1.0 + 1e-9), ("var", 6.5 * (1 + 1e-9)), ("std", 2.0), ("prod", -24.0 * (1 + 1e-9))]:
        ref = checks.combine(name, [checks.part(x, name)])
        assert checks.check(name, ref, np.float64(wrong), f64, 1)[0] is False, name
        right = {"mean": 1.0, "var": 6.5, "std": math.sqrt(6.5), "prod": -24.0}[name]
        passed, how = checks.check(name, ref, np.float64(right), f64, 1)
        assert passed is True, name
        # The bound itself, not just far past it: half of it passes, twice it fails (a bound
        # four times as loose passed the 1e-9 errors above only where they exceed it).
        bound = float(re.fullmatch(r"\|err\| <= ([0-9.e+-]+)", how).group(1))
        assert bound > 8 * np.spacing(abs(right)), (name, how)  # the steps below are representable
        for factor, verdict in ((0.5, True), (-0.5, True), (2.0, False), (-2.0, False)):
            near = np.float64(right + factor * bound)
            assert checks.check(name, ref, near, f64, 1)[0] is verdict, (name, factor, how)
    ref = checks.combine("argmax", [checks.part(x, "argmax")])
    assert checks.check("argmax", ref, np.int64(2), f64, 1) == (True, "exact")
    assert checks.check("argmax", ref, np.int64(1), f64, 1)[0] is False
    ref = checks.combine("any", [checks.part(x, "any")])
    assert checks.check("any", ref, np.bool_(True), f64, 1)[0] is True
    assert checks.check("any", ref, np.int64(1), f64, 1)[0] is False  # an int is not a bool


# ------------------------------------------------------------------ the mean's partial warns as NumPy's mean


def test_mean_partials_do_not_warn_where_numpy_mean_does_not():
    # The MPI and Dask layers' means come from moments states, whose squared deviations
    # overflow for float64 elements past 1.3e154: they warned "overflow encountered in
    # multiply", where NumPy's mean (and this mean) is finite and silent.
    rng = np.random.default_rng(1)
    x = rng.standard_normal(300) * 1e180
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want = np.mean(x)
        state = core.partial(x, "mean")
        assert math.isclose(float(state.mean), want, rel_tol=1e-14)
        column = multireduce.mean(x.reshape(30, 10), axis=0)  # the moments path on the CPU
        np.testing.assert_allclose(column, np.mean(x.reshape(30, 10), axis=0), rtol=1e-14)
    with pytest.warns(RuntimeWarning, match="overflow"):  # var's squares overflow, as NumPy's var's
        multireduce.var(x)
    with pytest.warns(RuntimeWarning, match="overflow"):
        np.var(x)
    with warnings.catch_warnings():  # a partial state is silent: the finalize of the whole decides
        warnings.simplefilter("error")
        core.partial(x, "var")
        core.partial(np.array([1e308, 1e308]), "mean")
    # Where the mean's own sum overflows, it warns as NumPy's mean does (silencing the whole
    # state had lost that warning on the moments paths).
    import dask.array as da

    import multireduce.dask as mdask
    import multireduce.mpi as mpi

    big = np.array([1e308, 1e308])
    calls = [
        lambda: np.mean(big),
        lambda: multireduce.mean(big.reshape(2, 1), axis=0),
        lambda: multireduce.mean(big[::-1]),
        lambda: mdask.treereduce(da.from_array(big, chunks=2), "mean").compute(),
        lambda: mpi.allreduce(big, "mean"),
        lambda: mpi.allreduce(big, "nanmean"),
    ]
    for call in calls:
        with pytest.warns(RuntimeWarning, match="overflow encountered in reduce"):
            call()


# -- the second review of --check's references (each case failed before) ---------------------


def _checked(op: str, shards: list, result, correction: float = 0.0) -> bool:
    shards = [np.asarray(s) for s in shards]
    ref = checks.combine(op, [checks.part(s, op) for s in shards])
    dt = get_op(op).result_dtype(shards[0].dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return checks.check(op, ref, dt.type(result), dt, len(shards), correction)[0]


def _file_checked(op: str, shards: list, result) -> bool:
    from multireduce import _cli

    shards = [np.asarray(s) for s in shards]
    ref = _cli._combine_references(op, [_cli._file_reference(s, op) for s in shards])
    dt = get_op(op).result_dtype(shards[0].dtype)
    ref, _ = _cli._wrapped_reference(op, ref, dt)
    return _cli._check_file_value(dt.type(result), ref, op, sum(s.size for s in shards), len(shards))[0]


def test_a_bound_past_float64s_range_in_floats_is_finite_in_rationals():
    # n * spread**2 (or sum|x|) passed float64's range, the bound became inf, and any finite
    # result passed: var 42 for [1e153, -1e153] * 50 (var 1e306), a sum of -1e300 for 1.5.
    x = np.array([1e153, -1e153] * 50)
    with np.errstate(over="ignore"):
        want_var, want_std = np.var(x), np.std(x)
    for op, right in (("var", want_var), ("std", want_std)):
        assert _checked(op, [x], right) and _checked(op, [x], np.inf) and not _checked(op, [x], 42.0), op
        assert not _checked(op, [x], np.nan), op  # a variance of finite elements is never NaN
    y = np.array([1.7e308, -1.7e308, 1.5])
    assert _file_checked("sum", [y], 1.5) and _file_checked("sum", [y], np.inf)
    assert not _file_checked("sum", [y], -1e300)


def test_results_that_numpy_gives_pass_the_check():
    # Correct results that failed the check (exit 3 from the CLI).
    equal = np.full(3, 6.837243571439553e280)  # var inf where the means round apart (NumPy's too)
    assert _checked("var", [equal], np.inf) and _checked("std", [equal], np.inf) and _checked("var", [equal], 0.0)
    top = float(np.finfo(np.float64).max)
    mixed = np.array([top, top, -np.inf])  # NumPy's mean: NaN (the finite part overflows first)
    for op in ("mean", "nanmean"):
        assert _checked(op, [mixed], np.nan) and _checked(op, [mixed], -np.inf) and not _checked(op, [mixed], np.inf)
    assert not _checked("mean", [np.array([1.0, 2.0, -np.inf])], np.nan)  # no overflow possible: -inf only
    # Uneven per-rank files: the float64 merge of the parts' means errs on [3.0]'s scale.
    assert _checked("mean", [[3.0], np.zeros(9999)], 0.000300000000000189)
    assert not _checked("mean", [[3.0], np.zeros(9999)], 0.0003001)
    tiny = np.array([3e-162, -3e-162] * 500)  # squares below the normal range, over N - 999
    for op, fn in (("var", np.var), ("std", np.std)):
        assert _checked(op, [tiny], fn(tiny, ddof=999), correction=999), op


def test_an_infinity_passes_only_past_the_rounding_threshold():
    # Round to nearest overflows from half an ulp past the largest value: float16 65504 +
    # 15.5 is 65504, and a mean of 65504s is 65504; inf passed for both.
    assert not _file_checked("sum", [np.float16([65504, 15.5])], np.inf)
    assert _file_checked("sum", [np.float16([65504, 15.5])], 65504)
    assert not _checked("mean", [np.float16([65504] * 3)], np.inf)
    assert _file_checked("sum", [np.float16([65504, 16.0])], np.inf)  # 65520: the tie rounds to inf


def test_products_near_the_range_ends_are_checked_to_their_bound():
    # The overflow and underflow tests took a factor of 2 of margin: [1e308, 0.5] (5e307, no
    # partial product past the range) passed any value of its sign, NaN too, and [2**-1021,
    # 2.0] passed 123. An infinity times a product that cannot round to 0 is that infinity.
    near_top, near_bottom = np.array([1e308, 0.5]), np.array([2.0**-1021, 2.0])
    assert _checked("prod", [near_top], 5e307) and not _checked("prod", [near_top], 1.0)
    assert not _checked("prod", [near_top], np.nan)
    assert _checked("prod", [near_bottom], 2.0**-1020) and not _checked("prod", [near_bottom], 123.0)
    assert _checked("prod", [[np.inf, 5e-324]], np.inf) and not _checked("prod", [[np.inf, 5e-324]], np.nan)
    flush = [np.inf, 1e-300, 1e-300]  # 1e-600 rounds to 0 in some order: inf * 0
    assert _checked("prod", [flush], np.nan) and _checked("prod", [flush], np.inf)
    past = [1e300, 1e300, 1e-300]  # a partial product past the range in some order
    assert _checked("prod", [past], np.inf) and _checked("prod", [past], 1e300)
