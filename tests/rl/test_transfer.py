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
