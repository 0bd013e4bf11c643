"""The CUDA sources are found from a source checkout / editable install and from a wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
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
    assert "multireduce/_native/hostcopy.c" in names  # the copy engine is compiled from it on first use
    assert "multireduce-0.1.0.dist-info/licenses/LICENSE" in names  # pyproject's license-files
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


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _lower_bound(requirements: list[str], name: str) -> tuple[int, ...]:
    (spec,) = [r for r in requirements if r.split(">")[0].split("[")[0].strip() == name]
    low = spec.split(">=")[1].split(",")[0].split(";")[0].strip()
    return tuple(int(p) for p in low.split("."))


def test_dependency_lower_bounds_cover_the_apis_used():
    project = _pyproject()["project"]
    # numpy.lib.array_utils and numpy.exceptions.AxisError (core, dask): NumPy 2.0.
    assert _lower_bound(project["dependencies"], "numpy") >= (2, 0)
    extras = project["optional-dependencies"]
    # multireduce.dask imports dask.tokenize, which dask 2024.9.0 introduced (2024.8 fails
    # with ModuleNotFoundError at import); with dask 2024.9 to 2025.11, tests/test_dask.py has
    # 45 failures (argmin/argmax over Dask fail while Dask builds their meta); 2025.12 passes.
    for extra in ("dask", "test"):
        assert _lower_bound(extras[extra], "dask") >= (2025, 12), extra
        assert _lower_bound(extras[extra], "distributed") == _lower_bound(extras[extra], "dask"), extra


def test_metadata_a_packager_needs():
    project = _pyproject()["project"]
    assert project["requires-python"] == ">=3.10"
    assert project["license"] == "BSD-3-Clause"
    assert project["readme"] == "README.md"
    classifiers = set(project.get("classifiers", []))
    for version in ("3.10", "3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert project["scripts"] == {"multireduce": "multireduce.__main__:main"}
    assert set(project["optional-dependencies"]) == {"gpu", "mpi", "dask", "bench", "test", "dev"}


def test_sdist_includes_are_anchored_at_the_root():
    # Hatch's include patterns are gitignore-style: "tests" also matches any nested folder of
    # that name (bench/results/README.md came along with "README.md", and any scratch copy of
    # the tree did too).
    include = _pyproject()["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]
    assert all(p.startswith("/") for p in include), include


@pytest.mark.slow
def test_sdist_carries_sources_kernels_and_tests_only(tmp_path):
    # hatchling itself (the test extra's), not the build front end, which the extra lacks:
    # this test was skipped wherever the README's install ran.
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = tmp_path.glob("multireduce-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    for needed in (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "multireduce/__init__.py",
        "multireduce/_native/hostcopy.c",
        f"kernels/{HEADER}",
        "kernels/multireduce/stats.cuh",
        "tests/conftest.py",
        "scripts/_mpiexec.py",  # tests/conftest.py imports it
        "docs/semantics.md",  # the README and reduce's docstring point there
    ):
        assert needed in names, needed
    top = {name.split("/", 1)[0] for name in names}
    allowed = {"multireduce", "kernels", "tests", "scripts", "docs", ".ci", "README.md", "LICENSE", "pyproject.toml"}
    allowed.add("PKG-INFO")
    assert top <= allowed | {".gitignore"}, sorted(top - allowed)
