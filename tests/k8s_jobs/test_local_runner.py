"""The local backend end to end: the toy harness (real openai SDK, real subprocesses) behind
one real mitmdump, against a scripted provider, several rollouts at once.

One run of mixed tasks (module fixture) is checked from several sides: a task that works,
one whose harness hangs (killed at its timeout with its whole tree), one that crashes, one
that runs out of turns, one the verifier fails, one whose verifier cannot grade (infra
error, retried), and each rollout's calls stitched by the pipeline under its own id.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from k8s_jobs import RolloutOptions, RunSummary, parse_tasks, run_rollouts
from k8s_jobs.outcome import Progress
from mitm_addon.launch import ForgeError
from pipeline.store import connect
from tests.support.forge_proxy import PROXY_AUTH, PROXY_PASSWORD, files_containing, password_args
from tests.support.toy_agent import HANG_MARKER, toy_agent
from tests.support.upstream import ScriptedUpstream

# Each toy rollout starts a Python process that imports the openai SDK (about 2 s of CPU):
# the module takes a minute on a loaded 2-core machine.
pytestmark = pytest.mark.slow

OPENAI_KEY = "sk-proj-rolloutkey-0123456789abcdefABCDEF"  # must never reach disk

TASKS = [
    {
        "id": "hello",
        "instruction": "Create hello.txt containing hi.",
        "timeout": 90,
        "verifier": 'test "$(cat hello.txt)" = hi',
        "metadata": {"difficulty": "easy"},
    },
    {
        "id": "wrong-file",  # the agent writes other.txt; the verifier wants hello.txt
        "instruction": "Create other.txt containing hi.",
        "timeout": 90,
        "verifier": {"command": ["test", "-f", "hello.txt"]},
    },
    {
        "id": "graded",  # JSON verifier with details (partial credit)
        "instruction": "Create notes.md containing hi.",
        "timeout": 90,
        "workspace": {"files": {"src/keep.txt": "kept\n"}},
        "verifier": {
            "command": 'echo log line; echo \'{"reward": 0.5, "details": {"partial_credit": 0.5}}\'',
            "reward": "json",
        },
    },
    {
        "id": "hang",
        "instruction": "Wait. [forge-test:hang]",
        "timeout": 4,
        "verifier": "test -f hello.txt",
    },
    {"id": "crash", "instruction": "Go. [forge-test:crash]", "timeout": 90, "verifier": "true"},
    {"id": "loop", "instruction": "Go. [forge-test:loop]", "timeout": 90},
    {
        "id": "broken-verifier",  # prints no JSON in json mode: cannot grade -> infra_error
        "instruction": "Create hello.txt containing hi.",
        "timeout": 90,
        "verifier": {"command": "echo not json", "reward": "json"},
    },
]


@dataclass
class Run:
    summary: RunSummary
    out: Path
    progress: list[Progress]
    received: int
    wall_s: float


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, confdir: Path) -> Run:
    tmp = tmp_path_factory.mktemp("rollouts")
    text = "\n".join(json.dumps(t) for t in TASKS)
    tasks = parse_tasks(text, "mixed.jsonl", tmp)
    progress: list[Progress] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", OPENAI_KEY)  # passed through by the toy template
        with ScriptedUpstream(toy_agent) as up:
            started = time.monotonic()
            summary = run_rollouts(
                tasks,
                RolloutOptions(
                    out_dir=tmp / "run",
                    harness="toy",
                    n=1,
                    parallel=4,
                    upstreams=[f"api.openai.com={up.base_url}"],
                    confdir=confdir,
                    # Each harness must send it with its rollout id: http://<id>:<password>@
                    proxy_extra=password_args(tmp / "secrets")[1::2],
                    max_attempts=2,
                    backoff_base_s=0.05,
                    kill_grace_s=0.5,
                    on_progress=progress.append,
                ),
            )
            wall = time.monotonic() - started
            received = len(up.received)
    return Run(summary, tmp / "run", progress, received, wall)


def by_task(run: Run) -> dict[str, object]:
    return {r.task_id: r for r in run.summary.results}


def test_each_rollout_gets_the_status_its_harness_earned(run: Run) -> None:
    status = {r.task_id: r.status for r in run.summary.results}
    assert status == {
        "hello": "complete",
        "wrong-file": "complete",
        "graded": "complete",
        "hang": "timed_out",
        "crash": "crashed",
        "loop": "partial",
        "broken-verifier": "infra_error",
    }
    crash = next(r for r in run.summary.results if r.task_id == "crash")
    assert crash.exit_code == -9


def test_rewards_come_from_the_verifiers(run: Run) -> None:
    rewards = {r.task_id: r.reward for r in run.summary.results}
    assert rewards == {
        "hello": 1.0,
        "wrong-file": 0.0,
        "graded": 0.5,
        "hang": 0.0,
        "crash": 1.0,  # `true` grades anything; the crashed status still drops it from GRPO
        "loop": None,  # no verifier: no reward row
        "broken-verifier": None,
    }
    rows = (
        connect(run.out)
        .execute(
            "SELECT rollout_id, reward, details_json, source FROM rewards_latest ORDER BY rollout_id"
        )
        .fetchall()
    )
    got = {rid: (reward, json.loads(details)) for rid, reward, details, _ in rows}
    assert got["graded.0"] == (0.5, {"exit_code": 0, "partial_credit": 0.5})
    assert got["wrong-file.0"] == (0.0, {"exit_code": 1})
    assert {r[3] for r in rows} == {"forge rollout verifier"}


def test_only_infra_errors_are_retried_as_new_attempts(run: Run) -> None:
    attempts = {r.task_id: r.attempts for r in run.summary.results}
    assert attempts["broken-verifier"] == ["broken-verifier.0", "broken-verifier.0.r1"]
    assert all(len(a) == 1 for t, a in attempts.items() if t != "broken-verifier")
    statuses = dict(
        connect(run.out).execute("SELECT rollout_id, status FROM rollouts_latest").fetchall()
    )
    assert statuses["broken-verifier.0"] == statuses["broken-verifier.0.r1"] == "infra_error"


def test_the_hung_harness_is_killed_with_its_whole_tree(run: Run) -> None:
    hang = next(r for r in run.summary.results if r.task_id == "hang")
    assert hang.error and "deadline" in hang.error and hang.exit_code is None
    assert hang.wall_s < 60, "the 987 s sleep did not hold the rollout"
    leftovers = [
        p.info["pid"]
        for p in psutil.process_iter(["pid", "cmdline"])
        if HANG_MARKER in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


def test_calls_are_stitched_per_rollout_by_the_pipeline(run: Run) -> None:
    con = connect(run.out)
    rows = con.execute(
        "SELECT rollout_id, task_id, harness, status, reward, n_calls, n_agents "
        "FROM trajectories ORDER BY rollout_id"
    ).fetchall()
    traj = {r[0]: r for r in rows}
    # hello: turn 1 (shell call), turn 2 (done), both in one agent chain.
    assert traj["hello.0"][1:] == ("hello", "toy", "complete", 1.0, 2, 1)
    assert traj["loop.0"][3] == "partial" and traj["loop.0"][5] == 8  # toy's max turns
    total = con.execute("SELECT count(*) FROM calls").fetchone()
    assert total is not None and total[0] == run.received
    orphans = con.execute("SELECT count(*) FROM calls WHERE rollout_id IS NULL").fetchone()
    assert orphans == (0,)
    cross = con.execute(
        "SELECT count(*) FROM edges e JOIN calls p ON p.call_id = e.parent_call_id "
        "JOIN calls c ON c.call_id = e.child_call_id WHERE p.rollout_id <> c.rollout_id"
    ).fetchone()
    assert cross == (0,)


def test_rollout_rows_carry_the_grpo_group_the_pipeline_forms(run: Run) -> None:
    con = connect(run.out)
    pairs = con.execute(
        "SELECT r.rollout_id, r.group_id, g.group_id FROM rollouts_latest r "
        "JOIN groups g USING (rollout_id)"
    ).fetchall()
    assert pairs and all(ours == theirs for _, ours, theirs in pairs)
    meta = con.execute(
        "SELECT metadata_json FROM rollouts_latest WHERE rollout_id = 'hello.0'"
    ).fetchone()
    assert meta is not None and json.loads(meta[0]) == {"difficulty": "easy", "sample": 0}
    dropped = dict(
        con.execute("SELECT rollout_id, drop_reason FROM groups WHERE NOT included").fetchall()
    )
    assert dropped["broken-verifier.0"] == "infra_error"


def test_progress_counts_running_done_failed_and_mean_reward(run: Run) -> None:
    last = run.progress[-1]
    assert (last.total, last.running, last.done) == (7, 0, 7)
    assert last.failed == 3  # timed_out, crashed, infra_error
    assert last.retries == 1
    assert last.mean_reward == pytest.approx((1 + 0 + 0.5 + 0 + 1) / 5)
    assert max(p.running for p in run.progress) > 1, "rollouts ran in parallel"


def test_no_secret_reaches_the_run_directory(run: Run) -> None:
    assert files_containing(run.out, [OPENAI_KEY, PROXY_PASSWORD, PROXY_AUTH]) == []


def test_a_run_directory_with_rollouts_is_not_reused(run: Run) -> None:
    tasks = parse_tasks(json.dumps(TASKS[0]), "one.jsonl")
    with pytest.raises(ForgeError, match="already holds rollouts"):
        run_rollouts(tasks, RolloutOptions(out_dir=run.out, harness="toy"))


def test_a_missing_harness_program_is_an_infra_error_without_retries(
    tmp_path: Path, confdir: Path
) -> None:
    from k8s_jobs.harnesses import HarnessTemplate

    missing = HarnessTemplate(name="missing", command=("forge-no-such-harness", "{instruction}"))
    tasks = parse_tasks(json.dumps(TASKS[0]), "one.jsonl")
    summary = run_rollouts(
        tasks,
        RolloutOptions(
            out_dir=tmp_path / "run",
            harness="missing",
            templates={"missing": missing},
            confdir=confdir,
            backoff_base_s=0.01,
        ),
    )
    (result,) = summary.results
    assert result.status == "infra_error" and result.attempts == ["hello.0"]
    assert result.error and "forge-no-such-harness" in result.error


def test_32_toy_rollouts_at_parallelism_8_end_graded_and_stitched(
    tmp_path: Path, confdir: Path
) -> None:
    """The issue's done-means: 32 rollouts (8 tasks x 4), 8 at a time."""
    lines = [
        json.dumps(
            {
                "id": f"file-{i}",
                "instruction": f"Create f{i}.txt containing hi.",
                "timeout": 240,
                # Right for even tasks only: groups then hold both rewards across tasks.
                "verifier": f"test -f f{i - i % 2}.txt",
            }
        )
        for i in range(8)
    ]
    tasks = parse_tasks("\n".join(lines), "scale.jsonl")
    with ScriptedUpstream(toy_agent) as up:
        summary = run_rollouts(
            tasks,
            RolloutOptions(
                out_dir=tmp_path / "run",
                harness="toy",
                n=4,
                parallel=8,
                upstreams=[f"api.openai.com={up.base_url}"],
                confdir=confdir,
            ),
        )
    assert len(summary.results) == 32
    assert {r.status for r in summary.results} == {"complete"}
    want = {f"file-{i}": 1.0 if i % 2 == 0 else 0.0 for i in range(8)}
    assert {r.task_id: r.reward for r in summary.results} == want
    con = connect(tmp_path / "run")
    traj = con.execute(
        "SELECT count(*), count(DISTINCT rollout_id), min(n_calls), max(n_calls), "
        "count(*) FILTER (WHERE n_agents = 1) FROM trajectories"
    ).fetchone()
    assert traj == (32, 32, 2, 2, 32)
    groups = con.execute(
        "SELECT group_id, count(*), avg(reward) FROM groups GROUP BY group_id ORDER BY group_id"
    ).fetchall()
    assert [(g, n) for g, n, _ in groups] == [(f"file-{i}@unversioned", 4) for i in range(8)]
    assert {g: r for g, _, r in groups} == {
        f"file-{i}@unversioned": want[f"file-{i}"] for i in range(8)
    }


def test_resuming_keeps_ended_rollouts_and_gives_the_others_unused_ids() -> None:
    from k8s_jobs.local import plan_rollouts, resume_plan
    from k8s_jobs.tasks import Task

    plan = plan_rollouts([Task("a", "x"), Task("b", "x")], 3, None)
    ended = {
        "a.0": ("complete", 1.0),  # ended: kept
        "a.1": ("infra_error", None),  # retryable: runs again as a.1.r1
        "b.0": ("infra_error", None),  # ... after its last attempt: kept as it ended
        "b.0.r1": ("infra_error", None),
    }
    used = {*ended, "a.2", "b.1"}  # a.2 and b.1 made calls but never ended
    todo, kept = resume_plan(plan, ended, used, max_attempts=2)
    assert [(k.rollout_id, k.status, k.reward) for k in kept] == [
        ("a.0", "complete", 1.0),
        ("b.0.r1", "infra_error", None),
    ]
    assert [(p.task.id, p.sample, p.first_attempt) for p in todo] == [
        ("a", 1, 1),
        ("a", 2, 1),
        ("b", 1, 1),
        ("b", 2, 0),
    ]
