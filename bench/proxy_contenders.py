"""The proxies the overhead benchmark compares, each started on a free loopback port.

- ``direct``: no proxy; the client calls the upstream's HTTPS URL.
- ``mitmdump``: bare ``mitmdump``, no addon, streaming bodies (``stream_large_bodies=1``:
  without it mitmproxy holds a server-sent event stream back until it ends, so its time
  to first token would be the whole stream's).
- ``forge``: the same ``mitmdump`` command plus ``-s mitm_addon/forge_addon.py`` recording
  to a temporary ``forge_dir`` (``forge_hosts=127.0.0.1``: the upstream's host), without
  ``stream_large_bodies``: Forge streams (tees) the requests of known APIs and their
  responses itself, and the option would stream every request body past the addon,
  which would then record them empty.
- ``litellm``: LiteLLM's proxy (``litellm --config``), a gateway with an OpenAI model
  pointing at the same upstream, serving HTTPS itself, from its own virtual environment.

Otherwise both mitmdump contenders get the same options (those Forge's launcher sets, plus
trust in the bench CA for the upstream leg), so the difference between them is the addon.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.bench_tls import Pki
from bench.proxy_load import BENCH_KEY, Route
from mitm_addon.launch import ADDON, free_port, mitmdump_path

REPO = Path(__file__).resolve().parent.parent
ADDON_IN_REPO = ADDON.relative_to(REPO)
LITELLM_VENV = REPO / "bench" / ".venv-litellm"
_START_TIMEOUT_S = 120.0  # LiteLLM imports for ~20 s on a busy 2-core machine


class ContenderError(RuntimeError):
    """A contender could not be started; the message says why and how to fix it."""


@dataclass
class Contender:
    name: str
    route: Route
    process: subprocess.Popen[bytes] | None  # the proxy (None: direct)
    log_path: Path | None

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the proxy's process tree so far."""
        if self.process is None:
            return 0.0
        root = psutil.Process(self.process.pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = proc.cpu_times()
                total += t.user + t.system
        return total

    def version(self) -> str:
        return _VERSIONS.get(self.name, "")


_VERSIONS: dict[str, str] = {}


@contextlib.contextmanager
def upstream_server(pki: Pki, work: Path, stream_words: int, chunk_gap_ms: float) -> Iterator[str]:
    """The lean upstream in its own process; yields its HTTPS base URL."""
    port = free_port()
    log = work / "upstream.log"
    cmd = [
        sys.executable,
        "-m",
        "bench.proxy_upstream",
        "--port",
        str(port),
        "--cert",
        str(pki.cert),
        "--key",
        str(pki.key),
        "--stream-words",
        str(stream_words),
        "--chunk-gap-ms",
        str(chunk_gap_ms),
    ]
    with _process(cmd, log, cwd=REPO) as process:
        _wait_listening(port, process, log)
        yield f"https://127.0.0.1:{port}"


def upstream_stats(base_url: str, pki: Pki) -> dict[str, int]:
    import ssl

    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    with urllib.request.urlopen(f"{base_url}/stats", context=context, timeout=10) as r:
        stats: dict[str, int] = json.loads(r.read())
    return stats


@contextlib.contextmanager
def direct(upstream: str, cafile: Path) -> Iterator[Contender]:
    yield Contender(
        "direct", Route(f"{upstream}/v1/chat/completions", None, str(cafile)), None, None
    )


@contextlib.contextmanager
def mitmdump(
    upstream: str,
    pki: Pki,
    work: Path,
    addon: bool,
    extra: Sequence[str] = (),
    checkout: Path | None = None,
) -> Iterator[Contender]:
    """Bare mitmdump (``addon=False``) or Forge in record mode (``addon=True``); ``extra``:
    more ``--set`` options; ``checkout``: the Forge of another checkout of this repository
    (``forge-baseline``, to measure a change against the code before it)."""
    name = ("forge-baseline" if checkout else "forge") if addon else "mitmdump"
    root = checkout.resolve() if checkout else REPO
    port = free_port()
    confdir = work / "mitmproxy-conf"  # shared: the CA is made once
    confdir.mkdir(mode=0o700, exist_ok=True)
    log = work / f"{name}.log"
    cmd = [
        mitmdump_path(),
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        str(port),
        "--set",
        f"confdir={confdir}",
        "--set",
        "connection_strategy=lazy",
        "--set",
        "flow_detail=0",
        "--set",
        f"ssl_verify_upstream_trusted_ca={pki.ca_cert}",
    ]
    ready = work / f".{name}-ready.json"
    if addon:
        forge_dir = work / f"{name}-run"
        cmd += [
            "-s",
            str(root / ADDON_IN_REPO),
            "--set",
            f"forge_dir={forge_dir}",
            "--set",
            "forge_hosts=127.0.0.1",
            "--set",
            f"forge_ready_file={ready}",
        ]
    else:
        cmd += ["--set", "stream_large_bodies=1"]
    for option in extra:
        cmd += ["--set", option]
    with _process(cmd, log, cwd=root) as process:
        if addon:
            _wait_file(ready, process, log)
        _wait_listening(port, process, log)
        bundle = work / "trust.pem"
        bundle.write_text(pki.ca_cert.read_text() + (confdir / "mitmproxy-ca-cert.pem").read_text())
        _VERSIONS.setdefault(name, _mitmproxy_version())
        yield Contender(
            name,
            Route(f"{upstream}/v1/chat/completions", f"http://127.0.0.1:{port}", str(bundle)),
            process,
            log,
        )


LITELLM_CONFIG = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}/v1
      api_key: sk-bench-not-a-real-key
general_settings:
  master_key: {master_key}
litellm_settings:
  telemetry: false
  drop_params: true
  ssl_verify: {cafile}
"""


def litellm_path() -> Path:
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        raise ContenderError(
            f"LiteLLM is not installed in {LITELLM_VENV}: run `make bench-setup` "
            "(or pass --skip litellm)"
        )
    return exe


@contextlib.contextmanager
def litellm(
    upstream: str, pki: Pki, work: Path, model: str, workers: int = 1
) -> Iterator[Contender]:
    """LiteLLM's proxy, HTTPS with the bench certificate, no database: ``litellm`` with
    one worker, ``litellm-workers`` with ``workers`` (as many as the cores, its best
    configuration on a multi-core host: Forge uses two processes, proxy and builder)."""
    name = "litellm" if workers == 1 else "litellm-workers"
    exe = litellm_path()
    port = free_port()
    config = work / f"{name}.yaml"
    config.write_text(
        LITELLM_CONFIG.format(
            model=model, upstream=upstream, cafile=pki.ca_cert, master_key=BENCH_KEY
        )
    )
    config.chmod(0o600)
    log = work / f"{name}.log"
    cmd = [
        str(exe),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        str(workers),
        "--ssl_keyfile_path",
        str(pki.key),
        "--ssl_certfile_path",
        str(pki.cert),
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LITELLM", "OPENAI", "DATABASE_URL", "HTTP_PROXY", "HTTPS_PROXY"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    env.update(
        LITELLM_LOG="ERROR",
        LITELLM_LOCAL_MODEL_COST_MAP="True",  # no fetch of the price list at start
        SSL_CERT_FILE=str(pki.ca_cert),
    )
    with _process(cmd, log, cwd=work, env=env) as process:
        _wait_listening(port, process, log)
        _VERSIONS.setdefault(name, _litellm_version())
        yield Contender(
            name,
            Route(f"https://127.0.0.1:{port}/v1/chat/completions", None, str(pki.ca_cert)),
            process,
            log,
        )


@contextlib.contextmanager
def _process(
    cmd: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as out:
        process = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group (Forge flushes its shards), SIGKILL after a bound."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    import socket

    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise ContenderError(f"{process.args[0]} did not listen on port {port} (log {log}):\n{tail}")


def _wait_file(path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists():
            return
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise ContenderError(f"Forge's addon did not start recording (log {log}):\n{tail}")


def _mitmproxy_version() -> str:
    from importlib.metadata import version

    return f"mitmproxy {version('mitmproxy')}"


def _litellm_version() -> str:
    python = LITELLM_VENV / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", "from importlib.metadata import version; print(version('litellm'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return f"litellm {out.stdout.strip()}" if out.returncode == 0 else "litellm ?"
