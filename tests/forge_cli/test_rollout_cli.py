"""``forge rollout`` as a user runs it: a harness from a config file (curl through the proxy,
one real LLM call per rollout), graded, recorded under each rollout's id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from pipeline.store import connect
from tests.support.upstream import ScriptedUpstream

# A harness in one line of shell: one Chat Completions call through HTTPS_PROXY (curl trusts
# Forge's CA through CURL_CA_BUNDLE), then the answer written to answer.txt.
HARNESS_CONFIG = """
harnesses:
  curl-agent:
    command:
      - bash
      - -c
      - >-
        curl -sS --fail https://api.openai.com/v1/chat/completions
        -H 'content-type: application/json' -H "authorization: Bearer $OPENAI_API_KEY"
        -d '{"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "{instruction}"}]}'
        > answer.json && echo {task_id} > answer.txt
    env: {OPENAI_API_KEY: sk-cli-dummy}
"""
TASKS = [
    {"id": "ask", "instruction": "Say hi.", "timeout": 60, "verifier": "test -s answer.txt"},
    {
        "id": "ask-twice",
        "instruction": "Say hi again.",
        "timeout": 60,
        "verifier": {"command": "grep -q nope answer.txt"},
    },
]


def forge(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return subprocess.run(
        [sys.executable, "-m", "forge_cli.main", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_rollout_cli_runs_grades_and_records_each_rollout(tmp_path: Path, confdir: Path) -> None:
    (tmp_path / "h.yaml").write_text(HARNESS_CONFIG)
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS))
    with ScriptedUpstream([{"text": "hi"}]) as up:
        done = forge(
            tmp_path,
            "rollout",
            "--tasks",
            "tasks.jsonl",
            "--harness",
            "curl-agent",
            "--harness-config",
            "h.yaml",
            "-n",
            "2",
            "--parallel",
            "3",
            "--out",
            "run",
            "--confdir",
            str(confdir),
            "--upstream",
            f"api.openai.com={up.base_url}",
            "--json",
        )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["results"]
    assert {(r["rollout_id"], r["status"], r["reward"]) for r in results} == {
        ("ask.0", "complete", 1.0),
        ("ask.1", "complete", 1.0),
        ("ask-twice.0", "complete", 0.0),
        ("ask-twice.1", "complete", 0.0),
    }
    assert "4 rollout(s)" in done.stderr and "mean reward 0.500" in done.stderr
    con = connect(tmp_path / "run")
    calls = con.execute("SELECT rollout_id, count(*) FROM calls GROUP BY ALL ORDER BY 1").fetchall()
    assert calls == [("ask-twice.0", 1), ("ask-twice.1", 1), ("ask.0", 1), ("ask.1", 1)]
    groups = con.execute("SELECT DISTINCT group_id FROM groups ORDER BY 1").fetchall()
    assert groups == [("ask-twice@unversioned",), ("ask@unversioned",)]


def test_rollout_cli_reports_a_bad_task_file_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "instruction": "x"}\n{"id": "b"}\n')
    done = forge(tmp_path, "rollout", "--tasks", "tasks.jsonl", "--harness", "toy")
    assert done.returncode == 2
    assert "tasks.jsonl:2: task 'b': field 'instruction'" in done.stderr


def test_the_k8s_backend_without_credentials_says_how_to_get_them(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "instruction": "x", "harness": "toy"}\n')
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "forge_cli.main",
            "rollout",
            "--tasks",
            "tasks.jsonl",
            "--backend",
            "k8s",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "no Kubernetes credentials" in done.stderr
    assert "--k8s-api" in done.stderr


def test_the_k8s_backend_runs_jobs_through_the_api_server(tmp_path: Path) -> None:
    from tests.support.kube_api import kube_api_server

    lines = [
        json.dumps({"id": n, "instruction": "x", "harness": "toy"}) for n in ("ok", "deadline")
    ]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines))
    with kube_api_server() as (api, url):
        done = forge(
            tmp_path,
            "rollout",
            "--tasks",
            "tasks.jsonl",
            "--backend",
            "k8s",
            "--k8s-api",
            url,
            "-n",
            "2",
            "--out",
            "r7",
            "--json",
        )
        jobs = [p for m, p in api.requests if m == "POST"]
    assert done.returncode == 0, done.stderr
    got = {(r["rollout_id"], r["status"], r["reward"]) for r in json.loads(done.stdout)["results"]}
    assert got == {
        ("ok.0", "complete", 1.0),
        ("ok.1", "complete", 1.0),
        ("deadline.0", "timed_out", None),
        ("deadline.1", "timed_out", None),
    }
    assert len(jobs) == 4 and "4 Job(s)" in done.stderr


def test_list_harnesses_names_the_builtins(tmp_path: Path) -> None:
    done = forge(tmp_path, "rollout", "--list-harnesses")
    assert done.returncode == 0
    assert [line.split()[0] for line in done.stdout.splitlines()] == [
        "claude",
        "codex",
        "openclaw",
        "opencode",
        "toy",
    ]


# One call through the proxy; the first "slow" rollout then hangs (until killed): a run
# stopped with one rollout cut short after its call.
RESUME_HARNESS = """
harnesses:
  call-then-maybe-hang:
    command:
      - bash
      - -c
      - >-
        curl -sS --fail https://api.openai.com/v1/chat/completions
        -H 'content-type: application/json' -H "authorization: Bearer $OPENAI_API_KEY"
        -d '{"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]}'
        > answer.json && echo ok > answer.txt &&
        if [ {task_id} = slow ] && mkdir MARK 2>/dev/null; then sleep 120; fi
    env: {OPENAI_API_KEY: sk-cli-dummy}
"""


def test_a_killed_run_resumes_without_running_or_losing_any_rollout_twice(
    tmp_path: Path, confdir: Path
) -> None:
    import signal
    import time

    from pipeline.store import connect as open_run

    (tmp_path / "h.yaml").write_text(RESUME_HARNESS.replace("MARK", str(tmp_path / "hung")))
    tasks = [
        {"id": "fast", "instruction": "x", "timeout": 60, "verifier": "test -s answer.txt"},
        {"id": "slow", "instruction": "x", "timeout": 200, "verifier": "test -s answer.txt"},
    ]
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in tasks))
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    with ScriptedUpstream([{"text": "hi"}] * 8) as up:
        args = [sys.executable, "-m", "forge_cli.main", "rollout", "--tasks", "tasks.jsonl",
                "--harness", "call-then-maybe-hang", "--harness-config", "h.yaml", "-n", "2",
                "--parallel", "4", "--out", "run", "--confdir", str(confdir),
                "--upstream", f"api.openai.com={up.base_url}"]  # fmt: skip
        first = subprocess.Popen(
            args, cwd=tmp_path, env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while True:  # until the three rollouts that do not hang have ended
                time.sleep(0.5)
                assert time.monotonic() < deadline and first.poll() is None
                ended = open_run(tmp_path / "run").execute("SELECT count(*) FROM rollouts")
                if ended.fetchone() == (3,):
                    break
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # forge, its proxy and the hung harness
            first.wait()
        done = forge(tmp_path, *args[3:], "--resume", "--json")
    for p in psutil.process_iter(["cmdline"]):  # the hung harness, orphaned by the kill
        if str(tmp_path / "hung") in " ".join(p.info["cmdline"] or []):
            for q in [*p.children(recursive=True), p]:
                q.kill()
    assert done.returncode == 0, done.stderr
    results = {
        r["rollout_id"]: (r["status"], r["reward"]) for r in json.loads(done.stdout)["results"]
    }
    hung = ({"slow.0", "slow.1"} - {r for r in results}).pop()  # the one cut short
    assert len(results) == 4 and f"{hung}.r1" in results
    assert set(results.values()) == {("complete", 1.0)}
    con = open_run(tmp_path / "run")
    calls = dict(con.execute("SELECT rollout_id, count(*) FROM calls GROUP BY ALL").fetchall())
    # Each rollout that ended ran once; the one cut short kept its call under its own id,
    # apart from its rerun, and has no reward, so GRPO drops it rather than train it.
    assert calls == {**dict.fromkeys(results, 1), hung: 1}
    trained = con.execute(
        "SELECT rollout_id, included, drop_reason FROM groups WHERE rollout_id = $r", {"r": hung}
    ).fetchall()
    assert trained in ([], [(hung, False, "no_reward")]), trained
