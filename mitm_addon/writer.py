"""The recorder's I/O: WAL appends from the hooks, parsing and shards on a worker thread.

Hooks call ``begin`` and ``end``; each writes one WAL frame (a single ``write(2)``,
microseconds) and ``end`` hands the capture to the worker. The worker parses,
hashes and buffers rows, and flushes them to Parquet shards when a rotation limit
(rows, bytes, seconds) is reached; a shard's WAL segments are deleted only after
the shard is durable. ``start`` first recovers the segments a killed proxy left.

The worker takes finished calls in batches, every ``_BATCH_S`` or as soon as
``_BATCH_CALLS`` wait. Waking the thread for each call (a ``queue.Queue``) made the
event loop hand the GIL over for each call, which cost more than the parsing: about
0.5 ms of the proxy's CPU per call on 2 cores. A call is durable once its WAL frame
is written, so the wait delays only its shard.
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from mitm_addon import wal as wal_mod
from mitm_addon.attribution import ProcessInfo
from mitm_addon.capture import Capture, dumps
from mitm_addon.config import Config
from mitm_addon.recorder import build_rows
from mitm_addon.tokens import count_tokens
from pipeline.schema import TABLES
from pipeline.shards import read_column_values, remove_stale_temporaries, write_shard

log = logging.getLogger(__name__)

_BATCH_S = 0.05  # the worker's longest sleep while calls wait
_BATCH_CALLS = 256  # calls waiting that wake the worker at once (bounds the memory held)
_SYNC_EVERY_S = 0.2  # fsync of the WAL for power-loss durability (SIGKILL needs none)
_PROCESS_WAIT_S = 2.0


@dataclass
class RecoveryReport:
    segments: int = 0
    calls: int = 0
    incomplete: int = 0
    torn_bytes: int = 0
    temporaries: int = 0


@dataclass
class _Buffer:
    calls: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    bytes: int = 0
    since: float | None = None


class Writer:
    def __init__(self, config: Config, run_id: str) -> None:
        assert config.out_dir is not None
        self.config = config
        self.root = config.out_dir
        self.run_id = run_id
        self.wal = wal_mod.Wal(self.root / "wal")
        self._inbox = _Inbox()
        self._open: dict[str, bytes] = {}  # call_id -> BEGIN frame of calls in flight
        self._seen: set[str] = set()
        self._responses: dict[str, str] = {}
        self._call_ids: set[str] = set()
        self._buffer = _Buffer()
        self._endpoints: Counter[tuple[str, str, str, int]] = Counter()
        self._endpoints_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._shard_seq = 0
        self._keep_segments = False  # a row could not be stored: keep the WAL for forensics
        self.last_error: str | None = None
        self.calls_written = 0

    # -- hooks (event loop thread) ---------------------------------------------------

    def begin(self, capture: Capture) -> None:
        """Log that a call started. Raises OSError when the log cannot be written, or when
        less than ``min_free_bytes`` is free: the call's response must fit too."""
        self._check_free_space()
        frame = wal_mod.encode_frame(wal_mod.BEGIN, dumps(capture.begin_header()), b"")
        with self.wal.lock:
            self.wal.append_locked(frame)
            self._open[capture.call_id] = frame

    def _check_free_space(self) -> None:
        if not self.config.min_free_bytes:
            return
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        if free < self.config.min_free_bytes:
            raise OSError(
                errno.ENOSPC,
                f"{free / 2**20:.1f} MiB free under {self.root}, below forge_min_free_bytes "
                f"({self.config.min_free_bytes / 2**20:.1f} MiB)",
            )

    def end(
        self, capture: Capture, process: concurrent.futures.Future[ProcessInfo | None] | None
    ) -> None:
        """Log a finished call and queue it for parsing. Raises OSError when it cannot be logged."""
        header, blob = capture.to_frame()
        frame = wal_mod.encode_frame(wal_mod.END, dumps(header), blob)
        with self.wal.lock:
            self.wal.append_locked(frame)
            self._open.pop(capture.call_id, None)
            self._inbox.put(("call", capture, process), wake=False)

    def count_endpoint(self, host: str, method: str, path: str, status: int) -> None:
        with self._endpoints_lock:
            self._endpoints[(host, method, path.partition("?")[0], status)] += 1

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> RecoveryReport:
        """Load what earlier runs stored, recover their WAL, start the worker."""
        _warm_arrow()
        report = RecoveryReport(temporaries=remove_stale_temporaries(self.root))
        self._seen = {r["hash"] for r in read_column_values(self.root, "messages", ["hash"])}
        for r in read_column_values(
            self.root, "calls", ["call_id", "response_id", "response_head_hash"]
        ):
            self._call_ids.add(r["call_id"])
            if r["response_id"] and r["response_head_hash"]:
                self._responses[r["response_id"]] = r["response_head_hash"]
        self._recover(report)
        self._thread = threading.Thread(target=self._run, name="forge-writer", daemon=True)
        self._thread.start()
        return report

    def stop(self, timeout: float = 30.0) -> None:
        """Flush everything to shards and stop the worker."""
        if self._thread is None:
            return
        self._request_flush()
        self._inbox.put(("stop", None, None))
        self._thread.join(timeout)
        self._thread = None
        self.wal.close()

    # -- worker --------------------------------------------------------------------------

    def _run(self) -> None:
        last_sync = time.monotonic()
        while True:
            for kind, item, extra in self._inbox.take(_BATCH_S):
                try:
                    if kind == "call":
                        self._add(item, extra)
                    elif kind == "flush":
                        self._flush(item)
                    elif kind == "stop":
                        return
                except Exception as e:  # the worker must survive a bad row; the WAL keeps it
                    self.last_error = f"{type(e).__name__}: {e}"
                    log.exception("forge: could not record a call (kept in the WAL): %s", e)
            now = time.monotonic()
            if now - last_sync >= _SYNC_EVERY_S:
                try:
                    self.wal.sync()
                except OSError as e:
                    self.last_error = f"WAL fsync failed: {e}"
                    log.error("forge: %s", self.last_error)
                last_sync = now
            if self._rotation_due(now):
                self._request_flush()

    def _rotation_due(self, now: float) -> bool:
        b = self._buffer
        if not b.calls:
            return False
        assert b.since is not None
        return (
            len(b.calls) >= self.config.rotate_rows
            or b.bytes >= self.config.rotate_bytes
            or now - b.since >= self.config.rotate_seconds
        )

    def _request_flush(self) -> None:
        with self.wal.lock:
            old = self.wal.rotate_locked()
            for frame in self._open.values():  # calls in flight stay in the live segment
                self.wal.append_locked(frame)
            self._inbox.put(("flush", old, None))

    def _add(
        self, capture: Capture, process: concurrent.futures.Future[ProcessInfo | None] | None
    ) -> None:
        if process is not None:
            try:
                info = process.result(timeout=_PROCESS_WAIT_S)
            except (concurrent.futures.TimeoutError, OSError):
                info = None
            if info is not None:
                capture.pid, capture.process_name = info.pid, info.name
                capture.parent_pids = info.parent_pids
                if capture.rollout_id is None and info.rollout_id:
                    capture.rollout_id, capture.rollout_source = info.rollout_id, "process_env"
        self._add_rows(capture)

    def _add_rows(self, capture: Capture) -> None:
        if capture.call_id in self._call_ids:
            return
        rows = build_rows(capture, self._responses.get, self.config.max_body_bytes, count_tokens)
        b = self._buffer
        if b.since is None:
            b.since = time.monotonic()
        b.calls.append(rows.call)
        self._call_ids.add(capture.call_id)
        b.bytes += len(capture.request_body) + len(capture.response_body)
        for m in rows.messages:
            if m["hash"] not in self._seen:
                self._seen.add(m["hash"])
                b.messages.append(m)
        call = rows.call
        if call["response_id"] and call["response_head_hash"]:
            self._responses[call["response_id"]] = call["response_head_hash"]

    def _flush(self, upto_segment: int | None) -> None:
        b = self._buffer
        with self._endpoints_lock:
            endpoints, self._endpoints = self._endpoints, Counter()
        self._shard_seq += 1
        name = f"{self.run_id}-{self._shard_seq:06d}"
        try:
            if b.messages:
                write_shard(self.root, "messages", name, b.messages)
            if b.calls:
                write_shard(self.root, "calls", name, b.calls)
            if endpoints:
                now = datetime.now(UTC)
                rows = [
                    {
                        "run_id": self.run_id,
                        "window_end": now,
                        "host": h,
                        "method": m,
                        "path": p,
                        "status_code": s,
                        "requests": n,
                    }
                    for (h, m, p, s), n in endpoints.items()
                ]
                write_shard(self.root, "endpoints", name, rows)
        except (pa.ArrowException, ValueError, TypeError) as e:
            # A row Arrow cannot encode must not block every later flush: set the bad rows
            # aside (their calls stay in this WAL segment, which is then kept) and retry.
            self.last_error = f"rows Arrow cannot store: {e}"
            log.error("forge: %s; those calls stay in the WAL", self.last_error)
            b.calls = _encodable(b.calls, "calls")
            b.messages = _encodable(b.messages, "messages")
            with self._endpoints_lock:
                self._endpoints.update(endpoints)
            self._keep_segments = True
            return
        except OSError as e:
            # Rows stay buffered and their WAL segments stay on disk; retried next flush.
            with self._endpoints_lock:
                self._endpoints.update(endpoints)
            self.last_error = f"cannot write shards to {self.root}: {e}"
            log.error("forge: %s (calls are kept in the WAL and retried)", self.last_error)
            return
        self.calls_written += len(b.calls)
        self._buffer = _Buffer()
        if upto_segment is not None and not self._keep_segments:
            self.wal.remove(upto_segment)
            self.last_error = None

    def _recover(self, report: RecoveryReport) -> None:
        segments = [s for s in self.wal.segments() if s < self.wal.seq]
        if not segments:
            return
        begun: dict[str, dict[str, Any]] = {}
        for seq in segments:
            frames, torn = wal_mod.read_frames(self.wal.path(seq).read_bytes())
            report.segments += 1
            report.torn_bytes += torn
            for kind, header, blob in frames:
                if kind == wal_mod.BEGIN:
                    begun[header["call_id"]] = header
                elif kind == wal_mod.END:
                    begun.pop(header["call_id"], None)
                    if header["call_id"] not in self._call_ids:
                        self._add_rows(Capture.from_frame(header, blob))
                        report.calls += 1
        for header in begun.values():
            if header["call_id"] in self._call_ids:
                continue
            capture = Capture.from_frame(header, b"")
            capture.incomplete = True
            capture.error = "the proxy stopped before the call ended"
            self._add_rows(capture)
            report.incomplete += 1
        self._flush(None)
        if self.last_error is None:
            self.wal.remove(segments[-1])
        if report.torn_bytes:
            log.warning(
                "forge: skipped %d bytes of a torn WAL frame (a call cut mid-write)",
                report.torn_bytes,
            )


def _warm_arrow() -> None:
    """Arrow's first conversion of Python rows imports pandas (half a second on 2 cores):
    done here, at start, and not in the first flush, where it would hold the GIL that
    the event loop needs mid-traffic."""
    for schema in TABLES.values():
        pa.Table.from_pylist([], schema=schema)


class _Inbox:
    """Items for the worker, which sleeps until one that wakes it or ``timeout`` passes.

    ``deque.append`` and ``popleft`` are atomic; the event is set only by items that must
    not wait (flush, stop) and by a backlog of ``_BATCH_CALLS``.
    """

    def __init__(self) -> None:
        self._items: deque[tuple[str, Any, Any]] = deque()
        self._wake = threading.Event()

    def put(self, item: tuple[str, Any, Any], wake: bool = True) -> None:
        self._items.append(item)
        if wake or len(self._items) >= _BATCH_CALLS:
            self._wake.set()

    def take(self, timeout: float) -> list[tuple[str, Any, Any]]:
        """What waits, after a wake-up or ``timeout`` seconds (at once when something woke it)."""
        self._wake.wait(timeout)
        self._wake.clear()
        items = []
        while self._items:
            items.append(self._items.popleft())
        return items


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


ProcessLookup = Callable[[int, int], ProcessInfo | None]
