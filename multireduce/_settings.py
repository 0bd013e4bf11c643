"""Integer settings, checked by one rule wherever the library takes them.

The settings: ``budget=``, ``slot_bytes=`` and ``threads=`` of ``stream.reduce``, the copy
engine's ``threads`` and ``flags``, lengths of shards and files (``n``) and the type of
device ordinals (``device=`` of ``stream.reduce`` and ``select_device``; their range is
:mod:`._devices`). Dask's ``split_every`` has a rule of its own (a dict of axes, too).
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["integer"]


def integer(value: Any, what: str, accepted: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int, if it is an integer from ``low`` to ``high`` (each bound optional).

    Python and NumPy integers are accepted; ``bool`` is not (Python counts it as an int, and
    ``True`` is never meant as a count). Otherwise a TypeError (not an integer) or a ValueError
    (out of range) that says ``what must be ACCEPTED, got VALUE``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be {accepted}, got {value!r} of type {type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{what} must be {accepted}, got {value}")
    return int(value)
