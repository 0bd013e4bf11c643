"""Finding mpiexec and running a command under it with a hard timeout.

Shared by the scripts (``bench_scaling.py``) and the test suite (``tests/conftest.py``,
``tests/mpi_scripts/launch.py``), so that all of them find the same launcher and kill a hung
job the same way.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path


def find_mpiexec() -> str | None:
    """``$MULTIREDUCE_MPIEXEC`` if set, else the mpiexec next to this interpreter (the PyPI
    mpich wheel installs it there), else the one on PATH; None if there is none."""
    chosen = os.environ.get("MULTIREDUCE_MPIEXEC")
    if chosen:
        return chosen
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def command(mpiexec: str, ranks: int, args: list[str]) -> list[str]:
    """``mpiexec [$MULTIREDUCE_MPIEXEC_ARGS] -n R python ARGS`` (Open MPI as root needs
    ``--allow-run-as-root --oversubscribe`` there)."""
    extra = shlex.split(os.environ.get("MULTIREDUCE_MPIEXEC_ARGS", ""))
    return [mpiexec, *extra, "-n", str(ranks), sys.executable, *args]


def repo_env(repo: Path) -> dict[str, str]:
    """This process's environment with ``repo`` first on PYTHONPATH (the checkout under test
    or benchmark, installed or not)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p)
    return env


def run_group(cmd: list[str], *, cwd: Path, env: dict, timeout: float) -> tuple[int, str, str]:
    """Run ``cmd`` in a session of its own; ``(returncode, stdout, stderr)``.

    Raises
    ------
    TimeoutError
        After ``timeout`` seconds, once the whole process group (mpiexec and every rank, not
        just mpiexec) is killed; the message holds the command and its output.
    """
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise TimeoutError(f"timed out after {timeout} s: {shlex.join(cmd)}\n{stdout}{stderr}") from None
    return proc.returncode, stdout, stderr
