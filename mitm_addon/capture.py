"""What the hooks keep of one call: a plain record, serialisable to a WAL frame."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Capture:
    """One LLM call as seen on the wire, secrets already removed.

    For WebSocket calls ``response_body`` holds the server's messages of this call as a
    JSON array of strings, and ``request_body`` the client's ``response.create`` text.
    """

    call_id: str
    run_id: str
    transport: str  # http, sse or websocket (http may become sse once headers arrive)
    method: str
    scheme: str
    host: str
    path: str
    started_at: float
    rollout_id: str | None = None
    rollout_source: str | None = None
    client_conn_id: str | None = None
    upstream_url: str | None = None
    request_headers: dict[str, str] = field(default_factory=dict)
    request_encoding: str | None = None  # as sent; request_body is stored decoded
    request_body: bytes = b""
    request_wire_bytes: int = 0
    status_code: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b""
    response_wire_bytes: int = 0
    response_truncated: bool = False
    stream_events: int | None = None
    first_byte_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    incomplete: bool = False  # the proxy stopped before the call ended
    pid: int | None = None
    parent_pids: list[int] = field(default_factory=list)
    process_name: str | None = None
    # Serve mode: the tokens of a call the policy answered (see mitm_addon.serve.handler).
    policy_version: int | None = None
    drift: str | None = None
    prompt_ids: list[int] | None = None
    prompt_parent_call_id: str | None = None
    completion_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # the whole prompt's length (prompt_ids may be a delta)

    _BLOBS = ("request_body", "response_body")

    def _header(self) -> dict[str, Any]:
        """Every field but the bodies, as ``asdict`` gives them (its values are flat: the
        headers map str to str and parent_pids holds ints, so shallow copies are deep ones).
        Built by hand because ``asdict`` deep-copies field by field, and this runs on the
        event loop twice per call."""
        header = {name: getattr(self, name) for name in _HEADER_FIELDS}
        header["request_headers"] = dict(self.request_headers)
        header["response_headers"] = dict(self.response_headers)
        header["parent_pids"] = list(self.parent_pids)
        return header

    def to_frame(self) -> tuple[dict[str, Any], bytes]:
        """(JSON header, blob) for the WAL; the blob is request body then response body."""
        header = self._header()
        header["request_len"] = len(self.request_body)
        return header, self.request_body + self.response_body

    @classmethod
    def from_frame(cls, header: dict[str, Any], blob: bytes) -> Capture:
        n = int(header.get("request_len", 0))
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in header.items() if k in known}
        return cls(**values, request_body=blob[:n], response_body=blob[n:])

    def begin_header(self) -> dict[str, Any]:
        """The small record written when the request arrives (recovery marks it incomplete)."""
        header = self._header()
        header.pop("request_headers", None)
        header.pop("response_headers", None)
        header["request_len"] = 0
        return header


_HEADER_FIELDS = tuple(f.name for f in fields(Capture) if f.name not in Capture._BLOBS)


def dumps(header: dict[str, Any]) -> bytes:
    # ASCII escapes: header values and error texts may hold lone surrogates (undecodable
    # bytes), which UTF-8 cannot encode; the recorder cleans them when it builds rows.
    return json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
