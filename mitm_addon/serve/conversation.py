"""API requests as chat-template conversations (pure).

The provider adapters split a request into its items and parameters; the SFT export's
converters (``pipeline.export.to_openai``) turn those into OpenAI chat messages and
function tools, the form Hugging Face chat templates take. Serve mode uses the same
conversion, so what the policy saw and what an SFT export holds cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mitm_addon.protocols import find_adapter
from mitm_addon.protocols.base import ParseError
from mitm_addon.serve.vision import image_text
from pipeline.export import _text_of, to_openai
from pipeline.images import HASH_TAG, extract_images, image_refs, image_size


class ConversionError(ValueError):
    """A request Forge cannot turn into a conversation; the message says what is wrong."""


@dataclass(frozen=True)
class Conversation:
    """One request, API-neutral: what the template renders and how to sample."""

    api: str
    model: str | None
    stream: bool
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    previous_response_id: str | None = None
    # Leading messages that a Responses call's ``instructions`` made: a later call naming
    # this one in ``previous_response_id`` does not inherit them (the API's rule).
    instructions: int = 0
    # For a vision policy: the raw bytes of each image the messages show, by hash.
    images: dict[str, bytes] = field(default_factory=dict)


# Body keys that bound the completion's length, per API (the first one present wins).
_MAX_TOKENS = {
    "anthropic_messages": ("max_tokens",),
    "openai_chat": ("max_completion_tokens", "max_tokens"),
    "openai_responses": ("max_output_tokens",),
}


def _number(params: dict[str, Any], key: str) -> float | None:
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConversionError(f"{key!r} is not a number")
    return float(value)


def _max_tokens(api: str, params: dict[str, Any]) -> int | None:
    for key in _MAX_TOKENS[api]:
        value = params.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConversionError(f"{key!r} is not a positive integer")
        return value
    return None


def _has_instructions(params: dict[str, Any]) -> bool:
    """Does ``instructions`` make a system message (as ``to_openai`` converts it)?"""
    return bool(_text_of(params.get("instructions")))


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """A converted message without the null fields templates would print as 'None'."""
    return {k: v for k, v in message.items() if v is not None}


# Content parts that hold one image, in each API's form (computer_screenshot: the output
# of a Responses computer call).
_IMAGE_PARTS = frozenset({"image", "image_url", "input_image", "computer_screenshot"})


def inline_images(items: list[Any]) -> tuple[list[Any], dict[str, bytes]]:
    """``items`` with each image part replaced by a text part holding its sentinel
    (``vision.image_text``), and each image's bytes by hash: what a vision policy's
    renderer turns into image tokens. Raises ConversionError for an image the policy
    cannot be shown (given by URL: its bytes never crossed the proxy; of a format whose
    size cannot be read)."""
    refs, found = extract_images(items)
    images = {image.hash: image.data for image in found}

    def walk(value: Any) -> Any:
        if isinstance(value, list):
            return [walk(v) for v in value]
        if not isinstance(value, dict):
            return value
        if value.get("type") in _IMAGE_PARTS:
            h = next((r for r in image_refs(value) if r.startswith(HASH_TAG + ":")), None)
            if h is None:
                raise ConversionError(
                    "a vision policy is shown inline images only: this request gives one by "
                    "URL or in a form Forge does not read"
                )
            size = image_size(images[h])
            if size is None:
                raise ConversionError(f"image {h}: not a PNG, GIF, JPEG or WebP image")
            return {"type": "text", "text": image_text(h, *size)}
        return {k: walk(v) for k, v in value.items()}

    return walk(refs), images


def from_request(
    method: str,
    path: str,
    body: dict[str, Any],
    history: list[dict[str, Any]] | None = None,
    images: bool = False,
) -> Conversation:
    """The conversation of one model call. ``history``: the messages (request and reply)
    of the response a Responses call names in ``previous_response_id``. ``images``: for
    a vision policy, each image stays in its message as a sentinel (``inline_images``);
    else it becomes the text ``[image]``."""
    adapter = find_adapter(method, path)
    if adapter is None:
        raise ConversionError(f"{method} {path} is not a model call Forge can serve")
    shown: dict[str, bytes] = {}
    try:
        parsed = adapter.parse_request(body)
        items = parsed.items
        if images:
            items, shown = inline_images(items)
        messages, tools = to_openai(adapter.api, parsed.params, items)
    except (ParseError, ValueError, TypeError, AttributeError) as e:
        raise ConversionError(f"{adapter.api}: {e}") from e
    messages = [_clean(m) for m in messages]
    instructions = int(adapter.api == "openai_responses" and _has_instructions(parsed.params))
    if parsed.previous_response_id is not None:
        if history is None:
            raise ConversionError(
                f"previous_response_id {parsed.previous_response_id!r} is unknown to this "
                "proxy (it keeps the responses it served since it started); send the whole "
                "input instead"
            )
        # The new instructions, then every message of the earlier response (its input
        # items, developer messages included, and its reply), then the new input items.
        messages = messages[:instructions] + history + messages[instructions:]
    if not messages:
        raise ConversionError(f"{adapter.api}: the request holds no message")
    return Conversation(
        api=adapter.api,
        model=parsed.model,
        stream=parsed.stream,
        messages=messages,
        tools=tools,
        max_tokens=_max_tokens(adapter.api, parsed.params),
        temperature=_number(parsed.params, "temperature"),
        top_p=_number(parsed.params, "top_p"),
        previous_response_id=parsed.previous_response_id,
        instructions=instructions,
        images=shown,
    )
