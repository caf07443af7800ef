"""``rl/config/grpo.yaml`` plus ``KEY=VALUE`` overrides to veRL's config dataclasses."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

__all__ = ["ConfigError", "load", "actor_config"]

DEFAULT = Path(__file__).resolve().parents[1] / "config" / "grpo.yaml"
_DTYPES = {"fp32": "fp32", "bf16": "bf16", "float32": "fp32", "bfloat16": "bf16"}


class ConfigError(ValueError):
    """A configuration that cannot be used (the message names the key)."""


def load(path: Path | None, overrides: Sequence[str] = ()) -> DictConfig:
    """The YAML at ``path`` (``rl/config/grpo.yaml`` by default) with dotted overrides.

    An override must name a key the file has (a typo is an error, not a new key).
    """
    path = path or DEFAULT
    try:
        cfg = OmegaConf.load(path)
    except (OSError, OmegaConfBaseException) as e:
        raise ConfigError(f"--config {path}: {e}") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"--config {path}: not a mapping")
    OmegaConf.set_struct(cfg, True)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. actor.optim.lr=1e-5")
        try:
            OmegaConf.update(cfg, key, OmegaConf.from_dotlist([f"v={value}"]).v, merge=True)
        except OmegaConfBaseException:
            raise ConfigError(f"override {item!r}: {path} has no key {key!r}") from None
    if cfg.old_log_probs not in ("recompute", "sampling"):
        raise ConfigError(f"old_log_probs: {cfg.old_log_probs!r}; use recompute or sampling")
    if str(cfg.model.dtype) not in _DTYPES:
        raise ConfigError(f"model.dtype: {cfg.model.dtype!r}; use fp32 or bf16")
    return cfg


def actor_config(cfg: DictConfig, model_path: Path, n_samples: int, world_size: int) -> Any:
    """veRL's ``FSDPActorConfig`` (with its model config) for one pass over ``n_samples``."""
    from verl.workers.config import (
        FSDPActorConfig,
        FSDPEngineConfig,
        FSDPOptimizerConfig,
        HFModelConfig,
        PolicyLossConfig,
    )

    a = cfg.actor
    mini = int(a.ppo_mini_batch_size or n_samples)
    if mini % world_size or n_samples % world_size:
        raise ConfigError(
            f"{n_samples} samples and actor.ppo_mini_batch_size={mini} must both divide by "
            f"the {world_size} processes"
        )
    if n_samples % mini:
        raise ConfigError(f"actor.ppo_mini_batch_size={mini} must divide the {n_samples} samples")
    # veRL splits each process's rows into micro-batches of one size: the largest that
    # divides them, up to the one asked for (gradients accumulate, so the step is the same).
    per_rank = mini // world_size
    asked = int(a.ppo_micro_batch_size_per_gpu)
    micro = max(d for d in range(1, min(asked, per_rank) + 1) if per_rank % d == 0)
    dtype = _DTYPES[str(cfg.model.dtype)]
    try:
        model = HFModelConfig(
            path=str(model_path),
            load_tokenizer=False,
            use_remove_padding=False,  # veRL packs without padding only through flash-attn
            enable_gradient_checkpointing=False,
            override_config={"attn_implementation": str(cfg.model.attn_implementation)},
        )
        actor = FSDPActorConfig(
            strategy=str(a.strategy),
            rollout_n=1,
            ppo_mini_batch_size=mini,
            ppo_micro_batch_size_per_gpu=micro,
            use_dynamic_bsz=False,
            ppo_epochs=int(a.ppo_epochs),
            shuffle=bool(a.shuffle),
            clip_ratio=float(a.clip_ratio),
            # veRL annotates float, but its policy losses read None as clip_ratio.
            clip_ratio_low=cast(
                float, None if a.clip_ratio_low is None else float(a.clip_ratio_low)
            ),
            clip_ratio_high=cast(
                float, None if a.clip_ratio_high is None else float(a.clip_ratio_high)
            ),
            loss_agg_mode=str(a.loss_agg_mode),
            entropy_coeff=float(a.entropy_coeff),
            use_kl_loss=bool(a.use_kl_loss),
            kl_loss_coef=float(a.kl_loss_coef),
            kl_loss_type=str(a.kl_loss_type),
            use_torch_compile=False,
            data_loader_seed=int(cfg.seed),
            policy_loss=PolicyLossConfig(loss_mode=str(a.policy_loss.loss_mode)),
            optim=FSDPOptimizerConfig(
                lr=float(a.optim.lr),
                weight_decay=float(a.optim.weight_decay),
                clip_grad=float(a.optim.clip_grad),
                total_training_steps=int(a.ppo_epochs) * -(-n_samples // mini),
            ),
            fsdp_config=FSDPEngineConfig(
                strategy=str(a.strategy),
                model_dtype=dtype,
                mixed_precision={
                    "param_dtype": dtype,
                    "reduce_dtype": "fp32",
                    "buffer_dtype": "fp32",
                },
                use_torch_compile=False,
                param_offload=False,
                optimizer_offload=False,
            ),
        )
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"veRL refused the actor config: {e}") from None
    actor.model_config = model
    engine = actor.engine
    engine.use_dynamic_bsz = False
    engine.micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu
    engine.infer_micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu
    engine.max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu
    engine.infer_max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu
    return actor
