"""Run a command in its own process group with a deadline; kill its whole tree."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["Finished", "kill_tree", "run_bounded"]


@dataclass(frozen=True)
class Finished:
    """How a bounded run ended: ``exit_code`` is None when it was killed at the deadline."""

    exit_code: int | None
    timed_out: bool
    wall_s: float


def kill_tree(process: subprocess.Popen[bytes], grace_s: float = 2.0) -> None:
    """SIGTERM the process group and every descendant (even those that left the group
    with setsid), wait up to ``grace_s``, then SIGKILL what is left."""
    try:
        root = psutil.Process(process.pid)
        victims = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        victims = []
    _signal_group(process.pid, signal.SIGTERM)
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(victims, timeout=grace_s)
    _signal_group(process.pid, signal.SIGKILL)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def run_bounded(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdout: Path,
    stderr: Path,
    timeout_s: float,
    grace_s: float = 2.0,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Finished:
    """Run ``argv`` (stdin closed, output to files) in a new session; at the deadline kill
    its tree. Processes it leaves behind in its group are killed when it exits.
    OSError (program missing, not executable) propagates: the caller decides what it means."""
    started = time.monotonic()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    if on_start is not None:
        on_start(process)
    try:
        code: int | None = process.wait(timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_tree(process, grace_s)
        code, timed_out = None, True
    else:
        _signal_group(process.pid, signal.SIGKILL)  # background leftovers of a finished run
    return Finished(code, timed_out, time.monotonic() - started)
