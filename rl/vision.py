"""Images in a vision policy's prompt: how many tokens each takes, and where they go.

A Qwen-VL model sees an image as ``<|vision_start|>`` ``<|image_pad|>`` x N
``<|vision_end|>``: the image processor resizes it so that each side is a multiple of
``patch_size x merge_size`` and its area lies between ``min_pixels`` and
``max_pixels``, cuts it into ``patch_size`` squares, and the vision tower merges each
``merge_size x merge_size`` block of patches into one token, so N = (H / patch) x
(W / patch) / merge^2. The count depends only on the image's size and the processor's
settings: rendering a prompt once with one pad per image and widening each pad to its
N (``expand_image_pads``) gives the same ids the model's own processor would, on every
turn, which is what keeps a conversation with images token-exact.

Pure functions; the settings come from the model folder's ``preprocessor_config.json``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
IMAGE_MARKER = VISION_START + IMAGE_PAD + VISION_END  # one image, before its pads widen


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


def expand_image_pads(ids: Sequence[int], pad_id: int, counts: Sequence[int]) -> list[int]:
    """``ids`` with its k-th ``pad_id`` widened to ``counts[k]`` pads. Raises ValueError
    when the prompt holds another number of pads than there are images."""
    out: list[int] = []
    k = 0
    for token in ids:
        if token != pad_id:
            out.append(token)
            continue
        if k >= len(counts):
            raise ValueError(f"the prompt holds more image pads than its {len(counts)} images")
        out.extend([pad_id] * counts[k])
        k += 1
    if k != len(counts):
        raise ValueError(f"the prompt holds {k} image pads for {len(counts)} images")
    return out
