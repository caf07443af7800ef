"""The addon's hooks, called directly through mitmproxy's taddons and tflow."""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import exceptions, flow, http
from mitmproxy.test import taddons, tflow

from mitm_addon.addons.state import FlowState
from mitm_addon.forge_addon import make_addons
from mitm_addon.tee import Tee
from pipeline.store import connect

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
SECRET = "sk-ant-unit-test-secret-0123456789"


class ForgeAddons:
    """Forge's addons as ``mitm_addon/forge_addon.py`` composes them, with each hook fired
    on every one of them in order, as mitmproxy fires it (an awaitable a hook returns is
    run to its end before the next addon's hook)."""

    HOOKS = frozenset(
        {
            "running",
            "done",
            "client_connected",
            "client_disconnected",
            "http_connect",
            "tls_clienthello",
            "requestheaders",
            "request",
            "responseheaders",
            "response",
            "error",
            "websocket_message",
            "websocket_end",
        }
    )

    def __init__(self) -> None:
        self.addons = make_addons()
        self.settings, self.routing, self.recording, self.serving = self.addons
        self.tctx: taddons.context | None = None

    def configure(self, **options: Any) -> None:
        """Set options: mitmproxy calls every addon's configure with the changed names."""
        assert self.tctx is not None, "use addon_context first"
        self.tctx.configure(self.addons[0], **options)

    def fire(self, name: str, *args: Any) -> None:
        assert self.tctx is not None, "use addon_context first"
        for addon in self.addons:
            hook = getattr(addon, name, None)
            if hook is None:
                continue
            result = hook(*args)
            if inspect.isawaitable(result):
                self.tctx.master.event_loop.run_until_complete(result)

    def __getattr__(self, name: str) -> Any:
        if name in ForgeAddons.HOOKS:
            return lambda *args: self.fire(name, *args)
        raise AttributeError(name)


def state_of(f: http.HTTPFlow) -> FlowState:
    state = FlowState.of(f)
    assert state is not None, "Routing took no state for this flow"
    return state


def capture_of(f: http.HTTPFlow) -> Any:
    """The record a flow's call has open (None: none)."""
    state = FlowState.of(f)
    return state.capture if state is not None else None


@contextlib.contextmanager
def addon_context(a: ForgeAddons) -> Iterator[taddons.context]:
    """taddons.context with Forge's addons, the event loop it makes outside a running loop
    closed afterwards."""
    with taddons.context(*a.addons) as tctx:
        a.tctx = tctx
        try:
            yield tctx
        finally:
            a.done()
            tctx.master.event_loop.close()


@pytest.fixture
def addon(tmp_path: Path) -> Iterator[tuple[ForgeAddons, taddons.context]]:
    a = ForgeAddons()
    with addon_context(a) as tctx:
        a.configure(
            forge_dir=str(tmp_path / "run"),
            forge_process_lookup=False,
            forge_rollout="r-1",
            forge_builder="thread",  # the child process is tested in test_writer and e2e
        )
        a.running()
        yield a, tctx


def llm_flow(host: str, path: str, body: bytes, **headers: str) -> http.HTTPFlow:
    f = tflow.tflow()
    f.request.scheme, f.request.host, f.request.port = "https", host, 443
    f.request.method, f.request.path = "POST", path
    f.request.headers.clear()
    f.request.headers["host"] = host
    f.request.headers["content-type"] = "application/json"
    for k, v in headers.items():
        f.request.headers[k.replace("_", "-")] = v
    f.request.content = body
    f.response = None
    return f


def respond(
    addon: ForgeAddons, f: http.HTTPFlow, status: int, content_type: str, chunks: list[bytes]
) -> bytes:
    """Drive responseheaders -> stream chunks -> response, as mitmproxy does; returns what the client got."""
    # As upstream sends them: an event stream chunked, anything else with its length.
    framing = (
        {"transfer-encoding": "chunked"}
        if content_type == "text/event-stream"
        else {"content-length": str(sum(map(len, chunks)))}
    )
    f.response = http.Response.make(status, b"", {"content-type": content_type})
    f.response.headers.update(framing)
    addon.responseheaders(f)
    stream = f.response.stream
    assert isinstance(stream, Tee), "LLM responses must be teed, not buffered"
    delivered = b"".join(piece for c in [*chunks, b""] for piece in stream(c))
    f.response.content = None
    addon.response(f)
    return delivered


def rows(run: Path, sql: str = "SELECT * FROM calls ORDER BY call_id") -> list[dict[str, object]]:
    con = connect(run)
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def test_streamed_call_is_teed_unchanged_and_recorded(addon, tmp_path: Path) -> None:
    a, _ = addon
    body = (WIRE / "anthropic_messages" / "request_tool.json").read_bytes()
    f = llm_flow("api.anthropic.com", "/v1/messages?beta=true", body, x_api_key=SECRET)
    a.request(f)
    sse = (WIRE / "anthropic_messages" / "stream_tool.sse").read_bytes()
    chunks = [sse[i : i + 97] for i in range(0, len(sse), 97)]
    delivered = respond(a, f, 200, "text/event-stream; charset=utf-8", chunks)
    assert delivered == sse
    a.done()
    (row,) = rows(tmp_path / "run")
    assert row["api"] == "anthropic_messages" and row["transport"] == "sse"
    assert (
        row["status"] == "complete"
        and row["rollout_id"] == "r-1"
        and row["rollout_source"] == "option"
    )
    assert row["tool_calls"] and row["stop_reason"] == "tool_use"
    assert row["request_headers"]["x-api-key"] == "[REDACTED]"


def test_other_hosts_are_tunnelled_without_interception(addon) -> None:
    a, _ = addon
    from mitmproxy.proxy import context
    from mitmproxy.tls import ClientHello, ClientHelloData

    hello = ClientHello(bytes.fromhex(_CLIENT_HELLO_EXAMPLE_COM))
    ctx_ = context.Context(tflow.tclient_conn(), None)  # type: ignore[arg-type]
    ctx_.server = tflow.tserver_conn()
    ctx_.server.address = ("example.com", 443)
    ctx_.client.sni = hello.sni  # as mitmproxy's TLS layer sets it before the hook
    data = ClientHelloData(ctx_, hello)
    a.tls_clienthello(data)
    assert data.ignore_connection


def test_other_hosts_404_answers_locally(addon) -> None:
    a, tctx = addon
    a.configure(forge_other_hosts="404")
    f = llm_flow("models.dev", "/api.json", b"")
    f.request.method = "GET"
    a.request(f)
    assert f.response is not None and f.response.status_code == 404


def test_upstream_option_reroutes_the_call(addon) -> None:
    a, tctx = addon
    a.configure(forge_upstream="api.openai.com=http://127.0.0.1:9/base")
    body = (WIRE / "openai_chat" / "request_tool.json").read_bytes()
    f = llm_flow("api.openai.com", "/v1/chat/completions", body, authorization=f"Bearer {SECRET}")
    a.request(f)
    assert (f.request.scheme, f.request.host, f.request.port) == ("http", "127.0.0.1", 9)
    assert f.request.path == "/base/v1/chat/completions"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("forge_mode", "train"),
        ("forge_upstream", "api.openai.com"),
        ("forge_upstream", "api.openai.com=ftp://x"),
        ("forge_other_hosts", "drop"),
        ("forge_hosts", " , "),
        ("forge_redact", "re:("),
        ("forge_rotate_rows", "0"),
        ("forge_on_write_error", "ignore"),
        ("forge_min_free_bytes", "-1"),
        ("forge_reserve_bytes", "-1"),
        ("forge_proxy_password", "@/nonexistent/forge-password"),
        ("stream_large_bodies", "1m"),
    ],
)
def test_bad_option_values_raise_options_error(addon, option: str, value: str) -> None:
    a, tctx = addon
    with pytest.raises(exceptions.OptionsError):
        tctx.options.set(f"{option}={value}")


def test_unwritable_forge_dir_refuses_to_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    a = ForgeAddons()
    with addon_context(a), pytest.raises(exceptions.OptionsError, match="not writable"):
        a.configure(forge_dir=str(blocker / "run"))


def test_unconfigured_addon_refuses_llm_calls_rather_than_pass_them_unrecorded() -> None:
    a = ForgeAddons()
    with addon_context(a):
        a.configure(forge_process_lookup=False)
        f = llm_flow("api.openai.com", "/v1/chat/completions", b"{}")
        a.request(f)
        assert f.response is not None and f.response.status_code == 503
        assert b"forge_dir" in f.response.content


def test_non_model_requests_are_counted_not_recorded(addon, tmp_path: Path) -> None:
    a, _ = addon
    f = llm_flow("api.openai.com", "/v1/models", b"")
    f.request.method = "GET"
    a.request(f)
    assert capture_of(f) is None
    f.response = http.Response.make(200, b'{"data": []}', {"content-type": "application/json"})
    a.response(f)
    a.done()
    assert rows(tmp_path / "run") == []
    (ep,) = rows(tmp_path / "run", "SELECT path, requests FROM endpoints")
    assert ep == {"path": "/v1/models", "requests": 1}


def test_unknown_model_call_shape_gets_a_row_with_parse_error(addon, tmp_path: Path) -> None:
    a, _ = addon
    f = llm_flow(
        "api.openai.com", "/v1/completions", json.dumps({"model": "m", "prompt": "hi"}).encode()
    )
    a.request(f)
    respond(a, f, 200, "application/json", [b'{"id": "cmpl-1", "choices": []}'])
    a.done()
    (row,) = rows(tmp_path / "run")
    assert row["api"] == "unknown" and "no adapter" in row["parse_error"]


def test_client_closing_after_last_event_still_yields_a_complete_row(addon, tmp_path: Path) -> None:
    a, _ = addon
    body = (WIRE / "openai_chat" / "request_tool.json").read_bytes()
    f = llm_flow("api.openai.com", "/v1/chat/completions", body)
    a.request(f)
    f.response = http.Response.make(
        200, b"", {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
    )
    a.responseheaders(f)
    f.response.stream((WIRE / "openai_chat" / "stream_tool.sse").read_bytes())
    from mitmproxy.flow import Error

    f.error = Error("peer closed connection")
    a.error(f)
    a.done()
    (row,) = rows(tmp_path / "run")
    assert row["status"] == "complete" and row["error"] is None


def test_stream_cut_before_its_final_event_is_incomplete(addon, tmp_path: Path) -> None:
    a, _ = addon
    body = (WIRE / "openai_chat" / "request_tool.json").read_bytes()
    f = llm_flow("api.openai.com", "/v1/chat/completions", body)
    a.request(f)
    f.response = http.Response.make(
        200, b"", {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
    )
    a.responseheaders(f)
    sse = (WIRE / "openai_chat" / "stream_tool.sse").read_bytes()
    f.response.stream(sse[: len(sse) // 2])
    from mitmproxy.flow import Error

    f.error = Error("connection reset by upstream")
    a.error(f)
    a.done()
    (row,) = rows(tmp_path / "run")
    assert row["status"] == "incomplete" and "reset" in row["error"]


def test_websocket_responses_calls_are_split_per_response_create(addon, tmp_path: Path) -> None:
    a, _ = addon
    f = tflow.twebsocketflow(messages=False)
    f.request.host, f.request.path, f.request.port = "api.openai.com", "/v1/responses", 443
    f.request.headers["host"] = "api.openai.com"
    a.request(f)
    from mitmproxy import websocket

    create = (WIRE / "openai_responses" / "ws_request.json").read_text()
    server = (WIRE / "openai_responses" / "ws_server.jsonl").read_text().splitlines()
    for _ in range(2):
        f.websocket.messages.append(websocket.WebSocketMessage(1, True, create.encode()))
        a.websocket_message(f)
        for line in server:
            f.websocket.messages.append(websocket.WebSocketMessage(1, False, line.encode()))
            a.websocket_message(f)
    a.websocket_end(f)
    a.done()
    got = rows(tmp_path / "run")
    assert len(got) == 2
    assert all(r["transport"] == "websocket" and r["status"] == "complete" for r in got)
    assert all(r["api"] == "openai_responses" and r["response_id"] for r in got)


def test_secret_in_request_body_is_scrubbed_before_disk(addon, tmp_path: Path) -> None:
    a, tctx = addon
    a.configure(forge_redact="re:tok-[a-z]{12}")
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": f"my key is {SECRET} and tok-abcdefghijkl"}],
        }
    ).encode()
    f = llm_flow("api.anthropic.com", "/v1/messages", body, x_api_key=SECRET)
    a.request(f)
    respond(
        a,
        f,
        200,
        "application/json",
        [(WIRE / "anthropic_messages" / "response_text.json").read_bytes()],
    )
    a.done()
    for p in (tmp_path / "run").rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert SECRET.encode() not in data and b"tok-abcdefghijkl" not in data, p


# A TLS ClientHello with SNI example.com (captured from curl, trimmed).
_CLIENT_HELLO_EXAMPLE_COM = (
    "0303a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
    "00"  # session id length
    "0004130113020100"  # cipher suites
    "0100"  # compression
    "0016"  # extensions length
    "0000001000"  # server_name ext header: type 0, len 16
    "0e00000b6578616d706c652e636f6d"  # list len 14, host_name, len 11, example.com
    "002b0003020304"  # supported_versions: TLS 1.3
)


def test_refused_websocket_upgrade_gets_426_so_codex_falls_back_to_http(addon) -> None:
    a, tctx = addon
    a.configure(forge_refuse_websocket=True)
    f = tflow.twebsocketflow(messages=False)
    f.response = None
    f.request.host, f.request.path, f.request.port = "api.openai.com", "/v1/responses", 443
    f.request.headers["host"] = "api.openai.com"
    a.request(f)
    assert f.response is not None and f.response.status_code == 426


def headers_arrive(
    tctx: taddons.context, a: ForgeAddons, f: http.HTTPFlow, length: bool = True
) -> None:
    """mitmproxy's requestheaders hook: the body has not arrived (content is unset)."""
    size = len(f.request.raw_content or b"")
    f.request.content = None
    if length:
        f.request.headers["content-length"] = str(size)
    else:
        del f.request.headers["content-length"]
        f.request.headers["transfer-encoding"] = "chunked"
    waiting = a.requestheaders(f)  # an awaitable only while the client's lookup runs
    if waiting is not None:
        tctx.master.event_loop.run_until_complete(waiting)


def test_a_known_api_request_streams_upstream_and_is_recorded_whole(addon, tmp_path: Path) -> None:
    a, tctx = addon
    body = (WIRE / "openai_chat" / "request_tool.json").read_bytes()
    f = llm_flow(
        "api.openai.com",
        "/v1/chat/completions",
        body,
        authorization=f"Bearer {SECRET}",
        proxy_authorization="Basic cm9sbG91dC03Og==",  # rollout-7:
    )
    headers_arrive(tctx, a, f)
    # Streamed: mitmproxy sends the headers on now, so the proxy's own header is gone already.
    assert isinstance(f.request.stream, Tee)
    assert "proxy-authorization" not in f.request.headers
    sent = b"".join(f.request.stream(body[i : i + 50]) for i in range(0, len(body), 50))
    assert sent == body
    f.request.stream(b"")
    a.request(f)
    respond(
        a, f, 200, "application/json", [(WIRE / "openai_chat" / "response_tool.json").read_bytes()]
    )
    a.done()
    (row,) = rows(tmp_path / "run")
    assert row["api"] == "openai_chat" and row["status"] == "complete"
    assert row["rollout_id"] == "rollout-7" and row["rollout_source"] == "proxy_auth"
    assert row["request_headers"]["authorization"] == "[REDACTED]"
    assert row["request_bytes"] == len(body) and row["model"]
    assert SECRET not in json.dumps(rows(tmp_path / "run", "SELECT * FROM messages"), default=str)


def test_a_request_cut_off_mid_body_is_recorded_with_what_arrived(addon, tmp_path: Path) -> None:
    a, tctx = addon
    body = (WIRE / "openai_chat" / "request_tool.json").read_bytes()
    f = llm_flow("api.openai.com", "/v1/chat/completions", body)
    headers_arrive(tctx, a, f)
    f.request.stream(body[:40])
    f.error = flow.Error("Client disconnected.")
    a.error(f)
    a.done()
    (row,) = rows(tmp_path / "run")
    assert row["status"] != "complete" and row["request_bytes"] == 40


@pytest.mark.parametrize("case", ["unknown-path", "chunked", "other-host"])
def test_requests_that_need_their_whole_body_are_not_streamed(addon, case: str) -> None:
    a, tctx = addon
    body = (WIRE / "openai_chat" / "request_tool.json").read_bytes()
    host, path = "api.openai.com", "/v1/chat/completions"
    if case == "unknown-path":
        path = "/custom/llm"  # may still be a model call: judged on its body, whole
    if case == "other-host":
        host = "example.com"
    f = llm_flow(host, path, body)
    headers_arrive(tctx, a, f, length=case != "chunked")
    assert not f.request.stream
    assert capture_of(f) is None
    f.request.content = body  # buffered: the request hook sees it whole
    a.request(f)
    assert (capture_of(f) is not None) == (case != "other-host")


def _ends_in_wal(run: Path) -> int:
    """END frames in the write-ahead log's segments now."""
    from mitm_addon import wal

    frames = []
    for seg in sorted((run / "wal").glob("*.wal")):
        frames += wal.read_frames(seg.read_bytes())[0]
    return sum(1 for kind, _, _ in frames if kind == wal.END)


@pytest.mark.parametrize(
    ("content_type", "framing", "chunks", "passed", "whole"),
    [
        # JSON with its length: the chunk that completes it waits for the END frame.
        ("application/json", "length", [b'{"id": "chatcmpl-1", ', b'"choices": []}'], [1, 2], 2),
        # Chat's [DONE], split across two chunks: its first half passes (it is no line yet).
        (
            "text/event-stream",
            "chunked",
            [b'data: {"id": "c", "choices": []}\n\n', b"data: [DO", b"NE]\n\n"],
            [1, 2, 3],
            3,
        ),
        # Anthropic's message_stop: held from its event line to the blank line that ends it.
        (
            "text/event-stream",
            "chunked",
            [
                b"event: message_start\ndata: {}\n\n",
                b"event: message_stop\n",
                b'data: {"type": "message_stop"}\n\n',
            ],
            [1, 1, 3],
            3,
        ),
        # Bytes after the last event pass as they come (the END frame is already written).
        (
            "text/event-stream",
            "chunked",
            [b"event: response.completed\ndata: {}\n\n", b": keep-alive\n\n"],
            [1, 2],
            1,
        ),
    ],
)
def test_last_byte_of_a_reply_waits_for_its_end_frame(
    addon,
    tmp_path: Path,
    content_type: str,
    framing: str,
    chunks: list[bytes],
    passed: list[int],
    whole: int,
) -> None:
    """``passed[i]``: how many of the chunks the client has after chunk i arrived; the
    first ``whole`` chunks are the reply. The END frame is in the log exactly when the
    client has the whole reply."""
    a, _ = addon
    run = tmp_path / "run"
    f = llm_flow("api.openai.com", "/v1/chat/completions", b'{"model": "gpt-4.1", "messages": []}')
    a.request(f)
    f.response = http.Response.make(200, b"", {"content-type": content_type})
    if framing == "chunked":
        f.response.headers["transfer-encoding"] = "chunked"
    else:
        f.response.headers["content-length"] = str(sum(map(len, chunks)))
    a.responseheaders(f)
    stream = f.response.stream
    assert callable(stream)
    got = b""
    for i, chunk in enumerate(chunks):
        got += b"".join(stream(chunk))
        assert got == b"".join(chunks[: passed[i]])
        assert _ends_in_wal(run) == (1 if passed[i] >= whole else 0), f"after chunk {i}"
    assert b"".join(stream(b"")) == b""  # the body's end: nothing was left held
    f.response.content = None
    a.response(f)  # already logged: not logged twice
    a.done()
    assert _ends_in_wal(run) <= 1
    (row,) = rows(run)
    assert row["response_bytes"] >= len(b"".join(chunks[:whole]))


def test_an_event_stream_without_a_last_event_passes_every_chunk_at_once(
    addon, tmp_path: Path
) -> None:
    """Chunked and without its API's last event (a cut stream): nothing is held; the body's
    end reaches the client after the response hook, which logs the call."""
    a, _ = addon
    f = llm_flow("api.openai.com", "/v1/chat/completions", b'{"model": "gpt-4.1", "messages": []}')
    a.request(f)
    f.response = http.Response.make(200, b"", {"content-type": "text/event-stream"})
    f.response.headers["transfer-encoding"] = "chunked"
    a.responseheaders(f)
    stream = f.response.stream
    assert callable(stream)
    chunks = [b'data: {"choices": []}\n\n', b'data: {"note": "data: [DONE] is text"}\n\n']
    assert [b"".join(stream(c)) for c in chunks] == chunks


def test_without_the_proxy_password_a_connection_gets_407_and_with_it_names_its_rollout(
    addon, tmp_path: Path
) -> None:
    import base64

    a, _ = addon
    a.configure(forge_proxy_password="pw-0123456789")

    def connect(credentials: str | None) -> http.HTTPFlow:
        f = tflow.tflow()
        f.request.method, f.request.host, f.request.port = "CONNECT", "api.openai.com", 443
        if credentials is not None:
            token = base64.b64encode(credentials.encode()).decode()
            f.request.headers["proxy-authorization"] = f"Basic {token}"
        a.http_connect(f)
        return f

    for credentials in (None, "r-1:nope", "r-1:"):
        f = connect(credentials)
        assert f.response is not None and f.response.status_code == 407
        assert f.response.headers["proxy-authenticate"] == 'Basic realm="forge"'
    f = connect("r-9:pw-0123456789")
    assert f.response is None
    shared = a.routing.shared
    assert shared.conn_rollout[f.client_conn.id] == "r-9"
    assert f.client_conn.id in shared.authorized
    a.client_disconnected(f.client_conn)
    assert f.client_conn.id not in shared.authorized
