"""notebooks/explore_trajectories.ipynb: it runs on the demo's recorded run with every plot
drawn from data, and it is committed without outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from pipeline.shards import write_shard
from tests.pipeline.runs import call_row, reward_row, rollout_row

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "explore_trajectories.ipynb"


def test_the_committed_notebook_has_no_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert "widgets" not in nb.metadata


def rl_run(root: Path) -> Path:
    """Rollouts served by three policy versions, later ones rewarded more often: the
    shape of an RL run's learning curve (the RL loop writes such runs)."""
    calls, rollouts, rewards = [], [], []
    for version in range(3):
        for n in range(4):
            rid = f"v{version}-{n}"
            calls.append(call_row(f"{rid}-c0", seconds=version * 10 + n, rollout_id=rid,
                                  policy_version=version, drift="CLEAN"))  # fmt: skip
            rollouts.append(rollout_row(rid, f"task-{n % 2}"))
            rewards.append(reward_row(rid, 1.0 if n < version + 1 else 0.0))
    write_shard(root, "calls", "calls-0", calls)
    write_shard(root, "rollouts", "rollouts-0", rollouts)
    write_shard(root, "rewards", "rewards-0", rewards)
    return root


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo's run (``python -m forge_cli.demo``: four toy rollouts recorded through a
    real mitmdump), written to a temporary directory."""
    out = tmp_path_factory.mktemp("demo")
    done = subprocess.run(
        [sys.executable, "-m", "forge_cli.demo", "--out", str(out / "run"),
         "--snapshot", str(out / "snapshot"), "--no-loop"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield out / "run"


@pytest.mark.slow  # the demo records four rollouts through mitmdump, then a kernel runs
@pytest.mark.timeout(900)
def test_the_notebook_runs_on_the_demo_run_and_every_plot_has_data(
    demo_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGE_DATA", str(demo_run))
    monkeypatch.setenv("FORGE_RL_DATA", str(rl_run(tmp_path / "rl")))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel is this interpreter (ipykernel's python3 spec), started in notebooks/.
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()  # fmt: skip
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]  # fmt: skip
    assert errors == []
    plots = [c for c in nb.cells if {"plot", "learning-curve"} & set(c.metadata.get("tags", []))]
    assert len(plots) == 8
    for cell in plots:  # each drew a figure (its asserts ran on the data before it did)
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), cell.source[:80]
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert f"run: {demo_run}" in text and "audits: all clean" in text


@pytest.mark.slow
def test_without_an_rl_run_the_learning_curve_is_skipped_with_a_reason(
    demo_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGE_DATA", str(demo_run))
    monkeypatch.setenv("FORGE_RL_DATA", str(tmp_path / "absent"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # the set-up cell (the first code cell) and the learning curve's
    setup = next(c for c in nb.cells if c.cell_type == "code")
    (curve,) = [c for c in nb.cells if "learning-curve" in c.metadata.get("tags", [])]
    nb.cells = [setup, curve]
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()  # fmt: skip
    assert [o.output_type for o in curve.outputs] == ["stream"]
    assert f"skipped: no RL run at {tmp_path / 'absent'}" in curve.outputs[0]["text"]


@pytest.mark.slow
def test_a_loops_curve_file_draws_the_learning_curve(
    demo_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``forge loop`` writes curve.jsonl, one line per round: the plot reads it."""
    loop = tmp_path / "loop"
    loop.mkdir()
    rounds = [
        {"round": k, "policy_version": k, "rollouts": 24, "mean_reward": r, "samples": 8,
         "trained": True}
        for k, r in enumerate((0.25, 0.4, 0.55))
    ]  # fmt: skip
    (loop / "curve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    monkeypatch.setenv("FORGE_DATA", str(demo_run))
    monkeypatch.setenv("FORGE_RL_DATA", str(loop))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    setup = next(c for c in nb.cells if c.cell_type == "code")
    (curve,) = [c for c in nb.cells if "learning-curve" in c.metadata.get("tags", [])]
    nb.cells = [setup, curve]
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()  # fmt: skip
    assert any("image/png" in o.get("data", {}) for o in curve.outputs), curve.outputs
