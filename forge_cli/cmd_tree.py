"""``forge tree``: one rollout's call tree in the terminal.

Every call is a line, indented under the call it came from, with the kind of edge and
its evidence (``pipeline/sql/150_edges.sql``), the agent, model, API, tokens, status,
the tools it called, and labels for side calls, prewarms and compactions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from pipeline.store import connect, shard_paths

__all__ = ["Node", "add_parser", "render_tree", "run"]

# Stitching never crosses rollouts, so the tree of one rollout is computed from its calls
# alone: `calls` is swapped for a table holding that rollout (fast on a large run).
_KEEP_ROLLOUT = """
CREATE OR REPLACE TEMP TABLE forge_tree_calls AS SELECT * FROM calls WHERE rollout_id = ?;
CREATE OR REPLACE VIEW calls AS SELECT * FROM forge_tree_calls
"""
_NODES = """
SELECT
    n.call_id, n.parent_call_id, n.edge_kind, e.evidence, n.depth, n.agent_key,
    n.is_side_call, n.is_prewarm, c.model, c.api, c.input_tokens, c.output_tokens,
    c.cache_read_tokens, c.cache_write_tokens, c.usage_estimated, c.status, c.error,
    c.tool_calls, c.started_at, c.duration_ms
FROM call_nodes AS n
JOIN calls AS c USING (call_id)
LEFT JOIN edges AS e ON e.child_call_id = n.call_id
WHERE n.rollout_id = ?
ORDER BY c.started_at NULLS FIRST, n.call_id
"""
_ROLLOUTS = """
SELECT rollout_id, count(*) AS calls, min(started_at) AS first_call
FROM calls
WHERE rollout_id IS NOT NULL
GROUP BY rollout_id
ORDER BY first_call DESC NULLS LAST, rollout_id
"""
_LISTED = 10  # rollouts named when --rollout is missing or wrong


@dataclass(frozen=True)
class Node:
    """One call as the tree shows it."""

    call_id: str
    parent_call_id: str | None
    edge_kind: str | None
    evidence: str | None
    depth: int | None
    agent_key: str | None
    is_side_call: bool
    is_prewarm: bool
    model: str | None
    api: str | None
    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    usage_estimated: bool | None
    status: str | None
    error: str | None
    tool_calls: list[str] | None
    started_at: datetime | None
    duration_ms: float | None


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tree",
        help="print a rollout's call tree",
        description="Print the calls of one rollout as a tree: each call under the call it "
        "continues, was spawned by or compacts, with its agent, model, API, tokens, status "
        "and tool calls. Side calls, prewarms and compactions are labelled.",
    )
    p.add_argument("--data", type=Path, required=True, help="run directory (holds calls/)")
    p.add_argument(
        "--rollout",
        default=None,
        help="rollout id (default: the only rollout of the run; else the rollouts are listed)",
    )
    p.set_defaults(func=run)


def _tokens(n: Node) -> str:
    if n.input_tokens is None and n.output_tokens is None:
        return "tokens ?"
    prompt = n.input_tokens or 0
    if n.api == "anthropic_messages":  # Anthropic counts cached prompt tokens apart
        prompt += (n.cache_read_tokens or 0) + (n.cache_write_tokens or 0)
    mark = "~" if n.usage_estimated else ""
    return f"in {mark}{prompt:,} out {mark}{n.output_tokens or 0:,}"


def _line(n: Node) -> str:
    parts = []
    if n.edge_kind is not None:
        parts.append(f"{n.edge_kind} ({n.evidence})")
    parts += [
        n.call_id,
        f"[{n.agent_key}]",
        n.model or "?",
        n.api or "?",
        _tokens(n),
        n.status or "?",
    ]
    if n.duration_ms is not None:
        parts.append(f"{n.duration_ms / 1000:.1f}s")
    if n.tool_calls:
        parts.append("-> " + ", ".join(n.tool_calls))
    labels = []
    if n.is_side_call:
        labels.append("side call")
    if n.is_prewarm:
        labels.append("prewarm")
    if n.edge_kind == "compacts":
        labels.append("compaction")
    if labels:
        parts.append("{" + ", ".join(labels) + "}")
    if n.status not in ("complete", None) and n.error:
        parts.append("error: " + " ".join(n.error.split())[:80])
    return "  ".join(parts)


def render_tree(nodes: Sequence[Node]) -> list[str]:
    """The tree's lines, given the nodes in call order.

    A conversation reads down one column: a call's continuation (its last `continues`
    child) comes under it at the same indentation, after its other children (sub-agents,
    side calls, compactions, retried branches), which are drawn as indented branches.
    """
    ids = {n.call_id for n in nodes}
    children: dict[str | None, list[Node]] = {}
    for n in nodes:
        parent = n.parent_call_id if n.parent_call_id in ids else None
        children.setdefault(parent, []).append(n)
    lines: list[str] = []
    # An explicit stack of (node, prefix of its line, prefix of what hangs under it):
    # a 1000-turn conversation is a 1000-call chain.
    stack: list[tuple[Node, str, str]] = [(r, "", "") for r in reversed(children.get(None, []))]
    while stack:
        node, lead, rest = stack.pop()
        lines.append(lead + _line(node))
        kids = children.get(node.call_id, [])
        following = [k for k in kids if k.edge_kind == "continues"]
        main = following[-1] if following else None
        branches = [k for k in kids if k is not main]
        if main is not None:
            stack.append((main, rest, rest))
        for i in reversed(range(len(branches))):
            last = i == len(branches) - 1 and main is None
            stack.append(
                (branches[i], rest + ("└─ " if last else "├─ "), rest + ("   " if last else "│  "))
            )
    return lines


def _summary(rollout: str, nodes: Sequence[Node]) -> str:
    agents = {n.agent_key for n in nodes if not n.is_side_call}
    depth = max((n.depth or 0) for n in nodes)
    models = sorted({n.model for n in nodes if n.model})
    side = sum(n.is_side_call for n in nodes)
    text = (
        f"rollout {rollout}: {len(nodes)} call(s), {len(agents)} agent(s), depth {depth}, "
        f"model(s) {', '.join(models) or '?'}"
    )
    return text + (f", {side} side call(s)" if side else "")


def _rollouts(con: duckdb.DuckDBPyConnection) -> list[tuple[str, int]]:
    return [(r[0], int(r[1])) for r in con.execute(_ROLLOUTS).fetchall()]


def _list_rollouts(rows: list[tuple[str, int]]) -> str:
    shown = "\n".join(f"  {rid}  ({n} call(s))" for rid, n in rows[:_LISTED])
    more = f"\n  ... and {len(rows) - _LISTED} more" if len(rows) > _LISTED else ""
    return shown + more


def load_nodes(con: duckdb.DuckDBPyConnection, rollout: str) -> list[Node]:
    """The rollout's calls as tree nodes, in call order (the connection is narrowed to it)."""
    for statement in _KEEP_ROLLOUT.split(";"):
        con.execute(statement, [rollout] if "?" in statement else [])
    return [Node(*row) for row in con.execute(_NODES, [rollout]).fetchall()]


def run(args: argparse.Namespace) -> int:
    data: Path = args.data
    if not shard_paths(data, "calls"):
        print(
            f"forge tree: no calls recorded under {data} (expected {data}/calls/*.parquet)",
            file=sys.stderr,
        )
        return 2
    con = connect(data, stitched=True)
    rollout = args.rollout
    rows = _rollouts(con)  # listed before load_nodes narrows the connection to one rollout
    if rollout is None:
        if len(rows) != 1:
            print(
                f"forge tree: {data} holds {len(rows)} rollouts; pick one with --rollout:\n"
                + _list_rollouts(rows),
                file=sys.stderr,
            )
            return 2
        rollout = rows[0][0]
    nodes = load_nodes(con, rollout)
    if not nodes:
        print(
            f"forge tree: no calls of rollout {rollout!r} in {data}; rollouts there:\n"
            + _list_rollouts(rows),
            file=sys.stderr,
        )
        return 2
    print(_summary(rollout, nodes))
    for line in render_tree(nodes):
        print(line)
    return 0
