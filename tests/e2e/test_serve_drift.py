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

from tests.support.serve_runs import HARNESS_RUNS, TURNS, assert_one_agent_served_exactly

pytestmark = [pytest.mark.slow, pytest.mark.harness]


def served(name: str, tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]) -> Any:
    run = HARNESS_RUNS[name]
    reason = run.unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} cannot run: {reason}")
        pytest.skip(reason)
    return run.serve(tiny_models[0], tmp_path, confdir)


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
