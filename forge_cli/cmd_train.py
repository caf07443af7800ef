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
        choices=("embedded", "verl"),
        default="embedded",
        help="embedded: this process's torch trainer (the flags below); verl: veRL's FSDP "
        "training engine, configured by --config and KEY=VALUE overrides (one process, or "
        "one per GPU under torchrun)",
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
        help="verl: config overrides by dotted key, e.g. actor.optim.lr=1e-5",
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
    if args.backend == "verl":
        return run_verl(args)
    if args.config is not None or args.overrides:
        raise ForgeError("--config and KEY=VALUE overrides are for --backend verl")
    if args.model is None or args.out is None:
        raise ForgeError("--model and --out are required")
    from rl import losses, trainer
    from rl.batches import BatchError, read_group_stats, read_samples

    if args.out.exists():
        raise ForgeError(f"--out {args.out} exists: checkpoints are never overwritten")
    if args.chats is not None and not args.sft:
        raise ForgeError("--chats holds text, without sampling logprobs: it trains --sft only")
    try:
        if args.chats is not None:
            from rl.sft_data import read_chat_samples

            samples = read_chat_samples(args.chats, args.model)
        else:
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
        raise ForgeError(
            f"{args.chats} holds no assistant turns" if args.chats else _no_samples(args.snapshot)
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
        optimizer = trainer.make_optimizer(
            model, settings, args.model if args.keep_optimizer else None
        )
        trainer.train(
            model,
            samples,
            settings,
            ref,
            on_step=emit,
            progress=not args.no_progress,
            snapshot_stats=read_group_stats(args.snapshot) if args.snapshot else None,
            optimizer=optimizer,
        )
    except (BatchError, ValueError, FloatingPointError) as e:
        raise ForgeError(str(e)) from None
    info = {
        "mode": "sft" if args.sft else "grpo",
        "settings": settings.describe(),
        "samples": len(samples),
        "seconds": round(time.monotonic() - started, 3),
    }
    if args.keep_optimizer:
        info["optimizer_continued"] = (args.model / trainer.OPTIMIZER_FILE).is_file()
    kept = optimizer if args.keep_optimizer else None
    _save(model, args.out, version, args.model, args.snapshot or args.chats, info, lines, kept)
    return 0


def _save(
    policy: Any,
    out: Path,
    version: int,
    parent: Path,
    snapshot: Path,
    info: dict[str, Any],
    lines: list[str],
    optimizer: Any = None,
) -> None:
    """Write the checkpoint (policy version + 1) and its metrics; say where."""
    from rl import trainer

    info = {
        "parent_policy_version": version,
        "parent_model": str(parent.resolve()),
        "snapshot": str(snapshot.resolve()),
        **info,
    }
    try:
        written = trainer.save_checkpoint(policy, out, version + 1, parent, info, optimizer)
    except FileExistsError as e:
        raise ForgeError(str(e)) from None
    (written / "train_metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    print(f"forge: checkpoint written to {written} (policy version {version + 1})", file=sys.stderr)


def _no_samples(snapshot: Path) -> str:
    from rl.batches import read_group_stats

    dropped = ", ".join(
        f"{int(n)} {key.removeprefix('rollouts/dropped/')}"
        for key, n in sorted(read_group_stats(snapshot).items())
        if key.startswith("rollouts/dropped/")
    )
    return (
        f"{snapshot} holds no samples (no served calls with token ids in included "
        "GRPO groups); nothing to train"
        + (
            f". Rollouts the GRPO rules dropped: {dropped}; more rollouts per task, or "
            "forge snapshot --grpo zero_spread=keep (or partial=zero), keep them"
            if dropped
            else ""
        )
    )


def run_verl(args: argparse.Namespace) -> int:
    """One GRPO pass of veRL's training engine; rank 0 writes the checkpoint."""
    from omegaconf import OmegaConf

    from rl import trainer
    from rl.batches import BatchError, read_group_stats, read_samples
    from rl.verl_backend import config as vconfig

    if args.sft:
        raise ForgeError("--sft is the embedded trainer's; veRL's backend trains GRPO/PPO")
    if args.chats is not None:
        raise ForgeError("--chats is for the embedded trainer's --sft; veRL trains snapshots")
    if args.keep_optimizer:
        raise ForgeError("--keep-optimizer is the embedded trainer's (veRL's engine keeps its own)")
    try:
        cfg = vconfig.load(args.config, args.overrides)
    except vconfig.ConfigError as e:
        raise ForgeError(str(e)) from None
    model = args.model or (Path(cfg.model.path) if cfg.model.path else None)
    out = args.out or (Path(cfg.out) if cfg.out else None)
    if model is None or out is None:
        raise ForgeError("give --model and --out (or model.path=... and out=...)")
    if out.exists():
        raise ForgeError(f"--out {out} exists: checkpoints are never overwritten")
    if not (model / "config.json").is_file():
        raise ForgeError(f"--model {model} is not a Hugging Face model folder (no config.json)")
    try:
        samples = read_samples(args.snapshot)
    except (BatchError, FileNotFoundError) as e:
        raise ForgeError(str(e)) from None
    if not samples:
        raise ForgeError(_no_samples(args.snapshot))

    import torch.distributed as dist

    from rl.verl_backend import run as vrun

    version = trainer.read_policy_version(model)
    started = time.monotonic()
    try:  # the process group train() joins is left on every way out
        try:
            result = vrun.train(
                samples, model, cfg, log=lambda msg: print(f"forge: {msg}", file=sys.stderr)
            )
        except (vconfig.ConfigError, BatchError) as e:
            raise ForgeError(str(e)) from None
        if result.state_dict is None:
            return 0  # not rank 0: rank 0 writes the checkpoint
        metrics = {
            "policy_version": version,
            "backend": "verl",
            "samples/count": len(samples),
            **result.metrics,
            **read_group_stats(args.snapshot),
        }
        line = json.dumps(metrics, sort_keys=True)
        print(line, flush=True)
        policy = trainer.load_policy(model)
        policy.load_state_dict(result.state_dict)
        info = {
            "mode": "grpo",
            "backend": "verl",
            "processes": result.world_size,
            "device": result.device,
            "config": OmegaConf.to_container(cfg, resolve=True),
            "samples": len(samples),
            "seconds": round(time.monotonic() - started, 3),
        }
        _save(policy, out, version, model, args.snapshot, info, [line])
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
