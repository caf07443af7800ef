"""The recorder's I/O in the proxy: WAL frames from the hooks; shards from a builder.

Hooks call ``begin`` and ``end``; each appends one WAL frame (a single ``write(2)``), so a
call is durable once its response has passed. Everything else runs elsewhere. A thread of
the proxy, ``forge-wal``, fsyncs the log and closes the live segment every second. A
builder (``mitm_addon.builder``) reads the closed segments and turns them into shards:
by default a child process (``forge_builder=process``), so that building rows, which
on 2 cores cost the event loop a tenth of its throughput when done on a thread, takes
nothing from the GIL; or a thread (``forge_builder=thread``). ``start`` first recovers
the segments a killed proxy left; ``stop`` closes the log and waits for the builder to
store every call.

A call's client process is looked up when its connection opens and is written into its
END frame. A lookup still running then (it has already kept the request waiting for up
to 2 s) gets its own PROC frame when it ends; meanwhile the END frame is written again
into each new segment, as the BEGIN frames of calls in flight are, so that the segment
the builder deletes never holds the only copy.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Protocol

from mitm_addon import builder as builder_mod
from mitm_addon import wal as wal_mod
from mitm_addon.attribution import ProcessInfo
from mitm_addon.capture import Capture, dumps
from mitm_addon.config import Config
from pipeline.shards import remove_stale_temporaries

log = logging.getLogger(__name__)

_TICK_S = 0.2  # the forge-wal thread's period: fsync of the WAL (SIGKILL needs none)
_ROTATE_S = 1.0  # the live segment is closed this often while calls arrive
_RESTART_S = 1.0  # before a dead builder is started again; doubled while it keeps dying
_RESTART_MAX_S = 30.0
_QUICK_DEATH_S = 5.0  # a child that dies sooner than this after its start failed to start
_FALLBACK_AFTER = 3  # quick deaths in a row, after which shards are built on a thread
_STOP_TIMEOUT_S = 30.0
# Free space is read (statvfs) for each call once less than this is free above
# forge_min_free_bytes; with more, at most every _FREE_SPACE_TTL_S: a call on the event
# loop need not pay a system call to learn that gigabytes are still free.
_FREE_SPACE_MARGIN = 256 * 1024 * 1024
_FREE_SPACE_TTL_S = 0.5
_REPO = Path(__file__).resolve().parent.parent  # on the child's path, as the addon puts it


class _Runner(Protocol):
    def start(self) -> None: ...
    def check(self) -> None: ...
    def finish(self, timeout: float) -> bool: ...


class Writer:
    def __init__(self, config: Config, run_id: str) -> None:
        assert config.out_dir is not None
        self.config = config
        self.root = config.out_dir
        self.run_id = run_id
        self.wal = wal_mod.Wal(self.root / "wal")
        # Frames that must stay in the live segment: the BEGIN frame of each call in flight,
        # the END frame of each ended call whose process lookup is still running.
        self._open: dict[str, bytes] = {}
        self._appended = 0  # frames the hooks appended since the segment was opened
        self._endpoints: Counter[tuple[str, str, str, int]] = Counter()
        self._endpoints_lock = threading.Lock()
        self._free_until = 0.0  # monotonic time before which free space need not be read
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._builder: _Runner | None = None
        self.reserve = Reserve(self.wal.directory / RESERVE_FILE, config.reserve_bytes)
        self.last_error: str | None = None

    @property
    def settings(self) -> builder_mod.Settings:
        c = self.config
        return builder_mod.Settings(
            root=self.root,
            run_id=self.run_id,
            rotate_rows=c.rotate_rows,
            rotate_bytes=c.rotate_bytes,
            rotate_seconds=c.rotate_seconds,
            max_body_bytes=c.max_body_bytes,
        )

    # -- hooks (event loop thread) ---------------------------------------------------

    def begin(self, capture: Capture) -> None:
        """Log that a call started. Raises OSError when the log cannot be written, when
        less than ``min_free_bytes`` is free, or when the reserve is spent: the call's
        end must fit too."""
        self._check_free_space()
        if not self.reserve.held and not self.reserve.take_back():
            raise OSError(
                errno.ENOSPC,
                f"the disk under {self.root} filled up and the write-ahead log's reserve "
                f"(forge_reserve_bytes, {self.config.reserve_bytes / 2**20:.1f} MiB) went to "
                "the calls in flight; new calls are refused until that much is free again",
            )
        frame = wal_mod.encode_frame(wal_mod.BEGIN, dumps(capture.begin_header()), b"")
        with self.wal.lock:
            self.wal.append_locked(frame)
            self._open[capture.call_id] = frame
            self._appended += 1

    def _check_free_space(self) -> None:
        if not self.config.min_free_bytes:
            return
        now = time.monotonic()
        if now < self._free_until:
            return
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        plenty = free >= self.config.min_free_bytes + _FREE_SPACE_MARGIN
        self._free_until = now + _FREE_SPACE_TTL_S if plenty else 0.0
        if free < self.config.min_free_bytes:
            raise OSError(
                errno.ENOSPC,
                f"{free / 2**20:.1f} MiB free under {self.root}, below forge_min_free_bytes "
                f"({self.config.min_free_bytes / 2**20:.1f} MiB)",
            )

    def end(
        self, capture: Capture, process: concurrent.futures.Future[ProcessInfo | None] | None
    ) -> None:
        """Log a finished call, with its client process when the lookup is done (else a
        PROC frame follows when it is). Raises OSError when it cannot be logged."""
        pending = process is not None and not process.done()
        if process is not None and not pending and (info := found_process(process)) is not None:
            capture.set_process(info.pid, info.name, info.parent_pids, info.rollout_id)
        header, blob = capture.frame_parts()
        if pending:
            header["process_pending"] = True
        frame = wal_mod.encode_frame(wal_mod.END, dumps(header), *blob)
        with self.wal.lock:
            try:
                self.wal.append_locked(frame)
            except OSError as e:
                # The disk is full: the reserve is for this. Its blocks go back to the file
                # system and the frame is appended again (what the failed write left of it
                # is a torn frame, which reading skips).
                if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not self.reserve.give_up():
                    raise
                log.error("forge: the disk under %s is full; the write-ahead log's reserve "
                          "finishes the calls in flight, new calls are refused", self.root)  # fmt: skip
                self.wal.append_locked(frame)
            self._appended += 1
            if pending:
                self._open[capture.call_id] = frame
            else:
                self._open.pop(capture.call_id, None)
        if pending:
            assert process is not None
            process.add_done_callback(partial(self._process_found, capture.call_id))

    def _process_found(
        self, call_id: str, process: concurrent.futures.Future[ProcessInfo | None]
    ) -> None:
        """The PROC frame of an ended call (on the lookup thread, when its lookup ends)."""
        info = found_process(process)
        header: dict[str, object] = {"call_id": call_id}
        if info is not None:
            header.update(
                pid=info.pid,
                process_name=info.name,
                parent_pids=info.parent_pids,
                rollout_id=info.rollout_id,
            )
        frame = wal_mod.encode_frame(wal_mod.PROC, dumps(header), b"")
        with self.wal.lock:
            if call_id not in self._open:
                return
            try:
                self.wal.append_locked(frame)
            except OSError as e:  # the END frame stays open; the builder stops waiting
                log.error("forge: cannot append to the write-ahead log: %s", e)
                return
            self._appended += 1
            del self._open[call_id]

    def count_endpoint(self, host: str, method: str, path: str, status: int) -> None:
        with self._endpoints_lock:
            self._endpoints[(host, method, path.partition("?")[0], status)] += 1

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> builder_mod.Report:
        """Recover what an earlier proxy left in the WAL, then start the builder."""
        if not self.reserve.take_back(force=True):
            log.error("forge: cannot preallocate the write-ahead log's reserve (%s); new calls "
                      "are write errors until it can be", self.reserve.last_error)  # fmt: skip
        temporaries = remove_stale_temporaries(self.root)
        report = builder_mod.recover(self.settings, self.wal.seq)
        report.temporaries = temporaries
        if self.config.builder == "thread":
            self._builder = _ThreadBuilder(self.settings)
        else:
            self._builder = _ChildBuilder(self.settings, self.wal.lock_fd)
        try:
            self._builder.start()
        except OSError as e:  # no interpreter to run it (a frozen mitmproxy, say)
            self._fall_back(f"the shard builder could not be started ({e})")
        self._thread = threading.Thread(target=self._run, name="forge-wal", daemon=True)
        self._thread.start()
        return report

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """Close the log and wait (up to ``timeout``) for the builder to store every call;
        what it could not store stays in the WAL for the next start."""
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join()
        self._thread = None
        try:
            with self.wal.lock:
                self._append_counts_locked()
        except OSError as e:
            log.error("forge: the last endpoint counts are lost: %s", e)
        try:
            self.wal.close_segment()
        except OSError as e:
            log.error("forge: cannot close the write-ahead log: %s", e)
        assert self._builder is not None
        if not self._builder.finish(timeout):
            log.error(
                "forge: not every call reached a shard; the rest stays in %s", self.wal.directory
            )
        self.reserve.remove()
        self.wal.close()

    # -- the forge-wal thread ------------------------------------------------------------

    def _run(self) -> None:
        opened = time.monotonic()
        while not self._stopping.wait(_TICK_S):
            now = time.monotonic()
            if now - opened >= _ROTATE_S and (self._appended or self._endpoints):
                self._rotate()
                opened = now
            try:
                self.wal.sync()
            except OSError as e:
                self.last_error = f"WAL fsync failed: {e}"
                log.error("forge: %s", self.last_error)
            assert self._builder is not None
            self._builder.check()
            runner = self._builder
            if isinstance(runner, _ChildBuilder) and runner.quick_deaths >= _FALLBACK_AFTER:
                code = runner.process.returncode if runner.process else None
                self._fall_back(
                    f"the shard builder died {runner.quick_deaths} times right after its "
                    f"start (exit code {code})"
                )

    def _fall_back(self, why: str) -> None:
        log.error("forge: %s; building shards on a thread of the proxy instead "
                  "(forge_builder=thread)", why)  # fmt: skip
        if isinstance(self._builder, _ChildBuilder):
            self._builder.discard()
        self._builder = _ThreadBuilder(self.settings)
        self._builder.start()

    def _rotate(self) -> None:
        """Close the live segment for the builder; open frames go on into the next one."""
        with self.wal.lock:
            try:
                self._append_counts_locked()
                self.wal.rotate_locked()
                if self._open:
                    self.wal.append_locked(b"".join(self._open.values()))
            except OSError as e:
                self.last_error = f"cannot rotate the write-ahead log: {e}"
                log.error("forge: %s", self.last_error)
                return
            self._appended = 0

    def _append_counts_locked(self) -> None:
        """The endpoint counts since the last segment, as a COUNTS frame (caller holds the
        WAL's lock); kept for the next segment if the frame cannot be written."""
        with self._endpoints_lock:
            counts, self._endpoints = self._endpoints, Counter()
        if not counts:
            return
        endpoints = [[h, m, p, s, n] for (h, m, p, s), n in counts.items()]
        frame = wal_mod.encode_frame(wal_mod.COUNTS, dumps({"endpoints": endpoints}), b"")
        try:
            self.wal.append_locked(frame)
        except OSError:
            with self._endpoints_lock:
                self._endpoints.update(counts)
            raise


RESERVE_FILE = "reserve"
_RETAKE_S = 0.5  # while the reserve is spent, it is tried again at most this often


class Reserve:
    """Disk space held for the ends of the calls in flight: a file of ``size`` allocated
    bytes (``posix_fallocate``) next to the log's segments. When an end cannot be
    appended because the disk is full, the file is emptied (its blocks freed) and the
    append tried again; new calls are refused until the whole reserve can be allocated
    again."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.held = size == 0
        self.spent = False  # given up to finish calls, not taken back yet
        self.last_error: str | None = None
        self._next_try = 0.0

    def take_back(self, force: bool = False) -> bool:
        """Allocate the reserve (at most every ``_RETAKE_S`` unless ``force``)."""
        if self.held:
            return True
        now = time.monotonic()
        if not force and now < self._next_try:
            return False
        self._next_try = now + _RETAKE_S
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
        except OSError as e:
            self.last_error = str(e)
            with contextlib.suppress(OSError):
                os.truncate(self.path, 0)  # what it did allocate goes back
            return False
        if self.spent:
            log.warning("forge: the write-ahead log's reserve is whole again; new calls are "
                        "accepted")  # fmt: skip
        self.held, self.spent = True, False
        return True

    def give_up(self) -> bool:
        """Free the reserve's blocks; False when there was none to free."""
        if not self.held or self.size == 0:
            return False
        try:
            os.truncate(self.path, 0)
        except OSError as e:
            self.last_error = str(e)
            return False
        self.held, self.spent = False, True
        self._next_try = time.monotonic() + _RETAKE_S
        return True

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        self.held = self.size == 0


def found_process(
    process: concurrent.futures.Future[ProcessInfo | None],
) -> ProcessInfo | None:
    """A done lookup's answer (None when it found nothing or was cancelled). Lookups set a
    result, never an exception (``attribution.ProcessLookups``)."""
    try:
        return process.result(timeout=0)
    except concurrent.futures.CancelledError:
        return None


class _ChildBuilder:
    """``python -m mitm_addon.builder`` as a child of the proxy, started again if it dies."""

    def __init__(self, settings: builder_mod.Settings, lock_fd: int) -> None:
        self.settings = settings
        self.lock_fd = lock_fd  # the child holds the log's lock too, until it exits
        self.process: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._died_at: float | None = None
        self._delay_s = _RESTART_S
        self.quick_deaths = 0  # deaths in a row within _QUICK_DEATH_S of a start

    def discard(self) -> None:
        """Let go of a builder that died (it has been reaped): its pipe."""
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()

    def start(self) -> None:
        self.discard()
        path = os.environ.get("PYTHONPATH", "")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(_REPO), path) if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mitm_addon.builder", *self.settings.argv()],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            pass_fds=(self.lock_fd,),
            env=env,
        )
        self._started_at, self._died_at = time.monotonic(), None

    def check(self) -> None:
        """Start the builder again if it died (its calls wait in the WAL meanwhile), after
        a pause that doubles while it keeps dying right after its start."""
        assert self.process is not None
        code = self.process.poll()
        if code is None:
            return
        now = time.monotonic()
        if self._died_at is None:
            self._died_at = now
            quick = now - self._started_at < _QUICK_DEATH_S
            self.quick_deaths = self.quick_deaths + 1 if quick else 0
            self._delay_s = min(_RESTART_MAX_S, _RESTART_S * 2 ** max(0, self.quick_deaths - 1))
            if self.quick_deaths < _FALLBACK_AFTER:
                log.error("forge: the shard builder (pid %d) exited with %s; starting it "
                          "again in %.0f s", self.process.pid, code, self._delay_s)  # fmt: skip
        if now - self._died_at >= self._delay_s and self.quick_deaths < _FALLBACK_AFTER:
            self.start()

    def finish(self, timeout: float) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:  # died since the last check: a fresh one finishes
            self.start()
            assert self.process is not None
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(b"finish\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        finally:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.error("forge: the shard builder did not finish in %.0f s; stopping it", timeout)
            self.process.kill()
            self.process.wait()
            return False
        return code == 0


class _ThreadBuilder:
    """The builder's loop on a thread of the proxy (``forge_builder=thread``), started
    again (with its state read afresh from the shards) if it fails."""

    def __init__(self, settings: builder_mod.Settings) -> None:
        self.settings = settings
        self.builder = builder_mod.Builder(settings)
        self._finishing = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at = 0.0

    def start(self) -> None:
        self.builder = builder_mod.Builder(self.settings)
        self.builder.load()
        self._thread = threading.Thread(target=self._run, name="forge-builder", daemon=True)
        self._thread.start()
        self._started_at = time.monotonic()

    def _run(self) -> None:
        try:
            builder_mod.run(self.builder, self._finishing.is_set, self._finishing.wait)
        except Exception as e:  # the WAL keeps every call; the next start stores them
            self.builder.last_error = f"{type(e).__name__}: {e}"
            log.exception("forge: the shard builder failed; calls stay in the WAL")

    def check(self) -> None:
        assert self._thread is not None
        if self._thread.is_alive() or time.monotonic() - self._started_at < _RESTART_S:
            return
        log.error("forge: starting the shard builder thread again")
        self.start()

    def finish(self, timeout: float) -> bool:
        self._finishing.set()
        assert self._thread is not None
        if not self._thread.is_alive():  # failed since the last check: a fresh one finishes
            self.start()
        self._thread.join(timeout)
        return not self._thread.is_alive() and self.builder.last_error is None
