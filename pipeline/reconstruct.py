"""Rebuild a call's request and response bodies from what is stored (the storage contract's proof)."""

from __future__ import annotations

import json
from typing import Any

import duckdb

from pipeline.canonical import resolve_refs
from pipeline.images import restore_images
from pipeline.store import sql_text


def _content(items: dict[str, tuple[str | None, str]], h: str) -> Any:
    if h not in items:
        raise MissingRow(f"no param row {h!r}")
    return json.loads(items[h][1])


class MissingRow(LookupError):
    """A hash a call points at has no messages row."""


def load_items(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str | None, str]]:
    """hash -> (parent_hash, content_json) for every stored messages row."""
    return {
        h: (p, c)
        for h, p, c in con.execute(
            "SELECT hash, parent_hash, content_json FROM messages"
        ).fetchall()
    }


def image_lookup(con: duckdb.DuckDBPyConnection) -> Any:
    """``lookup(hash) -> raw bytes`` over the stored ``images`` rows."""

    def lookup(h: str) -> bytes:
        row = con.execute(_IMAGE_DATA, [h]).fetchone()
        if row is None:
            raise MissingRow(f"no images row {h!r}")
        return bytes(row[0])

    return lookup


_IMAGE_DATA = "SELECT any_value(data) FROM images WHERE hash = ? HAVING count(*) > 0"


def walk_back(items: dict[str, tuple[str | None, str]], head: str | None, n: int) -> list[Any]:
    """The last ``n`` items of the chain ending at ``head``, oldest first."""
    out: list[Any] = []
    h = head
    while len(out) < n:
        if h is None or h not in items:
            raise MissingRow(f"chain broken at {h!r} after {len(out)} of {n} items")
        parent, content = items[h]
        out.append(json.loads(content))
        h = parent
    out.reverse()
    return out


def reconstruct_request(
    con: duckdb.DuckDBPyConnection,
    call_id: str,
    items: dict[str, tuple[str | None, str]] | None = None,
) -> dict[str, Any]:
    """The request body of ``call_id`` exactly as the harness sent it (equal as canonical JSON)."""
    row = con.execute(sql_text("call_request_pointers"), {"call_id": call_id}).fetchone()
    if row is None:
        raise MissingRow(f"no call {call_id!r}")
    params_hash, head, list_key, n, form = row
    items = items if items is not None else load_items(con)
    if params_hash not in items:
        raise MissingRow(f"no params row {params_hash!r}")
    body: dict[str, Any] = resolve_refs(
        json.loads(items[params_hash][1]), lambda h: _content(items, h)
    )
    chain = restore_images(walk_back(items, head, n or 0), image_lookup(con))
    if form == "string":
        body[list_key] = chain[0]
    elif form == "list":
        body[list_key] = chain
    return body
