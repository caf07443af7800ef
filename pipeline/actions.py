"""The GUI actions a model's output takes, in one vocabulary whatever the agent.

A GUI agent acts through Anthropic's computer-use tool (a ``tool_use`` named
``computer`` whose ``input.action`` is ``left_click``, ``type``, ...), OpenAI's
computer-use calls (a ``computer_call`` item whose ``action.type`` is ``click``,
``keypress``, ...), or browser tools called by name (Playwright MCP's
``browser_click``; browser-use's ``click``, ``input``, ``navigate``, which it asks for
as JSON in the reply's text). ``gui_actions`` reads all of them into the kinds below,
so that the behaviour views count a GUI agent's actions as they count tool calls.
"""

from __future__ import annotations

import json
from typing import Any

# The kinds an action is read as.
KINDS = (
    "click",
    "type",
    "key",
    "scroll",
    "navigate",
    "move",
    "drag",
    "select",
    "screenshot",
    "wait",
    "done",
    "other",
)

# Anthropic's computer tool: input.action -> kind.
_COMPUTER_TOOL = {
    "left_click": "click",
    "right_click": "click",
    "middle_click": "click",
    "double_click": "click",
    "triple_click": "click",
    "left_click_drag": "drag",
    "left_mouse_down": "drag",
    "left_mouse_up": "drag",
    "mouse_move": "move",
    "type": "type",
    "key": "key",
    "hold_key": "key",
    "scroll": "scroll",
    "screenshot": "screenshot",
    "wait": "wait",
}
# OpenAI's computer_call: action.type -> kind.
_COMPUTER_CALL = {
    "click": "click",
    "double_click": "click",
    "drag": "drag",
    "keypress": "key",
    "move": "move",
    "screenshot": "screenshot",
    "scroll": "scroll",
    "type": "type",
    "wait": "wait",
}
# Browser tools by name (a "browser_" prefix dropped): Playwright MCP and browser-use.
_BROWSER_TOOLS = {
    "click": "click",
    "click_element": "click",
    "click_element_by_index": "click",
    "input": "type",
    "input_text": "type",
    "type": "type",
    "fill_form": "type",
    "send_keys": "key",
    "press_key": "key",
    "scroll": "scroll",
    "scroll_down": "scroll",
    "scroll_up": "scroll",
    "scroll_to_text": "scroll",
    "navigate": "navigate",
    "navigate_back": "navigate",
    "go_to_url": "navigate",
    "go_back": "navigate",
    "open_tab": "navigate",
    "switch_tab": "navigate",
    "switch": "navigate",
    "search": "navigate",
    "search_google": "navigate",
    "hover": "move",
    "drag": "drag",
    "drag_drop": "drag",
    "select_option": "select",
    "select_dropdown_option": "select",
    "select_dropdown": "select",
    "take_screenshot": "screenshot",
    "screenshot": "screenshot",
    "wait": "wait",
    "wait_for": "wait",
    "done": "done",
}


def _kind(table: dict[str, str], key: Any) -> str:
    return table.get(key, "other") if isinstance(key, str) else "other"


def _browser_tool(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    key = name.lower().removeprefix("browser_")
    return _BROWSER_TOOLS.get(key)


def _json_object(text: Any) -> Any:
    if not isinstance(text, str) or not text.lstrip().startswith("{"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _action_list(reply: Any) -> list[str]:
    """browser-use's reply form: a JSON object whose ``action`` is a list of one-key
    objects, each naming its action (``{"action": [{"click": {"index": 3}}]}``)."""
    if not isinstance(reply, dict) or not isinstance(reply.get("action"), list):
        return []
    out = []
    for step in reply["action"]:
        if isinstance(step, dict) and len(step) == 1:
            kind = _browser_tool(next(iter(step)))
            out.append(kind or "other")
    return out


def _from_part(part: dict[str, Any]) -> list[str]:
    """The actions of one content block or output item (not of what it contains)."""
    kind = part.get("type")
    if kind == "tool_use":
        name, args = part.get("name"), part.get("input")
        if name == "computer" and isinstance(args, dict):
            return [_kind(_COMPUTER_TOOL, args.get("action"))]
        found = _browser_tool(name)
        return [found] if found else []
    if kind == "computer_call":
        actions = part.get("actions")
        steps = actions if isinstance(actions, list) else [part.get("action")]
        return [
            _kind(_COMPUTER_CALL, s.get("type")) if isinstance(s, dict) else "other" for s in steps
        ]
    if kind == "function_call":
        found = _browser_tool(part.get("name"))
        return [found] if found else []
    if kind in ("text", "output_text"):
        return _action_list(_json_object(part.get("text")))
    if "function" in part and isinstance(part["function"], dict):  # a Chat tool call
        found = _browser_tool(part["function"].get("name"))
        return [found] if found else []
    return []


def gui_actions(output_items: list[Any]) -> list[str]:
    """The kinds of GUI action the output items take, in order."""
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, list):
            for e in v:
                walk(e)
        elif isinstance(v, dict):
            out.extend(_from_part(v))
            if v.get("role") == "assistant" and isinstance(v.get("content"), str):
                out.extend(_action_list(_json_object(v["content"])))  # Chat's text reply
            for key in ("content", "tool_calls"):
                if isinstance(v.get(key), list):
                    walk(v[key])

    walk(output_items)
    return out
