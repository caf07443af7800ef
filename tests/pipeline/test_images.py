"""Inline images out of items and back: one hash per screenshot whatever the API's form."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image as PILImage

from bench.gui import screenshot
from pipeline.canonical import canonical_json
from pipeline.images import (
    IMAGE_KEY,
    extract_images,
    image_hash,
    image_refs,
    image_size,
    restore_images,
)

PNG = screenshot(3, 320, 200)
B64 = base64.b64encode(PNG).decode()
URL = "data:image/png;base64," + B64


def anthropic_block(data: str = B64, media: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}


# The same screenshot as each API carries it.
FORMS: dict[str, dict[str, Any]] = {
    "anthropic image block": {"role": "user", "content": [anthropic_block()]},
    "anthropic computer-use tool result": {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [anthropic_block()]}
        ],
    },
    "chat image_url": {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": URL, "detail": "auto"}}],
    },
    "responses input_image": {
        "role": "user",
        "content": [{"type": "input_image", "image_url": URL, "detail": "auto"}],
    },
    "responses computer_call_output": {
        "type": "computer_call_output",
        "call_id": "call_1",
        "output": {"type": "computer_screenshot", "image_url": URL},
    },
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_api_form_stores_the_screenshot_once_under_one_hash(form: str) -> None:
    item = FORMS[form]
    stored, images = extract_images(item)
    assert [(i.hash, i.media_type, i.data) for i in images] == [(image_hash(PNG), "image/png", PNG)]
    assert B64 not in canonical_json(stored)
    assert len(canonical_json(stored)) < 300
    assert image_refs(stored) == [image_hash(PNG)]
    restored = restore_images(stored, {image_hash(PNG): PNG}.__getitem__)
    assert canonical_json(restored) == canonical_json(item)


def test_the_item_keeps_its_key_order_and_is_not_changed_in_place() -> None:
    item = {"role": "user", "content": [anthropic_block()]}
    before = canonical_json(item)
    stored, _ = extract_images(item)
    assert canonical_json(item) == before
    assert list(stored["content"][0]["source"]) == ["type", "media_type", "data"]
    assert stored["content"][0]["source"]["data"] == {IMAGE_KEY: image_hash(PNG)}


def test_a_payload_that_would_not_encode_back_identically_stays_inline() -> None:
    wrapped = "\n".join(B64[i : i + 76] for i in range(0, len(B64), 76))  # MIME line breaks
    for item in (
        {"content": [anthropic_block(wrapped)]},
        {"content": [{"type": "image_url", "image_url": {"url": URL + "!"}}]},  # not base64
        {"content": [anthropic_block(B64[:400])]},  # under REF_MIN_BYTES
        {"content": [anthropic_block(B64, "application/pdf")]},  # a document, not an image
        {"text": "see " + URL},  # a data URL inside prose is text
    ):
        stored, images = extract_images(item)
        assert images == []
        assert stored == item


def test_images_given_by_url_are_referred_to_by_their_url() -> None:
    item = {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "input_image", "image_url": "https://example.com/b.png"},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/c.png"}},
            anthropic_block(),
        ],
    }
    stored, images = extract_images(item)
    assert len(images) == 1
    assert image_refs(stored) == [
        "https://example.com/a.png",
        "https://example.com/b.png",
        "https://example.com/c.png",
        image_hash(PNG),
    ]


def test_one_screenshot_sent_twice_in_an_item_is_two_occurrences_of_one_hash() -> None:
    other = screenshot(4, 320, 200)
    item = {
        "content": [
            anthropic_block(),
            anthropic_block(base64.b64encode(other).decode()),
            anthropic_block(),
        ]
    }
    stored, images = extract_images(item)
    assert [i.hash for i in images] == [image_hash(PNG), image_hash(other), image_hash(PNG)]
    assert image_refs(stored) == [i.hash for i in images]


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_image_size_is_read_from_the_header(fmt: str) -> None:
    out = io.BytesIO()
    PILImage.new("RGB", (173, 91), (10, 200, 30)).save(out, format=fmt)
    assert image_size(out.getvalue()) == (173, 91)


def test_image_size_of_something_else_is_none() -> None:
    assert image_size(b"not an image at all") is None
    assert image_size(b"\xff\xd8\xff") is None  # a JPEG cut short


leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=30)
    | st.sampled_from([URL, B64, "data:image/png;base64,AAAA"])
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["type", "data", "media_type", "url", "x"]), inner, max_size=4
        )
        | st.builds(anthropic_block)
    ),
    max_leaves=10,
)


@given(values)
def test_any_value_restores_exactly(value: Any) -> None:
    stored, images = extract_images(value)
    table = {i.hash: i.data for i in images}
    assert canonical_json(restore_images(stored, table.__getitem__)) == canonical_json(value)
