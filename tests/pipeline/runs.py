"""Test run directories: rows built from the schema, and agent loops recorded in each
API's wire format with the real recorder (``mitm_addon.recorder.build_rows``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from mitm_addon.capture import Capture
from mitm_addon.protocols import find_adapter
from mitm_addon.recorder import build_rows
from pipeline.schema import CALLS
from pipeline.shards import write_shard

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def call_row(call_id: str, seconds: float = 0.0, **values: Any) -> dict[str, Any]:
    """A calls row with every column of the schema (NULL unless given)."""
    row: dict[str, Any] = {f.name: None for f in CALLS}
    row.update(
        call_id=call_id,
        run_id="run-1",
        api="openai_chat",
        status="complete",
        started_at=T0 + timedelta(seconds=seconds),
        ended_at=T0 + timedelta(seconds=seconds + 0.5),
    )
    row.update(values)
    return row


def rollout_row(rollout_id: str, task_id: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "rollout_id": rollout_id,
        "task_id": task_id,
        "harness": "toy",
        "status": "complete",
        "written_at": T0,
    }
    row.update(values)
    return row


def reward_row(rollout_id: str, reward: float, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "rollout_id": rollout_id,
        "reward": reward,
        "source": "test",
        "written_at": T0,
    }
    row.update(values)
    return row


# --- Recorded conversations ------------------------------------------------------------
# A scripted agent loop in each API's wire format, recorded with the real recorder
# (mitm_addon.recorder.build_rows), so the shards hold what the proxy would write.


@dataclass
class Step:
    """One assistant turn: optional reasoning and text, tool calls, and their results."""

    text: str | None = None
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    results: list[tuple[str, bool]] = field(default_factory=list)  # (output, is_error)
    reasoning: str | None = None


@dataclass
class Agent:
    api: str
    rollout_id: str
    system: str
    prompt: str
    tools: list[tuple[str, str, dict[str, Any]]]  # (name, description, JSON schema)
    steps: list[Step]
    model: str = "policy-1"
    headers: dict[str, str] = field(default_factory=dict)
    # Responses API only: send previous_response_id and only the new items.
    previous_response_id: bool = False
    # Anthropic only: mark the newest message's last block with cache_control and unmark
    # the older ones, as Claude Code does (so re-sent items change and get new hashes).
    move_cache_control: bool = False
    call_prefix: str = "c"
    spacing_s: float = 1.0  # seconds between the agent's calls


_PATHS = {
    "anthropic_messages": ("api.anthropic.com", "/v1/messages"),
    "openai_chat": ("api.openai.com", "/v1/chat/completions"),
    "openai_responses": ("api.openai.com", "/v1/responses"),
}


def _tool_defs(agent: Agent) -> list[dict[str, Any]]:
    if agent.api == "anthropic_messages":
        return [{"name": n, "description": d, "input_schema": s} for n, d, s in agent.tools]
    if agent.api == "openai_chat":
        return [
            {"type": "function", "function": {"name": n, "description": d, "parameters": s}}
            for n, d, s in agent.tools
        ]
    return [
        {"type": "function", "name": n, "description": d, "parameters": s}
        for n, d, s in agent.tools
    ]


def _response(agent: Agent, k: int, step: Step) -> dict[str, Any]:
    ids = [f"{agent.call_prefix}{k}_{i}" for i in range(len(step.calls))]
    if agent.api == "anthropic_messages":
        content: list[dict[str, Any]] = []
        if step.reasoning:
            content.append({"type": "thinking", "thinking": step.reasoning, "signature": "s"})
        if step.text:
            content.append({"type": "text", "text": step.text})
        content += [
            {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": a}
            for i, (n, a) in zip(ids, step.calls, strict=True)
        ]
        return {
            "id": f"msg_{agent.call_prefix}{k}",
            "type": "message",
            "role": "assistant",
            "model": agent.model,
            "content": content,
            "stop_reason": "tool_use" if step.calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
    if agent.api == "openai_chat":
        message: dict[str, Any] = {"role": "assistant", "content": step.text, "refusal": None}
        if step.calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": n, "arguments": json.dumps(a)},
                }
                for i, (n, a) in zip(ids, step.calls, strict=True)
            ]
        return {
            "id": f"chatcmpl-{agent.call_prefix}{k}",
            "object": "chat.completion",
            "created": 1,
            "model": agent.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if step.calls else "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    output: list[dict[str, Any]] = []
    if step.reasoning:
        output.append(
            {
                "id": f"rs_{agent.call_prefix}{k}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": step.reasoning}],
            }
        )
    if step.text:
        output.append(
            {
                "id": f"msg_{agent.call_prefix}{k}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": step.text, "annotations": []}],
            }
        )
    output += [
        {
            "id": f"fc_{i}",
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_{i}",
            "name": n,
            "arguments": json.dumps(a),
        }
        for i, (n, a) in zip(ids, step.calls, strict=True)
    ]
    return {
        "id": f"resp_{agent.call_prefix}{k}",
        "object": "response",
        "status": "completed",
        "model": agent.model,
        "output": output,
        "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
    }


def _results(agent: Agent, response: dict[str, Any], step: Step) -> list[dict[str, Any]]:
    """The items a harness appends after running the step's tool calls."""
    if agent.api == "anthropic_messages":
        uses = [b for b in response["content"] if b["type"] == "tool_use"]
        blocks = []
        for use, (out, err) in zip(uses, step.results, strict=True):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": use["id"],
                "content": out,
            }
            if err:
                block["is_error"] = True
            blocks.append(block)
        return [{"role": "user", "content": blocks}] if blocks else []
    if agent.api == "openai_chat":
        calls = response["choices"][0]["message"].get("tool_calls") or []
        return [
            {"role": "tool", "tool_call_id": c["id"], "content": out}
            for c, (out, _err) in zip(calls, step.results, strict=True)
        ]
    calls = [o for o in response["output"] if o["type"] == "function_call"]
    return [
        {"type": "function_call_output", "call_id": c["call_id"], "output": out}
        for c, (out, _err) in zip(calls, step.results, strict=True)
    ]


def _with_cache_mark(items: list[Any]) -> list[Any]:
    """A copy of Anthropic messages with cache_control on the last block of the last one."""
    out = json.loads(json.dumps(items))
    last = out[-1]
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"]}]
    last["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return out


def record_agent(
    agent: Agent, start_s: float = 0.0, heads: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(calls rows, messages rows) of the agent's loop, one call per step."""
    host, path = _PATHS[agent.api]
    heads = {} if heads is None else heads
    if agent.api == "anthropic_messages":
        items: list[Any] = [{"role": "user", "content": agent.prompt}]
    elif agent.api == "openai_chat":
        items = [
            {"role": "system", "content": agent.system},
            {"role": "user", "content": agent.prompt},
        ]
    else:
        items = [{"role": "user", "content": [{"type": "input_text", "text": agent.prompt}]}]
    calls: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    new_items = list(items)
    previous: str | None = None
    for k, step in enumerate(agent.steps):
        body: dict[str, Any] = {"model": agent.model, "tools": _tool_defs(agent)}
        if agent.api == "anthropic_messages":
            sent = _with_cache_mark(items) if agent.move_cache_control else items
            body.update(system=agent.system, max_tokens=1000, messages=sent)
        elif agent.api == "openai_chat":
            body["messages"] = items
        else:
            body["instructions"] = agent.system
            if agent.previous_response_id and previous is not None:
                body.update(previous_response_id=previous, input=new_items)
            else:
                body["input"] = items
        response = _response(agent, k, step)
        t = T0.timestamp() + start_s + k * agent.spacing_s
        capture = Capture(
            call_id=f"{agent.rollout_id}-{agent.call_prefix}{k:03d}",
            run_id="run-1",
            transport="http",
            method="POST",
            scheme="https",
            host=host,
            path=path,
            started_at=t,
            ended_at=t + agent.spacing_s / 2,
            rollout_id=agent.rollout_id,
            request_headers=dict(agent.headers),
            request_body=json.dumps(body).encode(),
            status_code=200,
            response_headers={"content-type": "application/json"},
            response_body=json.dumps(response).encode(),
        )
        rows = build_rows(capture, heads.get)
        assert rows.call["parse_error"] is None, rows.call["parse_error"]
        if rows.call["response_id"]:
            heads[rows.call["response_id"]] = rows.call["response_head_hash"]
        calls.append(rows.call)
        messages += rows.messages
        previous = rows.call["response_id"]
        parsed = find_adapter("POST", path)
        assert parsed is not None
        output = parsed.parse_response(response).output_items
        results = _results(agent, response, step)
        # With previous_response_id the server holds the output: only results are new.
        new_items = results if agent.previous_response_id else output + results
        items = items + output + results
    return calls, messages


def write_agents(root: Path, agents: list[tuple[Agent, float]]) -> None:
    """Record each (agent, start second) and write one calls and one messages shard."""
    calls: list[dict[str, Any]] = []
    messages: dict[str, dict[str, Any]] = {}
    heads: dict[str, str] = {}
    for agent, start in agents:
        c, m = record_agent(agent, start, heads)
        calls += c
        for row in m:
            messages.setdefault(row["hash"], row)
    write_shard(root, "calls", "calls-0", calls)
    write_shard(root, "messages", "messages-0", list(messages.values()))
