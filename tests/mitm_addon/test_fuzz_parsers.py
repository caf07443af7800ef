"""Fuzzing of every parser that reads traffic: each raises only its documented error
(``ParseError``, ``BodyError``), and ``build_rows`` always returns a row that can be stored.

Inputs are random JSON and bytes, and the wire fixtures mutated (values replaced, keys
dropped, events dropped, duplicated, reordered or cut, bodies truncated, compressed or
labelled with an encoding they do not have). CI runs a few hundred cases per test;
``FORGE_SOAK=1`` (``make soak``) runs ten times as many (about 24,000 in all).
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import tracemalloc
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import brotli
import pyarrow as pa
import pytest
import zstandard
from hypothesis import (
    HealthCheck,
    currently_in_test_context,
    event,
    example,
    given,
    settings,
)
from hypothesis import strategies as st

from mitm_addon import sse
from mitm_addon.bodies import BodyError, decode_body
from mitm_addon.capture import Capture
from mitm_addon.protocols import anthropic_messages, openai_chat, openai_responses
from mitm_addon.protocols.base import ParseError, SseEvent
from mitm_addon.recorder import build_rows
from mitm_addon.tokens import count_tokens
from pipeline.schema import CALLS, MESSAGES

SOAK = os.environ.get("FORGE_SOAK") == "1"
SOAK_FACTOR = 10
WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
APIS = ("anthropic_messages", "openai_chat", "openai_responses")
MODULES: dict[str, ModuleType] = {
    "anthropic_messages": anthropic_messages,
    "openai_chat": openai_chat,
    "openai_responses": openai_responses,
}
PATHS = {
    "anthropic_messages": "/v1/messages?beta=true",
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
}
DEEP = 50_000  # nesting far past the interpreter's recursion limit


def budget(ci: int) -> settings:
    """``ci`` examples in CI, ``SOAK_FACTOR`` times as many under FORGE_SOAK=1."""
    return settings(
        max_examples=ci * SOAK_FACTOR if SOAK else ci,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- the wire fixtures ------------------------------------------------------------------


def _json_files(api: str, *prefixes: str) -> list[Any]:
    paths = sorted(p for p in (WIRE / api).glob("*.json") if p.name.startswith(prefixes))
    return [json.loads(p.read_text()) for p in paths]


REQUESTS = {api: _json_files(api, "request_") for api in APIS}
RESPONSES = {api: _json_files(api, "response_", "error") for api in APIS}
STREAMS = {
    api: [sse.parse_sse(p.read_bytes()) for p in sorted((WIRE / api).glob("*.sse"))] for api in APIS
}
WS_REQUEST = json.loads((WIRE / "openai_responses" / "ws_request.json").read_text())
WS_SERVER = (WIRE / "openai_responses" / "ws_server.jsonl").read_text().splitlines()


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _vocabulary() -> list[str]:
    """Keys and short string values of every fixture: random JSON built from them reaches
    the parsers' branches (``"type": "message_start"``) far more often than random text."""
    values: list[Any] = [*REQUESTS.values(), *RESPONSES.values(), WS_REQUEST]
    values += [
        json.loads(e.data)
        for s in STREAMS.values()
        for es in s
        for e in es
        if e.data.startswith("{")
    ]
    values += [json.loads(line) for line in WS_SERVER]
    return sorted({s for s in _strings(values) if len(s) <= 40})


VOCABULARY = _vocabulary()

# -- strategies -------------------------------------------------------------------------

# Text without lone surrogates: a JSON "\ud800" escape is a known recorder bug (see
# test_build_rows_stores_json_that_canonical_json_refuses), kept out of the green tests.
_text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(VOCABULARY)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
JSON = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
RARELY = st.sampled_from((False, False, False, False, True))  # integers(0, 4) favours 0
NEWLINES = st.sampled_from(["\n", "\r\n", "\r"])


def _locations(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _locations(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _locations(v, (*path, i))


@st.composite
def mutated(
    draw: st.DrawFn, base: Any, max_edits: int = 4, leaves: st.SearchStrategy[Any] | None = None
) -> Any:
    """``base`` with a few random edits anywhere in its tree (new values from ``leaves``)."""
    leaves = JSON if leaves is None else leaves
    value = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, max_edits))):
        path = draw(st.sampled_from(list(_locations(value))))
        op = draw(st.sampled_from(("replace", "delete", "duplicate", "shorten", "retype")))
        if not path:
            if op == "replace":
                value = draw(leaves)
            continue
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        key, node = path[-1], parent[path[-1]]
        if op == "replace":
            parent[key] = draw(leaves)
        elif op == "delete":
            del parent[key]
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(node))
        elif op == "shorten" and isinstance(node, str | list):
            parent[key] = node[: draw(st.integers(0, len(node)))]
        elif op == "retype":
            parent[key] = draw(
                st.sampled_from(
                    [None, True, 0, -1, 2**31, 1.5, "", "x", [], {}, [node], {"a": node}]
                )
            )
    return value


@st.composite
def json_bytes(draw: st.DrawFn, bases: Sequence[Any]) -> bytes:
    """JSON text of a mutated fixture (or of random JSON), sometimes cut or made invalid UTF-8."""
    base = st.sampled_from(list(bases))
    value = draw(base | base.flatmap(mutated) | JSON)
    data = json.dumps(value, ensure_ascii=draw(st.booleans())).encode()
    damage = draw(st.sampled_from(("none",) * 6 + ("truncate", "latin1", "garbage")))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "latin1":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + b"\xff\xfe\xc3" + data[at:]
    elif damage == "garbage":
        data = draw(st.binary(max_size=300))
    return data


@st.composite
def event_lists(draw: st.DrawFn, api: str) -> list[SseEvent]:
    """A fixture stream with events dropped, duplicated, swapped, cut short or mutated."""
    events = list(draw(st.sampled_from(STREAMS[api])))
    for _ in range(draw(st.sampled_from((0, 0, 1, 2, 3)))):
        if not events:
            break
        i = draw(st.integers(0, len(events) - 1))
        op = draw(st.sampled_from(("drop", "duplicate", "swap", "cut", "mutate", "garble")))
        if op == "drop":
            del events[i]
        elif op == "duplicate":
            events.insert(i, events[i])
        elif op == "swap":
            j = draw(st.integers(0, len(events) - 1))
            events[i], events[j] = events[j], events[i]
        elif op == "cut":
            events = events[:i]
        elif op == "mutate":
            try:  # an event garbled by an earlier edit is no longer JSON
                value = json.loads(events[i].data)
            except ValueError:
                continue
            data = json.dumps(draw(mutated(value, max_edits=2)))
            events[i] = SseEvent(events[i].event, data, events[i].id)
        elif op == "garble":
            data = events[i].data
            data = draw(st.sampled_from([data[: len(data) // 2], "", " ", "[DONE]", "null", "[]"]))
            events[i] = SseEvent(events[i].event, data, events[i].id)
    return events


def sse_bytes(events: Sequence[SseEvent], newline: str) -> bytes:
    out = []
    for e in events:
        head = f"event: {e.event}{newline}" if e.event else ""
        lines = "".join(f"data: {line}{newline}" for line in e.data.split("\n"))
        out.append(f"{head}{lines}{newline}")
    return "".join(out).encode("utf-8", "surrogatepass")


CODECS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
}
# What Content-Encoding headers say: real codings, lists, odd case and spacing, unknown ones.
ENCODING_HEADERS = st.sampled_from(
    [
        None,
        "",
        "identity",
        "gzip",
        "x-gzip",
        "deflate",
        "br",
        "zstd",
        "GZIP",
        " br ",
        "gzip, br",
        "zstd,gzip",
        "compress",
        "gzip;q=1",
        ",",
        "deflate, identity",
    ]
) | st.text(max_size=12)


@st.composite
def encoded(draw: st.DrawFn, payload: bytes) -> tuple[bytes, str | None]:
    """(body, Content-Encoding): honest, stacked, truncated after compression, or a lie."""
    mode = draw(st.sampled_from(("plain", "honest", "honest", "stacked", "truncated", "lie")))
    if mode == "plain":
        return payload, None
    if mode == "lie":
        return payload, draw(ENCODING_HEADERS)
    codings = draw(
        st.lists(
            st.sampled_from(sorted(CODECS)), min_size=1, max_size=2 if mode == "stacked" else 1
        )
    )
    body = payload
    for coding in codings:
        body = CODECS[coding](body)
    if mode == "truncated":
        body = body[: draw(st.integers(0, len(body)))]
    return body, ", ".join(reversed(codings))


# -- SSE ----------------------------------------------------------------------------------

SSE_INPUTS = (
    st.binary(max_size=600)
    | st.builds(sse_bytes, st.sampled_from(APIS).flatmap(event_lists), NEWLINES)
    | st.lists(
        st.sampled_from(
            [
                b"data: x",
                b"event: y",
                b":c",
                b"id: 1",
                b"\xef\xbb\xbf",
                b"\n",
                b"\r",
                b"\r\n",
                b"\xff",
                b"\xe2\x82",
                b"data:",
            ]
        ),
        max_size=40,
    ).map(b"".join)
)


@budget(200)
@given(data=SSE_INPUTS, cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_sse_decoder_never_raises_and_chunking_does_not_change_events(
    data: bytes, cuts: list[int]
) -> None:
    whole = sse.parse_sse_with_incomplete(data)
    decoder = sse.SseDecoder()
    events: list[SseEvent] = []
    start = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        events += decoder.feed(data[start:cut])
        start = cut
    events += decoder.feed(data[start:])
    assert (events, decoder.close()) == whole
    assert decoder.close() == []
    assert all(isinstance(e.data, str) for e in events)


# -- bodies ------------------------------------------------------------------------------


@budget(200)
@given(
    body=st.binary(max_size=400) | st.binary(max_size=400).flatmap(encoded).map(lambda t: t[0]),
    encoding=ENCODING_HEADERS,
    limit=st.integers(0, 5000),
)
def test_decode_body_raises_only_body_error(body: bytes, encoding: str | None, limit: int) -> None:
    try:
        out = decode_body(body, encoding, limit)
    except BodyError:
        return
    assert isinstance(out, bytes)
    if encoding and encoding.strip().lower() in CODECS:
        assert len(out) <= limit


@budget(150)
@given(
    payload=st.binary(max_size=3000) | st.text(max_size=2000).map(str.encode),
    coding=st.sampled_from(sorted(CODECS)),
    cut=st.integers(0, 10_000),
    limit=st.integers(0, 4000),
)
def test_decoded_body_is_the_payload_a_prefix_of_it_or_a_body_error(
    payload: bytes, coding: str, cut: int, limit: int
) -> None:
    body = CODECS[coding](payload)
    truncated = body[: cut % (len(body) + 1)]
    try:
        out = decode_body(truncated, coding, limit)
    except BodyError:
        assert len(payload) > limit or truncated != body
        return
    assert payload.startswith(out) and len(out) <= limit
    if truncated == body:
        assert out == payload


# 64,000,000 zero bytes, brotli quality 9: 102 bytes.
_BROTLI_BOMB_SIZE = 64_000_000


@pytest.fixture(scope="module")
def brotli_bomb() -> bytes:
    return brotli.compress(bytes(_BROTLI_BOMB_SIZE), quality=9)


@pytest.mark.parametrize("limit", [0, 100_000, 4_000_000])
def test_a_brotli_bomb_is_refused_within_bounded_memory(brotli_bomb: bytes, limit: int) -> None:
    assert len(brotli_bomb) < 200
    tracemalloc.start()
    try:
        with pytest.raises(BodyError, match="past"):
            decode_body(brotli_bomb, "br", limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * limit + 24_000_000, f"peak {peak / 1e6:.0f} MB decoding a {limit}-byte bound"


# -- the adapters ------------------------------------------------------------------------


def _parses_or_parse_error(fn: Callable[[Any], Any], value: Any) -> None:
    try:
        fn(value)
    except ParseError:
        event("ParseError")
    else:
        event("parsed")


@pytest.mark.parametrize("api", APIS)
@budget(120)
@given(data=st.data())
def test_parse_request_raises_only_parse_error(api: str, data: st.DataObject) -> None:
    body = data.draw(mutated(data.draw(st.sampled_from(REQUESTS[api]))) | JSON)
    _parses_or_parse_error(MODULES[api].parse_request, body)


@pytest.mark.parametrize("api", APIS)
@budget(120)
@given(data=st.data())
def test_parse_response_raises_only_parse_error(api: str, data: st.DataObject) -> None:
    body = data.draw(mutated(data.draw(st.sampled_from(RESPONSES[api]))) | JSON)
    _parses_or_parse_error(MODULES[api].parse_response, body)


@pytest.mark.parametrize("api", APIS)
@budget(150)
@given(data=st.data())
def test_parse_stream_raises_only_parse_error(api: str, data: st.DataObject) -> None:
    events = data.draw(
        event_lists(api)
        | st.lists(
            st.builds(
                SseEvent,
                st.none() | _text,
                JSON.map(json.dumps) | st.text(max_size=30),
            ),
            max_size=8,
        )
    )
    _parses_or_parse_error(MODULES[api].parse_stream, events)


@budget(150)
@given(
    messages=st.lists(
        st.sampled_from(WS_SERVER).flatmap(
            lambda line: (
                st.just(line)
                | mutated(json.loads(line), max_edits=2).map(json.dumps)
                | st.integers(0, len(line)).map(lambda n: line[:n])
            )
        ),
        max_size=len(WS_SERVER) + 2,
    )
    | st.lists(JSON.map(json.dumps) | st.text(max_size=20), max_size=6)
)
def test_parse_ws_raises_only_parse_error(messages: list[str]) -> None:
    _parses_or_parse_error(openai_responses.parse_ws, messages)


@budget(120)
@given(text=json_bytes([WS_REQUEST]).map(lambda b: b.decode("utf-8", "replace")))
def test_parse_ws_request_raises_only_parse_error(text: str) -> None:
    _parses_or_parse_error(openai_responses.parse_ws_request, text)


DEEP_JSON = "[" * DEEP


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda m=m: m.parse_stream([SseEvent(None, DEEP_JSON)]), id=f"{api}-stream")
        for api, m in MODULES.items()
    ]
    + [
        pytest.param(lambda: openai_responses.parse_ws([DEEP_JSON]), id="ws"),
        pytest.param(lambda: openai_responses.parse_ws_request(DEEP_JSON), id="ws-request"),
    ],
)
def test_json_nested_past_the_stack_is_a_parse_error(call: Callable[[], Any]) -> None:
    with pytest.raises(ParseError):
        call()


# -- build_rows ---------------------------------------------------------------------------

HARNESS_HEADER_NAMES = ["x-claude-code-session-id", "session-id", "user-agent", "traceparent"]


@st.composite
def captures(draw: st.DrawFn) -> Capture:
    """A captured call as the hooks (or WAL recovery) hand it over, with any body at all."""
    api = draw(st.sampled_from(APIS))
    transport = draw(st.sampled_from(("http", "sse", "websocket")))
    if draw(st.booleans()):
        method, path = "POST", PATHS[api]
    else:
        method = draw(st.sampled_from(("POST", "GET", "PUT")))
        path = draw(st.sampled_from([PATHS[api], "/v1/completions", "/"]) | _text)
    headers: dict[str, str] = {"content-encoding": ""}
    if transport == "websocket":
        request_body = draw(json_bytes([WS_REQUEST]))
        lines = draw(
            st.lists(
                st.sampled_from(WS_SERVER)
                | st.sampled_from(WS_SERVER).flatmap(
                    lambda line: mutated(json.loads(line), max_edits=2).map(json.dumps)
                ),
                max_size=len(WS_SERVER) + 2,
            )
        )
        response_body = draw(
            st.sampled_from(
                [json.dumps(lines).encode(), json.dumps(lines)[:-3].encode(), b"", b"{}", b"[1]"]
            )
            | st.binary(max_size=100)
        )
    else:
        request_body = draw(json_bytes(REQUESTS[api]))
        if transport == "sse":
            payload = sse_bytes(draw(event_lists(api)), draw(NEWLINES))
            if draw(RARELY):
                payload = payload[: draw(st.integers(0, len(payload)))]
        else:
            payload = draw(json_bytes(RESPONSES[api]))
        response_body, encoding = draw(encoded(payload))
        headers["content-encoding"] = encoding or ""
    if not headers["content-encoding"]:
        del headers["content-encoding"]
    started = draw(st.floats(1.6e9, 1.9e9))
    ended = draw(st.none() | st.floats(0, 600).map(lambda d: started + d))
    return Capture(
        call_id="call-fuzz",
        run_id="run-fuzz",
        transport=transport,
        method=method,
        scheme="https",
        host=draw(st.sampled_from(["api.openai.com", "api.anthropic.com", "chatgpt.com"])),
        path=path,
        started_at=started,
        rollout_id=draw(st.none() | _text),
        request_headers=draw(st.dictionaries(st.sampled_from(HARNESS_HEADER_NAMES), _text)),
        request_body=request_body,
        request_wire_bytes=len(request_body),
        status_code=draw(
            st.sampled_from([None, 101, 200, 200, 200, 400, 429, 500, 529]) | st.integers(100, 599)
        ),
        response_headers=headers,
        response_body=response_body,
        response_wire_bytes=len(response_body),
        response_truncated=draw(RARELY),
        stream_events=draw(st.none() | st.integers(0, 100)),
        first_byte_at=ended,
        ended_at=ended,
        error=draw(st.none() | st.none() | _text),
        incomplete=draw(RARELY),
    )


def assert_storable(capture: Capture, limit: int = 1 << 20) -> dict[str, Any]:
    """build_rows returns one row for the call, and its rows fit the Parquet schemas."""
    rows = build_rows(capture, {"resp_prev": "m1:" + "0" * 40}.get, limit, count_tokens)
    call = rows.call
    assert call["call_id"] == capture.call_id
    assert call["status"] in ("complete", "error", "incomplete")
    if currently_in_test_context():
        parsed = "no parse error" if call["parse_error"] is None else "parse error"
        event(f"status {call['status']}, {parsed}")
    assert (call["status"] == "complete") == (call["error"] is None)
    pa.Table.from_pylist([call], schema=CALLS)
    pa.Table.from_pylist(rows.messages, schema=MESSAGES)
    return call


@budget(250)
@given(capture=captures())
def test_build_rows_always_returns_a_storable_row(capture: Capture) -> None:
    assert_storable(capture)


# Inputs that make build_rows raise, or return a row no shard can hold (a lone surrogate
# does not encode to UTF-8, so the flush of the whole buffer fails). See the report.
_KNOWN_BAD = {
    "nan-in-request": (b'{"model":"m","messages":[],"temperature":NaN}', b""),
    "huge-exponent-in-request": (
        b'{"model":"m","messages":[{"role":"user","content":1e400}]}',
        b"",
    ),
    "infinity-in-response": (
        b'{"model":"m","messages":[]}',
        b'{"object":"chat.completion","choices":[],"usage":{"prompt_tokens":Infinity}}',
    ),
    "lone-surrogate-in-request": (
        b'{"model":"m","messages":[{"role":"user","content":"cut emoji \\ud83d"}]}',
        b"",
    ),
    "lone-surrogate-in-response-error": (
        b'{"model":"m","messages":[]}',
        b'{"error":{"type":"server_error","message":"cut emoji \\ud83d"}}',
    ),
    "deep-request": (b"[" * DEEP, b""),
    "deep-response": (b'{"model":"m","messages":[]}', b'{"a":' * DEEP),
}


@pytest.mark.parametrize("case", sorted(_KNOWN_BAD))
def test_build_rows_stores_json_that_canonical_json_refuses(case: str) -> None:
    request, response = _KNOWN_BAD[case]
    capture = Capture(
        call_id="call-bad",
        run_id="run-fuzz",
        transport="http",
        method="POST",
        scheme="https",
        host="api.openai.com",
        path="/v1/chat/completions",
        started_at=1.7e9,
        request_body=request,
        status_code=200,
        response_body=response,
    )
    assert_storable(capture)


@pytest.mark.parametrize("transport", ["http", "sse", "websocket"])
def test_build_rows_of_a_call_cut_before_any_byte(transport: str) -> None:
    # What WAL recovery hands over for a call that was in flight at a SIGKILL.
    bare = Capture("c", "r", transport, "POST", "https", "api.openai.com", "/v1/responses", 1.7e9)
    bare.incomplete = True
    assert assert_storable(bare)["status"] == "incomplete"


# Any JSON text a server or client may send: NaN, Infinity, lone surrogate escapes.
WIDE_JSON = st.recursive(
    st.none() | st.floats() | st.text(st.characters(), max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def wide_captures(draw: st.DrawFn) -> Capture:
    api = draw(st.sampled_from(APIS))
    request = draw(mutated(draw(st.sampled_from(REQUESTS[api])), 2, WIDE_JSON))
    response = draw(mutated(draw(st.sampled_from(RESPONSES[api])), 2, WIDE_JSON))
    return Capture(
        call_id="call-wide",
        run_id="run-fuzz",
        transport="http",
        method="POST",
        scheme="https",
        host="api.openai.com",
        path=PATHS[api],
        started_at=1.7e9,
        request_body=json.dumps(request).encode(),
        status_code=200,
        response_body=json.dumps(response).encode(),
    )


@example(
    capture=Capture(
        "c",
        "r",
        "http",
        "POST",
        "https",
        "api.openai.com",
        "/v1/chat/completions",
        1.7e9,
        request_body=b'{"messages":[{"role":"user","content":"\\ud83d"}]}',
    )
)
@budget(150)
@given(capture=wide_captures())
def test_build_rows_on_json_with_nan_infinity_and_lone_surrogates(capture: Capture) -> None:
    assert_storable(capture)
