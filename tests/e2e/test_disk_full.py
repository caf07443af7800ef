"""A full disk under a running proxy: calls are refused loudly (the default) or passed with a
warning when the user chose so (`forge_on_write_error=warn`); nothing passes silently.

The disk is an 8 MiB tmpfs mounted for the test (root only, as CI runs), filled after the
proxy started until less than `forge_min_free_bytes` (2 MiB here) is left: the proxy's
reserve for the responses of calls it lets start.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
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
def small_disk(where: Path) -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "forge-test", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


RESERVE = 2 * 1024 * 1024
RESERVE_OPTION = [f"forge_min_free_bytes={RESERVE}"]


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
