"""No secret a client sent reaches anything Forge writes: the run directory (shards,
write-ahead log, proxy log) and what the commands make from it (snapshots, exports, view
pages, query results). The client sends every kind: a bearer token, an ``x-api-key``, a
cookie and proxy credentials with a password."""

from __future__ import annotations

from pathlib import Path

from forge_cli.main import main
from tests.support.forge_proxy import (
    ANTHROPIC_KEY,
    COOKIE_VALUE,
    OPENAI_KEY,
    SECRETS,
    anthropic_client,
    files_containing,
    forge_proxy,
    openai_client,
)
from tests.support.upstream import ScriptedUpstream

SCRIPT = [
    {"tool_call": {"name": "shell", "arguments": {"command": "echo hi > hello.txt"}}},
    {"text": "Done."},
]


def test_no_secret_reaches_the_run_or_anything_made_from_it(
    tmp_path: Path, confdir: Path
) -> None:
    out = tmp_path / "run"
    with ScriptedUpstream(SCRIPT) as up:
        ups = {"api.openai.com": up.base_url, "api.anthropic.com": up.base_url}
        with forge_proxy(out, confdir, ups, rollout="r-secrets") as proxy:
            with openai_client(proxy) as client:
                for stream in (False, True):
                    reply = client.chat.completions.create(
                        model="gpt-4.1",
                        stream=stream,
                        messages=[{"role": "user", "content": f"my key is {OPENAI_KEY}"}],
                    )
                    if stream:
                        list(reply)
                client.responses.create(model="gpt-4.1", input="hi")
            with anthropic_client(proxy) as client:
                client.messages.create(
                    model="claude-sonnet-4-5-20250929",
                    max_tokens=64,
                    messages=[{"role": "user", "content": "hi"}],
                )
        # The secrets did go through the proxy (else the scan below proves nothing).
        received = up.received
        assert len(received) == 4
        assert received[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"
        assert received[-1].headers["x-api-key"] == ANTHROPIC_KEY
        assert all(COOKIE_VALUE in r.headers["cookie"] for r in received)
        assert all("proxy-authorization" not in r.headers for r in received)
    assert main(["reward", "--data", str(out), "--rollout", "r-secrets", "--reward", "1"]) == 0
    made = tmp_path / "made"
    commands = [
        ["snapshot", "--data", str(out), "--out", str(made / "snapshot"), "--no-audits"],
        ["export", "sft", "--data", str(out), "--out", str(made / "sft.parquet")],
        ["view", "--data", str(out), "--out", str(made / "view")],
        ["sql", "--data", str(out), "--format", "parquet", "--out", str(made / "calls.parquet"),
         "select * from calls"],
        ["sql", "--data", str(out), "--format", "json", "--out", str(made / "messages.json"),
         "select * from messages"],
    ]  # fmt: skip
    for argv in commands:
        assert main(argv) == 0, argv
    assert len([p for p in made.rglob("*") if p.is_file()]) >= 5
    assert files_containing(tmp_path, SECRETS) == []
