"""Append-only write-ahead log of recorded calls, in numbered segments.

A frame is ``FWL1 | kind u8 | header_len u32 | blob_len u32 | header | blob | crc32 u32``;
the header is a JSON object. Frames are appended with one ``write(2)`` each on an
``O_APPEND`` descriptor, so a frame is in the kernel before the harness receives the end
of its response and a SIGKILL cannot lose it; ``sync()`` (fsync) runs from a thread of
its own to survive power loss too, without holding the lock the hooks append under: an
fsync takes milliseconds, and the event loop must not wait for the disk.

The newest segment is the live one; the proxy closes it (starts the next) every second,
and the shard builder (``mitm_addon.builder``) reads closed segments only. A torn or
corrupt frame (a write cut short by a kill or a full disk) is skipped: reading resumes
at the next frame whose checksum holds.
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

from pipeline.atomic import fsync_dir

log = logging.getLogger(__name__)

MAGIC = b"FWL1"
BEGIN = 1  # a call started (header only)
END = 2  # a call ended (header + bodies); "process_pending": a PROC frame follows
PROC = 3  # the client process of an ended call, once its lookup finished (header only)
COUNTS = 4  # {"endpoints": [[host, method, path, status, requests], ...]} of non-model calls
_HEAD = struct.Struct("<4sBII")
_CRC = struct.Struct("<I")


def encode_frame(kind: int, header: bytes, *blob: bytes) -> bytes:
    """One frame; the blob may come in parts (a call's request and response bodies), which
    are then copied once, into the frame."""
    crc = zlib.crc32(header)
    for part in blob:
        crc = zlib.crc32(part, crc)
    size = sum(map(len, blob))
    return b"".join((_HEAD.pack(MAGIC, kind, len(header), size), header, *blob, _CRC.pack(crc)))


def read_frames(data: bytes) -> tuple[list[tuple[int, dict[str, Any], bytes]], int]:
    """(frames, bytes skipped: torn or corrupt frames, and a torn tail).

    After a bad frame, reading resumes at the next ``FWL1`` that starts a frame whose
    checksum holds, so a write cut short mid-segment loses only its own frame."""
    frames: list[tuple[int, dict[str, Any], bytes]] = []
    pos = skipped = 0
    size = len(data)
    while pos + _HEAD.size <= size:
        magic, kind, hlen, blen = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + hlen + blen + _CRC.size
        frame = None
        if magic == MAGIC and end <= size:
            header = data[pos + _HEAD.size : pos + _HEAD.size + hlen]
            blob = data[pos + _HEAD.size + hlen : end - _CRC.size]
            (crc,) = _CRC.unpack_from(data, end - _CRC.size)
            if crc == zlib.crc32(blob, zlib.crc32(header)):
                try:
                    value = json.loads(header)
                except ValueError:
                    value = None
                if isinstance(value, dict):
                    frame = (kind, value, blob)
        if frame is not None:
            frames.append(frame)
            pos = end
            continue
        resume = data.find(MAGIC, pos + 1)
        if resume < 0:
            break
        skipped += resume - pos
        pos = resume
    return frames, skipped + (size - pos)


def segment_path(directory: Path, seq: int) -> Path:
    return directory / f"{seq:08d}.wal"


def list_segments(directory: Path) -> list[int]:
    """The segments' numbers, oldest first (the last one is live while a proxy runs)."""
    return sorted(int(p.stem) for p in directory.glob("*.wal") if p.stem.isdigit())


def remove_segments(directory: Path, upto: int, keep: int | None = None) -> None:
    """Delete the segments numbered <= upto (their calls are in shards), but ``keep``."""
    for seq in list_segments(directory):
        if seq <= upto and seq != keep:
            segment_path(directory, seq).unlink(missing_ok=True)
    fsync_dir(directory)


class WalBusy(OSError):
    """Another live proxy holds the log's directory (it records into the same run)."""


LOCK_FILE = ".lock"
# Longer than a proxy takes to stop: its writer waits up to 30 s for the builder to store
# every call (writer._STOP_TIMEOUT_S), so a proxy whose launcher was killed can hold the
# directory for that long after the launcher's successor starts; shorter than the
# launcher's 60 s wait for the new proxy to be ready (launch.proxy._READY_TIMEOUT_S).
LOCK_WAIT_S = 45.0


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
        fsync_dir(directory)
        self._dirty = False
        self._dir_dirty = False  # a segment was made since the directory's last fsync
        self._retired: list[int] = []  # descriptors of rotated segments, not yet synced

    def _open(self, seq: int) -> int:
        return os.open(self.path(seq), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def segments(self) -> list[int]:
        return list_segments(self.directory)

    def path(self, seq: int) -> Path:
        return segment_path(self.directory, seq)

    def append_locked(self, frame: bytes) -> None:
        """Append one frame; the caller holds ``lock``. Raises OSError (disk full, ...)."""
        view = memoryview(frame)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._dirty = True

    def rotate_locked(self) -> int:
        """Start a new segment; returns the number of the one closed. Caller holds ``lock``.

        The closed segment is synced (and closed) by the next ``sync``, outside the lock."""
        old = self.seq
        new_fd = self._open(self.seq + 1)
        self._retired.append(self._fd)
        self.seq += 1
        self._fd = new_fd
        self._dirty = self._dir_dirty = True
        return old

    def sync(self) -> None:
        """fsync what was appended (and rotated segments, and the directory) since the last
        call. Holds ``lock`` only to take the descriptors; appends go on meanwhile."""
        with self.lock:
            if self._fd < 0 or not (self._dirty or self._retired or self._dir_dirty):
                return
            retired, live = self._retired, os.dup(self._fd)
            self._retired = []
            sync_dir, self._dir_dirty, self._dirty = self._dir_dirty, False, False
        try:
            for fd in (*retired, live):
                os.fsync(fd)
            if sync_dir:
                fsync_dir(self.directory)
        except OSError:
            with self.lock:  # tried again next time
                self._retired = retired + self._retired
                self._dirty = self._dir_dirty = True
            os.close(live)
            raise
        for fd in (*retired, live):
            os.close(fd)

    def remove(self, upto: int) -> None:
        """Delete the closed segments numbered <= upto (their calls are in shards)."""
        remove_segments(self.directory, upto, keep=self.seq)

    @property
    def lock_fd(self) -> int:
        """The descriptor holding the directory's flock (a child that inherits it holds
        the lock until it exits too)."""
        return self._lock_fd

    def close_segment(self) -> None:
        """fsync and close the live segment, keeping the directory's lock: appends fail
        from now on, and the builder may read every segment as closed."""
        self.sync()
        with self.lock:
            for fd in self._retired:
                os.close(fd)
            self._retired = []
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1

    def close(self) -> None:
        """Close the live segment and release the directory's lock."""
        try:
            self.close_segment()
        finally:
            with self.lock:
                if self._lock_fd >= 0:
                    os.close(self._lock_fd)  # releases the flock (unless a child holds it too)
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
