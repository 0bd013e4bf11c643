"""Independent references for the tests: exact integers, math.fsum, and ulp helpers.

Nothing here calls multireduce or NumPy's reductions on the values under test.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def exact_int_sum(x: np.ndarray, result: np.dtype) -> int:
    """The sum of integer/bool elements in Python integers, wrapped into ``result``."""
    total = sum(int(v) for v in x.ravel().tolist())
    bits = np.dtype(result).itemsize * 8
    total %= 1 << bits
    if np.dtype(result).kind == "i" and total >= 1 << (bits - 1):
        total -= 1 << bits
    return total


def float_sum(x: np.ndarray) -> float:
    """The correctly rounded float64 sum of the elements (math.fsum), with IEEE special
    values handled the way any summation order would produce them."""
    values = x.astype(np.float64).ravel().tolist()
    if any(math.isnan(v) for v in values):
        return math.nan
    pos_inf = any(v == math.inf for v in values)
    neg_inf = any(v == -math.inf for v in values)
    if pos_inf and neg_inf:
        return math.nan
    if pos_inf:
        return math.inf
    if neg_inf:
        return -math.inf
    return math.fsum(values)


def ulp(value: float, dtype) -> float:
    """The spacing of ``dtype`` at ``value``."""
    dt = np.dtype(dtype)
    return float(np.spacing(dt.type(abs(value)) if math.isfinite(value) else dt.type(0)))


def ieee_extreme(x: np.ndarray, largest: bool) -> float:
    """max/min with NaN propagation and -0.0 < +0.0, computed one element at a time."""
    values = x.astype(np.float64).ravel().tolist()
    if any(math.isnan(v) for v in values):
        return math.nan
    key = lambda v: (v, math.copysign(1.0, v))  # noqa: E731  -0.0 sorts below +0.0
    return max(values, key=key) if largest else min(values, key=key)


def same_float(a, b) -> bool:
    """Equal as floats, NaN equal to NaN, and the sign of zero must match."""
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def sum_result_dtype(dtype) -> np.dtype:
    """The dtype of a sum (and prod) of ``dtype``: int64 for bool and signed, uint64 for
    unsigned integers, floats keep theirs (the Array API's rule, which NumPy follows)."""
    dt = np.dtype(dtype)
    return np.dtype(np.uint64) if dt.kind == "u" else np.dtype(np.int64) if dt.kind in "bi" else dt


def _count(shape: tuple[int, ...], axis) -> int:
    """The number of elements each result of a reduction over ``axis`` covers."""
    if axis is None:
        return math.prod(shape)
    axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
    return math.prod(shape[a] for a in axes)


def split_float_sum(x: np.ndarray, axis=None, keepdims: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The sum of the finite float elements of ``x`` over ``axis`` in float64, and a bound on its error.

    Independent of NumPy's summation order: each element is split exactly into ``hi``, a
    multiple of a power of two ``q`` chosen so that every partial sum of the ``hi`` parts
    is an integer multiple of ``q`` below ``2**53 * q`` (so NumPy adds them exactly, in any
    order), and ``lo = x - hi`` (exact: ``|x| < q``, or ``hi <= x < 2 * hi``, Sterbenz),
    ``|lo| < q``. Only the ``lo`` sum and the final addition round: the error is at most
    ``2 * m * 2**-53 * sum|lo| + ulp(value)``, for ``m`` elements per result, about
    ``m**2 * 2**-53 * q``: 1e-12 of ``max|x|`` for a million elements.

    Returns ``(value, bound)``, float64 arrays of the reduction's shape (0-d for ``axis=None``).
    """
    w = np.asarray(x, dtype=np.float64)
    if not np.isfinite(w).all():
        raise ValueError("split_float_sum takes finite elements only")
    m = _count(w.shape, axis)
    big = float(np.max(np.abs(w))) if w.size else 0.0
    if big == 0.0:
        value = np.sum(w, axis=axis, keepdims=keepdims) + 0.0  # exact: all zeros
        return np.asarray(value), np.zeros_like(np.asarray(value))
    q = math.ldexp(1.0, math.frexp(big)[1] + max(1, m.bit_length()) - 53)  # m * max|x| < 2**53 * q
    hi = np.trunc(w / q) * q
    lo = w - hi
    value = np.sum(hi, axis=axis, keepdims=keepdims) + np.sum(lo, axis=axis, keepdims=keepdims)
    lo_magnitude = np.sum(np.abs(lo), axis=axis, keepdims=keepdims)
    bound = 2.0 * m * 2.0**-53 * lo_magnitude + np.spacing(np.abs(value))
    return np.asarray(value), np.asarray(bound)


def assert_float_sum(got: np.ndarray, x: np.ndarray, axis=None, keepdims: bool = False, *, skip_nan: bool = False):
    """Assert that ``got`` (host values) is the sum of the float array ``x`` over ``axis``.

    multireduce accumulates float16 in float32 and float32 and float64 in float64
    (``ops._sum_accumulator``; the kernels' ``Sum``/``NanSum`` with ``Acc``) and converts the
    accumulator to ``x``'s dtype once, rounding to nearest (``convert<Out>``). So each result
    lies within the README's accumulation bound ``eps_acc * sum|x| * (log2(m + 1) + m / 50000
    + 1)`` (one process: no ranks term) plus half an ulp of the result (the one rounding) of
    the exact sum, here :func:`split_float_sum`'s (whose own tiny error bound is added). For
    float32 that is half an ulp and about 1e-9 of ``sum|x|``: a result one ulp off the
    correctly rounded sum fails unless the exact sum lies within that of a rounding boundary.
    A slice holding NaN sums to NaN (``skip_nan``: NaN elements count as zero, as nansum's);
    ``x`` holds no infinities. No sum is -0.0 (sums of zeros are +0.0).
    """
    got = np.asarray(got)
    dt = x.dtype
    assert dt.kind == "f", dt
    assert got.dtype == dt, (got.dtype, dt)
    nan = np.isnan(x)
    # float64 in both cases: np.where(nan, 0.0, x) kept float16 input in float16, whose
    # sum of |x| below overflowed to inf, and an infinite tolerance passed any result.
    wide = np.where(nan, 0.0, x.astype(np.float64))
    ref, ref_error = split_float_sum(wide, axis, keepdims)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    nan_slices = np.zeros(ref.shape, bool) if skip_nan else np.logical_or.reduce(nan, axis=axis, keepdims=keepdims)
    m = _count(x.shape, axis)
    acc_eps = float(np.finfo(np.float32 if dt == np.float16 else np.float64).eps)
    magnitude = np.sum(np.abs(wide), axis=axis, keepdims=keepdims)
    tol = acc_eps * magnitude * (math.log2(m + 1) + m / 50_000 + 1) + ref_error
    value = got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        tol = tol + 0.5 * np.spacing(np.abs(got)).astype(np.float64)
        err = np.abs(value - ref)
    largest = float(np.finfo(dt).max)
    # Near the top of the range the one rounding may give the infinity of the sum's sign.
    overflowed = (np.abs(ref) + tol >= largest) & (value == np.copysign(np.inf, ref))
    ok = np.where(nan_slices, np.isnan(got), (err <= tol) | overflowed)
    assert np.all(ok), {
        "bad": int(np.size(ok) - np.count_nonzero(ok)),
        "got": value[~ok][:5],
        "ref": np.broadcast_to(ref, ok.shape)[~ok][:5],
        "tol": np.broadcast_to(tol, ok.shape)[~ok][:5],
    }
    assert not np.any((got == 0) & np.signbit(got)), "a sum of zeros is +0.0"


def ieee_extreme_axes(x: np.ndarray, axis=None, keepdims: bool = False, *, largest: bool, skip_nan: bool = False):
    """max/min (nanmax/nanmin with ``skip_nan``) over ``axis`` as IEEE 754-2019 defines them.

    NumPy's maximum/minimum (fmax/fmin) reductions give the value; where it is zero, NumPy
    returns whichever zero it met first, so the sign is set here: the max is +0.0 if the
    slice holds a +0.0 and -0.0 otherwise, the min -0.0 if it holds a -0.0. NaN propagates
    (is ignored with ``skip_nan``; an all-NaN slice gives NaN).
    """
    if skip_nan:
        ufunc = np.fmax if largest else np.fmin
    else:
        ufunc = np.maximum if largest else np.minimum
    value = np.asarray(ufunc.reduce(x, axis=axis, keepdims=keepdims))
    if x.dtype.kind != "f" or not np.any(value == 0):
        return value
    wanted = (x == 0) & (np.signbit(x) != largest)  # +0.0 for max, -0.0 for min
    has = np.asarray(np.logical_or.reduce(wanted, axis=axis, keepdims=keepdims))
    plus, minus = x.dtype.type(0.0), x.dtype.type(-0.0)
    zero = np.where(has, plus, minus) if largest else np.where(has, minus, plus)
    return np.where(value == 0, zero, value).astype(x.dtype)


def assert_same_bits(got, want) -> None:
    """Same dtype, shape and bits (so -0.0 differs from +0.0); any NaN matches any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if got.dtype.kind == "f":
        uint = f"u{got.itemsize}"
        same = (got.view(uint) == want.view(uint)) | (np.isnan(got) & np.isnan(want))
    else:
        same = got == want
    assert np.all(same), {"got": got[~same][:5], "want": want[~same][:5]}


def assert_rounded_once(got, exact, accumulation_error: float = 0.0) -> None:
    """Assert ``|got - exact| <= ulp(got) / 2 + accumulation_error``, in exact rationals.

    For a result rounded once to nearest from an accumulator within ``accumulation_error``
    of the exact value ``exact`` (an int, float or Fraction).
    """
    got = np.asarray(got)[()]
    err = abs(Fraction(float(got)) - Fraction(exact))
    allowed = Fraction(ulp(float(got), got.dtype)) / 2 + Fraction(accumulation_error)
    assert err <= allowed, (float(got), float(exact), float(err), float(allowed))


def make_data(dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random test data of ``dtype``: full-range integers (so that integer sums wrap), and
    floats in [-1, 1) (float16 too, so that sums of a million stay finite)."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    return (rng.random(n) * 2 - 1).astype(dt)


def check(x: np.ndarray, op: str, got) -> None:
    """Assert that ``got`` (a NumPy scalar) is ``op`` over ``x`` within the error bound of
    multireduce's accumulation rules; see the README's accuracy notes."""
    dt = x.dtype
    if op == "sum":
        expected_dtype = np.dtype(np.uint64) if dt.kind == "u" else np.dtype(np.int64) if dt.kind in "bi" else dt
        assert got.dtype == expected_dtype, (got.dtype, expected_dtype)
        if dt.kind in "biu":
            assert int(got) == exact_int_sum(x, expected_dtype)
            return
        ref = float_sum(x)
        if not math.isfinite(ref):
            assert same_float(got, ref), (got, ref)
            return
        acc_eps = np.finfo(np.float32).eps if dt == np.float16 else np.finfo(np.float64).eps
        magnitude = math.fsum(abs(v) for v in x.astype(np.float64).ravel().tolist())
        n = x.size
        tol = acc_eps * magnitude * (math.log2(n + 1) + n / 50_000 + 1)
        largest = float(np.finfo(dt).max)
        if abs(ref) + tol >= largest:
            # Near or past the top of the range, rounding may overflow to infinity.
            assert float(got) == math.copysign(math.inf, ref) or abs(float(got) - ref) <= tol + ulp(largest, dt), (
                got,
                ref,
            )
            return
        tol += ulp(ref, dt)
        assert abs(float(got) - ref) <= tol, (float(got), ref, tol)
        if ref == 0:
            assert not math.copysign(1.0, float(got)) < 0, "a zero sum is +0.0, as in NumPy"
        return
    assert got.dtype == dt, (got.dtype, dt)
    if dt.kind in "biu":
        values = [int(v) for v in x.ravel().tolist()]
        assert int(got) == (max(values) if op == "max" else min(values))
        return
    assert same_float(got, ieee_extreme(x, largest=(op == "max"))), (got, x)


def run_in_threads(calls, timeout: float = 60.0) -> None:
    """Run each of ``calls`` (no-argument callables) on its own daemon thread; wait for all.

    Fails if a thread is still running ``timeout`` seconds after the start (a hang or
    deadlock), naming where each stuck thread and each ``multireduce-stream`` copy thread is;
    the threads are daemons, so the process still exits. Raises the first exception a call
    raised.
    """
    import sys
    import threading
    import time
    import traceback

    errors: list[BaseException] = []

    def guarded(call):
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=guarded, args=(c,), daemon=True) for c in calls]
    for w in workers:
        w.start()
    deadline = time.monotonic() + timeout
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    stuck = [w for w in workers if w.is_alive()]
    if stuck:
        frames = sys._current_frames()
        where = {
            t.name: "".join(traceback.format_stack(frames[t.ident])[-4:])
            for t in threading.enumerate()
            if t.ident in frames and (t in stuck or t.name.startswith("multireduce-stream"))
        }
        raise AssertionError(
            f"{len(stuck)} of {len(workers)} calls still running after {timeout} s (hang or deadlock): {where}"
        )
    if errors:
        raise errors[0]


def numpy_var_warnings(values) -> list[str]:
    """The messages of the RuntimeWarnings that NumPy's var of the float64 ``values`` gives.

    The word of an overflow of the squares is NumPy's: "in square" from NumPy 2.4, "in
    multiply" before.
    """
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.var(np.asarray(values, dtype=np.float64))
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
