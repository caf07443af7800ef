"""Process lookups of client sockets: batched, the same answers as one by one, and across
users when the proxy is root without CAP_SYS_PTRACE (a container's default)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mitm_addon.attribution import (
    ProcessLookups,
    Socket,
    SocketTable,
    lookup_process,
    parse_tcp_table,
    read_socket_table,
    socket_owners,
)

REPO = Path(__file__).resolve().parents[2]

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

    def table() -> SocketTable | None:
        nonlocal calls
        calls += 1
        gate.wait(10)  # hold the first read while the rest of the burst queues up
        return read_socket_table()

    lookups = ProcessLookups(proxy_pid=-1, table=table)
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
    answers = iter([RuntimeError("boom"), {}])

    def table() -> SocketTable | None:
        item = next(answers)
        if isinstance(item, Exception):
            raise item
        return item

    lookups = ProcessLookups(proxy_pid=-1, table=table)
    assert lookups.submit(1234).result(timeout=10) is None
    assert lookups.submit(1235).result(timeout=10) is None
    lookups.shutdown()
    assert lookups.submit(1236).cancelled()


def test_a_port_missing_from_the_socket_table_is_found_by_the_full_scan(
    client_ports: list[int],
) -> None:
    # A table read can miss a line that moved while the kernel was printing it.
    lookups = ProcessLookups(proxy_pid=-1, table=lambda: {})
    assert lookups.owners(client_ports[:3]) == {port: os.getpid() for port in client_ports[:3]}


# Two lines of /proc/net/tcp as the kernel prints them: a listener on 127.0.0.1:8080 and a
# connection from port 51234 to it, owned by uid 1000 (columns after the inode cut short).
TCP_TEXT = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000
   1: 0100007F:C822 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0000000000000000
   2: 0100007F:C823 0100007F:1F90 06 00000000:00000000 03:00000D7B 00000000     0        0 0 3 0000000000000000
   3: garbage
"""


def test_the_socket_table_keeps_connected_sockets_by_local_port() -> None:
    assert parse_tcp_table(TCP_TEXT) == {0xC822: [Socket(inode=4343, uid=1000)]}


def test_table_lookups_find_the_same_owners_as_a_full_psutil_scan(
    client_ports: list[int],
) -> None:
    # No full scan behind the table here: what it finds, the table found.
    by_table = ProcessLookups(proxy_pid=-1, scan=lambda: []).owners(client_ports)
    by_scan = ProcessLookups(proxy_pid=-1, table=lambda: None).owners(client_ports)
    full = socket_owners(psutil.net_connections(kind="tcp"), -1)
    assert by_table == by_scan == {port: full[port] for port in client_ports}
    assert set(by_table.values()) == {os.getpid()}


# Run by a process of another user: hold a connection to the test's server until stdin closes.
HOLDER = 'exec 3<>"/dev/tcp/127.0.0.1/$1" && read -r _'

# Run as root without CAP_SYS_PTRACE: can it read the holder's descriptors, and whom does the
# lookup find?
LOOKER = """\
import json, os, sys
from mitm_addon.attribution import lookup_process
pid, port = int(sys.argv[1]), int(sys.argv[2])
try:
    os.listdir(f"/proc/{pid}/fd") and os.readlink(f"/proc/{pid}/fd/0")
    refused = False
except PermissionError:
    refused = True
info = lookup_process(port, proxy_pid=os.getpid())
print(json.dumps({"refused": refused, "pid": info and info.pid, "rollout": info and info.rollout_id}))
"""


@pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root on Linux and setpriv (util-linux)",
)
def test_root_without_ptrace_finds_another_users_process_and_its_rollout(tmp_path: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    nobody = 65534
    holder = subprocess.Popen(
        ["/bin/bash", "-c", HOLDER, "holder", str(server.getsockname()[1])],
        stdin=subprocess.PIPE,
        user=nobody,
        group=nobody,
        extra_groups=[],
        env={"FORGE_ROLLOUT_ID": "r-other-user", "PATH": "/usr/bin:/bin"},
        cwd="/",
    )
    try:
        server.settimeout(30)
        accepted, (_, port) = server.accept()
        looked = subprocess.run(
            # A container's default capabilities: root, but no CAP_SYS_PTRACE.
            ["setpriv", "--bounding-set=-sys_ptrace", sys.executable, "-c", LOOKER]
            + [str(holder.pid), str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        accepted.close()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the holder's read ends
        holder.wait(10)
        server.close()
    assert looked.returncode == 0, looked.stderr
    report = json.loads(looked.stdout)
    assert report["refused"], "the kernel let root read another user's descriptors"
    assert report == {"refused": True, "pid": holder.pid, "rollout": "r-other-user"}
