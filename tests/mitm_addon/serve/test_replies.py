"""Streamed replies: whatever deltas a completion arrives in, each API's event stream,
folded as its SDK folds it, is the same reply as the API's whole JSON body."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mitm_addon.serve import replies
from tests.mitm_addon.serve.test_completion import streamed, texts


def stream(
    api: str, text: str, cuts: list[int], request: dict[str, Any]
) -> tuple[replies.Reply, list[Any]]:
    """The events of ``text`` sampled in the pieces ``cuts`` make, and the whole reply."""
    pieces, parsed = streamed(text, cuts)
    head = replies.Reply("c1", "m", parsed, input_tokens=7, output_tokens=0, created=1)
    encoder = replies.encoder(api, head, request)
    events = encoder.start()
    for piece in pieces:
        events += encoder.piece(piece)
    reply = replies.Reply("c1", "m", parsed, input_tokens=7, output_tokens=5, created=1)
    return reply, events + encoder.end(reply)


def fold_anthropic(events: list[Any]) -> dict[str, Any]:
    message: dict[str, Any] = {}
    for name, data in events:
        assert name == data["type"]
        if name == "message_start":
            message = dict(data["message"], content=[])
        elif name == "content_block_start":
            assert data["index"] == len(message["content"])
            message["content"].append(dict(data["content_block"], _json=""))
        elif name == "content_block_delta":
            block, delta = message["content"][data["index"]], data["delta"]
            kind = delta["type"]
            if kind == "text_delta":
                block["text"] += delta["text"]
            elif kind == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif kind == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                block["_json"] += delta["partial_json"]
        elif name == "content_block_stop":
            block = message["content"][data["index"]]
            if block["type"] == "tool_use":
                block["input"] = json.loads(block["_json"])
        elif name == "message_delta":
            message.update(data["delta"])
            message["usage"].update(data["usage"])
    for block in message["content"]:
        del block["_json"]
    return message


def fold_chat(events: list[Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"content": "", "tool_calls": []}
    finish = None
    assert events[-1] == (None, "[DONE]")
    for _, data in events[:-1]:
        for choice in data["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            if "reasoning_content" in delta:
                message["reasoning_content"] = (
                    message.get("reasoning_content", "") + delta["reasoning_content"]
                )
            for call in delta.get("tool_calls", []):
                if call["index"] == len(message["tool_calls"]):
                    message["tool_calls"].append(
                        {"id": call["id"], "name": call["function"]["name"], "arguments": ""}
                    )
                message["tool_calls"][call["index"]]["arguments"] += call["function"]["arguments"]
            finish = choice["finish_reason"] or finish
    return dict(message, finish_reason=finish)


@settings(max_examples=150, deadline=None)
@given(texts, st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_each_apis_stream_folds_to_its_whole_reply(text: str, cuts: list[int]) -> None:
    reply, events = stream("anthropic_messages", text, cuts, {})
    assert fold_anthropic(events) == replies.anthropic_json(reply)

    reply, events = stream("openai_chat", text, cuts, {})
    whole = replies.chat_json(reply)["choices"][0]
    folded = fold_chat(events)
    assert folded["finish_reason"] == whole["finish_reason"]
    assert folded["content"] == (whole["message"]["content"] or "")
    assert (
        folded.get("reasoning_content") == whole["message"].get("reasoning_content")
        or not reply.completion.reasoning
    )
    assert [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in whole["message"].get("tool_calls", [])
    ] == [(c["id"], c["name"], c["arguments"]) for c in folded["tool_calls"]]

    request = {"instructions": "be brief", "tools": []}
    reply, events = stream("openai_responses", text, cuts, request)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[-1][0] == "response.completed"
    assert events[-1][1]["response"] == replies.responses_json(reply, request)
    texts_done = [d["text"] for n, d in events if n == "response.output_text.done"]
    deltas = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    c = reply.completion
    assert texts_done == ([c.text] if c.text or not c.tool_calls else []) and deltas == c.text


def test_codex_tools_are_called_in_their_own_shape_and_come_back_as_served() -> None:
    """A custom tool (Codex's apply_patch) is called with a custom_tool_call, a namespaced
    one (spawn_agent in ``collaboration``) names its namespace; what the harness sends
    back converts to the very message the splice store remembered."""
    from mitm_addon.serve.completion import ParsedCompletion, ToolCall
    from pipeline.export import responses_messages

    tools = [
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
        {
            "type": "namespace",
            "name": "collaboration",
            "tools": [{"type": "function", "name": "spawn_agent", "parameters": {}}],
        },
        {"type": "function", "name": "exec_command", "parameters": {}},
    ]
    kinds = replies.responses_tool_kinds(tools)
    assert kinds == {
        "apply_patch": ("custom", None),
        "spawn_agent": ("function", "collaboration"),
        "exec_command": ("function", None),
    }
    calls = [
        ToolCall("apply_patch", {"input": "*** Begin Patch\n*** End Patch\n"}),
        ToolCall("spawn_agent", {"task_name": "w", "message": "go"}),
        ToolCall("exec_command", {"cmd": "ls"}),
    ]
    reply = replies.Reply(
        "c1", "m", ParsedCompletion("", None, calls), 3, 9, created=1, tool_kinds=kinds
    )
    output = replies.responses_json(reply, {"tools": tools})["output"]
    assert [(o["type"], o.get("namespace")) for o in output] == [
        ("custom_tool_call", None),
        ("function_call", "collaboration"),
        ("function_call", None),
    ]
    assert output[0]["input"] == "*** Begin Patch\n*** End Patch\n"
    streamed = replies.ResponsesStream(reply, {"tools": tools})
    names = [n for piece in replies.pieces(reply.completion) for n, _ in streamed.piece(piece)]
    assert "response.custom_tool_call_input.delta" in names
    # Streamed, the same items: no empty message beside a reply of calls only.
    for only in ([calls[0]], calls):
        alone = replies.Reply(
            "c2", "m", ParsedCompletion("", None, only), 3, 9, created=1, tool_kinds=kinds
        )
        encoder = replies.ResponsesStream(alone, {"tools": tools})
        final = replies.events(encoder, alone)[-1][1]["response"]
        assert final["output"] == replies.responses_json(alone, {"tools": tools})["output"]
    [back] = responses_messages({}, output)
    assert back["tool_calls"] == replies.reply_message(reply, "openai_responses")["tool_calls"]
