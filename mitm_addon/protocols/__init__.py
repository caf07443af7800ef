"""Provider wire formats, one module per API, pure functions only."""

from __future__ import annotations

from mitm_addon.protocols import anthropic_messages, openai_chat, openai_responses
from mitm_addon.protocols.base import Adapter

ADAPTERS: tuple[Adapter, ...] = (
    anthropic_messages.ADAPTER,
    openai_chat.ADAPTER,
    openai_responses.ADAPTER,
)


def find_adapter(method: str, path: str) -> Adapter | None:
    """The adapter whose model-call endpoint this request targets, if any."""
    for adapter in ADAPTERS:
        if adapter.matches(method, path):
            return adapter
    return None
