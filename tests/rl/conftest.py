"""A tiny Qwen3 built locally (no downloads), and samples whose ids fit its vocabulary."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from rl.batches import Sample

VOCAB = 48  # ids 0..47; 0 is the pad token


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Qwen3 (hidden 64) with a word-level tokenizer, saved as a HF folder."""
    return _word_level_qwen3(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def window_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same, every layer attending to the last 8 tokens (sliding-window attention)."""
    window = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}
    return _word_level_qwen3(tmp_path_factory.mktemp("models") / "window", **window)


def _word_level_qwen3(out: Path, **extra: Any) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab = {"<pad>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=0,
        **extra,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


@pytest.fixture
def tiny_model(tiny_model_dir: Path) -> Any:
    from rl.trainer import load_policy

    return load_policy(tiny_model_dir)


def make_samples(
    n: int,
    seed: int = 0,
    group_size: int = 4,
    logprob: float | None = -1.0,
    max_len: int = 24,
) -> list[Sample]:
    """``n`` samples: a prompt, a completion, maybe a second turn; groups of ``group_size``
    with rewards 1/0 alternating, so advantages are +-1 around each group's mean."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids: list[int] = []
        mask: list[int] = []
        for turn in range(rng.choice((1, 2))):
            prompt = rng.randint(2 if turn == 0 else 1, 6)
            completion = rng.randint(1, 6)
            ids += [rng.randrange(2, VOCAB) for _ in range(prompt + completion)]
            mask += [0] * prompt + [1] * completion
        ids, mask = ids[:max_len], mask[:max_len]
        adv = 1.0 if i % 2 == 0 else -1.0
        lps = None if logprob is None else tuple(logprob * m for m in mask)
        out.append(
            Sample(
                sample_id=f"s{i:03d}",
                group_id=f"task{i // group_size}@v0",
                input_ids=tuple(ids),
                loss_mask=tuple(mask),
                old_logprobs=lps,
                advantage=adv,
                policy_version=0,
            )
        )
    return out


def _token_call(call_id: str, s: float, rollout: str, drift: str, parent: str | None,
                prompt: list[int], completion: list[int]) -> dict[str, Any]:  # fmt: skip
    from tests.pipeline.runs import call_row

    return call_row(
        call_id,
        s,
        rollout_id=rollout,
        model="policy",
        drift=drift,
        prompt_parent_call_id=parent,
        prompt_ids=prompt,
        completion_ids=completion,
        completion_logprobs=[-0.5 - 0.1 * i for i in range(len(completion))],
        policy_version=0,
    )


@pytest.fixture(scope="session")
def snapshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real snapshot (``write_snapshot`` over real shards): task t, rollouts r1 (reward 1,
    two CLEAN calls) and r2 (reward 0); task u, rollouts r3 (1) and r4 (0); task v, r5 and
    r6 both rewarded 1 (zero spread: GRPO drops the group)."""
    from pipeline.shards import write_shard
    from pipeline.snapshot import write_snapshot
    from pipeline.store import connect
    from tests.pipeline.runs import reward_row, rollout_row

    root = tmp_path_factory.mktemp("snap")
    run = root / "run"
    calls = [
        _token_call("a1", 0, "r1", "FORK", None, [2, 3], [4]),
        _token_call("a2", 1, "r1", "CLEAN", "a1", [5], [6, 7]),
        _token_call("b1", 0, "r2", "FORK", None, [2, 3], [8]),
        _token_call("c1", 0, "r3", "FORK", None, [9, 10, 11], [12, 13, 14]),
        _token_call("d1", 0, "r4", "FORK", None, [9, 10, 11], [15]),
        _token_call("e1", 0, "r5", "FORK", None, [16, 17], [18]),
        _token_call("f1", 0, "r6", "FORK", None, [16, 17], [19]),
    ]
    write_shard(run, "calls", "calls-0", calls)
    rollouts = [rollout_row("r1", "t"), rollout_row("r2", "t")]
    rollouts += [rollout_row("r3", "u"), rollout_row("r4", "u")]
    rollouts += [rollout_row("r5", "v"), rollout_row("r6", "v")]
    write_shard(run, "rollouts", "rollouts", rollouts)
    rewards = [reward_row("r1", 1.0), reward_row("r2", 0.0)]
    rewards += [reward_row("r3", 1.0), reward_row("r4", 0.0)]
    rewards += [reward_row("r5", 1.0), reward_row("r6", 1.0)]
    write_shard(run, "rewards", "rewards", rewards)
    out = root / "s001"
    write_snapshot(run, out, con=connect(run), audit=False)
    return out
