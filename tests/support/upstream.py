"""Scripted stand-in for the LLM providers, speaking their real wire formats.

No real LLM is reachable from the test machines, so tests point SDKs, curl and
real harness CLIs (through the Forge proxy) at this server instead. It answers

* Anthropic Messages: ``POST /v1/messages`` (``?beta=true`` too), JSON or SSE,
  ``POST /v1/messages/count_tokens``;
* OpenAI Chat Completions: ``POST /v1/chat/completions``, JSON or SSE;
* OpenAI Responses: ``POST /v1/responses`` (JSON or SSE), ``GET /v1/responses``
  upgraded to a WebSocket (``response.create`` messages), ``GET
  /v1/responses/{id}``; the same under ``/backend-api/codex/responses``;
* ``GET /v1/models`` (OpenAI or Anthropic shape, chosen by the request headers);
* anything else: 404 with the provider's error body.

Paths are also accepted without the ``/v1`` prefix. Request bodies may be
compressed (``Content-Encoding``: zstd, gzip, br, deflate).

The reply is decided from the request alone, never from a global counter, so
that the side calls real harnesses make (titles, topic checks, quota probes) do
not shift the script: turn number = number of tool results already in the
conversation (a parallel turn with k tool calls consumes k results), the last
turn repeating. A script turn is one of::

    "plain text"
    {"text": "Done."}
    {"tool_call": {"name": "shell", "arguments": {"command": ["bash", "-lc", "ls"]}}}
    {"tool_call": {"by_tool": {"Bash": {"command": "ls"}, "shell": {"command": ["ls"]}}}}
    {"text": "Let me look.", "tool_calls": [{...}, {...}]}     # parallel calls

A tool call whose name the request does not offer is adapted: first ``by_tool``
(first entry whose tool the request offers), then the ``tool_mapper`` hook, then
a built-in mapping of shell commands onto the shell tools real harnesses offer
(Claude Code ``Bash``, Codex ``shell`` / ``shell_command`` / ``exec_command`` /
``local_shell``), else the scripted name is used as is. A request that offers
no tools (a side call) gets ``side_text`` when the turn is a tool call.

Usage::

    with ScriptedUpstream([{"text": "hi"}]) as up:
        anthropic.Anthropic(base_url=up.base_url, api_key="sk-test")
        openai.OpenAI(base_url=up.openai_base_url, api_key="sk-test")
        up.received  # every request, decoded

Standalone (for manual runs of real harnesses)::

    python -m tests.support.upstream --port 8765 --script script.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import io
import itertools
import json
import re
import secrets
import shlex
import socket
import string
import struct
import sys
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import brotli
import zstandard
from aiohttp import WSMsgType, web

__all__ = [
    "Conversation",
    "Fault",
    "OfferedTool",
    "ReceivedRequest",
    "Reply",
    "ResolvedCall",
    "ScriptedUpstream",
    "ToolCallSpec",
    "Turn",
    "count_tokens",
    "decode_body",
    "parse_turn",
    "select_turn",
]

HOST = "127.0.0.1"
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_WS_MESSAGES = 10_000
MAX_STORED_RESPONSES = 2_000
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"

Api = Literal["anthropic_messages", "openai_chat", "openai_responses"]
Transport = Literal["http", "sse", "websocket"]
FaultKind = Literal[
    "status",
    "reset_mid_stream",
    "stall_mid_stream",
    "invalid_json",
    "close_after_last_event",
    "error_event",
]

DEFAULT_OPENAI_MODELS = ("gpt-5", "gpt-5-codex", "gpt-4.1", "gpt-4o-mini")
DEFAULT_ANTHROPIC_MODELS = (
    "claude-sonnet-4-5-20250929",
    "claude-haiku-4-5-20251001",
    "claude-opus-4-1-20250805",
)


# --------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class Fault:
    """A failure to inject into model calls (messages, chat, responses; HTTP and WebSocket).

    kind:
      ``status``: reply ``status`` with the provider's error JSON (over a WebSocket: a
        wrapped ``{"type": "error", "status": ...}`` event, as the real server sends).
      ``reset_mid_stream``: send ``after_events`` events, then reset the TCP connection
        (RST). Non-stream replies are reset before any byte is sent.
      ``stall_mid_stream``: send ``after_events`` events, sleep ``stall_s``, then go on.
      ``invalid_json``: event number ``after_events`` carries truncated JSON; a non-stream
        reply is a truncated JSON body with status 200.
      ``close_after_last_event``: send every event, then close the connection without the
        chunked terminator (WebSocket: close right after the last event).
      ``error_event``: send ``after_events`` events, then the provider's in-stream error
        event (Anthropic ``event: error``, Chat ``data: {"error": ...}``, Responses
        ``response.failed``) and end the stream. Non-stream replies behave as ``status``.
    times: apply to the first ``times`` matching model calls only (None: all of them).
    match: optional predicate over the received request choosing which calls fail.
    """

    kind: FaultKind
    status: int = 500
    after_events: int = 2
    stall_s: float = 5.0
    times: int | None = None
    match: Callable[[ReceivedRequest], bool] | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FaultKind.__args__:  # type: ignore[attr-defined]
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if not 0 <= self.stall_s <= 3600:
            raise ValueError("stall_s must be within [0, 3600]")
        if self.after_events < 0:
            raise ValueError("after_events must be >= 0")


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as the upstream received it.

    Over a WebSocket each client message is one record (method GET, the upgrade's path and
    headers, ``body`` the decoded message including its ``"type"``, ``connection_id`` the
    socket's number); the upgrade itself is not recorded.
    """

    method: str
    path: str
    query: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # decoded JSON, or the (decompressed) raw bytes when not JSON, None if empty
    raw_body: bytes  # as it came on the wire (still compressed)
    transport: Transport
    api: str | None  # anthropic_messages, openai_chat, openai_responses, ... or None
    content_encoding: str | None = None
    connection_id: int | None = None  # WebSocket connection number
    received_at: float = field(default_factory=time.time)

    @property
    def path_qs(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path


@dataclass(frozen=True)
class ToolCallSpec:
    name: str | None
    arguments: Any = None  # dict (JSON arguments) or str (custom tool input)
    by_tool: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Turn:
    text: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()


@dataclass(frozen=True)
class OfferedTool:
    name: str
    kind: str  # "function", "custom", "local_shell", or a server tool's type
    spec: Mapping[str, Any]
    # Responses tools grouped in a ``{"type": "namespace"}`` tool (Codex's
    # ``collaboration`` namespace holds spawn_agent, wait_agent, ...): the namespace's
    # name, which a call to the tool must carry.
    namespace: str | None = None


@dataclass(frozen=True)
class Conversation:
    """What the script hooks see of one model call."""

    api: Api
    body: Mapping[str, Any]
    tools: tuple[OfferedTool, ...]
    tool_results: int
    history: tuple[Any, ...]  # messages (Anthropic, Chat) or resolved input items (Responses)
    transport: Transport

    def offers(self, name: str) -> bool:
        return any(t.name == name for t in self.tools)


@dataclass(frozen=True)
class ResolvedCall:
    name: str
    kind: str
    arguments: Any
    namespace: str | None = None


@dataclass(frozen=True)
class Reply:
    text: str | None
    calls: tuple[ResolvedCall, ...] = ()


Script = Sequence[Any] | Callable[[Conversation], Any]
ToolMapper = Callable[[ToolCallSpec, Conversation], "tuple[str, Any] | None"]


# --------------------------------------------------------------------------- script logic


def parse_turn(obj: Any) -> Turn:
    """Turn a script entry (str, dict or Turn) into a Turn."""
    if isinstance(obj, Turn):
        return obj
    if isinstance(obj, str):
        return Turn(text=obj)
    if not isinstance(obj, Mapping):
        raise TypeError(f"script turn must be str or dict, got {type(obj).__name__}")
    unknown = set(obj) - {"text", "tool_call", "tool_calls"}
    if unknown:
        raise ValueError(f"unknown script turn keys: {sorted(unknown)}")
    raw_calls: list[Any] = []
    if obj.get("tool_call") is not None:
        raw_calls.append(obj["tool_call"])
    raw_calls.extend(obj.get("tool_calls") or [])
    calls = []
    for c in raw_calls:
        if not isinstance(c, Mapping):
            raise TypeError("tool_call must be a dict")
        name, by_tool = c.get("name"), c.get("by_tool")
        if name is None and not by_tool:
            raise ValueError("tool_call needs a name or by_tool")
        args = c.get("arguments", c.get("input"))
        calls.append(ToolCallSpec(name=name, arguments={} if args is None else args,
                                  by_tool=dict(by_tool) if by_tool else None))
    text = obj.get("text")
    if text is None and not calls:
        raise ValueError("script turn needs text or a tool call")
    return Turn(text=text, tool_calls=tuple(calls))


def select_turn(turns: Sequence[Turn], tool_results: int) -> Turn:
    """Script turn for a conversation already holding ``tool_results`` tool results."""
    if not turns:
        return Turn(text="OK")
    consumed = 0
    for turn in turns:
        k = len(turn.tool_calls)
        if k == 0 or consumed + k > tool_results:
            return turn
        consumed += k
    return turns[-1]


def _command_of(args: Any) -> tuple[list[str], str] | None:
    """(argv, shell string) of a shell-like argument dict, or None."""
    if not isinstance(args, Mapping):
        return None
    cmd = args.get("command", args.get("cmd"))
    if isinstance(cmd, str):
        return ["bash", "-lc", cmd], cmd
    if isinstance(cmd, list) and cmd and all(isinstance(p, str) for p in cmd):
        if (len(cmd) == 3 and cmd[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh")
                and cmd[1] in ("-lc", "-c")):
            return list(cmd), cmd[2]
        return list(cmd), shlex.join(cmd)
    return None


def _local_shell_action(argv: list[str]) -> dict[str, Any]:
    return {"type": "exec", "command": argv, "env": {}, "timeout_ms": None,
            "user": None, "working_directory": None}


# Shell tools of real harnesses: name -> builder(argv, shell string) of its arguments.
SHELL_TOOL_ADAPTERS: dict[str, Callable[[list[str], str], Any]] = {
    "Bash": lambda argv, s: {"command": s, "description": "Run shell command"},
    "bash": lambda argv, s: {"command": s},
    "exec_command": lambda argv, s: {"cmd": s},
    "shell_command": lambda argv, s: {"command": s},
    "shell": lambda argv, s: {"command": argv},
    "container.exec": lambda argv, s: {"command": argv},
    "local_shell": lambda argv, s: _local_shell_action(argv),
}


def _adapt_arguments(args: Any, kind: str) -> Any:
    if kind == "custom":
        if isinstance(args, str):
            return args
        if isinstance(args, Mapping) and isinstance(args.get("input"), str) and len(args) == 1:
            return args["input"]
        return json.dumps(args)
    if kind == "local_shell":
        if isinstance(args, Mapping) and args.get("type") == "exec":
            return dict(args)
        cmd = _command_of(args)
        return _local_shell_action(cmd[0] if cmd else ["true"])
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            return {"input": args}
        return parsed if isinstance(parsed, dict) else {"input": parsed}
    return dict(args) if isinstance(args, Mapping) else {"input": args}


def resolve_call(spec: ToolCallSpec, conv: Conversation,
                 tool_mapper: ToolMapper | None = None) -> ResolvedCall:
    offered = {t.name: t for t in conv.tools}
    if spec.name is not None and spec.name in offered:
        kind = offered[spec.name].kind
        return ResolvedCall(spec.name, kind, _adapt_arguments(spec.arguments, kind),
                            offered[spec.name].namespace)
    for name, args in (spec.by_tool or {}).items():
        if name in offered:
            kind = offered[name].kind
            return ResolvedCall(name, kind, _adapt_arguments(args, kind), offered[name].namespace)
    if tool_mapper is not None:
        mapped = tool_mapper(spec, conv)
        if mapped is not None:
            name, args = mapped
            kind = offered[name].kind if name in offered else "function"
            return ResolvedCall(name, kind, _adapt_arguments(args, kind))
    candidates = [spec.arguments, *(spec.by_tool or {}).values()]
    cmd = next((c for c in map(_command_of, candidates) if c is not None), None)
    if cmd is not None:
        for tool in conv.tools:
            adapter = SHELL_TOOL_ADAPTERS.get(tool.name)
            if tool.kind == "local_shell":
                adapter = SHELL_TOOL_ADAPTERS["local_shell"]
            if adapter is not None:
                return ResolvedCall(tool.name, tool.kind,
                                    _adapt_arguments(adapter(*cmd), tool.kind))
    if spec.name is not None:
        return ResolvedCall(spec.name, "function", _adapt_arguments(spec.arguments, "function"))
    name, args = next(iter((spec.by_tool or {}).items()))
    return ResolvedCall(name, "function", _adapt_arguments(args, "function"))


def decide_reply(script: Script, conv: Conversation, *, side_text: str,
                 tool_mapper: ToolMapper | None) -> Reply:
    if callable(script):
        turn = parse_turn(script(conv))
    else:
        turn = select_turn([parse_turn(t) for t in script], conv.tool_results)
    if not conv.tools:
        if turn.tool_calls:
            return Reply(text=side_text)
        return Reply(text=turn.text or side_text)
    calls = tuple(resolve_call(c, conv, tool_mapper) for c in turn.tool_calls)
    return Reply(text=turn.text or None, calls=calls)


# --------------------------------------------------------------------------- small helpers

_B62 = string.digits + string.ascii_letters
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def _b62(n: int) -> str:
    return "".join(secrets.choice(_B62) for _ in range(n))


def _hex(n: int) -> str:
    return secrets.token_hex((n + 1) // 2)[:n]


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def count_tokens(obj: Any) -> int:
    """Crude token count: words and punctuation in every string of a JSON value."""
    total = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(_TOKEN_RE.findall(item))
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def _split_text(text: str) -> list[str]:
    pieces = re.findall(r"\s*\S+", text)
    tail = text[len("".join(pieces)):]
    if tail:
        if pieces:
            pieces[-1] += tail
        else:
            pieces = [tail]
    return pieces


def _split_json(s: str, size: int = 10) -> list[str]:
    return [s[i:i + size] for i in range(0, len(s), size)] or [""]


def _obfuscation(piece: str) -> str:
    return _b62(max(1, 16 - len(piece) % 16))


def decode_body(raw: bytes, content_encoding: str | None,
                limit: int = MAX_BODY_BYTES) -> bytes:
    """Undo a request's Content-Encoding (zstd, gzip, br, deflate; several, comma-separated)."""
    encodings = [e.strip().lower() for e in (content_encoding or "").split(",") if e.strip()]
    data = raw
    for enc in reversed(encodings):
        if enc == "identity":
            continue
        if enc in ("gzip", "x-gzip"):
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            data = d.decompress(data, limit + 1)
        elif enc == "deflate":
            try:
                data = zlib.decompressobj(zlib.MAX_WBITS).decompress(data, limit + 1)
            except zlib.error:
                data = zlib.decompressobj(-zlib.MAX_WBITS).decompress(data, limit + 1)
        elif enc == "br":
            data = brotli.decompress(data)
        elif enc == "zstd":
            reader = zstandard.ZstdDecompressor().stream_reader(
                io.BytesIO(data), read_across_frames=True)
            out = bytearray()
            while len(out) <= limit:
                chunk = reader.read(1 << 20)
                if not chunk:
                    break
                out += chunk
            data = bytes(out)
        else:
            raise ValueError(f"unsupported content-encoding {enc!r}")
        if len(data) > limit:
            raise ValueError("decompressed body too large")
    return data


# --------------------------------------------------------------------------- errors


_ANTHROPIC_ERROR_TYPES = {
    400: ("invalid_request_error", "Invalid request"),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Permission denied"),
    404: ("not_found_error", "Not found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Rate limited"),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}

_OPENAI_ERROR_TYPES = {
    400: ("invalid_request_error", None, "Invalid request"),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    404: ("invalid_request_error", None, "Not found"),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached."),
    500: ("server_error", None,
          "The server had an error while processing your request. Sorry about that!"),
    503: ("server_error", None, "The engine is currently overloaded, please try again later"),
}


def anthropic_error(status: int, message: str | None = None,
                    request_id: str | None = None) -> dict[str, Any]:
    etype, default = _ANTHROPIC_ERROR_TYPES.get(
        status, ("api_error" if status >= 500 else "invalid_request_error", "Error"))
    body: dict[str, Any] = {"type": "error",
                            "error": {"type": etype, "message": message or default}}
    if request_id:
        body["request_id"] = request_id
    return body


def openai_error(status: int, message: str | None = None, code: str | None = None,
                 param: str | None = None) -> dict[str, Any]:
    etype, default_code, default = _OPENAI_ERROR_TYPES.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None, "Error"))
    return {"error": {"message": message or default, "type": etype, "param": param,
                      "code": code or default_code}}


# --------------------------------------------------------------------------- per-API views


def _anthropic_conversation(body: Mapping[str, Any], transport: Transport) -> Conversation:
    tools = []
    for t in body.get("tools") or []:
        if isinstance(t, Mapping) and isinstance(t.get("name"), str):
            ttype = t.get("type")
            kind = "function" if ttype in (None, "custom") or "input_schema" in t else str(ttype)
            tools.append(OfferedTool(t["name"], kind, t))
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    results = 0
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), list):
            results += sum(1 for b in m["content"]
                           if isinstance(b, Mapping) and b.get("type") == "tool_result")
    return Conversation("anthropic_messages", body, tuple(tools), results, tuple(messages),
                        transport)


def _chat_conversation(body: Mapping[str, Any], transport: Transport) -> Conversation:
    tools = []
    for t in body.get("tools") or []:
        if not isinstance(t, Mapping):
            continue
        if t.get("type") == "function" and isinstance(t.get("function"), Mapping):
            tools.append(OfferedTool(str(t["function"].get("name")), "function", t))
        elif t.get("type") == "custom" and isinstance(t.get("custom"), Mapping):
            tools.append(OfferedTool(str(t["custom"].get("name")), "custom", t))
    for f in body.get("functions") or []:  # legacy
        if isinstance(f, Mapping) and isinstance(f.get("name"), str):
            tools.append(OfferedTool(f["name"], "function", f))
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    results = sum(1 for m in messages if m.get("role") in ("tool", "function"))
    return Conversation("openai_chat", body, tuple(tools), results, tuple(messages), transport)


def _responses_input_items(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return list(value)
    return [value]


def _responses_conversation(body: Mapping[str, Any], history: list[Any],
                            transport: Transport) -> Conversation:
    tools = []
    for t in body.get("tools") or []:
        if not isinstance(t, Mapping):
            continue
        ttype = str(t.get("type", "function"))
        if ttype == "local_shell":
            tools.append(OfferedTool("local_shell", "local_shell", t))
        elif ttype in ("function", "custom"):
            tools.append(OfferedTool(str(t.get("name")), ttype, t))
        else:
            tools.append(OfferedTool(str(t.get("name") or ttype), ttype, t))
        if ttype == "namespace":
            for inner in t.get("tools") or []:
                if isinstance(inner, Mapping) and isinstance(inner.get("name"), str):
                    tools.append(OfferedTool(inner["name"], str(inner.get("type", "function")),
                                             inner, namespace=str(t.get("name"))))
    results = sum(1 for it in history if isinstance(it, Mapping)
                  and str(it.get("type", "")).endswith("_call_output"))
    return Conversation("openai_responses", body, tuple(tools), results, tuple(history),
                        transport)


# --------------------------------------------------------------------------- Anthropic shapes


def _anthropic_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def build_anthropic_message(reply: Reply, model: str, input_tokens: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for c in reply.calls:
        content.append({"type": "tool_use", "id": "toolu_01" + _b62(22), "name": c.name,
                        "input": c.arguments if isinstance(c.arguments, dict)
                        else _adapt_arguments(c.arguments, "function")})
    return {
        "id": "msg_01" + _b62(22),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.calls else "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(input_tokens, max(1, count_tokens(content))),
    }


def anthropic_stream_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events (name, data) the real API sends for ``message``."""
    usage = message["usage"]
    start = dict(message, content=[], stop_reason=None, stop_sequence=None,
                 usage=dict(usage, output_tokens=1))
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            head: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _split_text(block["text"])]
        else:
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                {"type": "input_json_delta", "partial_json": p}
                for p in _split_json(_compact(block["input"]))]
        events.append(("content_block_start",
                       {"type": "content_block_start", "index": i, "content_block": head}))
        if i == 0:
            events.append(("ping", {"type": "ping"}))
        for d in deltas:
            events.append(("content_block_delta",
                           {"type": "content_block_delta", "index": i, "delta": d}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    if not message["content"]:
        events.append(("ping", {"type": "ping"}))
    events.append(("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": {"input_tokens": usage["input_tokens"],
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": usage["output_tokens"]},
    }))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


# --------------------------------------------------------------------------- OpenAI Chat shapes


def _chat_usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }


def build_chat_completion(reply: Reply, model: str, prompt_tokens: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None,
                               "refusal": None, "annotations": []}
    if reply.calls:
        calls = []
        for c in reply.calls:
            if c.kind == "custom":
                calls.append({"id": "call_" + _b62(24), "type": "custom",
                              "custom": {"name": c.name, "input": c.arguments}})
            else:
                args = c.arguments if isinstance(c.arguments, str) else _compact(c.arguments)
                calls.append({"id": "call_" + _b62(24), "type": "function",
                              "function": {"name": c.name, "arguments": args}})
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + _b62(29),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if reply.calls else "stop"}],
        "usage": _chat_usage(prompt_tokens, max(1, count_tokens(message))),
        "service_tier": "default",
        "system_fingerprint": "fp_" + _hex(10),
    }


def chat_stream_chunks(completion: Mapping[str, Any], *, include_usage: bool,
                       obfuscation: bool) -> list[dict[str, Any]]:
    """The ``data:`` chunks (without the final ``[DONE]``) the real API sends."""
    base = {k: completion[k] for k in ("id", "created", "model", "service_tier",
                                       "system_fingerprint")}
    base = {"id": base["id"], "object": "chat.completion.chunk", **base}
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        c = dict(base, choices=[{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish}])
        if include_usage:
            c["usage"] = None
        if obfuscation:
            c["obfuscation"] = _obfuscation(_compact(delta))
        return c

    calls = message.get("tool_calls") or []
    text = message.get("content")
    chunks: list[dict[str, Any]] = []
    first: dict[str, Any] = {"role": "assistant", "content": "" if text else None,
                             "refusal": None}

    def call_head(i: int, c: Mapping[str, Any]) -> dict[str, Any]:
        if c["type"] == "custom":
            return {"index": i, "id": c["id"], "type": "custom",
                    "custom": {"name": c["custom"]["name"], "input": ""}}
        return {"index": i, "id": c["id"], "type": "function",
                "function": {"name": c["function"]["name"], "arguments": ""}}

    if text:
        chunks.append(chunk(first))
        chunks.extend(chunk({"content": p}) for p in _split_text(text))
    for i, c in enumerate(calls):
        if i == 0 and not text:
            chunks.append(chunk(dict(first, tool_calls=[call_head(i, c)])))
        else:
            chunks.append(chunk({"tool_calls": [call_head(i, c)]}))
        if c["type"] == "custom":
            for p in _split_json(c["custom"]["input"]):
                chunks.append(chunk({"tool_calls": [{"index": i, "custom": {"input": p}}]}))
        else:
            for p in _split_json(c["function"]["arguments"]):
                chunks.append(chunk({"tool_calls": [{"index": i,
                                                     "function": {"arguments": p}}]}))
    if not text and not calls:
        chunks.append(chunk(first))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        last = dict(base, choices=[], usage=completion["usage"])
        if obfuscation:
            last["obfuscation"] = _b62(8)
        chunks.append(last)
    return chunks


# --------------------------------------------------------------------------- Responses shapes


def _responses_usage(inp: int, out: int) -> dict[str, Any]:
    return {"input_tokens": inp,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": inp + out}


def build_response(body: Mapping[str, Any], reply: Reply | None,
                   input_tokens: int) -> dict[str, Any]:
    """A completed Response object; ``reply`` None gives an empty output (``generate: false``)."""
    output: list[dict[str, Any]] = []
    if reply is not None and reply.text:
        output.append({"id": "msg_" + _hex(48), "type": "message", "status": "completed",
                       "content": [{"type": "output_text", "annotations": [], "logprobs": [],
                                    "text": reply.text}],
                       "role": "assistant"})
    for c in reply.calls if reply is not None else ():
        call_id = "call_" + _b62(24)
        if c.kind == "custom":
            output.append({"id": "ctc_" + _hex(48), "type": "custom_tool_call",
                           "status": "completed", "call_id": call_id, "input": c.arguments,
                           "name": c.name})
        elif c.kind == "local_shell":
            output.append({"id": "lsh_" + _hex(48), "type": "local_shell_call",
                           "status": "completed", "call_id": call_id, "action": c.arguments})
        else:
            args = c.arguments if isinstance(c.arguments, str) else _compact(c.arguments)
            item = {"id": "fc_" + _hex(48), "type": "function_call", "status": "completed",
                    "arguments": args, "call_id": call_id, "name": c.name}
            if c.namespace is not None:
                item["namespace"] = c.namespace
            output.append(item)
    reasoning_raw, text_raw = body.get("reasoning"), body.get("text")
    reasoning: Mapping[str, Any] = reasoning_raw if isinstance(reasoning_raw, Mapping) else {}
    text_cfg: Mapping[str, Any] = text_raw if isinstance(text_raw, Mapping) else {}
    now = int(time.time())
    return {
        "id": "resp_" + _hex(48),
        "object": "response",
        "created_at": now,
        "status": "completed",
        "background": False,
        "completed_at": now,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": body.get("model") or "gpt-5",
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": text_cfg.get("format") or {"type": "text"},
                 "verbosity": text_cfg.get("verbosity") or "medium"},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": list(body.get("tools") or []),
        "top_logprobs": body.get("top_logprobs", 0),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": _responses_usage(input_tokens, count_tokens(output)),
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def responses_stream_events(response: Mapping[str, Any], *,
                            obfuscation: bool) -> list[dict[str, Any]]:
    """The events (SSE data / WebSocket messages) the real API sends for ``response``."""
    events: list[dict[str, Any]] = []

    def emit(etype: str, **fields: Any) -> None:
        events.append({"type": etype, "sequence_number": len(events), **fields})

    pending = dict(response, status="in_progress", output=[], usage=None, completed_at=None)
    emit("response.created", response=copy.deepcopy(pending))
    emit("response.in_progress", response=copy.deepcopy(pending))
    for idx, item in enumerate(response["output"]):
        iid = item["id"]
        if item["type"] == "message":
            emit("response.output_item.added", output_index=idx,
                 item=dict(item, status="in_progress", content=[]))
            for ci, part in enumerate(item["content"]):
                emit("response.content_part.added", item_id=iid, output_index=idx,
                     content_index=ci, part=dict(part, text=""))
                for p in _split_text(part["text"]):
                    extra = {"obfuscation": _obfuscation(p)} if obfuscation else {}
                    emit("response.output_text.delta", item_id=iid, output_index=idx,
                         content_index=ci, delta=p, logprobs=[], **extra)
                emit("response.output_text.done", item_id=iid, output_index=idx,
                     content_index=ci, text=part["text"], logprobs=[])
                emit("response.content_part.done", item_id=iid, output_index=idx,
                     content_index=ci, part=part)
        elif item["type"] == "function_call":
            emit("response.output_item.added", output_index=idx,
                 item=dict(item, status="in_progress", arguments=""))
            for p in _split_json(item["arguments"]):
                extra = {"obfuscation": _obfuscation(p)} if obfuscation else {}
                emit("response.function_call_arguments.delta", item_id=iid, output_index=idx,
                     delta=p, **extra)
            emit("response.function_call_arguments.done", item_id=iid, output_index=idx,
                 name=item["name"], arguments=item["arguments"])
        elif item["type"] == "custom_tool_call":
            emit("response.output_item.added", output_index=idx,
                 item=dict(item, status="in_progress", input=""))
            for p in _split_json(item["input"]):
                emit("response.custom_tool_call_input.delta", item_id=iid, output_index=idx,
                     delta=p)
            emit("response.custom_tool_call_input.done", item_id=iid, output_index=idx,
                 input=item["input"])
        else:
            emit("response.output_item.added", output_index=idx,
                 item=dict(item, status="in_progress"))
        emit("response.output_item.done", output_index=idx, item=item)
    emit("response.completed", response=response)
    return events


# --------------------------------------------------------------------------- the server


@dataclass
class _Frame:
    """One stream event: SSE (event name + JSON text) or a WebSocket text message."""

    event: str | None
    data: str


def _sse_bytes(frame: _Frame) -> bytes:
    head = f"event: {frame.event}\n" if frame.event else ""
    return f"{head}data: {frame.data}\n\n".encode()


def _is_anthropic_request(request: web.BaseRequest) -> bool:
    path = request.path
    return (path.startswith(("/v1/messages", "/messages", "/v1/complete"))
            or "anthropic-version" in request.headers
            or "x-api-key" in request.headers)


def _reset_connection(request: web.BaseRequest) -> None:
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class ScriptedUpstream:
    """A scripted provider on 127.0.0.1, served from its own thread and event loop."""

    def __init__(
        self,
        script: Script | None = None,
        *,
        fault: Fault | None = None,
        delay_s: float = 0.0,
        first_event_delay_s: float = 0.0,
        side_text: str = "OK",
        tool_mapper: ToolMapper | None = None,
        port: int = 0,
        openai_models: Sequence[str] = DEFAULT_OPENAI_MODELS,
        anthropic_models: Sequence[str] = DEFAULT_ANTHROPIC_MODELS,
        ws_idle_timeout_s: float = 300.0,
        start_timeout_s: float = 15.0,
    ) -> None:
        if not 0 <= delay_s <= 60 or not 0 <= first_event_delay_s <= 600:
            raise ValueError("delays out of range")
        self._script: Script = []
        self.set_script(script if script is not None else [])
        self.fault = fault
        self.delay_s = delay_s
        self.first_event_delay_s = first_event_delay_s
        self.side_text = side_text
        self.tool_mapper = tool_mapper
        self.openai_models = tuple(openai_models)
        self.anthropic_models = tuple(anthropic_models)
        self.ws_idle_timeout_s = ws_idle_timeout_s
        self.start_timeout_s = start_timeout_s
        self._requested_port = port
        self.port: int = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._received: list[ReceivedRequest] = []
        self._fault_uses = 0
        self._responses: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._ws_ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._stop_requested: asyncio.Event | None = None
        self._start_error: BaseException | None = None

    # ----------------------------------------------------------------- public API

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (Anthropic SDK base_url; OpenAI: use openai_base_url)."""
        return f"http://{HOST}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://{HOST}:{self.port}/v1/responses"

    @property
    def received(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._received)

    def clear_received(self) -> None:
        with self._lock:
            self._received.clear()

    def wait_for_requests(self, n: int, timeout_s: float = 10.0) -> list[ReceivedRequest]:
        """Block until at least ``n`` requests were received; return them all."""
        deadline = time.monotonic() + min(timeout_s, 600.0)
        with self._cond:
            while len(self._received) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self._received)} requests received, wanted {n}")
                self._cond.wait(left)
            return list(self._received)

    def set_script(self, script: Script) -> None:
        if not callable(script):
            script = list(script)
            for t in script:
                parse_turn(t)
        self._script = script

    def set_fault(self, fault: Fault | None) -> None:
        with self._lock:
            self.fault = fault
            self._fault_uses = 0

    def start(self) -> ScriptedUpstream:
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(target=self._thread_main, name="scripted-upstream",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(self.start_timeout_s):
            raise RuntimeError("scripted upstream did not start in time")
        if self._start_error is not None:
            raise RuntimeError("scripted upstream failed to start") from self._start_error
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._stop_requested is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._stop_requested.set)
        thread.join(timeout_s)
        self._thread = None

    def __enter__(self) -> ScriptedUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- thread / loop

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:  # noqa: BLE001 - surfaced through start()
            self._start_error = e
        finally:
            self._ready.set()
            try:
                tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in tasks:
                    t.cancel()
                if tasks:
                    loop.run_until_complete(
                        asyncio.wait(tasks, timeout=2.0))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _serve(self) -> None:
        self._stop_requested = asyncio.Event()
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        self._add_routes(app)
        runner = web.AppRunner(app, access_log=None, auto_decompress=False,
                               handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner
        try:
            site = web.TCPSite(runner, HOST, self._requested_port)
            await site.start()
            self.port = int(runner.addresses[0][1])
            self._ready.set()
            await self._stop_requested.wait()
        finally:
            await asyncio.wait_for(runner.cleanup(), timeout=5.0)

    def _add_routes(self, app: web.Application) -> None:
        r = app.router
        for prefix in ("/v1", ""):
            r.add_post(prefix + "/messages", self._handle_messages)
            r.add_post(prefix + "/messages/count_tokens", self._handle_count_tokens)
            r.add_post(prefix + "/chat/completions", self._handle_chat)
            r.add_post(prefix + "/responses", self._handle_responses)
            r.add_get(prefix + "/responses", self._handle_responses_ws)
            r.add_get(prefix + "/responses/{response_id}", self._handle_get_response)
            r.add_get(prefix + "/models", self._handle_models)
            r.add_get(prefix + "/models/{model_id}", self._handle_model)
        r.add_post("/backend-api/codex/responses", self._handle_responses)
        r.add_get("/backend-api/codex/responses", self._handle_responses_ws)
        r.add_route("*", "/{tail:.*}", self._handle_not_found)

    # ----------------------------------------------------------------- recording

    def _record(self, rec: ReceivedRequest) -> None:
        with self._cond:
            self._received.append(rec)
            self._cond.notify_all()

    def _take_fault(self, rec: ReceivedRequest) -> Fault | None:
        with self._lock:
            fault = self.fault
            if fault is None:
                return None
            if fault.times is not None and self._fault_uses >= fault.times:
                return None
            if fault.match is not None and not fault.match(rec):
                return None
            self._fault_uses += 1
            return fault

    async def _read_request(self, request: web.Request, api: str | None
                            ) -> tuple[ReceivedRequest, Any, str | None]:
        """Read, decode and record a request: (record, JSON body or None, error text)."""
        raw = await request.read()
        encoding = request.headers.get("Content-Encoding")
        error: str | None = None
        body: Any = None
        try:
            data = decode_body(raw, encoding)
        except Exception as e:  # noqa: BLE001 - any codec failure is a client error
            data, error = raw, f"could not decode request body ({encoding}): {e}"
        if data and error is None:
            try:
                body = json.loads(data)
            except ValueError:
                body, error = data, "We could not parse the JSON body of your request."
        elif data:
            body = data
        stream = isinstance(body, dict) and bool(body.get("stream"))
        rec = ReceivedRequest(
            method=request.method, path=request.path, query=request.query_string,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body, raw_body=raw, transport="sse" if stream else "http", api=api,
            content_encoding=encoding)
        self._record(rec)
        if error is None and api is not None and not isinstance(body, dict):
            error = "Request body must be a JSON object."
        return rec, body, error

    # ----------------------------------------------------------------- responses

    def _headers(self, anthropic: bool) -> dict[str, str]:
        if anthropic:
            return {"request-id": "req_011C" + _b62(20),
                    "anthropic-organization-id": str(uuid.UUID(int=0x5C12)),
                    "x-robots-tag": "none"}
        return {"x-request-id": "req_" + _hex(32), "openai-version": "2020-10-01",
                "openai-organization": "user-forge-test", "openai-processing-ms": "7"}

    def _json(self, obj: Any, *, anthropic: bool, status: int = 200) -> web.Response:
        headers = self._headers(anthropic)
        if anthropic and status >= 400 and isinstance(obj, dict):
            obj = dict(obj, request_id=headers["request-id"])
        return web.Response(status=status, text=_compact(obj),
                            content_type=JSON_CONTENT_TYPE, headers=headers)

    def _error(self, status: int, *, anthropic: bool, message: str | None = None,
               code: str | None = None, param: str | None = None) -> web.Response:
        if anthropic:
            return self._json(anthropic_error(status, message), anthropic=True, status=status)
        return self._json(openai_error(status, message, code, param), anthropic=False,
                          status=status)

    def _error_frame(self, api: Api, fault: Fault, seq: int,
                     response: Mapping[str, Any] | None) -> _Frame:
        if api == "anthropic_messages":
            return _Frame("error", _compact(anthropic_error(fault.status, fault.message)))
        if api == "openai_chat":
            return _Frame(None, _compact(openai_error(fault.status if fault.status >= 400
                                                      else 500, fault.message)))
        failed = dict(response or {}, status="failed", output=[], usage=None,
                      error={"code": "server_error",
                             "message": fault.message or "An error occurred while processing "
                             "your request."})
        return _Frame("response.failed", _compact(
            {"type": "response.failed", "sequence_number": seq, "response": failed}))

    async def _send_stream(self, request: web.Request, api: Api, frames: list[_Frame],
                           fault: Fault | None, *, anthropic: bool,
                           response: Mapping[str, Any] | None = None) -> web.StreamResponse:
        headers = dict(self._headers(anthropic), **{"Cache-Control": "no-cache"})
        resp = web.StreamResponse(status=200, headers=headers)
        resp.content_type = "text/event-stream"
        resp.charset = "utf-8"
        await resp.prepare(request)
        try:
            for i in range(len(frames) + 1):
                if fault is not None and i == min(fault.after_events, len(frames)):
                    if fault.kind == "reset_mid_stream":
                        _reset_connection(request)
                        return resp
                    if fault.kind == "stall_mid_stream":
                        await asyncio.sleep(fault.stall_s)
                    if fault.kind == "error_event":
                        await resp.write(_sse_bytes(self._error_frame(api, fault, i, response)))
                        await resp.write_eof()
                        return resp
                if i == len(frames):
                    break
                frame = frames[i]
                if fault is not None and fault.kind == "invalid_json" and \
                        i == fault.after_events:
                    frame = _Frame(frame.event, frame.data[: max(1, len(frame.data) // 2)])
                delay = self.delay_s + (self.first_event_delay_s if i == 0 else 0.0)
                if delay:
                    await asyncio.sleep(delay)
                await resp.write(_sse_bytes(frame))
            if fault is not None and fault.kind == "close_after_last_event":
                if request.transport is not None:
                    request.transport.close()
                return resp
            await resp.write_eof()
        except ConnectionError:
            pass
        return resp

    async def _send_body(self, request: web.Request, obj: Any, fault: Fault | None, *,
                         anthropic: bool) -> web.StreamResponse:
        """A non-stream 200 reply, with a fault applied when one is given."""
        if self.first_event_delay_s:
            await asyncio.sleep(self.first_event_delay_s)
        if fault is None:
            return self._json(obj, anthropic=anthropic)
        text = _compact(obj)
        if fault.kind == "reset_mid_stream":
            _reset_connection(request)
            return web.Response(status=200)
        if fault.kind == "stall_mid_stream":
            await asyncio.sleep(fault.stall_s)
            return self._json(obj, anthropic=anthropic)
        if fault.kind == "invalid_json":
            return web.Response(status=200, text=text[: len(text) // 2],
                                content_type=JSON_CONTENT_TYPE,
                                headers=self._headers(anthropic))
        if fault.kind == "close_after_last_event":
            resp = web.StreamResponse(status=200, headers=self._headers(anthropic))
            resp.content_type = JSON_CONTENT_TYPE
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            with contextlib.suppress(ConnectionError):
                await resp.write(text.encode())
                if request.transport is not None:
                    request.transport.close()
            return resp
        return self._error(fault.status, anthropic=anthropic, message=fault.message)

    # ----------------------------------------------------------------- handlers

    async def _handle_messages(self, request: web.Request) -> web.StreamResponse:
        rec, body, error = await self._read_request(request, "anthropic_messages")
        if error is not None:
            return self._error(400, anthropic=True, message=error)
        fault = self._take_fault(rec)
        if fault is not None and fault.kind == "status":
            return self._error(fault.status, anthropic=True, message=fault.message)
        conv = _anthropic_conversation(body, rec.transport)
        reply = decide_reply(self._script, conv, side_text=self.side_text,
                             tool_mapper=self.tool_mapper)
        in_tokens = max(1, count_tokens([body.get("system"), body.get("messages"),
                                         body.get("tools")]))
        message = build_anthropic_message(reply, str(body.get("model") or "claude"), in_tokens)
        if not body.get("stream"):
            return await self._send_body(request, message, fault, anthropic=True)
        frames = [_Frame(name, _compact(data)) for name, data in
                  anthropic_stream_events(message)]
        return await self._send_stream(request, "anthropic_messages", frames, fault,
                                       anthropic=True)

    async def _handle_count_tokens(self, request: web.Request) -> web.StreamResponse:
        rec, body, error = await self._read_request(request, "anthropic_count_tokens")
        if error is not None:
            return self._error(400, anthropic=True, message=error)
        n = max(1, count_tokens([body.get("system"), body.get("messages"), body.get("tools")]))
        return self._json({"input_tokens": n}, anthropic=True)

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        rec, body, error = await self._read_request(request, "openai_chat")
        if error is not None:
            return self._error(400, anthropic=False, message=error)
        fault = self._take_fault(rec)
        if fault is not None and fault.kind == "status":
            return self._error(fault.status, anthropic=False, message=fault.message)
        conv = _chat_conversation(body, rec.transport)
        reply = decide_reply(self._script, conv, side_text=self.side_text,
                             tool_mapper=self.tool_mapper)
        in_tokens = max(1, count_tokens([body.get("messages"), body.get("tools")]))
        completion = build_chat_completion(reply, str(body.get("model") or "gpt-4o"), in_tokens)
        if not body.get("stream"):
            return await self._send_body(request, completion, fault, anthropic=False)
        opts = body.get("stream_options") if isinstance(body.get("stream_options"),
                                                        Mapping) else {}
        chunks = chat_stream_chunks(completion, include_usage=bool(opts.get("include_usage")),
                                    obfuscation=opts.get("include_obfuscation", True)
                                    is not False)
        frames = [_Frame(None, _compact(c)) for c in chunks] + [_Frame(None, "[DONE]")]
        return await self._send_stream(request, "openai_chat", frames, fault, anthropic=False)

    def _responses_plan(self, body: Mapping[str, Any], transport: Transport
                        ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(response object, error body) for a Responses create body; stores the response."""
        prev = body.get("previous_response_id")
        history: list[Any] = []
        if prev:
            with self._lock:
                stored = self._responses.get(str(prev))
            if stored is None:
                return None, openai_error(
                    400, f"Previous response with id '{prev}' not found.",
                    code="previous_response_not_found", param="previous_response_id")
            history = list(stored["history"])
        history += _responses_input_items(body.get("input"))
        in_tokens = max(1, count_tokens([body.get("instructions"), history, body.get("tools")]))
        if body.get("generate") is False:
            response = build_response(body, None, in_tokens)
        else:
            conv = _responses_conversation(body, history, transport)
            reply = decide_reply(self._script, conv, side_text=self.side_text,
                                 tool_mapper=self.tool_mapper)
            response = build_response(body, reply, in_tokens)
        with self._lock:
            self._responses[response["id"]] = {"history": history + response["output"],
                                               "response": response}
            while len(self._responses) > MAX_STORED_RESPONSES:
                self._responses.popitem(last=False)
        return response, None

    async def _handle_responses(self, request: web.Request) -> web.StreamResponse:
        rec, body, error = await self._read_request(request, "openai_responses")
        if error is not None:
            return self._error(400, anthropic=False, message=error)
        fault = self._take_fault(rec)
        if fault is not None and fault.kind == "status":
            return self._error(fault.status, anthropic=False, message=fault.message)
        response, err = self._responses_plan(body, rec.transport)
        if response is None:
            return self._json(err, anthropic=False, status=400)
        if not body.get("stream"):
            return await self._send_body(request, response, fault, anthropic=False)
        opts = body.get("stream_options") if isinstance(body.get("stream_options"),
                                                        Mapping) else {}
        events = responses_stream_events(
            response, obfuscation=opts.get("include_obfuscation", True) is not False)
        frames = [_Frame(e["type"], _compact(e)) for e in events]
        return await self._send_stream(request, "openai_responses", frames, fault,
                                       anthropic=False, response=response)

    async def _handle_get_response(self, request: web.Request) -> web.StreamResponse:
        await self._read_request(request, None)
        rid = request.match_info["response_id"]
        with self._lock:
            stored = self._responses.get(rid)
        if stored is None:
            return self._error(404, anthropic=False,
                               message=f"Response with id '{rid}' not found.")
        return self._json(stored["response"], anthropic=False)

    async def _handle_responses_ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_BODY_BYTES, compress=True, heartbeat=None)
        if not ws.can_prepare(request).ok:
            await self._read_request(request, None)
            return self._error(405, anthropic=False,
                               message=f"Invalid method for URL (GET {request.path})")
        headers = {k.lower(): v for k, v in request.headers.items()}
        conn_id = next(self._ws_ids)
        await ws.prepare(request)
        last_response_id: str | None = None
        try:
            for _ in range(MAX_WS_MESSAGES):
                try:
                    msg = await ws.receive(timeout=self.ws_idle_timeout_s)
                except TimeoutError:
                    break
                if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED,
                                WSMsgType.ERROR):
                    break
                if msg.type != WSMsgType.TEXT:
                    await ws.send_str(_compact({"type": "error", "status": 400, "error": {
                        "type": "invalid_request_error", "code": "invalid_message",
                        "message": "Expected a text message."}}))
                    continue
                raw = msg.data.encode()
                try:
                    body = json.loads(msg.data)
                except ValueError:
                    body = None
                rec = ReceivedRequest(method="GET", path=request.path,
                                      query=request.query_string, headers=headers,
                                      body=body if body is not None else raw, raw_body=raw,
                                      transport="websocket", api="openai_responses",
                                      connection_id=conn_id)
                mtype = body.get("type") if isinstance(body, dict) else None
                if mtype == "response.processed":
                    self._record(replace(rec, api=None))
                    continue
                self._record(rec)
                if mtype not in ("response.create", "response.append"):
                    await ws.send_str(_compact({"type": "error", "status": 400, "error": {
                        "type": "invalid_request_error", "code": "invalid_message",
                        "message": f"Unsupported message type {mtype!r}."}}))
                    continue
                create = {k: v for k, v in body.items() if k != "type"}
                if mtype == "response.append":
                    create["previous_response_id"] = last_response_id
                fault = self._take_fault(rec)
                if fault is not None and fault.kind == "status":
                    await ws.send_str(_compact(dict(
                        openai_error(fault.status, fault.message),
                        type="error", status=fault.status)))
                    continue
                response, err = self._responses_plan(create, "websocket")
                if response is None:
                    await ws.send_str(_compact(dict(err or {}, type="error", status=400)))
                    continue
                last_response_id = response["id"]
                events = responses_stream_events(response, obfuscation=False)
                if not await self._send_ws_events(request, ws, events, fault, response):
                    break
        except ConnectionError:
            pass
        finally:
            if not ws.closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ws.close(), timeout=2.0)
        return ws

    async def _send_ws_events(self, request: web.Request, ws: web.WebSocketResponse,
                              events: list[dict[str, Any]], fault: Fault | None,
                              response: Mapping[str, Any]) -> bool:
        """Send one response's events; False when the socket is gone."""
        for i in range(len(events) + 1):
            if fault is not None and i == min(fault.after_events, len(events)):
                if fault.kind == "reset_mid_stream":
                    _reset_connection(request)
                    return False
                if fault.kind == "stall_mid_stream":
                    await asyncio.sleep(fault.stall_s)
                if fault.kind == "error_event":
                    frame = self._error_frame("openai_responses", fault, i, response)
                    await ws.send_str(frame.data)
                    return True
            if i == len(events):
                break
            text = _compact(events[i])
            if fault is not None and fault.kind == "invalid_json" and i == fault.after_events:
                text = text[: len(text) // 2]
            delay = self.delay_s + (self.first_event_delay_s if i == 0 else 0.0)
            if delay:
                await asyncio.sleep(delay)
            await ws.send_str(text)
        if fault is not None and fault.kind == "close_after_last_event":
            await asyncio.wait_for(ws.close(), timeout=2.0)
            return False
        return True

    async def _handle_models(self, request: web.Request) -> web.StreamResponse:
        await self._read_request(request, "models")
        if _is_anthropic_request(request):
            data = [self._anthropic_model(m) for m in self.anthropic_models]
            return self._json({"data": data, "has_more": False,
                               "first_id": data[0]["id"] if data else None,
                               "last_id": data[-1]["id"] if data else None}, anthropic=True)
        return self._json({"object": "list",
                           "data": [self._openai_model(m) for m in self.openai_models]},
                          anthropic=False)

    async def _handle_model(self, request: web.Request) -> web.StreamResponse:
        await self._read_request(request, "models")
        mid = request.match_info["model_id"]
        anthropic = _is_anthropic_request(request)
        if anthropic and mid in self.anthropic_models:
            return self._json(self._anthropic_model(mid), anthropic=True)
        if not anthropic and mid in self.openai_models:
            return self._json(self._openai_model(mid), anthropic=False)
        if anthropic:
            return self._error(404, anthropic=True, message=f"model: {mid}")
        return self._error(404, anthropic=False, code="model_not_found",
                           message=f"The model '{mid}' does not exist or you do not have "
                                   "access to it.")

    @staticmethod
    def _anthropic_model(mid: str) -> dict[str, Any]:
        words = mid.split("-")
        display = " ".join(w.capitalize() for w in words if not w.isdigit() or len(w) < 8)
        return {"type": "model", "id": mid, "display_name": display,
                "created_at": "2025-09-29T00:00:00Z"}

    @staticmethod
    def _openai_model(mid: str) -> dict[str, Any]:
        return {"id": mid, "object": "model", "created": 1_754_000_000, "owned_by": "openai"}

    async def _handle_not_found(self, request: web.Request) -> web.StreamResponse:
        await self._read_request(request, None)
        if _is_anthropic_request(request):
            return self._error(404, anthropic=True, message="Not Found")
        return self._error(404, anthropic=False,
                           message=f"Invalid URL ({request.method} {request.path})")


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.upstream",
        description="Scripted LLM upstream (Anthropic Messages, OpenAI Chat and Responses) "
                    "on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    parser.add_argument("--script", help="JSON file: a list of turns")
    parser.add_argument("--delay-s", type=float, default=0.0, help="delay before each event")
    parser.add_argument("--side-text", default="OK", help="reply to calls offering no tools")
    parser.add_argument("--max-seconds", type=float, default=3600.0,
                        help="exit after this long (bounded run)")
    parser.add_argument("--log", action="store_true", help="print each request received")
    args = parser.parse_args(argv)
    script: list[Any] = [{"text": "OK"}]
    if args.script:
        with open(args.script, encoding="utf-8") as f:
            script = json.load(f)
        if not isinstance(script, list):
            parser.error("--script must hold a JSON list of turns")
    up = ScriptedUpstream(script, port=args.port, delay_s=args.delay_s,
                          side_text=args.side_text)
    with up:
        print(f"scripted upstream listening on {up.base_url}", flush=True)
        deadline = time.monotonic() + args.max_seconds
        seen = 0
        try:
            while time.monotonic() < deadline:
                time.sleep(0.2)
                if args.log:
                    recs = up.received
                    for r in recs[seen:]:
                        print(f"{r.transport:9} {r.method} {r.path_qs} api={r.api}", flush=True)
                    seen = len(recs)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
