"""Backends: ``numpy`` (the CPU reference path) and ``cupy`` (multireduce's CUDA kernels).

Each backend module provides the same functions:

``reduce(x, op, acc, result, axes)``
    Reduce ``x`` over ``axes`` (sorted, non-negative) with the fold op ``op``, forming
    partials in the accumulator dtype ``acc`` and returning values of dtype ``result`` on
    ``x``'s device, with the shape of the kept axes.
``reduce_full(x, op, acc, result)``
    The same over every axis of a non-empty array.
``moments(x, axes, op)`` and ``arg(x, axis, op)``
    The mergeable states of :mod:`multireduce._stats` (moments ops; argmin/argmax).
``stats(x, axes, correction)``
    :func:`multireduce.stats` of a non-empty ``x``: the :class:`multireduce._stats.Stats`
    fields on ``x``'s device (NumPy scalars or arrays; CuPy arrays, finalized by a kernel).
``constant(value, dtype)``
    A result holding ``value``, for empty inputs.

The CuPy backend runs every op on multireduce's kernels (see docs/semantics.md); it never
falls back to CuPy's own reductions or to the host.
"""
