"""A run directory for ``forge view`` tests, recorded with the real recorder
(``tests.pipeline.runs``): a Claude Code-like rollout with a sub-agent and a side call,
a Codex-like one on the Responses API, a Chat one and a computer-use one with screenshots;
two of them share a task and have rewards, so GRPO gives them an advantage. One tool
result holds live markup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.shards import write_shard
from tests.pipeline.runs import Agent, Step, reward_row, rollout_row, write_agents

OBJ: dict[str, Any] = {"type": "object"}
# If the page ever parsed recorded text as HTML, this would set window.__forgePwned.
HOSTILE = '<script>window.__forgePwned = 1</script><img src=x onerror="window.__forgePwned = 2">'
SESSION = {"x-claude-code-session-id": "sess-1"}


def claude_main() -> Agent:
    return Agent(
        "anthropic_messages", "claude-r", "You are Claude Code.", "Fix the failing test.",
        [("Agent", "Launch a sub-agent", OBJ), ("Bash", "Run a command", OBJ)],
        [
            Step(text="I will ask a sub-agent to look.", reasoning="Delegate the search.",
                 calls=[("Agent", {"prompt": "Find the failing test."})],
                 results=[("test_a fails", False)]),
            Step(calls=[("Bash", {"command": "cat page.html"})], results=[(HOSTILE, False)]),
            Step(text="Fixed the test."),
        ],
        model="claude-big", headers=dict(SESSION), move_cache_control=True, call_prefix="m",
    )  # fmt: skip


def claude_sub_agent() -> Agent:
    return Agent(
        "anthropic_messages", "claude-r", "You are a sub-agent.", "Find the failing test.",
        [("Bash", "Run a command", OBJ)],
        [
            Step(calls=[("Bash", {"command": "pytest -q"})], results=[("1 failed", True)]),
            Step(text="test_a fails"),
        ],
        model="claude-big", call_prefix="s", spacing_s=0.2,
        headers={**SESSION, "x-claude-code-agent-id": "agent-7",
                 "x-claude-code-parent-agent-id": "sess-1"},
    )  # fmt: skip


def claude_title() -> Agent:
    """A side call: a small model, no tools, naming the session."""
    return Agent(
        "anthropic_messages", "claude-r", "Write a 5-word title.", "Fix the failing test.",
        [], [Step(text="Fixing a failing test")],
        model="claude-small", headers=dict(SESSION), call_prefix="t",
    )  # fmt: skip


def codex() -> Agent:
    return Agent(
        "openai_responses", "codex-r", "You are Codex.", "Fix the failing test.",
        [("shell", "Run a command", OBJ)],
        [
            Step(reasoning="Run the tests.", calls=[("shell", {"command": ["pytest"]})],
                 results=[("Exit code: 1", False)]),
            Step(text="Done."),
        ],
        model="gpt-5-codex", previous_response_id=True, call_prefix="c",
    )  # fmt: skip


def chat() -> Agent:
    return Agent(
        "openai_chat", "chat-r", "You are a toy agent.", "Write hello.txt.",
        [("shell", "Run a command", OBJ)],
        [
            Step(calls=[("shell", {"command": "echo hi > hello.txt"})], results=[("", False)]),
            Step(text="Done."),
        ],
        model="gpt-4.1-mini", call_prefix="h",
    )  # fmt: skip


GUI_STEPS, GUI_KEEP, GUI_SIZE = 4, 2, (320, 240)


def write_gui_rollout(root: Path, rollout_id: str = "gui-r") -> list[list[bytes]]:
    """A computer-use rollout (``bench.gui``: 4 calls re-sending their last 2 screenshots),
    recorded with the real recorder; returns the screenshots each call carried."""
    from bench.bench_gui_storage import gui_capture
    from bench.gui import body_bytes, computer_use_calls
    from mitm_addon.recorder import build_rows

    seen: set[str] = set()
    tables: dict[str, list[dict[str, Any]]] = {"calls": [], "messages": [], "images": []}
    carried = []
    calls = computer_use_calls(GUI_STEPS, GUI_KEEP, *GUI_SIZE)
    for i, (request, response, images) in enumerate(calls):
        capture = gui_capture(i, body_bytes(request), body_bytes(response), rollout_id, 1.79e9)
        rows = build_rows(capture, lambda _: None)
        tables["calls"].append(rows.call)
        for table, new in (("messages", rows.messages), ("images", rows.images)):
            for row in new:
                if row["hash"] not in seen:
                    seen.add(row["hash"])
                    tables[table].append(row)
        carried.append(images)
    for table, rows in tables.items():
        write_shard(root, table, f"{rollout_id}-{table}", rows)
    return carried


def write_view_run(root: Path) -> Path:
    """Write the run under ``root``; returns ``root``."""
    write_gui_rollout(root)
    write_agents(
        root,
        [(claude_main(), 0), (claude_title(), 0.3), (claude_sub_agent(), 0.5),
         (codex(), 100), (chat(), 200)],
    )  # fmt: skip
    write_shard(
        root,
        "rollouts",
        "rollouts",
        [rollout_row("claude-r", "fix-test", harness="claude"),
         rollout_row("codex-r", "fix-test", harness="codex"),
         rollout_row("chat-r", "hello", harness="toy"),
         rollout_row("gui-r", "sign-up", harness="computer-use")],
    )  # fmt: skip
    write_shard(
        root, "rewards", "rewards", [reward_row("claude-r", 1.0), reward_row("codex-r", 0.0)]
    )
    return root
