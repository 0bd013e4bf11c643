"""Axis geometry shared by the backends: an axis set as an (outer, reduced, inner) view.

Pure Python (no CuPy), so that it is tested on machines without a GPU.
"""

from __future__ import annotations

import math

__all__ = ["axis_layout", "fortran_as_c"]


def axis_layout(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int, int] | None:
    """``(outer, reduced, inner)`` for reducing ``axes`` of a C-contiguous array of ``shape``.

    A C-contiguous array whose reduced axes are adjacent (axes of length one do not count)
    is, without copying, a 3-d array ``(outer, reduced, inner)``: each output element
    ``(o, i)`` reduces ``reduced`` elements ``inner`` apart. ``None`` if the reduced axes are
    not adjacent.

    Examples
    --------
    >>> axis_layout((4, 5, 6), (1,))
    (4, 5, 6)
    >>> axis_layout((4, 5, 6), (1, 2))
    (4, 30, 1)
    >>> axis_layout((4, 5, 6), (0, 2)) is None
    True
    """
    axes = set(axes)
    significant = [(i, n) for i, n in enumerate(shape) if n != 1]
    reduced_pos = [k for k, (i, _) in enumerate(significant) if i in axes]
    if reduced_pos and reduced_pos != list(range(reduced_pos[0], reduced_pos[-1] + 1)):
        return None
    if not reduced_pos:
        return (math.prod(shape), 1, 1)
    first, last = reduced_pos[0], reduced_pos[-1]
    outer = math.prod(n for _, n in significant[:first])
    reduced = math.prod(n for _, n in significant[first : last + 1])
    inner = math.prod(n for _, n in significant[last + 1 :])
    return (outer, reduced, inner)


def fortran_as_c(x, axes: tuple[int, ...]) -> tuple[object, tuple[int, ...]] | None:
    """The C-contiguous transpose of a Fortran-order ``x`` and ``axes`` numbered from its other end.

    ``None`` where ``x`` is not Fortran-order only (C-contiguous, 1-d or 0-d, or neither):
    reducing the transpose over the returned axes, then transposing the result, reduces
    ``x`` in memory order.
    """
    if x.ndim > 1 and x.flags.f_contiguous and not x.flags.c_contiguous:
        return x.T, tuple(sorted(x.ndim - 1 - a for a in axes))
    return None
