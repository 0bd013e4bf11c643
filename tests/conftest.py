"""Shared fixtures: GPU detection (tests marked ``gpu`` skip without one) and mpiexec."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import _mpiexec  # noqa: E402


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """Why GPU tests cannot run here, or None if they can."""
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed"
    import cupy

    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return f"no usable CUDA device ({exc})"
    return None if count > 0 else "no CUDA device"


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


# The same launcher lookup as the scripts (scripts/_mpiexec.py), found once per session.
find_mpiexec = functools.cache(_mpiexec.find_mpiexec)


@pytest.fixture(scope="session")
def mpiexec() -> str:
    found = find_mpiexec()
    if found is None:
        pytest.skip("mpiexec not found next to the interpreter or on PATH")
    return found


@pytest.fixture
def native_stand_in():
    """The native copy engine's library, its host-to-host upload stand-in reset (no failure).

    Tests make the stand-in fail with ``native_stand_in.mr_test_configure(k, code)``.
    """
    from multireduce import _hostcopy

    lib = _hostcopy.load()
    lib.mr_test_configure(0, 0)
    yield lib
    lib.mr_test_configure(0, 0)
