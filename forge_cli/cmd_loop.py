"""``forge loop``: rounds of collect (serve mode), snapshot and train; resumable."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from forge_cli.args import positive_int
from forge_cli.logging_args import add_logger_arguments, open_tracker
from mitm_addon.launch import ForgeError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "loop",
        help="collect with the policy, snapshot, train, publish; repeat (resumable)",
        description="Each round serves the current checkpoint, runs the task file's rollouts "
        "against it (serve mode), writes a snapshot and trains the next checkpoint from it. "
        "OUT/state.json records finished phases: a loop stopped at any point, even with "
        "kill -9, resumes where it stopped and trains every rollout exactly once. "
        "See rl/config/demo.yaml for the settings.",
    )
    p.add_argument("--config", type=Path, required=True, help="loop settings (YAML)")
    p.add_argument("--rounds", type=positive_int, default=None, help="override the config's rounds")
    add_logger_arguments(p, "OUT/logs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from k8s_jobs.tasks import TaskError
    from rl.loop import CURVE_FILE, LoopConfig, LoopError, run_loop

    try:
        config = LoopConfig.load(args.config)
        if args.rounds is not None:
            if args.rounds < 1:
                raise LoopError("--rounds must be at least 1")
            config = dataclasses.replace(config, rounds=args.rounds)
        settings = {k: str(v) for k, v in dataclasses.asdict(config).items()}
        with open_tracker(args, config.out / "logs", config.out.name, settings) as tracker:
            # One point per round: its curve line and its training step's last metrics.
            state = run_loop(config, on_round=lambda point, k: tracker.log(point, k))
    except (LoopError, TaskError, ValueError) as e:
        raise ForgeError(str(e)) from None
    policy = state.rounds[-1].result()
    print(f"forge loop: {len(state.rounds)} round(s) done; policy {policy}")
    print(f"forge loop: learning curve in {config.out / CURVE_FILE}")
    return 0
