"""Sliding-window attention: how far back a model sees, so that what it cannot see is not run.

A model whose every layer attends to the last ``window`` tokens (itself included) computes
each hidden state from the ``layers x (window - 1)`` tokens before it and no others, and
rotary position embeddings depend on relative positions only: dropping the tokens
further back leaves every logit as it was, up to float rounding. The trainer and the
embedded policy server use this to run a harness's 8k-token prompt as its last few
hundred tokens.
"""

from __future__ import annotations

from typing import Any


def attention_reach(config: Any) -> int | None:
    """Tokens before a position that its last hidden state depends on: ``layers x
    (window - 1)`` when every layer is sliding-window attention over ``window`` tokens
    (transformers' ``layer_types`` and ``sliding_window``, the window counting the token
    itself); None when any layer attends to the whole sequence."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not isinstance(window, int) or window < 1 or not types:
        return None
    if any(t != "sliding_attention" for t in types):
        return None
    return len(types) * (window - 1)


def visible_suffix(ids: list[int], reach: int | None) -> list[int]:
    """The tokens of ``ids`` that the logits after its last token depend on."""
    return ids if reach is None else ids[-(reach + 1) :]
