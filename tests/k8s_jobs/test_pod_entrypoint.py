"""``python -m k8s_jobs.pod``, the Job's harness container, run here the way the pod runs it:
a one-rollout Forge proxy (the sidecar) on loopback, settings from the environment, rows
written next to the proxy's shards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from k8s_jobs.pod import EXIT_INFRA
from pipeline.store import connect
from tests.support.forge_proxy import forge_proxy
from tests.support.upstream import ScriptedUpstream

CONFIG = """
harnesses:
  curl-agent:
    command:
      - bash
      - -c
      - >-
        curl -sS --fail https://api.openai.com/v1/chat/completions
        -H 'content-type: application/json'
        -d '{"model": "m", "messages": [{"role": "user", "content": "hi"}]}' > answer.json
"""


def run_pod(tmp_path: Path, confdir: Path, verifier: object) -> tuple[int, dict[str, object], Path]:
    out = tmp_path / "runs" / "t.0"
    (tmp_path / "h.yaml").write_text(CONFIG)
    task = {"id": "t", "instruction": "Say hi.", "timeout": 60, "verifier": verifier}
    with (
        ScriptedUpstream([{"text": "hi"}]) as up,
        forge_proxy(out, confdir, {"api.openai.com": up.base_url}, rollout="t.0") as proxy,
    ):
        env = {
            "PATH": os.environ["PATH"],
            "FORGE_TASK_JSON": json.dumps(task),
            "FORGE_ROLLOUT_ID": "t.0",
            "FORGE_GROUP_ID": "t@v2",
            "FORGE_POLICY_VERSION": "2",
            "FORGE_HARNESS": "curl-agent",
            "FORGE_HARNESS_CONFIG": str(tmp_path / "h.yaml"),
            "FORGE_OUT": str(out),
            "FORGE_PROXY_URL": proxy.url,
            "FORGE_CA_CERT": str(proxy.ca_cert),
            "FORGE_WORK": str(tmp_path / "work"),
            "FORGE_HOME": str(tmp_path / "home" / "home"),
            "FORGE_TERMINATION_LOG": str(tmp_path / "termination-log"),
        }
        done = subprocess.run(
            [sys.executable, "-m", "k8s_jobs.pod"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    line = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    return done.returncode, line, out


def test_the_pod_runs_grades_and_writes_rows_beside_the_sidecars_shards(
    tmp_path: Path, confdir: Path
) -> None:
    code, line, out = run_pod(tmp_path, confdir, "test -s answer.json")
    assert code == 0 and line == {
        "rollout_id": "t.0",
        "status": "complete",
        "reward": 1.0,
        "error": None,
    }
    row = (
        connect(out)
        .execute(
            "SELECT t.rollout_id, t.status, t.reward, t.n_calls, t.policy_version_min, g.group_id "
            "FROM trajectories t JOIN groups g USING (rollout_id)"
        )
        .fetchall()
    )
    assert row == [("t.0", "complete", 1.0, 1, 2, "t@v2")]


def test_an_infra_error_exits_75_for_the_jobs_failure_policy(tmp_path: Path, confdir: Path) -> None:
    code, line, out = run_pod(tmp_path, confdir, {"command": "echo no json", "reward": "json"})
    assert code == EXIT_INFRA and line["status"] == "infra_error"
    status = connect(out).execute("SELECT status FROM rollouts_latest").fetchall()
    assert status == [("infra_error",)]


def test_missing_settings_exit_2_naming_the_variable(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "k8s_jobs.pod"],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "FORGE_TASK_JSON is not set" in done.stderr
