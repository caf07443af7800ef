"""Record every call Routing sent its way: the writer's life cycle, the client process of
each connection, and each call's record from its first byte to its last.

Responses are teed, never buffered: the harness gets each chunk when upstream sends it.
Requests to a known model API are teed too (sent upstream as they arrive, as bare
mitmproxy streams them); other requests are examined whole. On the way of a request and
its response the hooks do little more than open the call's record (its BEGIN frame in the
write-ahead log); its headers are redacted, its bodies scrubbed and its END frame written
at its end, once the response has passed. Shards are built from the log by
``mitm_addon.builder``, a child process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Awaitable
from functools import partial
from pathlib import Path

import psutil
from mitmproxy import connection, ctx, http, websocket

from mitm_addon.addons.routing import json_response
from mitm_addon.addons.state import FlowState, Route, Shared, WsCall
from mitm_addon.attribution import ProcessInfo, ProcessLookups
from mitm_addon.bodies import BodyError, decode_body
from mitm_addon.capture import Capture
from mitm_addon.ids import new_id
from mitm_addon.redact import REDACTED, redact_headers, redact_query, scrub_body
from mitm_addon.tee import ReplyTee, Tee
from mitm_addon.writer import Writer, found_process

log = logging.getLogger(__name__)
_PARENT_POLL_S = 0.5
_LOOKUP_WAIT_S = 2.0  # the longest a first request waits for its client's process lookup

# WebSocket server messages that end one Responses call (checked on a message's head).
_WS_TERMINAL = re.compile(
    r'"type"\s*:\s*"(response\.completed|response\.failed|response\.incomplete|error)"'
)
_WS_HEAD_CHARS = 256

ProcessFuture = concurrent.futures.Future[ProcessInfo | None]


class Recording:
    """Writes each routed call to the write-ahead log: BEGIN when it starts, END when it ends."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._conn_process: dict[str, ProcessFuture] = {}
        self._conn_found: dict[str, ProcessInfo | None] = {}  # lookups seen done, by connection
        self._lookups = ProcessLookups(os.getpid())
        self._local_addresses = local_addresses()
        self._parent_watch: asyncio.Task[None] | None = None

    # -- life cycle ----------------------------------------------------------------------

    def configure(self, updated: set[str]) -> None:
        config, writer = self.shared.config, self.shared.writer
        if "forge_dir" not in updated or writer is None or config is None:
            return
        if config.out_dir != writer.root:  # a new forge_dir: record there from now on
            writer.stop()
            self.shared.writer = None
            self.running()

    def running(self) -> None:
        shared, config = self.shared, self.shared.config
        if shared.writer is not None or config is None or config.out_dir is None:
            if shared.config_error:
                log.error("forge: %s; LLM calls will be refused until it is", shared.config_error)
            return
        writer = shared.writer = Writer(config, shared.run_id)
        report = writer.start()
        if report.segments:
            log.warning(
                "forge: recovered %d calls (%d incomplete) from the write-ahead log of an earlier run",
                report.calls,
                report.incomplete,
            )
        log.info("forge: recording %s to %s", ",".join(sorted(config.hosts)), config.out_dir)
        parent = ctx.options.forge_parent_pid
        if parent and self._parent_watch is None:
            if os.getppid() != parent and not _alive(parent):
                # Killed while this proxy started: no one will stop it, and it would hold
                # its run directory for ever.
                log.warning("forge: the launcher (pid %d) has gone; stopping", parent)
                ctx.master.shutdown()
            elif os.getppid() != parent:
                log.warning("forge: forge_parent_pid %d is not this proxy's parent", parent)
            else:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # no event loop (taddons): nothing to watch with
                    loop = None
                if loop is not None:
                    self._parent_watch = loop.create_task(self._watch_parent(parent))
        ready = ctx.options.forge_ready_file
        if ready:
            Path(ready).write_text(
                json.dumps(
                    {"pid": os.getpid(), "run_id": shared.run_id, "dir": str(config.out_dir)}
                )
            )

    async def _watch_parent(self, pid: int) -> None:
        while os.getppid() == pid:
            await asyncio.sleep(_PARENT_POLL_S)
        log.warning("forge: the launcher (pid %d) has gone; stopping", pid)
        ctx.master.shutdown()

    def done(self) -> None:
        # Lookups first: a call still waiting for its process gets its (empty) PROC frame
        # while the log is open.
        self._lookups.shutdown()
        if self.shared.writer is not None:
            self.shared.writer.stop()
            self.shared.writer = None

    # -- connections ---------------------------------------------------------------------

    def client_connected(self, client: connection.Client) -> None:
        config = self.shared.config
        if config is None or not config.process_lookup or not client.peername:
            return
        # Only a client on this host has a process to find: loopback, or (transparent
        # capture of a REDIRECTed connection) one of the host's own addresses.
        if client.peername[0].removeprefix("::ffff:") not in self._local_addresses:
            return
        self._conn_process[client.id] = self._lookups.submit(client.peername[1])

    def client_disconnected(self, client: connection.Client) -> None:
        self._conn_process.pop(client.id, None)
        self._conn_found.pop(client.id, None)

    def _process_of(self, conn_id: str) -> tuple[ProcessInfo | None, ProcessFuture | None]:
        """(the connection's client process, once its lookup is done; else the lookup still
        running). Read from the future once per connection (each read takes its lock)."""
        if conn_id in self._conn_found:
            return self._conn_found[conn_id], None
        future = self._conn_process.get(conn_id)
        if future is None or not future.done():
            return None, future
        info = self._conn_found[conn_id] = found_process(future)
        return info, None

    # -- HTTP ------------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # The lookup needs the client's socket to exist: a client that sends one request and
        # closes as soon as it has the answer (the OpenAI SDK after a stream's [DONE]) can be
        # gone before a lookup that lagged (a busy proxy) reads /proc. Hold the connection's
        # first request until its lookup is done; later requests find it done. mitmproxy
        # awaits what a hook returns: a coroutine only then, so other requests cost no task.
        process = self._conn_process.get(flow.client_conn.id)
        if process is not None and not process.done():
            return self._open_after_lookup(flow, process)
        self._open_streamed(flow)
        return None

    async def _open_after_lookup(self, flow: http.HTTPFlow, process: ProcessFuture) -> None:
        with contextlib.suppress(asyncio.TimeoutError, concurrent.futures.CancelledError):
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(process)), _LOOKUP_WAIT_S)
        self._open_streamed(flow)

    def _open_streamed(self, flow: http.HTTPFlow) -> None:
        """Open the record of a call Routing streams, and tee its body upstream. A record
        that cannot be opened leaves the call to ``request`` (which refuses it if it must),
        its body examined whole."""
        state = FlowState.of(flow)
        if state is None or not state.streamed:
            return
        config = self.shared.config
        assert config is not None
        capture = self._new_capture(flow, state)
        if not self._log_begin(capture):
            state.streamed = False
            return
        tee = Tee(config.max_body_bytes)
        flow.request.stream = tee
        state.capture, state.request_tee = capture, tee

    def request(self, flow: http.HTTPFlow) -> None:
        state = FlowState.of(flow)
        if state is None or state.request_tee is not None:
            return  # not an LLM host's, or teed: its record opened at its headers
        if state.route is Route.MODEL or state.route is Route.SERVED:
            self._begin(flow, state)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = FlowState.of(flow)
        if state is None or state.capture is None or flow.response is None:
            return
        if state.route is Route.SERVED and state.upstream_url is None:
            return  # answered here, whole: nothing to tee
        assert self.shared.config is not None
        capture = state.capture
        length: int | None = None
        chunked = False
        for name, value in flow.response.headers.fields:  # no mitmproxy lookup: it decodes all
            name = name.lower()
            if name == b"content-type" and b"text/event-stream" in value:
                capture.transport = "sse"
            elif name == b"content-length" and value.strip().isdigit():
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        tee = ReplyTee(
            self.shared.config.max_body_bytes,
            partial(self._end_before_last_byte, flow, state),
            length=None if chunked else length,
            events=capture.transport == "sse",
        )
        flow.response.stream = tee
        state.response_tee = tee

    def _end_before_last_byte(self, flow: http.HTTPFlow, state: FlowState) -> None:
        """The response's body has ended upstream: log the call's end now, while its last
        bytes wait (``ReplyTee``), not after the client has them."""
        if state.capture is None:
            return
        try:
            self._end(flow, state, None)
        except Exception:  # a bug here must not cut the reply off
            log.exception("forge: cannot log the end of %s", flow.request.path)

    def response(self, flow: http.HTTPFlow) -> None:
        state = FlowState.of(flow)
        if state is None:
            return
        if state.capture is not None:
            self._end(flow, state, None)
        elif (
            state.route in (Route.ENDPOINT, Route.LOCAL)
            and flow.response is not None
            and (writer := self.shared.writer) is not None
        ):
            writer.count_endpoint(
                state.host, flow.request.method, flow.request.path, flow.response.status_code
            )

    def error(self, flow: http.HTTPFlow) -> None:
        state = FlowState.of(flow)
        if state is None or state.capture is None:
            return
        self._end(flow, state, flow.error.msg if flow.error else "connection error")
        if flow.response is None and flow.killable:
            # Without a response mitmproxy would answer 502 itself; the harness must see
            # what it sees without the proxy: a dropped connection.
            flow.kill()

    # -- WebSocket (Responses API, as Codex CLI speaks it) --------------------------------

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        state = FlowState.of(flow)
        if state is None or state.route is not Route.WEBSOCKET or flow.websocket is None:
            return
        if self.shared.writer is None:
            return
        message = flow.websocket.messages[-1]
        current = state.ws_call
        if message.from_client:
            if not starts_ws_call(message):
                return
            if current is not None:
                self._end_ws(flow, state, "a new response.create arrived before this call ended")
            capture = self._new_capture(flow, state)
            capture.transport = "websocket"
            capture.status_code = 101
            body = message.content
            capture.request_wire_bytes = len(body)
            assert self.shared.config is not None
            capture.request_headers, secrets = self._request_headers(state)
            capture.request_body = scrub_body(body, secrets, self.shared.config.redaction)
            if not self._log_begin(capture):
                return
            state.ws_call = WsCall(capture)
        elif current is not None:
            text = message.text if message.is_text else message.content.decode("utf-8", "replace")
            if current.capture.first_byte_at is None:
                current.capture.first_byte_at = time.time()
            current.messages.append(text)
            if _WS_TERMINAL.search(text[:_WS_HEAD_CHARS]):
                self._end_ws(flow, state, None)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        state = FlowState.of(flow)
        if state is not None and state.ws_call is not None:
            reason = (
                flow.error.msg if flow.error else "the WebSocket closed before the response ended"
            )
            self._end_ws(flow, state, reason)

    # -- records ---------------------------------------------------------------------------

    def _new_capture(self, flow: http.HTTPFlow, state: FlowState) -> Capture:
        """A new call's record, as its BEGIN frame needs it: the path is redacted now (it is
        written at once); the headers and bodies wait for the call's end."""
        shared = self.shared
        assert shared.config is not None
        rollout = shared.conn_rollout.get(flow.client_conn.id)
        source = "proxy_auth" if rollout else None
        if rollout is None and shared.config.rollout:
            rollout, source = shared.config.rollout, "option"
        if state.path is None:  # the flow's first call (a WebSocket has more)
            state.path, state.query_secrets = redact_query(
                state.client_path, shared.config.redaction
            )
        capture = Capture(
            call_id=new_id(),
            run_id=shared.run_id,
            transport="http",
            method=flow.request.method,
            scheme=flow.request.scheme,
            host=state.host,
            path=state.path,
            started_at=time.time(),
            rollout_id=rollout,
            rollout_source=source,
            client_conn_id=flow.client_conn.id,
            upstream_url=state.upstream_url,
        )
        info, _ = self._process_of(flow.client_conn.id)
        if info is not None:
            capture.set_process(info.pid, info.name, info.parent_pids, info.rollout_id)
        return capture

    def _request_headers(self, state: FlowState) -> tuple[dict[str, str], list[str]]:
        """(the request's headers as stored, the secret values to scrub from its bodies),
        from the headers as the client sent them; worked out once per flow."""
        if state.headers is None:
            assert self.shared.config is not None
            headers, secrets = redact_headers(state.client_fields, self.shared.config.redaction)
            state.headers = (headers, secrets + state.query_secrets)
        return state.headers

    def _begin(self, flow: http.HTTPFlow, state: FlowState) -> None:
        config = self.shared.config
        assert config is not None
        capture = self._new_capture(flow, state)
        if flow.request.timestamp_end:
            capture.started_at = flow.request.timestamp_end
        if self._log_begin(capture):
            state.capture = capture
        elif config.on_write_error == "fail":
            writer = self.shared.writer
            flow.response = json_response(
                507,
                {
                    "error": "Forge cannot record this call "
                    f"({writer.last_error if writer else 'no writer'}); "
                    "refusing to pass it unrecorded (forge_on_write_error=fail)"
                },
            )

    def _log_begin(self, capture: Capture) -> bool:
        writer = self.shared.writer
        assert writer is not None
        try:
            writer.begin(capture)
            return True
        except (OSError, ValueError) as e:
            writer.last_error = f"cannot append to the write-ahead log: {e}"
            log.error("forge: %s", writer.last_error)
            return False

    def _log_end(self, capture: Capture, process: ProcessFuture | None) -> None:
        writer = self.shared.writer
        assert writer is not None
        try:
            writer.end(capture, process)
        except (OSError, ValueError) as e:
            writer.last_error = f"cannot append to the write-ahead log: {e}"
            log.error("forge: LOST call %s %s: %s", capture.method, capture.path, writer.last_error)

    def _set_request_body(
        self, flow: http.HTTPFlow, capture: Capture, raw: bytes, secrets: list[str]
    ) -> None:
        config = self.shared.config
        assert config is not None
        encoding = capture.request_headers.get("content-encoding")
        if encoding == REDACTED:  # kept off disk by forge_redact; the request still has it
            encoding = flow.request.headers.get("content-encoding")
        capture.request_wire_bytes = len(raw)
        capture.request_encoding = encoding
        body = raw
        if encoding:
            try:
                body = decode_body(raw, encoding, config.max_body_bytes)
            except BodyError as e:
                capture.error = f"request body: {e}"
        capture.request_body = scrub_body(body, secrets, config.redaction)
        if capture.started_at and flow.request.timestamp_end:
            capture.started_at = flow.request.timestamp_end

    def _end(self, flow: http.HTTPFlow, state: FlowState, error: str | None) -> None:
        """Complete the record and log it: the headers redacted and the bodies scrubbed here,
        once the response has passed, not on the way of the request or the response."""
        capture, tee, sent = state.capture, state.response_tee, state.request_tee
        state.capture = state.response_tee = state.request_tee = None
        config = self.shared.config
        assert capture is not None and config is not None
        capture.request_headers, secrets = self._request_headers(state)
        raw = sent.body() if sent is not None else (flow.request.raw_content or b"")
        self._set_request_body(flow, capture, raw, secrets)
        capture.ended_at = time.time()
        if flow.response is not None:
            capture.status_code = flow.response.status_code
            capture.response_headers, _ = redact_headers(
                flow.response.headers.fields, config.redaction
            )
            if tee is not None:
                body = tee.body()
                capture.response_wire_bytes = tee.size
                capture.response_truncated = tee.truncated
                capture.first_byte_at = tee.first_at or flow.response.timestamp_start
            else:
                body = flow.response.raw_content or b""
                capture.response_wire_bytes = len(body)
                capture.first_byte_at = flow.response.timestamp_start
            capture.response_body = scrub_body(body, secrets, config.redaction)
        if error:
            capture.error = error
        self._log_end(capture, self._lookup_at_end(flow, capture))

    def _lookup_at_end(self, flow: http.HTTPFlow, capture: Capture) -> ProcessFuture | None:
        """The call's client process, if its lookup ended after the call began; else the
        lookup still running, for the writer to wait on."""
        info, running = self._process_of(flow.client_conn.id)
        if info is not None and capture.pid is None:
            capture.set_process(info.pid, info.name, info.parent_pids, info.rollout_id)
        return running

    def _end_ws(self, flow: http.HTTPFlow, state: FlowState, error: str | None) -> None:
        call = state.ws_call
        assert call is not None
        state.ws_call = None
        capture = call.capture
        capture.ended_at = time.time()
        capture.stream_events = len(call.messages)
        body = json.dumps(call.messages, ensure_ascii=False).encode("utf-8")
        capture.response_wire_bytes = sum(len(m) for m in call.messages)
        assert self.shared.config is not None
        _, secrets = self._request_headers(state)
        capture.response_body = scrub_body(body, secrets, self.shared.config.redaction)
        if error:
            capture.error = error
        self._log_end(capture, self._lookup_at_end(flow, capture))


def starts_ws_call(message: websocket.WebSocketMessage) -> bool:
    """Does this client message start a Responses call (``response.create``)?"""
    return message.is_text and '"response.create"' in message.text[: _WS_HEAD_CHARS * 4]


def local_addresses() -> frozenset[str]:
    """This host's IP addresses (loopback included)."""
    found = {"127.0.0.1", "::1"}
    try:
        for addrs in psutil.net_if_addrs().values():
            found.update(
                a.address.split("%")[0]
                for a in addrs
                if a.family in (socket.AF_INET, socket.AF_INET6)
            )
    except OSError:
        pass
    return frozenset(found)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
