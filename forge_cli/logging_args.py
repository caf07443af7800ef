"""``--logger`` and ``--log-dir``, shared by ``forge train`` and ``forge loop``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mitm_addon.launch import ForgeError


def add_logger_arguments(p: Any, default_dir: str) -> None:
    p.add_argument(
        "--logger",
        default="console",
        metavar="NAMES",
        help="where metrics go, comma-separated: console (JSON lines on stdout), "
        "tensorboard, wandb (WANDB_MODE=offline without a network). Default console",
    )
    p.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help=f"folder for TensorBoard event files and W&B runs (default {default_dir})",
    )


def open_tracker(
    args: argparse.Namespace, default_dir: Path, name: str, config: dict[str, Any]
) -> Any:
    """The ``rl.tracking.Tracker`` the flags ask for; a bad flag is a ForgeError."""
    from rl.tracking import Tracker, TrackingError, parse_loggers

    try:
        loggers = parse_loggers(args.logger)
        return Tracker(loggers, args.log_dir or default_dir, name=name, config=config)
    except TrackingError as e:
        raise ForgeError(str(e)) from None
