"""``forge view``: self-contained HTML pages of rollouts' call trees.

With ``--rollout``, one page; without, one page per rollout in a directory plus an
``index.html``. Pages load nothing from the network (CSS and JS are inlined), so they
open from disk, from a CI artifact or from an e-mail attachment alike.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from forge_cli.view.load import list_rollouts, load_calls, load_summaries
from forge_cli.view.page import page_file_name, render_index, render_rollout_page
from pipeline.atomic import write_atomic
from pipeline.store import connect, shard_paths

__all__ = ["add_parser", "run"]

_LISTED = 10  # rollouts named when --rollout is wrong
_BATCH = 50  # rollouts loaded at once when every rollout is written


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "view",
        help="write HTML pages of rollouts' call trees",
        description="Write a self-contained HTML page per rollout: its call tree (main agent, "
        "sub-agents, side calls, compactions) with each call's messages, tool calls and "
        "results, model, tokens, latency, drift class and GRPO advantage; collapsible and "
        "searchable. Without --rollout, every rollout's page and an index.html.",
    )
    p.add_argument("--data", type=Path, required=True, help="run directory (holds calls/)")
    p.add_argument("--rollout", default=None, help="the rollout to show (default: every rollout)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="with --rollout, the page's file (default DATA/view/<rollout>.html); "
        "without, the directory for the pages and index.html (default DATA/view)",
    )
    p.set_defaults(func=run)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a reader never sees half a page)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # No fsync: a page lost to a power cut is written again by the next `forge view`.
    write_atomic(path, text, sync=False, sync_dir=False)


def _error(message: str) -> int:
    print(f"forge view: {message}", file=sys.stderr)
    return 2


def _one(data: Path, rollout: str, out: Path | None) -> int:
    con = connect(data)
    summaries = load_summaries(con, [rollout])
    if rollout not in summaries:
        rows = list_rollouts(connect(data))  # `con` is narrowed by now
        listed = "\n".join(f"  {rid}  ({n} call(s))" for rid, n in rows[:_LISTED])
        more = f"\n  ... and {len(rows) - _LISTED} more" if len(rows) > _LISTED else ""
        return _error(f"no rollout {rollout!r} in {data}; rollouts there:\n{listed}{more}")
    calls = load_calls(con, [rollout]).get(rollout, [])
    path = out or data / "view" / page_file_name(rollout)
    if path.is_dir():
        path = path / page_file_name(rollout)
    write_text_atomic(path, render_rollout_page(replace(summaries[rollout], calls=calls)))
    print(f"forge view: wrote rollout {rollout} ({len(calls)} call(s)) to {path}")
    return 0


def _all(data: Path, out: Path | None) -> int:
    directory = out or data / "view"
    if directory.suffix == ".html":
        return _error(f"--out {directory} names a file; without --rollout it is a directory")
    con = connect(data)
    ids = [rid for rid, _ in list_rollouts(con)]
    if not ids:
        return _error(f"no rollouts in {data}")
    summaries = load_summaries(con, ids)
    for start in range(0, len(ids), _BATCH):
        batch = ids[start : start + _BATCH]
        # load_calls narrows its connection to the batch: a fresh one for each later batch
        calls = load_calls(con if start == 0 else connect(data), batch)
        for rid in batch:
            page = render_rollout_page(
                replace(summaries[rid], calls=calls.get(rid, [])), index_href="index.html"
            )
            write_text_atomic(directory / page_file_name(rid), page)
        print(f"forge view: {start + len(batch)}/{len(ids)} rollout page(s) written", flush=True)
    index = directory / "index.html"
    write_text_atomic(index, render_index([summaries[r] for r in ids], data.resolve().name))
    print(f"forge view: wrote {len(ids)} rollout page(s) to {directory}; open {index}")
    return 0


def run(args: argparse.Namespace) -> int:
    data: Path = args.data
    if not shard_paths(data, "calls"):
        return _error(f"no calls recorded under {data} (expected {data}/calls/*.parquet)")
    if args.rollout is not None:
        return _one(data, args.rollout, args.out)
    return _all(data, args.out)
