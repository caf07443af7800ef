"""GUI actions read from each agent's output form into one vocabulary."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.actions import KINDS, gui_actions


def anthropic_computer(*actions: str) -> list[Any]:
    return [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Clicking the field."}]
            + [
                {"type": "tool_use", "id": f"toolu_{i}", "name": "computer", "input": {"action": a}}
                for i, a in enumerate(actions)
            ],
        }
    ]


def test_anthropic_computer_use_actions() -> None:
    out = anthropic_computer(
        "left_click", "double_click", "type", "key", "scroll", "mouse_move",
        "left_click_drag", "screenshot", "wait", "zoom",
    )  # fmt: skip
    assert gui_actions(out) == [
        "click", "click", "type", "key", "scroll", "move", "drag", "screenshot", "wait", "other",
    ]  # fmt: skip


def test_openai_computer_calls_single_and_batched() -> None:
    out = [
        {"type": "reasoning", "summary": []},
        {"type": "computer_call", "call_id": "c1", "action": {"type": "click", "x": 1, "y": 2}},
        {
            "type": "computer_call",
            "call_id": "c2",
            "actions": [{"type": "type", "text": "Ada"}, {"type": "keypress", "keys": ["ENTER"]}],
        },
        {"type": "computer_call", "call_id": "c3", "action": {"type": "teleport"}},
    ]
    assert gui_actions(out) == ["click", "type", "key", "other"]


def test_browser_tools_by_name_in_every_api() -> None:
    chat = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "browser_navigate", "arguments": "{}"}},
                {"id": "2", "type": "function", "function": {"name": "browser_click", "arguments": "{}"}},
                {"id": "3", "type": "function", "function": {"name": "shell", "arguments": "{}"}},
            ],
        }
    ]  # fmt: skip
    responses = [{"type": "function_call", "name": "browser_type", "arguments": "{}"}]
    anthropic = [
        {"role": "assistant", "content": [{"type": "tool_use", "name": "Bash", "input": {}},
                                          {"type": "tool_use", "name": "browser_press_key", "input": {}}]}
    ]  # fmt: skip
    assert gui_actions(chat) == ["navigate", "click"]  # shell is a tool call, not a GUI action
    assert gui_actions(responses) == ["type"]
    assert gui_actions(anthropic) == ["key"]


def test_browser_use_json_replies() -> None:
    reply = {
        "thinking": "fill the name",
        "evaluation_previous_goal": "Success",
        "memory": "",
        "next_goal": "submit",
        "action": [
            {"input": {"index": 2, "text": "Ada", "clear": True}},
            {"click": {"index": 20}},
            {"navigate": {"url": "http://127.0.0.1/x", "new_tab": False}},
            {"scroll": {"down": True, "pages": 1}},
            {"done": {"text": "ok", "success": True}},
            {"write_file": {"file_name": "a", "content": ""}},
        ],
    }
    chat = [{"role": "assistant", "content": json.dumps(reply)}]
    responses = [{"type": "message", "role": "assistant",
                  "content": [{"type": "output_text", "text": json.dumps(reply)}]}]  # fmt: skip
    expected = ["type", "click", "navigate", "scroll", "done", "other"]
    assert gui_actions(chat) == expected
    assert gui_actions(responses) == expected


@pytest.mark.parametrize(
    "out",
    [
        [{"role": "assistant", "content": "Done."}],
        [{"role": "assistant", "content": "{not json"}],
        [{"role": "assistant", "content": '{"action": "click"}'}],
        [{"type": "function_call", "name": "exec_command", "arguments": "{}"}],
        [],
    ],
)
def test_outputs_without_gui_actions_have_none(out: list[Any]) -> None:
    assert gui_actions(out) == []


def test_every_kind_read_is_in_the_vocabulary() -> None:
    from pipeline import actions

    tables = (actions._COMPUTER_TOOL, actions._COMPUTER_CALL, actions._BROWSER_TOOLS)
    assert {k for t in tables for k in t.values()} | {"other"} == set(KINDS)
