"""End-to-end helpers: a real mitmdump running Forge's addon, and SDK clients that use it."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import ssl
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from mitm_addon.launch import ProxySettings, RunningProxy, start_proxy, stop_proxy_process

# Dummy credentials the tests send; a scan checks that none of them reaches disk.
OPENAI_KEY = "sk-proj-forgetestkey-0123456789abcdefABCDEF"
ANTHROPIC_KEY = "sk-ant-api03-forgetestkey-0123456789abcdef"
COOKIE_VALUE = "forge-cookie-0123456789abcdef"
PROXY_PASSWORD = "forge-proxy-password-0123456789abcdef"  # in proxy credentials
# The Proxy-Authorization header's own form of them (Basic, no user).
PROXY_AUTH = base64.b64encode(f":{PROXY_PASSWORD}".encode()).decode()
SECRETS = (OPENAI_KEY, ANTHROPIC_KEY, COOKIE_VALUE, PROXY_PASSWORD, PROXY_AUTH)
# Every kind of credential header, for clients and harnesses to send on each model call.
SECRET_HEADERS = {
    "cookie": f"session={COOKIE_VALUE}; theme=dark",
    "authorization": f"Bearer {OPENAI_KEY}",
    "x-api-key": ANTHROPIC_KEY,
}
_MODEL_PATHS = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


def password_args(folder: Path) -> list[str]:
    """``--set forge_proxy_password=@FILE`` for ``forge record``: the proxy answers 407 to
    a client without it, so a harness that got through sent it in its proxy credentials."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "proxy-password"
    path.write_text(PROXY_PASSWORD + "\n")
    return ["--set", f"forge_proxy_password=@{path}"]


def assert_secrets_sent(received: Sequence[Any]) -> None:
    """Every model call the upstream received carried the cookie, the bearer token and the
    x-api-key of SECRET_HEADERS (so the scan that follows looked for values really sent)."""
    calls = [r for r in received if r.path.split("?")[0] in _MODEL_PATHS]
    assert calls, [r.path for r in received]
    for r in calls:
        sent = {k: r.headers.get(k, "") for k in SECRET_HEADERS}
        assert COOKIE_VALUE in sent["cookie"], (r.path, sent)
        assert sent["authorization"] == f"Bearer {OPENAI_KEY}", (r.path, sent)
        assert sent["x-api-key"] == ANTHROPIC_KEY, (r.path, sent)


@contextlib.contextmanager
def forge_proxy(
    out_dir: Path,
    confdir: Path,
    upstreams: dict[str, str],
    extra: Sequence[str] = (),
    rollout: str | None = None,
) -> Iterator[RunningProxy]:
    """mitmdump -s forge_addon.py on a free loopback port; stopped with SIGTERM (shards flushed)."""
    settings = ProxySettings(
        out_dir=out_dir,
        confdir=confdir,
        rollout=rollout,
        upstreams=[f"{h}={u}" for h, u in upstreams.items()],
        extra=list(extra),
    )
    proxy = start_proxy(settings)
    try:
        yield proxy
    finally:
        stop_proxy_process(proxy.process)
    # Whatever the test sent through it, no secret reached the run directory.
    assert files_containing(out_dir, SECRETS) == [], "a key, cookie or proxy password reached disk"


def kill_proxy(proxy: RunningProxy) -> None:
    """SIGKILL: no flush, no clean-up; what survives is what the WAL and shards hold."""
    os.killpg(proxy.process.pid, signal.SIGKILL)
    proxy.process.wait(10)


def http_client(proxy: RunningProxy, timeout: float = 30.0) -> httpx.Client:
    """A client through the proxy that sends every kind of secret on every request: proxy
    credentials with a password (no user: the rollout stays the proxy's), a session cookie
    (as browsers and some harnesses do), a bearer token and an ``x-api-key`` (the SDKs set
    their own over these). The secrets scan looks for each value."""
    verify = ssl.create_default_context(cafile=str(proxy.ca_cert))
    return httpx.Client(
        proxy=f"http://:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}",
        verify=verify,
        timeout=timeout,
        headers=SECRET_HEADERS,
    )


def openai_client(proxy: RunningProxy):  # type: ignore[no-untyped-def]
    import openai

    return openai.OpenAI(api_key=OPENAI_KEY, http_client=http_client(proxy), max_retries=0)


def anthropic_client(proxy: RunningProxy):  # type: ignore[no-untyped-def]
    import anthropic

    return anthropic.Anthropic(api_key=ANTHROPIC_KEY, http_client=http_client(proxy), max_retries=0)


def files_containing(root: Path, needles: Sequence[str]) -> list[str]:
    """Every file under root holding any needle (the secrets scan)."""
    hits = []
    for p in root.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            hits += [f"{p}: {n[:12]}..." for n in needles if n.encode() in data]
    return hits
