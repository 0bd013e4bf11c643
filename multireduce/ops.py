"""The reduction operators, each defined once.

An :class:`Op` carries everything that every layer needs to know about one reduction:

* its **identity** per dtype, used to pad idle GPU lanes, for empty shards under MPI and for
  empty chunks under Dask;
* its **accumulator dtype**, the precision in which partials are formed and travel between
  ranks and chunks;
* its **combine rule**: ``host_reduce`` on the CPU, and the C++ functor of the same name in
  ``kernels/multireduce/reduce.cuh`` on the GPU;
* the name of the matching predefined MPI operation.

The CPU backend, the GPU backend, and the MPI and Dask layers all read these objects; none of
them spells out an identity or an accumulator rule of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "OPS",
    "SUPPORTED_DTYPES",
    "Op",
    "check_dtype",
    "get_op",
]

#: Input dtypes every op accepts, in NumPy's canonical order.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
)
_SUPPORTED_NAMES = ", ".join(dt.name for dt in SUPPORTED_DTYPES)
# dtype= may name any supported dtype except bool: a boolean "sum" is not a sum.
_RESULT_DTYPES = tuple(dt for dt in SUPPORTED_DTYPES if dt.kind != "b")


def check_dtype(dtype: np.dtype, what: str = "input") -> np.dtype:
    """Return ``dtype`` as a ``np.dtype`` if multireduce supports it.

    Raises
    ------
    TypeError
        If the dtype is not one of :data:`SUPPORTED_DTYPES` (object, string, complex,
        datetime, structured, ...). The message names the dtype and the accepted ones.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{what} dtype {dtype!r} is not a NumPy dtype; supported dtypes: {_SUPPORTED_NAMES}") from exc
    if dt not in SUPPORTED_DTYPES or dt.byteorder == ">":
        raise TypeError(f"multireduce does not support {what} dtype {dt}; supported dtypes: {_SUPPORTED_NAMES}")
    return dt


def _float_accumulator(dt: np.dtype) -> np.dtype:
    # float16 partials widen to float32 (MPI has no half type; the hardware adds in float32
    # anyway) and float32 to float64, so that a float32 sum is rounded once, at the end.
    return np.dtype(np.float64) if dt.itemsize >= 4 else np.dtype(np.float32)


def _sum_result(dt: np.dtype) -> np.dtype:
    # NumPy's rule: bool and signed integers sum in int64, unsigned in uint64, floats in kind.
    if dt.kind in "bi":
        return np.dtype(np.int64)
    if dt.kind == "u":
        return np.dtype(np.uint64)
    return dt


def _sum_accumulator(result: np.dtype) -> np.dtype:
    # Integers accumulate in 64 bits of the result's signedness. Wrap-around modulo 2**64
    # and a final cast give the same bits as NumPy's accumulation in a narrower result dtype.
    if result.kind == "i":
        return np.dtype(np.int64)
    if result.kind == "u":
        return np.dtype(np.uint64)
    return _float_accumulator(result)


def _extreme_accumulator(result: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if result == np.float16 else result


def _host_sum(x: np.ndarray, acc: np.dtype) -> np.generic:
    return np.add.reduce(x, axis=None, dtype=acc)


def _ieee_extreme(x: np.ndarray, value: np.generic, positive_zero_wins: bool) -> np.generic:
    # NumPy's maximum/minimum return either zero when +0.0 and -0.0 compare equal, so its
    # answer depends on the order of the elements. IEEE 754-2019 maximum/minimum order
    # -0.0 below +0.0, which is independent of order and so is what every backend and every
    # combine step here implements. This costs a second pass only when the extreme is zero.
    if value.dtype.kind != "f" or value != 0:
        return value
    zeros = x == 0
    if positive_zero_wins:
        has_positive = bool(np.any(zeros & ~np.signbit(x)))
        return value.dtype.type(0.0) if has_positive else value.dtype.type(-0.0)
    has_negative = bool(np.any(zeros & np.signbit(x)))
    return value.dtype.type(-0.0) if has_negative else value.dtype.type(0.0)


def _host_max(x: np.ndarray, acc: np.dtype) -> np.generic:
    return _ieee_extreme(x, np.max(x).astype(acc), positive_zero_wins=True)


def _host_min(x: np.ndarray, acc: np.dtype) -> np.generic:
    return _ieee_extreme(x, np.min(x).astype(acc), positive_zero_wins=False)


def _zero(dt: np.dtype) -> np.generic:
    return dt.type(0)


def _lowest(dt: np.dtype) -> np.generic:
    if dt.kind == "b":
        return np.bool_(False)
    if dt.kind == "f":
        return dt.type(-np.inf)
    return dt.type(np.iinfo(dt).min)


def _highest(dt: np.dtype) -> np.generic:
    if dt.kind == "b":
        return np.bool_(True)
    if dt.kind == "f":
        return dt.type(np.inf)
    return dt.type(np.iinfo(dt).max)


@dataclass(frozen=True, eq=False)
class Op:
    """One reduction operator.

    Attributes
    ----------
    name : str
        Public name, as accepted by :func:`multireduce.reduce`.
    functor : str
        The C++ functor in ``kernels/multireduce/reduce.cuh`` that implements ``combine`` on
        the GPU.
    mpi_name : str
        Name of the predefined MPI operation with the same combine rule (``"SUM"``, ...).
    numpy_name : str
        NumPy's name for the same reduction, used in error messages that mirror NumPy's.
    accepts_dtype : bool
        Whether ``dtype=`` may be given (NumPy's ``sum`` takes it, ``max``/``min`` do not).
    empty_allowed : bool
        Whether the reduction of zero elements is defined (it is the identity).
    host_reduce : callable
        ``host_reduce(x, acc_dtype) -> np.generic``: the CPU reduction of a NumPy array to one
        value of ``acc_dtype``. It is also the combine rule for partials.
    """

    name: str
    functor: str
    mpi_name: str
    numpy_name: str
    accepts_dtype: bool
    empty_allowed: bool
    host_reduce: Callable[[np.ndarray, np.dtype], np.generic]
    _result: Callable[[np.dtype], np.dtype]
    _accumulator: Callable[[np.dtype], np.dtype]
    _identity: Callable[[np.dtype], np.generic]

    def result_dtype(self, dtype: np.dtype, requested: np.dtype | None = None) -> np.dtype:
        """The dtype of the result for input ``dtype`` and an optional ``dtype=`` request.

        Raises
        ------
        TypeError
            If the input dtype is unsupported, if ``dtype=`` is given to an op that does not
            take it, or if the requested dtype is unsupported.
        """
        dt = check_dtype(dtype)
        if requested is None:
            return self._result(dt)
        if not self.accepts_dtype:
            takers = ", ".join(repr(o.name) for o in OPS.values() if o.accepts_dtype)
            raise TypeError(f"op {self.name!r} does not take dtype=; ops that do: {takers}")
        req = check_dtype(requested, what="requested")
        if req not in _RESULT_DTYPES:
            names = ", ".join(d.name for d in _RESULT_DTYPES)
            raise TypeError(f"dtype={req} is not accepted for op {self.name!r}; accepted: {names}")
        return req

    def accumulator_dtype(self, result: np.dtype) -> np.dtype:
        """The dtype in which partials are formed and combined, for a given result dtype."""
        return self._accumulator(np.dtype(result))

    def identity(self, acc: np.dtype) -> np.generic:
        """The neutral element of this op, as a scalar of the accumulator dtype ``acc``."""
        return self._identity(np.dtype(acc))

    def empty_error(self) -> ValueError:
        """The error NumPy raises for this op on a zero-size array."""
        return ValueError(f"zero-size array to reduction operation {self.numpy_name} which has no identity")

    def __repr__(self) -> str:
        return f"<multireduce op {self.name!r}>"


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op(
            name="sum",
            functor="Sum",
            mpi_name="SUM",
            numpy_name="add",
            accepts_dtype=True,
            empty_allowed=True,
            host_reduce=_host_sum,
            _result=_sum_result,
            _accumulator=_sum_accumulator,
            _identity=_zero,
        ),
        Op(
            name="max",
            functor="Max",
            mpi_name="MAX",
            numpy_name="maximum",
            accepts_dtype=False,
            empty_allowed=False,
            host_reduce=_host_max,
            _result=lambda dt: dt,
            _accumulator=_extreme_accumulator,
            _identity=_lowest,
        ),
        Op(
            name="min",
            functor="Min",
            mpi_name="MIN",
            numpy_name="minimum",
            accepts_dtype=False,
            empty_allowed=False,
            host_reduce=_host_min,
            _result=lambda dt: dt,
            _accumulator=_extreme_accumulator,
            _identity=_highest,
        ),
    )
}


def get_op(op: str | Op) -> Op:
    """Look up an op by name (or pass an :class:`Op` through).

    Raises
    ------
    ValueError
        If ``op`` names no known op. The message lists the known ones.
    """
    if isinstance(op, Op):
        return op
    try:
        return OPS[op]
    except (KeyError, TypeError):
        known = ", ".join(repr(name) for name in OPS)
        raise ValueError(f"unknown op {op!r}; expected one of: {known}") from None
