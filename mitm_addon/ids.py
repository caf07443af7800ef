"""Sortable ids: 12 hex digits of milliseconds since the epoch, a counter, random digits."""

from __future__ import annotations

import itertools
import os
import threading
import time

_counter = itertools.count()
_lock = threading.Lock()


def new_id(prefix: str = "") -> str:
    """``prefix`` + ``<ms:12x><counter:06x><random:6x>``: sorts by creation time, unique per process."""
    with _lock:
        n = next(_counter) & 0xFFFFFF
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{n:06x}{os.urandom(3).hex()}"
