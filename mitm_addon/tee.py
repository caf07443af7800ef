"""The stream callable that forwards a body's chunks unchanged and keeps a copy of them."""

from __future__ import annotations

import time


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
