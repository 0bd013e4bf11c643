"""How partials travel between ranks, and whether MPI may be handed GPU memory.

Nothing here imports ``mpi4py``: the encodings are pure array code (NumPy or CuPy, whichever
``xp`` is given), and the CUDA-aware decision takes its probes as arguments, so both are
tested without starting MPI.

Max and min travel as ordered integer keys
-------------------------------------------
MPI's predefined ``MAX``/``MIN`` on floating-point types compare with ``<``: with a NaN, or
with ``-0.0`` against ``+0.0``, the answer depends on which rank's value comes first, so it
depends on the reduction tree. Each float partial is therefore mapped to an ``int64`` key
whose integer order is the IEEE 754 total order (``-inf < ... < -0.0 < +0.0 < ... < inf``),
with every NaN mapped to the largest key. Integer ``MAX`` on keys is exact and commutative,
so the combined key is the same whatever the order of ranks, and decoding it gives NaN if
any rank had a NaN, and IEEE 754-2019 ``maximum``/``minimum`` otherwise (nanmax/nanmin map
NaN to the smallest key instead, so that NaN loses to every number) (the combine rule of
:meth:`multireduce.ops.Op.host_reduce`). Min uses the bitwise complement of the key, which
reverses the order, so that both ops reduce with ``MAX``; float32 partials are widened to
float64 first (exactly). Integer partials (and bool) map to ``int64`` keys the same way,
``uint64`` with its top bit flipped.

Sums (and products, with ``PROD``) travel in the accumulator dtype with ``SUM``: float64, float32 (the accumulator of
float16), and 64-bit integers as ``uint64``, whose wrap-around is defined (signed overflow
in C is not), giving the same bits as two's-complement ``int64`` addition.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CUDA_AWARE_ENV",
    "CudaAwareness",
    "decide_cuda_aware",
    "decode_extreme",
    "decode_extreme_scalar",
    "encode_extreme",
    "encode_extreme_scalar",
    "mpix_probe",
    "openmpi_cvar_probe",
    "sum_wire_dtype",
]

_INT64_MAX = np.int64(np.iinfo(np.int64).max)
_INT64_MIN = np.int64(np.iinfo(np.int64).min)
_KEY_MAX = int(_INT64_MAX)
_KEY_MIN = int(_INT64_MIN)
_INT64 = struct.Struct("<q")
_FLOAT64 = struct.Struct("<d")
_UINT64_TOP = np.uint64(1 << 63)


def encode_extreme(partial, positive: bool, xp=np, nan_wins: bool = True):
    """Map a 1-element partial of max (``positive``) or min to an ``int64`` key for ``MAX``.

    Parameters
    ----------
    partial : numpy.ndarray or cupy.ndarray
        Shape ``(1,)``, of any supported accumulator dtype.
    positive : bool
        True for max, false for min.
    xp : module
        ``numpy`` or ``cupy``, the module of ``partial``.
    nan_wins : bool
        True (max, min): NaN takes the largest key and so wins. False (nanmax, nanmin): NaN
        takes the smallest key and loses to every number.

    Returns
    -------
    array of int64, shape (1,)
        Keys such that the ``MAX`` of keys decodes (:func:`decode_extreme`) to the op's
        combine of the partials, independent of their order.
    """
    kind = partial.dtype.kind
    if kind == "f":
        bits = partial.astype(np.float64).view(np.int64)
        # Negative floats order backwards as sign-magnitude integers: flipping the magnitude
        # bits makes integer order the IEEE total order (-0.0 -> -1, +0.0 -> 0).
        keys = xp.where(bits < 0, bits ^ _INT64_MAX, bits)
        if not positive:
            keys = ~keys
        # After the complement for min, NaN still has to win (or lose): it takes the largest
        # (or the smallest) key, which no number maps to.
        return xp.where(xp.isnan(partial), _INT64_MAX if nan_wins else _INT64_MIN, keys)
    if partial.dtype == np.uint64:
        keys = (partial ^ _UINT64_TOP).view(np.int64)
    else:
        keys = partial.astype(np.int64)
    return keys if positive else ~keys


def decode_extreme(keys, positive: bool, acc_dtype: np.dtype, xp=np, nan_wins: bool = True):
    """Invert :func:`encode_extreme` for the combined key; returns an ``acc_dtype`` array."""
    acc_dtype = np.dtype(acc_dtype)
    if acc_dtype.kind == "f":
        nan = keys == (_INT64_MAX if nan_wins else _INT64_MIN)
        k = keys if positive else ~keys
        bits = xp.where(k < 0, k ^ _INT64_MAX, k)
        values = bits.view(np.float64)
        values = xp.where(nan, np.float64(np.nan), values)
        return values.astype(acc_dtype)
    k = keys if positive else ~keys
    if acc_dtype == np.uint64:
        return k.view(np.uint64) ^ _UINT64_TOP
    return k.astype(acc_dtype)


def encode_extreme_scalar(value: np.generic, positive: bool, nan_wins: bool = True) -> int:
    """Encode one host partial as :func:`encode_extreme` does, in Python integers.

    The host path handles one scalar per call; integer arithmetic on it costs a fraction of
    the array operations (this is most of what the MPI layer adds to a call).
    """
    kind = value.dtype.kind
    if kind == "f":
        if value != value:  # NaN
            return _KEY_MAX if nan_wins else _KEY_MIN
        (bits,) = _INT64.unpack(_FLOAT64.pack(float(value)))
        key = bits ^ _KEY_MAX if bits < 0 else bits
    elif value.dtype == np.uint64:
        key = int(value) - (1 << 63)  # flipping the top bit, read as int64
    else:
        key = int(value)
    return key if positive else ~key


def decode_extreme_scalar(key: int, positive: bool, acc_dtype: np.dtype, nan_wins: bool = True) -> np.generic:
    """Invert :func:`encode_extreme_scalar`; returns a scalar of ``acc_dtype``."""
    acc_dtype = np.dtype(acc_dtype)
    if acc_dtype.kind == "f":
        if key == (_KEY_MAX if nan_wins else _KEY_MIN):
            return acc_dtype.type(np.nan)
        k = key if positive else ~key
        bits = k ^ _KEY_MAX if k < 0 else k
        (value,) = _FLOAT64.unpack(_INT64.pack(bits))
        return acc_dtype.type(value)
    k = key if positive else ~key
    if acc_dtype == np.uint64:
        return acc_dtype.type(k + (1 << 63))
    return acc_dtype.type(k)


def sum_wire_dtype(acc_dtype: np.dtype) -> np.dtype:
    """Return the dtype in which a sum partial of ``acc_dtype`` travels (see the module notes)."""
    acc_dtype = np.dtype(acc_dtype)
    return np.dtype(np.uint64) if acc_dtype.kind in "iu" else acc_dtype


#: Environment variable that overrides CUDA-aware detection: ``1`` (device buffers go to MPI)
#: or ``0`` (partials are staged through host memory).
CUDA_AWARE_ENV = "MULTIREDUCE_CUDA_AWARE"


@dataclass(frozen=True)
class CudaAwareness:
    """Whether MPI is handed device buffers, and how that was decided.

    Attributes
    ----------
    enabled : bool
        True if GPU partials go to MPI as device buffers, false if staged through host.
    method : str
        What decided it: ``"env"``, the name of the probe that answered, or ``"default"``.
    detail : str
        A human-readable account of every source consulted, for ``info`` and run output.
    """

    enabled: bool
    method: str
    detail: str


#: A probe returns ``(answer, detail)``; ``answer`` is None when it cannot tell.
Probe = Callable[[], tuple["bool | None", str]]


def decide_cuda_aware(probes: Sequence[tuple[str, Probe]], environ: Mapping[str, str] | None = None) -> CudaAwareness:
    """Decide whether MPI is CUDA-aware.

    The environment variable :data:`CUDA_AWARE_ENV` wins if set. Otherwise the probes are
    asked in order until one answers, and that answer decides; what each probe that was asked said is
    kept in ``detail``. If none answers, MPI is taken as not CUDA-aware: staging an 8-byte partial
    through host memory is always correct, whereas handing device memory to an MPI that
    cannot read it crashes.

    Parameters
    ----------
    probes : sequence of (name, callable)
        Each callable returns ``(True | False | None, detail)``.
    environ : mapping, optional
        Defaults to ``os.environ``.

    Raises
    ------
    ValueError
        If the environment variable is set to anything but ``0`` or ``1``.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(CUDA_AWARE_ENV)
    if value is not None:
        if value.strip() not in ("0", "1"):
            raise ValueError(f"{CUDA_AWARE_ENV} must be 0 or 1, got {value!r}")
        enabled = value.strip() == "1"
        return CudaAwareness(enabled, "env", f"{CUDA_AWARE_ENV}={value.strip()} (override; MPI library not asked)")
    details = []
    for name, probe in probes:
        answer, detail = probe()
        details.append(f"{name}: {detail}")
        if answer is not None:
            # Later probes are not run: each one reaches into the MPI library through ctypes,
            # and one answer is enough.
            return CudaAwareness(bool(answer), name, "; ".join(details))
    details.append("no source could tell; assuming not CUDA-aware")
    return CudaAwareness(False, "default", "; ".join(details))


def mpix_probe(lib) -> Probe:
    """Probe ``MPIX_Query_cuda_support()`` (Open MPI, MPICH) in the ctypes library ``lib``.

    It is the library's run-time answer, so it comes first.
    """

    def probe():
        func = getattr(lib, "MPIX_Query_cuda_support", None)
        if func is None:
            return None, "not exported by this MPI library"
        func.restype = ctypes.c_int
        func.argtypes = []
        value = int(func())
        return bool(value), f"returned {value}"

    return probe


def openmpi_cvar_probe(lib, library_version: str) -> Probe:
    """Probe Open MPI's ``mpi_built_with_cuda_support`` parameter.

    It is read through the MPI tool interface (``MPI_T_cvar_read``): the value ``ompi_info``
    reports, without running ``ompi_info``.
    """

    def probe():
        if "Open MPI" not in library_version:
            return None, "not Open MPI"
        c_int = ctypes.c_int
        required = ["MPI_T_init_thread", "MPI_T_cvar_get_index", "MPI_T_cvar_handle_alloc", "MPI_T_cvar_read"]
        missing = [name for name in required if getattr(lib, name, None) is None]
        if missing:
            return None, f"MPI_T functions not exported: {', '.join(missing)}"
        provided = c_int(0)
        # MPI_THREAD_SINGLE is 0 in Open MPI; MPI_T may be initialized any number of times.
        rc = lib.MPI_T_init_thread(c_int(0), ctypes.byref(provided))
        if rc != 0:
            return None, f"MPI_T_init_thread failed with code {rc}"
        try:
            index = c_int(-1)
            rc = lib.MPI_T_cvar_get_index(b"mpi_built_with_cuda_support", ctypes.byref(index))
            if rc != 0:
                return None, f"mpi_built_with_cuda_support not found (MPI_T code {rc})"
            handle = ctypes.c_void_p()
            count = c_int(0)
            rc = lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count))
            if rc != 0:
                return None, f"MPI_T_cvar_handle_alloc failed with code {rc}"
            # The value is a bool or an int depending on the version; a zeroed buffer larger
            # than either reads correctly as "any byte set".
            buf = (ctypes.c_ubyte * 64)()
            rc = lib.MPI_T_cvar_read(handle, buf)
            if getattr(lib, "MPI_T_cvar_handle_free", None) is not None:
                lib.MPI_T_cvar_handle_free(ctypes.byref(handle))
            if rc != 0:
                return None, f"MPI_T_cvar_read failed with code {rc}"
            value = any(buf)
            return value, f"mpi_built_with_cuda_support = {str(value).lower()}"
        finally:
            if getattr(lib, "MPI_T_finalize", None) is not None:
                lib.MPI_T_finalize()

    return probe
