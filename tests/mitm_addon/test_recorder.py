"""From a capture to rows: splitting, content addressing, status."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mitm_addon.capture import Capture
from mitm_addon.recorder import build_rows, split_params
from pipeline.canonical import REF_KEY, canonical_json, resolve_refs

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=700),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=10), values, max_size=6))
def test_params_split_into_refs_resolve_back_exactly(params: dict[str, Any]) -> None:
    split, parts = split_params(params)
    table = {h: v for h, _, v in parts}
    assert canonical_json(resolve_refs(split, table.__getitem__)) == canonical_json(params)
    assert all(len(c) >= 512 for _, c, _ in parts)


def anthropic_capture(billing: str, system: str, question: str) -> Capture:
    body = {
        "model": "claude-opus-5-5",
        "max_tokens": 1000,
        "system": [{"type": "text", "text": billing}, {"type": "text", "text": system}],
        "tools": [
            {"name": f"T{i}", "description": "d" * 800, "input_schema": {"type": "object"}}
            for i in range(5)
        ],
        "messages": [{"role": "user", "content": question}],
    }
    return Capture(
        call_id=f"c-{billing}",
        run_id="r",
        transport="http",
        method="POST",
        scheme="https",
        host="api.anthropic.com",
        path="/v1/messages",
        started_at=time.time(),
        request_body=json.dumps(body).encode(),
        status_code=200,
        response_body=(WIRE / "anthropic_messages" / "response_text.json").read_bytes(),
    )


def test_a_changing_small_system_block_does_not_restore_the_big_ones() -> None:
    system = "You are Claude Code. " * 500
    a = build_rows(anthropic_capture("billing: 1", system, "hi"), lambda _: None)
    b = build_rows(anthropic_capture("billing: 2", system, "hi"), lambda _: None)
    new = {m["hash"] for m in b.messages} - {m["hash"] for m in a.messages}
    new_bytes = sum(m["content_bytes"] for m in b.messages if m["hash"] in new)
    assert len(new) == 1 and new_bytes < 1000, (
        "only the params row with the new billing block is new"
    )
    params = json.loads(next(m["content_json"] for m in b.messages if m["kind"] == "params"))
    assert (
        params["system"][0] == {"text": "billing: 2", "type": "text"}
        and REF_KEY in params["system"][1]
    )


def test_codex_prewarm_is_flagged() -> None:
    body = {"model": "gpt-5.5", "input": [], "generate": False, "stream": True}
    c = Capture(
        call_id="p",
        run_id="r",
        transport="http",
        method="POST",
        scheme="https",
        host="api.openai.com",
        path="/v1/responses",
        started_at=time.time(),
        request_body=json.dumps(body).encode(),
    )
    assert build_rows(c, lambda _: None).call["prewarm"] is True


def test_an_http_error_is_recorded_with_its_body() -> None:
    c = anthropic_capture("b", "s", "q")
    c.status_code = 529
    c.response_body = (WIRE / "anthropic_messages" / "error.json").read_bytes()
    row = build_rows(c, lambda _: None).call
    assert row["status"] == "error" and row["error"].startswith("HTTP 529")


def test_malformed_request_json_still_gets_a_row() -> None:
    c = anthropic_capture("b", "s", "q")
    c.request_body = b'{"model": "x", "messages": [tru'
    row = build_rows(c, lambda _: None).call
    assert row["api"] == "anthropic_messages" and row["parse_error"].startswith("request:")


def openai_stream_capture(body: bytes, error: str | None) -> Capture:
    request = {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    return replace(
        anthropic_capture("s", "s", "q"),
        transport="sse",
        host="api.openai.com",
        path="/v1/chat/completions",
        request_body=json.dumps(request).encode(),
        response_headers={"content-type": "text/event-stream"},
        response_body=body,
        error=error,
    )


def test_a_malformed_stream_event_is_an_error_even_when_the_client_hung_up_on_it() -> None:
    events = (WIRE / "openai_chat" / "stream_text.sse").read_bytes().split(b"\n\n")
    bad = b"\n\n".join([*events[:3], b"data: {not json", b""])
    for error in (None, "Client disconnected."):
        row = build_rows(openai_stream_capture(bad, error), lambda _: None).call
        assert row["status"] == "error" and "response:" in row["error"], (error, row["error"])
    # A stream cut inside an event is not malformed, only incomplete.
    cut = b"\n\n".join(events[:3]) + b"\n\ndata: {not js"
    row = build_rows(openai_stream_capture(cut, "Client disconnected."), lambda _: None).call
    assert row["status"] == "incomplete" and row["error"] == "Client disconnected."


def test_a_plain_body_cut_short_by_a_hang_up_is_incomplete_not_an_error() -> None:
    c = anthropic_capture("b", "s", "q")
    c.response_body = c.response_body[: len(c.response_body) // 2]
    c.error = "Client disconnected."
    row = build_rows(c, lambda _: None).call
    assert row["status"] == "incomplete" and row["error"] == "Client disconnected."


def test_a_gui_loop_stores_each_screenshot_once_and_rebuilds_every_request(tmp_path: Path) -> None:
    """Anthropic's computer-use loop re-sending its last 3 screenshots: 12 calls carry 33
    screenshots but 12 images rows are stored; no item holds base64; every request is
    rebuilt exactly from the shards; each call's actions and images are on its row."""
    from bench.bench_gui_storage import gui_capture
    from bench.gui import ACTION_KINDS, body_bytes, computer_use_calls
    from pipeline.images import image_hash
    from pipeline.reconstruct import reconstruct_request
    from pipeline.shards import write_shard
    from pipeline.store import connect

    seen: set[str] = set()
    calls, messages, images, sent = [], [], [], []
    for i, (request, response, carried) in enumerate(
        computer_use_calls(12, keep=3, width=256, height=192)
    ):
        rows = build_rows(
            gui_capture(i, body_bytes(request), body_bytes(response)), lambda _: None
        )
        assert rows.call["parse_error"] is None
        assert rows.call["request_images"] == [image_hash(png) for png in carried]
        assert rows.call["actions"] == [ACTION_KINDS[i % len(ACTION_KINDS)]]
        assert rows.call["tool_calls"] == ["computer"]
        assert {r["hash"] for r in rows.images} == {image_hash(png) for png in carried}
        calls.append(rows.call)
        sent.append(request)
        for table, new in ((messages, rows.messages), (images, rows.images)):
            table += [r for r in new if r["hash"] not in seen and not seen.add(r["hash"])]
    assert sum(len(c["request_images"]) for c in calls) == 1 + 2 + 3 * 10
    assert len(images) == 12  # the screenshot after the last action was never sent
    assert all(
        r["width"] == 256 and r["height"] == 192 and r["media_type"] == "image/png" for r in images
    )
    assert max(len(m["content_json"]) for m in messages if m["kind"] == "item") < 1000
    write_shard(tmp_path, "images", "r-000001", images)
    write_shard(tmp_path, "messages", "r-000001", messages)
    write_shard(tmp_path, "calls", "r-000001", calls)
    con = connect(tmp_path)
    for call, request in zip(calls, sent, strict=True):
        assert canonical_json(reconstruct_request(con, call["call_id"])) == canonical_json(request)
