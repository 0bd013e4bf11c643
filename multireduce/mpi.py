"""Reductions across MPI ranks: the core reduction of each rank's shard plus one Allreduce.

Importing this module imports ``mpi4py.MPI``, which initializes MPI; ``import multireduce``
alone does not. Every function that takes ``comm`` is collective over it (``None`` means
``MPI.COMM_WORLD``) unless its docstring says otherwise.

Errors never leave ranks waiting in a collective: each collective here first agrees, in the
same Allreduce that carries the partial where possible, on whether any rank failed. If one
did, every rank raises: the failing rank its own exception, the others :class:`RankError`
naming the failing rank and its message. That agreement is one record of one length for every
function here, and it names the function (and for :func:`allreduce` the op): ranks in
different functions meet in it and all raise ``ValueError("call differs across ranks")``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    from mpi4py import MPI
except (ImportError, RuntimeError) as exc:
    # mpi4py missing, or installed without an MPI library (mpi4py 4: "RuntimeError: cannot
    # load MPI library"): the extra that brings both, named.
    if isinstance(exc, RuntimeError) and "cannot load MPI library" not in str(exc):
        raise
    raise ImportError(
        f"multireduce.mpi needs mpi4py and an MPI library ({exc}); install them with: pip install 'multireduce[mpi]'"
    ) from exc

from . import _devices, _exact, _partials, _settings, _stats, core
from ._shards import FileLayout, inspect_file, shard_counts, shard_range
from ._shards import read_shard as _read_layout_shard
from ._transport import (
    CUDA_AWARE_ENV,
    CudaAwareness,
    decide_cuda_aware,
    decode_extreme_scalar,
    encode_extreme,
    encode_extreme_scalar,
    mpix_probe,
    openmpi_cvar_probe,
    sum_wire_dtype,
)
from .ops import OPS, SUPPORTED_DTYPES, Op, cast_result, get_op

__all__ = [
    "CUDA_AWARE_ENV",
    "DEVICE_ENV",
    "CudaAwareness",
    "FileLayout",
    "RankError",
    "agree",
    "allreduce",
    "cuda_aware",
    "describe_failures",
    "inspect_file",
    "local_rank",
    "rank_failures",
    "read_shard",
    "select_device",
    "shard",
    "stats",
    "shard_counts",
    "shard_range",
    "transport_counts",
]

#: Environment variable that overrides the GPU a rank uses (a device ordinal).
DEVICE_ENV = "MULTIREDUCE_DEVICE"

_FAILURES_ATTR = "_multireduce_rank_failures"
_OP_CODES = {name: i + 1 for i, name in enumerate(OPS)}
#: What stats() agrees as in the op's slot, and lists for its rank: a call of its own. Its
#: moments travel as allreduce(x, "mean")'s do, so with mean's code a rank in stats() paired
#: with one in allreduce(x, "mean") unnoticed: each returned a different thing, and for an
#: all-empty global array the stats ranks raised while the others waited in the Allgather.
_STATS_CALL = "mpi.stats()"
_OP_CODES[_STATS_CALL] = len(OPS) + 1
#: The largest code of a reduction in the op's slot; the other calls' codes come after it.
_LAST_REDUCTION_CODE = len(OPS) + 1
#: What the other collective functions agree as in the op's slot (the same record: the
#: Allreduce of a rank in one of them meets that of a rank in allreduce or stats, and each
#: learns what the other called). local_rank and select_device share a code: both begin with
#: the same Split_type, and the CLI's GPU ranks call select_device while its CPU ranks call
#: local_rank.
_CALL_CODES = {
    "mpi.agree()": _LAST_REDUCTION_CODE + 1,
    "mpi.read_shard()": _LAST_REDUCTION_CODE + 2,
    "mpi.local_rank()": _LAST_REDUCTION_CODE + 3,
    "mpi.select_device()": _LAST_REDUCTION_CODE + 3,
    "python -m multireduce": _LAST_REDUCTION_CODE + 4,  # the CLI's agreement on its arguments
}
_DTYPE_CODES = {dt: i + 1 for i, dt in enumerate(SUPPORTED_DTYPES)}
_CODE_DTYPES = {code: dt for dt, code in _DTYPE_CODES.items()}

# How combines moved their partials: NumPy partials ("host"), CuPy partials copied to host
# memory for a non-CUDA-aware MPI ("staged"), CuPy buffers handed to MPI ("device").
_transport_counts = {"host": 0, "staged": 0, "device": 0}
_cuda_aware: CudaAwareness | None = None
#: allreduce()'s default correction, compared by identity on the per-call path.
_NO_CORRECTION = 0.0


class RankError(RuntimeError):
    """Raised on the ranks that did not fail when another rank of a collective failed.

    Attributes
    ----------
    failures : dict of int to str
        ``{rank: "ExceptionType: message"}`` for every rank that failed.
    """

    def __init__(self, failures: dict[int, str], size: int | None = None):
        self.failures = dict(failures)
        super().__init__(describe_failures(self.failures, size))


def describe_failures(failures: dict[int, str], size: int | None = None) -> str:
    """One line per distinct message, naming the ranks that raised it (``"rank 1 of 4: ..."``)."""
    return _by_rank(failures, "" if size is None else f" of {size}", " failed")


def _by_rank(values: dict[int, str], of: str = "", verb: str = "") -> str:
    """One line per distinct value, naming the ranks that hold it (``"ranks 0, 2: value"``)."""
    by_message: dict[str, list[int]] = {}
    for rank, message in sorted(values.items()):
        by_message.setdefault(message, []).append(rank)
    lines = []
    for message, ranks in by_message.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_rank_list(ranks)}"
        lines.append(f"{who}{of}{verb}: {message}")
    return "\n".join(lines)


def _rank_list(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def rank_failures(exc: BaseException) -> dict[int, str] | None:
    """``{rank: message}`` if ``exc`` was raised on every rank by a collective agreement.

    The CLI uses this to tell errors that every rank knows about (print once, exit) from
    errors on one rank alone (abort the job, or the other ranks would wait forever).
    """
    return getattr(exc, _FAILURES_ATTR, None)


def _mark(exc: BaseException, failures: dict[int, str]) -> BaseException:
    setattr(exc, _FAILURES_ATTR, dict(failures))
    return exc


def _comm(comm):
    if comm is None:
        return MPI.COMM_WORLD
    # A communicator's interface (mpi4py's Comm, or a wrapper of one); checked here, the same
    # on every rank, so that a wrong object fails with its name before any collective.
    # An intercommunicator is one on every rank of it (both groups see it so): refused alike,
    # where MPI's in-place Allreduce failed with "sendbuf cannot be MPI_IN_PLACE".
    is_inter = getattr(comm, "Is_inter", None)
    inter = is_inter is not None and is_inter()
    if inter or not all(hasattr(comm, name) for name in ("Allreduce", "Get_rank", "Get_size")):
        kind = "an intercommunicator" if inter else f"{comm!r} of type {type(comm).__name__}"
        raise TypeError(
            f"comm must be an mpi4py.MPI.Comm (an intracommunicator such as MPI.COMM_WORLD), or None for "
            f"MPI.COMM_WORLD; got {kind}"
        )
    return comm


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException as err:  # the allgather of the failures must still happen on this rank
        text = f"(its str() raised {type(err).__name__})"
    return f"{type(exc).__name__}: {text}"


def _raise_failures(comm, error: BaseException | None) -> None:
    # Only reached when the flag Allreduce said some rank failed, so its cost does not matter.
    messages = comm.allgather(None if error is None else _describe(error))
    failures = {rank: m for rank, m in enumerate(messages) if m is not None}
    if error is not None:
        raise _mark(error, failures)
    raise _mark(RankError(failures, comm.Get_size()), failures)


def _raise_everywhere(comm, exc: BaseException) -> None:
    """Raise ``exc``, which every rank raises alike, marked as every rank's failure."""
    raise _mark(exc, dict.fromkeys(range(comm.Get_size()), _describe(exc)))


def _raise_mismatch(comm, name: str, local: Any, exc_type: type[Exception]) -> None:
    """Raise ``exc_type("NAME differs across ranks:")`` on every rank, listing each rank's value.

    Collective: call it on every rank once the agreement has shown that ``name`` differs
    (the agreement's result is the same on every rank, so all of them get here).
    """
    listing = _by_rank(dict(enumerate(comm.allgather(str(local)))))
    _raise_everywhere(comm, exc_type(f"{name} differs across ranks:\n{listing}"))


#: The (code, ~code) slot pairs of the agreement record that :func:`_agree_values` fills with
#: its checks (those that allreduce uses for the input dtype, dtype=, reproducible= and
#: correction=).
_VALUE_SLOTS = (1, 5, 9, 11)
#: The agreement's slot of the op's code (reductions) or of the call's (_CALL_CODES).
_CALL_SLOT = 3


def _decide(comm, meta: np.ndarray, error: BaseException | None, checks: tuple, shown) -> None:
    """What the agreement Allreduce of ``meta`` decided, raised on every rank alike.

    The one decision of every collective function here, in this order:

    1. if some rank failed (``meta[0]``), its failures (:func:`_raise_failures`);
    2. if some rank is in another function (its code in :data:`_CALL_SLOT` is one of
       :data:`_CALL_CODES`, above every reduction's), ``ValueError("call differs across
       ranks")``, listing each rank's call;
    3. the first ``(slot, name, exc_type)`` of ``checks`` whose code differs across ranks:
       ``exc_type("NAME differs across ranks")``, listing each rank's value.

    Each code travels with its complement (:func:`_meta`), so that MAX gives both the largest
    and the smallest code over the ranks: they are equal where ``m[slot] == ~m[slot + 1]``.
    ``shown()`` gives this rank's ``(call, value per check)`` as the errors list them; it is
    called only where something differs, so a rank that failed never reaches it.
    """
    if meta[0]:
        _raise_failures(comm, error)
    m = meta.tolist()
    for slot, _, _ in checks:
        if m[slot] != ~m[slot + 1]:
            break
    else:
        return  # the common case: every code agreed
    call, *values = shown()
    if m[_CALL_SLOT] != ~m[_CALL_SLOT + 1] and m[_CALL_SLOT] > _LAST_REDUCTION_CODE:
        _raise_mismatch(comm, "call", call, ValueError)
    for (slot, name, exc_type), value in zip(checks, values, strict=True):
        if m[slot] != ~m[slot + 1]:
            _raise_mismatch(comm, name, value, exc_type)


def _agree_values(
    comm, error: BaseException | None, call: str, checks: tuple[tuple[str, int, Any, type[Exception]], ...] = ()
) -> None:
    """The agreement of ``call`` (a key of :data:`_CALL_CODES`) in one Allreduce of allreduce's record.

    It agrees on ``error`` (as :func:`agree`), then on the call, then on values that must be
    equal on every rank; the record is the one that :func:`allreduce` agrees in
    (:data:`_META_SIZE`), decided by :func:`_decide`.

    ``checks`` holds ``(name, code, shown, exc_type)`` per value (at most four), as many on
    every rank of the same call: ``code`` is an int64 that two ranks share exactly when their
    values are equal, ``shown`` what the error lists for this rank (a rank that failed may pass
    anything: its failure is raised first).
    """
    slots = _VALUE_SLOTS[: len(checks)]  # zip(strict=True) refuses more checks than slots
    meta = np.zeros(_META_SIZE, dtype=np.int64)
    meta[0] = error is not None
    code = _CALL_CODES[call]
    meta[_CALL_SLOT], meta[_CALL_SLOT + 1] = code, ~code
    for slot, (_, value, _, _) in zip(slots, checks, strict=True):
        meta[slot], meta[slot + 1] = value, ~value
    comm.Allreduce(MPI.IN_PLACE, meta, op=MPI.MAX)
    table = ((_CALL_SLOT, "call", ValueError),) + tuple(
        (slot, name, exc_type) for slot, (name, _, _, exc_type) in zip(slots, checks, strict=True)
    )
    _decide(comm, meta, error, table, lambda: (call, call, *(c[2] for c in checks)))


def _agree(
    comm, static: _Static | None, meta: np.ndarray, error, *, empty_error=None, options: tuple = (False, 0.0)
) -> None:
    """The agreement Allreduce of ``meta`` (in place, :func:`_meta`), then what it decided.

    On every rank alike (:func:`_decide`): the failures if any rank failed, a rank in another
    function, a mismatch across ranks of the input dtype, the op, ``dtype=``, ``reproducible=``
    or ``correction=`` (``options`` is this rank's ``(reproducible, correction)``, for the
    message), and ``empty_error()`` (if given) if every shard is empty.
    """
    comm.Allreduce(MPI.IN_PLACE, meta, op=MPI.MAX)
    _decide(comm, meta, error, _AGREED, lambda: _shown(static, options))
    if empty_error is not None and not meta[7]:
        _raise_everywhere(comm, empty_error())


def _shown(st: _Static, options: tuple) -> tuple:
    """A reduction's call and agreed values as the agreement's errors list them (:data:`_AGREED`)."""
    call = st.call if st.call == _STATS_CALL else f"mpi.allreduce(op={st.call!r})"
    return (call, st.in_dtype.name, st.call, None if st.requested is None else st.requested.name, *options)


def agree(error: BaseException | None, comm=None) -> None:
    """Agree on errors: raise on every rank if any rank passes an exception (collective).

    Call it with the exception a rank caught in a local step (or ``None``), before the next
    collective, so that no rank enters a collective that a failed rank will never reach.

    Parameters
    ----------
    error : BaseException or None
    comm : mpi4py.MPI.Comm, optional

    Raises
    ------
    BaseException
        On a rank that passed an exception: that exception.
    RankError
        On the other ranks, if any rank passed one. Both carry the map of failures
        (:func:`rank_failures`).
    ValueError
        On every rank, if no rank passed an exception but some rank is in another collective
        function of this module (``"call differs across ranks"``, listing each rank's call).

    Examples
    --------
    >>> try:  # doctest: +SKIP
    ...     x = read_local_data()
    ... except Exception as exc:
    ...     agree(exc)
    ... else:
    ...     agree(None)
    """
    if error is not None and not isinstance(error, BaseException):
        # Still agreed (the other ranks must not wait), as the caller's mistake.
        error = TypeError(f"agree takes an exception or None, not {type(error).__name__}: {error!r}")
    _agree_values(_comm(comm), error, "mpi.agree()")


def _is_cupy(x: Any) -> bool:
    # The module name check keeps CuPy unimported for NumPy input (as core does).
    return type(x).__module__.startswith("cupy")


@dataclass(frozen=True)
class _Static:
    """What a combine needs to know that depends only on (op, input dtype, dtype=)."""

    op: Op
    in_dtype: np.dtype
    requested: np.dtype | None
    result: np.dtype
    acc: np.dtype
    wire: np.dtype  # sums only
    positive: bool  # max (True) or min (False)
    codes: tuple[int, int, int]
    call: str  # what the agreement compares and lists for the op: the op's name, or _STATS_CALL


@functools.lru_cache(maxsize=256)
def _static(op: Op, in_dtype: np.dtype, requested: np.dtype | None, call: str | None = None) -> _Static:
    # Cached because the dtype rules cost more than the MPI call for a scalar partial.
    # Errors (unsupported dtypes) are raised, not cached. ``call`` (stats() passes
    # _STATS_CALL) replaces the op's name in the agreement.
    result = op.result_dtype(in_dtype, requested)
    acc = op.accumulator_dtype(result)
    call = op.name if call is None else call
    codes = (
        _DTYPE_CODES[np.dtype(in_dtype)],
        _OP_CODES[call],
        0 if requested is None else _DTYPE_CODES[requested],
    )
    positive = op.mpi_name == "MAX"
    return _Static(op, np.dtype(in_dtype), requested, result, acc, sum_wire_dtype(acc), positive, codes, call)


# Fold ops whose partials travel as numbers; the others (MAX/MIN) travel as ordered keys.
_MPI_ARITH = {"SUM": MPI.SUM, "PROD": MPI.PROD}


def _arith(st: _Static) -> bool:
    return st.op.mpi_name in _MPI_ARITH


@dataclass
class _Plan:
    static: _Static
    count: int
    on_gpu: bool
    device: int | None
    # The arguments that the agreement checks beyond _Static's codes (see _meta).
    reproducible: bool = False
    correction: float = 0.0

    @property
    def op(self) -> Op:
        return self.static.op

    @property
    def options(self) -> tuple[bool, float]:
        return self.reproducible, self.correction


def _plan(x: Any, op, dtype, call: str | None = None) -> tuple[_Plan, Any]:
    op = get_op(op)
    on_gpu = _is_cupy(x)
    if not (on_gpu or isinstance(x, np.ndarray)):
        x = np.asarray(x)
    static = _static(op, x.dtype, None if dtype is None else np.dtype(dtype), call)
    return _Plan(static, x.size, on_gpu, x.data.device_id if on_gpu else None), x


def _local_partial(x: Any, plan: _Plan):
    """The rank's own partial: a fold op's value, or a moments or arg op's state."""
    if plan.op.kind != "fold":
        return core.partial(x, plan.op)
    if plan.static.requested is None:
        if plan.on_gpu and x.size and not cuda_aware().enabled:
            # The kernel writes the partial straight into a pinned host slot (_Staging.slot).
            return core.partial(x, plan.op.name, out=_Staging.slot(plan))
        return core.partial(x, plan.op)
    # dtype= converts the elements first, and the partial is in its accumulator dtype.
    return core.partial(x, plan.op, dtype=plan.static.requested)


def allreduce(
    x_local: Any,
    op: str | Op,
    *,
    comm=None,
    dtype: Any = None,
    correction: float = _NO_CORRECTION,
    reproducible: bool = False,
):
    """Reduce the shards of all ranks with ``op``; every rank gets the global result.

    Each rank reduces its own shard with :func:`multireduce.core.partial` (on its GPU for a
    CuPy array), and the partials are combined by one ``MPI_Allreduce`` (two for sums and
    products, whose partials cannot share the buffer of the error agreement, and for every op
    where some rank hands MPI a device buffer, see Notes). The result equals
    :func:`multireduce.reduce` of the concatenation of all shards (each flattened in C order,
    in rank order), up to the order of floating-point additions.

    Fold ops (sum, prod, max, min, count_nonzero, any, all, nansum, nanprod, nanmax, nanmin) combine
    their partials inside the Allreduce. Moments ops (mean, nanmean, var, std, nanvar, nanstd) and arg ops
    (argmin, argmax) agree in the same first Allreduce, then gather their small states
    (:mod:`multireduce._stats`) and merge them in rank order with the core's merge: Chan et
    al.'s update for moments, and (value, int64 global index) pairs for argmin/argmax, whose
    indices count elements of the concatenation.

    Parameters
    ----------
    x_local : numpy.ndarray or cupy.ndarray
        This rank's shard, of any shape, possibly empty. All ranks must pass the same dtype.
    op : str or Op
        Any of ``multireduce.OPS``, the same on every rank, for NumPy and CuPy shards alike.
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``MPI.COMM_WORLD``.
    dtype : dtype, optional
        Result dtype, for sum, prod, nansum and nanprod only (as :func:`multireduce.reduce`); the
        same on every rank.
    correction : float, optional
        For var, std, nanvar and nanstd, as in :func:`multireduce.var`; the same on every
        rank (compared exactly, by value: -0.0 and 0.0 are the same).
    reproducible : bool, optional
        The same on every rank (compared as a bool, for every op). For float sum and mean:
        each rank forms the exact sum of its shard (:class:`multireduce._exact.ExactSum`), the
        integer limbs are added by one integer ``MPI_SUM`` (exact, so independent of rank
        count, split and combine order), and the total is rounded once: the result is bitwise
        identical to ``multireduce.sum(concatenation, reproducible=True)`` on one rank. The
        mean of integer or bool shards is reproducible as it is (``float64(exact total) /
        n``, the same bits at any rank count), where the global ``n * max(|x|) < 2**62``;
        elsewhere every rank raises the core's NotImplementedError. Other ops as in
        :func:`multireduce.reduce`.

    Returns
    -------
    numpy.generic or cupy.ndarray
        A NumPy scalar for NumPy shards, a 0-d CuPy array on the shard's device for CuPy
        shards; the dtype is that of :func:`multireduce.reduce`. Every rank gets the same
        value, bit for bit.

    Raises
    ------
    TypeError
        On every rank if the ranks' dtypes (or ``dtype=``) differ; on a rank with an
        unsupported dtype.
    ValueError
        On every rank for max, min, nanmax, nanmin, argmin, argmax when all shards are empty
        (NumPy's message); on a rank given an unknown op; on every rank if the ranks' ops
        differ (``"op differs across ranks"``; a rank in :func:`stats` lists
        ``mpi.stats()``), or their ``reproducible=`` (``"reproducible= differs across
        ranks"``) or ``correction=`` (``"correction= differs across ranks"``); the message
        lists each rank's value. On every rank if some rank is in another collective function
        of this module (:func:`agree`, :func:`read_shard`, :func:`local_rank`,
        :func:`select_device`): ``"call differs across ranks"``, listing each rank's call.
    NotImplementedError
        With ``reproducible=True``, where :func:`multireduce.reduce` of the concatenation
        raises it (var, prod, ...), on every rank.
    RankError
        On the other ranks when some rank raised.

    Notes
    -----
    Partials travel in the op's accumulator dtype (float32 sums as float64, integer sums in
    64 bits, float16 as float32), so nothing is rounded before the final cast. Empty shards
    contribute the op's identity. Max and min propagate NaN and order ``-0.0 < +0.0``
    (IEEE 754-2019) whatever the order in which MPI combines ranks; see
    :mod:`multireduce._transport`. GPU partials are handed to MPI as device buffers (after a
    stream synchronization) if :func:`cuda_aware` says so, and staged through host memory
    otherwise (the reduction kernel writes the partial straight into pinned, device-mapped
    host memory; only ``dtype=`` partials and empty shards are copied there);
    :func:`transport_counts` records which. Ranks may mix NumPy and CuPy shards (each gets
    its result as its shard's kind): where some rank hands MPI a device buffer, the agreement
    says so, and for max/min-type ops every rank then combines the keys in one more Allreduce
    (the device rank's key is not in the agreement's record). Every combine ends on the host
    (a device buffer's combined 8 bytes come back through the stream's pinned slot), and a GPU
    result is a 0-d CuPy array over a cell of pinned host memory mapped into the device's
    address space (the CPU stores the value; no copy is queued on the stream, and kernels read
    the cell over the host link). Such a cell is reused only once nothing references the
    result, and only after the stream's work queued before then has finished; work on another
    stream that reads a result must be finished before the result is dropped, as for CuPy's
    pool memory. Whatever can fail on one rank (the local reduction, waiting for the stream,
    taking the result's cells, which may allocate pinned memory) happens before the first
    Allreduce, whose agreement makes every rank raise if one failed; after it a rank makes only
    the collectives, host arithmetic and stores into those cells (and, handing MPI a device
    buffer, the 8-byte copy back from it, which fails only if the device itself has failed).

    NumPy's warnings come as NumPy gives them, on the ranks that meet them: a rank's local
    reduction that overflows warns on that rank, and the final cast of the combined value to
    the result dtype (a float16 sum past 65504: ``RuntimeWarning: overflow encountered in
    reduce``, NumPy's words for its own float16 sum), which every rank makes alike on the
    same value, warns on every rank. Each rank
    follows its own ``numpy.errstate`` and warning filters there, so ``over="raise"`` raises
    ``FloatingPointError`` on every rank alike, after the collectives. MPI's addition of the
    partials cannot warn: a float64 sum whose partials only overflow there is inf without a
    warning. A program that prints diagnostics once gathers them to one rank, as
    ``python -m multireduce`` does.

    Examples
    --------
    Under ``mpiexec -n 4``, each rank holding ``np.arange(rank * 10, rank * 10 + 10)``:

    >>> allreduce(x_local, "sum")  # doctest: +SKIP
    np.int64(780)
    """
    if dtype is None and reproducible is False and correction is _NO_CORRECTION and type(op) is str:
        try:
            fast = _fast_entry(x_local, op)
        except BaseException as exc:  # agreed with the other ranks in _combine, then re-raised
            return _combine(_comm(comm), None, None, exc)
        if fast is not None:
            return _fast_allreduce(_comm(comm), x_local, fast)
    comm = _comm(comm)
    plan = partial = error = None
    exact = False
    try:
        plan, x = _plan(x_local, op, dtype)
        correction = core._check_correction(plan.op, correction)
        plan.reproducible = core._checked_reproducible(reproducible)  # agreed across ranks
        plan.correction = correction
        st = plan.static
        # Decided from (op, dtype, dtype=), which the first Allreduce checks across ranks; the
        # core's refusals (var, prod, nansum, ...) are raised here, agreed below.
        exact = reproducible and core._needs_exact(st.in_dtype, st.op, st.result, True)
        if exact:  # of the elements converted as dtype= asks, as the core does
            partial = core.partial(x, plan.op, dtype=st.requested, reproducible=True)
    except BaseException as exc:  # agreed with the other ranks in _combine, then re-raised
        error = exc
    if exact:
        return _combine_exact(comm, plan, partial, error)
    try:
        if error is None:
            partial = _local_partial(x, plan)
    except BaseException as exc:  # agreed with the other ranks in _combine, then re-raised
        error = exc
    return _combine_partial(comm, plan, partial, error)


def _combine_partial(comm, plan: _Plan | None, partial, error):
    """Combine a :func:`_local_partial`: states gathered and merged, fold values in the Allreduce."""
    if error is None and plan.op.kind != "fold":
        return _combine_states(comm, plan, partial, plan.correction)
    return _combine(comm, plan, partial, error)


def _combine_exact(comm, plan: _Plan, acc, error):
    """Agree, then add every rank's exact accumulator with one integer Allreduce."""
    reserved = packed = None
    if error is None:
        try:  # before the agreement, as everything that may fail on one rank (see _reserve_cells)
            # Normalized limbs are below 2**32, so up to 2**31 ranks add without overflow.
            packed = acc.normalize().to_array()
            if plan.on_gpu:
                reserved = _reserve_cells(plan, 1)
        except BaseException as exc:  # agreed below, then re-raised on this rank
            error = exc
    _agree(comm, plan.static, _meta(plan, error), error, options=plan.options)
    _transport_counts["host"] += 1
    comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.SUM)
    value = _exact.ExactSum.from_array(packed).result(plan.static.result, mean=plan.op.name == "mean")
    if reserved is not None:
        return _store(reserved, [value])[0]  # ExactSum.result gives a scalar of the result dtype
    return value


def stats(x_local: Any, *, comm=None, correction: float = 0.0) -> _stats.Stats:
    """:func:`multireduce.stats` of the concatenation of all ranks' shards (collective).

    Each rank computes the :class:`multireduce._stats.Moments` state of its shard in one
    pass; the states are gathered and merged in rank order with the core's
    :func:`multireduce._stats.merge` (Chan et al.'s update), so that every rank gets the same
    bits.

    Parameters
    ----------
    x_local : numpy.ndarray or cupy.ndarray
        This rank's shard, possibly empty. All ranks must pass the same dtype. A CuPy shard's
        state comes from the fused GPU moments kernel.
    comm : mpi4py.MPI.Comm, optional
    correction : float, optional
        For the variance, as in :func:`multireduce.var`; the same on every rank (compared
        exactly, by value).

    Returns
    -------
    multireduce.Stats
        The same on every rank: NumPy scalars, or 0-d CuPy arrays on the shard's device for a
        CuPy shard (as :func:`multireduce.stats`). The merged state is finalized on the host
        by the rules of the GPU's finalize kernel (the same bits; the GPU tests compare the
        two), and a CuPy shard's fields are result cells, as :func:`allreduce`'s results.

    Raises
    ------
    TypeError
        On every rank if the ranks' dtypes differ; on a rank with an unsupported dtype or a
        ``correction`` that is not a real number.
    ValueError
        On every rank if all shards are empty, or if ``correction`` differs across ranks
        (``"correction= differs across ranks"``, listing each rank's), or if another rank is
        in :func:`allreduce` (``"op differs across ranks"``, listing ``mpi.stats()`` for the
        ranks here and the op for the others; ``"mean"`` too, whose moments stats exchanges),
        or if another rank is in another collective function of this module (``"call differs
        across ranks"``).
    RankError
        On the other ranks when some rank raised.
    """
    comm = _comm(comm)
    plan = state = error = None
    try:
        # The moments of "mean", agreed as a call of their own (_STATS_CALL).
        plan, x = _plan(x_local, "mean", None, _STATS_CALL)
        correction = core._check_correction(get_op("var"), correction)
        plan.correction = correction  # agreed across ranks
        # var's state, whose squares warn where they overflow, as multireduce.stats's
        # (mean's leaves that warning out: NumPy's mean squares nothing).
        state = core.partial(x, "var")
    except BaseException as exc:  # agreed with the other ranks in _combine, then re-raised
        error = exc
    if error is not None:
        return _combine(comm, plan, None, error)
    return _combine_states(comm, plan, state, correction, stats=True)


_STATS_FIELDS = _stats._field_names(_stats.Stats)


def _combine_states(comm, plan: _Plan, state, correction: float, *, stats: bool = False):
    """Combine moments or arg states, merged in rank order on every rank; finalized.

    One agreement Allreduce (the same as :func:`_combine`'s first), then an allgather of
    the small states. Returns the op's result, or with ``stats`` a :class:`multireduce.Stats`;
    for a GPU shard in result cells reserved before the agreement (:func:`_reserve_cells`).
    """
    st = plan.static
    empty_error = _stats.empty_stats_error if stats else (None if st.op.empty_allowed else st.op.empty_error)
    error = reserved = None
    if plan.on_gpu:
        try:
            reserved = _reserve_cells(plan, len(_STATS_FIELDS) if stats else 1)
        except BaseException as exc:  # agreed below, then re-raised on this rank
            error = exc
    _agree(comm, st, _meta(plan, error), error, empty_error=empty_error, options=plan.options)
    _transport_counts["host"] += 1
    # One layout on every rank (an empty shard's arg state has the input's value dtype too).
    layout = (_stats.moments_dtype if st.op.kind == "moments" else _stats.arg_dtype)(st.in_dtype)
    records = _allgather_state(comm, state, layout, plan.count)
    if st.op.kind == "moments":
        merged = _stats.merge_records(records)
        if plan.reproducible and st.op.name == "mean" and st.in_dtype.kind in "biu":
            # The core's check, on the global count and extremes (each shard's may pass while
            # the whole does not); the merged state is the same on every rank, and so is this.
            refused = core._integer_mean_error(st.in_dtype, merged.n, merged.lo, merged.hi)
            if refused is not None:
                _raise_everywhere(comm, refused)
        if stats:
            result = _stats.finalize_stats(merged, st.in_dtype, correction, value_warnings=not plan.on_gpu)
            if reserved is None:
                return result
            return _stats.Stats(*_store(reserved, [getattr(result, name) for name in _STATS_FIELDS]))
        value = _stats.finalize_moments(merged, st.op, st.result, correction, value_warnings=not plan.on_gpu)
    else:
        # argmin/argmax: a rank's indices are into its own shard; the global index adds the
        # number of elements on the ranks before it (shards concatenate in rank order).
        pairs = []
        offset = 0
        for record in records:
            index = int(record["index"])
            pairs.append((record["value"], index + offset if index >= 0 else index))
            offset += int(record["count"])
        merged = _stats.arg_merge_pairs(pairs, largest=st.op.largest, nan_wins=st.op.nan_wins)
        try:
            value = _stats.arg_finalize(merged, st.op)
        except ValueError as exc:  # nanargmax/nanargmin of NaN only: from the merged state, every rank's
            _raise_everywhere(comm, exc)
    return value if reserved is None else _store(reserved, [value])[0]


@functools.lru_cache(maxsize=64)
def _wire_dtype(layout: np.dtype) -> np.dtype:
    """A state's record as it travels: the state's fields, then the shard's element count."""
    return np.dtype(layout.descr + [("count", np.int64)])


def _allgather_state(comm, state, layout: np.dtype, count: int) -> np.ndarray:
    """Every rank's 0-d state and element count: one record per rank, in rank order.

    The records (``layout``'s fields, then ``count``) travel as raw bytes in one ``Allgather``
    (the dtype agreement before it makes every rank's layout the same), never pickled.
    """
    wire = _wire_dtype(layout)
    mine = np.empty(1, dtype=wire)
    # One assignment casts each field to the layout's dtype.
    mine[0] = (*(getattr(state, name) for name in layout.names), count)
    every = np.empty(comm.Get_size(), dtype=wire)
    comm.Allgather(mine.view(np.uint8), every.view(np.uint8))
    return every


def _reserve_cells(plan: _Plan, count: int, *, synchronize: bool = True) -> tuple[_ResultCells, list]:
    """``count`` result cells of the current stream of a GPU shard's device, for :func:`_store`.

    Made before a combine's agreement, because once the agreement has passed every rank must
    finish the call as the others do: a step that fails on one rank alone after it leaves the
    others in their next collective. So whatever may fail is done here: the stream's slots
    are made if this is its first call, the cells reserved (taking one may allocate a block of
    pinned memory), and with ``synchronize`` the stream waited for (which raises an earlier
    asynchronous CUDA error here, and makes the cells safe to store into: see
    :class:`_ResultCells`). After the collectives a combine does only host arithmetic and
    stores into these cells.
    """
    import cupy

    with cupy.cuda.Device(plan.device):
        stream = cupy.cuda.get_current_stream()
        if synchronize:
            stream.synchronize()
        cells = _Staging.get(plan.device, stream.ptr).results
        return cells, [cells.reserve() for _ in range(count)]


def _store(reserved: tuple[_ResultCells, list], values: list) -> list:
    """Host results (NumPy scalars) stored into the cells of :func:`_reserve_cells`, as 0-d CuPy arrays, bit for bit."""
    cells, held = reserved
    out = []
    for cell, value in zip(held, values, strict=True):
        array, box = cells.result(cell, np.asarray(value).dtype)
        box[0] = value
        out.append(array)
    return out


def _timed_allreduce(
    x_local: Any, op: str | Op, comm=None, correction: float = _NO_CORRECTION
) -> tuple[Any, float, float]:
    """:func:`allreduce` split into its two phases for the CLI's timings.

    Returns ``(result, local_seconds, combine_seconds)`` on this rank: the local partial
    (a moments or arg op's state) including a stream synchronization, then the combine. A
    Barrier precedes each phase so that one rank's wait for another is not counted in the
    next phase. Every op, with its default arguments but ``correction`` (var and std).
    """
    comm = _comm(comm)
    plan = partial = error = None
    comm.Barrier()
    start = MPI.Wtime()
    try:
        plan, x = _plan(x_local, op, None)
        plan.correction = core._check_correction(plan.op, correction)  # agreed across ranks
        partial = _local_partial(x, plan)
        if plan.on_gpu:
            import cupy

            cupy.cuda.get_current_stream().synchronize()
    except BaseException as exc:  # agreed with the other ranks in _combine, then re-raised
        error = exc
    local = MPI.Wtime() - start
    comm.Barrier()
    start = MPI.Wtime()
    result = _combine_partial(comm, plan, partial, error)
    if plan.on_gpu:
        import cupy

        cupy.cuda.get_current_stream().synchronize()
    return result, local, MPI.Wtime() - start


class _Slots:
    """Pinned, device-mapped host memory for one (device, stream): the partial's slot and the results' cells.

    The slot (8 bytes) takes the partial going to MPI: the reduction kernel writes it there
    directly (:meth:`device_partial`), or, for a partial made elsewhere, an asynchronous copy
    does. Results come back in :attr:`results`. Nothing is allocated per call; the views per
    dtype are made once.
    """

    def __init__(self, device: int):
        import cupy

        self.device = device
        self.host, self.mapped = _partials.mapped_host_memory(cupy, 8)
        self.ptr = self.host.ctypes.data
        self.results = _ResultCells(device, cupy)
        self._device_views: dict[np.dtype, Any] = {}
        self._host_views: dict[np.dtype, np.ndarray] = {}

    def device_partial(self, dtype: np.dtype):
        """The slot as a 0-d CuPy array of ``dtype``: a kernel that writes it stores into host memory."""
        view = self._device_views.get(dtype)
        if view is None:
            import cupy

            view = self._device_views[dtype] = _partials.mapped_scalar(cupy, self.mapped, self.host, self.device, dtype)
        return view

    def host_view(self, dtype: np.dtype) -> np.ndarray:
        """The slot as a one-element NumPy array of ``dtype``."""
        view = self._host_views.get(dtype)
        if view is None:
            view = self._host_views[dtype] = self.host[: np.dtype(dtype).itemsize].view(dtype)
        return view


class _ResultCells:
    """The results of one (device, stream) as 0-d CuPy arrays over pinned, device-mapped host cells.

    A combine (every one ends on the host) hands its GPU caller a 0-d CuPy array
    whose memory is one 8-byte cell of pinned host memory mapped into the device's address
    space. The CPU stores the value, and the array is usable by kernels at once: nothing is
    allocated on the device, no copy is queued on the stream, and a later synchronization has
    nothing of it to wait for. (A kernel that reads the result reads it over the host link.)

    A cell goes out again only once nothing references the array handed out over it, a view of
    that array, or its memory: the reference counts of the cell's ``MemoryPointer`` and
    ``UnownedMemory`` are back at what this class alone holds. Its new value is stored only
    after the caller has synchronized the stream, so kernels queued on this stream before the
    old result was dropped have read it; this is CuPy's memory-pool rule (a freed block is
    reused in stream order), and as there, work on another stream that reads a result must be
    finished before the result is dropped. A call takes the first free cell after the last one
    handed out; a new block, as large as all before it, is added only when every cell is held,
    so there are at most twice as many cells as results ever held at once (or BLOCK), and a
    call that finds a run of held cells walks past them once.

    ``take`` is not thread-safe by itself: a (device, stream) pair is used by one call at a time
    (the partial's slot is shared the same way).
    """

    BLOCK = 32  # cells in the first block

    def __init__(self, device: int, cupy: Any):
        self.device = device
        self._cupy = cupy
        self._cells: list[tuple[Any, Any]] = []  # (UnownedMemory, MemoryPointer) per cell
        self._bytes: list[np.ndarray] = []  # the host bytes of each cell
        self._views: dict[tuple[int, np.dtype], np.ndarray] = {}
        self._next = 0
        self._free_refs: tuple[int, int] | None = None
        self._grow()

    @staticmethod
    def _refs(cell: tuple[Any, Any]) -> tuple[int, int]:
        return sys.getrefcount(cell[0]), sys.getrefcount(cell[1])

    def _grow(self) -> int:
        """Add a block (as many cells as there are, at least BLOCK); return its first cell."""
        cuda = self._cupy.cuda
        count = max(self.BLOCK, len(self._cells))
        host, mapped = _partials.mapped_host_memory(self._cupy, 8 * count)
        first = len(self._cells)
        for k in range(count):
            memory = cuda.UnownedMemory(mapped + 8 * k, 8, host, self.device)
            self._cells.append((memory, cuda.MemoryPointer(memory, 0)))
            self._bytes.append(host[8 * k : 8 * k + 8])
        if self._free_refs is None:
            self._free_refs = self._refs(self._cells[0])
        return first

    def take(self, dtype: np.dtype) -> tuple[Any, np.ndarray]:
        """A free cell as ``(0-d CuPy array of dtype, one-element NumPy view of its host bytes)``.

        Store the value through the view once the stream is synchronized (see the class notes).
        """
        return self.result(self.reserve(), dtype)

    def reserve(self) -> tuple[int, Any]:
        """A free cell, held for a result whose dtype is not known yet: ``(index, its MemoryPointer)``.

        The cell stays out of later calls while the caller holds the pointer; :meth:`result`
        makes its array. This is all that may allocate (a new block of pinned memory), so a
        combine reserves its cells before its collectives (see :func:`_reserve_cells`).
        """
        cells, n = self._cells, len(self._cells)
        k = self._next
        for _ in range(n):
            if k >= n:
                k = 0
            if self._refs(cells[k]) == self._free_refs:
                break
            k += 1
        else:
            k = self._grow()
        self._next = k + 1
        return k, cells[k][1]

    def result(self, reserved: tuple[int, Any], dtype: np.dtype) -> tuple[Any, np.ndarray]:
        """The reserved cell as ``(0-d CuPy array of dtype, one-element NumPy view of its bytes)``."""
        k, pointer = reserved
        box = self._views.get((k, dtype))
        if box is None:
            box = self._views[k, dtype] = self._bytes[k][: dtype.itemsize].view(dtype)
        return self._cupy.ndarray((), dtype, memptr=pointer), box


class _Staging:
    """The :class:`_Slots` of each (device, stream), made on first use.

    Streams are told apart by :func:`multireduce._partials.stream_id` (the per-thread default
    stream of each thread is its own).
    """

    _slots: dict[tuple, _Slots] = _partials.stream_cache({})

    @classmethod
    def get(cls, device: int, stream: int) -> _Slots:
        """The slots of the stream with handle ``stream`` on ``device``."""
        key = (device, _partials.stream_id(stream))
        found = cls._slots.get(key)
        if found is None:
            found = cls._slots[key] = _Slots(device)
        return found

    @classmethod
    def slot(cls, plan: _Plan):
        """The partial's slot of the current stream of ``plan.device`` as a 0-d CuPy array."""
        import cupy

        if cupy.cuda.runtime.getDevice() != plan.device:
            with cupy.cuda.Device(plan.device):
                return cls.slot(plan)
        return cls.get(plan.device, cupy.cuda.get_current_stream().ptr).device_partial(plan.static.acc)


def _to_host(partial, plan: _Plan) -> np.generic:
    """Bring a partial to host memory as a NumPy scalar: the one place that stages.

    For a CuPy partial: if the kernel did not write it into the pinned slot already
    (:meth:`_Slots.device_partial`; it did unless ``dtype=`` was given or the shard is empty),
    an asynchronous copy into the slot on the current stream; then a wait for that stream, so
    that the kernel that wrote the partial has finished.
    """
    if plan.on_gpu:
        import cupy

        _transport_counts["staged"] += 1
        runtime = cupy.cuda.runtime
        if runtime.getDevice() != plan.device:
            with cupy.cuda.Device(plan.device):
                return _to_host(partial, plan)
        stream = cupy.cuda.get_current_stream()
        slots = _Staging.get(plan.device, stream.ptr)
        if partial.data.ptr != slots.mapped:
            size = partial.dtype.itemsize
            runtime.memcpyAsync(slots.ptr, partial.data.ptr, size, runtime.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        return slots.host_view(partial.dtype)[0]
    _transport_counts["host"] += 1
    return partial


def _from_host(value: np.generic, plan: _Plan):
    """``value`` as a 0-d CuPy array for the partial's device, bit for bit (a -0.0 stays).

    The array is a result cell (:class:`_ResultCells`) of the current stream, which the caller
    must have synchronized since its last kernel. The combines reserve their cells before the
    agreement instead (:func:`_reserve_cells`); ``scripts/profile_mpi.py`` and
    ``scripts/diag_combine.py`` time this way back.
    """
    return _store(_reserve_cells(plan, 1, synchronize=False), [value])[0]


#: The agreement's slots: 0 the error flag; 1-6 the codes of (input dtype, op, dtype=), each
#: followed by its complement (stats() has an op code of its own, _STATS_CALL); 7 whether the
#: shard is non-empty; 8 the max/min key; 9-12 the codes of reproducible= and correction= with
#: their complements (_option_codes); 13 whether the rank combines on the device (CUDA-aware
#: MPI, CuPy shard), whose max/min key then travels in an Allreduce of its own that every rank
#: joins. Every collective function here agrees in this record: the others (_CALL_CODES) put
#: their code in the op's slots 3-4 and their own checks in slots 1-2, 5-6, 9-12
#: (_agree_values); _decide reads the agreed record for all of them.
_META_SIZE = 14
_DEVICE_SLOT = 13
#: What a rank that combines on the device puts in the key's slot: MAX's identity.
_KEY_IDENTITY = np.iinfo(np.int64).min
#: The (code, ~code) pairs of the agreement, in the order they are checked: slot, the name in
#: the error, and the error's type.
_AGREED = (
    (1, "input dtype", TypeError),
    (_CALL_SLOT, "op", ValueError),
    (5, "dtype=", TypeError),
    (9, "reproducible=", ValueError),
    (11, "correction=", ValueError),
)


def _option_codes(reproducible: bool, correction: float) -> tuple[int, int, int, int]:
    """Slots 9-12 of the agreement: ``reproducible`` and the bits of ``correction``, with complements.

    ``correction`` is compared exactly, by its bits, except that -0.0 counts as 0.0 and every
    NaN as one NaN (they give the same results).
    """
    correction = float(correction) + 0.0  # -0.0 + 0.0 is +0.0
    if correction != correction:
        correction = float("nan")
    bits = int(np.float64(correction).view(np.int64))
    return int(reproducible), ~int(reproducible), bits, ~bits


_DEFAULT_OPTION_CODES = _option_codes(False, 0.0)


@functools.lru_cache(maxsize=256)
def _meta_template(codes: tuple[int, int, int]) -> np.ndarray:
    meta = np.zeros(_META_SIZE, dtype=np.int64)
    for i, code in enumerate(codes):
        meta[1 + 2 * i] = code
        meta[2 + 2 * i] = ~code
    meta[9:13] = _DEFAULT_OPTION_CODES  # the default arguments, as the per-call path has them
    return meta


def _meta(plan: _Plan | None, error) -> np.ndarray:
    # The agreement travels as int64 under MAX: a code c and its complement ~c give both the
    # largest and (as ~max(~c)) the smallest code over ranks, so "all equal" is one Allreduce.
    # Slot 8 carries the max/min key, which reduces with MAX too. See _META_SIZE.
    if plan is None:
        meta = np.zeros(_META_SIZE, dtype=np.int64)
    else:
        meta = _meta_template(plan.static.codes).copy()
        meta[7] = plan.count > 0
        if plan.reproducible or plan.correction:
            meta[9:13] = _option_codes(plan.reproducible, plan.correction)
    meta[0] = error is not None
    return meta


def _combine(comm, plan: _Plan | None, partial, error):
    use_device = False
    host = wire = reserved = None
    meta = None
    if error is None:
        try:
            meta = _meta(plan, None)
            use_device = plan.on_gpu and cuda_aware().enabled
            if use_device:
                # The other ranks must make the key's Allreduce too (_global_value), to which
                # this rank's key goes; in the agreement it adds MAX's identity. The buffer is
                # made (and its kernels waited for) first, so that a failure there is agreed.
                meta[_DEVICE_SLOT] = 1
                meta[8] = _KEY_IDENTITY
                wire = _device_wire(plan, partial)
            else:
                host = _to_host(partial, plan)
                if not _arith(plan.static):
                    meta[8] = encode_extreme_scalar(host, plan.static.positive, plan.op.nan_wins)
            if plan.on_gpu:  # the result's cell, before the agreement (both paths waited above)
                reserved = _reserve_cells(plan, 1, synchronize=False)
        except BaseException as exc:  # agreed below, then re-raised on this rank
            error = exc
    if error is not None:
        meta = _meta(plan, error)
    # plan is None only where this rank failed, and then _agree raises before the empty check.
    empty_error = None if plan is None or plan.op.empty_allowed else plan.op.empty_error
    static, options = (None, (False, 0.0)) if plan is None else (plan.static, plan.options)
    _agree(comm, static, meta, error, empty_error=empty_error, options=options)
    st = plan.static
    if use_device:
        value = _combine_on_device(comm, plan, wire)
    else:
        value = _global_value(comm, st, host, meta)
    result = cast_result(value, st.result)
    if reserved is not None:
        return _store(reserved, [result])[0]
    return result


def _global_value(comm, st: _Static, host: np.generic, meta: np.ndarray, wire: np.ndarray | None = None):
    """The global value, in the accumulator dtype, once the agreement has run.

    Max and min: decoded from the key that the agreement carried (``meta[8]``), unless some
    rank combines on the device (``meta[_DEVICE_SLOT]``): its key was not in the agreement,
    and travels in one more Allreduce (:func:`_combine_on_device`'s), which this rank joins
    with the agreed key of the others. Sums and products: one more Allreduce of this rank's
    host partial, in ``wire`` if given (a one-element buffer of the wire dtype, reused by the
    caller) or in a new one; a rank that combines on the device makes the same one.
    """
    if not _arith(st):
        key = int(meta[8])
        if meta[_DEVICE_SLOT]:
            buf = np.array([key], dtype=np.int64)
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
            key = int(buf[0])
        return decode_extreme_scalar(key, st.positive, st.acc, st.op.nan_wins)
    if wire is None:
        wire = np.empty(1, dtype=st.wire)
    value = wire.view(st.acc)
    value[0] = host
    comm.Allreduce(MPI.IN_PLACE, wire, op=_MPI_ARITH[st.op.mpi_name])
    return _one_nan(value[0])


def _one_nan(value: np.generic) -> np.generic:
    """A sum's or product's combined value, with any NaN as the one quiet NaN (positive).

    MPI combines the partials in a different order on each rank, and a NaN that meets another
    NaN keeps the first operand's sign and payload: ranks holding NaNs of both signs got
    different bits. (Max and min carry one NaN key already.)
    """
    return value.dtype.type(np.nan) if value != value else value


def _device_wire(plan: _Plan, partial):
    """The one-element device buffer that a rank combining on the device hands MPI.

    The partial as the wire dtype (sums, products) or its key (max, min); made before the
    agreement, so that a failure here (a CUDA error surfacing at the synchronization, say) is
    agreed instead of leaving the other ranks in :func:`_combine_on_device`'s Allreduce.
    """
    import cupy

    st = plan.static
    with cupy.cuda.Device(plan.device):
        if _arith(st):
            buf = partial.astype(st.acc).reshape(1).view(st.wire)
        else:
            buf = encode_extreme(partial.reshape(1), st.positive, xp=cupy, nan_wins=st.op.nan_wins)
        # MPI reads the buffer outside CUDA's stream order: the kernels that wrote it must
        # have finished.
        cupy.cuda.get_current_stream().synchronize()
    return buf


def _combine_on_device(comm, plan: _Plan, buf) -> np.generic:
    """The combine of a rank that hands MPI its device buffer ``buf`` (:func:`_device_wire`), after the agreement.

    One Allreduce of the partial (sums, products) or of its key (max, min), both of one element;
    host ranks make the same one (:func:`_global_value`), because the agreement said that some
    rank combines on the device. Returns the global value in the accumulator dtype: the
    combined 8 bytes come back through the stream's pinned slot (made before the agreement, by
    :func:`_reserve_cells`) and are decoded on the host as the host ranks decode theirs, so
    that nothing after the collectives allocates memory or launches a kernel, which could fail
    on this rank alone.
    """
    import cupy

    st = plan.static
    _transport_counts["device"] += 1
    with cupy.cuda.Device(plan.device):
        comm.Allreduce(MPI.IN_PLACE, buf, op=_MPI_ARITH[st.op.mpi_name] if _arith(st) else MPI.MAX)
        stream = cupy.cuda.get_current_stream()
        slots = _Staging.get(plan.device, stream.ptr)
        runtime = cupy.cuda.runtime
        runtime.memcpyAsync(slots.ptr, buf.data.ptr, buf.nbytes, runtime.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
    if _arith(st):
        return _one_nan(slots.host_view(st.acc)[0])  # the wire's bits are the accumulator's
    key = int(slots.host_view(np.dtype(np.int64))[0])
    return decode_extreme_scalar(key, st.positive, st.acc, st.op.nan_wins)


class _Fast:
    """What :func:`_fast_allreduce` needs, made once.

    Per (op, dtype) for NumPy shards, per (op, dtype, device, stream) for CuPy shards. Only a
    GPU entry has the fields past ``stream``: the sum's wire buffer, the stream's partial slot
    (as a CuPy and a NumPy array) and its result cells, all used by one call at a time as the
    stream's slots always were. A NumPy entry holds nothing that a call writes, so that host
    callers in several threads (each with its own communicator) do not share a buffer.
    """

    __slots__ = (
        "static", "op", "acc", "meta", "arith", "device", "stream",
        "wire", "partial", "host_in", "results",
    )  # fmt: skip

    def __init__(self, static: _Static, device: int | None = None, stream: Any = None) -> None:
        self.static = static
        self.op, self.acc = static.op, static.acc
        meta = _meta_template(static.codes).copy()
        meta[7] = 1  # this shard is not empty
        self.meta = meta
        self.arith = _arith(static)
        self.device, self.stream = device, stream
        self.wire = None  # _global_value's buffer, reused (GPU entries of sums only)
        if stream is not None:
            if self.arith:  # reused as the stream's slots are
                self.wire = np.zeros(1, dtype=static.wire)
            slots = _Staging.get(device, stream.ptr)
            self.partial = slots.device_partial(static.acc)  # the slot, which the kernel writes
            self.host_in = slots.host_view(static.acc)
            self.results = slots.results


#: (op name, dtype) for NumPy shards, (op name, dtype, device, stream) for CuPy shards ->
#: _Fast, or None where the per-call path does not apply.
_fast: dict[tuple, _Fast | None] = _partials.stream_cache({}, stream_at=3, device_at=2)


def _fast_entry(x: Any, op: str) -> _Fast | None:
    """The per-call path's entry for ``allreduce(x, op)``, if it applies.

    It does for a non-empty shard and a fold op: a NumPy array, or a CuPy array on the current
    device with an MPI that is not CUDA-aware (every fold op has a GPU kernel).
    The main job's common case.
    """
    if type(x) is np.ndarray:
        if not x.size:
            return None
        key: tuple = (op, x.dtype)
        device = stream = None
    else:
        backend = core._cupy_backend
        if backend is None or type(x) is not backend.cupy.ndarray or not x.size:
            return None
        cupy = backend.cupy
        device = x.data.device_id
        if device != cupy.cuda.runtime.getDevice():
            return None
        stream = cupy.cuda.get_current_stream()
        ptr = stream.ptr
        key = (op, x.dtype, device, ptr if ptr != _partials._PER_THREAD_STREAM else _partials.stream_id(ptr))
    try:
        return _fast[key]
    except KeyError:
        pass
    entry = None
    resolved = OPS.get(op)
    if resolved is not None and resolved.kind == "fold" and x.dtype in _DTYPE_CODES:
        if stream is None or not cuda_aware().enabled:
            entry = _Fast(_static(resolved, x.dtype, None), device, stream)
    return _fast.setdefault(key, entry)


def _fast_allreduce(comm, x: Any, f: _Fast):
    """:func:`allreduce` on the per-call path (see :func:`_fast_entry`).

    The same steps and collective calls as the general path (:func:`_combine`), with
    everything looked up once: the local partial (on a GPU, the kernel writes it into the
    stream's pinned slot, and the result's cell is taken while it runs, then one wait), the
    agreement Allreduce (which carries the max/min key), the value Allreduce for sums and
    products, and on a GPU the result stored into its cell (:class:`_ResultCells`).
    """
    st = f.static
    try:
        if f.stream is None:
            host = core.partial(x, f.op)
            meta = f.meta.copy()
        else:
            core._cupy_backend.reduce_full(x, f.op, f.acc, f.acc, out=f.partial)
            # While the kernel runs: the result's cell (written after the wait) and the
            # agreement's buffer.
            out, box = f.results.take(st.result)
            meta = f.meta.copy()
            f.stream.synchronize()
            host = f.host_in[0]
        if not f.arith:
            meta[8] = encode_extreme_scalar(host, st.positive, f.op.nan_wins)
    except BaseException as exc:  # agreed with the other ranks in _combine, then re-raised
        return _combine(comm, _Plan(st, x.size, f.stream is not None, f.device), None, exc)
    _transport_counts["host" if f.stream is None else "staged"] += 1
    _agree(comm, st, meta, None)  # the shard is not empty: no empty-array error to agree on
    value = _global_value(comm, st, host, meta, f.wire)
    if f.stream is None:
        return cast_result(value, st.result)
    box[0] = value  # cast to the result dtype as value.astype would
    return out


def transport_counts() -> dict[str, int]:
    """How many combines on this rank moved their partial which way, since import.

    Keys: ``"host"`` (NumPy partials), ``"staged"`` (CuPy partials that went through pinned
    host memory because MPI is not CUDA-aware: written there by the kernel, or copied),
    ``"device"`` (CuPy buffers handed to MPI). Not collective.
    """
    return dict(_transport_counts)


def _mpi_library() -> ctypes.CDLL:
    # dlsym on the handle of mpi4py's extension searches the MPI library it links to, the
    # one actually in use, without guessing its file name.
    return ctypes.CDLL(MPI.__file__)


def cuda_aware(*, refresh: bool = False) -> CudaAwareness:
    """Whether GPU partials are handed to MPI as device buffers, and how it was decided.

    Sources, first answer wins: the environment variable ``MULTIREDUCE_CUDA_AWARE`` (``0`` or
    ``1``); ``MPIX_Query_cuda_support()`` where the MPI library exports it (Open MPI, MPICH);
    Open MPI's ``mpi_built_with_cuda_support`` parameter, read through the MPI tool interface
    (as ``ompi_info`` reports it); otherwise not CUDA-aware. The answer is cached; not
    collective.

    Raises
    ------
    ValueError
        If ``MULTIREDUCE_CUDA_AWARE`` is set to anything but 0 or 1.
    """
    global _cuda_aware
    if _cuda_aware is None or refresh:
        lib = _mpi_library()
        probes = [
            ("MPIX_Query_cuda_support", mpix_probe(lib)),
            ("Open MPI mpi_built_with_cuda_support", openmpi_cvar_probe(lib, MPI.Get_library_version())),
        ]
        _cuda_aware = decide_cuda_aware(probes)
        _fast.clear()  # its entries were made for the previous answer
    return _cuda_aware


def local_rank(comm=None) -> tuple[int, int]:
    """Return this rank's index among the ranks of ``comm`` on its node, and their number.

    Uses ``Split_type(COMM_TYPE_SHARED)``, after the agreement that every collective function
    here begins with: if some rank is in another of them, every rank raises
    ``ValueError("call differs across ranks")`` (a rank in :func:`select_device` is in the same
    call), or the failure if a rank passed one to :func:`agree`. A second agreement follows,
    which raises :class:`RankError` here if a rank in :func:`select_device` could not make
    its device current.
    """
    local, size, _ = _local_rank(_comm(comm), "mpi.local_rank()")
    return local, size


def _local_rank(comm, call: str, error: BaseException | None = None, then=None) -> tuple[int, int, Any]:
    """The node-local rank and size, between two agreements; and ``then(local)``'s value.

    Without the first agreement, a rank in the Split_type and one in another call's Allreduce
    waited for each other forever (MPICH); ``error`` is the caller's local failure, agreed
    there. The second agrees on what ``then`` (select_device's activation of its device)
    raises: without it, a rank whose device could not be made current raised alone, and the
    others went on to their next collective and waited there. local_rank() makes the same
    two agreements (with no ``then``), so that the CLI's CPU ranks, which call it while its
    GPU ranks call select_device, meet them in both.
    """
    _agree_values(comm, error, call)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        local, size = node.Get_rank(), node.Get_size()
    finally:
        node.Free()
    value = failure = None
    if then is not None:
        try:
            value = then(local)
        except BaseException as exc:  # agreed below, then re-raised on this rank
            failure = exc
    _agree_values(comm, failure, call)
    return local, size, value


def select_device(comm=None, *, device: int | None = None) -> int:
    """Choose and activate this rank's GPU; returns its ordinal.

    By default each rank takes device ``local_rank % device_count``, so that the ranks on a
    node spread over its GPUs (and share them when there are more ranks than GPUs).
    ``device=``, or else the environment variable ``MULTIREDUCE_DEVICE``, overrides it.
    Collective (the node-local rank needs ``Split_type``, after :func:`local_rank`'s
    agreement), even when overridden. The errors below, and CUDA's error if the device cannot
    be made current, are agreed with the other ranks (in ``select_device`` or
    :func:`local_rank`): the rank that has one raises it, and the others raise
    :class:`RankError` (without the agreement they went on to their next collective and
    waited there for the failed rank forever).

    Raises
    ------
    RuntimeError
        If CuPy sees no GPU.
    TypeError
        If ``device=`` is not an integer (a bool, a float or a string is not a device ordinal).
    ValueError
        If ``device=`` or ``MULTIREDUCE_DEVICE`` is not a device of this node (an integer
        from 0 to the device count - 1), or ``MULTIREDUCE_DEVICE`` is not an integer; the
        message names which of the two was wrong.
    RankError
        On the other ranks, if one rank raised any of these.
    """
    comm = _comm(comm)
    error = requested = count = None
    try:  # what does not need the node-local rank: checked before the first agreement
        count = _device_count()
        if count < 1:
            raise RuntimeError("select_device: CuPy sees no CUDA device")
        requested = _requested_device(device, count, os.environ)
    except BaseException as exc:  # agreed in _local_rank, then re-raised on this rank
        error = exc

    def activate(local: int) -> int:
        device = local % count if requested is None else requested
        _use_device(device)
        return device

    return _local_rank(comm, "mpi.select_device()", error, activate)[2]


def _device_count() -> int:
    return _devices.import_cupy("select_device").cuda.runtime.getDeviceCount()


def _use_device(device: int) -> None:
    import cupy

    cupy.cuda.Device(device).use()


def _requested_device(device: Any, count: int, environ) -> int | None:
    """The device that ``device=``, or else ``MULTIREDUCE_DEVICE`` in ``environ``, asks for.

    ``None`` if neither does. Raises :func:`select_device`'s TypeError and ValueErrors.
    """
    valid = _devices.accepted_ordinals(count)
    if device is not None:
        _settings.integer(device, "select_device: device=", valid)  # the TypeError; the range below
        source = "select_device: device="
    else:
        device = _env_device(environ, valid)
        if device is None:
            return None
        source = f"{DEVICE_ENV}="
    return _devices.ordinal_in_range(device, count, source)


def _env_device(environ, valid: str) -> int | None:
    """``MULTIREDUCE_DEVICE`` in ``environ`` as an int, None where it is unset or blank.

    Raises a ValueError naming the variable and ``valid`` (what it accepts) for a value that
    is not an integer.
    """
    text = environ.get(DEVICE_ENV, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{DEVICE_ENV}={environ[DEVICE_ENV]!r}: it must be {valid}") from None


def shard(n: int, comm=None) -> slice:
    """Return the slice of a global length ``n`` that this rank holds (see :func:`shard_range`).

    Not collective.
    """
    comm = _comm(comm)
    start, stop = shard_range(n, comm.Get_rank(), comm.Get_size())
    return slice(start, stop)


def read_shard(path: str | os.PathLike, *, dtype: Any = None, n: int | None = None, comm=None) -> np.ndarray:
    """Read this rank's shard of a ``.npy`` or raw binary file into host memory.

    Each rank reads only its own slice (:func:`shard`) of the array's elements in the file's
    memory order (C order; for a Fortran-order ``.npy`` file, Fortran order, so that argmin and
    argmax of the shards count in that order): ``.npy`` files from their checked header (never
    unpickling), raw files as ``dtype`` in native byte order; the slice is read with plain
    reads, and a file that shrinks meanwhile is an error naming it. Collective: if any rank
    fails, every rank raises (:func:`agree`).

    Parameters
    ----------
    path : path-like
    dtype : dtype, optional
        Required for raw files; for ``.npy`` files it must match if given.
    n : int, optional
        Raw files only: use the first ``n`` elements (default: the whole file). Every rank
        must split the same number of elements of the same dtype (this is checked).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    TypeError
        For a ``.npy`` of Python objects or of an unsupported dtype, or a dtype mismatch; on
        every rank if the ranks' files (or ``dtype=``) give different dtypes
        (``"read_shard: dtype differs across ranks"``, listing each rank's).
    ValueError
        For a truncated file, or a raw file without ``dtype``; on every rank if the number of
        elements that the ranks split differs across them (their ``n=``, or the lengths of
        their files), listing each rank's count, ``n=`` and path: the shards would overlap or
        leave gaps; on every rank if some rank is in another collective function of this
        module (``"call differs across ranks"``, listing each rank's call).
    RankError
        On the other ranks when one rank failed.
    """
    return _read_agreed(_comm(comm), path, dtype, n)[1]


def _read_agreed(comm, path, dtype, n) -> tuple[FileLayout, np.ndarray]:
    """:func:`read_shard`, returning the file's layout beside this rank's shard (the CLI's ``--input``)."""
    error = None
    layout = shard_data = None
    dtype_code = count = 0  # what a rank that failed passes (its failure is raised first)
    dtype_name = split = None
    try:
        layout = inspect_file(path, dtype=dtype, n=n)
        dtype_code, count = _DTYPE_CODES[layout.dtype], layout.n
        dtype_name, split = layout.dtype.name, f"{layout.n} (n={n!r}, {layout.path})"
        shard_data = _read_layout_shard(layout, comm.Get_rank(), comm.Get_size())
    except BaseException as exc:  # agreed below, then re-raised on this rank
        error = exc
    # One Allreduce, as agree(): the failures first, then the call, then the split that every
    # rank must share.
    _agree_values(
        comm,
        error,
        "mpi.read_shard()",
        (
            ("read_shard: dtype", dtype_code, dtype_name, TypeError),
            ("read_shard: the number of elements to split", count, split, ValueError),
        ),
    )
    return layout, shard_data
