"""Training metrics where training people look: the console, TensorBoard, Weights & Biases.

``forge train`` logs every optimizer step (its ``step``), ``forge loop`` one point per
round (the round's rollouts and its training step's last metrics). ``--logger`` picks the
backends, comma-separated:

- ``console``: one JSON line per point on stdout (what Forge always printed);
- ``tensorboard``: event files under ``LOG_DIR/tensorboard`` (torch's ``SummaryWriter``);
- ``wandb``: a Weights & Biases run whose files go under ``LOG_DIR/wandb``. Without a
  network, set ``WANDB_MODE=offline`` and ``wandb sync`` the folder later.

Metric names are the trainer's (``loss/pg``, ``grad/norm``, ...); values that are not
finite numbers are left out of TensorBoard and W&B (they stay in the JSON line).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LOGGERS = ("console", "tensorboard", "wandb")


class TrackingError(ValueError):
    """A logger Forge does not know, or one whose library is missing."""


def parse_loggers(text: str) -> tuple[str, ...]:
    """``console,tensorboard`` -> ("console", "tensorboard"); unknown names are refused."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in LOGGERS]
    if unknown or not names:
        raise TrackingError(
            f"--logger: unknown logger {', '.join(unknown) or repr(text)} (choose from "
            f"{', '.join(LOGGERS)}, comma-separated)"
        )
    return names


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric values of a metrics line (booleans and text left out)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if k != "step"  # the x axis, not a series
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
    }


class Tracker:
    """Logs points to the chosen backends; ``close`` flushes them (use it as a context)."""

    def __init__(
        self,
        loggers: tuple[str, ...],
        log_dir: Path,
        project: str = "forge",
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.loggers = loggers
        self.log_dir = log_dir
        self._tensorboard: Any = None
        self._wandb: Any = None
        if "tensorboard" in loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise TrackingError(
                    f"--logger tensorboard needs the tensorboard package: {e}"
                ) from e
            self._tensorboard = SummaryWriter(str(log_dir / "tensorboard"))
        if "wandb" in loggers:
            try:
                import wandb
            except ImportError as e:
                raise TrackingError(f"--logger wandb needs the wandb package: {e}") from e
            (log_dir / "wandb").mkdir(parents=True, exist_ok=True)
            self._wandb = wandb.init(
                project=os.environ.get("WANDB_PROJECT", project),
                name=name,
                dir=str(log_dir),
                config=dict(config or {}),
                reinit="create_new",
            )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if "console" in self.loggers:
            print(json.dumps(dict(metrics)), flush=True)
        values = scalars(metrics)
        if self._tensorboard is not None:
            for key, value in values.items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def line(self, text: str) -> None:
        """A trainer's metrics line (JSON), logged at its ``step``."""
        metrics = json.loads(text)
        self.log(metrics, int(metrics.get("step", 0)))

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_tensorboard(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``folder``: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(folder.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out
