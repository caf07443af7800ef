"""The Kubernetes launcher driven through the official client against a local server that
answers the Kubernetes REST API (tests/support/kube_api.py): every ending of a Job, and the
API's refusals (404, 409, 429, 500) and broken or expired watches."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from k8s_jobs.k8s import K8sSettings, job_name
from k8s_jobs.launcher import LaunchOptions, job_outcome, launch_jobs
from k8s_jobs.tasks import parse_tasks
from tests.support.kube_api import KubeApi, kube_api_server


def tasks_named(*names: str):  # type: ignore[no-untyped-def]
    lines = [json.dumps({"id": n, "instruction": "x", "harness": "toy"}) for n in names]
    return parse_tasks("\n".join(lines), "k8s.jsonl")


def api_client(url: str) -> client.ApiClient:
    config = client.Configuration(host=url)
    config.retries = 0
    return client.ApiClient(config)


def options(**kw: object) -> LaunchOptions:
    base: dict[str, object] = dict(
        settings=K8sSettings(run_name="t"),
        parallel=2,
        create_per_s=50.0,
        backoff_base_s=0.01,
        watch_timeout_s=1,
        stuck_grace_s=0.3,
        deadline_s=60.0,
    )
    base.update(kw)
    return LaunchOptions(**base)  # type: ignore[arg-type]


def run(
    api: KubeApi, url: str, names: tuple[str, ...], **kw: object
) -> dict[str, tuple[str, float | None]]:
    results = launch_jobs(tasks_named(*names), options(**kw), api_client(url))
    return {r.task_id: (r.status, r.reward) for r in results}


def test_every_ending_of_a_job_maps_to_a_status() -> None:
    names = ("ok", "agent-crash", "deadline", "infra", "image-pull", "evicted")
    with kube_api_server() as (api, url):
        got = run(api, url, names)
        deletes = [p for m, p in api.requests if m == "DELETE"]
        max_active = api.max_active
    assert got == {
        "ok": ("complete", 1.0),
        "agent-crash": ("crashed", 0.0),
        "deadline": ("timed_out", None),
        "infra": ("infra_error", None),
        "image-pull": ("infra_error", None),
        "evicted": ("complete", 1.0),
    }
    assert len(deletes) == 1 and "image-pull" in deletes[0]  # the stuck Job is cleaned up
    assert max_active <= 2


def test_429_and_500_on_create_are_retried() -> None:
    with kube_api_server() as (api, url):
        api.faults["create"] = [429, 500, 429]
        got = run(api, url, ("ok",))
        posts = [p for m, p in api.requests if m == "POST"]
    assert got == {"ok": ("complete", 1.0)} and len(posts) == 4


def test_an_existing_job_is_adopted_on_409() -> None:
    with kube_api_server() as (api, url):
        first = launch_jobs(tasks_named("ok"), options(), api_client(url))
        again = launch_jobs(tasks_named("ok"), options(), api_client(url))  # same Job names
    assert [r.status for r in first] == [r.status for r in again] == ["complete"]
    assert first[0].job == again[0].job == job_name("t", "ok.0")
    assert first[0].rollout_id == "ok.0"


def test_a_missing_namespace_is_an_infra_error_without_retries() -> None:
    with kube_api_server() as (api, url):
        results = launch_jobs(
            tasks_named("ok"), options(settings=K8sSettings(namespace="nope")), api_client(url)
        )
        posts = [p for m, p in api.requests if m == "POST"]
    (r,) = results
    assert r.status == "infra_error" and r.error and "404" in r.error and "nope" in r.error
    assert len(posts) == 1


def test_broken_and_expired_watches_are_resumed() -> None:
    with kube_api_server(step_s=0.3) as (api, url):
        api.faults["watch"] = [500, 410, 500]
        got = run(api, url, ("ok", "deadline"))
    assert got == {"ok": ("complete", 1.0), "deadline": ("timed_out", None)}


def test_creation_is_rate_limited() -> None:
    with kube_api_server(step_s=0.05) as (api, url):
        run(
            api,
            url,
            ("ok",),
            parallel=10,
            create_per_s=4.0,
            settings=K8sSettings(run_name="t", n=5),
        )
        times = sorted(api.created_at)
    assert len(times) == 5 and times[-1] - times[0] >= 0.9  # 5 creations at 4/s: >= 1 s


def test_parallelism_bounds_the_jobs_that_exist_at_once() -> None:
    with kube_api_server(step_s=0.2) as (api, url):
        got = run(api, url, ("ok",), parallel=2, settings=K8sSettings(run_name="t", n=6))
        assert api.max_active <= 2
    assert got == {"ok": ("complete", 1.0)}


@pytest.mark.parametrize(
    ("job", "pods", "want"),
    [
        ({"status": {}}, [], None),
        ({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}, [], "infra_error"),
        (
            {
                "status": {
                    "conditions": [
                        {"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}
                    ]
                }
            },
            [],
            "infra_error",
        ),
        ({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}, [], None),
    ],
)
def test_job_outcomes(
    job: dict[str, object], pods: list[dict[str, object]], want: str | None
) -> None:
    outcome = job_outcome(job, pods)
    assert (outcome[0] if outcome else None) == want
