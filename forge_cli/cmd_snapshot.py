"""``forge snapshot``: write an immutable, ``datasets``-loadable snapshot of a run directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mitm_addon.launch import ForgeError
from pipeline.grpo import GroupSettings, parse_settings
from pipeline.snapshot import FilterError, SnapshotExists, TrajectoryFilter, write_snapshot

__all__ = [
    "add_filter_arguments",
    "add_grpo_argument",
    "add_parser",
    "filters_from",
    "group_settings_from",
    "run",
]


def add_grpo_argument(p: argparse.ArgumentParser) -> None:
    """--grpo NAME=VALUE: the GRPO grouping rules of the groups and samples views."""
    p.add_argument(
        "--grpo",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a GRPO grouping rule (pipeline/sql/220_grpo_settings.sql); repeatable: "
        "normalize_std=true|false, unbiased_std=true|false, eps=1e-6, "
        "zero_spread=drop|keep, single_member=drop|zero|raw, partial=drop|zero|credit, "
        "partial_credit_key=KEY, version_window=1",
    )


def group_settings_from(args: argparse.Namespace) -> GroupSettings | None:
    if not args.grpo:
        return None
    try:
        return parse_settings(args.grpo)
    except ValueError as e:
        raise ForgeError(str(e)) from None


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    """--where, --min-reward and --status: which trajectories to keep."""
    p.add_argument(
        "--where",
        default=None,
        metavar="SQL",
        help="keep rollouts whose trajectories row satisfies this SQL expression, "
        "e.g. \"harness = 'codex' AND n_calls < 200\"",
    )
    p.add_argument(
        "--min-reward",
        type=float,
        default=None,
        help="keep rollouts whose reward is at least this (ungraded ones are left out)",
    )
    p.add_argument(
        "--status",
        action="append",
        default=[],
        choices=("complete", "partial", "crashed", "timed_out", "infra_error"),
        help="keep rollouts with this status; repeatable",
    )


def filters_from(args: argparse.Namespace) -> TrajectoryFilter:
    return TrajectoryFilter(
        where=args.where, min_reward=args.min_reward, statuses=tuple(args.status)
    )


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "snapshot",
        help="write an immutable dataset snapshot (samples, trajectories, groups, calls)",
        description="Write samples, trajectories, GRPO groups and call metadata of a run "
        "directory as Parquet, with manifest.json (source shards and their sha256, rows, "
        "filters, versions) and a dataset card, into a new directory. "
        'datasets.load_dataset("parquet", data_dir=OUT) loads the samples as the train split. '
        "An existing OUT is never written into.",
    )
    p.add_argument("--data", type=Path, required=True, help="run directory")
    p.add_argument("--out", type=Path, required=True, help="new snapshot directory")
    add_filter_arguments(p)
    add_grpo_argument(p)
    p.add_argument("--no-audits", action="store_true", help="do not run the audit queries (faster)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.data.is_dir():
        raise ForgeError(f"--data {args.data}: no such run directory")
    settings = group_settings_from(args)
    try:
        result = write_snapshot(
            args.data,
            args.out,
            filters_from(args),
            audit=not args.no_audits,
            group_settings=settings,
        )
    except SnapshotExists as e:
        raise ForgeError(str(e)) from None
    except FilterError as e:
        raise ForgeError(f"{e}; the columns are those of the trajectories view") from None
    rows = ", ".join(f"{n} {table}" for table, n in result.rows.items())
    print(f"forge: snapshot written to {result.path} ({rows})")
    if not result.rows.get("samples"):
        print(
            "forge: no training samples (no served calls with token ids in the kept rollouts); "
            f'load a table with datasets.load_dataset("{result.path}", "trajectories")'
        )
    failed = {name: n for name, n in result.audits.items() if n}
    for name, n in failed.items():
        print(f"forge: warning: audit {name} returned {n} row(s)", file=sys.stderr)
    return 0
