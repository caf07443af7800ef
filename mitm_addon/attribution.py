"""Which process, and so which rollout, owns a client socket (same host only).

A lookup reads the kernel's socket tables (``/proc/net/tcp`` and ``tcp6``, those of the
proxy's network namespace) for the client's local port, which give the socket's inode and
owner uid, then looks for that inode among the descriptors of that uid's processes, the
processes that owned recent connections first. A harness's next connection usually comes
from a process already seen, so a lookup reads a few links where a full socket scan
(``psutil.net_connections``) reads every descriptor of every process on the host.

Without CAP_SYS_PTRACE (a container's default capabilities) even root may not read another
user's descriptors or environment: the kernel checks the reader's filesystem ids. A proxy
running as root (transparent capture runs the harness as a user of its own) then reads them
with the owner's filesystem ids, which ``setfsuid``/``setfsgid`` change for the calling
thread only. Lookups run on a thread of their own.

The kernel prints a socket table a page per read and resumes between reads, so a line
that moved meanwhile can be missed. A port not found in the table (or whose owner was not
found) gets psutil's full scan, which reads the tables afresh; so does every port where
``/proc/net/tcp`` does not exist (not Linux).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, TypeVar

import psutil

log = logging.getLogger(__name__)

ROLLOUT_ENV = "FORGE_ROLLOUT_ID"
_MAX_ANCESTORS = 32
_RECENT = 8  # owners of recent connections, tried first
_TCP_LISTEN = "0A"
_PROC = Path("/proc")
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

T = TypeVar("T")


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    name: str | None
    parent_pids: list[int] = field(default_factory=list)
    rollout_id: str | None = None  # FORGE_ROLLOUT_ID of the nearest process that has it


@dataclass(frozen=True)
class Socket:
    inode: int
    uid: int


SocketTable = dict[int, list[Socket]]  # local port -> the sockets bound to it


def parse_tcp_table(text: str) -> SocketTable:
    """Local port -> connected sockets, from the text of ``/proc/net/tcp`` or ``tcp6``.

    Listening sockets and sockets without an inode (closed, in TIME_WAIT) are left out.
    Columns: sl, local address:port (hex), remote, state, queues, timer, retransmits,
    uid, timeout, inode.
    """
    table: SocketTable = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] == _TCP_LISTEN:
            continue
        try:
            port = int(fields[1].rpartition(":")[2], 16)
            uid, inode = int(fields[7]), int(fields[9])
        except ValueError:
            continue
        if inode:
            table.setdefault(port, []).append(Socket(inode, uid))
    return table


def read_socket_table(proc: Path = _PROC) -> SocketTable | None:
    """Both TCP tables of this process's network namespace; ``None`` without /proc/net."""
    table: SocketTable = {}
    found = False
    for name in ("tcp", "tcp6"):
        try:
            text = (proc / "net" / name).read_bytes().decode("ascii", "replace")
        except OSError:
            continue
        found = True
        for port, sockets in parse_tcp_table(text).items():
            table.setdefault(port, []).extend(sockets)
    return table if found else None


@contextmanager
def fs_ids(uid: int, gid: int) -> Iterator[None]:
    """This thread's filesystem uid and gid set to these for the block (Linux; root)."""
    assert _libc is not None
    old_gid = _libc.setfsgid(gid)
    old_uid = _libc.setfsuid(uid)
    try:
        yield
    finally:
        _libc.setfsuid(old_uid)  # back to root first: that restores the right to set the gid
        _libc.setfsgid(old_gid)


def as_owner(pid: int, read: Callable[[], T]) -> T | None:
    """``read()``; if the kernel refuses it, again with the filesystem ids of ``pid``'s owner.

    The second try needs root (CAP_SETUID and CAP_SETGID); ``None`` when both fail.
    """
    try:
        return read()
    except PermissionError:
        if _libc is None or os.geteuid() != 0:
            return None
    except OSError:
        return None
    try:
        st = os.stat(_PROC / str(pid))  # owned by the process's effective uid and gid
        if st.st_uid == os.geteuid():
            return None  # the same ids were refused: a process that is not dumpable
        with fs_ids(st.st_uid, st.st_gid):
            return read()
    except OSError:
        return None


def _holds_socket(pid: int, links: set[str]) -> bool:
    fd_dir = _PROC / str(pid) / "fd"

    def read() -> bool:
        with os.scandir(fd_dir) as entries:
            for entry in entries:
                try:
                    if os.readlink(entry.path) in links:
                        return True
                except FileNotFoundError:  # closed since the listing
                    continue
        return False

    return bool(as_owner(pid, read))


def _pids(uid: int) -> Iterator[int]:
    """Pids of live processes of effective uid ``uid``, newest first.

    A harness's client has usually just started, so it comes early.
    """
    try:
        with os.scandir(_PROC) as it:
            entries = [e for e in it if e.name.isdigit()]
    except OSError:
        return
    entries.sort(key=lambda e: int(e.name), reverse=True)
    for entry in entries:
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        yield int(entry.name)


def socket_owner(sockets: Sequence[Socket], skip_pid: int, first: Iterable[int] = ()) -> int | None:
    """The process (not ``skip_pid``) holding one of ``sockets``.

    Tried in order: ``first``, then the processes of each socket's uid (a socket that
    outlived a change of its process's uid is left to the full scan).
    """
    if not sockets:
        return None
    links = {f"socket:[{s.inode}]" for s in sockets}
    uids = list(dict.fromkeys(s.uid for s in sockets))
    tried = {skip_pid}
    for pid in chain(first, *(_pids(uid) for uid in uids)):
        if pid in tried:
            continue
        tried.add(pid)
        if _holds_socket(pid, links):
            return pid
    return None


def socket_owners(conns: Sequence[Any], proxy_pid: int) -> dict[int, int]:
    """Local port -> pid of connected TCP sockets in a psutil scan, the proxy's ends left out.

    The first socket listed wins a port held twice (as a search of the list in order would).
    """
    owners: dict[int, int] = {}
    for c in conns:
        if c.pid and c.pid != proxy_pid and c.laddr and c.raddr:
            owners.setdefault(c.laddr.port, c.pid)
    return owners


def _psutil_scan() -> Sequence[Any]:
    conns: Sequence[Any] = psutil.net_connections(kind="tcp")
    return conns


class ProcessLookups:
    """Process lookups of client ports, on one thread, with one socket-table read per batch.

    A harness opening 64 connections at once queues 64 ports; every port waiting when a
    batch starts is answered from one read of the socket tables (and each process described
    once per batch), so a burst costs two reads.
    """

    def __init__(
        self,
        proxy_pid: int,
        table: Callable[[], SocketTable | None] = read_socket_table,
        scan: Callable[[], Sequence[Any]] = _psutil_scan,
    ) -> None:
        self.proxy_pid = proxy_pid
        self.scans = 0
        self._table = table
        self._scan = scan  # without /proc/net: psutil's full scan
        self._recent: list[int] = []
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

    def owners(self, ports: Sequence[int]) -> dict[int, int]:
        """Port -> pid of the process holding the client end, for those found."""
        self.scans += 1
        table = self._table()
        if table is None:
            return self._scan_owners(ports)
        found = self._table_owners(table, ports)
        missing = [port for port in ports if port not in found]
        if missing:
            # A port the table did not show, or whose owner was not found: psutil's full
            # scan (a fresh read of the tables and every descriptor) has the last word.
            found.update(self._scan_owners(missing))
        return found

    def _scan_owners(self, ports: Sequence[int]) -> dict[int, int]:
        try:
            everyone = socket_owners(self._scan(), self.proxy_pid)
        except (psutil.Error, OSError) as e:
            log.debug("cannot list sockets: %s", e)
            return {}
        return {port: everyone[port] for port in ports if port in everyone}

    def _table_owners(self, table: SocketTable, ports: Sequence[int]) -> dict[int, int]:
        found: dict[int, int] = {}
        for port in ports:
            pid = socket_owner(table.get(port, []), self.proxy_pid, self._recent)
            if pid is not None:
                found[port] = pid
                if pid in self._recent:
                    self._recent.remove(pid)
                self._recent.insert(0, pid)
                del self._recent[_RECENT:]
        return found

    def _answer(self, batch: list[tuple[int, Future[ProcessInfo | None]]]) -> None:
        if not batch:
            return
        owners = self.owners([port for port, _ in batch])
        described: dict[int, ProcessInfo | None] = {}
        for port, future in batch:
            pid = owners.get(port)
            if pid is not None and pid not in described:
                described[pid] = describe_process(pid)
            future.set_result(described[pid] if pid is not None else None)


def lookup_process(client_port: int, proxy_pid: int) -> ProcessInfo | None:
    """The process whose local TCP socket has port ``client_port`` (the proxy's peer).

    The proxy's own end of the connection is skipped, so this works for forward
    proxying and for transparent capture (where the client believes it talks to :443).
    Blocking (it reads /proc): call it off the event loop.
    """
    pid = ProcessLookups(proxy_pid).owners([client_port]).get(client_port)
    return describe_process(pid) if pid is not None else None


def describe_process(pid: int) -> ProcessInfo | None:
    """Name, ancestors and the nearest FORGE_ROLLOUT_ID of a process."""
    try:
        proc = psutil.Process(pid)
        name = proc.name()
        lineage = [proc] + proc.parents()[:_MAX_ANCESTORS]
    except psutil.Error:
        return None
    rollout = None
    for p in lineage:
        rollout = environ_value(p, ROLLOUT_ENV)
        if rollout:
            break
    return ProcessInfo(
        pid=pid, name=name, parent_pids=[p.pid for p in lineage[1:]], rollout_id=rollout or None
    )


def environ_value(proc: psutil.Process, key: str) -> str | None:
    """``key`` in the environment a process started with (read as its owner if need be)."""
    if _libc is None:
        try:
            value: str | None = proc.environ().get(key)
            return value
        except (psutil.Error, OSError):
            return None
    data = as_owner(proc.pid, (_PROC / str(proc.pid) / "environ").read_bytes)
    prefix = key.encode() + b"="
    for item in (data or b"").split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None
