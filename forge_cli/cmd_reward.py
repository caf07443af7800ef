"""``forge reward``: write a rollout's terminal reward (one ``rewards`` row)."""

from __future__ import annotations

import argparse
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from mitm_addon.launch import ForgeError
from pipeline.canonical import canonical_json
from pipeline.shards import shard_files, write_rows

__all__ = ["add_parser", "run"]

# What a verifier may say about a rollout (pipeline.schema.REWARDS.status).
STATUSES = ("complete", "partial", "crashed", "timed_out")
DEFAULT_SOURCE = "forge reward"

# Does any shard of a table name this rollout? Parameters: $files, $rollout_id.
_ROLLOUT_KNOWN_SQL = (
    "SELECT count(*) FROM read_parquet($files, union_by_name = true) WHERE rollout_id = $rollout_id"
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "reward",
        help="write a rollout's terminal reward",
        description="Append one row to DIR/rewards/: the rollout's terminal reward (gamma = 1: "
        "GRPO gives it to every trained token), the verifier's status and details. The latest "
        "row of a rollout wins, so rerunning corrects a reward.",
    )
    p.add_argument("--data", type=Path, required=True, help="run directory (holds calls/)")
    p.add_argument("--rollout", required=True, help="rollout id (the calls' rollout_id)")
    p.add_argument("--reward", required=True, help="terminal reward, a finite number")
    p.add_argument(
        "--status",
        choices=STATUSES,
        default=None,
        help="the verifier's view of the rollout (default: none; the runner's status stands)",
    )
    p.add_argument(
        "--details",
        default=None,
        metavar="JSON",
        help="verifier details as a JSON object, e.g. '{\"partial_credit\": 0.5}'",
    )
    p.add_argument(
        "--source", default=DEFAULT_SOURCE, help=f"writer's name (default {DEFAULT_SOURCE!r})"
    )
    p.add_argument(
        "--allow-unknown",
        action="store_true",
        help="write even if no call or rollouts row in DIR has this rollout id",
    )
    p.set_defaults(func=run)


def parse_reward(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ForgeError(
            f"--reward {text!r} is not a number: pass e.g. --reward 1 or --reward 0.5"
        ) from None
    if not math.isfinite(value):
        raise ForgeError(f"--reward {text!r} is not finite: pass a finite number such as 0 or 1")
    return value


def parse_details(text: str | None) -> str | None:
    """The details as canonical JSON (an object), or None."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ForgeError(
            f"--details is not valid JSON ({e}): pass an object, e.g. '{{\"partial_credit\": 0.5}}'"
        ) from None
    if not isinstance(value, dict):
        raise ForgeError("--details must be a JSON object, e.g. '{\"partial_credit\": 0.5}'")
    try:
        return canonical_json(value)
    except ValueError:
        raise ForgeError("--details holds NaN or Infinity: use finite numbers or null") from None


def rollout_known(data: Path, rollout_id: str) -> bool:
    """Whether a call or a rollouts row in ``data`` has this rollout id."""
    for table in ("calls", "rollouts"):
        files = [str(p) for p in shard_files(data, table)]
        if files:
            row = (
                duckdb.connect()
                .execute(_ROLLOUT_KNOWN_SQL, {"files": files, "rollout_id": rollout_id})
                .fetchone()
            )
            if row and row[0]:
                return True
    return False


def run(args: argparse.Namespace) -> int:
    data: Path = args.data
    if not data.is_dir():
        raise ForgeError(
            f"no run directory {data}: pass --data with a directory written by forge record"
        )
    reward = parse_reward(args.reward)
    details = parse_details(args.details)
    if not args.allow_unknown and not rollout_known(data, args.rollout):
        raise ForgeError(
            f"no call or rollouts row in {data} has rollout id {args.rollout!r}: check the id "
            f'(forge sql --data {data} "select rollout_id, n_calls from trajectories") '
            "or pass --allow-unknown to write it anyway"
        )
    row = {
        "rollout_id": args.rollout,
        "reward": reward,
        "status": args.status,
        "details_json": details,
        "source": args.source,
        "written_at": datetime.now(UTC),
    }
    path = write_rows(data, "rewards", [row])
    print(f"reward {reward:g} for rollout {args.rollout} written to {path}")
    return 0
