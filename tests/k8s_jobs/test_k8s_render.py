"""``forge k8s render``: every manifest validates offline against the Kubernetes JSON schemas
(kubernetes-validate, strict: unknown fields are errors), and the Jobs have the shape the
issue asks for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from k8s_jobs.k8s import K8sSettings, job_name, label_value, manifest_dicts
from k8s_jobs.tasks import load_tasks, parse_task, parse_tasks
from mitm_addon.launch import ForgeError

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "tasks" / "demo.jsonl"
# Native sidecars (init containers with restartPolicy Always) arrived in 1.28 (beta, on by
# default from 1.29); validate against that floor and the newest schemas the package ships.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
SETTINGS = {
    "plain": K8sSettings(n=2, image="registry.example/forge-rollout:1"),
    "transparent": K8sSettings(n=1, transparent=True, policy_version=7, model="gpt-5.5"),
}


def jobs(settings: K8sSettings, tasks_path: Path = DEMO) -> list[dict[str, Any]]:
    return [m for _, m in manifest_dicts(load_tasks(tasks_path), settings) if m["kind"] == "Job"]


def containers(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = job["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("mode", sorted(SETTINGS))
def test_every_rendered_manifest_validates_strictly(mode: str, version: str) -> None:
    manifests = manifest_dicts(load_tasks(DEMO), SETTINGS[mode])
    assert len(manifests) == 1 + 3 * SETTINGS[mode].n  # the claim, then a Job per rollout
    for _, manifest in manifests:
        kubernetes_validate.validate(manifest, version, strict=True)


def test_the_validator_rejects_a_broken_job() -> None:
    job = jobs(SETTINGS["plain"])[0]
    job["spec"]["template"]["spec"]["initContainers"][0]["restartPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[-1], strict=True)
    job = jobs(SETTINGS["plain"])[0]
    job["spec"]["template"]["spec"]["containers"][0]["colour"] = "blue"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


def test_the_proxy_is_a_native_sidecar_started_before_the_harness() -> None:
    job = jobs(SETTINGS["plain"])[0]
    spec = job["spec"]["template"]["spec"]
    names = [c["name"] for c in spec["initContainers"]]
    assert names == ["forge-trust", "forge-proxy"]
    proxy = containers(job)["forge-proxy"]
    assert proxy["restartPolicy"] == "Always" and proxy["startupProbe"]["tcpSocket"]["port"] == 8080
    cmd = proxy["command"]
    assert "mitmdump" in cmd and "forge_rollout=hello.0" in cmd
    assert "forge_dir=/forge/runs/hello.0" in cmd and "/opt/forge/mitm_addon/forge_addon.py" in cmd
    assert spec["restartPolicy"] == "Never"


def test_the_harness_gets_the_task_the_proxy_and_the_requests() -> None:
    job = jobs(SETTINGS["plain"])[0]
    harness = containers(job)["harness"]
    assert harness["command"] == ["python", "-m", "k8s_jobs.pod"]
    env = {e["name"]: e["value"] for e in harness["env"]}
    assert env["FORGE_PROXY_URL"] == "http://127.0.0.1:8080" and env["FORGE_HARNESS"] == "toy"
    assert parse_task(json.loads(env["FORGE_TASK_JSON"]), "x", REPO) == load_tasks(DEMO)[0]
    assert harness["resources"]["requests"] == {"cpu": "4", "memory": "4Gi"}
    # k8s_jobs.pod's result reaches the launcher as the container's termination message.
    assert harness["terminationMessagePath"] == "/dev/termination-log"


def test_only_the_sidecar_can_read_the_ca_key() -> None:
    job = jobs(SETTINGS["plain"])[0]
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert "items" not in volumes["forge-ca"]["secret"]  # key and certificate
    assert [i["key"] for i in volumes["forge-ca-cert"]["secret"]["items"]] == [
        "mitmproxy-ca-cert.pem"
    ]
    for name, c in containers(job).items():
        mounted = {m["name"] for m in c.get("volumeMounts", [])}
        assert ("forge-ca" in mounted) == (name == "forge-proxy"), name


def test_every_container_is_restricted_but_the_iptables_step() -> None:
    for mode, settings in SETTINGS.items():
        for name, c in containers(jobs(settings)[0]).items():
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            if name == "forge-iptables":
                assert mode == "transparent" and sc["capabilities"]["add"] == [
                    "NET_ADMIN",
                    "NET_RAW",
                ]
            else:
                assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, (mode, name)
                assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_transparent_mode_redirects_outbound_443_except_the_proxys_own() -> None:
    job = jobs(SETTINGS["transparent"])[0]
    spec = job["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == [
        "forge-trust",
        "forge-iptables",
        "forge-proxy",
    ]
    rule = " ".join(containers(job)["forge-iptables"]["command"])
    proxy_uid = containers(job)["forge-proxy"]["securityContext"]["runAsUser"]
    assert f"--dport 443 -m owner ! --uid-owner {proxy_uid} -j REDIRECT --to-ports 8080" in rule
    assert "--mode" in containers(job)["forge-proxy"]["command"]
    env = {e["name"]: e["value"] for e in containers(job)["harness"]["env"]}
    assert env["FORGE_PROXY_URL"] == "" and env["FORGE_POLICY_VERSION"] == "7"


def test_labels_failure_policy_deadline_and_clean_up() -> None:
    job = jobs(SETTINGS["transparent"])[0]
    labels = job["metadata"]["labels"]
    assert labels["forge.dev/rollout"] == "hello.0" and labels["forge.dev/task"] == "hello"
    assert labels["forge.dev/run"] == "forge"  # what the launcher watches
    assert labels["forge.dev/group"] == "hello_v7" and labels["forge.dev/policy-version"] == "7"
    assert job["metadata"]["annotations"]["forge.dev/group-id"] == "hello@v7"
    assert job["spec"]["template"]["metadata"]["labels"] == labels
    spec = job["spec"]
    assert spec["ttlSecondsAfterFinished"] == 3600 and spec["backoffLimit"] == 2
    actions = [r["action"] for r in spec["podFailurePolicy"]["rules"]]
    assert actions == ["Ignore", "Count", "FailJob"]
    # (harness 60 s + verifier 120 s + 300 s slack) x 3 attempts
    assert spec["activeDeadlineSeconds"] == (60 + 120 + 300) * 3


def test_job_names_are_dns_labels_unique_per_rollout() -> None:
    ids = ["A.0", "a.0", "x" * 120 + ".3", "x" * 120 + ".4"]
    names = [job_name("forge", i) for i in ids]
    assert len(set(names)) == len(names)
    for n in names:
        assert len(n) <= 63 and n == n.lower() and n[0].isalnum() and n[-1].isalnum()
    assert label_value("t@v3") == "t_v3" and len(label_value("y" * 100)) <= 63


def test_tasks_with_folders_on_this_machine_are_refused(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    tasks = parse_tasks(
        json.dumps({"id": "a", "instruction": "x", "harness": "toy", "workspace": {"dir": "repo"}}),
        "t.jsonl",
        tmp_path,
    )
    with pytest.raises(ForgeError, match="does not exist in the pod"):
        manifest_dicts(tasks, K8sSettings())


def test_the_checked_in_examples_are_what_render_writes(tmp_path: Path) -> None:
    rendered = REPO / "k8s_jobs" / "rendered"
    for example, extra in (
        ("demo", ["-n", "2"]),
        ("demo-transparent", ["--transparent", "--policy-version", "3", "--run-name", "forge-t"]),
    ):
        out = tmp_path / example
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "forge_cli.main",
                "k8s",
                "render",
                "--tasks",
                str(DEMO),
                "--out",
                str(out),
                "--image",
                "ghcr.io/example/forge-rollout:0.1.0",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stderr
        want = {p.name: yaml.safe_load(p.read_text()) for p in (rendered / example).glob("*.yaml")}
        got = {p.name: yaml.safe_load(p.read_text()) for p in out.glob("*.yaml")}
        assert got == want, f"regenerate k8s_jobs/rendered/{example} (see docs/rollouts.md)"
