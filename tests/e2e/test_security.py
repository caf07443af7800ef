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
import httpx
import pytest

from mitm_addon.launch import (
    ADDON,
    ProxySettings,
    free_port,
    mitmdump_path,
    start_proxy,
    stop_proxy_process,
    system_ca_file,
)
from pipeline.store import connect
from tests.support.forge_proxy import OPENAI_KEY, files_containing, forge_proxy
from tests.support.upstream import ScriptedUpstream


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
    assert "set forge_proxy_password" in log and "exiting" in log, log
    # mitmproxy's proxyauth=any accepts any credentials: no authentication at all.
    log = run_mitmdump(tmp_path, confdir, "--listen-host", "0.0.0.0", "--proxyauth", "any")
    assert "set forge_proxy_password" in log and "exiting" in log, log


def test_listening_on_every_interface_when_asked_needs_proxy_auth(
    tmp_path: Path, confdir: Path
) -> None:
    # An empty listen_host, given on purpose, is every interface: not overridden, refused.
    log = run_mitmdump(tmp_path, confdir, "--listen-host", "")
    assert "listen_host= (every interface)" in log and "set forge_proxy_password" in log, log


PROXY_PASSWORD = "forge-proxy-pw-0123456789abcdef"


def test_beyond_loopback_clients_need_the_proxy_password_and_the_user_names_the_rollout(
    tmp_path: Path, confdir: Path
) -> None:
    secret = tmp_path / "proxy-password"
    secret.write_text(PROXY_PASSWORD + "\n")
    secret.chmod(0o600)
    out = tmp_path / "run"
    with ScriptedUpstream([{"text": "ok"}]) as up:
        proxy = start_proxy(
            ProxySettings(
                out_dir=out,
                confdir=confdir,
                listen_host="0.0.0.0",
                upstreams=[f"api.openai.com={up.base_url}"],
                extra=[f"forge_proxy_password=@{secret}"],
            )
        )
        try:
            ctx = ssl.create_default_context(cafile=str(proxy.ca_cert))

            def ask(credentials: str) -> int:
                with httpx.Client(
                    proxy=f"http://{credentials}127.0.0.1:{proxy.port}", verify=ctx, timeout=20
                ) as client:
                    return client.post(
                        "https://api.openai.com/v1/chat/completions",
                        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]},
                        headers={"authorization": f"Bearer {OPENAI_KEY}"},
                    ).status_code

            for wrong in ("", "r-1:wrong@", "r-1:@"):
                with pytest.raises(httpx.ProxyError, match="407"):
                    ask(wrong)
            assert ask(f"r-42:{PROXY_PASSWORD}@") == 200
            assert len(up.received) == 1
            assert "proxy-authorization" not in up.received[0].headers
        finally:
            stop_proxy_process(proxy.process)
    (row,) = connect(out).execute("SELECT rollout_id, rollout_source FROM calls").fetchall()
    assert row == ("r-42", "proxy_auth")
    assert files_containing(out, [PROXY_PASSWORD, OPENAI_KEY]) == []


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
