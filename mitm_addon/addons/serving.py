"""Serve mode: the calls Routing gave the policy are answered from it, in the API's own
shape (SSE, event by event as the policy samples, when the harness asked for a stream),
with their token ids on the record.

A served call, and a Responses WebSocket, is rerouted to serve mode's loopback endpoint
(``mitm_addon.serve.endpoint``), which answers it; mitmproxy relays the reply as it
comes and Recording records it as it records a provider's. The policy is asked on worker
threads, so mitmproxy's event loop keeps relaying other flows while a completion is
sampled. This addon comes after Recording in ``addons``: a served call's record is open
(its BEGIN frame written) before it is rerouted, and a WebSocket call's before its
``response.create`` reaches the endpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable
from typing import Any

from mitmproxy import exceptions, http

from mitm_addon.addons.recording import starts_ws_call
from mitm_addon.addons.state import FlowState, Route, Shared
from mitm_addon.capture import Capture
from mitm_addon.config import Config, ConfigError
from mitm_addon.serve.endpoint import CallJob, Endpoint, SocketJob
from mitm_addon.serve.handler import Answer, Server, TokenRecord
from mitm_addon.serve.renderer import TemplateError

log = logging.getLogger(__name__)
_WORKERS = 4  # model lists and token counts answered at once


class Serving:
    """Answers ``Route.SERVED`` and ``Route.LOCAL`` flows from the policy server."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.server: Server | None = None
        self._key: tuple[Any, ...] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            _WORKERS, thread_name_prefix="forge-local"
        )
        self.endpoint = Endpoint()
        self._captures: dict[str, Capture] = {}  # served calls waiting for their tokens
        self._sockets: dict[str, tuple[str, SocketJob]] = {}  # by flow id
        self._calls: dict[str, tuple[str, str]] = {}  # flow id -> (endpoint path, call id)

    def configure(self, updated: set[str]) -> None:
        if not any(k.startswith("forge_") for k in updated) or self.shared.config is None:
            return
        try:
            self.server = self._server_for(self.shared.config)
        except ConfigError as e:
            raise exceptions.OptionsError(str(e)) from e

    def _server_for(self, config: Config) -> Server | None:
        """The server for a new configuration (kept when nothing it uses changed)."""
        if config.mode != "serve":
            self._key = None
            return None
        if not config.policy_url or config.tokenizer_dir is None:
            raise ConfigError(
                "forge_mode=serve needs forge_policy (the policy server's URL) and "
                "forge_tokenizer (the policy's model folder)"
            )
        key = (
            config.policy_url,
            config.tokenizer_dir,
            config.serve_models,
            config.serve_max_tokens,
            config.policy_version,
        )
        if self.server is not None and self._key == key:
            return self.server
        try:
            server = Server(
                config.policy_url,
                config.tokenizer_dir,
                config.serve_models,
                policy_version=config.policy_version,
                max_tokens_cap=config.serve_max_tokens or None,
            )
        except (TemplateError, ValueError) as e:
            raise ConfigError(str(e)) from e
        self._key = key
        return server

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # Record mode has no server: no coroutine (and no task for mitmproxy to run) per call.
        if self.server is None or flow.response is not None:
            return None
        state = FlowState.of(flow)
        if state is None:
            return None
        if state.route is Route.LOCAL:
            return self._answer_local(flow, self.server, state.host)
        if state.route is Route.SERVED and state.capture is not None:
            return self._serve(flow, self.server, state, state.capture)
        if state.route is Route.WEBSOCKET:
            return self._serve_socket(flow, self.server, state)
        return None

    async def _answer_local(self, flow: http.HTTPFlow, server: Server, host: str) -> None:
        local = await asyncio.get_running_loop().run_in_executor(
            self._pool,
            server.answer_local,
            host,
            flow.request.method,
            flow.request.path,
            flow.request.get_content(strict=False) or b"",
        )
        flow.response = answer_response(local)

    async def _serve(
        self, flow: http.HTTPFlow, server: Server, state: FlowState, capture: Capture
    ) -> None:
        await self.endpoint.start()
        self._captures[capture.call_id] = capture
        job = CallJob(
            server,
            capture.call_id,
            flow.request.method,
            flow.request.path,
            flow.request.get_content(strict=False) or b"",
            self._take_tokens,
        )
        path = self.endpoint.expect_call(job)
        self._calls[flow.id] = (path, capture.call_id)
        self._reroute(flow, state, path)

    async def _serve_socket(self, flow: http.HTTPFlow, server: Server, state: FlowState) -> None:
        await self.endpoint.start()
        job = SocketJob(server, self._take_tokens)
        path = self.endpoint.expect_socket(job)
        self._sockets[flow.id] = (path, job)
        self._reroute(flow, state, path)

    def _reroute(self, flow: http.HTTPFlow, state: FlowState, path: str) -> None:
        request, port = flow.request, self.endpoint.port
        assert port is not None
        request.scheme, request.host, request.port, request.path = "http", "127.0.0.1", port, path
        request.headers["host"] = f"127.0.0.1:{port}"
        # The endpoint answers from the body as the harness sent it (decoded, registered
        # above); what mitmproxy relays is only drained, never decoded again.
        request.headers.pop("content-encoding", None)
        # Recorded as answered by the policy (the endpoint is Forge's own relay to it).
        assert self.server is not None
        state.upstream_url = self.server.client.base_url

    def _take_tokens(self, call_id: str, tokens: TokenRecord | None) -> None:
        """A served call's token record onto its record (on the event loop, before the
        last byte of its reply is sent)."""
        capture = self._captures.pop(call_id, None)
        if capture is None or tokens is None or self.server is None:
            return
        t = tokens
        capture.policy_version, capture.drift = t.policy_version, t.drift
        capture.prompt_ids, capture.prompt_parent_call_id = t.prompt_ids, t.prompt_parent_call_id
        capture.completion_ids, capture.completion_logprobs = (
            t.completion_ids,
            t.completion_logprobs,
        )
        capture.finish_reason, capture.prompt_tokens = t.finish_reason, t.prompt_tokens
        capture.upstream_url = self.server.client.base_url

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        served = self._sockets.get(flow.id)
        if served is None or flow.websocket is None:
            return
        message = flow.websocket.messages[-1]
        if not message.from_client or not starts_ws_call(message):
            return
        state = FlowState.of(flow)
        call = state.ws_call if state is not None else None
        if call is None:  # not recorded (Recording could not open its record)
            served[1].call_ids.append(None)
            return
        self._captures[call.capture.call_id] = call.capture
        served[1].call_ids.append(call.capture.call_id)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        served = self._sockets.pop(flow.id, None)
        if served is not None:
            self.endpoint.forget(served[0])
            for call_id in served[1].call_ids:
                if call_id is not None:
                    self._captures.pop(call_id, None)

    def response(self, flow: http.HTTPFlow) -> None:
        self._forget(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._forget(flow)

    def _forget(self, flow: http.HTTPFlow) -> None:
        """A served call that has ended: whatever was registered for it goes."""
        served = self._calls.pop(flow.id, None)
        if served is not None:
            self.endpoint.forget(served[0])
            self._captures.pop(served[1], None)

    async def done(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        await self.endpoint.stop()


def answer_response(answer: Answer) -> http.Response:
    headers = {"content-type": answer.content_type, **answer.headers}
    if answer.stream:
        headers["cache-control"] = "no-cache"
    return http.Response.make(answer.status, answer.body, headers)
