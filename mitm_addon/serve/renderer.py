"""The policy's tokenizer and chat template: messages to token ids and ids back to text.

Loaded with ``transformers.AutoTokenizer`` from the folder named by ``forge_tokenizer``
(a Hugging Face model folder: ``tokenizer.json``, ``tokenizer_config.json``, the chat
template), so the prompt is exactly what the template renders.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

# An assistant turn whose text marks where an earlier completion ends: what the template
# renders after it is what follows a completion in the real conversation.
_SPLICE_POINT = "\u2063forge-splice-point\u2063"


class TemplateError(ValueError):
    """The tokenizer folder or its chat template cannot render a conversation."""


class Renderer:
    def __init__(self, path: Path) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as e:  # pragma: no cover - the serve extra is not installed
            raise TemplateError(
                "serve mode needs transformers: pip install 'forge-rl[serve]'"
            ) from e
        if not (path / "tokenizer_config.json").is_file():
            raise TemplateError(f"forge_tokenizer: {path} holds no tokenizer_config.json")
        try:
            self.tokenizer: Any = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as e:
            raise TemplateError(f"forge_tokenizer: cannot load a tokenizer from {path}: {e}") from e
        self.template: str | None = getattr(self.tokenizer, "chat_template", None)
        if not self.template:
            raise TemplateError(f"forge_tokenizer: {path} has no chat template")
        eos = self.tokenizer.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else [])
        self.eos_text: str = self.tokenizer.eos_token or ""
        # The Rust tokenizer is thread-safe, the Python wrapper's template cache may not be.
        self._lock = threading.Lock()

    def _text(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation: bool
    ) -> str:
        try:
            with self._lock:
                text = self.tokenizer.apply_chat_template(
                    messages,
                    tools=tools or None,
                    add_generation_prompt=generation,
                    tokenize=False,
                )
        except Exception as e:  # jinja2 raises many types (TemplateError, TypeError, ...)
            raise TemplateError(f"the chat template cannot render this conversation: {e}") from e
        if not isinstance(text, str):
            raise TemplateError("the chat template did not render text")
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        return self.encode(self._text(messages, tools, generation=True))

    def render_full(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """The conversation as a whole, without a generation prompt (its last turn ended)."""
        return self.encode(self._text(messages, tools, generation=False))

    def render_continuation(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], after_eos: bool
    ) -> list[int]:
        probe = [
            {"role": "user", "content": "."},
            {"role": "assistant", "content": _SPLICE_POINT},
            *messages,
        ]
        text = self._text(probe, tools, generation=True)
        _, found, rest = text.partition(_SPLICE_POINT)
        if not found:
            raise TemplateError("the chat template drops assistant text: cannot splice turns")
        if after_eos and self.eos_text and rest.startswith(self.eos_text):
            rest = rest[len(self.eos_text) :]
        return self.encode(rest)

    def ends_turn(self, token_id: int) -> bool:
        return token_id in self.eos_ids

    def decode(self, ids: list[int]) -> str:
        """The completion's text, special tokens kept, its final end-of-turn token cut."""
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        """Prompt tokens of a conversation (token counting endpoints)."""
        return len(self.encode(self._text(messages, tools, generation=True)))
