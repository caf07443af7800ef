"""Token splicing and drift classes: later turns reuse the exact ids of earlier completions.

A harness sends the whole conversation on every call. Re-rendering it through the chat
template would re-tokenise the policy's earlier completions, and the text of a sampled
completion rarely tokenises back to the ids that were sampled. So every served call is
remembered with its prompt and completion ids, keyed by a hash chain over the
conversation's messages (the same idea as the content-addressed store, over
chat-template messages), and a new call is planned against the longest remembered
conversation it continues:

* ``CLEAN``: the request repeats an earlier call's conversation and its reply exactly as
  served, then adds messages (tool results, a user turn). Prompt = that call's prompt +
  completion + the new messages rendered by the template: the parent's ids, token for
  token. A call with no earlier assistant turn starts a conversation: CLEAN, no parent.
* ``REALIGN``: the same messages on a different surface (the harness dropped the
  reasoning, re-serialised tool arguments, trimmed whitespace): rendering them would give
  other tokens, so the stored ids are spliced instead, as for CLEAN.
* ``FORK``: the history was rewritten (compaction, an edited or removed message, a
  sub-agent, an assistant turn the policy did not write). The prompt is rendered whole,
  still splicing the longest remembered prefix when there is one.

Pure apart from the ``Tokens`` it is given; ``SpliceStore`` is a bounded, thread-safe LRU.
"""

from __future__ import annotations

import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

CLEAN, REALIGN, FORK = "CLEAN", "REALIGN", "FORK"


class Tokens(Protocol):
    """What splicing needs of the policy's tokenizer and chat template."""

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """The whole prompt, generation prompt included."""
        ...

    def render_continuation(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], after_eos: bool
    ) -> list[int]:
        """The ids that follow an assistant turn when ``messages`` come next, generation
        prompt included; without the end-of-turn token when the turn already ended with it."""
        ...

    def ends_turn(self, token_id: int) -> bool: ...


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def message_key(message: dict[str, Any], strict: bool) -> str:
    """What identifies a message for splicing. Strict: everything the template renders
    (text, reasoning, tool calls with their arguments as JSON values); loose: the same
    without reasoning and surrounding whitespace. Tool-call ids are not part of either:
    the harness answers them, the template does not render them."""
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = json.dumps(content, sort_keys=True)
    calls = [
        [
            (c.get("function") or {}).get("name"),
            _arguments((c.get("function") or {}).get("arguments")),
        ]
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    key: list[Any] = [message.get("role"), content if strict else content.strip(), calls]
    if strict:
        key.append(message.get("reasoning_content") or "")
    return json.dumps(key, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def chain_keys(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], strict: bool
) -> list[str]:
    """``keys[i]`` identifies the conversation's first i messages (with its tools)."""
    h = hashlib.blake2b(
        json.dumps(list(tools), sort_keys=True).encode(), digest_size=16, person=b"forge-tools"
    )
    keys = [h.hexdigest()]
    for message in messages:
        h = hashlib.blake2b(keys[-1].encode(), digest_size=16)
        h.update(message_key(message, strict).encode("utf-8"))
        keys.append(h.hexdigest())
    return keys


@dataclass(frozen=True)
class ServedCall:
    """A served call as splicing needs it: its exact prompt and completion ids."""

    call_id: str
    prompt_ids: array[int]
    completion_ids: array[int]

    @property
    def ids(self) -> list[int]:
        return list(self.prompt_ids) + list(self.completion_ids)


@dataclass(frozen=True)
class Plan:
    """The prompt of one call and how it relates to earlier calls.

    ``prompt_ids`` is the whole prompt sent to the policy; ``stored_ids`` what the calls
    row keeps: for CLEAN calls with a parent, only the ids after the parent's prompt +
    completion (``prompt_ids == parent prompt + parent completion + stored_ids``); for
    every other call the whole prompt (``pipeline/sql/300_token_calls.sql`` reads it so).
    """

    drift: str
    prompt_ids: list[int]
    parent_call_id: str | None
    stored_ids: list[int]


class SpliceStore:
    """Served calls by the conversation they end (request messages + reply), bounded."""

    def __init__(self, max_calls: int = 4096) -> None:
        self.max_calls = max_calls
        self._strict: OrderedDict[str, ServedCall] = OrderedDict()
        self._loose: OrderedDict[str, ServedCall] = OrderedDict()
        self._histories: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def add(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        call: ServedCall,
        response_id: str | None = None,
    ) -> None:
        """Remember a served call; ``messages`` ends with the reply as the harness got it."""
        strict = chain_keys(messages, tools, strict=True)[-1]
        loose = chain_keys(messages, tools, strict=False)[-1]
        with self._lock:
            for table, key in ((self._strict, strict), (self._loose, loose)):
                table[key] = call
                table.move_to_end(key)
                while len(table) > self.max_calls:
                    table.popitem(last=False)
            if response_id is not None:
                self._histories[response_id] = [dict(m) for m in messages]
                while len(self._histories) > self.max_calls:
                    self._histories.popitem(last=False)

    def history(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation a served Responses call ended (for ``previous_response_id``)."""
        with self._lock:
            found = self._histories.get(response_id)
            return [dict(m) for m in found] if found is not None else None

    def find(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
    ) -> tuple[int, ServedCall, bool] | None:
        """(prefix length, call, strict) of the longest remembered conversation that
        ``messages`` continue; at equal length an exact (strict) match wins."""
        strict = chain_keys(messages, tools, strict=True)
        loose = chain_keys(messages, tools, strict=False)
        with self._lock:
            for n in range(len(messages), 0, -1):
                if messages[n - 1].get("role") != "assistant":
                    continue
                if (call := self._strict.get(strict[n])) is not None:
                    return n, call, True
                if (call := self._loose.get(loose[n])) is not None:
                    return n, call, False
        return None


def plan_prompt(
    store: SpliceStore,
    tokens: Tokens,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> Plan:
    """The prompt ids of a call and its drift class (see the module docstring)."""
    found = store.find(messages, tools)
    if found is None:
        ids = tokens.render(messages, tools)
        has_turns = any(m.get("role") == "assistant" for m in messages)
        return Plan(FORK if has_turns else CLEAN, ids, None, ids)
    n, parent, strict = found
    rest = messages[n:]
    after_eos = bool(parent.completion_ids) and tokens.ends_turn(parent.completion_ids[-1])
    delta = tokens.render_continuation(rest, tools, after_eos)
    ids = parent.ids + delta
    if any(m.get("role") == "assistant" for m in rest):
        return Plan(FORK, ids, None, ids)  # assistant turns the policy did not write
    if not strict:
        # Stored whole: the pipeline merges only CLEAN chains into one training sequence.
        return Plan(REALIGN, ids, None, ids)
    return Plan(CLEAN, ids, parent.call_id, delta)
