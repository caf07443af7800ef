"""The ``forge_*`` options: declared once, parsed once per change into the ``Config`` the
other addons read (``Shared.config``). A bad value is an ``OptionsError`` that says how to
fix it; an option the user set is never silently overridden."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

from mitmproxy import ctx, exceptions, optmanager
from mitmproxy.addonmanager import Loader

from mitm_addon import config as cfg
from mitm_addon.addons.state import NO_FORGE_DIR, Shared
from mitm_addon.serve.handler import parse_models

log = logging.getLogger(__name__)


class Settings:
    """Declares every ``forge_*`` option and parses them into ``Shared.config``."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "forge_dir",
            str,
            "",
            "Directory the recorded calls go to (Parquet shards under calls/ and messages/, "
            "a write-ahead log under wal/). Created if absent; must be writable.",
        )
        loader.add_option(
            "forge_mode",
            str,
            "record",
            "record: pass calls through to the provider and record them. serve: answer them "
            "from the policy server (forge_policy) and record them with their token ids; no "
            "provider is contacted for the models it serves.",
        )
        loader.add_option(
            "forge_policy",
            str,
            "",
            "Serve mode: base URL of the policy server (vLLM or forge serve-policy), e.g. "
            "http://127.0.0.1:8000 .",
        )
        loader.add_option(
            "forge_tokenizer",
            str,
            "",
            "Serve mode: folder of the policy's tokenizer and chat template (its model folder).",
        )
        loader.add_option(
            "forge_serve_models",
            str,
            "all",
            "Serve mode: the requested models the policy answers, comma-separated names or "
            "globs (claude-*), or all. Calls for other models go to their provider and are "
            "recorded as in record mode.",
        )
        loader.add_option(
            "forge_serve_max_tokens",
            int,
            0,
            "Serve mode: the most completion tokens the policy writes per call, below what the "
            "harness asks for (0: no cap beyond the harness's own max_tokens, else 4096). A "
            "capped reply ends with the API's length stop reason.",
        )
        loader.add_option(
            "forge_policy_version",
            int,
            -1,
            "Serve mode: the policy version recorded on each served call when the policy "
            "server reports none (vLLM; forge serve-policy reports its own). -1: none.",
        )
        loader.add_option(
            "forge_rollout",
            Optional[str],  # type: ignore[arg-type]  # noqa: UP045 - mitmproxy's option types
            None,
            "Rollout id for calls that carry none in their proxy credentials "
            "(HTTPS_PROXY=http://ROLLOUT:x@host:port) .",
        )
        loader.add_option(
            "forge_proxy_password",
            str,
            "",
            "Require proxy credentials with this password (@FILE: read it from FILE) from "
            "every client; the user name is free and names the rollout "
            "(HTTPS_PROXY=http://ROLLOUT:PASSWORD@host:port). Needed to listen beyond "
            "loopback (or mitmproxy's proxyauth, whose fixed user then names no rollout).",
        )
        loader.add_option(
            "forge_hosts",
            str,
            ",".join(cfg.DEFAULT_HOSTS),
            "Comma-separated LLM hosts to intercept (*.example.com wildcards allowed). "
            "Every other host is tunnelled untouched or refused, per forge_other_hosts.",
        )
        loader.add_option(
            "forge_upstream",
            str,
            "",
            "Send a provider host to another base URL: "
            "api.openai.com=http://127.0.0.1:9000,api.anthropic.com=https://gateway.example .",
        )
        loader.add_option(
            "forge_other_hosts",
            str,
            "pass",
            "Hosts outside forge_hosts: pass (tunnel untouched, no forged certificate) or 404 "
            "(answer 404 locally; on a machine without internet, catalog fetchers then fall back).",
        )
        loader.add_option(
            "forge_redact",
            str,
            "",
            "Extra secrets to keep off disk, comma-separated: header:NAME, param:NAME or re:PATTERN "
            "(a bare NAME is a header). Authorization, API-key headers, cookies, proxy passwords "
            "and key-like query parameters are always removed.",
        )
        loader.add_option(
            "forge_rotate_rows", int, 5000, "Start a new shard after this many calls."
        )
        loader.add_option(
            "forge_rotate_bytes",
            int,
            64 * 1024 * 1024,
            "Start a new shard after this many body bytes.",
        )
        loader.add_option(
            "forge_rotate_seconds", int, 60, "Start a new shard after this many seconds."
        )
        loader.add_option(
            "forge_max_body_bytes",
            int,
            256 * 1024 * 1024,
            "Bodies past this size still pass through, but are not kept whole (the row says so).",
        )
        loader.add_option(
            "forge_on_write_error",
            str,
            "fail",
            "When a call cannot be logged (disk full, directory gone): fail (answer the harness "
            "507 so nothing passes unrecorded) or warn (pass the call and log an error).",
        )
        loader.add_option(
            "forge_min_free_bytes",
            int,
            64 * 1024 * 1024,
            "Treat the disk as full when less than this is free under forge_dir: a call that "
            "starts then is a write error (see forge_on_write_error), so a response is never "
            "passed that could not be logged. 0 turns the check off.",
        )
        loader.add_option(
            "forge_reserve_bytes",
            int,
            64 * 1024 * 1024,
            "Disk space the write-ahead log preallocates under forge_dir (wal/reserve) and "
            "gives up when the disk fills, so that the calls already passed can still be "
            "logged; until it is whole again, new calls are write errors. 0: no reserve.",
        )
        loader.add_option(
            "forge_process_lookup",
            bool,
            True,
            "Find the client process of each connection (pid, ancestors, FORGE_ROLLOUT_ID).",
        )
        loader.add_option(
            "forge_builder",
            str,
            "process",
            "Where recorded calls become Parquet shards: process (a child process, python -m "
            "mitm_addon.builder, so that parsing and encoding take nothing from the proxy's "
            "event loop) or thread (a thread of the proxy: no child process, at a cost in "
            "throughput). Either reads the write-ahead log the hooks append to.",
        )
        loader.add_option(
            "forge_refuse_websocket",
            bool,
            False,
            "Answer WebSocket upgrades to the Responses API with 426, so clients that can "
            "(Codex CLI) fall back to HTTP + SSE.",
        )
        loader.add_option(
            "forge_ready_file", str, "", "Written once the addon is recording (for launchers)."
        )
        loader.add_option(
            "forge_parent_pid",
            int,
            0,
            "Stop, storing every recorded call, once the process with this pid is no longer "
            "the proxy's parent: a launcher killed with SIGKILL takes its proxy with it "
            "(forge record and forge rollout set it). 0: off.",
        )

    def configure(self, updated: set[str]) -> None:
        o = ctx.options
        if "connection_strategy" in updated:
            self._lazy_connections()
        if "listen_host" in o and updated & {"listen_host", "proxyauth", "forge_proxy_password"}:
            self._loopback_unless_asked()
        if "stream_large_bodies" in updated and o.stream_large_bodies:
            # mitmproxy would stream a large request past the addon, which then records
            # an empty body; Forge streams responses from LLM hosts itself anyway.
            raise exceptions.OptionsError(
                "stream_large_bodies would pass large requests through unrecorded: unset it "
                "(Forge streams every response from an LLM host itself; forge_max_body_bytes "
                "bounds what it keeps)"
            )
        if not any(k.startswith("forge_") for k in updated):
            return
        try:
            new = parse_config(o)
            if new.out_dir is not None:
                check_writable(new.out_dir)
        except cfg.ConfigError as e:
            raise exceptions.OptionsError(str(e)) from e
        self.shared.config = new
        self.shared.config_error = None if new.out_dir else NO_FORGE_DIR

    def _lazy_connections(self) -> None:
        """LLM hosts may be unreachable (tests, gateways, serve mode): Forge connects
        upstream only once it knows where a call goes. mitmproxy's default (eager) becomes
        lazy; an eager strategy the user asked for is refused."""
        if ctx.options.connection_strategy == "lazy":
            return
        if set_by_user("connection_strategy"):
            raise exceptions.OptionsError(
                "connection_strategy=eager: Forge needs lazy (it connects to a provider only "
                "once it knows where the call goes: forge_upstream reroutes it, serve mode "
                "answers it); unset connection_strategy"
            )
        ctx.options.update(connection_strategy="lazy")

    def _loopback_unless_asked(self) -> None:
        """mitmproxy listens on every interface by default; a recorder of API traffic
        listens on loopback unless the user names a host, and one beyond loopback needs
        proxy authentication (``check_listen_host``)."""
        o = ctx.options
        if not set_by_user("listen_host"):
            if o.listen_host != "127.0.0.1":
                o.update(listen_host="127.0.0.1")
            return
        check_listen_host(o.listen_host, o.proxyauth, o.forge_proxy_password)


def set_by_user(name: str) -> bool:
    """Did the user (a flag, --set, a config file) give this mitmproxy option a value,
    even its default? mitmproxy keeps unset options as ``optmanager.unset``."""
    option = ctx.options._options.get(name)  # noqa: SLF001 - no public "was it set" API
    return option is not None and option.value is not optmanager.unset


def parse_config(o: optmanager.OptManager) -> cfg.Config:
    """The ``Config`` of the current ``forge_*`` option values; ConfigError on a bad one."""
    out = Path(o.forge_dir).expanduser().resolve() if o.forge_dir else None
    return cfg.Config(
        out_dir=out,
        mode=cfg.parse_choice("forge_mode", o.forge_mode, cfg.MODES),
        rollout=o.forge_rollout or None,
        proxy_password=cfg.parse_proxy_password(o.forge_proxy_password),
        hosts=cfg.parse_hosts(o.forge_hosts),
        upstreams=cfg.parse_upstreams(o.forge_upstream),
        other_hosts=cfg.parse_choice("forge_other_hosts", o.forge_other_hosts, cfg.OTHER_HOSTS),
        redaction=cfg.parse_redaction(o.forge_redact),
        rotate_rows=int(cfg.parse_positive("forge_rotate_rows", o.forge_rotate_rows)),
        rotate_bytes=int(cfg.parse_positive("forge_rotate_bytes", o.forge_rotate_bytes)),
        rotate_seconds=cfg.parse_positive("forge_rotate_seconds", o.forge_rotate_seconds),
        max_body_bytes=int(cfg.parse_positive("forge_max_body_bytes", o.forge_max_body_bytes)),
        on_write_error=cfg.parse_choice(
            "forge_on_write_error", o.forge_on_write_error, cfg.ON_WRITE_ERROR
        ),
        min_free_bytes=cfg.parse_non_negative("forge_min_free_bytes", o.forge_min_free_bytes),
        reserve_bytes=cfg.parse_non_negative("forge_reserve_bytes", o.forge_reserve_bytes),
        process_lookup=o.forge_process_lookup,
        refuse_websocket=o.forge_refuse_websocket,
        builder=cfg.parse_choice("forge_builder", o.forge_builder, cfg.BUILDERS),
        policy_url=cfg.parse_policy_url(o.forge_policy) if o.forge_policy else None,
        tokenizer_dir=Path(o.forge_tokenizer).expanduser().resolve() if o.forge_tokenizer else None,
        serve_models=parse_models(o.forge_serve_models),
        serve_max_tokens=cfg.parse_non_negative("forge_serve_max_tokens", o.forge_serve_max_tokens),
        policy_version=cfg.parse_policy_version(o.forge_policy_version),
    )


def check_listen_host(host: str, proxyauth: str | None, forge_password: str = "") -> None:
    """Listening beyond loopback (every interface, for an empty host) exposes the
    harness's traffic: require proxy authentication, Forge's (``forge_proxy_password``)
    or mitmproxy's (``proxyauth``, but not ``any``, which accepts anyone)."""
    if proxyauth and forge_password:
        raise exceptions.OptionsError(
            "proxyauth and forge_proxy_password both ask clients for credentials: set one "
            "(forge_proxy_password keeps the user name free for the rollout id)"
        )
    if host in ("localhost", "::1") or host.startswith("127."):
        return
    if forge_password or (proxyauth and proxyauth.strip().lower() != "any"):
        return
    where = f"listen_host={host}" if host else "listen_host= (every interface)"
    raise exceptions.OptionsError(
        f"{where} would let anyone on the network use this proxy and read the calls it "
        "records; set forge_proxy_password (e.g. --set forge_proxy_password=@FILE; the "
        "user name then names the rollout) or proxyauth USER:PASS (not any), or listen on "
        "127.0.0.1"
    )


def check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".forge-probe-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise cfg.ConfigError(
            f"forge_dir {directory} is not writable ({e}); Forge refuses to start "
            "rather than pass calls unrecorded"
        ) from e
