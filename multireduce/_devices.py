"""CUDA device ordinals, as the library's device settings accept them.

The settings: ``select_device``'s ``device=`` and ``MULTIREDUCE_DEVICE`` in the MPI layer,
and ``device=`` of ``stream.reduce``.
"""

from __future__ import annotations

__all__ = ["accepted_ordinals", "import_cupy", "ordinal_in_range"]


def import_cupy(what: str, instead: str = ""):
    """CuPy, or a ModuleNotFoundError saying that ``what`` needs it and what to install.

    Nothing falls back to the CPU; ``instead`` (``"; on the CPU, ..."``) may say what to call there.
    """
    try:
        import cupy
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"{what} needs CuPy ({exc}): install multireduce[gpu] (cupy-cuda13x) or cupy-cuda12x for a CUDA 12 "
            f"driver{instead}",
            name="cupy",
        ) from exc
    return cupy


def accepted_ordinals(count: int) -> str:
    """What a device setting accepts on a node with ``count`` CUDA devices, for error messages."""
    if count < 1:
        return "an integer device ordinal, but this node has no CUDA device"
    return f"an integer device ordinal from 0 to {count - 1} (this node has {count} CUDA device(s))"


def ordinal_in_range(device: int, count: int, source: str) -> int:
    """``device`` as an int, if it names one of ``count`` devices.

    Otherwise a ValueError naming ``source`` (the setting, written as ``name=``) and the
    accepted values.
    """
    if not 0 <= device < count:
        raise ValueError(
            f"{source}{int(device)}: device {int(device)} does not exist; it must be {accepted_ordinals(count)}"
        )
    return int(device)
