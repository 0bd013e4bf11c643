"""The README and docs/semantics.md against the code, on the CPU.

Links and named files exist, the benchmark commands' flags are accepted by their scripts, the
CLI takes the documented options, and the README's NumPy examples give what their comments
say. Each check reads the documents, so a path, flag or value that changes on one side only
fails here.
"""

from __future__ import annotations

import glob
import re
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import multireduce
import multireduce as mr
from multireduce import _cli

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
#: The committed measurements are not in an sdist (tests/ is): paths under bench/ are then
#: not checked, and the tests that read them skip.
RESULTS = REPO / "bench" / "results"
NO_RESULTS = pytest.mark.skipif(not RESULTS.is_dir(), reason="bench/results is not in this tree (an sdist)")


def _unshipped(path: Path) -> bool:
    """Whether ``path`` lies under bench/ in a tree that lacks the measurements."""
    return not RESULTS.is_dir() and path.resolve().is_relative_to(REPO / "bench")


SEMANTICS = REPO / "docs" / "semantics.md"
DOCS = (README, SEMANTICS)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _section(title: str) -> str:
    """The README's ``## title`` section, up to the next heading of level 2."""
    text = _text(README)
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", _text(path), flags=re.S)  # no headings inside code blocks
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def _expand(pattern: str) -> list[str]:
    """``a/{b,c}.d`` -> [``a/b.d``, ``a/c.d``]."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [p for alt in m.group(1).split(",") for p in _expand(pattern[: m.start()] + alt + pattern[m.end() :])]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_resolve(doc):
    text = re.sub(r"```.*?```", "", _text(doc), flags=re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links or doc is not README, "no links found in the README"
    bad = []
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists() and not _unshipped(path):
            bad.append(f"{link}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            bad.append(f"{link}: no heading with anchor #{anchor} in {path.name}")
    assert not bad, "\n".join(bad)


#: Backticked repository paths: things under these top-level names.
_ROOTS = ("bench/", "docs/", "kernels/", "multireduce/", "scripts/", "tests/", ".ci/")


def _named_paths(doc: Path) -> list[str]:
    found = []
    for span in re.findall(r"`([^`\n]+)`", _text(doc)):
        for word in span.split():
            word = word.strip("(),;:")
            if word.startswith(_ROOTS) and "<" not in word and "multireduce/kernels" not in word:
                found.append(word)
    return sorted(set(found))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_paths_exist(doc):
    names = _named_paths(doc)
    assert len(names) >= (20 if doc is README else 3), names
    names = [name for name in names if not _unshipped(REPO / name)]
    missing = [name for name in names if not any(glob.glob(str(REPO / p)) for p in _expand(name.rstrip("/")))]
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


@NO_RESULTS
def test_bare_result_names_exist():
    # "`h200_2a1f465/dtypes_mean_*.txt`" and the like, short for bench/results/...
    names = set(re.findall(r"`((?:h200|cpu|mpi|scaling)[\w]*_[0-9a-f]{7}[^`\s]*)`", _text(README)))
    names |= set(re.findall(r"\((?:`)?((?:h200|cpu)[\w]*_[0-9a-f]{7})(?:`)?[,)]", _text(README)))
    assert len(names) >= 10, names
    missing = [n for n in names if not any(glob.glob(str(REPO / "bench" / "results" / p)) for p in _expand(n))]
    assert not missing, f"README names results that bench/results lacks: {missing}"


def _script_commands() -> list[tuple[str, list[str]]]:
    """(script, flags) of every ``python scripts/X.py --flag ...`` in the README."""
    commands = []
    for m in re.finditer(r"python (scripts/[\w]+\.py)((?: --?[\w-]+(?: [^\s`;&|]+)?)*)", _text(README)):
        flags = re.findall(r"(--[\w-]+)", m.group(2))
        commands.append((m.group(1), flags))
    return commands


def test_readme_script_flags_are_accepted():
    commands = _script_commands()
    scripts = sorted({script for script, _ in commands})
    assert len(scripts) >= 10, scripts
    assert any(flags for _, flags in commands)

    def usage(script):
        done = subprocess.run(
            [sys.executable, str(REPO / script), "--help"], capture_output=True, text=True, timeout=60, cwd=REPO
        )
        return script, done

    with ThreadPoolExecutor(4) as pool:
        helps = dict(pool.map(usage, scripts))
    bad = []
    for script, done in helps.items():
        if done.returncode != 0:
            bad.append(f"{script} --help: exit {done.returncode}: {done.stderr[-300:]}")
    for script, flags in commands:
        accepted = set(re.findall(r"--[\w-]+", helps[script].stdout))
        bad += [f"{script} does not take {flag}" for flag in flags if flag not in accepted]
    assert not bad, "\n".join(bad)


def test_cli_options_in_the_table_parse():
    table = _section("Main job: `mpirun -n 4 python -m multireduce`")
    options = set(re.findall(r"^\| `(--[\w-]+)", table, flags=re.M))
    options |= set(re.findall(r"`(--[\w-]+)", table))
    assert {"--op", "--input", "--check", "--repeat", "--cpu", "--device"} <= options, options
    help_text = "".join(
        subprocess.run(
            [sys.executable, "-m", "multireduce", *command, "--help"], capture_output=True, text=True, timeout=60
        ).stdout
        for command in (["run"], [])  # run's options, and the program's own (--version)
    )
    for option in options - {"--output"}:  # --output is bench's
        assert option in help_text, f"README documents {option}; `run --help` and `--help` lack it"
    args = _cli._parse(["--op", "sum", "--op", "max", "--dtype", "int32", "--n", "100", "--no-check", "--json"])
    assert (args.command, args.ops, args.n, args.check, args.json) == ("run", ["sum", "max"], 100, False, True)
    assert _cli._parse([]).repeat == 3  # "best reported; default 3"
    with pytest.raises(_cli.UsageError, match="the CLI runs"):
        _cli._parse(["--op", "median"])
    with pytest.raises(_cli.UsageError, match="--per-rank applies to synthetic data"):
        _cli._parse(["--input", "x.npy", "--per-rank", "5"])
    bench = _cli._parse(["bench", "--output", "bench.json"])
    assert str(bench.output) == "bench.json"


def test_cli_documented_constants():
    text = _section("Main job: `mpirun -n 4 python -m multireduce`")
    assert "`x[i] = (i * 7919) % 2001 - 1000`" in text
    assert _cli._MULT == 7919
    assert _cli._Pattern.for_dtype(np.dtype(np.float32)) == _cli._Pattern(2001, -1000)
    assert _cli._Pattern.for_dtype(np.dtype(np.int8)) == _cli._Pattern(201, -100)
    assert _cli._Pattern.for_dtype(np.dtype(np.uint8)) == _cli._Pattern(201, 0)
    assert _cli._Pattern.for_dtype(np.dtype(np.bool_)) == _cli._Pattern(2, 0)
    assert "256 MiB per rank on a GPU, 16 MiB on a CPU" in text
    assert (_cli.DEFAULT_GPU_BYTES_PER_RANK, _cli.DEFAULT_CPU_BYTES_PER_RANK) == (256 * 2**20, 16 * 2**20)
    assert "Exit status: 0 ok, 1 error, 2 usage error, 3 a check failed, 130 interrupted" in text
    assert (_cli.EXIT_ERROR, _cli.EXIT_USAGE, _cli.EXIT_CHECK, _cli.EXIT_INTERRUPTED) == (1, 2, 3, 130)


def test_cli_help_and_info_run():
    done = subprocess.run([sys.executable, "-m", "multireduce", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "{run,info,bench}" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "multireduce", "info", "--cpu"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for line in ("backend: cpu", "MPI: ", "ranks: 1", "CUDA-aware MPI: ", "stream copy engine: "):
        assert line in done.stdout, done.stdout


def _python_blocks(section: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_python_api_first_example():
    (block,) = _python_blocks(_section("Python API"))
    line = next(ln for ln in block.splitlines() if ln.startswith("multireduce.sum(np.arange"))
    code, comment = line.split("#", 1)
    value = eval(code, {"np": np, "multireduce": multireduce})  # noqa: S307
    assert repr(value) == comment.split(",")[0].strip()  # "np.int64(45)"


def test_reductions_example_runs():
    (block,) = _python_blocks(_section("Reductions and semantics"))
    scope: dict = {}
    exec(block, scope)  # noqa: S102
    x = scope["x"]
    assert mr.sum(x, axis=0).shape == (64,) and mr.sum(x, axis=0).dtype == np.float32  # "(64,) float32"
    s = scope["s"]
    assert list(s.__dataclass_fields__) == ["count", "nan_count", "sum", "min", "max", "mean", "var", "std"]
    assert mr.argmax(x) == np.argmax(x)


def test_reproducible_example_values():
    (block,) = _python_blocks(_section("Reproducible sums"))
    lines = [ln for ln in block.splitlines() if ln.startswith(("import", "x =", "multireduce.sum"))]
    assert len(lines) == 4, lines
    scope: dict = {}
    for line in lines:
        code, _, comment = line.partition("#")
        value = eval(code, scope) if code.startswith("multireduce.sum") else exec(code, scope)  # noqa: S102, S307
        if comment:
            assert value == float(comment.split(":")[0].split(",")[0]), line
    # The prose: the order-free ops through reduce, the per-op functions sum and mean only.
    text = _section("Reproducible sums")
    assert "`multireduce.max(x,\nreproducible=True)` is a `TypeError`" in text
    with pytest.raises(TypeError):
        mr.max(np.arange(3.0), reproducible=True)
    assert mr.reduce(np.arange(3.0), "max", reproducible=True) == 2.0
    assert mr.sum(np.arange(6).reshape(2, 3), axis=0, reproducible=True).tolist() == [3, 5, 7]
    assert mr.mean(np.arange(3), reproducible=True) == 1.0  # an integer mean is exact
    for call in (
        lambda: mr.mean(np.full(8, 2**59), reproducible=True),  # its int64 total could wrap
        lambda: mr.sum(np.ones((2, 3)), axis=0, reproducible=True),
        lambda: mr.reduce(np.ones(3), "prod", reproducible=True),
    ):
        with pytest.raises(NotImplementedError):
            call()


def test_semantics_examples():
    """A few rows of the README's and docs/semantics.md's rules, run."""
    semantics = _text(SEMANTICS)
    readme = _section("Reductions and semantics")
    assert "is 1.07e37 here" in readme
    y = np.ones(1000, np.float32)
    y[0] = 3.4e38
    assert f"{float(mr.std(y)):.2e}" == "1.07e+37"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert np.isnan(mr.var(np.array([1.0, 2.0]), correction=2))  # NumPy: inf
        assert mr.var(np.array([]), correction=-1) == 0.0
    assert "`sum([1.7, 2.7], dtype=int32)` is\n  3" in semantics
    assert mr.sum(np.array([1.7, 2.7]), dtype=np.int32) == 3
    zeros = np.array([0.0, -0.0])
    assert not np.signbit(mr.max(zeros)) and not np.signbit(mr.max(zeros[::-1]))
    assert np.signbit(mr.min(zeros)) and np.signbit(mr.min(zeros[::-1]))
    with pytest.raises(np.exceptions.AxisError):
        mr.sum(np.array(3.0), axis=0)
    assert 'raises `ValueError("repeated axis")`' in semantics
    with pytest.raises(ValueError, match="^repeated axis$"):
        mr.sum(np.ones((2, 2)), axis=(0, 0))
    assert mr.sum(np.ones((2, 2)), keepdims=np.True_).shape == (1, 1)  # NumPy: TypeError
