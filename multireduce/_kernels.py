"""Where the CUDA sources live, and how their templates are named.

This module imports neither CuPy nor MPI: the packaging tests and the nvcc build test use it
on machines without a GPU.

The wheel carries the top-level ``kernels/`` directory as ``multireduce/kernels`` (see
``pyproject.toml``); a source checkout or an editable install finds it next to the package.
"""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

import numpy as np

from ._stats import _extreme_acc, _sum_acc
from .ops import OPS, SUPPORTED_DTYPES, Op

__all__ = [
    "CTYPES",
    "DEFAULT_BLOCK",
    "DEFAULT_LOAD",
    "TILED_LOAD",
    "TILED_MIN_BYTES",
    "TILED_TILING",
    "DEFAULT_UNROLL",
    "cols_kernel_name",
    "exact_kernel_name",
    "exact_round_kernel_name",
    "default_kernel_names",
    "elements_per_trip",
    "arg_kernel_name",
    "kernel_dir",
    "kernel_name",
    "moments_finalize_kernel_name",
    "moments_kernel_name",
    "read_source",
    "stats_finalize_kernel_name",
]

#: The one table from NumPy dtype to the C++ type the kernels use for it.
CTYPES: dict[np.dtype, str] = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "signed char",
    np.dtype(np.int16): "short",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.uint32): "unsigned int",
    np.dtype(np.uint64): "unsigned long long",
    np.dtype(np.float16): "__half",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}

#: Threads per block, 16-byte loads in flight per thread, and the load cache policy (0:
#: __ldg, 1: no L1 allocation plus a 256-byte L2 prefetch), chosen with
#: ``scripts/bench_kernel.py --variants``.
DEFAULT_BLOCK = 512
DEFAULT_UNROLL = 4
DEFAULT_LOAD = 0
#: Inputs of at least this many bytes use the full kernel's tiled mode instead: one block per
#: tile of ``TILED_TILING`` (tiles of DEFAULT_BLOCK * DEFAULT_UNROLL << (TILED_TILING - 1)
#: 16-byte vectors: 512 KiB), in the load argument's bits 2 and up. On the H200, 2^30 float32
#: took 920.5 us (sum), 924.5 (max) and 924.1 (min) that way against 931.0-933.1 us with the
#: grid-stride interleave and 924.2 (sum) / 940.4 (max) for cupy; at 2^28 (1 GiB) and below
#: the interleave was as fast or faster (bench/results/h200_6ce6399/bench_kernel_tiles.txt).
TILED_MIN_BYTES = 2 << 30
TILED_TILING = 5
TILED_LOAD = DEFAULT_LOAD | (TILED_TILING << 2)
#: Threads per block and rows in flight per thread of the column kernel, by accumulator size,
#: chosen with ``scripts/bench_axis.py --cols-variants`` on the H200 (4 GiB float32, axis=0):
#: float64 accumulators (sum) 256x8 reach 0.96x the full reduction (512x4: 0.86x); 4-byte ones
#: (max, min) 512x4 reach 0.95x (256x8: 0.88x).
COLS_BLOCK = 512
COLS_UNROLL = 4
COLS_BLOCK_WIDE = 256
COLS_UNROLL_WIDE = 8
#: nansum of float32 columns (float64 accumulators): ptxas unrolls the 256x8 loop only twice
#: once the NaN select is in it (16 loads in flight per thread instead of Sum's 32), and it ran
#: at 0.78x the full reduction; 256x6 gets four trips per iteration (24 loads) and 0.92x
#: (bench/results/h200_494f0f0). float64 input compiles to Sum's shape at 256x8. nanprod's
#: load is the same select (NaN to 1): at 256x8 its float32 columns ran at 0.78x too
#: (bench/results/h200_71ffd81).
COLS_NANSUM_F32 = (256, 6)


def cols_config(op: Op, dtype: np.dtype, acc: np.dtype) -> tuple[int, int]:
    """(threads per block, rows in flight) of the column kernel for ``op`` on ``dtype`` input."""
    if op.functor in ("NanSum", "NanProd") and np.dtype(dtype) == np.float32:
        return COLS_NANSUM_F32
    if np.dtype(acc).itemsize == 8:
        return COLS_BLOCK_WIDE, COLS_UNROLL_WIDE
    return COLS_BLOCK, COLS_UNROLL


def elements_per_trip(itemsize: int, block: int, unroll: int) -> int:
    """Elements one block loads per trip of its loop: ``unroll`` 16-byte vectors per thread."""
    return (16 // itemsize) * block * unroll


def rows_config() -> tuple[int, int, int, int, int]:
    """(threads per block, 16-byte loads in flight, waves, load policy, blocks per row) of the row kernel.

    ``waves`` 0: one block per row (gridDim.y = rows, up to 65535, the kernel strides over the
    rest); otherwise at most ``waves`` times the blocks the GPU holds at once, each looping
    over rows. The load policy is ``load16``'s (0-3). Blocks per row 0: chosen from the shape
    (one for many rows; several, combined by the last one done, for few long rows).
    ``scripts/bench_axis.py --rows-variants`` times others.
    """
    return DEFAULT_BLOCK, DEFAULT_UNROLL, 0, DEFAULT_LOAD & 3, 0


#: Threads per block, and 16-byte loads in flight per thread, of the moments and arg kernels
#: (kernels/multireduce/stats.cuh). Measured once on an H200 (4 GiB float32, kernel alone):
#: moments 512 x 8 reads 4.35 TB/s, as fast as reduce_kernel's sum (512 x 4: 4.2 TB/s). The
#: arg kernel keeps 4: at 8, its one-byte instantiations spill.
STATS_BLOCK = 512
MOMENTS_UNROLL = 8
ARG_UNROLL = 4

#: The header that nvcc includes: it includes reduce.cuh itself.
HEADER = "multireduce/stats.cuh"
#: The headers in the order of their text in :func:`read_source`.
SOURCES = ("multireduce/reduce.cuh", "multireduce/stats.cuh")


def kernel_dir() -> Path:
    """The directory holding ``multireduce/reduce.cuh``.

    Raises
    ------
    FileNotFoundError
        If neither the installed copy nor the source checkout's ``kernels/`` exists.
    """
    installed = importlib.resources.files("multireduce") / "kernels"
    if installed.is_dir():
        return Path(str(installed))
    checkout = Path(__file__).resolve().parent.parent / "kernels"
    if (checkout / HEADER).is_file():
        return checkout
    raise FileNotFoundError(
        f"multireduce's CUDA sources were not found: neither {installed} (wheel) "
        f"nor {checkout} (source checkout) exists"
    )


def read_source() -> str:
    """The text of the kernel headers: ``reduce.cuh`` followed by ``stats.cuh``.

    The text itself (not an ``#include``) goes to NVRTC, so that CuPy's on-disk kernel cache,
    which hashes the source string, notices every edit of either header. It starts with a
    ``#define`` that tells ``stats.cuh`` not to ``#include "reduce.cuh"`` (which nvcc needs,
    and NVRTC, having no files, could not open): its text is already there.
    """
    root = kernel_dir()
    return "#define MULTIREDUCE_ONE_SOURCE_TEXT 1\n" + "".join((root / name).read_text() for name in SOURCES)


def kernel_name(
    op: Op,
    dtype: np.dtype,
    acc: np.dtype,
    result: np.dtype,
    block: int = DEFAULT_BLOCK,
    unroll: int = DEFAULT_UNROLL,
    load: int = DEFAULT_LOAD,
    kernel: str = "reduce_kernel",
) -> str:
    """The C++ name of one instantiation of ``reduce_kernel`` (or ``reduce_rows_kernel``).

    ``reduce_cols_kernel`` has no load policy: use :func:`cols_kernel_name`.
    """
    t, a, o = (CTYPES[np.dtype(d)] for d in (dtype, acc, result))
    return f"multireduce::{kernel}<{t}, {a}, {o}, multireduce::{op.functor}, {block}, {unroll}, {load}>"


def cols_kernel_name(
    op: Op, dtype: np.dtype, acc: np.dtype, result: np.dtype, block: int = COLS_BLOCK, unroll: int = COLS_UNROLL
) -> str:
    """The C++ name of one instantiation of ``reduce_cols_kernel``."""
    t, a, o = (CTYPES[np.dtype(d)] for d in (dtype, acc, result))
    return f"multireduce::reduce_cols_kernel<{t}, {a}, {o}, multireduce::{op.functor}, {block}, {unroll}>"


@functools.cache  # called on every launch: the name is formatted once per dtype
def moments_kernel_name(dtype: np.dtype, block: int = STATS_BLOCK, unroll: int = MOMENTS_UNROLL) -> str:
    """The C++ name of one instantiation of ``moments_rows_kernel`` (moments of ``dtype`` input).

    The state's sum is in the sum accumulator of ``dtype`` and lo/hi in the max/min
    accumulator, as in :class:`multireduce._stats.Moments`.
    """
    dt = np.dtype(dtype)
    t, s, e = (CTYPES[d] for d in (dt, _sum_acc(dt), _extreme_acc(dt)))
    return f"multireduce::moments_rows_kernel<{t}, {s}, {e}, {block}, {unroll}>"


#: The moments ops that ``moments_finalize_kernel`` finalizes, by its OP parameter.
MOMENTS_FINALIZE_OPS = {"var": 1, "std": 2}


@functools.cache  # called on every launch: the name is formatted once per dtype
def moments_finalize_kernel_name(dtype: np.dtype, op: str, result: np.dtype | None = None) -> str:
    """The C++ name of ``moments_finalize_kernel`` for ``op`` (var or std) of ``dtype`` input.

    Its state is that of :func:`moments_kernel_name`; its output has the dtype ``result``
    (default: the op's result dtype for ``dtype``).
    """
    dt = np.dtype(dtype)
    out = OPS[op].result_dtype(dt) if result is None else np.dtype(result)
    s, e, o = (CTYPES[d] for d in (_sum_acc(dt), _extreme_acc(dt), out))
    return f"multireduce::moments_finalize_kernel<{s}, {e}, {o}, {MOMENTS_FINALIZE_OPS[op]}>"


@functools.cache  # called on every launch: the name is formatted once per dtype
def mean_from_sum_kernel_name(result: np.dtype) -> str:
    """The C++ name of ``mean_from_sum_kernel`` writing means of dtype ``result``."""
    return f"multireduce::mean_from_sum_kernel<{CTYPES[np.dtype(result)]}>"


@functools.cache  # called on every launch: the name is formatted once per dtype
def stats_finalize_kernel_name(dtype: np.dtype) -> str:
    """The C++ name of ``stats_finalize_kernel`` for ``dtype`` input (``multireduce.stats`` on the GPU).

    Its state is that of :func:`moments_kernel_name`; its outputs have the result dtypes of
    count (int64), sum, min and max (the input's dtype), mean and var.
    """
    dt = np.dtype(dtype)
    t, s, e, so, mo = (
        CTYPES[d]
        for d in (dt, _sum_acc(dt), _extreme_acc(dt), OPS["sum"].result_dtype(dt), OPS["mean"].result_dtype(dt))
    )
    return f"multireduce::stats_finalize_kernel<{t}, {s}, {e}, {so}, {mo}>"


@functools.cache  # called on every launch: the name is formatted once per dtype
def arg_kernel_name(
    dtype: np.dtype, largest: bool, nan_wins: bool = True, block: int = STATS_BLOCK, unroll: int = ARG_UNROLL
) -> str:
    """The C++ name of one instantiation of ``arg_rows_kernel`` (argmax if ``largest``, else argmin).

    ``nan_wins`` false: nanargmax/nanargmin (NaN the smallest key). Without NaN (integer and
    bool input) both are the same kernel, named with ``true``.
    """
    dt = np.dtype(dtype)
    t, e = CTYPES[dt], CTYPES[_extreme_acc(dt)]
    nan = "true" if nan_wins or dt.kind != "f" else "false"
    return f"multireduce::arg_rows_kernel<{t}, {e}, {block}, {unroll}, {'true' if largest else 'false'}, {nan}>"


EXACT_BLOCK = 256


#: 16-byte loads in flight and float64 window sums per thread of the exact-sum kernel.
EXACT_UNROLL = 2
EXACT_SUMS = 2


def exact_kernel_name(
    dtype: np.dtype, block: int = EXACT_BLOCK, unroll: int | None = None, sums: int | None = None
) -> str:
    """The C++ name of one instantiation of ``exact_sum_kernel`` (reproducible sums)."""
    unroll = EXACT_UNROLL if unroll is None else unroll
    sums = EXACT_SUMS if sums is None else sums
    return f"multireduce::exact_sum_kernel<{CTYPES[np.dtype(dtype)]}, {block}, {unroll}, {sums}>"


def exact_round_kernel_name(result: np.dtype) -> str:
    """The C++ name of ``exact_round_kernel`` for a float result dtype (reproducible sums)."""
    return f"multireduce::exact_round_kernel<{CTYPES[np.dtype(result)]}>"


def default_kernel_names(
    block: int = DEFAULT_BLOCK, unroll: int = DEFAULT_UNROLL, load: int = DEFAULT_LOAD
) -> list[str]:
    """Every instantiation that :func:`multireduce.reduce` and :func:`multireduce.partial` use.

    Without ``dtype=``: each op that has a kernel, on each supported dtype, to its result and
    to its accumulator, as a full (grid-stride and tiled), a row and a column reduction; the exact-sum kernel of
    each float dtype; the moments, stats-finalize, argmin and argmax kernels of each
    supported dtype; and the float64 sums and the division of the GPU mean.
    The nvcc and NVRTC build tests compile exactly these.
    """
    names = set()
    for op in OPS.values():
        if op.functor is None:
            continue  # moments and arg ops: their own kernels, below
        for dt in SUPPORTED_DTYPES:
            result = op.result_dtype(dt)
            acc = op.accumulator_dtype(result)
            for out in (result, acc):
                names.add(kernel_name(op, dt, acc, out, block, unroll, load))
                names.add(kernel_name(op, dt, acc, out, block, unroll, (load & 3) | (TILED_TILING << 2)))
                names.add(kernel_name(op, dt, acc, out, block, unroll, load, kernel="reduce_rows_kernel"))
                names.add(cols_kernel_name(op, dt, acc, out, *cols_config(op, dt, acc)))
    for dt in SUPPORTED_DTYPES:
        if dt.kind == "f":
            names.add(exact_kernel_name(dt))
            names.add(exact_round_kernel_name(dt))
        names.add(moments_kernel_name(dt))
        names.add(stats_finalize_kernel_name(dt))
        for name in MOMENTS_FINALIZE_OPS:
            names.add(moments_finalize_kernel_name(dt, name))
        # The GPU mean: float64 sums of every dtype (full, tiled, rows, columns), then the division.
        f64, add = np.dtype(np.float64), OPS["sum"]
        names.add(kernel_name(add, dt, f64, f64, block, unroll, load))
        names.add(kernel_name(add, dt, f64, f64, block, unroll, (load & 3) | (TILED_TILING << 2)))
        names.add(kernel_name(add, dt, f64, f64, block, unroll, load, kernel="reduce_rows_kernel"))
        names.add(cols_kernel_name(add, dt, f64, f64, *cols_config(add, dt, f64)))
        names.add(mean_from_sum_kernel_name(OPS["mean"].result_dtype(dt)))
        for largest in (True, False):
            for nan_wins in (True, False):  # the same kernel for integer and bool input
                names.add(arg_kernel_name(dt, largest=largest, nan_wins=nan_wins))
    return sorted(names)
