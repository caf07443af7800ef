"""The single pyarrow schema of every shard Forge writes.

Each field carries its description in the field metadata, so the schema page in
``docs/schema.md`` is generated from this module (``python -m pipeline.schema``)
and cannot go stale. Bump ``SCHEMA_VERSION`` on any change to a column's meaning.
"""

from __future__ import annotations

import sys

import pyarrow as pa

SCHEMA_VERSION = 1

_TS = pa.timestamp("us", tz="UTC")


def _f(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


# One row per intercepted LLM call. Grain: call_id.
CALLS = pa.schema(
    [
        _f(
            "call_id",
            pa.string(),
            "Sortable id: 12 hex digits of ms since the epoch, a counter, random digits.",
            False,
        ),
        _f(
            "run_id",
            pa.string(),
            "Id of the proxy process that recorded the call (one per mitmdump start).",
        ),
        _f("rollout_id", pa.string(), "Rollout the call belongs to."),
        _f(
            "rollout_source",
            pa.string(),
            "Where rollout_id came from: proxy_auth, option, process_env, or null.",
        ),
        # Harness ids, from request headers.
        _f("claude_session_id", pa.string(), "Header x-claude-code-session-id."),
        _f("claude_agent_id", pa.string(), "Header x-claude-code-agent-id."),
        _f("claude_parent_agent_id", pa.string(), "Header x-claude-code-parent-agent-id."),
        _f("codex_session_id", pa.string(), "Header session-id (Codex CLI)."),
        _f("codex_thread_id", pa.string(), "Header thread-id (Codex CLI)."),
        _f("codex_parent_thread_id", pa.string(), "Header x-codex-parent-thread-id."),
        _f("openai_subagent", pa.string(), "Header x-openai-subagent."),
        _f("opencode_session_id", pa.string(), "Header x-session-id (opencode)."),
        _f("opencode_parent_session_id", pa.string(), "Header x-parent-session-id (opencode)."),
        _f("openclaw_session_id", pa.string(), "Header x-openclaw-session-id."),
        _f("traceparent", pa.string(), "W3C traceparent header."),
        _f("user_agent", pa.string(), "User-Agent header."),
        # Process of the client socket (same host only).
        _f("pid", pa.int32(), "Pid of the process that owned the client socket."),
        _f("parent_pids", pa.list_(pa.int32()), "Ancestors of pid, nearest first."),
        _f("process_name", pa.string(), "Name of the process that owned the client socket."),
        _f(
            "client_conn_id",
            pa.string(),
            "mitmproxy's client connection id (calls on one socket share it).",
        ),
        # What was called.
        _f("api", pa.string(), "anthropic_messages, openai_chat, openai_responses, or unknown."),
        _f(
            "transport", pa.string(), "http (one JSON body), sse (server-sent events) or websocket."
        ),
        _f("method", pa.string(), "HTTP method."),
        _f("host", pa.string(), "Provider host the harness addressed (before forge_upstream)."),
        _f("path", pa.string(), "Request path, query string redacted."),
        _f(
            "upstream_url",
            pa.string(),
            "Base URL the call was sent to when forge_upstream rerouted it.",
        ),
        _f("model", pa.string(), "Model named in the request."),
        _f("response_model", pa.string(), "Model named in the response."),
        _f("stream", pa.bool_(), "The request asked for a stream."),
        # Outcome.
        _f(
            "status",
            pa.string(),
            "complete, error (HTTP >= 400 or API error event), incomplete (stream cut or proxy stopped).",
        ),
        _f("status_code", pa.int32(), "HTTP status (101 for WebSocket calls)."),
        _f(
            "error",
            pa.string(),
            "Error text: connection error, API error body, or why the call is incomplete.",
        ),
        _f(
            "parse_error",
            pa.string(),
            "Why the request or response could not be parsed (the call was still passed through).",
        ),
        _f("started_at", _TS, "Request fully received from the harness."),
        _f("first_byte_at", _TS, "First response byte from upstream."),
        _f("ended_at", _TS, "Response complete (or the call failed)."),
        _f("duration_ms", pa.float64(), "ended_at - started_at in ms."),
        _f("ttfb_ms", pa.float64(), "first_byte_at - started_at in ms."),
        # Usage.
        _f(
            "input_tokens",
            pa.int64(),
            "Prompt tokens as the provider reported them (uncached part for Anthropic).",
        ),
        _f("output_tokens", pa.int64(), "Completion tokens."),
        _f("cache_read_tokens", pa.int64(), "Prompt tokens read from the provider's cache."),
        _f("cache_write_tokens", pa.int64(), "Prompt tokens written to the provider's cache."),
        _f(
            "usage_estimated",
            pa.bool_(),
            "Token counts were estimated with tiktoken (o200k_base) because the provider reported none.",
        ),
        # Request, content-addressed.
        _f(
            "request_params_hash",
            pa.string(),
            "Hash of the request body minus its item list (a messages row of kind params).",
        ),
        _f(
            "request_head_hash",
            pa.string(),
            "Hash of the last item of the request's conversation chain.",
        ),
        _f("request_list_key", pa.string(), "Body key that holds the items: messages or input."),
        _f(
            "request_items",
            pa.int32(),
            "Number of items the request itself carried (the tail of the chain).",
        ),
        _f(
            "request_items_form",
            pa.string(),
            "list, or string when a Responses input was a bare string.",
        ),
        _f("request_bytes", pa.int64(), "Request body size on the wire (decompressed)."),
        _f(
            "request_encoding",
            pa.string(),
            "Content-Encoding of the request body (zstd, gzip, br) or null.",
        ),
        _f(
            "request_headers",
            pa.map_(pa.string(), pa.string()),
            "Request headers, secrets removed.",
        ),
        _f("previous_response_id", pa.string(), "Responses API previous_response_id."),
        _f(
            "request_images",
            pa.list_(pa.string()),
            "Images the request's items carry, in order: an images row's hash for each "
            "inline image, the URL for each linked one.",
        ),
        _f("tools", pa.list_(pa.string()), "Names of the tools the request offered."),
        _f(
            "prewarm",
            pa.bool_(),
            "A Responses generate:false warm-up (Codex): no model output, kept for chaining.",
        ),
        # Response.
        _f("response_id", pa.string(), "Provider's id of the response."),
        _f(
            "response_head_hash",
            pa.string(),
            "Hash of the last output item, chained after request_head_hash.",
        ),
        _f(
            "response_items",
            pa.int32(),
            "Number of output items (chain rows after request_head_hash).",
        ),
        _f(
            "response_json",
            pa.string(),
            "The response as one JSON body (streams assembled), canonical JSON.",
        ),
        _f("response_bytes", pa.int64(), "Response body bytes on the wire."),
        _f(
            "response_headers",
            pa.map_(pa.string(), pa.string()),
            "Response headers, secrets removed.",
        ),
        _f("stop_reason", pa.string(), "stop_reason / finish_reason / status of the response."),
        _f("tool_calls", pa.list_(pa.string()), "Names of the tools the response called."),
        _f(
            "actions",
            pa.list_(pa.string()),
            "GUI actions the response took (click, type, key, scroll, navigate, ...; see "
            "pipeline.actions), from computer-use calls and browser tools.",
        ),
        _f("stream_events", pa.int32(), "SSE events or WebSocket messages received."),
        # Serve mode (token ids; null in record mode).
        _f(
            "policy_version",
            pa.int64(),
            "Version of the policy weights that produced the completion.",
        ),
        _f("drift", pa.string(), "CLEAN, REALIGN, TRIM or FORK (serve mode)."),
        _f(
            "prompt_ids",
            pa.list_(pa.int32()),
            "Prompt token ids (for CLEAN calls only the delta after the parent's prompt + completion).",
        ),
        _f(
            "prompt_parent_call_id",
            pa.string(),
            "Call whose prompt + completion prefix prompt_ids extends (CLEAN calls).",
        ),
        _f("completion_ids", pa.list_(pa.int32()), "Completion token ids."),
        _f(
            "completion_logprobs",
            pa.list_(pa.float32()),
            "Per-token logprobs of completion_ids at sampling.",
        ),
        _f("finish_reason", pa.string(), "Policy server's finish reason."),
    ]
)

# Content-addressed conversation items, request parameters and output items.
# Grain: hash (written once per run directory).
MESSAGES = pa.schema(
    [
        _f(
            "hash",
            pa.string(),
            "m1 hash over canonical JSON and parent hash (see pipeline.canonical).",
            False,
        ),
        _f(
            "parent_hash",
            pa.string(),
            "Previous item of the chain; null for the first item and for params.",
        ),
        _f(
            "kind",
            pa.string(),
            "item (a conversation item) or params (a request body minus its items).",
        ),
        _f("role", pa.string(), "role of the item where it has one."),
        _f(
            "item_type",
            pa.string(),
            "type of the item where it has one (message, function_call, ...).",
        ),
        _f("content_json", pa.string(), "Canonical JSON of the item."),
        _f("content_bytes", pa.int64(), "Bytes of content_json."),
        _f("first_call_id", pa.string(), "The call that first stored this row."),
    ]
)

# Inline images taken out of conversation items (see pipeline.images), each stored
# once however many calls re-send it. Grain: hash (written once per run directory).
IMAGES = pa.schema(
    [
        _f("hash", pa.string(), "i1 hash over the raw bytes (see pipeline.images).", False),
        _f("media_type", pa.string(), "MIME type the first call that sent it gave."),
        _f("bytes", pa.int64(), "Size of the raw image."),
        _f("width", pa.int32(), "Width in pixels, read from its header (PNG, GIF, JPEG, WebP)."),
        _f("height", pa.int32(), "Height in pixels."),
        _f("data", pa.binary(), "The raw image."),
        _f("first_call_id", pa.string(), "The call that first stored this row."),
    ]
)

# Requests to LLM hosts that are not model calls (model lists, settings, telemetry,
# token counting), counted, not stored. Grain: (run_id, window_end, host, method, path).
ENDPOINTS = pa.schema(
    [
        _f("run_id", pa.string(), "Proxy process.", False),
        _f("window_end", _TS, "End of the counting window (a shard flush)."),
        _f("host", pa.string(), "Host addressed."),
        _f("method", pa.string(), "HTTP method."),
        _f("path", pa.string(), "Path without query string."),
        _f("status_code", pa.int32(), "HTTP status returned to the harness."),
        _f("requests", pa.int64(), "Number of requests in the window."),
    ]
)

# One row per rollout attempt, written by whoever ran the harness (forge record, the
# rollout runner). Grain: rollout_id (the latest row wins when a rollout is rewritten).
ROLLOUTS = pa.schema(
    [
        _f("rollout_id", pa.string(), "Rollout id (the calls' rollout_id).", False),
        _f("task_id", pa.string(), "Task the rollout attempted."),
        _f("harness", pa.string(), "Harness name (claude, codex, toy, or the command's name)."),
        _f("group_id", pa.string(), "GRPO group the rollout was launched in, if any."),
        _f(
            "policy_version",
            pa.int64(),
            "Policy version the rollout was launched with (serve mode).",
        ),
        _f("status", pa.string(), "complete, partial, crashed, timed_out or infra_error."),
        _f("exit_code", pa.int32(), "Harness exit code."),
        _f("started_at", _TS, "Harness started."),
        _f("ended_at", _TS, "Harness ended."),
        _f("command", pa.list_(pa.string()), "Harness argv."),
        _f("metadata_json", pa.string(), "Task metadata, canonical JSON."),
        _f("written_at", _TS, "When this row was written."),
    ]
)

# Terminal rewards, written by verifiers or `forge reward`. Grain: rollout_id (the
# latest written_at wins).
REWARDS = pa.schema(
    [
        _f("rollout_id", pa.string(), "Rollout the reward is for.", False),
        _f(
            "reward",
            pa.float64(),
            "Terminal reward (gamma = 1: it applies to every trained token).",
        ),
        _f(
            "status",
            pa.string(),
            "Verifier's view of the rollout: complete, partial, crashed, timed_out.",
        ),
        _f(
            "details_json",
            pa.string(),
            "Verifier details, canonical JSON (partial credit lives here).",
        ),
        _f("source", pa.string(), "verifier, forge reward, or another writer's name."),
        _f("written_at", _TS, "When this row was written."),
    ]
)

TABLES: dict[str, pa.Schema] = {
    "calls": CALLS,
    "messages": MESSAGES,
    "images": IMAGES,
    "endpoints": ENDPOINTS,
    "rollouts": ROLLOUTS,
    "rewards": REWARDS,
}


def with_version(schema: pa.Schema) -> pa.Schema:
    """The schema with Forge's version in its file metadata."""
    return schema.with_metadata({"forge.schema_version": str(SCHEMA_VERSION)})


def render_markdown() -> str:
    """The schema page: one table per relation, generated from the fields."""
    lines = [
        f"# Shard schema (version {SCHEMA_VERSION})",
        "",
        "Generated by `python -m pipeline.schema`; do not edit by hand.",
        "",
    ]
    for name, schema in TABLES.items():
        lines += [f"## `{name}`", "", "| column | type | meaning |", "| --- | --- | --- |"]
        for field in schema:
            doc = (field.metadata or {}).get(b"doc", b"").decode()
            lines.append(f"| `{field.name}` | `{field.type}` | {doc} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
