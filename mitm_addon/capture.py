"""What the hooks keep of one call: a plain record, serialisable to a WAL frame."""

from __future__ import annotations

import json
import operator
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import orjson


@dataclass(slots=True)
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

    def set_process(
        self, pid: int, name: str | None, parent_pids: list[int], rollout_id: str | None
    ) -> None:
        """The client process found for the call; its FORGE_ROLLOUT_ID names the rollout
        when nothing stronger did (proxy credentials, the forge_rollout option)."""
        self.pid, self.process_name, self.parent_pids = pid, name, list(parent_pids)
        if self.rollout_id is None and rollout_id:
            self.rollout_id, self.rollout_source = rollout_id, "process_env"

    def _header(self) -> dict[str, Any]:
        """Every field but the bodies that differs from its default (``from_frame`` puts the
        defaults back). The headers and parent_pids are copied (their values are flat, so
        shallow copies are deep ones). Built by hand, and without the defaults, because it
        runs on the event loop twice per call: ``asdict`` deep-copies field by field, and
        each key left out is encoding work saved."""
        header = dict(zip(_REQUIRED_FIELDS, _get_required(self), strict=True))
        for name, value in zip(_NONE_FIELDS, _get_none(self), strict=True):
            if value is not None:
                header[name] = value
        for name, value in zip(_FALSY_FIELDS, _get_falsy(self), strict=True):
            if value:
                header[name] = value
        if "request_headers" in header:
            header["request_headers"] = dict(self.request_headers)
        if "response_headers" in header:
            header["response_headers"] = dict(self.response_headers)
        if "parent_pids" in header:
            header["parent_pids"] = list(self.parent_pids)
        return header

    def to_frame(self) -> tuple[dict[str, Any], bytes]:
        """(JSON header, blob) for the WAL; the blob is request body then response body."""
        header, (request, response) = self.frame_parts()
        return header, request + response

    def frame_parts(self) -> tuple[dict[str, Any], tuple[bytes, bytes]]:
        """``to_frame`` with the blob's two parts apart (``wal.encode_frame`` joins them)."""
        header = self._header()
        header["request_len"] = len(self.request_body)
        return header, (self.request_body, self.response_body)

    @classmethod
    def from_frame(cls, header: dict[str, Any], blob: bytes) -> Capture:
        n = int(header.get("request_len", 0))
        values = {k: v for k, v in header.items() if k in _KNOWN_FIELDS}
        return cls(**values, request_body=blob[:n], response_body=blob[n:])

    def begin_header(self) -> dict[str, Any]:
        """The small record written when the request arrives (recovery marks it incomplete)."""
        header = self._header()
        header.pop("request_headers", None)
        header.pop("response_headers", None)
        header["request_len"] = 0
        return header


def _default(f: Any) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


_KNOWN_FIELDS = frozenset(f.name for f in fields(Capture))
_REQUIRED_FIELDS = tuple(
    f.name for f in fields(Capture) if f.default is MISSING and f.default_factory is MISSING
)
# The other fields but the bodies, by default: None, or a falsy value ({}, [], 0, False),
# which only a falsy value of the same type equals. A field at its default is left out of
# frames (stream_events=0 or completion_ids=[] are not None: they are kept).
_OPTIONAL = [
    f for f in fields(Capture) if f.name not in _REQUIRED_FIELDS and f.name not in Capture._BLOBS
]
_NONE_FIELDS = tuple(f.name for f in _OPTIONAL if _default(f) is None)
_FALSY_FIELDS = tuple(f.name for f in _OPTIONAL if _default(f) is not None)
assert not any(_default(f) for f in _OPTIONAL), "a field whose default is truthy"
_get_required = operator.attrgetter(*_REQUIRED_FIELDS)
_get_none = operator.attrgetter(*_NONE_FIELDS)
_get_falsy = operator.attrgetter(*_FALSY_FIELDS)


def dumps(header: dict[str, Any]) -> bytes:
    """A frame header as compact JSON: orjson (UTF-8), a tenth of ``json.dumps``'s time."""
    try:
        return orjson.dumps(header)
    except TypeError:
        # A lone surrogate (undecodable bytes in an error text or a header value), which
        # UTF-8 cannot encode, or an int past 64 bits: ASCII escapes keep it; the recorder
        # cleans such strings when it builds rows.
        return json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
