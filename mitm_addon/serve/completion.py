"""The policy's completion text parsed back into reasoning, text and tool calls (pure).

Parsers are chosen per chat template: ``hermes`` reads Qwen3 / Hermes output, where
reasoning sits in ``<think>...</think>`` and each tool call is a JSON object
``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``. A
block whose JSON does not parse stays in the text: the harness sees what the model
wrote rather than a call it did not make.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


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


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, rest): the ``<think>`` block the model opened (or the template opened
    for it, when only ``</think>`` appears) and the text after it."""
    head = text.lstrip()
    if head.startswith(THINK_OPEN):
        inner, sep, rest = head[len(THINK_OPEN) :].partition(THINK_CLOSE)
        if not sep:  # cut off while thinking
            return inner.strip("\n"), ""
        return inner.strip("\n"), rest.lstrip("\n")
    if THINK_CLOSE in text and THINK_OPEN not in text:
        inner, _, rest = text.partition(THINK_CLOSE)
        return inner.strip("\n"), rest.lstrip("\n")
    return None, text


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


def parse_hermes(text: str, finish: str) -> ParsedCompletion:
    """Qwen3 / Hermes output: ``<think>`` reasoning, text, ``<tool_call>`` JSON blocks."""
    reasoning, rest = split_reasoning(text)
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _TOOL_CALL.finditer(rest):
        call = _tool_call(match.group(1))
        if call is None:
            continue
        calls.append(call)
        kept.append(rest[position : match.start()])
        position = match.end()
    kept.append(rest[position:])
    content = "".join(kept)
    return ParsedCompletion(
        text=content.strip() if calls else content,
        reasoning=reasoning,
        tool_calls=calls,
        finish=finish,
    )


PARSERS = {"hermes": parse_hermes}


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
