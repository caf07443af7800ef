"""rl.train: training settings by name, as ``forge loop``'s ``train:`` section gives them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl.losses import LossSettings
from rl.train import TrainError, TrainJob, settings_from, train
from rl.trainer import TrainSettings


def test_settings_by_name_fill_the_trainer_and_loss_settings() -> None:
    settings, keep = settings_from(
        {"lr": 1e-3, "sft": True, "micro_batch_size": 16, "clip_ratio_high": 0.28, "seed": 3}
    )
    assert settings == TrainSettings(
        loss=LossSettings(clip_ratio_high=0.28), sft=True, lr=1e-3, micro_batch_size=16, seed=3
    )
    assert keep is False
    assert settings_from({"keep_optimizer": True}) == (TrainSettings(), True)


def test_a_yaml_number_read_as_a_string_is_taken_as_a_float() -> None:
    # PyYAML reads `lr: 1e-3` (no dot) as the string "1e-3".
    settings, _ = settings_from({"lr": "1e-3", "weight_decay": 0})
    assert settings.lr == 1e-3 and settings.weight_decay == 0.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lrr": 1}, "unknown training setting(s) lrr"),
        ({"lr": "fast"}, "lr must be float, got 'fast'"),
        ({"sft": 1}, "sft must be bool, got 1"),
        ({"micro_batch_size": 1.5}, "micro_batch_size must be int, got 1.5"),
        ({"epochs": True}, "epochs must be int, got True"),
        ({"micro_batch_size": 0}, "micro_batch_size must be at least 1"),
        ({"loss_agg_mode": "nope"}, "loss_agg_mode 'nope' is not one of veRL's"),
    ],
)
def test_a_bad_setting_is_refused_with_its_name(options: dict[str, object], message: str) -> None:
    with pytest.raises(TrainError) as e:
        settings_from(options)
    assert message in str(e.value)


def test_a_job_needs_exactly_one_source_and_a_new_output(tmp_path: Path) -> None:
    model = tmp_path / "model"
    with pytest.raises(TrainError, match="give exactly one"):
        train(TrainJob(model=model, out=tmp_path / "out"))
    with pytest.raises(TrainError, match="never overwritten"):
        train(TrainJob(model=model, out=tmp_path, snapshot=tmp_path))
    chats = TrainJob(model=model, out=tmp_path / "out", chats=tmp_path / "c.parquet")
    with pytest.raises(TrainError, match="trains --sft only"):
        train(chats)
