"""Serve mode: the calls Routing gave the policy are answered from it, in the API's own
shape (SSE when the harness asked for a stream), with their token ids on the record.

The policy answers on a worker thread, so mitmproxy's event loop keeps relaying other
flows while a completion is sampled. This addon comes after Recording in ``addons``: a
served call's record is open (its BEGIN frame written) before the policy is asked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable
from typing import Any

from mitmproxy import exceptions, http

from mitm_addon.addons.state import FlowState, Route, Shared
from mitm_addon.config import Config, ConfigError
from mitm_addon.protocols import find_adapter
from mitm_addon.serve.handler import Answer, Server, error_answer
from mitm_addon.serve.renderer import TemplateError

log = logging.getLogger(__name__)
_WORKERS = 8  # completions sampled at once (the policy server batches them)


class Serving:
    """Answers ``Route.SERVED`` and ``Route.LOCAL`` flows from the policy server."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.server: Server | None = None
        self._key: tuple[Any, ...] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            _WORKERS, thread_name_prefix="forge-serve"
        )

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
        )
        if self.server is not None and self._key == key:
            return self.server
        try:
            server = Server(
                config.policy_url,
                config.tokenizer_dir,
                config.serve_models,
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
            return self._answer(flow, self.server, state)
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

    async def _answer(self, flow: http.HTTPFlow, server: Server, state: FlowState) -> None:
        capture = state.capture
        assert capture is not None
        try:
            answer = await asyncio.get_running_loop().run_in_executor(
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
            answer = error_answer(
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
        flow.response = answer_response(answer)

    def done(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def answer_response(answer: Answer) -> http.Response:
    headers = {"content-type": answer.content_type, **answer.headers}
    if answer.stream:
        headers["cache-control"] = "no-cache"
    return http.Response.make(answer.status, answer.body, headers)
