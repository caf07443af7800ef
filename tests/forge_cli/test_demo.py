"""``make demo`` end to end: the walk-through, then a short loop that trains something."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.store import connect

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_make_demo_short_loop_moves_the_weights_on_groups_with_a_spread_of_rewards(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["HOME"] = str(tmp_path / "home")  # its own mitmproxy CA under ~/.forge
    done = subprocess.run(
        [sys.executable, "-m", "forge_cli.demo", "--out", str(tmp_path / "run"),
         "--snapshot", str(tmp_path / "snapshot"), "--loop", str(tmp_path / "loop")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1100,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    loop = tmp_path / "loop"
    # The SFT policy copies a sloppy expert: some rollouts of a task pass, some fail.
    expert = connect(loop / "expert").execute("SELECT count(*), avg(reward) FROM trajectories")
    n, mean = expert.fetchone() or (0, None)
    assert n == 96 and mean is not None and 0 < mean < 1
    curve = [json.loads(line) for line in (loop / "rl" / "curve.jsonl").read_text().splitlines()]
    assert [(c["round"], c["policy_version"], c["rollouts"]) for c in curve] == [
        (0, 1, 18),
        (1, 2, 18),
    ]
    for c in curve:  # groups with a spread of rewards, so the step moved the weights
        assert c["trained"] and c["samples"] > 0 and c["grad_norm"] > 0, c
        assert 0 < c["mean_reward"] < 1, c
    assert "so its step moved the weights" in done.stdout
