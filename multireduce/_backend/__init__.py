"""Backends: ``numpy`` (the CPU reference path) and ``cupy`` (multireduce's CUDA kernels).

Each backend module provides the same two functions:

``reduce_full(x, op, acc, result)``
    Reduce every element of a non-empty array ``x`` with ``op``, forming partials in the
    accumulator dtype ``acc`` and returning one value of dtype ``result`` on ``x``'s device.
``constant(value, dtype)``
    A result holding ``value``, for empty inputs.
"""
