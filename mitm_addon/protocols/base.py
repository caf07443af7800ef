"""Types shared by the provider adapters.

An adapter turns one API's wire format into the pieces Forge stores:

* a request body becomes ``ParsedRequest``: the conversation items it carries (the
  value of ``messages`` or ``input``) and the rest of the body (``params``), so that
  ``reconstruct_request(params, items, ...)`` gives back the body exactly (as
  canonical JSON);
* a response (one JSON body, a list of SSE events, or WebSocket messages) becomes
  ``ParsedResponse``: the response assembled into the API's non-streaming JSON
  shape, and the output items in the form a harness sends them back next turn.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")


class ParseError(ValueError):
    """A body or stream does not have the shape its API documents."""


def route(path: str) -> str:
    """A request path without its query, fragment and trailing slashes."""
    return path.split("?", 1)[0].split("#", 1)[0].rstrip("/")


def declared_name(tool: dict[str, Any]) -> Any:
    """A declared tool's ``name``, else its ``type`` (built-in tools have only a type)."""
    return tool.get("name", tool.get("type"))


class Checks:
    """Shape checks for one API's parser; each failure is a ParseError naming the API."""

    def __init__(self, api: str) -> None:
        self.api = api

    def guarded(self, fn: Callable[_P, _R]) -> Callable[_P, _R]:
        """Turn any lookup or type slip on malformed input into ParseError."""
        api = self.api

        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return fn(*args, **kwargs)
            except ParseError:
                raise
            # RecursionError: JSON nested deeper than the interpreter's stack (json.loads,
            # copy.deepcopy) is malformed input too, not a crash.
            except (
                KeyError,
                IndexError,
                TypeError,
                AttributeError,
                ValueError,
                RecursionError,
            ) as exc:
                raise ParseError(f"{api}: malformed input ({type(exc).__name__}: {exc})") from exc

        return wrapper

    def obj(self, value: Any, what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ParseError(f"{self.api}: {what} is not a JSON object")
        return value

    def arr(self, value: Any, what: str) -> list[Any]:
        if not isinstance(value, list):
            raise ParseError(f"{self.api}: {what} is not a JSON array")
        return value

    def opt_str(self, value: Any, what: str) -> str | None:
        if value is not None and not isinstance(value, str):
            raise ParseError(f"{self.api}: {what} is not a string")
        return value

    def tool_names(
        self, tools: Any, name_of: Callable[[dict[str, Any]], Any] = declared_name
    ) -> list[str]:
        """The names of a request's declared tools (none when ``tools`` is absent).

        ``name_of`` reads one tool's name; a tool whose name is not a string is left out.
        """
        if tools is None:
            return []
        names: list[str] = []
        for tool in self.arr(tools, "tools"):
            name = name_of(self.obj(tool, "a tool"))
            if isinstance(name, str):
                names.append(name)
        return names


def opt_int(value: Any) -> int | None:
    """An integer, else None (booleans are not integers here)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def error_text(error: Any, kind_keys: Sequence[str]) -> str:
    """``kind: message`` of an API error object; the kind is the first of ``kind_keys``
    with a truthy value (else the last one's value)."""
    if not isinstance(error, dict):
        return str(error)
    kind: Any = None
    for key in kind_keys:
        kind = error.get(key)
        if kind:
            break
    message = error.get("message")
    if isinstance(kind, str) and isinstance(message, str):
        return f"{kind}: {message}"
    return str(message if message is not None else kind)


@dataclass(frozen=True)
class SseEvent:
    """One server-sent event: ``event`` is None when the stream names no event type."""

    event: str | None
    data: str
    id: str | None = None


@dataclass(frozen=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


@dataclass(frozen=True)
class ParsedRequest:
    api: str
    model: str | None
    stream: bool
    list_key: str  # "messages" or "input"
    items: list[Any]
    items_form: str  # "list", or "string" for a bare-string Responses input
    params: dict[str, Any]  # the body minus list_key
    previous_response_id: str | None = None
    tools: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ParsedResponse:
    response: dict[str, Any] | None  # the API's non-streaming JSON shape
    output_items: list[Any]  # items as a harness sends them back next turn
    response_id: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    usage: Usage | None = None
    tool_calls: list[str] = field(default_factory=list)
    complete: bool = True  # False: the stream ended before its terminal event
    error: str | None = None  # an API error (error body or error event)


def no_response(error: str | None, *, complete: bool = True) -> ParsedResponse:
    """A response with no body to assemble: an API error body, or a stream that never
    got its first event (``complete=False``)."""
    return ParsedResponse(response=None, output_items=[], complete=complete, error=error)


@dataclass(frozen=True)
class RequestShape:
    """Where one API's request bodies differ; ``parse_request_body`` reads the rest."""

    list_key: str  # the key of the conversation items: "messages" or "input"
    items_must_be_list: bool  # False: a bare string, or no items at all, is valid too
    stream_may_be_null: bool  # True: ``"stream": null`` means not streamed
    tool_name: Callable[[dict[str, Any]], Any] = declared_name  # one declared tool's name
    has_previous_response_id: bool = False  # the request may continue a stored response


def parse_request_body(checks: Checks, shape: RequestShape, body: dict[str, Any]) -> ParsedRequest:
    """A request body split into its items and params, with model, stream and tools read.

    Raises ParseError (or a lookup error, which ``Checks.guarded`` turns into one).
    """
    params, items, items_form = split_request(body, shape.list_key)
    if shape.items_must_be_list and items_form != "list":
        raise ParseError(f"{checks.api}: {shape.list_key!r} must be a list")
    stream = params.get("stream", False)
    if stream is None and shape.stream_may_be_null:
        stream = False
    if not isinstance(stream, bool):
        raise ParseError(f"{checks.api}: 'stream' is not a boolean")
    model = checks.opt_str(params.get("model"), "'model'")
    previous_response_id = (
        checks.opt_str(params.get("previous_response_id"), "'previous_response_id'")
        if shape.has_previous_response_id
        else None
    )
    return ParsedRequest(
        api=checks.api,
        model=model,
        stream=stream,
        list_key=shape.list_key,
        items=items,
        items_form=items_form,
        params=params,
        previous_response_id=previous_response_id,
        tools=checks.tool_names(params.get("tools"), shape.tool_name),
    )


@dataclass(frozen=True)
class Adapter:
    """One API: which requests it owns and how to parse them."""

    api: str
    matches: Callable[[str, str], bool]  # (method, path) -> is a model call of this API
    parse_request: Callable[[dict[str, Any]], ParsedRequest]
    parse_response: Callable[[dict[str, Any]], ParsedResponse]
    parse_stream: Callable[[Sequence[SseEvent]], ParsedResponse]
    # WebSocket transport (Responses API only): client and server text messages.
    parse_ws: Callable[[Sequence[str]], ParsedResponse] | None = None


def reconstruct_request(
    params: dict[str, Any], list_key: str, items: list[Any], items_form: str
) -> dict[str, Any]:
    """The request body rebuilt from what is stored (inverse of parse_request)."""
    body = dict(params)
    if items_form == "string":
        if len(items) != 1 or not isinstance(items[0], str):
            raise ParseError("a string-form request holds exactly one string item")
        body[list_key] = items[0]
    elif items_form == "absent":
        pass
    else:
        body[list_key] = list(items)
    return body


def split_request(body: dict[str, Any], list_key: str) -> tuple[dict[str, Any], list[Any], str]:
    """(params, items, items_form) of a request body whose items live under list_key."""
    if not isinstance(body, dict):
        raise ParseError("request body is not a JSON object")
    params = {k: v for k, v in body.items() if k != list_key}
    if list_key not in body:
        return params, [], "absent"
    value = body[list_key]
    if isinstance(value, str):
        return params, [value], "string"
    if not isinstance(value, list):
        raise ParseError(f"{list_key!r} is neither a list nor a string")
    return params, list(value), "list"
