"""From a captured call to the rows Forge stores (pure apart from the token estimate).

``build_rows`` turns a ``Capture`` into one ``calls`` row and the ``messages`` rows
its request and response need: the request body is split into its parameters (one
content-addressed row, shared by every call with the same system prompt and tools)
and its items (a hash chain, so a 100-turn conversation stores each item once).

Its pieces (``capture_row``, ``request_columns``, ``response_columns``,
``usage_columns``, ``call_status``, ``message_row``) are pure and public, so that the
benchmark's shard generator (``bench.gen_shards``) builds its rows with them too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mitm_addon import sse
from mitm_addon.bodies import BodyError, decode_body
from mitm_addon.capture import Capture
from mitm_addon.protocols import find_adapter, openai_responses
from mitm_addon.protocols.base import ParsedRequest, ParsedResponse, ParseError
from pipeline.actions import gui_actions
from pipeline.canonical import REF_KEY, REF_MIN_BYTES, canonical_json, chain_hashes, item_hash
from pipeline.images import Image, extract_images, image_refs

# Request headers that identify harness sessions and agents -> calls column.
HARNESS_HEADERS = {
    "x-claude-code-session-id": "claude_session_id",
    "x-claude-code-agent-id": "claude_agent_id",
    "x-claude-code-parent-agent-id": "claude_parent_agent_id",
    "session-id": "codex_session_id",
    "thread-id": "codex_thread_id",
    "x-codex-parent-thread-id": "codex_parent_thread_id",
    "x-openai-subagent": "openai_subagent",
    "x-session-id": "opencode_session_id",
    "x-parent-session-id": "opencode_parent_session_id",
    "x-openclaw-session-id": "openclaw_session_id",
    "traceparent": "traceparent",
    "user-agent": "user_agent",
}
# A response body decoded past this size is refused (build_rows's default limit).
MAX_BODY_BYTES = 256 * 1024 * 1024
# Error text kept per call; a full error body is rarely useful past this.
_ERROR_CHARS = 4000


_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _reject_constant(name: str) -> Any:
    raise ParseError(f"JSON holds {name}, which canonical JSON cannot store")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ParseError(f"JSON number {text[:40]} overflows a double")
    return value


def _clean_strings(value: Any) -> Any:
    """Lone UTF-16 surrogates (a client splitting an emoji) replaced, so the value encodes."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_clean_strings(v) for v in value]
    if isinstance(value, dict):
        return {_clean_strings(k): _clean_strings(v) for k, v in value.items()}
    return value


def loads(data: bytes | str) -> Any:
    """JSON as Forge stores it: finite numbers only, strings that encode as UTF-8.

    Raises ParseError for anything else (invalid JSON, NaN, 1e400, nesting too deep).
    """
    try:
        value = json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError as e:
        raise ParseError("JSON nested too deeply") from e
    except ValueError as e:
        raise ParseError(f"not JSON: {e}") from e
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if _LONE_SURROGATE.search(raw):
        value = _clean_strings(value)
    return value


@dataclass(frozen=True)
class Rows:
    call: dict[str, Any]
    messages: list[dict[str, Any]]
    images: list[dict[str, Any]] = field(default_factory=list)


def image_row(image: Image, call_id: str) -> dict[str, Any]:
    """One ``images`` row (grain: hash)."""
    size = image.size
    return {
        "hash": image.hash,
        "media_type": image.media_type,
        "bytes": len(image.data),
        "width": size[0] if size else None,
        "height": size[1] if size else None,
        "data": image.data,
        "first_call_id": call_id,
    }


def take_images(items: list[Any]) -> tuple[list[Any], list[Image]]:
    """Items with their inline images replaced by references (``pipeline.images``), and
    the images, one per occurrence."""
    out, images = [], []
    for item in items:
        stored, found = extract_images(item)
        out.append(stored)
        images += found
    return out, images


def _ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _ms(end: float | None, start: float | None) -> float | None:
    return (end - start) * 1000.0 if end is not None and start is not None else None


def message_row(
    h: str,
    parent: str | None,
    canonical: str,
    item: Any,
    call_id: str,
    kind: str,
    content_bytes: int | None = None,
) -> dict[str, Any]:
    """One ``messages`` row (grain: hash): an item, the params, or one param part.

    ``content_bytes`` is the UTF-8 length of ``canonical``, when the caller knows it.
    """
    role = item.get("role") if isinstance(item, dict) else None
    item_type = item.get("type") if isinstance(item, dict) else None
    return {
        "hash": h,
        "parent_hash": parent,
        "kind": kind,
        "role": role if isinstance(role, str) else None,
        "item_type": item_type if isinstance(item_type, str) else None,
        "content_json": canonical,
        "content_bytes": (
            content_bytes if content_bytes is not None else len(canonical.encode("utf-8"))
        ),
        "first_call_id": call_id,
    }


def split_params(params: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str, Any]]]:
    """Params with large top-level values (and large elements of top-level lists) replaced
    by ``{"$forge_ref": hash}``, and the (hash, canonical JSON, value) of each part.

    Harnesses resend a system prompt and tool list of tens of kB on every call, and some
    change a small block of it each time (Claude Code's billing header): storing the big
    parts once keeps a run's storage linear in what is new.
    """
    parts: list[tuple[str, str, Any]] = []

    def ref(value: Any, canonical: str) -> dict[str, str]:
        h = item_hash(canonical, None)
        parts.append((h, canonical, value))
        return {REF_KEY: h}

    out: dict[str, Any] = {}
    for key, value in params.items():
        canonical = canonical_json(value)
        if len(canonical) < REF_MIN_BYTES:
            out[key] = value
        elif isinstance(value, list):
            elements = []
            for element in value:
                c = canonical_json(element)
                elements.append(ref(element, c) if len(c) >= REF_MIN_BYTES else element)
            out[key] = elements
        else:
            out[key] = ref(value, canonical)
    return out, parts


def api_of(capture: Capture) -> str:
    """The API a captured call was made to, from its transport and path alone."""
    if capture.transport == "websocket":
        return openai_responses.ADAPTER.api
    adapter = find_adapter(capture.method, capture.path)
    return adapter.api if adapter is not None else "unknown"


def parse_request_body(capture: Capture) -> ParsedRequest:
    """The parsed request; raises ParseError."""
    if capture.transport == "websocket":
        text = capture.request_body.decode("utf-8", "replace")
        return openai_responses.parse_ws_request(text)
    adapter = find_adapter(capture.method, capture.path)
    if adapter is None:
        raise ParseError(f"no adapter for {capture.method} {capture.path}")
    body = loads(capture.request_body)  # the hook stores request bodies already decoded
    return adapter.parse_request(body)


def parse_response_body(
    capture: Capture, api: str, limit: int
) -> tuple[ParsedResponse, int | None]:
    """(parsed response, number of stream events); raises ParseError or BodyError."""
    if capture.transport == "websocket":
        messages = loads(capture.response_body or b"[]")
        if openai_responses.ADAPTER.parse_ws is None:
            raise ParseError("no WebSocket parser")
        return openai_responses.ADAPTER.parse_ws(messages), len(messages)
    adapter = find_adapter(capture.method, capture.path)
    if adapter is None or adapter.api != api:
        raise ParseError(f"no adapter for {capture.method} {capture.path}")
    raw = decode_body(
        capture.response_body, capture.response_headers.get("content-encoding"), limit
    )
    if capture.transport == "sse":
        events = sse.parse_sse(raw)
        return adapter.parse_stream(events), len(events)
    body = loads(raw)
    if not isinstance(body, dict):
        raise ParseError("response body is not a JSON object")
    return adapter.parse_response(body), None


# What a malformed body can raise while it is parsed, hashed or canonicalised.
_BAD_INPUT = (ParseError, BodyError, ValueError, RecursionError, TypeError)


def build_rows(
    capture: Capture,
    previous_response_head: Callable[[str], str | None],
    limit: int = MAX_BODY_BYTES,
    estimate_tokens: Callable[[str], int] | None = None,
) -> Rows:
    """The calls row and messages rows of one captured call. Never raises: a call whose
    bodies cannot be parsed still gets its row, with the reason in ``parse_error``.

    ``previous_response_head(response_id)`` gives the response_head_hash of an earlier
    Responses call, so a request that carries only new items (``previous_response_id``)
    still chains onto the whole conversation.
    """
    row = capture_row(capture)
    try:
        return _build_rows(capture, row, previous_response_head, limit, estimate_tokens)
    except Exception as e:  # a bug in a parser must not lose the call: keep its metadata
        row = capture_row(capture)
        row["api"] = api_of(capture)
        row["status"], row["error"] = call_status(capture, None, None)
        reason = f"forge could not parse this call ({type(e).__name__}: {e})"
        row["parse_error"] = reason[:_ERROR_CHARS]
        return Rows(call=_utf8_safe(row), messages=[])


def capture_row(capture: Capture) -> dict[str, Any]:
    """A calls row (grain: call_id) with the columns that come from the capture itself,
    no parsing; every other column None."""
    row: dict[str, Any] = dict.fromkeys(_CALL_COLUMNS)
    row.update(
        call_id=capture.call_id,
        run_id=capture.run_id,
        rollout_id=capture.rollout_id,
        rollout_source=capture.rollout_source,
        client_conn_id=capture.client_conn_id,
        pid=capture.pid,
        parent_pids=capture.parent_pids or None,
        process_name=capture.process_name,
        transport=capture.transport,
        method=capture.method,
        host=capture.host,
        path=capture.path,
        upstream_url=capture.upstream_url,
        status_code=capture.status_code,
        started_at=_ts(capture.started_at),
        first_byte_at=_ts(capture.first_byte_at),
        ended_at=_ts(capture.ended_at),
        duration_ms=_ms(capture.ended_at, capture.started_at),
        ttfb_ms=_ms(capture.first_byte_at, capture.started_at),
        request_bytes=capture.request_wire_bytes or len(capture.request_body),
        request_encoding=capture.request_encoding,
        request_headers=capture.request_headers or None,
        response_bytes=capture.response_wire_bytes or len(capture.response_body),
        response_headers=capture.response_headers or None,
        stream_events=capture.stream_events,
        policy_version=capture.policy_version,
        drift=capture.drift,
        prompt_ids=capture.prompt_ids,
        prompt_parent_call_id=capture.prompt_parent_call_id,
        completion_ids=capture.completion_ids,
        completion_logprobs=capture.completion_logprobs,
        finish_reason=capture.finish_reason,
    )
    for header, column in HARNESS_HEADERS.items():
        row[column] = capture.request_headers.get(header)
    return row


def _build_rows(
    capture: Capture,
    row: dict[str, Any],
    previous_response_head: Callable[[str], str | None],
    limit: int,
    estimate_tokens: Callable[[str], int] | None,
) -> Rows:
    messages: list[dict[str, Any]] = []
    images: list[Image] = []
    errors: list[str] = []
    api = row["api"] = api_of(capture)
    request: ParsedRequest | None = None
    head: str | None = None
    try:
        request = parse_request_body(capture)
        stored_items, images = take_images(request.items)
        request_rows, head = _request_rows(
            capture.call_id, request, stored_items, previous_response_head
        )
        messages += request_rows
        params_hash = request_rows[0]["hash"] if request_rows else None
        row.update(request_columns(request, params_hash, head))
        row["request_images"] = image_refs(stored_items) or None
    except _BAD_INPUT as e:
        request, head, images = None, None, []
        errors.append(f"request: {e}")

    response: ParsedResponse | None = None
    response_error: str | None = None
    if capture.response_body or capture.transport == "websocket":
        try:
            response, events = parse_response_body(capture, api, limit)
            if events is not None:
                row["stream_events"] = events
            output_items, output_images = take_images(response.output_items)
            out_rows = chain_hashes(output_items, head)
            response_json = (
                canonical_json(response.response) if response.response is not None else None
            )
            messages += [
                message_row(h, p, c, item, capture.call_id, "item")
                for (h, p, c), item in zip(out_rows, output_items, strict=True)
            ]
            images += output_images
            response_head = out_rows[-1][0] if out_rows else None
            row.update(response_columns(response, response_head, response_json))
        except _BAD_INPUT as e:
            response = None
            response_error = f"response: {e}"
            errors.append(response_error)
    if capture.response_truncated:
        errors.append("response: larger than forge_max_body_bytes, not kept whole")

    row.update(usage_columns(capture, request, response, estimate_tokens))
    row["status"], row["error"] = call_status(capture, response, response_error)
    row["parse_error"] = "; ".join(errors) or None
    unique = {image.hash: image for image in images}
    return Rows(
        call=_utf8_safe(row),
        messages=messages,
        images=[image_row(image, capture.call_id) for image in unique.values()],
    )


def request_columns(
    request: ParsedRequest, params_hash: str | None, head: str | None
) -> dict[str, Any]:
    """The calls columns read from a parsed request; ``params_hash`` is its params row's
    hash, ``head`` the hash its item chain ends in."""
    return {
        "model": request.model,
        "stream": request.stream,
        "request_params_hash": params_hash,
        "request_head_hash": head,
        "request_list_key": request.list_key,
        "request_items": len(request.items),
        "request_items_form": request.items_form,
        "previous_response_id": request.previous_response_id,
        "tools": request.tools,
        # Codex warms a WebSocket up with generate:false: no output, but later calls
        # name its response in previous_response_id, so its items are kept.
        "prewarm": request.params.get("generate") is False,
    }


def response_columns(
    response: ParsedResponse, head: str | None, response_json: str | None
) -> dict[str, Any]:
    """The calls columns read from a parsed response; ``head`` is the hash of its last
    output item (None without output), ``response_json`` its canonical JSON."""
    return {
        "response_id": response.response_id,
        "response_model": response.model,
        "response_head_hash": head,
        "response_items": len(response.output_items),
        "response_json": response_json,
        "stop_reason": response.stop_reason,
        "tool_calls": response.tool_calls,
        "actions": gui_actions(response.output_items) or None,
    }


def usage_columns(
    capture: Capture,
    request: ParsedRequest | None,
    response: ParsedResponse | None,
    estimate_tokens: Callable[[str], int] | None,
) -> dict[str, Any]:
    """The token count columns: the policy's exact counts for a served call, else the
    response's usage, else (with ``estimate_tokens``) an estimate; else none."""
    if capture.completion_ids is not None and capture.prompt_tokens is not None:
        # Served by the policy: the exact counts, whatever the reply's shape reports.
        return {
            "input_tokens": capture.prompt_tokens,
            "output_tokens": len(capture.completion_ids),
            "usage_estimated": False,
        }
    if response is None:
        return {}
    usage = response.usage
    if usage is not None:
        return {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_read_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "usage_estimated": False,
        }
    if estimate_tokens is not None and request is not None:
        return {
            "input_tokens": estimate_tokens(
                canonical_json(request.items) + canonical_json(request.params)
            ),
            "output_tokens": estimate_tokens(canonical_json(response.output_items)),
            "usage_estimated": True,
        }
    return {}


def _text(value: str) -> str:
    """The string as it can be stored: lone surrogates (undecodable bytes) replaced."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _utf8_safe(row: dict[str, Any]) -> dict[str, Any]:
    """Every string of a calls row encodable as UTF-8 (header values, error texts, paths).

    Runs for every call: ASCII strings, nearly all of them, are left as they are."""
    for key, value in row.items():
        if isinstance(value, str):
            if not value.isascii():
                row[key] = _text(value)
        elif isinstance(value, dict):
            if not all(
                k.isascii() and (not isinstance(v, str) or v.isascii()) for k, v in value.items()
            ):
                row[key] = {
                    _text(k): _text(v) if isinstance(v, str) else v for k, v in value.items()
                }
        elif (
            isinstance(value, list)
            and value
            and isinstance(value[0], str)
            and not all(v.isascii() for v in value)
        ):
            row[key] = [_text(v) for v in value]
    return row


def _request_rows(
    call_id: str,
    request: ParsedRequest,
    items: list[Any],
    previous_response_head: Callable[[str], str | None],
) -> tuple[list[dict[str, Any]], str | None]:
    """(messages rows, params row first; the chain's head hash) of a parsed request whose
    items, as stored, are ``items``."""
    params, parts = split_params(request.params)
    params_canonical = canonical_json(params)
    rows = [
        message_row(
            item_hash(params_canonical, None), None, params_canonical, params, call_id, "params"
        )
    ]
    rows += [message_row(h, None, c, value, call_id, "param") for h, c, value in parts]
    parent = (
        previous_response_head(request.previous_response_id)
        if request.previous_response_id
        else None
    )
    chain = chain_hashes(items, parent)
    rows += [
        message_row(h, p, c, item, call_id, "item")
        for (h, p, c), item in zip(chain, items, strict=True)
    ]
    return rows, (chain[-1][0] if chain else parent)


def call_status(
    capture: Capture, response: ParsedResponse | None, response_error: str | None
) -> tuple[str, str | None]:
    """(status, error): complete, error or incomplete, with the error text."""
    body_text = capture.response_body[:_ERROR_CHARS].decode("utf-8", "replace")
    if capture.status_code is not None and capture.status_code >= 400:
        return "error", f"HTTP {capture.status_code}: {body_text}"
    if (
        response_error
        and not capture.response_truncated
        and (not capture.error or capture.transport == "sse")
    ):
        # The provider answered, but not in its API's shape: the client failed on it too.
        # A stream's parser reads whole events only, so a malformed one is the provider's
        # even when the client, failing on it, hung up before the upstream's end reached
        # the proxy; a plain body cut short by a hang-up is merely incomplete.
        return "error", response_error[:_ERROR_CHARS]
    if capture.response_truncated and not capture.error:
        return "complete", None  # delivered whole; only Forge's copy was cut
    if response is not None and response.error:
        return "error", response.error[:_ERROR_CHARS]
    if response is not None and response.complete:
        # A client that closes right after the last event makes mitmproxy report an
        # error although every byte arrived: the call is complete.
        return "complete", None
    if capture.incomplete:
        return "incomplete", capture.error or "the proxy stopped before the call ended"
    if capture.error:
        return "incomplete", capture.error
    if response is None:
        return ("complete", None) if capture.status_code else ("incomplete", "no response")
    return "incomplete", "the stream ended before its final event"


def _columns() -> list[str]:
    from pipeline.schema import CALLS

    return [f.name for f in CALLS]


_CALL_COLUMNS = _columns()
