"""Images inside conversation items, stored once by content hash.

A GUI agent re-sends its recent screenshots on every call, and a screenshot is tens or
hundreds of kB of base64: kept inside the items, each would be stored again in every
item that carries it. So before an item is hashed, each inline image in it is taken
out into one ``images`` row (its raw bytes, grain: hash) and replaced by a reference.

Contract (part of the ``m1`` item form, see ``pipeline.canonical``):

* An image's hash is ``"i1:" + sha256(b"forge-i1\\0" + raw bytes)`` in hex, truncated
  to 40 hex digits: the same screenshot has one hash whether it came as an Anthropic
  base64 block, a Chat ``image_url`` data URL or a Responses ``input_image``.
* Anywhere in an item, a string ``data:image/<type>;base64,<payload>`` of at least
  ``REF_MIN_BYTES`` characters becomes ``{"$forge_image": <hash>, "prefix":
  "data:image/<type>;base64,"}``, and the ``data`` of a ``{"type": "base64", ...}``
  source whose ``media_type`` is ``image/...`` (Anthropic image blocks, screenshots in
  tool results; not PDF documents) becomes ``{"$forge_image": <hash>}``.
* A payload is taken out only when putting it back gives the same string (standard
  base64, padded, no line breaks); any other stays inline, so restoring is exact.

Images given by URL stay as they are (their bytes never crossed the proxy).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.canonical import REF_MIN_BYTES

IMAGE_KEY = "$forge_image"
HASH_TAG = "i1"
_PREFIX = b"forge-i1\0"
_HEX_DIGITS = 40
_DATA_URL = re.compile(r"data:(image/[A-Za-z0-9.+-]+);base64,")


@dataclass(frozen=True)
class Image:
    """One inline image taken out of an item: an ``images`` row's content."""

    hash: str
    media_type: str | None
    data: bytes

    @property
    def size(self) -> tuple[int, int] | None:
        return image_size(self.data)


def image_hash(data: bytes) -> str:
    """The hash of an image's raw bytes."""
    digest = hashlib.sha256(_PREFIX)
    digest.update(data)
    return f"{HASH_TAG}:{digest.hexdigest()[:_HEX_DIGITS]}"


def _decoded(payload: str) -> bytes | None:
    """The bytes of a base64 payload that encodes back to exactly ``payload``, else None."""
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if base64.b64encode(data).decode("ascii") == payload else None


def extract_images(value: Any) -> tuple[Any, list[Image]]:
    """``value`` with its inline images replaced by references, and the images, in the
    order they appear (one entry per occurrence). ``value`` itself is not changed; the
    parts of it that hold no image are shared, not copied."""
    found: list[Image] = []

    def take(payload: str, media_type: str | None) -> str | None:
        if len(payload) < REF_MIN_BYTES or not payload.isascii():
            return None
        data = _decoded(payload)
        if data is None:
            return None
        image = Image(image_hash(data), media_type, data)
        found.append(image)
        return image.hash

    def source_data(source: dict[str, Any]) -> Any:
        """The ``data`` of an image source by reference; any other ``data`` walked."""
        data, media = source["data"], source.get("media_type")
        if (
            source.get("type") == "base64"
            and isinstance(data, str)
            and isinstance(media, str)
            and media.startswith("image/")
        ):
            h = take(data, media)
            if h is not None:
                return {IMAGE_KEY: h}
        return walk(data)

    def walk(v: Any) -> Any:
        """``v`` with its images replaced; ``v`` itself (not a copy) when it holds none."""
        if isinstance(v, str):
            match = _DATA_URL.match(v) if len(v) >= REF_MIN_BYTES else None
            if match is not None:
                h = take(v[match.end() :], match.group(1))
                if h is not None:
                    return {IMAGE_KEY: h, "prefix": match.group(0)}
            return v
        if isinstance(v, list):
            items = [walk(e) for e in v]
            return v if all(a is b for a, b in zip(items, v, strict=True)) else items
        if isinstance(v, dict):
            out = {k: source_data(v) if k == "data" else walk(e) for k, e in v.items()}
            return v if all(out[k] is e for k, e in v.items()) else out
        return v

    return walk(value), found


def is_image_ref(value: Any) -> bool:
    return isinstance(value, dict) and IMAGE_KEY in value and set(value) <= {IMAGE_KEY, "prefix"}


def restore_images(value: Any, lookup: Callable[[str], bytes]) -> Any:
    """``value`` with every image reference put back (``lookup(hash) -> raw bytes``)."""
    if is_image_ref(value):
        payload = base64.b64encode(lookup(value[IMAGE_KEY])).decode("ascii")
        return value.get("prefix", "") + payload
    if isinstance(value, list):
        return [restore_images(e, lookup) for e in value]
    if isinstance(value, dict):
        return {k: restore_images(e, lookup) for k, e in value.items()}
    return value


def image_refs(value: Any) -> list[str]:
    """The images a stored value refers to, in order: a hash for each inline image, the
    URL for each image given by URL (Chat ``image_url``, Responses ``input_image``,
    an Anthropic ``url`` source)."""
    out: list[str] = []

    def walk(v: Any) -> None:
        if is_image_ref(v):
            out.append(v[IMAGE_KEY])
        elif isinstance(v, list):
            for e in v:
                walk(e)
        elif isinstance(v, dict):
            url = _linked_image(v)
            if url is not None:
                out.append(url)
            for e in v.values():
                walk(e)

    walk(value)
    return out


def _linked_image(part: dict[str, Any]) -> str | None:
    """The URL of an image part that links its image rather than carrying it."""
    kind = part.get("type")
    url: Any = None
    if kind == "image_url":
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
    elif kind in ("input_image", "computer_screenshot"):
        url = part.get("image_url")
    elif kind == "url" and "media_type" not in part:
        # An Anthropic source {"type": "url", "url": ...} (a block's "source" value).
        url = part.get("url")
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        return url
    return None


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) read from a PNG, GIF, JPEG or WebP header; None for anything else."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return w, h
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return w, h
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    pos = 2
    while pos + 9 < len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            h, w = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return w, h
        pos += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return w, h
    if chunk == b"VP8 " and len(data) >= 30:
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None
