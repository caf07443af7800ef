"""OpenAI Chat Completions (POST /v1/chat/completions): requests, ChatCompletion bodies, streams.

A stream is a sequence of ``chat.completion.chunk`` objects (``data:`` lines with no
``event:`` line) ending in ``data: [DONE]``. Each chunk carries per-choice deltas:
``content`` and ``refusal`` text, and ``tool_calls`` fragments keyed by their
``index`` whose ``function.arguments`` concatenate to the JSON arguments. With
``stream_options.include_usage`` the last chunk has no choices and the usage.
"""

from __future__ import annotations

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

API = "openai_chat"
LIST_KEY = "messages"
DONE = "[DONE]"

_c = Checks(API)


def matches(method: str, path: str) -> bool:
    """POST .../chat/completions (with or without /v1, any query)."""
    return method.upper() == "POST" and route(path).endswith("/chat/completions")


def _tool_name(tool: dict[str, Any]) -> Any:
    """A declared tool's ``function.name`` (or ``custom.name``), else its name or type."""
    kind = tool.get("type")
    spec = tool.get(kind) if isinstance(kind, str) else None
    return spec.get("name") if isinstance(spec, dict) else tool.get("name", kind)


# ``messages`` is always a list; ``"stream": null`` means not streamed; a tool's name
# sits under its type (``{"type": "function", "function": {"name": ...}}``).
_REQUEST = RequestShape(
    list_key=LIST_KEY, items_must_be_list=True, stream_may_be_null=True, tool_name=_tool_name
)


@_c.guarded
def parse_request(body: dict[str, Any]) -> ParsedRequest:
    """Split a Chat Completions request into its ``messages`` and everything else."""
    return parse_request_body(_c, _REQUEST, body)


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        input_tokens=opt_int(usage.get("prompt_tokens")),
        output_tokens=opt_int(usage.get("completion_tokens")),
        cache_read_tokens=opt_int(cached),
    )


def _error_text(error: Any) -> str:
    """``type: message`` of an API error object (``code`` when it has no type)."""
    return error_text(error, ("type", "code"))


def _output_message(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as a client sends it back in the next request."""
    item: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("refusal") is not None:
        item["refusal"] = message["refusal"]
    if message.get("tool_calls"):
        item["tool_calls"] = message["tool_calls"]
    return item


def _parsed_completion(
    completion: dict[str, Any], *, complete: bool, error: str | None
) -> ParsedResponse:
    choices = _c.arr(completion.get("choices"), "'choices'")
    first = min(
        (_c.obj(c, "a choice") for c in choices), key=lambda c: c.get("index", 0), default=None
    )
    message = _c.obj(first.get("message"), "choice 'message'") if first is not None else None
    tool_calls: list[str] = []
    if message is not None:
        for call in _c.arr(message.get("tool_calls") or [], "'tool_calls'"):
            call = _c.obj(call, "a tool call")
            kind = call.get("type", "function")
            spec = call.get(kind) if isinstance(kind, str) else None
            if isinstance(spec, dict) and isinstance(spec.get("name"), str):
                tool_calls.append(spec["name"])
    return ParsedResponse(
        response=completion,
        output_items=[_output_message(message)] if message is not None else [],
        response_id=_c.opt_str(completion.get("id"), "'id'"),
        model=_c.opt_str(completion.get("model"), "'model'"),
        stop_reason=_c.opt_str(first.get("finish_reason"), "'finish_reason'") if first else None,
        usage=_usage(completion.get("usage")),
        tool_calls=tool_calls,
        complete=complete,
        error=error,
    )


@_c.guarded
def parse_response(body: dict[str, Any]) -> ParsedResponse:
    """A non-streaming body: a ChatCompletion, or an error body ``{"error": {...}}``."""
    body = _c.obj(body, "response body")
    if "choices" not in body and isinstance(body.get("error"), dict):
        return no_response(_error_text(body["error"]))
    if body.get("object", "chat.completion") != "chat.completion":
        raise ParseError(f"{API}: response object is {body.get('object')!r}")
    return _parsed_completion(body, complete=True, error=None)


# Keys of a chunk that describe the completion as a whole, copied onto it.
_CHUNK_ONLY_KEYS = frozenset({"choices", "object", "usage", "obfuscation"})


def _merge_tool_call(calls: dict[int, dict[str, Any]], fragment: dict[str, Any]) -> None:
    """Fold one ``tool_calls`` delta into the call with the same index."""
    index = fragment["index"]
    if not isinstance(index, int):
        raise ParseError(f"{API}: tool call index {index!r} is not an integer")
    call = calls.setdefault(index, {})
    for key, value in fragment.items():
        if key == "index" or value is None:
            continue
        if key in ("id", "type"):
            call.setdefault(key, value)  # sent once; some servers repeat it
        elif isinstance(value, dict):
            # {"function": {"name": ..., "arguments": ...}}: text fields concatenate
            spec = call.setdefault(key, {})
            for sub_key, sub_value in value.items():
                previous = spec.get(sub_key)
                if isinstance(previous, str) and isinstance(sub_value, str):
                    spec[sub_key] = previous + sub_value
                elif sub_value is not None or sub_key not in spec:
                    spec[sub_key] = sub_value
        else:
            call[key] = value
    call.setdefault("type", "function")


class _Choice:
    """One choice's accumulated message."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.extra: dict[str, Any] = {}

    def apply(self, choice: dict[str, Any]) -> None:
        delta = _c.obj(choice.get("delta", {}), "choice 'delta'")
        for key, value in delta.items():
            if key == "tool_calls":
                for fragment in _c.arr(value or [], "delta 'tool_calls'"):
                    _merge_tool_call(self.tool_calls, _c.obj(fragment, "a tool call delta"))
            elif value is None:
                self.message.setdefault(key, None)
            elif isinstance(value, str) and key != "role":
                # content, refusal, and servers' reasoning text (reasoning_content)
                previous = self.message.get(key)
                self.message[key] = (previous if isinstance(previous, str) else "") + value
            else:
                self.message[key] = value
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            if self.logprobs is None:
                self.logprobs = {}
            for key, value in logprobs.items():
                if isinstance(value, list):
                    self.logprobs[key] = list(self.logprobs.get(key) or []) + value
                else:
                    self.logprobs.setdefault(key, value)
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None:
            self.finish_reason = _c.opt_str(finish_reason, "'finish_reason'")
        for key, value in choice.items():
            if key not in ("index", "delta", "logprobs", "finish_reason"):
                self.extra[key] = value

    def result(self) -> dict[str, Any]:
        message = dict(self.message)
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.get("id"), "type": c.get("type"), **c}
                for _, c in sorted(self.tool_calls.items())
            ]
        return {
            "index": self.index,
            "message": message,
            "logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
            **self.extra,
        }


@_c.guarded
def parse_stream(events: Sequence[SseEvent]) -> ParsedResponse:
    """Assemble chunks into a ChatCompletion; ``complete`` needs [DONE] and finish reasons."""
    completion: dict[str, Any] | None = None
    choices: dict[int, _Choice] = {}
    usage: Any = None
    done = False
    error: str | None = None
    for event in events:
        data = event.data.strip()
        if not data:
            continue
        if data == DONE:
            done = True
            continue
        chunk = _c.obj(json.loads(data), "chunk")
        if "choices" not in chunk and "error" in chunk:
            error = _error_text(chunk["error"])
            continue
        if completion is None:
            completion = {}
        for key, value in chunk.items():
            if key not in _CHUNK_ONLY_KEYS:
                completion[key] = value
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        for raw in _c.arr(chunk.get("choices", []), "'choices'"):
            raw = _c.obj(raw, "a choice")
            index = raw.get("index", 0)
            if not isinstance(index, int):
                raise ParseError(f"{API}: choice index {index!r} is not an integer")
            choices.setdefault(index, _Choice(index)).apply(raw)
    if completion is None:
        return no_response(error, complete=False)
    assembled: dict[str, Any] = {
        "id": completion.pop("id", None),
        "object": "chat.completion",
        "created": completion.pop("created", None),
        "model": completion.pop("model", None),
        "choices": [choice.result() for _, choice in sorted(choices.items())],
        "usage": usage,
        **completion,
    }
    finished = bool(choices) and all(c.finish_reason is not None for c in choices.values())
    return _parsed_completion(assembled, complete=done and finished and error is None, error=error)


ADAPTER = Adapter(
    api=API,
    matches=matches,
    parse_request=parse_request,
    parse_response=parse_response,
    parse_stream=parse_stream,
)
