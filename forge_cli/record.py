"""``forge record``: run a harness with its LLM calls recorded through Forge's proxy."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from forge_cli.args import (
    add_serve_arguments,
    add_set_argument,
    add_upstream_argument,
    serve_extra,
)
from mitm_addon.launch import (
    DEFAULT_CONFDIR,
    ForgeError,
    ProxySettings,
    harness_env,
    start_proxy,
    stop_proxy_process,
    transparent,
)
from pipeline.shards import write_rows

__all__ = ["ForgeError", "add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "record",
        help="run a command with its LLM calls recorded",
        description="Start Forge's proxy on a free loopback port, run CMD with HTTPS_PROXY and CA "
        "trust set for every runtime, stop the proxy, print a summary, exit with CMD's code.",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="run directory (default data/runs/record-<time>)"
    )
    p.add_argument(
        "--rollout",
        default=None,
        help="rollout id of every call (default: the run directory's name)",
    )
    add_upstream_argument(p)
    p.add_argument("--hosts", default=None, help="comma-separated LLM hosts to intercept")
    p.add_argument(
        "--other-hosts",
        choices=("pass", "404"),
        default=None,
        help="hosts outside --hosts: tunnel untouched (pass) or answer 404",
    )
    p.add_argument(
        "--confdir",
        type=Path,
        default=DEFAULT_CONFDIR,
        help="mitmproxy directory holding Forge's CA (default ~/.forge/mitmproxy)",
    )
    add_set_argument(p)
    p.add_argument(
        "--transparent",
        action="store_true",
        help="for harnesses that ignore proxy variables (Linux, root): run CMD as its own user "
        f"(--uid, default {transparent.HARNESS_USER}, created if missing) and redirect that "
        "user's outbound port 443 to the proxy with iptables",
    )
    p.add_argument(
        "--uid",
        default=None,
        metavar="UID|USER",
        help="with --transparent: the user CMD runs as (not root)",
    )
    add_serve_arguments(p)
    p.add_argument("--task", default=None, help="task id for the rollout's row in rollouts/")
    p.add_argument(
        "--harness", default=None, help="harness name for the rollout's row (default: CMD's name)"
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ForgeError("nothing to run: forge record [OPTIONS] -- CMD [ARGS...]")
    for item in args.upstream:
        if "=" not in item:
            raise ForgeError(
                f"--upstream {item!r}: expected HOST=URL, e.g. api.openai.com=http://127.0.0.1:9000"
            )
    out = args.out or Path("data/runs") / time.strftime("record-%Y%m%d-%H%M%S")
    if args.uid is not None and not args.transparent:
        raise ForgeError("--uid goes with --transparent")
    harness = transparent.prepare(args.uid) if args.transparent else None
    rollout = args.rollout or out.resolve().name
    extra = list(args.extra) + serve_extra(args)
    settings = ProxySettings(
        out_dir=out,
        confdir=args.confdir,
        rollout=rollout,
        upstreams=args.upstream,
        hosts=args.hosts,
        other_hosts=args.other_hosts,
        extra=extra,
        mode="transparent" if harness else "regular",
    )
    proxy = start_proxy(settings)
    try:
        print(
            f"forge: proxy on {proxy.url} recording to {out} (log {proxy.log_path})",
            file=sys.stderr,
        )
        # Behind a password the harness needs credentials, and their user names the rollout
        # (an empty one is dropped by some clients); without one the plain address does.
        user = rollout if proxy.password is not None else None
        env = harness_env(proxy, dict(os.environ), rollout, proxy_user=user)
        started = datetime.now(UTC)
        code = (
            _run_child(cmd, env)
            if harness is None
            else transparent.run_harness(cmd, env, proxy, harness)
        )
    finally:
        proxy_code = stop_proxy_process(proxy.process)
    if proxy_code not in (0, -signal.SIGTERM):
        print(
            f"forge: warning: the proxy exited with {proxy_code}; see {proxy.log_path}",
            file=sys.stderr,
        )
    write_rollout(out, rollout, args.task, args.harness or Path(cmd[0]).name, cmd, code, started)
    print_summary(out, proxy.run_id)
    return code


def write_rollout(
    out: Path,
    rollout: str,
    task: str | None,
    harness: str,
    cmd: list[str],
    code: int,
    started: datetime,
) -> None:
    """The rollout's row: what ran, how it ended (rewards come from verifiers)."""
    now = datetime.now(UTC)
    write_rows(
        out.resolve(),
        "rollouts",
        [
            {
                "rollout_id": rollout,
                "task_id": task,
                "harness": harness,
                "status": "complete" if code == 0 else "crashed",
                "exit_code": code,
                "started_at": started,
                "ended_at": now,
                "command": cmd,
                "written_at": now,
            }
        ],
    )


def _run_child(cmd: list[str], env: dict[str, str]) -> int:
    try:
        child = subprocess.Popen(cmd, env=env)
    except FileNotFoundError as e:
        raise ForgeError(f"cannot run {cmd[0]!r}: {e.strerror}") from e
    # Ctrl-C reaches the child through the terminal's process group; we wait for it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def print_summary(out: Path, run_id: str) -> None:
    from pipeline.store import connect, sql_text

    con = connect(out)
    rows = con.execute(sql_text("record_summary"), {"run_id": run_id}).fetchall()
    total = sum(r[2] for r in rows)
    print(f"forge: recorded {total} LLM call(s) in {out}", file=sys.stderr)
    if rows:
        print(
            f"  {'api':<20} {'model':<32} {'calls':>6} {'failed':>6} {'in tok':>9} {'out tok':>9}",
            file=sys.stderr,
        )
        for api, model, calls, failed, tin, tout, est in rows:
            mark = "~" if est else " "
            print(
                f"  {api:<20} {model:<32} {calls:>6} {failed:>6} {tin:>8}{mark} {tout:>8}{mark}",
                file=sys.stderr,
            )
    for status, error, n in con.execute(sql_text("record_errors"), {"run_id": run_id}).fetchall():
        print(f"  {n} {status}: {error}", file=sys.stderr)
    other = con.execute(
        "SELECT count(*), coalesce(sum(requests), 0) FROM endpoints WHERE run_id = $run_id",
        {"run_id": run_id},
    ).fetchone()
    if other and other[1]:
        print(f"  other requests to LLM hosts (not model calls): {other[1]}", file=sys.stderr)
