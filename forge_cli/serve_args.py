"""Serve-mode options shared by ``forge record`` and ``forge rollout``: the flags, and the
addon options (``forge_mode=serve``, ``forge_policy``, ...) they turn into."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from forge_cli.proxy import ForgeError

__all__ = ["add_serve_arguments", "serve_extra"]

# How long a serve-mode command waits for a policy server that is still starting.
WAIT_S = 60.0


def add_serve_arguments(p: Any) -> None:
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


def _models(policy: str, wait_s: float = WAIT_S) -> bytes:
    """The body of the policy server's /v1/models; a server still starting (connection
    refused) is waited for up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            with urllib.request.urlopen(policy.rstrip("/") + "/v1/models", timeout=10) as r:
                return bytes(r.read())
        except urllib.error.URLError as e:
            refused = isinstance(e.reason, ConnectionRefusedError)
            if not refused or time.monotonic() > deadline:
                raise
            if not said:
                print(f"forge: waiting for the policy server at {policy}", file=sys.stderr)
                said = True
            time.sleep(0.5)


def serve_options(
    policy: str | None, tokenizer: Path | None, models: str = "all", max_tokens: int = 0
) -> list[str]:
    """The addon options of serve mode; the tokenizer defaults to the policy's model folder."""
    if not policy:
        raise ForgeError("--mode serve needs --policy URL (e.g. http://127.0.0.1:8000)")
    if tokenizer is None:
        try:
            root = json.loads(_models(policy))["data"][0].get("root")
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise ForgeError(f"cannot ask the policy server at {policy} for its model: {e}") from e
        if not isinstance(root, str) or not Path(root).is_dir():
            raise ForgeError(
                "the policy server's model is not a local folder: pass --tokenizer DIR"
            )
        tokenizer = Path(root)
    return [
        "forge_mode=serve",
        f"forge_policy={policy}",
        f"forge_tokenizer={tokenizer.resolve()}",
        f"forge_serve_models={models}",
        f"forge_serve_max_tokens={max_tokens}",
    ]
