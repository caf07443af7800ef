"""Forge's mitmproxy addon: ``mitmdump -s mitm_addon/forge_addon.py --set forge_dir=DIR``.

Only wiring lives here: options, hooks, and the hand-off to the writer (the WAL; shards
are built from it by ``mitm_addon.builder``, a child process). LLM hosts
(``forge_hosts``) are intercepted and their model calls recorded; every other host
is tunnelled untouched (no forged certificate) or answered 404 (``forge_other_hosts``).
Responses are teed, never buffered: the harness gets each chunk when upstream sends it.
Requests to a known model API are teed too (sent upstream as they arrive, as bare
mitmproxy streams them); other requests are buffered and examined whole. On the way of
a request and its response the hooks do little more than open the call's record (its
BEGIN frame); its headers are redacted, its bodies scrubbed and its END frame written at
its end, once the response has passed.
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
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):  # loaded by path through ``mitmdump -s``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
from mitmproxy import connection, ctx, exceptions, http, tls
from mitmproxy.addonmanager import Loader

from mitm_addon import config as cfg
from mitm_addon.attribution import ProcessInfo, ProcessLookups
from mitm_addon.bodies import BodyError, decode_body
from mitm_addon.capture import Capture
from mitm_addon.ids import new_id
from mitm_addon.protocols import find_adapter, openai_responses
from mitm_addon.protocols.base import Adapter
from mitm_addon.redact import (
    REDACTED,
    proxy_auth_user,
    redact_headers,
    redact_query,
    scrub_body,
)
from mitm_addon.serve.handler import Answer as ServeAnswer
from mitm_addon.serve.handler import Server as ServeServer
from mitm_addon.serve.handler import answers_locally, parse_models
from mitm_addon.serve.handler import error_answer as serve_error_answer
from mitm_addon.serve.renderer import TemplateError
from mitm_addon.writer import Writer, found_process

log = logging.getLogger(__name__)
_PARENT_POLL_S = 0.5
_LOOKUP_WAIT_S = 2.0  # the longest a first request waits for its client's process lookup
# Distinct Host headers whose parsed host (and forge_hosts verdict) is kept: a proxy sees a
# handful; the bound only stops a client that sends a new one per request from growing it.
_HOST_CACHE_SIZE = 1024

# WebSocket server messages that end one Responses call (checked on a message's head).
_WS_TERMINAL = re.compile(
    r'"type"\s*:\s*"(response\.completed|response\.failed|response\.incomplete|error)"'
)
_WS_HEAD_CHARS = 256


class Tee:
    """A body's stream callable: forwards each chunk unchanged and keeps a copy."""

    __slots__ = ("chunks", "size", "limit", "truncated", "first_at")

    def __init__(self, limit: int) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.truncated = False
        self.first_at: float | None = None

    def __call__(self, data: bytes) -> bytes:
        if data:
            if self.first_at is None:
                self.first_at = time.time()
            self.size += len(data)
            if self.size <= self.limit:
                self.chunks.append(data)
            else:
                self.truncated = True
        return data

    def body(self) -> bytes:
        return b"".join(self.chunks)


class _WsCall:
    """The Responses call in progress on one WebSocket."""

    __slots__ = ("capture", "messages")

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.messages: list[str] = []


class ForgeAddon:
    def __init__(self) -> None:
        self.config: cfg.Config | None = None
        self.config_error: str | None = "forge_dir is not set: add --set forge_dir=DIR"
        self.writer: Writer | None = None
        self.run_id = new_id("run-")
        self._conn_rollout: dict[str, str] = {}
        self._conn_process: dict[str, concurrent.futures.Future[ProcessInfo | None]] = {}
        self._conn_found: dict[str, ProcessInfo | None] = {}  # lookups seen done, by connection
        self._hosts: dict[str, tuple[str, bool]] = {}  # Host header -> (host, in forge_hosts)
        self._adapters: dict[tuple[str, str], Adapter | None] = {}  # (method, path) -> adapter
        self._lookups = ProcessLookups(os.getpid())
        self._local_addresses = local_addresses()
        self._parent_watch: asyncio.Task[None] | None = None
        # Serve mode answers model calls in an async hook of its own (a child addon, so it
        # runs after this addon's request hook has opened the call's record). mitmproxy
        # walks ``addons`` at every event: the child is there only in serve mode.
        self.serve = ServeHook(self)
        self.addons: list[ServeHook] = []

    # -- options -------------------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "forge_dir",
            str,
            "",
            "Directory the recorded calls go to (Parquet shards under calls/ and messages/, "
            "a write-ahead log under wal/). Created if absent; must be writable.",
        )
        loader.add_option(
            "forge_mode",
            str,
            "record",
            "record: pass calls through to the provider and record them. serve: answer them "
            "from the policy server (forge_policy) and record them with their token ids; no "
            "provider is contacted for the models it serves.",
        )
        loader.add_option(
            "forge_policy",
            str,
            "",
            "Serve mode: base URL of the policy server (vLLM or forge serve-policy), e.g. "
            "http://127.0.0.1:8000 .",
        )
        loader.add_option(
            "forge_tokenizer",
            str,
            "",
            "Serve mode: folder of the policy's tokenizer and chat template (its model folder).",
        )
        loader.add_option(
            "forge_serve_models",
            str,
            "all",
            "Serve mode: the requested models the policy answers, comma-separated names or "
            "globs (claude-*), or all. Calls for other models go to their provider and are "
            "recorded as in record mode.",
        )
        loader.add_option(
            "forge_serve_max_tokens",
            int,
            0,
            "Serve mode: the most completion tokens the policy writes per call, below what the "
            "harness asks for (0: no cap beyond the harness's own max_tokens, else 4096). A "
            "capped reply ends with the API's length stop reason.",
        )
        loader.add_option(
            "forge_rollout",
            Optional[str],  # type: ignore[arg-type]  # noqa: UP045 - mitmproxy's option types
            None,
            "Rollout id for calls that carry none in their proxy credentials "
            "(HTTPS_PROXY=http://ROLLOUT:x@host:port) .",
        )
        loader.add_option(
            "forge_hosts",
            str,
            ",".join(cfg.DEFAULT_HOSTS),
            "Comma-separated LLM hosts to intercept (*.example.com wildcards allowed). "
            "Every other host is tunnelled untouched or refused, per forge_other_hosts.",
        )
        loader.add_option(
            "forge_upstream",
            str,
            "",
            "Send a provider host to another base URL: "
            "api.openai.com=http://127.0.0.1:9000,api.anthropic.com=https://gateway.example .",
        )
        loader.add_option(
            "forge_other_hosts",
            str,
            "pass",
            "Hosts outside forge_hosts: pass (tunnel untouched, no forged certificate) or 404 "
            "(answer 404 locally; on a machine without internet, catalog fetchers then fall back).",
        )
        loader.add_option(
            "forge_redact",
            str,
            "",
            "Extra secrets to keep off disk, comma-separated: header:NAME, param:NAME or re:PATTERN "
            "(a bare NAME is a header). Authorization, API-key headers, cookies, proxy passwords "
            "and key-like query parameters are always removed.",
        )
        loader.add_option(
            "forge_rotate_rows", int, 5000, "Start a new shard after this many calls."
        )
        loader.add_option(
            "forge_rotate_bytes",
            int,
            64 * 1024 * 1024,
            "Start a new shard after this many body bytes.",
        )
        loader.add_option(
            "forge_rotate_seconds", int, 60, "Start a new shard after this many seconds."
        )
        loader.add_option(
            "forge_max_body_bytes",
            int,
            256 * 1024 * 1024,
            "Bodies past this size still pass through, but are not kept whole (the row says so).",
        )
        loader.add_option(
            "forge_on_write_error",
            str,
            "fail",
            "When a call cannot be logged (disk full, directory gone): fail (answer the harness "
            "507 so nothing passes unrecorded) or warn (pass the call and log an error).",
        )
        loader.add_option(
            "forge_min_free_bytes",
            int,
            64 * 1024 * 1024,
            "Treat the disk as full when less than this is free under forge_dir: a call that "
            "starts then is a write error (see forge_on_write_error), so a response is never "
            "passed that could not be logged. 0 turns the check off.",
        )
        loader.add_option(
            "forge_process_lookup",
            bool,
            True,
            "Find the client process of each connection (pid, ancestors, FORGE_ROLLOUT_ID).",
        )
        loader.add_option(
            "forge_builder",
            str,
            "process",
            "Where recorded calls become Parquet shards: process (a child process, python -m "
            "mitm_addon.builder, so that parsing and encoding take nothing from the proxy's "
            "event loop) or thread (a thread of the proxy: no child process, at a cost in "
            "throughput). Either reads the write-ahead log the hooks append to.",
        )
        loader.add_option(
            "forge_refuse_websocket",
            bool,
            False,
            "Answer WebSocket upgrades to the Responses API with 426, so clients that can "
            "(Codex CLI) fall back to HTTP + SSE.",
        )
        loader.add_option(
            "forge_ready_file", str, "", "Written once the addon is recording (for launchers)."
        )
        loader.add_option(
            "forge_parent_pid",
            int,
            0,
            "Stop, storing every recorded call, once the process with this pid is no longer "
            "the proxy's parent: a launcher killed with SIGKILL takes its proxy with it "
            "(forge record and forge rollout set it). 0: off.",
        )

    def configure(self, updated: set[str]) -> None:
        if "connection_strategy" in ctx.options and ctx.options.connection_strategy != "lazy":
            # LLM hosts may be unreachable (tests, gateways): connect only once we know where to.
            ctx.options.update(connection_strategy="lazy")
        if "listen_host" in ctx.options and ("listen_host" in updated or "proxyauth" in updated):
            _check_listen_host(ctx.options.listen_host, ctx.options.proxyauth)
            if not ctx.options.listen_host:
                # mitmproxy listens on every interface by default; a recorder of API
                # traffic should not: loopback unless asked otherwise.
                ctx.options.update(listen_host="127.0.0.1")
        if "stream_large_bodies" in updated and ctx.options.stream_large_bodies:
            # mitmproxy would stream a large request past the addon, which then records
            # an empty body; Forge streams responses from LLM hosts itself anyway.
            raise exceptions.OptionsError(
                "stream_large_bodies would pass large requests through unrecorded: unset it "
                "(Forge streams every response from an LLM host itself; forge_max_body_bytes "
                "bounds what it keeps)"
            )
        if not any(k.startswith("forge_") for k in updated):
            return
        o = ctx.options
        try:
            out = Path(o.forge_dir).expanduser().resolve() if o.forge_dir else None
            new = cfg.Config(
                out_dir=out,
                mode=cfg.parse_choice("forge_mode", o.forge_mode, cfg.MODES),
                rollout=o.forge_rollout or None,
                hosts=cfg.parse_hosts(o.forge_hosts),
                upstreams=cfg.parse_upstreams(o.forge_upstream),
                other_hosts=cfg.parse_choice(
                    "forge_other_hosts", o.forge_other_hosts, cfg.OTHER_HOSTS
                ),
                redaction=cfg.parse_redaction(o.forge_redact),
                rotate_rows=int(cfg.parse_positive("forge_rotate_rows", o.forge_rotate_rows)),
                rotate_bytes=int(cfg.parse_positive("forge_rotate_bytes", o.forge_rotate_bytes)),
                rotate_seconds=cfg.parse_positive("forge_rotate_seconds", o.forge_rotate_seconds),
                max_body_bytes=int(
                    cfg.parse_positive("forge_max_body_bytes", o.forge_max_body_bytes)
                ),
                on_write_error=cfg.parse_choice(
                    "forge_on_write_error", o.forge_on_write_error, ("fail", "warn")
                ),
                min_free_bytes=cfg.parse_non_negative(
                    "forge_min_free_bytes", o.forge_min_free_bytes
                ),
                process_lookup=o.forge_process_lookup,
                refuse_websocket=o.forge_refuse_websocket,
                builder=cfg.parse_choice("forge_builder", o.forge_builder, cfg.BUILDERS),
                policy_url=cfg.parse_policy_url(o.forge_policy) if o.forge_policy else None,
                tokenizer_dir=Path(o.forge_tokenizer).expanduser().resolve()
                if o.forge_tokenizer
                else None,
                serve_models=parse_models(o.forge_serve_models),
                serve_max_tokens=cfg.parse_non_negative(
                    "forge_serve_max_tokens", o.forge_serve_max_tokens
                ),
            )
            if out is not None:
                _check_writable(out)
            server = self._serve_server(new)
        except cfg.ConfigError as e:
            raise exceptions.OptionsError(str(e)) from e
        self.serve.server = server
        self.addons = [self.serve] if server is not None else []
        old_dir = self.config.out_dir if self.config else None
        self.config = new
        self._hosts.clear()
        self.config_error = None if new.out_dir else "forge_dir is not set: add --set forge_dir=DIR"
        if self.writer is not None and new.out_dir != old_dir:
            self.writer.stop()
            self.writer = None
            self.running()

    def running(self) -> None:
        if self.writer is not None or self.config is None or self.config.out_dir is None:
            if self.config_error:
                log.error("forge: %s; LLM calls will be refused until it is", self.config_error)
            return
        self.writer = Writer(self.config, self.run_id)
        report = self.writer.start()
        if report.segments:
            log.warning(
                "forge: recovered %d calls (%d incomplete) from the write-ahead log of an earlier run",
                report.calls,
                report.incomplete,
            )
        log.info(
            "forge: recording %s to %s", ",".join(sorted(self.config.hosts)), self.config.out_dir
        )
        parent = ctx.options.forge_parent_pid
        if parent and self._parent_watch is None:
            if os.getppid() != parent:
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
                    {"pid": os.getpid(), "run_id": self.run_id, "dir": str(self.config.out_dir)}
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
        if self.writer is not None:
            self.writer.stop()
            self.writer = None
        self.serve.done()  # also when a configure left serve mode: its pool may have threads

    # -- connections ---------------------------------------------------------------------

    def client_connected(self, client: connection.Client) -> None:
        if self.config is None or not self.config.process_lookup or not client.peername:
            return
        # Only a client on this host has a process to find: loopback, or (transparent
        # capture of a REDIRECTed connection) one of the host's own addresses.
        if client.peername[0].removeprefix("::ffff:") not in self._local_addresses:
            return
        self._conn_process[client.id] = self._lookups.submit(client.peername[1])

    def client_disconnected(self, client: connection.Client) -> None:
        self._conn_rollout.pop(client.id, None)
        self._conn_process.pop(client.id, None)
        self._conn_found.pop(client.id, None)

    def _process_of(
        self, conn_id: str
    ) -> tuple[ProcessInfo | None, concurrent.futures.Future[ProcessInfo | None] | None]:
        """(the connection's client process, once its lookup is done; else the lookup still
        running). Read from the future once per connection (each read takes its lock)."""
        if conn_id in self._conn_found:
            return self._conn_found[conn_id], None
        future = self._conn_process.get(conn_id)
        if future is None or not future.done():
            return None, future
        info = self._conn_found[conn_id] = found_process(future)
        return info, None

    def _adapter(self, method: str, path: str) -> Adapter | None:
        """``find_adapter``, kept by (method, path): a harness calls one or two endpoints."""
        key = (method, path)
        if key not in self._adapters:
            if len(self._adapters) >= _HOST_CACHE_SIZE:
                self._adapters.clear()
            self._adapters[key] = find_adapter(method, path)
        return self._adapters[key]

    def requestheaders(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # The lookup needs the client's socket to exist: a client that sends one request and
        # closes as soon as it has the answer (the OpenAI SDK after a stream's [DONE]) can be
        # gone before a lookup that lagged (a busy proxy) reads /proc. Hold the connection's
        # first request until its lookup is done; later requests find it done. mitmproxy
        # awaits what a hook returns: a coroutine only then, so other requests cost no task.
        process = self._conn_process.get(flow.client_conn.id)
        if process is not None and not process.done():
            return self._stream_after_lookup(flow, process)
        self._stream_request(flow)
        return None

    async def _stream_after_lookup(
        self, flow: http.HTTPFlow, process: concurrent.futures.Future[ProcessInfo | None]
    ) -> None:
        with contextlib.suppress(asyncio.TimeoutError, concurrent.futures.CancelledError):
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(process)), _LOOKUP_WAIT_S)
        self._stream_request(flow)

    def _stream_request(self, flow: http.HTTPFlow) -> None:
        """Open the record of a call to a known API at its headers and tee its body upstream.

        Only in record mode, for a body of known size within ``forge_max_body_bytes``; a
        call that needs its body before it is sent (serve mode, an unknown path that may
        be a model call, a chunked or oversized body, a WebSocket) is left to ``request``,
        and so is one whose record cannot be opened (``request`` refuses it if it must).
        """
        config, request = self.config, flow.request
        if (
            config is None
            or self.config_error
            or self.writer is None
            or self.serve.server is not None
        ):
            return
        # What decides it, from mitmproxy's header tuple in one pass: each mitmproxy header
        # lookup decodes and lower-cases every header again. Redacting the headers for the
        # record waits for the call's end, off the request's path.
        length = upgrade = host_header = None
        proxy_auth = False
        for name, value in request.headers.fields:
            key = name.lower()
            if key == b"content-length":
                length = value if length is None else b"x"  # repeated: not a size
            elif key == b"host":
                host_header = value if host_header is None else b""  # repeated: parse it
            elif key == b"upgrade":
                upgrade = value
            elif key == b"proxy-authorization":
                proxy_auth = True
        try:
            size = int(length or b"")
        except ValueError:
            return
        if not 0 < size <= config.max_body_bytes or upgrade is not None:
            return
        host, llm = self._host_of(request, host_header.decode("latin-1") if host_header else None)
        if not llm or not self._adapter(request.method, request.path):
            return
        if proxy_auth:
            self._take_proxy_auth(flow)  # never sent on, never stored
        capture = self._new_capture(flow, host)
        if not self._log_begin(capture):
            return
        tee = Tee(config.max_body_bytes)
        request.stream = tee
        flow.metadata.update(forge_capture=capture, forge_request_tee=tee)
        self._reroute(flow, host)

    def _host_of(self, request: http.Request, host_header: str | None) -> tuple[str, bool]:
        """(``request.pretty_host`` lower-cased, whether it is one of ``forge_hosts``), by
        Host header: mitmproxy parses and validates the authority on every call otherwise.

        ``host_header`` is the request's Host header as the hooks read it; HTTP/2 and 3 name
        the authority instead, which ``request.host_header`` gives."""
        assert self.config is not None
        if request.is_http2 or request.is_http3:
            host_header = request.host_header
        if not host_header or not host_header.isascii():  # the rare case: parse every time
            host = request.pretty_host.lower()
            return host, cfg.host_matches(host, self.config.hosts)
        known = self._hosts.get(host_header)
        if known is None:
            if len(self._hosts) >= _HOST_CACHE_SIZE:
                self._hosts.clear()
            host = request.pretty_host.lower()
            known = self._hosts[host_header] = (host, cfg.host_matches(host, self.config.hosts))
        return known

    def _take_proxy_auth(self, flow: http.HTTPFlow) -> None:
        """Remove ``Proxy-Authorization`` (never sent on); its user names the rollout."""
        auth = flow.request.headers.pop("proxy-authorization", None)
        if auth and (user := proxy_auth_user(auth)):
            self._conn_rollout[flow.client_conn.id] = user

    def http_connect(self, flow: http.HTTPFlow) -> None:
        user = proxy_auth_user(flow.request.headers.get("proxy-authorization"))
        if user:
            self._conn_rollout[flow.client_conn.id] = user

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        if self.config is None:
            return
        # The SNI as mitmproxy already read it from the ClientHello (reading
        # ``data.client_hello.sni`` walks the parsed extensions again).
        host = data.context.client.sni or (data.context.server.address or ("",))[0]
        if not cfg.host_matches(str(host), self.config.hosts) and self.config.other_hosts == "pass":
            data.ignore_connection = True

    # -- HTTP ------------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        if "forge_request_tee" in flow.metadata:
            return  # teed: its record was opened at its headers, and is completed at its end
        config = self.config
        self._take_proxy_auth(flow)
        if config is None:
            return
        host, llm = self._host_of(flow.request, flow.request.host_header)
        if not llm:
            if config.other_hosts == "404":
                flow.response = _json_response(
                    404, {"error": f"{host} is not served here (forge_other_hosts=404)"}
                )
            return
        if self.config_error or self.writer is None:
            flow.response = _json_response(
                503, {"error": f"Forge is not recording: {self.config_error or 'not started'}"}
            )
            return
        method, path = flow.request.method, flow.request.path
        upgrade = flow.request.headers.get("upgrade", "").lower() == "websocket"
        if self.serve.server is not None and self._route_serve(flow, host, upgrade):
            return
        if upgrade and openai_responses.matches_websocket(path):
            if config.refuse_websocket:
                flow.response = _json_response(
                    426, {"error": "WebSocket refused by Forge (forge_refuse_websocket); use HTTP"}
                )
                return
            flow.metadata["forge_ws"] = True
        elif self._adapter(method, path) is not None or _looks_like_model_call(
            flow, config.max_body_bytes
        ):
            self._begin(flow, host)
            if flow.response is not None:  # refused: could not log
                return
        else:
            flow.metadata["forge_count"] = host
        self._reroute(flow, host)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        capture: Capture | None = flow.metadata.get("forge_capture")
        if capture is None or flow.response is None or flow.metadata.get("forge_served"):
            return  # served calls are answered whole: nothing to tee
        assert self.config is not None
        for name, value in flow.response.headers.fields:  # no mitmproxy lookup: it decodes all
            if name.lower() == b"content-type" and b"text/event-stream" in value:
                capture.transport = "sse"
        tee = Tee(self.config.max_body_bytes)
        flow.response.stream = tee
        flow.metadata["forge_tee"] = tee

    def response(self, flow: http.HTTPFlow) -> None:
        if "forge_capture" in flow.metadata:
            self._end(flow, None)
        elif (host := flow.metadata.get("forge_count")) and self.writer and flow.response:
            self.writer.count_endpoint(
                host, flow.request.method, flow.request.path, flow.response.status_code
            )

    def error(self, flow: http.HTTPFlow) -> None:
        if "forge_capture" in flow.metadata:
            self._end(flow, flow.error.msg if flow.error else "connection error")
            if flow.response is None and flow.killable:
                # Without a response mitmproxy would answer 502 itself; the harness must see
                # what it sees without the proxy: a dropped connection.
                flow.kill()

    def _route_serve(self, flow: http.HTTPFlow, host: str, upgrade: bool) -> bool:
        """Serve mode: True when the request is answered here (by the policy, or locally)."""
        server = self.serve.server
        assert server is not None and self.config is not None and self.writer is not None
        method, path = flow.request.method, flow.request.path
        if upgrade:
            # mitmproxy cannot hold a WebSocket without an upstream to relay; Codex falls
            # back to HTTP + SSE on a 426, which serve mode answers.
            flow.response = _json_response(
                426, {"error": "Forge serve mode answers the Responses API over HTTP; use SSE"}
            )
            return True
        if self._adapter(method, path) is not None:
            if not server.serves(_requested_model(flow, self.config.max_body_bytes)):
                return False  # another model's call: to its provider, recorded
            self._begin(flow, host)
            if flow.response is None:
                flow.metadata["forge_serve"] = True
            return True
        if server.models and not answers_locally(method, path):
            return False  # some models still use the provider: so do its other endpoints
        flow.metadata["forge_serve_local"] = host  # answered by the async hook
        return True

    def _serve_server(self, config: cfg.Config) -> ServeServer | None:
        """The serve-mode server for a new configuration (kept when nothing it uses changed)."""
        if config.mode != "serve":
            return None
        if not config.policy_url or config.tokenizer_dir is None:
            raise cfg.ConfigError(
                "forge_mode=serve needs forge_policy (the policy server's URL) and "
                "forge_tokenizer (the policy's model folder)"
            )
        old = self.serve.server
        key = (
            config.policy_url,
            config.tokenizer_dir,
            config.serve_models,
            config.serve_max_tokens,
        )
        if old is not None and self.serve.key == key:
            return old
        try:
            server = ServeServer(
                config.policy_url,
                config.tokenizer_dir,
                config.serve_models,
                max_tokens_cap=config.serve_max_tokens or None,
            )
        except (TemplateError, ValueError) as e:
            raise cfg.ConfigError(str(e)) from e
        self.serve.key = key
        return server

    # -- WebSocket (Responses API, as Codex CLI speaks it) --------------------------------

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        if not flow.metadata.get("forge_ws") or flow.websocket is None or self.writer is None:
            return
        message = flow.websocket.messages[-1]
        current: _WsCall | None = flow.metadata.get("forge_ws_call")
        if message.from_client:
            if not message.is_text or '"response.create"' not in message.text[: _WS_HEAD_CHARS * 4]:
                return
            if current is not None:
                self._end_ws(flow, current, "a new response.create arrived before this call ended")
            capture = self._new_capture(
                flow, flow.metadata.get("forge_host", flow.request.pretty_host)
            )
            capture.transport = "websocket"
            capture.status_code = 101
            body = message.content
            capture.request_wire_bytes = len(body)
            assert self.config is not None
            capture.request_headers, secrets = self._request_headers(flow)
            capture.request_body = scrub_body(body, secrets, self.config.redaction)
            if not self._log_begin(capture):
                return
            flow.metadata["forge_ws_call"] = _WsCall(capture)
        elif current is not None:
            text = message.text if message.is_text else message.content.decode("utf-8", "replace")
            if current.capture.first_byte_at is None:
                current.capture.first_byte_at = time.time()
            current.messages.append(text)
            if _WS_TERMINAL.search(text[:_WS_HEAD_CHARS]):
                self._end_ws(flow, current, None)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        current: _WsCall | None = flow.metadata.get("forge_ws_call")
        if current is not None:
            reason = (
                flow.error.msg if flow.error else "the WebSocket closed before the response ended"
            )
            self._end_ws(flow, current, reason)

    # -- helpers -----------------------------------------------------------------------------

    def _new_capture(self, flow: http.HTTPFlow, host: str) -> Capture:
        """A new call's record, as its BEGIN frame needs it: the path is redacted now (it is
        written at once); the headers and bodies wait for the call's end (``_request_headers``
        redacts the headers as they are now, before a reroute rewrites Host)."""
        assert self.config is not None
        rollout = self._conn_rollout.get(flow.client_conn.id)
        source = "proxy_auth" if rollout else None
        if rollout is None and self.config.rollout:
            rollout, source = self.config.rollout, "option"
        path = flow.metadata.get("forge_path")
        if path is None:  # the flow's first call (a WebSocket has more)
            path, query_secrets = redact_query(flow.request.path, self.config.redaction)
            flow.metadata.update(
                forge_path=path,
                forge_query_secrets=query_secrets,
                forge_request_fields=flow.request.headers.fields,
                forge_host=host,
            )
        capture = Capture(
            call_id=new_id(),
            run_id=self.run_id,
            transport="http",
            method=flow.request.method,
            scheme=flow.request.scheme,
            host=host,
            path=path,
            started_at=time.time(),
            rollout_id=rollout,
            rollout_source=source,
            client_conn_id=flow.client_conn.id,
        )
        info, _ = self._process_of(flow.client_conn.id)
        if info is not None:
            capture.set_process(info.pid, info.name, info.parent_pids, info.rollout_id)
        return capture

    def _request_headers(self, flow: http.HTTPFlow) -> tuple[dict[str, str], list[str]]:
        """(the request's headers as stored, the secret values to scrub from its bodies),
        from the headers as they were when its record opened; worked out once per flow."""
        known: tuple[dict[str, str], list[str]] | None = flow.metadata.get("forge_headers")
        if known is None:
            assert self.config is not None
            fields = flow.metadata.get("forge_request_fields", flow.request.headers.fields)
            headers, secrets = redact_headers(fields, self.config.redaction)
            known = (headers, secrets + flow.metadata.get("forge_query_secrets", []))
            flow.metadata["forge_headers"] = known
        return known

    def _begin(self, flow: http.HTTPFlow, host: str) -> None:
        assert self.config is not None
        capture = self._new_capture(flow, host)
        if flow.request.timestamp_end:
            capture.started_at = flow.request.timestamp_end
        if self._log_begin(capture):
            flow.metadata["forge_capture"] = capture
        elif self.config.on_write_error == "fail":
            flow.response = _json_response(
                507,
                {
                    "error": "Forge cannot record this call "
                    f"({self.writer.last_error if self.writer else 'no writer'}); "
                    "refusing to pass it unrecorded (forge_on_write_error=fail)"
                },
            )

    def _set_request_body(
        self, flow: http.HTTPFlow, capture: Capture, raw: bytes, secrets: list[str]
    ) -> None:
        assert self.config is not None
        encoding = capture.request_headers.get("content-encoding")
        if encoding == REDACTED:  # kept off disk by forge_redact; the request still has it
            encoding = flow.request.headers.get("content-encoding")
        capture.request_wire_bytes = len(raw)
        capture.request_encoding = encoding
        body = raw
        if encoding:
            try:
                body = decode_body(raw, encoding, self.config.max_body_bytes)
            except BodyError as e:
                capture.error = f"request body: {e}"
        capture.request_body = scrub_body(body, secrets, self.config.redaction)
        if capture.started_at and flow.request.timestamp_end:
            capture.started_at = flow.request.timestamp_end

    def _log_begin(self, capture: Capture) -> bool:
        assert self.writer is not None
        try:
            self.writer.begin(capture)
            return True
        except (OSError, ValueError) as e:
            self.writer.last_error = f"cannot append to the write-ahead log: {e}"
            log.error("forge: %s", self.writer.last_error)
            return False

    def _log_end(
        self, capture: Capture, process: concurrent.futures.Future[ProcessInfo | None] | None
    ) -> None:
        assert self.writer is not None
        try:
            self.writer.end(capture, process)
        except (OSError, ValueError) as e:
            self.writer.last_error = f"cannot append to the write-ahead log: {e}"
            log.error(
                "forge: LOST call %s %s: %s", capture.method, capture.path, self.writer.last_error
            )

    def _end(self, flow: http.HTTPFlow, error: str | None) -> None:
        """Complete the record and log it: the headers redacted and the bodies scrubbed here,
        once the response has passed, not on the way of the request or the response."""
        capture: Capture = flow.metadata.pop("forge_capture")
        tee: Tee | None = flow.metadata.pop("forge_tee", None)
        sent: Tee | None = flow.metadata.pop("forge_request_tee", None)
        assert self.config is not None
        capture.request_headers, secrets = self._request_headers(flow)
        raw = sent.body() if sent is not None else (flow.request.raw_content or b"")
        self._set_request_body(flow, capture, raw, secrets)
        capture.ended_at = time.time()
        if flow.response is not None:
            capture.status_code = flow.response.status_code
            capture.response_headers, _ = redact_headers(
                flow.response.headers.fields, self.config.redaction
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
            capture.response_body = scrub_body(body, secrets, self.config.redaction)
        if error:
            capture.error = error
        self._log_end(capture, self._lookup_at_end(flow, capture))

    def _lookup_at_end(
        self, flow: http.HTTPFlow, capture: Capture
    ) -> concurrent.futures.Future[ProcessInfo | None] | None:
        """The call's client process, if its lookup ended after the call began; else the
        lookup still running, for the writer to wait on."""
        info, running = self._process_of(flow.client_conn.id)
        if info is not None and capture.pid is None:
            capture.set_process(info.pid, info.name, info.parent_pids, info.rollout_id)
        return running

    def _end_ws(self, flow: http.HTTPFlow, call: _WsCall, error: str | None) -> None:
        flow.metadata.pop("forge_ws_call", None)
        capture = call.capture
        capture.ended_at = time.time()
        capture.stream_events = len(call.messages)
        body = json.dumps(call.messages, ensure_ascii=False).encode("utf-8")
        capture.response_wire_bytes = sum(len(m) for m in call.messages)
        assert self.config is not None
        _, secrets = self._request_headers(flow)
        capture.response_body = scrub_body(body, secrets, self.config.redaction)
        if error:
            capture.error = error
        self._log_end(capture, self._lookup_at_end(flow, capture))

    def _reroute(self, flow: http.HTTPFlow, host: str) -> None:
        assert self.config is not None
        upstream = self.config.upstreams.get(host)
        if upstream is None:
            return
        flow.request.scheme = upstream.scheme
        flow.request.host = upstream.host
        flow.request.port = upstream.port
        if upstream.path_prefix:
            flow.request.path = upstream.path_prefix + flow.request.path
        flow.request.headers["host"] = f"{upstream.host}:{upstream.port}"
        capture: Capture | None = flow.metadata.get("forge_capture")
        if capture is not None:
            capture.upstream_url = upstream.base_url


class ServeHook:
    """Serve mode's async request hook: the policy answers on a worker thread, so
    mitmproxy's event loop keeps relaying other flows while a completion is sampled."""

    def __init__(self, forge: ForgeAddon) -> None:
        self.forge = forge
        self.server: ServeServer | None = None
        self.key: tuple[Any, ...] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="forge-serve")

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # Record mode has no server: no coroutine (and no task for mitmproxy to run) per call.
        return None if self.server is None else self._request(flow)

    async def _request(self, flow: http.HTTPFlow) -> None:
        host = flow.metadata.pop("forge_serve_local", None)
        if host is not None and self.server is not None:
            loop = asyncio.get_running_loop()
            local = await loop.run_in_executor(
                self._pool,
                self.server.answer_local,
                host,
                flow.request.method,
                flow.request.path,
                flow.request.get_content(strict=False) or b"",
            )
            flow.response = _answer_response(local)
            if self.forge.writer is not None:
                self.forge.writer.count_endpoint(
                    host, flow.request.method, flow.request.path, local.status
                )
            return
        if not flow.metadata.pop("forge_serve", False):
            return
        server, capture = self.server, flow.metadata.get("forge_capture")
        if server is None or capture is None:
            return
        loop = asyncio.get_running_loop()
        try:
            answer = await loop.run_in_executor(
                self._pool,
                server.answer,
                capture.call_id,
                flow.request.method,
                flow.request.path,
                flow.request.get_content(strict=False) or b"",
            )
        except Exception as e:  # a bug must not send the call on to the provider
            log.exception("forge: serving %s failed", flow.request.path)
            adapter = find_adapter(flow.request.method, flow.request.path)
            answer = serve_error_answer(
                adapter.api if adapter is not None else "openai_chat",
                500,
                f"Forge failed to serve this call: {type(e).__name__}: {e}",
            )
        if answer.stream:
            capture.transport = "sse"
        if answer.tokens is not None:
            t = answer.tokens
            capture.policy_version, capture.drift = t.policy_version, t.drift
            capture.prompt_ids, capture.prompt_parent_call_id = (
                t.prompt_ids,
                t.prompt_parent_call_id,
            )
            capture.completion_ids, capture.completion_logprobs = (
                t.completion_ids,
                t.completion_logprobs,
            )
            capture.finish_reason, capture.prompt_tokens = t.finish_reason, t.prompt_tokens
            capture.upstream_url = server.client.base_url
        flow.metadata["forge_served"] = True
        flow.response = _answer_response(answer)

    def done(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _answer_response(answer: ServeAnswer) -> http.Response:
    headers = {"content-type": answer.content_type, **answer.headers}
    if answer.stream:
        headers["cache-control"] = "no-cache"
    return http.Response.make(answer.status, answer.body, headers)


def _requested_model(flow: http.HTTPFlow, limit: int) -> str | None:
    """The model a model call names in its JSON body (None when it names none)."""
    try:
        raw = decode_body(
            flow.request.raw_content or b"", flow.request.headers.get("content-encoding"), limit
        )
        body = json.loads(raw)
    except (BodyError, ValueError, RecursionError):
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


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


def _looks_like_model_call(flow: http.HTTPFlow, limit: int) -> bool:
    """A POST no adapter owns whose JSON body names a model: recorded with a parse_error."""
    if flow.request.method != "POST" or "json" not in flow.request.headers.get("content-type", ""):
        return False
    try:
        raw = decode_body(
            flow.request.raw_content or b"", flow.request.headers.get("content-encoding"), limit
        )
        body = json.loads(raw)
    except (BodyError, ValueError, RecursionError):
        return False
    return (
        isinstance(body, dict)
        and "model" in body
        and any(k in body for k in ("messages", "input", "prompt"))
    )


def _json_response(status: int, body: dict[str, Any]) -> http.Response:
    return http.Response.make(
        status, json.dumps(body).encode(), {"content-type": "application/json"}
    )


def _check_listen_host(host: str, proxyauth: str | None) -> None:
    """Listening beyond loopback exposes the harness's traffic: require proxy authentication."""
    if not host or host in ("localhost", "::1") or host.startswith("127."):
        return
    if not proxyauth:
        raise exceptions.OptionsError(
            f"listen_host={host} would let anyone on the network use this proxy and read the "
            "calls it records; set proxyauth (e.g. --proxyauth USER:PASS) or listen on 127.0.0.1"
        )


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".forge-probe-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise cfg.ConfigError(
            f"forge_dir {directory} is not writable ({e}); Forge refuses to start "
            "rather than pass calls unrecorded"
        ) from e


addons = [ForgeAddon()]
