"""Append-only write-ahead log of completed calls, in numbered segments.

A frame is ``FWL1 | kind u8 | header_len u32 | blob_len u32 | header | blob | crc32 u32``.
Frames are appended with one ``write(2)`` each on an ``O_APPEND`` descriptor, so a
frame is in the kernel before the harness receives the end of its response and a
SIGKILL cannot lose it; ``sync()`` (fsync) runs from the writer thread to survive
power loss too. Reading stops at the first torn or corrupt frame.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAGIC = b"FWL1"
BEGIN = 1  # a call started (header only)
END = 2  # a call ended (header + bodies)
_HEAD = struct.Struct("<4sBII")
_CRC = struct.Struct("<I")


def encode_frame(kind: int, header: bytes, blob: bytes) -> bytes:
    crc = zlib.crc32(blob, zlib.crc32(header))
    return b"".join((_HEAD.pack(MAGIC, kind, len(header), len(blob)), header, blob, _CRC.pack(crc)))


def read_frames(data: bytes) -> tuple[list[tuple[int, dict[str, Any], bytes]], int]:
    """(frames, bytes of a torn or corrupt tail that were skipped)."""
    frames: list[tuple[int, dict[str, Any], bytes]] = []
    pos = 0
    while pos + _HEAD.size <= len(data):
        magic, kind, hlen, blen = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + hlen + blen + _CRC.size
        if magic != MAGIC or end > len(data):
            break
        header = data[pos + _HEAD.size : pos + _HEAD.size + hlen]
        blob = data[pos + _HEAD.size + hlen : end - _CRC.size]
        (crc,) = _CRC.unpack_from(data, end - _CRC.size)
        if crc != zlib.crc32(blob, zlib.crc32(header)):
            break
        try:
            frames.append((kind, json.loads(header), blob))
        except ValueError:
            break
        pos = end
    return frames, len(data) - pos


class WalBusy(OSError):
    """Another live proxy holds the log's directory (it records into the same run)."""


LOCK_FILE = ".lock"
LOCK_WAIT_S = 30.0


class Wal:
    """Segments ``<dir>/NNNNNNNN.wal``; the newest is open for appending.

    One proxy at a time owns a directory (an exclusive ``flock`` on ``.lock``, released
    when the process ends however it ends): a second proxy recording into the same run
    waits for the first to finish, up to ``lock_wait_s``, then raises ``WalBusy``, since
    reading a live proxy's segments as an earlier run's would record its calls twice.
    """

    def __init__(self, directory: Path, lock_wait_s: float = LOCK_WAIT_S) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_directory(directory, lock_wait_s)
        self.lock = threading.Lock()
        existing = self.segments()
        self.seq = (existing[-1] + 1) if existing else 1
        self._fd = self._open(self.seq)
        self._dirty = False

    def _open(self, seq: int) -> int:
        path = self.directory / f"{seq:08d}.wal"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        _fsync_dir(self.directory)
        return fd

    def segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.directory.glob("*.wal") if p.stem.isdigit())

    def path(self, seq: int) -> Path:
        return self.directory / f"{seq:08d}.wal"

    def append_locked(self, frame: bytes) -> None:
        """Append one frame; the caller holds ``lock``. Raises OSError (disk full, ...)."""
        view = memoryview(frame)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._dirty = True

    def rotate_locked(self) -> int:
        """Start a new segment; returns the number of the one closed. Caller holds ``lock``."""
        old = self.seq
        os.fsync(self._fd)
        os.close(self._fd)
        self.seq += 1
        self._fd = self._open(self.seq)
        self._dirty = False
        return old

    def sync(self) -> None:
        with self.lock:
            if self._dirty:
                os.fsync(self._fd)
                self._dirty = False

    def remove(self, upto: int) -> None:
        """Delete the closed segments numbered <= upto (their calls are in shards)."""
        for seq in self.segments():
            if seq <= upto and seq != self.seq:
                self.path(seq).unlink(missing_ok=True)
        _fsync_dir(self.directory)

    def close(self) -> None:
        with self.lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = -1


def _lock_directory(directory: Path, wait_s: float) -> int:
    """An exclusive flock on ``directory/.lock`` (holding this process's pid), waiting up
    to ``wait_s`` for another holder to let go."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            if time.monotonic() >= deadline:
                os.close(fd)
                raise WalBusy(
                    f"another Forge proxy (pid {holder}) is recording into {directory.parent}; "
                    "stop it or record into another directory"
                ) from None
            if not said:
                log.warning("forge: waiting for the proxy (pid %s) recording into %s to stop",
                            holder, directory.parent)  # fmt: skip
                said = True
            time.sleep(0.2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
