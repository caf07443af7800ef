"""A vision policy's prompt: image parts stay in the conversation as sentinels, the
renderer widens each to the image's own tokens, and every API's image form gives the
same tokens."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from PIL import Image

from mitm_addon.serve.conversation import Conversation, ConversionError, from_request
from mitm_addon.serve.renderer import Renderer
from mitm_addon.serve.vision import (
    VisionSettings,
    VisionTokens,
    encode_prompt,
    image_hashes,
    image_runs,
    image_text,
    image_token_count,
    load_settings,
)
from pipeline.images import image_hash


def png(width: int, height: int, color: tuple[int, int, int] = (10, 20, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "PNG")
    return buf.getvalue()


SHOT = png(1920, 1080)
SMALL = png(640, 480, (200, 0, 0))
B64 = base64.b64encode(SHOT).decode()
TOKENS = VisionTokens(start=1, end=2, pad=3)


def test_an_image_sentinel_names_its_hash_and_encodes_to_its_token_count() -> None:
    h = image_hash(SHOT)
    text = "see " + image_text(h, 1920, 1080) + " and " + image_text(image_hash(SMALL), 640, 480)
    assert image_hashes(text) == [h, image_hash(SMALL)]
    s = VisionSettings()
    ids = encode_prompt(text, lambda t: [ord(c) for c in t], TOKENS, s)
    n1, n2 = image_token_count(1080, 1920, s), image_token_count(480, 640, s)
    assert (n1, n2) == (60, 54)
    assert ids == [
        *map(ord, "see "), 1, *[3] * 60, 2, *map(ord, " and "), 1, *[3] * 54, 2,
    ]  # fmt: skip
    assert image_runs(ids, TOKENS) == [60, 54]
    with pytest.raises(ValueError, match="not an image hash"):
        image_text("sha:abc", 1, 1)


def test_settings_come_from_the_folders_preprocessor_config(tiny_vl_model: Path) -> None:
    assert load_settings(tiny_vl_model) == VisionSettings()
    assert load_settings(tiny_vl_model.parent) is None


def _chat(content: list[dict[str, object]]) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


def _chat_with_screenshot() -> Conversation:
    """A Chat call: "Click it." and the screenshot, for a vision policy."""
    url = f"data:image/png;base64,{B64}"
    content = [{"type": "text", "text": "Click it."}, {"type": "image_url", "image_url": {"url": url}}]
    return from_request("POST", "/v1/chat/completions", _chat(content), images=True)


def test_every_apis_image_form_becomes_one_sentinel_with_the_images_bytes() -> None:
    h = image_hash(SHOT)
    expected = "Click it.\n\n" + image_text(h, 1920, 1080)
    chat = _chat_with_screenshot()
    anthropic = from_request(
        "POST",
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 9,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Click it."},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": B64},
                        },
                    ],
                }
            ],
        },
        images=True,
    )
    responses = from_request(
        "POST",
        "/v1/responses",
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Click it."},
                        {"type": "input_image", "image_url": f"data:image/png;base64,{B64}"},
                    ],
                }
            ],
        },
        images=True,
    )
    for conv in (chat, anthropic, responses):
        assert conv.messages[-1]["content"] == expected
        assert conv.images == {h: SHOT}
    text_policy = from_request("POST", "/v1/chat/completions", _chat(
        [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}}]
    ))  # fmt: skip
    assert text_policy.messages[-1]["content"] == "[image]" and text_policy.images == {}


def test_a_screenshot_in_a_tool_result_stays_in_the_tool_message() -> None:
    body = {
        "model": "m",
        "max_tokens": 9,
        "messages": [
            {"role": "user", "content": "Open the page."},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "computer",
                     "input": {"action": "screenshot"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "image", "source": {
                                "type": "base64", "media_type": "image/png", "data": B64}},
                        ],
                    }
                ],
            },
        ],
    }  # fmt: skip
    conv = from_request("POST", "/v1/messages", body, images=True)
    assert conv.messages[-1] == {
        "role": "tool",
        "tool_call_id": "t1",
        "name": "computer",
        "content": image_text(image_hash(SHOT), 1920, 1080),
    }


def test_an_image_given_by_url_is_refused_with_the_reason() -> None:
    body = _chat([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
    with pytest.raises(ConversionError, match="inline images only"):
        from_request("POST", "/v1/chat/completions", body, images=True)
    broken = "data:image/png;base64," + base64.b64encode(b"not a png" * 2000).decode()
    body = _chat([{"type": "image_url", "image_url": {"url": broken}}])
    with pytest.raises(ConversionError, match="not a PNG, GIF, JPEG or WebP"):
        from_request("POST", "/v1/chat/completions", body, images=True)


def test_the_vision_renderer_gives_the_pads_the_model_expects(tiny_vl_model: Path) -> None:
    renderer = Renderer(tiny_vl_model)
    assert renderer.vision_tokens is not None
    tokens = renderer.vision_tokens
    conv = _chat_with_screenshot()
    ids = renderer.render(conv.messages, conv.tools)
    assert image_runs(ids, tokens) == [60]
    start = ids.index(tokens.start)
    assert ids[start : start + 62] == [tokens.start, *[tokens.pad] * 60, tokens.end]
    # The text around the image is the template's, tokenised as a text model would.
    text = Renderer(tiny_vl_model)._text(conv.messages, [], generation=True)
    before, _, after = text.partition(conv.messages[-1]["content"].split("\n")[-1])
    assert ids[:start] == renderer._encode_text(before)
    assert ids[start + 62 :] == renderer._encode_text(after)
