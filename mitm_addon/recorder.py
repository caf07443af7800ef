"""From a captured call to the rows Forge stores (pure apart from the token estimate).

``build_rows`` turns a ``Capture`` into one ``calls`` row and the ``messages`` rows
its request and response need: the request body is split into its parameters (one
content-addressed row, shared by every call with the same system prompt and tools)
and its items (a hash chain, so a 100-turn conversation stores each item once).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mitm_addon import sse
from mitm_addon.bodies import BodyError, decode_body
from mitm_addon.capture import Capture
from mitm_addon.protocols import find_adapter, openai_responses
from mitm_addon.protocols.base import ParsedRequest, ParsedResponse, ParseError
from pipeline.canonical import REF_KEY, REF_MIN_BYTES, canonical_json, chain_hashes, item_hash

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
# Error text kept per call; a full error body is rarely useful past this.
_ERROR_CHARS = 4000


@dataclass(frozen=True)
class Rows:
    call: dict[str, Any]
    messages: list[dict[str, Any]]


def _ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _ms(end: float | None, start: float | None) -> float | None:
    return (end - start) * 1000.0 if end is not None and start is not None else None


def _item_row(
    h: str, parent: str | None, canonical: str, item: Any, call_id: str, kind: str
) -> dict[str, Any]:
    role = item.get("role") if isinstance(item, dict) else None
    item_type = item.get("type") if isinstance(item, dict) else None
    return {
        "hash": h,
        "parent_hash": parent,
        "kind": kind,
        "role": role if isinstance(role, str) else None,
        "item_type": item_type if isinstance(item_type, str) else None,
        "content_json": canonical,
        "content_bytes": len(canonical.encode("utf-8")),
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
    try:  # the hook stores request bodies already decoded
        body = json.loads(capture.request_body)
    except ValueError as e:
        raise ParseError(f"request body is not JSON: {e}") from e
    return adapter.parse_request(body)


def parse_response_body(
    capture: Capture, api: str, limit: int
) -> tuple[ParsedResponse, int | None]:
    """(parsed response, number of stream events); raises ParseError or BodyError."""
    if capture.transport == "websocket":
        messages = json.loads(capture.response_body or b"[]")
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
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise ParseError(f"response body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise ParseError("response body is not a JSON object")
    return adapter.parse_response(body), None


def build_rows(
    capture: Capture,
    previous_response_head: Callable[[str], str | None],
    limit: int = 256 * 1024 * 1024,
    estimate_tokens: Callable[[str], int] | None = None,
) -> Rows:
    """The calls row and messages rows of one captured call.

    ``previous_response_head(response_id)`` gives the response_head_hash of an earlier
    Responses call, so a request that carries only new items (``previous_response_id``)
    still chains onto the whole conversation.
    """
    row: dict[str, Any] = {column: None for column in _CALL_COLUMNS}
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
    )
    for header, column in HARNESS_HEADERS.items():
        row[column] = capture.request_headers.get(header)

    messages: list[dict[str, Any]] = []
    errors: list[str] = []
    api = row["api"] = api_of(capture)
    request: ParsedRequest | None = None
    try:
        request = parse_request_body(capture)
    except ParseError as e:
        errors.append(f"request: {e}")

    head: str | None = None
    if request is not None:
        params, parts = split_params(request.params)
        for h, canonical, value in parts:
            messages.append(_item_row(h, None, canonical, value, capture.call_id, "param"))
        params_canonical = canonical_json(params)
        params_hash = item_hash(params_canonical, None)
        messages.append(
            _item_row(params_hash, None, params_canonical, params, capture.call_id, "params")
        )
        parent = (
            previous_response_head(request.previous_response_id)
            if request.previous_response_id
            else None
        )
        for h, p, canonical in chain_hashes(request.items, parent):
            messages.append(
                _item_row(h, p, canonical, json.loads(canonical), capture.call_id, "item")
            )
        head = messages[-1]["hash"] if request.items else parent
        row.update(
            model=request.model,
            stream=request.stream,
            request_params_hash=params_hash,
            request_head_hash=head,
            request_list_key=request.list_key,
            request_items=len(request.items),
            request_items_form=request.items_form,
            previous_response_id=request.previous_response_id,
            tools=request.tools,
            # Codex warms a WebSocket up with generate:false: no output, but later calls
            # name its response in previous_response_id, so its items are kept.
            prewarm=request.params.get("generate") is False,
        )

    response: ParsedResponse | None = None
    if capture.response_body or capture.transport == "websocket":
        try:
            response, events = parse_response_body(capture, api, limit)
            if events is not None:
                row["stream_events"] = events
        except (ParseError, BodyError, ValueError) as e:
            errors.append(f"response: {e}")
    if capture.response_truncated:
        errors.append("response: larger than forge_max_body_bytes, not kept whole")

    if response is not None:
        out_rows = chain_hashes(response.output_items, head)
        for h, p, canonical in out_rows:
            messages.append(
                _item_row(h, p, canonical, json.loads(canonical), capture.call_id, "item")
            )
        usage = response.usage
        row.update(
            response_id=response.response_id,
            response_model=response.model,
            response_head_hash=out_rows[-1][0] if out_rows else None,
            response_items=len(out_rows),
            response_json=canonical_json(response.response)
            if response.response is not None
            else None,
            stop_reason=response.stop_reason,
            tool_calls=response.tool_calls,
        )
        if usage is not None:
            row.update(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cache_read_tokens=usage.cache_read_tokens,
                cache_write_tokens=usage.cache_write_tokens,
                usage_estimated=False,
            )
        elif estimate_tokens is not None and request is not None:
            row.update(
                input_tokens=estimate_tokens(
                    canonical_json(request.items) + canonical_json(request.params)
                ),
                output_tokens=estimate_tokens(canonical_json(response.output_items)),
                usage_estimated=True,
            )

    row["status"], row["error"] = _status(capture, response)
    row["parse_error"] = "; ".join(errors) or None
    return Rows(call=row, messages=messages)


def _status(capture: Capture, response: ParsedResponse | None) -> tuple[str, str | None]:
    """complete, error or incomplete, with the error text."""
    body_text = capture.response_body[:_ERROR_CHARS].decode("utf-8", "replace")
    if capture.status_code is not None and capture.status_code >= 400:
        return "error", f"HTTP {capture.status_code}: {body_text}"
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
