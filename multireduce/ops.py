"""The reduction operators, each defined once.

An :class:`Op` carries everything that every layer needs to know about one reduction:

* its **identity** per dtype, used to pad idle GPU lanes, for empty shards under MPI and for
  empty chunks under Dask;
* its **accumulator dtype**, the precision in which partials are formed and travel between
  ranks and chunks;
* its **combine rule**: ``host_reduce`` on the CPU, and the C++ functor of the same name in
  ``kernels/multireduce/reduce.cuh`` on the GPU (every fold op);
* the name of the matching predefined MPI operation.

Ops of kind ``"fold"`` have one value per output element as their partial. The moments ops
(mean, nanmean, var, std, nanvar, nanstd, and :func:`multireduce.stats`) and the arg ops
(argmin, argmax, nanargmin, nanargmax)
have a small state instead, defined once with its merge in :mod:`multireduce._stats`.

The CPU backend, the GPU backend, and the MPI and Dask layers all read these objects; none of
them spells out an identity or an accumulator rule of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "KERNEL_OPS",
    "KINDS",
    "OPS",
    "SUPPORTED_DTYPES",
    "Op",
    "check_dtype",
    "get_op",
    "ieee_zero_fix",
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
        datetime, ...), or if it has fields or is a subarray dtype, even one that compares equal to a
        supported dtype. The message names the dtype and the accepted ones.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{what} dtype {dtype!r} is not a NumPy dtype; supported dtypes: {_SUPPORTED_NAMES}") from exc
    # A structured dtype may compare equal to a supported one (np.dtype(("<f4", {"a": ("<i4", 0)}))
    # == np.float32 is True), so the membership test below would let it through.
    if dt.names is not None or dt.subdtype is not None:
        kind = "has fields" if dt.names is not None else "is a subarray dtype"
        raise TypeError(
            f"multireduce does not support {what} dtype {dt}: it {kind}; supported dtypes: {_SUPPORTED_NAMES}"
        )
    if dt not in SUPPORTED_DTYPES or dt.byteorder == ">":
        raise TypeError(f"multireduce does not support {what} dtype {dt}; supported dtypes: {_SUPPORTED_NAMES}")
    return dt


def _float_accumulator(dt: np.dtype) -> np.dtype:
    # float16 partials widen to float32 (MPI has no half type; the hardware adds in float32
    # anyway) and float32 to float64, so that a float32 sum is rounded once, at the end.
    return np.dtype(np.float64) if dt.itemsize >= 4 else np.dtype(np.float32)


def _sum_result(dt: np.dtype) -> np.dtype:
    # The Array API (2023.12) rule for sum and prod, which NumPy follows on 64-bit platforms:
    # bool and signed integers give the default integer (int64), unsigned integers uint64,
    # floating-point inputs keep their dtype.
    if dt.kind in "bi":
        return np.dtype(np.int64)
    if dt.kind == "u":
        return np.dtype(np.uint64)
    return dt


def _sum_accumulator(result: np.dtype) -> np.dtype:
    # Integers accumulate in 64 bits of the result's signedness. Wrap-around modulo 2**64
    # and a final cast give the same bits as NumPy's accumulation in a narrower result dtype
    # (for products too: the low bits of a product depend only on the low bits of the factors).
    if result.kind == "i":
        return np.dtype(np.int64)
    if result.kind == "u":
        return np.dtype(np.uint64)
    return _float_accumulator(result)


def _extreme_accumulator(result: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if result == np.float16 else result


def _same(dt: np.dtype) -> np.dtype:
    return dt


def _always(dtype) -> Callable[[np.dtype], np.dtype]:
    fixed = np.dtype(dtype)
    return lambda dt: fixed


def _mean_result(dt: np.dtype) -> np.dtype:
    # NumPy's rule (the standard leaves integer input unspecified): floats keep their dtype,
    # bool and integers give float64.
    return dt if dt.kind == "f" else np.dtype(np.float64)


def _positive_zero(x: np.ndarray) -> np.ndarray:
    # Adding +0.0 turns -0.0 into +0.0 and changes nothing else: sums of zeros are +0.0.
    return x + x.dtype.type(0) if x.dtype.kind == "f" else x


def _host_sum(x: np.ndarray, acc: np.dtype, axes: tuple[int, ...] | None = None) -> np.ndarray:
    return _positive_zero(np.add.reduce(x, axis=axes, dtype=acc))


def _host_prod(x: np.ndarray, acc: np.dtype, axes: tuple[int, ...] | None = None) -> np.ndarray:
    return np.multiply.reduce(x, axis=axes, dtype=acc)


def _nan_as(fill: int, host: Callable) -> Callable:
    """``host`` with NaN elements read as ``fill`` first (nansum: 0, nanprod: 1)."""

    def reduce(x: np.ndarray, acc: np.dtype, axes: tuple[int, ...] | None = None) -> np.ndarray:
        if x.dtype.kind == "f":
            x = np.where(np.isnan(x), x.dtype.type(fill), x)
        return host(x, acc, axes)

    return reduce


def ieee_zero_fix(
    x: np.ndarray, value: np.ndarray, axes: tuple[int, ...], largest: bool, nan_free: bool = False
) -> np.ndarray:
    """Apply IEEE 754-2019's signed-zero order to a NumPy max/min ``value`` of ``x`` over ``axes``.

    NumPy's maximum/minimum return either zero when +0.0 and -0.0 compare equal, so its answer
    depends on the order of the elements. IEEE 754-2019 maximum/minimum (and maximumNumber /
    minimumNumber, for the NaN-ignoring ops) order -0.0 below +0.0, which is independent of
    order and so is what every backend and every combine step here implements. This costs
    further passes only where some extreme is zero. ``nan_free`` says that a zero extreme
    implies no NaN in its slice (true for the NaN-propagating max/min).
    """
    value = np.asarray(value)
    if value.dtype.kind != "f" or not np.any(value == 0):
        return value
    if nan_free:
        # One integer pass, no temporaries: where the max is zero every element is <= 0, so a
        # non-negative integer view (sign bit clear) is a +0.0; where the min is zero every
        # element is >= 0, so a negative one (sign bit set) is a -0.0.
        bits = x.view(f"i{x.itemsize}")
        has_wanted = np.max(bits, axis=axes) >= 0 if largest else np.min(bits, axis=axes) < 0
    else:
        wanted = (x == 0) & (np.signbit(x) != largest)  # +0.0 for max, -0.0 for min
        has_wanted = np.logical_or.reduce(wanted, axis=axes)
    if largest:
        fixed = np.where(has_wanted, value.dtype.type(0.0), value.dtype.type(-0.0))
    else:
        fixed = np.where(has_wanted, value.dtype.type(-0.0), value.dtype.type(0.0))
    return np.where(value == 0, fixed, value)


def _extreme(ufunc, largest: bool):
    nan_free = ufunc in (np.maximum, np.minimum)  # these propagate NaN: a zero result saw none

    def host(x: np.ndarray, acc: np.dtype, axes: tuple[int, ...] | None = None) -> np.ndarray:
        value = ufunc.reduce(x, axis=axes)
        return ieee_zero_fix(x, value, axes, largest, nan_free).astype(acc)

    return host


_F64_MAX = float(np.finfo(np.float64).max)


def cast_result(value: Any, result: np.dtype) -> Any:
    """``value`` (a NumPy or CuPy array or scalar) converted to ``result``, warning as NumPy's reductions do.

    For an accumulator's value converted to the result dtype (float16 and float32 sums and
    products accumulate in a wider float: past the narrow dtype's range the conversion
    overflows, where NumPy's own reduction, in the narrow dtype, overflows in its
    additions), and for the elements converted by ``dtype=`` (which NumPy converts inside
    its reduction): NumPy says "overflow encountered in reduce" and "invalid value
    encountered in reduce", not "... in cast". Those are the warnings given here, under the
    caller's ``numpy.errstate`` (raise, ignore, call as NumPy's). CuPy values are converted
    on their device, silently, as every GPU operation.
    """
    if type(value).__module__.startswith("cupy"):
        with value.device:
            return value.astype(result)
    if value.dtype == result or np.can_cast(value.dtype, result, "safe"):  # nothing can overflow
        return value.astype(result)
    with as_reduction_warnings():
        return value.astype(result)


def warn_as_reduction(overflow: bool = False, invalid: bool = False) -> None:
    """NumPy's own warnings of a reduction, under the caller's ``numpy.errstate``, in its order.

    "overflow encountered in reduce" and "invalid value encountered in reduce", raised by
    NumPy operations that make them (so ``errstate``'s raise, ignore, call and the warning
    filters apply as to NumPy's), not imitated.
    """
    if overflow:
        np.add.reduce(np.array([_F64_MAX, _F64_MAX]))
    if invalid:
        np.add.reduce(np.array([np.inf, -np.inf]))


@contextlib.contextmanager
def as_reduction_warnings() -> Iterator[None]:
    """The block's floating-point errors, collected, then warned once as NumPy's one reduction warns them.

    For work that stands for one NumPy reduction (a conversion NumPy makes inside its
    reduction, a sum taken in blocks): NumPy's callback names the flags "overflow" and
    "invalid value" (underflow is ignored, as by NumPy's default).
    """
    flags: set[str] = set()
    with np.errstate(all="call", call=lambda kind, flag: flags.add(kind)):
        yield
    warn_as_reduction(
        overflow=any(kind.startswith("overflow") for kind in flags),
        invalid=any(kind.startswith("invalid") for kind in flags),
    )


def _host_count_nonzero(x: np.ndarray, acc: np.dtype, axes: tuple[int, ...] | None = None) -> np.ndarray:
    return np.add.reduce(x != 0, axis=axes, dtype=acc)


def _host_any(x: np.ndarray, acc: np.dtype, axes: tuple[int, ...] | None = None) -> np.ndarray:
    # NaN is nonzero, hence true, as in NumPy and the standard.
    return np.logical_or.reduce(x != 0, axis=axes)


def _host_all(x: np.ndarray, acc: np.dtype, axes: tuple[int, ...] | None = None) -> np.ndarray:
    return np.logical_and.reduce(x != 0, axis=axes)


def _zero(dt: np.dtype) -> np.generic:
    return dt.type(0)


def _one(dt: np.dtype) -> np.generic:
    return dt.type(1)


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


def _nan_or(fallback: Callable[[np.dtype], np.generic]) -> Callable[[np.dtype], np.generic]:
    # fmax/fmin ignore NaN, so NaN is their neutral element; an all-NaN (or empty) partial
    # then stays NaN, and the global result is NaN only if every element was NaN.
    return lambda dt: dt.type(np.nan) if dt.kind == "f" else fallback(dt)


#: How an op's partials are formed and combined.
#:
#: ``"fold"``: one value per output element in the accumulator dtype, combined with
#: ``combine_with``'s ``host_reduce`` (and, on the GPU, its C++ functor).
#: ``"moments"``: a :class:`multireduce._stats.Moments` state, merged with Chan et al.'s update.
#: ``"arg"``: a :class:`multireduce._stats.ArgState` (value, int64 index) pair.
KINDS = ("fold", "moments", "arg")


@dataclass(frozen=True, eq=False)
class Op:
    """One reduction operator.

    Attributes
    ----------
    name : str
        Public name, as accepted by :func:`multireduce.reduce`.
    kind : {"fold", "moments", "arg"}
        How partials are formed and combined (see :data:`KINDS`).
    functor : str or None
        The C++ functor in ``kernels/multireduce/reduce.cuh`` that implements the op on the
        GPU, or None where there is no GPU kernel yet.
    mpi_name : str or None
        For fold ops, how partials travel under MPI: ``"SUM"`` and ``"PROD"`` as numbers in
        the accumulator dtype, ``"MAX"``/``"MIN"`` as ordered integer keys (see
        :mod:`multireduce._transport`). None for moments and arg ops, whose states are merged
        with :mod:`multireduce._stats`.
    numpy_name : str
        NumPy's name for the same reduction, used in error messages that mirror NumPy's.
    accepts_dtype : bool
        Whether ``dtype=`` may be given (sum, prod, nansum and nanprod, as in the Array API
        and NumPy).
    empty_allowed : bool
        Whether the reduction of zero elements is defined.
    combine_with : str
        The fold op whose ``host_reduce`` combines this op's partials (``"sum"`` for
        count_nonzero and nansum, ``"prod"`` for nanprod: a NaN partial of nansum comes from
        inf - inf, of nanprod from inf * 0, and must stay).
    host_reduce : callable or None
        Fold ops: ``host_reduce(x, acc_dtype, axes) -> array``, the CPU reduction of ``x``
        over ``axes`` (a tuple of non-negative ints) to values of ``acc_dtype``.
    statistic : {"mean", "var", "std"} or None
        Moments ops: what the state is finalized to. var and std (and nanvar, nanstd) take
        ``correction=``.
    skips_nan : bool
        Whether NaN elements are left out: the nan* ops. nansum and nanprod read them as
        their identity (also before a ``dtype=`` conversion), nanmax and nanmin lose them to
        any number; nanmean, nanvar and nanstd count the other elements; nanargmax and
        nanargmin pass over them (an all-NaN slice raises NumPy's ValueError). Otherwise a NaN
        makes the result NaN (or its index).
    largest : bool
        Arg ops: argmax and nanargmax (else argmin and nanargmin).
    """

    name: str
    kind: str
    functor: str | None
    mpi_name: str | None
    numpy_name: str
    accepts_dtype: bool
    empty_allowed: bool
    host_reduce: Callable[[np.ndarray, np.dtype, tuple[int, ...]], np.ndarray] | None
    _result: Callable[[np.dtype], np.dtype]
    _accumulator: Callable[[np.dtype], np.dtype]
    _identity: Callable[[np.dtype], np.generic] | None
    combine_with: str = ""
    statistic: str | None = None
    skips_nan: bool = False
    largest: bool = False

    @property
    def nan_wins(self) -> bool:
        """Whether NaN beats every number in MAX/MIN and arg keys (else it loses to every number).

        It wins for max, min, any, all, argmax and argmin, and loses for nanmax, nanmin,
        nanargmax and nanargmin: the ops that skip NaN are those where it loses.
        """
        return not self.skips_nan

    def __reduce_ex__(self, protocol):
        # A registered op travels by name (pickle; Dask's distributed sends it with every task):
        # the receiving process's own OPS entry, so that ``op is OPS[op.name]`` holds there too.
        # Its callables are local functions, which plain pickle refuses; cloudpickle sent them
        # by value, about 1.2 KB per task.
        if OPS.get(self.name) is self:
            return get_op, (self.name,)
        return super().__reduce_ex__(protocol)

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
        names = ", ".join(d.name for d in _RESULT_DTYPES)
        try:
            req = check_dtype(requested, what="requested")
        except TypeError as exc:  # its message lists the input dtypes, bool among them
            raise TypeError(f"dtype={requested!r} is not accepted for op {self.name!r}; accepted: {names}") from exc
        if req not in _RESULT_DTYPES:
            raise TypeError(f"dtype={req} is not accepted for op {self.name!r}; accepted: {names}")
        return req

    def accumulator_dtype(self, result: np.dtype) -> np.dtype:
        """The dtype in which partials are formed and combined, for a given result dtype.

        For moments ops this is float64 (the dtype of the mean and of M2). For arg ops, whose
        result is always int64, it says nothing about the extreme value that travels next to
        the index: that value's dtype depends on the input (``_stats.arg_dtype(input dtype)``).
        """
        return self._accumulator(np.dtype(result))

    def identity(self, acc: np.dtype) -> np.generic:
        """The neutral element of this fold op, as a scalar of the accumulator dtype ``acc``.

        Raises
        ------
        TypeError
            For moments and arg ops, whose empty partial is a state, not a value.
        """
        if self._identity is None:
            raise TypeError(f"op {self.name!r} is a {self.kind} op; its empty partial is a state (multireduce._stats)")
        return self._identity(np.dtype(acc))

    @property
    def combiner(self) -> Op:
        """The fold op that combines this op's partials (itself for most ops)."""
        return OPS[self.combine_with or self.name]

    def empty_error(self) -> ValueError:
        """The error NumPy raises for this op on a zero-size array."""
        if self.kind == "arg":
            return ValueError(f"attempt to get {self.numpy_name} of an empty sequence")
        return ValueError(f"zero-size array to reduction operation {self.numpy_name} which has no identity")

    def __repr__(self) -> str:
        return f"<multireduce op {self.name!r}>"


def _fold(
    name,
    functor,
    mpi_name,
    numpy_name,
    host,
    result,
    acc,
    identity,
    *,
    accepts_dtype=False,
    empty_allowed=True,
    combine_with="",
    skips_nan=False,
):
    return Op(
        name=name,
        kind="fold",
        functor=functor,
        mpi_name=mpi_name,
        numpy_name=numpy_name,
        accepts_dtype=accepts_dtype,
        empty_allowed=empty_allowed,
        host_reduce=host,
        _result=result,
        _accumulator=acc,
        _identity=identity,
        combine_with=combine_with,
        skips_nan=skips_nan,
    )


def _composite(name, kind, numpy_name, result, acc, *, empty_allowed, statistic=None, skips_nan=False, largest=False):
    return Op(
        name=name,
        kind=kind,
        functor=None,
        mpi_name=None,
        numpy_name=numpy_name,
        accepts_dtype=False,
        empty_allowed=empty_allowed,
        host_reduce=None,
        _result=result,
        _accumulator=acc,
        _identity=None,
        statistic=statistic,
        skips_nan=skips_nan,
        largest=largest,
    )


_F64 = _always(np.float64)

OPS: dict[str, Op] = {
    op.name: op
    for op in (
        _fold("sum", "Sum", "SUM", "add", _host_sum, _sum_result, _sum_accumulator, _zero, accepts_dtype=True),
        _fold(
            "max",
            "Max",
            "MAX",
            "maximum",
            _extreme(np.maximum, True),
            _same,
            _extreme_accumulator,
            _lowest,
            empty_allowed=False,
        ),
        _fold(
            "min",
            "Min",
            "MIN",
            "minimum",
            _extreme(np.minimum, False),
            _same,
            _extreme_accumulator,
            _highest,
            empty_allowed=False,
        ),
        _fold("prod", "Prod", "PROD", "multiply", _host_prod, _sum_result, _sum_accumulator, _one, accepts_dtype=True),
        _fold(
            "count_nonzero",
            "CountNonzero",
            "SUM",
            "count_nonzero",
            _host_count_nonzero,
            _always(np.int64),
            _same,
            _zero,
            combine_with="sum",
        ),
        _fold("any", "Any", "MAX", "logical_or", _host_any, _always(np.bool_), _same, _lowest),
        _fold("all", "All", "MIN", "logical_and", _host_all, _always(np.bool_), _same, _highest),
        _fold(
            "nansum",
            "NanSum",
            "SUM",
            "add",
            _nan_as(0, _host_sum),
            _sum_result,
            _sum_accumulator,
            _zero,
            accepts_dtype=True,
            combine_with="sum",
            skips_nan=True,
        ),
        _fold(
            "nanprod",
            "NanProd",
            "PROD",
            "multiply",
            _nan_as(1, _host_prod),
            _sum_result,
            _sum_accumulator,
            _one,
            accepts_dtype=True,
            combine_with="prod",
            skips_nan=True,
        ),
        _fold(
            "nanmax",
            "NanMax",
            "MAX",
            "fmax",
            _extreme(np.fmax, True),
            _same,
            _extreme_accumulator,
            _nan_or(_lowest),
            empty_allowed=False,
            skips_nan=True,
        ),
        _fold(
            "nanmin",
            "NanMin",
            "MIN",
            "fmin",
            _extreme(np.fmin, False),
            _same,
            _extreme_accumulator,
            _nan_or(_highest),
            empty_allowed=False,
            skips_nan=True,
        ),
        _composite("mean", "moments", "mean", _mean_result, _F64, empty_allowed=True, statistic="mean"),
        _composite(
            "nanmean", "moments", "nanmean", _mean_result, _F64, empty_allowed=True, statistic="mean", skips_nan=True
        ),
        _composite("var", "moments", "var", _mean_result, _F64, empty_allowed=True, statistic="var"),
        _composite("std", "moments", "std", _mean_result, _F64, empty_allowed=True, statistic="std"),
        _composite(
            "nanvar", "moments", "nanvar", _mean_result, _F64, empty_allowed=True, statistic="var", skips_nan=True
        ),
        _composite(
            "nanstd", "moments", "nanstd", _mean_result, _F64, empty_allowed=True, statistic="std", skips_nan=True
        ),
        _composite(
            "argmax", "arg", "argmax", _always(np.int64), _extreme_accumulator, empty_allowed=False, largest=True
        ),
        _composite("argmin", "arg", "argmin", _always(np.int64), _extreme_accumulator, empty_allowed=False),
        # NumPy's messages for an empty sequence name argmax/argmin for these too.
        _composite(
            "nanargmax",
            "arg",
            "argmax",
            _always(np.int64),
            _extreme_accumulator,
            empty_allowed=False,
            skips_nan=True,
            largest=True,
        ),
        _composite(
            "nanargmin", "arg", "argmin", _always(np.int64), _extreme_accumulator, empty_allowed=False, skips_nan=True
        ),
    )
}

#: The ops with a GPU kernel (a C++ functor in ``kernels/multireduce/reduce.cuh``).
KERNEL_OPS: tuple[str, ...] = tuple(name for name, op in OPS.items() if op.functor is not None)


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
