"""``forge train --backend verl``: snapshot samples in veRL's layout, trained by veRL's own
FSDP engine (on CPU here, through the CPU platform), agreeing with the embedded trainer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from mitm_addon.launch import free_port
from rl import trainer
from rl.batches import SAMPLES_FILE, collate, read_samples
from rl.verl_backend import config as vconfig
from rl.verl_backend.dataproto import to_dataproto
from tests.rl.conftest import make_samples, snapshot_dir, tiny_model_dir  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def test_samples_become_left_padded_prompts_and_right_padded_responses() -> None:
    samples = make_samples(8, seed=3)
    data = to_dataproto(samples, pad_id=0)
    b = data.batch
    p = b["prompts"].shape[1]
    for i, s in enumerate(samples):
        cut = s.loss_mask.index(1)
        n = len(s.input_ids) - cut
        attention = b["attention_mask"][i]
        # Every token kept, in order: the real prompt tokens end at column P.
        real = b["input_ids"][i][attention.bool()].tolist()
        assert real == list(s.input_ids)
        assert b["prompts"][i, p - cut :].tolist() == list(s.input_ids[:cut])
        assert attention[: p - cut].sum() == 0  # left padding
        assert b["responses"][i, :n].tolist() == list(s.input_ids[cut:])
        assert attention[p + n :].sum() == 0  # right padding
        assert b["response_mask"][i, :n].tolist() == list(s.loss_mask[cut:])
        assert b["response_mask"][i, n:].sum() == 0
        # Logprobs and advantages sit on the same tokens as the embedded trainer's batch.
        batch = collate([s])
        mask = b["response_mask"][i].bool()
        assert torch.equal(
            b["old_log_probs"][i][mask], batch.old_logprobs[0][batch.loss_mask[0].bool()]
        )
        assert torch.equal(b["advantages"][i][mask], batch.advantages[0][batch.loss_mask[0].bool()])
        assert b["position_ids"][i][attention.bool()].tolist() == list(range(len(s.input_ids)))
    assert list(data.non_tensor_batch["uid"]) == [s.group_id for s in samples]
    assert data.non_tensor_batch["old_log_probs_known"].all()


def test_config_overrides_name_existing_keys_and_bad_values_are_refused(tmp_path: Path) -> None:
    cfg = vconfig.load(None, ["actor.optim.lr=1e-5", "actor.policy_loss.loss_mode=gspo"])
    assert cfg.actor.optim.lr == 1e-5 and cfg.actor.policy_loss.loss_mode == "gspo"
    with pytest.raises(vconfig.ConfigError, match="no key 'actor.optim.lrr'"):
        vconfig.load(None, ["actor.optim.lrr=1"])
    with pytest.raises(vconfig.ConfigError, match="KEY=VALUE"):
        vconfig.load(None, ["actor.optim.lr"])
    with pytest.raises(vconfig.ConfigError, match="old_log_probs"):
        vconfig.load(None, ["old_log_probs=maybe"])
    with pytest.raises(vconfig.ConfigError, match="must both divide"):
        vconfig.actor_config(vconfig.load(None, ["actor.ppo_mini_batch_size=3"]), tmp_path, 4, 2)


def _with_true_logprobs(snapshot: Path, model_dir: Path, out: Path) -> list[Any]:
    """A copy of ``snapshot`` whose samples carry the tiny model's own logprobs."""
    shutil.copytree(snapshot, out)
    samples = read_samples(out)
    model = trainer.load_policy(model_dir)
    with torch.no_grad():
        batch = trainer.with_old_logprobs(model, collate(samples), recompute_all=True)
    table = pq.read_table(out / SAMPLES_FILE)
    lps = [
        [float(x) for x in batch.old_logprobs[i, : len(s.input_ids)].tolist()]
        for i, s in enumerate(samples)
    ]
    column = table.schema.get_field_index("old_logprobs")
    table = table.set_column(
        column, table.schema.field(column), pa.array(lps, table.schema.field(column).type)
    )
    pq.write_table(table, out / SAMPLES_FILE)
    return read_samples(out)


def _forge_train_verl(launcher: list[str], snap: Path, model: Path, out: Path) -> dict[str, Any]:
    done = subprocess.run(
        [*launcher, "-m", "forge_cli.main", "train", "--backend", "verl"]
        + ["--snapshot", str(snap), "--model", str(model), "--out", str(out)]
        + ["old_log_probs=sampling", "actor.optim.lr=1e-2", "actor.optim.weight_decay=0"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "checkpoint written to" in done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("{")]
    metrics: dict[str, Any] = json.loads(line)
    return metrics


def _embedded_step(samples: list[Any], model_dir: Path) -> tuple[dict[str, float], Any]:
    """The embedded trainer's step with the same settings: its metrics and weights."""
    model = trainer.load_policy(model_dir)
    steps: list[dict[str, float]] = []
    trainer.train(
        model,
        samples,
        trainer.TrainSettings(lr=1e-2, weight_decay=0.0, micro_batch_size=4),
        on_step=steps.append,
        progress=False,
    )
    return steps[0], model.state_dict()


def _assert_same_step(
    out: Path,
    model_dir: Path,
    metrics: dict[str, Any],
    samples: list[Any],
    grad_key: str = "grad_norm",
) -> tuple[float, float]:
    """veRL's step (``metrics``, weights in ``out``) is the embedded trainer's: the same
    loss, gradient norm (``grad_key``) and weights; returns (moved, apart)."""
    embedded, weights = _embedded_step(samples, model_dir)
    # The same PPO loss and gradient as the embedded trainer's (ratio 1 at the start).
    assert metrics["actor/pg_loss"] == pytest.approx(embedded["loss/pg"], abs=1e-5)
    assert metrics[grad_key] == pytest.approx(embedded["grad/norm"], rel=1e-4)
    # The same optimizer step: AdamW moved every weight by up to lr (1e-2); both trainers
    # land on the same weights to well within that.
    before = trainer.load_policy(model_dir).state_dict()
    after = trainer.load_policy(out).state_dict()
    assert before.keys() == after.keys() == weights.keys()
    moved = max(float((after[k] - before[k]).abs().max()) for k in after)
    apart = max(float((after[k] - weights[k]).abs().max()) for k in after)
    assert moved > 5e-3 and apart < 1e-3, (moved, apart)
    return moved, apart


@pytest.fixture
def own_logprobs(
    snapshot_dir: Path,  # noqa: F811
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> tuple[Path, list[Any]]:
    """A copy of the snapshot whose samples carry the tiny model's own logprobs."""
    snap = tmp_path / "snap"
    return snap, _with_true_logprobs(snapshot_dir, tiny_model_dir, snap)


def test_verl_takes_the_embedded_trainers_step_from_the_same_logprobs(
    own_logprobs: tuple[Path, list[Any]],
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    snap, samples = own_logprobs
    out = tmp_path / "step-1"
    metrics = _forge_train_verl([sys.executable], snap, tiny_model_dir, out)
    # veRL recomputed the logprobs of the converted samples: they are the model's own, token
    # for token, so the layouts agree.
    assert metrics["old_logprobs/abs_diff_sampling"] < 1e-4, metrics
    _assert_same_step(out, tiny_model_dir, metrics, samples)
    assert metrics["samples/count"] == 4 and metrics["groups/zero_spread"] == 1
    meta = json.loads((out / "forge.json").read_text())
    assert meta["policy_version"] == 1 and meta["backend"] == "verl" and meta["device"] == "cpu"
    assert meta["processes"] == 1 and meta["config"]["actor"]["optim"]["lr"] == 1e-2
    assert (out / "tokenizer.json").is_file()


@pytest.mark.slow
def test_two_fsdp_processes_under_torchrun_take_the_same_step_as_one(
    own_logprobs: tuple[Path, list[Any]],
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    snap, samples = own_logprobs
    out = tmp_path / "step-1"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    metrics = _forge_train_verl(torchrun, snap, tiny_model_dir, out)
    assert json.loads((out / "forge.json").read_text())["processes"] == 2
    _assert_same_step(out, tiny_model_dir, metrics, samples)


def test_train_refuses_mixed_backends_and_missing_paths(
    snapshot_dir: Path,  # noqa: F811
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from forge_cli.main import main

    base = ["train", "--snapshot", str(snapshot_dir)]
    assert main([*base, "--model", str(tiny_model_dir), "--out", str(tmp_path / "a"), "x=1"]) == 2
    assert "for --backend verl" in capsys.readouterr().err
    assert main([*base, "--backend", "verl", "--out", str(tmp_path / "b")]) == 2
    assert "give --model and --out" in capsys.readouterr().err
    verl = [
        *base,
        "--backend",
        "verl",
        "--model",
        str(tiny_model_dir),
        "--out",
        str(tmp_path / "c"),
    ]
    assert main([*verl, "actor.optim.lrr=1"]) == 2
    assert "no key 'actor.optim.lrr'" in capsys.readouterr().err
    assert main([*verl, "--sft"]) == 2
    assert "embedded trainer's" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
