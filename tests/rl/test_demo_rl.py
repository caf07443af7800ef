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
        "--seeds", "1", "--expert-tasks", "6", "--sft-epochs", "1", "--rounds", "1",
        "--tasks-per-round", "1", "-n", "3", "--heldout", "2", "--parallel", "3",
        "--micro-batch-size", "4", "--confdir", str(confdir),
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

    assert pq.read_table(out / "expert" / "sft.parquet").num_rows == 6
    assert read_policy_version(out / "seed-0" / "sft") == 1
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
    # Held-out rollouts ran twice (SFT, then the loop's last policy), two tasks each.
    for name in ("heldout-sft", "heldout-rl"):
        rollouts = connect(out / "seed-0" / name).execute("select count(*) from rollouts")
        assert rollouts.fetchone() == (2,)
