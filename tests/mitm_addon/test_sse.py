"""The incremental SSE decoder against the WHATWG event-stream rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mitm_addon.protocols.base import SseEvent
from mitm_addon.sse import SseDecoder, parse_sse, parse_sse_with_incomplete

WIRE = Path(__file__).parent.parent / "fixtures" / "wire"
SSE_FIXTURES = sorted(WIRE.glob("*/*.sse"))


def reference_parse(data: bytes) -> tuple[list[SseEvent], list[SseEvent]]:
    """The same rules written as one loop over the whole stream (no chunking)."""
    text = data.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = re.split(r"\r\n|\r|\n", text)
    terminated = lines[:-1]  # the last piece has no line end after it
    complete: list[SseEvent] = []
    data_lines: list[str] = []
    event_type = ""
    last_id: str | None = None

    def apply(line: str) -> None:
        nonlocal event_type, last_id
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data_lines.append(value)
        elif name == "event":
            event_type = value
        elif name == "id" and "\0" not in value:
            last_id = value

    for line in terminated:
        if line == "":
            if data_lines:
                complete.append(SseEvent(event_type or None, "\n".join(data_lines), last_id))
            data_lines.clear()
            event_type = ""
        else:
            apply(line)
    if lines[-1]:
        apply(lines[-1])
    tail = [SseEvent(event_type or None, "\n".join(data_lines), last_id)] if data_lines else []
    return complete, tail


def feed_in_chunks(data: bytes, cuts: list[int]) -> tuple[list[SseEvent], list[SseEvent]]:
    decoder = SseDecoder()
    events: list[SseEvent] = []
    previous = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        events.extend(decoder.feed(data[previous:cut]))
        previous = cut
    return events, decoder.close()


def test_blank_line_dispatches_an_event_with_its_type() -> None:
    stream = b"event: message_start\ndata: {}\n\ndata: plain\n\n"
    assert parse_sse(stream) == [
        SseEvent(event="message_start", data="{}"),
        SseEvent(event=None, data="plain"),
    ]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_gives_the_same_events(newline: bytes) -> None:
    stream = newline.join([b"event: a", b"data: 1", b"", b"data: 2", b"data: 3", b"", b""])
    assert parse_sse(stream) == [SseEvent("a", "1"), SseEvent(None, "2\n3")]


def test_data_lines_join_with_newlines_and_keep_empty_ones() -> None:
    assert parse_sse(b"data: a\ndata:\ndata\ndata: b\n\n") == [SseEvent(None, "a\n\n\nb")]


def test_only_one_leading_space_is_removed_from_a_value() -> None:
    assert parse_sse(b"data:  two\n\ndata:none\n\n") == [
        SseEvent(None, " two"),
        SseEvent(None, "none"),
    ]


def test_comments_retry_and_unknown_fields_are_ignored() -> None:
    stream = b": keep-alive\nretry: 1000\nfoo: bar\ndata: x\n: another\n\n"
    assert parse_sse(stream) == [SseEvent(None, "x")]


def test_an_event_without_data_is_not_dispatched_and_resets_its_type() -> None:
    assert parse_sse(b"event: lonely\n\ndata: x\n\n") == [SseEvent(None, "x")]


def test_last_event_id_persists_and_ignores_ids_with_nul() -> None:
    stream = b"id: 7\ndata: a\n\ndata: b\n\nid: bad\x00\ndata: c\n\nid\ndata: d\n\n"
    assert [e.id for e in parse_sse(stream)] == ["7", "7", "7", ""]


def test_a_leading_bom_is_stripped_once() -> None:
    assert parse_sse(b"\xef\xbb\xbfdata: x\n\n") == [SseEvent(None, "x")]
    # A second BOM is part of the field name, so the line is an unknown field.
    assert parse_sse(b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n") == []


def test_trailing_event_without_blank_line_is_reported_as_incomplete() -> None:
    stream = b'data: done\n\ndata: {"partial"\n'
    complete, tail = parse_sse_with_incomplete(stream)
    assert complete == [SseEvent(None, "done")]
    assert tail == [SseEvent(None, '{"partial"')]
    assert parse_sse(stream) == complete
    # An unterminated last line still belongs to the open event.
    assert parse_sse_with_incomplete(b"data: a\ndata: b")[1] == [SseEvent(None, "a\nb")]
    decoder = SseDecoder()
    assert decoder.feed(b"event: x\ndata: 1") == []
    assert decoder.close() == [SseEvent("x", "1")]
    assert decoder.close() == []


def test_a_stream_ending_on_a_blank_line_has_no_incomplete_event() -> None:
    assert parse_sse_with_incomplete(b"data: a\n\n")[1] == []
    assert parse_sse_with_incomplete(b"data: a\n\n: trailing comment\n")[1] == []


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\r") == []
    # If the LF were a second line end, it would dispatch here as a blank line.
    assert decoder.feed(b"\ndata: b\r") == []
    assert decoder.feed(b"\n\r") == [SseEvent(None, "a\nb")]
    assert decoder.feed(b"\n") == []
    assert decoder.close() == []


def test_a_multibyte_character_split_across_chunks_survives() -> None:
    data = "data: 18 °C ☔\n\n".encode()
    split = data.index("☔".encode()) + 1
    decoder = SseDecoder()
    assert decoder.feed(data[:split]) == []
    assert decoder.feed(data[split:]) == [SseEvent(None, "18 °C ☔")]


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert parse_sse(b"data: \xff\xfe ok\n\n") == [SseEvent(None, "\ufffd\ufffd ok")]
    # A sequence cut off by the end of the stream also becomes U+FFFD.
    assert parse_sse_with_incomplete(b"data: \xe2\x82")[1] == [SseEvent(None, "\ufffd")]


def test_feeding_after_close_is_an_error() -> None:
    decoder = SseDecoder()
    decoder.close()
    with pytest.raises(ValueError):
        decoder.feed(b"data: x\n\n")


@pytest.mark.parametrize("path", SSE_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_streams_parse_to_complete_events_only(path: Path) -> None:
    complete, tail = parse_sse_with_incomplete(path.read_bytes())
    assert complete and tail == []
    assert (complete, tail) == reference_parse(path.read_bytes())


_field = st.sampled_from(["data", "event", "id", "retry", "", "x", "da"])
_value = st.text(st.sampled_from('ab :é☔\x00{}"\\'), max_size=6)
_line = st.one_of(
    st.builds(lambda f, v: f"{f}: {v}", _field, _value),
    st.builds(lambda f, v: f"{f}:{v}", _field, _value),
    st.sampled_from(["", "", "data", ": comment", "\ufeffdata: bom"]),
)
_newline = st.sampled_from(["\n", "\r\n", "\r"])
_stream = st.builds(
    lambda lines, ends, bom, junk: (
        (
            ("\ufeff" if bom else "")
            + "".join(line + end for line, end in zip(lines, ends, strict=False))
        ).encode()
        + junk
    ),
    st.lists(_line, max_size=25),
    st.lists(_newline, min_size=25, max_size=25),
    st.booleans(),
    st.sampled_from([b"", b"\xff", b"\xe2\x82", b"data: tail", b"\r"]),
)


@settings(database=None, max_examples=300, deadline=None)
@given(data=_stream, cuts=st.lists(st.integers(0, 400), max_size=12))
def test_chunk_boundaries_do_not_change_events(data: bytes, cuts: list[int]) -> None:
    cuts = [c for c in cuts if c <= len(data)]
    assert feed_in_chunks(data, cuts) == reference_parse(data)


@settings(database=None, max_examples=60, deadline=None)
@given(
    index=st.integers(0, len(SSE_FIXTURES) - 1),
    cuts=st.lists(st.integers(0, 10**6), max_size=40),
)
def test_chunk_boundaries_do_not_change_fixture_events(index: int, cuts: list[int]) -> None:
    data = SSE_FIXTURES[index].read_bytes()
    cuts = [c % (len(data) + 1) for c in cuts]
    assert feed_in_chunks(data, cuts) == (parse_sse(data), [])


def test_one_byte_chunks_give_the_same_events_as_one_chunk() -> None:
    for path in SSE_FIXTURES:
        data = path.read_bytes()
        assert feed_in_chunks(data, list(range(len(data)))) == (parse_sse(data), [])
