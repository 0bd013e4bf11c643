"""Correctness of multireduce.mpi at any rank count: run as ``mpiexec -n N python check_allreduce.py DIR``.

Every assertion compares with a reference computed from the whole global array, which every
rank builds from a seed (exact Python integers, math.fsum, Python max/min with IEEE signed
zeros), so the same assertions hold at 1, 2, 3, 4, ... ranks (mpi4jax style). ``--gpu``
reduces CuPy shards on each rank's GPU. Rank 0 prints ``PASS <ranks> <cases>`` at the end.
Any failed assertion ends the whole job through the CLI's ``guarded`` (MPI_Abort).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np

import multireduce
from multireduce import _cli, mpi
from multireduce.mpi import MPI

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
XP = np
CASES = 0


def to_device(a):
    if XP is np or a.dtype.kind != "f":
        return XP.asarray(a)
    # Bit-exact: a CuPy array made from a one-element zero can take a memset path (+0.0).
    return XP.asarray(a.view(f"u{a.itemsize}")).view(a.dtype)


def to_host(v):
    return v.get()[()] if XP is not np else v


def same_everywhere(value) -> None:
    blobs = COMM.allgather(np.asarray(value).tobytes())
    assert all(b == blobs[0] for b in blobs), f"ranks disagree: {blobs}"


def global_data(dtype: np.dtype, n: int, kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if kind == "small":
            return rng.integers(max(info.min, -100), min(info.max, 100), n, endpoint=True).astype(dt)
        # The full range: 64-bit sums overflow and must wrap as NumPy's do.
        return rng.integers(info.min, info.max, n, endpoint=True, dtype=dt)
    if kind == "small":
        return rng.integers(-1000, 1000, n, endpoint=True).astype(dt)
    return rng.standard_normal(n).astype(dt)


def ref_sum(g: np.ndarray, result: np.dtype):
    if result.kind in "iu":
        exact = sum(int(v) for v in g.tolist()) % (1 << 64)
        return np.array(exact, dtype=np.uint64).astype(np.int64 if result.kind == "i" else np.uint64).astype(result)[()]
    vals = [float(v) for v in g.tolist()]
    infs = {v for v in vals if math.isinf(v)}
    if any(math.isnan(v) for v in vals) or len(infs) == 2:
        return float("nan")
    return infs.pop() if infs else math.fsum(vals)


def ref_extreme(g: np.ndarray, op: str):
    vals = g.tolist()
    if g.dtype.kind == "f":
        if any(math.isnan(v) for v in vals):
            return float("nan")
        best = (max if op == "max" else min)(vals)
        if best == 0:
            # IEEE 754-2019: -0.0 < +0.0, independent of where they are.
            signs = {math.copysign(1.0, v) for v in vals if v == 0}
            want = 1.0 if op == "max" else -1.0
            best = math.copysign(0.0, want if want in signs else -want)
        return best
    return (max if op == "max" else min)(vals)


def bits_equal(a, b, dt) -> bool:
    a = np.asarray(a, dtype=dt)
    b = np.asarray(b, dtype=dt)
    if dt.kind == "f" and np.isnan(a) and np.isnan(b):
        return True
    return a.tobytes() == b.tobytes()


def check(g: np.ndarray, op: str, dtype=None, *, exact_floats: bool) -> None:
    global CASES
    CASES += 1
    local = to_device(g[mpi.shard(g.size)])
    requested = None if dtype is None else np.dtype(dtype)
    result_dt = requested or (np.sum(g[:0]).dtype if op == "sum" else g.dtype)
    if op != "sum" and g.size == 0:
        expected = _numpy_empty_message(op)
        try:
            mpi.allreduce(local, op, dtype=dtype)
        except ValueError as exc:
            assert str(exc) == expected, (str(exc), expected)
            return
        raise AssertionError(f"{op} of an empty global array did not raise on rank {RANK}")
    got = to_host(mpi.allreduce(local, op, dtype=dtype))
    same_everywhere(got)
    assert got.dtype == result_dt, (op, g.dtype, got.dtype, result_dt)
    if dtype is None:
        # An Op object takes the general path; a name takes the per-call path where it applies
        # (a non-empty GPU shard): both give the same bits.
        general = to_host(mpi.allreduce(local, multireduce.get_op(op)))
        assert bits_equal(got, general, result_dt) and general.dtype == got.dtype, (op, g.dtype, got, general)
    if op == "sum":
        source = g.astype(requested) if requested is not None and requested.kind in "iu" else g
        ref = ref_sum(source, result_dt)
        if result_dt.kind in "iu" or exact_floats:
            assert bits_equal(got, result_dt.type(ref), result_dt), (op, g.dtype, g.size, got, ref)
        else:
            acc = np.finfo(np.float64 if result_dt.itemsize >= 4 else np.float32).eps
            magnitude = math.fsum(abs(float(v)) for v in g.tolist())
            tol = (g.size + SIZE) * acc * magnitude + np.finfo(result_dt).eps * abs(ref)
            assert abs(float(got) - ref) <= tol, (g.dtype, g.size, got, ref, tol)
    else:
        ref = ref_extreme(g, op)
        assert bits_equal(got, ref, result_dt), (op, g.dtype, g.size, got, ref)


# -- the ops beyond sum/max/min, and stats -------------------------------------------------------


def _ieee_key(v: float):
    return (v, math.copysign(1.0, v))  # -0.0 sorts below +0.0


def _ref_new(g: np.ndarray, op: str, correction: float = 0.0):
    """A reference from the whole global array, in Python numbers."""
    vals = g.tolist()
    fl = g.dtype.kind == "f"
    nan = [v for v in vals if fl and math.isnan(v)]
    num = [v for v in vals if not (fl and math.isnan(v))]
    if op == "count_nonzero":
        return sum(1 for v in vals if v != 0)
    if op == "any":
        return any(v != 0 for v in vals)
    if op == "all":
        return all(v != 0 for v in vals)
    if op in ("nanmax", "nanmin"):
        if not num:
            return float("nan")
        return (max if op == "nanmax" else min)(num, key=_ieee_key)
    if op in ("argmax", "argmin", "nanargmax", "nanargmin"):
        if nan and op in ("argmax", "argmin"):
            return next(i for i, v in enumerate(vals) if fl and math.isnan(v))
        if not num:
            return "All-NaN slice encountered"  # nanargmax/nanargmin raise it
        best = (max if op in ("argmax", "nanargmax") else min)(num, key=_ieee_key if fl else None)
        return next(
            i
            for i, v in enumerate(vals)
            if not (fl and math.isnan(v)) and v == best and (not fl or _ieee_key(v) == _ieee_key(best))
        )
    if op == "nansum":
        return ref_sum(np.array(num, dtype=g.dtype), np.sum(g[:0]).dtype)
    if op in ("prod", "nanprod"):
        if g.dtype.kind in "biu":
            p = 1
            for v in vals:
                p = p * int(v) % (1 << 64)
            return p
        p = 1.0
        for v in vals if op == "prod" else num:
            p *= v
        return p
    skips = op in ("nanmean", "nanvar", "nanstd")
    use = num if skips else vals
    if nan and not skips:
        return float("nan")
    n = len(use)
    if op in ("mean", "nanmean"):
        return math.fsum(use) / n if n else float("nan")
    mean = math.fsum(use) / n if n else 0.0
    if n - correction <= 0:
        return float("nan")
    var = math.fsum((v - mean) ** 2 for v in use) / (n - correction)
    return math.sqrt(var) if op in ("std", "nanstd") else var


def check_new(g: np.ndarray, op: str, correction: float = 0.0) -> None:
    global CASES
    CASES += 1
    local = to_device(g[mpi.shard(g.size)])
    kw = {"correction": correction} if op in ("var", "std", "nanvar", "nanstd") else {}
    if g.size == 0 and op in ("nanmax", "nanmin", "argmax", "argmin", "nanargmax", "nanargmin"):
        try:
            mpi.allreduce(local, op)
        except ValueError as exc:
            assert "zero-size array" in str(exc) or "empty sequence" in str(exc), str(exc)
            return
        raise AssertionError(f"{op} of an empty global array did not raise on rank {RANK}")
    ref = _ref_new(g, op, correction)
    if isinstance(ref, str):  # nanargmax/nanargmin of NaN only: every rank raises NumPy's error
        try:
            mpi.allreduce(local, op)
        except ValueError as exc:
            assert str(exc) == ref, str(exc)
            return
        raise AssertionError(f"{op} of NaN only did not raise on rank {RANK}")
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = to_host(mpi.allreduce(local, op, **kw))
    same_everywhere(got)
    expected_dtype = multireduce.get_op(op).result_dtype(g.dtype)
    assert got.dtype == expected_dtype, (op, g.dtype, got.dtype, expected_dtype)
    exact = ("count_nonzero", "any", "all", "argmax", "argmin", "nanargmax", "nanargmin")
    if op in exact or g.dtype.kind in "biu" and op in ("prod", "nansum", "nanprod"):
        want = np.asarray(ref if op not in ("prod", "nanprod") else np.uint64(ref)).astype(got.dtype)
        assert bits_equal(got, want, got.dtype), (op, g.dtype, g.size, got, ref)
    elif op in ("nanmax", "nanmin"):
        assert bits_equal(got, ref, got.dtype), (op, g.dtype, g.size, got, ref)
    elif op in ("prod", "nansum", "nanprod"):
        assert bits_equal(got, got.dtype.type(ref), got.dtype), (op, g.dtype, g.size, got, ref)  # exact data
    else:
        if math.isnan(ref):
            assert math.isnan(float(got)), (op, got, ref)
        else:
            eps = float(np.finfo(got.dtype).eps)
            scale = max([abs(float(v)) for v in g.tolist() if not math.isnan(v)] + [1.0])
            tol = 1e-12 * scale * (scale if op in ("var", "nanvar") else 1) + 2 * eps * abs(ref)
            assert abs(float(got) - ref) <= tol, (op, g.dtype, g.size, got, ref, tol)


def check_new_ops() -> None:
    rng = np.random.default_rng(42)
    for dt in ("bool", "int8", "int64", "uint16", "uint64", "float16", "float32", "float64"):
        for n in (0, 1, 2, 3, 5, 7, 1000):
            dtype = np.dtype(dt)
            if dtype.kind == "f":
                g = (rng.integers(-8, 9, n) / 2).astype(dtype)  # exact sums in every order
                if n > 2:
                    g[rng.integers(0, n)] = -0.0
                    g[rng.integers(0, n)] = 0.0
            else:
                g = global_data(dt, n, "full", n)
            for op in ("count_nonzero", "any", "all", "nansum", "nanmax", "nanmin", "argmax", "argmin"):
                check_new(g, op)
            for op in ("nanargmax", "nanargmin"):
                check_new(g, op)
            for op in ("mean", "var", "std", "nanmean", "nanvar", "nanstd"):
                for correction in (0, 1):
                    check_new(g, op, correction)
            # Products: powers of two (exact for floats), and wrapping integers.
            p = g if dtype.kind in "biu" else rng.choice(np.array([0.5, -0.5, 1.0, -1.0, 2.0], dtype=dtype), n)
            check_new(p, "prod")
            check_new(p, "nanprod")
            if dtype.kind == "f" and n > 1:
                q = p.copy()
                q[:: max(1, n // 3)] = np.nan  # NaN counts as one
                check_new(q, "nanprod")
            if dtype.kind == "f" and n > 1:
                h = g.copy()
                h[n // 2] = np.nan
                for op in ("nansum", "nanmax", "nanmin", "nanmean", "mean", "var", "argmax", "argmin", "count_nonzero"):
                    check_new(h, op)
                for op in ("nanvar", "nanstd"):
                    for correction in (0, 1):
                        check_new(h, op, correction)
                h[: n // 2] = np.nan  # NaN before the extremes, on the first ranks
                for op in ("nanargmax", "nanargmin"):
                    check_new(h, op)
                    check_new(np.full(n, np.nan, dtype=dtype), op)  # raises on every rank
                check_new(np.full(n, np.nan, dtype=dtype), "nanmax")  # all NaN: NaN
                check_new(np.full(n, np.nan, dtype=dtype), "nanvar")


def host_stats(s):
    """A Stats whose fields are host values (a CuPy shard's are 0-d CuPy arrays on its device)."""
    if XP is not np:
        assert all(isinstance(getattr(s, f), XP.ndarray) for f in STATS_FIELDS), s
    return multireduce.Stats(*(to_host(getattr(s, f)) for f in STATS_FIELDS))


STATS_FIELDS = ("count", "nan_count", "sum", "min", "max", "mean", "var", "std")


def check_stats() -> None:
    global CASES
    rng = np.random.default_rng(9)
    for n in (1, 2, 3, 1001):
        g = 1e6 + rng.standard_normal(n)
        g[n // 2] = -0.0 if n < 3 else g[n // 2]
        s = host_stats(mpi.stats(to_device(g[mpi.shard(g.size)]), correction=1))
        CASES += 1
        same_everywhere([s.count, s.nan_count, s.sum, s.min, s.max, s.mean, s.var])
        assert s.count == n and s.nan_count == 0
        assert bits_equal(s.min, ref_extreme(g, "min"), g.dtype) and bits_equal(s.max, ref_extreme(g, "max"), g.dtype)
        vals = g.tolist()
        mean = math.fsum(vals) / n
        assert abs(float(s.mean) - mean) <= 1e-15 * abs(mean) * 4
        if n > 1:
            var = math.fsum((v - mean) ** 2 for v in vals) / (n - 1)
            assert abs(float(s.var) - var) <= 1e-9 * var, (s.var, var)  # no cancellation at 1e6
        else:
            assert math.isnan(s.var)
    h = np.arange(7, dtype=np.float32)
    h[3] = np.nan
    s = host_stats(mpi.stats(to_device(h[mpi.shard(h.size)])))
    assert s.count == 7 and s.nan_count == 1 and math.isnan(s.sum) and math.isnan(s.max) and math.isnan(s.var)
    for dtype in (np.int16, np.uint8, np.bool_, np.float16):  # the merged state's finalize per dtype
        h = (np.arange(-5, 30) % 7).astype(dtype)
        s = host_stats(mpi.stats(to_device(h[mpi.shard(h.size)]), correction=1))
        ref = multireduce.stats(h, correction=1)
        for f in STATS_FIELDS:
            got, want = np.asarray(getattr(s, f)), np.asarray(getattr(ref, f))
            assert got.dtype == want.dtype, (dtype, f, got.dtype, want.dtype)
            assert bits_equal(got[()], want[()], want.dtype) or abs(float(got) - float(want)) <= 1e-12 * abs(
                float(want)
            ), (dtype, f, got, want)
    expect_everywhere(lambda: mpi.stats(to_device(np.zeros(0))), ValueError, "zero-size array to stats")


def check_integer_means() -> None:
    # Integer means are exact however the ranks split the data: Chan's update, which merges
    # the ranks' moments, gave -4e-16 where the mean is 0 (_stats.state_mean).
    global CASES
    rng = np.random.default_rng(17)
    for dtype in (np.int8, np.int32, np.int64, np.uint16, np.bool_):
        for n in (1, 7, 1001):
            g = global_data(np.dtype(dtype), n, "small", int(rng.integers(1 << 30)))
            want = np.mean(g)  # float64(sum) / n: exact sums here
            local = to_device(g[mpi.shard(g.size)])
            got = [to_host(mpi.stats(local).mean), to_host(mpi.allreduce(local, "mean"))]
            CASES += 1
            same_everywhere(got)
            assert all(bits_equal(v, want, np.dtype(np.float64)) for v in got), (dtype, n, got, want)
    g = np.array([3, -1, -2, 5, -5] * 7, dtype=np.int32)  # the mean is exactly 0
    got = to_host(mpi.stats(to_device(g[mpi.shard(g.size)])).mean)
    assert bits_equal(got, np.float64(0.0), np.dtype(np.float64)), got


def _numpy_empty_message(op: str) -> str:
    try:
        getattr(np, op)(np.zeros(0))
    except ValueError as exc:
        return str(exc)
    raise AssertionError("NumPy reduced an empty array")


def check_values() -> None:
    dtypes = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint32", "uint64", "float16", "float32", "float64"]
    lengths = [0, 1, 2, 3, 5, 7, 1000, 4099]
    for seed, dt in enumerate(dtypes):
        for n in lengths:
            for kind in ("small", "full"):
                g = global_data(dt, n, kind, seed * 100 + n)
                for op in ("sum", "max", "min"):
                    check(g, op, exact_floats=kind == "small")


def check_special_floats() -> None:
    for dt in ("float16", "float32", "float64"):
        for n in (1, 2, 3, 5, 9):
            for pos in sorted({0, n // 2, n - 1}):
                g = np.arange(n, dtype=dt)
                g[pos] = np.nan
                for op in ("max", "min", "sum"):
                    check(g, op, exact_floats=True)
            # Signed zeros on different ranks, in both orders.
            for first in (0.0, -0.0):
                g = np.full(n, -first, dtype=dt)
                g[0] = first
                for op in ("max", "min"):
                    check(g, op, exact_floats=True)
            g = np.array([np.inf, -np.inf, 1.0] * n, dtype=dt)
            with np.errstate(invalid="ignore"):  # inf + -inf on one rank: NaN, as intended
                for op in ("max", "min", "sum"):
                    check(g, op, exact_floats=True)


def check_dtype_argument() -> None:
    g = global_data("int16", 1001, "small", 7)
    check(g, "sum", dtype=np.float64, exact_floats=True)
    check(g, "sum", dtype=np.int8, exact_floats=True)
    f = global_data("float32", 1001, "small", 8)
    check(f, "sum", dtype=np.int32, exact_floats=True)
    check(f, "sum", dtype=np.float64, exact_floats=True)


def expect_everywhere(func, exc_type, text: str, failing_rank: int | None = None) -> None:
    global CASES
    CASES += 1
    try:
        func()
    except mpi.RankError as exc:  # first: RankError is a RuntimeError too
        assert failing_rank is not None and RANK != failing_rank, f"unexpected RankError on rank {RANK}: {exc}"
        assert f"rank {failing_rank} of {SIZE} failed" in str(exc), str(exc)
        assert text in str(exc), (str(exc), text)
        assert set(exc.failures) == {failing_rank}
        return
    except exc_type as exc:
        if failing_rank is not None and RANK != failing_rank:
            raise AssertionError(f"rank {RANK} raised {exc_type.__name__}, expected RankError") from exc
        assert text in str(exc), (str(exc), text)
        assert mpi.rank_failures(exc) is not None
        return
    raise AssertionError(f"rank {RANK}: no exception")


def check_errors() -> None:
    ones = to_device(np.ones(3))
    if SIZE > 1:
        mixed = to_device(np.ones(3, dtype=np.float32 if RANK == SIZE - 1 else np.float64))
        expect_everywhere(lambda: mpi.allreduce(mixed, "sum"), TypeError, "input dtype differs across ranks")
        op = "max" if RANK == 0 else "sum"
        expect_everywhere(lambda: mpi.allreduce(ones, op), ValueError, "op differs across ranks")
        # stats() is agreed as a call of its own, not as the "mean" whose moments it exchanges.
        call = (lambda: mpi.stats(ones)) if RANK == 0 else (lambda: mpi.allreduce(ones, "mean"))
        expect_everywhere(call, ValueError, "op differs across ranks:\nrank 0: mpi.stats()\n")
        dt = np.float32 if RANK == 0 else np.float64
        expect_everywhere(lambda: mpi.allreduce(ones, "sum", dtype=dt), TypeError, "dtype= differs across ranks")
    bad = SIZE - 1
    # One rank fails locally; the others must not wait for it, and must learn why.
    op = "median" if RANK == bad else "sum"
    expect_everywhere(lambda: mpi.allreduce(ones, op), ValueError, "unknown op 'median'", failing_rank=bad)
    if XP is np:
        x = np.array(["a", "b"]) if RANK == bad else np.ones(2)
        expect_everywhere(lambda: mpi.allreduce(x, "sum"), TypeError, "does not support input dtype", failing_rank=bad)
    err = RuntimeError("boom") if RANK == 0 else None
    expect_everywhere(lambda: mpi.agree(err), RuntimeError, "boom", failing_rank=0)
    mpi.agree(None)


class _Bomb:
    """Unpickling this would create a file: proves that object .npy files are never unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def check_files(tmp: Path) -> None:
    global CASES
    g = global_data("int32", 1003, "full", 11)
    h = global_data("float64", 998, "small", 12)
    sentinel = tmp / "unpickled"
    if RANK == 0:
        np.save(tmp / "g.npy", g)
        np.save(tmp / "fortran.npy", np.asfortranarray(h.reshape(2, 499)))
        h.tofile(tmp / "h.raw")
        np.save(tmp / "empty.npy", np.zeros((0, 3), dtype=np.float32))
        raw = (tmp / "g.npy").read_bytes()
        (tmp / "truncated.npy").write_bytes(raw[:-7])
        (tmp / "odd.raw").write_bytes(b"\0" * 13)
        obj = np.empty(2, dtype=object)
        obj[:] = [_Bomb(sentinel), 1]
        with open(tmp / "objects.npy", "wb") as fh:
            np.lib.format.write_array(fh, obj, allow_pickle=True)
    COMM.Barrier()
    for path, dtype, ref in ((tmp / "g.npy", None, g), (tmp / "fortran.npy", None, h), (tmp / "h.raw", "float64", h)):
        local = mpi.read_shard(path, dtype=dtype)
        CASES += 1
        assert local.size == mpi.shard(ref.size).stop - mpi.shard(ref.size).start
        got = mpi.allreduce(local, "sum")
        same_everywhere(got)
        assert bits_equal(got, got.dtype.type(ref_sum(ref, got.dtype)), got.dtype), (path, got)
        assert mpi.allreduce(local, "max") == max(ref.tolist())
    n_raw = 100
    local = mpi.read_shard(tmp / "h.raw", dtype="float64", n=n_raw)
    assert COMM.allreduce(local.size) == n_raw
    empty = mpi.read_shard(tmp / "empty.npy")
    assert mpi.allreduce(empty, "sum") == 0
    expect_everywhere(lambda: mpi.allreduce(empty, "max"), ValueError, "zero-size array")
    expect_everywhere(lambda: mpi.read_shard(tmp / "missing.npy"), FileNotFoundError, "missing.npy")
    expect_everywhere(lambda: mpi.read_shard(tmp / "truncated.npy"), ValueError, "is truncated")
    expect_everywhere(lambda: mpi.read_shard(tmp / "odd.raw", dtype="float64"), ValueError, "not a whole number")
    expect_everywhere(lambda: mpi.read_shard(tmp / "h.raw"), ValueError, "give the dtype")
    expect_everywhere(lambda: mpi.read_shard(tmp / "g.npy", dtype="float32"), TypeError, "holds int32")
    expect_everywhere(lambda: mpi.read_shard(tmp / "objects.npy"), TypeError, "never unpickles")
    COMM.Barrier()
    assert not sentinel.exists(), "an object .npy was unpickled"


#: Bounds on the float64 rounding errors of the moments of ``check_gpu_states``'s data (values
#: in [-3, 3]). The GPU's per-thread shifted sums s1, s2 are exact there (small integers);
#: the per-thread mean ``c + s1 / n`` and ``M2 = s2 - s1 * (s1 / n)`` round a few times, and
#: each of Chan's merges (threads, warps, blocks, then ranks: about 15 levels here, the bounds
#: allow 64) rounds a few quantities bounded by the data (|mean| <= 3, |delta| <= 6, squared
#: deviations <= 36); a merged mean is a convex combination of its inputs, so their errors do
#: not grow. A level adds at most about 21 * 2**-53 (2.3e-15) to the mean's error: at most
#: 1.5e-13 in all. M2 gains about 2 * 36 * 2**-53 * n per level from its own roundings and at
#: most 2 * |delta| * (the means' error) * na * nb / n summed over a level's merges, 2e-12 * n:
#: the variance M2 / n is within 1.3e-10. Both bounds are far below half an ulp of the float32
#: results (1.2e-7 at a variance of 4; 9e-10 at the mean 0.016), so a result one ulp off fails.
GPU_MEAN_ERROR = 1e-12
GPU_VAR_ERROR = 1e-9


def assert_rounded_once(got, exact: Fraction, error: float, what) -> None:
    """|got - exact| <= half an ulp of got (its one rounding to float32) + the float64 error bound."""
    assert math.isfinite(float(got)), (what, got, float(exact))
    err = abs(Fraction(float(got)) - exact)
    allowed = Fraction(float(np.spacing(abs(got)))) / 2 + Fraction(error)
    assert err <= allowed, (what, float(got), float(exact), float(err), float(allowed))


def check_state_results(everything: np.ndarray, got: dict, stats: multireduce.Stats) -> None:
    """The moments and arg ops of ``everything`` (small integers as float32) against exact references.

    Exact where the result is exact: argmax/argmin (NumPy's first occurrence), and the stats'
    count, NaN count, sum (the integer sum, exact in float64 and in float32) and min/max
    (bit for bit). The mean T/N and variance (N*Q - T**2)/N**2 (T the sum, Q the sum of
    squares) are Fractions; the GPU forms them in float64 (see GPU_MEAN_ERROR) and rounds once
    to float32. One element (N = 1) is exact too: its state has M2 = 0 and mean = the element.
    """
    values = [int(v) for v in everything.tolist()]
    assert all(float(v) == w for v, w in zip(values, everything.tolist(), strict=True))  # small integers
    n, total, squares = len(values), sum(values), sum(v * v for v in values)
    mean, var = Fraction(total, n), Fraction(n * squares - total * total, n * n)
    for op in ("argmax", "argmin"):
        want = int(np.argmax(everything) if op == "argmax" else np.argmin(everything))
        assert got[op].dtype == np.int64 and int(got[op]) == want, (op, got[op], want)
    std_error = GPU_VAR_ERROR / math.sqrt(float(var)) if var else math.sqrt(GPU_VAR_ERROR)
    std_error += 2.0**-52 * math.sqrt(float(var))  # the float64 sqrt's rounding, and math.sqrt's below
    for op, exact, error in (
        ("mean", mean, GPU_MEAN_ERROR),
        ("var", var, GPU_VAR_ERROR),
        ("std", Fraction(math.sqrt(float(var))), std_error),
    ):
        value = got[op]
        assert value.dtype == np.float32, (op, value.dtype)
        assert_rounded_once(value, exact, error, op)
        if n == 1:
            assert bits_equal(value, float(values[0]) if op == "mean" else 0.0, value.dtype), (op, value)
    assert stats.count.dtype == stats.nan_count.dtype == np.int64, stats
    assert int(stats.count) == n and int(stats.nan_count) == 0, stats
    assert stats.sum.dtype == np.float32 and bits_equal(stats.sum, float(total), stats.sum.dtype), (stats.sum, total)
    assert bits_equal(stats.min, float(min(values)), np.dtype(np.float32)), (stats.min, min(values))
    assert bits_equal(stats.max, float(max(values)), np.dtype(np.float32)), (stats.max, max(values))
    assert stats.min.dtype == stats.max.dtype == np.float32, stats
    assert stats.mean.dtype == stats.var.dtype == np.float32, stats
    assert_rounded_once(stats.mean, mean, GPU_MEAN_ERROR, "stats.mean")
    assert_rounded_once(stats.var, var, GPU_VAR_ERROR, "stats.var")


def state_data(per_rank: int) -> tuple[np.ndarray, list[int]]:
    """``check_gpu_states``' global array and the ranks' uneven shard lengths."""
    counts = [per_rank + r for r in range(SIZE)]  # uneven shards
    everything = (np.arange(sum(counts)) % 7 - 3).astype(np.float32)
    everything[sum(counts) // 2 :: 97] = 3.0  # ties: argmax takes the first
    return everything, counts


def check_gpu_states() -> None:
    """GPU shards of the moments and arg ops (values i % 7 - 3): the global results on the
    device, against exact references (:func:`check_state_results`)."""
    import cupy

    for per_rank in (0, 1000) if SIZE > 1 else (1, 1000):
        everything, counts = state_data(per_rank)
        start = sum(counts[:RANK])
        shard = cupy.asarray(everything[start : start + counts[RANK]])
        got = {}
        for op in ("mean", "var", "std", "argmax", "argmin"):
            result = mpi.allreduce(shard, op)
            assert isinstance(result, cupy.ndarray) and result.shape == (), (op, type(result))
            got[op] = result.get()[()]
        s = mpi.stats(shard)
        assert all(isinstance(getattr(s, f), cupy.ndarray) for f in STATS_FIELDS), s
        check_state_results(everything, got, multireduce.Stats(*(getattr(s, f).get()[()] for f in STATS_FIELDS)))


def check_helpers() -> None:
    for n in (0, 1, SIZE - 1, SIZE, 10 * SIZE + 1):
        s = mpi.shard(n)
        starts = COMM.allgather((s.start, s.stop))
        assert starts[0][0] == 0 and starts[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(starts, starts[1:], strict=False))
        sizes = [b - a for a, b in starts]
        assert max(sizes) - min(sizes) <= 1
    local, local_size = mpi.local_rank()
    assert 0 <= local < local_size <= SIZE
    aware = mpi.cuda_aware()
    assert aware.method in ("env", "default", "MPIX_Query_cuda_support", "Open MPI mpi_built_with_cuda_support")


def main() -> int:
    global XP
    parser = argparse.ArgumentParser()
    parser.add_argument("tmp", type=Path)
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args()
    if args.gpu:
        import cupy

        XP = cupy
        mpi.select_device()
    check_helpers()
    check_values()
    check_special_floats()
    check_dtype_argument()
    check_new_ops()  # every op: on the CPU, or on the GPU's kernels
    check_integer_means()
    if XP is np:
        check_stats()
    else:
        check_gpu_states()
    check_errors()
    if RANK == 0:
        args.tmp.mkdir(parents=True, exist_ok=True)
    COMM.Barrier()
    check_files(args.tmp)
    counts = mpi.transport_counts()
    if args.gpu and not mpi.cuda_aware().enabled:
        assert counts["staged"] > 0 and counts["device"] == 0, counts
    if not (args.gpu and mpi.cuda_aware().enabled):
        # The main job's common case took the per-call path (mpi._fast_entry).
        assert any(entry is not None for entry in mpi._fast.values()), mpi._fast
    if args.gpu and mpi.cuda_aware().enabled:
        assert counts["device"] > 0 and counts["staged"] == 0, counts
    if not args.gpu:
        assert counts["host"] > 0 and counts["staged"] == counts["device"] == 0, counts
    total = COMM.allreduce(CASES, op=MPI.MIN)
    if RANK == 0:
        print(f"PASS {SIZE} {total} {os.path.basename(sys.argv[0])} transport={counts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_cli.guarded(main, COMM, mpi))
