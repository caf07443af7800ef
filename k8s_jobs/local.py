"""The local backend: many rollouts as subprocesses behind one shared Forge proxy.

Each rollout gets its own working directory (the task's workspace) and HOME, and its
proxy credentials carry its rollout id (``HTTPS_PROXY=http://<rollout-id>:x@127.0.0.1:P``, with
the proxy's ``forge_proxy_password`` in place of ``x`` where it has one),
which the addon records as the calls' rollout_id. The harness runs in its own process
group with the task's deadline; at the deadline its whole tree is killed. Then the
verifier grades the working directory. Each rollout ends with a ``rollouts`` row (the
runner's status) and, when graded, a ``rewards`` row.

Statuses: complete, partial (a template's "stopped early" exit code), crashed (any other
non-zero exit), timed_out, infra_error (workspace, missing harness program, verifier that
could not grade, proxy gone). Infra errors are retried with exponential backoff as a new
attempt (``<task>.<n>.r<k>``; the failed attempt keeps its infra_error row, which GRPO
drops); agent failures are never retried. A failing rollout never stops the others.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from k8s_jobs.attempt import reward_row, rollout_row, run_attempt
from k8s_jobs.harnesses import HarnessTemplate, builtin_harnesses
from k8s_jobs.outcome import FAILED_STATUSES, Progress, backoff_s, group_id, rollout_id
from k8s_jobs.processes import kill_tree
from k8s_jobs.tasks import Task
from mitm_addon.launch import (
    DEFAULT_CONFDIR,
    ForgeError,
    ProxySettings,
    RunningProxy,
    harness_env,
    start_proxy,
    stop_proxy_process,
)
from pipeline.shards import shard_files, write_rows

__all__ = ["RolloutOptions", "RolloutResult", "RunSummary", "plan_rollouts", "run_rollouts"]

log = logging.getLogger(__name__)

_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


@dataclass
class RolloutOptions:
    """Settings of one ``forge rollout`` run (the CLI flags, one to one)."""

    out_dir: Path
    """Run directory: shards (calls, messages, rollouts, rewards), proxy.log, logs/<rollout>/."""
    harness: str | None = None
    """Harness for every task (overrides each task's own ``harness``)."""
    n: int = 1
    """Rollouts per task: the GRPO group size."""
    parallel: int = 4
    """Rollouts running at once."""
    upstreams: list[str] = field(default_factory=list)
    """Proxy ``HOST=URL`` redirects (e.g. a scripted provider)."""
    model: str | None = None
    """Model for every rollout (the template's default otherwise)."""
    policy_version: int | None = None
    """Policy version the rollouts are launched with (written to rollouts rows and group ids)."""
    templates: Mapping[str, HarnessTemplate] | None = None
    """Harness templates by name (default: the built-in ones)."""
    timeout_s: float | None = None
    """Harness deadline for every task (each task's ``timeout`` otherwise)."""
    max_attempts: int = 3
    """Attempts per rollout when the environment fails (infra_error); agent failures: 1."""
    backoff_base_s: float = 2.0
    """Wait before the first retry; doubles each retry."""
    backoff_max_s: float = 60.0
    kill_grace_s: float = 2.0
    """Between SIGTERM and SIGKILL when a harness is killed at its deadline."""
    confdir: Path = DEFAULT_CONFDIR
    """mitmproxy directory holding Forge's CA."""
    work_root: Path | None = None
    """Where working directories and homes go (default: a new temporary folder)."""
    keep_workdirs: bool = False
    proxy_extra: list[str] = field(default_factory=list)
    """More ``--set NAME=VALUE`` for the proxy (forge_hosts, forge_mode, ...)."""
    on_progress: Callable[[Progress], None] | None = None
    """Called (from worker threads, serialised) whenever a rollout starts or ends."""
    resume: bool = False
    """Continue a run directory that already holds rollouts (a killed run): rollouts that
    ended are kept and not run again; the others run under ids not used before, so calls
    of an attempt cut short stay apart (they have no reward: GRPO drops them)."""


@dataclass(frozen=True)
class PlannedRollout:
    task: Task
    sample: int
    group_id: str
    first_attempt: int = 0
    """Attempt number of the first id to use (``rollout_id``): above 0 when resuming."""


@dataclass
class RolloutResult:
    rollout_id: str
    """The id of the attempt that counts (the last one)."""
    task_id: str
    sample: int
    group_id: str
    status: str
    reward: float | None = None
    details: dict[str, Any] | None = None
    exit_code: int | None = None
    error: str | None = None
    attempts: list[str] = field(default_factory=list)
    """Rollout ids of every attempt, in order (more than one after infra errors)."""
    wall_s: float = 0.0
    job: str | None = None
    """The Kubernetes Job's name (the k8s backend)."""


@dataclass
class RunSummary:
    out_dir: Path
    run_id: str
    results: list[RolloutResult]
    wall_s: float

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def mean_reward(self) -> float | None:
        rewards = [r.reward for r in self.results if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    @property
    def per_minute(self) -> float:
        return 60.0 * len(self.results) / self.wall_s if self.wall_s > 0 else 0.0


def plan_rollouts(
    tasks: Sequence[Task], n: int, policy_version: int | None
) -> list[PlannedRollout]:
    """Every (task, sample) pair, samples of a task next to each other."""
    return [
        PlannedRollout(task, sample, group_id(task.id, policy_version))
        for task in tasks
        for sample in range(n)
    ]


def run_rollouts(tasks: Sequence[Task], options: RolloutOptions) -> RunSummary:
    """Run ``options.n`` rollouts of every task, ``options.parallel`` at a time, behind one
    proxy recording into ``options.out_dir``; return when all have ended."""
    _check_options(tasks, options)
    out = options.out_dir.expanduser().resolve()
    if shard_files(out, "rollouts") and not options.resume:
        raise ForgeError(
            f"{out} already holds rollouts: pass a new --out directory for this run, or "
            "--resume to finish a run that was stopped"
        )
    templates = dict(options.templates or builtin_harnesses())
    for task in tasks:
        name = options.harness or task.harness
        if name is None:
            raise ForgeError(f"{task.source}: task {task.id!r} names no harness: pass --harness")
        if name not in templates:
            raise ForgeError(f"unknown harness {name!r}; known: {', '.join(sorted(templates))}")
    plan = plan_rollouts(tasks, options.n, options.policy_version)
    kept: list[RolloutResult] = []
    own_root = options.work_root is None
    work_root = Path(tempfile.mkdtemp(prefix="forge-rollouts-")) if own_root else options.work_root
    assert work_root is not None
    started = time.monotonic()
    proxy = start_proxy(
        ProxySettings(
            out_dir=out,
            confdir=options.confdir,
            upstreams=list(options.upstreams),
            extra=list(options.proxy_extra),
        )
    )
    if options.resume:
        # After the proxy started: it has stored the calls its predecessor left in the
        # write-ahead log, so a rollout cut short shows its calls.
        try:
            plan, kept = resume_plan(plan, *_recorded(out), options.max_attempts)
        except BaseException:
            stop_proxy_process(proxy.process)
            raise
    runner = _Runner(options, templates, out, work_root, proxy, len(plan))
    try:
        with ThreadPoolExecutor(max_workers=options.parallel, thread_name_prefix="rollout") as pool:
            futures = [pool.submit(runner.run_one, p) for p in plan]
            try:
                results = [f.result() for f in futures]
            except BaseException:
                runner.abort()
                for f in futures:
                    f.cancel()
                raise
    finally:
        code = stop_proxy_process(proxy.process)
        if code not in (0, -15):
            log.warning("the proxy exited with %s; see %s", code, proxy.log_path)
        if own_root and not options.keep_workdirs:
            shutil.rmtree(work_root, ignore_errors=True)
    return RunSummary(out, proxy.run_id, kept + results, time.monotonic() - started)


def _recorded(out: Path) -> tuple[dict[str, tuple[str, float | None]], set[str]]:
    """(rollout id -> (status, reward) of the rollouts that ended, every rollout id with
    a call or a row) in a run directory."""
    import duckdb

    from pipeline.store import connect

    con: duckdb.DuckDBPyConnection = connect(out)
    ended = {
        rid: (status, reward)
        for rid, status, reward in con.execute(
            "SELECT r.rollout_id, r.status, w.reward FROM rollouts_latest AS r "
            "LEFT JOIN rewards_latest AS w USING (rollout_id)"
        ).fetchall()
    }
    used = {r[0] for r in con.execute("SELECT DISTINCT rollout_id FROM calls").fetchall()}
    con.close()
    return ended, used | set(ended)


def resume_plan(
    plan: Sequence[PlannedRollout],
    ended: Mapping[str, tuple[str, float | None]],
    used: set[str],
    max_attempts: int,
) -> tuple[list[PlannedRollout], list[RolloutResult]]:
    """Split ``plan`` into the rollouts still to run and the results of those that ended
    (a final row other than a retryable infra_error). A rollout to run starts at the first
    attempt number whose id no call or row uses yet."""
    todo: list[PlannedRollout] = []
    kept: list[RolloutResult] = []
    for p in plan:
        attempt, last_ended = 0, None
        while (rid := rollout_id(p.task.id, p.sample, attempt)) in used:
            if rid in ended:
                last_ended = rid
            attempt += 1
        status = ended[last_ended][0] if last_ended else None
        if last_ended is not None and (status != "infra_error" or attempt >= max_attempts):
            result = RolloutResult(last_ended, p.task.id, p.sample, p.group_id, status or "")
            result.reward = ended[last_ended][1]
            result.attempts.append(last_ended)
            kept.append(result)
        else:
            todo.append(replace(p, first_attempt=attempt))
    return todo, kept


def _check_options(tasks: Sequence[Task], options: RolloutOptions) -> None:
    if not tasks:
        raise ForgeError("no tasks to run")
    if options.n < 1:
        raise ForgeError(f"-n must be at least 1, not {options.n}")
    if options.parallel < 1:
        raise ForgeError(f"--parallel must be at least 1, not {options.parallel}")
    if options.max_attempts < 1:
        raise ForgeError(f"--max-attempts must be at least 1, not {options.max_attempts}")
    if options.timeout_s is not None and not options.timeout_s > 0:
        raise ForgeError(f"--timeout must be positive, not {options.timeout_s}")
    for item in options.upstreams:
        if "=" not in item:
            raise ForgeError(
                f"--upstream {item!r}: expected HOST=URL, e.g. api.openai.com=http://127.0.0.1:9000"
            )


class _Runner:
    """State shared by the worker threads: the proxy, the progress counts, live processes."""

    def __init__(
        self,
        options: RolloutOptions,
        templates: Mapping[str, HarnessTemplate],
        out: Path,
        work_root: Path,
        proxy: RunningProxy,
        total: int,
    ) -> None:
        self.options = options
        self.templates = templates
        self.out = out
        self.work_root = work_root
        self.proxy = proxy
        # Proxy and CA variables for every runtime, computed once (writes the CA bundle).
        self.proxy_env = harness_env(proxy, {}, None)
        self._lock = threading.Lock()
        self._aborted = threading.Event()
        self._live: dict[int, subprocess.Popen[bytes]] = {}
        self._total = total
        self._running = self._done = self._failed = self._retries = self._rewarded = 0
        self._reward_sum = 0.0

    # ---------------------------------------------------------------- progress

    def _report(self, **delta: float) -> None:
        with self._lock:
            self._running += int(delta.get("running", 0))
            self._done += int(delta.get("done", 0))
            self._failed += int(delta.get("failed", 0))
            self._retries += int(delta.get("retries", 0))
            if "reward" in delta:
                self._reward_sum += float(delta["reward"])
                self._rewarded += 1
            snapshot = Progress(
                self._total,
                self._running,
                self._done,
                self._failed,
                self._retries,
                self._reward_sum,
                self._rewarded,
            )
            if self.options.on_progress is not None:
                self.options.on_progress(snapshot)

    def abort(self) -> None:
        """Stop starting rollouts and kill the running ones (Ctrl-C)."""
        self._aborted.set()
        with self._lock:
            live = list(self._live.values())
        for process in live:
            kill_tree(process, grace_s=0.5)

    # ---------------------------------------------------------------- one rollout

    def run_one(self, planned: PlannedRollout) -> RolloutResult:
        """All attempts of one rollout; never raises for a rollout's own failure."""
        task = planned.task
        result = RolloutResult("", task.id, planned.sample, planned.group_id, "infra_error")
        started = time.monotonic()
        self._report(running=1)
        try:
            first = planned.first_attempt
            for attempt in range(first, first + self.options.max_attempts):
                if self._aborted.is_set():
                    result.error = "aborted"
                    break
                if attempt > first:
                    self._report(retries=1)
                    n_retry = attempt - first
                    time.sleep(
                        backoff_s(n_retry, self.options.backoff_base_s, self.options.backoff_max_s)
                    )
                rid = rollout_id(task.id, planned.sample, attempt)
                result.rollout_id = rid
                result.attempts.append(rid)
                retry = self._attempt(planned, rid, result)
                if not retry:
                    break
        except Exception as e:  # a bug here must not stop the other rollouts: record it
            log.exception("rollout %s failed in the runner", result.rollout_id)
            result.status, result.error = "infra_error", f"runner error: {e!r}"
        finally:
            result.wall_s = time.monotonic() - started
            delta: dict[str, float] = {"running": -1, "done": 1}
            if result.status in FAILED_STATUSES:
                delta["failed"] = 1
            if result.reward is not None:
                delta["reward"] = result.reward
            self._report(**delta)
        return result

    def _attempt(self, planned: PlannedRollout, rid: str, result: RolloutResult) -> bool:
        """One attempt; fills ``result``; True when it should be retried."""
        task = planned.task
        template = self.templates[self.options.harness or task.harness or ""]
        base = self.work_root / rid
        # The proxy URL's user name is the rollout id: the addon records it on every call.
        proxy_env = dict(self.proxy_env)
        for name in _PROXY_VARS:
            proxy_env[name] = self.proxy.client_url(rid)
        try:
            outcome = run_attempt(
                task,
                template,
                rollout_id=rid,
                workdir=base / "work",
                home=base / "home",
                logs=self.out / "logs" / rid,
                proxy_env=proxy_env,
                model=self.options.model,
                timeout_s=self.options.timeout_s,
                grace_s=self.options.kill_grace_s,
                on_start=self._track,
                proxy_alive=self._proxy_problem,
            )
        finally:
            self._untrack()
            if not self.options.keep_workdirs:
                shutil.rmtree(base, ignore_errors=True)
        result.status, result.exit_code, result.error = (
            outcome.status,
            outcome.exit_code,
            outcome.error,
        )
        result.reward = outcome.verdict.reward if outcome.verdict else None
        result.details = outcome.verdict.details if outcome.verdict else None
        row = rollout_row(
            task,
            rid,
            template.name,
            planned.group_id,
            self.options.policy_version,
            planned.sample,
            outcome,
        )
        # The reward first: a rollouts row marks a rollout that ended (what --resume keeps).
        if outcome.verdict is not None:
            write_rows(self.out, "rewards", [reward_row(rid, outcome.verdict)])
        write_rows(self.out, "rollouts", [row])
        return outcome.status == "infra_error" and outcome.retryable and not self._aborted.is_set()

    def _proxy_problem(self) -> str | None:
        code = self.proxy.process.poll()
        return None if code is None else f"the proxy exited ({code}); see {self.proxy.log_path}"

    def _track(self, process: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._live[threading.get_ident()] = process
        if self._aborted.is_set():
            kill_tree(process, grace_s=0.5)

    def _untrack(self) -> None:
        with self._lock:
            self._live.pop(threading.get_ident(), None)


def summary_json(summary: RunSummary) -> str:
    """The run's results as JSON (``forge rollout --json`` and results.json in the run)."""
    return json.dumps(
        {
            "out_dir": str(summary.out_dir),
            "run_id": summary.run_id,
            "wall_s": round(summary.wall_s, 3),
            "rollouts_per_minute": round(summary.per_minute, 3),
            "mean_reward": summary.mean_reward,
            "results": [
                {
                    "rollout_id": r.rollout_id,
                    "task_id": r.task_id,
                    "sample": r.sample,
                    "group_id": r.group_id,
                    "status": r.status,
                    "reward": r.reward,
                    "exit_code": r.exit_code,
                    "attempts": r.attempts,
                    "error": r.error,
                    "wall_s": round(r.wall_s, 3),
                }
                for r in summary.results
            ],
        },
        indent=2,
    )
