"""Anthropic Messages API (POST /v1/messages): requests, Message bodies, event streams.

A stream is assembled into exactly the Message object the non-streaming API returns:
``message_start`` carries the message shell, ``content_block_start`` opens each
block, deltas grow it (``text_delta``, ``input_json_delta`` whose concatenation is
the tool input as JSON text, ``thinking_delta``, ``signature_delta``,
``citations_delta``), ``message_delta`` sets ``stop_reason`` and the cumulative
usage, ``message_stop`` ends the stream.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from mitm_addon.protocols.base import (
    Adapter,
    Checks,
    ParsedRequest,
    ParsedResponse,
    ParseError,
    RequestShape,
    SseEvent,
    Usage,
    error_text,
    no_response,
    opt_int,
    parse_request_body,
    route,
)

API = "anthropic_messages"
LIST_KEY = "messages"

_c = Checks(API)


def matches(method: str, path: str) -> bool:
    """POST .../v1/messages (any query, e.g. ``?beta=true``); count_tokens and batches are not."""
    return method.upper() == "POST" and route(path).endswith("/v1/messages")


# ``messages`` is always a list; ``stream`` a boolean if present (null is rejected).
_REQUEST = RequestShape(list_key=LIST_KEY, items_must_be_list=True, stream_may_be_null=False)


@_c.guarded
def parse_request(body: dict[str, Any]) -> ParsedRequest:
    """Split a Messages request into its ``messages`` and everything else."""
    return parse_request_body(_c, _REQUEST, body)


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    return Usage(
        input_tokens=opt_int(usage.get("input_tokens")),
        output_tokens=opt_int(usage.get("output_tokens")),
        cache_read_tokens=opt_int(usage.get("cache_read_input_tokens")),
        cache_write_tokens=opt_int(usage.get("cache_creation_input_tokens")),
    )


def _error_text(error: Any) -> str:
    """``type: message`` of an API error object."""
    return error_text(error, ("type",))


def _parsed_message(
    message: dict[str, Any], *, complete: bool, error: str | None
) -> ParsedResponse:
    content = _c.arr(message.get("content"), "message 'content'")
    tool_calls = [
        block["name"]
        for block in content
        if isinstance(block, dict)
        and str(block.get("type", "")).endswith("tool_use")
        and isinstance(block.get("name"), str)
    ]
    return ParsedResponse(
        response=message,
        output_items=[{"role": "assistant", "content": content}],
        response_id=_c.opt_str(message.get("id"), "message 'id'"),
        model=_c.opt_str(message.get("model"), "message 'model'"),
        stop_reason=_c.opt_str(message.get("stop_reason"), "'stop_reason'"),
        usage=_usage(message.get("usage")),
        tool_calls=tool_calls,
        complete=complete,
        error=error,
    )


@_c.guarded
def parse_response(body: dict[str, Any]) -> ParsedResponse:
    """A non-streaming body: a Message, or an error body ``{"type": "error", "error": {...}}``."""
    body = _c.obj(body, "response body")
    if body.get("type") == "error":
        return no_response(_error_text(body.get("error")))
    if body.get("type") != "message":
        raise ParseError(f"{API}: response body is neither a message nor an error")
    return _parsed_message(body, complete=True, error=None)


class _StreamAssembler:
    """Grows the Message snapshot event by event."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.json_parts: dict[int, list[str]] = {}  # block index -> input_json_delta texts
        self.complete = False
        self.error: str | None = None

    def content(self) -> list[Any]:
        assert self.message is not None
        return _c.arr(self.message.get("content"), "message 'content'")

    def block(self, data: dict[str, Any]) -> dict[str, Any]:
        index = data["index"]
        content = self.content()
        if not isinstance(index, int) or not 0 <= index < len(content):
            raise ParseError(f"{API}: event for content block {index!r} that was never started")
        return _c.obj(content[index], "content block")

    def apply(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "ping":
            return
        if kind == "error":
            self.error = _error_text(data.get("error"))
            return
        if kind == "message_start":
            self.message = copy.deepcopy(_c.obj(data.get("message"), "'message'"))
            self.message.setdefault("content", [])
            return
        if self.message is None:
            raise ParseError(f"{API}: {kind!r} event before message_start")
        if kind == "content_block_start":
            self.start_block(data)
        elif kind == "content_block_delta":
            self.apply_delta(self.block(data), data["index"], _c.obj(data.get("delta"), "'delta'"))
        elif kind == "content_block_stop":
            self.finish_block(data["index"], strict=True)
        elif kind == "message_delta":
            self.apply_message_delta(data)
        elif kind == "message_stop":
            self.complete = True
        # Event types added after this was written are skipped: the stream stays usable.

    def start_block(self, data: dict[str, Any]) -> None:
        index = data["index"]
        content = self.content()
        block = copy.deepcopy(_c.obj(data.get("content_block"), "'content_block'"))
        if not isinstance(index, int) or not 0 <= index <= len(content):
            raise ParseError(f"{API}: content_block_start at index {index!r} skips a block")
        if index == len(content):
            content.append(block)
        else:
            content[index] = block
        if "input" in block and str(block.get("type", "")).endswith("tool_use"):
            self.json_parts[index] = []

    def apply_delta(self, block: dict[str, Any], index: int, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text", "")) + _need_str(delta, "text")
        elif kind == "input_json_delta":
            if index not in self.json_parts:
                raise ParseError(f"{API}: input_json_delta for a block that takes no input")
            self.json_parts[index].append(_need_str(delta, "partial_json"))
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking", "")) + _need_str(delta, "thinking")
        elif kind == "signature_delta":
            block["signature"] = _need_str(delta, "signature")
        elif kind == "citations_delta":
            citations = block.get("citations")
            if not isinstance(citations, list):
                citations = block["citations"] = []
            citations.append(delta["citation"])
        # Unknown delta types are skipped, as unknown events are.

    def finish_block(self, index: Any, *, strict: bool) -> None:
        """Parse the concatenated tool input; a truncated one stays as it started."""
        if not isinstance(index, int):
            raise ParseError(f"{API}: content block index {index!r} is not an integer")
        parts = self.json_parts.pop(index, None)
        if parts is None:
            return
        text = "".join(parts)
        if not text.strip():
            return  # a tool called without arguments: the start's input ({}) stands
        try:
            value = json.loads(text)
        except ValueError as exc:
            if strict:
                raise ParseError(f"{API}: tool input of block {index} is not JSON: {exc}") from exc
            return
        self.content()[index]["input"] = value

    def apply_message_delta(self, data: dict[str, Any]) -> None:
        assert self.message is not None
        for key, value in _c.obj(data.get("delta", {}), "message_delta 'delta'").items():
            self.message[key] = value
        usage = data.get("usage")
        if usage is not None:
            # Counts are cumulative: they overwrite; absent or null ones keep the
            # message_start value (input and cache counts usually come only there).
            current = self.message.get("usage")
            merged = dict(current) if isinstance(current, dict) else {}
            for key, value in _c.obj(usage, "message_delta 'usage'").items():
                if value is not None:
                    merged[key] = value
            self.message["usage"] = merged
        for key, value in data.items():
            if key not in ("type", "delta", "usage"):
                self.message[key] = value  # e.g. context_management (beta)

    def result(self) -> ParsedResponse:
        if self.message is None:
            return no_response(self.error, complete=False)
        for index in list(self.json_parts):
            self.finish_block(index, strict=False)
        return _parsed_message(
            self.message, complete=self.complete and self.error is None, error=self.error
        )


def _need_str(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ParseError(f"{API}: {obj.get('type')!r} has no string {key!r}")
    return value


@_c.guarded
def parse_stream(events: Sequence[SseEvent]) -> ParsedResponse:
    """Assemble a streamed Message; ``complete`` only when message_stop arrived."""
    assembler = _StreamAssembler()
    for event in events:
        if not event.data.strip():
            continue
        assembler.apply(_c.obj(json.loads(event.data), f"data of {event.event!r} event"))
    return assembler.result()


ADAPTER = Adapter(
    api=API,
    matches=matches,
    parse_request=parse_request,
    parse_response=parse_response,
    parse_stream=parse_stream,
)
