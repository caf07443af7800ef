"""Every API, streamed and not, through a real mitmdump with the official SDKs."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard

from mitm_addon.launch import stop_proxy_process
from pipeline.canonical import canonical_json
from pipeline.reconstruct import reconstruct_request
from pipeline.store import connect
from tests.support.forge_proxy import (
    COOKIE_VALUE,
    OPENAI_KEY,
    SECRETS,
    anthropic_client,
    files_containing,
    forge_proxy,
    http_client,
    kill_proxy,
    openai_client,
)
from tests.support.upstream import Fault, ScriptedUpstream

SHELL_TOOL_CHAT = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
SHELL_TOOL_RESPONSES = {
    "type": "function",
    "name": "shell",
    "description": "Run a command.",
    "parameters": SHELL_TOOL_CHAT["function"]["parameters"],
}
SHELL_TOOL_ANTHROPIC = {
    "name": "shell",
    "description": "Run a command.",
    "input_schema": SHELL_TOOL_CHAT["function"]["parameters"],
}


def calls(out: Path, where: str = "true") -> list[dict[str, Any]]:
    cur = connect(out).execute(f"SELECT * FROM calls WHERE {where} ORDER BY call_id")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def model_calls(up: ScriptedUpstream) -> list[Any]:
    return [
        r for r in up.received if r.api in ("anthropic_messages", "openai_chat", "openai_responses")
    ]


def assert_recorded_as_received(out: Path, up: ScriptedUpstream) -> list[dict[str, Any]]:
    """Same count, same models, each request reconstructed equal to what the upstream got."""
    rows = calls(out)
    received = model_calls(up)
    assert len(rows) == len(received)
    con = connect(out)
    for row, got in zip(rows, received, strict=True):
        body = dict(got.body)
        if got.transport == "websocket":
            body.pop("type", None)
        assert row["model"] == body.get("model")
        rebuilt = reconstruct_request(con, row["call_id"])
        if got.transport == "websocket":
            rebuilt.pop("type", None)
        assert canonical_json(rebuilt) == canonical_json(body)
    return rows


def run_chat(client: Any, stream: bool) -> list[Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "make hello.txt"}]
    finals = []
    for _ in range(2):
        if stream:
            with client.chat.completions.stream(
                model="gpt-4.1", messages=messages, tools=[SHELL_TOOL_CHAT]
            ) as s:
                final = s.get_final_completion()
        else:
            final = client.chat.completions.create(
                model="gpt-4.1", messages=messages, tools=[SHELL_TOOL_CHAT]
            )
        finals.append(final)
        msg = final.choices[0].message
        turn: dict[str, Any] = {
            "role": "assistant",
            "content": msg.content,
        }  # as most clients send it back
        if msg.tool_calls:
            turn["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in msg.tool_calls
            ]
        messages.append(turn)
        for call in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "exit=0"})
    return finals


def run_anthropic(client: Any, stream: bool) -> list[Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "make hello.txt"}]
    finals = []
    for _ in range(2):
        kwargs = {
            "model": "claude-sonnet-4-5-20250929",
            "max_tokens": 256,
            "messages": messages,
            "tools": [SHELL_TOOL_ANTHROPIC],
        }
        if stream:
            with client.messages.stream(**kwargs) as s:
                final = s.get_final_message()
        else:
            final = client.messages.create(**kwargs)
        finals.append(final)
        messages.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in final.content],
            }
        )
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "exit=0"}
            for b in final.content
            if b.type == "tool_use"
        ]
        if results:
            messages.append({"role": "user", "content": results})
    return finals


def run_responses(client: Any, stream: bool) -> list[Any]:
    items: list[Any] = [{"role": "user", "content": "make hello.txt"}]
    finals = []
    for _ in range(2):
        kwargs = {"model": "gpt-5", "input": items, "tools": [SHELL_TOOL_RESPONSES]}
        if stream:
            with client.responses.stream(**kwargs) as s:
                final = s.get_final_response()
        else:
            final = client.responses.create(**kwargs)
        finals.append(final)
        for item in final.output:
            items.append(item.model_dump(exclude_none=True, exclude={"parsed_arguments"}))
            if item.type == "function_call":
                items.append(
                    {"type": "function_call_output", "call_id": item.call_id, "output": "exit=0"}
                )
    return finals


RUNNERS = {
    "openai_chat": (openai_client, run_chat),
    "anthropic_messages": (anthropic_client, run_anthropic),
    "openai_responses": (openai_client, run_responses),
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("api", sorted(RUNNERS))
def test_every_api_is_recorded_as_the_upstream_received_it(
    recording: Any, api: str, stream: bool
) -> None:
    make_client, run = RUNNERS[api]
    with make_client(recording.proxy) as client:
        finals = run(client, stream)
    stop_proxy_process(recording.proxy.process)
    rows = assert_recorded_as_received(recording.out, recording.upstream)
    assert [r["api"] for r in rows] == [api, api]
    assert [r["transport"] for r in rows] == (["sse", "sse"] if stream else ["http", "http"])
    assert all(r["status"] == "complete" and r["parse_error"] is None for r in rows)
    assert all(r["rollout_id"] == "r-e2e" and r["pid"] for r in rows)
    assert rows[0]["tool_calls"] == ["shell"] and rows[1]["tool_calls"] == []
    # The client's session cookie went upstream; on disk it is redacted (and the scan of the
    # run's files finds none of its values).
    assert all(COOKIE_VALUE in r.headers.get("cookie", "") for r in model_calls(recording.upstream))
    assert {r["request_headers"]["cookie"] for r in rows} == {"[REDACTED]"}
    for row, final in zip(rows, finals, strict=True):
        assert row["response_id"] == final.id
        assert row["output_tokens"]
        # A Chat stream reports usage only when asked (stream_options); Forge then estimates.
        assert row["usage_estimated"] == (api == "openai_chat" and stream)
    # The second call continues the first: its chain passes through the first's response.
    con = connect(recording.out)
    chain = con.execute(
        "WITH RECURSIVE up(h) AS (SELECT ? UNION ALL SELECT m.parent_hash FROM messages m JOIN up ON m.hash = up.h "
        "WHERE m.parent_hash IS NOT NULL) SELECT list(h) FROM up",
        [rows[1]["request_head_hash"]],
    ).fetchone()[0]
    if api != "openai_responses":  # Responses outputs carry server-side fields the client may drop
        assert rows[0]["response_head_hash"] in chain


def test_responses_over_websocket_is_recorded_per_response_create(recording: Any) -> None:
    from websockets.sync.client import connect as ws_connect

    ctx = ssl.create_default_context(cafile=str(recording.proxy.ca_cert))
    create = {
        "type": "response.create",
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ],
        "tools": [SHELL_TOOL_RESPONSES],
        "stream": True,
        "store": False,
    }
    with ws_connect(
        "wss://api.openai.com/v1/responses",
        proxy=recording.proxy.url,
        ssl=ctx,
        additional_headers={"authorization": f"Bearer {OPENAI_KEY}"},
        open_timeout=20,
    ) as ws:
        for _ in range(2):
            ws.send(json.dumps(create))
            while True:
                event = json.loads(ws.recv(timeout=20))
                if event["type"] in ("response.completed", "response.failed", "error"):
                    break
            create["previous_response_id"] = event["response"]["id"]
            create["input"] = [
                {"type": "function_call_output", "call_id": "call_x", "output": "exit=0"}
            ]
    time.sleep(0.5)
    stop_proxy_process(recording.proxy.process)
    rows = assert_recorded_as_received(recording.out, recording.upstream)
    assert [r["transport"] for r in rows] == ["websocket", "websocket"]
    assert all(r["status"] == "complete" for r in rows)
    assert rows[1]["previous_response_id"] == rows[0]["response_id"]
    # previous_response_id: the second request carried one item, yet it chains onto the first call.
    assert rows[1]["request_items"] == 1
    head = (
        connect(recording.out)
        .execute("SELECT parent_hash FROM messages WHERE hash = ?", [rows[1]["request_head_hash"]])
        .fetchone()[0]
    )
    assert head == rows[0]["response_head_hash"]


def test_compressed_request_bodies_are_recorded_decoded(recording: Any) -> None:
    body = {"model": "gpt-5-codex", "input": "say hi", "stream": False}
    raw = zstandard.ZstdCompressor().compress(json.dumps(body).encode())
    with http_client(recording.proxy) as client:
        r = client.post(
            "https://api.openai.com/v1/responses",
            content=raw,
            headers={
                "content-type": "application/json",
                "content-encoding": "zstd",
                "authorization": f"Bearer {OPENAI_KEY}",
            },
        )
    assert r.status_code == 200
    stop_proxy_process(recording.proxy.process)
    (row,) = assert_recorded_as_received(recording.out, recording.upstream)
    assert row["request_encoding"] == "zstd" and row["request_items_form"] == "string"


def test_model_lists_are_counted_not_recorded_as_calls(recording: Any) -> None:
    with openai_client(recording.proxy) as client:
        assert client.models.list().data
    stop_proxy_process(recording.proxy.process)
    assert calls(recording.out) == []
    (n,) = (
        connect(recording.out)
        .execute("SELECT sum(requests) FROM endpoints WHERE path = '/v1/models'")
        .fetchone()
    )
    assert n == 1


def test_client_that_disconnects_after_the_last_event_yields_a_complete_row(recording: Any) -> None:
    # Like Codex's HTTP fallback, goose or aider: read up to the final event, then hang up.
    body = {"model": "gpt-5", "input": "hi", "stream": True}
    with (
        http_client(recording.proxy) as client,
        client.stream(
            "POST",
            "https://api.openai.com/v1/responses",
            json=body,
            headers={"authorization": f"Bearer {OPENAI_KEY}"},
        ) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data:") and '"response.completed"' in line:
                break
    stop_proxy_process(recording.proxy.process)
    (row,) = calls(recording.out)
    assert row["status"] == "complete" and row["response_id"]


def test_killed_proxy_loses_no_completed_call(tmp_path: Path, confdir: Path) -> None:
    out = tmp_path / "run"
    n = 6
    with ScriptedUpstream([{"text": "ok"}], first_event_delay_s=0) as up:
        ups = {"api.openai.com": up.base_url}
        with forge_proxy(out, confdir, ups) as proxy, openai_client(proxy) as client:
            for i in range(n):
                client.chat.completions.create(
                    model="gpt-4.1", messages=[{"role": "user", "content": f"q{i}"}]
                )
            # One more call, left hanging mid-stream when the proxy dies.
            up.set_fault(Fault("stall_mid_stream", after_events=2, stall_s=30))
            hung = threading.Thread(target=_swallow, args=(client, True), daemon=True)
            hung.start()
            up.wait_for_requests(n + 1)
            time.sleep(0.3)
            kill_proxy(proxy)
        assert not list(out.rglob("calls/*.parquet")), (
            "nothing was flushed yet: the WAL holds it all"
        )
        with forge_proxy(out, confdir, ups):
            pass  # a restart recovers the WAL
    rows = calls(out)
    assert [r["status"] for r in rows].count("complete") == n
    assert [r["status"] for r in rows].count("incomplete") == 1
    assert not list(out.rglob("*.tmp")) and files_containing(out, SECRETS) == []


def _swallow(client: Any, stream: bool) -> None:
    try:
        for _ in client.chat.completions.create(
            model="gpt-4.1", stream=stream, messages=[{"role": "user", "content": "hang"}]
        ):
            pass
    except Exception:  # the proxy is killed under this call; its failure is the point
        return


def test_rollout_id_comes_from_the_proxy_credentials(tmp_path: Path, confdir: Path) -> None:
    with (
        ScriptedUpstream([{"text": "ok"}]) as up,
        forge_proxy(tmp_path / "run", confdir, {"api.openai.com": up.base_url}) as proxy,
    ):
        ctx = ssl.create_default_context(cafile=str(proxy.ca_cert))
        with httpx.Client(proxy=f"http://r-17:x@127.0.0.1:{proxy.port}", verify=ctx) as client:
            r = client.post(
                "https://api.openai.com/v1/chat/completions",
                json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {OPENAI_KEY}"},
            )
            assert r.status_code == 200
            assert "proxy-authorization" not in up.received[-1].headers
        stop_proxy_process(proxy.process)
    (row,) = calls(tmp_path / "run")
    assert (row["rollout_id"], row["rollout_source"]) == ("r-17", "proxy_auth")


def test_rollout_id_comes_from_the_client_process_environment(
    tmp_path: Path, confdir: Path
) -> None:
    client_code = (
        "import os, ssl, sys, httpx\n"
        "ctx = ssl.create_default_context(cafile=sys.argv[2])\n"
        "with httpx.Client(proxy=sys.argv[1], verify=ctx) as c:\n"
        "    r = c.post('https://api.openai.com/v1/chat/completions', json={'model': 'gpt-4.1',"
        " 'messages': [{'role': 'user', 'content': 'hi'}]})\n"
        "    sys.exit(r.status_code != 200)\n"
    )
    with (
        ScriptedUpstream([{"text": "ok"}]) as up,
        forge_proxy(tmp_path / "run", confdir, {"api.openai.com": up.base_url}) as proxy,
    ):
        # A wrapper shell carries FORGE_ROLLOUT_ID; the client it starts does not ("; exit" keeps
        # bash from exec-ing into the client, so the wrapper stays an ancestor).
        wrapper = f'env -u FORGE_ROLLOUT_ID {sys.executable} -c "$0" "$@"; exit $?'
        env = {**os.environ, "FORGE_ROLLOUT_ID": "r-env"}
        done = subprocess.run(
            ["bash", "-c", wrapper, client_code, proxy.url, str(proxy.ca_cert)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        stop_proxy_process(proxy.process)
    (row,) = calls(tmp_path / "run")
    assert (row["rollout_id"], row["rollout_source"]) == ("r-env", "process_env")
    assert row["process_name"].startswith("python") and row["parent_pids"]
