"""One rollout attempt, wherever it runs (a local subprocess or a Kubernetes pod): lay out the
workspace, run the harness to its deadline, grade the result, and build its rows.

The caller supplies the proxy variables (the shared local proxy with the rollout id in its
credentials, or the pod's sidecar) and writes the rows where its shards go.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from k8s_jobs.harnesses import HarnessTemplate, render, resolve_executable
from k8s_jobs.outcome import classify_exit
from k8s_jobs.processes import run_bounded
from k8s_jobs.tasks import Task
from k8s_jobs.verifier import VerifierError, VerifierResult, run_verifier
from k8s_jobs.workspace import WorkspaceError, prepare_workspace
from pipeline.canonical import canonical_json

__all__ = ["REWARD_SOURCE", "AttemptOutcome", "reward_row", "rollout_row", "run_attempt"]

REWARD_SOURCE = "forge rollout verifier"


@dataclass
class AttemptOutcome:
    status: str
    exit_code: int | None = None
    verdict: VerifierResult | None = None
    error: str | None = None
    argv: list[str] = field(default_factory=list)
    retryable: bool = False
    """For infra_error: whether another attempt may succeed (a missing program will not)."""
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    ended_at: datetime | None = None


class _InfraError(RuntimeError):
    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def run_attempt(
    task: Task,
    template: HarnessTemplate,
    *,
    rollout_id: str,
    workdir: Path,
    home: Path,
    logs: Path,
    proxy_env: Mapping[str, str],
    model: str | None = None,
    timeout_s: float | None = None,
    grace_s: float = 2.0,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
    proxy_alive: Callable[[], str | None] | None = None,
) -> AttemptOutcome:
    """Run one attempt to its end; never raises for the rollout's own failures.

    ``proxy_alive`` returns None while the proxy works, else why it does not (checked
    after the harness: calls it made after the proxy died were not recorded)."""
    outcome = AttemptOutcome(status="infra_error")
    logs.mkdir(parents=True, exist_ok=True)
    try:
        prepare_workspace(task.workspace, workdir)
        cmd = render(
            template,
            instruction=task.instruction,
            workdir=workdir,
            home=home,
            rollout_id=rollout_id,
            task_id=task.id,
            model=model,
        )
        for d in (home, home / "tmp", *(home / h for h in cmd.home_dirs)):
            d.mkdir(parents=True, exist_ok=True)
        argv = list(cmd.argv)
        program = resolve_executable(argv[0], os.environ.get("PATH"))
        if program is None:
            raise _InfraError(
                f"harness {template.name!r}: program {argv[0]!r} not found "
                "(install it, or name its path in a harness config)",
                retryable=False,
            )
        argv[0] = program
        outcome.argv = argv
        env = harness_env(cmd.env, task, rollout_id, home, proxy_env)
        timeout = timeout_s or task.timeout_s
        try:
            finished = run_bounded(
                argv,
                cwd=workdir,
                env=env,
                stdout=logs / "harness.stdout",
                stderr=logs / "harness.stderr",
                timeout_s=timeout,
                grace_s=grace_s,
                on_start=on_start,
            )
        except OSError as e:
            raise _InfraError(f"cannot run {argv[0]!r}: {e.strerror or e}", retryable=False) from e
        if proxy_alive is not None and (why := proxy_alive()):
            raise _InfraError(why)
        outcome.exit_code = finished.exit_code
        status = classify_exit(finished.exit_code, finished.timed_out, template.partial_exit_codes)
        if finished.timed_out:
            outcome.error = f"killed at the deadline of {timeout:g} s"
        elif status != "complete":
            outcome.error = f"harness exited with {finished.exit_code}"
        if task.verifier is not None:
            venv = verifier_env(task, rollout_id, home, workdir, status, finished.exit_code, logs)
            try:
                outcome.verdict = run_verifier(task.verifier, cwd=workdir, env=venv, log_dir=logs)
            except VerifierError as e:
                raise _InfraError(f"verifier: {e}") from e
        outcome.status = status
    except (_InfraError, WorkspaceError) as e:
        outcome.status, outcome.verdict, outcome.error = "infra_error", None, str(e)
        outcome.retryable = getattr(e, "retryable", True)
    outcome.ended_at = datetime.now(UTC)
    return outcome


def harness_env(
    template_env: Mapping[str, str],
    task: Task,
    rollout_id: str,
    home: Path,
    proxy_env: Mapping[str, str],
) -> dict[str, str]:
    """Built from scratch: nothing of the caller's environment leaks in but PATH (and what
    the template's pass_env named); then the proxy and CA variables."""
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
    }
    env.update(template_env)
    env.update(task.environment)
    env.update(proxy_env)
    env["FORGE_ROLLOUT_ID"], env["FORGE_TASK_ID"] = rollout_id, task.id
    return env


def verifier_env(
    task: Task,
    rollout_id: str,
    home: Path,
    workdir: Path,
    status: str,
    exit_code: int | None,
    logs: Path,
) -> dict[str, str]:
    """The verifier sees the task's environment and the run's outcome, not the proxy."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": str(home / "tmp"),
        **task.environment,
        "FORGE_ROLLOUT_ID": rollout_id,
        "FORGE_TASK_ID": task.id,
        "FORGE_WORKDIR": str(workdir),
        "FORGE_HARNESS_STATUS": status,
        "FORGE_HARNESS_EXIT_CODE": "" if exit_code is None else str(exit_code),
        "FORGE_HARNESS_STDOUT": str(logs / "harness.stdout"),
    }


def rollout_row(
    task: Task,
    rollout_id: str,
    harness: str,
    group_id: str,
    policy_version: int | None,
    sample: int,
    outcome: AttemptOutcome,
) -> dict[str, Any]:
    """The attempt's ``rollouts`` row (pipeline.schema.ROLLOUTS)."""
    now = datetime.now(UTC)
    return {
        "rollout_id": rollout_id,
        "task_id": task.id,
        "harness": harness,
        "group_id": group_id,
        "policy_version": policy_version,
        "status": outcome.status,
        "exit_code": outcome.exit_code,
        "started_at": outcome.started_at,
        "ended_at": outcome.ended_at or now,
        "command": outcome.argv,
        "metadata_json": canonical_json({**task.metadata, "sample": sample}),
        "written_at": now,
    }


def reward_row(rollout_id: str, verdict: VerifierResult) -> dict[str, Any]:
    """The verifier's ``rewards`` row (pipeline.schema.REWARDS); the runner's status stands."""
    return {
        "rollout_id": rollout_id,
        "reward": verdict.reward,
        "status": None,
        "details_json": canonical_json(verdict.details),
        "source": REWARD_SOURCE,
        "written_at": datetime.now(UTC),
    }
