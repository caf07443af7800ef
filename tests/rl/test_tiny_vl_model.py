"""The tiny Qwen3-VL: built without downloads, image token counts computed without its
processor equal the processor's, a prompt with a screenshot runs through it only with
its exact pad count, and the engine and the trainer load it as a vision model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from forge_cli.main import main
from mitm_addon.serve.vision import (
    VisionTokens,
    encode_prompt,
    grid,
    image_text,
    image_token_count,
)
from rl.tiny_vl_model import SETTINGS, build_tiny_vl_model, load_image_processor

SIZES = [
    (1920, 1080),
    (1024, 768),
    (320, 240),
    (64, 64),
    (33, 500),
    (500, 33),
    (4000, 3000),
    (32, 32),
    (100, 37),
]


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl"))


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_image_token_counts_equal_the_image_processors(
    vl_dir: Path, width: int, height: int
) -> None:
    processor = load_image_processor(vl_dir)
    out = processor(images=[Image.new("RGB", (width, height))], return_tensors="pt")
    assert tuple(out["image_grid_thw"][0].tolist()) == grid(height, width, SETTINGS)
    assert out["pixel_values"].shape[0] == image_token_count(height, width, SETTINGS) * 4


def test_a_screenshot_sized_image_is_sixty_tokens() -> None:
    assert image_token_count(1080, 1920, SETTINGS) == 60


def test_a_prompt_with_a_screenshot_runs_through_the_model_only_with_its_exact_pad_count(
    vl_dir: Path,
) -> None:
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(str(vl_dir))
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(vl_dir), dtype=torch.float32).eval()
    tokens = VisionTokens.of(tokenizer.get_vocab().get)
    pad = tokens.pad
    shown = image_text("i1:" + "0" * 40, 1920, 1080)
    messages = [{"role": "user", "content": shown + "What does the page show?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode(piece: str) -> list[int]:
        return list(tokenizer.encode(piece, add_special_tokens=False))

    ids = encode_prompt(text, encode, tokens, SETTINGS)
    assert ids.count(pad) == image_token_count(1080, 1920, SETTINGS) == 60
    image = Image.new("RGB", (1920, 1080), (40, 90, 200))
    pixels = load_image_processor(vl_dir)(images=[image], return_tensors="pt")

    def forward(prompt: list[int]) -> torch.Tensor:
        mm = torch.tensor([[int(t == pad) for t in prompt]])
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt]), mm_token_type_ids=mm, **pixels)
        return out.logits

    assert forward(ids).shape == (1, len(ids), model.config.text_config.vocab_size)
    with pytest.raises(ValueError):  # the vision tower's features must fill every pad
        forward(ids[:5] + ids[6:])


def test_init_model_writes_a_folder_the_engine_and_the_trainer_load_as_a_vision_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rl.policy.engine import Engine
    from rl.trainer import load_policy

    out = tmp_path / "vl"
    assert main(["init-model", "--tiny-vl", "--out", str(out)]) == 0
    assert "tiny Qwen3-VL model written" in capsys.readouterr().out
    assert (
        json.loads((out / "preprocessor_config.json").read_text())["max_pixels"]
        == SETTINGS.max_pixels
    )
    assert json.loads((out / "config.json").read_text())["architectures"] == [
        "Qwen3VLForConditionalGeneration"
    ]
    assert Engine(out).pixels is not None  # served and trained as a vision model
    assert type(load_policy(out)).__name__ == "Qwen3VLForConditionalGeneration"
    assert main(["init-model", "--tiny-vl", "--reply", "x", "--out", str(tmp_path / "no")]) == 2
