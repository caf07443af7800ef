"""``--logger``: metrics to the console, TensorBoard event files and W&B runs (offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl.tracking import Tracker, TrackingError, parse_loggers, read_tensorboard, scalars


def test_logger_names_are_parsed_once_each_and_unknown_ones_refused() -> None:
    assert parse_loggers("console, tensorboard,console") == ("console", "tensorboard")
    with pytest.raises(TrackingError, match="unknown logger mlflow"):
        parse_loggers("console,mlflow")
    with pytest.raises(TrackingError, match="unknown logger"):
        parse_loggers(" , ")


def test_only_finite_numbers_become_series() -> None:
    line = {"step": 3, "loss/pg": 0.5, "ok": True, "note": "x", "bad": float("nan"), "n": 4}
    assert scalars(line) == {"loss/pg": 0.5, "n": 4.0}


def test_tensorboard_event_files_read_back_every_point_at_its_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Tracker(("console", "tensorboard"), tmp_path) as tracker:
        tracker.line(json.dumps({"step": 1, "loss/pg": 0.5, "grad/norm": 1.25}))
        tracker.line(json.dumps({"step": 2, "loss/pg": -0.25, "grad/norm": 0.75}))
    assert read_tensorboard(tmp_path / "tensorboard") == {
        "loss/pg": [(1, 0.5), (2, -0.25)],
        "grad/norm": [(1, 1.25), (2, 0.75)],
    }
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [p["step"] for p in printed] == [1, 2]


def test_wandb_writes_an_offline_run_without_a_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with Tracker(("wandb",), tmp_path, name="t", config={"lr": 0.001}) as tracker:
        tracker.log({"loss/pg": 0.375, "grad/norm": 2.5}, 7)
    (run,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    data = run.read_bytes()  # protobuf records: the history row's keys and JSON values
    assert b"loss/pg" in data and b"0.375" in data and b"grad/norm" in data and b"2.5" in data
