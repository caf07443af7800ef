"""``make transfer``: the transfer table, the learnability curves, the recipe shared by
every harness."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rl import transfer
from rl.transfer import Trained, demo_args, mean_curve, table


def _trained(harness: str, curves: list[list[float | None]]) -> Trained:
    seeds = [{"seed": k, "curve": c, "sft": 0.0, "rl": 0.0} for k, c in enumerate(curves)]
    return Trained(harness, Path("/nowhere"), {"seeds": seeds})


def test_the_mean_curve_averages_the_seeds_rounds_where_defined() -> None:
    t = _trained("toy", [[0.25, 0.5, None], [0.75, None, None]])
    assert mean_curve(t) == [0.5, 0.5, None]


def test_the_table_puts_trained_in_on_rows_and_bolds_the_harness_trained_in() -> None:
    matrix = {
        "toy": {"toy": {"sft": [0.4, 0.2], "rl": [0.8, 0.6]}, "codex": {"sft": [0.0, 0.0], "rl": [0.05, 0.0]}},
        "codex": {"toy": {"sft": [0.1, 0.1], "rl": [0.2, 0.2]}, "codex": {"sft": [0.5, 0.3], "rl": [0.9, 0.7]}},
    }  # fmt: skip
    assert table(matrix, ["toy", "codex"]).splitlines() == [
        "| trained in \\ evaluated in | toy | codex |",
        "|---|---|---|",
        "| toy | **70.0% (SFT 30.0%)** | 2.5% (SFT 0.0%) |",
        "| codex | 20.0% (SFT 10.0%) | **80.0% (SFT 40.0%)** |",
    ]


def _args(**over: object) -> argparse.Namespace:
    values: dict[str, object] = {name: None for name in transfer.RECIPE}
    values.update(
        model="tiny", expert_accuracy=0.35, keep_optimizer=True, serve_max_tokens=48,
        sliding_window=64, out=Path("/tmp/t"), parallel=None, confdir=None, seeds=2,
    )  # fmt: skip
    values.update(over)
    return argparse.Namespace(**values)


def test_every_harness_gets_the_same_recipe_and_model() -> None:
    toy, codex = demo_args("toy", _args()), demo_args("codex", _args())
    assert toy.out == Path("/tmp/t/toy") and codex.out == Path("/tmp/t/codex")
    for name in transfer.RECIPE:
        assert getattr(toy, name) == getattr(codex, name), name
    assert toy.sliding_window == codex.sliding_window == 64
    assert toy.seeds == 2 and toy.expert_tasks == 96  # the tiny model's defaults fill the rest


def test_bad_harness_lists_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("toy,gemini", "toy,toy", ","):
        with pytest.raises(SystemExit) as stop:
            transfer.main(["--harnesses", bad, "--out", "/tmp/never"])
        assert stop.value.code == 2
        assert "--harnesses takes distinct names of toy, codex, claude" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.harness
def test_transfer_measures_each_harness_policies_through_the_other_and_reuses_finished_demos(
    tmp_path: Path, confdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The toy harness and the real Codex CLI at the smallest size: both demos run, each
    seed's SFT and SFT+RL checkpoints are measured through the other harness, and a second
    run with --reuse trains nothing and measures nothing again."""
    import json

    from pipeline.store import connect
    from tests.support import harnesses

    reason = harnesses.unavailable_reason("codex")
    if reason:
        pytest.skip(reason)
    out = tmp_path / "transfer"
    argv = [
        "--harnesses", "toy,codex", "--out", str(out), "--seeds", "1", "--expert-tasks", "4",
        "--sft-epochs", "1", "--rounds", "1", "--tasks-per-round", "1", "-n", "2",
        "--heldout", "2", "--parallel", "2", "--confdir", str(confdir),
    ]  # fmt: skip
    assert transfer.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["transfer"]) == {"toy", "codex"}
    for a in ("toy", "codex"):
        demo = json.loads((out / a / "results.json").read_text())
        assert demo["settings"]["sliding_window"] == 64  # one model in every harness
        (seed,) = demo["seeds"]
        # The harness it was trained in: the demo's own figures.
        assert results["transfer"][a][a] == {"sft": [seed["sft"]], "rl": [seed["rl"]]}
        b = "codex" if a == "toy" else "toy"
        for stage in ("sft", "rl"):
            run = connect(out / a / "seed-0" / f"in-{b}-{stage}", stitched=True)
            ((harness, n, rate),) = run.execute(
                "SELECT harness, count(*), avg((coalesce(reward, 0) > 0)::INT) "
                "FROM trajectories GROUP BY 1"
            ).fetchall()
            assert (harness, n) == (b, 2)
            assert results["transfer"][a][b][stage] == [rate]
    assert results["curves"]["codex"] == [demo["seeds"][0]["curve"]]
    assert (out / "learnability.png").stat().st_size > 0
    md = (out / "results.md").read_text()
    assert md.startswith(table(results["transfer"], ["toy", "codex"]))
    capsys.readouterr()
    before = (out / "codex" / "results.json").stat().st_mtime_ns
    assert transfer.main([*argv, "--reuse"]) == 0
    assert (out / "codex" / "results.json").stat().st_mtime_ns == before
    assert "codex: reusing" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["transfer"] == results["transfer"]
