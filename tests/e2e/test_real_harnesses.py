"""Real harness CLIs (Claude Code, Codex) under ``forge record``, against the scripted upstream.

Each harness gets a small file-writing task; the upstream answers with a shell tool call,
then with text. The recorded rows must equal the model calls the upstream received. The
proxy requires a password (the harness sends it in its proxy credentials); where the harness
can add headers, it also sends a cookie, a bearer token and an x-api-key; none reaches disk.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.export import iter_sft_examples
from pipeline.store import connect
from tests.e2e.test_record_sdks import assert_recorded_as_received
from tests.support import harnesses
from tests.support.forge_proxy import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    SECRET_HEADERS,
    SECRETS,
    assert_secrets_sent,
    files_containing,
    password_args,
)
from tests.support.upstream import ScriptedUpstream

pytestmark = [pytest.mark.slow, pytest.mark.harness]

TASK = "Create a file hello.txt containing the word hi."
SCRIPT = [
    {"tool_call": {"name": "shell", "arguments": {"command": "echo hi > hello.txt"}}},
    {"text": "Done: hello.txt contains hi."},
]
_TIMEOUT_S = 240


def record(
    tmp_path: Path,
    confdir: Path,
    spec: harnesses.HarnessRun,
    host: str,
    upstream: ScriptedUpstream,
    *forge_args: str,
) -> subprocess.CompletedProcess[str]:
    spec.prepare()
    argv = [
        sys.executable,
        "-m",
        "forge_cli.main",
        "record",
        "--out",
        str(tmp_path / "run"),
        "--confdir",
        str(confdir),
        "--upstream",
        f"{host}={upstream.base_url}",
        *password_args(tmp_path / "secrets"),
        *forge_args,
        "--",
        *spec.argv,
    ]
    return subprocess.run(
        argv,
        cwd=spec.cwd,
        env=dict(spec.env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )


def check_run(
    done: subprocess.CompletedProcess[str], tmp_path: Path, up: ScriptedUpstream
) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # Some harnesses exit 0 after a network error: check the work, not only the code.
    assert (tmp_path / "work" / "hello.txt").read_text().strip() == "hi", done.stdout[-2000:]
    rows = assert_recorded_as_received(tmp_path / "run", up)
    assert rows and all(r["status"] == "complete" for r in rows), [
        (r["status"], r["error"]) for r in rows
    ]
    assert files_containing(tmp_path / "run", SECRETS) == []
    return rows


@pytest.mark.skipif(
    not harnesses.claude_available(), reason=harnesses.unavailable_reason("claude") or ""
)
def test_claude_code_completes_its_task_with_every_call_recorded(
    tmp_path: Path, confdir: Path
) -> None:
    spec = harnesses.claude_command(
        TASK,
        workdir=tmp_path / "work",
        home=tmp_path / "home",
        proxy_url=None,
        ca_cert=None,
        api_key=ANTHROPIC_KEY,
        headers=SECRET_HEADERS,
    )
    with ScriptedUpstream(SCRIPT) as up:
        done = record(tmp_path, confdir, spec, "api.anthropic.com", up)
        rows = check_run(done, tmp_path, up)
        assert_secrets_sent(up.received)
    assert {r["api"] for r in rows} == {"anthropic_messages"}
    assert all(r["claude_session_id"] for r in rows)
    assert any(r["tool_calls"] for r in rows)


@pytest.mark.skipif(
    not harnesses.codex_available(), reason=harnesses.unavailable_reason("codex") or ""
)
@pytest.mark.parametrize("transport", ["websocket", "http", "custom-provider"])
def test_codex_completes_its_task_with_every_call_recorded(
    tmp_path: Path, confdir: Path, transport: str
) -> None:
    """The built-in provider over its WebSocket and over HTTP (the proxy refuses the
    upgrade with 426, Codex's own fallback); it sends only its bearer token. A custom
    provider over the WebSocket adds a cookie and an x-api-key (its http_headers)."""
    custom = transport == "custom-provider"
    spec = harnesses.codex_command(
        TASK,
        workdir=tmp_path / "work",
        home=tmp_path / "home",
        proxy_url=None,
        ca_cert=None,
        api_key=OPENAI_KEY,
        headers=SECRET_HEADERS if custom else None,
    )
    extra = ["--set", "forge_refuse_websocket=true"] if transport == "http" else []
    with ScriptedUpstream(SCRIPT) as up:
        done = record(tmp_path, confdir, spec, "api.openai.com", up, *extra)
        rows = check_run(done, tmp_path, up)
        if custom:
            assert_secrets_sent(up.received)
        else:
            assert {r.headers.get("authorization") for r in up.received} == {f"Bearer {OPENAI_KEY}"}
    transport = "websocket" if custom else transport
    assert {r["api"] for r in rows} == {"openai_responses"}
    assert {r["transport"] for r in rows} == (
        {"websocket"} if transport == "websocket" else {"sse"}
    )
    if transport == "websocket":  # a warm-up, then calls that chain through previous_response_id
        assert rows[0]["prewarm"] and not any(r["prewarm"] for r in rows[1:])
        assert all(
            r["previous_response_id"] == p["response_id"]
            for p, r in zip(rows, rows[1:], strict=False)
        )
        # Those calls carry only their new items: their conversation, as SFT exports it,
        # starts with the warm-up's, Codex's base instructions.
        con = connect(tmp_path / "run", stitched=True)
        try:
            firsts = {e["messages"][0]["content"][:40] for e in iter_sft_examples(con)}
        finally:
            con.close()
        assert firsts == {"You are Codex, a coding agent based on G"}
    assert all(r["codex_session_id"] for r in rows)
    assert any(r["tool_calls"] for r in rows)
