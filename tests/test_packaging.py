"""The CUDA sources are found from a source checkout / editable install and from a wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import multireduce._kernels as kernels

REPO = Path(__file__).resolve().parent.parent
HEADER = "multireduce/reduce.cuh"


def test_source_checkout_finds_top_level_kernels():
    # The test environment is an editable install: the package is the checkout's.
    assert Path(kernels.__file__).resolve().parent == REPO / "multireduce"
    assert kernels.kernel_dir() == REPO / "kernels"
    assert "reduce_kernel" in kernels.read_source()


@pytest.mark.slow
def test_wheel_carries_kernels_inside_the_package(tmp_path):
    wheel_dir = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = wheel_dir.glob("multireduce-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert f"multireduce/kernels/{HEADER}" in names
    assert not any(name.startswith("kernels/") for name in names), "kernels/ must live inside the package"

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    code = "import multireduce._kernels as k; print(k.kernel_dir()); print(len(k.read_source()))"
    env = {**os.environ, "PYTHONPATH": str(site)}
    # Run from a directory outside the checkout, with the installed copy first on the path.
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found, length = out.stdout.split()
    assert Path(found) == site / "multireduce" / "kernels"
    assert int(length) == len(kernels.read_source())  # the same headers as the checkout's
