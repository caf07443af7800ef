"""What a rollout page shows: plain frozen data, built by ``load`` and rendered by ``page``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# A message in the OpenAI chat shape of ``pipeline.export`` (role, content, tool_calls,
# reasoning_content, tool_call_id, name): one shape for every recorded API.
Message = dict[str, Any]


@dataclass(frozen=True)
class Shot:
    """An image a call's new items carry: shown where it first appears on the page."""

    ref: str  # an images row's hash, or the URL of a linked image
    src: str | None = None  # a data: URL, at the image's first appearance on the page
    first_call: str | None = None  # the call that showed it first, for a repeat
    media_type: str | None = None
    width: int | None = None
    height: int | None = None


@dataclass(frozen=True)
class CallView:
    """One call of a rollout: its place in the tree, its numbers and its new messages."""

    call_id: str
    parent_call_id: str | None
    edge_kind: str | None  # continues | spawns | compacts; None for a root
    evidence: str | None
    depth: int | None
    agent_key: str | None
    is_side_call: bool
    is_prewarm: bool
    model: str | None
    api: str | None
    status: str | None
    error: str | None
    started_at: datetime | None
    duration_ms: float | None
    ttfb_ms: float | None
    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    usage_estimated: bool | None
    drift: str | None  # CLEAN | REALIGN | TRIM | FORK in serve mode; None in record mode
    policy_version: int | None
    stop_reason: str | None
    tools: list[str] | None  # tools the request offered
    tool_calls: list[str] | None  # tools the response called
    actions: list[str] | None  # GUI actions the response took (pipeline.actions)
    earlier_messages: int = 0  # leading messages already shown in the parent call
    request: list[Message] = field(default_factory=list)  # messages new in this request
    response: list[Message] = field(default_factory=list)
    raw_request: list[Any] = field(default_factory=list)  # the same, as recorded items
    raw_response: list[Any] = field(default_factory=list)
    shots: list[Shot] = field(default_factory=list)  # images in the new items, in order
    note: str | None = None  # why the conversation is missing or shown raw


@dataclass(frozen=True)
class RolloutView:
    """One rollout: its `trajectories` row, its GRPO `groups` row (if any) and its calls
    in call order (parents before children)."""

    rollout_id: str
    task_id: str | None = None
    harness: str | None = None
    status: str | None = None
    reward: float | None = None
    models: list[str] = field(default_factory=list)
    n_calls: int = 0
    depth: int | None = None
    fan_out: int = 0
    n_agents: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    wall_ms: float | None = None
    group_id: str | None = None
    advantage: float | None = None
    included: bool | None = None
    drop_reason: str | None = None
    group_size: int | None = None
    group_mean: float | None = None
    group_std: float | None = None
    calls: list[CallView] = field(default_factory=list)
