"""The embedded trainer: veRL's maths, token alignment, accumulation, steps, checkpoints."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig, PolicyLossConfig

from rl.batches import Sample, collate
from rl.losses import LossSettings
from rl.trainer import (
    TrainSettings,
    load_policy,
    read_policy_version,
    save_checkpoint,
    shared_prefix_length,
    token_logprobs,
    train,
    train_step,
)
from tests.rl.conftest import VOCAB, make_samples


def reference_logprobs(model: Any, samples: list[Sample]) -> torch.Tensor:
    """(B, T) logprobs by the plain loop: one unpadded forward per sample, log_softmax."""
    t = max(len(s.input_ids) for s in samples)
    out = torch.zeros(len(samples), t)
    with torch.no_grad():
        for i, s in enumerate(samples):
            ids = torch.tensor([s.input_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            for j in range(1, len(s.input_ids)):
                out[i, j] = logp[j - 1, s.input_ids[j]]
    return out


def with_logprobs(
    samples: list[Sample], logprobs: torch.Tensor, shift: float = 0.0
) -> list[Sample]:
    out = []
    for i, s in enumerate(samples):
        lps = tuple(
            (float(logprobs[i, j]) + shift * ((j % 3) - 1)) * m for j, m in enumerate(s.loss_mask)
        )
        out.append(Sample(s.sample_id, s.group_id, s.input_ids, s.loss_mask, lps, s.advantage))
    return out


def verl_config(loss_mode: str, agg: str) -> ActorConfig:
    """Built here, not by rl.losses: the reference is veRL's own objects."""
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=agg,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        use_torch_compile=False,
    )


def sgd(model: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.5)


@pytest.mark.parametrize(
    ("loss_mode", "agg"),
    [("vanilla", "token-mean"), ("gspo", "seq-mean-token-mean"), ("vanilla", "seq-mean-token-sum")],
)
def test_embedded_loss_equals_verl_core_algos_on_the_same_batch(
    tiny_model: Any, loss_mode: str, agg: str
) -> None:
    samples = make_samples(6, seed=1)
    ref_lp = reference_logprobs(tiny_model, samples)
    # Old logprobs off the current ones by up to 0.3 nats, so that some ratios clip.
    samples = with_logprobs(samples, ref_lp, shift=0.3)
    full = collate(samples)
    expected, _ = core_algos.get_policy_loss_fn(loss_mode)(
        old_log_prob=full.old_logprobs,
        log_prob=ref_lp,
        advantages=full.advantages,
        response_mask=full.loss_mask.bool(),
        loss_agg_mode=agg,
        config=verl_config(loss_mode, agg),
    )
    settings = TrainSettings(loss=LossSettings(loss_mode=loss_mode, loss_agg_mode=agg))
    # Three micro-batches of two, each padded to its own length.
    micro = [collate(samples[i : i + 2]) for i in range(0, 6, 2)]
    metrics = train_step(tiny_model, sgd(tiny_model), micro, settings)
    assert metrics["loss/pg"] == pytest.approx(float(expected), abs=1e-5)
    assert metrics["loss/clipfrac"] > 0  # the shift made some ratios leave [0.8, 1.2]


def test_recomputed_logprobs_of_unchanged_weights_equal_the_old_ones(tiny_model: Any) -> None:
    samples = make_samples(5, seed=2)
    ref_lp = reference_logprobs(tiny_model, samples)
    batch = collate(with_logprobs(samples, ref_lp))
    with torch.no_grad():
        lp = token_logprobs(tiny_model, batch) * batch.loss_mask
    assert torch.allclose(lp, batch.old_logprobs, atol=1e-5)
    # Ratio 1 everywhere: the token-mean PPO loss is minus the mean advantage per token.
    metrics = train_step(tiny_model, sgd(tiny_model), [batch], TrainSettings())
    mean_adv = float(batch.advantages.sum() / batch.loss_mask.sum())
    assert metrics["loss/pg"] == pytest.approx(-mean_adv, abs=1e-5)
    assert metrics["loss/clipfrac"] == 0 and abs(metrics["loss/ppo_kl"]) < 1e-5


def test_one_step_changes_the_weights_and_lowers_the_loss_on_a_repeated_batch(
    tiny_model: Any,
) -> None:
    samples = make_samples(8, seed=3)
    samples = with_logprobs(samples, reference_logprobs(tiny_model, samples))
    before = copy.deepcopy(tiny_model.state_dict())
    settings = TrainSettings(lr=1e-3, epochs=3, loss=LossSettings(clip_ratio=10.0))
    history = train(tiny_model, samples, settings)
    changed = [k for k, v in tiny_model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed
    losses = [h["loss/pg"] for h in history]
    assert losses[1] < losses[0] and losses[2] < losses[1]


def test_sft_is_cross_entropy_on_completion_tokens_only_and_lowers_it(tiny_model: Any) -> None:
    samples = make_samples(8, seed=4, logprob=None)
    lp = reference_logprobs(tiny_model, samples)
    mask = collate(samples).loss_mask
    expected = float(-(lp * mask).sum() / mask.sum())
    history = train(tiny_model, samples, TrainSettings(sft=True, lr=3e-3, epochs=3))
    losses = [h["loss/sft"] for h in history]
    assert losses[0] == pytest.approx(expected, abs=1e-5)
    assert losses[2] < losses[1] < losses[0]
    assert "loss/pg" not in history[0]


def test_gradient_accumulation_over_micro_batches_equals_one_full_batch_step(
    tiny_model: Any,
) -> None:
    samples = make_samples(8, seed=5)
    samples = with_logprobs(samples, reference_logprobs(tiny_model, samples), shift=0.2)
    settings = TrainSettings(grad_clip=1e9)
    one = copy.deepcopy(tiny_model)
    many = copy.deepcopy(tiny_model)
    m1 = train_step(one, sgd(one), [collate(samples)], settings)
    mk = train_step(many, sgd(many), [collate(samples[i : i + 3]) for i in (0, 3, 6)], settings)
    assert mk["loss/pg"] == pytest.approx(m1["loss/pg"], abs=1e-6)
    assert mk["grad/norm"] == pytest.approx(m1["grad/norm"], rel=1e-5)
    for (name, a), (_, b) in zip(one.named_parameters(), many.named_parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_kl_loss_to_the_reference_is_verls_and_zero_for_equal_policies(tiny_model: Any) -> None:
    samples = make_samples(4, seed=6)
    lp = reference_logprobs(tiny_model, samples)
    samples = with_logprobs(samples, lp)
    settings = TrainSettings(loss=LossSettings(kl_coef=0.1))
    ref = copy.deepcopy(tiny_model)
    metrics = train_step(tiny_model, sgd(tiny_model), [collate(samples)], settings, ref)
    assert metrics["loss/kl"] == pytest.approx(0.0, abs=1e-6)
    # After the step the policy moved: the KL is veRL's low_var_kl of the two.
    metrics = train_step(tiny_model, sgd(tiny_model), [collate(samples)], settings, ref)
    batch = collate(samples)
    moved = reference_logprobs(ref, samples)  # ref never changes
    assert torch.allclose(moved, lp, atol=1e-6)
    assert metrics["loss/kl"] > 0
    with pytest.raises(ValueError, match="reference"):
        train_step(tiny_model, sgd(tiny_model), [batch], settings, None)


def test_unknown_loss_modes_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="gspo"):
        LossSettings(loss_mode="nope")
    with pytest.raises(ValueError, match="token-mean"):
        LossSettings(loss_agg_mode="nope")
    with pytest.raises(ValueError, match="loss_scale_factor"):
        LossSettings(loss_agg_mode="seq-mean-token-sum-norm")


def test_samples_without_logprobs_get_them_from_the_weights_before_the_update(
    tiny_model: Any,
) -> None:
    samples = make_samples(4, seed=7, logprob=None)
    history = train(tiny_model, samples, TrainSettings(lr=1e-3))
    mean_adv = sum(s.advantage * s.n_loss_tokens for s in samples) / sum(
        s.n_loss_tokens for s in samples
    )
    assert history[0]["loss/pg"] == pytest.approx(-mean_adv, abs=1e-5)
    assert history[0]["samples/unknown_logprobs"] == 4


def test_the_checkpoint_reloads_with_transformers_and_carries_its_version(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = load_policy(tiny_model_dir)
    assert read_policy_version(tiny_model_dir) == 0
    train(model, make_samples(4, seed=8), TrainSettings(lr=1e-2))
    out = save_checkpoint(model, tmp_path / "step-1", 1, tiny_model_dir, {"snapshot": "s001"})
    meta = json.loads((out / "forge.json").read_text())
    assert meta == {"policy_version": 1, "snapshot": "s001"}
    assert read_policy_version(out) == 1
    again = AutoModelForCausalLM.from_pretrained(out)
    for (name, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert AutoTokenizer.from_pretrained(out).pad_token == "<pad>"
    with pytest.raises(FileExistsError, match="never overwritten"):
        save_checkpoint(model, out, 2)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_token_ids_outside_the_vocabulary_are_refused_before_any_step(tiny_model: Any) -> None:
    bad = Sample("x", "g", (1, 2, 4096), (0, 1, 1), None, 1.0)
    before = copy.deepcopy(tiny_model.state_dict())
    with pytest.raises(ValueError, match="outside the model's vocabulary of 48"):
        train(tiny_model, [*make_samples(2), bad], TrainSettings(lr=1e-2))
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())


@pytest.mark.parametrize("plain_head", [True, False], ids=["trained-rows", "logits-to-keep"])
def test_logprobs_of_trained_tokens_equal_a_full_forward_and_carry_gradients(
    tiny_model: Any, plain_head: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rl.trainer

    if not plain_head:  # the path of models whose logits are more than the head's output
        monkeypatch.setattr(rl.trainer, "_PLAIN_HEAD", frozenset())
    samples = make_samples(6, seed=5)
    batch = collate(samples)
    lp = token_logprobs(tiny_model, batch)
    expected = reference_logprobs(tiny_model, samples) * batch.loss_mask
    assert torch.allclose(lp.detach(), expected, atol=1e-5)
    assert bool((lp.detach()[batch.loss_mask == 0] == 0).all())
    lp.sum().backward()
    grads = [p.grad for p in tiny_model.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)


def agent_samples(prefix_len: int, seed: int = 0) -> list[Sample]:
    """Four samples as a harness's calls make them: one long shared prompt (system prompt
    and tools), then each its own turn and trained completion, of different lengths."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(2, VOCAB, (prefix_len,), generator=g).tolist()
    out = []
    for i in range(4):
        turn = torch.randint(2, VOCAB, (20 + 7 * i,), generator=g).tolist()
        reply = torch.randint(2, VOCAB, (10 + i,), generator=g).tolist()
        mask = (0,) * (prefix_len + len(turn)) + (1,) * len(reply)
        out.append(Sample(f"s{i}", "g", tuple(prefix + turn + reply), mask, None, 1.0 - i / 2))
    return out


def test_the_shared_prefix_is_the_rows_common_start_before_any_trained_token() -> None:
    samples = agent_samples(600)
    assert shared_prefix_length(collate(samples)) == 600  # then each its own turn
    # A row that is trained earlier bounds it: its hidden state before that token is its own.
    early = Sample("e", "g", samples[0].input_ids[:630], (0,) * 100 + (1,) * 530, None, 0.0)
    assert shared_prefix_length(collate([*samples, early])) == 99
    # Different first tokens: nothing is shared.
    other = Sample("o", "g", (7, *samples[0].input_ids[1:]), samples[0].loss_mask, None, 0.0)
    assert shared_prefix_length(collate([samples[0], other])) == 0


def test_a_shared_prefix_run_once_gives_the_full_forwards_logprobs_and_gradients(
    tiny_model: Any,
) -> None:
    import rl.trainer

    samples = agent_samples(rl.trainer.SHARED_PREFIX_MIN_TOKENS + 88)
    batch = collate(samples)
    shared = token_logprobs(tiny_model, batch)
    shared.sum().backward()
    grads = {k: p.grad.clone() for k, p in tiny_model.named_parameters() if p.grad is not None}
    tiny_model.zero_grad(set_to_none=True)
    # The same batch through the full forward (prefix sharing off).
    old = rl.trainer.SHARED_PREFIX_MIN_TOKENS
    try:
        rl.trainer.SHARED_PREFIX_MIN_TOKENS = 10**9
        full = token_logprobs(tiny_model, batch)
    finally:
        rl.trainer.SHARED_PREFIX_MIN_TOKENS = old
    full.sum().backward()
    expected = reference_logprobs(tiny_model, samples) * batch.loss_mask
    assert torch.allclose(shared.detach(), expected, atol=1e-5)
    assert float((shared - full).detach().abs().max()) < 1e-5
    assert grads.keys() == {k for k, p in tiny_model.named_parameters() if p.grad is not None}
    for k, p in tiny_model.named_parameters():
        assert torch.allclose(grads[k], p.grad, atol=1e-5, rtol=1e-4), k


def test_a_kept_optimizer_continues_in_the_next_training_run(
    tiny_model: Any, tmp_path: Path
) -> None:
    from rl.trainer import OPTIMIZER_FILE, make_optimizer, save_checkpoint, train

    samples = make_samples(4, seed=3)
    first = TrainSettings(lr=1e-3)
    optimizer = make_optimizer(tiny_model, first)
    train(tiny_model, samples, first, optimizer=optimizer)
    ckpt = save_checkpoint(tiny_model, tmp_path / "step-1", 1, optimizer=optimizer)
    assert (ckpt / OPTIMIZER_FILE).is_file()
    again = make_optimizer(tiny_model, TrainSettings(lr=5e-4, weight_decay=0.0), ckpt)
    saved, loaded = optimizer.state_dict(), again.state_dict()
    assert saved["state"].keys() == loaded["state"].keys() and saved["state"]
    for k, v in saved["state"].items():
        assert torch.equal(v["exp_avg_sq"], loaded["state"][k]["exp_avg_sq"])
        assert float(v["step"]) == float(loaded["state"][k]["step"]) == 1.0
    # This run's settings, not the saved ones.
    assert again.param_groups[0]["lr"] == 5e-4 and again.param_groups[0]["weight_decay"] == 0.0
    fresh = make_optimizer(tiny_model, first, tmp_path)  # a folder without optimizer.pt
    assert not fresh.state_dict()["state"]
