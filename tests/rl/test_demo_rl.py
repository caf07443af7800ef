"""``make demo-rl`` at the smallest size: every stage runs and the report is written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.store import connect
from rl.trainer import read_policy_version
from tests.support import harnesses

REPO = Path(__file__).resolve().parents[2]
# The toy run only checks that every stage runs. The Codex run must take a real GRPO step,
# so its groups need a spread of rewards: an expert right half the time over 64 tasks (about
# 10 of each kind of task: the policy sees the instruction and learns per kind), SFT long
# enough to copy both habits (the sliding-window model crops Codex's 7.7k-token prompts:
# 15 epochs take a minute), then 4 groups of 8. Measured: every group had a spread, its
# success rates 3/8 to 6/8; at 0.4 all four groups of one reward have odds of about 1e-7.
SIZES = {
    "toy": ["--expert-tasks", "6", "--sft-epochs", "1", "--tasks-per-round", "1", "-n", "3"],
    "codex": [
        "--expert-tasks", "64", "--expert-accuracy", "0.5", "--sft-epochs", "15",
        "--tasks-per-round", "4", "-n", "8",
    ],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "harness", ["toy", pytest.param("codex", marks=pytest.mark.harness)]
)  # fmt: skip
def test_the_demo_records_an_expert_trains_sft_then_rl_and_reports_heldout_success(
    tmp_path: Path, confdir: Path, harness: str
) -> None:
    """Every stage, through the toy harness and through the real Codex CLI (its expert
    recorded, the policy served to it, its held-out tasks graded)."""
    reason = harnesses.unavailable_reason("codex") if harness == "codex" else None
    if reason:
        pytest.skip(reason)
    out = tmp_path / "demo-rl"
    argv = [
        sys.executable, "-m", "rl.demo_rl", "--harness", harness, "--out", str(out),
        "--seeds", "1", "--rounds", "1", "--heldout", "2", "--parallel", "4",
        "--confdir", str(confdir), *SIZES[harness],
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"held-out success: sft=\d+\.\d% sft\+rl=\d+\.\d% seeds=1", last)
    results = json.loads((out / "results.json").read_text())
    (seed,) = results["seeds"]
    assert 0 <= seed["sft"] <= 1 and 0 <= seed["rl"] <= 1 and len(seed["curve"]) == 1
    assert "| 0 |" in (out / "results.md").read_text()
    # The expert's six rollouts became SFT chats; SFT wrote policy version 1.
    import pyarrow.parquet as pq

    expert_tasks = int(SIZES[harness][1])
    assert pq.read_table(out / "expert" / "sft.parquet").num_rows == expert_tasks
    assert read_policy_version(out / "seed-0" / "sft") == 1
    # The round's snapshot passed every audit.
    manifest = json.loads(
        (out / "seed-0" / "rl" / "snapshots" / "round-0" / "manifest.json").read_text()
    )
    assert manifest["audits"] and set(manifest["audits"].values()) == {0}
    # The loop served the SFT policy: its rollouts carry version 1.
    con = connect(out / "seed-0" / "rl" / "runs" / "round-0")
    versions = con.execute("select distinct policy_version from rollouts").fetchall()
    assert versions == [(1,)]
    # Behaviour before and after RL, from the behaviour views over the held-out runs.
    for stage in ("sft", "rl"):
        view = connect(out / "seed-0" / f"heldout-{stage}", stitched=True).execute(
            "SELECT n_trajectories, mean_tool_coverage FROM behaviour_summary"
        )
        assert view.fetchall() == [
            (2, seed["behaviour"][stage]["mean_tool_coverage"])
        ]  # fmt: skip
    assert set(results["heldout_behaviour"]["rl"]) == {
        "mean_tool_coverage", "self_verification_rate", "mean_plan_completion", "error_recovery"
    }  # fmt: skip
    assert "| tool coverage |" in (out / "results.md").read_text()
    # The demo keeps the AdamW state across rounds by default, and says so.
    assert results["settings"]["keep_optimizer"] is True
    assert results["settings"]["harness"] == harness
    expert = connect(out / "expert" / "run").execute("SELECT DISTINCT harness FROM rollouts")
    assert expert.fetchall() == [(harness,)]
    if harness == "codex":  # the served calls were Codex's Responses calls
        apis = connect(out / "seed-0" / "heldout-sft").execute("SELECT DISTINCT api FROM calls")
        assert apis.fetchall() == [("openai_responses",)]
        check_one_grpo_step_through_codex(out)
    # Held-out rollouts ran twice (SFT, then the loop's last policy), two tasks each.
    for name in ("heldout-sft", "heldout-rl"):
        rollouts = connect(out / "seed-0" / name).execute("select count(*) from rollouts")
        assert rollouts.fetchone() == (2,)


def check_one_grpo_step_through_codex(out: Path) -> None:
    """Round 0 through Codex: every served call CLEAN, each agent's chain one sample
    holding all its calls, and a step that moved the weights."""
    import pyarrow.parquet as pq
    from safetensors.torch import load_file

    from rl.batches import read_samples

    run = connect(out / "seed-0" / "rl" / "runs" / "round-0", stitched=True)
    # Served calls (Codex's generate:false warm-up is answered without sampling): each
    # continues the conversation before it token for token.
    calls = run.execute(
        "SELECT rollout_id, count(*), count(*) FILTER (WHERE drift = 'CLEAN') "
        "FROM calls WHERE completion_ids IS NOT NULL GROUP BY rollout_id"
    ).fetchall()
    assert len(calls) == 32
    assert all(clean == n for _, n, clean in calls), calls
    assert max(n for _, n, _ in calls) >= 2  # some rollouts called a tool, then answered
    snap = out / "seed-0" / "rl" / "snapshots" / "round-0"
    samples = pq.read_table(snap / "data" / "train-00000-of-00001.parquet").to_pylist()
    assert samples, "every group had one reward: no sample, no step"
    n_calls = {r: n for r, n, _ in calls}
    for row in samples:  # one sample per agent, all of its calls merged
        assert [r["rollout_id"] for r in samples].count(row["rollout_id"]) == 1
        assert row["n_calls"] == len(row["call_ids"]) == n_calls[row["rollout_id"]]
        # Each call's completion is one run of trained tokens.
        mask = row["loss_mask"]
        runs = sum(1 for a, b in zip([0, *mask[:-1]], mask, strict=True) if b and not a)
        assert runs == row["n_calls"]
    assert len(read_samples(snap)) == len(samples)
    step = out / "seed-0" / "rl" / "checkpoints" / "step-1"
    (metrics,) = [
        json.loads(line) for line in (step / "train_metrics.jsonl").read_text().splitlines()
    ]
    assert metrics["loss/pg"] != 0.0 and metrics["grad/norm"] > 0.0
    before = load_file(str(out / "seed-0" / "sft" / "model.safetensors"))
    after = load_file(str(step / "model.safetensors"))
    assert before.keys() == after.keys()
    assert max(float((after[k] - before[k]).abs().max()) for k in before) > 0.0
