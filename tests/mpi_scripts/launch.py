"""Start a command under mpiexec with a hard timeout, from the repository root.

``MULTIREDUCE_MPIEXEC_ARGS`` adds launcher options (Open MPI as root needs
``--allow-run-as-root --oversubscribe``); the mpiexec itself comes from the ``mpiexec``
fixture in conftest.py (next to the interpreter, else on PATH).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), out.get("PYTHONPATH", "")) if p)
    # Never inherit an override from the developer's shell: tests set it explicitly.
    out.pop("MULTIREDUCE_CUDA_AWARE", None)
    return out


def run(mpiexec: str | None, ranks: int, args: list[str], timeout: float = 60, extra_env=None) -> Finished:
    """Run ``python ARGS`` on ``ranks`` ranks (``mpiexec=None``: one process, no launcher)."""
    cmd = [sys.executable, *args]
    if mpiexec is not None:
        launcher_args = shlex.split(os.environ.get("MULTIREDUCE_MPIEXEC_ARGS", ""))
        cmd = [mpiexec, *launcher_args, "-n", str(ranks), *cmd]
    environment = env()
    environment.update(extra_env or {})
    start = time.monotonic()
    # A session of its own, so that a hung job is killed with all its ranks, not just mpiexec.
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s: {shlex.join(cmd)}\n{stdout}{stderr}") from None
    return Finished(proc.returncode, stdout, stderr, time.monotonic() - start)
