"""Lay out a rollout's working directory from its task's workspace spec."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from k8s_jobs.tasks import Workspace

__all__ = ["WorkspaceError", "prepare_workspace"]

_GIT_TIMEOUT_S = 300.0  # a clone of a large local repository; remote ones need the network


class WorkspaceError(RuntimeError):
    """The workspace could not be laid out (an environment failure, not the agent's)."""


def prepare_workspace(workspace: Workspace, dest: Path) -> None:
    """Fill ``dest`` (created if missing) with the task's files, folder copy or git clone."""
    dest.mkdir(parents=True, exist_ok=True)
    if workspace.files is not None:
        for name, text in workspace.files.items():
            path = dest / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    elif workspace.dir is not None:
        try:
            shutil.copytree(workspace.dir, dest, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error) as e:
            raise WorkspaceError(f"cannot copy {workspace.dir} into the workspace: {e}") from e
    elif workspace.git is not None:
        _clone(workspace.git, workspace.ref, dest)


def _clone(source: str, ref: str | None, dest: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(dest.parent),
        "GIT_TERMINAL_PROMPT": "0",  # never wait for credentials
        "LANG": "C.UTF-8",
    }
    steps = [["git", "clone", "--quiet", "--no-hardlinks", "--", source, str(dest)]]
    if ref:
        steps.append(["git", "-C", str(dest), "checkout", "--quiet", "--detach", ref])
    for argv in steps:
        try:
            done = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                timeout=_GIT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise WorkspaceError(f"{' '.join(argv[:2])} failed: {e}") from e
        if done.returncode != 0:
            raise WorkspaceError(
                f"{' '.join(argv[:3])} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
            )
