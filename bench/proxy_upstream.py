"""A lean OpenAI Chat Completions upstream for the proxy benchmark, over TLS on loopback.

``POST /v1/chat/completions`` answers at once: a JSON completion, or with ``"stream":
true`` an SSE stream of ``chunk`` events (the first one, the assistant role, sent at
once; the content deltas ``--chunk-gap-ms`` apart) ending in ``data: [DONE]``, shaped
as the real API sends them. ``GET /stats`` says how many requests and distinct client
connections it served (the benchmark checks that clients keep their connections alive).

It runs in its own process so that it shares no interpreter lock with the load
generator::

    python -m bench.proxy_upstream --port 9000 --cert leaf.pem --key leaf-key.pem
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time

from aiohttp import web

MODEL = "gpt-4.1-mini-2025-04-14"
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"


def render_completion(words: int, created: int) -> bytes:
    """The JSON body of a non-streamed chat completion with ``words`` words of text."""
    text = " ".join(f"word{i}" for i in range(words))
    body = {
        "id": "chatcmpl-BenchAAAAAAAAAAAAAAAAAAAAAAAAA",
        "object": "chat.completion",
        "created": created,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 412,
            "completion_tokens": words,
            "total_tokens": 412 + words,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": "fp_bench00000",
    }
    return json.dumps(body).encode()


def render_stream_events(words: int, created: int) -> list[bytes]:
    """The SSE events of a streamed chat completion: role, one delta per word, stop, usage, DONE."""

    def chunk(delta: dict[str, object], finish: str | None, usage: object = None) -> bytes:
        body: dict[str, object] = {
            "id": "chatcmpl-BenchAAAAAAAAAAAAAAAAAAAAAAAAA",
            "object": "chat.completion.chunk",
            "created": created,
            "model": MODEL,
            "service_tier": "default",
            "system_fingerprint": "fp_bench00000",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            if usage is None
            else [],
            "usage": usage,
        }
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    events = [chunk({"role": "assistant", "content": "", "refusal": None}, None)]
    events += [chunk({"content": f"word{i} "}, None) for i in range(words)]
    events.append(chunk({}, "stop"))
    events.append(
        chunk(
            {},
            None,
            {"prompt_tokens": 412, "completion_tokens": words, "total_tokens": 412 + words},
        )
    )
    events.append(b"data: [DONE]\n\n")
    return events


class Upstream:
    """The aiohttp application: precomputed bodies, a request and connection count."""

    def __init__(self, words: int, stream_words: int, chunk_gap_s: float) -> None:
        created = int(time.time())
        self.body = render_completion(words, created)
        self.events = render_stream_events(stream_words, created)
        self.chunk_gap_s = chunk_gap_s
        self.requests = 0
        self.peers: set[tuple[str, int]] = set()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.requests += 1
        if request.transport is not None:
            peer = request.transport.get_extra_info("peername")
            if peer:
                self.peers.add((str(peer[0]), int(peer[1])))
        try:
            stream = bool(json.loads(raw).get("stream"))
        except (ValueError, AttributeError):
            return web.json_response(
                {
                    "error": {
                        "message": "body is not a JSON object",
                        "type": "invalid_request_error",
                    }
                },
                status=400,
            )
        if not stream:
            return web.Response(body=self.body, content_type="application/json")
        response = web.StreamResponse(headers={"content-type": SSE_CONTENT_TYPE})
        await response.prepare(request)
        await response.write(self.events[0])
        for event in self.events[1:]:
            if self.chunk_gap_s:
                await asyncio.sleep(self.chunk_gap_s)
            await response.write(event)
        await response.write_eof()
        return response

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests, "connections": len(self.peers)})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/stats", self.stats)
        return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_upstream")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True, help="PEM certificate chain for 127.0.0.1")
    parser.add_argument("--key", required=True)
    parser.add_argument("--words", type=int, default=60, help="words in a JSON completion")
    parser.add_argument("--stream-words", type=int, default=20, help="content deltas per stream")
    parser.add_argument("--chunk-gap-ms", type=float, default=1.0)
    args = parser.parse_args(argv)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    upstream = Upstream(args.words, args.stream_words, args.chunk_gap_ms / 1000)
    web.run_app(
        upstream.app(),
        host="127.0.0.1",
        port=args.port,
        ssl_context=context,
        access_log=None,
        print=None,
        backlog=1024,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
