"""``forge rollout``: many rollouts of a harness on a task file, each ending in a reward."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from forge_cli.args import (
    add_serve_arguments,
    add_set_argument,
    add_upstream_argument,
    positive_int,
    serve_extra,
)
from k8s_jobs.harnesses import builtin_harnesses, load_harness_config
from k8s_jobs.local import RolloutOptions, run_rollouts, summary_json
from k8s_jobs.outcome import STATUSES, ProgressPrinter
from k8s_jobs.settings import K8sSettings
from k8s_jobs.tasks import load_tasks
from mitm_addon.launch import DEFAULT_CONFDIR, ForgeError

__all__ = ["add_parser", "run"]

BACKENDS = ("local", "k8s")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "rollout",
        help="run N rollouts of a harness per task, each graded by the task's verifier",
        description="Run every task of --tasks N times with --harness, --parallel at once, behind "
        "one Forge proxy recording into --out. Each rollout gets a fresh working directory and "
        "HOME; its proxy credentials carry its rollout id; its harness is killed (whole process "
        "tree) at the task's timeout; the verifier's result is written as its reward. Statuses: "
        f"{', '.join(STATUSES)}; only infra_error is retried.",
    )
    p.add_argument("--tasks", type=Path, default=None, help="task file (.jsonl, .yaml or .yml)")
    p.add_argument("--harness", default=None, help="harness for every task (default: each task's)")
    p.add_argument(
        "-n",
        type=positive_int,
        default=1,
        help="rollouts per task, the GRPO group size (default 1)",
    )
    p.add_argument("--parallel", type=int, default=4, help="rollouts at once (default 4)")
    p.add_argument(
        "--out", type=Path, default=None, help="run directory (default data/runs/rollout-<time>)"
    )
    add_upstream_argument(p)
    p.add_argument("--model", default=None, help="model for every rollout (default: the harness's)")
    p.add_argument(
        "--policy-version", type=int, default=None, help="policy version the rollouts run with"
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="harness deadline in seconds for every task"
    )
    p.add_argument(
        "--harness-config",
        type=Path,
        default=None,
        help="YAML or TOML file adding or overriding harness templates (see docs/rollouts.md)",
    )
    p.add_argument(
        "--max-attempts", type=int, default=3, help="attempts after infra errors (default 3)"
    )
    p.add_argument(
        "--backoff", type=float, default=2.0, help="seconds before the first retry (doubles)"
    )
    p.add_argument("--confdir", type=Path, default=DEFAULT_CONFDIR, help="mitmproxy CA directory")
    p.add_argument("--work-root", type=Path, default=None, help="where working directories go")
    p.add_argument(
        "--keep-workdirs", action="store_true", help="keep working directories and homes"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="finish a stopped run in the same --out: rollouts that ended are kept, the "
        "others run again under new ids",
    )
    add_set_argument(p)
    add_serve_arguments(p)
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--list-harnesses", action="store_true", help="list harness templates and exit")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="local",
        help="local subprocesses (default) or Kubernetes Jobs",
    )
    k = p.add_argument_group("Kubernetes backend (--backend k8s; see forge k8s render)")
    k.add_argument("--namespace", default=K8sSettings.namespace)
    k.add_argument("--image", default=K8sSettings.image, help="rollout image (k8s_jobs/Dockerfile)")
    k.add_argument(
        "--run-name", default=None, help="Job name prefix and run label (default: --out's name)"
    )
    k.add_argument("--ca-secret", default=K8sSettings.ca_secret, help="Secret holding Forge's CA")
    k.add_argument(
        "--runs-pvc", default=K8sSettings.runs_pvc, help="ReadWriteMany claim for shards"
    )
    k.add_argument(
        "--transparent", action="store_true", help="iptables REDIRECT instead of proxy variables"
    )
    k.add_argument(
        "--create-rate", type=float, default=5.0, help="Job creations per second (default 5)"
    )
    k.add_argument(
        "--k8s-api",
        default=None,
        metavar="URL",
        help="API server URL without credentials (e.g. kubectl proxy's http://127.0.0.1:8001); "
        "default: the kubeconfig's current context, or the in-cluster service account",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    templates = (
        load_harness_config(args.harness_config) if args.harness_config else builtin_harnesses()
    )
    if args.list_harnesses:
        for name, t in sorted(templates.items()):
            print(f"{name:<10} {t.description}")
        return 0
    if args.tasks is None:
        raise ForgeError(
            "nothing to run: pass --tasks FILE (.jsonl or .yaml; see docs/rollouts.md)"
        )
    tasks = load_tasks(args.tasks)
    out = args.out or Path("data/runs") / time.strftime("rollout-%Y%m%d-%H%M%S")
    if args.backend == "k8s" and args.mode == "serve":
        raise ForgeError(
            "--mode serve runs with --backend local only: a pod's proxy sidecar would need "
            "the policy's tokenizer and a policy URL reachable from the cluster"
        )
    proxy_extra = list(args.extra) + serve_extra(args)
    printer = ProgressPrinter()
    if args.backend == "k8s":
        return run_k8s(args, tasks, out, printer)
    options = RolloutOptions(
        out_dir=out,
        harness=args.harness,
        n=args.n,
        parallel=args.parallel,
        upstreams=list(args.upstream),
        model=args.model,
        policy_version=args.policy_version,
        templates=templates,
        timeout_s=args.timeout,
        max_attempts=args.max_attempts,
        backoff_base_s=args.backoff,
        confdir=args.confdir,
        work_root=args.work_root,
        keep_workdirs=args.keep_workdirs,
        proxy_extra=proxy_extra,
        resume=args.resume,
        on_progress=printer,
    )
    print(f"forge: {len(tasks)} task(s) x {args.n} rollout(s) into {out}", file=sys.stderr)
    try:
        summary = run_rollouts(tasks, options)
    finally:
        printer.close()
    if args.json:
        print(summary_json(summary))
    counts = ", ".join(f"{summary.count(s)} {s}" for s in STATUSES if summary.count(s))
    mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    print(
        f"forge: {len(summary.results)} rollout(s) in {summary.wall_s:.1f} s "
        f"({summary.per_minute:.1f}/min): {counts}; mean reward {mean}",
        file=sys.stderr,
    )
    for r in summary.results:
        if r.error:
            print(f"  {r.rollout_id}: {r.status}: {r.error}", file=sys.stderr)
    print(
        f'forge: try  forge sql --data {out} "select rollout_id, status, reward, n_calls from trajectories"',
        file=sys.stderr,
    )
    return 0 if all(r.status != "infra_error" for r in summary.results) else 1


def _api_client(url: str | None) -> Any:
    from kubernetes import client, config

    if url:
        return client.ApiClient(client.Configuration(host=url))
    try:
        config.load_kube_config()
    except (config.ConfigException, OSError) as kube_error:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            raise ForgeError(
                f"no Kubernetes credentials ({kube_error}): set a kubeconfig context, run in a "
                "cluster, or pass --k8s-api URL (e.g. from `kubectl proxy`)"
            ) from None
    return client.ApiClient()


def run_k8s(args: argparse.Namespace, tasks: list[Any], out: Path, printer: ProgressPrinter) -> int:
    """--backend k8s: a Job per rollout through the API server (k8s_jobs.launcher)."""
    from forge_cli.cmd_k8s import settings_from_args
    from k8s_jobs.launcher import LaunchOptions, launch_jobs

    settings = settings_from_args(args, args.run_name or out.name)
    options = LaunchOptions(
        settings=settings,
        parallel=args.parallel,
        create_per_s=args.create_rate,
        backoff_base_s=args.backoff,
        on_progress=printer,
    )
    started = time.monotonic()
    try:
        results = launch_jobs(tasks, options, _api_client(args.k8s_api))
    finally:
        printer.close()
    wall = time.monotonic() - started
    if args.json:
        rows = [
            {
                "rollout_id": r.rollout_id,
                "task_id": r.task_id,
                "status": r.status,
                "reward": r.reward,
                "job": r.job,
                "error": r.error,
            }
            for r in results
        ]
        print(
            json.dumps(
                {"namespace": settings.namespace, "run": settings.run_name, "results": rows},
                indent=2,
            )
        )
    counts = ", ".join(
        f"{sum(r.status == s for r in results)} {s}"
        for s in STATUSES
        if any(r.status == s for r in results)
    )
    print(
        f"forge: {len(results)} Job(s) in {wall:.1f} s: {counts}; shards and rows are on the "
        f"claim {settings.runs_pvc} under <rollout-id>/",
        file=sys.stderr,
    )
    for r in results:
        if r.error:
            print(f"  {r.rollout_id}: {r.status}: {r.error}", file=sys.stderr)
    return 0 if all(r.status != "infra_error" for r in results) else 1
