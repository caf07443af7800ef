"""Run a task's verifier and turn what it says into a terminal reward."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k8s_jobs.processes import run_bounded
from k8s_jobs.tasks import Verifier

__all__ = ["VerifierError", "VerifierResult", "parse_verifier_output", "run_verifier"]


class VerifierError(RuntimeError):
    """The verifier could not grade (did not start, timed out, or printed no usable JSON):
    an environment failure, not a reward of 0."""


@dataclass(frozen=True)
class VerifierResult:
    reward: float
    details: dict[str, Any]
    exit_code: int


def parse_verifier_output(mode: str, exit_code: int, stdout: str) -> VerifierResult:
    """``exit_code`` mode: 0 gives 1.0, anything else 0.0. ``json`` mode: the last
    non-empty stdout line is ``{"reward": <finite number>, "details": {...}}`` (whatever
    the exit code)."""
    if mode == "exit_code":
        return VerifierResult(1.0 if exit_code == 0 else 0.0, {"exit_code": exit_code}, exit_code)
    if mode != "json":
        raise ValueError(f"unknown verifier reward mode {mode!r}")
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise VerifierError(
            f'the verifier printed nothing (exit {exit_code}); expected {{"reward": ...}}'
        )
    try:
        value = json.loads(lines[-1])
    except ValueError:
        raise VerifierError(
            f'the verifier\'s last line is not JSON: {lines[-1][:200]!r}; expected {{"reward": ...}}'
        ) from None
    if not isinstance(value, dict) or "reward" not in value:
        raise VerifierError(f"the verifier's JSON has no 'reward': {lines[-1][:200]!r}")
    reward = value["reward"]
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise VerifierError(f"the verifier's reward is not a finite number: {reward!r}")
    details = value.get("details", {})
    if details is None:
        details = {}
    if not isinstance(details, dict):
        raise VerifierError(f"the verifier's 'details' is not an object: {details!r}")
    return VerifierResult(float(reward), dict(details) | {"exit_code": exit_code}, exit_code)


def run_verifier(
    verifier: Verifier, *, cwd: Path, env: Mapping[str, str], log_dir: Path
) -> VerifierResult:
    """Run the verifier in the rollout's working directory, bounded by its timeout."""
    out, err = log_dir / "verifier.stdout", log_dir / "verifier.stderr"
    try:
        finished = run_bounded(
            verifier.argv(), cwd=cwd, env=env, stdout=out, stderr=err, timeout_s=verifier.timeout_s
        )
    except OSError as e:
        raise VerifierError(f"the verifier did not start: {e}") from e
    if finished.timed_out or finished.exit_code is None:
        raise VerifierError(f"the verifier ran past its timeout of {verifier.timeout_s:g} s")
    text = out.read_text(encoding="utf-8", errors="replace")
    return parse_verifier_output(verifier.reward, finished.exit_code, text)
