"""A GUI agent's traffic, synthesised: screenshots of a web form and the computer-use
loop that re-sends them.

``screenshot(step)`` draws the page a browser agent sees after ``step`` actions (a
header, a sidebar of links, a form whose name field fills one letter per step, the
mouse pointer where the last click went) as a PNG, deterministic for a step.
``computer_use_calls(steps, keep)`` is the Anthropic computer-use loop over those
pages: each call's request carries the task, every earlier action and its tool result,
with the screenshot kept in the last ``keep`` results only and dropped from older
ones (as Anthropic's reference loop does with ``only_n_most_recent_images``), so the
conversation is rewritten on every call; each response is one ``computer`` action.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

from PIL import Image, ImageDraw

WIDTH, HEIGHT = 1024, 768
MODEL = "claude-sonnet-4-5"
COMPUTER_TOOL = {
    "type": "computer_20250124",
    "name": "computer",
    "display_width_px": WIDTH,
    "display_height_px": HEIGHT,
}
TASK = "Open the sign-up form, type the name Ada Lovelace and submit it."
NAME = "Ada Lovelace"
# The actions the scripted model takes, in turn (Anthropic computer tool inputs).
ACTIONS: tuple[dict[str, Any], ...] = (
    {"action": "left_click", "coordinate": [420, 300]},
    {"action": "type", "text": "A"},
    {"action": "scroll", "coordinate": [512, 400], "scroll_direction": "down", "scroll_amount": 2},
    {"action": "key", "text": "Tab"},
    {"action": "mouse_move", "coordinate": [600, 520]},
    {"action": "screenshot"},
)
ACTION_KINDS = ("click", "type", "scroll", "key", "move", "screenshot")


def screenshot(step: int, width: int = WIDTH, height: int = HEIGHT) -> bytes:
    """The page after ``step`` actions, as PNG bytes (drawn at 1024 x 768, then scaled)."""
    full = (WIDTH, HEIGHT)
    img = Image.new("RGB", full, (250, 250, 250))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, WIDTH, 56), fill=(32, 64, 128))
    d.text((16, 20), f"Forge demo shop  -  step {step}", fill=(255, 255, 255))
    d.rectangle((0, 56, 200, HEIGHT), fill=(236, 238, 242))
    for i in range(12):
        d.text((16, 80 + 28 * i), f"Link {i + 1}: section {(step + i) % 17}", fill=(20, 60, 160))
    top = 120 - 12 * (step % 5)  # the form scrolls
    d.rectangle((260, top, WIDTH - 60, top + 420), outline=(180, 180, 180), fill=(255, 255, 255))
    d.text((280, top + 20), "Sign up", fill=(0, 0, 0))
    typed = NAME[: step % (len(NAME) + 1)]
    for row, (label, value) in enumerate(
        [("Name", typed), ("Email", ""), ("Plan", "free"), ("Notes", f"draft {step}")]
    ):
        y = top + 70 + 70 * row
        d.text((280, y), label, fill=(60, 60, 60))
        d.rectangle((380, y - 6, WIDTH - 100, y + 24), outline=(120, 120, 120))
        d.text((388, y), value, fill=(0, 0, 0))
    d.rectangle((280, top + 360, 400, top + 396), fill=(40, 140, 60))
    d.text((300, top + 370), "Submit", fill=(255, 255, 255))
    x, y = 300 + (step * 37) % (WIDTH - 400), 200 + (step * 53) % (HEIGHT - 300)
    d.polygon([(x, y), (x, y + 18), (x + 5, y + 13), (x + 12, y + 13)], fill=(0, 0, 0))
    if (width, height) != full:
        img = img.resize((width, height), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def _image_block(png: bytes) -> dict[str, Any]:
    data = base64.b64encode(png).decode("ascii")
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def computer_use_calls(
    steps: int, keep: int = 5, width: int = WIDTH, height: int = HEIGHT
) -> Iterator[tuple[dict[str, Any], dict[str, Any], list[bytes]]]:
    """(request body, response body, the screenshots the request carries) per call."""
    shots = [screenshot(0, width, height)]
    turns: list[tuple[dict[str, Any], str]] = []  # (action input, tool_use id) per step
    for step in range(steps):
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": TASK}, _image_block(shots[0])]}
            if keep > len(turns)
            else {"role": "user", "content": [{"type": "text", "text": TASK}]}
        ]
        carried = [shots[0]] if keep > len(turns) else []
        for i, (action, tool_id) in enumerate(turns):
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": tool_id, "name": "computer", "input": action}
                    ],
                }
            )
            content: list[dict[str, Any]] = []
            if i >= len(turns) - keep:
                content.append(_image_block(shots[i + 1]))
                carried.append(shots[i + 1])
            else:
                content.append({"type": "text", "text": "[screenshot omitted]"})
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": tool_id, "content": content}
                    ],
                }
            )
        request = {
            "model": MODEL,
            "max_tokens": 1024,
            "system": "You control a browser through the computer tool.",
            "tools": [COMPUTER_TOOL],
            "messages": messages,
        }
        action = ACTIONS[step % len(ACTIONS)]
        tool_id = f"toolu_{step:04d}"
        response = {
            "id": f"msg_{step:04d}",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [{"type": "tool_use", "id": tool_id, "name": "computer", "input": action}],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1500 * len(carried) + 400, "output_tokens": 40},
        }
        yield request, response, carried
        turns.append((action, tool_id))
        shots.append(screenshot(step + 1, width, height))


def body_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
