"""``forge reward`` then ``forge eval``: rewards written as rows, pass rates read back."""

from __future__ import annotations

import argparse
import csv
import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from forge_cli import cmd_eval, cmd_reward
from mitm_addon.launch import ForgeError
from pipeline.evaluation import pass_at_k, pass_hat_k
from pipeline.shards import shard_files, write_shard
from pipeline.store import connect

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def forge(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="forge")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd_reward.add_parser(sub)
    cmd_eval.add_parser(sub)
    args = parser.parse_args(list(argv))
    return int(args.func(args))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """Two tasks, three rollouts each, in the toy harness; one rollout ran out of time."""
    root = tmp_path / "run"
    calls: list[dict[str, Any]] = []
    rollouts: list[dict[str, Any]] = []
    for task in ("t1", "t2"):
        for i in range(3):
            rid = f"{task}-r{i}"
            start = T0 + timedelta(minutes=len(rollouts))
            calls.append(
                {
                    "call_id": f"{rid}-c",
                    "rollout_id": rid,
                    "model": "m1",
                    "status": "complete",
                    "started_at": start,
                    "ended_at": start + timedelta(seconds=1),
                }
            )
            status = "timed_out" if rid == "t2-r2" else "complete"
            rollouts.append(
                {
                    "rollout_id": rid,
                    "task_id": task,
                    "harness": "toy",
                    "status": status,
                    "started_at": start,
                    "ended_at": start + timedelta(seconds=2),
                    "written_at": start,
                }
            )
    write_shard(root, "calls", "calls-0", calls)
    write_shard(root, "rollouts", "rollouts-0", rollouts)
    return root


def test_reward_writes_one_row_that_the_views_read(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        forge(
            "reward",
            "--data",
            str(run),
            "--rollout",
            "t1-r0",
            "--reward",
            "0.5",
            "--status",
            "partial",
            "--details",
            '{"partial_credit": 0.5, "a": [1]}',
            "--source",
            "unit-verifier",
        )
        == 0
    )
    assert "written to" in capsys.readouterr().out
    (shard,) = shard_files(run, "rewards")
    (row,) = pq.read_table(shard).to_pylist()
    assert row["rollout_id"] == "t1-r0" and row["reward"] == 0.5 and row["status"] == "partial"
    assert row["details_json"] == '{"a":[1],"partial_credit":0.5}'  # canonical JSON
    assert row["source"] == "unit-verifier" and row["written_at"] is not None
    con = connect(run)
    assert con.execute(
        "SELECT reward, status FROM trajectories WHERE rollout_id = 't1-r0'"
    ).fetchone() == (0.5, "partial")


def test_a_second_reward_corrects_the_first(run: Path) -> None:
    forge("reward", "--data", str(run), "--rollout", "t1-r0", "--reward", "0")
    forge("reward", "--data", str(run), "--rollout", "t1-r0", "--reward", "1")
    con = connect(run)
    assert con.execute("SELECT count(*) FROM rewards").fetchone() == (2,)
    assert con.execute("SELECT reward FROM trajectories WHERE rollout_id = 't1-r0'").fetchone() == (
        1.0,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rollout", "nope", "--reward", "1"], "--allow-unknown"),
        (["--rollout", "t1-r0", "--reward", "yes"], "is not a number"),
        (["--rollout", "t1-r0", "--reward", "nan"], "is not finite"),
        (["--rollout", "t1-r0", "--reward", "1", "--details", "{bad"], "not valid JSON"),
        (["--rollout", "t1-r0", "--reward", "1", "--details", "[1]"], "must be a JSON object"),
    ],
)
def test_reward_refuses_bad_input_and_says_how_to_fix_it(
    run: Path, argv: list[str], message: str
) -> None:
    with pytest.raises(ForgeError, match=message):
        forge("reward", "--data", str(run), *argv)
    assert shard_files(run, "rewards") == []


def test_reward_for_an_unknown_rollout_is_written_when_allowed(run: Path) -> None:
    assert (
        forge(
            "reward", "--data", str(run), "--rollout", "later", "--reward", "1", "--allow-unknown"
        )
        == 0
    )
    assert len(shard_files(run, "rewards")) == 1


def test_missing_run_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ForgeError, match="no run directory"):
        forge("reward", "--data", str(tmp_path / "missing"), "--rollout", "r", "--reward", "1")
    with pytest.raises(ForgeError, match="no run directory"):
        forge("eval", "--data", str(tmp_path / "missing"))


def grade(run: Path) -> None:
    # t1: 2 of 3 succeed; t2: 1 success, 1 failure, and t2-r2 timed out ungraded (a failure).
    for rid, value in (
        ("t1-r0", "1"),
        ("t1-r1", "1"),
        ("t1-r2", "0"),
        ("t2-r0", "1"),
        ("t2-r1", "0"),
    ):
        assert forge("reward", "--data", str(run), "--rollout", rid, "--reward", value) == 0


def test_eval_round_trip_json(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grade(run)
    capsys.readouterr()
    assert forge("eval", "--data", str(run), "--k", "3,1", "--format", "json") == 0
    records = json.loads(capsys.readouterr().out)
    tasks = {r["task_id"]: r for r in records if r["scope"] == "task"}
    (mean,) = [r for r in records if r["scope"] == "mean"]
    assert set(tasks) == {"t1", "t2"}
    for task, (n, c) in {"t1": (3, 2), "t2": (3, 1)}.items():
        rec = tasks[task]
        assert (rec["harness"], rec["model"], rec["policy_version"]) == ("toy", "m1", None)
        assert (rec["n_trials"], rec["n_success"]) == (n, c)
        for k in (1, 3):
            assert rec[f"pass@{k}"] == pytest.approx(pass_at_k(n, c, k))
            assert rec[f"pass^{k}"] == pytest.approx(pass_hat_k(n, c, k))
    assert mean["n_tasks"] == 2 and mean["pass@1"] == pytest.approx(0.5)
    assert mean["pass@3"] == pytest.approx(1.0) and mean["pass^3"] == pytest.approx(0.0)


def test_eval_csv_and_table(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grade(run)
    capsys.readouterr()
    assert forge("eval", "--data", str(run), "--k", "1,3", "--format", "csv") == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["scope"] for r in rows] == ["task", "task", "mean"]
    assert list(rows[0]) == [
        "scope",
        "harness",
        "model",
        "policy_version",
        "task_id",
        "n_trials",
        "n_success",
        "pass@1",
        "pass^1",
        "pass@3",
        "pass^3",
    ]
    assert float(rows[0]["pass@1"]) == pytest.approx(2 / 3) and rows[0]["policy_version"] == ""
    assert forge("eval", "--data", str(run), "--k", "1") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "harness",
        "model",
        "policy",
        "task",
        "trials",
        "ok",
        "pass@1",
        "pass^1",
    ]
    assert table[1].split() == ["toy", "m1", "-", "t1", "3", "2", "0.667", "0.667"]
    assert "(mean of 2 tasks)" in table[3]


def test_eval_threshold(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forge("reward", "--data", str(run), "--rollout", "t1-r0", "--reward", "0.6")
    capsys.readouterr()
    forge("eval", "--data", str(run), "--threshold", "0.5", "--format", "json")
    (t1,) = [r for r in json.loads(capsys.readouterr().out) if r["task_id"] == "t1"]
    assert (t1["n_trials"], t1["n_success"]) == (1, 1)


def test_eval_without_graded_rollouts_says_how_to_grade(tmp_path: Path) -> None:
    # A plain `forge record` run: calls, no tasks, no rewards.
    write_shard(
        tmp_path, "calls", "calls-0", [{"call_id": "c1", "rollout_id": "r1", "status": "complete"}]
    )
    with pytest.raises(ForgeError, match="forge reward"):
        forge("eval", "--data", str(tmp_path))


def test_an_unfinished_ungraded_rollout_is_a_failed_trial(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert forge("eval", "--data", str(run), "--format", "json") == 0
    (t2,) = [r for r in json.loads(capsys.readouterr().out) if r["scope"] == "task"]
    assert (t2["task_id"], t2["n_trials"], t2["n_success"], t2["pass@1"]) == ("t2", 1, 0, 0.0)


@pytest.mark.parametrize("k", ["0", "a,b", ""])
def test_eval_rejects_bad_k(run: Path, k: str) -> None:
    with pytest.raises(ForgeError, match="--k"):
        forge("eval", "--data", str(run), "--k", k)
