"""The completion reader: what a stream sends as the policy samples adds up to the whole
completion, however the text is cut; and the whole completion follows the Hermes rules
(checked against a regular-expression reading written independently here).
Text after a tool call is not part of the reply (vLLM's Hermes parser drops it too)."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from mitm_addon.serve.completion import (
    HermesStream,
    ParsedCompletion,
    Piece,
    ToolCall,
    parse_hermes,
)

CALL = '<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call>'

# Pieces a policy writes: markers, whole and broken tool calls, words, whitespace.
FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    CALL,
    '<tool_call>{"name": "shell", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>',
    "<tool_call>not json</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',
    "<",
    "</",
    "<tool",
    "<thi",
    "\n",
    "\n\n",
    " ",
    "\t",
    "hello",
    "wörld ✓",
    "x<y",
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join)

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def reference(text: str, opened: bool = False) -> ParsedCompletion:
    """The Hermes rules, read with regular expressions."""
    reasoning = None
    if opened or text.lstrip().startswith("<think>"):
        body = text if opened else text.lstrip()[len("<think>") :]
        inner, sep, rest = body.partition("</think>")
        reasoning, text = inner.strip("\n"), rest if sep else ""
    calls, kept, position = [], [], 0
    for match in _BLOCK.finditer(text):
        try:
            value = json.loads(match.group(1))
            arguments = value.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            assert isinstance(value["name"], str) and isinstance(arguments, dict)
        except (ValueError, KeyError, TypeError, AssertionError):
            continue
        calls.append(ToolCall(value["name"], arguments))
        kept.append(text[position : match.start()])
        position = match.end()
    kept.append(text[position:])
    content = kept[0].lstrip()  # text after the first call is not part of the reply
    return ParsedCompletion(content.rstrip() if calls else content, reasoning, calls, "stop")


def streamed(
    text: str, cuts: list[int], opened: bool = False
) -> tuple[list[Piece], ParsedCompletion]:
    """``text`` read as it would arrive cut at ``cuts``: every piece, and the whole."""
    reader = HermesStream(opened)
    pieces: list[Piece] = []
    start = 0
    for cut in sorted(c % (len(text) + 1) for c in cuts):
        pieces += reader.feed(text[start:cut])
        start = max(start, cut)
    pieces += reader.feed(text[start:])
    last, parsed = reader.finish("stop")
    return pieces + last, parsed


@settings(max_examples=400, deadline=None)
@given(texts, st.lists(st.integers(min_value=0, max_value=400), max_size=8), st.booleans())
def test_what_a_stream_sends_adds_up_to_the_whole_completion_however_it_is_cut(
    text: str, cuts: list[int], opened: bool
) -> None:
    pieces, parsed = streamed(text, cuts, opened)
    assert parsed == parse_hermes(text, "stop", opened) == reference(text, opened)
    assert "".join(p.text for p in pieces if p.kind == "text") == parsed.text
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    assert reasoning == (parsed.reasoning or "")
    assert [p.call for p in pieces if p.kind == "tool"] == parsed.tool_calls


def test_text_streams_as_it_comes_and_a_tool_call_when_it_closes() -> None:
    reader = HermesStream()
    assert reader.feed("Let me ") == [Piece("text", "Let me")]  # its space may end the text
    assert reader.feed("look.\n<tool") == [Piece("text", " look.")]  # "<tool" may open a call
    assert reader.feed('_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n') == []
    assert reader.feed("</tool_call>") == [Piece("tool", call=ToolCall("shell", {"command": "ls"}))]
    last, parsed = reader.finish("stop")
    assert last == [] and parsed.text == "Let me look."


def test_reasoning_streams_without_the_newlines_around_it() -> None:
    reader = HermesStream()
    assert reader.feed("<thi") == []
    assert reader.feed("nk>\n\nSo") == [Piece("reasoning", "So")]
    assert reader.feed(" it is.\n\n</th") == [Piece("reasoning", " it is.")]
    assert reader.feed("ink>\n\nDone.") == [Piece("text", "Done.")]
    assert reader.finish("stop")[1] == ParsedCompletion("Done.", "So it is.", [], "stop")


def test_a_block_that_is_not_a_call_stays_text_and_a_cut_off_one_too() -> None:
    assert parse_hermes("a <tool_call>not json</tool_call>", "stop").text == (
        "a <tool_call>not json</tool_call>"
    )
    assert parse_hermes('<tool_call>{"name": "shell"', "length").text == (
        '<tool_call>{"name": "shell"'
    )
    assert parse_hermes("<think>still thinking", "length") == ParsedCompletion(
        "", "still thinking", [], "length"
    )
