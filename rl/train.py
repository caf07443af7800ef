"""Train a policy on a snapshot (or, for SFT, on recorded chats) into a new checkpoint.

The library call behind ``forge train``, ``forge loop``'s train phase and ``make demo-rl``:
one pass of the embedded trainer (``train``), of veRL's FSDP engine (``train_verl``), or of
veRL's own ``RayPPOTrainer`` on a Ray cluster (``train_verl_ray``).
The checkpoint is a Hugging Face model folder whose ``forge.json`` records the policy
version (the input's + 1); its metrics, one JSON line per optimizer step, go to the
caller's ``on_metrics`` and to ``OUT/train_metrics.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitm_addon.launch.errors import ForgeError
from rl import losses, trainer
from rl.batches import BatchError, read_group_stats, read_images, read_samples

__all__ = [
    "TrainError",
    "TrainJob",
    "settings_from",
    "train",
    "train_verl",
    "train_verl_ray",
]

log = logging.getLogger(__name__)

OnMetrics = Callable[[str], None]
"""Called with each optimizer step's metrics, as one JSON line."""


class TrainError(ForgeError):
    """A training job that cannot run (bad settings, no samples, an existing output)."""


@dataclass(frozen=True)
class TrainJob:
    """One pass of the embedded trainer."""

    model: Path
    """The policy to start from: a Hugging Face model folder."""
    out: Path
    """The new checkpoint's folder; must not exist (checkpoints are never overwritten)."""
    snapshot: Path | None = None
    """The snapshot whose samples are trained (GRPO/PPO, or SFT on its completions)."""
    chats: Path | None = None
    """SFT only: chats written by ``forge export sft``, tokenized with the model's template."""
    settings: trainer.TrainSettings = field(default_factory=trainer.TrainSettings)
    keep_optimizer: bool = False
    """Save the AdamW state in the checkpoint, and continue ``model``'s saved state."""
    progress: bool = True
    """A progress bar on standard error."""


# Names ``settings_from`` takes besides TrainSettings' and LossSettings' own fields.
_JOB_OPTIONS = ("keep_optimizer",)


def settings_from(options: Mapping[str, Any]) -> tuple[trainer.TrainSettings, bool]:
    """(TrainSettings, keep_optimizer) from a flat mapping of setting names, as ``forge
    loop``'s ``train:`` section gives them: the fields of TrainSettings and of LossSettings
    (``lr``, ``sft``, ``loss_mode``, ``clip_ratio_high``, ...) and ``keep_optimizer``."""
    train_fields = {f.name for f in dataclasses.fields(trainer.TrainSettings)} - {"loss"}
    loss_fields = {f.name for f in dataclasses.fields(losses.LossSettings)}
    unknown = sorted(set(options) - train_fields - loss_fields - set(_JOB_OPTIONS))
    if unknown:
        known = sorted(train_fields | loss_fields | set(_JOB_OPTIONS))
        raise TrainError(f"unknown training setting(s) {', '.join(unknown)}; known: {known}")
    hints = {
        **typing.get_type_hints(losses.LossSettings),
        **typing.get_type_hints(trainer.TrainSettings),
        "keep_optimizer": bool,
    }
    values = {k: _coerce(k, v, hints[k]) for k, v in options.items()}
    try:
        loss = losses.LossSettings(**{k: v for k, v in values.items() if k in loss_fields})
        settings = trainer.TrainSettings(
            loss=loss, **{k: v for k, v in values.items() if k in train_fields}
        )
    except (TypeError, ValueError) as e:
        raise TrainError(str(e)) from None
    return settings, bool(values.get("keep_optimizer", False))


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """``value`` as the setting's type: a float setting takes an int, or a string that
    reads as a number (YAML 1.1 reads ``1e-3`` as a string); anything else must match."""
    kinds = typing.get_args(hint) or (hint,)
    if value is None and type(None) in kinds:
        return None
    if float in kinds and not isinstance(value, bool):
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif any(isinstance(value, k) and not (k is int and isinstance(value, bool)) for k in kinds):
        return value
    wanted = " or ".join(getattr(k, "__name__", str(k)) for k in kinds)
    raise TrainError(f"{name} must be {wanted}, got {value!r}")


def train(job: TrainJob, on_metrics: OnMetrics | None = None) -> Path:
    """Train ``job`` with the embedded trainer; returns the checkpoint written."""
    settings = job.settings
    if job.out.exists():
        raise TrainError(f"--out {job.out} exists: checkpoints are never overwritten")
    if (job.snapshot is None) == (job.chats is None):
        raise TrainError("train a snapshot or (SFT only) chats: give exactly one")
    if job.chats is not None and not settings.sft:
        raise TrainError("--chats holds text, without sampling logprobs: it trains --sft only")
    try:
        if job.chats is not None:
            from rl.sft_data import read_chat_samples

            samples = read_chat_samples(job.chats, job.model)
        else:
            assert job.snapshot is not None
            samples = read_samples(job.snapshot)
    except (BatchError, ValueError, FileNotFoundError) as e:
        raise TrainError(str(e)) from None
    if not samples:
        raise TrainError(
            f"{job.chats} holds no assistant turns"
            if job.chats is not None
            else _no_samples(job.snapshot)
        )
    try:
        model = trainer.load_policy(job.model)
        use_ref = settings.loss.kl_coef > 0 and not settings.sft
        ref = trainer.load_policy(job.model) if use_ref else None
    except (OSError, ValueError) as e:
        raise TrainError(f"--model {job.model}: {e}") from None
    images = None
    if trainer.is_vision(model):
        if job.snapshot is None:
            raise TrainError(
                f"--model {job.model} is a vision-language model: train it on a snapshot "
                "(its samples name their images); --chats holds text only"
            )
        from rl.vision_inputs import Pixels, SampleImages, vision_tokens_of

        images = SampleImages(
            Pixels(job.model), read_images(job.snapshot), vision_tokens_of(model.config)
        )
    version = trainer.read_policy_version(job.model)
    lines: list[str] = []

    def emit(metrics: dict[str, float]) -> None:
        line = json.dumps({"policy_version": version, **metrics}, sort_keys=True)
        lines.append(line)
        if on_metrics is not None:
            on_metrics(line)

    started = time.monotonic()
    try:
        optimizer = trainer.make_optimizer(
            model, settings, job.model if job.keep_optimizer else None
        )
        trainer.train(
            model,
            samples,
            settings,
            ref,
            on_step=emit,
            progress=job.progress,
            snapshot_stats=read_group_stats(job.snapshot) if job.snapshot else None,
            optimizer=optimizer,
            images=images,
        )
    except (BatchError, ValueError, FloatingPointError) as e:
        raise TrainError(str(e)) from None
    info: dict[str, Any] = {
        "mode": "sft" if settings.sft else "grpo",
        "settings": settings.describe(),
        "samples": len(samples),
        "seconds": round(time.monotonic() - started, 3),
    }
    if job.keep_optimizer:
        info["optimizer_continued"] = (job.model / trainer.OPTIMIZER_FILE).is_file()
    source = job.snapshot if job.snapshot is not None else job.chats
    assert source is not None
    kept = optimizer if job.keep_optimizer else None
    return _save(model, job.out, version, job.model, source, info, lines, kept)


def _checked_samples(snapshot: Path, model: Path, out: Path) -> list[Any]:
    """The snapshot's samples, once ``out`` is new and ``model`` a model folder (the veRL
    backends' checks before a step)."""
    if out.exists():
        raise TrainError(f"--out {out} exists: checkpoints are never overwritten")
    if not (model / "config.json").is_file():
        raise TrainError(f"--model {model} is not a Hugging Face model folder (no config.json)")
    from rl.tiny_vl_model import is_vision_model

    if is_vision_model(model):
        raise TrainError(
            f"--model {model} is a vision-language model: Forge's veRL backends train text "
            "models only; train it with the embedded trainer (--backend embedded)"
        )
    try:
        samples = read_samples(snapshot)
    except (BatchError, FileNotFoundError) as e:
        raise TrainError(str(e)) from None
    if not samples:
        raise TrainError(_no_samples(snapshot))
    return samples


def train_verl(
    snapshot: Path,
    model: Path | None,
    out: Path | None,
    config: Path | None = None,
    overrides: Sequence[str] = (),
    on_metrics: OnMetrics | None = None,
) -> Path | None:
    """One GRPO pass of veRL's training engine over ``snapshot``, configured by a YAML file
    (default ``rl/config/grpo.yaml``) and ``KEY=VALUE`` overrides; ``model`` and ``out``
    default to ``model.path`` and ``out`` there. Rank 0 writes the checkpoint and returns
    it; other ranks (under torchrun) return None."""
    from omegaconf import OmegaConf

    from rl.verl_backend import config as vconfig

    try:
        cfg = vconfig.load(config, list(overrides))
    except vconfig.ConfigError as e:
        raise TrainError(str(e)) from None
    model = model or (Path(cfg.model.path) if cfg.model.path else None)
    out = out or (Path(cfg.out) if cfg.out else None)
    if model is None or out is None:
        raise TrainError("give --model and --out (or model.path=... and out=...)")
    samples = _checked_samples(snapshot, model, out)

    import torch.distributed as dist

    from rl.verl_backend import run as vrun

    version = trainer.read_policy_version(model)
    started = time.monotonic()
    try:  # the process group vrun.train joins is left on every way out
        try:
            result = vrun.train(samples, model, cfg, log=log.info)
        except (vconfig.ConfigError, BatchError) as e:
            raise TrainError(str(e)) from None
        if result.state_dict is None:
            return None  # not rank 0: rank 0 writes the checkpoint
        metrics = {
            "policy_version": version,
            "backend": "verl",
            "samples/count": len(samples),
            **result.metrics,
            **read_group_stats(snapshot),
        }
        line = json.dumps(metrics, sort_keys=True)
        if on_metrics is not None:
            on_metrics(line)
        policy = trainer.load_policy(model)
        policy.load_state_dict(result.state_dict)
        info = {
            "mode": "grpo",
            "backend": "verl",
            "processes": result.world_size,
            "device": result.device,
            "config": OmegaConf.to_container(cfg, resolve=True),
            "samples": len(samples),
            "seconds": round(time.monotonic() - started, 3),
        }
        return _save(policy, out, version, model, snapshot, info, [line])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def train_verl_ray(
    snapshot: Path,
    model: Path,
    out: Path,
    overrides: Sequence[str] = (),
    on_metrics: OnMetrics | None = None,
) -> Path:
    """One GRPO pass of veRL's ``RayPPOTrainer`` over ``snapshot`` on a Ray cluster
    (``RAY_ADDRESS``, or a local one started for the run and shut down after it);
    ``overrides`` are veRL's own Hydra overrides of its ``ppo_trainer.yaml``. veRL writes
    its checkpoint beside ``out`` (``OUT-verl``, ``trainer.default_local_dir``); its
    Hugging Face weights become the Forge checkpoint ``out``. On several nodes both folders
    must be on a path the driver shares with the workers."""
    samples = _checked_samples(snapshot, model, out)

    import ray
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from rl.verl_backend import ray_run

    verl_dir = out.parent / f"{out.name}-verl"
    # Absolute paths: the Ray workers that read and write them need not share our cwd.
    verl_overrides = [
        f"data.train_files={snapshot.resolve()}",
        f"actor_rollout_ref.model.path={model.resolve()}",
        f"trainer.default_local_dir={verl_dir.resolve()}",
        *overrides,
    ]
    try:  # bad overrides are refused here, before a cluster is joined or started
        asked = ray_run.compose(verl_overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise TrainError(f"veRL override: {e}") from None
    if Path(str(asked.trainer.default_local_dir)).exists():
        raise TrainError(
            f"trainer.default_local_dir {asked.trainer.default_local_dir} exists: veRL's "
            "checkpoints are never overwritten; pick a new --out (or remove that folder)"
        )

    version = trainer.read_policy_version(model)
    started = time.monotonic()
    ours = not ray.is_initialized()  # ray_run starts (or joins) Ray unless it already runs
    try:
        result = ray_run.train(samples, verl_overrides, log_line=log.info)
    finally:
        if ours and ray.is_initialized():
            # The worker group's placement groups and the runtime env (the CPU setup hook)
            # belong to this run; a later call in this process starts afresh.
            ray.shutdown()
    metrics = {
        "policy_version": version,
        "backend": "verl-ray",
        "samples/count": len(samples),
        **result.metrics,
        **read_group_stats(snapshot),
    }
    line = json.dumps(metrics, sort_keys=True)
    if on_metrics is not None:
        on_metrics(line)
    try:
        policy = trainer.load_policy(result.weights)
    except (OSError, ValueError) as e:
        raise TrainError(f"veRL's checkpoint {result.weights}: {e}") from None
    info = {
        "mode": "grpo",
        "backend": "verl-ray",
        "processes": result.processes,
        "nodes": result.nodes,
        "device": result.device,
        "overrides": verl_overrides,  # Forge's paths, then the caller's
        "verl_checkpoint": str(result.checkpoint),
        "samples": len(samples),
        "seconds": round(time.monotonic() - started, 3),
    }
    return _save(policy, out, version, model, snapshot, info, [line])


def _save(
    policy: Any,
    out: Path,
    version: int,
    parent: Path,
    source: Path,
    info: dict[str, Any],
    lines: list[str],
    optimizer: Any = None,
) -> Path:
    """Write the checkpoint (policy version + 1) and its metrics."""
    info = {
        "parent_policy_version": version,
        "parent_model": str(parent.resolve()),
        "snapshot": str(source.resolve()),
        **info,
    }
    try:
        written = trainer.save_checkpoint(policy, out, version + 1, parent, info, optimizer)
    except FileExistsError as e:
        raise TrainError(str(e)) from None
    (written / "train_metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    log.info("checkpoint written to %s (policy version %d)", written, version + 1)
    return Path(written)


def _no_samples(snapshot: Path | None) -> str:
    assert snapshot is not None
    dropped = ", ".join(
        f"{int(n)} {key.removeprefix('rollouts/dropped/')}"
        for key, n in sorted(read_group_stats(snapshot).items())
        if key.startswith("rollouts/dropped/")
    )
    return (
        f"{snapshot} holds no samples (no served calls with token ids in included "
        "GRPO groups); nothing to train"
        + (
            f". Rollouts the GRPO rules dropped: {dropped}; more rollouts per task, or "
            "forge snapshot --grpo zero_spread=keep (or partial=zero), keep them"
            if dropped
            else ""
        )
    )
