"""Embedded GRPO/PPO trainer: one process, torch on CPU or one GPU, veRL's loss maths.

``train(model, samples, settings)`` runs optimizer steps over a snapshot's samples:
each step takes a mini-batch (``mini_batch_size`` samples; all of them by default, one
on-policy update per GRPO pass), splits it into micro-batches (gradient accumulation),
normalises every micro-batch by the whole mini-batch's counts (veRL's
``global_batch_info``) and steps once. The loss comes from ``rl.losses`` (veRL's
``core_algos``); ``sft=True`` trains cross-entropy on the completion tokens instead.
Checkpoints are Hugging Face model folders with ``forge.json`` giving the policy version.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pipeline.atomic import atomic_directory, fsync_file
from rl import losses
from rl.batches import (
    Batch,
    Sample,
    collate,
    crop_to_reach,
    group_stats,
    split_micro_batches,
)
from rl.window import attention_reach

if TYPE_CHECKING:
    from rl.vision_inputs import SampleImages

logger = logging.getLogger(__name__)

FORGE_JSON = "forge.json"
OPTIMIZER_FILE = "optimizer.pt"  # the AdamW state, with --keep-optimizer
# Files of a model folder that belong to its weights (rewritten by save_pretrained);
# everything else (tokenizer, chat template, generation config) is copied to a checkpoint.
# Metrics that are already normalised by the mini-batch (they add over micro-batches).
_SUMMED = frozenset({"loss/pg", "loss/kl", "loss/total", "loss/sft"})
_WEIGHT_FILES = (
    "config.json",
    FORGE_JSON,
    OPTIMIZER_FILE,
    "model.safetensors",
    "model.safetensors.index.json",
)


@dataclass(frozen=True)
class TrainSettings:
    """One training pass over a snapshot."""

    loss: losses.LossSettings = field(default_factory=losses.LossSettings)
    """Policy loss, aggregation, clipping and KL, in veRL's names."""
    sft: bool = False
    """Cross-entropy on the completion tokens instead of the policy loss (advantages unused)."""
    lr: float = 1e-6
    """AdamW learning rate (veRL's actor default)."""
    weight_decay: float = 0.01
    """AdamW weight decay (veRL's actor default)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this before each step (veRL's default)."""
    micro_batch_size: int = 4
    """Samples per forward/backward; gradients accumulate over a mini-batch's micro-batches."""
    max_tokens: int | None = None
    """Padded tokens per micro-batch at most (None: no bound); a longer sample is an error."""
    mini_batch_size: int | None = None
    """Samples per optimizer step (None: all of them, one step per epoch)."""
    epochs: int = 1
    """Passes over the samples (veRL's ppo_epochs)."""
    recompute_old_logprobs: bool = False
    """Use the current weights' logprobs as the old ones for every sample (as veRL does);
    otherwise only samples recorded without logprobs get them recomputed."""
    seed: int = 0
    """Seeds torch before training (dropout, if the model has any)."""

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1:
            raise ValueError("micro_batch_size must be at least 1")
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ValueError("mini_batch_size must be at least 1")
        if self.epochs < 1:
            raise ValueError("epochs must be at least 1")

    def describe(self) -> dict[str, Any]:
        return asdict(self)


# Causal LMs whose logits are just the output projection of the decoder's last hidden
# state (no scaling or soft-capping): their head can run on the trained rows alone.
_PLAIN_HEAD = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"})


# A micro-batch whose rows all begin with at least this many identical tokens (a
# harness's system prompt and tools, a GRPO group's shared prompt) runs that prefix once.
SHARED_PREFIX_MIN_TOKENS = 512


def shared_prefix_length(batch: Batch) -> int:
    """Tokens every row of ``batch`` begins with, unpadded, up to the position before the
    first trained token of any row (that position's hidden state is needed per row)."""
    ids, attention = batch.input_ids, batch.attention_mask
    same = (ids == ids[:1]).all(dim=0) & (attention > 0).all(dim=0)  # (T,)
    lead = int(torch.cumprod(same.to(torch.int64), dim=0).sum())
    trained = (batch.loss_mask[:, 1:] > 0).any(dim=0)  # (T-1,): position j predicts j+1
    first = int(torch.nonzero(trained)[0]) if bool(trained.any()) else ids.shape[1] - 1
    return min(lead, first)


def _hidden_after_shared_prefix(model: torch.nn.Module, batch: Batch, n: int) -> torch.Tensor:
    """(B, T-n, H): the decoder's last hidden states after the first ``n`` tokens, which
    every row shares, computed once for the batch and attended to by each row (its keys
    and values repeated over the rows; their gradients add up through the repeat). Equal
    to the full forward pass up to float rounding, and its attention costs rows x suffix x
    length instead of rows x length^2: Codex's 7.7k-token prompt is such a prefix."""
    from transformers import DynamicCache

    decoder = model.get_decoder()  # type: ignore[operator]
    cache = DynamicCache(config=model.config)  # type: ignore[arg-type]
    decoder(
        input_ids=batch.input_ids[:1, :n],
        attention_mask=batch.attention_mask[:1, :n],
        past_key_values=cache,
        use_cache=True,
    )
    cache.batch_repeat_interleave(batch.input_ids.shape[0])
    hidden: torch.Tensor = decoder(
        input_ids=batch.input_ids[:, n:],
        attention_mask=batch.attention_mask,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    return hidden


def token_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """(B, T) logprob of each trained token given the ones before it; 0 elsewhere.

    Only positions whose next token is in the loss mask get logits: an agent's sample is
    mostly prompt and tool output, and Qwen3's 152k-word head over every position was most
    of a step's time and memory. For the plain-head models of ``_PLAIN_HEAD`` the head runs
    on exactly those rows; for others, on the positions trained in any sample of the batch
    (the model's own ``logits_to_keep``, so its own logit processing applies). A prefix
    every row shares (``shared_prefix_length``, at least ``SHARED_PREFIX_MIN_TOKENS``) runs
    once for a plain-head model.
    """
    b, t = batch.input_ids.shape
    trained = batch.loss_mask[:, 1:] > 0  # (B, T-1): position j predicts token j+1
    out = torch.zeros(b, t, dtype=torch.float32, device=batch.input_ids.device)
    if not bool(trained.any()):
        return out
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) in _PLAIN_HEAD:
        n = shared_prefix_length(batch)
        if b > 1 and n >= SHARED_PREFIX_MIN_TOKENS:
            hidden = _hidden_after_shared_prefix(model, batch, n)  # (B, T-n, H)
            rows = hidden[:, :-1][trained[:, n:]]
        else:
            # torch types a Module's unknown attributes as Tensor | Module; these are HF's.
            hidden = model.get_decoder()(  # type: ignore[operator]
                input_ids=batch.input_ids, attention_mask=batch.attention_mask
            ).last_hidden_state  # (B, T, H)
            rows = hidden[:, :-1][trained]
        logits = model.get_output_embeddings()(rows)  # type: ignore[operator]  # (N, V)
        labels = batch.input_ids[:, 1:][trained]  # (N,)
        lp = -F.cross_entropy(logits.float(), labels, reduction="none")
        out[:, 1:][trained] = lp
        return out
    keep = torch.nonzero(trained.any(dim=0)).squeeze(1)  # (K,)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        logits_to_keep=keep,
        **(batch.vision or {}),  # a vision model's pixel inputs for the rows' images
    ).logits  # (B, K, V)
    k, v = keep.numel(), logits.shape[-1]
    labels = batch.input_ids[:, keep + 1]  # (B, K)
    # Rows of (B*K, V), the vocabulary contiguous: cross-entropy over a transposed
    # (B, V, K) made the whole step 2.3x slower on CPU (bench/bench_train.py).
    lp = -F.cross_entropy(logits.float().reshape(b * k, v), labels.reshape(-1), reduction="none")
    out[:, keep + 1] = lp.view(b, k)
    return out * batch.loss_mask


def with_old_logprobs(model: torch.nn.Module, batch: Batch, recompute_all: bool) -> Batch:
    """``batch`` with old logprobs from the current weights where unknown (or everywhere)."""
    todo = torch.ones_like(batch.old_logprobs_known) if recompute_all else ~batch.old_logprobs_known
    if not bool(todo.any()):
        return batch
    with torch.no_grad():
        fresh = token_logprobs(model, batch) * batch.loss_mask
    old = torch.where(todo[:, None], fresh, batch.old_logprobs)
    return replace(batch, old_logprobs=old, old_logprobs_known=torch.ones_like(todo))


def check_vocabulary(samples: Sequence[Sample], vocab_size: int) -> None:
    """Refuse token ids the model cannot embed (a snapshot from another tokenizer)."""
    for s in samples:
        top = max(s.input_ids)
        if top >= vocab_size or min(s.input_ids) < 0:
            raise ValueError(
                f"sample {s.sample_id} holds token id {top}, outside the model's vocabulary "
                f"of {vocab_size}: train the model whose tokenizer recorded the snapshot"
            )


def mini_batches(samples: Sequence[Sample], size: int | None) -> list[list[Sample]]:
    """Consecutive mini-batches of ``size`` samples (None: one of all of them)."""
    if size is None:
        return [list(samples)]
    return [list(samples[i : i + size]) for i in range(0, len(samples), size)]


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[Batch],
    settings: TrainSettings,
    ref_model: torch.nn.Module | None = None,
) -> dict[str, float]:
    """One optimizer step over the micro-batches of a mini-batch; returns its metrics."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    tokens = sum(b.n_loss_tokens for b in batches)
    if tokens == 0:
        raise ValueError("this mini-batch has no trained tokens (every loss mask is 0)")
    config = None if settings.sft else losses.actor_config(settings.loss)
    if config is not None:
        mask = torch.cat([b.loss_mask.sum(dim=-1) for b in batches])  # (B_total,)
        config.global_batch_info.update(losses.global_batch_info(mask[:, None], settings.loss))
    totals: dict[str, float] = {}
    for batch in batches:
        logprobs = token_logprobs(model, batch)
        if config is None:
            loss = losses.sft_loss(logprobs, batch.loss_mask, tokens)
            metrics = {"loss/sft": float(loss.detach())}
        else:
            ref = None
            if config.use_kl_loss:
                if ref_model is None:
                    raise ValueError("kl_coef > 0 needs a reference model")
                with torch.no_grad():
                    ref = token_logprobs(ref_model, batch)
            loss, metrics = losses.ppo_loss(
                config, logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask, ref
            )
        loss.backward()
        share = batch.n_loss_tokens / tokens
        for k, v in metrics.items():
            # Losses are normalised by the whole mini-batch: they add up. Means over one
            # micro-batch (clip fractions, ppo_kl) are weighted by its share of tokens.
            totals[k] = totals.get(k, 0.0) + (v if k in _SUMMED else v * share)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    if not math.isfinite(float(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"gradient norm {float(grad_norm)}: step skipped")
    optimizer.step()
    totals["grad/norm"] = float(grad_norm)
    totals["batch/tokens"] = float(tokens)
    totals["batch/samples"] = float(sum(len(b) for b in batches))
    return totals


def train(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    settings: TrainSettings,
    ref_model: torch.nn.Module | None = None,
    on_step: Callable[[dict[str, float]], None] | None = None,
    progress: bool = False,
    snapshot_stats: dict[str, float] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    images: SampleImages | None = None,
) -> list[dict[str, float]]:
    """Optimizer steps over ``samples``: ``epochs`` x mini-batches, with ``optimizer``
    (default: a fresh ``make_optimizer``). Returns each step's
    metrics (also passed to ``on_step``), each with ``step`` and the sample statistics
    (``snapshot_stats``, e.g. ``read_group_stats``, add to and override them)."""
    if not samples:
        raise ValueError("no samples to train on")
    # An HF model: torch types a Module's unknown attributes as Tensor | Module.
    text_config = model.config.get_text_config()  # type: ignore[union-attr, operator]
    check_vocabulary(samples, int(text_config.vocab_size))
    if images is None and any(s.images for s in samples) and is_vision(model):
        raise ValueError("these samples show images: train them with the snapshot's images")
    reach = attention_reach(text_config)
    if reach is not None:
        # A sliding-window model: tokens no trained logit can see are not run at all
        # (Codex's 7.7k-token prompt becomes the last few hundred tokens before a reply).
        samples = [crop_to_reach(s, reach) for s in samples]
    torch.manual_seed(settings.seed)
    pad_id = int(getattr(text_config, "pad_token_id", None) or 0)
    if optimizer is None:
        optimizer = make_optimizer(model, settings)
    plan = [
        [
            collate(chunk, pad_id, images)
            for chunk in split_micro_batches(mb, settings.micro_batch_size, settings.max_tokens)
        ]
        for _ in range(settings.epochs)
        for mb in mini_batches(samples, settings.mini_batch_size)
    ]
    if not settings.sft:
        # Old logprobs come from the weights before any update (veRL computes them once
        # per batch, before its PPO epochs).
        model.eval()
        plan = [
            [with_old_logprobs(model, b, settings.recompute_old_logprobs) for b in step]
            for step in plan
        ]
    stats = group_stats(samples)
    if snapshot_stats:
        # Zero-spread groups dropped by the pipeline plus any kept with all advantages 0.
        kept_zero = stats["groups/zero_spread"]
        stats.update(snapshot_stats)
        stats["groups/zero_spread"] = snapshot_stats.get("groups/zero_spread", 0.0) + kept_zero
    history = []
    bar = _progress(len(plan), progress)
    try:
        for i, step in enumerate(plan):
            result = train_step(model, optimizer, step, settings, ref_model)
            metrics = {"step": float(i + 1), **stats, **result}
            history.append(metrics)
            if on_step is not None:
                on_step(metrics)
            if bar is not None:
                bar.update(1)
                key = "loss/sft" if settings.sft else "loss/pg"
                bar.set_postfix({key: f"{metrics.get(key, float('nan')):.4f}"})
    finally:
        if bar is not None:
            bar.close()
    model.eval()
    return history


def make_optimizer(
    model: torch.nn.Module, settings: TrainSettings, state_from: Path | None = None
) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, continuing the state saved in ``state_from``
    (a checkpoint folder's ``optimizer.pt``) when there is one.

    A fresh AdamW's first step moves every parameter with a gradient by about the learning
    rate, whatever the gradient's size (its moments start at zero): one-step rounds of
    ``forge loop`` with a fresh optimizer each take that step every round. The saved
    state's learning rate and weight decay are replaced by ``settings``'.
    """
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=settings.lr,
        weight_decay=settings.weight_decay,
    )
    path = None if state_from is None else Path(state_from) / OPTIMIZER_FILE
    if path is not None and path.is_file():
        try:
            optimizer.load_state_dict(torch.load(path, weights_only=True))
        except (ValueError, KeyError, RuntimeError) as e:
            raise ValueError(f"{path} does not fit this model's parameters: {e}") from None
        for group in optimizer.param_groups:
            group["lr"], group["weight_decay"] = settings.lr, settings.weight_decay
    return optimizer


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="train", unit="step", dynamic_ncols=True)


# --- Checkpoints ------------------------------------------------------------------------


def read_policy_version(model_dir: str | Path) -> int:
    """The policy version recorded in ``model_dir/forge.json`` (0 for a folder without one)."""
    path = Path(model_dir) / FORGE_JSON
    if not path.is_file():
        return 0
    return int(json.loads(path.read_text())["policy_version"])


def load_policy(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """The causal LM of a Hugging Face folder, in ``dtype`` (fp32 for CPU training); a
    vision-language model for a folder with an image processor's settings."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from rl.tiny_vl_model import is_vision_model

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
    if is_vision_model(model_dir):
        return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)


def is_vision(model: Any) -> bool:
    """Does ``model`` take images (a Qwen-VL model: its config names an image token)?"""
    return getattr(getattr(model, "config", None), "image_token_id", None) is not None


def save_checkpoint(
    model: Any,
    out: str | Path,
    policy_version: int,
    source: str | Path | None = None,
    info: dict[str, Any] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> Path:
    """Write ``model`` to the new folder ``out`` with ``forge.json`` (policy version, info).

    Non-weight files of ``source`` (tokenizer, chat template) are copied along. The folder
    is written next to ``out`` and renamed into place: it appears whole or not at all.
    """
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists: checkpoints are never overwritten; pick a new --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out, create=False, sync_dir=False) as tmp:  # save_pretrained makes it
        model.save_pretrained(tmp)
        if source is not None:
            for path in sorted(Path(source).iterdir()):
                if (
                    path.is_file()
                    and path.name not in _WEIGHT_FILES
                    and not (tmp / path.name).exists()
                ):
                    if path.suffix in (".safetensors", ".bin", ".pt"):
                        continue
                    shutil.copy2(path, tmp / path.name)
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        meta = {"policy_version": int(policy_version), **(info or {})}
        (tmp / FORGE_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        for path in tmp.iterdir():
            fsync_file(path)
    return out
