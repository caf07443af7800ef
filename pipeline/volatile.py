"""What harnesses send that is not conversation: the rules, per harness, that keep it out
of the prompt the policy sees and out of the keys that splice earlier completions (pure).

A harness resends the whole conversation on every call. Some of what it sends changes from
one request to the next without the conversation changing, and each rule below names one
such thing, measured on the harness it comes from (``docs/harnesses.md`` has the evidence):

* **request attributes** (``drop_system_block``): text a harness puts in the system prompt
  for the provider's API, not for the model. Claude Code's first system block is
  ``x-anthropic-billing-header: cc_version=...; cch=<hash>; ...;``, whose hash changes on
  every call. Dropped from the conversation (serve mode's prompt and the SFT export).
* **transient context** (``transient_span``): context a harness adds to one request only
  and drops from the next. OpenClaw ends each request with a user message between
  ``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` and ``<<<END_OPENCLAW_INTERNAL_CONTEXT>>>``
  (its running exec sessions and sub-agents). It stays in the prompt of the call it came
  with (the policy samples from what the harness sent), and it is left out of the keys
  that find earlier completions, so a later call still splices them (drift ``TRIM``).

Moving ``cache_control`` markers need no rule: the conversion to chat messages keeps text,
not content-block attributes. The stored record always keeps the bytes the harness sent.
"""

from __future__ import annotations

import re

# Request attributes a harness puts in a system text block: (harness, block prefix).
SYSTEM_ATTRIBUTES: tuple[tuple[str, str], ...] = (("claude-code", "x-anthropic-billing-header:"),)

# Transient context: (harness, start marker, end marker) of a text span.
TRANSIENT_MARKERS: tuple[tuple[str, str, str], ...] = (
    (
        "openclaw",
        "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>",
        "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
    ),
)

_TRANSIENT = [
    re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    for _, start, end in TRANSIENT_MARKERS
]


def drop_system_block(text: str) -> bool:
    """Is this system text block a request attribute (not prompt text)?"""
    head = text.lstrip()[:64]
    return any(head.startswith(prefix) for _, prefix in SYSTEM_ATTRIBUTES)


def without_transient(text: str) -> str:
    """``text`` with every transient-context span removed, surrounding whitespace
    trimmed; the empty string when nothing else is left."""
    if "<<<" not in text:
        return text
    for pattern in _TRANSIENT:
        text = pattern.sub("", text)
    return text.strip()


def has_transient(text: str) -> bool:
    return "<<<" in text and any(p.search(text) for p in _TRANSIENT)
