"""Fuzzing of the addon's hooks through taddons: whatever the traffic, no exception escapes a
hook, every byte passes, and after ``done()`` every call that reached ``response`` or
``error`` has exactly one row.

Flows get random methods, paths, hosts and headers (content-encoding lies, huge
content-length), random bodies, responses streamed through the Tee in random chunkings
and interleaved with other flows, errors before and in the middle of a stream; WebSocket
flows get messages in random order. ``FORGE_SOAK=1`` (``make soak``) runs ten times as
many cases and streams 100 MB instead of 20 MB through the Tee.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import tracemalloc
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import brotli
import pyarrow.parquet as pq
import zstandard
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from mitmproxy import http, websocket
from mitmproxy.flow import Error
from mitmproxy.test import tflow

from mitm_addon.tee import Tee
from tests.mitm_addon.test_forge_addon import ForgeAddons, addon_context, capture_of

SOAK = os.environ.get("FORGE_SOAK") == "1"
SOAK_FACTOR = 10
WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
STATUSES = ("complete", "error", "incomplete")
SECRET = "sk-proj-fuzz-secret-0123456789abcdef"


def budget(ci: int) -> settings:
    return settings(
        max_examples=ci * SOAK_FACTOR if SOAK else ci,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- what the flows carry ---------------------------------------------------------------

ROUTES = {  # host -> model-call paths it serves
    "api.anthropic.com": ["/v1/messages", "/v1/messages?beta=true"],
    "api.openai.com": ["/v1/chat/completions", "/v1/responses"],
    "chatgpt.com": ["/backend-api/codex/responses"],
}
API_OF_PATH = {
    "/v1/messages": "anthropic_messages",
    "/v1/messages?beta=true": "anthropic_messages",
    "/v1/chat/completions": "openai_chat",
    "/v1/responses": "openai_responses",
    "/backend-api/codex/responses": "openai_responses",
}
OTHER_PATHS = ["/v1/models", "/v1/completions", "/v1/messages/count_tokens", "/", "/v1/x?key=abc"]


def _wire(api: str, *globs: str) -> list[bytes]:
    return [p.read_bytes() for g in globs for p in sorted((WIRE / api).glob(g))]


REQUESTS = {api: _wire(api, "request_*.json") for api in set(API_OF_PATH.values())}
BODIES = {api: _wire(api, "response_*.json", "error.json") for api in REQUESTS}
STREAMS = {api: _wire(api, "stream_*.sse") for api in REQUESTS}
WS_CREATE = json.loads((WIRE / "openai_responses" / "ws_request.json").read_text())
WS_SERVER = (WIRE / "openai_responses" / "ws_server.jsonl").read_text().splitlines()

CODECS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
}
# Header text as HTTP carries it (ASCII and UTF-8). Non-UTF-8 values are a known bug,
# tested on their own below (test_non_utf8_*).
_header_text = st.text(st.characters(codec="utf-8", exclude_characters="\r\n\0"), max_size=30).map(
    str.strip
)
_header_names = st.sampled_from(
    [
        "x-request-id",
        "user-agent",
        "session-id",
        "x-claude-code-session-id",
        "accept",
        "anthropic-version",
        "openai-beta",
        "x-stainless-lang",
        "traceparent",
        "cookie",
    ]
)
RARELY = st.sampled_from((False, False, False, False, True))


@st.composite
def bodies(draw: st.DrawFn, candidates: Sequence[bytes]) -> bytes:
    """A fixture body as is, cut short, with bytes flipped, or random bytes."""
    body = draw(st.sampled_from(list(candidates))) if candidates else b""
    how = draw(st.sampled_from(("as is", "as is", "as is", "cut", "flip", "random")))
    if how == "cut":
        body = body[: draw(st.integers(0, len(body)))]
    elif how == "flip" and body:
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[at + 1 :]
    elif how == "random":
        body = draw(st.binary(max_size=400))
    return body


@st.composite
def encodings(draw: st.DrawFn, body: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """(body on the wire, its content-encoding header): honest, a lie, or absent."""
    how = draw(st.sampled_from(("none", "none", "honest", "lie")))
    if how == "none":
        return body, []
    if how == "honest":
        coding = draw(st.sampled_from(sorted(CODECS)))
        return CODECS[coding](body), [(b"content-encoding", coding.encode())]
    lie = draw(st.sampled_from(["gzip", "br", "zstd", "deflate", "gzip, br", "compress", "x"]))
    return body, [(b"content-encoding", lie.encode())]


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]


@dataclass
class Plan:
    """One HTTP flow: the request, then how the upstream answers."""

    host: str
    method: str
    path: str
    request_headers: list[tuple[bytes, bytes]]
    request_body: bytes
    outcome: str  # "refused" (no response), "complete", "cut" (error mid-stream)
    status: int = 200
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    cut_after: int = 0


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    host = draw(st.sampled_from([*ROUTES, "example.com"]))
    if host in ROUTES and draw(st.sampled_from((True, True, True, False))):
        path = draw(st.sampled_from(ROUTES[host]))
        method = "POST"
    else:
        path = draw(st.sampled_from(OTHER_PATHS + [p for ps in ROUTES.values() for p in ps]))
        method = draw(st.sampled_from(("POST", "GET", "PUT", "DELETE", "OPTIONS")))
    api = API_OF_PATH.get(path, "openai_chat")
    body, headers = draw(encodings(draw(bodies(REQUESTS[api]))))
    headers.append((b"host", host.encode()))
    if draw(st.booleans()):
        headers.append((b"content-type", b"application/json"))
    length = draw(st.sampled_from([len(body), len(body), 0, 10**12, 2**63 - 1]))
    headers.append((b"content-length", str(length).encode()))
    headers.append((b"authorization", f"Bearer {SECRET}".encode()))
    for name, value in draw(st.lists(st.tuples(_header_names, _header_text), max_size=4)):
        headers.append((name.encode(), value.encode()))

    outcome = draw(st.sampled_from(("complete", "complete", "complete", "cut", "refused")))
    if outcome == "refused":
        return Plan(host, method, path, headers, body, outcome)
    status = draw(st.sampled_from([200, 200, 200, 400, 429, 500, 529]) | st.integers(100, 599))
    stream = draw(st.booleans())
    payload = draw(bodies(STREAMS[api] if stream else BODIES[api]))
    payload, response_headers = draw(encodings(payload))
    content_type = b"text/event-stream; charset=utf-8" if stream else b"application/json"
    response_headers.append((b"content-type", draw(st.sampled_from([content_type, b"text/html"]))))
    chunks = _chunked(payload, draw(st.lists(st.integers(0, 20_000), max_size=20)))
    cut_after = draw(st.integers(0, len(chunks)))
    return Plan(
        host, method, path, headers, body, outcome, status, response_headers, chunks, cut_after
    )


# -- driving the hooks the way mitmproxy does -----------------------------------------------


def _flow(plan: Plan) -> http.HTTPFlow:
    f = tflow.tflow()
    f.request.scheme, f.request.host, f.request.port = "https", plan.host, 443
    f.request.method = plan.method
    f.request.path = plan.path
    f.request.headers = http.Headers(plan.request_headers)
    f.request.raw_content = plan.request_body
    f.response = None
    return f


def drive(a: ForgeAddons, f: http.HTTPFlow, plan: Plan, delivered: list[bytes]) -> Iterator[str]:
    """The hooks of one flow in mitmproxy's order, one step per ``next``; yields the step."""
    a.request(f)
    yield "request"
    assert f.request.raw_content == plan.request_body, "the request body must pass unchanged"
    if f.response is not None:  # answered by Forge itself (404, 503, 507, 426)
        a.response(f)
        return
    if plan.outcome == "refused":
        f.error = Error("Connection refused by upstream")
        a.error(f)
        return
    f.response = http.Response.make(plan.status, b"", http.Headers(plan.response_headers))
    # The length upstream declared: a cut body never reached it (else it was not cut).
    declared = sum(map(len, plan.chunks)) + (plan.outcome == "cut")
    f.response.headers["content-length"] = str(declared)
    a.responseheaders(f)
    yield "responseheaders"
    tee = f.response.stream
    chunks = plan.chunks if plan.outcome == "complete" else plan.chunks[: plan.cut_after]
    for chunk in chunks:
        delivered.append(b"".join(tee(chunk)) if callable(tee) else chunk)
        yield "chunk"
    if plan.outcome == "cut":
        f.error = Error("peer closed connection without sending complete message body")
        a.error(f)
        return
    if callable(tee):
        delivered.append(b"".join(tee(b"")))  # the body's end: what was held back passes
        f.response.data.content = None  # a streamed body is not kept on the flow
    else:
        f.response.raw_content = b"".join(chunks)
    a.response(f)


def call_rows(run: Path) -> list[dict[str, Any]]:
    """The calls rows of a run directory (pyarrow: no views needed)."""
    rows: list[dict[str, Any]] = []
    for path in sorted((run / "calls").glob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


@dataclass
class Outcome:
    captured: list[str]  # call ids of the flows Forge recorded
    rows: list[dict[str, Any]]
    delivered: dict[int, bytes]


def run_flows(plans_: Sequence[Plan], schedule: Sequence[int], **options: Any) -> Outcome:
    """Drive the flows interleaved per ``schedule`` (each entry picks a flow to advance)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        a = ForgeAddons()
        with addon_context(a):
            a.configure(
                forge_dir=str(run), forge_process_lookup=False, forge_builder="thread", **options
            )
            a.running()
            flows = [_flow(p) for p in plans_]
            delivered: dict[int, list[bytes]] = {i: [] for i in range(len(flows))}
            steps = {
                i: drive(a, f, p, delivered[i])
                for i, (f, p) in enumerate(zip(flows, plans_, strict=True))
            }
            captured: list[str] = []
            pending = list(steps)
            picks = iter(schedule)
            while pending:
                i = pending[next(picks, 0) % len(pending)]
                step = next(steps[i], None)
                if step == "request" and (capture := capture_of(flows[i])) is not None:
                    captured.append(capture.call_id)
                if step is None:
                    pending.remove(i)
            a.done()
            rows = call_rows(run)
            for p in run.rglob("*"):
                if p.is_file():
                    assert SECRET.encode() not in p.read_bytes(), f"the key reached {p}"
        return Outcome(captured, rows, {i: b"".join(d) for i, d in delivered.items()})


def assert_one_row_per_call(outcome: Outcome) -> None:
    ids = [r["call_id"] for r in outcome.rows]
    assert sorted(ids) == sorted(outcome.captured), "a call was lost or recorded twice"
    for row in outcome.rows:
        assert row["status"] in STATUSES
        assert (row["status"] == "complete") == (row["error"] is None), row


def _plan(path: str = "/v1/chat/completions", **changes: Any) -> Plan:
    body = REQUESTS["openai_chat"][0]
    plan = Plan(
        "api.openai.com",
        "POST",
        path,
        [(b"host", b"api.openai.com"), (b"content-type", b"application/json")],
        body,
        "complete",
        200,
        [(b"content-type", b"application/json")],
        [BODIES["openai_chat"][0]],
    )
    for k, v in changes.items():
        setattr(plan, k, v)
    return plan


@budget(80)
@given(
    plans_=st.lists(plans(), min_size=1, max_size=6),
    schedule=st.lists(st.integers(0, 5), max_size=200),
)
def test_no_hook_raises_every_byte_passes_and_every_call_has_one_row(
    plans_: list[Plan], schedule: list[int]
) -> None:
    outcome = run_flows(plans_, schedule)
    assert_one_row_per_call(outcome)
    event(f"{len(outcome.captured)} of {len(plans_)} flows recorded")
    for row in outcome.rows:
        event(f"row {row['transport']} {row['status']}")
    for i, plan in enumerate(plans_):
        sent = plan.chunks if plan.outcome == "complete" else plan.chunks[: plan.cut_after]
        if outcome.delivered[i]:  # the flow reached the upstream (Forge answered none itself)
            assert outcome.delivered[i] == b"".join(sent), "the Tee changed the stream"


NON_UTF8 = st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@st.composite
def plans_with_non_utf8(draw: st.DrawFn) -> Plan:
    """A plan whose request or response carries bytes that are not UTF-8 (Latin-1 header
    values, a raw byte in the path): HTTP allows them, mitmproxy passes them on."""
    plan = draw(plans())
    where = draw(st.sampled_from(("request header", "response header", "path")))
    if where == "request header":
        plan.request_headers.append((b"x-title", draw(NON_UTF8)))
    elif where == "response header":
        plan.response_headers.append((b"x-served-by", draw(NON_UTF8)))
    else:
        raw = draw(NON_UTF8).decode("utf-8", "surrogateescape")
        plan.path += ("&" if "?" in plan.path else "?") + "q=" + raw
    return plan


@example(
    plans_=[_plan(request_headers=[(b"host", b"api.openai.com"), (b"x-t", b"\xe9")])], schedule=[]
)
@budget(20)
@given(
    plans_=st.lists(plans_with_non_utf8(), min_size=1, max_size=4),
    schedule=st.lists(st.integers(0, 5), max_size=100),
)
def test_hooks_fuzzed_with_bytes_that_are_not_utf8(plans_: list[Plan], schedule: list[int]) -> None:
    assert_one_row_per_call(run_flows(plans_, schedule))


# -- WebSocket ----------------------------------------------------------------------------


@st.composite
def ws_messages(draw: st.DrawFn) -> list[tuple[bool, bool, bytes]]:
    """(from_client, is_text, content) in random order: creates, server events, binaries."""
    create = dict(WS_CREATE)
    server = [line.encode() for line in WS_SERVER]
    choices = st.one_of(
        st.builds(
            lambda text: (
                True,
                True,
                json.dumps({**create, "input": text}, ensure_ascii=False).encode(),
            ),
            st.text(st.characters(codec="utf-8"), max_size=20),
        ),
        st.sampled_from(server).map(lambda m: (False, True, m)),
        st.sampled_from(server).flatmap(
            lambda m: st.integers(0, len(m)).map(lambda n: (False, True, m[:n]))
        ),
        st.tuples(st.booleans(), st.just(False), st.binary(max_size=50)),
        st.sampled_from([b'{"type":"ping"}', b"{}", b"not json"]).map(lambda m: (True, True, m)),
        st.just((False, True, b'{"type":"error","status":429,"error":{"message":"slow"}}')),
    )
    return draw(st.lists(choices, max_size=40))


@budget(60)
@given(messages=ws_messages(), cut=st.booleans())
def test_websocket_messages_in_any_order_give_one_row_per_response_create(
    messages: list[tuple[bool, bool, bytes]], cut: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        a = ForgeAddons()
        with addon_context(a):
            a.configure(forge_dir=str(run), forge_process_lookup=False, forge_builder="thread")
            a.running()
            f = tflow.twebsocketflow(messages=False)
            f.request.host, f.request.path, f.request.port = "api.openai.com", "/v1/responses", 443
            f.request.headers["host"] = "api.openai.com"
            a.request(f)
            assert f.websocket is not None
            for from_client, is_text, content in messages:
                kind = 1 if is_text else 2
                f.websocket.messages.append(websocket.WebSocketMessage(kind, from_client, content))
                a.websocket_message(f)
            if cut:
                f.error = Error("connection reset")
            a.websocket_end(f)
            a.done()
            rows = call_rows(run)
    creates = sum(1 for c, t, m in messages if c and t and b'"response.create"' in m)
    assert len(rows) == creates
    assert len({r["call_id"] for r in rows}) == creates
    assert all(r["status"] in STATUSES and r["transport"] == "websocket" for r in rows)
    event(f"{creates} calls")
    for row in rows:
        event(f"row {row['status']}")


# -- a huge stream ----------------------------------------------------------------------

HUGE_BYTES = (100 if SOAK else 20) * 1024 * 1024
TEE_LIMIT = 1024 * 1024
CHUNK_TEXT = 8 * 1024


def anthropic_stream(total: int) -> Iterator[bytes]:
    """An Anthropic text stream of about ``total`` bytes, made one event at a time."""

    def event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    message = {
        "id": "msg_huge",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    yield event("message_start", {"type": "message_start", "message": message})
    yield event(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )
    sent, n = 0, 0
    while sent < total:
        n += 1
        text = (f"{n:08d} " * (CHUNK_TEXT // 9))[:CHUNK_TEXT]
        chunk = event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
        )
        sent += len(chunk)
        yield chunk
    yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": n},
        },
    )
    yield event("message_stop", {"type": "message_stop"})


def test_a_huge_stream_passes_whole_while_the_tee_keeps_at_most_its_limit(tmp_path: Path) -> None:
    run = tmp_path / "run"
    a = ForgeAddons()
    with addon_context(a):
        a.configure(
            forge_dir=str(run),
            forge_process_lookup=False,
            forge_builder="thread",
            forge_max_body_bytes=TEE_LIMIT,
        )
        a.running()
        plan = Plan(
            "api.anthropic.com",
            "POST",
            "/v1/messages",
            [(b"host", b"api.anthropic.com"), (b"content-type", b"application/json")],
            REQUESTS["anthropic_messages"][0],
            "complete",
        )
        f = _flow(plan)
        a.request(f)
        f.response = http.Response.make(
            200, b"", {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
        )
        a.responseheaders(f)
        tee = f.response.stream
        assert isinstance(tee, Tee)
        sent, passed = hashlib.sha256(), hashlib.sha256()
        total = 0
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for chunk in anthropic_stream(HUGE_BYTES):
                sent.update(chunk)
                for piece in tee(chunk):
                    passed.update(piece)
                total += len(chunk)
            for piece in tee(b""):
                passed.update(piece)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert passed.digest() == sent.digest(), "bytes were changed or lost on the way"
        assert total >= HUGE_BYTES and tee.size == total and tee.truncated
        assert sum(len(c) for c in tee.chunks) <= TEE_LIMIT
        assert peak < TEE_LIMIT + 4 * 1024 * 1024, f"{peak / 2**20:.1f} MiB held while streaming"
        f.response.data.content = None
        a.response(f)
        a.done()
    (row,) = call_rows(run)
    assert row["response_bytes"] == total
    assert "larger than forge_max_body_bytes" in row["parse_error"]


# -- bugs found by fuzzing, fixed: each test keeps its fix in place ----------------------


def _normal_then(plan: Plan) -> list[Plan]:
    return [_plan(), plan, _plan()]


def _run_expecting_rows(plans_: list[Plan]) -> None:
    outcome = run_flows(plans_, [0] * 1000)
    assert len(outcome.captured) == len(plans_), "a call was not recorded"
    assert_one_row_per_call(outcome)


def test_non_utf8_request_header_value_is_recorded() -> None:
    plan = _plan()
    plan.request_headers.append((b"x-title", b"caf\xe9"))
    _run_expecting_rows(_normal_then(plan))


def test_non_utf8_response_header_value_is_recorded() -> None:
    plan = _plan()
    plan.response_headers.append((b"x-served-by", b"m\xfcnchen"))
    _run_expecting_rows(_normal_then(plan))


def test_non_utf8_bytes_in_the_path_do_not_escape_the_request_hook() -> None:
    plan = _plan()
    f = _flow(plan)
    f.request.data.path = b"/v1/chat/completions?q=caf\xe9"
    a = ForgeAddons()
    with tempfile.TemporaryDirectory() as tmp, addon_context(a):
        a.configure(forge_dir=tmp, forge_process_lookup=False, forge_builder="thread")
        a.running()
        a.request(f)
        assert capture_of(f) is not None


def test_deeply_nested_json_to_an_unknown_endpoint_does_not_escape_the_request_hook() -> None:
    plan = _plan("/v1/completions", request_body=b"[" * 100_000)
    a = ForgeAddons()
    with tempfile.TemporaryDirectory() as tmp, addon_context(a):
        a.configure(forge_dir=tmp, forge_process_lookup=False, forge_builder="thread")
        a.running()
        a.request(_flow(plan))


def test_a_response_with_a_lone_surrogate_does_not_lose_the_other_calls() -> None:
    poison = _plan(chunks=[b'{"error":{"type":"server_error","message":"cut \\ud83d"}}'])
    outcome = run_flows(_normal_then(poison), [0] * 1000)
    assert len(outcome.rows) == 3


def test_a_compressed_request_to_an_unknown_endpoint_is_decoded_within_the_bound() -> None:
    bomb = brotli.compress(bytes(64_000_000), quality=9)
    plan = _plan("/v1/completions", request_body=bomb)
    plan.request_headers.append((b"content-encoding", b"br"))
    f = _flow(plan)
    a = ForgeAddons()
    with tempfile.TemporaryDirectory() as tmp, addon_context(a):
        a.configure(
            forge_dir=tmp,
            forge_process_lookup=False,
            forge_builder="thread",
            forge_max_body_bytes=1 << 20,
        )
        a.running()
        tracemalloc.start()
        try:
            a.request(f)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # bodies.decode_body feeds brotli in pieces: the output may overshoot the 1 MiB bound by
    # a piece's worth (see bodies._BROTLI_MIN_PIECE), never by the body's 64 MB.
    assert peak < 32 * 1024 * 1024, f"{peak / 2**20:.0f} MiB for a {len(bomb)}-byte body"
