"""``forge train``: one GRPO (or SFT) pass of the embedded trainer over a snapshot."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forge_cli.args import positive_float
from forge_cli.logging_args import add_logger_arguments, open_tracker
from mitm_addon.launch import ForgeError

if TYPE_CHECKING:
    from rl.trainer import TrainSettings

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
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--snapshot", type=Path, help="snapshot directory")
    source.add_argument(
        "--chats",
        type=Path,
        help="--sft only: chat examples written by `forge export sft` (a run recorded "
        "against a provider), tokenized with --model's chat template as serve mode would",
    )
    p.add_argument(
        "--model", type=Path, help="Hugging Face model folder (verl: or model.path in --config)"
    )
    p.add_argument("--out", type=Path, help="new checkpoint folder (verl: or out in --config)")
    p.add_argument(
        "--backend",
        choices=("embedded", "verl", "verl-ray"),
        default="embedded",
        help="embedded: this process's torch trainer (the flags below); verl: veRL's FSDP "
        "training engine, configured by --config and KEY=VALUE overrides (one process, or "
        "one per GPU under torchrun); verl-ray: veRL's RayPPOTrainer on a Ray cluster "
        "(RAY_ADDRESS, or a local one started for the run), whose KEY=VALUE overrides are "
        "veRL's own Hydra overrides of its ppo_trainer.yaml (e.g. trainer.nnodes=2 "
        "actor_rollout_ref.actor.optim.lr=1e-5)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="verl: YAML config (default: rl/config/grpo.yaml)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="verl: config overrides by dotted key, e.g. actor.optim.lr=1e-5; verl-ray: "
        "veRL's Hydra overrides, e.g. actor_rollout_ref.actor.optim.lr=1e-5",
    )
    p.add_argument(
        "--keep-optimizer",
        action="store_true",
        help="save the AdamW state in the checkpoint (optimizer.pt), and continue --model's "
        "saved state when it has one: forge loop's one-step rounds then run one optimizer, "
        "instead of a fresh AdamW whose first step moves every weight by about the lr",
    )
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
    p.add_argument("--lr", type=positive_float, default=1e-6)
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
    add_logger_arguments(p, "OUT-logs, beside the checkpoint")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rl.train import TrainJob, train, train_verl, train_verl_ray  # torch: when training

    if args.backend in ("verl", "verl-ray"):
        if args.sft:
            raise ForgeError("--sft is the embedded trainer's; veRL's backend trains GRPO/PPO")
        if args.chats is not None:
            raise ForgeError("--chats is for the embedded trainer's --sft; veRL trains snapshots")
        if args.keep_optimizer:
            raise ForgeError(
                "--keep-optimizer is the embedded trainer's (veRL's engine keeps its own)"
            )
    if args.backend == "verl-ray":
        if args.config is not None:
            raise ForgeError(
                "verl-ray is configured by overrides of veRL's ppo_trainer.yaml, not --config"
            )
        if args.snapshot is None or args.model is None or args.out is None:
            raise ForgeError("--backend verl-ray needs --snapshot, --model and --out")
        with _tracker(args) as tracker:
            train_verl_ray(args.snapshot, args.model, args.out, args.overrides, tracker.line)
        return 0
    if args.backend == "verl":
        with _tracker(args) as tracker:
            train_verl(
                args.snapshot, args.model, args.out, args.config, args.overrides, tracker.line
            )
        return 0
    if args.config is not None or args.overrides:
        raise ForgeError(
            "KEY=VALUE overrides are for --backend verl or verl-ray, --config for verl alone"
        )
    if args.model is None or args.out is None:
        raise ForgeError("--model and --out are required")
    job = TrainJob(
        model=args.model,
        out=args.out,
        snapshot=args.snapshot,
        chats=args.chats,
        settings=_settings(args),
        keep_optimizer=args.keep_optimizer,
        progress=not args.no_progress,
    )
    with _tracker(args) as tracker:
        train(job, tracker.line)
    return 0


def _tracker(args: argparse.Namespace) -> Any:
    """Metrics lines to the --logger backends, each at its optimizer step."""
    out = args.out if args.out is not None else Path("train")
    config = {
        k: v if isinstance(v, int | float | str | bool) else str(v)
        for k, v in vars(args).items()
        if k != "func" and v is not None
    }
    return open_tracker(args, out.parent / f"{out.name}-logs", out.name, config)


def _settings(args: argparse.Namespace) -> TrainSettings:
    from rl.losses import LossSettings
    from rl.trainer import TrainSettings

    try:
        return TrainSettings(
            loss=LossSettings(
                loss_mode=args.loss_mode,
                loss_agg_mode=args.loss_agg_mode,
                clip_ratio=args.clip_ratio,
                clip_ratio_high=args.clip_ratio_high,
                kl_coef=args.kl_coef,
                kl_type=args.kl_type,
                loss_scale_factor=args.loss_scale_factor,
            ),
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
    except ValueError as e:
        raise ForgeError(str(e)) from None
