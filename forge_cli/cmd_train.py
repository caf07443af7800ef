"""``forge train``: one GRPO (or SFT) pass of the embedded trainer over a snapshot."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from forge_cli.proxy import ForgeError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train a policy on a snapshot with the embedded trainer (GRPO/PPO or --sft)",
        description="One pass of the embedded trainer (torch, CPU or one GPU) over the samples "
        "of a snapshot: veRL's policy loss (PPO-clip with token-mean by default), gradient "
        "accumulation over micro-batches, and a new Hugging Face model folder in OUT whose "
        "forge.json records the policy version (the input's + 1). Metrics are printed as "
        "JSON lines (and written to OUT/train_metrics.jsonl).",
    )
    p.add_argument("--snapshot", type=Path, required=True, help="snapshot directory")
    p.add_argument("--model", type=Path, required=True, help="Hugging Face model folder")
    p.add_argument("--out", type=Path, required=True, help="new checkpoint folder")
    p.add_argument(
        "--sft",
        action="store_true",
        help="cross-entropy on the completion tokens instead of the policy loss",
    )
    p.add_argument(
        "--loss-mode",
        default="vanilla",
        help="veRL policy loss: vanilla (PPO-clip), gspo, cispo, gpg, clip_cov, kl_cov, ...",
    )
    p.add_argument(
        "--loss-agg-mode",
        default="token-mean",
        help="token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean, "
        "seq-mean-token-sum-norm (needs --loss-scale-factor)",
    )
    p.add_argument("--loss-scale-factor", type=int, default=None)
    p.add_argument("--clip-ratio", type=float, default=0.2, help="PPO epsilon")
    p.add_argument("--clip-ratio-high", type=float, default=None, help="DAPO clip-higher")
    p.add_argument("--kl-coef", type=float, default=0.0, help="KL loss weight to --model")
    p.add_argument("--kl-type", default="low_var_kl", help="veRL KL estimator")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--micro-batch-size", type=int, default=4, help="samples per forward")
    p.add_argument(
        "--mini-batch-size",
        type=int,
        default=None,
        help="samples per optimizer step (default: all, one step per epoch)",
    )
    p.add_argument("--max-tokens", type=int, default=None, help="padded tokens per micro-batch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument(
        "--recompute-old-logprobs",
        action="store_true",
        help="take old logprobs from --model for every sample, not the recorded ones",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rl import losses, trainer
    from rl.batches import BatchError, read_group_stats, read_samples

    if args.out.exists():
        raise ForgeError(f"--out {args.out} exists: checkpoints are never overwritten")
    try:
        samples = read_samples(args.snapshot)
        loss = losses.LossSettings(
            loss_mode=args.loss_mode,
            loss_agg_mode=args.loss_agg_mode,
            clip_ratio=args.clip_ratio,
            clip_ratio_high=args.clip_ratio_high,
            kl_coef=args.kl_coef,
            kl_type=args.kl_type,
            loss_scale_factor=args.loss_scale_factor,
        )
        settings = trainer.TrainSettings(
            loss=loss,
            sft=args.sft,
            lr=args.lr,
            weight_decay=args.weight_decay,
            grad_clip=args.grad_clip,
            micro_batch_size=args.micro_batch_size,
            max_tokens=args.max_tokens,
            mini_batch_size=args.mini_batch_size,
            epochs=args.epochs,
            recompute_old_logprobs=args.recompute_old_logprobs,
            seed=args.seed,
        )
    except (BatchError, ValueError, FileNotFoundError) as e:
        raise ForgeError(str(e)) from None
    if not samples:
        dropped = ", ".join(
            f"{int(n)} {key.removeprefix('rollouts/dropped/')}"
            for key, n in sorted(read_group_stats(args.snapshot).items())
            if key.startswith("rollouts/dropped/")
        )
        raise ForgeError(
            f"{args.snapshot} holds no samples (no served calls with token ids in included "
            "GRPO groups); nothing to train"
            + (
                f". Rollouts the GRPO rules dropped: {dropped}; more rollouts per task, or "
                "forge snapshot --grpo zero_spread=keep (or partial=zero), keep them"
                if dropped
                else ""
            )
        )
    try:
        model = trainer.load_policy(args.model)
        ref = trainer.load_policy(args.model) if args.kl_coef > 0 and not args.sft else None
    except (OSError, ValueError) as e:
        raise ForgeError(f"--model {args.model}: {e}") from None
    version = trainer.read_policy_version(args.model)
    lines: list[str] = []

    def emit(metrics: dict[str, float]) -> None:
        line = json.dumps({"policy_version": version, **metrics}, sort_keys=True)
        lines.append(line)
        print(line, flush=True)

    started = time.monotonic()
    try:
        trainer.train(
            model,
            samples,
            settings,
            ref,
            on_step=emit,
            progress=not args.no_progress,
            snapshot_stats=read_group_stats(args.snapshot),
        )
    except (BatchError, ValueError, FloatingPointError) as e:
        raise ForgeError(str(e)) from None
    info = {
        "parent_policy_version": version,
        "parent_model": str(args.model.resolve()),
        "snapshot": str(args.snapshot.resolve()),
        "mode": "sft" if args.sft else "grpo",
        "settings": settings.describe(),
        "samples": len(samples),
        "seconds": round(time.monotonic() - started, 3),
    }
    try:
        out = trainer.save_checkpoint(model, args.out, version + 1, args.model, info)
    except FileExistsError as e:
        raise ForgeError(str(e)) from None
    (out / "train_metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    print(f"forge: checkpoint written to {out} (policy version {version + 1})", file=sys.stderr)
    return 0
