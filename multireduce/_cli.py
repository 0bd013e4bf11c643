"""The command line: ``python -m multireduce [run | info | bench] [options]``.

It runs alone or under ``mpirun -n N``. Arguments are parsed before MPI starts, so ``--help``
and usage errors need no MPI when run alone; under a launcher with other processes a usage
error joins the first agreement, so that ranks started with other arguments (an MPMD launch)
stop too. Output comes once, from rank 0, and so do the warnings that the reductions raise
(NumPy's overflow in the final cast, which every rank meets alike): each rank records them,
and rank 0 prints each once with the ranks that met it. Every step that can fail on one
rank alone (reading a file, allocating device memory) is followed by a collective agreement
(:func:`multireduce.mpi.agree`), so that all ranks stop together and rank 0 prints the failing
rank's message. Anything that escapes without agreement (a bug) aborts the whole job with
``MPI_Abort``: the other ranks may be waiting in a collective that this rank will never reach.

Exit status: 0 success, 1 error, 2 usage error, 3 a result failed its check, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import math
import os
import platform
import socket
import stat
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, _cli_checks, _provenance
from ._cli_checks import exact_sum as _exact_float_sum
from ._cli_checks import ieee_key as _ieee_key
from ._cli_checks import same_float as _same_float
from ._cli_checks import to_float as _to_float
from .ops import OPS, check_dtype, get_op

__all__ = ["guarded", "main"]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CHECK = 3
EXIT_INTERRUPTED = 130  # KeyboardInterrupt, as the shell reports SIGINT

# Per-rank sizes of the embedded default: "a few hundred MB" on a GPU, enough on a CPU to
# time the reduction without making a 2-core CI machine wait.
DEFAULT_GPU_BYTES_PER_RANK = 256 * 2**20
DEFAULT_CPU_BYTES_PER_RANK = 16 * 2**20
DEFAULT_DTYPE = "float32"

# Synthetic data: x[i] = (i * _MULT) % period + low. _MULT is a prime that does not divide
# any period used, so every window of `period` consecutive indices holds each value once:
# sums, maxima and minima have closed forms in exact integers, independent of multireduce.
_MULT = 7919
#: Indices per block of synthetic data (:meth:`_Pattern.values`): 32 MiB of int64.
_PATTERN_BLOCK = 1 << 22


class UsageError(Exception):
    """A bad command line; reported once, with exit status 2."""


def _env_rank() -> int:
    # The launcher's rank, known before MPI starts: lets usage errors print once.
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{self.prog}: error: {message}")

    def _print_message(self, message, file=None):
        if _env_rank() == 0:
            super()._print_message(message, file)


#: The largest count the CLI takes: NumPy's index range (int64).
MAX_LENGTH = 2**63 - 1


def _length(text: str) -> int:
    """Parse an element count: a non-negative integer (``1_000_000``, ``1e6``) of at most 2**63 - 1.

    Underscores group digits as in Python's literals: one between two digits only.
    """
    if "_" in text and not all(a.isdigit() and b.isdigit() for a, b in _around_underscores(text)):
        raise argparse.ArgumentTypeError(
            f"must be a non-negative integer, got {text!r} (an underscore goes between two digits)"
        )
    try:
        value = Decimal(text.replace("_", ""))
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}") from None
    if not value.is_finite() or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r} (negative)")
    # Compared as a Decimal: int() of 1e1000000000 would take minutes building its digits.
    if value > MAX_LENGTH:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer of at most 2**63 - 1, got {text!r}")
    return int(value)


def _around_underscores(text: str) -> list[tuple[str, str]]:
    """The characters before and after each underscore of ``text`` ("" at either end)."""
    return [(text[i - 1] if i else "", text[i + 1 : i + 2]) for i, c in enumerate(text) if c == "_"]


def _positive(text: str) -> int:
    value = _length(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


#: The ops the CLI runs and checks against independent references: every op of the library.
CLI_OPS = tuple(OPS)
#: The ops a run or a benchmark takes without --op.
DEFAULT_OPS = ("sum", "max", "min")
#: nansum, nanmax and nanmin are checked with sum's, max's and min's references over the
#: elements that are not NaN.
_NAN_FOLDS = {"nansum": "sum", "nanmax": "max", "nanmin": "min"}


def _op_name(text: str) -> str:
    if text not in CLI_OPS:
        known = ", ".join(repr(name) for name in CLI_OPS)
        raise argparse.ArgumentTypeError(f"unknown op {text!r}; the CLI runs: {known}")
    return get_op(text).name


def _input_path(text: str) -> str:
    if not text:  # an empty name would open "." (IsADirectoryError) on every rank
        raise argparse.ArgumentTypeError("must name a file, got an empty path")
    return text


def _correction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a real number (NumPy's ddof), got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite real number (NumPy's ddof), got {text!r}")
    return value


#: The ops that take --correction: var, std, nanvar and nanstd.
_CORRECTED = tuple(name for name, op in OPS.items() if op.statistic in ("var", "std"))


def _dtype(text: str) -> np.dtype:
    try:
        return check_dtype(text)
    except TypeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sizes(text: str) -> list[int]:
    sizes = [_length(part) for part in text.split(",") if part.strip()]
    if not sizes:  # was taken as no --sizes: the default sweep ran instead
        raise argparse.ArgumentTypeError(f"must list at least one global length (e.g. 1000,1e6), got {text!r}")
    return sizes


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m multireduce",
        description="Distributed reductions on GPUs or CPUs. Run alone or under mpirun -n N; "
        "the default subcommand is 'run'.",
    )
    parser.add_argument("--version", action="version", version=f"multireduce {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    common = _Parser(add_help=False)
    common.add_argument("--cpu", action="store_true", help="use the CPU backend even where a GPU exists")
    common.add_argument(
        "--device",
        type=_length,
        default=None,
        help="GPU ordinal for every rank (default: node-local rank %% device count)",
    )
    common.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    run = sub.add_parser(
        "run",
        parents=[common],
        help="reduce data across all ranks (the default)",
        description="Reduce synthetic data (default) or a file across all ranks.",
    )
    run.add_argument(
        "--op",
        dest="ops",
        action="append",
        type=_op_name,
        metavar="OP",
        help=f"reduction, repeatable: {', '.join(CLI_OPS)} (default: {', '.join(DEFAULT_OPS)})",
    )
    run.add_argument(
        "--correction",
        type=_correction,
        default=None,
        help="for var, std, nanvar and nanstd: divide by N - correction (NumPy's ddof; default 0)",
    )
    run.add_argument(
        "--dtype",
        type=_dtype,
        default=None,
        help=f"element dtype of synthetic data (default {DEFAULT_DTYPE}) or of a raw --input file",
    )
    size = run.add_mutually_exclusive_group()
    size.add_argument("--n", type=_length, default=None, help="global number of elements, split unevenly if need be")
    size.add_argument("--per-rank", type=_length, default=None, help="number of elements on each rank")
    run.add_argument(
        "--input",
        metavar="FILE",
        type=_input_path,
        default=None,
        help="read a .npy file or a raw binary file of --dtype; each rank reads its own slice. "
        "With {rank} in the name, each rank reads all of its own file instead",
    )
    run.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compare with an independent reference (default: on for synthetic data, off for --input)",
    )
    run.add_argument("--repeat", type=_positive, default=3, help="timed repetitions per op; the best is reported")
    run.add_argument(
        "--all-ranks", action="store_true", help="also print each rank's host, device, shard length and load time"
    )
    run.set_defaults(func=_cmd_run)

    info = sub.add_parser("info", parents=[common], help="devices, backend, MPI library, ranks, CUDA-aware status")
    info.set_defaults(func=_cmd_info)

    bench = sub.add_parser("bench", parents=[common], help="sweep sizes and ops, write JSON")
    bench.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        help="comma-separated global lengths (at 0, of the default ops only sum is timed)",
    )
    bench.add_argument(
        "--op",
        dest="ops",
        action="append",
        type=_op_name,
        metavar="OP",
        help=f"reduction, repeatable (default: {', '.join(DEFAULT_OPS)})",
    )
    bench.add_argument(
        "--dtype", type=_dtype, default=np.dtype(DEFAULT_DTYPE), help=f"element dtype (default {DEFAULT_DTYPE})"
    )
    bench.add_argument("--warmup", type=_length, default=2, help="untimed calls per size and op (default 2)")
    bench.add_argument("--repeat", type=_positive, default=5, help="timed calls per size and op (default 5)")
    bench.add_argument(
        "--output",
        type=Path,
        default=Path("multireduce-bench.json"),
        help="JSON file to write (checked before the benchmark runs)",
    )
    bench.set_defaults(func=_cmd_bench)
    return parser


#: The options that take a number (``--sizes``: a comma-separated list), each with the
#: shortest abbreviation argparse takes for it (``--co`` for ``--correction``; ``--n`` only
#: whole, as ``--no-check`` shares its start).
_NUMBER_OPTIONS = {
    "--correction": 4,
    "--n": 3,
    "--per-rank": 3,
    "--sizes": 3,
    "--warmup": 3,
    "--repeat": 3,
    "--device": 4,
}


def _attach_negative_corrections(argv: list[str]) -> list[str]:
    """``--correction -1e+300`` as ``--correction=-1e+300``, and so for every option that takes a number.

    argparse reads a value that starts with "-" as an option unless it looks like "-1" or
    "-1.5", so a negative value in exponent form ("-1e+300", "-2E3") would be "expected one
    argument", where "-1" gets the option's own message (a negative ``--n``, say). A value
    that parses as a number (its first item, for ``--sizes``) is attached to the option here.
    """
    out: list[str] = []
    rest = iter(argv)
    for arg in rest:
        if arg == "--":  # what follows is not options
            out += [arg, *rest]
            break
        out.append(arg)
        if any(len(arg) >= k and name.startswith(arg) for name, k in _NUMBER_OPTIONS.items()):
            value = next(rest, None)
            if value is None:
                break
            if value.startswith("-") and _is_number(value.split(",")[0]):
                out[-1] = f"{arg}={value}"
            else:
                out.append(value)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = _build_parser()
    commands = {"run", "info", "bench"}
    command_first = bool(argv) and argv[0] in commands
    if not argv or (argv[0] not in commands and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    args, extra = parser.parse_known_args(_attach_negative_corrections(argv))
    if extra:
        if extra[0] in commands and not command_first:  # "--cpu info": an option before the command
            raise UsageError(
                f"{parser.prog}: error: the command comes first: python -m multireduce {extra[0]} [options] "
                f"(got {extra[0]!r} after an option)"
            )
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        args = parser.parse_args(["run"])
    if args.cpu and args.device is not None:
        raise UsageError(f"{parser.prog}: error: --device picks a GPU, and --cpu asks for none: give one of them")
    if args.command == "run" and args.correction is not None and not set(args.ops or ()) & set(_CORRECTED):
        raise UsageError(
            f"{parser.prog}: error: --correction applies to {', '.join(_CORRECTED)}; give one of them with --op"
        )
    if args.command == "run" and args.input is not None and args.per_rank is not None:
        raise UsageError(f"{parser.prog}: error: --per-rank applies to synthetic data, not to --input")
    if args.command == "run" and args.input is not None and "{rank}" in args.input and args.n is not None:
        raise UsageError(
            f"{parser.prog}: error: --n (a global length) does not apply to --input with {{rank}}, "
            "where each rank reads all of its own file"
        )
    args.auto_size = args.command == "run" and args.input is None and args.per_rank is None and args.n is None
    return args


# --------------------------------------------------------------------------------------------
# Backend and environment


@dataclass
class _Context:
    comm: Any
    mpi: Any
    rank: int
    size: int
    backend: str  # "gpu" or "cpu"
    backend_reason: str
    device: int | None = None
    device_name: str = "cpu"

    def sync(self) -> None:
        if self.backend == "gpu":
            import cupy

            cupy.cuda.get_current_stream().synchronize()

    @property
    def xp(self):
        if self.backend == "gpu":
            import cupy

            return cupy
        return np


def _detect_backend(force_cpu: bool) -> tuple[str, str]:
    """("gpu" | "cpu", why). Never a silent fallback: the reason is printed with the results."""
    if force_cpu:
        return "cpu", "forced by --cpu"
    try:
        import cupy
    except ImportError as exc:
        return "cpu", f"CuPy is not importable ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return "cpu", f"CuPy finds no usable CUDA device ({exc})"
    if count == 0:
        return "cpu", "CuPy finds no CUDA device"
    return "gpu", f"CuPy {cupy.__version__} finds {count} CUDA device(s)"


def _arguments_code(args) -> tuple[int, str]:
    """The parsed command line as an int64 code that two ranks share when their arguments are equal, and as text."""
    shown = " ".join(f"{k}={v!r}" for k, v in sorted(vars(args).items()) if k != "func")
    digest = hashlib.blake2b(shown.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True), shown


def _agree_command_line(comm, mpi, error: BaseException | None, code: int, shown: str) -> None:
    """The CLI's first collective: the agreement on every rank's command line, or on its usage error.

    :func:`_setup` and :func:`_usage_error` make it with the same record, so that ranks
    started with different arguments meet in it whichever of the two they reached.
    """
    mpi._agree_values(comm, error, "python -m multireduce", (("the command line", code, shown, ValueError),))


def _setup(args, comm, mpi) -> _Context:
    backend, reason = _detect_backend(args.cpu)
    ctx = _Context(comm, mpi, comm.Get_rank(), comm.Get_size(), backend, reason)
    # Ranks started with different arguments (an MPMD launch, a wrapper script) would make
    # different collective calls (a hang, or MPI's "message truncated") or split different
    # lengths (a wrong result): every rank raises instead.
    _agree_command_line(comm, mpi, None, *_arguments_code(args))
    error = None
    try:
        # The one collective step comes first on every rank, before anything that can fail on
        # one rank alone: a rank that failed earlier would be in agree() while the others are in
        # local_rank()'s agreement, which raises the failure here, and they would then wait in
        # agree() below for a rank that has left. select_device makes local_rank's two
        # agreements around its Split_type; CPU ranks take part in them through local_rank
        # (one call, as the agreement counts them).
        if backend == "gpu":
            import cupy

            ctx.device = mpi.select_device(comm, device=args.device)
            props = cupy.cuda.runtime.getDeviceProperties(ctx.device)
            name = props["name"]
            ctx.device_name = name.decode() if isinstance(name, bytes) else str(name)
        else:
            mpi.local_rank(comm)
            if args.device is not None:  # no GPU here: the CPU is not what --device asked for
                raise ValueError(
                    f"--device {args.device} asks for a GPU, but this rank runs on the CPU ({reason}); "
                    "drop --device to run on the CPU, or run where CuPy sees a CUDA device"
                )
            # An exported MULTIREDUCE_DEVICE is not used here, but a malformed one is an error
            # as on a GPU (it passed unread).
            valid = "a non-negative integer device ordinal (the CPU backend does not use a valid one)"
            if (mpi._env_device(os.environ, valid) or 0) < 0:
                raise ValueError(f"{mpi.DEVICE_ENV}={os.environ[mpi.DEVICE_ENV]!r}: it must be {valid}")
        mpi.cuda_aware()  # a bad MULTIREDUCE_CUDA_AWARE fails here, agreed, not later on one rank
    except Exception as exc:  # agreed below, then reported by rank 0
        if mpi.rank_failures(exc) is not None:
            raise  # agreed already (select_device's errors): every rank raises it
        error = exc
    mpi.agree(error, comm)
    return ctx


def _emit(ctx: _Context, text: str) -> None:
    if ctx.rank == 0:
        print(text, flush=True)


def _environment(ctx, mpi) -> dict:
    """What every JSON document of the CLI says about where it ran."""
    return {
        "multireduce": __version__,
        "ranks": ctx.size,
        "backend": ctx.backend,
        "backend_reason": ctx.backend_reason,
        "device": ctx.device_name,
        "mpi_library": _mpi_library_line(mpi),
        "cuda_aware": mpi.cuda_aware().enabled,
    }


def _mpi_library_line(mpi) -> str:
    # Open MPI's string ends in the C string's NUL, which JSON would carry as "\u0000".
    return " ".join(mpi.MPI.Get_library_version().replace("\0", " ").strip().splitlines()[0].split())


def _transport_line(mpi) -> str:
    aware = mpi.cuda_aware()
    how = "device buffers to MPI" if aware.enabled else "staged through host memory"
    return f"{'yes' if aware.enabled else 'no'} ({how}), decided by {aware.method} [{aware.detail}]"


# --------------------------------------------------------------------------------------------
# Synthetic data with exactly known results


@dataclass(frozen=True)
class _Pattern:
    period: int
    low: int

    @staticmethod
    def for_dtype(dt: np.dtype) -> _Pattern:
        if dt.kind == "b":
            return _Pattern(2, 0)
        if dt.kind == "u":
            return _Pattern(201 if dt.itemsize == 1 else 2001, 0)
        half = 100 if dt.itemsize == 1 else 1000
        return _Pattern(2 * half + 1, -half)

    def values(self, start: int, stop: int, dt: np.dtype, xp):
        """x[start:stop] as ``dt`` on ``xp``'s device (NumPy or CuPy).

        Made in blocks of :data:`_PATTERN_BLOCK` int64 indices: the whole range's indices
        took 8 bytes per element beside the data (int8 data: 9 bytes per element, and the
        kernel's OOM killer ended a rank of ``--n 3e9 --dtype int8`` without a message).
        """
        n = stop - start
        dt = np.dtype(dt)
        message = (
            f"cannot make {n:,} elements of synthetic data on one rank ({dt.itemsize * n:,} bytes of "
            f"{dt.name}); give a smaller length (--n, --per-rank, --sizes) or more ranks"
        )
        # Past what an array's bytes can count: NumPy's "array is too big" ValueError names
        # neither the option nor the remedy.
        if dt.itemsize * n > np.iinfo(np.intp).max:
            raise MemoryError(message)
        try:
            out = xp.empty(n, dtype=dt)
        except MemoryError as exc:  # NumPy's and CuPy's out-of-memory errors are MemoryErrors
            raise MemoryError(f"{message}: {exc}") from exc
        for b0 in range(0, n, _PATTERN_BLOCK):
            i = xp.arange(start + b0, start + min(n, b0 + _PATTERN_BLOCK), dtype=np.int64)
            i *= _MULT
            i %= self.period
            i += self.low
            out[b0 : b0 + i.size] = i.astype(dt)
        return out

    def _window(self, count: int) -> list[int]:
        return [(i * _MULT) % self.period + self.low for i in range(count)]

    def reference(self, op: str, n: int, kind: str = "f") -> Any:
        """The exact reference of ``op`` over x[0:n] of a dtype of ``kind``.

        sum / max / min (and nansum / nanmax / nanmin: there is no NaN here) in Python
        integers (None: empty max/min); the other ops as :mod:`multireduce._cli_checks`
        references.
        """
        full, rest = divmod(n, self.period)
        window = self._window(self.period if full else rest)
        if op in _cli_checks.OPS:
            return _cli_checks.synthetic(op, window, full, rest, kind)
        op = _NAN_FOLDS.get(op, op)
        tail = window[:rest] if full else window
        if op == "sum":
            return full * sum(window) + sum(tail) if full else sum(tail)
        if n == 0:
            return None
        return (max if op == "max" else min)(window)

    def abs_bound(self) -> int:
        return max(abs(self.low), abs(self.low + self.period - 1))


def _check_value(result: np.generic, reference, op: str, dt: np.dtype, n: int, bound: float) -> tuple[bool, str]:
    """Compare a global result on the synthetic data with its exact reference. Returns (passed, how).

    The synthetic elements are integers of magnitude at most ``bound``, which is what makes
    the "exact" branch of float sums hold; file data goes through :func:`_check_file_value`.
    """
    res = np.asarray(result)
    if isinstance(reference, float) and np.isnan(reference):
        return bool(np.isnan(res)), "NaN"
    if op != "sum" or res.dtype.kind in "iub":
        return bool(res == reference), "exact"
    target = np.asarray(reference).astype(res.dtype)  # the exact value, rounded once
    acc = get_op("sum").accumulator_dtype(res.dtype)
    if n * bound < 2.0 ** (np.finfo(acc).nmant + 1):
        # Every partial sum is an integer below 2**(mantissa bits): the accumulation is exact
        # whatever the order, so only the final rounding to the result dtype remains.
        return bool(res == target), "exact"
    tol = n * bound * float(np.finfo(acc).eps) + abs(float(target)) * float(np.finfo(res.dtype).eps)
    return bool(abs(float(res) - float(reference)) <= tol), f"|err| <= {tol:.3g}"


# --------------------------------------------------------------------------------------------
# References for file data: exact integer and float sums, IEEE special values. Each rank reduces
# its own shard to a small part, the parts are gathered and combined, and the global result is
# compared with the combination. Nothing here calls multireduce's reductions.


@dataclass(frozen=True)
class _FloatSum:
    """The reference of a float sum over one shard, or over all of them (:func:`_combine_references`).

    ``total`` is the exact sum of the finite elements, whatever its size. NaN and infinities
    are only flagged: the result they give is the same in any order of additions, as in
    NumPy (NaN, or +-inf, or NaN for both).
    """

    total: Fraction
    magnitude: Fraction  # exact sum of |finite elements|: the error bound's scale (a float64 sum
    # was inf past its range, and the bound with it: any finite result passed)
    max_abs: float  # largest |finite element|
    integral: bool  # every finite element is an integer
    nan: bool
    pos_inf: bool
    neg_inf: bool

    @property
    def value(self) -> float:
        if self.nan or (self.pos_inf and self.neg_inf):
            return math.nan
        if self.pos_inf or self.neg_inf:
            return math.inf if self.pos_inf else -math.inf
        return _to_float(self.total)


def _float_sum_part(x: np.ndarray) -> _FloatSum:
    finite_mask = np.isfinite(x)
    finite = x if finite_mask.all() else x[finite_mask]
    max_abs = float(np.max(np.abs(finite))) if finite.size else 0.0
    magnitude = _exact_float_sum(np.abs(finite))
    # Integers in a float dtype: needed (and checked) only where a sum of them can be exact.
    integral = finite.size * max_abs < 2.0**53 and bool(np.all(np.trunc(finite) == finite))
    return _FloatSum(
        total=_exact_float_sum(finite),
        magnitude=magnitude,
        max_abs=max_abs,
        integral=integral,
        nan=bool(np.isnan(x).any()),
        pos_inf=bool(np.isposinf(x).any()),
        neg_inf=bool(np.isneginf(x).any()),
    )


def _file_reference(x: np.ndarray, op: str):
    """Compute this rank's part of the independent reference of ``op`` over the file data ``x``.

    Integer sums: an exact Python int (chunks keep the int64 sums of 32-bit halves exact).
    Float sums: a :class:`_FloatSum`. max/min: a Python int, bool or float (NaN if any element
    is NaN; -0.0 below +0.0), or None for an empty shard.
    """
    if op in _cli_checks.OPS:
        return _cli_checks.part(x, op)
    if op in _NAN_FOLDS:
        op, x = _NAN_FOLDS[op], x[~np.isnan(x)] if x.dtype.kind == "f" else x
    if op == "sum":
        if x.dtype.kind == "f":
            return _float_sum_part(x)
        total = 0
        wide = x.astype(np.int64) if x.dtype != np.uint64 else x
        for start in range(0, wide.size, 1 << 20):
            chunk = wide[start : start + (1 << 20)]
            low = (chunk & 0xFFFFFFFF).astype(np.int64)
            high = (chunk >> 32).astype(np.int64)  # arithmetic shift keeps the sign
            total += int(low.sum()) + (int(high.sum()) << 32)
        return total
    if x.size == 0:
        return None
    if x.dtype.kind == "f" and np.isnan(x).any():
        return math.nan
    # Max and min are exact in any order: NumPy's value, as a Python number (floats as float64).
    value = (np.max(x) if op == "max" else np.min(x)).item()
    if isinstance(value, float) and value == 0:  # max/min do not see the sign of zero
        negative = np.signbit(x[x == 0])
        # IEEE 754-2019 order, -0.0 below +0.0: max is +0.0 where any zero is, min -0.0.
        value = math.copysign(0.0, -1.0 if (negative.all() if op == "max" else negative.any()) else 1.0)
    return value


def _combine_references(op: str, parts: list) -> Any:
    """Combine the ranks' parts (:func:`_file_reference`) into the global reference."""
    if op in _cli_checks.OPS:
        return _cli_checks.combine(op, parts)
    if op in ("nanmax", "nanmin"):  # no element but NaN: NaN (an empty input is refused before)
        combined = _combine_references(_NAN_FOLDS[op], parts)
        return math.nan if combined is None else combined
    op = _NAN_FOLDS.get(op, op)
    if op == "sum" and any(isinstance(p, _FloatSum) for p in parts):
        return _FloatSum(
            total=sum((p.total for p in parts), Fraction(0)),
            magnitude=sum((p.magnitude for p in parts), Fraction(0)),
            max_abs=max(p.max_abs for p in parts),
            integral=all(p.integral for p in parts),
            nan=any(p.nan for p in parts),
            pos_inf=any(p.pos_inf for p in parts),
            neg_inf=any(p.neg_inf for p in parts),
        )
    if op == "sum":
        return sum(parts)
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    if any(isinstance(p, float) and math.isnan(p) for p in parts):
        return math.nan
    return (max if op == "max" else min)(parts, key=_ieee_key)


def _check_file_value(result: np.generic, reference, op: str, n: int, ranks: int) -> tuple[bool, str]:
    """Compare a global result on file data with its reference (:func:`_combine_references`).

    Integers and max/min must be identical (floats: NaN with NaN, infinities and zeros of the
    same sign). A float sum must be identical where the input makes it so (NaN, an infinity,
    or integers whose partial sums are all exact in the accumulator, then rounded once), and
    otherwise lie within the error bound of multireduce's summation in its accumulator dtype
    (float64 for float32/float64 data, float32 for float16), relative to the sum of |x|:
    ``eps * sum|x| * (log2(n + 1) + n / 50000 + ranks + 1)``, plus one ulp of the result for
    its final rounding; near the top of the result's range the result may also be the
    infinity of the reference's sign. Where the sum of |x| reaches the accumulator's range,
    partial sums may overflow in some order of additions: any infinity, and NaN from two of
    opposite signs, are then results of a correct summation too.
    """
    if not isinstance(reference, _FloatSum):
        if isinstance(reference, float):
            return _same_float(float(result), reference), "identical"
        return bool(np.asarray(result) == reference), "exact"
    res_dt = np.asarray(result).dtype
    res = float(result)
    acc = np.finfo(get_op("sum").accumulator_dtype(res_dt))
    may_overflow = not reference.magnitude < Fraction(float(acc.max))
    if math.isnan(reference.value):
        return math.isnan(res), "NaN"
    if reference.pos_inf or reference.neg_inf:  # an infinite element, not a sum past the range
        return res == reference.value or (may_overflow and math.isnan(res)), "same infinity"
    if reference.integral and n * reference.max_abs < 2.0 ** (acc.nmant + 1):
        # Every partial sum is an integer below 2**(mantissa bits): exact in any order, so only
        # the final rounding to the result dtype remains.
        with np.errstate(over="ignore"):
            target = float(res_dt.type(reference.value))
        return _same_float(res, target), "exact"  # a zero sum is +0.0, as in NumPy
    tol = _cli_checks.to_float(
        Fraction(float(acc.eps)) * reference.magnitude * Fraction(_cli_checks.bound_factor(n, ranks))
    )
    why = f"the sum of |x| is past the range of the {acc.dtype} accumulator, so partial sums may overflow"
    return _cli_checks.within(float(result), reference.total, tol, res_dt, may_overflow, why)


def _wrap_int(value: int, dt: np.dtype) -> int:
    # Integer sums wrap modulo 2**64, then to the result dtype, as NumPy's do.
    bits = value % (1 << 64)
    return int(np.array(bits, dtype=np.uint64).astype(np.int64 if dt.kind == "i" else np.uint64).astype(dt))


# --------------------------------------------------------------------------------------------
# run


def _load(args, ctx: _Context) -> tuple[Any, dict]:
    """Load or generate this rank's data on its device; also return the global description and times."""
    from ._shards import inspect_file
    from ._shards import read_shard as read_layout_shard

    comm, mpi = ctx.comm, ctx.mpi
    info: dict = {"h2d_s": None}
    error = None
    x = None
    comm.Barrier()
    start = time.perf_counter()
    try:
        if args.input is not None:
            if "{rank}" in args.input:  # a file per rank, each read whole
                path = args.input.replace("{rank}", str(ctx.rank))
                layout = inspect_file(path, dtype=args.dtype, n=args.n)
                host = read_layout_shard(layout, 0, 1)
            else:  # one file split across the ranks, which must see the same dtype and length
                layout, host = mpi._read_agreed(comm, args.input, args.dtype, args.n)
            info.update(source=args.input, dtype=layout.dtype, kind=layout.kind)
            info["n_global_file"] = layout.n
        else:
            dt = np.dtype(args.dtype or DEFAULT_DTYPE)
            if args.auto_size:
                per_bytes = DEFAULT_GPU_BYTES_PER_RANK if ctx.backend == "gpu" else DEFAULT_CPU_BYTES_PER_RANK
                n = (per_bytes // dt.itemsize) * ctx.size
            elif args.per_rank is not None:
                n = args.per_rank * ctx.size
                if n > MAX_LENGTH:
                    raise ValueError(
                        f"--per-rank {args.per_rank:,} on {ctx.size} ranks makes a global length of {n:,}, "
                        "more than 2**63 - 1"
                    )
            else:
                n = args.n
            begin, end = ctx.mpi.shard_range(n, ctx.rank, ctx.size)
            pattern = _Pattern.for_dtype(dt)
            # Generated where it is reduced: on the GPU there is no host-to-device copy.
            x = pattern.values(begin, end, dt, ctx.xp)
            ctx.sync()
            info.update(source="synthetic", dtype=dt, n_global=n, pattern=pattern)
    except Exception as exc:  # agreed below
        if mpi.rank_failures(exc) is not None:
            raise  # agreed already (the shared file's read): every rank raises it
        error = exc
    load_s = time.perf_counter() - start
    mpi.agree(error, comm)
    if args.input is not None:
        comm.Barrier()
        start = time.perf_counter()
        try:
            if ctx.backend == "gpu":
                import cupy

                with cupy.cuda.Device(ctx.device):
                    x = cupy.asarray(host)
                ctx.sync()
            else:
                x = host
        except Exception as exc:  # agreed below (e.g. out of device memory on one rank)
            error = exc
        info["h2d_s"] = time.perf_counter() - start if ctx.backend == "gpu" else None
        mpi.agree(error, comm)
        info["host_shard"] = host
        info["n_global"] = comm.allreduce(int(host.size))
    info["load_s"] = load_s
    info["n_local"] = int(x.size)
    return x, info


def _max_over_ranks(comm, values: list[float | None]) -> list[float | None]:
    from mpi4py import MPI  # imported by multireduce.mpi before any command runs

    arr = np.array([-1.0 if v is None else v for v in values], dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.MAX)
    return [None if v is None else float(a) for v, a in zip(values, arr, strict=True)]


def _cmd_run(args, comm, mpi) -> int:
    ctx = _setup(args, comm, mpi)
    ops = args.ops or list(DEFAULT_OPS)
    x, info = _load(args, ctx)
    dt = info["dtype"]
    n = info["n_global"]
    check = args.check if args.check is not None else args.input is None
    empty = [name for name in ops if n == 0 and not get_op(name).empty_allowed]
    # n is the same on every rank, so every rank passes the same error to the agreement.
    mpi.agree(_no_elements_error(empty, args) if empty else None, comm)

    rows = []
    local_times = []
    for name in ops:
        corrected = {"correction": args.correction or 0.0} if name in _CORRECTED else {}
        # NumPy's warnings (a float16 sum past its dtype's range: "overflow encountered in
        # reduce", from the final conversion that every rank makes alike) are recorded, and rank 0 reports each
        # once for all ranks (_report_warnings) instead of every rank printing its own.
        with _recorded_warnings(ctx) as caught:
            # The first call compiles the GPU kernel and sets up MPI's connections: not timed.
            try:
                mpi.allreduce(x, name, comm=comm, **corrected)
            except ValueError as exc:
                named = _all_nan_error(exc, name, mpi)
                if named is exc:
                    raise
                raise named from exc
            kernel_s = allreduce_s = float("inf")
            for _ in range(args.repeat):
                value, k, c = mpi._timed_allreduce(x, name, comm, **corrected)
                k, c = _max_over_ranks(comm, [k, c])
                kernel_s, allreduce_s = min(kernel_s, k), min(allreduce_s, c)
        host_value = np.asarray(value.get() if ctx.backend == "gpu" else value)[()]
        rows.append(
            {
                "op": name,
                "result": host_value,
                "kernel_s": kernel_s,
                "allreduce_s": allreduce_s,
                "warnings": _distinct_warnings(caught),
                **corrected,
            }
        )
        local_times.append(kernel_s)
    if check:  # after the timings, which the references' memory traffic would disturb
        references = None if info["source"] == "synthetic" else _file_references(ctx, info["host_shard"], ops)
        for row in rows:
            row.update(_reference_row(ctx, info, row, dt, n, references))
    _mark_overflows(ctx, x, rows, dt, n)
    warned = _gathered_warnings(ctx, [row.pop("warnings") for row in rows])

    load_s, h2d_s = _max_over_ranks(comm, [info["load_s"], info["h2d_s"]])
    transport = comm.gather(mpi.transport_counts(), root=0)
    per_rank = comm.gather(
        {
            "rank": ctx.rank,
            "host": socket.gethostname(),
            "backend": ctx.backend,
            "device": ctx.device,
            "n_local": info["n_local"],
            "load_s": info["load_s"],
        },
        root=0,
    )
    failed = [r["op"] for r in rows if r.get("check") is False]
    if ctx.rank == 0:
        nbytes = n * dt.itemsize
        report = {
            **_environment(ctx, mpi),
            "cuda_aware_decided_by": mpi.cuda_aware().method,
            "transport": {k: sum(t[k] for t in transport) for k in transport[0]},
            "source": info["source"],
            "dtype": dt.name,
            "n": n,
            "bytes": nbytes,
            "repeat": args.repeat,
            "load_s": load_s,
            "h2d_s": h2d_s,
            "results": [_jsonable_row({**r, "warnings": w}, nbytes) for r, w in zip(rows, warned, strict=True)],
            "check_passed": None if not check else not failed,
        }
        if args.all_ranks:
            report["per_rank"] = per_rank
        _report_warnings(ctx, [(row["op"], w) for row, w in zip(rows, warned, strict=True)])
        _emit(ctx, json.dumps(report, indent=2) if args.json else _format_run(report))
    if failed:
        return EXIT_CHECK
    return 0


def _all_nan_error(exc: ValueError, name: str, mpi) -> ValueError:
    """``exc``, or for nanargmax/nanargmin of NaN only the same agreed error naming the op.

    NumPy's message, "All-NaN slice encountered", which every rank raises from the merged
    state, named neither the op nor what to do.
    """
    failures = mpi.rank_failures(exc)
    if failures is None or not get_op(name).skips_nan or "All-NaN slice" not in str(exc):
        return exc
    takers = ", ".join(n for n in CLI_OPS if get_op(n).kind != "arg" or not get_op(n).skips_nan)
    error = ValueError(
        f"{name}: every element is NaN (NumPy's 'All-NaN slice encountered'), so there is no index to "
        f"return; give data with a non-NaN element, or only ops that take NaN-only input with --op ({takers})"
    )
    return mpi._mark(error, dict.fromkeys(failures, f"{type(error).__name__}: {error}"))


def _no_elements_error(ops: list[str], args) -> ValueError:
    """The error for ops that cannot reduce zero elements (max, min, the arg ops) when the input has none."""
    if getattr(args, "sizes", None) is not None:  # bench
        where = "--sizes 0"
    elif getattr(args, "n", None) == 0:  # with --input too: it reads that many elements
        where = "--n 0"
    elif getattr(args, "per_rank", None) == 0:
        where = "--per-rank 0"
    else:
        where = "the input files hold no elements"
    takers = ", ".join(name for name in CLI_OPS if get_op(name).empty_allowed)
    named = ops[0] if len(ops) == 1 else f"{', '.join(ops[:-1])} and {ops[-1]}"
    return ValueError(
        f"{named} {'needs' if len(ops) == 1 else 'need'} at least one element, as in NumPy, "
        f"and there are none ({where}); "
        f"give at least one element, or only ops that take an empty input with --op ({takers})"
    )


@contextlib.contextmanager
def _recorded_warnings(ctx: _Context):
    """Record the warnings of the reductions in the block (collective at its end).

    Inside the block every warning is recorded and none raises: a rank whose filter made one
    an error there left the other ranks in the block's next collective (a hang where the
    ranks' filters differ, as in an MPMD launch, or where only one rank's own reduction
    warned and the library's agreement raised a RankError on the others). At its end the
    recorded warnings meet the user's filters (``-W error``, ``PYTHONWARNINGS=error``, or an
    "ignore", which drops one from the list): an error is agreed over every rank, so that
    the job stops with one message and exit status 1 instead of hanging or aborting.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    kept, error = [], None
    with warnings.catch_warnings(record=True) as replayed:  # the user's filters again, recorded
        for w in caught:
            try:
                # The module, as warnings.warn named it: filters may name one (-W
                # error::RuntimeWarning:multireduce.mpi); warn_explicit would take the path.
                module = _module_of(w.filename)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, module=module, registry={})
            except Warning as exc:
                error = exc
                break
        kept = list(replayed)
    caught[:] = kept
    ctx.mpi.agree(error, ctx.comm)


def _module_of(filename: str) -> str:
    """The name of the loaded module whose file is ``filename`` (else the name warnings would derive)."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return filename[:-3] if filename.endswith(".py") else filename


def _distinct_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """The warnings recorded on this rank as ``"Category: message"``, each once, in the order they came."""
    return list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))


def _gathered_warnings(ctx: _Context, per_item: list[list[str]]) -> list[list[dict]] | None:
    """Every rank's warnings of each item (a result row, a benchmark record), on rank 0 (collective).

    Returns, on rank 0, per item ``[{"warning": "Category: message", "ranks": [...]}, ...]``
    (each distinct warning once, with the ranks that recorded it); ``None`` on the others.
    """
    gathered = ctx.comm.gather(per_item, root=0)
    if ctx.rank != 0:
        return None
    merged = []
    for i in range(len(per_item)):
        ranks_of: dict[str, list[int]] = {}
        for rank, items in enumerate(gathered):
            for text in items[i]:
                ranks_of.setdefault(text, []).append(rank)
        merged.append([{"warning": text, "ranks": ranks} for text, ranks in ranks_of.items()])
    return merged


def _report_warnings(ctx: _Context, labelled: list[tuple[str, list[dict]]]) -> None:
    """Print each gathered warning once on stderr (rank 0), naming what it is about and its ranks.

    ``multireduce: warning: sum: RuntimeWarning: overflow encountered in reduce (ranks 0-3 of 4)``.
    """
    for label, items in labelled:
        for item in items:
            ranks = item["ranks"]
            where = ""
            if ctx.size > 1:
                who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ctx.mpi._rank_list(ranks)}"
                where = f" ({who} of {ctx.size})"
            print(f"multireduce: warning: {label}: {item['warning']}{where}", file=sys.stderr, flush=True)


#: Elements tested at a time by :func:`_every_element` (bounds its temporary's memory).
_FINITE_CHUNK = 1 << 22


def _every_element(ctx: _Context, x, test) -> bool:
    """Whether ``test(xp, chunk)`` (elementwise bools) holds for every element of every rank's shard.

    Collective; failures agreed.
    """
    error = None
    holds = True
    try:
        flat = x.reshape(-1)
        for start in range(0, flat.size, _FINITE_CHUNK):
            if not bool(test(ctx.xp, flat[start : start + _FINITE_CHUNK]).all()):
                holds = False
                break
    except Exception as exc:  # agreed below (out of device memory on one rank, say)
        error = exc
    ctx.mpi.agree(error, ctx.comm)
    return bool(ctx.comm.allreduce(holds, op=ctx.mpi.MPI.LAND))


def _finite(xp, chunk):
    return xp.isfinite(chunk)


def _nan(xp, chunk):
    return xp.isnan(chunk)


def _finite_or_nan(xp, chunk):
    return xp.isfinite(chunk) | xp.isnan(chunk)


#: The ops whose result can go past its dtype's range: sums and products (integers wrap
#: modulo 2**64, floats reach inf or NaN), var and std (float16 results reach inf), and means
#: of floats, whose float64 sum may (the mean is then that sum over the count, as NumPy's).
_CAN_OVERFLOW = ("sum", "nansum", "prod", "nanprod", "var", "std", "nanvar", "nanstd", "mean", "nanmean")


def _mark_overflows(ctx: _Context, x, rows: list[dict], dt: np.dtype, n: int) -> None:
    """Set each row's ``"overflow"``: whether its result went past its dtype's range (collective).

    Only sums, products, variances, standard deviations and means can (:data:`_CAN_OVERFLOW`);
    max, min, counts and indices never do. A float sum or product did where its result is an
    infinity or NaN while every element on every rank is finite (NaN elements aside for the
    nan ops); a mean (its float64 sum overflowed), variance or standard deviation where it
    is an infinity (NaN is an infinite element's, or no element's). NumPy warns of
    that where a rank's reduction or the final cast to the result dtype overflows, but not
    where MPI's combine of the ranks' partials does, so the data decides. An integer sum or
    product did where the check's exact reference is outside the result dtype (it wrapped
    modulo 2**64, as NumPy's integer sums and products do, with no warning); without the
    check, a sum cannot where ``n`` elements of the input dtype's range cannot reach the
    result's, a product where ``n`` factors of the largest magnitude cannot, and it is
    unknown (``None``) elsewhere. The results are the same on every rank, so every rank
    makes the same collective calls here.
    """
    finite: dict[bool, bool] = {}
    for row in rows:
        op = get_op(row["op"])
        result_dt = op.result_dtype(dt)
        if op.name not in _CAN_OVERFLOW:
            row["overflow"] = False
        elif result_dt.kind == "f":
            value = float(row["result"])
            # NaN of a variance is no overflow (a NaN or infinite element's, or too few
            # elements'); NaN of a mean of finite elements is a float64 sum that overflowed both
            # ways (inf - inf), unless no element is counted (n = 0, or nanmean of NaN alone).
            if math.isfinite(value) or (op.statistic in ("var", "std") and math.isnan(value)):
                row["overflow"] = False
            else:
                if op.skips_nan not in finite:
                    finite[op.skips_nan] = _every_element(ctx, x, _finite_or_nan if op.skips_nan else _finite)
                row["overflow"] = finite[op.skips_nan]
                if row["overflow"] and math.isnan(value) and op.statistic == "mean":
                    nan_only = op.skips_nan and _every_element(ctx, x, _nan)  # (n is global: alike on every rank)
                    row["overflow"] = n > 0 and not nan_only
        elif "overflow" not in row:  # _reference_row sets it where the check ran
            low, high = (0, 1) if dt.kind == "b" else (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
            out = np.iinfo(result_dt)
            if op.mpi_name == "PROD":  # prod and nanprod
                largest = max(abs(low), abs(high))
                fits = largest <= 1 or n * math.log2(largest) < math.log2(out.max)
            else:
                fits = out.min <= n * low and n * high <= out.max
            row["overflow"] = False if fits else None


def _overflow_note(row: dict, dtype: np.dtype) -> str:
    """The report's line for a result that overflowed (:func:`_mark_overflows`)."""
    result_dt = get_op(row["op"]).result_dtype(dtype)
    if result_dt.kind == "f":
        largest = float(np.finfo(result_dt).max)
        if get_op(row["op"]).statistic == "mean":
            where = f"float64's range (largest {float(np.finfo(np.float64).max):g})"
            return f"overflow: the float64 sum of the elements went past {where}, so the {row['op']} is {row['result']}"
        where = f"the range of {result_dt} (largest {largest:g})"
        return f"overflow: the {row['op']} went past {where}, so it is {row['result']}"
    return (
        f"overflow: the exact {row['op']} is outside the range of {result_dt}: it wrapped modulo 2**64, "
        f"as NumPy's integer {'products' if get_op(row['op']).mpi_name == 'PROD' else 'sums'} do"
    )


def _file_references(ctx: _Context, shard: np.ndarray, ops: list[str]) -> dict[str, Any]:
    """The global reference of each of ``ops`` over the file data (collective)."""
    error = parts = None
    try:
        parts = {op: _file_reference(shard, op) for op in ops}
    except Exception as exc:  # agreed below (out of memory on one rank, say)
        error = exc
    ctx.mpi.agree(error, ctx.comm)
    gathered = ctx.comm.allgather(parts)
    return {op: _combine_references(op, [g[op] for g in gathered]) for op in ops}


def _reference_row(ctx, info, row: dict, dt, n, references) -> dict:
    """The check of one result ``row`` (op, result, and correction for var and std)."""
    op, value, correction = row["op"], row["result"], row.get("correction", 0.0)
    result_dt = get_op(op).result_dtype(dt)
    if info["source"] == "synthetic":
        pattern = info["pattern"]
        reference = pattern.reference(op, n, dt.kind)
    else:
        reference = references[op]
    if np.asarray(value).dtype != result_dt:  # the value's dtype is part of the result
        shown = reference.value if isinstance(reference, _FloatSum) else reference
        if op in _cli_checks.OPS:
            shown = _cli_checks.reference_value(op, reference, result_dt, correction)
        return {"reference": shown, "check": False, "check_how": f"dtype {np.asarray(value).dtype}, not {result_dt}"}
    if op in _cli_checks.OPS:
        passed, how = _cli_checks.check(op, reference, value, result_dt, ctx.size, correction)
        overflow = {}
        if op in _cli_checks.PRODUCT_OPS and result_dt.kind in "iu":
            overflow = {"overflow": _cli_checks.wrapped_past_range(reference, result_dt)}
        shown = _cli_checks.reference_value(op, reference, result_dt, correction)
        return {"reference": shown, "check": passed, "check_how": how, **overflow}
    op = _NAN_FOLDS.get(op, op)
    if info["source"] == "synthetic":
        reference, overflow = _wrapped_reference(op, reference, result_dt)
        if reference is not None and result_dt.kind == "b":  # max/min of bools: as file data's
            reference = bool(reference)
        passed, how = _check_value(value, reference, op, dt, n, pattern.abs_bound())
        return {"reference": reference, "check": passed, "check_how": how, **overflow}
    reference, overflow = _wrapped_reference(op, reference, result_dt)
    passed, how = _check_file_value(value, reference, op, n, ctx.size)
    if isinstance(reference, _FloatSum):
        reference = reference.value
    return {"reference": reference, "check": passed, "check_how": how, **overflow}


def _wrapped_reference(op: str, reference: Any, result_dt: np.dtype) -> tuple[Any, dict]:
    """An exact integer reference wrapped modulo 2**64 as the result dtype's, and the row's ``"overflow"``.

    An integer sum whose exact value is outside its result dtype wrapped (:func:`_mark_overflows`).
    Other references are returned as they are, with no ``"overflow"``.
    """
    if not isinstance(reference, int) or isinstance(reference, bool) or result_dt.kind not in "iu":
        return reference, {}
    info = np.iinfo(result_dt)
    overflow = {"overflow": not info.min <= reference <= info.max} if op == "sum" else {}
    return _wrap_int(reference, result_dt), overflow


def _jsonable(value):
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def _jsonable_row(row: dict, nbytes: int) -> dict:
    out = {k: _jsonable(v) for k, v in row.items()}
    out["kernel_gbps"] = nbytes / row["kernel_s"] / 1e9 if row["kernel_s"] > 0 else None
    out["allreduce_us"] = row["allreduce_s"] * 1e6
    return out


def _format_run(r: dict) -> str:
    lines = [
        f"multireduce {r['multireduce']}: {r['ranks']} rank(s), backend {r['backend']} ({r['backend_reason']})"
        + (f", device {r['device']}" if r["backend"] == "gpu" else ""),
        f"MPI: {r['mpi_library']}; GPU partials: "
        + ("device buffers to MPI" if r["cuda_aware"] else "staged through host memory")
        + f" (CUDA-aware {'yes' if r['cuda_aware'] else 'no'}, decided by {r['cuda_aware_decided_by']})",
        f"data: {r['source']}, {r['dtype']}, n = {r['n']:,} ({r['bytes'] / 1e6:,.1f} MB over all ranks)",
        "",
    ]
    width = max([5, *(len(row["op"]) for row in r["results"])])
    head = f"{'result':>24} {'reference':>24} {'check':>6} {'kernel ms':>10} {'GB/s':>8} {'allreduce us':>13}"
    lines.append(f"{'op':<{width}} {head}")
    for row in r["results"]:
        check = "-" if "check" not in row else ("ok" if row["check"] else "FAIL")
        gbps = "-" if row["kernel_gbps"] is None else f"{row['kernel_gbps']:.1f}"
        lines.append(
            f"{row['op']:<{width}} {row['result']!s:>24} {row.get('reference', '-')!s:>24} {check:>6} "
            f"{row['kernel_s'] * 1e3:>10.3f} {gbps:>8} {row['allreduce_us']:>13.1f}"
        )
    lines += [_overflow_note(row, np.dtype(r["dtype"])) for row in r["results"] if row.get("overflow")]
    load = "load -"
    if r["load_s"] > 0:
        load = f"load {r['load_s'] * 1e3:.1f} ms ({r['bytes'] / r['load_s'] / 1e9:.2f} GB/s)"
    h2d = "h2d -" if r["h2d_s"] is None else f"h2d {r['h2d_s'] * 1e3:.1f} ms ({r['bytes'] / r['h2d_s'] / 1e9:.2f} GB/s)"
    lines.append("")
    lines.append(f"phases, max over ranks (kernel and allreduce: best of {r['repeat']}): {load}; {h2d}")
    lines.append(f"partials moved (all ranks, all calls): {r['transport']}")
    if r["check_passed"] is not None:
        lines.append("check: " + ("all results match the reference" if r["check_passed"] else "FAILED"))
    for row in r.get("per_rank", []):
        lines.append(
            f"  rank {row['rank']} on {row['host']}: {row['backend']} device {row['device']}, "
            f"n_local {row['n_local']:,}, load {row['load_s'] * 1e3:.1f} ms"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# info


def _cmd_info(args, comm, mpi) -> int:
    ctx = _setup(args, comm, mpi)
    import mpi4py

    from . import stream

    local, local_size = mpi.local_rank(comm)
    per_rank = comm.gather(
        {
            "rank": ctx.rank,
            "host": socket.gethostname(),
            "local_rank": local,
            "backend": ctx.backend,
            "device": ctx.device,
            "device_name": ctx.device_name,
        },
        root=0,
    )
    aware = mpi.cuda_aware()
    devices = []
    cupy_version = None
    if ctx.backend == "gpu":
        import cupy

        cupy_version = cupy.__version__
        for d in range(cupy.cuda.runtime.getDeviceCount()):
            props = cupy.cuda.runtime.getDeviceProperties(d)
            name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            devices.append(
                {
                    "id": d,
                    "name": name,
                    "memory_gib": props["totalGlobalMem"] / 2**30,
                    "compute_capability": f"{props['major']}.{props['minor']}",
                }
            )
    major, minor = mpi.MPI.Get_version()
    report = {
        "multireduce": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mpi4py": mpi4py.__version__,
        "cupy": cupy_version,
        "backend": ctx.backend,
        "backend_reason": ctx.backend_reason,
        "devices": devices,
        "mpi_library": _mpi_library_line(mpi),
        "mpi_standard": f"{major}.{minor}",
        "ranks": ctx.size,
        "ranks_on_this_node": local_size,
        "cuda_aware": aware.enabled,
        "cuda_aware_decided_by": aware.method,
        "cuda_aware_detail": aware.detail,
        "per_rank": per_rank,
        "stream_copy_engine": stream.copy_engine(),
    }
    if ctx.rank == 0:
        if args.json:
            _emit(ctx, json.dumps(report, indent=2))
        else:
            lines = [
                f"multireduce {__version__} (Python {report['python']}, NumPy {report['numpy']}, "
                f"mpi4py {report['mpi4py']}, CuPy {cupy_version or 'not used'})",
                f"backend: {ctx.backend} ({ctx.backend_reason})",
                "devices: " + ("none" if not devices else ""),
            ]
            for d in devices:
                lines.append(
                    f"  {d['id']}: {d['name']}, {d['memory_gib']:.1f} GiB, compute capability {d['compute_capability']}"
                )
            lines += [
                f"MPI: {report['mpi_library']} (MPI {report['mpi_standard']})",
                f"ranks: {ctx.size}",
            ]
            for row in per_rank:
                where = f"GPU {row['device']} ({row['device_name']})" if row["backend"] == "gpu" else "CPU"
                lines.append(f"  rank {row['rank']}: {row['host']}, node-local rank {row['local_rank']}, {where}")
            lines.append("CUDA-aware MPI: " + _transport_line(mpi))
            engine = report["stream_copy_engine"]
            lines.append(f"stream copy engine: {engine['engine']} ({engine.get('library') or engine.get('reason')})")
            _emit(ctx, "\n".join(lines))
    return 0


# --------------------------------------------------------------------------------------------
# bench


def _is_foreign_pipe(st: os.stat_result) -> bool:
    """Whether ``st`` is a pipe (FIFO) or socket other than this process's standard output or error."""
    if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return False
    for fd in (1, 2):
        try:
            if os.path.samestat(st, os.fstat(fd)):
                return False
        except OSError:  # closed
            continue
    return True


def _check_output(path: Path) -> None:
    """Fail now, not after the benchmark, if the JSON file ``path`` cannot be written.

    Makes the missing parent directories (as the final write does), opens the file for
    appending (which changes nothing in an existing file) and removes it again if it was new.
    A pipe (FIFO) or socket is refused before it is opened, unless it is this process's own
    standard output or error (``/dev/stdout`` into a pipe, as under a launcher): the open of
    another waits for a reader (every rank waited with it), and with one, this check's close
    ended the reader's input before the results were written (the final write then waited
    for ever).

    Raises
    ------
    OSError
        Of the kind the file system reported (IsADirectoryError, PermissionError, ...), with a
        message naming ``--output`` and the path.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # The file the final write makes: a symbolic link's target (removing a new file by the
        # link's name removed the link and left its target, empty, behind).
        real = Path(os.path.realpath(path)) if path.is_symlink() and not path.exists() else path
        existed = real.exists()
        if existed and _is_foreign_pipe(real.stat()):
            raise OSError(errno.EINVAL, "a pipe (FIFO) or socket, not a file (write the JSON to a file)")
        with open(real, "a"):
            pass
        if not existed:
            real.unlink()
    except OSError as exc:
        kind, detail = type(exc), exc.strerror or str(exc)
        if isinstance(exc, FileExistsError):  # from mkdir: a file where a directory should be
            kind, detail = NotADirectoryError, f"{exc.filename} is not a directory"
        elif exc.filename is not None and Path(exc.filename) != path:
            detail += f": {exc.filename}"
        raise kind(f"--output must name a file that can be written; {path}: {detail}") from exc


def _cmd_bench(args, comm, mpi) -> int:
    ctx = _setup(args, comm, mpi)
    # Rank 0 writes the results: check that it can before the benchmark runs, and agree, so
    # that a bad --output ends every rank now with one line instead of a traceback at the end.
    # A size of 0 with ops named by --op that need an element is refused here too (they were
    # left out of the records silently); of the default ops, max and min are not timed there.
    ops = args.ops or list(DEFAULT_OPS)
    sizes = args.sizes or (
        [2**10, 2**16, 2**20, 2**24, 2**27] if ctx.backend == "gpu" else [2**10, 2**14, 2**18, 2**21]
    )
    named = list(dict.fromkeys(args.ops or []))  # in order, once each
    empty = [name for name in named if not get_op(name).empty_allowed] if 0 in sizes else []
    error = _no_elements_error(empty, args) if empty else None
    if ctx.rank == 0 and error is None:
        try:
            _check_output(args.output)
        except Exception as exc:  # agreed below
            error = exc
    mpi.agree(error, comm)
    dt = args.dtype
    pattern = _Pattern.for_dtype(dt)
    records = []
    recorded = []  # per record, this rank's warnings (as _cmd_run's rows)
    for n in sizes:
        begin, end = mpi.shard_range(n, ctx.rank, ctx.size)
        error = x = None
        try:
            x = pattern.values(begin, end, dt, ctx.xp)
            ctx.sync()
        except Exception as exc:  # agreed below (out of memory on one rank, say)
            error = exc
        mpi.agree(error, comm)
        for name in ops:
            if n == 0 and not get_op(name).empty_allowed:  # a default op (named ones: refused above)
                continue
            with _recorded_warnings(ctx) as caught:  # reported once, by rank 0
                for _ in range(args.warmup):
                    mpi.allreduce(x, name, comm=comm)
                kernel, combine = [], []
                for _ in range(args.repeat):
                    _, k, c = mpi._timed_allreduce(x, name, comm)
                    k, c = _max_over_ranks(comm, [k, c])
                    kernel.append(k)
                    combine.append(c)
            recorded.append(_distinct_warnings(caught))
            kernel_s = float(np.median(kernel))
            combine_s = float(np.median(combine))
            records.append(
                {
                    "op": name,
                    "dtype": dt.name,
                    "n": n,
                    "ranks": ctx.size,
                    "backend": ctx.backend,
                    "device": ctx.device_name,
                    "kernel_s_median": kernel_s,
                    "kernel_s_min": min(kernel),
                    "allreduce_s_median": combine_s,
                    "allreduce_s_min": min(combine),
                    "kernel_gbps": n * dt.itemsize / kernel_s / 1e9 if kernel_s > 0 else None,
                }
            )
        del x
    warned = _gathered_warnings(ctx, recorded)
    error = None
    if ctx.rank == 0:
        for rec, items in zip(records, warned, strict=True):
            rec["warnings"] = items
        _report_warnings(ctx, [(f"{rec['op']}, n = {rec['n']:,}", rec["warnings"]) for rec in records])
        doc = {
            **_environment(ctx, mpi),
            "git_commit": _provenance.git_commit(),
            "warmup": args.warmup,
            "repeat": args.repeat,
            "timing": "Barrier + MPI.Wtime around each phase after a stream sync; max over ranks; "
            "median and min over repetitions",
            "records": records,
        }
        try:  # checked before the benchmark, but the disk may fill up or the path change since
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(doc, indent=2) + "\n")
        except Exception as exc:  # agreed below
            error = exc
    mpi.agree(error, comm)
    if ctx.rank == 0:
        if args.json:
            _emit(ctx, json.dumps(doc, indent=2))
        else:
            width = max([5, *(len(rec["op"]) for rec in records)])
            lines = [f"{'op':<{width}} {'dtype':<8} {'n':>12} {'kernel ms':>10} {'GB/s':>8} {'allreduce us':>13}"]
            for rec in records:
                gbps = "-" if rec["kernel_gbps"] is None else f"{rec['kernel_gbps']:.1f}"
                lines.append(
                    f"{rec['op']:<{width}} {rec['dtype']:<8} {rec['n']:>12,} {rec['kernel_s_median'] * 1e3:>10.3f} "
                    f"{gbps:>8} {rec['allreduce_s_median'] * 1e6:>13.1f}"
                )
            lines.append(f"wrote {args.output} ({len(records)} records, {ctx.size} rank(s), {ctx.backend})")
            _emit(ctx, "\n".join(lines))
    return 0


# --------------------------------------------------------------------------------------------
# Entry point and error handling


def guarded(job, comm, mpi) -> int:
    """Run ``job()`` on every rank and turn exceptions into an exit status.

    An error that every rank knows about (raised by a collective agreement) is printed once,
    by rank 0, naming the failing rank(s); every rank returns the same status: 1, or 130 where
    some rank was interrupted, or 2 where every failure is a rank's bad command line. Any other
    exception is known to this rank only, while the others may be blocked in a collective: it is printed with
    this rank's number and the job is ended with ``MPI_Abort``. A KeyboardInterrupt counts as
    an error here (exit status 130), so that Ctrl-C on one rank ends the job too.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    try:
        return job()
    except BaseException as exc:  # KeyboardInterrupt on one rank too: the others must not wait
        failures = mpi.rank_failures(exc)
        if failures is not None:
            if rank == 0:
                print(f"multireduce: error: {mpi.describe_failures(failures, size)}", file=sys.stderr, flush=True)
            # Every rank exits with one status, as mpiexec combines the ranks' statuses with OR
            # (1 here and 130 or 2 on the failing rank gave 131 or 3): 130 where some rank was
            # interrupted, 2 where only command lines failed (an MPMD launch), else 1.
            messages = failures.values()
            if isinstance(exc, KeyboardInterrupt) or any(m.startswith("KeyboardInterrupt: ") for m in messages):
                return EXIT_INTERRUPTED
            if all(message.startswith(f"{UsageError.__name__}: ") for message in messages):
                return EXIT_USAGE
            return EXIT_ERROR
        if isinstance(exc, BrokenPipeError):
            # The reader of rank 0's output went away (``| head``): one line, no traceback,
            # and no second BrokenPipeError from the interpreter's last flush of stdout.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            print(f"multireduce: rank {rank} of {size}: standard output was closed; output stopped", file=sys.stderr)
        else:
            print(f"multireduce: rank {rank} of {size} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        status = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_ERROR
        if size > 1:
            comm.Abort(status)
        return status


def _env_size() -> int:
    # The process count that the launcher gives each process it starts, known before MPI
    # starts: mpiexec (Open MPI's, or MPICH's and Intel MPI's Hydra), or Slurm's srun, which
    # sets SLURM_STEP_NUM_TASKS in each task of a step (PMIx launches set neither of the
    # others). 1 otherwise. SLURM_NTASKS is also set in a batch script outside any step: not
    # used. Counting a launch that is not one costs only an MPI start; missing one left a
    # rank with a usage error out of the first agreement, and the others waited forever.
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 1


def _usage_error(exc: UsageError) -> int:
    """Report a bad command line (rank 0 prints it) and return exit status 2.

    Under a launcher with other processes, this rank first joins the command line's agreement
    (:func:`_setup`'s) with the error: ranks started with other, valid arguments (an MPMD
    launch, ``mpiexec -n 1 A : -n 1 B``) wait in it, and without this rank they waited
    forever. They raise the failure there (rank 0 prints it if its own arguments were valid).
    Rank 0 with a usage error of its own prints it, then the other ranks' failures whose
    message differs from its own (an MPMD launch whose other command lines are bad otherwise).
    """
    agreed = _join_first_agreement(exc)
    if _env_rank() == 0:
        print(exc, file=sys.stderr)
        if agreed is not None:
            failures, size = agreed
            others = {r: m for r, m in failures.items() if r != 0 and m != failures.get(0)}
            if others:
                from .mpi import describe_failures  # imported by the agreement already

                print(f"multireduce: error: {describe_failures(others, size)}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def _join_first_agreement(exc: UsageError) -> tuple[dict[int, str], int] | None:
    """Under a launcher with other processes, join :func:`_setup`'s first agreement with ``exc``.

    For a rank that runs no job (a usage error, ``--help``, ``--version``): without it, ranks
    of an MPMD launch that run one waited in that agreement forever. Returns the agreed
    failures and the rank count (None where there is no launcher or no MPI).
    """
    if _env_size() > 1:
        try:
            limit = _mpi_start_timeout()
        except UsageError:  # reported where this rank's command line is valid (main)
            limit = MPI_START_TIMEOUT
        try:
            mpi = _import_mpi(limit)
        except ImportError:  # no MPI here: every rank fails alike, and prints nothing more
            return None
        comm = mpi.MPI.COMM_WORLD
        try:
            _agree_command_line(comm, mpi, exc, 0, "")  # a failed rank's code is not read
        except BaseException as agreed:  # this rank's own UsageError, marked as agreed
            failures = mpi.rank_failures(agreed)
            if failures is None:
                raise
            return failures, comm.Get_size()
    return None


#: What a rank that prints help or a version tells the first agreement (:func:`main`).
_NO_JOB = "prints help or a version and runs no job"

#: Seconds that the command line waits for MPI to start (``MULTIREDUCE_MPI_START_TIMEOUT``).
MPI_START_TIMEOUT = 60.0


def _mpi_start_timeout() -> float:
    """``MULTIREDUCE_MPI_START_TIMEOUT`` in seconds (default :data:`MPI_START_TIMEOUT`).

    Raises
    ------
    UsageError
        For anything but a number from 0 to :data:`_ALARM_MAX` (what ``signal.alarm`` takes).
    """
    raw = os.environ.get("MULTIREDUCE_MPI_START_TIMEOUT", "").strip()
    try:
        limit = float(raw) if raw else MPI_START_TIMEOUT
    except ValueError:
        limit = math.nan
    if not (0 <= limit <= _ALARM_MAX):
        raise UsageError(
            f"multireduce: error: MULTIREDUCE_MPI_START_TIMEOUT={raw!r}: expected seconds, "
            f"a number from 0 to {_ALARM_MAX} (0 waits forever)"
        )
    return limit


#: The longest alarm ``signal.alarm`` takes (a C unsigned int on some systems, an int on others).
_ALARM_MAX = 2**31 - 1


def _import_mpi(limit: float):
    """:mod:`multireduce.mpi`, whose import starts MPI, ended by ``SIGALRM`` after ``limit`` seconds.

    MPI_Init waits for every process of the launch: where one failed before starting MPI (a
    crash, mpi4py missing in its environment), MPICH's Hydra, the ``mpiexec`` of the mpich
    wheel, left the others waiting in it forever. MPI_Init holds the GIL, so no Python code
    can run until it returns: the kernel's alarm ends this process instead (its default
    action), and the launcher then ends the job and reports "Alarm clock (signal 14)".
    ``limit`` is ``MULTIREDUCE_MPI_START_TIMEOUT`` (:func:`_mpi_start_timeout`); 0 waits
    forever.
    """
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()  # signals need it
    if limit == 0 or _env_size() == 1 or not hasattr(signal, "alarm") or not main_thread:
        from . import mpi

        return mpi
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    started = time.monotonic()
    pending = 0  # an alarm the caller had set: put back afterwards, less the time taken
    try:
        pending = signal.alarm(max(1, math.ceil(limit)))
        from . import mpi
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if pending:
            signal.alarm(max(1, pending - math.floor(time.monotonic() - started)))
    return mpi


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m multireduce`` and of the ``multireduce`` script.

    Returns the exit status (0 success, 1 error, 2 usage error, 3 check failed, 130 interrupted).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parse(argv)
    except UsageError as exc:
        return _usage_error(exc)
    except SystemExit as exc:  # --help and --version print and exit through argparse
        printed = f"python -m multireduce {' '.join(argv)} {_NO_JOB}"
        agreed = _join_first_agreement(UsageError(printed))
        if agreed is not None:
            failures, size = agreed
            if _env_rank() == 0 and (len(failures) < size or not all(m.endswith(_NO_JOB) for m in failures.values())):
                # Other ranks meant to run a job, or had a bad command line: they exit 2 and
                # print nothing (rank 0 reports an agreed failure), so rank 0 says why here.
                from .mpi import describe_failures  # imported by the agreement already

                print(f"multireduce: error: {describe_failures(failures, size)}", file=sys.stderr, flush=True)
        return int(exc.code or 0)
    try:
        limit = _mpi_start_timeout()
    except UsageError as exc:
        return _usage_error(exc)
    try:
        mpi = _import_mpi(limit)
    except ImportError as exc:  # mpi4py or its MPI library missing (multireduce.mpi names the extra)
        print(f"multireduce: python -m multireduce: {exc}", file=sys.stderr)
        return EXIT_ERROR
    comm = mpi.MPI.COMM_WORLD
    return guarded(lambda: args.func(args, comm, mpi), comm, mpi)
