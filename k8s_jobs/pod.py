"""``python -m k8s_jobs.pod``: one rollout inside a Kubernetes pod (the Job's harness container).

The pod's Forge proxy is its sidecar (``forge_rollout`` set to this rollout), so the proxy
URL carries no credentials. Everything comes from the environment the Job sets:

    FORGE_TASK_JSON        the task spec object (k8s_jobs.tasks)
    FORGE_ROLLOUT_ID       this rollout's id;  FORGE_GROUP_ID, FORGE_SAMPLE
    FORGE_HARNESS          template name;  FORGE_HARNESS_CONFIG (optional file), FORGE_MODEL
    FORGE_POLICY_VERSION   optional integer
    FORGE_OUT              run directory for the rollouts/rewards rows (the sidecar's forge_dir)
    FORGE_PROXY_URL        e.g. http://127.0.0.1:8080; empty in transparent mode
    FORGE_CA_CERT          Forge's CA certificate (PEM)
    FORGE_WORK, FORGE_HOME the rollout's working directory and HOME
    FORGE_TERMINATION_LOG  where the result JSON goes (default /dev/termination-log)

Exit code: 0 when the rollout ended, whatever the agent did (its status is in its row);
75 (EX_TEMPFAIL) after an infra error, which the Job's podFailurePolicy retries; 2 for
bad settings.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from k8s_jobs.attempt import reward_row, rollout_row, run_attempt
from k8s_jobs.harnesses import builtin_harnesses, load_harness_config
from k8s_jobs.tasks import parse_task
from mitm_addon.launch import ForgeError
from mitm_addon.launch.trust import trust_env, write_ca_bundle
from pipeline.shards import write_rows

__all__ = ["EXIT_INFRA", "main"]

EXIT_INFRA = 75  # EX_TEMPFAIL: the environment failed; try again
TERMINATION_LOG = "/dev/termination-log"  # Kubernetes shows it as the container's message


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value:
        raise ForgeError(f"{name} is not set (the Job rendered by `forge k8s render` sets it)")
    return value


def main(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        task = parse_task(
            json.loads(_required(env, "FORGE_TASK_JSON")), "FORGE_TASK_JSON", Path("/")
        )
        rid = _required(env, "FORGE_ROLLOUT_ID")
        harness = _required(env, "FORGE_HARNESS")
        out = Path(_required(env, "FORGE_OUT"))
        ca_cert = Path(_required(env, "FORGE_CA_CERT"))
        work, home = Path(_required(env, "FORGE_WORK")), Path(_required(env, "FORGE_HOME"))
        config = env.get("FORGE_HARNESS_CONFIG")
        templates = load_harness_config(config) if config else builtin_harnesses()
        if harness not in templates:
            raise ForgeError(f"unknown harness {harness!r}; known: {', '.join(sorted(templates))}")
        version = env.get("FORGE_POLICY_VERSION")
        policy_version = int(version) if version else None
        sample = int(env.get("FORGE_SAMPLE", "0"))
    except (ForgeError, ValueError) as e:
        print(f"forge pod: error: {e}", file=sys.stderr)
        return 2
    bundle = write_ca_bundle(ca_cert, home.parent / "forge-ca-bundle.pem")
    outcome = run_attempt(
        task,
        templates[harness],
        rollout_id=rid,
        workdir=work,
        home=home,
        logs=out / "logs" / rid,
        proxy_env=trust_env(env.get("FORGE_PROXY_URL", ""), ca_cert, bundle),
        model=env.get("FORGE_MODEL") or None,
    )
    group = env.get("FORGE_GROUP_ID") or task.id
    row = rollout_row(task, rid, harness, group, policy_version, sample, outcome)
    write_rows(out, "rollouts", [row])
    if outcome.verdict is not None:
        write_rows(out, "rewards", [reward_row(rid, outcome.verdict)])
    reward = outcome.verdict.reward if outcome.verdict else None
    result = json.dumps(
        {"rollout_id": rid, "status": outcome.status, "reward": reward, "error": outcome.error}
    )
    print(result)
    termination = Path(env.get("FORGE_TERMINATION_LOG", TERMINATION_LOG))
    if termination.parent.is_dir():
        with contextlib.suppress(OSError):  # outside Kubernetes there may be no such file
            termination.write_text(result[:4000])  # the kubelet keeps 4 KiB
    return EXIT_INFRA if outcome.status == "infra_error" else 0


if __name__ == "__main__":
    sys.exit(main())
