"""The policy's tokenizer and chat template: messages to token ids and ids back to text.

Loaded with ``transformers.AutoTokenizer`` from the folder named by ``forge_tokenizer``
(a Hugging Face model folder: ``tokenizer.json``, ``tokenizer_config.json``, the chat
template), so the prompt is exactly what the template renders. A folder with an image
processor's settings (``preprocessor_config.json``) is a vision policy's: each image
sentinel in the rendered text becomes the image's tokens (``vision.encode_prompt``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from mitm_addon.serve.vision import VisionSettings, VisionTokens, encode_prompt, load_settings

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
        try:
            self.vision: VisionSettings | None = load_settings(path)
        except ValueError as e:
            raise TemplateError(f"forge_tokenizer: {e}") from e
        self.vision_tokens: VisionTokens | None = None
        if self.vision is not None:
            vocab = self.tokenizer.get_vocab()
            try:
                self.vision_tokens = VisionTokens.of(vocab.get)
            except ValueError as e:
                raise TemplateError(f"forge_tokenizer: {path}: {e}") from e
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
        if self.vision is not None and self.vision_tokens is not None:
            return encode_prompt(text, self._encode_text, self.vision_tokens, self.vision)
        return self._encode_text(text)

    def _encode_text(self, text: str) -> list[int]:
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

    def decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)

    @property
    def opens_reasoning(self) -> bool:
        """Does the generation prompt open a ``<think>`` block for the model?"""
        text = self._text([{"role": "user", "content": "."}], [], generation=True)
        return text.rstrip().endswith("<think>")

    def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        """Prompt tokens of a conversation (token counting endpoints)."""
        return len(self.encode(self._text(messages, tools, generation=True)))


class IncrementalDecoder:
    """A completion's text as its ids arrive: ``feed`` returns the text the new ids add,
    holding back what cannot be written yet (a character whose bytes are split across
    tokens, end-of-turn tokens that may be the last); ``finish`` the rest, so that all of
    it is ``Renderer.decode`` of all the ids. Each step decodes a window of a few tokens,
    not the whole completion."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.ids: list[int] = []
        self.written = ""
        self._prefix = 0  # the window's start: ids already written, decoded for context
        self._read = 0  # ids up to here are written

    def _decode(self, ids: list[int]) -> str:
        return str(self.renderer.tokenizer.decode(ids, skip_special_tokens=False))

    def feed(self, new_ids: list[int]) -> str:
        self.ids += new_ids
        end = len(self.ids)
        while end > self._read and self.ids[end - 1] in self.renderer.eos_ids:
            end -= 1  # an end-of-turn token is written only once a token follows it
        if end <= self._read:
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix : end])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # a character still split: wait for its next byte
        delta = after[len(before) :]
        self._prefix, self._read = self._read, end
        self.written += delta
        return delta

    def finish(self) -> str:
        whole = self.renderer.decode(self.ids)
        if not whole.startswith(self.written):  # a tokenizer whose pieces do not add up
            raise ValueError("the completion's text decoded piece by piece differs from whole")
        rest = whole[len(self.written) :]
        self.written = whole
        return rest
