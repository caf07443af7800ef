"""Call trees of real harness runs recorded through ``forge record``.

Claude Code delegates to a sub-agent (its Agent tool), Codex spawns an agent thread
(``spawn_agent``), and the toy harness's ``consult`` tool starts a child process that
makes its own LLM call. Each run's `edges` and `call_nodes` must give: every call in one
rollout and one tree, each agent's calls chained in order, the sub-agent's first call
hanging from the call that launched it, side calls labelled, and every audit empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.store import audits, connect
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
from tests.support.upstream import Conversation, ScriptedUpstream

pytestmark = [pytest.mark.slow, pytest.mark.harness]

_TIMEOUT_S = 300
SUB_TASK = "SUB-AGENT TASK: create a file hello.txt containing the word hi."


def record(
    tmp_path: Path,
    confdir: Path,
    argv: list[str],
    env: Mapping[str, str],
    cwd: Path,
    upstreams: Mapping[str, str],
    *forge_args: str,
) -> subprocess.CompletedProcess[str]:
    """``forge record --out tmp/run -- ARGV`` with the providers sent to the upstream, behind
    a proxy password (the harness sends it in its proxy credentials)."""
    routes = [a for host, url in upstreams.items() for a in ("--upstream", f"{host}={url}")]
    cmd = [sys.executable, "-m", "forge_cli.main", "record", "--out", str(tmp_path / "run")]
    cmd += ["--confdir", str(confdir), *routes, *password_args(tmp_path / "secrets")]
    cmd += [*forge_args, "--", *argv]
    return subprocess.run(
        cmd,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )


def tree(run_dir: Path) -> tuple[duckdb.DuckDBPyConnection, list[dict[str, Any]]]:
    """The run's calls with their node and incoming edge, in call order."""
    con = connect(run_dir)
    con.execute("SET enable_progress_bar = false")
    cur = con.execute(
        """
        SELECT c.call_id, c.rollout_id, c.model, c.tools, c.tool_calls, c.prewarm,
            c.claude_agent_id, c.codex_thread_id, c.openai_subagent, c.pid, c.status,
            n.parent_call_id, n.edge_kind, n.depth, n.root_call_id, n.agent_key,
            n.is_side_call, n.is_prewarm, e.evidence, e.child_is_side_call,
            n.rollout_id AS node_rollout_id
        FROM calls AS c
        JOIN call_nodes AS n USING (call_id)
        LEFT JOIN edges AS e ON e.child_call_id = c.call_id
        ORDER BY c.started_at, c.call_id
        """
    )
    names = [d[0] for d in cur.description]
    return con, [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def check_common(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> None:
    """One rollout, one tree, side calls labelled by their definition, audits empty."""
    (n_calls,) = con.execute("SELECT count(*) FROM calls").fetchone() or (0,)
    assert len(rows) == n_calls > 0, "every call is exactly one node"
    assert {r["rollout_id"] for r in rows} == {"run"} == {r["node_rollout_id"] for r in rows}
    roots = [r for r in rows if r["parent_call_id"] is None]
    assert len(roots) == 1 and roots[0] is rows[0], [(r["call_id"], r["edge_kind"]) for r in rows]
    assert all(r["root_call_id"] == rows[0]["call_id"] for r in rows)
    tooled = [r["model"] for r in rows if r["tools"]]
    main_model = max(set(tooled), key=tooled.count)
    for r in rows:
        side = not r["tools"] and r["model"] != main_model
        assert r["is_side_call"] == side
        if r["parent_call_id"] is not None:
            assert r["child_is_side_call"] == side
    assert {k: v for k, v in audits(con).items() if v} == {}


def agent_chains(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    chains: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if not r["is_side_call"]:
            chains.setdefault(r["agent_key"], []).append(r)
    return chains


def check_chain_in_order(chain: list[dict[str, Any]], evidence: set[str]) -> None:
    """Each call after the first continues the one before it."""
    for before, after in zip(chain, chain[1:], strict=False):
        assert (after["parent_call_id"], after["edge_kind"]) == (before["call_id"], "continues")
        assert after["evidence"] in evidence, after


# --------------------------------------------------------------------------- Claude Code


def claude_script(conv: Conversation) -> Any:
    """The main agent hands the task to a sub-agent (Agent tool); the sub-agent writes the
    file with Bash. Sub-agents are told apart by their first message: SUB_TASK."""
    first = conv.history[0] if conv.history else {}
    if SUB_TASK in json.dumps(first.get("content")):
        if conv.tool_results == 0:
            return {"tool_call": {"name": "Bash", "arguments": {"command": "echo hi > hello.txt"}}}
        return {"text": "hello.txt written."}
    if conv.tool_results == 0:
        agent = {"description": "write hello.txt", "prompt": SUB_TASK}
        agent["subagent_type"] = "general-purpose"
        return {"tool_call": {"name": "Agent", "arguments": agent}}
    return {"text": "Done: the sub-agent wrote hello.txt."}


@pytest.mark.skipif(
    not harnesses.claude_available(), reason=harnesses.unavailable_reason("claude") or ""
)
def test_claude_code_sub_agent_hangs_from_the_agent_call(tmp_path: Path, confdir: Path) -> None:
    spec = harnesses.claude_command(
        "Use a sub-agent to create hello.txt containing hi.",
        workdir=tmp_path / "work",
        home=tmp_path / "home",
        proxy_url=None,
        ca_cert=None,
        api_key=ANTHROPIC_KEY,
        headers=SECRET_HEADERS,
    ).prepare()
    with ScriptedUpstream(claude_script) as up:
        done = record(
            tmp_path,
            confdir,
            list(spec.argv),
            spec.env,
            spec.cwd,
            {"api.anthropic.com": up.base_url},
        )
        assert_secrets_sent(up.received)  # the sub-agent's calls too
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (tmp_path / "work" / "hello.txt").read_text().strip() == "hi"
    assert files_containing(tmp_path / "run", SECRETS) == []
    con, rows = tree(tmp_path / "run")
    check_common(con, rows)
    chains = agent_chains(rows)
    main = chains.pop("main")
    assert all(r["claude_agent_id"] is None for r in main)
    check_chain_in_order(main, {"hash_chain", "normalised_chain"})
    assert len(chains) == 1, list(chains)
    ((agent_id, sub),) = chains.items()
    assert {r["claude_agent_id"] for r in sub} == {agent_id}
    launcher = next(r for r in main if "Agent" in (r["tool_calls"] or []))
    assert (sub[0]["parent_call_id"], sub[0]["edge_kind"], sub[0]["evidence"]) == (
        launcher["call_id"],
        "spawns",
        "header",
    )
    check_chain_in_order(sub, {"hash_chain", "normalised_chain"})
    assert "Bash" in (sub[0]["tool_calls"] or [])


# --------------------------------------------------------------------------- Codex


def codex_script(conv: Conversation) -> Any:
    """The root thread spawns an agent thread and waits for it; the agent writes the file.
    Sub-agent requests carry x-openai-subagent in client_metadata."""
    if "collab_spawn" in json.dumps(conv.body.get("client_metadata") or {}):
        if conv.tool_results == 0:
            return {
                "tool_call": {"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt"}}
            }
        return {"text": "hello.txt written."}
    if conv.tool_results == 0:
        spawn = {"task_name": "hello_writer", "message": SUB_TASK, "fork_turns": "none"}
        return {"tool_call": {"name": "spawn_agent", "arguments": spawn}}
    if conv.tool_results == 1:
        return {"tool_call": {"name": "wait_agent", "arguments": {"timeout_ms": 30000}}}
    return {"text": "Done: the agent wrote hello.txt."}


@pytest.mark.skipif(
    not harnesses.codex_available(), reason=harnesses.unavailable_reason("codex") or ""
)
@pytest.mark.parametrize("transport", ["websocket", "http"])
def test_codex_spawned_agent_hangs_from_the_spawn_agent_call(
    tmp_path: Path, confdir: Path, transport: str
) -> None:
    # gpt-5.5 (classic tools) offers spawn_agent only with multi_agent_v2 on: a `namespace`
    # tool `collaboration` in the request's tools. The default model (code mode) offers it
    # as a namespace inside an `additional_tools` input item instead.
    spec = harnesses.codex_command(
        "Use a sub-agent to create hello.txt containing hi.",
        workdir=tmp_path / "work",
        home=tmp_path / "home",
        proxy_url=None,
        ca_cert=None,
        api_key=OPENAI_KEY,
        extra_args=["--enable", "multi_agent_v2"],
    ).prepare()
    extra = ["--set", "forge_refuse_websocket=true"] if transport == "http" else []
    with ScriptedUpstream(codex_script) as up:
        done = record(
            tmp_path,
            confdir,
            list(spec.argv),
            spec.env,
            spec.cwd,
            {"api.openai.com": up.base_url},
            *extra,
        )
        offered = [
            t.get("name")
            for r in up.received
            if isinstance(r.body, dict)
            for t in r.body.get("tools") or []
        ]
    assert "collaboration" in offered, "Codex did not offer its collaboration tools"
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (tmp_path / "work" / "hello.txt").read_text().strip() == "hi"
    assert files_containing(tmp_path / "run", SECRETS) == []
    con, rows = tree(tmp_path / "run")
    check_common(con, rows)
    chains = agent_chains(rows)
    main = chains.pop("main")
    assert len(chains) == 1, list(chains)
    ((thread, sub),) = chains.items()
    assert {r["codex_thread_id"] for r in sub} == {thread}
    assert {r["openai_subagent"] for r in sub} == {"collab_spawn"}
    assert all(r["openai_subagent"] is None for r in main)
    evidence = (
        {"previous_response_id"} if transport == "websocket" else {"hash_chain", "normalised_chain"}
    )
    check_chain_in_order(main, evidence)
    check_chain_in_order(sub, evidence)
    if transport == "websocket":  # each thread's connection opens with a prewarm
        assert main[0]["is_prewarm"] and sub[0]["is_prewarm"]
        assert not any(r["is_prewarm"] for r in main[1:] + sub[1:])
    launcher = next(r for r in main if "spawn_agent" in (r["tool_calls"] or []))
    assert (sub[0]["parent_call_id"], sub[0]["edge_kind"], sub[0]["evidence"]) == (
        launcher["call_id"],
        "spawns",
        "header",
    )


# --------------------------------------------------------------------------- toy harness


def test_toy_harness_child_process_hangs_from_the_consult_call(
    tmp_path: Path, confdir: Path
) -> None:
    script = [
        {"tool_call": {"name": "consult", "arguments": {"question": "Which file name?"}}},
        {"tool_call": {"name": "shell", "arguments": {"command": "echo hi > hello.txt"}}},
        {"text": "Done."},
    ]
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["OPENAI_API_KEY"] = OPENAI_KEY
    argv = [sys.executable, "-m", "k8s_jobs.toy_harness", "make hello.txt"]
    with ScriptedUpstream(script, side_text="Call it hello.txt.") as up:
        done = record(tmp_path, confdir, argv, env, tmp_path, {"api.openai.com": up.base_url})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "hello.txt").read_text() == "hi\n"
    con, rows = tree(tmp_path / "run")
    check_common(con, rows)
    chains = agent_chains(rows)
    main = chains.pop("main")
    check_chain_in_order(main, {"hash_chain"})
    assert [r["tool_calls"] for r in main] == [["consult"], ["shell"], []]
    ((key, (child,)),) = chains.items()
    assert key == f"pid:{child['pid']}" and child["pid"] != main[0]["pid"]
    assert (child["parent_call_id"], child["edge_kind"], child["evidence"]) == (
        main[0]["call_id"],
        "spawns",
        "process_tree",
    )
    assert not child["is_side_call"]  # no tools, but the main model: a sub-agent process
