"""Flags shared by the commands that start a proxy (``forge record``, ``forge rollout``),
and the addon options they turn into."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mitm_addon.launch import ForgeError
from mitm_addon.launch.serve_options import serve_options


def add_upstream_argument(p: Any) -> None:
    """--upstream HOST=URL (repeatable), for the commands that start a proxy."""
    p.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="HOST=URL",
        help="send a provider host to another base URL; repeatable",
    )


def add_set_argument(p: Any) -> None:
    """--set OPTION=VALUE (repeatable, into args.extra): any other proxy option."""
    p.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="any other mitmproxy or forge_ option for the proxy; repeatable",
    )


def add_serve_arguments(p: Any) -> None:
    """--mode record|serve and the serve-mode flags."""
    p.add_argument(
        "--mode",
        choices=("record", "serve"),
        default="record",
        help="record: calls go to their provider; serve: the policy server answers them",
    )
    p.add_argument(
        "--policy", default=None, metavar="URL", help="serve mode: the policy server's base URL"
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="serve mode: the policy's model folder (default: the folder the policy server "
        "reports as its model's root, when it is a local folder)",
    )
    p.add_argument(
        "--serve-models",
        default="all",
        help="serve mode: requested models the policy answers (names or globs, or all)",
    )
    p.add_argument(
        "--serve-max-tokens",
        type=int,
        default=0,
        metavar="N",
        help="serve mode: the most tokens the policy writes per call (default 0: what the "
        "harness asks for)",
    )


def serve_extra(args: argparse.Namespace) -> list[str]:
    """The addon options the serve flags ask for (none in record mode)."""
    if args.mode != "serve":
        for flag, value in (("--policy", args.policy), ("--tokenizer", args.tokenizer)):
            if value is not None:
                raise ForgeError(f"{flag} goes with --mode serve")
        return []
    if args.serve_max_tokens < 0:
        raise ForgeError(f"--serve-max-tokens must be >= 0, got {args.serve_max_tokens}")
    return serve_options(args.policy, args.tokenizer, args.serve_models, args.serve_max_tokens)


def _int_between(value: str, low: int, high: int | None, what: str) -> int:
    """An argparse value as an integer in [low, high] (no upper bound for None)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
    if n < low or (high is not None and n > high):
        bound = f">= {low}" if high is None else f"{low} to {high}"
        raise argparse.ArgumentTypeError(f"{value} is out of range ({bound})")
    return n


def positive_int(value: str) -> int:
    """argparse type: an integer > 0."""
    return _int_between(value, 1, None, "an integer")


def positive_float(value: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number > 0")
    return x


def port(value: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535."""
    return _int_between(value, 0, 65535, "a port number")
