"""Sliding-window models run only the tokens their trained or sampled logits can see."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from rl.batches import Sample, collate, crop_to_reach
from rl.policy.engine import Engine, SamplingParams, logprobs_of
from rl.trainer import TrainSettings, load_policy, token_logprobs, train
from rl.window import attention_reach, visible_suffix
from tests.rl.conftest import VOCAB
from tests.rl.test_trainer import reference_logprobs

REACH = 14  # the window model: 2 layers x (8 - 1)


def _config(**fields: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(num_hidden_layers=3, **fields)


def test_the_reach_is_layers_times_window_less_one_only_when_every_layer_slides() -> None:
    assert attention_reach(_config()) is None
    slide = {"use_sliding_window": True, "sliding_window": 8}
    assert attention_reach(_config(**slide, max_window_layers=0)) == 21
    # The first layer attends to everything: the reach is the whole sequence.
    assert attention_reach(_config(**slide, max_window_layers=1)) is None
    assert attention_reach(None) is None


def long_samples(n: int, length: int, seed: int = 0) -> list[Sample]:
    """Agent-like samples: a long prompt, a reply, a tool result, a second reply."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = [rng.randrange(2, VOCAB) for _ in range(length)]
        mask = [0] * (length - 30) + [1] * 6 + [0] * 18 + [1] * 6
        out.append(Sample(f"s{i}", "g", tuple(ids), tuple(mask), None, 1.0 - 2 * (i % 2)))
    return out


def test_a_cropped_sample_keeps_its_trained_tokens_and_what_they_can_see() -> None:
    (s,) = long_samples(1, 200)
    first = s.loss_mask.index(1)  # 170
    cropped = crop_to_reach(s, REACH)
    assert cropped.input_ids == s.input_ids[first - 1 - REACH :]
    assert cropped.loss_mask == s.loss_mask[first - 1 - REACH :]
    assert sum(cropped.loss_mask) == sum(s.loss_mask) == 12
    assert crop_to_reach(s, 10_000) is s  # nothing lies beyond the reach


def test_cropped_logprobs_equal_the_full_forwards_and_one_token_less_does_not(
    window_model_dir: Path,
) -> None:
    model = load_policy(window_model_dir)
    samples = long_samples(4, 200)
    full = reference_logprobs(model, samples) * collate(samples).loss_mask
    with torch.no_grad():
        cropped = token_logprobs(model, collate([crop_to_reach(s, REACH) for s in samples]))
        short = token_logprobs(model, collate([crop_to_reach(s, REACH - 1) for s in samples]))
    mask = collate(samples).loss_mask > 0
    assert float((cropped - full[:, -cropped.shape[1] :]).abs().max()) < 1e-5
    # The reach is exact: one token fewer changes the first trained token's logprob.
    assert (
        float((short - full[:, -short.shape[1] :])[:, mask[0, -short.shape[1] :]].abs().max())
        > 1e-3
    )


def test_training_a_window_model_takes_the_uncropped_step(
    window_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rl.trainer

    samples = long_samples(4, 300)
    settings = TrainSettings(micro_batch_size=2, recompute_old_logprobs=True)
    # Plain SGD: the weights move by the gradient itself (AdamW's first step moves each
    # weight by about lr whatever the size of its gradient, sign flips of 1e-9 included).
    cropped = load_policy(window_model_dir)
    (fast,) = train(
        cropped, samples, settings, optimizer=torch.optim.SGD(cropped.parameters(), lr=1.0)
    )
    monkeypatch.setattr(rl.trainer, "attention_reach", lambda config: None)
    whole = load_policy(window_model_dir)
    (slow,) = train(whole, samples, settings, optimizer=torch.optim.SGD(whole.parameters(), lr=1.0))
    assert fast["loss/pg"] == pytest.approx(slow["loss/pg"], abs=1e-6)
    assert fast["grad/norm"] == pytest.approx(slow["grad/norm"], rel=1e-4)
    moved = 0.0
    for (name, a), b in zip(cropped.named_parameters(), whole.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    start = load_policy(window_model_dir)
    for a, b in zip(cropped.parameters(), start.parameters(), strict=True):
        moved = max(moved, float((a - b).detach().abs().max()))
    assert moved > 1e-3  # the step did move them


def test_the_engine_samples_a_window_model_as_from_the_whole_prompt(
    window_model_dir: Path,
) -> None:
    engine = Engine(window_model_dir)
    assert engine.reach == REACH
    prompt = [random.Random(1).randrange(2, VOCAB) for _ in range(220)]
    params = SamplingParams(max_tokens=12, seed=7, ignore_eos=True)
    fast = engine.generate(prompt, params)
    engine.reach = None  # the whole prompt, as a full-attention model runs it
    whole = engine.generate(prompt, params)
    assert fast.token_ids == whole.token_ids
    assert fast.logprobs == pytest.approx(whole.logprobs, abs=1e-5)
    # The recomputation the trainer compares with crops the same way.
    again = logprobs_of(engine.model, prompt, fast.token_ids)
    assert again.tolist() == pytest.approx(fast.logprobs, abs=1e-5)
    assert visible_suffix(prompt, REACH) == prompt[-REACH - 1 :]
