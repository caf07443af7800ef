"""Incremental server-sent-events parser (the WHATWG event-stream rules), pure.

Bytes go in as they arrive off the wire, split anywhere (inside a UTF-8 sequence,
inside a CRLF pair); complete events come out. Lines end with CRLF, LF or CR; a
blank line dispatches the event; ``data`` lines are joined with LF; ``event``
names the type; ``id`` sets the last event id, which persists across events;
lines starting with ``:`` are comments. Invalid UTF-8 becomes U+FFFD instead of
raising, because a recorder must keep whatever the server sent.

The standard discards an event that is still open when the stream ends; a
recorder wants to know about it, so ``SseDecoder.close`` returns it separately
(the caller decides whether a truncated event means a truncated response).
"""

from __future__ import annotations

import codecs
import re

from mitm_addon.protocols.base import SseEvent

__all__ = ["SseDecoder", "parse_sse", "parse_sse_with_incomplete"]

# One line terminator: CRLF, LF, or a lone CR.
_LINE_END = re.compile(r"\r\n|\r|\n")
_BOM = "\ufeff"


class SseDecoder:
    """Feed bytes, get complete events; ``close`` returns the unterminated tail event."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending: list[str] = []  # text of the line not yet terminated
        self._skip_lf = False  # the last chunk ended in CR: a leading LF belongs to it
        self._at_start = True  # a BOM is stripped only at the very start of the stream
        self._data: list[str] = []
        self._event_type = ""
        self._last_id: str | None = None
        self._closed = False

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events that this chunk completes, in order."""
        if self._closed:
            raise ValueError("SseDecoder.feed after close")
        return self._feed_text(self._decoder.decode(chunk, final=False))

    def close(self) -> list[SseEvent]:
        """End of stream: the event left open (no final blank line), if it carries data."""
        if self._closed:
            return []
        self._closed = True
        # The decoder can only hold back part of a UTF-8 sequence, which flushes as
        # U+FFFD and never contains a line end: it joins the unterminated last line.
        self._feed_text(self._decoder.decode(b"", final=True))
        if self._pending:
            # The last line had no terminator: it still belongs to the open event.
            self._process_line("".join(self._pending))
            self._pending = []
        tail = self._take_event()
        return [tail] if tail is not None else []

    def _feed_text(self, text: str) -> list[SseEvent]:
        if not text:
            return []
        if self._at_start:
            self._at_start = False
            if text.startswith(_BOM):
                text = text[1:]
        if self._skip_lf:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        if "\n" not in text and "\r" not in text:
            if text:
                self._pending.append(text)
            return []
        if self._pending:
            text = "".join(self._pending) + text
            self._pending = []
        events: list[SseEvent] = []
        start = 0
        for match in _LINE_END.finditer(text):
            line = text[start : match.start()]
            start = match.end()
            if match.group() == "\r" and start == len(text):
                # A CR at the end of the chunk: the next chunk may start with its LF.
                self._skip_lf = True
            if not line:
                event = self._take_event()
                if event is not None:
                    events.append(event)
            else:
                self._process_line(line)
        if start < len(text):
            self._pending.append(text[start:])
        return events

    def _process_line(self, line: str) -> None:
        if line.startswith(":"):
            return  # comment (servers send these as keep-alives)
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event_type = value
        elif field == "id" and "\0" not in value:
            self._last_id = value
        # "retry" and unknown fields do not change the events.

    def _take_event(self) -> SseEvent | None:
        """Dispatch the buffered event (None when it carries no data line) and reset."""
        data, event_type = self._data, self._event_type
        self._data, self._event_type = [], ""
        if not data:
            return None
        return SseEvent(event=event_type or None, data="\n".join(data), id=self._last_id)


def parse_sse_with_incomplete(data: bytes) -> tuple[list[SseEvent], list[SseEvent]]:
    """(complete events, the unterminated tail event if any) of a whole event stream."""
    decoder = SseDecoder()
    complete = decoder.feed(data)
    return complete, decoder.close()


def parse_sse(data: bytes) -> list[SseEvent]:
    """The complete events of a whole event stream (an unterminated tail is dropped)."""
    return parse_sse_with_incomplete(data)[0]
