"""A GUI agent's loop through a real mitmdump: Anthropic computer use and Chat screenshots,
each screenshot stored once, every request rebuilt exactly, the actions on each call."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from bench.gui import COMPUTER_TOOL, screenshot
from mitm_addon.launch import stop_proxy_process
from pipeline.images import image_hash
from pipeline.store import connect
from tests.e2e.test_record_sdks import assert_recorded_as_received, calls
from tests.support.forge_proxy import anthropic_client, openai_client
from tests.support.upstream import ScriptedUpstream

STEPS, KEEP = 8, 3
W, H = 256, 192
TASK = "Type Ada into the name field and submit the form."
COMPUTER_SCRIPT = [
    {"tool_call": {"name": "computer", "arguments": {"action": "left_click", "coordinate": [420, 300]}}},
    {"tool_call": {"name": "computer", "arguments": {"action": "type", "text": "Ada"}}},
    {"tool_call": {"name": "computer", "arguments": {"action": "scroll", "coordinate": [9, 9],
                                                     "scroll_direction": "down", "scroll_amount": 2}}},
    {"tool_call": {"name": "computer", "arguments": {"action": "key", "text": "Return"}}},
    {"tool_call": {"name": "computer", "arguments": {"action": "screenshot"}}},
]  # fmt: skip
COMPUTER_KINDS = ["click", "type", "scroll", "key", "screenshot"]
BROWSER_TOOLS = ["browser_navigate", "browser_click", "browser_type", "browser_press_key"]
BROWSER_KINDS = ["navigate", "click", "type", "key"]


@pytest.fixture
def upstream(request: pytest.FixtureRequest) -> Any:
    script = (
        COMPUTER_SCRIPT
        if "anthropic" in request.node.name
        else [
            {"tool_call": {"name": name, "arguments": {"target": "form"}}} for name in BROWSER_TOOLS
        ]
    )
    with ScriptedUpstream(script) as up:
        yield up


def only_recent_images(messages: list[dict[str, Any]], keep: int) -> tuple[list[Any], list[bytes]]:
    """The messages with every image but the last ``keep`` replaced by a text block (as
    Anthropic's reference computer-use loop trims them), and the images left, in order."""
    out = copy.deepcopy(messages)
    slots: list[tuple[list[Any], int]] = []

    def visit(content: Any) -> None:
        if not isinstance(content, list):
            return
        for i, block in enumerate(content):
            if block.get("type") in ("image", "image_url"):
                slots.append((content, i))
            visit(block.get("content"))

    for m in out:
        visit(m.get("content"))
    kept = []
    for n, (content, i) in enumerate(slots):
        if n < len(slots) - keep:
            content[i] = {"type": "text", "text": "[screenshot omitted]"}
        else:
            kept.append(_png_of(content[i]))
    return out, kept


def _png_of(block: dict[str, Any]) -> bytes:
    if block["type"] == "image":
        return base64.b64decode(block["source"]["data"])
    return base64.b64decode(block["image_url"]["url"].split(",", 1)[1])


def anthropic_image(png: bytes) -> dict[str, Any]:
    data = base64.b64encode(png).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def chat_image(png: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def run_anthropic_computer_use(client: Any, stream: bool) -> list[list[bytes]]:
    """The loop; returns the screenshots each call carried."""
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": TASK}, anthropic_image(screenshot(0, W, H))],
        }
    ]
    carried = []
    for step in range(1, STEPS + 1):
        sent, images = only_recent_images(messages, KEEP)
        carried.append(images)
        kwargs = dict(model="claude-sonnet-4-5", max_tokens=512, tools=[COMPUTER_TOOL],
                      messages=sent, betas=["computer-use-2025-01-24"])  # fmt: skip
        if stream:
            with client.beta.messages.stream(**kwargs) as s:
                reply = s.get_final_message()
        else:
            reply = client.beta.messages.create(**kwargs)
        (use,) = [b for b in reply.content if b.type == "tool_use"]
        assert use.name == "computer"
        messages.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in reply.content],
            }
        )
        result = {
            "type": "tool_result",
            "tool_use_id": use.id,
            "content": [anthropic_image(screenshot(step, W, H))],
        }
        messages.append({"role": "user", "content": [result]})
    return carried


def run_chat_browser_tools(client: Any, stream: bool) -> list[list[bytes]]:
    tools = [
        {"type": "function", "function": {"name": n, "description": "A browser action.",
                                          "parameters": {"type": "object", "properties": {}}}}
        for n in BROWSER_TOOLS
    ]  # fmt: skip
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": TASK}, chat_image(screenshot(0, W, H))],
        }
    ]
    carried = []
    for step in range(1, STEPS + 1):
        sent, images = only_recent_images(messages, KEEP)
        carried.append(images)
        if stream:
            with client.chat.completions.stream(model="gpt-4.1", messages=sent, tools=tools) as s:
                message = s.get_final_completion().choices[0].message
        else:
            message = (
                client.chat.completions.create(model="gpt-4.1", messages=sent, tools=tools)
                .choices[0]
                .message
            )
        (call,) = message.tool_calls
        messages.append(
            {"role": "assistant", "content": message.content, "tool_calls": [call.model_dump()]}
        )
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "ok"})
        messages.append({"role": "user", "content": [{"type": "text", "text": "Current screenshot:"},
                                                     chat_image(screenshot(step, W, H))]})  # fmt: skip
    return carried


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("api", ["anthropic", "chat"])
def test_a_gui_agent_loop_stores_each_screenshot_once_and_every_request_exactly(
    recording: Any, api: str, stream: bool
) -> None:
    if api == "anthropic":
        with anthropic_client(recording.proxy) as client:
            carried = run_anthropic_computer_use(client, stream)
        kinds = [COMPUTER_KINDS[min(i, len(COMPUTER_KINDS) - 1)] for i in range(STEPS)]
    else:
        with openai_client(recording.proxy) as client:
            carried = run_chat_browser_tools(client, stream)
        kinds = [
            BROWSER_KINDS[min(i, len(BROWSER_KINDS) - 1)] for i in range(STEPS)
        ]  # the last turn repeats
    stop_proxy_process(recording.proxy.process)

    assert_recorded_as_received(recording.out, recording.upstream)  # base64 and all
    rows = calls(recording.out)
    assert [r["status"] for r in rows] == ["complete"] * STEPS
    assert [r["request_images"] for r in rows] == [[image_hash(p) for p in c] for c in carried]
    assert [r["actions"] for r in rows] == [[k] for k in kinds]
    sent = {p: None for c in carried for p in c}
    assert sum(map(len, carried)) == 1 + 2 + KEEP * (STEPS - 2)
    con = connect(recording.out)
    stored = con.execute(
        "SELECT hash, bytes, width, height, data FROM images ORDER BY first_call_id"
    ).fetchall()
    assert sorted(h for h, *_ in stored) == sorted(image_hash(p) for p in sent)  # each once
    assert all((n, w, h, d) == (len(d), W, H, d) for _, n, w, h, d in stored)
    (biggest,) = con.execute(
        "SELECT max(content_bytes) FROM messages WHERE kind = 'item'"
    ).fetchone()
    assert biggest < 2000  # the conversation items hold references, not base64
