"""Stitching: `edges` and `call_nodes` from tiny recorded runs, one rule per test.

Fixtures are built as the recorder builds rows: each request's items become a hash chain
(``pipeline.canonical``), stored once by the first call that sends them, and each call
row points at its request's and response's last item (see ``Run.call``).
"""

from __future__ import annotations

import argparse
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import duckdb
import pytest

from forge_cli import cmd_tree
from pipeline import store
from pipeline.canonical import canonical_json, chain_hashes
from pipeline.schema import CALLS
from pipeline.shards import write_shard

T0 = datetime(2026, 3, 1, tzinfo=UTC)
SYSTEM = {"role": "system", "content": "You are an agent."}
TOOLS = ["Bash", "Read"]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def tool_use(tool_id: str, name: str = "Bash", **extra: Any) -> dict[str, Any]:
    block = {"type": "tool_use", "id": tool_id, "name": name, "input": {"command": "ls"}}
    return {"role": "assistant", "content": [dict(block, **extra)]}


def tool_result(tool_id: str, cached: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id, "content": "ok"}
    if cached:
        block["cache_control"] = {"type": "ephemeral"}
    return {"role": "user", "content": [block]}


def say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


class Run:
    """Calls and messages rows of one run directory, built like the recorder's."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.messages: dict[str, dict[str, Any]] = {}
        self.heads: dict[str, str | None] = {}  # response_id -> response_head_hash

    def _store(self, rows: list[tuple[str, str | None, str]], call_id: str) -> None:
        for h, parent, canonical in rows:
            if h not in self.messages:  # written once, by the first call that sends it
                self.messages[h] = {
                    "hash": h,
                    "parent_hash": parent,
                    "kind": "item",
                    "role": None,
                    "item_type": None,
                    "content_json": canonical,
                    "content_bytes": len(canonical),
                    "first_call_id": call_id,
                }

    def call(
        self,
        call_id: str,
        request: list[Any],
        response: list[Any] | None = None,
        *,
        at: float,
        rollout: str | None = "r1",
        previous: str | None = None,
        tools: list[str] | None = None,
        tool_calls: list[str] | None = None,
        model: str = "big-model",
        **columns: Any,
    ) -> dict[str, Any]:
        """Record one call ``at`` seconds into the run; ``previous`` is a response id."""
        parent = self.heads.get(previous) if previous else None
        request_rows = chain_hashes(request, parent)
        self._store(request_rows, call_id)
        head = request_rows[-1][0] if request_rows else parent
        response_rows = chain_hashes(response or [], head)
        self._store(response_rows, call_id)
        row: dict[str, Any] = {f.name: None for f in CALLS}
        row.update(
            call_id=call_id,
            run_id="run-1",
            rollout_id=rollout,
            api="anthropic_messages",
            model=model,
            status="complete",
            started_at=T0 + timedelta(seconds=at),
            ended_at=T0 + timedelta(seconds=at + 0.5),
            request_head_hash=head,
            request_items=len(request),
            request_items_form="list",
            previous_response_id=previous,
            response_id=f"resp-{call_id}",
            response_head_hash=response_rows[-1][0] if response_rows else None,
            response_items=len(response_rows),
            tools=TOOLS if tools is None else tools,
            tool_calls=tool_calls if tool_calls is not None else _tool_names(response or []),
            input_tokens=100,
            output_tokens=10,
        )
        row.update(columns)
        self.heads[row["response_id"]] = row["response_head_hash"]
        self.calls.append(row)
        return row

    def open(self, root: Path) -> duckdb.DuckDBPyConnection:
        write_shard(root, "calls", "calls-1", self.calls)
        write_shard(root, "messages", "messages-1", list(self.messages.values()))
        return open_stitching(root)


def stitching_files() -> list[str]:
    """The view files of stitching (100-199): edges and call_nodes need no later ones."""
    return [n for n in ALL_SQL_FILES() if 100 <= int(n[:3]) <= 199]


ALL_SQL_FILES = store.derived_sql_files


def open_stitching(root: Path) -> duckdb.DuckDBPyConnection:
    """``pipeline.store.connect`` running only the stitching views (faster, and blind to
    later views another part of the pipeline may be changing)."""
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    with mock.patch.object(store, "derived_sql_files", stitching_files):
        return store.connect(root, con)


def _tool_names(items: list[Any]) -> list[str]:
    return [
        b["name"]
        for item in items
        if isinstance(item, dict) and isinstance(item.get("content"), list)
        for b in item["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]


def parents(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, str, str]]:
    """child -> (parent, kind, evidence)."""
    rows = con.execute("SELECT child_call_id, parent_call_id, kind, evidence FROM edges").fetchall()
    return {c: (p, k, e) for c, p, k, e in rows}


def nodes(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    cur = con.execute("SELECT * FROM call_nodes")
    names = [d[0] for d in cur.description]
    return {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}


STITCHING_AUDITS = [
    n for n in store.audit_names() if n.startswith(("audit_edges_", "audit_calls_"))
]


def assert_clean(con: duckdb.DuckDBPyConnection) -> None:
    """Every stitching audit returns no rows."""
    bad = {}
    for name in STITCHING_AUDITS:
        rows = con.execute(store.sql_text(name)).fetchall()
        if rows:
            bad[name] = rows[:3]
    assert bad == {}


# --------------------------------------------------------------------------- continues


def test_a_call_continues_the_call_whose_response_is_on_its_chain(tmp_path: Path) -> None:
    run = Run()
    run.call("a", [SYSTEM, user("go")], [tool_use("t1")], at=0)
    run.call("b", [SYSTEM, user("go"), tool_use("t1"), tool_result("t1")], [say("done")], at=1)
    con = run.open(tmp_path)
    assert parents(con) == {"b": ("a", "continues", "hash_chain")}
    n = nodes(con)
    assert (n["a"]["depth"], n["b"]["depth"]) == (0, 1)
    assert n["b"]["root_call_id"] == "a" and n["b"]["agent_key"] == "main"
    assert_clean(con)


def test_the_nearest_earlier_response_wins(tmp_path: Path) -> None:
    run = Run()
    history = [SYSTEM, user("go")]
    for i, call_id in enumerate("abcd"):
        out = [tool_use(f"t{i}")]
        run.call(call_id, history, out, at=i)
        history = history + out + [tool_result(f"t{i}")]
    con = run.open(tmp_path)
    assert {c: p for c, (p, _, _) in parents(con).items()} == {"b": "a", "c": "b", "d": "c"}
    assert [nodes(con)[c]["depth"] for c in "abcd"] == [0, 1, 2, 3]
    assert_clean(con)


def test_previous_response_id_links_requests_that_carry_only_new_items(tmp_path: Path) -> None:
    run = Run()
    kw: dict[str, Any] = {"api": "openai_responses", "transport": "websocket"}
    warm = run.call("w", [], [], at=0, prewarm=True, **kw)
    first = run.call("a", [SYSTEM, user("go")], [tool_use("t1")], at=1, previous="resp-w", **kw)
    run.call("b", [tool_result("t1")], [say("done")], at=2, previous=first["response_id"], **kw)
    con = run.open(tmp_path)
    assert warm["response_head_hash"] is None
    assert parents(con) == {
        "a": ("w", "continues", "previous_response_id"),
        "b": ("a", "continues", "previous_response_id"),
    }
    n = nodes(con)
    assert n["w"]["is_prewarm"] and n["w"]["parent_call_id"] is None and n["w"]["depth"] == 0
    assert not n["a"]["is_prewarm"] and n["b"]["depth"] == 2
    assert_clean(con)


def test_previous_response_id_never_reaches_into_another_rollout(tmp_path: Path) -> None:
    run = Run()
    run.call("a", [user("go")], [say("hi")], at=0, rollout="r1")
    run.call("b", [user("more")], [say("ok")], at=1, rollout="r2", previous="resp-a")
    con = run.open(tmp_path)
    assert parents(con) == {}
    assert_clean(con)


def test_a_moved_cache_control_mark_still_continues(tmp_path: Path) -> None:
    # Claude Code marks the newest message with cache_control and drops the mark from the
    # message it marked before: every request alters the previous request's last item.
    run = Run()
    history = [user("go")]
    for i, call_id in enumerate("abcd"):
        out = [tool_use(f"t{i}")]
        run.call(call_id, history, out, at=i)
        history = [*history[:-1], _uncached(history[-1]), *out, tool_result(f"t{i}", cached=True)]
    con = run.open(tmp_path)
    links = parents(con)
    assert {c: p for c, (p, _, _) in links.items()} == {"b": "a", "c": "b", "d": "c"}
    # b's request still holds a's response exactly (a's request was not altered); later
    # ones hold an altered copy, and an older exact response (a's) must not win.
    assert links["b"][2] == "hash_chain"
    assert links["c"][2] == links["d"][2] == "normalised_chain"
    assert_clean(con)


def _uncached(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if not isinstance(content, list):
        return message
    return dict(
        message, content=[{k: v for k, v in b.items() if k != "cache_control"} for b in content]
    )


def test_a_system_message_resent_as_a_string_still_continues(tmp_path: Path) -> None:
    blocks = {"role": "system", "content": [{"type": "text", "text": "Environment: linux"}]}
    flat = {"role": "system", "content": "Environment: linux"}
    run = Run()
    run.call("a", [user("go"), blocks], [tool_use("t1")], at=0)
    run.call("b", [user("go"), flat, tool_use("t1"), tool_result("t1")], [say("done")], at=1)
    con = run.open(tmp_path)
    assert parents(con) == {"b": ("a", "continues", "normalised_chain")}


def test_chat_content_null_and_absent_compare_equal(tmp_path: Path) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    recorded = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "annotations": [],
        "tool_calls": [call],
    }
    echoed = {"role": "assistant", "tool_calls": [call]}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
    run = Run()
    kw: dict[str, Any] = {"api": "openai_chat"}
    run.call("a", [SYSTEM, user("go")], [recorded], at=0, tool_calls=["shell"], **kw)
    run.call("b", [SYSTEM, user("go"), echoed, tool], [say("done")], at=1, **kw)
    con = run.open(tmp_path)
    assert parents(con) == {"b": ("a", "continues", "normalised_chain")}


def test_responses_items_echoed_without_id_and_status_compare_equal(tmp_path: Path) -> None:
    output = {
        "id": "fc_1",
        "type": "function_call",
        "status": "completed",
        "call_id": "call_1",
        "name": "exec_command",
        "arguments": '{"cmd":"ls"}',
    }
    echoed = {k: v for k, v in output.items() if k not in ("id", "status")}
    echoed["internal_chat_message_metadata_passthrough"] = {"turn_id": "t-1"}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    run = Run()
    kw: dict[str, Any] = {"api": "openai_responses", "transport": "sse"}
    dev = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x"}]}
    run.call("a", [dev, user("go")], [output], at=0, tool_calls=["exec_command"], **kw)
    run.call("b", [dev, user("go"), echoed, result], [say("done")], at=1, **kw)
    con = run.open(tmp_path)
    assert parents(con) == {"b": ("a", "continues", "normalised_chain")}


def test_the_normalised_match_needs_the_item_before_the_response_too(tmp_path: Path) -> None:
    # Two agents of one rollout both answer "Done." at the same position: only the one whose
    # preceding item matches is the parent.
    run = Run()
    run.call("a", [user("task A")], [say("Done.")], at=0, claude_session_id="s")
    run.call(
        "x", [user("task X")], [say("Done.")], at=1, claude_session_id="s", claude_agent_id="ag"
    )
    run.call(
        "b",
        [_cached(user("task A")), say("Done."), user("next")],
        [say("ok")],
        at=2,
        claude_session_id="s",
    )
    con = run.open(tmp_path)
    assert parents(con)["b"] == ("a", "continues", "normalised_chain")


def _cached(message: dict[str, Any]) -> dict[str, Any]:
    text = message["content"]
    block = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
    return dict(message, content=[block])


def test_a_retry_of_a_failed_call_is_its_sibling(tmp_path: Path) -> None:
    run = Run()
    history = [SYSTEM, user("go")]
    run.call("a", history, [tool_use("t1")], at=0)
    history = history + [tool_use("t1"), tool_result("t1")]
    run.call("f", history, None, at=1, status="error", error="HTTP 529: overloaded")
    run.call("b", history, [say("done")], at=2)
    con = run.open(tmp_path)
    assert parents(con) == {
        "f": ("a", "continues", "hash_chain"),
        "b": ("a", "continues", "hash_chain"),
    }
    assert_clean(con)


def test_a_retried_first_call_is_a_second_root_not_a_compaction(tmp_path: Path) -> None:
    run = Run()
    run.call("f", [SYSTEM, user("go")], None, at=0, status="error", pid=10)
    run.call("a", [SYSTEM, user("go")], [say("hi")], at=1, pid=10)
    con = run.open(tmp_path)
    assert parents(con) == {}
    assert {n["root_call_id"] for n in nodes(con).values()} == {"f", "a"}


def test_grpo_rollouts_of_one_task_stitch_apart(tmp_path: Path) -> None:
    # Same system prompt and task, same deterministic tool output, same text replies: the
    # items are stored once, by the first rollout, yet each rollout keeps its own chain.
    run = Run()
    for k, rollout in enumerate(["r1", "r2", "r3"]):
        history = [SYSTEM, user("fix the bug")]
        for i in range(3):
            out = [say("Let me look.")] if i < 2 else [say("Fixed.")]
            run.call(f"{rollout}-{i}", history, out, at=10 * k + i, rollout=rollout, tools=[])
            history = history + out + [user("(output)")]
    con = run.open(tmp_path)
    links = parents(con)
    for rollout in ["r1", "r2", "r3"]:
        assert links[f"{rollout}-1"][:2] == (f"{rollout}-0", "continues")
        assert links[f"{rollout}-2"][:2] == (f"{rollout}-1", "continues")
        assert f"{rollout}-0" not in links
    assert_clean(con)


def test_calls_without_a_rollout_stitch_among_themselves(tmp_path: Path) -> None:
    run = Run()
    run.call("a", [user("go")], [tool_use("t1")], at=0, rollout=None)
    run.call("b", [user("go"), tool_use("t1"), tool_result("t1")], [say("ok")], at=1, rollout=None)
    con = run.open(tmp_path)
    assert parents(con) == {"b": ("a", "continues", "hash_chain")}
    assert_clean(con)


# --------------------------------------------------------------------------- spawns


def claude(agent: str | None = None, parent: str | None = None) -> dict[str, Any]:
    return {
        "claude_session_id": "sess-1",
        "claude_agent_id": agent,
        "claude_parent_agent_id": parent,
        "pid": 100,
    }


def test_a_claude_sub_agent_hangs_from_the_call_that_asked_for_it(tmp_path: Path) -> None:
    # The Agent tool runs in the background: the main agent goes on (b) before the
    # sub-agent's first call (s1), which must still hang from a, whose response asked.
    run = Run()
    main = [SYSTEM, user("use a sub-agent")]
    run.call("a", main, [tool_use("t1", "Agent")], at=0, **claude())
    main = main + [tool_use("t1", "Agent"), tool_result("t1")]
    run.call("b", main, [say("launched")], at=1, **claude())
    sub = [user("write hello.txt")]
    run.call("s1", sub, [tool_use("t2")], at=2, **claude("ag1"))
    run.call(
        "s2", sub + [tool_use("t2"), tool_result("t2")], [say("written")], at=3, **claude("ag1")
    )
    con = run.open(tmp_path)
    assert parents(con) == {
        "b": ("a", "continues", "hash_chain"),
        "s1": ("a", "spawns", "header"),
        "s2": ("s1", "continues", "hash_chain"),
    }
    n = nodes(con)
    assert [n[c]["agent_key"] for c in ["a", "b", "s1", "s2"]] == ["main", "main", "ag1", "ag1"]
    assert n["s2"]["depth"] == 2 and n["s2"]["root_call_id"] == "a"
    assert_clean(con)


def test_a_nested_sub_agent_hangs_from_its_parent_agent(tmp_path: Path) -> None:
    run = Run()
    run.call("a", [user("go")], [tool_use("t1", "Agent")], at=0, **claude())
    run.call("s", [user("sub task")], [tool_use("t2", "Agent")], at=1, **claude("ag1"))
    run.call("n", [user("nested task")], [say("done")], at=2, **claude("ag2", "ag1"))
    run.call(
        "m", [user("go"), tool_use("t1", "Agent"), tool_result("t1")], [say("ok")], at=3, **claude()
    )
    con = run.open(tmp_path)
    links = parents(con)
    assert links["s"] == ("a", "spawns", "header")
    assert links["n"] == ("s", "spawns", "header")
    assert links["m"] == ("a", "continues", "hash_chain")
    n = nodes(con)
    assert (n["n"]["depth"], n["n"]["agent_key"]) == (2, "ag2")
    assert_clean(con)


def codex(thread: str, parent: str | None = None) -> dict[str, Any]:
    return {
        "api": "openai_responses",
        "transport": "websocket",
        "codex_session_id": "th-root",
        "codex_thread_id": thread,
        "codex_parent_thread_id": parent,
        "openai_subagent": "collab_spawn" if parent else None,
        "pid": 200,
    }


def test_a_codex_spawned_thread_hangs_from_the_spawn_agent_call(tmp_path: Path) -> None:
    # Codex opens the sub-agent's WebSocket (prewarm first) only after the parent already
    # moved on to wait_agent; spawn_agent is the call that launched it.
    run = Run()
    spawn = {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "arguments": "{}"}
    wait = {"type": "function_call", "call_id": "c2", "name": "wait_agent", "arguments": "{}"}
    run.call("w", [], [], at=0, prewarm=True, **codex("th-root"))
    run.call(
        "a",
        [user("go")],
        [spawn],
        at=1,
        previous="resp-w",
        tool_calls=["spawn_agent"],
        **codex("th-root"),
    )
    out1 = {"type": "function_call_output", "call_id": "c1", "output": "spawned"}
    run.call(
        "b", [out1], [wait], at=2, previous="resp-a", tool_calls=["wait_agent"], **codex("th-root")
    )
    run.call("sw", [], [], at=3, prewarm=True, **codex("th-sub", "th-root"))
    run.call(
        "s1",
        [user("write hello.txt")],
        [say("done")],
        at=4,
        previous="resp-sw",
        **codex("th-sub", "th-root"),
    )
    out2 = {"type": "function_call_output", "call_id": "c2", "output": "finished"}
    run.call("c", [out2], [say("all done")], at=5, previous="resp-b", **codex("th-root"))
    con = run.open(tmp_path)
    links = parents(con)
    assert links["sw"] == ("a", "spawns", "header")
    assert links["s1"] == ("sw", "continues", "previous_response_id")
    assert links["c"] == ("b", "continues", "previous_response_id")
    n = nodes(con)
    assert n["s1"]["agent_key"] == "th-sub" and n["c"]["agent_key"] == "main"
    assert n["sw"]["is_prewarm"] and n["sw"]["depth"] == 2
    assert_clean(con)


def test_a_sub_agent_forking_its_parent_history_spawns_by_hash(tmp_path: Path) -> None:
    # Codex fork_turns="all": the child's first request carries the parent's conversation.
    run = Run()
    kw = {"api": "openai_responses", "transport": "sse"}
    spawn = {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "arguments": "{}"}
    history = [user("go")]
    run.call(
        "a", history, [spawn], at=0, tool_calls=["spawn_agent"], **dict(codex("th-root"), **kw)
    )
    run.call(
        "s",
        history + [spawn, user("you are the sub-agent")],
        [say("ok")],
        at=1,
        **dict(codex("th-sub", "th-root"), **kw),
    )
    con = run.open(tmp_path)
    assert parents(con) == {"s": ("a", "spawns", "hash_chain")}
    assert nodes(con)["s"]["agent_key"] == "th-sub"


def test_a_child_process_hangs_from_its_parent_process_open_call(tmp_path: Path) -> None:
    run = Run()
    history = [SYSTEM, user("go")]
    run.call("a", history, [tool_use("t1", "consult")], at=0, pid=10, parent_pids=[5, 1])
    run.call(
        "x",
        [user("which file?")],
        [say("hello.txt")],
        at=1,
        pid=11,
        parent_pids=[10, 5, 1],
        tools=[],
    )
    run.call(
        "b",
        history + [tool_use("t1", "consult"), tool_result("t1")],
        [say("ok")],
        at=2,
        pid=10,
        parent_pids=[5, 1],
    )
    con = run.open(tmp_path)
    assert parents(con) == {
        "x": ("a", "spawns", "process_tree"),
        "b": ("a", "continues", "hash_chain"),
    }
    n = nodes(con)
    assert n["x"]["agent_key"] == "pid:11" and not n["x"]["is_side_call"]
    assert_clean(con)


def test_the_nearest_ancestor_process_with_calls_wins(tmp_path: Path) -> None:
    run = Run()
    run.call("a", [user("go")], [tool_use("t1")], at=0, pid=10, parent_pids=[1])
    run.call("m", [user("middle")], [tool_use("t2")], at=1, pid=20, parent_pids=[10, 1])
    run.call("x", [user("leaf")], [say("ok")], at=2, pid=30, parent_pids=[25, 20, 10, 1])
    con = run.open(tmp_path)
    links = parents(con)
    assert links["m"] == ("a", "spawns", "process_tree")
    assert links["x"] == ("m", "spawns", "process_tree")


def test_a_chain_without_headers_hangs_from_the_pending_tool_call(tmp_path: Path) -> None:
    # An in-process sub-agent (no headers, same process): the new chain began while a's
    # tool call was pending, since a's continuation (b) came after it.
    run = Run()
    history = [SYSTEM, user("go")]
    run.call("a", history, [tool_use("t1", "delegate")], at=0, pid=10)
    run.call("s", [user("sub task")], [say("sub done")], at=1, pid=10)
    run.call(
        "b", history + [tool_use("t1", "delegate"), tool_result("t1")], [say("ok")], at=2, pid=10
    )
    con = run.open(tmp_path)
    assert parents(con)["s"] == ("a", "spawns", "time")
    assert nodes(con)["s"]["agent_key"] == "chain:s"


def test_without_process_or_headers_time_still_attaches(tmp_path: Path) -> None:
    run = Run()
    run.call("a", [user("go")], [tool_use("t1", "delegate")], at=0)
    run.call("s", [user("sub task")], [say("sub done")], at=1)
    con = run.open(tmp_path)
    assert parents(con) == {"s": ("a", "spawns", "time")}


def test_a_side_call_is_labelled_and_hangs_from_its_agent(tmp_path: Path) -> None:
    run = Run()
    history = [SYSTEM, user("go")]
    run.call("a", history, [tool_use("t1")], at=0, **claude())
    run.call(
        "t",
        [user("Write a 5-word title for: go")],
        [say("Going")],
        at=0.5,
        tools=[],
        model="small-model",
        **claude(),
    )
    run.call("b", history + [tool_use("t1"), tool_result("t1")], [say("ok")], at=1, **claude())
    con = run.open(tmp_path)
    assert parents(con)["t"] == ("a", "spawns", "header")
    child_flag = con.execute(
        "SELECT child_is_side_call FROM edges WHERE child_call_id = 't'"
    ).fetchone()
    assert child_flag == (True,)
    n = nodes(con)
    assert n["t"]["is_side_call"] and n["t"]["agent_key"] == "side:t"
    assert not n["a"]["is_side_call"] and not n["b"]["is_side_call"]
    assert_clean(con)


def test_a_call_without_tools_on_the_main_model_is_not_a_side_call(tmp_path: Path) -> None:
    run = Run()
    run.call("a", [user("go")], [tool_use("t1")], at=0, pid=10)
    run.call(
        "x", [user("which file?")], [say("hello.txt")], at=1, tools=[], pid=11, parent_pids=[10]
    )
    con = run.open(tmp_path)
    assert not nodes(con)["x"]["is_side_call"]


def test_a_side_call_continuing_the_conversation_is_a_spawn(tmp_path: Path) -> None:
    run = Run()
    history = [SYSTEM, user("go")]
    run.call("a", history, [say("done")], at=0, **claude())
    run.call(
        "s",
        history + [say("done"), user("Summarise the above.")],
        [say("summary")],
        at=1,
        tools=[],
        model="small-model",
        **claude(),
    )
    con = run.open(tmp_path)
    assert parents(con) == {"s": ("a", "spawns", "hash_chain")}
    assert nodes(con)["s"]["agent_key"] == "side:s"


# --------------------------------------------------------------------------- compacts


def test_a_compaction_starts_a_new_chain_linked_to_the_last_call(tmp_path: Path) -> None:
    run = Run()
    history = [SYSTEM, user("go")]
    run.call("a", history, [tool_use("t1")], at=0, **claude())
    history = history + [tool_use("t1"), tool_result("t1")]
    run.call("b", history, [say("I did step one.")], at=1, **claude())
    # the summarisation request continues b; the new chain starts from its summary
    run.call(
        "sum",
        history + [say("I did step one."), user("Summarise.")],
        [say("Summary")],
        at=2,
        tools=[],
        **claude(),
    )
    fresh = [SYSTEM, user("This session continues from a summary: Summary. Go on.")]
    run.call("c", fresh, [tool_use("t2")], at=3, **claude())
    run.call("d", fresh + [tool_use("t2"), tool_result("t2")], [say("done")], at=4, **claude())
    con = run.open(tmp_path)
    links = parents(con)
    assert links["sum"] == ("b", "continues", "hash_chain")
    assert links["c"] == ("sum", "compacts", "header")
    assert links["d"] == ("c", "continues", "hash_chain")
    n = nodes(con)
    assert n["d"]["agent_key"] == "main" and n["d"]["depth"] == 4
    assert_clean(con)


def test_a_process_restarting_its_conversation_compacts(tmp_path: Path) -> None:
    run = Run()
    run.call("a", [SYSTEM, user("go")], [say("step one done")], at=0, pid=10)
    run.call("c", [SYSTEM, user("Summary: step one done. Go on.")], [say("ok")], at=1, pid=10)
    con = run.open(tmp_path)
    assert parents(con) == {"c": ("a", "compacts", "process_tree")}


# --------------------------------------------------------------------------- properties


def test_every_call_is_one_node_in_exactly_one_rollout(tmp_path: Path) -> None:
    run = Run()
    rng = random.Random(7)
    for r in range(4):
        history: list[Any] = [SYSTEM, user(f"task {r}")]
        for i in range(6):
            out = [tool_use(f"r{r}t{i}")]
            run.call(f"r{r}c{i}", history, out, at=100 * r + i + rng.random() / 2, rollout=f"r{r}")
            history = history + out + [tool_result(f"r{r}t{i}")]
    con = run.open(tmp_path)
    rows = con.execute(
        "SELECT n.rollout_id, count(*), count(DISTINCT n.root_call_id), max(n.depth) "
        "FROM call_nodes AS n GROUP BY ALL ORDER BY 1"
    ).fetchall()
    assert rows == [(f"r{r}", 6, 1, 5) for r in range(4)]
    assert_clean(con)


def reference_parents(run: Run) -> dict[str, str]:
    """The hash-chain rule as a plain loop: the latest earlier call of the same rollout
    whose response head is the nearest one on the request's chain."""
    parent_of = {h: m["parent_hash"] for h, m in run.messages.items()}
    order = sorted(run.calls, key=lambda c: (c["started_at"], c["call_id"]))
    out: dict[str, str] = {}
    for i, b in enumerate(order):
        earlier = [a for a in order[:i] if a["rollout_id"] == b["rollout_id"]]
        h = b["request_head_hash"]
        while h is not None:
            found = [a for a in earlier if a["response_head_hash"] == h]
            if found:
                out[b["call_id"]] = found[-1]["call_id"]
                break
            h = parent_of[h]
    return out


@pytest.mark.parametrize("seed", range(5))
def test_hash_chain_stitching_matches_a_plain_loop(tmp_path: Path, seed: int) -> None:
    # Random conversation trees: each call extends a random earlier call's conversation
    # (or starts a new one) in one of two rollouts, sometimes a retry with no response.
    rng = random.Random(seed)
    run = Run()
    conversations: list[tuple[str, list[Any]]] = []
    for i in range(40):
        rollout = rng.choice(["r1", "r2"])
        mine = [c for c in conversations if c[0] == rollout]
        if mine and rng.random() < 0.85:
            _, history = rng.choice(mine)
            request = history + [tool_result(f"x{i}")] if rng.random() < 0.8 else history
        else:
            request = [SYSTEM, user(f"task {rng.randrange(3)}")]
        failed = rng.random() < 0.1
        out = None if failed else [tool_use(f"t{i}") if rng.random() < 0.7 else say("same text")]
        run.call(
            f"c{i:02d}",
            request,
            out,
            at=i,
            rollout=rollout,
            status="error" if failed else "complete",
        )
        if out is not None:
            conversations.append((rollout, request + out))
    con = run.open(tmp_path)
    got = {c: p for c, (p, k, e) in parents(con).items() if e == "hash_chain"}
    assert got == reference_parents(run)
    assert_clean(con)


# --------------------------------------------------------------------------- pieces


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            {"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ),
        (
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "hi",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    }
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ),
        (
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "x", "annotations": []}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "input_text", "text": "x"}],
            },
        ),
    ],
)
def test_normalising_forgets_what_harnesses_alter(a: Any, b: Any) -> None:
    con = duckdb.connect()
    con.execute(
        (Path(__file__).parents[2] / "pipeline/sql/100_forge_normalise_item.sql").read_text()
    )
    (x, y) = con.execute(
        "SELECT forge_normalise_item(?), forge_normalise_item(?)",
        [canonical_json(a), canonical_json(b)],
    ).fetchone() or (None, None)
    assert x == y


def test_normalising_keeps_what_matters() -> None:
    con = duckdb.connect()
    con.execute(
        (Path(__file__).parents[2] / "pipeline/sql/100_forge_normalise_item.sql").read_text()
    )
    texts = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": 'say "id":"x"'},
        {"role": "user", "content": 'say "status":"y"'},
        {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "a", "arguments": "{}"},
    ]
    got = {
        con.execute("SELECT forge_normalise_item(?)", [canonical_json(t)]).fetchone()[0]  # type: ignore[index]
        for t in texts
    }
    assert len(got) == len(texts)


# --------------------------------------------------------------------------- forge tree


def test_forge_tree_prints_the_rollout_as_an_indented_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Run()
    main = [SYSTEM, user("go")]
    run.call("a", main, [tool_use("t1", "Agent")], at=0, **claude())
    run.call("t", [user("title?")], [say("Go")], at=0.5, tools=[], model="small-model", **claude())
    run.call("s", [user("sub")], [say("sub done")], at=1, **claude("ag1"))
    run.call(
        "b", main + [tool_use("t1", "Agent"), tool_result("t1")], [say("ok")], at=2, **claude()
    )
    run.call("other", [user("x")], [say("y")], at=3, rollout="r2")
    run.open(tmp_path)
    parser = argparse.ArgumentParser()
    cmd_tree.add_parser(parser.add_subparsers())
    args = parser.parse_args(["tree", "--data", str(tmp_path), "--rollout", "r1"])
    assert args.func(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("rollout r1: 4 call(s), 2 agent(s), depth 1")
    assert out[1].startswith("a  [main]  big-model  anthropic_messages  in 100 out 10  complete")
    assert out[1].endswith("-> Agent")
    assert (
        out[2].startswith("├─ spawns (header)  t  [side:t]  small-model")
        and "{side call}" in out[2]
    )
    assert out[3].startswith("├─ spawns (header)  s  [ag1]")
    assert out[4].startswith("continues (hash_chain)  b  [main]")
    assert len(out) == 5


def test_forge_tree_lists_the_rollouts_when_it_cannot_tell_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Run()
    run.call("a", [user("x")], [say("y")], at=0, rollout="r1")
    run.call("b", [user("x")], [say("y")], at=1, rollout="r2")
    run.open(tmp_path)
    parser = argparse.ArgumentParser()
    cmd_tree.add_parser(parser.add_subparsers())
    for argv in (["--data", str(tmp_path)], ["--data", str(tmp_path), "--rollout", "nope"]):
        args = parser.parse_args(["tree", *argv])
        assert args.func(args) == 2
        err = capsys.readouterr().err
        assert "r1" in err and "r2" in err


def test_render_tree_keeps_a_long_conversation_in_one_column() -> None:
    def node(i: int) -> cmd_tree.Node:
        return cmd_tree.Node(
            call_id=f"c{i}",
            parent_call_id=f"c{i - 1}" if i else None,
            edge_kind="continues" if i else None,
            evidence="hash_chain" if i else None,
            depth=i,
            agent_key="main",
            is_side_call=False,
            is_prewarm=False,
            model="m",
            api="openai_chat",
            input_tokens=1,
            output_tokens=1,
            cache_read_tokens=None,
            cache_write_tokens=None,
            usage_estimated=False,
            status="complete",
            error=None,
            tool_calls=None,
            started_at=None,
            duration_ms=None,
        )

    lines = cmd_tree.render_tree([node(i) for i in range(2000)])
    assert len(lines) == 2000 and all(not line.startswith((" ", "│", "├", "└")) for line in lines)


def test_a_compaction_restarting_from_the_first_request_is_no_retry(tmp_path: Path) -> None:
    # Codex-style: the compacted chain re-sends the first request's items, then a summary.
    run = Run()
    first = [SYSTEM, user("go")]
    run.call("a", first, [tool_use("t1")], at=0, **codex("th"))
    run.call(
        "b", first + [tool_use("t1"), tool_result("t1")], [say("step done")], at=1, **codex("th")
    )
    run.call(
        "c",
        first + [user("Summary of the work so far: step done.")],
        [tool_use("t2")],
        at=2,
        **codex("th"),
    )
    con = run.open(tmp_path)
    assert parents(con)["c"] == ("b", "compacts", "header")


def test_a_sub_agent_first_call_failing_twice_gives_each_retry_one_edge(tmp_path: Path) -> None:
    run = Run()
    main = [SYSTEM, user("use a sub-agent")]
    run.call("a", main, [tool_use("t1", "Agent")], at=0, **claude())
    sub = [user("write hello.txt")]
    run.call("f1", sub, None, at=1, status="error", error="HTTP 529", **claude("ag1"))
    run.call("f2", sub, None, at=2, status="error", error="HTTP 529", **claude("ag1"))
    run.call("s1", sub, [say("written")], at=3, **claude("ag1"))
    con = run.open(tmp_path)
    assert parents(con) == {
        "f1": ("a", "spawns", "header"),
        "f2": ("a", "spawns", "header"),
        "s1": ("a", "spawns", "header"),
    }
    assert_clean(con)
