"""Policy, KL and SFT losses of a micro-batch, with veRL's own maths.

The policy loss, the KL estimate and the aggregation are veRL's
(``verl.trainer.ppo.core_algos``: ``get_policy_loss_fn``, ``kl_penalty``, ``agg_loss``),
composed as veRL's ``ppo_loss`` composes them, so the embedded trainer and the veRL
backend share one definition. Each micro-batch is normalised by the counts of its whole
mini-batch (veRL's ``global_batch_info``): the gradients of k micro-batches then add up
to the gradient of one step on the full batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch

# veRL 0.9.1's aggregation modes (ActorConfig validates the same list).
LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


@dataclass(frozen=True)
class LossSettings:
    """The loss of one PPO/GRPO update, in veRL's names."""

    loss_mode: str = "vanilla"
    """veRL policy loss (``actor.policy_loss.loss_mode``): vanilla (PPO-clip, Schulman 2017),
    gspo (sequence-level ratio, Zheng et al. 2025), cispo, gpg, clip_cov, kl_cov, ..."""
    loss_agg_mode: str = "token-mean"
    """How token losses become a scalar; token-mean as in DAPO (Yu et al. 2025)."""
    clip_ratio: float = 0.2
    """PPO's epsilon."""
    clip_ratio_low: float | None = None
    """Lower epsilon (None: clip_ratio)."""
    clip_ratio_high: float | None = None
    """Upper epsilon; DAPO's clip-higher raises it to 0.28 (None: clip_ratio)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (Ye et al. 2019)."""
    kl_coef: float = 0.0
    """Weight of the KL loss to the reference policy; 0 turns it off (as Dr. GRPO and DAPO)."""
    kl_type: str = "low_var_kl"
    """veRL's KL estimator (k1, k2, k3/low_var_kl, abs, ... and '+' straight-through forms)."""
    loss_scale_factor: int | None = None
    """Constant divisor for seq-mean-token-sum-norm (Dr. GRPO); required in that mode, since
    veRL's default (the padded length) changes with each micro-batch's padding."""

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"loss_agg_mode {self.loss_agg_mode!r} is not one of veRL's: {list(LOSS_AGG_MODES)}"
            )
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.loss_scale_factor is None:
            raise ValueError(
                "seq-mean-token-sum-norm needs loss_scale_factor (e.g. the maximum response "
                "length): veRL's default divides by the padded length, which varies by batch"
            )
        policy_loss_fn(self.loss_mode)  # fails early, listing the valid names


def policy_loss_fn(name: str) -> Any:
    """veRL's registered policy loss ``name`` (ValueError lists the valid names)."""
    from verl.trainer.ppo import core_algos

    return core_algos.get_policy_loss_fn(name)


def actor_config(settings: LossSettings) -> Any:
    """A veRL ``ActorConfig`` carrying ``settings`` (the policy losses read it)."""
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=settings.clip_ratio,
        clip_ratio_low=(
            settings.clip_ratio if settings.clip_ratio_low is None else settings.clip_ratio_low
        ),
        clip_ratio_high=(
            settings.clip_ratio if settings.clip_ratio_high is None else settings.clip_ratio_high
        ),
        clip_ratio_c=settings.clip_ratio_c,
        loss_agg_mode=settings.loss_agg_mode,
        loss_scale_factor=settings.loss_scale_factor,
        policy_loss=PolicyLossConfig(loss_mode=settings.loss_mode),
        use_kl_loss=settings.kl_coef > 0,
        kl_loss_coef=settings.kl_coef,
        kl_loss_type=settings.kl_type,
        use_torch_compile=False,
    )


def global_batch_info(loss_mask: torch.Tensor, settings: LossSettings) -> dict[str, Any]:
    """veRL's normalisers for a whole mini-batch: its trained tokens and sequences.

    loss_mask: (B, T) of the whole mini-batch (or the summed counts of its micro-batches).
    """
    return {
        "dp_size": 1,
        "batch_num_tokens": int(loss_mask.sum().item()),
        "global_batch_size": int((loss_mask.sum(dim=-1) > 0).sum().item()),
        "loss_scale_factor": settings.loss_scale_factor,
    }


def ppo_loss(
    config: Any,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss (+ KL loss) of one micro-batch, as veRL's ``ppo_loss`` composes them.

    All tensors (B, T); ``config``: ``actor_config(...)`` with ``global_batch_info`` set to
    the mini-batch's counts. Returns the loss to back-propagate and metrics.
    """
    from verl.trainer.ppo import core_algos

    mask = loss_mask.to(torch.bool)
    fn = core_algos.get_policy_loss_fn(config.policy_loss.loss_mode)
    pg_loss, pg_metrics = fn(
        old_log_prob=old_logprobs,
        log_prob=logprobs,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=None,
    )
    metrics = {
        "loss/pg": float(pg_loss.detach()),
        "loss/clipfrac": float(pg_metrics.get("actor/pg_clipfrac", 0.0)),
        "loss/clipfrac_lower": float(pg_metrics.get("actor/pg_clipfrac_lower", 0.0)),
        "loss/ppo_kl": float(pg_metrics.get("actor/ppo_kl", 0.0)),
    }
    loss = pg_loss
    if config.use_kl_loss:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs reference logprobs (a reference model)")
        # veRL annotates FloatTensor; any floating Tensor works.
        kld = core_algos.kl_penalty(
            logprob=cast("torch.FloatTensor", logprobs),
            ref_logprob=cast("torch.FloatTensor", ref_logprobs),
            kl_penalty=config.kl_loss_type,
        )
        kl_loss = core_algos.agg_loss(
            loss_mat=kld,
            loss_mask=mask,
            loss_agg_mode=config.loss_agg_mode,
            **config.global_batch_info,
        )
        loss = loss + kl_loss * config.kl_loss_coef
        metrics["loss/kl"] = float(kl_loss.detach())
    metrics["loss/total"] = float(loss.detach())
    return loss, metrics


def sft_loss(
    logprobs: torch.Tensor, loss_mask: torch.Tensor, batch_num_tokens: int
) -> torch.Tensor:
    """Cross-entropy on the trained tokens, normalised by the mini-batch's trained tokens
    (veRL's ``sft_loss`` with dp_size 1). logprobs, loss_mask: (B, T)."""
    from verl.utils.torch_functional import masked_sum

    return -masked_sum(logprobs, loss_mask.to(torch.bool)) / batch_num_tokens
