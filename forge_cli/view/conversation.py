"""A call's conversation split into what its parent already showed and what is new (pure).

A harness re-sends the whole history on every call, so a page that printed each call's
request in full would grow with the square of the turns. Each call shows only the
messages after its parent's conversation (the parent's request and response), when the
parent's conversation is a prefix of its request; otherwise (a compaction, a sub-agent
with its own history, a rewritten history) it shows its whole request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forge_cli.view.model import Message
from pipeline.export import to_openai

__all__ = ["Split", "new_items", "split_conversation", "to_messages"]


@dataclass(frozen=True)
class Split:
    earlier: int  # leading request messages equal to the parent's conversation
    request: list[Message]  # the request's messages after those
    response: list[Message]
    full: list[Message]  # request + response: what a child call is compared with
    note: str | None  # set when items could not be converted and are shown as recorded


def _raw_message(item: Any) -> Message:
    role = item.get("role") if isinstance(item, dict) else None
    text = json.dumps(item, indent=1, ensure_ascii=False, sort_keys=True)
    return {"role": role if isinstance(role, str) else "item", "content": text, "raw": True}


def to_messages(
    api: str | None, params: dict[str, Any], items: list[Any]
) -> tuple[list[Message], str | None]:
    """The items as OpenAI chat messages; items the converters cannot read are shown as
    their JSON, with a note saying why."""
    try:
        return to_openai(api or "", params, items)[0], None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        return [_raw_message(i) for i in items], f"shown as recorded ({type(e).__name__}: {e})"


def split_conversation(
    api: str | None,
    params: dict[str, Any],
    request_items: list[Any],
    response_items: list[Any],
    parent_full: Sequence[Message] | None,
) -> Split:
    """The call's messages: those its parent's conversation already holds are counted in
    ``earlier`` and left out of ``request``."""
    request, note = to_messages(api, params, request_items)
    full, full_note = to_messages(api, params, request_items + response_items)
    if full[: len(request)] == request:
        response = full[len(request) :]
    else:  # a converter that pairs items across the boundary: convert the response alone
        response, _ = to_messages(api, {}, response_items)
    earlier = 0
    if parent_full and list(parent_full) == request[: len(parent_full)]:
        earlier = len(parent_full)
    return Split(earlier, request[earlier:], response, full, note or full_note)


def new_items(
    chain: Sequence[tuple[str, Any]], parent_head: str | None, parent_items: int = 0
) -> list[Any]:
    """The items of a request chain ((hash, item) oldest first) after ``parent_head``,
    the last item of the parent's conversation. When that hash is not on the chain (the
    harness altered re-sent items) the first ``parent_items`` are left out: pass the
    parent's item count only when its messages were found to be a prefix of these."""
    hashes = [h for h, _ in chain]
    if parent_head is not None and parent_head in hashes:
        return [item for _, item in chain[hashes.index(parent_head) + 1 :]]
    return [item for _, item in chain[parent_items:]]
