"""Shards from the write-ahead log, built away from the proxy's event loop.

The proxy (``mitm_addon.writer``) appends each call's frames to the live WAL segment and
closes that segment every second. A builder reads the closed segments in order, turns
each ended call into its rows (``recorder.build_rows``), buffers them, writes them to
Parquet shards when a rotation limit (rows, bytes, seconds) is reached, and then deletes
the segments whose calls are all in shards. A call in flight when its segment closes has
its BEGIN frame written again in the next one (and an ended call still waiting for its
client's process, its END frame), so a deleted segment takes nothing with it.

By default the builder is a child of the proxy, ``python -m mitm_addon.builder``
(``forge_builder=process``): parsing, hashing and Parquet encoding then take nothing from
the GIL that the proxy's event loop needs. On 2 cores, the same work on a thread of the
proxy cost it a tenth of its throughput, and made its own hooks slower as well.
``forge_builder=thread`` runs the same loop on a thread of the proxy, with no child
process. Recovery, at start, of the segments a killed proxy left uses this class too.

The child reads ``finish`` on its stdin when the proxy has closed the log: it reads every
segment, marks the calls still in flight incomplete, flushes, deletes the segments and
exits 0. End of file without ``finish`` means the proxy died: the child exits at once and
leaves the log to the next proxy's recovery (it holds the log's lock until then). It
ignores SIGINT and SIGTERM, which a terminal or a launcher sends to a whole process
group: the proxy decides when it stops.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import select
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from mitm_addon import wal
from mitm_addon.capture import Capture
from mitm_addon.recorder import build_rows
from mitm_addon.tokens import count_tokens
from pipeline.schema import TABLES
from pipeline.shards import read_column_values, shard_files, write_shard

log = logging.getLogger(__name__)

POLL_S = 0.1  # between looks for newly closed segments
_PROCESS_WAIT_S = 3.0  # an ended call waits this long for its PROC frame, then goes without
_RETRY_S = 1.0  # after a failed flush, before the next try
_FINAL_TRIES = 3  # flushes tried when the proxy stops, before leaving the calls in the WAL
INCOMPLETE_AT_STOP = "the proxy stopped before the call ended"


@dataclass(frozen=True)
class Settings:
    """What a builder needs to know of the proxy's configuration."""

    root: Path  # the run directory (forge_dir): shards under it, the WAL in wal/
    run_id: str  # names this proxy's shards
    rotate_rows: int = 5000
    rotate_bytes: int = 64 * 1024 * 1024
    rotate_seconds: float = 60.0
    max_body_bytes: int = 256 * 1024 * 1024

    @property
    def wal_dir(self) -> Path:
        return self.root / "wal"

    def argv(self) -> list[str]:
        """The child's command-line arguments (``parse_args`` reads them back)."""
        return [
            "--dir",
            str(self.root),
            "--run-id",
            self.run_id,
            "--rotate-rows",
            str(self.rotate_rows),
            "--rotate-bytes",
            str(self.rotate_bytes),
            "--rotate-seconds",
            repr(self.rotate_seconds),
            "--max-body-bytes",
            str(self.max_body_bytes),
        ]


@dataclass
class Report:
    """What reading a set of segments found (the proxy logs it for a recovery)."""

    segments: int = 0
    calls: int = 0  # ended calls turned into rows
    incomplete: int = 0  # calls that began and never ended
    torn_bytes: int = 0
    temporaries: int = 0  # shard files of an interrupted write, removed


@dataclass
class _Buffer:
    calls: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    bytes: int = 0
    since: float | None = None


class Builder:
    """Frames in, shards out. Not thread-safe: one loop drives it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.report = Report()
        self.last_error: str | None = None
        self.calls_written = 0
        self._seen: set[str] = set()  # message and image hashes already stored
        self._call_ids: set[str] = set()
        self._responses: dict[str, str] = {}  # response_id -> the head it continues from
        self._begun: dict[str, dict[str, Any]] = {}  # BEGIN headers of calls not ended yet
        self._waiting: dict[str, tuple[Capture, float]] = {}  # ended, awaiting their PROC
        self._buffer = _Buffer()
        self._endpoints: Counter[tuple[str, str, str, int]] = Counter()
        self._shard_seq = last_shard_seq(settings.root, settings.run_id)
        self._keep_segments = False  # a row could not be stored: keep the WAL for forensics
        self._retry_at = 0.0
        self._read_upto = 0  # the last segment read to its end: flushes delete up to it

    def load(self) -> None:
        """What earlier runs stored: the calls and messages not to store twice."""
        _warm_arrow()
        root = self.settings.root
        self._seen = {
            r["hash"]
            for table in ("messages", "images")
            for r in read_column_values(root, table, ["hash"])
        }
        for r in read_column_values(
            root, "calls", ["call_id", "response_id", "request_head_hash", "response_head_hash"]
        ):
            self._call_ids.add(r["call_id"])
            self._remember_response(r)

    def _remember_response(self, call: dict[str, Any]) -> None:
        """Where a later call naming ``call``'s response in ``previous_response_id``
        continues: its response's last item, or, for a response without output (Codex's
        ``generate: false`` prewarm, which carries the base instructions), its request's."""
        head = call["response_head_hash"] or call["request_head_hash"]
        if call["response_id"] and head:
            self._responses[call["response_id"]] = head

    # -- frames ------------------------------------------------------------------------

    def read_segment(self, seq: int) -> None:
        """Every frame of a closed segment (a full buffer is flushed on the way)."""
        frames, torn = wal.read_frames(wal.segment_path(self.settings.wal_dir, seq).read_bytes())
        self.report.segments += 1
        if torn:
            self.report.torn_bytes += torn
            log.warning("forge: skipped %d bytes of torn WAL frames in segment %d", torn, seq)
        for kind, header, blob in frames:
            try:
                self.add_frame(kind, header, blob)
            except (KeyError, TypeError, ValueError) as e:  # a frame this code cannot use
                self.last_error = f"a WAL frame could not be read: {type(e).__name__}: {e}"
                log.error("forge: %s (segment %d is kept)", self.last_error, seq)
                self._keep_segments = True
        self._read_upto = seq
        b = self._buffer
        if not (b.calls or b.messages or self._endpoints or self._waiting):
            self._remove_read_segments()  # all that was read is in shards already

    def add_frame(self, kind: int, header: dict[str, Any], blob: bytes) -> None:
        """One frame; raises KeyError, TypeError or ValueError for one it cannot use."""
        call_id: str = header["call_id"] if kind != wal.COUNTS else ""
        if kind == wal.BEGIN:
            if call_id not in self._call_ids:
                self._begun[call_id] = header
        elif kind == wal.END:
            self._begun.pop(call_id, None)
            if call_id in self._call_ids or call_id in self._waiting:
                return  # stored already, or written again at a rotation while it waits
            capture = Capture.from_frame(header, blob)
            if header.get("process_pending"):
                self._waiting[call_id] = (capture, time.monotonic() + _PROCESS_WAIT_S)
            else:
                self.add_capture(capture)
        elif kind == wal.PROC:
            entry = self._waiting.pop(call_id, None)
            if entry is not None:
                capture = entry[0]
                if header.get("pid") is not None:
                    capture.set_process(
                        header["pid"],
                        header.get("process_name"),
                        header.get("parent_pids") or [],
                        header.get("rollout_id"),
                    )
                self.add_capture(capture)
        elif kind == wal.COUNTS:
            for host, method, path, status, n in header.get("endpoints", []):
                self._endpoints[(host, method, path, int(status))] += int(n)
        else:
            log.warning("forge: skipped a WAL frame of unknown kind %d", kind)

    def expire_waiting(self, now: float) -> None:
        """Ended calls whose PROC frame is overdue get their rows without the process."""
        for call_id, (capture, deadline) in list(self._waiting.items()):
            if now >= deadline:
                del self._waiting[call_id]
                self.add_capture(capture)

    def finish(self, reason: str = INCOMPLETE_AT_STOP) -> int:
        """Nothing more will be appended: rows for every call still open. A call that began
        and never ended is incomplete; returns how many."""
        for capture, _ in self._waiting.values():
            self.add_capture(capture)
        self._waiting.clear()
        incomplete = 0
        for call_id, header in self._begun.items():
            if call_id in self._call_ids:
                continue
            capture = Capture.from_frame(header, b"")
            capture.incomplete = True
            capture.error = reason
            self.add_capture(capture)
            incomplete += 1
        self._begun.clear()
        self.report.incomplete += incomplete
        return incomplete

    def add_capture(self, capture: Capture) -> None:
        if capture.call_id in self._call_ids:
            return
        s = self.settings
        rows = build_rows(capture, self._responses.get, s.max_body_bytes, count_tokens)
        b = self._buffer
        if b.since is None:
            b.since = time.monotonic()
        b.calls.append(rows.call)
        self._call_ids.add(capture.call_id)
        if not capture.incomplete:  # those that never ended are counted by finish
            self.report.calls += 1
        b.bytes += len(capture.request_body) + len(capture.response_body)
        for m in rows.messages:
            if m["hash"] not in self._seen:
                self._seen.add(m["hash"])
                b.messages.append(m)
        for image in rows.images:
            if image["hash"] not in self._seen:
                self._seen.add(image["hash"])
                b.images.append(image)
        self._remember_response(rows.call)
        full = len(b.calls) >= s.rotate_rows or b.bytes >= s.rotate_bytes
        if full and time.monotonic() >= self._retry_at:
            self.flush()  # a shard holds at most rotate_rows calls, even of one segment

    # -- shards ------------------------------------------------------------------------

    def rotation_due(self, now: float) -> bool:
        b, s = self._buffer, self.settings
        if not b.calls or now < self._retry_at:
            return False
        assert b.since is not None
        return (
            len(b.calls) >= s.rotate_rows
            or b.bytes >= s.rotate_bytes
            or now - b.since >= s.rotate_seconds
        )

    def retry_in(self) -> float:
        """Seconds until a flush that failed may be tried again."""
        return max(0.0, self._retry_at - time.monotonic())

    def flush(self) -> bool:
        """Write what is buffered to shards; then delete the segments read to their end,
        all of whose calls are now in shards. False when nothing could be written (the rows
        stay buffered and the segments on disk, for the next try)."""
        b = self._buffer
        endpoints, self._endpoints = self._endpoints, Counter()
        name = f"{self.settings.run_id}-{self._shard_seq + 1:06d}"
        root = self.settings.root
        try:
            if b.images:  # before the items that refer to them
                write_shard(root, "images", name, b.images)
            if b.messages:
                write_shard(root, "messages", name, b.messages)
            if b.calls:
                write_shard(root, "calls", name, b.calls)
            if endpoints:
                now = datetime.now(UTC)
                rows = [
                    {
                        "run_id": self.settings.run_id,
                        "window_end": now,
                        "host": h,
                        "method": m,
                        "path": p,
                        "status_code": status,
                        "requests": n,
                    }
                    for (h, m, p, status), n in endpoints.items()
                ]
                write_shard(root, "endpoints", name, rows)
        except (pa.ArrowException, ValueError, TypeError) as e:
            # A row Arrow cannot encode must not block every later flush: set the bad rows
            # aside (their calls stay in the WAL, which is then kept) and retry.
            self.last_error = f"rows Arrow cannot store: {e}"
            log.error("forge: %s; those calls stay in the WAL", self.last_error)
            b.calls = _encodable(b.calls, "calls")
            b.messages = _encodable(b.messages, "messages")
            b.images = _encodable(b.images, "images")
            self._endpoints.update(endpoints)
            self._keep_segments = True
            return False
        except OSError as e:
            # Rows stay buffered and their WAL segments stay on disk; retried after a pause.
            self._endpoints.update(endpoints)
            self.last_error = f"cannot write shards to {root}: {e}"
            log.error("forge: %s (calls are kept in the WAL and retried)", self.last_error)
            self._retry_at = time.monotonic() + _RETRY_S
            return False
        if b.images or b.messages or b.calls or endpoints:
            self._shard_seq += 1
        self.calls_written += len(b.calls)
        self._buffer = _Buffer()
        self._remove_read_segments()
        return True

    def _remove_read_segments(self) -> None:
        if self._read_upto and not self._keep_segments:
            wal.remove_segments(self.settings.wal_dir, self._read_upto)
            self.last_error = None


def last_shard_seq(root: Path, run_id: str) -> int:
    """The highest shard number this run has written (0 for none), so that a builder
    started again after a crash never replaces a shard (``write_shard`` would)."""
    pattern = re.compile(rf"{re.escape(run_id)}-(\d+)\.parquet")
    found = [0]
    for table in TABLES:
        for path in shard_files(root, table):
            if m := pattern.fullmatch(path.name):
                found.append(int(m.group(1)))
    return max(found)


def run(builder: Builder, finishing: Callable[[], bool], wait: Callable[[float], object]) -> None:
    """Read closed segments as they appear and flush when a rotation limit is reached,
    until ``finishing()``; then read every segment, close the calls still open, flush
    and delete the segments. ``wait(seconds)`` sleeps between looks (it may return
    early, or raise to abandon the loop)."""
    wal_dir = builder.settings.wal_dir
    read_upto = 0
    while True:
        final = finishing()
        segments = wal.list_segments(wal_dir)
        for seq in segments if final else segments[:-1]:  # the newest is live
            if seq > read_upto:
                builder.read_segment(seq)
                read_upto = seq
        now = time.monotonic()
        builder.expire_waiting(now)
        if final:
            builder.finish()
            for _ in range(_FINAL_TRIES):
                if builder.flush():
                    return
                time.sleep(builder.retry_in())
            log.error("forge: shards could not be written; the calls stay in %s", wal_dir)
            return
        if builder.rotation_due(now):
            builder.flush()
        wait(POLL_S)


def recover(settings: Settings, before_segment: int) -> Report:
    """Rows for the segments a proxy that did not stop cleanly left (numbered below
    ``before_segment``, the live one of the proxy starting now). Calls that began and
    never ended are incomplete. The segments are deleted once their calls are stored."""
    segments = [s for s in wal.list_segments(settings.wal_dir) if s < before_segment]
    builder = Builder(settings)
    if not segments:
        return builder.report
    builder.load()
    for seq in segments:
        builder.read_segment(seq)
    builder.finish()
    if not builder.flush():
        log.error("forge: recovered calls could not be stored yet; they stay in the WAL")
    return builder.report


def _warm_arrow() -> None:
    """Arrow's first conversion of Python rows imports pandas (half a second on 2 cores):
    done here, before any traffic, and not in the first flush, where on the proxy's
    thread (``forge_builder=thread``) it would hold the GIL the event loop needs."""
    for schema in TABLES.values():
        pa.Table.from_pylist([], schema=schema)


def _encodable(rows: list[dict[str, Any]], table: str) -> list[dict[str, Any]]:
    """The rows that Arrow can store under the table's schema (one by one: the slow path)."""
    kept = []
    for row in rows:
        try:
            pa.Table.from_pylist([row], schema=TABLES[table])
            kept.append(row)
        except (pa.ArrowException, ValueError, TypeError) as e:
            log.error(
                "forge: set aside a %s row Arrow cannot store (%s); it stays in the WAL", table, e
            )
    return kept


# -- the child process -------------------------------------------------------------------


class ParentGone(Exception):
    """The proxy that started this builder has died: stop at once, touch nothing more."""


class Commands:
    """The proxy's word on the child's stdin: ``finish``; end of file: the proxy is gone."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.parent = os.getppid()
        self.finishing = False

    def is_finishing(self) -> bool:
        return self.finishing

    def wait(self, seconds: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], seconds)
        if ready:
            data = os.read(self.fd, 4096)
            if b"finish" in data:
                self.finishing = True
            elif not data:
                raise ParentGone
        if os.getppid() != self.parent:
            raise ParentGone


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python -m mitm_addon.builder",
        description="Build a Forge proxy's shards from its write-ahead log (started by the "
        "proxy; stopped by `finish` on stdin).",
    )
    parser.add_argument("--dir", type=Path, required=True, help="the run directory (forge_dir)")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--rotate-rows", type=int, default=Settings.rotate_rows)
    parser.add_argument("--rotate-bytes", type=int, default=Settings.rotate_bytes)
    parser.add_argument("--rotate-seconds", type=float, default=Settings.rotate_seconds)
    parser.add_argument("--max-body-bytes", type=int, default=Settings.max_body_bytes)
    a = parser.parse_args(argv)
    return Settings(
        root=a.dir,
        run_id=a.run_id,
        rotate_rows=a.rotate_rows,
        rotate_bytes=a.rotate_bytes,
        rotate_seconds=a.rotate_seconds,
        max_body_bytes=a.max_body_bytes,
    )


def main(argv: list[str] | None = None) -> int:
    """The child: 0 when it finished and stored everything, 1 when shards could not all be
    written (the calls stay in the WAL), 3 when the proxy died first."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s forge builder: %(message)s"
    )
    settings = parse_args(argv)
    commands = Commands(sys.stdin.fileno())
    builder = Builder(settings)
    try:
        builder.load()
        run(builder, commands.is_finishing, commands.wait)
    except ParentGone:
        return 3
    return 0 if builder.last_error is None else 1


if __name__ == "__main__":
    sys.exit(main())
