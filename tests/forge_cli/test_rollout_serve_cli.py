"""``forge rollout --mode serve``, then ``forge snapshot --grpo`` and ``forge train``: the
walk-through's "train a step" on the toy harness, answered by the scripted tiny policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.store import connect
from tests.forge_cli.test_rollout_cli import forge
from tests.support.policy import policy_server

TASK = {
    "id": "hello",
    "instruction": "Create hello.txt containing hi.",
    "timeout": 120,
    "verifier": {"command": 'test "$(cat hello.txt 2>/dev/null)" = hi'},
}


@pytest.mark.slow
def test_served_rollouts_make_a_snapshot_the_trainer_takes_a_step_on(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    (tmp_path / "tasks.jsonl").write_text(json.dumps(TASK) + "\n")
    with policy_server(tiny_models[1]) as policy:
        done = forge(tmp_path, "rollout", "--tasks", "tasks.jsonl", "--harness", "toy",
                     "-n", "2", "--out", "run", "--confdir", str(confdir), "--json",
                     "--mode", "serve", "--policy", policy.base_url,
                     "--serve-max-tokens", "64")  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The scripted policy calls `ls` every turn: each rollout runs out of turns (partial).
    results = json.loads(done.stdout)["results"]
    assert [(r["status"], r["reward"]) for r in results] == [("partial", 0.0)] * 2
    con = connect(tmp_path / "run")
    calls = con.execute(
        "SELECT count(*), count(DISTINCT rollout_id), bool_and(len(completion_ids) > 0), "
        "bool_and(upstream_url = $url) FROM calls",
        {"url": policy.base_url},
    ).fetchone()
    assert calls == (16, 2, True, True)  # the toy harness's 8 turns each, all served

    # Default rules drop unfinished rollouts: nothing to train on, and the snapshot says so.
    done = forge(tmp_path, "snapshot", "--data", "run", "--out", "s1")
    assert done.returncode == 0 and "no training samples" in done.stdout, done.stdout
    # Counting them as failures (reward 0) and keeping the tie keeps both rollouts: one
    # sequence per call, since the toy harness drops the reasoning from each turn it sends
    # back (REALIGN) and the trainer learns each completion once, in its own context.
    done = forge(tmp_path, "snapshot", "--data", "run", "--out", "s2",
                 "--grpo", "partial=zero", "--grpo", "zero_spread=keep")  # fmt: skip
    assert done.returncode == 0 and "16 samples" in done.stdout, done.stdout

    done = forge(tmp_path, "train", "--snapshot", "s2", "--model", str(tiny_models[1]),
                 "--out", "step-1", "--sft", "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    metrics = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("{")))
    # The scripted policy already gives its own tokens probability ~1: the loss is ~0.
    assert metrics["samples/count"] == 16 and metrics["samples/loss_tokens"] > 0
    assert 0 <= metrics["loss/sft"] < 1e-3
    assert json.loads((tmp_path / "step-1" / "forge.json").read_text())["policy_version"] == 1
