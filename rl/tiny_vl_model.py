"""A tiny Qwen3-VL vision-language model built locally, with the real Qwen3 tokenizer and
an image processor configured here: no download.

The architecture is transformers' ``Qwen3VLForConditionalGeneration`` at toy size (a
one-block vision tower of width 32 on 16-pixel patches, merged 2 x 2 into the text
model's width; a 2-layer text model of width 64 with Qwen3-VL's interleaved multimodal
rotary embedding), seeded random weights. The tokenizer is Qwen3's (``rl.tiny_model``),
whose vocabulary holds Qwen-VL's vision tokens (``<|vision_start|>``, ``<|image_pad|>``,
``<|vision_end|>``); the image processor is ``Qwen2VLImageProcessor``'s settings in
``preprocessor_config.json``, sized so a 1920 x 1080 screenshot becomes 60 image
tokens (``mitm_addon.serve.vision`` computes the count without the processor).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mitm_addon.serve.vision import (
    IMAGE_PAD,
    PREPROCESSOR_CONFIG,
    VISION_END,
    VISION_START,
    VisionSettings,
)
from rl.tiny_model import TINY_CONFIG, qwen3_tokenizer_dir, save_tiny

SETTINGS = VisionSettings()
IMAGE_PROCESSOR: dict[str, Any] = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": SETTINGS.patch_size,
    "merge_size": SETTINGS.merge_size,
    "temporal_patch_size": SETTINGS.temporal_patch_size,
    "min_pixels": SETTINGS.min_pixels,
    "max_pixels": SETTINGS.max_pixels,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
}
VISION: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": SETTINGS.patch_size,
    "spatial_merge_size": SETTINGS.merge_size,
    "temporal_patch_size": SETTINGS.temporal_patch_size,
    "out_hidden_size": TINY_CONFIG["hidden_size"],
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [],
}


def text_config(vocab_size: int) -> dict[str, Any]:
    head_dim = TINY_CONFIG["head_dim"]
    half = head_dim // 2  # rotary frequencies per head
    spatial = 3 * half // 8
    return {
        "vocab_size": vocab_size,
        "hidden_size": TINY_CONFIG["hidden_size"],
        "intermediate_size": TINY_CONFIG["intermediate_size"],
        "num_hidden_layers": TINY_CONFIG["num_hidden_layers"],
        "num_attention_heads": TINY_CONFIG["num_attention_heads"],
        "num_key_value_heads": TINY_CONFIG["num_key_value_heads"],
        "head_dim": head_dim,
        "max_position_embeddings": TINY_CONFIG["max_position_embeddings"],
        # Qwen3-VL splits each head's rotary frequencies over (time, height, width).
        "rope_scaling": {
            "rope_type": "default",
            "mrope_section": [half - 2 * spatial, spatial, spatial],
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": True,
        "bos_token_id": TINY_CONFIG["bos_token_id"],
        "eos_token_id": TINY_CONFIG["eos_token_id"],
        "pad_token_id": TINY_CONFIG["pad_token_id"],
    }


def build_tiny_vl_model(out: Path, seed: int = 0) -> Path:
    """Write a seeded random tiny Qwen3-VL model, the Qwen3 tokenizer and the image
    processor's settings to ``out``."""
    import torch
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    source = qwen3_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    names = (VISION_START, VISION_END, IMAGE_PAD, "<|video_pad|>")
    vocab: dict[str, int] = tokenizer.get_vocab()
    ids = [vocab[name] for name in names]
    config = Qwen3VLConfig(
        text_config=text_config(TINY_CONFIG["vocab_size"]),
        vision_config=VISION,
        vision_start_token_id=ids[0],
        vision_end_token_id=ids[1],
        image_token_id=ids[2],
        video_token_id=ids[3],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()  # type: ignore[arg-type]
    save_tiny(model, tokenizer, source, out)
    (out / PREPROCESSOR_CONFIG).write_text(json.dumps(IMAGE_PROCESSOR, indent=2) + "\n")
    return out


def is_vision_model(model_dir: Path) -> bool:
    """A model folder with an image processor's settings: a vision policy."""
    return (Path(model_dir) / PREPROCESSOR_CONFIG).is_file()


def load_image_processor(model_dir: Path) -> Any:
    """The folder's image processor (the PIL one: no torchvision needed)."""
    from transformers import Qwen2VLImageProcessorPil

    config = json.loads((model_dir / PREPROCESSOR_CONFIG).read_text())
    keys = ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels",
            "image_mean", "image_std")  # fmt: skip
    return Qwen2VLImageProcessorPil(**{k: config[k] for k in keys if k in config})
