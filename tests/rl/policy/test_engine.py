"""The embedded engine's sampling: logprobs recorded at sampling are the logprobs a
trainer recomputes for the same ids with the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl.policy.engine import Engine, EngineError, SamplingParams, logprobs_of


@pytest.fixture(scope="module")
def engine(tiny_models: tuple[Path, Path]) -> Engine:
    return Engine(tiny_models[0])


PROMPT = [151644, 872, 198, 14990, 1879, 151645, 198, 151644, 77091, 198]  # a chat turn


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_sampling_logprobs_equal_a_forward_pass_over_the_same_ids(
    engine: Engine, temperature: float
) -> None:
    g = engine.generate(PROMPT, SamplingParams(max_tokens=24, temperature=temperature, seed=3))
    assert len(g.token_ids) == len(g.logprobs) == 24 and g.finish_reason == "length"
    recomputed = logprobs_of(engine.model, PROMPT, g.token_ids)
    assert max(abs(a - b) for a, b in zip(recomputed.tolist(), g.logprobs, strict=True)) <= 1e-4


def test_a_seed_makes_sampling_reproducible(engine: Engine) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    assert engine.generate(PROMPT, params).token_ids == engine.generate(PROMPT, params).token_ids


def test_a_prompt_past_the_context_is_refused(engine: Engine) -> None:
    with pytest.raises(EngineError, match="maximum context length"):
        engine.generate(PROMPT, SamplingParams(max_tokens=engine.max_model_len))
