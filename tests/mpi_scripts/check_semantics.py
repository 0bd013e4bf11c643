"""Property check of multireduce.mpi against the core: ``mpiexec -n N python check_semantics.py SEED CASES``.

Every rank draws the same random cases from ``SEED`` (dtype, length, values with NaN, signed
zeros, infinities, subnormals and extremes, an uneven split into shards of mixed shapes and
layouts, some empty or 0-d, an op and its arguments), reduces its shard with
``mpi.allreduce`` (or ``mpi.stats``), and compares with ``multireduce.reduce`` (or
``multireduce.stats``) of the whole global array on one rank:

- bit for bit where the result is order-free (integers, max/min/nanmax/nanmin, argmin/argmax,
  count_nonzero/any/all, reproducible sums and means), within a tight tolerance for float
  sums, products and moments; the same result dtype; the same bits on every rank;
- where the core raises, every rank raises the same exception type and message, agreed
  (``rank_failures``);
- each rank picks by its own draw between the per-call path (op as a string, no other
  argument) and the general path (an ``Op`` object, or an explicit ``correction=0.0``), so the
  two paths meet in one call; they must give the same bits as an all-general call.

Then (more than one rank) arguments that differ across ranks and failures on one rank, for
every kind of combine: every rank must raise, with the documented message.

Rank 0 prints ``PASS <ranks> <cases>`` or the failures, ``FAIL <count>``. Any unexpected
exception ends the job through the CLI's ``guarded`` (MPI_Abort); the launcher's timeout
catches a hang.
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np

import multireduce
from multireduce import _cli, mpi
from multireduce.mpi import MPI
from multireduce.ops import OPS, SUPPORTED_DTYPES

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
FAILURES: list[str] = []
CASES = 0

EXACT_OPS = {
    "max",
    "min",
    "nanmax",
    "nanmin",
    "argmax",
    "argmin",
    "nanargmax",
    "nanargmin",
    "count_nonzero",
    "any",
    "all",
}
STATS_FIELDS = ("count", "nan_count", "sum", "min", "max", "mean", "var", "std")


def fail(text: str) -> None:
    FAILURES.append(f"rank {RANK}: {text}")


# -- data --------------------------------------------------------------------------------------


def values(rng: np.random.Generator, dt: np.dtype, n: int, op: str) -> np.ndarray:
    if dt.kind == "b":
        return rng.random(n) < rng.choice([0.0, 0.5, 1.0])
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if rng.random() < 0.5:
            g = rng.integers(max(info.min, -3), min(info.max, 3), n, endpoint=True).astype(dt)
        else:  # the full range: 64-bit sums and products wrap as NumPy's do
            g = rng.integers(info.min, info.max, n, endpoint=True, dtype=dt)
        if n and rng.random() < 0.3:
            g[rng.integers(0, n, max(1, n // 4))] = rng.choice(np.array([info.min, info.max], dtype=dt))
        return g
    kind = rng.integers(0, 3)
    if kind == 0:  # halves: exact sums in every order
        g = (rng.integers(-8, 9, n) / 2).astype(dt)
    elif kind == 1:
        g = rng.standard_normal(n).astype(dt)
    else:
        g = (rng.standard_normal(n) * np.exp(rng.uniform(-6, 6, n))).astype(dt)
    if op in ("prod", "nanprod"):  # powers of two, few enough that no order overflows or underflows: exact
        g = rng.choice(np.array([1.0, -1.0], dtype=dt), n)
        g[rng.integers(0, n, min(n, 12))] = rng.choice(np.array([0.5, -0.5, 2.0, -2.0], dtype=dt), min(n, 12))
    info = np.finfo(dt)
    big = {2: 6e4, 4: 1e38, 8: 1e150}[dt.itemsize]
    specials = [0.0, -0.0, np.nan, np.inf, -np.inf, big, -big, float(info.smallest_subnormal), -float(info.tiny)]
    if n and rng.random() < 0.6:
        for _ in range(rng.integers(1, 4)):
            g[rng.integers(0, n)] = specials[rng.integers(0, len(specials))]
    if n and rng.random() < 0.2:
        g[:] = rng.choice(np.array([0.0, -0.0], dtype=dt), n)
    if n and rng.random() < 0.1:
        g[:] = np.nan
    return g


def split(rng: np.random.Generator, g: np.ndarray) -> list[np.ndarray]:
    """``SIZE`` shards of ``g`` in rank order, of mixed shapes and layouts (C-order flattening = the slice)."""
    cuts = np.sort(rng.integers(0, g.size + 1, SIZE - 1))
    if rng.random() < 0.3:  # everything on one rank
        cuts[:] = rng.choice([0, g.size])
    shards = []
    for piece in np.split(g, cuts):
        form = rng.integers(0, 6)
        if piece.size == 1 and form < 2:
            piece = piece.reshape(())  # 0-d
        elif piece.size == 0 and form < 3:
            piece = piece.reshape((0, 3) if form else (2, 0, 5))
        elif piece.size % 2 == 0 and piece.size and form == 3:
            piece = np.asfortranarray(piece.reshape(2, -1))  # F memory, C-order flattening = piece
        elif piece.size and form == 4:
            piece = piece[::-1].copy()[::-1]  # negative strides
        elif piece.size % 3 == 0 and piece.size and form == 5:
            piece = piece.reshape(-1, 1, 3)
        shards.append(piece)
    return shards


# -- outcomes ----------------------------------------------------------------------------------


def outcome(func):
    """``("ok", dtype, hex bits)`` or ``("raise", type, message, agreed ranks)`` of ``func()``."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = func()
    except Exception as exc:
        failures = mpi.rank_failures(exc)
        return ("raise", type(exc).__name__, str(exc), None if failures is None else sorted(failures))
    if isinstance(value, multireduce.Stats):
        return (
            "ok",
            "stats",
            tuple(
                (np.asarray(v).dtype.str, np.asarray(v).tobytes().hex())
                for v in (getattr(value, f) for f in STATS_FIELDS)
            ),
        )
    value = np.asarray(value)
    if value.shape != ():
        return ("ok", "shape", str(value.shape))
    return ("ok", value.dtype.str, value.tobytes().hex())


def scalar(out) -> np.generic:
    return np.frombuffer(bytes.fromhex(out[2]), dtype=np.dtype(out[1]))[0]


def close(got: np.generic, want: np.generic, tol: float) -> bool:
    g, w = float(got), float(want)
    if math.isnan(w) or math.isnan(g):
        return math.isnan(w) and math.isnan(g)
    if math.isinf(w) or math.isinf(g):
        return g == w
    return abs(g - w) <= tol


def tolerance(g: np.ndarray, op: str, want: np.generic, correction) -> float:
    """A bound on the difference that the order of float additions (and the final rounding) makes."""
    flat = g.astype(np.float64).ravel()
    finite = flat[np.isfinite(flat)]
    n = max(g.size, 1) + SIZE
    eps64, eps = float(np.finfo(np.float64).eps), float(np.finfo(np.asarray(want).dtype).eps)
    acc_eps = eps64 if g.dtype.itemsize >= 4 or g.dtype.kind != "f" else float(np.finfo(np.float32).eps)
    rounding = 2 * eps * abs(float(want)) + 2 * float(np.finfo(np.asarray(want).dtype).smallest_subnormal)
    mag = float(np.abs(finite).sum()) if finite.size else 0.0
    if op in ("sum", "nansum"):
        return n * acc_eps * mag + rounding
    if op in ("mean", "nanmean"):
        return n * eps64 * mag / max(g.size, 1) + rounding
    if op in ("prod", "nanprod"):
        return 4 * n * acc_eps * abs(float(want)) + rounding
    # var and std: Chan's merges of the ranks' moments
    scale = float(np.abs(finite - finite.mean()).max()) if finite.size else 0.0
    m2 = 64 * n * eps64 * scale * scale * max(g.size, 1) / max(g.size - float(correction), 1e-300)
    if op in ("std", "nanstd"):
        return math.sqrt(m2) + rounding
    return m2 + rounding


def exact_case(g: np.ndarray, op: str, kw: dict, result: np.dtype) -> bool:
    if op in EXACT_OPS or result.kind in "biu":
        return True
    if kw.get("reproducible") and op in ("sum", "mean"):
        return True
    if op in ("mean", "nanmean") and g.dtype.kind in "biu" and not kw:
        # Integer means are exact however the ranks split the data (while the sum is exact)
        return float(np.abs(g.astype(np.float64)).sum()) < 2.0**52
    return False


def compare(label: str, got, want, g: np.ndarray, op: str, kw: dict) -> None:
    every = COMM.allgather(got)
    if any(o != every[0] for o in every):
        fail(f"{label}: ranks differ: {every}")
        return
    if want[0] == "raise":
        wtype, wmsg = want[1], want[2]
        if got[0] != "raise" or got[1] != wtype or got[2] != wmsg:
            fail(f"{label}: got {got}, the core raised {wtype}: {wmsg}")
        elif got[3] is None:
            fail(f"{label}: {got[1]} raised but not agreed (rank_failures is None)")
        return
    if got[0] != "ok":
        fail(f"{label}: raised {got[1:]}, the core gave {want}")
        return
    if got[1] != want[1]:
        fail(f"{label}: result dtype {got[1]}, the core's {want[1]}")
        return
    if got[1] == "stats":
        for name, (dt, gbits), (_, wbits) in zip(STATS_FIELDS, got[2], want[2], strict=True):
            gv = np.frombuffer(bytes.fromhex(gbits), dtype=np.dtype(dt))[0]
            wv = np.frombuffer(bytes.fromhex(wbits), dtype=np.dtype(dt))[0]
            if name in ("count", "nan_count", "min", "max") or g.dtype.kind in "biu" and name == "sum":
                ok = gbits == wbits or (np.isnan(gv) and np.isnan(wv))
            else:
                sub = {"sum": "sum", "mean": "mean", "var": "var", "std": "std"}[name]
                ok = close(gv, wv, tolerance(g, sub if name != "sum" else "nansum", wv, kw.get("correction", 0.0)))
                if name == "sum" and not ok:
                    ok = close(gv, wv, tolerance(g, "sum", wv, 0))
            if not ok:
                fail(f"{label}: stats.{name} {gv!r}, the core's {wv!r}")
        return
    gv, wv = scalar(got), scalar(want)
    dt = np.dtype(got[1])
    if exact_case(g, op, kw, dt):
        same = got[2] == want[2] or (dt.kind == "f" and np.isnan(gv) and np.isnan(wv))
        if not same:
            fail(f"{label}: {gv!r} (bits {got[2]}), the core's {wv!r} (bits {want[2]})")
        return
    if not close(gv, wv, tolerance(g, op, wv, kw.get("correction", 0.0))):
        fail(f"{label}: {gv!r}, the core's {wv!r} (tolerance {tolerance(g, op, wv, kw.get('correction', 0.0))})")


# -- the random cases --------------------------------------------------------------------------


def draw_case(rng: np.random.Generator):
    dt = np.dtype(SUPPORTED_DTYPES[rng.integers(0, len(SUPPORTED_DTYPES))])
    n = int(rng.choice([0, 1, 2, 3, 4, 5, 7, 16, 33, 200]))
    if rng.random() < 0.03:  # shards past the core's small-array paths
        n = int(rng.integers(2_000, 70_000))
    op = list(OPS)[rng.integers(0, len(OPS))] if rng.random() < 0.92 else "stats"
    g = values(rng, dt, n, op)
    kw: dict = {}
    r = rng.random()
    if op in ("sum", "prod", "nansum", "nanprod") and r < 0.3 or op != "stats" and r < 0.03:
        kw["dtype"] = np.dtype(SUPPORTED_DTYPES[rng.integers(0, len(SUPPORTED_DTYPES))])
    requested = kw.get("dtype")
    if requested is not None and requested.kind in "iu" and g.dtype.kind == "f":
        # A float out of the integer's range (or NaN, inf) converts as the C cast does, which
        # NumPy's SIMD and scalar loops do differently: keep to values that convert exactly.
        info = np.iinfo(requested)
        with np.errstate(invalid="ignore"):
            g = np.nan_to_num(np.clip(g, max(info.min, -100), min(info.max, 100)), nan=0.0, posinf=1, neginf=0).astype(
                g.dtype
            )
    if op in ("var", "std", "nanvar", "nanstd", "stats") and rng.random() < 0.6:
        kw["correction"] = [1, 1.0, 0.5, 2, 5.0, -0.0][rng.integers(0, 6)]
    if op != "stats" and rng.random() < 0.25:
        kw["reproducible"] = True
    if rng.random() < 0.02:  # arguments the op does not take: the core's error on every rank
        if op == "stats":
            kw["correction"] = "1"
        else:
            corrected = op in ("var", "std", "nanvar", "nanstd")
            kw["correction" if not corrected else "dtype"] = 1 if not corrected else np.int8
    return g, op, kw


def run_case(i: int, g: np.ndarray, op: str, kw: dict, shards: list[np.ndarray], mine: np.random.Generator) -> None:
    global CASES
    CASES += 1
    label = f"case {i}: {op} {g.dtype} n={g.size} {kw} shards={[s.shape for s in shards]}"
    local = shards[RANK]
    if op == "stats":
        want = outcome(lambda: multireduce.stats(g, **kw))
        got = outcome(lambda: mpi.stats(local, **kw))
        compare(label, got, want, g, op, kw)
        return
    want = outcome(lambda: multireduce.reduce(g, op, **kw))
    # This rank's own choice of path: the per-call path (a string, no arguments) where kw is
    # empty, or the general path (an Op object, or correction=0.0 given).
    choice = mine.integers(0, 3) if not kw else 1
    if choice == 0:
        got = outcome(lambda: mpi.allreduce(local, op))
    elif choice == 1:
        got = outcome(lambda: mpi.allreduce(local, multireduce.get_op(op), **kw))
    else:
        got = outcome(lambda: mpi.allreduce(local, op, correction=0.0))
    compare(label, got, want, g, op, kw)
    if not kw:  # the general path alone, on every rank: the same bits
        general = outcome(lambda: mpi.allreduce(local, multireduce.get_op(op)))
        every = COMM.allgather(general)
        if general != got:
            fail(f"{label}: general path {general}, mixed paths {got}")
        elif any(o != every[0] for o in every):
            fail(f"{label}: general path differs across ranks {every}")


def random_cases(seed: int, count: int) -> None:
    mine = np.random.default_rng([seed, RANK, 7])
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        g, op, kw = draw_case(rng)
        run_case(i, g, op, kw, split(rng, g), mine)


# -- arguments that differ, failures on one rank ------------------------------------------------


def expect(label: str, func, exc_type: str, headline: str, failing: int | None = None) -> None:
    """Every rank raises: ``exc_type`` with ``headline`` on ``failing`` (every rank if None), RankError elsewhere."""
    global CASES
    CASES += 1
    got = outcome(func)
    every = COMM.allgather(got)
    for rank, o in enumerate(every):
        if o[0] != "raise":
            fail(f"{label}: rank {rank} returned {o}")
            continue
        if failing is None or rank == failing:
            if o[1] != exc_type or headline not in o[2]:
                fail(f"{label}: rank {rank} raised {o[1]}: {o[2]!r}, expected {exc_type}: {headline!r}")
        elif o[1] != "RankError" or f"rank {failing} of {SIZE} failed" not in o[2]:
            fail(f"{label}: rank {rank} raised {o[1]}: {o[2]!r}, expected RankError naming rank {failing}")
        expected = list(range(SIZE)) if failing is None else [failing]
        if o[3] != expected:
            fail(f"{label}: rank {rank}: rank_failures {o[3]}, expected {expected}")
    # A collective after it must still work on every rank (nobody was left behind).
    if COMM.allreduce(1) != SIZE:
        fail(f"{label}: the next collective is broken")


def mismatches() -> None:
    first = RANK == 0
    last = RANK == SIZE - 1
    bad = SIZE - 1
    f64 = np.arange(5, dtype=np.float64) + RANK
    empty = np.zeros(0)
    for x in (f64, empty if first else f64, empty):
        if SIZE > 1:
            expect(
                "op", lambda x=x: mpi.allreduce(x, "sum" if first else "max"), "ValueError", "op differs across ranks"
            )
            expect("op-states", lambda x=x: mpi.allreduce(x, "mean" if first else "argmax"), "ValueError", "op differs")
            expect("op-fold-state", lambda x=x: mpi.allreduce(x, "var" if first else "min"), "ValueError", "op differs")
            mixed = x.astype(np.float32) if last else x
            for op in ("sum", "max", "mean", "argmin", "count_nonzero", "prod"):
                expect(
                    f"input dtype {op}", lambda op=op, m=mixed: mpi.allreduce(m, op), "TypeError", "input dtype differs"
                )
            expect("input dtype stats", lambda m=mixed: mpi.stats(m), "TypeError", "input dtype differs")
            expect(
                "input dtype reproducible",
                lambda m=mixed: mpi.allreduce(m, "sum", reproducible=True),
                "TypeError",
                "input dtype differs",
            )
            ints = x.astype(np.int32) if last else x
            expect(
                "int vs float reproducible",
                lambda m=ints: mpi.allreduce(m, "sum", reproducible=True),
                "TypeError",
                "input dtype differs",
            )
            expect(
                "dtype= given on one rank",
                lambda x=x: mpi.allreduce(x, "sum", dtype=np.float32 if first else None),
                "TypeError",
                "dtype= differs across ranks",
            )
            expect(
                "dtype= differs",
                lambda x=x: mpi.allreduce(x, "prod", dtype=np.float32 if first else np.float64),
                "TypeError",
                "dtype= differs across ranks",
            )
            expect(
                "dtype= vs default of the same dtype",
                lambda x=x: mpi.allreduce(x, "sum", dtype=np.float64 if first else None),
                "TypeError",
                "dtype= differs across ranks",
            )
            for op in ("sum", "mean", "max", "argmax", "count_nonzero"):
                expect(
                    f"reproducible {op}",
                    lambda op=op, x=x: mpi.allreduce(x, op, reproducible=last),
                    "ValueError",
                    "reproducible= differs across ranks",
                )
            for op in ("var", "std"):
                expect(
                    f"correction {op}",
                    lambda op=op, x=x: mpi.allreduce(x, op, correction=1.0 if first else 0),
                    "ValueError",
                    "correction= differs across ranks",
                )
            expect("correction stats", lambda x=x: mpi.stats(x, correction=RANK), "ValueError", "correction= differs")
            expect(
                "stats vs mean",
                lambda x=x: mpi.stats(x) if first else mpi.allreduce(x, "mean"),
                "ValueError",
                "op differs",
            )
            expect(
                "agree vs sum",
                lambda x=x: mpi.agree(None) if first else mpi.allreduce(x, "sum"),
                "ValueError",
                "call differs",
            )
            expect(
                "agree vs exact",
                lambda x=x: mpi.agree(None) if last else mpi.allreduce(x, "mean", reproducible=True),
                "ValueError",
                "call differs",
            )
            expect(
                "local_rank vs stats",
                lambda x=x: mpi.local_rank() if first else mpi.stats(x),
                "ValueError",
                "call differs",
            )
        # One rank fails locally, for every kind of combine.
        strings = np.array(["a", "b"]) if RANK == bad else x
        for op, kw in (
            ("sum", {}),
            ("max", {}),
            ("sum", {"dtype": np.float64}),
            ("mean", {}),
            ("argmax", {}),
            ("sum", {"reproducible": True}),
            ("mean", {"reproducible": True}),
            ("var", {"correction": 1}),
        ):
            expect(
                f"bad input {op} {kw}",
                lambda op=op, kw=kw, s=strings: mpi.allreduce(s, op, **kw),
                "TypeError",
                "does not support input dtype",
                bad,
            )
        expect("bad input stats", lambda s=strings: mpi.stats(s), "TypeError", "does not support input dtype", bad)
        expect(
            "bad correction",
            lambda x=x: mpi.allreduce(x, "var", correction="1" if RANK == bad else 1),
            "TypeError",
            "correction must be a real number",
            bad,
        )
        expect(
            "bad stats correction",
            lambda x=x: mpi.stats(x, correction="1" if RANK == bad else 1),
            "TypeError",
            "correction must be a real number",
            bad,
        )
        expect(
            "unknown op",
            lambda x=x: mpi.allreduce(x, "median" if RANK == bad else "sum"),
            "ValueError",
            "unknown op",
            bad,
        )
        expect(
            "reproducible var on one rank",
            lambda x=x: mpi.allreduce(x, "var", reproducible=RANK == bad),
            "NotImplementedError",
            "reproducible=True is not available",
            bad,
        )
        expect(
            "unsupported dtype= on one rank",
            lambda x=x: mpi.allreduce(x, "sum", dtype=np.complex128 if RANK == bad else np.float64),
            "TypeError",
            "complex",
            bad,
        )
        expect("empty max", lambda: mpi.allreduce(empty, "max"), "ValueError", "zero-size array")
        expect("empty argmin", lambda: mpi.allreduce(empty, "argmin"), "ValueError", "")
        expect("empty stats", lambda: mpi.stats(empty), "ValueError", "zero-size array to stats")


def main() -> int:
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    random_cases(seed, count)
    mismatches()
    every = COMM.gather(FAILURES, root=0)
    total = COMM.allreduce(CASES, op=MPI.MIN)
    if RANK == 0:
        failures = [f for rank_failures in every for f in rank_failures]
        for line in failures[:60]:
            print(line, flush=True)
        print(f"PASS {SIZE} {total}" if not failures else f"FAIL {len(failures)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_cli.guarded(main, COMM, mpi))
