"""The proxy benchmark's load generator: timed chat-completion calls over aiohttp.

Every call is a ``POST /v1/chat/completions`` over HTTPS with keep-alive. Through a
forward proxy (mitmdump, Forge) the client opens a CONNECT tunnel and speaks TLS to the
upstream through it, as ``HTTPS_PROXY`` makes real harnesses do; a gateway (LiteLLM)
and the direct baseline are called at their own HTTPS URL. A call counts only when its
reply is complete and well formed; anything else stops the benchmark with an error.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

SYSTEM_PROMPT_WORDS = 300  # a short harness system prompt: the request body is ~3 kB
# The key every client sends (the upstream ignores it; LiteLLM takes it as its master key,
# without which it refuses to start). Fresh per run, and never written anywhere else.
BENCH_KEY = "sk-bench-" + secrets.token_hex(24)


@dataclass(frozen=True)
class Route:
    """Where a contender's calls go: the URL, and the forward proxy if any."""

    url: str
    proxy: str | None
    cafile: str  # PEM bundle the client trusts (the bench CA, plus mitmproxy's CA)


@dataclass(frozen=True)
class Call:
    """One completed call, times in seconds from the request's start."""

    latency_s: float
    ttft_s: float | None  # streams: until the first content delta was read


class CallFailed(RuntimeError):
    """A call through a contender did not complete as the upstream sent it."""


def render_request(model: str, stream: bool, turn: int = 0) -> bytes:
    """A small harness-shaped request: system prompt, one earlier exchange, a new question."""
    system = " ".join(f"rule{i}" for i in range(SYSTEM_PROMPT_WORDS))
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a coding agent. " + system},
            {"role": "user", "content": "List the files in the repository."},
            {"role": "assistant", "content": "README.md\nsrc/\ntests/"},
            {"role": "user", "content": f"Open README.md and summarise it (turn {turn})."},
        ],
        "max_tokens": 256,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def client_session(route: Route, concurrency: int) -> aiohttp.ClientSession:
    context = ssl.create_default_context(cafile=route.cafile)
    connector = aiohttp.TCPConnector(
        ssl=context, limit=concurrency, limit_per_host=concurrency, keepalive_timeout=60
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=60),
        headers={"authorization": f"Bearer {BENCH_KEY}"},
    )


async def one_call(
    session: aiohttp.ClientSession, route: Route, body: bytes, stream: bool, words: int
) -> Call:
    start = time.perf_counter()
    ttft: float | None = None
    async with session.post(
        route.url,
        data=body,
        proxy=route.proxy,
        headers={"content-type": "application/json"},
    ) as response:
        if response.status != 200:
            text = (await response.read())[:300]
            raise CallFailed(f"{route.url} via {route.proxy}: HTTP {response.status}: {text!r}")
        if not stream:
            reply = await response.read()
            if b'"finish_reason"' not in reply:
                raise CallFailed(f"not a chat completion: {reply[:200]!r}")
            return Call(time.perf_counter() - start, None)
        seen, done = 0, False
        async for line in response.content:
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                done = True
                continue
            if b'"content":"word' in line.replace(b" ", b""):
                seen += 1
                if ttft is None:
                    ttft = time.perf_counter() - start
        if not done or seen != words:
            raise CallFailed(f"stream ended early: {seen} of {words} deltas, [DONE] seen: {done}")
    return Call(time.perf_counter() - start, ttft)


@dataclass(frozen=True)
class Phase:
    """A timed batch of calls: each call, the wall time, the proxy's CPU seconds."""

    calls: list[Call]
    wall_s: float
    cpu_s: float | None


async def run_calls(
    route: Route,
    body: bytes,
    calls: int,
    concurrency: int,
    stream: bool,
    words: int,
    cpu_seconds: Callable[[], float] | None = None,
) -> Phase:
    """``calls`` calls from ``concurrency`` workers sharing one keep-alive pool.

    The pool's connections are opened (one call each) before the clock and the CPU meter start.
    """
    async with client_session(route, concurrency) as session:
        await asyncio.gather(
            *(one_call(session, route, body, stream, words) for _ in range(concurrency))
        )
        results: list[Call] = []
        remaining = calls

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                results.append(await one_call(session, route, body, stream, words))

        cpu0 = cpu_seconds() if cpu_seconds else None
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        cpu = cpu_seconds() - cpu0 if cpu_seconds and cpu0 is not None else None
        return Phase(results, wall, cpu)
