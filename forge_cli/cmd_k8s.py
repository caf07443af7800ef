"""``forge k8s render``: the Kubernetes Jobs of a rollout run, as YAML (for kubectl or GitOps)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from forge_cli.args import positive_int
from k8s_jobs.settings import K8sSettings
from k8s_jobs.tasks import load_tasks

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "k8s",
        help="Kubernetes Jobs for rollouts",
        description="Kubernetes Jobs for rollouts (see docs/rollouts.md).",
    )
    k8s_sub = p.add_subparsers(dest="k8s_command", required=True, metavar="SUBCOMMAND")
    r = k8s_sub.add_parser(
        "render",
        help="write a Job per rollout (and the shards claim) as YAML",
        description="Write one Job per rollout (N per task): the harness container, a native "
        "mitmproxy sidecar running Forge's addon, the CA from a Secret, shards to a "
        "ReadWriteMany claim, the verifier at the end. Apply with kubectl apply -f DIR.",
    )
    r.add_argument("--tasks", type=Path, required=True, help="task file (.jsonl, .yaml or .yml)")
    r.add_argument("--out", type=Path, required=True, help="folder for the YAML files")
    r.add_argument("--harness", default=None, help="harness for every task (default: each task's)")
    r.add_argument("-n", type=positive_int, default=1, help="rollouts per task (default 1)")
    r.add_argument("--image", default=K8sSettings.image, help="rollout image (k8s_jobs/Dockerfile)")
    r.add_argument("--namespace", default=K8sSettings.namespace)
    r.add_argument("--model", default=None)
    r.add_argument("--policy-version", type=int, default=None)
    r.add_argument("--run-name", default=K8sSettings.run_name, help="prefix of Job names")
    r.add_argument("--ca-secret", default=K8sSettings.ca_secret, help="Secret holding Forge's CA")
    r.add_argument(
        "--runs-pvc", default=K8sSettings.runs_pvc, help="ReadWriteMany claim for shards"
    )
    r.add_argument(
        "--transparent",
        action="store_true",
        help="redirect the pod's outbound 443 to the sidecar with iptables (NET_ADMIN init "
        "container) for harnesses that ignore proxy variables",
    )
    r.add_argument(
        "--upstream", action="append", default=[], metavar="HOST=URL", help="sidecar redirects"
    )
    r.add_argument("--cpu", default=K8sSettings.cpu, help="CPU request per pod (default 4)")
    r.add_argument("--memory", default=K8sSettings.memory, help="memory per pod (default 4Gi)")
    r.add_argument("--ttl", type=int, default=K8sSettings.ttl_s, help="seconds finished Jobs stay")
    r.add_argument(
        "--harness-config",
        dest="k8s_harness_config",
        default=None,
        help="harness config path inside the image",
    )
    r.set_defaults(func=run_render)


def settings_from_args(args: argparse.Namespace, run_name: str) -> K8sSettings:
    """The Jobs' settings from ``forge k8s render``'s or ``forge rollout --backend k8s``'s
    options (the pod's resources, TTL and in-image harness config only ``render`` sets)."""
    return K8sSettings(
        image=args.image,
        namespace=args.namespace,
        harness=args.harness,
        n=args.n,
        model=args.model,
        policy_version=args.policy_version,
        run_name=run_name,
        ca_secret=args.ca_secret,
        runs_pvc=args.runs_pvc,
        transparent=args.transparent,
        upstreams=list(args.upstream),
        cpu=getattr(args, "cpu", K8sSettings.cpu),
        memory=getattr(args, "memory", K8sSettings.memory),
        ttl_s=getattr(args, "ttl", K8sSettings.ttl_s),
        harness_config=getattr(args, "k8s_harness_config", None),
    )


def run_render(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, args.run_name)
    from k8s_jobs.k8s import write_manifests  # the kubernetes client: only when rendering

    paths = write_manifests(load_tasks(args.tasks), settings, args.out)
    print(f"forge: wrote {len(paths)} manifest(s) to {args.out}")
    print(f"  check: kubectl apply --dry-run=client -f {args.out}")
    return 0


run = run_render
