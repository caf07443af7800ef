"""SFT exports: one example per agent chain, in the OpenAI chat ``messages`` + ``tools`` format.

The last call of each chain (``sft_chains``) holds the chain's whole conversation: its
content-addressed items from the first one to its response's last. They are converted
from the call's API (Anthropic Messages, Chat Completions, Responses) to OpenAI chat
messages: system, user, assistant (``content``, ``tool_calls`` with JSON-string
``arguments``, ``reasoning_content``), and ``tool`` messages (``tool_call_id``,
``name``). ``tools`` holds OpenAI function tools. The Parquet file loads with
``datasets.load_dataset("parquet", data_files=...)``; ``tools`` is an Arrow JSON column,
so ``datasets`` (4+) gives it as a list of dicts, ready for a chat template's ``tools``.

Not carried over: images and documents (replaced by "[image]" / "[document]"), server
tools (web search and code execution run by the provider) and their results, and
encrypted reasoning without a summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.atomic import atomic_file
from pipeline.canonical import resolve_refs
from pipeline.reconstruct import MissingRow
from pipeline.snapshot import TrajectoryFilter, select_rollouts
from pipeline.volatile import drop_system_block

logger = logging.getLogger(__name__)

Message = dict[str, Any]

TOOL_CALL = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("type", pa.string()),
        pa.field(
            "function",
            pa.struct([pa.field("name", pa.string()), pa.field("arguments", pa.string())]),
        ),
    ]
)
MESSAGE = pa.struct(
    [
        pa.field("role", pa.string()),
        pa.field("content", pa.string()),
        pa.field("reasoning_content", pa.string()),
        pa.field("tool_calls", pa.list_(TOOL_CALL)),
        pa.field("tool_call_id", pa.string()),
        pa.field("name", pa.string()),
    ]
)
SFT = pa.schema(
    [
        pa.field("messages", pa.list_(MESSAGE)),
        # OpenAI function tools, as JSON (datasets decodes it to a list of dicts).
        pa.field("tools", pa.json_()),
        pa.field("example_id", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string()),
        pa.field("task_id", pa.string()),
        pa.field("harness", pa.string()),
        pa.field("agent_key", pa.string()),
        pa.field("api", pa.string()),
        pa.field("model", pa.string()),
        pa.field("policy_version", pa.int64()),
        pa.field("reward", pa.float64()),
        pa.field("status", pa.string()),
        pa.field("n_messages", pa.int64()),
        pa.field("n_tool_calls", pa.int64()),
    ]
)

# ---------------------------------------------------------------------------------------
# Conversion to OpenAI chat messages (pure).


def _join(parts: Sequence[str]) -> str:
    return "\n\n".join(p for p in parts if p)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _text_of(content: Any) -> str:
    """Plain text of a content value: a string, or a list of text / image / file parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    parts: list[str] = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, str):
            parts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        elif kind in ("image", "image_url", "input_image"):
            parts.append("[image]")
        elif kind in ("document", "file", "input_file"):
            parts.append("[document]")
    return _join(parts)


def _assistant(
    content: str = "", tool_calls: list[dict[str, Any]] | None = None, reasoning: str = ""
) -> Message:
    message: Message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def _tool_call(call_id: Any, name: Any, arguments: str) -> dict[str, Any]:
    return {
        "id": str(call_id) if call_id is not None else None,
        "type": "function",
        "function": {"name": str(name), "arguments": arguments},
    }


def _system_text(system: Any) -> str:
    """The system prompt's text, without the blocks that are request attributes
    (``pipeline.volatile``: Claude Code's billing header)."""
    if isinstance(system, list):
        system = [
            b
            for b in system
            if not (
                isinstance(b, dict)
                and isinstance(b.get("text"), str)
                and drop_system_block(b["text"])
            )
        ]
    return _text_of(system)


def anthropic_messages(params: dict[str, Any], items: list[Any]) -> list[Message]:
    """Anthropic Messages ``system`` + ``messages`` as OpenAI chat messages."""
    out: list[Message] = []
    system = _system_text(params.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        role = item.get("role")
        content = item.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if role == "assistant":
            texts, reasoning, calls = [], [], []
            for b in blocks:
                kind = b.get("type") if isinstance(b, dict) else None
                if kind == "text":
                    texts.append(b.get("text") or "")
                elif kind == "thinking":
                    reasoning.append(b.get("thinking") or "")
                elif kind == "tool_use":
                    names[str(b.get("id"))] = str(b.get("name"))
                    calls.append(_tool_call(b.get("id"), b.get("name"), _dumps(b.get("input", {}))))
            out.append(_assistant(_join(texts), calls, _join(reasoning)))
            continue
        # user (or a system turn some clients send in messages)
        texts = []
        for b in blocks:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                text = _text_of(b.get("content"))
                tool_id = str(b.get("tool_use_id"))
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": tool_id,
                        "name": names.get(tool_id),
                        "content": text,
                    }
                )
            elif isinstance(b, dict) and b.get("type") in ("text", "image", "document"):
                texts.append(_text_of([b]))
        if texts:
            out.append({"role": "system" if role == "system" else "user", "content": _join(texts)})
    return out


def chat_messages(params: dict[str, Any], items: list[Any]) -> list[Message]:
    """Chat Completions messages, normalised: text content, developer as system."""
    out: list[Message] = []
    names: dict[str, str] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        role = item.get("role")
        if role == "assistant":
            calls = []
            for c in item.get("tool_calls") or []:
                fn = c.get(c.get("type", "function")) or c.get("function") or {}
                args = fn.get("arguments")
                arguments = args if isinstance(args, str) else _dumps(args or {})
                names[str(c.get("id"))] = str(fn.get("name"))
                calls.append(_tool_call(c.get("id"), fn.get("name"), arguments))
            legacy = item.get("function_call")
            if isinstance(legacy, dict):
                calls.append(_tool_call(None, legacy.get("name"), str(legacy.get("arguments"))))
            reasoning = item.get("reasoning_content") or item.get("reasoning") or ""
            out.append(
                _assistant(
                    _text_of(item.get("content")),
                    calls,
                    reasoning if isinstance(reasoning, str) else "",
                )
            )
        elif role in ("tool", "function"):
            tool_id = item.get("tool_call_id")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": tool_id,
                    "name": item.get("name") or names.get(str(tool_id)),
                    "content": _text_of(item.get("content")),
                }
            )
        else:
            out.append(
                {
                    "role": "system" if role in ("system", "developer") else "user",
                    "content": _text_of(item.get("content")),
                }
            )
    return out


_RESPONSES_CALLS = ("function_call", "custom_tool_call", "local_shell_call")
_RESPONSES_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def responses_messages(params: dict[str, Any], items: list[Any]) -> list[Message]:
    """Responses ``instructions`` + ``input`` (and output items) as OpenAI chat messages.

    Reasoning, text and tool calls that follow one another form one assistant message.
    """
    out: list[Message] = []
    instructions = _text_of(params.get("instructions"))
    if instructions:
        out.append({"role": "system", "content": instructions})
    names: dict[str, str] = {}
    open_turn: Message | None = None  # the assistant message being built
    reasoning: list[str] = []

    def turn() -> Message:
        nonlocal open_turn
        if open_turn is None:
            open_turn = _assistant()
            out.append(open_turn)
        return open_turn

    def close() -> None:
        nonlocal open_turn
        if reasoning and open_turn is None:
            turn()
        if reasoning and open_turn is not None:
            open_turn["reasoning_content"] = _join(
                [open_turn.get("reasoning_content", ""), *reasoning]
            )
        reasoning.clear()
        open_turn = None

    for item in items:
        if isinstance(item, str):  # a bare-string input
            close()
            out.append({"role": "user", "content": item})
            continue
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "reasoning":
            summary = item.get("summary") or []
            reasoning.append(_text_of(summary) if isinstance(summary, list) else "")
        elif kind == "message" and item.get("role") == "assistant":
            message = turn()
            message["content"] = _join([message["content"], _text_of(item.get("content"))])
        elif kind in _RESPONSES_CALLS:
            call_id = item.get("call_id")
            if kind == "function_call":
                name, arguments = item.get("name"), str(item.get("arguments") or "{}")
            elif kind == "custom_tool_call":
                name, arguments = item.get("name"), _dumps({"input": item.get("input", "")})
            else:
                name, arguments = "local_shell", _dumps(item.get("action") or {})
            names[str(call_id)] = str(name)
            turn().setdefault("tool_calls", []).append(_tool_call(call_id, name, arguments))
        elif kind in _RESPONSES_OUTPUTS:
            close()
            output = item.get("output")
            call_id = item.get("call_id")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "name": names.get(str(call_id)),
                    "content": output if isinstance(output, str) else _text_of(output),
                }
            )
        elif kind == "message":
            close()
            role = item.get("role")
            out.append(
                {
                    "role": "system" if role in ("system", "developer") else "user",
                    "content": _text_of(item.get("content")),
                }
            )
        # web_search_call, item_reference and other server-side items are not messages.
    close()
    return out


def _open_namespaces(tools: list[Any]) -> list[Any]:
    out: list[Any] = []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            out += _open_namespaces(list(tool.get("tools") or []))
        else:
            out.append(tool)
    return out


def openai_tools(api: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's client tools as OpenAI function tools (server tools left out)."""
    tools = params.get("tools") or []
    if api == "openai_responses":  # a namespace's tools (Codex's collaboration) are tools
        tools = _open_namespaces(tools if isinstance(tools, list) else [])
    out: list[dict[str, Any]] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        fn: dict[str, Any] | None = None
        if api == "anthropic_messages":
            if "input_schema" in tool:
                fn = {
                    "name": tool.get("name"),
                    "description": tool.get("description", ""),
                    "parameters": tool["input_schema"],
                }
        elif api == "openai_chat":
            if tool.get("type", "function") == "function" and isinstance(
                tool.get("function"), dict
            ):
                fn = dict(tool["function"])
        elif tool.get("type") == "function":
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        elif tool.get("type") == "custom":
            fn = {
                "name": tool.get("name"),
                "description": tool.get("description", ""),
                "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "string"}},
                    "required": ["input"],
                },
            }
        if fn is not None and fn.get("name"):
            out.append({"type": "function", "function": fn})
    if api == "openai_chat":  # the legacy `functions` parameter
        for legacy in params.get("functions") or []:
            if isinstance(legacy, dict) and legacy.get("name"):
                out.append({"type": "function", "function": dict(legacy)})
    return out


CONVERTERS = {
    "anthropic_messages": anthropic_messages,
    "openai_chat": chat_messages,
    "openai_responses": responses_messages,
}


def to_openai(
    api: str, params: dict[str, Any], items: list[Any]
) -> tuple[list[Message], list[dict[str, Any]]]:
    """(messages, tools) in the OpenAI chat format for a conversation of ``api``."""
    if api not in CONVERTERS:
        raise ValueError(f"no converter for api {api!r}; known: {', '.join(CONVERTERS)}")
    return CONVERTERS[api](params, items), openai_tools(api, params)


# ---------------------------------------------------------------------------------------
# Reading chains from the store.

_LEAVES = """
SELECT call_id, rollout_id, agent_key, api, model, policy_version, task_id, harness,
    status, reward
FROM sft_chains
WHERE $all OR rollout_id IN (SELECT rollout_id FROM _forge_export_rollouts)
ORDER BY rollout_id, started_at, call_id
"""
_POINTERS = """
SELECT c.call_id, c.request_params_hash, c.response_head_hash
FROM calls AS c
WHERE c.call_id IN (SELECT call_id FROM _forge_export_calls)
"""
_ROWS_OF_ROLLOUTS = """
SELECT m.hash, any_value(m.parent_hash), any_value(m.content_json)
FROM messages AS m
JOIN calls AS c ON c.call_id = m.first_call_id
WHERE c.rollout_id IN (SELECT rollout_id FROM _forge_export_rollouts)
GROUP BY m.hash
"""
_ROWS_BY_HASH = """
SELECT hash, any_value(parent_hash), any_value(content_json)
FROM messages
WHERE hash IN (SELECT unnest($hashes))
GROUP BY hash
"""


class _Items:
    """hash -> (parent_hash, content_json), loaded per rollout and fetched on a miss
    (items another rollout stored first: the shared start of GRPO siblings)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.rows: dict[str, tuple[str | None, str]] = {}

    def load_rollouts(self) -> None:
        for h, parent, content in self.con.sql(_ROWS_OF_ROLLOUTS).fetchall():
            self.rows[h] = (parent, content)

    def get(self, h: str) -> tuple[str | None, str]:
        if h not in self.rows:
            for key, parent, content in self.con.sql(
                _ROWS_BY_HASH, params={"hashes": [h]}
            ).fetchall():
                self.rows[key] = (parent, content)
        if h not in self.rows:
            raise MissingRow(f"no messages row {h!r}")
        return self.rows[h]

    def chain(self, head: str) -> list[Any]:
        """Every item of the chain ending at ``head``, oldest first."""
        out: list[Any] = []
        h: str | None = head
        seen: set[str] = set()
        while h is not None:
            if h in seen:
                raise MissingRow(f"chain loops at {h!r}")
            seen.add(h)
            parent, content = self.get(h)
            out.append(json.loads(content))
            h = parent
        out.reverse()
        return out

    def params(self, h: str) -> dict[str, Any]:
        value = resolve_refs(json.loads(self.get(h)[1]), lambda r: json.loads(self.get(r)[1]))
        return value if isinstance(value, dict) else {}


@dataclass
class ExportResult:
    path: Path
    rows: int
    skipped: int


def iter_sft_examples(
    con: duckdb.DuckDBPyConnection,
    filters: TrajectoryFilter | None = None,
    skipped: list[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """SFT examples (rows of ``SFT``) for the chains of the rollouts the filter keeps;
    the ids of chains that cannot be rebuilt are appended to ``skipped``."""
    skipped = [] if skipped is None else skipped
    filters = filters or TrajectoryFilter()
    rollouts = None if filters.empty else select_rollouts(con, filters)
    con.register(
        "_forge_export_rollouts", pa.table({"rollout_id": pa.array(rollouts or [], pa.string())})
    )
    try:
        leaves = con.sql(_LEAVES, params={"all": rollouts is None}).fetchall()
        columns = ["call_id", "rollout_id", "agent_key", "api", "model", "policy_version",
                   "task_id", "harness", "status", "reward"]  # fmt: skip
        chains = [dict(zip(columns, row, strict=True)) for row in leaves]
        if rollouts is None:  # item rows are loaded per rollout: those with chains
            con.unregister("_forge_export_rollouts")
            kept = sorted({c["rollout_id"] for c in chains if c["rollout_id"] is not None})
            con.register(
                "_forge_export_rollouts", pa.table({"rollout_id": pa.array(kept, pa.string())})
            )
        con.register(
            "_forge_export_calls",
            pa.table({"call_id": pa.array([c["call_id"] for c in chains], pa.string())}),
        )
        pointers = {r[0]: (r[1], r[2]) for r in con.sql(_POINTERS).fetchall()}
        items = _Items(con)
        items.load_rollouts()
        for chain in chains:
            params_hash, head = pointers[chain["call_id"]]
            try:
                conversation = items.chain(head)
                params = items.params(params_hash) if params_hash else {}
            except MissingRow as e:
                logger.warning("call %s left out: %s", chain["call_id"], e)
                skipped.append(chain["call_id"])
                continue
            messages, tools = to_openai(chain["api"], params, conversation)
            if not messages or messages[-1]["role"] != "assistant":
                logger.warning(
                    "call %s left out: it ends without an assistant message", chain["call_id"]
                )
                skipped.append(chain["call_id"])
                continue
            yield {
                "messages": messages,
                "tools": _dumps(tools),
                "example_id": chain["call_id"],
                **{k: chain[k] for k in columns if k != "call_id"},
                "n_messages": len(messages),
                "n_tool_calls": sum(len(m.get("tool_calls") or []) for m in messages),
            }
    finally:
        for name in ("_forge_export_rollouts", "_forge_export_calls"):
            with contextlib.suppress(duckdb.Error):
                con.unregister(name)


def write_sft(
    con: duckdb.DuckDBPyConnection, out: str | Path, filters: TrajectoryFilter | None = None
) -> ExportResult:
    """Write the SFT examples to the Parquet file ``out`` (replaced atomically)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    skipped: list[str] = []
    with (
        atomic_file(out, sync_dir=False) as f,
        pq.ParquetWriter(f, SFT, compression="zstd") as writer,
    ):
        batch: list[dict[str, Any]] = []
        for example in iter_sft_examples(con, filters, skipped):
            batch.append(example)
            if len(batch) >= 256:
                writer.write_table(pa.Table.from_pylist(batch, schema=SFT))
                rows += len(batch)
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=SFT))
            rows += len(batch)
    return ExportResult(path=out, rows=rows, skipped=len(skipped))
