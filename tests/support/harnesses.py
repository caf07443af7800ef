"""The real agent harness CLIs (Claude Code, Codex) for end-to-end tests.

Where the pinned binaries live (``.harnesses/``, installed with
``scripts/install_harnesses.sh``), whether they are there, and the exact argv and
environment of an unattended run on a small task. The harness is left as it ships.
Only the proxy (``HTTPS_PROXY``), CA trust, a dummy key, a throwaway home and the
switches that turn off telemetry and side traffic reach it. docs/harnesses.md
records what each harness sends, measured with the versions pinned here.

Everything here is pure except :meth:`HarnessRun.prepare` (creates the
directories) and :func:`run` (runs the command, bounded by a timeout)::

    run_spec = claude_command("create a file hello.txt containing hi",
                              workdir=tmp / "work", home=tmp / "home",
                              proxy_url=proxy.url, ca_cert=proxy.ca_cert)
    proc = run(run_spec, timeout_s=120)
    assert proc.returncode == 0 and (tmp / "work" / "hello.txt").read_text() == "hi"

Check the output as well as the exit code. When the CA is not trusted, Claude Code
exits 1 after about 20 s of retries, and Codex never exits by itself: it retries
("Reconnecting... waiting for network") until the timeout kills it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

REPO_ROOT = Path(__file__).resolve().parents[2]
HARNESS_DIR = REPO_ROOT / ".harnesses"
NODE_MODULES = HARNESS_DIR / "node_modules"
BIN_DIR = NODE_MODULES / ".bin"

CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
CODEX_PACKAGE = "@openai/codex"
# Kept equal to .harnesses/package.json (see pinned_versions()).
CLAUDE_CODE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"

HarnessName = Literal["claude", "codex"]
HARNESSES: tuple[HarnessName, ...] = ("claude", "codex")

# Hosts each harness contacts in the runs built here (quiet settings). Everything
# else is switched off; see docs/harnesses.md for what the switches remove.
PROVIDER_HOSTS: dict[HarnessName, tuple[str, ...]] = {
    "claude": ("api.anthropic.com",),
    "codex": ("api.openai.com",),
}

# Codex's default model (gpt-6.2-sol in 0.171.0) runs in "code mode": its tools
# arrive as an `additional_tools` input item (namespaces), and the shell is reached
# only through the freeform `exec` tool, whose input is JavaScript
# (`await tools.exec_command({cmd: "..."})`). A model from Codex's catalogue
# without code mode gets the classic request: a top-level `tools` list with the
# `exec_command` function ({"cmd": "..."}). Tests use the latter by default,
# with no "model metadata not found" warning. Pass model=None for the default model.
CODEX_TEST_MODEL = "gpt-5.5"

# Codex settings that stop side traffic: OTLP metrics to ab.chatgpt.com, the
# plugin marketplace (github.com, api.github.com, chatgpt.com/backend-api/plugins),
# and the model catalogue refresh (chatgpt.com/backend-api/codex/models).
CODEX_QUIET_ARGS: tuple[str, ...] = (
    "-c", "analytics.enabled=false",
    "--disable", "plugins",
    "--disable", "remote_plugin",
    "--disable", "api_key_model_discovery",
)

# Name of the model provider defined for transport="http": the built-in `openai`
# provider cannot be overridden (-c model_providers.openai.supports_websockets=false
# is ignored), so a custom provider with the same base URL is used instead.
CODEX_HTTP_PROVIDER = "openai_http"
# A custom provider that keeps the WebSocket: the one that can send extra headers.
CODEX_WS_PROVIDER = "openai_ws"

CLAUDE_QUIET_ENV: dict[str, str] = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
}


# --------------------------------------------------------------------------- locations


def _platform_key() -> str:
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        machine, machine)
    system = platform.system().lower()
    if system == "linux":
        libc = platform.libc_ver()[0]
        return f"linux-{arch}" + ("" if libc == "glibc" else "-musl")
    return f"{system}-{arch}"


def claude_bin() -> Path:
    """The `claude` command: .harnesses/node_modules/.bin/claude.

    That file is the native binary (Claude Code ships as one since 2.1; the
    package's postinstall hard-links the platform package's binary over a
    placeholder). Where the postinstall did not run (npm's install-script
    allow-list, --ignore-scripts), the platform package's binary is returned.
    """
    shim = BIN_DIR / "claude"
    try:
        if shim.resolve().stat().st_size > 1_000_000:
            return shim
    except OSError:
        pass
    native = NODE_MODULES / f"{CLAUDE_CODE_PACKAGE}-{_platform_key()}" / "claude"
    return native if native.exists() else shim


def codex_bin() -> Path:
    """The `codex` command: the npm launcher (node), which execs the native binary
    from the platform package (@openai/codex-<platform>, an npm alias of
    @openai/codex@<version>-<platform>), as an npm install runs it."""
    return BIN_DIR / "codex"


def binary(name: HarnessName) -> Path:
    if name == "claude":
        return claude_bin()
    if name == "codex":
        return codex_bin()
    raise ValueError(f"unknown harness {name!r}")


def pinned_versions() -> dict[str, str]:
    """Package name -> exact version, as .harnesses/package.json pins them."""
    with open(HARNESS_DIR / "package.json", encoding="utf-8") as f:
        return dict(json.load(f)["dependencies"])


def installed_version(name: HarnessName) -> str | None:
    """Version of the installed npm package, or None when it is not installed."""
    pkg = CLAUDE_CODE_PACKAGE if name == "claude" else CODEX_PACKAGE
    try:
        with open(NODE_MODULES / pkg / "package.json", encoding="utf-8") as f:
            return str(json.load(f)["version"])
    except (OSError, ValueError, KeyError):
        return None


def unavailable_reason(name: HarnessName) -> str | None:
    """Why the harness cannot run here (a pytest skip reason), or None when it can."""
    path = binary(name)
    if not path.exists():
        return f"{name} is not installed ({path} missing; run scripts/install_harnesses.sh)"
    if not os.access(path, os.X_OK):
        return f"{path} is not executable"
    if name == "codex" and shutil.which("node") is None:
        return "node is not on PATH (the codex launcher is a node script)"
    if name == "claude" and path.resolve().stat().st_size < 1_000_000:
        return f"{path} is the placeholder, not the native binary (postinstall skipped?)"
    want = CLAUDE_CODE_VERSION if name == "claude" else CODEX_VERSION
    have = installed_version(name)
    if have != want:
        return f"{name} {have} installed, {want} pinned (rerun scripts/install_harnesses.sh)"
    return None


def available(name: HarnessName | None = None) -> bool:
    """True when the harness (or, with no name, every harness) can run here."""
    names = HARNESSES if name is None else (name,)
    return all(unavailable_reason(n) is None for n in names)


def claude_available() -> bool:
    return available("claude")


def codex_available() -> bool:
    return available("codex")


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class HarnessRun:
    """One unattended harness run: run `argv` in `cwd` with exactly `env`, stdin
    closed (``codex exec`` reads stdin to EOF when it is not a terminal)."""

    harness: HarnessName
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    home: Path
    make_dirs: tuple[Path, ...] = field(default=())

    def prepare(self) -> HarnessRun:
        """Create the working directory and the throwaway home(s)."""
        for d in (self.cwd, self.home, *self.make_dirs):
            d.mkdir(parents=True, exist_ok=True)
        return self


def _base_env(home: Path, proxy_url: str | None, base_env: Mapping[str, str] | None
              ) -> dict[str, str]:
    """A small environment built from scratch: nothing from the caller's environment
    (real keys, proxies, NO_PROXY, CA settings) leaks in besides PATH."""
    src = os.environ if base_env is None else base_env
    env = {
        "PATH": src.get("PATH", os.defpath),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "TMPDIR": src.get("TMPDIR", "/tmp"),
    }
    if proxy_url:
        env["HTTPS_PROXY"] = proxy_url
    return env


def claude_command(
    prompt: str,
    *,
    workdir: Path,
    home: Path,
    proxy_url: str | None,
    ca_cert: Path | str | None,
    api_key: str = "dummy",
    model: str | None = None,
    output_format: Literal["text", "json", "stream-json"] = "text",
    quiet: bool = True,
    extra_args: Sequence[str] = (),
    base_env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> HarnessRun:
    """``claude -p PROMPT --dangerously-skip-permissions`` with a dummy key.

    ``headers`` go on every API request through ``ANTHROPIC_CUSTOM_HEADERS`` (one
    ``Name: value`` per line), all but ``x-api-key``, which the key sets.

    As root, Claude Code refuses --dangerously-skip-permissions unless
    IS_SANDBOX=1. The CA is trusted through NODE_EXTRA_CA_CERTS (SSL_CERT_FILE
    works too). With ``quiet`` the run contacts only api.anthropic.com:
    GET /api/claude_code/settings, GET /api/claude_code/policy_limits, then
    POST /v1/messages?beta=true per model turn (SSE).
    """
    env = _base_env(home, proxy_url, base_env)
    env["ANTHROPIC_API_KEY"] = api_key
    if headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(
            f"{k}: {v}" for k, v in headers.items() if k.lower() != "x-api-key"
        )
    if ca_cert is not None:
        env["NODE_EXTRA_CA_CERTS"] = str(ca_cert)
    if quiet:
        env.update(CLAUDE_QUIET_ENV)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"
    argv = [str(claude_bin()), "-p", prompt, "--dangerously-skip-permissions"]
    if output_format != "text":
        argv += ["--output-format", output_format]
        if output_format == "stream-json":
            argv.append("--verbose")  # required by -p with stream-json
    if model:
        argv += ["--model", model]
    argv += list(extra_args)
    return HarnessRun("claude", tuple(argv), env, Path(workdir), Path(home))


def codex_http_provider_args(
    provider: str = CODEX_HTTP_PROVIDER,
    *,
    websockets: bool = False,
    headers: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """-c overrides defining a provider like the built-in one: same base URL
    (https://api.openai.com/v1), key from OPENAI_API_KEY, the Responses API over HTTP +
    SSE (or over its WebSocket with ``websockets``), and ``headers`` on every request
    (``http_headers``, all but ``authorization``, which the key sets)."""
    p = f"model_providers.{provider}"
    args = [
        "-c", f"model_provider={provider}",
        "-c", f"{p}.name={provider}",
        "-c", f"{p}.base_url=https://api.openai.com/v1",
        "-c", f"{p}.env_key=OPENAI_API_KEY",
        "-c", f"{p}.wire_api=responses",
        "-c", f"{p}.supports_websockets={'true' if websockets else 'false'}",
    ]
    sent = {k: v for k, v in (headers or {}).items() if k.lower() != "authorization"}
    if sent:  # a TOML inline table; JSON strings are TOML basic strings
        table = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in sent.items())
        args += ["-c", f"{p}.http_headers={{ {table} }}"]
    return tuple(args)


def codex_command(
    prompt: str,
    *,
    workdir: Path,
    home: Path,
    proxy_url: str | None,
    ca_cert: Path | str | None,
    api_key: str = "dummy",
    model: str | None = CODEX_TEST_MODEL,
    transport: Literal["websocket", "http"] = "websocket",
    quiet: bool = True,
    json_events: bool = False,
    extra_args: Sequence[str] = (),
    base_env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> HarnessRun:
    """``codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox PROMPT``.

    No login is needed: ``codex exec`` takes the key from CODEX_API_KEY (sent as
    ``Authorization: Bearer``). OPENAI_API_KEY alone is *not* used by the built-in
    provider (the requests then carry no Authorization header); it is set too,
    for the custom provider of transport="http" (its env_key).
    CODEX_HOME (under ``home``) must exist; :meth:`HarnessRun.prepare` creates it.

    transport="websocket" is the default of the built-in `openai` provider:
    ``GET wss://api.openai.com/v1/responses`` upgraded to a WebSocket, one per
    agent thread, carrying ``response.create`` messages. Codex falls back to
    HTTP + SSE (``POST /v1/responses``) for the rest of that agent thread when the
    upgrade is refused (the proxy answers 426); each new sub-agent thread tries the
    WebSocket again. transport="http" never tries
    the WebSocket, through a custom provider (see codex_http_provider_args); its
    requests differ a little from the built-in provider's: no ``version`` header,
    no ``internal_chat_message_metadata_passthrough`` on input items, shorter tool
    descriptions, and the key comes from OPENAI_API_KEY.

    The built-in provider takes no extra headers. With ``headers``, transport="websocket"
    runs a custom provider that keeps the WebSocket (``supports_websockets=true``), and
    both transports send the headers (see codex_http_provider_args).
    """
    codex_home = Path(home) / ".codex"
    env = _base_env(home, proxy_url, base_env)
    env["CODEX_HOME"] = str(codex_home)
    env["CODEX_API_KEY"] = api_key
    env["OPENAI_API_KEY"] = api_key
    if ca_cert is not None:
        env["CODEX_CA_CERTIFICATE"] = str(ca_cert)
    argv = [str(codex_bin()), "exec", "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox", "--color", "never",
            "-C", str(workdir)]
    if quiet:
        argv += list(CODEX_QUIET_ARGS)
    if transport not in ("websocket", "http"):
        raise ValueError(f"transport must be 'websocket' or 'http', not {transport!r}")
    if transport == "http" or headers:
        argv += list(codex_http_provider_args(
            CODEX_HTTP_PROVIDER if transport == "http" else CODEX_WS_PROVIDER,
            websockets=transport == "websocket", headers=headers))
    if model:
        argv += ["-m", model]
    if json_events:
        argv.append("--json")
    argv += list(extra_args)
    argv.append(prompt)
    return HarnessRun("codex", tuple(argv), env, Path(workdir), Path(home),
                      make_dirs=(codex_home,))


def command(name: HarnessName, prompt: str, **kwargs: object) -> HarnessRun:
    """claude_command or codex_command by name."""
    if name == "claude":
        return claude_command(prompt, **kwargs)  # type: ignore[arg-type]
    if name == "codex":
        return codex_command(prompt, **kwargs)  # type: ignore[arg-type]
    raise ValueError(f"unknown harness {name!r}")


def run(spec: HarnessRun, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run a prepared command, stdin closed, output captured, in its own process
    group; on timeout the whole group is killed and returncode is -9."""
    spec.prepare()
    proc = subprocess.Popen(
        list(spec.argv), cwd=spec.cwd, env=dict(spec.env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        return subprocess.CompletedProcess(list(spec.argv), -9, out, err)
    return subprocess.CompletedProcess(list(spec.argv), proc.returncode, out, err)
