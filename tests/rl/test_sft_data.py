"""SFT samples from recorded chats: serve mode's prompts, and completions it parses back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from k8s_jobs.toy_harness import SYSTEM, TOOLS
from mitm_addon.serve.completion import parse_hermes
from mitm_addon.serve.renderer import Renderer
from rl.batches import BatchError
from rl.sft_data import chat_samples
from rl.tiny_model import qwen3_tokenizer_dir


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer(qwen3_tokenizer_dir())


def chat(command: str) -> dict[str, Any]:
    """A toy-harness chain as `forge export sft` writes it (empty fields as None)."""
    function = {"name": "shell", "arguments": json.dumps({"command": command})}
    call = {"id": "call_1", "type": "function", "function": function}
    fields = ("content", "reasoning_content", "tool_calls", "tool_call_id", "name")
    blank: dict[str, Any] = dict.fromkeys(fields)
    return {
        "call_id": "c1",
        "messages": [
            {**blank, "role": "system", "content": SYSTEM},
            {**blank, "role": "user", "content": "Create the directory build/a."},
            {**blank, "role": "assistant", "content": "", "tool_calls": [call]},
            {**blank, "role": "tool", "content": "exit=0\n", "tool_call_id": "call_1"},
            {**blank, "role": "assistant", "content": "Done."},
        ],
        "tools": json.dumps(TOOLS),
    }


def test_each_assistant_turn_is_a_sample_on_serve_modes_prompt(renderer: Renderer) -> None:
    example = chat("bash task.sh")
    samples = chat_samples([example], renderer)
    assert [s.sample_id for s in samples] == ["c1:2", "c1:4"]
    clean = [{k: v for k, v in m.items() if v is not None} for m in example["messages"]]
    for sample, turn in zip(samples, (2, 4), strict=True):
        cut = sample.loss_mask.index(1)
        # The prompt is what serve mode sends the policy for this turn.
        assert list(sample.input_ids[:cut]) == renderer.render(clean[:turn], TOOLS)
        assert all(sample.loss_mask[cut:]) and renderer.ends_turn(sample.input_ids[-1])


def test_a_trained_completion_parses_back_into_the_recorded_reply(renderer: Renderer) -> None:
    first, last = chat_samples([chat("echo 'a b' > out.txt")], renderer)
    text = renderer.decode(list(first.input_ids[first.loss_mask.index(1) :]))
    parsed = parse_hermes(text, "stop")
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("shell", {"command": "echo 'a b' > out.txt"})
    ]
    reply = parse_hermes(renderer.decode(list(last.input_ids[last.loss_mask.index(1) :])), "stop")
    assert reply.text.strip() == "Done." and not reply.tool_calls


def test_a_template_that_rewrites_history_is_refused(renderer: Renderer) -> None:
    class Shifty:
        """Renders the earlier turns differently once a turn follows them."""

        def render(self, messages: Any, tools: Any) -> list[int]:
            return [1, 2, 3]

        def render_full(self, messages: Any, tools: Any) -> list[int]:
            return [1, 9, 3, 4, 5]

        def ends_turn(self, token: int) -> bool:
            return token == 5

    with pytest.raises(BatchError, match="differently"):
        chat_samples([chat("ls")], Shifty())
