"""The public API surface and the small support modules, on the CPU.

What ``import multireduce`` exports and imports, the version in every place it is written,
signatures against the README, and the helpers behind the settings, device ordinals, axis
layouts and provenance records.
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import multireduce
from multireduce import _axes, _devices, _provenance, _settings

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"

# The functions of README's "Python API" and "Reductions and semantics" sections.
README_FUNCTIONS = {
    "reduce",
    "partial",
    "sum",
    "prod",
    "nansum",
    "nanprod",
    "max",
    "min",
    "nanmax",
    "nanmin",
    "mean",
    "nanmean",
    "var",
    "std",
    "nanvar",
    "nanstd",
    "count_nonzero",
    "any",
    "all",
    "argmin",
    "argmax",
    "nanargmin",
    "nanargmax",
    "stats",
}


def _readme_section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


# -- exports ---------------------------------------------------------------------------------


def test_all_is_unique_and_resolves():
    names = multireduce.__all__
    assert len(names) == len(set(names))
    missing = [n for n in names if not hasattr(multireduce, n)]
    assert not missing


def test_public_names_are_exported():
    # Every public attribute that is not a submodule is in __all__, and nothing private is.
    public = {n for n, v in vars(multireduce).items() if not n.startswith("_") and not inspect.ismodule(v)} | {
        "__version__"
    }
    assert public == set(multireduce.__all__)
    assert not [n for n in multireduce.__all__ if n.startswith("_") and n != "__version__"]


def test_readme_functions_are_exported():
    assert set(README_FUNCTIONS) <= set(multireduce.__all__)
    # And every multireduce.NAME / mr.NAME the two sections call exists.
    text = _readme_section("Python API") + _readme_section("Reductions and semantics")
    called = set(re.findall(r"\b(?:multireduce|mr)\.([a-z_]+)\(", text))
    assert called, "no calls found in the README's API sections"
    submodules = {"mpi", "dask"}
    assert not [n for n in called - submodules if n not in multireduce.__all__]


@pytest.mark.parametrize("name", sorted(n for n in multireduce.__all__ if callable(getattr(multireduce, n))))
def test_public_callables_have_docstrings(name):
    doc = inspect.getdoc(getattr(multireduce, name))
    assert doc and len(doc) > 40, name


def test_reduce_and_partial_signatures_match_readme():
    # README: reduce(x, op, *, axis=None, keepdims=False, dtype=None, correction=0.0, reproducible=False)
    text = " ".join(_readme_section("Python API").split())
    for name in ("reduce", "partial"):
        m = re.search(rf"`{name}\((x, op, \*, [^)]*)\)`", text)
        assert m, f"README does not give {name}'s signature"
        documented = [p.strip() for p in m.group(1).split(",")]
        actual = [
            p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
            for p in inspect.signature(getattr(multireduce, name)).parameters.values()
        ]
        sig = inspect.signature(getattr(multireduce, name))
        star = next(i for i, p in enumerate(sig.parameters.values()) if p.kind is inspect.Parameter.KEYWORD_ONLY)
        actual.insert(star, "*")
        assert documented == actual, name


@pytest.mark.parametrize("name", ["reduce", "partial"])
def test_docstring_documents_every_parameter(name):
    doc = inspect.getdoc(getattr(multireduce, name))
    params = [p for p in inspect.signature(getattr(multireduce, name)).parameters if p not in ("x", "op")]
    if name == "reduce":
        assert not [p for p in params if not re.search(rf"^{p} :", doc, flags=re.M)]
    else:
        assert not [p for p in params if f"``{p}" not in doc and f"{p} :" not in doc]


def test_reduce_raises_what_its_docstring_says():
    x = np.arange(6.0).reshape(2, 3)
    with pytest.raises(TypeError):
        multireduce.reduce(x, "max", dtype=np.float32)
    with pytest.raises(TypeError):
        multireduce.reduce(x, "sum", correction=1)
    with pytest.raises(TypeError):
        multireduce.reduce(x, "argmin", axis=(0,))
    with pytest.raises(TypeError):
        multireduce.reduce(np.ma.array(x), "sum")
    with pytest.raises(ValueError, match="unknown op"):
        multireduce.reduce(x, "nope")
    with pytest.raises(ValueError):
        multireduce.reduce(x, "sum", axis=(0, 0))
    with pytest.raises(ValueError):
        multireduce.reduce(np.empty(0), "max")
    with pytest.raises(np.exceptions.AxisError):
        multireduce.reduce(x, "sum", axis=2)
    with pytest.raises(NotImplementedError):
        multireduce.reduce(x, "prod", reproducible=True)
    with pytest.raises(NotImplementedError):
        multireduce.reduce(x, "sum", axis=0, reproducible=True)


# -- imports and version ---------------------------------------------------------------------


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd or REPO, capture_output=True, text=True, timeout=120, check=False
    )


def test_import_needs_only_numpy():
    code = (
        "import sys, multireduce, multireduce.core, multireduce.stream, multireduce._cli\n"
        "heavy = {'cupy', 'cupy_backends', 'mpi4py', 'dask', 'distributed', 'cuda', 'pandas', 'scipy'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    out = _run("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_version_agrees_everywhere():
    assert multireduce.__version__ == _pyproject()["project"]["version"]
    out = _run("-m", "multireduce", "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"multireduce {multireduce.__version__}"


# -- _settings.integer -----------------------------------------------------------------------


@pytest.mark.parametrize("value", [3, np.int8(3), np.uint64(3), np.int64(3)])
def test_integer_accepts_python_and_numpy_ints(value):
    got = _settings.integer(value, "threads=", "an integer from 1 to 64", 1, 64)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("value", [True, np.True_, 3.0, np.float64(3), "3", None, np.array(3), [3]])
def test_integer_refuses_non_integers_naming_the_setting(value):
    with pytest.raises(TypeError, match=r"^threads= must be an integer from 1 to 64, got "):
        _settings.integer(value, "threads=", "an integer from 1 to 64", 1, 64)


@pytest.mark.parametrize("value", [0, -1, 65, 2**100, np.uint64(2**64 - 1), np.int64(-(2**63))])
def test_integer_refuses_out_of_range_naming_the_setting(value):
    with pytest.raises(ValueError, match=rf"^threads= must be an integer from 1 to 64, got {int(value)}$"):
        _settings.integer(value, "threads=", "an integer from 1 to 64", 1, 64)


def test_integer_bounds_are_optional():
    assert _settings.integer(-(2**100), "n", "an integer") == -(2**100)
    assert _settings.integer(2**100, "n", "a count", low=0) == 2**100
    with pytest.raises(ValueError, match="n must be a count, got -1"):
        _settings.integer(-1, "n", "a count", low=0)


# -- _devices ---------------------------------------------------------------------------------


def test_ordinal_in_range():
    assert _devices.ordinal_in_range(np.int64(1), 2, "device=") == 1
    with pytest.raises(ValueError, match=r"^device=2: device 2 does not exist; .* from 0 to 1 \(this node has 2"):
        _devices.ordinal_in_range(2, 2, "device=")
    with pytest.raises(ValueError, match=r"^MULTIREDUCE_DEVICE=-1: device -1 does not exist"):
        _devices.ordinal_in_range(-1, 2, "MULTIREDUCE_DEVICE=")


def test_accepted_ordinals_with_one_and_no_device():
    assert "from 0 to 0" in _devices.accepted_ordinals(1)
    none = _devices.accepted_ordinals(0)
    assert "-1" not in none and "no CUDA device" in none
    with pytest.raises(ValueError, match="no CUDA device") as info:
        _devices.ordinal_in_range(0, 0, "device=")
    assert "-1" not in str(info.value)


# -- _axes.axis_layout ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axes", "expected"),
    [
        ((4, 5, 6), (1,), (4, 5, 6)),
        ((4, 5, 6), (0,), (1, 4, 30)),
        ((4, 5, 6), (2,), (20, 6, 1)),
        ((4, 5, 6), (0, 1, 2), (1, 120, 1)),
        ((4, 5, 6), (), (120, 1, 1)),
        ((4, 5, 6), (0, 2), None),
        ((4, 1, 6), (0, 2), (1, 24, 1)),  # a length-one axis between does not separate them
        ((4, 1, 6), (1,), (24, 1, 1)),  # reducing only length-one axes reduces nothing
        ((), (), (1, 1, 1)),
        ((0, 5), (0,), (1, 0, 5)),
        ((5, 0), (0,), (1, 5, 0)),
        ((3, 0, 4), (0, 2), None),
    ],
)
def test_axis_layout(shape, axes, expected):
    assert _axes.axis_layout(shape, axes) == expected
    if expected is not None:
        outer, reduced, inner = expected
        assert outer * reduced * inner == int(np.prod(shape))
        # The layout is a reshape that reduces the same elements as NumPy over ``axes``.
        x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        want = x.sum(axis=axes).ravel() if axes else x.ravel()
        got = x.reshape(outer, reduced, inner).sum(axis=1).ravel()
        np.testing.assert_array_equal(got, want)


# -- _provenance.git_state ---------------------------------------------------------------------


def test_git_state_from_environment(monkeypatch):
    monkeypatch.setenv("MULTIREDUCE_GIT_COMMIT", "abc123")
    assert _provenance.git_state() == {"commit": "abc123", "dirty": None, "source": "MULTIREDUCE_GIT_COMMIT"}
    assert _provenance.git_commit() == "abc123"


def test_git_state_outside_any_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv("MULTIREDUCE_GIT_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.setattr(_provenance, "_CHECKOUT", tmp_path)
    state = _provenance.git_state()
    assert state["commit"] == "unknown" and state["dirty"] is None and state["source"]
    assert _provenance.git_commit() is None


def test_git_state_without_git(monkeypatch):
    monkeypatch.delenv("MULTIREDUCE_GIT_COMMIT", raising=False)
    monkeypatch.setenv("PATH", "")
    state = _provenance.git_state()
    assert state["commit"] == "unknown" and state["dirty"] is None
    assert state["source"].startswith("git not runnable")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_state_of_an_installed_copy_inside_another_repository(monkeypatch, tmp_path):
    # A wheel installed into a virtual environment that lives inside some other git checkout
    # (a .venv in a project's repository): that repository's commit is not multireduce's.
    other = tmp_path / "project"
    site = other / ".venv" / "lib" / "python3" / "site-packages"
    (site / "multireduce").mkdir(parents=True)
    (site / "multireduce" / "_provenance.py").write_text("# installed copy\n")
    env = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    (other / "app.py").write_text("print()\n")
    (other / ".gitignore").write_text(".venv/\n")
    subprocess.run(["git", *env, "-C", str(other), "add", "app.py", ".gitignore"], check=True)
    subprocess.run(["git", *env, "-C", str(other), "commit", "-q", "-m", "x"], check=True)
    monkeypatch.delenv("MULTIREDUCE_GIT_COMMIT", raising=False)
    monkeypatch.setattr(_provenance, "_CHECKOUT", site)
    state = _provenance.git_state()
    assert state["commit"] == "unknown", state
    assert state["dirty"] is None


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_git_state_of_this_checkout(monkeypatch):
    monkeypatch.delenv("MULTIREDUCE_GIT_COMMIT", raising=False)
    state = _provenance.git_state()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert state["commit"] == head.stdout.strip()
    assert state["source"] == "git" and isinstance(state["dirty"], bool)
