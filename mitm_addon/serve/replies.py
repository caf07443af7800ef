"""Replies in the shape of the API the harness called, as one JSON body or as the API's
event stream (pure).

``Reply`` carries what the policy said and the ids the harness will send back; each
``*_json`` gives the non-streaming body. Streams are written by one encoder per API
(``AnthropicStream``, ``ChatStream``, ``ResponsesStream``), fed as the completion is
sampled: ``start`` before the first token, ``piece`` for each reasoning or text delta
and each whole tool call (``completion.Piece``), ``end`` with the finished ``Reply``.
Each returns (event name, data) pairs that ``encode_sse`` writes out (a WebSocket sends
each data as one message). Streams follow the order the providers document: Anthropic
``message_start`` ... ``message_stop``; Chat chunks then ``data: [DONE]``; Responses
``response.created`` ... ``response.completed``. A whole reply streams through the same
encoders (``events``), one piece per block.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from mitm_addon.serve.completion import ParsedCompletion, Piece, ToolCall

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
    # Responses: each offered tool's (kind, namespace): "custom" tools (Codex's
    # apply_patch) are called with custom_tool_call items, namespaced ones (Codex's
    # collaboration tools) name their namespace. Any other name is a function.
    tool_kinds: dict[str, tuple[str, str | None]] = field(default_factory=dict)

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


Event = tuple[str | None, Any]


class StreamEncoder(Protocol):
    """One API's event stream, written as the completion is sampled."""

    def start(self) -> list[Event]: ...

    def piece(self, piece: Piece) -> list[Event]: ...

    def end(self, reply: Reply) -> list[Event]: ...


def pieces(completion: ParsedCompletion) -> list[Piece]:
    """A whole completion as the pieces a stream of it sends: one per block."""
    out = [Piece("reasoning", completion.reasoning)] if completion.reasoning else []
    if completion.text:
        out.append(Piece("text", completion.text))
    return out + [Piece("tool", call=call) for call in completion.tool_calls]


def events(encoder: StreamEncoder, reply: Reply) -> list[Event]:
    """The whole stream of a finished reply."""
    out = encoder.start()
    for piece in pieces(reply.completion):
        out += encoder.piece(piece)
    return out + encoder.end(reply)


class AnthropicStream:
    """Messages events: ``message_start``, content blocks (thinking, text, tool_use) each
    started, given its deltas and stopped, ``message_delta``, ``message_stop``."""

    def __init__(self, head: Reply) -> None:
        self.head = head
        self._index = -1  # the content block in progress
        self._open: str | None = None  # its type
        self._calls = 0

    def start(self) -> list[Event]:
        shell = anthropic_json(self.head)
        shell.update(content=[], stop_reason=None, usage=_anthropic_usage(self.head, 1))
        return [("message_start", {"type": "message_start", "message": shell})]

    def _block(self, kind: str, block: dict[str, Any]) -> list[Event]:
        out = self._close()
        self._index += 1
        self._open = kind
        data = {"type": "content_block_start", "index": self._index, "content_block": block}
        return out + [("content_block_start", data)]

    def _delta(self, delta: dict[str, Any]) -> Event:
        data = {"type": "content_block_delta", "index": self._index, "delta": delta}
        return ("content_block_delta", data)

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        out = []
        if self._open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": THINKING_SIGNATURE}))
        self._open = None
        stop = {"type": "content_block_stop", "index": self._index}
        return out + [("content_block_stop", stop)]

    def piece(self, piece: Piece) -> list[Event]:
        out: list[Event] = []
        if piece.kind == "reasoning":
            if self._open != "thinking":
                out += self._block(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                )
            return out + [self._delta({"type": "thinking_delta", "thinking": piece.text})]
        if piece.kind == "text":
            if self._open != "text":
                out += self._block("text", {"type": "text", "text": ""})
            return out + [self._delta({"type": "text_delta", "text": piece.text})]
        call = _call(piece)
        start = {
            "type": "tool_use",
            "id": self.head.tool_call_id(self._calls, "toolu_"),
            "name": call.name,
            "input": {},
        }
        self._calls += 1
        out += self._block("tool_use", start)
        out.append(
            self._delta({"type": "input_json_delta", "partial_json": _arguments(call.arguments)})
        )
        return out + self._close()

    def end(self, reply: Reply) -> list[Event]:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _anthropic_stop(reply), "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens},
        }
        return self._close() + [
            ("message_delta", delta),
            ("message_stop", {"type": "message_stop"}),
        ]


def _call(piece: Piece) -> ToolCall:
    assert piece.call is not None, "a tool piece carries its call"
    return piece.call


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


class ChatStream:
    """Chat Completions chunks: the role, content and reasoning deltas, each tool call (its
    head, then its arguments), the finish reason, usage when asked, ``[DONE]``."""

    def __init__(self, head: Reply, include_usage: bool) -> None:
        self.head = head
        self.include_usage = include_usage
        self._calls = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> Event:
        head = self.head
        return (
            None,
            {
                "id": f"chatcmpl-{head.call_id}",
                "object": "chat.completion.chunk",
                "created": head.created,
                "model": head.model,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
            },
        )

    def start(self) -> list[Event]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def piece(self, piece: Piece) -> list[Event]:
        if piece.kind == "reasoning":
            return [self._chunk({"reasoning_content": piece.text})]
        if piece.kind == "text":
            return [self._chunk({"content": piece.text})]
        call, i = _call(piece), self._calls
        self._calls += 1
        head = {
            "index": i,
            "id": self.head.tool_call_id(i, "call_"),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        arguments = {"index": i, "function": {"arguments": _arguments(call.arguments)}}
        return [self._chunk({"tool_calls": [head]}), self._chunk({"tool_calls": [arguments]})]

    def end(self, reply: Reply) -> list[Event]:
        out = [self._chunk({}, _chat_finish(reply))]
        if self.include_usage:
            name, data = self._chunk({})
            data.update(choices=[], usage=_chat_usage(reply))
            out.append((name, data))
        return out + [(None, "[DONE]")]


# -- OpenAI Responses ------------------------------------------------------------------


def responses_tool_kinds(tools: Any) -> dict[str, tuple[str, str | None]]:
    """(kind, namespace) of each tool a Responses request offers, namespaces opened."""
    kinds: dict[str, tuple[str, str | None]] = {}

    def add(tool: Any, namespace: str | None) -> None:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            kind = tool.get("type", "function")
            if kind in ("function", "custom"):
                kinds[tool["name"]] = (kind, namespace)
            elif kind == "namespace":
                for inner in tool.get("tools") or []:
                    add(inner, tool["name"])

    for tool in tools if isinstance(tools, list) else []:
        add(tool, None)
    return kinds


def _custom_input(arguments: dict[str, Any]) -> str:
    """A custom tool's input text, from the arguments the policy wrote ({"input": ...})."""
    value = arguments.get("input")
    return value if isinstance(value, str) else _arguments(arguments)


def _responses_call_item(reply: Reply, i: int, call: ToolCall) -> dict[str, Any]:
    """The output item of the reply's ``i``-th tool call."""
    kind, namespace = reply.tool_kinds.get(call.name, ("function", None))
    if kind == "custom":
        return {
            "type": "custom_tool_call",
            "id": f"ctc_{reply.call_id}_{i}",
            "call_id": reply.tool_call_id(i, "call_"),
            "name": call.name,
            "input": _custom_input(call.arguments),
            "status": "completed",
        }
    item = {
        "type": "function_call",
        "id": f"fc_{reply.call_id}_{i}",
        "call_id": reply.tool_call_id(i, "call_"),
        "name": call.name,
        "arguments": _arguments(call.arguments),
        "status": "completed",
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


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
    output += [_responses_call_item(reply, i, call) for i, call in enumerate(c.tool_calls)]
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


class ResponsesStream:
    """Responses events: ``response.created`` and ``in_progress``, each output item
    (reasoning, message, function call) added, given its deltas and done, then
    ``response.completed`` (``response.incomplete`` when cut off) with those items."""

    def __init__(self, head: Reply, request: dict[str, Any]) -> None:
        self.head = head
        self.request = request
        self._seq = 0
        self._items: list[dict[str, Any]] = []  # the output items done
        self._open: dict[str, Any] | None = None  # the item in progress
        self._texts: list[str] = []  # its text so far
        self._calls = 0

    def _event(self, data: dict[str, Any]) -> Event:
        data["sequence_number"] = self._seq
        self._seq += 1
        return (data["type"], data)

    def start(self) -> list[Event]:
        shell = responses_json(self.head, self.request)
        shell.update(status="in_progress", output=[], usage=None, incomplete_details=None)
        return [
            self._event({"type": "response.created", "response": shell}),
            self._event({"type": "response.in_progress", "response": dict(shell)}),
        ]

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"output_index": len(self._items), "item_id": self._open["id"]}

    def _add(self, item: dict[str, Any], shown: dict[str, Any]) -> list[Event]:
        out = self._close()
        self._open, self._texts = item, []
        added = {"type": "response.output_item.added", "output_index": len(self._items)}
        return out + [self._event(dict(added, item=shown))]

    def _close(self) -> list[Event]:
        item = self._open
        if item is None:
            return []
        text = "".join(self._texts)
        where = self._where()
        out: list[Event] = []
        if item["type"] == "reasoning":
            part: dict[str, Any] = {"type": "summary_text", "text": text}
            item["summary"] = [part]
            at = dict(where, summary_index=0)
            out += [
                self._event({"type": "response.reasoning_summary_text.done", **at, "text": text}),
                self._event({"type": "response.reasoning_summary_part.done", **at, "part": part}),
            ]
        elif item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            item["content"] = [part]
            at = dict(where, content_index=0)
            out += [
                self._event({"type": "response.output_text.done", **at, "text": text}),
                self._event({"type": "response.content_part.done", **at, "part": part}),
            ]
        done = {"type": "response.output_item.done", "output_index": len(self._items), "item": item}
        out.append(self._event(done))
        self._items.append(item)
        self._open = None
        return out

    def piece(self, piece: Piece) -> list[Event]:
        out: list[Event] = []
        open_kind = self._open["type"] if self._open is not None else None
        if piece.kind == "reasoning":
            if open_kind != "reasoning":
                item = {"type": "reasoning", "id": f"rs_{self.head.call_id}", "summary": []}
                out += self._add(item, dict(item))
                part = {"type": "summary_text", "text": ""}
                at = dict(self._where(), summary_index=0)
                out.append(
                    self._event(
                        {"type": "response.reasoning_summary_part.added", **at, "part": part}
                    )
                )
            self._texts.append(piece.text)
            at = dict(self._where(), summary_index=0)
            return out + [
                self._event(
                    {"type": "response.reasoning_summary_text.delta", **at, "delta": piece.text}
                )
            ]
        if piece.kind == "text":
            if open_kind != "message":
                out += self._message()
            self._texts.append(piece.text)
            at = dict(self._where(), content_index=0)
            return out + [
                self._event({"type": "response.output_text.delta", **at, "delta": piece.text})
            ]
        call, i = _call(piece), self._calls
        self._calls += 1
        item = _responses_call_item(self.head, i, call)
        where_args: tuple[str, str, str]
        if item["type"] == "custom_tool_call":
            where_args = (
                "input",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
            )
        else:
            where_args = (
                "arguments",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
            )
        key, delta, done = where_args
        out += self._add(item, dict(item, status="in_progress", **{key: ""}))
        where = self._where()
        out += [
            self._event({"type": delta, **where, "delta": item[key]}),
            self._event({"type": done, **where, key: item[key]}),
        ]
        return out + self._close()

    def _message(self) -> list[Event]:
        item: dict[str, Any] = {
            "type": "message",
            "id": f"msg_{self.head.call_id}",
            "status": "completed",
            "role": "assistant",
            "content": [],
        }
        out = self._add(item, dict(item, status="in_progress"))
        empty = {"type": "output_text", "text": "", "annotations": []}
        at = dict(self._where(), content_index=0)
        return out + [self._event({"type": "response.content_part.added", **at, "part": empty})]

    def end(self, reply: Reply) -> list[Event]:
        out = self._close()
        if all(item["type"] == "reasoning" for item in self._items):
            out += self._message() + self._close()  # a reply says something, if only ""
        return out + [self.terminal(reply)]

    def terminal(self, reply: Reply) -> Event:
        """``response.completed`` (``response.incomplete`` when cut off), with the items
        streamed so far."""
        final = responses_json(reply, self.request)
        final["output"] = self._items
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return self._event({"type": kind, "response": final})


def prewarm_events(head: Reply, request: dict[str, Any]) -> list[Event]:
    """A Responses call with ``generate: false`` (Codex warming the cache): created and
    completed, with no output."""
    stream = ResponsesStream(head, request)
    return stream.start() + [stream.terminal(head)]


def encoder(api: str, head: Reply, request: dict[str, Any]) -> StreamEncoder:
    """The stream encoder of ``api`` for a reply whose head (ids, model, prompt size) is
    ``head``; raises ValueError for an API without one."""
    if api == "anthropic_messages":
        return AnthropicStream(head)
    if api == "openai_chat":
        options = request.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        return ChatStream(head, usage)
    if api == "openai_responses":
        return ResponsesStream(head, request)
    raise ValueError(f"no reply builder for api {api!r}")


def build(api: str, reply: Reply, stream: bool, request: dict[str, Any]) -> tuple[str, bytes]:
    """(content type, body) of the reply to a call of ``api``, whole."""
    if stream:
        return "text/event-stream", encode_sse(events(encoder(api, reply, request), reply))
    if api == "anthropic_messages":
        body: dict[str, Any] = anthropic_json(reply)
    elif api == "openai_chat":
        body = chat_json(reply)
    elif api == "openai_responses":
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
                "function": {"name": call.name, "arguments": _message_arguments(reply, call)},
            }
            for i, call in enumerate(c.tool_calls)
        ]
    return message


def _message_arguments(reply: Reply, call: ToolCall) -> str:
    """A call's arguments as the harness's next request will hold them once converted (a
    custom tool call comes back as its input text, converted to {"input": text})."""
    if reply.tool_kinds.get(call.name, ("function", None))[0] == "custom":
        return _arguments({"input": _custom_input(call.arguments)})
    return _arguments(call.arguments)
