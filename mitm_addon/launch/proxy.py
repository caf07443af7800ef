"""Start and stop a ``mitmdump`` running Forge's addon, and give a harness the environment
that sends its calls through it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from mitm_addon.config import ConfigError, parse_proxy_password
from mitm_addon.launch.errors import ForgeError
from mitm_addon.launch.trust import trust_env, write_ca_bundle

ADDON = Path(__file__).resolve().parent.parent / "forge_addon.py"
DEFAULT_CONFDIR = Path("~/.forge/mitmproxy")
_READY_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def mitmdump_path() -> str:
    here = Path(sys.executable).parent / "mitmdump"
    if here.exists():
        return str(here)
    found = shutil.which("mitmdump")
    if not found:
        raise ForgeError("mitmdump not found: install Forge's dependencies (make setup)")
    return found


@dataclass
class ProxySettings:
    out_dir: Path
    confdir: Path = DEFAULT_CONFDIR
    port: int = 0
    listen_host: str = "127.0.0.1"
    rollout: str | None = None
    upstreams: list[str] = field(default_factory=list)
    hosts: str | None = None
    other_hosts: str | None = None
    mode: str = "regular"  # or "transparent"
    extra: list[str] = field(default_factory=list)  # more --set NAME=VALUE


@dataclass
class RunningProxy:
    process: subprocess.Popen[bytes]
    port: int
    confdir: Path
    run_id: str
    log_path: Path
    password: str | None = None  # forge_proxy_password, which clients must send

    @property
    def url(self) -> str:
        """The proxy's address, without credentials (safe to print)."""
        return f"http://127.0.0.1:{self.port}"

    def client_url(self, user: str | None = None) -> str:
        """The proxy URL a harness is given: credentials whose user name is the rollout id
        (the addon records it on each call) and whose password is ``forge_proxy_password``
        where the proxy requires one; the plain address when there is neither. Name a user
        where you can: OpenClaw (Node's fetch) and opencode (Bun's) send no credentials
        at all for an empty user name, and get 407."""
        if not user and self.password is None:
            return self.url
        password = quote(self.password if self.password is not None else "x", safe="")
        return f"http://{quote(user or '', safe='')}:{password}@127.0.0.1:{self.port}"

    @property
    def ca_cert(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"


def start_proxy(settings: ProxySettings) -> RunningProxy:
    """Start mitmdump with the addon and wait until it is recording."""
    out = settings.out_dir.expanduser().resolve()
    confdir = settings.confdir.expanduser().resolve()
    for what, folder in (("the run directory", out), ("the mitmproxy directory", confdir)):
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700 if folder == confdir else 0o777)
        except OSError as e:
            raise ForgeError(f"cannot create {what} {folder}: {e.strerror or e}") from e
    os.chmod(confdir, 0o700)
    password = _proxy_password(settings.extra)
    port = settings.port or free_port()
    ready = out / f".proxy-ready-{os.getpid()}-{port}.json"
    ready.unlink(missing_ok=True)
    log_path = out / "proxy.log"
    args = [
        mitmdump_path(),
        "--listen-host",
        settings.listen_host,
        "--listen-port",
        str(port),
        "-s",
        str(ADDON),
        "--set",
        f"confdir={confdir}",
        "--set",
        f"forge_dir={out}",
        "--set",
        f"forge_ready_file={ready}",
        "--set",
        f"forge_parent_pid={os.getpid()}",  # a SIGKILLed launcher takes its proxy along
        "--set",
        "connection_strategy=lazy",
        "--set",
        "flow_detail=0",
    ]
    if settings.mode != "regular":
        args += ["--mode", settings.mode]
    if settings.rollout:
        args += ["--set", f"forge_rollout={settings.rollout}"]
    if settings.upstreams:
        args += ["--set", f"forge_upstream={','.join(settings.upstreams)}"]
    if settings.hosts:
        args += ["--set", f"forge_hosts={settings.hosts}"]
    if settings.other_hosts:
        args += ["--set", f"forge_other_hosts={settings.other_hosts}"]
    for item in settings.extra:
        args += ["--set", item]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.exists():
            try:
                info = json.loads(ready.read_text())
            except ValueError:
                time.sleep(0.05)
                continue
            ready.unlink(missing_ok=True)
            _protect_ca(confdir)
            return RunningProxy(process, port, confdir, info["run_id"], log_path, password)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    stop_proxy_process(process)
    tail = log_path.read_text(errors="replace")[-3000:]
    raise ForgeError(f"the proxy did not start: {start_failure(tail)} (its log: {log_path})")


def _proxy_password(extra: list[str]) -> str | None:
    """The ``forge_proxy_password`` among the ``--set`` items (the last one wins, as in
    mitmproxy), read as the addon reads it, so that harnesses can be given it."""
    value = None
    for item in extra:
        name, _, rest = item.partition("=")
        if name.strip() == "forge_proxy_password":
            value = rest
    try:
        return parse_proxy_password(value) if value is not None else None
    except ConfigError as e:
        raise ForgeError(str(e)) from e


_FAILURE = re.compile(r"(?:\b[A-Za-z_.]*Error|\berror): (.+)")


def start_failure(log_tail: str) -> str:
    """Why mitmdump exited at start, in one line: its last error line (a bad option's
    ConfigError, a port in use), else the log's last line."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if found := _FAILURE.search(line):
            return found.group(1)
    return lines[-1] if lines else "it exited without a word"


def _protect_ca(confdir: Path) -> None:
    """The CA private key is readable by its owner only."""
    for name in ("mitmproxy-ca.pem", "mitmproxy-ca.p12"):
        p = confdir / name
        if p.exists():
            os.chmod(p, 0o600)


def stop_proxy_process(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM (the addon flushes its shards), then SIGKILL after a bound."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode or 0


def ca_bundle(proxy: RunningProxy) -> Path:
    """System CAs plus the proxy's, for the variables that replace the system store."""
    return write_ca_bundle(proxy.ca_cert, proxy.confdir / "forge-ca-bundle.pem")


def harness_env(
    proxy: RunningProxy, base: dict[str, str], rollout: str | None, proxy_user: str | None = None
) -> dict[str, str]:
    """The child's environment: ``base`` plus the proxy and CA-trust variables of every
    runtime (the proxy URL with its credentials, see :meth:`RunningProxy.client_url`), and
    ``FORGE_ROLLOUT_ID`` when a rollout is named."""
    env = {**base, **trust_env(proxy.client_url(proxy_user), proxy.ca_cert, ca_bundle(proxy))}
    if rollout:
        env["FORGE_ROLLOUT_ID"] = rollout
    return env
