"""OpenAI Responses API (POST /v1/responses, chatgpt.com /backend-api/codex/responses).

Over HTTP a stream is SSE with ``event:`` lines; each data is one event object whose
``type`` matches the event name. ``response.created`` carries the response shell,
``response.output_item.added``/``.done`` open and close output items,
``response.content_part.*``, ``response.output_text.*``,
``response.function_call_arguments.*`` and ``response.reasoning_summary_*`` grow
them, and ``response.completed`` (or ``.incomplete`` / ``.failed``) carries the
final response object.

Codex CLI also speaks this API over a WebSocket to the same path: the client sends
``{"type": "response.create", ...request body...}`` as a text message, and the
server sends each event as one text message (the same JSON as the SSE data).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
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
    reconstruct_request,
    route,
)

API = "openai_responses"
LIST_KEY = "input"
WS_CREATE = "response.create"

# Events that end a response: after one of them the stream is complete.
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Events that carry a snapshot of the response while it is generated.
_SNAPSHOT_EVENTS = frozenset({"response.created", "response.queued", "response.in_progress"})

_c = Checks(API)


def matches(method: str, path: str) -> bool:
    """POST .../responses (/v1/responses, /responses, /backend-api/codex/responses)."""
    return method.upper() == "POST" and route(path).endswith("/responses")


def matches_websocket(path: str) -> bool:
    """Whether a WebSocket upgrade (GET) to this path carries Responses API traffic."""
    return route(path).endswith("/responses")


# ``input`` is a list, a bare string or absent; ``"stream": null`` means not streamed;
# function and custom tools go by ``name``, built-in tools by their ``type``; a request
# may continue a stored response (``previous_response_id``).
_REQUEST = RequestShape(
    list_key=LIST_KEY,
    items_must_be_list=False,
    stream_may_be_null=True,
    has_previous_response_id=True,
)


@_c.guarded
def parse_request(body: dict[str, Any]) -> ParsedRequest:
    """Split a Responses request into its ``input`` items and everything else."""
    return parse_request_body(_c, _REQUEST, body)


@_c.guarded
def parse_ws_request(text: str) -> ParsedRequest:
    """The client's ``response.create`` WebSocket message; ``type`` is not kept in params."""
    message = _c.obj(json.loads(text), "WebSocket message")
    if message.get("type") != WS_CREATE:
        raise ParseError(f"{API}: WebSocket message type is {message.get('type')!r}")
    return parse_request({k: v for k, v in message.items() if k != "type"})


def render_ws_request(parsed: ParsedRequest) -> dict[str, Any]:
    """The ``response.create`` message rebuilt from a parsed one (inverse of parse_ws_request)."""
    body = reconstruct_request(parsed.params, parsed.list_key, parsed.items, parsed.items_form)
    return {"type": WS_CREATE, **body}


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    details = details if isinstance(details, dict) else {}
    return Usage(
        input_tokens=opt_int(usage.get("input_tokens")),
        output_tokens=opt_int(usage.get("output_tokens")),
        cache_read_tokens=opt_int(details.get("cached_tokens")),
        cache_write_tokens=opt_int(details.get("cache_write_tokens")),
    )


def _error_text(error: Any) -> str:
    """``code: message`` of an API error object (``type`` when it has no code)."""
    return error_text(error, ("code", "type"))


def _tool_call_name(item: Any) -> str | None:
    """Function and custom tool calls by name; built-in calls (web_search_call...) by type."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if not isinstance(kind, str) or not kind.endswith("_call"):
        return None
    name = item.get("name")
    return name if isinstance(name, str) else kind


def _stop_reason(response: dict[str, Any]) -> str | None:
    details = response.get("incomplete_details")
    if isinstance(details, dict) and isinstance(details.get("reason"), str):
        return str(details["reason"])
    return _c.opt_str(response.get("status"), "'status'")


def _parsed(response: dict[str, Any], *, complete: bool, error: str | None) -> ParsedResponse:
    output = _c.arr(response.get("output", []), "'output'")
    if error is None and isinstance(response.get("error"), dict):
        error = _error_text(response["error"])
    return ParsedResponse(
        response=response,
        output_items=list(output),
        response_id=_c.opt_str(response.get("id"), "'id'"),
        model=_c.opt_str(response.get("model"), "'model'"),
        stop_reason=_stop_reason(response),
        usage=_usage(response.get("usage")),
        tool_calls=[name for name in map(_tool_call_name, output) if name is not None],
        complete=complete,
        error=error,
    )


@_c.guarded
def parse_response(body: dict[str, Any]) -> ParsedResponse:
    """A non-streaming body: a Response object, or an error body ``{"error": {...}}``."""
    body = _c.obj(body, "response body")
    if body.get("object") != "response":
        if isinstance(body.get("error"), dict):
            return no_response(_error_text(body["error"]))
        raise ParseError(f"{API}: response object is {body.get('object')!r}")
    return _parsed(body, complete=True, error=None)


class _StreamAssembler:
    """Rebuilds the response from events, the way the SDK's snapshot does."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] | None = None  # latest created/in_progress response
        self.final: dict[str, Any] | None = None  # response of the terminal event
        self.items: dict[int, dict[str, Any]] = {}  # output_index -> item being built
        self.error: str | None = None

    def item(self, event: dict[str, Any]) -> dict[str, Any] | None:
        index = event["output_index"]
        if not isinstance(index, int):
            raise ParseError(f"{API}: output_index {index!r} is not an integer")
        return self.items.get(index)

    def apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "error":
            # SSE: {"type":"error","code","message",...}; WebSocket wraps it:
            # {"type":"error","status":429,"error":{"type","code","message"}}
            inner = event.get("error")
            self.error = _error_text(inner if isinstance(inner, dict) else event)
        elif kind in _SNAPSHOT_EVENTS:
            self.snapshot = copy.deepcopy(_c.obj(event.get("response"), f"{kind} 'response'"))
        elif kind in TERMINAL_EVENTS:
            self.final = copy.deepcopy(_c.obj(event.get("response"), f"{kind} 'response'"))
        elif kind in ("response.output_item.added", "response.output_item.done"):
            index = event["output_index"]
            if not isinstance(index, int):
                raise ParseError(f"{API}: output_index {index!r} is not an integer")
            self.items[index] = copy.deepcopy(_c.obj(event.get("item"), "'item'"))
        elif kind in ("response.content_part.added", "response.content_part.done"):
            self.set_part(event, "content", "content_index", "part")
        elif kind in (
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_part.done",
        ):
            self.set_part(event, "summary", "summary_index", "part")
        elif kind == "response.output_text.delta":
            self.grow(event, "content", "content_index", "text", event["delta"])
        elif kind == "response.output_text.done":
            self.grow(event, "content", "content_index", "text", event["text"], replace=True)
        elif kind == "response.refusal.delta":
            self.grow(event, "content", "content_index", "refusal", event["delta"])
        elif kind == "response.reasoning_summary_text.delta":
            self.grow(event, "summary", "summary_index", "text", event["delta"])
        elif kind == "response.reasoning_summary_text.done":
            self.grow(event, "summary", "summary_index", "text", event["text"], replace=True)
        elif kind == "response.function_call_arguments.delta":
            item = self.item(event)
            if item is not None:
                item["arguments"] = str(item.get("arguments") or "") + str(event["delta"])
        elif kind == "response.function_call_arguments.done":
            item = self.item(event)
            if item is not None:
                item["arguments"] = str(event["arguments"])
        # Other events (annotations, built-in tool progress, rate limits, ...) add
        # nothing that output_item.done and the terminal response do not carry.

    def set_part(self, event: dict[str, Any], list_key: str, index_key: str, part_key: str) -> None:
        item = self.item(event)
        if item is None:
            return
        parts = item.get(list_key)
        if not isinstance(parts, list):
            parts = item[list_key] = []
        index = event[index_key]
        part = copy.deepcopy(_c.obj(event.get(part_key), f"'{part_key}'"))
        if not isinstance(index, int) or not 0 <= index <= len(parts):
            raise ParseError(f"{API}: {index_key} {index!r} skips a part")
        if index == len(parts):
            parts.append(part)
        else:
            parts[index] = part

    def grow(
        self,
        event: dict[str, Any],
        list_key: str,
        index_key: str,
        text_key: str,
        text: Any,
        *,
        replace: bool = False,
    ) -> None:
        if not isinstance(text, str):
            raise ParseError(f"{API}: {event.get('type')!r} carries no text")
        item = self.item(event)
        if item is None:
            return
        parts = _c.arr(item.get(list_key, []), f"item {list_key!r}")
        index = event[index_key]
        if not isinstance(index, int) or not 0 <= index < len(parts):
            return  # a delta for a part that was never opened: nothing to grow
        part = _c.obj(parts[index], "a part")
        part[text_key] = text if replace else str(part.get(text_key) or "") + text

    def result(self) -> ParsedResponse:
        built = [item for _, item in sorted(self.items.items())]
        if self.final is not None:
            if not self.final.get("output") and built:
                self.final["output"] = built  # some servers send the output only as items
            return _parsed(self.final, complete=True, error=self.error)
        if self.snapshot is None:
            return no_response(self.error, complete=False)
        self.snapshot["output"] = built
        return _parsed(self.snapshot, complete=False, error=self.error)


def _assemble(events: Iterable[dict[str, Any]]) -> ParsedResponse:
    assembler = _StreamAssembler()
    for event in events:
        assembler.apply(event)
    return assembler.result()


@_c.guarded
def parse_stream(events: Sequence[SseEvent]) -> ParsedResponse:
    """Assemble an SSE stream; ``complete`` when a terminal event arrived."""
    decoded: list[dict[str, Any]] = []
    for event in events:
        data = event.data.strip()
        if not data or data == "[DONE]":  # some compatible servers end with [DONE]
            continue
        decoded.append(_c.obj(json.loads(data), f"data of {event.event!r} event"))
    return _assemble(decoded)


@_c.guarded
def parse_ws(messages: Sequence[str]) -> ParsedResponse:
    """Assemble the server's WebSocket text messages of one response."""
    decoded: list[dict[str, Any]] = []
    for text in messages:
        message = _c.obj(json.loads(text), "WebSocket message")
        if message.get("type") == WS_CREATE:
            continue  # the client's request, if the caller passed the whole exchange
        decoded.append(message)
    return _assemble(decoded)


ADAPTER = Adapter(
    api=API,
    matches=matches,
    parse_request=parse_request,
    parse_response=parse_response,
    parse_stream=parse_stream,
    parse_ws=parse_ws,
)
