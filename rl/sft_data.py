"""SFT samples from chat examples (``forge export sft``), tokenized as serve mode would.

A run recorded against a provider holds text, not the policy's token ids. Each assistant
turn of an example becomes one sample: the prompt is the conversation before the turn as
serve mode renders it (the policy's chat template with its generation prompt), and the
completion is the turn as the same template writes it, up to and including its
end-of-turn token; only the completion is in the loss mask. A policy trained on these
samples learns to write what serve mode parses back into the recorded replies.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rl.batches import BatchError, Sample


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """A message without the export's empty fields (templates test for presence)."""
    return {k: v for k, v in message.items() if v is not None}


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        value = json.loads(value)
    return list(value)


def turn_samples(example: dict[str, Any], renderer: Any, name: str) -> Iterator[Sample]:
    """One sample per assistant turn of ``example`` (``messages`` and ``tools``)."""
    messages = [_clean(m) for m in example["messages"]]
    tools = _tools(example.get("tools"))
    for i, message in enumerate(messages):
        if message.get("role") != "assistant" or i == 0:
            continue
        prompt = renderer.render(messages[:i], tools)
        full = renderer.render_full(messages[: i + 1], tools)
        if full[: len(prompt)] != prompt:
            raise BatchError(
                f"{name}, turn {i}: the chat template renders the conversation before this "
                "turn differently with and without it; cannot cut the turn's tokens out"
            )
        completion = full[len(prompt) :]
        end = next((j for j, t in enumerate(completion) if renderer.ends_turn(t)), None)
        if end is None:
            raise BatchError(f"{name}, turn {i}: the template wrote no end-of-turn token")
        completion = completion[: end + 1]
        yield Sample(
            sample_id=f"{name}:{i}",
            group_id=None,
            input_ids=tuple(prompt + completion),
            loss_mask=(0,) * len(prompt) + (1,) * len(completion),
            old_logprobs=None,
            advantage=0.0,
        )


def chat_samples(examples: Iterable[dict[str, Any]], renderer: Any) -> list[Sample]:
    samples: list[Sample] = []
    for k, example in enumerate(examples):
        name = str(example.get("call_id") or f"example-{k}")
        samples.extend(turn_samples(example, renderer, name))
    return samples


def read_chat_samples(path: Path, model_dir: Path) -> list[Sample]:
    """Samples from a ``forge export sft`` Parquet file, tokenized with ``model_dir``'s
    tokenizer and chat template."""
    import pyarrow.parquet as pq

    from mitm_addon.serve.renderer import Renderer, TemplateError

    if not path.is_file():
        raise FileNotFoundError(f"no chat examples at {path} (write them with forge export sft)")
    try:
        renderer = Renderer(model_dir)
    except TemplateError as e:
        raise BatchError(str(e)) from None
    rows = pq.read_table(path).to_pylist()
    try:
        return chat_samples(rows, renderer)
    except TemplateError as e:
        raise BatchError(f"{path}: {e}") from None
