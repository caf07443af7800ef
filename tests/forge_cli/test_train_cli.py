"""``forge train``: a real snapshot and a tiny model in, a versioned checkpoint out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forge_cli.main import main

# Fixtures from tests/rl/conftest.py (a tiny model, a real snapshot).
from tests.rl.conftest import snapshot_dir, tiny_model_dir  # noqa: F401


def lines_of(out: str) -> list[dict[str, float]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_train_writes_a_checkpoint_one_version_up_and_json_metrics(
    snapshot_dir: Path,  # noqa: F811
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    step1 = tmp_path / "step-1"
    argv = ["train", "--snapshot", str(snapshot_dir), "--no-progress", "--lr", "1e-3"]
    assert main([*argv, "--model", str(tiny_model_dir), "--out", str(step1)]) == 0
    (metrics,) = lines_of(capsys.readouterr().out)
    assert metrics["policy_version"] == 0 and metrics["step"] == 1
    assert {"loss/pg", "adv/mean", "groups/zero_spread", "grad/norm"} <= set(metrics)
    assert metrics["groups/count"] == 2 and metrics["samples/count"] == 4
    assert metrics["groups/zero_spread"] == 1 and metrics["groups/total"] == 3
    meta = json.loads((step1 / "forge.json").read_text())
    assert meta["policy_version"] == 1 and meta["mode"] == "grpo"
    assert meta["snapshot"] == str(snapshot_dir.resolve())
    assert (step1 / "tokenizer.json").is_file() and (step1 / "config.json").is_file()
    assert lines_of((step1 / "train_metrics.jsonl").read_text()) == [metrics]

    step2 = tmp_path / "step-2"
    args = [*argv, "--model", str(step1), "--out", str(step2), "--loss-mode", "gspo"]
    assert main(args) == 0
    assert json.loads((step2 / "forge.json").read_text())["policy_version"] == 2


def test_train_sft_and_refusals(
    snapshot_dir: Path,  # noqa: F811
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["train", "--snapshot", str(snapshot_dir), "--model", str(tiny_model_dir)]
    out = tmp_path / "sft"
    assert main([*base, "--out", str(out), "--sft", "--no-progress"]) == 0
    (metrics,) = lines_of(capsys.readouterr().out)
    assert metrics["loss/sft"] > 0 and "loss/pg" not in metrics
    assert json.loads((out / "forge.json").read_text())["mode"] == "sft"

    assert main([*base, "--out", str(out)]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "x"), "--loss-mode", "nope"]) == 2
    assert "Supported modes" in capsys.readouterr().err
    bad = ["train", "--snapshot", str(tmp_path), "--model", str(tiny_model_dir)]
    assert main([*bad, "--out", str(tmp_path / "y")]) == 2
    assert "manifest.json" in capsys.readouterr().err


def test_train_logs_each_step_to_tensorboard_as_printed(
    snapshot_dir: Path,  # noqa: F811
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rl.tracking import read_tensorboard

    out = tmp_path / "step-1"
    argv = ["train", "--snapshot", str(snapshot_dir), "--model", str(tiny_model_dir), "--out"]
    assert main([*argv, str(out), "--no-progress", "--logger", "console,tensorboard"]) == 0
    (metrics,) = lines_of(capsys.readouterr().out)
    logged = read_tensorboard(tmp_path / "step-1-logs" / "tensorboard")
    assert logged["loss/pg"] == [(1, pytest.approx(metrics["loss/pg"]))]
    assert logged["grad/norm"] == [(1, pytest.approx(metrics["grad/norm"]))]
    assert set(logged) == {k for k in metrics if k != "step"}

    assert main([*argv, str(tmp_path / "x"), "--logger", "console,mlflow"]) == 2
    assert "unknown logger mlflow" in capsys.readouterr().err


def test_train_backend_verl_ray_refuses_config_sft_and_missing_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["train", "--backend", "verl-ray", "--snapshot", str(tmp_path / "snap")]
    base += ["--model", str(tmp_path / "model")]
    ray = [*base, "--out", str(tmp_path / "out")]
    refused = [
        (
            [*ray, "--config", str(tmp_path / "grpo.yaml")],
            "verl-ray is configured by overrides of veRL's ppo_trainer.yaml, not --config",
        ),
        ([*ray, "--sft"], "--sft is the embedded trainer's; veRL's backend trains GRPO/PPO"),
        (
            [*ray, "--keep-optimizer"],
            "--keep-optimizer is the embedded trainer's (veRL's engine keeps its own)",
        ),
        (base, "--backend verl-ray needs --snapshot, --model and --out"),
    ]
    for argv, message in refused:
        assert main(argv) == 2
        assert capsys.readouterr().err == f"forge: error: {message}\n"
    assert not any(tmp_path.iterdir())
