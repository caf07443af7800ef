"""Which process, and so which rollout, owns a client socket (same host only)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

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
    pid = next(
        (
            c.pid
            for c in conns
            if c.pid and c.pid != proxy_pid and c.laddr and c.raddr and c.laddr.port == client_port
        ),
        None,
    )
    if pid is None:
        return None
    return describe_process(pid)


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
