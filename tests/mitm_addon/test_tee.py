"""The tees: what passes is what came, and a reply's last bytes wait for its end record."""

from __future__ import annotations

import pytest

from mitm_addon.tee import ReplyTee, Tee

STREAMS = {
    "openai_chat": b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
    b'data: {"choices": [], "usage": {}}\n\ndata: [DONE]\n\n',
    "anthropic_messages": b'event: message_delta\ndata: {"type": "message_delta"}\n\n'
    b'event: message_stop\ndata: {"type": "message_stop"}\n\n',
    "openai_responses": b'event: response.output_text.delta\ndata: {"delta": "hi"}\n\n'
    b'event: response.completed\ndata: {"type": "response.completed"}\n\n',
    "anthropic_error": b'event: ping\ndata: {}\n\nevent: error\ndata: {"type": "error"}\n\n',
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_at_every_split_the_last_event_passes_only_after_the_end_is_logged(name: str) -> None:
    body = STREAMS[name]
    for cut in range(1, len(body)):
        for second in (cut + 1, (cut + len(body)) // 2, len(body)):
            chunks = [c for c in (body[:cut], body[cut:second], body[second:]) if c]
            delivered = [b""]
            at_end: list[bytes] = []  # what the client had when the end was logged
            tee = ReplyTee(
                1 << 20,
                lambda at_end=at_end, delivered=delivered: at_end.append(delivered[0]),
                length=None,
                events=True,
            )
            for chunk in [*chunks, b""]:
                delivered[0] += b"".join(tee(chunk))
            assert delivered[0] == body, (cut, second)
            (before,) = at_end  # logged once
            assert len(before) < len(body) and body.startswith(before), (cut, second)


def test_a_stream_without_its_last_event_passes_at_once_and_ends_at_its_end() -> None:
    logged: list[int] = []
    tee = ReplyTee(1 << 20, lambda: logged.append(1), length=None, events=True)
    chunks = [b'data: {"a": 1}\n\n', b'data: {"text": "say data: [DONE] then event: error"}\n\n']
    assert [b"".join(tee(c)) for c in chunks] == chunks and logged == []
    assert list(tee(b"")) == [] and logged == [1]


def test_with_a_length_the_chunk_that_completes_it_waits_for_the_end() -> None:
    order: list[str] = []
    tee = ReplyTee(1 << 20, lambda: order.append("end"), length=10, events=False)
    order.append(b"".join(tee(b"0123")).decode())
    order.append(b"".join(tee(b"456789")).decode())
    assert order == ["0123", "end", "456789"]
    assert list(tee(b"")) == [] and order.count("end") == 1


def test_a_json_body_without_a_length_is_not_held() -> None:
    tee = ReplyTee(1 << 20, lambda: None, length=None, events=False)
    assert list(tee(b'{"a": ')) == [b'{"a": '] and list(tee(b"1}")) == [b"1}"]


def test_tee_keeps_a_copy_up_to_its_limit_and_passes_everything() -> None:
    tee = Tee(4)
    assert tee(b"ab") == b"ab" and tee(b"cdef") == b"cdef"
    assert tee.body() == b"ab" and tee.truncated and tee.size == 6
