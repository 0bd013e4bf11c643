"""Where a result came from: the git commit that benchmark and CLI records carry."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def git_state() -> dict:
    """``{"commit": sha or "unknown", "dirty": bool or None, "source": how it was found}``.

    ``$MULTIREDUCE_GIT_COMMIT`` wins: it names the commit of a copied working tree that has
    no history of its own (as on the GPU machine). Untracked files do not count as dirty, or
    every new result file under bench/results would. An installed copy of the package (one
    that no git checkout around it tracks) gives ``"unknown"``.
    """
    given = os.environ.get("MULTIREDUCE_GIT_COMMIT")
    if given:
        return {"commit": given, "dirty": None, "source": "MULTIREDUCE_GIT_COMMIT"}

    def git(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *cmd], cwd=_CHECKOUT, capture_output=True, text=True, timeout=10, check=False)

    try:
        # This copy of the package must be tracked by the checkout found around it: an installed
        # copy (site-packages in a virtual environment inside some other repository) is not, and
        # that repository's commit says nothing about multireduce.
        tracked = git("ls-files", "--error-unmatch", "--", f"multireduce/{Path(__file__).name}")
        if tracked.returncode != 0:
            reason = tracked.stderr.strip() or "not tracked"
            return {"commit": "unknown", "dirty": None, "source": f"not a git checkout of multireduce: {reason}"}
        head = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"commit": "unknown", "dirty": None, "source": f"git not runnable: {exc}"}
    if head.returncode != 0:
        return {"commit": "unknown", "dirty": None, "source": f"git: {head.stderr.strip()}"}
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": head.stdout.strip(), "dirty": dirty, "source": "git"}


def git_commit() -> str | None:
    """The commit alone, or None where it is unknown."""
    commit = git_state()["commit"]
    return None if commit == "unknown" else commit
