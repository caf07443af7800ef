"""Parsing of the addon's option values: pure, and the only place that raises on bad ones."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar, get_args
from urllib.parse import urlsplit

DEFAULT_HOSTS = ("api.anthropic.com", "api.openai.com", "chatgpt.com")

Mode = Literal["record", "serve"]
OtherHosts = Literal["pass", "404"]
OnWriteError = Literal["fail", "warn"]
Builder = Literal["process", "thread"]
MODES: tuple[Mode, ...] = get_args(Mode)
OTHER_HOSTS: tuple[OtherHosts, ...] = get_args(OtherHosts)
ON_WRITE_ERROR: tuple[OnWriteError, ...] = get_args(OnWriteError)
BUILDERS: tuple[Builder, ...] = get_args(Builder)

_Choice = TypeVar("_Choice", bound=str)


class ConfigError(ValueError):
    """An option value Forge cannot use; the message says how to fix it."""


@dataclass(frozen=True)
class Upstream:
    scheme: str
    host: str
    port: int
    path_prefix: str  # "" or "/prefix" without trailing slash

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path_prefix}"


@dataclass(frozen=True)
class Redaction:
    headers: frozenset[str] = frozenset()  # lower-case header names
    params: frozenset[str] = frozenset()  # lower-case query parameter names
    patterns: tuple[re.Pattern[str], ...] = ()  # scrubbed from stored text


@dataclass(frozen=True)
class Config:
    out_dir: Path | None
    mode: Mode = "record"
    rollout: str | None = None
    hosts: frozenset[str] = frozenset(DEFAULT_HOSTS)
    upstreams: dict[str, Upstream] = field(default_factory=dict)
    other_hosts: OtherHosts = "pass"
    redaction: Redaction = Redaction()
    rotate_rows: int = 5000
    rotate_bytes: int = 64 * 1024 * 1024
    rotate_seconds: float = 60.0
    max_body_bytes: int = 256 * 1024 * 1024
    on_write_error: OnWriteError = "fail"
    min_free_bytes: int = 64 * 1024 * 1024
    reserve_bytes: int = 64 * 1024 * 1024  # preallocated to finish the calls in flight
    proxy_password: str | None = None  # clients must send it (any user: the rollout id)
    process_lookup: bool = True
    refuse_websocket: bool = False
    builder: Builder = "process"  # where shards are built: a child process, or a thread
    # Serve mode: the policy server's base URL, the policy's tokenizer folder, and the
    # requested models it answers (empty: all).
    policy_url: str | None = None
    tokenizer_dir: Path | None = None
    serve_models: tuple[str, ...] = ()
    # Serve mode: most completion tokens per served call (0: what the harness asks for).
    serve_max_tokens: int = 0
    # Serve mode: the policy version recorded on calls whose server reports none (vLLM,
    # whose weights the loop publishes; None: the server's own, else none).
    policy_version: int | None = None


def parse_policy_url(value: str) -> str:
    """``forge_policy``: the policy server's base URL (vLLM or ``forge serve-policy``)."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"forge_policy: {value!r} is not an http:// URL (e.g. http://127.0.0.1:8000)"
        )
    return value.strip().rstrip("/").removesuffix("/v1")


def parse_hosts(value: str) -> frozenset[str]:
    hosts = frozenset(h.strip().lower().rstrip(".") for h in value.split(",") if h.strip())
    if not hosts:
        raise ConfigError("forge_hosts is empty: name at least one LLM host, e.g. api.openai.com")
    for host in hosts:
        if not re.fullmatch(r"[a-z0-9*.\-]+|\[[0-9a-f:]+\]", host):
            raise ConfigError(f"forge_hosts: {host!r} is not a host name")
    return hosts


def host_matches(host: str, hosts: frozenset[str]) -> bool:
    """Exact names, or ``*.example.com`` wildcards."""
    host = host.lower().rstrip(".")
    if host in hosts:
        return True
    return any(p.startswith("*.") and host.endswith(p[1:]) for p in hosts)


def parse_upstreams(value: str) -> dict[str, Upstream]:
    """``api.openai.com=http://127.0.0.1:9000,api.anthropic.com=https://gw.example/anthropic``."""
    out: dict[str, Upstream] = {}
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        host, sep, url = part.partition("=")
        host = host.strip().lower()
        if not sep or not host or not url.strip():
            raise ConfigError(
                f"forge_upstream: {part!r} is not HOST=URL (e.g. api.openai.com=http://127.0.0.1:9000)"
            )
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"forge_upstream: {url!r} is not an http:// or https:// URL")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as e:
            raise ConfigError(f"forge_upstream: bad port in {url!r}") from e
        if parts.query or parts.fragment:
            raise ConfigError(f"forge_upstream: {url!r} must not carry a query or fragment")
        out[host] = Upstream(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))
    return out


def parse_redaction(value: str) -> Redaction:
    """Comma list: ``header:NAME``, ``param:NAME`` or ``re:PATTERN``; a bare NAME is a header."""
    headers: set[str] = set()
    params: set[str] = set()
    patterns: list[re.Pattern[str]] = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        kind, sep, rest = part.partition(":")
        if sep and kind == "re":
            try:
                patterns.append(re.compile(rest))
            except re.error as e:
                raise ConfigError(f"forge_redact: bad pattern {rest!r}: {e}") from e
        elif sep and kind == "param":
            params.add(rest.lower())
        elif sep and kind == "header":
            headers.add(rest.lower())
        elif not sep:
            headers.add(part.lower())
        else:
            raise ConfigError(f"forge_redact: {part!r}: use header:NAME, param:NAME or re:PATTERN")
    return Redaction(frozenset(headers), frozenset(params), tuple(patterns))


def parse_choice(name: str, value: str, choices: tuple[_Choice, ...]) -> _Choice:
    for choice in choices:
        if value == choice:
            return choice
    raise ConfigError(f"{name}={value!r}: choose one of {', '.join(choices)}")


def parse_positive(name: str, value: float) -> float:
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value}")
    return value


def parse_non_negative(name: str, value: int) -> int:
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value}")
    return value


def parse_policy_version(value: int) -> int | None:
    """``forge_policy_version``: a version (>= 0), or -1 for none."""
    if value < -1:
        raise ConfigError(f"forge_policy_version must be >= 0 (or -1: none), got {value}")
    return None if value == -1 else value


def parse_proxy_password(value: str) -> str | None:
    """``forge_proxy_password``: the password itself, or ``@FILE`` to read it from a file
    (its first line), so that it need not sit on a command line."""
    if not value:
        return None
    if not value.startswith("@"):
        return value
    path = Path(value[1:]).expanduser()
    try:
        password = (
            path.read_text(encoding="utf-8").splitlines()[0].strip() if path.stat().st_size else ""
        )
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"forge_proxy_password: cannot read {path}: {e}") from e
    if not password:
        raise ConfigError(f"forge_proxy_password: {path} is empty")
    return password
