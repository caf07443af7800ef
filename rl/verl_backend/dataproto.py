"""Snapshot samples in veRL's layout: left-padded prompts, right-padded responses.

veRL's actor trains a ``DataProto`` whose rows are ``prompts`` (B, P), left-padded, and
``responses`` (B, R), right-padded, with ``input_ids = cat(prompts, responses)``; the loss
runs over ``response_mask`` (B, R). A Forge sample is one token sequence whose loss mask
marks the model's own tokens, possibly several completions with tool results between them.
It maps onto veRL's multi-turn layout: the prompt is everything before the first trained
token, the response everything after it, and ``response_mask`` is the sample's loss mask
there (0 on tool results and later prompts, as veRL's agent loop writes it).

Token alignment is the same on both sides: the logprob of ``responses[:, t]`` is taken from
the logits one position before it. The GRPO group id becomes veRL's ``uid``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from verl.protocol import DataProto

from rl.batches import BatchError, Sample

__all__ = ["to_dataproto", "split_at_first_trained_token"]


def split_at_first_trained_token(sample: Sample) -> int:
    """Index of the sample's first trained token: its prompt is the tokens before it."""
    for i, m in enumerate(sample.loss_mask):
        if m:
            return i
    raise BatchError(f"sample {sample.sample_id}: no token is in the loss mask")


def to_dataproto(samples: Sequence[Sample], pad_id: int = 0, temperature: float = 1.0) -> DataProto:
    """One ``DataProto`` holding ``samples`` in veRL's padded layout.

    Tensors (B rows; P the longest prompt, R the longest response):
    ``prompts`` (B, P) and ``responses`` (B, R) int64; ``input_ids``, ``attention_mask`` and
    ``position_ids`` (B, P + R); ``response_mask`` (B, R) int64; ``old_log_probs`` (B, R)
    float32, the sampling logprobs (0 where unknown); ``advantages`` (B, R) float32, the
    sample's advantage on its response mask. Non-tensors: ``uid`` (the GRPO group id),
    ``sample_id`` and ``old_log_probs_known`` (whether the sample carried its logprobs).
    """
    if not samples:
        raise BatchError("no samples to convert")
    cuts = [split_at_first_trained_token(s) for s in samples]
    b = len(samples)
    p = max(cuts)
    r = max(len(s.input_ids) - c for s, c in zip(samples, cuts, strict=True))
    prompts = torch.full((b, p), pad_id, dtype=torch.int64)
    prompt_mask = torch.zeros((b, p), dtype=torch.int64)
    responses = torch.full((b, r), pad_id, dtype=torch.int64)
    response_attention = torch.zeros((b, r), dtype=torch.int64)
    response_mask = torch.zeros((b, r), dtype=torch.int64)
    old = torch.zeros((b, r), dtype=torch.float32)
    adv = torch.zeros((b, r), dtype=torch.float32)
    known = np.zeros(b, dtype=bool)
    for i, (s, c) in enumerate(zip(samples, cuts, strict=True)):
        ids = torch.tensor(s.input_ids, dtype=torch.int64)
        n = len(s.input_ids) - c
        prompts[i, p - c :] = ids[:c]
        prompt_mask[i, p - c :] = 1
        responses[i, :n] = ids[c:]
        response_attention[i, :n] = 1
        mask = torch.tensor(s.loss_mask[c:], dtype=torch.int64)
        response_mask[i, :n] = mask
        if s.old_logprobs is not None:
            old[i, :n] = torch.tensor(s.old_logprobs[c:], dtype=torch.float32) * mask
            known[i] = True
        adv[i, :n] = s.advantage * mask.float()
    attention = torch.cat([prompt_mask, response_attention], dim=1)
    data: DataProto = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": torch.clamp(torch.cumsum(attention, dim=1) - 1, min=0),
            "response_mask": response_mask,
            "old_log_probs": old,
            "advantages": adv,
        },
        non_tensors={
            "uid": np.array([s.group_id or s.sample_id for s in samples], dtype=object),
            "sample_id": np.array([s.sample_id for s in samples], dtype=object),
            "old_log_probs_known": known,
        },
        meta_info={"temperature": temperature},
    )
    return data
