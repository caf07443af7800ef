"""OpenAI Responses adapter (HTTP and Codex's WebSocket) against real-format fixtures."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import openai.types.responses
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from mitm_addon.protocols import find_adapter
from mitm_addon.protocols import openai_responses as orr
from mitm_addon.protocols.base import ParseError, SseEvent, Usage, reconstruct_request
from mitm_addon.sse import parse_sse

WIRE = Path(__file__).parents[2] / "fixtures" / "wire" / "openai_responses"


def load_json(name: str) -> Any:
    return json.loads((WIRE / name).read_bytes())


def load_events(name: str) -> list[SseEvent]:
    return parse_sse((WIRE / name).read_bytes())


def load_ws() -> list[str]:
    return (WIRE / "ws_server.jsonl").read_text(encoding="utf-8").splitlines()


def as_sse(datas: list[dict[str, Any]]) -> list[SseEvent]:
    return [SseEvent(event=d["type"], data=json.dumps(d)) for d in datas]


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/v1/responses", True),
        ("POST", "/responses", True),
        ("POST", "/backend-api/codex/responses", True),
        ("post", "/openai/v1/responses?api-version=preview", True),
        ("GET", "/v1/responses", False),
        ("GET", "/v1/responses/resp_123", False),
        ("POST", "/v1/responses/resp_123/cancel", False),
        ("GET", "/v1/responses/resp_123/input_items", False),
        ("POST", "/v1/responses/input_tokens", False),
        ("POST", "/backend-api/codex/responses/compact", False),
        ("POST", "/v1/chat/completions", False),
    ],
)
def test_matches_only_response_creation(method: str, path: str, expected: bool) -> None:
    assert orr.matches(method, path) is expected
    if expected:
        assert find_adapter(method, path) is orr.ADAPTER


def test_websocket_paths_match() -> None:
    assert orr.matches_websocket("/v1/responses")
    assert orr.matches_websocket("/backend-api/codex/responses")
    assert not orr.matches_websocket("/v1/realtime?model=gpt-realtime")


def test_reconstruct_gives_back_the_request_body() -> None:
    body = load_json("request_tool.json")
    parsed = orr.parse_request(body)
    assert parsed.items == body["input"] and parsed.items_form == "list"
    rebuilt = reconstruct_request(parsed.params, parsed.list_key, parsed.items, parsed.items_form)
    assert json.dumps(rebuilt, sort_keys=True) == json.dumps(body, sort_keys=True)


def test_request_exposes_model_stream_instructions_and_tool_names() -> None:
    parsed = orr.parse_request(load_json("request_tool.json"))
    assert (parsed.api, parsed.model, parsed.stream, parsed.list_key) == (
        "openai_responses",
        "gpt-4.1",
        True,
        "input",
    )
    assert parsed.tools == ["get_weather", "web_search"]  # built-in tools by their type
    assert parsed.params["instructions"] == "You are a helpful assistant."
    assert parsed.previous_response_id is None


def test_string_input_round_trips_in_string_form() -> None:
    body = {"model": "gpt-4.1", "input": "Tell me a joke", "previous_response_id": "resp_abc"}
    parsed = orr.parse_request(body)
    assert (parsed.items, parsed.items_form) == (["Tell me a joke"], "string")
    assert parsed.previous_response_id == "resp_abc" and parsed.stream is False
    rebuilt = reconstruct_request(parsed.params, parsed.list_key, parsed.items, parsed.items_form)
    assert rebuilt == body
    absent = orr.parse_request({"model": "gpt-4.1", "previous_response_id": "resp_abc"})
    assert absent.items_form == "absent"
    assert reconstruct_request(absent.params, "input", absent.items, absent.items_form) == {
        "model": "gpt-4.1",
        "previous_response_id": "resp_abc",
    }


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "input": {"role": "user"}},
        {"model": "m", "input": [], "stream": "true"},
        {"model": "m", "input": [], "previous_response_id": 5},
        {"model": "m", "input": [], "tools": [["web_search"]]},
        "input",
    ],
)
def test_malformed_request_is_a_parse_error(body: Any) -> None:
    with pytest.raises(ParseError):
        orr.parse_request(body)


def test_json_response_with_a_function_call() -> None:
    body = load_json("response_tool.json")
    parsed = orr.parse_response(body)
    assert parsed.response == body
    assert parsed.response_id == "resp_68a1c3f2e0b88190a7d41e5c3b2f9a6d0c4e8b1f7a3d5e92"
    assert parsed.model == "gpt-4.1-2025-04-14"
    assert parsed.stop_reason == "completed"
    assert parsed.tool_calls == ["get_weather"]
    assert parsed.output_items == body["output"]
    assert parsed.usage == Usage(
        input_tokens=291, output_tokens=23, cache_read_tokens=0, cache_write_tokens=0
    )
    assert parsed.complete and parsed.error is None
    openai.types.responses.Response.model_validate(body)


def test_stream_assembles_the_same_response_as_the_json_api() -> None:
    streamed = orr.parse_stream(load_events("stream_tool.sse"))
    direct = orr.parse_response(load_json("response_tool.json"))
    assert streamed == direct


@pytest.mark.parametrize("name", ["stream_tool.sse", "stream_text.sse"])
def test_assembled_response_is_accepted_by_the_sdk(name: str) -> None:
    events = load_events(name)
    adapter: TypeAdapter[Any] = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    for number, e in enumerate(events):
        data = json.loads(e.data)
        assert e.event == data["type"] and data["sequence_number"] == number
        adapter.validate_python(data)
    assembled = orr.parse_stream(events).response
    response = openai.types.responses.Response.model_validate(assembled)
    assert response.model_dump(mode="json", exclude_unset=True) == assembled


@pytest.mark.parametrize("name", ["stream_tool.sse", "stream_text.sse"])
def test_output_is_rebuilt_from_items_when_the_completed_event_has_none(name: str) -> None:
    events = [json.loads(e.data) for e in load_events(name)]
    expected = orr.parse_stream(as_sse(events))
    assert events[-1]["type"] == "response.completed"
    events[-1]["response"]["output"] = []
    assert orr.parse_stream(as_sse(events)) == expected


@pytest.mark.parametrize("name", ["stream_tool.sse", "stream_text.sse"])
def test_deltas_alone_rebuild_the_output(name: str) -> None:
    """Without any .done event the added items grow into the final items."""
    events = [json.loads(e.data) for e in load_events(name)]
    expected = orr.parse_stream(as_sse(events))
    assert expected.response is not None
    kept = [e for e in events if not e["type"].endswith(".done")]
    kept[-1] = copy.deepcopy(kept[-1])
    kept[-1]["response"]["output"] = []
    rebuilt = orr.parse_stream(as_sse(kept))
    assert rebuilt.response is not None
    for got, want in zip(rebuilt.response["output"], expected.response["output"], strict=True):
        # Items still say in_progress (only .done says completed) but the content matches.
        assert {k: v for k, v in got.items() if k != "status"} == {
            k: v for k, v in want.items() if k not in ("status", "encrypted_content")
        }


def test_reasoning_summary_and_text_assemble() -> None:
    parsed = orr.parse_stream(load_events("stream_text.sse"))
    assert parsed.tool_calls == []
    reasoning, message = parsed.output_items
    assert reasoning["type"] == "reasoning"
    assert reasoning["summary"][0]["text"].startswith("**Answering the weather question**")
    assert (
        message["content"][0]["text"]
        == "It's 18 °C in Paris with light rain — take an umbrella. ☔"
    )
    assert parsed.usage == Usage(
        input_tokens=348, output_tokens=145, cache_read_tokens=0, cache_write_tokens=0
    )


def test_truncated_stream_is_incomplete() -> None:
    events = load_events("stream_text.sse")
    assert orr.parse_stream(events).complete
    for cut in range(len(events)):
        partial = orr.parse_stream(events[:cut])
        assert not partial.complete
        if cut == 0:
            assert partial.response is None
        else:
            assert partial.response is not None and partial.response["status"] == "in_progress"
    # Cut in the middle of the answer text: the output holds what had arrived.
    cut = next(i for i, e in enumerate(events) if '"delta":" with light rain"' in e.data)
    partial = orr.parse_stream(events[:cut])
    assert partial.output_items[1]["content"][0]["text"] == "It's 18 °C in Paris"
    assert partial.output_items[0]["summary"][0]["text"].endswith("answer briefly.")


def test_failed_and_incomplete_responses_are_terminal() -> None:
    events = [json.loads(e.data) for e in load_events("stream_text.sse")]
    failed = copy.deepcopy(events[:2]) + [
        {
            "type": "response.failed",
            "sequence_number": 2,
            "response": {
                **events[0]["response"],
                "status": "failed",
                "error": {"code": "server_error", "message": "The model failed to respond."},
            },
        }
    ]
    parsed = orr.parse_stream(as_sse(failed))
    assert parsed.complete and parsed.stop_reason == "failed"
    assert parsed.error == "server_error: The model failed to respond."
    incomplete = copy.deepcopy(events)
    incomplete[-1]["type"] = "response.incomplete"
    incomplete[-1]["response"]["status"] = "incomplete"
    incomplete[-1]["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    parsed = orr.parse_stream(as_sse(incomplete))
    assert parsed.complete and parsed.stop_reason == "max_output_tokens" and parsed.error is None
    openai.types.responses.Response.model_validate(parsed.response)


def test_error_event_and_error_body_are_reported() -> None:
    events = [json.loads(e.data) for e in load_events("stream_text.sse")][:4]
    events.append(
        {
            "type": "error",
            "sequence_number": 4,
            "code": "rate_limit_exceeded",
            "message": "Rate limit reached",
            "param": None,
        }
    )
    parsed = orr.parse_stream(as_sse(events))
    assert not parsed.complete and parsed.error == "rate_limit_exceeded: Rate limit reached"
    body = orr.parse_response(load_json("error.json"))
    assert body.response is None and body.output_items == []
    assert body.error is not None and body.error.startswith("string_above_max_length: Invalid")


def test_websocket_request_round_trips() -> None:
    text = (WIRE / "ws_request.json").read_text(encoding="utf-8")
    parsed = orr.parse_ws_request(text)
    assert "type" not in parsed.params
    assert (parsed.model, parsed.stream, parsed.items_form) == ("gpt-5-codex", True, "list")
    assert parsed.tools == ["shell", "web_search"]
    assert parsed.params["include"] == ["reasoning.encrypted_content"]
    body = reconstruct_request(parsed.params, parsed.list_key, parsed.items, parsed.items_form)
    assert {"type": "response.create", **body} == json.loads(text)
    rendered = orr.render_ws_request(parsed)
    assert rendered == json.loads(text) and next(iter(rendered)) == "type"


@pytest.mark.parametrize(
    "text", ["not json", "[]", '{"type":"response.cancel"}', '{"model":"gpt-5-codex","input":[]}']
)
def test_websocket_request_of_another_shape_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        orr.parse_ws_request(text)


def test_websocket_messages_assemble_like_the_sse_stream() -> None:
    messages = load_ws()
    parsed = orr.parse_ws(messages)
    assert parsed.complete and parsed.error is None
    assert parsed.tool_calls == ["shell"]
    assert parsed.usage == Usage(
        input_tokens=4120, output_tokens=87, cache_read_tokens=3968, cache_write_tokens=0
    )
    assert [item["type"] for item in parsed.output_items] == ["reasoning", "function_call"]
    assert json.loads(parsed.output_items[1]["arguments"]) == {
        "command": ["bash", "-lc", "ls -la"],
        "workdir": "/home/user/project",
    }
    # The same JSON sent as SSE data assembles to the same result.
    sse = [SseEvent(event=json.loads(m)["type"], data=m) for m in messages]
    assert orr.parse_stream(sse) == parsed
    # The client's own response.create, if passed along, is skipped.
    request = (WIRE / "ws_request.json").read_text(encoding="utf-8")
    assert orr.parse_ws([request, *messages]) == parsed
    assert orr.ADAPTER.parse_ws is orr.parse_ws


def test_websocket_messages_are_valid_sdk_events() -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    kinds = []
    for message in load_ws():
        data = json.loads(message)
        kinds.append(data["type"])
        if not data["type"].startswith("codex."):
            adapter.validate_python(data)
    assert "codex.rate_limits" in kinds  # a ChatGPT-backend message, ignored by the parser
    openai.types.responses.Response.model_validate(orr.parse_ws(load_ws()).response)


def test_truncated_websocket_exchange_is_incomplete() -> None:
    messages = load_ws()
    for cut in range(len(messages)):
        assert not orr.parse_ws(messages[:cut]).complete


def test_wrapped_websocket_error_is_reported() -> None:
    error = {
        "type": "error",
        "status": 429,
        "error": {
            "type": "usage_limit_reached",
            "message": "The usage limit has been reached",
            "plan_type": "plus",
            "resets_at": 1755448898,
        },
    }
    parsed = orr.parse_ws([json.dumps(error)])
    assert parsed.response is None and not parsed.complete
    assert parsed.error == "usage_limit_reached: The usage limit has been reached"


@pytest.mark.parametrize(
    "messages",
    [
        ["not json"],
        ["[]"],
        ['{"type":"response.created","response":[]}'],
        ['{"type":"response.output_item.added","output_index":"0","item":{}}'],
        ['{"type":"response.output_item.added","output_index":0,"item":"x"}'],
        [
            '{"type":"response.output_item.added","output_index":0,"item":{"type":"message"}}',
            '{"type":"response.content_part.added","output_index":0,"content_index":4,"part":{}}',
        ],
        [
            '{"type":"response.output_item.added","output_index":0,"item":{"type":"message"}}',
            '{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":3}',
        ],
        ['{"type":"response.completed","response":{"output":{}}}'],
    ],
)
def test_malformed_stream_is_a_parse_error(messages: list[str]) -> None:
    with pytest.raises(ParseError):
        orr.parse_ws(messages)
    with pytest.raises(ParseError):
        orr.parse_stream([SseEvent(None, m) for m in messages])


@pytest.mark.parametrize(
    "body", [[], {"object": "list"}, {"object": "response", "output": {}}, {"error": "x"}]
)
def test_malformed_response_is_a_parse_error(body: Any) -> None:
    with pytest.raises(ParseError):
        orr.parse_response(body)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-1, 2) | st.sampled_from(["", "x", "message"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["output_index", "content_index", "summary_index", "item", "part", "delta", "text"]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=14,
)
_kind = st.sampled_from(
    [
        "response.created",
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.function_call_arguments.delta",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.completed",
        "error",
    ]
)


CREATED_MESSAGE = (WIRE / "ws_server.jsonl").read_text(encoding="utf-8").splitlines()[0]
_keys = st.sampled_from(
    ["output_index", "content_index", "summary_index", "item", "part", "delta", "text", "response"]
)


@settings(database=None, max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            _json,
            st.builds(lambda k, d: {**d, "type": k}, _kind, st.dictionaries(_keys, _json)),
            st.builds(
                lambda k, i, d: {**d, "type": k, "output_index": i, "content_index": 0},
                _kind,
                st.integers(0, 2),
                st.dictionaries(_keys, _json),
            ),
        ),
        max_size=8,
    )
)
def test_arbitrary_events_raise_only_parse_error(datas: list[Any]) -> None:
    created = CREATED_MESSAGE
    for messages in ([json.dumps(d) for d in datas], [created] + [json.dumps(d) for d in datas]):
        with contextlib.suppress(ParseError):
            orr.parse_ws(messages)
