"""A local HTTP server answering the Kubernetes REST API for Jobs and Pods, for launcher tests.

It speaks the real API's wire format: JSON objects with ``kind``/``apiVersion``, ``Status``
bodies for errors (404 NotFound, 409 AlreadyExists, 429 TooManyRequests with
``Retry-After``, 500 InternalError), ``*List`` replies with a ``resourceVersion``, label
selectors (``a=b,c=d``), and watches (``?watch=true``) as a stream of JSON lines
``{"type": "ADDED"|"MODIFIED"|"DELETED"|"ERROR", "object": ...}`` that ends at
``timeoutSeconds``; a resource version older than the server keeps gives an ERROR event
with a 410 Expired Status, as the real server does.

Endpoints: ``POST/GET /apis/batch/v1/namespaces/{ns}/jobs``, ``GET/DELETE
.../jobs/{name}``, ``GET /api/v1/namespaces/{ns}/pods``.

A small controller plays the job controller and kubelet: each created Job follows the
scenario named by its ``forge.dev/task`` label (see ``SCENARIOS``), so one test can cover
every ending. ``faults`` injects replies: ``{"create": [429, 500], "watch": [500, 410]}``
answers the next create calls and watches with those statuses, in order.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

# task label -> what happens to the Job's pod(s)
SCENARIOS = (
    "ok",  # the pod runs; the harness container exits 0 with a result message; Job Complete
    "agent-crash",  # the agent crashed: the pod still exits 0, its message says crashed
    "deadline",  # Job Failed, reason DeadlineExceeded
    "infra",  # pods exit 75 until backoffLimit: Job Failed, reason BackoffLimitExceeded
    "image-pull",  # the pod waits in ImagePullBackOff forever (the launcher must delete it)
    "evicted",  # the first pod is evicted (DisruptionTarget, ignored), the second completes
)
KEPT_EVENTS = 1000  # events kept for watches; older resource versions get 410


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class KubeApi:
    """The server's state; thread-safe."""

    def __init__(self, step_s: float = 0.1) -> None:
        self.step_s = step_s
        self.namespaces = {"forge"}
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []  # (rv, type, job)
        self.rv = 100
        self.first_kept_rv = 0
        self.faults: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str]] = []
        self.created_at: list[float] = []
        self.max_active = 0
        self.lock = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ state changes

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def _event(self, kind: str, job: dict[str, Any]) -> None:
        self.events.append((self.rv, kind, copy.deepcopy(job)))
        if len(self.events) > KEPT_EVENTS:
            drop = len(self.events) - KEPT_EVENTS
            self.first_kept_rv = self.events[drop][0]
            del self.events[:drop]
        self.lock.notify_all()

    def expire_history(self) -> None:
        """Forget every event so far (a compaction): older watches get 410."""
        with self.lock:
            self.first_kept_rv = self.rv + 1
            self.events.clear()

    def fault(self, kind: str) -> int | None:
        with self.lock:
            queue = self.faults.get(kind) or []
            return queue.pop(0) if queue else None

    def create_job(self, ns: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if ns not in self.namespaces:
                return 404, status_body(404, "NotFound", f'namespaces "{ns}" not found')
            name = body["metadata"]["name"]
            if (ns, name) in self.jobs:
                return 409, status_body(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
            job = copy.deepcopy(body)
            job["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
            job["status"] = {"active": 1, "startTime": _now()}
            self._bump(job)
            self.jobs[(ns, name)] = job
            self.created_at.append(time.monotonic())
            active = sum(1 for j in self.jobs.values() if not _ended(j))
            self.max_active = max(self.max_active, active)
            self._event("ADDED", job)
        thread = threading.Thread(target=self._control, args=(ns, name), daemon=True)
        thread.start()
        self._threads.append(thread)
        return 201, job

    def delete_job(self, ns: str, name: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            job = self.jobs.pop((ns, name), None)
            if job is None:
                return 404, status_body(404, "NotFound", f'jobs.batch "{name}" not found')
            for key in [
                k for k, p in self.pods.items() if p["metadata"]["labels"].get("job-name") == name
            ]:
                del self.pods[key]
            self._bump(job)
            self._event("DELETED", job)
            body = status_body(200, "", "")
            body["status"] = "Success"
            return 200, body

    def _set_pod(self, ns: str, job_name: str, n: int, status: dict[str, Any]) -> None:
        pod_name = f"{job_name}-{n}"
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "labels": {"job-name": job_name, "batch.kubernetes.io/job-name": job_name},
            },
            "spec": {"containers": [{"name": "harness", "image": "x"}]},
            "status": status,
        }
        self._bump(pod)
        self.pods[(ns, pod_name)] = pod

    def _finish(self, ns: str, name: str, kind: str, reason: str | None = None) -> None:
        job = self.jobs.get((ns, name))
        if job is None:
            return
        cond = {"type": kind, "status": "True", "lastTransitionTime": _now()}
        if reason:
            cond.update(reason=reason, message=f"Job has reached the specified {reason}")
        job["status"] = {"conditions": [cond], ("succeeded" if kind == "Complete" else "failed"): 1}
        self._bump(job)
        self._event("MODIFIED", job)

    def _control(self, ns: str, name: str) -> None:
        """Play the job controller and kubelet for one Job."""
        time.sleep(self.step_s)
        with self.lock:
            job = self.jobs.get((ns, name))
            if job is None:
                return
            scenario = job["metadata"]["labels"].get("forge.dev/task", "ok")
            rid = job["metadata"]["annotations"]["forge.dev/rollout-id"]
            message = {"rollout_id": rid, "status": "complete", "reward": 1.0, "error": None}
            if scenario == "agent-crash":
                message.update(status="crashed", reward=0.0, error="harness exited with 1")
            if scenario in ("ok", "agent-crash", "evicted"):
                if scenario == "evicted":
                    self._set_pod(
                        ns,
                        name,
                        0,
                        {
                            "phase": "Failed",
                            "reason": "Evicted",
                            "conditions": [{"type": "DisruptionTarget", "status": "True"}],
                        },
                    )
                self._set_pod(
                    ns,
                    name,
                    1,
                    {
                        "phase": "Succeeded",
                        "containerStatuses": [
                            {
                                "name": "harness",
                                "ready": False,
                                "restartCount": 0,
                                "image": "x",
                                "imageID": "",
                                "state": {
                                    "terminated": {
                                        "exitCode": 0,
                                        "reason": "Completed",
                                        "message": json.dumps(message),
                                    }
                                },
                            }
                        ],
                    },
                )
                self._finish(ns, name, "Complete")
            elif scenario == "deadline":
                self._finish(ns, name, "Failed", "DeadlineExceeded")
            elif scenario == "infra":
                for n in range(3):
                    self._set_pod(
                        ns,
                        name,
                        n,
                        {
                            "phase": "Failed",
                            "containerStatuses": [
                                {
                                    "name": "harness",
                                    "ready": False,
                                    "restartCount": 0,
                                    "image": "x",
                                    "imageID": "",
                                    "state": {"terminated": {"exitCode": 75, "reason": "Error"}},
                                }
                            ],
                        },
                    )
                self._finish(ns, name, "Failed", "BackoffLimitExceeded")
            elif scenario == "image-pull":
                self._set_pod(
                    ns,
                    name,
                    0,
                    {
                        "phase": "Pending",
                        "initContainerStatuses": [
                            {
                                "name": "forge-trust",
                                "ready": False,
                                "restartCount": 0,
                                "image": "x",
                                "imageID": "",
                                "state": {
                                    "waiting": {
                                        "reason": "ImagePullBackOff",
                                        "message": 'Back-off pulling image "x"',
                                    }
                                },
                            }
                        ],
                    },
                )

    # ------------------------------------------------------------ reads

    def list_jobs(self, ns: str, selector: str) -> dict[str, Any]:
        with self.lock:
            items = [
                copy.deepcopy(j)
                for (n, _), j in sorted(self.jobs.items())
                if n == ns and _matches(j, selector)
            ]
            return {
                "kind": "JobList",
                "apiVersion": "batch/v1",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }

    def list_pods(self, ns: str, selector: str) -> dict[str, Any]:
        with self.lock:
            items = [
                copy.deepcopy(p)
                for (n, _), p in sorted(self.pods.items())
                if n == ns and _matches(p, selector)
            ]
            return {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }

    def watch_jobs(
        self, ns: str, selector: str, rv: str | None, timeout_s: float
    ) -> Iterator[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            if rv:
                since = int(rv)
                if since < self.first_kept_rv - 1:
                    yield {
                        "type": "ERROR",
                        "object": status_body(
                            410,
                            "Expired",
                            f"too old resource version: {since} ({self.first_kept_rv})",
                        ),
                    }
                    return
            else:  # no version: the current state as ADDED events, then changes
                since = self.rv
                for (n, _), job in sorted(self.jobs.items()):
                    if n == ns and _matches(job, selector):
                        yield {"type": "ADDED", "object": copy.deepcopy(job)}
        while not self._stop.is_set():
            with self.lock:
                new = [(v, k, j) for v, k, j in self.events if v > since]
                if not new:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self.lock.wait(min(left, 0.2))
                    continue
            for v, kind, job in new:
                since = v
                if job["metadata"].get("namespace") == ns and _matches(job, selector):
                    yield {"type": kind, "object": job}
            if time.monotonic() >= deadline:
                return

    def stop(self) -> None:
        self._stop.set()


def _ended(job: dict[str, Any]) -> bool:
    return any(c.get("status") == "True" for c in (job.get("status") or {}).get("conditions") or [])


def _matches(obj: dict[str, Any], selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    api: KubeApi
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _fault(self, kind: str) -> bool:
        code = self.api.fault(kind)
        if code is None:
            return False
        if code == 429:
            self._send(
                429,
                status_body(429, "TooManyRequests", "please try again later"),
                {"Retry-After": "0"},
            )
        elif code == 410:  # only meaningful for watches: an Expired ERROR event
            self.api.expire_history()
            return False
        else:
            self._send(code, status_body(code, "InternalError", "injected failure"))
        return True

    def _route(self) -> tuple[str, str, str | None, dict[str, list[str]]] | None:
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        query = parse_qs(url.query)
        if (
            parts[:4] == ["apis", "batch", "v1", "namespaces"]
            and len(parts) >= 6
            and parts[5] == "jobs"
        ):
            return "jobs", parts[4], parts[6] if len(parts) > 6 else None, query
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "pods":
            return "pods", parts[3], None, query
        return None

    def do_POST(self) -> None:  # noqa: N802
        route = self._route()
        self.api.requests.append(("POST", self.path))
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if route is None or route[0] != "jobs" or route[2] is not None:
            return self._send(
                404,
                status_body(404, "NotFound", "the server could not find the requested resource"),
            )
        if self._fault("create"):
            return None
        code, obj = self.api.create_job(route[1], body)
        return self._send(code, obj)

    def do_DELETE(self) -> None:  # noqa: N802
        route = self._route()
        self.api.requests.append(("DELETE", self.path))
        if route is None or route[0] != "jobs" or route[2] is None:
            return self._send(404, status_body(404, "NotFound", "not found"))
        code, obj = self.api.delete_job(route[1], route[2])
        return self._send(code, obj)

    def do_GET(self) -> None:  # noqa: N802
        route = self._route()
        self.api.requests.append(("GET", self.path))
        if route is None:
            return self._send(404, status_body(404, "NotFound", "not found"))
        kind, ns, name, query = route
        selector = (query.get("labelSelector") or [""])[0]
        if kind == "pods":
            return self._send(200, self.api.list_pods(ns, selector))
        if name is not None:
            job = self.api.jobs.get((ns, name))
            if job is None:
                return self._send(
                    404, status_body(404, "NotFound", f'jobs.batch "{name}" not found')
                )
            return self._send(200, job)
        if (query.get("watch") or ["false"])[0] not in ("true", "1"):
            return self._send(200, self.api.list_jobs(ns, selector))
        if self._fault("watch"):
            return None
        rv = (query.get("resourceVersion") or [None])[0]
        timeout_s = float((query.get("timeoutSeconds") or ["30"])[0])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in self.api.watch_jobs(ns, selector, rv, timeout_s):
                line = (json.dumps(event) + "\n").encode()
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        return None


@contextmanager
def kube_api_server(step_s: float = 0.1) -> Iterator[tuple[KubeApi, str]]:
    """(state, base URL) of a server on a free loopback port, stopped on exit."""
    api = KubeApi(step_s)
    handler = type("Handler", (_Handler,), {"api": api})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        api.stop()
        server.shutdown()
        server.server_close()
