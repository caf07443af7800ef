"""Token splicing over multi-turn tool conversations, with the real Qwen3 tokenizer and
chat template: each turn's prompt extends the last one's prompt + completion token for
token (CLEAN), and a rewritten history is a FORK."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mitm_addon.serve.completion import parse_hermes
from mitm_addon.serve.renderer import Renderer
from mitm_addon.serve.replies import Reply, reply_message
from mitm_addon.serve.splice import (
    CLEAN,
    FORK,
    REALIGN,
    TRIM,
    ServedCall,
    SpliceStore,
    plan_prompt,
)
from rl.tiny_model import qwen3_tokenizer_dir
from tests.support.serve_runs import runs_in_order

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
TOOL_CALL = '<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call>'
EOS = 151645  # <|im_end|>


@pytest.fixture(scope="module")
def renderer() -> Iterator[Renderer]:
    yield Renderer(qwen3_tokenizer_dir())


# One turn of the policy: ordinary token ids (any text the model might write), maybe a
# tool call after them, maybe cut off before its end-of-turn token (max_tokens).
turns = st.lists(
    st.tuples(
        st.lists(st.integers(0, 151642), min_size=0, max_size=12),
        st.booleans(),  # ends with a tool call
        st.booleans(),  # ends its turn (EOS) rather than running out of tokens
    ),
    min_size=2,
    max_size=5,
)


def serve_turn(
    store: SpliceStore,
    renderer: Renderer,
    call_id: str,
    messages: list[dict[str, Any]],
    completion: list[int],
) -> tuple[Any, dict[str, Any]]:
    """Plan a call, 'sample' ``completion``, remember it; (plan, the reply message)."""
    plan = plan_prompt(store, renderer, messages, TOOLS)
    finish = "stop" if completion and completion[-1] == EOS else "length"
    parsed = parse_hermes(renderer.decode(completion), finish)
    reply = Reply(call_id, "m", parsed, len(plan.prompt_ids), len(completion))
    message = reply_message(reply, "anthropic_messages")
    store.add(
        [*messages, message],
        TOOLS,
        ServedCall(call_id, array("i", plan.prompt_ids), array("i", completion)),
    )
    return plan, message


def continue_conversation(messages: list[dict[str, Any]], reply: dict[str, Any]) -> None:
    messages.append(reply)
    for call in reply.get("tool_calls", []):
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "a.txt\nb.txt"})
    if not reply.get("tool_calls"):
        messages.append({"role": "user", "content": "go on"})


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=turns)
def test_each_turn_extends_the_previous_prompt_and_completion_token_for_token(
    renderer: Renderer, script: list[tuple[list[int], bool, bool]]
) -> None:
    store = SpliceStore()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "list the files"},
    ]
    previous: tuple[str, list[int]] | None = None
    for n, (ids, tool, ends) in enumerate(script):
        completion = ids + (renderer.encode(TOOL_CALL) if tool else []) + ([EOS] if ends else [])
        plan, reply = serve_turn(store, renderer, f"c{n}", messages, completion)
        if previous is None:
            assert plan.drift == CLEAN and plan.parent_call_id is None
            assert plan.prompt_ids == renderer.render(messages, TOOLS)
        else:
            parent_id, whole = previous
            assert plan.drift == CLEAN and plan.parent_call_id == parent_id
            assert plan.prompt_ids == whole + plan.stored_ids
        previous = (f"c{n}", plan.prompt_ids + completion)
        continue_conversation(messages, reply)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=turns, edit=st.sampled_from(["user", "tool_result", "assistant"]))
def test_a_rewritten_history_is_a_fork(
    renderer: Renderer, script: list[tuple[list[int], bool, bool]], edit: str
) -> None:
    store = SpliceStore()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    for n, (ids, tool, ends) in enumerate(script):
        completion = ids + (renderer.encode(TOOL_CALL) if tool else []) + ([EOS] if ends else [])
        _, reply = serve_turn(store, renderer, f"c{n}", messages, completion)
        continue_conversation(messages, reply)
    # Rewrite a message of the first turn (the conversation has at least two): what was
    # served after it no longer continues what the harness now sends.
    rewritten = [dict(m) for m in messages]
    if edit == "user":
        rewritten[0]["content"] = "summary of the work so far: files listed"
    elif edit == "assistant":
        rewritten[1]["content"] = rewritten[1]["content"] + " (edited)"
    else:
        rewritten[2]["content"] = "a different result"
    plan = plan_prompt(store, renderer, rewritten, TOOLS)
    assert plan.drift == FORK and plan.parent_call_id is None
    assert plan.stored_ids == plan.prompt_ids


def test_a_reply_sent_back_without_its_reasoning_is_realigned_to_the_sampled_ids(
    renderer: Renderer,
) -> None:
    store = SpliceStore()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    completion = renderer.encode("<think>\nplan\n</think>\n\n" + TOOL_CALL) + [EOS]
    first, reply = serve_turn(store, renderer, "c0", messages, completion)
    assert reply["reasoning_content"] == "plan"
    echoed = {k: v for k, v in reply.items() if k != "reasoning_content"}
    continue_conversation(messages, echoed)
    plan = plan_prompt(store, renderer, messages, TOOLS)
    assert plan.drift == REALIGN and plan.parent_call_id is None
    assert (
        plan.prompt_ids[: len(first.prompt_ids) + len(completion)] == first.prompt_ids + completion
    )
    # Rendering the echoed history instead would have lost the reasoning's tokens.
    assert renderer.render(messages, TOOLS)[: len(plan.prompt_ids)] != plan.prompt_ids


def internal_context(n: int) -> dict[str, Any]:
    """OpenClaw's transient message: sent with one request, dropped from the next."""
    return {
        "role": "user",
        "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\n"
        f"active exec sessions: {n}\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
    }


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=turns)
def test_dropped_transient_context_still_splices_every_earlier_completion(
    renderer: Renderer, script: list[tuple[list[int], bool, bool]]
) -> None:
    store = SpliceStore()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "list the files"},
    ]
    completions: list[list[int]] = []
    for n, (ids, tool, ends) in enumerate(script):
        completion = ids + (renderer.encode(TOOL_CALL) if tool else []) + ([EOS] if ends else [])
        plan, reply = serve_turn(
            store, renderer, f"c{n}", [*messages, internal_context(n)], completion
        )
        assert plan.drift == (CLEAN if n == 0 else TRIM)
        assert plan.parent_call_id is None and plan.stored_ids == plan.prompt_ids
        # The messages as the harness sent them, earlier completions as sampled.
        head = renderer.render_full(messages[:2], TOOLS)
        assert plan.prompt_ids[: len(head)] == head
        assert runs_in_order(plan.prompt_ids, completions)
        text = renderer.tokenizer.decode(plan.prompt_ids)
        assert f"active exec sessions: {n}\n" in text
        assert all(f"active exec sessions: {k}\n" not in text for k in range(n))
        completions.append(completion)
        continue_conversation(messages, reply)  # the next request drops the context


def test_a_rewritten_history_with_transient_context_is_still_a_fork(renderer: Renderer) -> None:
    store = SpliceStore()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    for n in range(2):
        completion = renderer.encode(TOOL_CALL) + [EOS]
        _, reply = serve_turn(
            store, renderer, f"c{n}", [*messages, internal_context(n)], completion
        )
        continue_conversation(messages, reply)
    rewritten = [dict(m) for m in messages]
    rewritten[2]["content"] = "a different result"
    plan = plan_prompt(store, renderer, [*rewritten, internal_context(2)], TOOLS)
    assert plan.drift == FORK
