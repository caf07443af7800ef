"""Claude Code and Codex CLI in serve mode: every call answered by the tiny policy, no
provider contacted, each recorded with its token ids and a drift class.

The policy is scripted to answer every conversation with one line of text, so each
harness ends after its first turn (and its side calls) with exit code 0.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.store import connect
from tests.support import harnesses
from tests.support.forge_proxy import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    SECRET_HEADERS,
    SECRETS,
    files_containing,
    password_args,
)
from tests.support.policy import policy_server

pytestmark = [pytest.mark.slow, pytest.mark.harness]

TASK = "Say that you are done."
REPLY = "All done."
_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def policy(
    tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    from rl.tiny_model import script_reply

    model = tmp_path_factory.mktemp("models") / "tiny-done"
    shutil.copytree(tiny_models[0], model)
    script_reply(model, REPLY)
    with policy_server(model) as server:
        yield server


def serve(
    tmp_path: Path, confdir: Path, spec: harnesses.HarnessRun, policy: Any, *extra: str
) -> list[dict[str, Any]]:
    spec.prepare()
    argv = [sys.executable, "-m", "forge_cli.main", "record", "--out", str(tmp_path / "run"),
            "--confdir", str(confdir), "--mode", "serve", "--policy", policy.base_url,
            "--serve-max-tokens", "32", *password_args(tmp_path / "secrets"), *extra,
            "--", *spec.argv]  # fmt: skip
    done = subprocess.run(
        argv,
        cwd=spec.cwd,
        env=dict(spec.env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert REPLY in done.stdout, done.stdout[-2000:]
    rows = connect(tmp_path / "run").execute("SELECT * FROM calls ORDER BY started_at").fetchall()
    names = [d[0] for d in connect(tmp_path / "run").execute("SELECT * FROM calls").description]
    calls = [dict(zip(names, r, strict=True)) for r in rows]
    assert calls, done.stderr[-4000:]
    for c in calls:
        assert c["status"] == "complete", (c["status"], c["error"])
        assert c["upstream_url"] == policy.base_url  # no provider was contacted
        if c["prewarm"]:  # Codex's generate:false warm-up: answered, nothing sampled
            assert (c["drift"], c["completion_ids"], c["output_tokens"]) == (None, None, 0)
            continue
        assert (
            c["completion_ids"] and c["prompt_ids"] and c["drift"] in ("CLEAN", "REALIGN", "FORK")
        )
        assert len(c["completion_logprobs"]) == len(c["completion_ids"])
    assert files_containing(tmp_path / "run", SECRETS) == []
    return calls


@pytest.mark.skipif(
    not harnesses.claude_available(), reason=harnesses.unavailable_reason("claude") or ""
)
def test_claude_code_in_serve_mode_ends_cleanly_with_every_call_served(
    tmp_path: Path, confdir: Path, policy: Any
) -> None:
    spec = harnesses.claude_command(
        TASK, workdir=tmp_path / "work", home=tmp_path / "home", proxy_url=None, ca_cert=None,
        api_key=ANTHROPIC_KEY, headers=SECRET_HEADERS,
    )  # fmt: skip
    calls = serve(tmp_path, confdir, spec, policy)
    assert {c["api"] for c in calls} == {"anthropic_messages"}


@pytest.mark.skipif(
    not harnesses.codex_available(), reason=harnesses.unavailable_reason("codex") or ""
)
@pytest.mark.parametrize(
    ("extra", "transport"),
    [((), "websocket"), (("--set", "forge_refuse_websocket=true"), "sse")],
    ids=["websocket", "refused-websocket"],
)
def test_codex_in_serve_mode_ends_cleanly_with_every_call_served(
    tmp_path: Path, confdir: Path, policy: Any, extra: tuple[str, ...], transport: str
) -> None:
    """Codex's built-in provider opens the Responses WebSocket, which serve mode answers;
    refused with 426 (forge_refuse_websocket), Codex falls back to HTTP and SSE."""
    spec = harnesses.codex_command(
        TASK, workdir=tmp_path / "work", home=tmp_path / "home", proxy_url=None, ca_cert=None,
        api_key=OPENAI_KEY,
    )  # fmt: skip
    calls = serve(tmp_path, confdir, spec, policy, *extra)
    assert {(c["api"], c["transport"]) for c in calls} == {("openai_responses", transport)}
    # Over its socket Codex first warms the cache (generate: false); over HTTP it does not.
    assert [c["prewarm"] for c in calls] == ([True, False] if transport == "websocket" else [False])
