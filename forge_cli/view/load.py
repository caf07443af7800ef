"""Read rollouts for ``forge view`` from a connection opened by ``pipeline.store.connect``.

Rows come from the pipeline's views: `trajectories` and `groups` (GRPO advantage) per
rollout, `call_nodes` and `edges` per call, `calls` for numbers and pointers, and the
content-addressed `messages` rows for each call's conversation.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import duckdb
import pyarrow as pa

from forge_cli.view.conversation import new_items, split_conversation
from forge_cli.view.model import CallView, Message, RolloutView, Shot
from pipeline.canonical import resolve_refs
from pipeline.images import image_refs

__all__ = ["MissingRow", "list_rollouts", "load_calls", "load_rollouts", "load_summaries"]

# The rollout ids `trajectories` has (seen in rollouts, calls or rewards), without the
# stitching that view runs.
_ROLLOUTS = """
SELECT rollout_id, count(call_id) AS n_calls
FROM (
    SELECT rollout_id, call_id, started_at FROM calls WHERE rollout_id IS NOT NULL
    UNION ALL
    SELECT rollout_id, NULL, NULL FROM rollouts_latest
    UNION ALL
    SELECT rollout_id, NULL, NULL FROM rewards_latest
)
GROUP BY rollout_id
ORDER BY min(started_at) NULLS LAST, rollout_id
"""
_SUMMARIES = """
SELECT t.rollout_id, t.task_id, t.harness, t.status, t.reward, t.models, t.n_calls, t.depth,
    t.fan_out, t.n_agents, t.tokens_in, t.tokens_out, t.wall_ms,
    g.group_id, g.advantage, g.included, g.drop_reason, g.group_size, g.group_mean, g.group_std
FROM trajectories AS t
LEFT JOIN groups AS g USING (rollout_id)
WHERE t.rollout_id IN (SELECT rollout_id FROM forge_view_rollouts)
"""
# Stitching never crosses rollouts and GRPO groups never cross tasks, so the trees of
# some rollouts are computed from their calls alone, and their groups from the calls of
# the rollouts that share their tasks: `calls` is swapped for a table holding those (fast
# on a large run). Each swap makes a new table: the old `calls` view may read the last.
_NARROW = (
    "CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM calls WHERE rollout_id IN ({ids})",
    "CREATE OR REPLACE VIEW calls AS SELECT * FROM {table}",
)
_WANTED = "SELECT rollout_id FROM forge_view_rollouts"
_SAME_TASKS = """
SELECT rollout_id FROM forge_view_rollouts
UNION
SELECT rollout_id FROM rollouts_latest
WHERE task_id IN (
    SELECT task_id FROM rollouts_latest
    WHERE rollout_id IN (SELECT rollout_id FROM forge_view_rollouts)
)
"""
_tables = itertools.count()


_CALLS = """
SELECT
    n.rollout_id, n.call_id, n.parent_call_id, n.edge_kind, e.evidence, n.depth, n.agent_key,
    coalesce(n.is_side_call, false), coalesce(n.is_prewarm, false),
    coalesce(c.model, c.response_model), c.api, c.status, c.error, c.started_at, c.duration_ms,
    c.ttfb_ms, c.input_tokens, c.output_tokens, c.cache_read_tokens, c.cache_write_tokens,
    c.usage_estimated, c.drift, c.policy_version, c.stop_reason, c.tools, c.tool_calls,
    c.actions, c.request_params_hash, c.request_head_hash, c.response_head_hash, c.response_items
FROM call_nodes AS n
JOIN calls AS c USING (call_id)
LEFT JOIN edges AS e ON e.child_call_id = n.call_id
ORDER BY n.rollout_id, c.started_at NULLS FIRST, n.call_id
"""
_ITEMS_OF_CALLS = """
SELECT hash, any_value(parent_hash), any_value(content_json)
FROM messages
WHERE first_call_id IN (SELECT call_id FROM calls)
GROUP BY hash
"""
_ITEMS_BY_HASH = """
SELECT hash, any_value(parent_hash), any_value(content_json)
FROM messages
WHERE hash = ?
GROUP BY hash
"""


_IMAGE = """
SELECT any_value(media_type), any_value(width), any_value(height), any_value(data)
FROM images
WHERE hash = ?
HAVING count(*) > 0
"""


class MissingRow(LookupError):
    """A hash a call points at has no `messages` row."""


class _Shots:
    """Each image of a rollout's calls, embedded (a data: URL) at its first appearance
    on the page and named at every later one, so a page holds each screenshot once."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.shown: dict[tuple[str, str], str] = {}  # (rollout, ref) -> the call showing it

    def of(self, rollout_id: str, call_id: str, items: list[Any]) -> list[Shot]:
        out = []
        for ref in image_refs(items):
            first = self.shown.get((rollout_id, ref))
            if first is not None:
                out.append(Shot(ref, first_call=first))
                continue
            self.shown[(rollout_id, ref)] = call_id
            if not ref.startswith("i1:"):  # a linked image: the page loads nothing
                out.append(Shot(ref))
                continue
            row = self.con.execute(_IMAGE, [ref]).fetchone()
            if row is None:
                out.append(Shot(ref))  # its images row is missing: named, not shown
                continue
            media, width, height, data = row
            media = media if isinstance(media, str) and media.startswith("image/") else "image/png"
            src = f"data:{media};base64,{base64.b64encode(bytes(data)).decode('ascii')}"
            out.append(Shot(ref, src=src, media_type=media, width=width, height=height))
        return out


class _Items:
    """hash -> (parent_hash, content_json): the rows the rollouts' calls stored, and any
    other row fetched when a chain reaches it (the shared start of GRPO siblings)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.rows = {h: (p, c) for h, p, c in con.execute(_ITEMS_OF_CALLS).fetchall()}

    def get(self, h: str) -> tuple[str | None, str]:
        if h not in self.rows:
            for key, parent, content in self.con.execute(_ITEMS_BY_HASH, [h]).fetchall():
                self.rows[key] = (parent, content)
        if h not in self.rows:
            raise MissingRow(f"no messages row {h!r}")
        return self.rows[h]

    def chain(self, head: str | None, limit: int | None = None) -> list[tuple[str, Any]]:
        """(hash, item) of the chain ending at ``head``, oldest first (``limit`` items at most)."""
        out: list[tuple[str, Any]] = []
        h, seen = head, set()
        while h is not None and (limit is None or len(out) < limit):
            if h in seen:
                raise MissingRow(f"chain loops at {h!r}")
            seen.add(h)
            parent, content = self.get(h)
            out.append((h, json.loads(content)))
            h = parent
        out.reverse()
        return out

    def params(self, h: str | None) -> dict[str, Any]:
        if h is None:
            return {}
        value = resolve_refs(json.loads(self.get(h)[1]), lambda r: json.loads(self.get(r)[1]))
        return value if isinstance(value, dict) else {}


def list_rollouts(con: duckdb.DuckDBPyConnection) -> list[tuple[str, int]]:
    """(rollout id, calls) of every rollout, oldest first."""
    return [(r[0], int(r[1])) for r in con.execute(_ROLLOUTS).fetchall()]


# CallView's fields in the order _CALLS selects them (after rollout_id).
_CALL_FIELDS = (
    "call_id", "parent_call_id", "edge_kind", "evidence", "depth", "agent_key",
    "is_side_call", "is_prewarm", "model", "api", "status", "error", "started_at",
    "duration_ms", "ttfb_ms", "input_tokens", "output_tokens", "cache_read_tokens",
    "cache_write_tokens", "usage_estimated", "drift", "policy_version", "stop_reason",
    "tools", "tool_calls", "actions",
)  # fmt: skip


class _Conversations:
    """Builds each call's view in call order, remembering each call's whole conversation
    (messages, and the hash of its last item) for the calls that hang from it."""

    def __init__(self, items: _Items, shots: _Shots) -> None:
        self.items = items
        self.shots = shots
        self.full: dict[str, list[Message]] = {}
        self.heads: dict[str, str | None] = {}
        self.lengths: dict[str, int] = {}  # items in the call's request + response

    def call(self, row: Sequence[Any]) -> CallView:
        rollout_id = row[0]
        fields = dict(zip(_CALL_FIELDS, row[1 : 1 + len(_CALL_FIELDS)], strict=True))
        params_hash, request_head, response_head, n_response = row[1 + len(_CALL_FIELDS) :]
        call_id, parent = fields["call_id"], fields["parent_call_id"]
        self.heads[call_id] = response_head or request_head
        try:
            request_chain = self.items.chain(request_head)
            response_chain = (
                self.items.chain(response_head, n_response or 0) if response_head else []
            )
            params = self.items.params(params_hash)
        except MissingRow as e:
            return CallView(**fields, note=f"conversation not stored: {e}")
        request_items = [item for _, item in request_chain]
        response_items = [item for _, item in response_chain]
        split = split_conversation(
            fields["api"], params, request_items, response_items, self.full.get(parent)
        )
        self.full[call_id] = split.full
        self.lengths[call_id] = len(request_chain) + len(response_chain)
        raw_request = new_items(
            request_chain,
            self.heads.get(parent) if parent else None,
            self.lengths.get(parent, 0) if parent and split.earlier else 0,
        )
        return CallView(
            **fields,
            earlier_messages=split.earlier,
            request=split.request,
            response=split.response,
            raw_request=raw_request,
            raw_response=response_items,
            shots=self.shots.of(rollout_id, call_id, raw_request + response_items),
            note=split.note,
        )


def _register(con: duckdb.DuckDBPyConnection, rollout_ids: Sequence[str]) -> None:
    ids = pa.array(list(rollout_ids), pa.string())
    con.register("forge_view_rollouts", pa.table({"rollout_id": ids}))


def _narrow(con: duckdb.DuckDBPyConnection, ids_query: str) -> None:
    """Swap `calls` for a table of the calls of the rollouts ``ids_query`` selects (a
    constant of this module, never user input)."""
    table = f"forge_view_calls_{next(_tables)}"
    for statement in _NARROW:
        con.execute(statement.format(table=table, ids=ids_query))


def load_summaries(
    con: duckdb.DuckDBPyConnection, rollout_ids: Sequence[str]
) -> dict[str, RolloutView]:
    """rollout id -> its view without calls (`trajectories` and `groups` rows). The
    connection's `calls` is narrowed to the rollouts of the same tasks (GRPO groups need
    them all)."""
    _register(con, rollout_ids)
    _narrow(con, _SAME_TASKS)
    cur = con.execute(_SUMMARIES)
    names = [d[0] for d in cur.description]
    out = {}
    for row in cur.fetchall():
        s = dict(zip(names, row, strict=True))
        s["models"] = list(s["models"] or [])
        out[s["rollout_id"]] = RolloutView(**s)
    return out


def load_calls(
    con: duckdb.DuckDBPyConnection, rollout_ids: Sequence[str]
) -> dict[str, list[CallView]]:
    """rollout id -> its calls in call order, with their conversations. The connection's
    `calls` is narrowed to these rollouts: use a fresh connection for other ones."""
    _register(con, rollout_ids)
    _narrow(con, _WANTED)
    out: dict[str, list[CallView]] = {}
    conversations = _Conversations(_Items(con), _Shots(con))
    for row in con.execute(_CALLS).fetchall():
        out.setdefault(row[0], []).append(conversations.call(row))
    return out


def load_rollouts(con: duckdb.DuckDBPyConnection, rollout_ids: Sequence[str]) -> list[RolloutView]:
    """The rollouts with their calls, in the order given (ids without a `trajectories` row
    are left out). The connection's `calls` is narrowed to them."""
    summaries = load_summaries(con, rollout_ids)
    calls = load_calls(con, rollout_ids)
    return [
        replace(summaries[rid], calls=calls.get(rid, [])) for rid in rollout_ids if rid in summaries
    ]
