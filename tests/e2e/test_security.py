"""The proxy is not an open relay, and its CA key stays private."""

from __future__ import annotations

import subprocess
from pathlib import Path

from forge_cli.proxy import ADDON, free_port, mitmdump_path
from tests.support.forge_proxy import forge_proxy


def run_mitmdump(tmp_path: Path, confdir: Path, *args: str) -> str:
    argv = [
        mitmdump_path(),
        "-p",
        str(free_port()),
        "-s",
        str(ADDON),
        "--set",
        f"confdir={confdir}",
        "--set",
        f"forge_dir={tmp_path / 'run'}",
        *args,
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=8)
        return done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:  # it started and kept running: what did it say?
        out = e.stdout or b""
        return out.decode() if isinstance(out, bytes) else out


def test_the_addon_listens_on_loopback_unless_told_otherwise(tmp_path: Path, confdir: Path) -> None:
    log = run_mitmdump(tmp_path, confdir)
    assert "proxy listening at 127.0.0.1:" in log, log


def test_listening_beyond_loopback_without_proxy_auth_is_refused(
    tmp_path: Path, confdir: Path
) -> None:
    log = run_mitmdump(tmp_path, confdir, "--listen-host", "0.0.0.0")
    assert "set proxyauth" in log and "exiting" in log, log


def test_ca_private_key_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    confdir = tmp_path / "conf"
    with forge_proxy(tmp_path / "run", confdir, {}):
        pass
    keys = list(confdir.glob("mitmproxy-ca.*"))
    assert keys and all(p.stat().st_mode & 0o077 == 0 for p in keys)
    assert confdir.stat().st_mode & 0o077 == 0
