"""Kubernetes Jobs for rollouts, built with the official ``kubernetes`` client's models.

One Job per rollout. Its pod (pure ``render_job``; ``write_manifests`` writes YAML):

* ``forge-trust`` (init): writes the system CA bundle plus Forge's CA into an emptyDir,
  mounted over the harness container's system store, so every runtime trusts the proxy;
* ``forge-iptables`` (init, ``transparent`` only): NET_ADMIN, installs an iptables
  ``REDIRECT`` of outbound TCP 443 to the sidecar for every uid but the sidecar's, for
  harnesses that ignore proxy variables (what service meshes do);
* ``forge-proxy`` (a native sidecar: an init container with ``restartPolicy: Always`` and a
  startup probe, so it runs before and alongside the harness): ``mitmdump -s
  forge_addon.py`` with ``forge_rollout`` = the rollout id, writing shards to the run
  volume (``<volume>/<rollout-id>``);
* ``harness``: ``python -m k8s_jobs.pod``, which runs the task's harness to its deadline,
  then its verifier, and writes the rollouts and rewards rows next to the shards.

The CA comes from a Secret (``mitmproxy-ca.pem`` for the sidecar, the certificate only for
the others). Infra failures exit 75 and are retried by the podFailurePolicy (with pod
disruptions, such as evictions, which do not count); any other failure fails the Job;
agent failures exit 0 with their status in the rollout's row. Labels carry rollout, task,
group and policy version; finished Jobs are deleted after ``ttl_s``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from k8s_jobs.local import PlannedRollout, plan_rollouts
from k8s_jobs.outcome import rollout_id
from k8s_jobs.pod import EXIT_INFRA, TERMINATION_LOG
from k8s_jobs.settings import K8sSettings
from k8s_jobs.tasks import Task
from mitm_addon.launch import ForgeError

__all__ = ["K8sSettings", "manifest_dicts", "render_job", "render_pvc", "write_manifests"]

LABEL_PREFIX = "forge.dev"
ADDON_PATH = "/opt/forge/mitm_addon/forge_addon.py"  # where k8s_jobs/Dockerfile puts it
HARNESS_UID = 1000
PROXY_UID = 1001  # apart from the harness: the transparent REDIRECT skips the proxy's own traffic
RUNS_MOUNT = "/forge/runs"
CA_KEY = "mitmproxy-ca.pem"  # key and certificate, as mitmproxy writes them in its confdir
CA_CERT_KEY = "mitmproxy-ca-cert.pem"
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")
# Slack between the task's deadlines and the Job's: image pull, sidecar start, row writes.
_DEADLINE_SLACK_S = 300


def job_name(prefix: str, rid: str) -> str:
    """A DNS-1123 label (at most 63 characters) unique to the rollout id: a readable slug
    plus a short hash of the exact id (ids differing in case or punctuation stay apart)."""
    slug = _DNS_LABEL.sub("-", f"{prefix}-{rid}".lower()).strip("-")
    digest = hashlib.sha256(rid.encode()).hexdigest()[:8]
    return f"{slug[: 63 - 9].rstrip('-')}-{digest}"


def label_value(value: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends (the exact
    value is kept in an annotation)."""
    cleaned = _LABEL_VALUE.sub("_", value)
    if len(cleaned) > 63:
        cleaned = cleaned[:54] + "_" + hashlib.sha256(value.encode()).hexdigest()[:8]
    return cleaned.strip("_.-") or "none"


def _restricted(uid: int) -> client.V1SecurityContext:
    """The 'restricted' Pod Security Standard: non-root, no escalation, no capabilities."""
    return client.V1SecurityContext(
        run_as_non_root=True,
        run_as_user=uid,
        run_as_group=HARNESS_UID,
        allow_privilege_escalation=False,
        capabilities=client.V1Capabilities(drop=["ALL"]),
        read_only_root_filesystem=False,
        seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
    )


def _check_task(task: Task) -> None:
    ws = task.workspace
    if ws.dir is not None or (
        ws.git is not None and "://" not in ws.git and not ws.git.startswith("git@")
    ):
        raise ForgeError(
            f"{task.source}: task {task.id!r}: a workspace folder or local repository on this "
            "machine does not exist in the pod; use inline files, a remote git URL, or bake "
            "the folder into the rollout image"
        )


def render_job(planned: PlannedRollout, settings: K8sSettings) -> client.V1Job:
    """The Job of one rollout (pure)."""
    task = planned.task
    _check_task(task)
    harness = settings.harness or task.harness
    if not harness:
        raise ForgeError(f"{task.source}: task {task.id!r} names no harness: pass --harness")
    rid = rollout_id(task.id, planned.sample)
    name = job_name(settings.run_name, rid)
    version = "unversioned" if settings.policy_version is None else str(settings.policy_version)
    labels = {
        "app.kubernetes.io/name": "forge-rollout",
        "app.kubernetes.io/managed-by": "forge",
        f"{LABEL_PREFIX}/run": label_value(settings.run_name),
        f"{LABEL_PREFIX}/rollout": label_value(rid),
        f"{LABEL_PREFIX}/task": label_value(task.id),
        f"{LABEL_PREFIX}/group": label_value(planned.group_id),
        f"{LABEL_PREFIX}/policy-version": version,
        f"{LABEL_PREFIX}/harness": label_value(harness),
    }
    annotations = {
        f"{LABEL_PREFIX}/rollout-id": rid,
        f"{LABEL_PREFIX}/task-id": task.id,
        f"{LABEL_PREFIX}/group-id": planned.group_id,
    }
    out_dir = f"{RUNS_MOUNT}/{rid}"
    verifier_s = task.verifier.timeout_s if task.verifier else 0.0
    deadline = int((task.timeout_s + verifier_s + _DEADLINE_SLACK_S) * (settings.backoff_limit + 1))

    vol = client.V1VolumeMount
    # The harness side sees the CA certificate only, never its key (the sidecar's alone).
    ca_cert_mount = vol(name="forge-ca-cert", mount_path="/forge/ca-cert", read_only=True)
    trust_mount = vol(name="forge-trust", mount_path="/forge/trust")
    runs_mount = vol(name="forge-runs", mount_path=RUNS_MOUNT)

    trust = client.V1Container(
        name="forge-trust",
        image=settings.image,
        command=[
            "sh",
            "-c",
            "cat /etc/ssl/certs/ca-certificates.crt /forge/ca-cert/mitmproxy-ca-cert.pem "
            "> /forge/trust/ca-certificates.crt",
        ],
        security_context=_restricted(HARNESS_UID),
        volume_mounts=[ca_cert_mount, trust_mount],
    )
    proxy_cmd = [
        "mitmdump",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        str(settings.proxy_port),
        "-s",
        ADDON_PATH,
        "--set",
        "confdir=/forge/proxy-conf",
        "--set",
        f"forge_dir={out_dir}",
        "--set",
        f"forge_rollout={rid}",
        "--set",
        "connection_strategy=lazy",
        "--set",
        "flow_detail=0",
    ]
    if settings.transparent:
        proxy_cmd += ["--mode", "transparent"]
    if settings.upstreams:
        proxy_cmd += ["--set", f"forge_upstream={','.join(settings.upstreams)}"]
    sidecar = client.V1Container(
        name="forge-proxy",
        image=settings.image,
        restart_policy="Always",  # a native sidecar: starts first, stops after the harness
        # mitmproxy wants a writable confdir: copy the CA from the read-only Secret.
        command=[
            "sh",
            "-c",
            "cp /forge/ca/mitmproxy-ca.pem /forge/ca/mitmproxy-ca-cert.pem /forge/proxy-conf/ "
            '&& exec "$@"',
            "forge-proxy",
            *proxy_cmd,
        ],
        ports=[client.V1ContainerPort(container_port=settings.proxy_port, name="forge-proxy")],
        startup_probe=client.V1Probe(
            tcp_socket=client.V1TCPSocketAction(port=settings.proxy_port, host="127.0.0.1"),
            period_seconds=1,
            failure_threshold=120,
        ),
        resources=client.V1ResourceRequirements(
            requests={"cpu": "250m", "memory": "256Mi"}, limits={"memory": "1Gi"}
        ),
        security_context=_restricted(PROXY_UID),
        volume_mounts=[
            vol(name="forge-ca", mount_path="/forge/ca", read_only=True),
            vol(name="forge-proxy-conf", mount_path="/forge/proxy-conf"),
            runs_mount,
        ],
    )
    init = [trust]
    if settings.transparent:
        init.append(
            client.V1Container(
                name="forge-iptables",
                image=settings.image,
                command=[
                    "iptables",
                    "-t",
                    "nat",
                    "-A",
                    "OUTPUT",
                    "-p",
                    "tcp",
                    "--dport",
                    "443",
                    "-m",
                    "owner",
                    "!",
                    "--uid-owner",
                    str(PROXY_UID),
                    "-j",
                    "REDIRECT",
                    "--to-ports",
                    str(settings.proxy_port),
                ],
                # The one step that needs root and NET_ADMIN (in the pod's network namespace only).
                security_context=client.V1SecurityContext(
                    run_as_non_root=False,
                    run_as_user=0,
                    allow_privilege_escalation=False,
                    capabilities=client.V1Capabilities(drop=["ALL"], add=["NET_ADMIN", "NET_RAW"]),
                ),
            )
        )
    init.append(sidecar)

    env = {
        "FORGE_TASK_JSON": json.dumps(task.to_json(), sort_keys=True),
        "FORGE_ROLLOUT_ID": rid,
        "FORGE_GROUP_ID": planned.group_id,
        "FORGE_SAMPLE": str(planned.sample),
        "FORGE_HARNESS": harness,
        "FORGE_OUT": out_dir,
        "FORGE_PROXY_URL": ""
        if settings.transparent
        else f"http://127.0.0.1:{settings.proxy_port}",
        "FORGE_CA_CERT": "/forge/ca-cert/mitmproxy-ca-cert.pem",
        "FORGE_WORK": "/forge/work",
        "FORGE_HOME": "/forge/home/home",
    }
    if settings.model:
        env["FORGE_MODEL"] = settings.model
    if settings.policy_version is not None:
        env["FORGE_POLICY_VERSION"] = str(settings.policy_version)
    if settings.harness_config:
        env["FORGE_HARNESS_CONFIG"] = settings.harness_config
    harness_container = client.V1Container(
        name="harness",
        image=settings.image,
        command=["python", "-m", "k8s_jobs.pod"],
        working_dir="/forge/work",
        # k8s_jobs.pod writes its result (status, reward) here for the launcher.
        termination_message_path=TERMINATION_LOG,
        termination_message_policy="FallbackToLogsOnError",
        env=[client.V1EnvVar(name=k, value=v) for k, v in env.items()],
        resources=client.V1ResourceRequirements(
            requests={"cpu": settings.cpu, "memory": settings.memory},
            limits={"memory": settings.memory},
        ),
        security_context=_restricted(HARNESS_UID),
        volume_mounts=[
            vol(name="forge-work", mount_path="/forge/work"),
            vol(name="forge-home", mount_path="/forge/home"),
            ca_cert_mount,
            vol(
                name="forge-trust",
                mount_path="/etc/ssl/certs/ca-certificates.crt",
                sub_path="ca-certificates.crt",
                read_only=True,
            ),
            runs_mount,
        ],
    )
    empty = client.V1EmptyDirVolumeSource
    volumes = [
        client.V1Volume(
            name="forge-ca",
            secret=client.V1SecretVolumeSource(secret_name=settings.ca_secret, default_mode=0o440),
        ),
        client.V1Volume(
            name="forge-ca-cert",
            secret=client.V1SecretVolumeSource(
                secret_name=settings.ca_secret,
                default_mode=0o444,
                items=[client.V1KeyToPath(key=CA_CERT_KEY, path=CA_CERT_KEY)],
            ),
        ),
        client.V1Volume(name="forge-proxy-conf", empty_dir=empty()),
        client.V1Volume(name="forge-trust", empty_dir=empty()),
        client.V1Volume(name="forge-work", empty_dir=empty()),
        client.V1Volume(name="forge-home", empty_dir=empty()),
        client.V1Volume(
            name="forge-runs",
            persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                claim_name=settings.runs_pvc
            ),
        ),
    ]
    pod = client.V1PodSpec(
        restart_policy="Never",
        init_containers=init,
        containers=[harness_container],
        volumes=volumes,
        automount_service_account_token=False,
        enable_service_links=False,
        security_context=client.V1PodSecurityContext(
            run_as_non_root=not settings.transparent,
            fs_group=HARNESS_UID,
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        ),
    )
    failure_policy = client.V1PodFailurePolicy(
        rules=[
            # Evictions, preemptions, node drains: not the rollout's fault, not counted.
            client.V1PodFailurePolicyRule(
                action="Ignore",
                on_pod_conditions=[
                    client.V1PodFailurePolicyOnPodConditionsPattern(
                        type="DisruptionTarget", status="True"
                    )
                ],
            ),
            # Infra errors (workspace, verifier, proxy): counted against backoffLimit.
            client.V1PodFailurePolicyRule(
                action="Count",
                on_exit_codes=client.V1PodFailurePolicyOnExitCodesRequirement(
                    container_name="harness", operator="In", values=[EXIT_INFRA]
                ),
            ),
            # Anything else is a bug or bad settings: retrying will not help.
            client.V1PodFailurePolicyRule(
                action="FailJob",
                on_exit_codes=client.V1PodFailurePolicyOnExitCodesRequirement(
                    container_name="harness", operator="NotIn", values=[0, EXIT_INFRA]
                ),
            ),
        ]
    )
    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(
            name=name, namespace=settings.namespace, labels=labels, annotations=annotations
        ),
        spec=client.V1JobSpec(
            backoff_limit=settings.backoff_limit,
            pod_failure_policy=failure_policy,
            active_deadline_seconds=deadline,
            ttl_seconds_after_finished=settings.ttl_s,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels, annotations=annotations), spec=pod
            ),
        ),
    )


def render_pvc(settings: K8sSettings, size: str = "50Gi") -> client.V1PersistentVolumeClaim:
    """The ReadWriteMany claim the Jobs write their shards to."""
    return client.V1PersistentVolumeClaim(
        api_version="v1",
        kind="PersistentVolumeClaim",
        metadata=client.V1ObjectMeta(
            name=settings.runs_pvc,
            namespace=settings.namespace,
            labels={"app.kubernetes.io/managed-by": "forge"},
        ),
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteMany"],
            resources=client.V1VolumeResourceRequirements(requests={"storage": size}),
        ),
    )


def to_dict(model: Any) -> dict[str, Any]:
    """A client model as the API's JSON object (camelCase keys, unset fields left out)."""
    data: dict[str, Any] = client.ApiClient().sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
    return data


def manifest_dicts(
    tasks: Sequence[Task], settings: K8sSettings
) -> list[tuple[str, dict[str, Any]]]:
    """(file name, manifest) of the claim and of every rollout's Job, in plan order."""
    if settings.n < 1:
        raise ForgeError(f"-n must be at least 1, not {settings.n}")
    out: list[tuple[str, dict[str, Any]]] = [("00-pvc.yaml", to_dict(render_pvc(settings)))]
    for planned in plan_rollouts(tasks, settings.n, settings.policy_version):
        job = render_job(planned, settings)
        assert job.metadata is not None and job.metadata.name is not None
        out.append((f"{job.metadata.name}.yaml", to_dict(job)))
    return out


def write_manifests(tasks: Sequence[Task], settings: K8sSettings, out_dir: Path) -> list[Path]:
    """Write the manifests as YAML, one file each; return their paths."""
    import yaml

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, manifest in manifest_dicts(tasks, settings):
        path = out_dir / name
        path.write_text(yaml.safe_dump(manifest, sort_keys=False, width=100))
        paths.append(path)
    return paths
