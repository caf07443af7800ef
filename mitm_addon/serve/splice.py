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
* ``TRIM``: the harness dropped context it had added to an earlier request only
  (``pipeline.volatile``'s transient context: OpenClaw's internal-context message), so the
  prompt extends no served call's prompt + completion, yet every assistant turn in it is a
  completion the policy sampled in exactly this conversation (transient context aside).
  The prompt is the messages as sent, with each of those completions spliced in as its
  sampled ids; it is stored whole, and trains as a sequence of its own.
* ``FORK``: the history was rewritten (compaction, an edited or removed message, a
  sub-agent, an assistant turn the policy did not write). The prompt is rendered whole,
  still splicing the longest remembered prefix when there is one.

Pure apart from the ``Tokens`` it is given; ``SpliceStore`` is a bounded, thread-safe LRU.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.volatile import has_transient, without_transient

CLEAN, REALIGN, TRIM, FORK = "CLEAN", "REALIGN", "TRIM", "FORK"


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


def _content(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


def message_key(message: dict[str, Any], strict: bool, stable: bool = False) -> str | None:
    """What identifies a message for splicing. Strict: everything the template renders
    (text, reasoning, tool calls with their arguments as JSON values); loose: the same
    without reasoning and surrounding whitespace. Tool-call ids are not part of either:
    the harness answers them, the template does not render them. Stable (with loose):
    without transient context too; None for a message that holds nothing else."""
    content = _content(message)
    if stable and has_transient(content):
        content = without_transient(content)
        if not content and not message.get("tool_calls"):
            return None
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


def _step(previous: str, key: str | None) -> str:
    if key is None:  # a message of transient context only: the stable key does not move
        return previous
    h = hashlib.blake2b(previous.encode(), digest_size=16)
    h.update(key.encode("utf-8"))
    return h.hexdigest()


@functools.lru_cache(maxsize=1 << 14)  # three keys each of the ~5k newest messages
def _digest(fingerprint: tuple[Any, ...]) -> str | None:
    """The digest of a message's key, by its fingerprint (``_fingerprint``): worked out
    once per message, not once per call that sends it again. The cache holds on to the
    messages' strings; the splice store holds more (a whole history per call)."""
    strict, stable, role, content, reasoning, calls = fingerprint
    message: dict[str, Any] = {"role": role, "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"function": {"name": name, "arguments": arguments}} for name, arguments in calls
        ]
    key = message_key(message, strict, stable)
    return None if key is None else hashlib.blake2b(key.encode("utf-8"), digest_size=16).hexdigest()


def _fingerprint(message: dict[str, Any], strict: bool, stable: bool) -> tuple[Any, ...] | None:
    """What ``message_key`` reads of a message, hashable (None when it is not: content
    blocks, arguments as objects). Hashing it is a C-speed pass over its strings."""
    content, reasoning = message.get("content"), message.get("reasoning_content")
    if not isinstance(content, str | None) or not isinstance(reasoning, str | None):
        return None
    calls: list[tuple[Any, Any]] = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return None
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str | None) or not isinstance(arguments, str | None):
            return None
        calls.append((name, arguments))
    return (strict, stable, message.get("role"), content, reasoning, tuple(calls))


def message_digest(message: dict[str, Any], strict: bool, stable: bool = False) -> str | None:
    """A short digest of ``message_key``: what the key chains are made of."""
    fingerprint = _fingerprint(message, strict, stable)
    if fingerprint is not None:
        return _digest(fingerprint)
    key = message_key(message, strict, stable)
    return None if key is None else hashlib.blake2b(key.encode("utf-8"), digest_size=16).hexdigest()


def chain_keys(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    strict: bool,
    stable: bool = False,
) -> list[str]:
    """``keys[i]`` identifies the conversation's first i messages (with its tools); stable
    keys leave transient context out (a message of nothing else does not move the key)."""
    h = hashlib.blake2b(
        json.dumps(list(tools), sort_keys=True).encode(), digest_size=16, person=b"forge-tools"
    )
    keys = [h.hexdigest()]
    for message in messages:
        keys.append(_step(keys[-1], message_digest(message, strict, stable)))
    return keys


@dataclass(frozen=True)
class Keys:
    """A conversation's three key chains, worked out once per call: strict, loose, and
    stable (loose without transient context: the loose chain itself when it holds none)."""

    strict: list[str]
    loose: list[str]
    stable: list[str]

    @classmethod
    def of(cls, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> Keys:
        loose = chain_keys(messages, tools, strict=False)
        transient = any(has_transient(_content(m)) for m in messages)
        return cls(
            chain_keys(messages, tools, strict=True),
            loose,
            chain_keys(messages, tools, strict=False, stable=True) if transient else loose,
        )

    def then(self, message: dict[str, Any]) -> tuple[str, str, str]:
        """The (strict, loose, stable) keys of the conversation followed by ``message``."""
        return (
            _step(self.strict[-1], message_digest(message, strict=True)),
            _step(self.loose[-1], message_digest(message, strict=False)),
            _step(self.stable[-1], message_digest(message, strict=False, stable=True)),
        )


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
    keys: Keys | None = None  # the request's key chains, for SpliceStore.add


class SpliceStore:
    """Served calls by the conversation they end (request messages + reply), bounded."""

    def __init__(self, max_calls: int = 4096) -> None:
        self.max_calls = max_calls
        self._strict: OrderedDict[str, ServedCall] = OrderedDict()
        self._loose: OrderedDict[str, ServedCall] = OrderedDict()
        self._stable: OrderedDict[str, ServedCall] = OrderedDict()  # loose, transient left out
        self._histories: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def add(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        call: ServedCall,
        response_id: str | None = None,
        keys: Keys | None = None,
        instructions: int = 0,
    ) -> None:
        """Remember a served call; ``messages`` ends with the reply as the harness got it.
        ``keys``: those of ``messages`` without the reply (the plan's), if worked out.
        ``response_id``: the Responses id a later call may continue from, whose history
        leaves out the ``instructions`` leading messages."""
        if keys is None:
            keys = Keys.of(messages[:-1], tools)
        strict, loose, stable = keys.then(messages[-1])
        tables = ((self._strict, strict), (self._loose, loose), (self._stable, stable))
        with self._lock:
            for table, key in tables:
                table[key] = call
                table.move_to_end(key)
                while len(table) > self.max_calls:
                    table.popitem(last=False)
        if response_id is not None:
            self.add_history(response_id, messages[instructions:])

    def add_history(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        """Remember the conversation a Responses call ended, for ``previous_response_id``."""
        with self._lock:
            self._histories[response_id] = [dict(m) for m in messages]
            while len(self._histories) > self.max_calls:
                self._histories.popitem(last=False)

    def history(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation a served Responses call ended (for ``previous_response_id``)."""
        with self._lock:
            found = self._histories.get(response_id)
            return [dict(m) for m in found] if found is not None else None

    def find(
        self, messages: Sequence[dict[str, Any]], keys: Keys
    ) -> tuple[int, ServedCall, bool] | None:
        """(prefix length, call, strict) of the longest remembered conversation that
        ``messages`` continue; at equal length an exact (strict) match wins."""
        strict, loose = keys.strict, keys.loose
        with self._lock:
            for n in range(len(messages), 0, -1):
                if messages[n - 1].get("role") != "assistant":
                    continue
                if (call := self._strict.get(strict[n])) is not None:
                    return n, call, True
                if (call := self._loose.get(loose[n])) is not None:
                    return n, call, False
        return None

    def completions(
        self, messages: Sequence[dict[str, Any]], keys: Keys
    ) -> list[tuple[int, ServedCall]] | None:
        """(index, call) of each assistant message: the served call whose reply it is,
        sampled in exactly the conversation before it (transient context aside); None
        when one of them is not such a reply."""
        stable = keys.stable
        found: list[tuple[int, ServedCall]] = []
        with self._lock:
            for i, message in enumerate(messages):
                if message.get("role") != "assistant":
                    continue
                call = self._stable.get(stable[i + 1])
                if call is None:
                    return None
                found.append((i, call))
        return found


def splice_all(
    tokens: Tokens,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    spliced: list[tuple[int, ServedCall]],
) -> list[int]:
    """The prompt of ``messages`` rendered by the template, with each assistant message
    at ``spliced``'s indices replaced by its call's completion ids."""
    ids: list[int] = []
    start, after_eos = 0, False
    for n, (index, call) in enumerate(spliced):
        segment = messages[start:index]
        if n == 0:
            ids += tokens.render(segment, tools)
        else:
            ids += tokens.render_continuation(segment, tools, after_eos)
        ids += call.completion_ids
        after_eos = bool(call.completion_ids) and tokens.ends_turn(call.completion_ids[-1])
        start = index + 1
    return ids + tokens.render_continuation(messages[start:], tools, after_eos)


def plan_prompt(
    store: SpliceStore,
    tokens: Tokens,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> Plan:
    """The prompt ids of a call and its drift class (see the module docstring)."""
    keys = Keys.of(messages, tools)
    return dataclasses.replace(_plan(store, tokens, messages, tools, keys), keys=keys)


def _plan(
    store: SpliceStore,
    tokens: Tokens,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    keys: Keys,
) -> Plan:
    found = store.find(messages, keys)
    if found is not None:
        n, parent, strict = found
        rest = messages[n:]
        if not any(m.get("role") == "assistant" for m in rest):
            after_eos = bool(parent.completion_ids) and tokens.ends_turn(parent.completion_ids[-1])
            delta = tokens.render_continuation(rest, tools, after_eos)
            ids = parent.ids + delta
            if not strict:
                # Stored whole: the pipeline merges only CLEAN chains into one sequence.
                return Plan(REALIGN, ids, None, ids)
            return Plan(CLEAN, ids, parent.call_id, delta)
    elif not any(m.get("role") == "assistant" for m in messages):
        ids = tokens.render(messages, tools)
        return Plan(CLEAN, ids, None, ids)  # a new conversation
    spliced = store.completions(messages, keys)
    if spliced and spliced[0][0] > 0:
        ids = splice_all(tokens, messages, tools, spliced)
        return Plan(TRIM, ids, None, ids)
    if found is None:
        ids = tokens.render(messages, tools)
        return Plan(FORK, ids, None, ids)
    # Assistant turns the policy did not write after a remembered prefix: spliced up to it.
    n, parent, _ = found
    after_eos = bool(parent.completion_ids) and tokens.ends_turn(parent.completion_ids[-1])
    ids = parent.ids + tokens.render_continuation(messages[n:], tools, after_eos)
    return Plan(FORK, ids, None, ids)
