"""A full disk under a running proxy: calls are refused loudly (the default) or passed with a
warning when the user chose so (`forge_on_write_error=warn`); nothing passes silently.

The disk is a tmpfs mounted for the test (root only, as CI runs). Filled until less than
`forge_min_free_bytes` is left, new calls are refused before they start. Filled to the
last byte under a call in flight, the write-ahead log's reserve (`forge_reserve_bytes`,
preallocated) takes that call's end, and new calls are refused until it is whole again.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from pipeline.store import connect
from tests.support.forge_proxy import SECRETS, files_containing, forge_proxy, openai_client
from tests.support.upstream import ScriptedUpstream

pytestmark = [pytest.mark.root]

if not sys.platform.startswith("linux") or os.geteuid() != 0:
    pytestmark.append(pytest.mark.skip(reason="needs root to mount a small tmpfs: run as CI does"))


@contextlib.contextmanager
def small_disk(where: Path, size: str = "8m") -> Iterator[Path]:
    where.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "forge-test", str(where)], check=True
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


RESERVE = 2 * 1024 * 1024
RESERVE_OPTION = [f"forge_min_free_bytes={RESERVE}", "forge_reserve_bytes=0"]


def free_bytes(disk: Path) -> int:
    st = os.statvfs(disk)
    return st.f_bavail * st.f_frsize


def fill(disk: Path) -> Path:
    """Write a file until less than RESERVE / 2 is free; returns it (delete it to free the
    space). The proxy's log still has room: its warnings must be readable."""
    ballast = disk / "ballast"
    with ballast.open("wb") as f:
        for _ in range(10_000):  # 8 MiB in 4 kB writes is far fewer; bounded all the same
            if free_bytes(disk) < RESERVE // 2:
                break
            f.write(b"\0" * 4096)
            f.flush()
    assert free_bytes(disk) < RESERVE
    return ballast


def ask(client: openai.OpenAI, text: str) -> str:
    reply = client.chat.completions.create(
        model="gpt-4.1", messages=[{"role": "user", "content": text}]
    )
    return reply.choices[0].message.content or ""


def test_a_full_disk_fails_calls_instead_of_passing_them_unrecorded(
    tmp_path: Path, confdir: Path
) -> None:
    with small_disk(tmp_path / "disk") as disk, ScriptedUpstream([{"text": "ok"}]) as up:
        out = disk / "run"
        with (
            forge_proxy(out, confdir, {"api.openai.com": up.base_url}, RESERVE_OPTION) as proxy,
            openai_client(proxy) as client,
        ):
            assert ask(client, "before") == "ok"
            ballast = fill(disk)
            with pytest.raises(openai.APIStatusError) as refused:
                ask(client, "while full")
            assert refused.value.status_code == 507
            assert "forge_on_write_error=fail" in str(refused.value)
            assert len(up.received) == 1, "the refused call reached the provider"
            ballast.unlink()
            assert ask(client, "after") == "ok"
        recorded = connect(out).sql("select status from calls order by call_id").fetchall()
        assert recorded == [("complete",), ("complete",)]
        assert files_containing(out, SECRETS) == []


def test_a_full_disk_with_warn_passes_calls_and_says_so(tmp_path: Path, confdir: Path) -> None:
    log = tmp_path / "warn.log"
    with (
        small_disk(tmp_path / "disk") as disk,
        ScriptedUpstream([{"text": "ok"}]) as up,
        forge_proxy(
            disk / "run",
            confdir,
            {"api.openai.com": up.base_url},
            extra=[*RESERVE_OPTION, "forge_on_write_error=warn"],
        ) as proxy,
        openai_client(proxy) as client,
    ):
        ballast = fill(disk)
        assert ask(client, "while full") == "ok"
        assert len(up.received) == 1
        ballast.unlink()
        assert ask(client, "after") == "ok"
        text = (disk / "run" / "proxy.log").read_text(errors="replace")
        log.write_text(text)
        assert files_containing(disk / "run", SECRETS) == []
    assert "cannot append to the write-ahead log" in text and "forge_min_free_bytes" in text


def fill_to_the_last_byte(disk: Path) -> Path:
    """Write a file until the disk refuses (ENOSPC); returns it."""
    ballast = disk / "ballast"
    with ballast.open("wb", buffering=0) as f:
        for _ in range(100_000):  # bounded: 16 MiB is 4096 writes of 4 kB
            try:
                f.write(b"\0" * 4096)
            except OSError:
                break
    assert free_bytes(disk) < 4096
    return ballast


def test_a_call_in_flight_when_the_disk_fills_is_finished_from_the_reserve(
    tmp_path: Path, confdir: Path
) -> None:
    """A real write error: the END frame does not fit; the reserve is given up for it, the
    call is recorded complete, the next call is refused (507) before it starts, and calls
    pass again once the reserve is whole."""
    reserve = 2 * 1024 * 1024
    options = ["forge_min_free_bytes=0", f"forge_reserve_bytes={reserve}"]
    # A reply larger than any slack left in the log's last page: its END frame cannot fit.
    long = " ".join(f"w{i}" for i in range(20_000))
    with small_disk(tmp_path / "disk", "16m") as disk, ScriptedUpstream([{"text": long}]) as up:
        out = disk / "run"
        with (
            forge_proxy(out, confdir, {"api.openai.com": up.base_url}, options) as proxy,
            openai_client(proxy) as client,
        ):
            assert (out / "wal" / "reserve").stat().st_blocks * 512 >= reserve
            up.first_event_delay_s = 2.0  # the next reply waits upstream while the disk fills
            answer: list[str] = []
            in_flight = threading.Thread(target=lambda: answer.append(ask(client, "in flight")))
            in_flight.start()
            up.wait_for_requests(1)
            ballast = fill_to_the_last_byte(disk)
            up.first_event_delay_s = 0.0
            in_flight.join(30)
            assert answer == [long]
            with pytest.raises(openai.APIStatusError) as refused:
                ask(client, "while full")
            assert refused.value.status_code == 507
            assert "forge_reserve_bytes" in str(refused.value)
            assert len(up.received) == 1, "the refused call reached the provider"
            ballast.unlink()
            time.sleep(0.6)  # the reserve is tried again at most twice a second
            assert ask(client, "after") == long
        recorded = connect(out).sql("select status from calls order by started_at").fetchall()
        assert recorded == [("complete",), ("complete",)]
        text = (out / "proxy.log").read_text(errors="replace")
        assert "reserve finishes the calls in flight" in text
        assert not (out / "wal" / "reserve").exists(), "a clean stop gives the reserve back"
        assert files_containing(out, SECRETS) == []
