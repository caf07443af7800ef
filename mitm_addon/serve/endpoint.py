"""Serve mode's own HTTP endpoint on loopback: the calls the policy answers are rerouted
here, so their replies can stream as the policy samples them and a Responses WebSocket
can be answered (mitmproxy sends an addon's own response whole, and cannot hold a
WebSocket without a server at the other end).

Serving registers each call before mitmproxy sends it on (``expect_call``: its key, the
request body as the harness sent it, and what to do with the token record); the
endpoint runs ``Server.answer_stream`` on a worker thread and writes each batch of
events as it comes, after handing the token record over just before the last. A
WebSocket is registered the same way (``expect_socket``); each ``response.create`` on
it is one call, answered with the Responses events as text messages, the record of the
call that Recording opened for that message taking its token record.

It runs on mitmproxy's event loop (aiohttp); everything that waits for the policy, or
renders and parses, runs on its threads. Keys are random: an unknown one is a 404.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mitm_addon.ids import new_id
from mitm_addon.serve.handler import (
    Answer,
    Server,
    Streamed,
    TokenRecord,
    error_answer,
    error_event,
)
from mitm_addon.serve.policy import PolicyError
from mitm_addon.serve.replies import Event, encode_sse

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

# Streams at once: each holds a thread while it waits for its policy's next tokens.
_THREADS = 64
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_END = object()

OnTokens = Callable[[str, TokenRecord | None], None]  # (call id, its token record)


@dataclass
class CallJob:
    """One call to answer: its record's id and the request as the harness sent it."""

    server: Server
    call_id: str
    method: str
    path: str
    body: bytes
    on_tokens: OnTokens


@dataclass
class SocketJob:
    """One Responses WebSocket: the records Recording opened for its calls, in order."""

    server: Server
    on_tokens: OnTokens
    call_ids: collections.deque[str | None] = field(default_factory=collections.deque)


class Endpoint:
    def __init__(self) -> None:
        self._calls: dict[str, CallJob] = {}
        self._sockets: dict[str, SocketJob] = {}
        self._runner: web.AppRunner | None = None
        self._starting: asyncio.Lock | None = None
        self.port: int | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            _THREADS, thread_name_prefix="forge-serve"
        )

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on a free loopback port (once)."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._runner is not None:
                return
            try:
                from aiohttp import web
            except ImportError as e:  # pragma: no cover - the serve extra is not installed
                raise RuntimeError("serve mode needs aiohttp: pip install 'forge-rl[serve]'") from e
            app = web.Application(client_max_size=_MAX_MESSAGE_BYTES)
            app.router.add_route("*", "/call/{key}", self._call)
            app.router.add_get("/socket/{key}", self._socket)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            await web.SockSite(runner, sock).start()
            self.port = int(sock.getsockname()[1])
            self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- registration (on the event loop) ---------------------------------------------------

    def expect_call(self, job: CallJob) -> str:
        """The path mitmproxy should send the call to."""
        key = new_id("c-")
        self._calls[key] = job
        return f"/call/{key}"

    def expect_socket(self, job: SocketJob) -> str:
        """The path mitmproxy should send the WebSocket upgrade to."""
        key = new_id("s-")
        self._sockets[key] = job
        return f"/socket/{key}"

    def forget(self, path: str) -> None:
        """Drop a registration mitmproxy never delivered (the flow failed first)."""
        key = path.rsplit("/", 1)[-1]
        self._calls.pop(key, None)
        self._sockets.pop(key, None)

    # -- HTTP --------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _call(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        await request.read()  # what mitmproxy relayed; the job holds the body as sent
        job = self._calls.pop(request.match_info["key"], None)
        if job is None:
            return web.json_response({"error": "no such served call"}, status=404)
        try:
            result = await self._run(
                job.server.answer_stream, job.call_id, job.method, job.path, job.body
            )
        except Exception as e:  # a bug must not leave the harness without an answer
            log.exception("forge: serving %s failed", job.path)
            result = error_answer("openai_chat", 500, f"Forge failed to serve this call: {e}")
        if isinstance(result, Answer):
            job.on_tokens(job.call_id, result.tokens)
            return web.Response(
                status=result.status,
                body=result.body,
                headers={"content-type": result.content_type, **result.headers},
            )
        response = web.StreamResponse(
            status=200, headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        await response.prepare(request)

        async def send(events: list[Event]) -> None:
            await response.write(encode_sse(events))

        await self._relay(result, lambda record: job.on_tokens(job.call_id, record), send)
        await response.write_eof()
        return response

    async def _relay(
        self,
        streamed: Streamed,
        on_tokens: Callable[[TokenRecord], None],
        send: Callable[[list[Event]], Any],
    ) -> None:
        """Send each batch of a streamed reply as it comes; a broken policy stream ends
        with the API's error event. Leaving early (the harness went) closes the stream."""
        events: Iterator[Any] = streamed.events
        try:
            while (item := await self._run(next, events, _END)) is not _END:
                if isinstance(item, TokenRecord):
                    on_tokens(item)
                else:
                    await send(item)
        except PolicyError as e:
            log.warning("forge: the policy's stream failed: %s", e)
            await send([error_event(streamed.api, str(e))])
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as e:
            log.exception("forge: streaming a served call failed")
            await send([error_event(streamed.api, f"Forge failed to serve this call: {e}")])
        finally:
            await self._run(_close, events)

    # -- WebSocket (the Responses API, as Codex speaks it) ----------------------------------

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import WSMsgType, web

        job = self._sockets.pop(request.match_info["key"], None)
        if job is None:
            return web.json_response({"error": "no such served socket"}, status=404)
        ws = web.WebSocketResponse(max_msg_size=_MAX_MESSAGE_BYTES, heartbeat=None)
        await ws.prepare(request)
        async for message in ws:
            if message.type is not WSMsgType.TEXT:
                if message.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                    break
                await ws.send_str(_ws_error(400, "Expected a text message."))
                continue
            await self._socket_call(ws, job, message.data)
        return ws

    async def _socket_call(self, ws: web.WebSocketResponse, job: SocketJob, text: str) -> None:
        try:
            body = json.loads(text)
        except ValueError as e:
            await ws.send_str(_ws_error(400, f"The message is not JSON: {e}"))
            return
        kind = body.get("type") if isinstance(body, dict) else None
        if kind != "response.create":
            await ws.send_str(_ws_error(400, f"Unsupported message type {kind!r}."))
            return
        call_id = job.call_ids.popleft() if job.call_ids else None
        create = {k: v for k, v in body.items() if k != "type"}
        create["stream"] = True
        result = await self._run(
            job.server.answer_stream,
            call_id or new_id(),
            "POST",
            "/v1/responses",
            json.dumps(create).encode(),
        )
        if isinstance(result, Answer):  # refused: the error, as the socket carries it
            try:
                error = json.loads(result.body)["error"]
            except (ValueError, KeyError, TypeError):
                error = {"message": result.body.decode("utf-8", "replace")}
            await ws.send_str(
                json.dumps({"type": "error", "status": result.status, "error": error})
            )
            return

        async def send(events: list[Event]) -> None:
            for _, data in events:
                await ws.send_str(json.dumps(data, ensure_ascii=False))

        def tokens(record: TokenRecord) -> None:
            if call_id is not None:
                job.on_tokens(call_id, record)

        await self._relay(result, tokens, send)


def _ws_error(status: int, message: str) -> str:
    error = {"type": "invalid_request_error", "code": "invalid_message", "message": message}
    return json.dumps({"type": "error", "status": status, "error": error})


def _close(events: Iterator[Any]) -> None:
    close = getattr(events, "close", None)
    if close is not None:
        close()
