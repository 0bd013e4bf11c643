"""Benchmark multireduce's full-reduction kernel against its peers, side by side in one run.

For every size n (default 2**10, 2**12, ..., 2**30), dtype (float32, float64, int32, float16)
and op (sum, max, min) this times, on the same device data in the same process:

``ours``
    ``multireduce.reduce(x, op)`` on a CuPy array: the public API, result left on the device.
``ours-acc32``
    float32 sums only: the private backend with a float32 accumulator,
    ``_backend.cupy.reduce_full(x, get_op("sum"), float32, float32)``. It prices the default
    float64 accumulation of float32 sums.
``cupy``
    ``cupy.sum`` / ``cupy.max`` / ``cupy.min`` (CUB, where CuPy's accelerators use it).
``torch``
    ``torch.sum`` / ``torch.amax`` / ``torch.amin`` on a zero-copy ``torch.as_tensor`` view of
    the same buffers, when torch imports and sees CUDA. torch and CuPy run on one stream.
``seed-tree``, ``seed-atomic``
    Sum only (float32, float64, int32, float16): the seed document's 256-thread shared-memory
    tree with one atomicAdd per block, and its one-atomicAdd-per-element kernel, both from
    ``scripts/seed_kernels.cu``. Each call zeroes the one-element output with a fill first, as
    the seed does. The per-element kernel is skipped (and recorded as skipped) above
    ``--atomic-max-n``. For max/min the seed peers are n/a and not recorded.

Method
------
Device time, not host time. One timed batch enqueues a one-thread *spin* kernel that waits on
the GPU's nanosecond clock, records the start event, enqueues ``inner`` back-to-back calls,
records the end event and synchronizes; time per call = elapsed / inner. The calls queue
behind the spin, so the host's launch overhead stays out of the device time as long as the
spin outlasts the enqueueing. The spin is sized from the enqueue time measured during the
warm-up batches (1.5x plus 200 us, at least ``--min-spin-us``); a batch whose enqueueing took
more than 80% of the spin is discarded, the spin doubled and the batch repeated, at most 3
times per measurement (counted in ``spin_overruns``; a call that synchronizes the host would
overrun every time, and its time then includes host time). ``inner`` is chosen so that a
batch holds about ``--target-batch-us`` of device work, at most ``--max-inner`` calls (20 for
small n, 1-3 at 4 GiB). Reported: the median, p10 and p90 over ``--repeat`` batches after ``--warmup`` batches. For slow
configurations both are cut so that one measurement takes about ``--budget`` seconds, but
never below ``--min-repeat`` batches; each record says how many batches it used.

L2 cache. With ``--rotate`` (default) inputs of at most ``--rotate-max-mib`` MiB are spread over
enough distinct buffers that one cycle through them reads more than twice the L2 size, and
consecutive calls (of all peers in turn) walk through the buffers, so that no call finds its
input in L2. Larger inputs do not fit in L2. Records say whether rotation was used.

Rates. GB/s = n * itemsize / time, bytes read only, 1 GB = 1e9 B. Every rate is also given as
a fraction of the device-to-device copy bandwidth measured at the start of the run: a copy of
a ``--copy-gib`` (4) GiB buffer, bytes read plus bytes written, the better of
``cudaMemcpyAsync`` and ``dst[...] = src``.

Data and correctness
--------------------
Values are made on the device from uniform random integers k (``cupy.random``) so that every
value is exact in its dtype and the exact sum, max and min follow from integer reductions of
k: float32 and float64 ``k * 2**-24`` with k in [0, 2**24), i.e. uniform in [0, 1); float16
``(2k + 1) * 2**-11`` with k in [-1024, 1024), odd multiples of 2**-11 in (-1, 1) with mean
exactly zero, so that a sum of 2**30 of them (standard deviation about 19000) stays below
float16's largest value 65504 except in a ~3.5-sigma draw (and if it does not, the exact sum
rounds to inf as well and the check still holds); int32 integers in [-1024, 1023].

Each peer's result on the first buffer is checked against the exact value: float32 and
float64 sums within a relative error of 1e-6; float16 sums within 1 float16 ulp of the exact
sum rounded to float16 (what a float32-accumulated sum rounded once to float16 gives);
integer sums and every max/min exactly. A miss by ``ours`` prints MISMATCH and sets the exit
status to 1. A miss by any other peer is marked ``!`` in the table and recorded, nothing more.

Checks (same run)
-----------------
accuracy
    Sum of 2**``--accuracy-power`` (30) float32 values ``k * 2**-24`` against the exact sum
    (a Fraction): relative errors of ours, cupy.sum and torch.sum. Target: ours <= 1e-7.
determinism
    100 ``multireduce.sum`` calls on a float32 view of 2**24 + 3 elements starting 12 bytes
    into a larger array (so that the kernel's unaligned head and its tail both run), and 100
    ``multireduce.max`` calls on such data with NaNs: all results must have identical bits.
python overhead
    Median wall time per call of ``float(multireduce.sum(x))`` and ``float(cupy.sum(x))``
    (and torch) for 1024 float32 elements, in 20 interleaved batches of 100 calls after 200
    warm-up calls each. Target: ours <= cupy.

Output
------
A table with one row per (n, dtype, op), a TARGETS block with PASS/MISS for each target, and
a JSON file, by default ``bench/results/kernel_<gpu-name-slug>_<short-commit>.json`` (``--out``),
holding ``meta``, ``records`` (one per configuration and peer, skipped ones included with their
reason), ``targets`` and ``checks``. The exit status is 1 if ours gave a wrong result, a
determinism check failed, or a measurement, the copy or a check raised; a missed performance
or accuracy target does not change it.

Runtime
-------
Estimated for one H200 and the default options: about 470 measurements of 40-130 ms each
(~40 s), the slow seed kernels and any slow CuPy fallback capped by ``--budget`` (~20 s),
data generation and buffer views (~10 s), the copy and the checks (~5 s), imports and
first-use NVRTC compiles (~5 s with CuPy's kernel cache warm, ~40 s cold): about 1.5 minutes,
2.5 at worst, under the 4-minute limit. ``--quick`` takes about 15 s (45 s with a cold cache).

Examples
--------
    python scripts/bench_kernel.py
    python scripts/bench_kernel.py --quick
    python scripts/bench_kernel.py --sizes 20,24,30 --dtypes float32,float16 --ops sum --repeat 50
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import re
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SEED_SOURCE = Path(__file__).resolve().with_name("seed_kernels.cu")
RESULTS_DIR = REPO / "bench" / "results"

DEFAULT_POWERS = (10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
QUICK_POWERS = (10, 20, 24, 28)
DTYPE_NAMES = ("float32", "float64", "int32", "float16")
OP_NAMES = ("sum", "max", "min")
QUICK_REPEAT = 10

MIB = 1 << 20
GIB = 1 << 30
NA = "n/a"  # a peer that does not apply to a configuration; not recorded

SEED_BLOCK = 256
SEED_CTYPES = {"float32": "float", "float64": "double", "int32": "int", "float16": "__half"}
SEED_TEMPLATES = {"seed-tree": "seed_tree_sum_kernel", "seed-atomic": "seed_atomic_sum_kernel"}

PEER_ORDER = ("ours", "ours-acc32", "cupy", "torch", "seed-tree", "seed-atomic")
EXTERNAL_PEERS = ("cupy", "torch", "seed-tree", "seed-atomic")  # "best peer" is the fastest of these
FRAMEWORK_PEERS = ("cupy", "torch")  # the 4 GiB target compares against these

SPIN_MARGIN = 0.8  # a batch whose enqueueing took longer than this fraction of the spin is redone
MAX_OVERRUNS = 3  # (with a doubled spin) this many times per measurement; later batches are kept
MAX_SPIN_US = 50_000.0
FLOAT_SUM_RTOL = 1e-6

TARGET_GBPS_4GIB = 4500.0
TARGET_US_2P24 = 24.0
TARGET_US_SMALL = 8.0
TARGET_ACC_RATIO = 0.95
TARGET_ACCURACY = 1e-7
DETERMINISM_RUNS = 100

say = functools.partial(print, flush=True)


# ---------------------------------------------------------------------------------------------
# Command line


def _name_list(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(t for t in re.split(r"[,\s]+", text.strip()) if t)
        unknown = [t for t in names if t not in allowed]
        if not names or unknown:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(allowed)}; got {text!r}")
        return names

    return parse


def _powers(text: str) -> tuple[int, ...]:
    try:
        powers = tuple(int(t) for t in re.split(r"[,\s]+", text.strip()) if t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated exponents p of n = 2**p; got {text!r}") from None
    if not powers or any(not 0 <= p <= 33 for p in powers):
        raise argparse.ArgumentTypeError(f"exponents must lie in 0..33; got {text!r}")
    return powers


def _count(text: str) -> int:
    match = re.fullmatch(r"\s*2\s*(?:\^|\*\*)\s*(\d+)\s*", text)
    try:
        return 1 << int(match.group(1)) if match else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 2^p; got {text!r}") from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark multireduce's reduction kernel against cupy, torch and the seed kernels.",
        epilog="See the module docstring for the method.",
    )
    parser.add_argument(
        "--sizes",
        type=_powers,
        nargs="+",
        default=[DEFAULT_POWERS],
        metavar="P,P,...",
        help="exponents p of the sizes n = 2**p (default: 10,12,...,30)",
    )
    parser.add_argument(
        "--dtypes",
        type=_name_list(DTYPE_NAMES),
        nargs="+",
        default=[DTYPE_NAMES],
        metavar="D,D,...",
        help="dtypes, a subset of float32,float64,int32,float16 (default: all)",
    )
    parser.add_argument(
        "--ops",
        type=_name_list(OP_NAMES),
        nargs="+",
        default=[OP_NAMES],
        metavar="OP,OP,...",
        help="ops, a subset of sum,max,min (default: all)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches per measurement (default: 5)")
    parser.add_argument("--repeat", type=int, default=30, help="timed batches per measurement (default: 30)")
    parser.add_argument(
        "--min-repeat", type=int, default=3, help="fewest timed batches when --budget cuts --repeat (default: 3)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=1.0,
        help="seconds one measurement should take at most, above --min-repeat (default: 1.0)",
    )
    parser.add_argument("--max-inner", type=int, default=20, help="most calls per timed batch (default: 20)")
    parser.add_argument(
        "--target-batch-us",
        type=float,
        default=2000.0,
        help="device work per timed batch that sets the calls per batch (default: 2000)",
    )
    parser.add_argument(
        "--min-spin-us", type=float, default=1000.0, help="shortest spin before a timed batch, in us (default: 1000)"
    )
    parser.add_argument(
        "--rotate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rotate through buffers totalling > 2x L2 for inputs <= --rotate-max-mib (default: on)",
    )
    parser.add_argument(
        "--rotate-max-mib", type=float, default=256.0, help="largest input, in MiB, that is rotated (default: 256)"
    )
    parser.add_argument(
        "--atomic-max-n",
        type=_count,
        default=1 << 24,
        help="largest n for the atomicAdd-per-element seed kernel, e.g. 2^24 (default: 2^24)",
    )
    parser.add_argument(
        "--copy-gib",
        type=float,
        default=4.0,
        help="size of the buffer copied for the copy bandwidth, in GiB (default: 4)",
    )
    parser.add_argument(
        "--accuracy-power", type=int, default=30, help="the accuracy check sums 2**p float32 values (default: 30)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--variants",
        default="",
        metavar="BxU,...",
        help="extra launch configurations of our kernel, e.g. 256x8,512x4p (threads x unroll; load suffix "
        "p: L2 prefetch, "
        "n: L1 no-allocate, e: __ldcs streaming)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: sizes 2^10,2^20,2^24,2^28, float32 only, --repeat 10 (overrides those)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON output path (default: bench/results/kernel_<gpu>_<commit>.json)"
    )
    args = parser.parse_args(argv)
    for name in ("sizes", "dtypes", "ops"):  # "--sizes 10,12 14" -> (10, 12, 14), in order, without repeats
        setattr(args, name, tuple(dict.fromkeys(item for group in getattr(args, name) for item in group)))
    if args.quick:
        args.sizes, args.dtypes, args.repeat = QUICK_POWERS, ("float32",), QUICK_REPEAT
    if args.repeat < 1 or args.min_repeat < 1 or args.warmup < 0 or args.max_inner < 1:
        parser.error("--repeat, --min-repeat and --max-inner must be >= 1, --warmup >= 0")
    return args


# ---------------------------------------------------------------------------------------------
# Environment: CuPy, torch, the device, git


def import_torch(cp: Any) -> tuple[Any, dict]:
    """torch if it imports and sees CUDA, else None; and what happened, for meta.

    torch must run on the stream that CuPy (and so multireduce, the seed kernels and the timing
    events) uses. Both use the legacy default stream unless configured otherwise; if they
    differ, CuPy is moved onto torch's current stream.
    """
    try:
        import torch
    except Exception as exc:  # ImportError, or OSError from a broken CUDA library: recorded, not hidden
        return None, {"available": False, "reason": f"import torch failed: {type(exc).__name__}: {exc}"}
    info: dict[str, Any] = {"version": torch.__version__}
    if not torch.cuda.is_available():
        return None, info | {"available": False, "reason": "torch.cuda.is_available() is False"}
    torch_stream = torch.cuda.current_stream().cuda_stream
    cupy_stream = cp.cuda.get_current_stream().ptr
    info |= {"available": True, "torch_stream": torch_stream, "cupy_stream": cupy_stream}
    if torch_stream != cupy_stream:
        stream = cp.cuda.Stream.null if torch_stream == 0 else cp.cuda.ExternalStream(torch_stream)
        stream.use()
        _KEEP_ALIVE.append(stream)
        info["stream_note"] = f"cupy moved from stream {cupy_stream:#x} to torch's current stream {torch_stream:#x}"
    return torch, info


_KEEP_ALIVE: list[Any] = []


def device_info(cp: Any) -> dict:
    device = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(device.id)
    name = props["name"]
    if isinstance(name, bytes):
        name = name.decode("utf-8", errors="replace")
    return {
        "id": device.id,
        "name": name.strip("\x00 "),
        "sm_count": props["multiProcessorCount"],
        "l2_bytes": props["l2CacheSize"],
        "total_mem_bytes": props["totalGlobalMem"],
        "compute_capability": f"{props['major']}.{props['minor']}",
    }


def cupy_accelerators() -> dict:
    # Private CuPy API, read only to record whether cupy.sum went through CUB (1 = cub, 2 = cutensor).
    env = os.environ.get("CUPY_ACCELERATORS")
    try:
        from cupy._core import _accelerator
    except ImportError as exc:
        return {"env": env, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "env": env,
        "routine": list(_accelerator.get_routine_accelerators()),
        "reduction": list(_accelerator.get_reduction_accelerators()),
    }


def release_memory(cp: Any) -> None:
    cp.cuda.get_current_stream().synchronize()
    cp.get_default_memory_pool().free_all_blocks()


def report_exception(what: str, exc: BaseException) -> str:
    """Print the traceback to stderr and return a one-line reason for the record."""
    say(f"ERROR while {what}: {type(exc).__name__}: {exc}", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------------
# Timing


class DeviceTimer:
    """Device time of a batch of calls queued behind a spin kernel; see the module docstring."""

    def __init__(self, cp: Any, spin_kernel: Any):
        self.cp = cp
        self.spin_kernel = spin_kernel
        self.start = cp.cuda.Event()
        self.end = cp.cuda.Event()
        self.spin_scale = 1.0  # measured / requested spin duration, at most 1

    def spin(self, us: float) -> None:
        ns = int(us * 1000)
        # The cycle bound (10 cycles per ns, 5x the duration at 2 GHz) only matters if
        # %globaltimer does not advance.
        self.spin_kernel((1,), (1,), (np.int64(ns), np.int64(10 * ns)))

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def calibrate(self, us: float = 1000.0) -> dict:
        """Time one spin of ``us`` with events, so that a spin that ends early is noticed."""
        self.spin(us)
        self.synchronize()
        self.start.record()
        self.spin(us)
        self.end.record()
        self.end.synchronize()
        measured = self.cp.cuda.get_elapsed_time(self.start, self.end) * 1e3
        self.spin_scale = min(1.0, measured / us)
        ok = 0.9 * us <= measured <= 3.0 * us
        if not ok:
            say(f"WARNING: a {us:.0f} us spin took {measured:.0f} us; overrun detection is scaled by it")
        return {"requested_us": us, "measured_us": measured, "ok": ok}

    def batch(self, run_once: Callable[[], Any], inner: int, spin_us: float) -> tuple[float, float]:
        """One timed batch: (device us per call, host us from the spin launch to the end event)."""
        t0 = time.perf_counter()
        self.spin(spin_us)
        self.start.record()
        for _ in range(inner):
            run_once()
        self.end.record()
        enqueue_us = (time.perf_counter() - t0) * 1e6
        self.end.synchronize()
        return self.cp.cuda.get_elapsed_time(self.start, self.end) * 1e3 / inner, enqueue_us


@dataclass
class Timing:
    times_us: list[float]
    inner: int
    warmup: int
    spin_us: float
    spin_overruns: int

    def summary(self) -> dict:
        p10, median, p90 = np.percentile(self.times_us, [10, 50, 90])
        return {
            "median_us": float(median),
            "p10_us": float(p10),
            "p90_us": float(p90),
            "inner": self.inner,
            "repeat": len(self.times_us),
            "warmup": self.warmup,
            "spin_us": self.spin_us,
            "spin_overruns": self.spin_overruns,
        }


def spin_needed(enqueue_us: float, opts: argparse.Namespace) -> float:
    return min(MAX_SPIN_US, max(opts.min_spin_us, 1.5 * enqueue_us + 200.0))


def measure(timer: DeviceTimer, run_once: Callable[[], Any], opts: argparse.Namespace) -> Timing:
    """Median device time of ``run_once()`` (one call on the next input buffer)."""
    run_once()  # first use: NVRTC compile, module load, workspace allocation
    timer.synchronize()
    # Twice, keeping the faster: the first of these calls may still pay for a lazy load.
    est_us, enqueue_us = min(timer.batch(run_once, 1, opts.min_spin_us) for _ in range(2))
    est_us = max(est_us, 0.5)
    inner = max(1, min(opts.max_inner, int(opts.target_batch_us / est_us)))
    spin_us = spin_needed(enqueue_us * inner, opts)  # generous: counts the spin launch inner times
    batch_s = (spin_us + est_us * inner) * 1e-6
    warmup = min(opts.warmup, int(0.25 * opts.budget / batch_s))
    repeat = max(opts.min_repeat, min(opts.repeat, int(opts.budget / batch_s)))
    if warmup:
        spin_us = spin_needed(max(timer.batch(run_once, inner, spin_us)[1] for _ in range(warmup)), opts)
    times: list[float] = []
    overruns = 0
    while len(times) < repeat:
        per_call_us, enqueue_us = timer.batch(run_once, inner, spin_us)
        if enqueue_us > SPIN_MARGIN * spin_us * timer.spin_scale and overruns < MAX_OVERRUNS:
            overruns += 1
            spin_us = min(2.0 * spin_us, MAX_SPIN_US)
            continue
        times.append(per_call_us)
    return Timing(times, inner, warmup, spin_us, overruns)


# ---------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class ValueSpec:
    """x = (a * k + b) * 2**-e for uniform random integers k in [low, high); exact in the dtype."""

    low: int
    high: int
    a: int = 1
    b: int = 0
    e: int = 0

    def exact(self, k_value: int, count: int = 1) -> Fraction:
        """The exact value of ``count`` elements whose k add up to ``k_value``."""
        return Fraction(self.a * k_value + self.b * count, 1 << self.e)


VALUE_SPECS = {
    "float32": ValueSpec(0, 1 << 24, e=24),  # uniform [0, 1) on a 2**-24 grid
    "float64": ValueSpec(0, 1 << 24, e=24),
    "float16": ValueSpec(-1024, 1024, a=2, b=1, e=11),  # odd multiples of 2**-11 in (-1, 1), mean 0
    "int32": ValueSpec(-1024, 1024),  # [-1024, 1023]; power-of-two ranges need no rejection sampling
}


@dataclass
class Dataset:
    """``n_buffers`` inputs of n elements, back to back in ``pool``, and exact results of the first."""

    dtype: np.dtype
    n: int
    pool: Any
    n_buffers: int
    refs: dict[str, Fraction]
    views: list = field(default_factory=list)
    cursor: int = 0
    _torch_views: Sequence | None = None

    @property
    def nbytes(self) -> int:
        return self.n * self.dtype.itemsize

    @property
    def rotated(self) -> bool:
        return self.n_buffers > 1

    def next_index(self) -> int:
        i = self.cursor
        self.cursor = i + 1 if i + 1 < self.n_buffers else 0
        return i

    def torch_views(self, torch: Any) -> Sequence:
        if self._torch_views is None:
            whole = torch.as_tensor(self.pool, device="cuda")  # zero copy, through __cuda_array_interface__
            self._torch_views = whole.view(self.n_buffers, self.n).unbind(0)
        return self._torch_views


def buffers_for(nbytes: int, l2_bytes: int, opts: argparse.Namespace) -> int:
    if not opts.rotate or nbytes > opts.rotate_max_mib * MIB:
        return 1
    return 2 * l2_bytes // nbytes + 1  # so that one cycle reads more than 2x L2


def random_k(cp: Any, spec: ValueSpec, size: int, seed: int) -> Any:
    # np.uint64: CuPy before 13.3 rejects a Python int seed under NumPy 2 (cupy#8392).
    return cp.random.RandomState(np.uint64(seed)).randint(spec.low, spec.high, size=size, dtype=np.int32)


def values_from_k(k: Any, spec: ValueSpec, dtype: np.dtype) -> Any:
    if dtype.kind == "i":
        assert (spec.a, spec.b, spec.e) == (1, 0, 0) and dtype == k.dtype
        return k
    x = k.astype(dtype)
    if spec.a != 1:
        x *= dtype.type(spec.a)
    if spec.b:
        x += dtype.type(spec.b)
    x *= dtype.type(2.0**-spec.e)  # a power of two: exact
    return x


def exact_refs(cp: Any, k_first: Any, spec: ValueSpec) -> dict[str, Fraction]:
    return {
        "sum": spec.exact(int(cp.sum(k_first, dtype=cp.int64)), k_first.size),
        "max": spec.exact(int(k_first.max())),
        "min": spec.exact(int(k_first.min())),
    }


def make_dataset(cp: Any, dtype_name: str, power: int, l2_bytes: int, opts: argparse.Namespace) -> Dataset:
    dtype = np.dtype(dtype_name)
    spec = VALUE_SPECS[dtype_name]
    n = 1 << power
    n_buffers = buffers_for(n * dtype.itemsize, l2_bytes, opts)
    k = random_k(cp, spec, n * n_buffers, seed=opts.seed * 10_000 + power * 10 + DTYPE_NAMES.index(dtype_name))
    refs = exact_refs(cp, k[:n], spec)
    pool = values_from_k(k, spec, dtype)
    del k
    views = [pool[i * n : (i + 1) * n] for i in range(n_buffers)]
    return Dataset(dtype, n, pool, n_buffers, refs, views)


# ---------------------------------------------------------------------------------------------
# Correctness


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def relative_error(value: Any, exact: Fraction) -> float:
    if not _finite(value):
        return math.inf
    diff = abs(Fraction(value) - exact)
    return float(diff / abs(exact)) if exact else float(diff)


def check_value(value: Any, exact: Fraction, dtype: np.dtype, op: str) -> dict:
    """Compare one result with the exact value; the tolerances are in the module docstring."""
    result: dict[str, Any] = {"value": value, "exact": float(exact), "rel_err": relative_error(value, exact)}
    if op != "sum" or dtype.kind == "i":
        result |= {"ok": _finite(value) and Fraction(value) == exact, "tolerance": "exact"}
    elif dtype == np.float16:
        result |= half_ulp_check(value, exact)
    else:
        result |= {"ok": result["rel_err"] <= FLOAT_SUM_RTOL, "tolerance": f"rel_err <= {FLOAT_SUM_RTOL:g}"}
    return result


def half_ulp_check(value: float, exact: Fraction) -> dict:
    with np.errstate(over="ignore"):
        rounded = np.float16(float(exact))  # +-inf when the exact sum is beyond float16's range
    if not np.isfinite(rounded):
        return {"ok": value == float(rounded), "ulp_err": None, "tolerance": "exact sum overflows float16"}
    ulp = float(np.spacing(np.abs(rounded)))
    ulps = abs(value - float(rounded)) / ulp if _finite(value) else math.inf
    return {"ok": ulps <= 1.0, "ulp_err": ulps, "tolerance": "<= 1 float16 ulp of the rounded exact sum"}


# ---------------------------------------------------------------------------------------------
# Peers


class Peer:
    """One implementation under test. ``bind`` returns the input buffers and the call on one."""

    name = ""

    def skip_reason(self, dtype: str, op: str, n: int) -> tuple[str, str] | None:
        """None if the peer runs this configuration, else (status, reason); status NA is not recorded."""
        return None

    def bind(self, ds: Dataset, op: str) -> tuple[Sequence, Callable[[Any], Any]]:
        raise NotImplementedError


class Ours(Peer):
    name = "ours"

    def __init__(self, mr: Any):
        self.mr = mr

    def bind(self, ds, op):
        reduce = self.mr.reduce
        return ds.views, lambda a: reduce(a, op)


class OursAcc32(Peer):
    name = "ours-acc32"

    def __init__(self, mr: Any, backend: Any):
        self.mr = mr
        self.backend = backend

    def skip_reason(self, dtype, op, n):
        return None if (dtype, op) == ("float32", "sum") else (NA, "float32 sum only")

    def bind(self, ds, op):
        sum_op, f32, reduce_full = self.mr.get_op("sum"), np.dtype(np.float32), self.backend.reduce_full
        return ds.views, lambda a: reduce_full(a, sum_op, f32, f32)


class OursVariant(Peer):
    """Our kernel with another launch configuration (threads per block x loads in flight)."""

    def __init__(self, mr: Any, backend: Any, block: int, unroll: int, load: int, grid: int | None = None):
        self.mr, self.backend, self.block, self.unroll, self.load = mr, backend, block, unroll, load
        self.grid = grid
        self.name = f"ours-{block}x{unroll}" + ("", "p", "n", "e")[load & 3] + (f"t{load >> 2}" if load >> 2 else "")
        self.name += "" if grid is None else f"g{grid}"

    def bind(self, ds, op):
        o = self.mr.get_op(op)
        result = o.result_dtype(ds.views[0].dtype)
        acc = o.accumulator_dtype(result)
        reduce_full, block, unroll, load, grid = (
            self.backend.reduce_full,
            self.block,
            self.unroll,
            self.load,
            self.grid,
        )
        return ds.views, lambda a: reduce_full(a, o, acc, result, block=block, unroll=unroll, load=load, grid=grid)


class CupyPeer(Peer):
    name = "cupy"

    def __init__(self, cp: Any):
        self.cp = cp

    def bind(self, ds, op):
        return ds.views, {"sum": self.cp.sum, "max": self.cp.max, "min": self.cp.min}[op]


class TorchPeer(Peer):
    name = "torch"

    def __init__(self, torch: Any, reason: str):
        self.torch = torch
        self.reason = reason

    def skip_reason(self, dtype, op, n):
        return None if self.torch is not None else ("unavailable", self.reason)

    def bind(self, ds, op):
        torch = self.torch
        return ds.torch_views(torch), {"sum": torch.sum, "max": torch.amax, "min": torch.amin}[op]


class SeedPeer(Peer):
    """A seed kernel: zero the one-element output with a fill, then launch one thread per element."""

    def __init__(self, cp: Any, module: Any, name: str, max_n: int | None):
        self.cp = cp
        self.module = module
        self.name = name
        self.template = SEED_TEMPLATES[name]
        self.max_n = max_n

    def skip_reason(self, dtype, op, n):
        if op != "sum":
            return NA, "the seed kernels are sum only"
        if dtype not in SEED_CTYPES:
            return NA, f"the seed kernels are not instantiated for {dtype}"
        if n >= 1 << 31:
            return "skipped", "the seed kernels index with int, so n must be < 2**31"
        if self.max_n is not None and n > self.max_n:
            return "skipped", (
                f"n > --atomic-max-n = {self.max_n}: one atomicAdd per element "
                "(about 30 ms at 2**24 and 0.5 s at 2**28 for float32)"
            )
        return None

    def bind(self, ds, op):
        kernel = self.module.get_function(seed_name(self.template, ds.dtype.name))
        out = self.cp.zeros(1, dtype=ds.dtype)
        grid, block, n32 = (-(-ds.n // SEED_BLOCK),), (SEED_BLOCK,), np.int32(ds.n)

        def call(a: Any) -> Any:
            out.fill(0)
            kernel(grid, block, (a, out, n32))
            return out

        return ds.views, call


def seed_name(template: str, dtype_name: str) -> str:
    return f"{template}<{SEED_CTYPES[dtype_name]}>"


def compile_seed_module(cp: Any) -> Any:
    names = [seed_name(t, d) for t in SEED_TEMPLATES.values() for d in SEED_CTYPES]
    return cp.RawModule(code=SEED_SOURCE.read_text(), options=("--std=c++17",), name_expressions=names)


def make_peers(cp, mr, backend, torch, torch_info, module, opts) -> list[Peer]:
    peers = [
        Ours(mr),
        OursAcc32(mr, backend),
        CupyPeer(cp),
        TorchPeer(torch, torch_info.get("reason", "")),
        SeedPeer(cp, module, "seed-tree", None),
        SeedPeer(cp, module, "seed-atomic", opts.atomic_max_n),
    ]
    assert tuple(p.name for p in peers) == PEER_ORDER
    for variant in filter(None, opts.variants.split(",")):
        # Suffixes: "p" the L2-prefetch load policy (LOAD 1), "n" L1::no_allocate alone (2),
        # "e" cache-streaming __ldcs, evict first (3); none: __ldg (0). See load16 in kernels/multireduce/reduce.cuh.
        variant = variant.lower()
        tiling, grid = 0, None
        if "g" in variant:  # "...gN": a grid of N blocks; g0: one block per tile
            variant, grid = variant.split("g")[0], int(variant.split("g")[1])
        if "t" in variant:  # "...tK": tiles of threads x unroll << (K - 1) vectors per block
            variant, tiling = variant.split("t")[0], int(variant.split("t")[1])
        load = {"p": 1, "n": 2, "e": 3}.get(variant[-1], 0) | (tiling << 2)
        block, unroll = (int(v) for v in variant.rstrip("pne").split("x"))
        peers.insert(1, OursVariant(mr, backend, block, unroll, load, grid))
    return peers


# ---------------------------------------------------------------------------------------------
# The sweep


def config_record(peer: Peer, dtype_name: str, n: int, op: str) -> dict:
    return {"peer": peer.name, "dtype": dtype_name, "n": n, "log2_n": n.bit_length() - 1, "op": op}


def run_peer(peer, ds, op, timer, opts, copy_gbps) -> tuple[dict, dict | None]:
    """Measure and check one peer on one configuration: (table cell, record or None)."""
    base = config_record(peer, ds.dtype.name, ds.n, op)
    skip = peer.skip_reason(ds.dtype.name, op, ds.n)
    if skip is not None:
        status, reason = skip
        return {"status": status}, None if status == NA else base | {"status": status, "reason": reason}
    try:
        args, call = peer.bind(ds, op)
        timing = measure(timer, lambda: call(args[ds.next_index()]), opts)
        check = check_value(call(args[0]).item(), ds.refs[op], ds.dtype, op)  # buffer 0 has the exact refs
    except Exception as exc:  # recorded, printed with its traceback, and counted in the exit status
        reason = report_exception(f"measuring {peer.name} {ds.dtype.name} n={ds.n} {op}", exc)
        return {"status": "error"}, base | {"status": "error", "reason": reason}
    summary = timing.summary()
    gbps = ds.nbytes / (summary["median_us"] * 1e3)
    record = (
        base
        | summary
        | {
            "status": "ok",
            "gbps": gbps,
            "frac_of_copy": gbps / copy_gbps if copy_gbps else None,
            "bytes_read": ds.nbytes,
            "rotated": ds.rotated,
            "n_buffers": ds.n_buffers,
            "repeat_requested": opts.repeat,
            "check": check,
        }
    )
    return {"status": "ok", "us": summary["median_us"], "gbps": gbps, "ok": check["ok"]}, record


def dataset_error_records(peers, dtype_name, n, opts, reason) -> list[dict]:
    records = []
    for op in opts.ops:
        for peer in peers:
            skip = peer.skip_reason(dtype_name, op, n)
            if skip is None or skip[0] != NA:
                records.append(config_record(peer, dtype_name, n, op) | {"status": "error", "reason": reason})
    return records


def run_sweep(cp, peers, timer, opts, l2_bytes, copy_gbps, save: Callable[[list[dict]], None]) -> list[dict]:
    """Every (dtype, size, op, peer); ``save(records)`` runs after each size, so that a run
    cut short still leaves its JSON."""
    records: list[dict] = []
    print_legend(peers)
    print_header(peers)
    for dtype_name in opts.dtypes:
        for power in opts.sizes:
            try:
                ds = make_dataset(cp, dtype_name, power, l2_bytes, opts)
            except Exception as exc:  # e.g. out of memory: recorded for every peer, and the run goes on
                reason = report_exception(f"generating {dtype_name} n=2**{power}", exc)
                records += dataset_error_records(peers, dtype_name, 1 << power, opts, f"dataset: {reason}")
                release_memory(cp)
                continue
            for op in opts.ops:
                cells = {}
                for peer in peers:
                    cells[peer.name], record = run_peer(peer, ds, op, timer, opts, copy_gbps)
                    if record is not None:
                        records.append(record)
                say(format_row(ds, op, cells, copy_gbps))
            del ds
            release_memory(cp)
            save(records)
    return records


# ---------------------------------------------------------------------------------------------
# The table

CELL = 16


def print_legend(peers: Sequence[Peer]) -> None:
    say(
        "\nus = median device time per call; GB/s = n * itemsize / time (bytes read, 1 GB = 1e9 B).\n"
        "ours/best = ours' rate / the best rate of " + ", ".join(EXTERNAL_PEERS) + " (> 1: ours is faster);\n"
        "ours/copy = ours' rate as a fraction of the device-to-device copy bandwidth (read + write).\n"
        "ours-acc32 = ours with a float32 accumulator (float32 sum only).\n"
        "n/a = does not apply, not recorded (seed-tree and seed-atomic are sum only); skip = skipped and\n"
        "recorded with the reason (seed-atomic above --atomic-max-n); unavail = torch is unavailable;\n"
        "! after a cell = that peer's result is outside the correctness tolerance (recorded; fatal only for ours)."
    )


def print_header(peers: Sequence[Peer]) -> None:
    names = "".join(f"{p.name:>{CELL - 1}} " for p in peers)
    units = "".join(f"{'us':>8} {'GB/s':>6} " for _ in peers)
    say(f"\n{'n':>5} {'dtype':>7} {'op':>3} {names}{'ours/best':>9} {'ours/copy':>9}  check")
    say(f"{'':>17} {units}")


def format_cell(cell: dict) -> str:
    status = cell["status"]
    if status != "ok":
        text = {"unavailable": "unavail", "error": "ERROR", "skipped": "skip"}.get(status, status)
        return f"{text:>{CELL - 1}} "
    return f"{cell['us']:8.1f} {cell['gbps']:6.0f}{' ' if cell['ok'] else '!'}"


def format_row(ds: Dataset, op: str, cells: dict[str, dict], copy_gbps: float | None) -> str:
    ours = cells["ours"]
    peers = [cells[name] for name in EXTERNAL_PEERS if cells.get(name, {}).get("status") == "ok"]
    ratio = frac = "-"
    if ours["status"] == "ok" and peers:
        ratio = f"{min(c['us'] for c in peers) / ours['us']:.2f}x"
    if ours["status"] == "ok" and copy_gbps:
        frac = f"{ours['gbps'] / copy_gbps:.0%}"
    check = {"ok": "ok" if ours.get("ok") else "MISMATCH"}.get(ours["status"], ours["status"].upper())
    size = f"2^{ds.n.bit_length() - 1}"
    body = "".join(format_cell(cell) for cell in cells.values())
    return f"{size:>5} {ds.dtype.name:>7} {op:>3} {body}{ratio:>9} {frac:>9}  {check}"


# ---------------------------------------------------------------------------------------------
# Copy bandwidth


def measure_copy(cp: Any, timer: DeviceTimer, opts: argparse.Namespace) -> dict:
    """Device-to-device copy of a ``--copy-gib`` buffer: GB/s counting bytes read + written."""
    nbytes = int(opts.copy_gib * GIB) // 16 * 16
    src = cp.arange(nbytes // 4, dtype=cp.uint32)
    dst = cp.empty_like(src)
    stream = cp.cuda.get_current_stream().ptr
    kind = cp.cuda.runtime.memcpyDeviceToDevice

    def memcpy() -> None:
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, kind, stream)

    def assign() -> None:
        dst[...] = src

    result: dict[str, Any] = {"bytes_copied": nbytes, "bytes_counted": 2 * nbytes}
    for method, fn in (("memcpyAsync", memcpy), ("assign", assign)):
        summary = measure(timer, fn, opts).summary()
        result[method] = summary | {"gbps": 2 * nbytes / (summary["median_us"] * 1e3)}
    if not bool((dst == src).all()):
        raise RuntimeError("the device-to-device copy produced a wrong result")
    best = max(("memcpyAsync", "assign"), key=lambda m: result[m]["gbps"])
    return result | {"gbps": result[best]["gbps"], "method": best}  # the caller frees the buffers


# ---------------------------------------------------------------------------------------------
# Checks


def check_accuracy(cp, mr, torch, opts) -> dict:
    """Relative error of a 2**p float32 sum against the exact sum (values k * 2**-24, exact)."""
    n = 1 << opts.accuracy_power
    spec = VALUE_SPECS["float32"]
    k = random_k(cp, spec, n, seed=opts.seed * 10_000 + 7)
    exact = spec.exact(int(cp.sum(k, dtype=cp.int64)), n)
    x = values_from_k(k, spec, np.dtype(np.float32))
    del k
    values = {"ours": mr.sum(x).item(), "cupy": cp.sum(x).item()}
    if torch is not None:
        values["torch"] = torch.sum(torch.as_tensor(x, device="cuda")).item()
    del x
    release_memory(cp)
    rounded = float(np.float32(float(exact)))  # the correctly rounded float32 sum
    result: dict[str, Any] = {"n": n, "exact": float(exact), "correctly_rounded": rounded}
    for name, value in values.items():
        result[name] = {"value": value, "rel_err": relative_error(value, exact), "correctly_rounded": value == rounded}
    result["ok"] = result["ours"]["rel_err"] <= TARGET_ACCURACY
    return result


def identical_bits(cp: Any, results: list, uint: Any) -> tuple[int, np.ndarray]:
    bits = cp.stack(results).view(uint).get()
    return int(np.count_nonzero(bits == bits[0])), bits


def check_determinism(cp, mr, opts) -> dict:
    """Bits of 100 sums of a misaligned float32 view, and of 100 maxes of data with NaNs."""
    n = (1 << 24) + 3
    rs = cp.random.RandomState(np.uint64(opts.seed * 10_000 + 11))
    base = rs.standard_normal(n + 3, dtype=cp.float32)
    x = base[3:]  # 12 bytes past a 256-byte aligned allocation: the kernel's head and tail both run
    same_sum, bits = identical_bits(cp, [mr.sum(x) for _ in range(DETERMINISM_RUNS)], cp.uint32)
    reference = float(cp.sum(x, dtype=cp.float64))
    y = base.copy()
    y[rs.randint(3, n + 3, size=16, dtype=np.int64)] = cp.nan
    y = y[3:]
    maxes = [mr.max(y) for _ in range(DETERMINISM_RUNS)]
    same_max, max_bits = identical_bits(cp, maxes, cp.uint32)
    all_nan = bool(np.isnan(max_bits.view(np.float32)).all())
    return {
        "n": n,
        "offset_bytes": x.data.ptr % 16,
        "runs": DETERMINISM_RUNS,
        "sum_identical": same_sum,
        "sum_bits": f"{int(bits[0]):#010x}",
        "sum_rel_err_vs_float64": abs(float(bits[:1].view(np.float32)[0]) - reference) / abs(reference),
        "nan_max_identical": same_max,
        "nan_max_all_nan": all_nan,
        "ok": same_sum == DETERMINISM_RUNS and same_max == DETERMINISM_RUNS and all_nan,
    }


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def check_overhead(cp, mr, torch, opts) -> dict:
    """Median host wall time per ``float(reduce(x))`` on 1024 float32, ours vs cupy (and torch)."""
    x = cp.random.RandomState(np.uint64(opts.seed * 10_000 + 13)).random_sample(1024, dtype=cp.float32)
    fns = {"ours": lambda: float(mr.sum(x)), "cupy": lambda: float(cp.sum(x))}
    if torch is not None:
        t = torch.as_tensor(x, device="cuda")
        fns["torch"] = lambda: float(torch.sum(t))
    for fn in fns.values():
        per_call_us(fn, 200)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(20):  # interleaved, so that drift hits all alike
        for name, fn in fns.items():
            samples[name].append(per_call_us(fn, 100))
    result: dict[str, Any] = {"n": 1024, "dtype": "float32", "calls": 20 * 100}
    result |= {f"{name}_us": float(np.median(s)) for name, s in samples.items()}
    result["ok"] = result["ours_us"] <= result["cupy_us"]
    return result


def run_check(name: str, fn: Callable[[], dict]) -> dict:
    say(f"check: {name} ...")
    try:
        return fn()
    except Exception as exc:  # recorded, printed, and counted in the exit status
        return {"ok": False, "error": report_exception(f"checking {name}", exc)}


def run_checks(cp, mr, torch, opts) -> dict:
    return {
        "accuracy": run_check("accuracy", lambda: check_accuracy(cp, mr, torch, opts)),
        "determinism": run_check("determinism", lambda: check_determinism(cp, mr, opts)),
        "python_overhead": run_check("python overhead", lambda: check_overhead(cp, mr, torch, opts)),
    }


def correctness_summary(records: list[dict]) -> dict:
    ours = [r for r in records if r["peer"] == "ours" and r["status"] == "ok"]
    bad = [f"{r['dtype']} n=2^{r['log2_n']} {r['op']}" for r in ours if not r["check"]["ok"]]
    errors = [
        f"{r['peer']} {r['dtype']} n={r['n']} {r['op']}: {r['reason']}" for r in records if r["status"] == "error"
    ]
    return {"ours_checked": len(ours), "ours_mismatches": bad, "errors": errors, "ok": not bad and not errors}


# ---------------------------------------------------------------------------------------------
# Targets


def find(records: list[dict], peer: str, dtype: str, n: int, op: str) -> dict | None:
    for r in records:
        if (r["peer"], r["dtype"], r["n"], r["op"], r["status"]) == (peer, dtype, n, op, "ok"):
            return r
    return None


def target(name: str, target_text: str, passed: bool | None, value: str, **extra: Any) -> dict:
    status = "NOT MEASURED" if passed is None else ("PASS" if passed else "MISS")
    return {"name": name, "target": target_text, "status": status, "value": value} | extra


def target_4gib(records: list[dict], op: str) -> dict:
    name, text = f"4 GiB float32 {op} rate", f">= {TARGET_GBPS_4GIB:.0f} GB/s and >= 1.00x best of cupy/torch"
    ours = find(records, "ours", "float32", 1 << 30, op)
    if ours is None:
        return target(name, text, None, "needs 30 in --sizes and float32 in --dtypes")
    peers = [r for p in FRAMEWORK_PEERS if (r := find(records, p, "float32", 1 << 30, op))]
    best = max(peers, key=lambda r: r["gbps"]) if peers else None
    ratio = ours["gbps"] / best["gbps"] if best else None
    passed = ours["gbps"] >= TARGET_GBPS_4GIB and ratio is not None and ratio >= 1.0
    vs = f"{ratio:.2f}x best ({best['peer']} {best['gbps']:.0f} GB/s)" if best else "no cupy/torch result"
    return target(name, text, passed, f"{ours['gbps']:.0f} GB/s, {vs}", gbps=ours["gbps"], ratio_vs_best=ratio)


def target_2p24(records: list[dict], op: str) -> dict:
    name, text = f"2^24 float32 {op} time", f"<= {TARGET_US_2P24:g} us"
    ours = find(records, "ours", "float32", 1 << 24, op)
    if ours is None:
        return target(name, text, None, "needs 24 in --sizes and float32 in --dtypes")
    us = ours["median_us"]
    return target(name, text, us <= TARGET_US_2P24, f"{us:.1f} us", us=us)


def target_small(records: list[dict]) -> dict:
    name, text = "largest float32 time, n <= 2^20", f"<= {TARGET_US_SMALL:g} us"
    ours = [
        r for r in records if (r["peer"], r["dtype"], r["status"]) == ("ours", "float32", "ok") and r["n"] <= 1 << 20
    ]
    if not ours:
        return target(name, text, None, "needs a size <= 20 in --sizes and float32 in --dtypes")
    worst = max(ours, key=lambda r: r["median_us"])
    value = f"{worst['median_us']:.1f} us ({worst['op']} at 2^{worst['log2_n']})"
    return target(name, text, worst["median_us"] <= TARGET_US_SMALL, value, us=worst["median_us"])


def target_accumulator(records: list[dict]) -> dict:
    name, text = "f64-vs-f32 accumulation rate ratio", f">= {TARGET_ACC_RATIO:g} (at 2^30)"
    pairs = {
        r["n"]: (r, acc)
        for r in records
        if (r["peer"], r["dtype"], r["op"], r["status"]) == ("ours", "float32", "sum", "ok")
        and (acc := find(records, "ours-acc32", "float32", r["n"], "sum"))
    }
    if not pairs:
        return target(name, text, None, "needs float32 in --dtypes and sum in --ops")
    n = 1 << 30 if 1 << 30 in pairs else max(pairs)
    ours, acc = pairs[n]
    ratio = acc["median_us"] / ours["median_us"]  # = rate with float64 / rate with float32 accumulation
    value = f"{ratio:.3f} at 2^{n.bit_length() - 1} (f64 acc {ours['gbps']:.0f}, f32 acc {acc['gbps']:.0f} GB/s)"
    return target(name, text, ratio >= TARGET_ACC_RATIO, value, ratio=ratio, n=n)


def target_accuracy(check: dict) -> dict:
    name, text = "float32 sum relative error", f"<= {TARGET_ACCURACY:g}"
    if "error" in check:
        return target(name, text, None, f"check failed: {check['error']}")
    others = ", ".join(f"{p} {check[p]['rel_err']:.1e}" for p in ("cupy", "torch") if p in check)
    value = f"{check['ours']['rel_err']:.1e} at n={check['n']} ({others})"
    return target(name, text, check["ok"], value, rel_err=check["ours"]["rel_err"])


def target_determinism(check: dict) -> list[dict]:
    runs = DETERMINISM_RUNS
    if "error" in check:
        return [target("determinism", f"{runs}/{runs} identical", None, f"check failed: {check['error']}")]
    nan_ok = check["nan_max_identical"] == runs and check["nan_max_all_nan"]
    nan_value = f"{check['nan_max_identical']}/{runs}" + ("" if check["nan_max_all_nan"] else ", not all NaN")
    return [
        target(
            "determinism: sum, 2^24+3 misaligned",
            f"{runs}/{runs} identical bits",
            check["sum_identical"] == runs,
            f"{check['sum_identical']}/{runs}",
        ),
        target("determinism: max with NaNs", f"{runs}/{runs} identical, NaN", nan_ok, nan_value),
    ]


def target_overhead(check: dict) -> dict:
    name, text = "Python overhead float(sum(x)), n=1024", "ours <= cupy"
    if "error" in check:
        return target(name, text, None, f"check failed: {check['error']}")
    value = f"ours {check['ours_us']:.1f} us, cupy {check['cupy_us']:.1f} us"
    if "torch_us" in check:
        value += f", torch {check['torch_us']:.1f} us"
    return target(name, text, check["ok"], value)


def evaluate_targets(records: list[dict], checks: dict) -> list[dict]:
    return [
        *(target_4gib(records, op) for op in OP_NAMES),
        *(target_2p24(records, op) for op in OP_NAMES),
        target_small(records),
        target_accumulator(records),
        target_accuracy(checks["accuracy"]),
        *target_determinism(checks["determinism"]),
        target_overhead(checks["python_overhead"]),
    ]


def print_targets(targets: list[dict], correctness: dict) -> None:
    say("\nTARGETS")
    for t in targets:
        say(f"  {t['status']:<12} {t['name']:<40} {t['value']:<60} target {t['target']}")
    mismatches = correctness["ours_mismatches"]
    say(
        f"\nCORRECTNESS: ours checked on {correctness['ours_checked']} configurations, "
        f"{len(mismatches)} MISMATCH" + (": " + "; ".join(mismatches) if mismatches else "")
    )
    if correctness["errors"]:
        say(f"ERRORS: {len(correctness['errors'])} measurements raised (see stderr)")


# ---------------------------------------------------------------------------------------------
# JSON


def jsonable(obj: Any) -> Any:
    """Plain JSON: numpy scalars to Python, non-finite floats to strings, paths to strings."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, Path | Fraction):
        return str(obj)
    return obj


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def output_path(opts: argparse.Namespace, gpu_name: str, commit: str) -> Path:
    if opts.out is not None:
        return opts.out
    short = commit[:7] if commit != "unknown" else "unknown"
    return RESULTS_DIR / f"kernel_{slug(gpu_name)}_{short}.json"


def collect_meta(cp, mr, kernels, torch_info, device, git, extra, opts) -> dict:
    return {
        "git_commit": git["commit"],
        "dirty": git["dirty"],
        **({"git_error": git["error"]} if "error" in git else {}),
        "gpu": device["name"],
        "device": device,
        "sm_count": device["sm_count"],
        "versions": {
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "cupy": cp.__version__,
            "torch": torch_info.get("version"),
            "multireduce": mr.__version__,
        },
        "cuda_runtime_version": cp.cuda.runtime.runtimeGetVersion(),
        "cuda_driver_version": cp.cuda.runtime.driverGetVersion(),
        "cupy_accelerators": cupy_accelerators(),
        "torch": torch_info,
        "kernel_launch_defaults": {"block": kernels.DEFAULT_BLOCK, "unroll": kernels.DEFAULT_UNROLL},
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "argv": sys.argv,
        "options": vars(opts),
        **extra,
    }


def write_json(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(document), indent=1, allow_nan=False) + "\n")
    say(f"\nwrote {path}")


# ---------------------------------------------------------------------------------------------
# Main


def exit_status(correctness: dict, checks: dict, copy: dict) -> int:
    failed = [name for name, c in checks.items() if "error" in c] + (["copy bandwidth"] if "error" in copy else [])
    if not checks["determinism"].get("ok", False):
        failed.append("determinism")
    if not correctness["ok"] or failed:
        say(
            f"FAILED: {len(correctness['ours_mismatches'])} mismatches, {len(correctness['errors'])} errors"
            + (f", failed checks: {', '.join(sorted(set(failed)))}" if failed else "")
        )
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # benchmark this checkout, installed or not
    import cupy as cp

    import multireduce as mr
    from multireduce import _kernels as kernels
    from multireduce import _provenance
    from multireduce._backend import cupy as backend

    torch, torch_info = import_torch(cp)
    if torch is not None:
        say(f"torch: available, {torch_info['version']}")
    else:
        say(f"torch: UNAVAILABLE ({torch_info['reason']}); its column reads 'unavail'")
    device = device_info(cp)
    say(
        f"device: {device['name']}, {device['sm_count']} SMs, L2 {device['l2_bytes'] / MIB:.0f} MiB; "
        f"cupy {cp.__version__}; multireduce {mr.__version__} from {Path(mr.__file__).parent}"
    )

    module = compile_seed_module(cp)
    timer = DeviceTimer(cp, module.get_function("spin_kernel"))
    spin = timer.calibrate()
    try:
        copy = measure_copy(cp, timer, opts)
        say(f"copy bandwidth: {copy['gbps']:.0f} GB/s (read + write, {copy['method']}, {opts.copy_gib:g} GiB)")
    except Exception as exc:  # rates are still reported, fractions of copy are not
        copy = {"gbps": None, "error": report_exception("measuring the copy bandwidth", exc)}
    release_memory(cp)

    peers = make_peers(cp, mr, backend, torch, torch_info, module, opts)
    # The checks are quick and run first, so that a sweep cut short still has them.
    checks = run_checks(cp, mr, torch, opts)
    git = _provenance.git_state()
    extra = {"copy_bandwidth": copy, "spin_calibration": spin}
    meta = collect_meta(cp, mr, kernels, torch_info, device, git, extra, opts)
    path = output_path(opts, device["name"], git["commit"])

    def document(records: list[dict], complete: bool) -> dict:
        correctness = correctness_summary(records)
        return {
            "meta": meta | {"complete": complete},
            "records": records,
            "targets": evaluate_targets(records, checks),
            "checks": checks | {"correctness": correctness},
        }

    records = run_sweep(
        cp, peers, timer, opts, device["l2_bytes"], copy["gbps"], lambda r: write_json(path, document(r, False))
    )
    final = document(records, True)
    print_targets(final["targets"], final["checks"]["correctness"])
    write_json(path, final)
    correctness = final["checks"]["correctness"]
    return exit_status(correctness, checks, copy)


if __name__ == "__main__":
    sys.exit(main())
