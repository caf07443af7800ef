"""The proxy is not an open relay, and its CA key stays private."""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import certifi

from mitm_addon.launch import ADDON, free_port, mitmdump_path, system_ca_file
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


def test_listening_on_every_interface_when_asked_needs_proxy_auth(
    tmp_path: Path, confdir: Path
) -> None:
    # An empty listen_host, given on purpose, is every interface: not overridden, refused.
    log = run_mitmdump(tmp_path, confdir, "--listen-host", "")
    assert "listen_host= (every interface)" in log and "set proxyauth" in log, log


def test_an_eager_connection_strategy_the_user_set_is_refused_not_overridden(
    tmp_path: Path, confdir: Path
) -> None:
    log = run_mitmdump(tmp_path, confdir, "--set", "connection_strategy=eager")
    assert "connection_strategy=eager: Forge needs lazy" in log and "exiting" in log, log
    log = run_mitmdump(tmp_path, confdir, "--set", "connection_strategy=lazy")
    assert "proxy listening at 127.0.0.1:" in log, log


def test_ca_private_key_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    confdir = tmp_path / "conf"
    with forge_proxy(tmp_path / "run", confdir, {}):
        pass
    keys = list(confdir.glob("mitmproxy-ca.*"))
    assert keys and all(p.stat().st_mode & 0o077 == 0 for p in keys)
    assert confdir.stat().st_mode & 0o077 == 0


TRUST_STORES = [
    "/etc/ssl/certs",
    "/usr/local/share/ca-certificates",
    "/usr/share/ca-certificates",
    "/etc/pki/ca-trust/source/anchors",
    "/etc/pki/tls/certs",
]
CA_VARIABLES = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "CODEX_CA_CERTIFICATE",
    "NODE_EXTRA_CA_CERTS",
]


def trust_store_digests() -> dict[str, str]:
    """sha256 of every file the system and Python trust: the bundles and the anchor folders."""
    paths = {Path(certifi.where()), *(Path(d) for d in TRUST_STORES)}
    verify = ssl.get_default_verify_paths()
    paths |= {Path(p) for p in (verify.cafile, verify.capath, system_ca_file()) if p}
    files = set()
    for path in paths:
        if path.is_dir():
            files |= {f for f in path.iterdir() if f.is_file()}  # follows symlinks
        elif path.is_file():
            files.add(path)
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(files)}


def test_forge_record_trusts_its_ca_only_in_the_harness_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["HOME"] = str(home)
    seen = tmp_path / "env.json"
    dump = f"import json, os; json.dump(dict(os.environ), open({str(seen)!r}, 'w'))"
    before = trust_store_digests()
    record = ["record", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", dump]
    done = subprocess.run(
        [sys.executable, "-m", "forge_cli.main", *record],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert trust_store_digests() == before
    confdir = home / ".forge" / "mitmproxy"
    ca = (confdir / "mitmproxy-ca-cert.pem").read_text().strip()
    for name in before:  # and no earlier run left it in one
        assert ca not in Path(name).read_text(errors="replace"), name
    harness = json.loads(seen.read_text())
    for name in CA_VARIABLES:
        assert Path(harness[name]).parent == confdir, (name, harness[name])
