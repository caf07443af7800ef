"""Serve mode over many tool turns, per harness: the exact drift class of every call, and
every earlier completion inside each later prompt as the ids the policy sampled.

Each harness runs unmodified under ``forge record --mode serve``, answered by a tiny
policy scripted to call that harness's shell tool on every turn, so the harness keeps
calling the tool until its turn limit (Claude Code, the toy harness, the SDK agent) or
until the test stops it (Codex has no turn limit). The runs are
``tests/support/serve_runs.py``'s, which ``bench/bench_serve.py`` measures too;
docs/harnesses.md carries the table.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pipeline.store import audits, connect
from tests.support.serve_runs import (
    HARNESS_RUNS,
    TURNS,
    assert_one_agent_served_exactly,
    claude_compaction,
    claude_sub_agents,
    codex_spawned_agents,
)

pytestmark = [pytest.mark.slow, pytest.mark.harness]


def require(name: str) -> None:
    """Skip a test whose harness cannot run here; with CI=true, fail it."""
    reason = HARNESS_RUNS[name].unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} cannot run: {reason}")
        pytest.skip(reason)


def served(name: str, tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]) -> Any:
    require(name)
    return HARNESS_RUNS[name].serve(tiny_models[0], tmp_path, confdir)


def test_claude_code_tool_turns_are_one_clean_chain(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    got = served("claude-code", tmp_path, confdir, tiny_models)
    assert got.code == 1 and f"Reached max turns ({TURNS})" in got.output, got.output[-2000:]
    assert {c["api"] for c in got.calls} == {"anthropic_messages"}
    assert_one_agent_served_exactly(got.calls, ["CLEAN"] * TURNS)
    assert (tmp_path / "work" / "out.txt").read_text() == "hi\n" * TURNS


def test_codex_over_http_tool_turns_are_one_clean_chain(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    got = served("codex-http", tmp_path, confdir, tiny_models)
    assert {(c["api"], c["transport"]) for c in got.calls} == {("openai_responses", "sse")}
    assert_one_agent_served_exactly(got.calls, ["CLEAN"] * TURNS)


def test_claude_code_sub_agents_each_start_their_own_chain_and_train_once(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    """Every turn delegates to a sub-agent (Agent tool). The main agent's calls are one
    CLEAN chain; each sub-agent's first call starts a chain of its own (CLEAN, no
    parent); and each completion is in exactly one token sequence (the audits)."""
    require("claude-code")
    got = claude_sub_agents(tiny_models[0], tmp_path, confdir)
    done = [c for c in got.calls if c["status"] == "complete"]  # the kill cuts some off
    agents: dict[str | None, list[dict[str, Any]]] = {}
    for c in done:
        agents.setdefault(c["claude_agent_id"], []).append(c)
    main = agents.pop(None)
    assert [c["tool_calls"] for c in main] == [["Agent"]] * 3
    assert_one_agent_served_exactly(main, ["CLEAN"] * 3)
    assert len(agents) >= 2, {k: len(v) for k, v in agents.items()}
    for calls in agents.values():
        assert_one_agent_served_exactly(calls, ["CLEAN"] * len(calls))
    sequences = trains_each_completion_once(tmp_path / "run", done)
    assert [c["call_id"] for c in main] in sequences  # the main chain trains as one


def trains_each_completion_once(run: Path, done: list[dict[str, Any]]) -> list[list[str]]:
    """The run's audits pass and each call is in exactly one token sequence; the
    sequences' call ids."""
    con = connect(run)
    assert {k: v for k, v in audits(con).items() if v} == {}
    sequences = [ids for (ids,) in con.execute("SELECT call_ids FROM token_sequences").fetchall()]
    assert sorted(c for ids in sequences for c in ids) == sorted(c["call_id"] for c in done)
    return sequences


def test_a_codex_spawned_agent_forks_under_its_own_tools_then_stays_clean(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    """Every turn spawns an agent (spawn_agent, Codex's collaboration namespace). The
    spawned thread inherits its parent's turns but not its collaboration tools, so its
    first prompt renders that history under another tool list: a FORK, starting its own
    chain; its continuations are CLEAN, the root's chain too, each completion trained
    once."""
    require("codex-websocket")
    got = codex_spawned_agents(tiny_models[0], tmp_path, confdir)
    done = [c for c in got.calls if c["status"] == "complete"]
    threads: dict[str, list[dict[str, Any]]] = {}
    for c in done:
        if not c["prewarm"]:  # each thread's socket opens with a warm-up, never sampled
            threads.setdefault(c["codex_thread_id"], []).append(c)
    [root] = [t for t, calls in threads.items() if calls[0]["openai_subagent"] is None]
    main = threads.pop(root)
    assert all(c["tool_calls"] == ["spawn_agent"] and "collaboration" in c["tools"] for c in main)
    assert_one_agent_served_exactly(main, ["CLEAN"] * len(main))
    assert threads and len(main) >= 2
    for calls in threads.values():
        assert {c["openai_subagent"] for c in calls} == {"collab_spawn"}
        assert not any("collaboration" in c["tools"] for c in calls)
        assert_one_agent_served_exactly(calls, ["FORK"] + ["CLEAN"] * (len(calls) - 1))
    trains_each_completion_once(tmp_path / "run", [c for c in done if not c["prewarm"]])


def test_a_claude_code_compaction_starts_a_new_chain_linked_by_a_compacts_edge(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    """A turn, /compact, a turn after it. The summary requests continue the first call
    (CLEAN); the call after the compaction holds no earlier assistant turn, only the
    summary as context, so it starts a chain of its own, stored whole (CLEAN, no
    parent: nothing in it is re-tokenised); the pipeline links it to the summary call
    with a compacts edge, and each completion is trained once."""
    require("claude-code")
    got = claude_compaction(tiny_models[0], tmp_path, confdir)
    assert got.code == 0, got.output[-2000:]
    first, *summaries, after = got.calls
    assert summaries, "no summary request"
    assert [c["status"] for c in got.calls] == ["complete"] * len(got.calls)
    assert (first["drift"], first["prompt_parent_call_id"]) == ("CLEAN", None)
    for c in summaries:
        assert (c["drift"], c["prompt_parent_call_id"]) == ("CLEAN", first["call_id"])
    assert (after["drift"], after["prompt_parent_call_id"]) == ("CLEAN", None)
    con = connect(tmp_path / "run")
    edges = con.execute("SELECT parent_call_id, child_call_id FROM edges WHERE kind = 'compacts'")
    [(summary, child)] = edges.fetchall()
    assert child == after["call_id"] and summary in {c["call_id"] for c in summaries}
    trains_each_completion_once(tmp_path / "run", got.calls)


def test_codex_over_its_websocket_is_served_and_its_tool_turns_are_one_clean_chain(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    """Codex's built-in provider speaks the Responses API over a WebSocket: each
    response.create on it is answered by the policy, none refused or sent on."""
    got = served("codex-websocket", tmp_path, confdir, tiny_models)
    assert {(c["api"], c["transport"]) for c in got.calls} == {("openai_responses", "websocket")}
    assert_one_agent_served_exactly(got.calls, ["CLEAN"] * TURNS)


def test_the_toy_harness_drops_reasoning_so_its_continuations_realign(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    got = served("toy", tmp_path, confdir, tiny_models)
    assert got.code == 3 and "toy: out of turns" in got.output, got.output[-2000:]
    assert_one_agent_served_exactly(got.calls, ["CLEAN"] + ["REALIGN"] * (TURNS - 1))


def test_an_anthropic_sdk_agent_tool_turns_are_one_clean_chain(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    got = served("anthropic-sdk", tmp_path, confdir, tiny_models)
    assert_one_agent_served_exactly(got.calls, ["CLEAN"] * TURNS)


def test_opencode_tool_turns_are_one_clean_chain(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    got = served("opencode", tmp_path, confdir, tiny_models)
    assert {c["api"] for c in got.calls} == {"anthropic_messages"}
    assert_one_agent_served_exactly(got.calls, ["CLEAN"] * TURNS)


def test_openclaw_drops_its_internal_context_each_turn_and_every_completion_is_spliced(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    """OpenClaw ends each request with an internal-context message it drops from the
    next (pipeline/volatile.py): TRIM, each earlier completion still spliced as sampled."""
    got = served("openclaw", tmp_path, confdir, tiny_models)
    assert {c["api"] for c in got.calls} == {"anthropic_messages"}
    assert_one_agent_served_exactly(got.calls, ["CLEAN"] + ["TRIM"] * (TURNS - 1))
