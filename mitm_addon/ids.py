"""Sortable ids: 12 hex digits of milliseconds since the epoch, a counter, random digits."""

from __future__ import annotations

import itertools
import random
import time

# ``next`` on a count is atomic under the GIL, so threads never share a counter value. The
# random digits only keep ids of different processes apart; ``random`` is reseeded from the
# OS in a forked child. One id is made per call on the proxy's event loop, so it avoids a
# lock and a getrandom(2) system call.
_counter = itertools.count()


def new_id(prefix: str = "") -> str:
    """``prefix`` + ``<ms:12x><counter:06x><random:6x>``: sorts by creation time, unique per process."""
    n = next(_counter) & 0xFFFFFF
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{n:06x}{random.getrandbits(24):06x}"
