"""Pure rules of the runner: rollout ids, group ids, statuses, retry backoff, progress."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "FAILED_STATUSES",
    "STATUSES",
    "Progress",
    "backoff_s",
    "classify_exit",
    "format_progress",
    "group_id",
    "rollout_id",
]

# pipeline.schema.ROLLOUTS.status
STATUSES = ("complete", "partial", "crashed", "timed_out", "infra_error")
FAILED_STATUSES = frozenset({"crashed", "timed_out", "infra_error"})


def rollout_id(task_id: str, sample: int, attempt: int = 0) -> str:
    """``<task>.<sample>``; a retried attempt (after an infra error) is ``<task>.<sample>.r<k>``,
    so the failed attempt's calls stay apart, labelled infra_error."""
    base = f"{task_id}.{sample}"
    return base if attempt == 0 else f"{base}.r{attempt}"


def group_id(task_id: str, policy_version: int | None) -> str:
    """The GRPO group the pipeline's ``groups`` view puts a rollout in (its default
    version window of 1): ``task@v<version>`` or ``task@unversioned``."""
    return (
        f"{task_id}@v{policy_version}" if policy_version is not None else f"{task_id}@unversioned"
    )


def classify_exit(exit_code: int | None, timed_out: bool, partial_exit_codes: Sequence[int]) -> str:
    """The runner's status of a harness run that started: killed at the deadline is
    timed_out; exit 0 complete; an exit code the template calls partial (e.g. out of
    turns) partial; any other exit, or death by a signal, crashed."""
    if timed_out:
        return "timed_out"
    if exit_code == 0:
        return "complete"
    if exit_code is not None and exit_code in partial_exit_codes:
        return "partial"
    return "crashed"


def backoff_s(attempt: int, base_s: float, cap_s: float) -> float:
    """Wait before retry number ``attempt`` (1, 2, ...): base * 2^(attempt-1), capped."""
    if attempt < 1:
        return 0.0
    return float(min(cap_s, base_s * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Progress:
    total: int
    running: int
    done: int
    failed: int
    retries: int
    reward_sum: float
    rewarded: int

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None


def format_progress(p: Progress, width: int = 24) -> str:
    """``[#########.......] 12/32 done  8 running  2 failed  mean reward 0.58``."""
    filled = int(width * p.done / p.total) if p.total else width
    bar = "#" * filled + "." * (width - filled)
    mean = "-" if p.mean_reward is None else f"{p.mean_reward:.3f}"
    retries = f"  {p.retries} retried" if p.retries else ""
    return (
        f"[{bar}] {p.done}/{p.total} done  {p.running} running  {p.failed} failed"
        f"{retries}  mean reward {mean}"
    )


class ProgressPrinter:
    """One live line on a terminal; a line per finished rollout otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self._last_done = -1

    def __call__(self, p: Progress) -> None:
        line = format_progress(p)
        if self.tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif p.done != self._last_done:
            print(line, file=sys.stderr, flush=True)
        self._last_done = p.done

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)
