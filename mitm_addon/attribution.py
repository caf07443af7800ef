"""Which process, and so which rollout, owns a client socket (same host only)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import psutil

log = logging.getLogger(__name__)

ROLLOUT_ENV = "FORGE_ROLLOUT_ID"
_MAX_ANCESTORS = 32


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    name: str | None
    parent_pids: list[int] = field(default_factory=list)
    rollout_id: str | None = None  # FORGE_ROLLOUT_ID of the nearest process that has it


def lookup_process(client_port: int, proxy_pid: int) -> ProcessInfo | None:
    """The process whose local TCP socket has port ``client_port`` (the proxy's peer).

    The proxy's own end of the connection is skipped, so this works for forward
    proxying and for transparent capture (where the client believes it talks to :443).
    Blocking (it scans /proc): call it off the event loop.
    """
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError) as e:
        log.debug("cannot list sockets: %s", e)
        return None
    pid = socket_owners(conns, proxy_pid).get(client_port)
    if pid is None:
        return None
    return describe_process(pid)


def socket_owners(conns: Sequence[Any], proxy_pid: int) -> dict[int, int]:
    """Local port -> pid of connected TCP sockets, the proxy's own ends left out.

    The first socket listed wins a port held twice (as a search of the list in order would).
    """
    owners: dict[int, int] = {}
    for c in conns:
        if c.pid and c.pid != proxy_pid and c.laddr and c.raddr:
            owners.setdefault(c.laddr.port, c.pid)
    return owners


class ProcessLookups:
    """``lookup_process`` for many ports, on one thread, with one socket scan per batch.

    Listing sockets walks every process's descriptors in /proc: tens of milliseconds of
    CPU on a busy host. A harness opening 64 connections at once would pay that 64 times;
    here every port waiting when a scan starts is answered from that one scan (and each
    process described once per scan), so a burst costs two scans.
    """

    def __init__(
        self,
        proxy_pid: int,
        scan: Callable[[], Sequence[Any]] = lambda: psutil.net_connections(kind="tcp"),
    ) -> None:
        self.proxy_pid = proxy_pid
        self.scans = 0
        self._scan = scan
        self._pending: list[tuple[int, Future[ProcessInfo | None]]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, client_port: int) -> Future[ProcessInfo | None]:
        future: Future[ProcessInfo | None] = Future()
        with self._cond:
            if self._closed:
                future.cancel()
                return future
            self._pending.append((client_port, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="forge-lookup", daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    def shutdown(self) -> None:
        """Stop the thread; lookups not started yet are cancelled."""
        with self._cond:
            self._closed = True
            pending, self._pending = self._pending, []
            self._cond.notify()
        for _, future in pending:
            future.cancel()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch, self._pending = self._pending, []
            batch = [(p, f) for p, f in batch if f.set_running_or_notify_cancel()]
            try:
                self._answer(batch)
            except Exception:  # the thread must outlive a bad scan: callers wait on these
                log.exception("forge: process lookup failed")
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)

    def _answer(self, batch: list[tuple[int, Future[ProcessInfo | None]]]) -> None:
        if not batch:
            return
        self.scans += 1
        try:
            owners = socket_owners(self._scan(), self.proxy_pid)
        except (psutil.Error, OSError) as e:
            log.debug("cannot list sockets: %s", e)
            owners = {}
        described: dict[int, ProcessInfo | None] = {}
        for port, future in batch:
            pid = owners.get(port)
            if pid is not None and pid not in described:
                described[pid] = describe_process(pid)
            future.set_result(described[pid] if pid is not None else None)


def describe_process(pid: int) -> ProcessInfo | None:
    """Name, ancestors and the nearest FORGE_ROLLOUT_ID of a process."""
    try:
        proc = psutil.Process(pid)
        name = proc.name()
        chain = [proc] + proc.parents()[:_MAX_ANCESTORS]
    except psutil.Error:
        return None
    rollout = None
    for p in chain:
        try:
            rollout = p.environ().get(ROLLOUT_ENV)
        except (psutil.Error, OSError):
            continue
        if rollout:
            break
    return ProcessInfo(
        pid=pid, name=name, parent_pids=[p.pid for p in chain[1:]], rollout_id=rollout or None
    )
