"""Bounded runs: the deadline kills the whole tree, even a grandchild in its own session."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from k8s_jobs.processes import run_bounded

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def test_a_finished_command_reports_its_exit_code(tmp_path: Path) -> None:
    done = run_bounded(
        ["bash", "-c", "echo out; echo err >&2; exit 5"],
        cwd=tmp_path,
        env=ENV,
        stdout=tmp_path / "o",
        stderr=tmp_path / "e",
        timeout_s=30,
    )
    assert (done.exit_code, done.timed_out) == (5, False)
    assert (tmp_path / "o").read_text() == "out\n" and (tmp_path / "e").read_text() == "err\n"


def test_the_deadline_kills_children_and_setsid_grandchildren(tmp_path: Path) -> None:
    script = (
        "sleep 611 & "
        "setsid bash -c 'echo $$ > escaped.pid; exec sleep 612' & "
        "trap '' TERM; sleep 613"  # the root ignores SIGTERM: SIGKILL must follow
    )
    started = time.monotonic()
    done = run_bounded(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=ENV,
        stdout=tmp_path / "o",
        stderr=tmp_path / "e",
        timeout_s=1.5,
        grace_s=0.5,
    )
    assert done.timed_out and done.exit_code is None
    assert time.monotonic() - started < 20
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(f"sleep {n}" in " ".join(p.info["cmdline"] or []) for n in (611, 612, 613))
    ]
    assert left == []


def test_background_leftovers_of_a_finished_run_are_killed(tmp_path: Path) -> None:
    done = run_bounded(
        ["bash", "-c", "sleep 614 & exit 0"],
        cwd=tmp_path,
        env=ENV,
        stdout=tmp_path / "o",
        stderr=tmp_path / "e",
        timeout_s=30,
    )
    assert done.exit_code == 0
    time.sleep(0.2)
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "sleep 614" in " ".join(p.info["cmdline"] or [])
    ]
    assert left == []
