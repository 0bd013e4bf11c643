"""Where the CUDA sources live, and how their templates are named.

This module imports neither CuPy nor MPI: the packaging tests and the nvcc build test use it
on machines without a GPU.

The wheel carries the top-level ``kernels/`` directory as ``multireduce/kernels`` (see
``pyproject.toml``); a source checkout or an editable install finds it next to the package.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import numpy as np

from .ops import OPS, SUPPORTED_DTYPES, Op

__all__ = [
    "CTYPES",
    "DEFAULT_BLOCK",
    "DEFAULT_LOAD",
    "DEFAULT_UNROLL",
    "cols_kernel_name",
    "exact_kernel_name",
    "default_kernel_names",
    "kernel_dir",
    "kernel_name",
    "read_source",
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
#: Threads per block and rows in flight per thread of the column kernel (not yet tuned).
COLS_BLOCK = 256
COLS_UNROLL = 8

HEADER = "multireduce/reduce.cuh"


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
    """The kernel header's text.

    The text itself (not an ``#include``) goes to NVRTC, so that CuPy's on-disk kernel cache,
    which hashes the source string, notices every edit of the header.
    """
    return (kernel_dir() / HEADER).read_text()


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


EXACT_BLOCK = 256


def exact_kernel_name(dtype: np.dtype, block: int = EXACT_BLOCK) -> str:
    """The C++ name of one instantiation of ``exact_sum_kernel`` (reproducible sums)."""
    return f"multireduce::exact_sum_kernel<{CTYPES[np.dtype(dtype)]}, {block}>"


def default_kernel_names(
    block: int = DEFAULT_BLOCK, unroll: int = DEFAULT_UNROLL, load: int = DEFAULT_LOAD
) -> list[str]:
    """Every instantiation that :func:`multireduce.reduce` and :func:`multireduce.partial` use.

    Without ``dtype=``: each op that has a kernel, on each supported dtype, to its result and
    to its accumulator, as a full, a row and a column reduction; and the exact-sum kernel of
    each float dtype. The nvcc and NVRTC build tests compile exactly these.
    """
    names = set()
    for op in OPS.values():
        if op.functor is None:
            continue  # no GPU kernel yet (see docs/axis-kernels.md)
        for dt in SUPPORTED_DTYPES:
            result = op.result_dtype(dt)
            acc = op.accumulator_dtype(result)
            for out in (result, acc):
                names.add(kernel_name(op, dt, acc, out, block, unroll, load))
                names.add(kernel_name(op, dt, acc, out, block, unroll, load, kernel="reduce_rows_kernel"))
                names.add(cols_kernel_name(op, dt, acc, out))
    for dt in SUPPORTED_DTYPES:
        if dt.kind == "f":
            names.add(exact_kernel_name(dt))
    return sorted(names)
