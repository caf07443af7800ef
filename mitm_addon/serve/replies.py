"""Replies in the shape of the API the harness called, as one JSON body or as the API's
event stream (pure).

``Reply`` carries what the policy said and the ids the harness will send back; each
``*_json`` gives the non-streaming body and each ``*_events`` the stream, as
(event name, data) pairs that ``encode_sse`` writes out. Streams follow the order the
providers document: Anthropic ``message_start`` ... ``message_stop``; Chat chunks then
``data: [DONE]``; Responses ``response.created`` ... ``response.completed``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mitm_addon.serve.completion import ParsedCompletion

# Anthropic thinking blocks carry a signature the API checks when they come back; the
# policy has no key to sign with, so Forge marks its own blocks with this constant.
THINKING_SIGNATURE = "forge-unsigned"


@dataclass(frozen=True)
class Reply:
    """One served completion, ready to be written in any API's shape."""

    call_id: str  # Forge's call id; the response and tool-call ids derive from it
    model: str
    completion: ParsedCompletion
    input_tokens: int
    output_tokens: int
    created: int = field(default_factory=lambda: int(time.time()))

    def tool_call_id(self, index: int, prefix: str) -> str:
        return f"{prefix}{self.call_id}_{index}"

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.completion.tool_calls)


def _arguments(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)


def encode_sse(events: list[tuple[str | None, Any]]) -> bytes:
    """SSE text: ``event:`` lines where the API names its events, ``data:`` as JSON
    (or verbatim when the data is already a string, as ``[DONE]`` is)."""
    out: list[str] = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        out.append((f"event: {name}\n" if name else "") + f"data: {text}\n\n")
    return "".join(out).encode("utf-8")


# -- Anthropic Messages ----------------------------------------------------------------


def _anthropic_stop(reply: Reply) -> str:
    if reply.completion.finish == "length":
        return "max_tokens"
    return "tool_use" if reply.has_tool_calls else "end_turn"


def _anthropic_blocks(reply: Reply) -> list[dict[str, Any]]:
    c = reply.completion
    blocks: list[dict[str, Any]] = []
    if c.reasoning:
        blocks.append(
            {"type": "thinking", "thinking": c.reasoning, "signature": THINKING_SIGNATURE}
        )
    if c.text:
        blocks.append({"type": "text", "text": c.text})
    for i, call in enumerate(c.tool_calls):
        blocks.append(
            {
                "type": "tool_use",
                "id": reply.tool_call_id(i, "toolu_"),
                "name": call.name,
                "input": call.arguments,
            }
        )
    return blocks


def _anthropic_usage(reply: Reply, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": reply.input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def anthropic_json(reply: Reply) -> dict[str, Any]:
    return {
        "id": f"msg_{reply.call_id}",
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": _anthropic_blocks(reply),
        "stop_reason": _anthropic_stop(reply),
        "stop_sequence": None,
        "usage": _anthropic_usage(reply, reply.output_tokens),
    }


def anthropic_events(reply: Reply) -> list[tuple[str | None, Any]]:
    shell = anthropic_json(reply)
    shell.update(content=[], stop_reason=None, usage=_anthropic_usage(reply, 1))
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": shell})
    ]
    for index, block in enumerate(_anthropic_blocks(reply)):
        kind = block["type"]
        start: dict[str, Any]
        if kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        elif kind == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": _arguments(block["input"])}]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _anthropic_stop(reply), "stop_sequence": None},
                "usage": {"output_tokens": reply.output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


# -- OpenAI Chat Completions -----------------------------------------------------------


def _chat_finish(reply: Reply) -> str:
    if reply.completion.finish == "length":
        return "length"
    return "tool_calls" if reply.has_tool_calls else "stop"


def _chat_usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }


def _chat_tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {
            "id": reply.tool_call_id(i, "call_"),
            "type": "function",
            "function": {"name": call.name, "arguments": _arguments(call.arguments)},
        }
        for i, call in enumerate(reply.completion.tool_calls)
    ]


def chat_json(reply: Reply) -> dict[str, Any]:
    c = reply.completion
    message: dict[str, Any] = {
        "role": "assistant",
        "content": c.text if c.text or not c.tool_calls else None,
        "refusal": None,
    }
    if c.reasoning is not None:
        message["reasoning_content"] = c.reasoning  # as vLLM's reasoning parsers name it
    if c.tool_calls:
        message["tool_calls"] = _chat_tool_calls(reply)
    return {
        "id": f"chatcmpl-{reply.call_id}",
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": _chat_finish(reply), "logprobs": None}
        ],
        "usage": _chat_usage(reply),
    }


def chat_events(reply: Reply, include_usage: bool) -> list[tuple[str | None, Any]]:
    c = reply.completion

    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str | None, Any]:
        return (
            None,
            {
                "id": f"chatcmpl-{reply.call_id}",
                "object": "chat.completion.chunk",
                "created": reply.created,
                "model": reply.model,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
            },
        )

    events = [chunk({"role": "assistant", "content": ""})]
    if c.reasoning is not None:
        events.append(chunk({"reasoning_content": c.reasoning}))
    if c.text:
        events.append(chunk({"content": c.text}))
    for i, call in enumerate(_chat_tool_calls(reply)):
        head = {"index": i, "id": call["id"], "type": "function"}
        head["function"] = {"name": call["function"]["name"], "arguments": ""}
        events.append(chunk({"tool_calls": [head]}))
        arguments = {"index": i, "function": {"arguments": call["function"]["arguments"]}}
        events.append(chunk({"tool_calls": [arguments]}))
    events.append(chunk({}, _chat_finish(reply)))
    if include_usage:
        name, data = chunk({})
        data.update(choices=[], usage=_chat_usage(reply))
        events.append((name, data))
    events.append((None, "[DONE]"))
    return events


# -- OpenAI Responses ------------------------------------------------------------------


def _responses_output(reply: Reply) -> list[dict[str, Any]]:
    c = reply.completion
    output: list[dict[str, Any]] = []
    if c.reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{reply.call_id}",
                "summary": [{"type": "summary_text", "text": c.reasoning}],
            }
        )
    if c.text or not c.tool_calls:
        output.append(
            {
                "type": "message",
                "id": f"msg_{reply.call_id}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": c.text, "annotations": []}],
            }
        )
    for i, call in enumerate(c.tool_calls):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{reply.call_id}_{i}",
                "call_id": reply.tool_call_id(i, "call_"),
                "name": call.name,
                "arguments": _arguments(call.arguments),
                "status": "completed",
            }
        )
    return output


def responses_json(reply: Reply, request: dict[str, Any]) -> dict[str, Any]:
    incomplete = reply.completion.finish == "length"
    return {
        "id": f"resp_{reply.call_id}",
        "object": "response",
        "created_at": reply.created,
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": reply.model,
        "output": _responses_output(reply),
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools", []),
        "metadata": request.get("metadata") or {},
        "usage": {
            "input_tokens": reply.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.input_tokens + reply.output_tokens,
        },
    }


def responses_events(reply: Reply, request: dict[str, Any]) -> list[tuple[str | None, Any]]:
    final = responses_json(reply, request)
    shell = dict(final, status="in_progress", output=[], usage=None, incomplete_details=None)
    raw: list[dict[str, Any]] = [
        {"type": "response.created", "response": shell},
        {"type": "response.in_progress", "response": shell},
    ]
    for n, item in enumerate(final["output"]):
        raw += list(_item_events(n, item))
    terminal = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    raw.append({"type": terminal, "response": final})
    return [(e["type"], dict(e, sequence_number=i)) for i, e in enumerate(raw)]


def _item_events(n: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    where = {"output_index": n, "item_id": item["id"]}
    kind = item["type"]
    if kind == "reasoning":
        yield {
            "type": "response.output_item.added",
            "output_index": n,
            "item": dict(item, summary=[]),
        }
        for s, part in enumerate(item["summary"]):
            yield {
                "type": "response.reasoning_summary_part.added",
                **where,
                "summary_index": s,
                "part": {"type": "summary_text", "text": ""},
            }
            yield {
                "type": "response.reasoning_summary_text.delta",
                **where,
                "summary_index": s,
                "delta": part["text"],
            }
            yield {
                "type": "response.reasoning_summary_text.done",
                **where,
                "summary_index": s,
                "text": part["text"],
            }
            yield {
                "type": "response.reasoning_summary_part.done",
                **where,
                "summary_index": s,
                "part": part,
            }
    elif kind == "message":
        empty = {"type": "output_text", "text": "", "annotations": []}
        yield {
            "type": "response.output_item.added",
            "output_index": n,
            "item": dict(item, status="in_progress", content=[]),
        }
        for p, part in enumerate(item["content"]):
            at = {**where, "content_index": p}
            yield {"type": "response.content_part.added", **at, "part": empty}
            if part["text"]:
                yield {"type": "response.output_text.delta", **at, "delta": part["text"]}
            yield {"type": "response.output_text.done", **at, "text": part["text"]}
            yield {"type": "response.content_part.done", **at, "part": part}
    else:
        yield {
            "type": "response.output_item.added",
            "output_index": n,
            "item": dict(item, status="in_progress", arguments=""),
        }
        yield {
            "type": "response.function_call_arguments.delta",
            **where,
            "delta": item["arguments"],
        }
        yield {
            "type": "response.function_call_arguments.done",
            **where,
            "arguments": item["arguments"],
        }
    yield {"type": "response.output_item.done", "output_index": n, "item": item}


def build(api: str, reply: Reply, stream: bool, request: dict[str, Any]) -> tuple[str, bytes]:
    """(content type, body) of the reply to a call of ``api``."""
    if api == "anthropic_messages":
        if stream:
            return "text/event-stream", encode_sse(anthropic_events(reply))
        body: dict[str, Any] = anthropic_json(reply)
    elif api == "openai_chat":
        if stream:
            options = request.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            return "text/event-stream", encode_sse(chat_events(reply, usage))
        body = chat_json(reply)
    elif api == "openai_responses":
        if stream:
            return "text/event-stream", encode_sse(responses_events(reply, request))
        body = responses_json(reply, request)
    else:
        raise ValueError(f"no reply builder for api {api!r}")
    return "application/json", json.dumps(body, ensure_ascii=False).encode("utf-8")


def reply_message(reply: Reply, api: str) -> dict[str, Any]:
    """The reply as a chat-template assistant message, with the ids the harness was given."""
    c = reply.completion
    prefix = "toolu_" if api == "anthropic_messages" else "call_"
    message: dict[str, Any] = {"role": "assistant", "content": c.text}
    if c.reasoning:
        message["reasoning_content"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = [
            {
                "id": reply.tool_call_id(i, prefix),
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for i, call in enumerate(c.tool_calls)
        ]
    return message
