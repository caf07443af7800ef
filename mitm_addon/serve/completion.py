"""The policy's completion text parsed back into reasoning, text and tool calls (pure).

Parsers are chosen per chat template: ``hermes`` reads Qwen3 / Hermes output, where
reasoning sits in ``<think>...</think>`` and each tool call is a JSON object
``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``. A
block whose JSON does not parse stays in the text: the harness sees what the model
wrote rather than a call it did not make.

``HermesStream`` reads the text as it is sampled and says what can be sent already
(``Piece``s: reasoning and text deltas, whole tool calls); ``parse_hermes`` is the same
reader given the whole text, so a streamed reply and a whole one always agree. Rules:
reasoning is the ``<think>`` block the completion opens (or the one the generation prompt
opened, ``opened``), newlines around it dropped; the text drops its leading whitespace,
and its trailing whitespace too when tool calls follow it; tool calls end a reply, so
text written between or after them is dropped (as vLLM's Hermes parser does): a reply
is reasoning, text, then calls, in every API's shape. The completion's token ids keep
all of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedCompletion:
    """What the model said: ``finish`` is ``stop`` (it ended its turn) or ``length``."""

    text: str
    reasoning: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish: str = "stop"


@dataclass(frozen=True)
class Piece:
    """What a reply can send so far: a reasoning or text delta, or a whole tool call."""

    kind: Literal["reasoning", "text", "tool"]
    text: str = ""
    call: ToolCall | None = None


def _tool_call(block: str) -> ToolCall | None:
    try:
        value = json.loads(block)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], arguments)


def _held(buffer: str, marker: str) -> int:
    """Length of the longest end of ``buffer`` that could begin ``marker``."""
    for n in range(min(len(buffer), len(marker) - 1), 0, -1):
        if marker.startswith(buffer[-n:]):
            return n
    return 0


class HermesStream:
    """Qwen3 / Hermes output read as it grows: ``feed`` each decoded delta, then
    ``finish``. What ``feed`` returns never changes later: text that may still turn out
    to be a marker, a tool call, or whitespace the rules drop is held back."""

    def __init__(self, opened: bool = False) -> None:
        self._buffer = ""
        self._mode: Literal["head", "reasoning", "text"] = "reasoning" if opened else "head"
        self._reasoning: list[str] | None = [] if opened else None
        self._text: list[str] = []
        self._calls: list[ToolCall] = []
        self._newlines = ""  # reasoning: trailing newlines held back
        self._spaces = ""  # text: trailing whitespace held back

    def feed(self, delta: str) -> list[Piece]:
        self._buffer += delta
        out: list[Piece] = []
        while self._step(out):
            pass
        return out

    def finish(self, finish: str) -> tuple[list[Piece], ParsedCompletion]:
        """The last pieces, and the whole completion they add up to with the earlier."""
        out: list[Piece] = []
        rest, self._buffer = self._buffer, ""
        if self._mode == "reasoning":  # cut off while thinking: what it wrote is reasoning
            self._think(rest, out)
        else:
            self._say(rest, out)
            if not self._calls:
                self._say_spaces(out)
        parsed = ParsedCompletion(
            text="".join(self._text),
            reasoning=None if self._reasoning is None else "".join(self._reasoning),
            tool_calls=list(self._calls),
            finish=finish,
        )
        return out, parsed

    # -- one step over the buffer; True while there is more to do --------------------------

    def _step(self, out: list[Piece]) -> bool:
        buffer = self._buffer
        if self._mode == "head":
            head = buffer.lstrip()
            if len(head) < len(THINK_OPEN) and THINK_OPEN.startswith(head):
                return False  # "", or what may yet be "<think>"
            if head.startswith(THINK_OPEN):
                self._buffer, self._mode, self._reasoning = head[len(THINK_OPEN) :], "reasoning", []
            else:
                self._mode = "text"
            return True
        if self._mode == "reasoning":
            end = buffer.find(THINK_CLOSE)
            if end < 0:
                self._emit_unless_marker(THINK_CLOSE, self._think, out)
                return False
            self._think(buffer[:end], out)
            self._newlines = ""  # the newlines before </think> are not reasoning
            self._buffer, self._mode = buffer[end + len(THINK_CLOSE) :], "text"
            return True
        start = buffer.find(CALL_OPEN)
        if start < 0:
            self._emit_unless_marker(CALL_OPEN, self._say, out)
            return False
        end = buffer.find(CALL_CLOSE, start + len(CALL_OPEN))
        self._say(buffer[:start], out)
        if end < 0:
            self._buffer = buffer[start:]  # inside a call: wait for its end
            return False
        call = _tool_call(buffer[start + len(CALL_OPEN) : end].strip())
        if call is None:  # not a call after all: what the model wrote stays text
            self._say(buffer[start : end + len(CALL_CLOSE)], out)
        else:
            self._calls.append(call)
            out.append(Piece("tool", call=call))
        self._buffer = buffer[end + len(CALL_CLOSE) :]
        return True

    def _emit_unless_marker(
        self, marker: str, emit: Callable[[str, list[Piece]], None], out: list[Piece]
    ) -> None:
        """Emit the buffer, all but its end that could still begin ``marker``."""
        keep = len(self._buffer) - _held(self._buffer, marker)
        emit(self._buffer[:keep], out)
        self._buffer = self._buffer[keep:]

    def _think(self, chunk: str, out: list[Piece]) -> None:
        assert self._reasoning is not None
        text = self._newlines + chunk
        if not self._reasoning:
            text = text.lstrip("\n")
        body = text.rstrip("\n")
        self._newlines = text[len(body) :]
        if body:
            self._reasoning.append(body)
            out.append(Piece("reasoning", body))

    def _say(self, chunk: str, out: list[Piece]) -> None:
        if self._calls:
            return  # after a tool call: not part of the reply
        text = self._spaces + chunk
        if not self._text:
            text = text.lstrip()
        body = text.rstrip()
        self._spaces = text[len(body) :]
        if body:
            self._text.append(body)
            out.append(Piece("text", body))

    def _say_spaces(self, out: list[Piece]) -> None:
        if self._spaces and self._text:
            self._text.append(self._spaces)
            out.append(Piece("text", self._spaces))
        self._spaces = ""


def parse_hermes(text: str, finish: str, opened: bool = False) -> ParsedCompletion:
    """Qwen3 / Hermes output: ``<think>`` reasoning, text, ``<tool_call>`` JSON blocks."""
    stream = HermesStream(opened)
    stream.feed(text)
    return stream.finish(finish)[1]


PARSERS = {"hermes": parse_hermes}
STREAMS = {"hermes": HermesStream}


def parser_for_template(template: str | None) -> str:
    """The parser a chat template's output needs; raises ValueError for unknown ones."""
    if template and "<tool_call>" in template:
        return "hermes"
    if template and "tool" not in template:
        return "hermes"  # no tools in the template: only <think> and text to read
    raise ValueError(
        "Forge has no tool-call parser for this chat template (it knows Qwen3/Hermes "
        "<tool_call> JSON); serve a model whose template uses it"
    )
