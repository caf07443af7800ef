"""Workspaces: inline files, a folder's copy, a git clone at a ref."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from k8s_jobs.tasks import Workspace
from k8s_jobs.workspace import WorkspaceError, prepare_workspace


def git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
        "PATH": "/usr/bin:/bin",
        "HOME": str(cwd),
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_inline_files_are_written_with_their_folders(tmp_path: Path) -> None:
    prepare_workspace(Workspace(files={"a.txt": "A", "src/b.py": "B"}), tmp_path / "w")
    assert (tmp_path / "w" / "src" / "b.py").read_text() == "B"


def test_a_folder_is_copied_not_shared(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f").write_text("x")
    prepare_workspace(Workspace(dir=src), tmp_path / "w")
    (tmp_path / "w" / "sub" / "f").write_text("changed")
    assert (src / "sub" / "f").read_text() == "x"


def test_a_git_repository_is_cloned_at_its_ref(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "f").write_text("one")
    git(repo, "add", "f")
    git(repo, "commit", "-qm", "one")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "f").write_text("two")
    git(repo, "commit", "-qam", "two")
    prepare_workspace(Workspace(git=str(repo), ref=first), tmp_path / "w")
    assert (tmp_path / "w" / "f").read_text() == "one"
    prepare_workspace(Workspace(git=str(repo)), tmp_path / "w2")
    assert (tmp_path / "w2" / "f").read_text() == "two"


def test_a_bad_ref_is_a_workspace_error(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    with pytest.raises(WorkspaceError, match="failed"):
        prepare_workspace(Workspace(git=str(repo), ref="no-such-ref"), tmp_path / "w")
