"""Behaviour views: tool coverage, self-verification, plan completion, error recovery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.shards import write_shard
from pipeline.store import connect, sql_text
from tests.pipeline.runs import Agent, Step, reward_row, rollout_row, write_agents

OBJ: dict[str, Any] = {"type": "object"}


def todos(*statuses: str) -> dict[str, Any]:
    return {"todos": [{"content": f"step {i}", "status": s} for i, s in enumerate(statuses)]}


def claude_like() -> Agent:
    """Plans, fails an edit, fixes it with other arguments, runs the tests, updates the plan."""
    return Agent(
        "anthropic_messages", "claude-1", "sys", "Fix the bug.",
        [("Bash", "", OBJ), ("Edit", "", OBJ), ("TodoWrite", "", OBJ), ("Read", "", OBJ)],
        [
            Step(calls=[("TodoWrite", todos("pending", "pending", "pending"))],
                 results=[("ok", False)]),
            Step(calls=[("Edit", {"file_path": "a.py", "old_string": "x", "new_string": "y"})],
                 results=[("<tool_use_error>String not found</tool_use_error>", True)]),
            Step(calls=[("Edit", {"file_path": "a.py", "old_string": "z", "new_string": "y"})],
                 results=[("The file a.py has been updated.", False)]),
            Step(calls=[("Bash", {"command": "pytest -q"})], results=[("3 passed", False)]),
            Step(calls=[("TodoWrite", todos("completed", "completed", "pending"))],
                 results=[("ok", False)]),
            Step(text="Fixed."),
        ],
        move_cache_control=True,
    )  # fmt: skip


def codex_like() -> Agent:
    """A build fails, the same command is run again and passes: no recovery by another action."""
    return Agent(
        "openai_responses", "codex-1", "sys", "Build it.",
        [("shell", "", OBJ), ("update_plan", "", OBJ)],
        [
            Step(calls=[("shell", {"command": ["bash", "-lc", "make"]})],
                 results=[("Exit code: 2\nWall time: 1s\nOutput:\nmake: *** Error 1", False)]),
            Step(calls=[("shell", {"command": ["bash", "-lc", "make"]})],
                 results=[("Exit code: 0\nWall time: 1s", False)]),
            Step(text="Built."),
        ],
        previous_response_id=True,
    )  # fmt: skip


def toy_like() -> Agent:
    """Checks first, edits last: not verified."""
    return Agent(
        "openai_chat", "toy-1", "sys", "Write hello.txt.",
        [("shell", "", OBJ), ("consult", "", OBJ)],
        [
            Step(calls=[("shell", {"command": "ls"})], results=[("", False)]),
            Step(calls=[("shell", {"command": "echo hi > hello.txt"})], results=[("", False)]),
            Step(text="Done."),
        ],
    )  # fmt: skip


@pytest.fixture
def studied(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    write_agents(tmp_path, [(claude_like(), 0), (codex_like(), 100), (toy_like(), 200)])
    write_shard(
        tmp_path,
        "rollouts",
        "rollouts",
        [rollout_row("claude-1", "t", harness="claude"),
         rollout_row("codex-1", "t", harness="codex"),
         rollout_row("toy-1", "t", harness="toy")],
    )  # fmt: skip
    write_shard(tmp_path, "rewards", "rewards", [reward_row("claude-1", 1.0)])
    return connect(tmp_path)


def behaviour(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    rows = con.sql("SELECT * FROM behaviour").to_arrow_table().to_pylist()
    return {r["rollout_id"]: r for r in rows}


def test_tool_coverage_is_tools_used_over_tools_offered(studied: duckdb.DuckDBPyConnection) -> None:
    b = behaviour(studied)
    assert (b["claude-1"]["n_tools_used"], b["claude-1"]["n_tools_offered"]) == (3, 4)
    assert b["claude-1"]["tool_coverage"] == 0.75 and b["claude-1"]["unused_tools"] == ["Read"]
    assert b["codex-1"]["tool_coverage"] == 0.5 and b["toy-1"]["tool_coverage"] == 0.5


def test_self_verification_needs_a_check_after_the_last_edit(
    studied: duckdb.DuckDBPyConnection,
) -> None:
    b = behaviour(studied)
    assert b["claude-1"]["self_verified"] is True and b["claude-1"]["n_edits"] == 1
    assert b["toy-1"]["self_verified"] is False, "ls came before the edit"
    assert b["codex-1"]["self_verified"] is None, "no edits"


def test_plan_completion_reads_the_last_plan(studied: duckdb.DuckDBPyConnection) -> None:
    b = behaviour(studied)
    assert (b["claude-1"]["plan_steps"], b["claude-1"]["plan_steps_completed"]) == (3, 2)
    assert b["claude-1"]["plan_completion"] == pytest.approx(2 / 3)
    assert b["codex-1"]["plan_completion"] is None


def test_error_recovery_needs_a_different_successful_action(
    studied: duckdb.DuckDBPyConnection,
) -> None:
    b = behaviour(studied)
    assert (b["claude-1"]["n_failed_results"], b["claude-1"]["n_recovered"]) == (1, 1)
    assert b["claude-1"]["error_recovery"] == 1.0
    assert (b["codex-1"]["n_failed_results"], b["codex-1"]["n_recovered"]) == (1, 0)
    assert b["codex-1"]["error_recovery"] == 0.0
    assert b["toy-1"]["error_recovery"] is None


def test_re_sent_items_do_not_count_twice(studied: duckdb.DuckDBPyConnection) -> None:
    # Claude Code's moving cache_control gives re-sent items new hashes.
    copies = studied.sql(
        "SELECT count(*) FROM rollout_items WHERE role = 'assistant' AND content_json LIKE "
        "'%toolu_c0_0%'"
    ).fetchall()
    assert copies == [(2,)], "the fixture re-sends a changed copy of the first tool call"
    n = studied.sql(
        "SELECT kind, count(*) FROM tool_events WHERE rollout_id = 'claude-1' GROUP BY ALL"
    ).fetchall()
    assert dict(n) == {"call": 5, "result": 5}
    assert behaviour(studied)["claude-1"]["n_tool_calls"] == 5


@pytest.mark.parametrize("api", ["anthropic_messages", "openai_chat", "openai_responses"])
def test_tool_events_read_every_api_format(tmp_path: Path, api: str) -> None:
    agent = Agent(
        api, "r1", "sys", "go", [("shell", "", OBJ), ("apply_patch", "", OBJ)],
        [
            Step(calls=[("shell", {"command": "pytest"}), ("apply_patch", {"input": "x"})],
                 results=[("Exit code: 1", True), ("Done", False)]),
            Step(text="ok"),
        ],
    )  # fmt: skip
    write_agents(tmp_path, [(agent, 0)])
    rows = (
        connect(tmp_path)
        .sql("SELECT kind, tool_name, action, failed FROM tool_events ORDER BY seq")
        .fetchall()
    )
    assert rows == [
        ("call", "shell", "check", None),
        ("call", "apply_patch", "edit", None),
        ("result", "shell", "check", True),
        ("result", "apply_patch", "edit", False),
    ]


def test_the_summary_aggregates_per_harness_and_model(studied: duckdb.DuckDBPyConnection) -> None:
    rows = studied.sql(
        "SELECT harness, model, n_trajectories, mean_tool_coverage, self_verification_rate, "
        "mean_plan_completion, error_recovery, mean_reward FROM behaviour_summary"
    ).fetchall()
    by = {r[0]: r for r in rows}
    assert by["claude"][1:] == ("policy-1", 1, 0.75, 1.0, pytest.approx(2 / 3), 1.0, 1.0)
    assert by["codex"][4:7] == (None, None, 0.0)
    assert by["toy"][4] == 0.0


def test_gui_actions_are_counted_per_rollout_and_a_text_agent_has_none(tmp_path: Path) -> None:
    """The computer-use rollout of the viewer's run: 4 calls, one action each (click,
    type, scroll, key); the computer tool counts as a tool call too."""
    from tests.forge_cli.view_runs import write_gui_rollout

    write_gui_rollout(tmp_path)
    write_agents(tmp_path, [(toy_like(), 200)])
    b = behaviour(connect(tmp_path))
    gui = b["gui-r"]
    assert (gui["n_gui_actions"], gui["n_clicks"], gui["n_typed"], gui["n_scrolls"],
            gui["n_navigations"]) == (4, 1, 1, 1, 0)  # fmt: skip
    assert (gui["n_tool_calls"], gui["tool_coverage"]) == (4, 1.0)
    assert (b["toy-1"]["n_gui_actions"], b["toy-1"]["n_clicks"]) == (0, 0)


@pytest.fixture(scope="module")
def macros() -> duckdb.DuckDBPyConnection:
    """A bare connection with the behaviour macros (they read no table)."""
    con = duckdb.connect()
    for name in ("341_forge_shell_action", "342_forge_tool_action", "343_forge_tool_failed"):
        con.execute(sql_text(name))
    return con


@pytest.mark.parametrize(
    ("name", "arguments", "action"),
    [
        ("Bash", '{"command":"npm test 2>&1 | tail"}', "check"),
        ("Bash", '{"command":"cat > a.py <<EOF"}', "edit"),
        ("exec_command", '{"cmd":"git diff"}', "check"),
        ("shell", '{"command":["bash","-lc","ls 2>/dev/null"]}', "check"),
        ("shell", '{"command":["bash","-lc","sed -i s/a/b/ f.py"]}', "edit"),
        ("shell", '{"command":["bash","-lc","echo hi"]}', "other"),
        ("str_replace_based_edit_tool", '{"command":"view","path":"a"}', "check"),
        ("str_replace_based_edit_tool", '{"command":"str_replace","path":"a"}', "edit"),
        ("update_plan", '{"plan":[]}', "plan"),
        ("WebFetch", "{}", "other"),
    ],
)
def test_tool_actions(
    macros: duckdb.DuckDBPyConnection, name: str, arguments: str, action: str
) -> None:
    got = macros.sql("SELECT forge_tool_action($n, $a)", params={"n": name, "a": arguments})
    assert got.fetchall() == [(action,)]


@pytest.mark.parametrize(
    ("output", "failed"),
    [
        ('{"output":"","metadata":{"exit_code":1,"duration_seconds":0.1}}', True),
        ('{"output":"ok","metadata":{"exit_code":0}}', False),
        ("Process exited with code 127\ncommand not found", True),
        ("Traceback (most recent call last):\n  File", True),
        ("error: could not compile", True),
        ("no errors found", False),
    ],
)
def test_tool_failures(macros: duckdb.DuckDBPyConnection, output: str, failed: bool) -> None:
    got = macros.sql("SELECT forge_tool_failed(NULL, $o)", params={"o": output}).fetchall()
    assert got == [(failed,)]
