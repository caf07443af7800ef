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


def opt_int(value: Any) -> int | None:
    """An integer, else None (booleans are not integers here)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
