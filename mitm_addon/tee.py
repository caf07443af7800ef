"""The stream callables that forward a body's chunks unchanged and keep a copy of them:
``Tee`` for requests, ``ReplyTee`` for responses (it holds the reply's last bytes until
the call's end is logged)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

# The line that starts each API's last SSE event: a client that has it has the whole
# reply and may stop reading (Codex does), before the body's end reaches it.
_LAST_EVENT = re.compile(
    rb"\n(?:data: ?\[DONE\]|event: ?(?:message_stop|error|"
    rb"response\.(?:completed|failed|incomplete))\s)"
)
_EVENT_END = re.compile(rb"\n\r?\n")  # the blank line that ends an event
_TAIL = 48  # bytes of a chunk kept to find a last-event line split across two chunks


class Tee:
    """A body's stream callable: forwards each chunk unchanged and keeps a copy (up to
    ``limit`` bytes; past it the copy is marked truncated, and the chunks still pass)."""

    __slots__ = ("chunks", "size", "limit", "truncated", "first_at")

    def __init__(self, limit: int) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.truncated = False
        self.first_at: float | None = None

    def __call__(self, data: bytes) -> bytes:
        if data:
            if self.first_at is None:
                self.first_at = time.time()
            self.size += len(data)
            if self.size <= self.limit:
                self.chunks.append(data)
            else:
                self.truncated = True
        return data

    def body(self) -> bytes:
        return b"".join(self.chunks)


class ReplyTee(Tee):
    """A response's tee that keeps the reply's last bytes from the client until ``finish``
    (which logs the call's end) has returned, so that a client never has a whole reply
    the write-ahead log does not.

    Which bytes are last: with a ``Content-Length``, the chunk that completes it; in an
    event stream, the API's last event, from the chunk where it starts to the blank line
    that ends it (a client may stop reading there, before the body's end). Once they are
    all here, ``finish`` runs and they pass; bytes after them pass as they come. Any
    other body ends only when mitmproxy sends its end (the last chunk of a chunked body,
    a closed connection), which it does after the ``response`` hook, where the end is
    logged; its chunks pass at once.
    """

    __slots__ = ("finish", "length", "events", "held", "_tail", "_last_at")

    def __init__(
        self, limit: int, finish: Callable[[], None], *, length: int | None, events: bool
    ) -> None:
        super().__init__(limit)
        self.finish: Callable[[], None] | None = finish
        self.length = length
        self.events = events
        self.held: list[bytes] = []
        self._tail = b"\n"  # the body's start is a line's start
        self._last_at = -1  # where the last event starts in b"".join(held), once seen

    def __call__(self, data: bytes) -> Sequence[bytes]:  # type: ignore[override]
        if not data:  # the body's end upstream: whatever is held is the last of it
            return self._release()
        super().__call__(data)
        if self.finish is None:  # the end is logged: the rest passes
            return (data,)
        if self.length is not None:
            return self._release([data]) if self.size >= self.length else (data,)
        if not self.events:
            return (data,)
        if self._last_at < 0:
            at = self._find_last_event(data)
            if at < 0:
                return (data,)
            self._last_at = at
        self.held.append(data)
        held = b"".join(self.held)
        if _EVENT_END.search(held, self._last_at) is None:
            return ()
        return self._release()

    def _find_last_event(self, data: bytes) -> int:
        """Where in ``data`` the line that starts the last event begins (0 when it began in
        the chunk before), or -1. The chunk is searched in place, and the seam with the
        chunk before through a short window, so that no chunk is copied whole."""
        tail = self._tail
        seam = tail + data[:_TAIL]
        self._tail = data[-_TAIL:] if len(data) >= _TAIL else (tail + data)[-_TAIL:]
        found = _LAST_EVENT.search(seam)
        if found is not None:
            return max(0, found.start() + 1 - len(tail))
        found = _LAST_EVENT.search(data)
        return -1 if found is None else found.start() + 1

    def _release(self, more: Sequence[bytes] = ()) -> Sequence[bytes]:
        """Log the end (once), then let the held bytes go."""
        finish, self.finish = self.finish, None
        if finish is not None:
            finish()
        held, self.held = [*self.held, *more], []
        return held
