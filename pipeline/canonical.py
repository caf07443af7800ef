"""Canonical JSON and content hashes: the storage contract for messages.

Contract, version ``m1`` (the tag is part of every hash value):

* canonical JSON is ``json.dumps(value, sort_keys=True, separators=(",", ":"),
  ensure_ascii=False, allow_nan=False)``, encoded as UTF-8;
* the hash of an item is ``"m1:" + sha256(b"forge-m1\\0" + parent + b"\\0" + canonical)``
  in hex, truncated to 40 hex digits (160 bits), where ``parent`` is the parent's
  hash value as ASCII, or empty for the first item of a chain.

So two conversations that share a prefix share its rows, and an item's hash pins
its whole history (the scheme of simonw/llm's conversation store).

A request's parameters (its body minus the conversation items) are stored as one
``params`` row in which any top-level value, or element of a top-level list, whose
canonical JSON is at least ``REF_MIN_BYTES`` long is replaced by
``{"$forge_ref": <hash of that value with no parent>}``, pointing at a ``param`` row.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

HASH_TAG = "m1"
_PREFIX = b"forge-m1\0"
REF_KEY = "$forge_ref"
REF_MIN_BYTES = 512
_HEX_DIGITS = 40


def canonical_json(value: Any) -> str:
    """The one serialisation every stored JSON value goes through."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def item_hash(canonical: str, parent: str | None) -> str:
    """Hash of an item given its canonical JSON and its parent's hash."""
    digest = hashlib.sha256()
    digest.update(_PREFIX)
    digest.update((parent or "").encode("ascii"))
    digest.update(b"\0")
    digest.update(canonical.encode("utf-8"))
    return f"{HASH_TAG}:{digest.hexdigest()[:_HEX_DIGITS]}"


def chain_hashes(items: list[Any], parent: str | None = None) -> list[tuple[str, str | None, str]]:
    """(hash, parent_hash, canonical_json) for each item of a chain, in order."""
    out: list[tuple[str, str | None, str]] = []
    for item in items:
        canonical = canonical_json(item)
        h = item_hash(canonical, parent)
        out.append((h, parent, canonical))
        parent = h
    return out


def resolve_refs(value: Any, lookup: Any) -> Any:
    """A params object with its ``$forge_ref`` parts put back (``lookup(hash) -> value``)."""

    def one(v: Any) -> Any:
        if isinstance(v, dict) and len(v) == 1 and REF_KEY in v:
            return lookup(v[REF_KEY])
        return v

    if not isinstance(value, dict):
        return value
    return {k: [one(e) for e in v] if isinstance(v, list) else one(v) for k, v in value.items()}
