"""Images in a vision policy's prompt: how many tokens each takes, and where they go.

A Qwen-VL model sees an image as ``<|vision_start|>`` ``<|image_pad|>`` x N
``<|vision_end|>``: the image processor resizes it so that each side is a multiple of
``patch_size x merge_size`` and its area lies between ``min_pixels`` and
``max_pixels``, cuts it into ``patch_size`` squares, and the vision tower merges each
``merge_size x merge_size`` block of patches into one token, so N = (H / patch) x
(W / patch) / merge^2. The count depends only on the image's size and the processor's
settings, so a prompt's ids are the same on every turn, which is what keeps a
conversation with images token-exact.

In serve mode an image reaches the chat template as a sentinel in the message text
(``image_text``: the image's content hash and size), so the conversation keys that
splicing compares hold the image's hash like any text, and ``encode_prompt`` turns each
sentinel into the image's tokens while it encodes the rendered prompt.

Pure functions; the settings come from the model folder's ``preprocessor_config.json``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
# An image in a message's text: invisible separators around its hash and size.
_SENTINEL = re.compile("\u2063forge-image:(i1:[0-9a-f]{40}):([0-9]+)x([0-9]+)\u2063")


@dataclass(frozen=True)
class VisionSettings:
    """The image processor's settings that fix an image's token count."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 32 * 32 * 4
    max_pixels: int = 128 * 128 * 4


def resized(height: int, width: int, s: VisionSettings) -> tuple[int, int]:
    """(height, width) the processor resizes an image to (Qwen2-VL's ``smart_resize``)."""
    factor = s.patch_size * s.merge_size
    if height < factor or width < factor:
        raise ValueError(f"an image of {width} x {height} is smaller than {factor} pixels a side")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"an image of {width} x {height} is too elongated (over 200:1)")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > s.max_pixels:
        beta = math.sqrt((height * width) / s.max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < s.min_pixels:
        beta = math.sqrt(s.min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def grid(height: int, width: int, s: VisionSettings) -> tuple[int, int, int]:
    """(t, h, w) patches of an image: the processor's ``image_grid_thw``."""
    h, w = resized(height, width, s)
    return 1, h // s.patch_size, w // s.patch_size


def image_token_count(height: int, width: int, s: VisionSettings) -> int:
    t, h, w = grid(height, width, s)
    return t * h * w // (s.merge_size**2)


def load_settings(model_dir: Path) -> VisionSettings | None:
    """The settings in a model folder's ``preprocessor_config.json``; None without one
    (a text model)."""
    path = Path(model_dir) / PREPROCESSOR_CONFIG
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
        defaults = VisionSettings()
        return VisionSettings(
            patch_size=int(config.get("patch_size", defaults.patch_size)),
            merge_size=int(config.get("merge_size", defaults.merge_size)),
            temporal_patch_size=int(
                config.get("temporal_patch_size", defaults.temporal_patch_size)
            ),
            min_pixels=int(config.get("min_pixels", defaults.min_pixels)),
            max_pixels=int(config.get("max_pixels", defaults.max_pixels)),
        )
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not an image processor's settings ({e})") from e


def image_text(image_hash: str, width: int, height: int) -> str:
    """The text that stands for an image in a message: its hash and size."""
    text = f"\u2063forge-image:{image_hash}:{width}x{height}\u2063"
    if not _SENTINEL.fullmatch(text):
        raise ValueError(f"not an image hash: {image_hash!r}")
    return text


def image_hashes(text: str) -> list[str]:
    """The hashes of the images in ``text``, in order (one per occurrence)."""
    return [m.group(1) for m in _SENTINEL.finditer(text)]


@dataclass(frozen=True)
class VisionTokens:
    """The ids of a tokenizer's vision tokens."""

    start: int
    end: int
    pad: int

    @classmethod
    def of(cls, token_to_id: Callable[[str], int | None]) -> VisionTokens:
        ids = [token_to_id(t) for t in (VISION_START, VISION_END, IMAGE_PAD)]
        if not all(isinstance(i, int) for i in ids):
            raise ValueError(
                f"the tokenizer has no {VISION_START}, {VISION_END} and {IMAGE_PAD} tokens"
            )
        start, end, pad = (int(i) for i in ids if i is not None)
        return cls(start, end, pad)


def encode_prompt(
    text: str, encode: Callable[[str], list[int]], tokens: VisionTokens, s: VisionSettings
) -> list[int]:
    """``text`` as token ids, each image sentinel as ``<|vision_start|>``, its pads,
    ``<|vision_end|>``: the text between images is encoded piece by piece, as the
    tokenizer splits text at special tokens anyway."""
    ids: list[int] = []
    pos = 0
    for m in _SENTINEL.finditer(text):
        if m.start() > pos:
            ids += encode(text[pos : m.start()])
        width, height = int(m.group(2)), int(m.group(3))
        ids += [tokens.start, *[tokens.pad] * image_token_count(height, width, s), tokens.end]
        pos = m.end()
    if pos < len(text):
        ids += encode(text[pos:])
    return ids


def image_runs(ids: Sequence[int], tokens: VisionTokens) -> list[int]:
    """The length of each run of image pads in ``ids``, in order."""
    runs: list[int] = []
    previous = None
    for token in ids:
        if token == tokens.pad:
            if previous == tokens.pad:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = token
    return runs
