"""A vision policy's model inputs for the images of a prompt: pixels, grids, token types,
3-D rotary positions.

Qwen-VL models take, besides the token ids, the pixel patches of every image in the
order its pads stand in the ids (``pixel_values``, one row per patch), each image's patch
grid (``image_grid_thw``) and a token type per position (``mm_token_type_ids``: 1 at an
image pad); their rotary positions are 3-D (time, height, width) over an image's pads.
``Pixels`` runs the model folder's image processor once per image content (by hash);
the engine and the trainer share it, so a served prompt and its training sample see the
same pixels.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mitm_addon.serve.vision import VisionTokens, image_runs
from pipeline.images import image_hash


class VisionInputError(ValueError):
    """Images that do not fit the prompt they come with; the message says how."""


class Pixels:
    """The image processor of a model folder, its output kept by image hash (bounded)."""

    def __init__(self, model_dir: Path, max_images: int = 512) -> None:
        from rl.tiny_vl_model import load_image_processor

        self.processor = load_image_processor(Path(model_dir))
        self.merge = int(getattr(self.processor, "merge_size", 2))
        self.max_images = max_images
        self._cache: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()

    def one(self, data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel patches (P, D), grid (3,)) of one image given by its raw bytes."""
        from PIL import Image, UnidentifiedImageError

        key = image_hash(data)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            image = Image.open(io.BytesIO(data)).convert("RGB")
        except (UnidentifiedImageError, OSError) as e:
            raise VisionInputError(f"image {key} cannot be read: {e}") from None
        out = self.processor(images=[image], return_tensors="pt")
        value = (out["pixel_values"].float(), out["image_grid_thw"][0].long())
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > self.max_images:
                self._cache.popitem(last=False)
        return value

    def tokens(self, grid: torch.Tensor) -> int:
        """Image tokens of an image with patch grid ``grid``."""
        return int(grid.prod()) // (self.merge**2)

    def batch(self, images: Sequence[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values (sum P, D), image_grid_thw (n, 3)) of ``images`` in order."""
        parts = [self.one(data) for data in images]
        return torch.cat([p for p, _ in parts]), torch.stack([g for _, g in parts])


def check_runs(ids: Sequence[int], tokens: VisionTokens, counts: Sequence[int]) -> None:
    """Refuse a prompt whose runs of image pads are not ``counts`` (one per image)."""
    runs = image_runs(ids, tokens)
    if len(runs) != len(counts):
        raise VisionInputError(
            f"the prompt holds {len(runs)} runs of image pads for {len(counts)} images"
        )
    for k, (run, count) in enumerate(zip(runs, counts, strict=True)):
        if run != count:
            raise VisionInputError(
                f"image {k} takes {count} tokens but the prompt holds {run} pads for it"
            )


def token_types(input_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``mm_token_type_ids``: 1 at image pads, 0 elsewhere (same shape as the ids)."""
    return (input_ids == pad_id).to(torch.int32)


def rope_positions(
    model: Any, input_ids: torch.Tensor, pad_id: int, grid: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids (3, 1, T), rope deltas (1, 1)) of a Qwen-VL prompt. Passed to the
    model explicitly: left to itself it keeps the deltas of the last prompt it saw and
    would apply them to a later one's decoding."""
    positions, deltas = model.model.get_rope_index(
        input_ids, mm_token_type_ids=token_types(input_ids, pad_id), image_grid_thw=grid
    )
    return positions, deltas


class SampleImages:
    """The pixel inputs of training samples' images: their bytes by hash (a snapshot's
    images table), the model's image processor, and its vision token ids."""

    def __init__(self, pixels: Pixels, images: Mapping[str, bytes], tokens: VisionTokens) -> None:
        self.pixels = pixels
        self.images = images
        self.tokens = tokens

    def inputs(self, samples: Sequence[Any], input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """(pixel_values, image_grid_thw, mm_token_type_ids) for a batch of ``samples``
        (rows of ``input_ids``); empty when none shows an image. Raises
        VisionInputError for an image the snapshot lacks or pads that do not fit it."""
        hashes = [h for s in samples for h in s.images]
        if not hashes:
            for s in samples:
                check_runs(s.input_ids, self.tokens, [])
            return {}
        missing = sorted({h for h in hashes if h not in self.images})
        if missing:
            raise VisionInputError(f"the snapshot holds no image {missing[0]}")
        pixel_values, grid = self.pixels.batch([self.images[h] for h in hashes])
        k = 0
        for s in samples:
            n = len(s.images)
            counts = [self.pixels.tokens(g) for g in grid[k : k + n]]
            try:
                check_runs(s.input_ids, self.tokens, counts)
            except VisionInputError as e:
                raise VisionInputError(f"sample {s.sample_id}: {e}") from None
            k += n
        return {
            "pixel_values": pixel_values,
            "image_grid_thw": grid,
            "mm_token_type_ids": token_types(input_ids, self.tokens.pad),
        }


def vision_tokens_of(config: Any) -> VisionTokens:
    """A Qwen-VL model config's vision token ids."""
    return VisionTokens(
        config.vision_start_token_id, config.vision_end_token_id, config.image_token_id
    )
