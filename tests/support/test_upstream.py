"""The scripted upstream speaks each provider's wire format: official SDKs parse it directly."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import brotli
import httpx
import openai
import pytest
import zstandard
from websockets.sync.client import connect as ws_connect

from .upstream import (
    Conversation,
    Fault,
    ScriptedUpstream,
    ToolCallSpec,
    Turn,
    count_tokens,
    decode_body,
    parse_turn,
    select_turn,
)

KEY = "sk-test-forge"
ROOT = Path(__file__).resolve().parents[2]

SHELL_THEN_DONE = [
    {"tool_call": {"name": "shell",
                   "arguments": {"command": ["bash", "-lc", "echo hi > out.txt"]}}},
    {"text": "Done."},
]

ANTHROPIC_BASH = {
    "name": "Bash",
    "description": "Run a command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                     "required": ["command"]},
}
CHAT_SHELL = {
    "type": "function",
    "function": {"name": "shell", "description": "Run a command",
                 "parameters": {"type": "object",
                                "properties": {"command": {"type": "array",
                                                           "items": {"type": "string"}}}}},
}
RESP_SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "parameters": {"type": "object",
                   "properties": {"command": {"type": "array", "items": {"type": "string"}}}},
    "strict": False,
}


def anthropic_client(up: ScriptedUpstream, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=up.base_url, api_key=KEY, **kw)


def openai_client(up: ScriptedUpstream, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=up.openai_base_url, api_key=KEY, **kw)


def sse_events(raw: bytes) -> list[tuple[str | None, str]]:
    """(event, data) pairs of an SSE body."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        event, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])
        out.append((event, "\n".join(data)))
    return out


# --------------------------------------------------------------------------- Anthropic


def test_anthropic_non_stream_text_parses_as_message() -> None:
    with ScriptedUpstream([{"text": "Hello there, friend."}]) as up, anthropic_client(up) as c:
        msg = c.messages.create(model="claude-sonnet-4-5", max_tokens=64,
                                messages=[{"role": "user", "content": "hi"}])
    assert msg.id.startswith("msg_01") and len(msg.id) == len("msg_01") + 22
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.model == "claude-sonnet-4-5"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "Hello there, friend."
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.input_tokens >= 1 and msg.usage.output_tokens >= 1


def test_anthropic_stream_helper_assembles_tool_use_input() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE) as up, anthropic_client(up) as c, c.messages.stream(
            model="claude-sonnet-4-5", max_tokens=64, tools=[ANTHROPIC_BASH],
            messages=[{"role": "user", "content": "make out.txt"}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "Bash"
    assert block.id.startswith("toolu_01")
    assert block.input["command"] == "echo hi > out.txt"
    assert final.usage.output_tokens > 1


def test_anthropic_stream_sends_the_real_event_sequence() -> None:
    script = [{"text": "Checking now.",
               "tool_call": {"name": "Bash", "arguments": {"command": "ls -la /tmp"}}}]
    with ScriptedUpstream(script) as up:
        r = httpx.post(up.base_url + "/v1/messages?beta=true", json={
            "model": "claude-sonnet-4-5", "max_tokens": 64, "stream": True,
            "tools": [ANTHROPIC_BASH], "messages": [{"role": "user", "content": "go"}]},
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["request-id"].startswith("req_")
    events = sse_events(r.content)
    for name, data in events:
        assert json.loads(data)["type"] == name  # every event has a matching event: line
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    datas = [json.loads(d) for _, d in events]
    text = "".join(d["delta"]["text"] for d in datas
                   if d["type"] == "content_block_delta" and d["delta"]["type"] == "text_delta")
    assert text == "Checking now."
    pieces = [d["delta"]["partial_json"] for d in datas
              if d["type"] == "content_block_delta"
              and d["delta"]["type"] == "input_json_delta"]
    assert len(pieces) >= 3 and pieces[0] == ""
    assert json.loads("".join(pieces)) == {"command": "ls -la /tmp"}
    assert datas[-2]["delta"]["stop_reason"] == "tool_use"
    assert datas[-2]["usage"]["output_tokens"] >= 1


def test_anthropic_reply_follows_tool_results_not_a_global_counter() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE, side_text="Title") as up, anthropic_client(up) as c:
        first = c.messages.create(model="m", max_tokens=64, tools=[ANTHROPIC_BASH],
                                  messages=[{"role": "user", "content": "go"}])
        side = c.messages.create(model="m", max_tokens=64,
                                 messages=[{"role": "user", "content": "title this"}])
        again = c.messages.create(model="m", max_tokens=64, tools=[ANTHROPIC_BASH],
                                  messages=[{"role": "user", "content": "go"}])
        tool_use = first.content[0]
        second = c.messages.create(model="m", max_tokens=64, tools=[ANTHROPIC_BASH], messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [tool_use.model_dump()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                          "content": "ok"}]},
        ])
    assert first.stop_reason == "tool_use" and again.stop_reason == "tool_use"
    assert side.content[0].text == "Title"
    assert second.stop_reason == "end_turn" and second.content[0].text == "Done."


def test_anthropic_count_tokens_and_models_list() -> None:
    with ScriptedUpstream() as up, anthropic_client(up) as c:
        n = c.messages.count_tokens(model="m", messages=[{"role": "user", "content": "a b c"}])
        models = c.models.list()
    assert n.input_tokens >= 3
    ids = [m.id for m in models.data]
    assert ids and all(i.startswith("claude-") for i in ids)
    assert all(m.type == "model" for m in models.data)


def test_anthropic_error_event_fault_raises_status_error_mid_stream() -> None:
    fault = Fault(kind="error_event", status=529, after_events=3)
    with ScriptedUpstream(["some longer text here"], fault=fault) as up, \
            anthropic_client(up, max_retries=0) as c:
        seen = []
        with pytest.raises(anthropic.APIStatusError) as e, c.messages.stream(
                model="m", max_tokens=9, messages=[{"role": "user", "content": "x"}]) as s:
            for ev in s:
                seen.append(ev.type)
    assert "overloaded_error" in str(e.value)
    assert "message_start" in seen


# --------------------------------------------------------------------------- OpenAI Chat


def test_chat_non_stream_tool_call_has_json_string_arguments() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE) as up, openai_client(up) as c:
        r = c.chat.completions.create(model="gpt-4o", tools=[CHAT_SHELL],
                                      messages=[{"role": "user", "content": "go"}])
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "shell"
    assert json.loads(call.function.arguments) == {"command": ["bash", "-lc", "echo hi > out.txt"]}
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_tool_call_deltas_reassemble_and_usage_chunk_comes_last() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE) as up, openai_client(up) as c:
        chunks = list(c.chat.completions.create(
            model="gpt-4o", tools=[CHAT_SHELL], stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "go"}]))
    assert len({ch.id for ch in chunks}) == 1
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    args = ""
    names = []
    for ch in chunks:
        for choice in ch.choices:
            for tc in choice.delta.tool_calls or []:
                assert tc.index == 0
                if tc.function.name:
                    names.append(tc.function.name)
                args += tc.function.arguments or ""
    assert names == ["shell"]
    assert json.loads(args)["command"][-1] == "echo hi > out.txt"
    assert sum(1 for ch in chunks for ch_c in ch.choices if ch_c.delta.tool_calls) >= 3
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert all(ch.usage is None for ch in chunks[:-1])


def test_chat_stream_ends_with_done_and_has_no_usage_unless_asked() -> None:
    with ScriptedUpstream(["Hi there you."]) as up:
        r = httpx.post(up.openai_base_url + "/chat/completions", json={
            "model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "x"}]},
            headers={"authorization": f"Bearer {KEY}"})
    events = sse_events(r.content)
    assert all(name is None for name, _ in events)  # Chat streams have data: lines only
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks) == \
        "Hi there you."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in ch for ch in chunks)


def test_chat_stream_helper_gives_final_completion() -> None:
    with ScriptedUpstream(["All done here."]) as up, openai_client(up) as c, \
            c.chat.completions.stream(model="gpt-4o",
                                      messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.content == "All done here."
    assert final.choices[0].finish_reason == "stop"


def test_chat_second_turn_after_tool_message_is_text() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE) as up, openai_client(up) as c:
        r = c.chat.completions.create(model="gpt-4o", tools=[CHAT_SHELL], messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "shell", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        ])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "Done."


def test_openai_status_fault_returns_provider_error_json() -> None:
    with ScriptedUpstream(["x"], fault=Fault(kind="status", status=500)) as up, \
            openai_client(up, max_retries=0) as c, pytest.raises(openai.InternalServerError) as e:
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    body = e.value.body
    assert isinstance(body, dict) and body["type"] == "server_error"


# --------------------------------------------------------------------------- OpenAI Responses


def test_responses_non_stream_function_call_item() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE) as up, openai_client(up) as c:
        r = c.responses.create(model="gpt-5", input="go", tools=[RESP_SHELL])
    assert r.id.startswith("resp_") and r.status == "completed"
    (item,) = r.output
    assert item.type == "function_call" and item.id.startswith("fc_")
    assert item.call_id.startswith("call_") and item.name == "shell"
    assert json.loads(item.arguments)["command"][0] == "bash"
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_responses_stream_helper_final_response_and_sequence_numbers() -> None:
    script = [{"text": "Final answer text."}]
    with ScriptedUpstream(script) as up, openai_client(up) as c, \
            c.responses.stream(model="gpt-5", input="hi") as s:
        events = list(s)
        final = s.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert types.count("response.output_text.delta") >= 3
    assert final.output_text == "Final answer text."
    assert final.output[0].id.startswith("msg_")
    assert final.usage is not None and final.usage.output_tokens >= 1


def test_responses_stream_function_call_arguments_events() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE) as up:
        r = httpx.post(up.openai_base_url + "/responses", json={
            "model": "gpt-5", "input": "go", "stream": True, "tools": [RESP_SHELL]})
    events = sse_events(r.content)
    for name, data in events:
        assert json.loads(data)["type"] == name
    datas = [json.loads(d) for _, d in events]
    deltas = [d["delta"] for d in datas if d["type"] == "response.function_call_arguments.delta"]
    done = next(d for d in datas if d["type"] == "response.function_call_arguments.done")
    assert len(deltas) >= 2 and "".join(deltas) == done["arguments"]
    assert done["name"] == "shell"
    assert datas[-1]["response"]["output"][0]["arguments"] == done["arguments"]


def test_responses_previous_response_id_counts_earlier_tool_results() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE) as up, openai_client(up) as c:
        first = c.responses.create(model="gpt-5", input="go", tools=[RESP_SHELL])
        call = first.output[0]
        second = c.responses.create(model="gpt-5", tools=[RESP_SHELL],
                                    previous_response_id=first.id,
                                    input=[{"type": "function_call_output",
                                            "call_id": call.call_id, "output": "ok"}])
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model="gpt-5", input="x", previous_response_id="resp_nope")
    assert second.output_text == "Done."
    assert second.previous_response_id == first.id
    assert e.value.code == "previous_response_not_found"


def test_responses_websocket_serves_several_creates_on_one_socket() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE) as up:
        with ws_connect(up.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"},
                        open_timeout=5, close_timeout=2) as ws:
            ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "go",
                                "tools": [RESP_SHELL]}))
            first = _ws_until_completed(ws)
            done = first[-1]["response"]
            call = done["output"][0]
            ws.send(json.dumps({"type": "response.create", "model": "gpt-5",
                                "tools": [RESP_SHELL], "previous_response_id": done["id"],
                                "input": [{"type": "function_call_output",
                                           "call_id": call["call_id"], "output": "ok"}]}))
            second = _ws_until_completed(ws)
        recs = up.received
    assert [e["sequence_number"] for e in first] == list(range(len(first)))
    assert first[0]["type"] == "response.created"
    assert call["type"] == "function_call" and call["name"] == "shell"
    assert second[-1]["response"]["output"][0]["content"][0]["text"] == "Done."
    assert [r.transport for r in recs] == ["websocket", "websocket"]
    assert recs[0].connection_id == recs[1].connection_id is not None
    assert recs[1].body["previous_response_id"] == done["id"]
    assert recs[0].headers["authorization"] == f"Bearer {KEY}"


def _ws_until_completed(ws: Any) -> list[dict[str, Any]]:
    events = []
    for _ in range(500):
        ev = json.loads(ws.recv(timeout=5))
        events.append(ev)
        if ev["type"] in ("response.completed", "response.failed", "error"):
            return events
    raise AssertionError("no response.completed")


def test_responses_websocket_status_fault_is_wrapped_error_event() -> None:
    fault = Fault(kind="status", status=429, times=1)
    with ScriptedUpstream(["hi"], fault=fault) as up, \
            ws_connect(up.ws_url, open_timeout=5, close_timeout=2) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "x"}))
        err = _ws_until_completed(ws)[-1]
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "x"}))
        ok = _ws_until_completed(ws)[-1]
    assert err["type"] == "error" and err["status"] == 429
    assert err["error"]["code"] == "rate_limit_exceeded"
    assert ok["type"] == "response.completed"


def test_codex_chatgpt_path_serves_responses() -> None:
    with ScriptedUpstream(["hello"]) as up, openai_client(up) as c:
        c = c.with_options(base_url=up.base_url + "/backend-api/codex")
        r = c.responses.create(model="gpt-5-codex", input="x")
    assert r.output_text == "hello"
    assert up.received[0].path == "/backend-api/codex/responses"


# --------------------------------------------------------------------------- tool choice


def _conv(tools: list[str], results: int = 0) -> Conversation:
    from .upstream import OfferedTool

    return Conversation("openai_responses", {}, tuple(OfferedTool(n, "function", {})
                                                     for n in tools), results, (), "http")


def test_by_tool_picks_first_entry_the_request_offers() -> None:
    script = [{"tool_call": {"by_tool": {"Bash": {"command": "ls"},
                                         "exec_command": {"cmd": "ls"},
                                         "shell": {"command": ["ls"]}}}}]
    tools = [{**RESP_SHELL, "name": "exec_command"}, RESP_SHELL]
    with ScriptedUpstream(script) as up, openai_client(up) as c:
        r = c.responses.create(model="gpt-5", input="x", tools=tools)
    assert r.output[0].name == "exec_command"
    assert json.loads(r.output[0].arguments) == {"cmd": "ls"}


def test_shell_command_maps_onto_offered_shell_tools() -> None:
    with ScriptedUpstream(SHELL_THEN_DONE) as up, openai_client(up) as c:
        tools = [{**RESP_SHELL, "name": "shell_command"}]
        r = c.responses.create(model="gpt-5", input="x", tools=tools)
        local = c.responses.create(model="gpt-5", input="x", tools=[{"type": "local_shell"}])
    assert r.output[0].name == "shell_command"
    assert json.loads(r.output[0].arguments) == {"command": "echo hi > out.txt"}
    assert local.output[0].type == "local_shell_call"
    assert local.output[0].action.command == ["bash", "-lc", "echo hi > out.txt"]


def test_tool_mapper_hook_and_callable_script() -> None:
    def mapper(spec: ToolCallSpec, conv: Conversation) -> tuple[str, Any] | None:
        return ("run", {"argv": spec.arguments["command"]}) if conv.offers("run") else None

    def script(conv: Conversation) -> Any:
        return SHELL_THEN_DONE[min(conv.tool_results, 1)]

    with ScriptedUpstream(script, tool_mapper=mapper) as up, openai_client(up) as c:
        r = c.responses.create(model="gpt-5", input="x", tools=[{**RESP_SHELL, "name": "run"}])
    assert r.output[0].name == "run"
    assert json.loads(r.output[0].arguments)["argv"][0] == "bash"


def test_select_turn_consumes_one_result_per_call_and_repeats_last() -> None:
    turns = [parse_turn(t) for t in [
        {"tool_calls": [{"name": "a"}, {"name": "b"}]}, {"tool_call": {"name": "c"}}, "end"]]
    assert select_turn(turns, 0) is turns[0]
    assert select_turn(turns, 1) is turns[0]
    assert select_turn(turns, 2) is turns[1]
    assert select_turn(turns, 3) is turns[2]
    assert select_turn(turns, 99) is turns[2]
    assert parse_turn("hi") == Turn(text="hi")
    with pytest.raises(ValueError):
        parse_turn({"txt": "typo"})


# --------------------------------------------------------------------------- bodies and faults


@pytest.mark.parametrize("encoding", ["zstd", "gzip", "br"])
def test_compressed_request_bodies_are_decoded(encoding: str) -> None:
    body = {"model": "gpt-5", "input": "compressed hello " * 50}
    raw = json.dumps(body).encode()
    packed = {"zstd": zstandard.ZstdCompressor().compress, "gzip": gzip.compress,
              "br": brotli.compress}[encoding](raw)
    with ScriptedUpstream(["ok"]) as up:
        r = httpx.post(up.openai_base_url + "/responses", content=packed, headers={
            "content-encoding": encoding, "content-type": "application/json"})
        (rec,) = up.received
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "ok"
    assert rec.body == body and rec.raw_body == packed and rec.content_encoding == encoding


def test_zstd_stream_without_content_size_decodes() -> None:
    raw = b'{"a": 1}' * 1000
    obj = zstandard.ZstdCompressor().compressobj()  # streaming: no content size in the frame
    packed = obj.compress(raw) + obj.flush()
    assert decode_body(packed, "zstd") == raw
    assert decode_body(packed + packed, "zstd") == raw + raw  # several frames
    with pytest.raises(ValueError):
        decode_body(b"x", "compress")


def test_invalid_request_json_gets_400_and_is_recorded_raw() -> None:
    with ScriptedUpstream(["ok"]) as up:
        r = httpx.post(up.base_url + "/v1/messages", content=b"{nope",
                       headers={"content-type": "application/json"})
        (rec,) = up.received
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert rec.body == b"{nope"


def test_anthropic_529_fault_then_retry_succeeds_when_times_is_one() -> None:
    fault = Fault(kind="status", status=529, times=1)
    with ScriptedUpstream(["fine"], fault=fault) as up:
        with anthropic_client(up, max_retries=0) as c, pytest.raises(anthropic.APIStatusError) as e:
            c.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        assert e.value.status_code == 529
        assert e.value.body["error"]["type"] == "overloaded_error"
        with anthropic_client(up, max_retries=0) as c:
            ok = c.messages.create(model="m", max_tokens=5,
                                   messages=[{"role": "user", "content": "x"}])
    assert ok.content[0].text == "fine"


def test_reset_mid_stream_cuts_after_n_events() -> None:
    fault = Fault(kind="reset_mid_stream", after_events=3)
    with ScriptedUpstream(["one two three four five six"], fault=fault) as up:
        got: list[bytes] = []
        with pytest.raises(httpx.HTTPError), httpx.stream(
                "POST", up.openai_base_url + "/chat/completions", json={
                    "model": "gpt-4o", "stream": True,
                    "messages": [{"role": "user", "content": "x"}]}) as r:
            for chunk in r.iter_raw():
                got.append(chunk)
    events = sse_events(b"".join(got))
    assert len(events) == 3


def test_close_after_last_event_leaves_body_without_terminator() -> None:
    fault = Fault(kind="close_after_last_event")
    with ScriptedUpstream(["short reply"], fault=fault) as up:
        got: list[bytes] = []
        with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
                "POST", up.base_url + "/v1/messages", json={
                    "model": "m", "max_tokens": 5, "stream": True,
                    "messages": [{"role": "user", "content": "x"}]}) as r:
            for chunk in r.iter_raw():
                got.append(chunk)
    names = [n for n, _ in sse_events(b"".join(got))]
    assert names[-1] == "message_stop"


def test_invalid_json_fault_corrupts_one_event() -> None:
    fault = Fault(kind="invalid_json", after_events=1)
    with ScriptedUpstream(["a b c"], fault=fault) as up:
        r = httpx.post(up.openai_base_url + "/responses", json={
            "model": "gpt-5", "input": "x", "stream": True})
    datas = [d for _, d in sse_events(r.content)]
    json.loads(datas[0])
    with pytest.raises(ValueError):
        json.loads(datas[1])
    json.loads(datas[-1])


def test_stall_and_delay_hold_back_events() -> None:
    fault = Fault(kind="stall_mid_stream", after_events=1, stall_s=0.4)
    with ScriptedUpstream(["a b"], fault=fault, delay_s=0.05) as up:
        times = []
        t0 = time.monotonic()
        with httpx.stream("POST", up.openai_base_url + "/chat/completions", json={
                "model": "gpt-4o", "stream": True,
                "messages": [{"role": "user", "content": "x"}]}) as r:
            for _ in r.iter_lines():
                times.append(time.monotonic() - t0)
    assert times[0] >= 0.04
    assert times[-1] >= 0.4 + 0.05 * 4


# --------------------------------------------------------------------------- routing and records


def test_unknown_paths_get_404_in_the_provider_shape() -> None:
    with ScriptedUpstream() as up:
        o = httpx.post(up.openai_base_url + "/embeddings", json={})
        a = httpx.get(up.base_url + "/v1/files", headers={"anthropic-version": "2023-06-01"})
    assert o.status_code == 404 and o.json()["error"]["type"] == "invalid_request_error"
    assert a.status_code == 404 and a.json()["error"]["type"] == "not_found_error"


def test_openai_models_list_shape() -> None:
    with ScriptedUpstream() as up, openai_client(up) as c:
        ids = [m.id for m in c.models.list()]
        one = c.models.retrieve(ids[0])
    assert "gpt-5" in ids and one.object == "model"


def test_received_records_every_request_with_transport() -> None:
    with ScriptedUpstream(["hi"]) as up:
        with anthropic_client(up) as a:
            a.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
            with a.messages.stream(model="m", max_tokens=5,
                                   messages=[{"role": "user", "content": "y"}]) as s:
                s.get_final_message()
        with openai_client(up) as o:
            list(o.chat.completions.create(model="g", stream=True,
                                           messages=[{"role": "user", "content": "z"}]))
        recs = up.wait_for_requests(3)
    assert [(r.method, r.path, r.transport, r.api) for r in recs] == [
        ("POST", "/v1/messages", "http", "anthropic_messages"),
        ("POST", "/v1/messages", "sse", "anthropic_messages"),
        ("POST", "/v1/chat/completions", "sse", "openai_chat"),
    ]
    assert recs[0].headers["x-api-key"] == KEY
    assert recs[2].headers["authorization"] == f"Bearer {KEY}"
    assert recs[1].body["messages"][0]["content"] == "y"


def test_binds_loopback_and_frees_port_on_exit() -> None:
    with ScriptedUpstream() as up:
        port = up.port
        assert up.base_url == f"http://127.0.0.1:{port}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free again


def test_count_tokens_is_crude_but_positive() -> None:
    assert count_tokens({"a": "hello world", "b": ["x, y"]}) == 5


def test_standalone_cli_serves_a_script_file(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "from the cli"}]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.upstream", "--port", str(port),
         "--script", str(script), "--max-seconds", "30"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"127.0.0.1:{port}" in line
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={
            "model": "g", "messages": [{"role": "user", "content": "x"}]})
        assert r.json()["choices"][0]["message"]["content"] == "from the cli"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_responses_error_event_fault_sends_response_failed() -> None:
    fault = Fault(kind="error_event", after_events=2, message="boom")
    with ScriptedUpstream(["a b c"], fault=fault) as up:
        r = httpx.post(up.openai_base_url + "/responses", json={
            "model": "gpt-5", "input": "x", "stream": True})
    datas = [json.loads(d) for _, d in sse_events(r.content)]
    assert [d["type"] for d in datas] == ["response.created", "response.in_progress",
                                         "response.failed"]
    assert datas[-1]["sequence_number"] == 2
    assert datas[-1]["response"]["status"] == "failed"
    assert datas[-1]["response"]["error"]["message"] == "boom"


def test_stop_is_prompt_with_a_stalled_stream_and_an_open_websocket() -> None:
    fault = Fault(kind="stall_mid_stream", after_events=1, stall_s=60)
    up = ScriptedUpstream(["x"], fault=fault).start()
    with httpx.Client(timeout=30) as client, \
            ws_connect(up.ws_url, open_timeout=5, close_timeout=2) as ws, \
            client.stream("POST", up.openai_base_url + "/chat/completions", json={
                "model": "g", "stream": True,
                "messages": [{"role": "user", "content": "x"}]}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        t0 = time.monotonic()
        up.stop()
        assert time.monotonic() - t0 < 5
        with pytest.raises(httpx.HTTPError):
            list(lines)
        del ws


def test_custom_tool_gets_a_custom_tool_call_with_string_input() -> None:
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
    script = [{"tool_call": {"name": "apply_patch", "arguments": patch}}, "Patched."]
    tools = [{"type": "custom", "name": "apply_patch", "description": "Apply a patch",
              "format": {"type": "text"}}]
    with ScriptedUpstream(script) as up, openai_client(up) as c:
        with c.responses.stream(model="gpt-5", input="x", tools=tools) as s:
            first = s.get_final_response()
        item = first.output[0]
        second = c.responses.create(model="gpt-5", tools=tools, input=[
            {"role": "user", "content": "x"},
            {"type": "custom_tool_call", "call_id": item.call_id, "name": "apply_patch",
             "input": item.input},
            {"type": "custom_tool_call_output", "call_id": item.call_id, "output": "Done!"}])
    assert item.type == "custom_tool_call" and item.input == patch
    assert item.id.startswith("ctc_")
    assert second.output_text == "Patched."
