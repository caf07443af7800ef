"""veRL's own Ray trainer (``RayPPOTrainer``, ``RayWorkerGroup`` of ``ActorRolloutRefWorker``)
over a snapshot, on a local Ray cluster of CPUs, taking the embedded trainer's step."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rl import trainer
from tests.rl.conftest import snapshot_dir, tiny_model_dir  # noqa: F401
from tests.rl.test_verl_backend import _assert_same_step as _assert_same_fsdp_step
from tests.rl.test_verl_backend import _with_true_logprobs

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a Ray cluster, an actor process, an FSDP step: ~1 minute


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is not installed (make setup installs it)")
        pytest.skip(f"{module} is not installed")


def _ray_train(snap: Path, model: Path, ckpt: Path, *extra: str) -> dict[str, Any]:
    """``python -m rl.verl_backend.ray_run`` with veRL's Hydra overrides: its JSON line."""
    done = subprocess.run(
        [sys.executable, "-m", "rl.verl_backend.ray_run"]
        + [f"data.train_files={snap}", f"actor_rollout_ref.model.path={model}"]
        + [f"trainer.default_local_dir={ckpt}", "ray_kwargs.ray_init.num_cpus=2"]
        + ["actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.optim.weight_decay=0"]
        + list(extra),
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "CUDA_VISIBLE_DEVICES": "",
            "RAY_ADDRESS": "",  # a local cluster of this machine's CPUs
            "RAY_USAGE_STATS_ENABLED": "0",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-6000:])
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("{")]
    metrics: dict[str, Any] = json.loads(line)
    return metrics


def _assert_same_step(
    metrics: dict[str, Any], new_weights: Path, samples: list[Any], model: Path
) -> None:
    """As tests/rl/test_verl_backend.py checks the FSDP backend: loss, gradient, weights
    (veRL wrote them in its checkpoint)."""
    moved, apart = _assert_same_fsdp_step(new_weights, model, metrics, samples, "actor/grad_norm")
    print(
        f"ray {new_weights.name}: pg_loss {metrics['actor/pg_loss']:.8f}, grad_norm "
        f"{metrics['actor/grad_norm']:.8f}, logprobs apart "
        f"{metrics['training/rollout_probs_diff_max']:.2e}, moved {moved:.3e}, apart {apart:.3e}"
    )


@pytest.fixture
def own_logprobs(
    snapshot_dir: Path,  # noqa: F811
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> tuple[Path, list[Any]]:
    """A copy of the snapshot whose samples carry the tiny model's own logprobs."""
    for module in ("ray", "verl", "hydra", "cachetools"):
        _require(module)
    snap = tmp_path / "snap"
    return snap, _with_true_logprobs(snapshot_dir, tiny_model_dir, snap)


def test_two_ray_workers_take_the_same_step_as_one(
    own_logprobs: tuple[Path, list[Any]],
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    snap, samples = own_logprobs
    # Two ActorRolloutRefWorker actors in one RayWorkerGroup (FSDP over gloo), two rows
    # each: veRL's micro-batch must divide a rank's rows.
    two = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
    two += ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"]
    metrics = _ray_train(snap, tiny_model_dir, tmp_path / "ckpt", *two)
    assert metrics["device"] == "cpu" and metrics["processes"] == 2 and metrics["nodes"] == 1
    assert metrics["samples/count"] == len(samples) == 4
    # veRL recomputed the old logprobs in its actors; the snapshot's (the model's own) agree,
    # so the layouts agree token for token.
    assert metrics["training/rollout_probs_diff_max"] < 1e-4, metrics
    assert metrics["training/global_step"] == 1
    _assert_same_step(metrics, Path(metrics["weights"]), samples, tiny_model_dir)


# In this process, unlike the subprocess runs above, so warnings are warnings as they are for
# `forge train`: Ray's and veRL's own deprecation notices (ray.experimental's state API, the
# legacy RayPPOTrainer ray_run builds on, 'set_vital') are not errors of the run.
@pytest.mark.filterwarnings("default")
def test_forge_train_backend_verl_ray_writes_a_forge_checkpoint_of_the_same_step(
    own_logprobs: tuple[Path, list[Any]],
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from forge_cli.main import main

    snap, samples = own_logprobs
    for name, value in (("RAY_ADDRESS", ""), ("CUDA_VISIBLE_DEVICES", "")):
        monkeypatch.setenv(name, value)  # a local cluster of this machine's CPUs
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    out = tmp_path / "step-1"
    argv = ["train", "--backend", "verl-ray", "--snapshot", str(snap)]
    argv += ["--model", str(tiny_model_dir), "--out", str(out)]
    argv += [
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.optim.weight_decay=0",
    ]
    argv += ["ray_kwargs.ray_init.num_cpus=2"]
    assert main(argv) == 0
    (line,) = (out / "train_metrics.jsonl").read_text().splitlines()
    assert line in capsys.readouterr().out.splitlines()
    metrics = json.loads(line)
    assert metrics["backend"] == "verl-ray" and metrics["policy_version"] == 0
    assert metrics["samples/count"] == 4 and metrics["groups/zero_spread"] == 1
    meta = json.loads((out / "forge.json").read_text())
    assert meta["policy_version"] == trainer.read_policy_version(tiny_model_dir) + 1 == 1
    assert meta["backend"] == "verl-ray" and meta["mode"] == "grpo"
    assert (meta["device"], meta["processes"], meta["nodes"]) == ("cpu", 1, 1)
    assert meta["snapshot"] == str(snap.resolve())
    # veRL's own checkpoint beside the Forge one, its Hugging Face weights the same as OUT's.
    verl = tmp_path / "step-1-verl" / "global_step_1" / "actor"
    assert meta["verl_checkpoint"] == str(verl.resolve())
    assert "actor_rollout_ref.actor.optim.lr=1e-2" in meta["overrides"]
    assert (out / "tokenizer.json").is_file()
    _assert_same_step(metrics, out, samples, tiny_model_dir)
