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
from pathlib import Path

import numpy as np

from multireduce import _cli, mpi
from multireduce.mpi import MPI

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
XP = np
CASES = 0


def to_device(a):
    return XP.asarray(a)


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
    check_errors()
    if RANK == 0:
        args.tmp.mkdir(parents=True, exist_ok=True)
    COMM.Barrier()
    check_files(args.tmp)
    counts = mpi.transport_counts()
    if args.gpu and not mpi.cuda_aware().enabled:
        assert counts["staged"] > 0 and counts["device"] == 0, counts
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
