"""The harness sees the same bytes with and without Forge in the path."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from mitm_addon.launch import stop_proxy_process
from pipeline.store import connect
from tests.support.forge_proxy import forge_proxy, http_client

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
CASES = {
    # path -> (fixture, content type)
    "/v1/messages": ("anthropic_messages/stream_tool.sse", "text/event-stream; charset=utf-8"),
    "/v1/messages?beta=true": ("anthropic_messages/response_tool.json", "application/json"),
    "/v1/chat/completions": ("openai_chat/stream_tool.sse", "text/event-stream; charset=utf-8"),
    "/v1/responses": ("openai_responses/stream_tool.sse", "text/event-stream; charset=utf-8"),
    "/v1/responses?json=1": ("openai_responses/response_tool.json", "application/json"),
}
REQUEST = {
    "/v1/messages": "anthropic_messages/request_tool.json",
    "/v1/chat/completions": "openai_chat/request_tool.json",
    "/v1/responses": "openai_responses/request_tool.json",
}
_CHUNK = 61  # odd-sized writes, so events straddle TCP segments


@pytest.fixture(scope="module")
def replay() -> Iterator[str]:
    """A server that answers each path with a fixture's exact bytes, streamed in small writes."""

    async def handle(request: web.Request) -> web.StreamResponse:
        fixture, content_type = CASES[request.path_qs]
        data = (WIRE / fixture).read_bytes()
        await request.read()
        resp = web.StreamResponse(
            headers={"content-type": content_type, "x-request-id": "req_fixed"}
        )
        await resp.prepare(request)
        for i in range(0, len(data), _CHUNK):
            await resp.write(data[i : i + _CHUNK])
        await resp.write_eof()
        return resp

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def fetch(client: httpx.Client, url: str, body: bytes) -> tuple[int, str, bytes]:
    with client.stream(
        "POST", url, content=body, headers={"content-type": "application/json"}
    ) as r:
        return r.status_code, r.headers["content-type"], b"".join(r.iter_raw())


def test_harness_sees_byte_identical_responses_with_and_without_the_proxy(
    replay: str, tmp_path: Path, confdir: Path
) -> None:
    out = tmp_path / "run"
    ups = {"api.anthropic.com": replay, "api.openai.com": replay}
    with forge_proxy(out, confdir, ups) as proxy:
        with httpx.Client(timeout=20) as direct, http_client(proxy) as proxied:
            for path in CASES:
                host = "api.anthropic.com" if path.startswith("/v1/messages") else "api.openai.com"
                body = (WIRE / REQUEST[path.partition("?")[0]]).read_bytes()
                want = fetch(direct, replay + path, body)
                got = fetch(proxied, f"https://{host}{path}", body)
                assert got == want, path
        stop_proxy_process(proxy.process)
    statuses = connect(out).execute("SELECT status, count(*) FROM calls GROUP BY ALL").fetchall()
    assert statuses == [("complete", len(CASES))]
