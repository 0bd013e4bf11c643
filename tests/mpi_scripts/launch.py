"""Start a command under mpiexec with a hard timeout, from the repository root.

``MULTIREDUCE_MPIEXEC_ARGS`` adds launcher options (Open MPI as root needs
``--allow-run-as-root --oversubscribe``); the mpiexec itself comes from the ``mpiexec``
fixture in conftest.py (next to the interpreter, else on PATH).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "scripts"))
import _mpiexec  # noqa: E402


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def result(self) -> Any:
        """The JSON after ``RESULT `` on the one stdout line that starts with it (rank 0's report)."""
        (line,) = [ln for ln in self.stdout.splitlines() if ln.startswith("RESULT ")]
        return json.loads(line.removeprefix("RESULT "))


def env() -> dict[str, str]:
    out = _mpiexec.repo_env(REPO)
    # Never inherit an override from the developer's shell: tests set it explicitly.
    out.pop("MULTIREDUCE_CUDA_AWARE", None)
    return out


def run(mpiexec: str | None, ranks: int, args: list[str], timeout: float = 60, extra_env=None) -> Finished:
    """Run ``python ARGS`` on ``ranks`` ranks (``mpiexec=None``: one process, no launcher)."""
    cmd = [sys.executable, *args] if mpiexec is None else _mpiexec.command(mpiexec, ranks, args)
    environment = env()
    environment.update(extra_env or {})
    start = time.monotonic()
    try:
        returncode, stdout, stderr = _mpiexec.run_group(cmd, cwd=REPO, env=environment, timeout=timeout)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None
    return Finished(returncode, stdout, stderr, time.monotonic() - start)
