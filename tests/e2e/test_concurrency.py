"""64 concurrent streaming calls through one real mitmdump: every recorded response is the
one its own client received, and nothing crosses between calls.

Each call carries a nonce that the scripted upstream echoes all through its streamed
reply, so a response recorded against the wrong request, or assembled from another
stream's events, shows up as a nonce or checksum mismatch.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
import ssl
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pyarrow.parquet as pq

from mitm_addon.launch import RunningProxy, stop_proxy_process
from tests.support.forge_proxy import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    SECRETS,
    files_containing,
    forge_proxy,
)
from tests.support.upstream import Conversation, ScriptedUpstream

CALLS = 64
APIS = ("anthropic_messages", "openai_chat", "openai_responses")
WORDS = 30  # words per reply: one stream event each
NONCE = re.compile(r"nonce-[0-9a-f]{16}")


def echo_nonce(conv: Conversation) -> dict[str, str]:
    """The reply: the request's nonce, then words that each repeat part of it."""
    (nonce,) = set(NONCE.findall(json.dumps(conv.body)))
    return {"text": " ".join([nonce] + [f"{nonce[-6:]}-{i}" for i in range(WORDS)])}


async def one_call(api: str, http: httpx.AsyncClient, nonce: str) -> str:
    """A streamed call; the text this client assembled from its events."""
    prompt = f"Repeat {nonce} back to me."
    parts: list[str] = []
    if api == "anthropic_messages":
        claude = anthropic.AsyncAnthropic(api_key=ANTHROPIC_KEY, http_client=http, max_retries=0)
        stream = await claude.messages.create(
            model="claude-sonnet-4-5-20250929",
            max_tokens=256,
            stream=True,
            messages=[{"role": "user", "content": prompt}],
        )
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                parts.append(event.delta.text)
    elif api == "openai_chat":
        client = openai.AsyncOpenAI(api_key=OPENAI_KEY, http_client=http, max_retries=0)
        chunks = await client.chat.completions.create(
            model="gpt-4.1", stream=True, messages=[{"role": "user", "content": prompt}]
        )
        async for chunk in chunks:
            parts += [c.delta.content for c in chunk.choices if c.delta.content]
    else:
        client = openai.AsyncOpenAI(api_key=OPENAI_KEY, http_client=http, max_retries=0)
        events = await client.responses.create(model="gpt-5", input=prompt, stream=True)
        async for event in events:
            if event.type == "response.output_text.delta":
                parts.append(event.delta)
    return "".join(parts)


async def run_calls(proxy: RunningProxy, nonces: list[str]) -> list[str]:
    verify = ssl.create_default_context(cafile=str(proxy.ca_cert))
    limits = httpx.Limits(max_connections=CALLS * 2, max_keepalive_connections=CALLS * 2)
    async with httpx.AsyncClient(
        proxy=proxy.url, verify=verify, timeout=120.0, limits=limits
    ) as http:
        return await asyncio.gather(
            *(one_call(APIS[i % len(APIS)], http, n) for i, n in enumerate(nonces))
        )


def recorded_text(api: str, response: dict[str, Any]) -> str:
    """The assistant text of a recorded response (the API's non-streaming shape)."""
    if api == "anthropic_messages":
        return "".join(b["text"] for b in response["content"] if b["type"] == "text")
    if api == "openai_chat":
        return str(response["choices"][0]["message"]["content"])
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def read_table(out: Path, table: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted((out / table).glob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_concurrent_streams_are_each_recorded_as_their_own_client_received_them(
    tmp_path: Path, confdir: Path
) -> None:
    out = tmp_path / "run"
    nonces = [f"nonce-{secrets.token_hex(8)}" for _ in range(CALLS)]
    with ScriptedUpstream(echo_nonce, delay_s=0.002) as up:
        ups = {"api.openai.com": up.base_url, "api.anthropic.com": up.base_url}
        with forge_proxy(out, confdir, ups) as proxy:
            received = asyncio.run(run_calls(proxy, nonces))
            stop_proxy_process(proxy.process)  # flushes the shards
        assert len(up.received) == CALLS
    assert files_containing(out, SECRETS) == []

    client_sha = {}
    for nonce, text in zip(nonces, received, strict=True):
        assert text.startswith(nonce) and text.count(nonce[-6:]) == WORDS + 1, text
        client_sha[nonce] = sha(text)

    calls = read_table(out, "calls")
    items = {m["hash"]: m for m in read_table(out, "messages")}
    assert len(calls) == CALLS
    seen: set[str] = set()
    for row in calls:
        assert row["status"] == "complete" and row["parse_error"] is None, row["error"]
        assert row["transport"] == "sse"
        # The request's own nonce, from its last conversation item.
        (nonce,) = set(NONCE.findall(items[row["request_head_hash"]]["content_json"]))
        text = recorded_text(row["api"], json.loads(row["response_json"]))
        assert set(NONCE.findall(text)) == {nonce}, "a reply was recorded against another request"
        assert sha(text) == client_sha[nonce], "the recorded reply is not what its client got"
        seen.add(nonce)
    assert seen == set(nonces)
    assert max_in_flight(calls) >= CALLS // 2, "the calls did not run concurrently"
    assert sorted(r["api"] for r in calls) == sorted(APIS[i % len(APIS)] for i in range(CALLS))


def max_in_flight(calls: list[dict[str, Any]]) -> int:
    """The most calls the proxy had open at one time (from their recorded start and end)."""
    edges = sorted([(r["started_at"], 1) for r in calls] + [(r["ended_at"], -1) for r in calls])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most
