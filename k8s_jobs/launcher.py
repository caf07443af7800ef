"""The Kubernetes backend: create the rendered Jobs through the API server and follow them.

At most ``parallel`` Jobs exist at once and at most ``create_per_s`` are created per second.
Creation retries 429 and 5xx replies with backoff (honouring ``Retry-After``); 409 means the
Job already exists (a relaunch) and is adopted; any other refusal is the rollout's
infra_error. Jobs are followed with a watch (label ``forge.dev/run``), restarted with
backoff when it breaks and relisted when its resource version expires (410). How a Job
ended gives the rollout's status (``job_outcome``): the harness container's termination
message (written by ``k8s_jobs.pod``) for complete Jobs; DeadlineExceeded is timed_out;
retries exhausted, a failed pod entrypoint, or an image that cannot be pulled is
infra_error (the stuck Job is deleted).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from k8s_jobs.k8s import LABEL_PREFIX, K8sSettings, label_value, render_job, to_dict
from k8s_jobs.local import PlannedRollout, RolloutResult, plan_rollouts
from k8s_jobs.outcome import FAILED_STATUSES, STATUSES, Progress, backoff_s, rollout_id
from k8s_jobs.tasks import Task

__all__ = ["LaunchOptions", "job_outcome", "launch_jobs"]

log = logging.getLogger(__name__)

# Waiting reasons of a container that will not start without a change to the Job.
STUCK_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
)
_RETRYABLE = frozenset({429, 500, 502, 503, 504})


@dataclass
class LaunchOptions:
    settings: K8sSettings
    parallel: int = 50
    """Jobs that exist at once."""
    create_per_s: float = 5.0
    """Job creations per second (the API server's priority and fairness allows bursts, not floods)."""
    api_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    watch_timeout_s: int = 30
    stuck_grace_s: float = 120.0
    """How long a pod may wait on an image pull error before its Job is deleted."""
    deadline_s: float = 24 * 3600.0
    on_progress: Callable[[Progress], None] | None = None
    clock: Callable[[], float] = field(default=time.monotonic)
    sleep: Callable[[float], None] = field(default=time.sleep)


def job_outcome(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> tuple[str, float | None, str | None] | None:
    """(status, reward, error) of a finished Job from its JSON and its pods' JSON; None
    while it runs (pure)."""
    conditions = {
        c.get("type"): c
        for c in (job.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    if "Complete" in conditions:
        message = _harness_message(pods)
        if message is None:
            return "infra_error", None, "the harness container left no result message"
        status = message.get("status")
        if status not in STATUSES:
            return "infra_error", None, f"unexpected result message {message!r}"
        reward = message.get("reward")
        return (
            str(status),
            float(reward) if isinstance(reward, int | float) else None,
            message.get("error"),
        )
    failed = conditions.get("Failed")
    if failed is not None:
        reason = failed.get("reason") or "Failed"
        text = f"{reason}: {failed.get('message') or ''}".rstrip(": ")
        if reason == "DeadlineExceeded":
            return "timed_out", None, text
        return "infra_error", None, text
    return None


def _harness_message(pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") == "harness" and terminated.get("exitCode") == 0:
                try:
                    value = json.loads(terminated.get("message") or "")
                except ValueError:
                    return None
                return value if isinstance(value, dict) else None
    return None


def stuck_reason(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """A waiting reason that will not clear by itself (image pull errors), or None (pure)."""
    for pod in pods:
        status = pod.get("status") or {}
        for cs in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_REASONS:
                return (
                    f"{cs.get('name')}: {waiting['reason']}: {waiting.get('message') or ''}".rstrip(
                        ": "
                    )
                )
    return None


class _Launch:
    def __init__(
        self, tasks: Sequence[Task], options: LaunchOptions, api: client.ApiClient
    ) -> None:
        self.o = options
        self.ns = options.settings.namespace
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.selector = f"{LABEL_PREFIX}/run={label_value(options.settings.run_name)}"
        self.pending: deque[tuple[PlannedRollout, client.V1Job]] = deque()
        self.order: dict[str, int] = {}
        for planned in plan_rollouts(tasks, options.settings.n, options.settings.policy_version):
            self.order[rollout_id(planned.task.id, planned.sample)] = len(self.order)
            self.pending.append((planned, render_job(planned, options.settings)))
        self.total = len(self.pending)
        self.active: dict[str, PlannedRollout] = {}
        self.stuck_since: dict[str, float] = {}
        self.results: dict[str, RolloutResult] = {}
        self.next_create = 0.0
        self.resource_version: str | None = None

    # -------------------------------------------------------------- API calls

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Call the API, retrying 429 and 5xx with backoff (Retry-After when given)."""
        for attempt in range(1, self.o.api_attempts + 1):
            try:
                return fn()
            except ApiException as e:
                if e.status not in _RETRYABLE or attempt == self.o.api_attempts:
                    raise
                wait = backoff_s(attempt, self.o.backoff_base_s, self.o.backoff_max_s)
                retry_after = (e.headers or {}).get("Retry-After")
                if retry_after and retry_after.isdigit():
                    wait = float(retry_after)
                log.info("%s: %s %s; retrying in %.1f s", what, e.status, e.reason, wait)
                self.o.sleep(wait)
        raise AssertionError("unreachable")

    def _create(self, planned: PlannedRollout, job: client.V1Job) -> None:
        name = str(job.metadata.name) if job.metadata else ""
        now = self.o.clock()
        if now < self.next_create:
            self.o.sleep(self.next_create - now)
        self.next_create = max(now, self.next_create) + 1.0 / self.o.create_per_s
        try:
            self._call(f"create {name}", lambda: self.batch.create_namespaced_job(self.ns, job))
        except ApiException as e:
            if e.status != 409:  # 409 AlreadyExists: a relaunch adopts the Job
                self._finish(
                    planned, name, "infra_error", None, f"create: {e.status} {_message(e)}"
                )
                return
        self.active[name] = planned
        self._progress()

    def _pods(self, name: str) -> list[dict[str, Any]]:
        pods = self._call(
            f"list pods of {name}",
            lambda: self.core.list_namespaced_pod(self.ns, label_selector=f"job-name={name}"),
        )
        return [to_dict(p) for p in pods.items]

    # -------------------------------------------------------------- progress

    def _finish(
        self,
        planned: PlannedRollout,
        name: str,
        status: str,
        reward: float | None,
        error: str | None,
    ) -> None:
        self.active.pop(name, None)
        rid = rollout_id(planned.task.id, planned.sample)
        self.results[rid] = RolloutResult(
            rid,
            planned.task.id,
            planned.sample,
            planned.group_id,
            status,
            reward=reward,
            error=error,
            attempts=[rid],
            job=name,
        )
        self._progress()

    def _progress(self) -> None:
        if self.o.on_progress is None:
            return
        done = list(self.results.values())
        rewards = [r.reward for r in done if r.reward is not None]
        self.o.on_progress(
            Progress(
                self.total,
                len(self.active),
                len(done),
                sum(r.status in FAILED_STATUSES for r in done),
                0,
                sum(rewards),
                len(rewards),
            )
        )

    # -------------------------------------------------------------- the loop

    def run(self) -> list[RolloutResult]:
        started = self.o.clock()
        while self.pending or self.active:
            if self.o.clock() - started > self.o.deadline_s:
                for name, planned in list(self.active.items()):
                    self._finish(planned, name, "infra_error", None, "launcher deadline passed")
                for planned, job in self.pending:
                    name = str(job.metadata.name) if job.metadata else ""
                    self._finish(planned, name, "infra_error", None, "not launched")
                self.pending.clear()
                break
            while self.pending and len(self.active) < self.o.parallel:
                self._create(*self.pending.popleft())
            if self.active:
                self._watch_once()
                self._check_stuck()
        return sorted(self.results.values(), key=lambda r: self.order[r.rollout_id])

    def _watch_once(self) -> None:
        """One watch window: handle events until it times out or a slot frees up."""
        try:
            stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                self.batch.list_namespaced_job,
                self.ns,
                label_selector=self.selector,
                resource_version=self.resource_version,
                timeout_seconds=self.o.watch_timeout_s,
                deserialize=False,
            )
            for event in stream:
                obj = event.get("object") or {}
                meta = obj.get("metadata") or {}
                if meta.get("resourceVersion"):
                    self.resource_version = meta["resourceVersion"]
                if self._handle_job(obj) and self.pending:
                    break  # a slot is free: create the next Job
        except ApiException as e:
            if e.status == 410:  # our resource version expired: start again from now
                self.resource_version = None
            else:
                log.warning("watch failed (%s %s); backing off", e.status, e.reason)
                self.o.sleep(backoff_s(1, self.o.backoff_base_s, self.o.backoff_max_s))
        except (OSError, ValueError) as e:  # connection reset, truncated stream
            log.warning("watch broke (%s); backing off", e)
            self.o.sleep(backoff_s(1, self.o.backoff_base_s, self.o.backoff_max_s))

    def _handle_job(self, job: Mapping[str, Any]) -> bool:
        name = (job.get("metadata") or {}).get("name")
        planned = self.active.get(name or "")
        if planned is None or name is None:
            return False
        outcome = job_outcome(job, self._pods(name) if _finished(job) else [])
        if outcome is None:
            return False
        self._finish(planned, name, *outcome)
        return True

    def _check_stuck(self) -> None:
        """Also catches ends a broken watch missed: each active Job is read once a window."""
        for name, planned in list(self.active.items()):
            try:
                job = to_dict(self._call(f"read {name}", self._reader(name)))
            except ApiException as e:
                if e.status == 404:
                    self._finish(planned, name, "infra_error", None, "the Job was deleted")
                continue
            if self._handle_job(job):
                continue
            reason = stuck_reason(self._pods(name))
            if reason is None:
                self.stuck_since.pop(name, None)
                continue
            first = self.stuck_since.setdefault(name, self.o.clock())
            if self.o.clock() - first >= self.o.stuck_grace_s:
                self._delete(name)
                self._finish(planned, name, "infra_error", None, reason)

    def _reader(self, name: str) -> Callable[[], Any]:
        return lambda: self.batch.read_namespaced_job(name, self.ns)

    def _delete(self, name: str) -> None:
        try:
            self._call(
                f"delete {name}",
                lambda: self.batch.delete_namespaced_job(
                    name, self.ns, propagation_policy="Background"
                ),
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("could not delete Job %s: %s %s", name, e.status, e.reason)


def _finished(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


def launch_jobs(
    tasks: Sequence[Task], options: LaunchOptions, api: client.ApiClient
) -> list[RolloutResult]:
    """Create every rollout's Job, follow them to their ends, return one result each."""
    return _Launch(tasks, options, api).run()
