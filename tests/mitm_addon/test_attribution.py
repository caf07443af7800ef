"""Process lookups of client sockets: batched, and the same answers as one by one."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import psutil
import pytest

from mitm_addon.attribution import ProcessLookups, lookup_process

CLIENTS = 24


@pytest.fixture
def client_ports() -> Iterator[list[int]]:
    """Ports of real loopback client sockets held by this process."""
    server = socket.create_server(("127.0.0.1", 0), backlog=CLIENTS)
    clients = [socket.create_connection(server.getsockname()) for _ in range(CLIENTS)]
    accepted = [server.accept()[0] for _ in range(CLIENTS)]
    try:
        yield [c.getsockname()[1] for c in clients]
    finally:
        for s in [*clients, *accepted, server]:
            s.close()


def test_a_burst_of_lookups_shares_scans_and_finds_each_socket_owner(
    client_ports: list[int],
) -> None:
    gate = threading.Event()
    calls = 0

    def scan() -> Sequence[Any]:
        nonlocal calls
        calls += 1
        gate.wait(10)  # hold the first scan while the rest of the burst queues up
        return psutil.net_connections(kind="tcp")

    lookups = ProcessLookups(proxy_pid=-1, scan=scan)
    futures = [lookups.submit(port) for port in client_ports]
    gate.set()
    infos = [f.result(timeout=30) for f in futures]
    lookups.shutdown()
    assert all(info is not None and info.pid == os.getpid() for info in infos)
    assert calls <= 2 and lookups.scans == calls
    # The same answers as looking each port up on its own.
    alone = lookup_process(client_ports[0], proxy_pid=-1)
    assert alone is not None and alone.pid == infos[0].pid  # type: ignore[union-attr]
    assert alone.parent_pids == infos[0].parent_pids  # type: ignore[union-attr]


def test_the_proxys_own_sockets_and_unknown_ports_resolve_to_none(
    client_ports: list[int],
) -> None:
    lookups = ProcessLookups(proxy_pid=os.getpid())
    unused = socket.socket()
    unused.bind(("127.0.0.1", 0))
    free = unused.getsockname()[1]
    unused.close()
    assert lookups.submit(client_ports[0]).result(timeout=30) is None
    assert lookups.submit(free).result(timeout=30) is None
    lookups.shutdown()


def test_a_failing_scan_answers_none_and_the_thread_goes_on() -> None:
    answers = iter([RuntimeError("boom"), []])

    def scan() -> Sequence[Any]:
        item = next(answers)
        if isinstance(item, Exception):
            raise item
        return item

    lookups = ProcessLookups(proxy_pid=-1, scan=scan)
    assert lookups.submit(1234).result(timeout=10) is None
    assert lookups.submit(1235).result(timeout=10) is None
    lookups.shutdown()
    assert lookups.submit(1236).cancelled()
