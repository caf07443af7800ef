"""Anthropic Messages adapter against wire fixtures in the API's real formats."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import anthropic.types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from mitm_addon.protocols import anthropic_messages as am
from mitm_addon.protocols import find_adapter
from mitm_addon.protocols.base import ParseError, SseEvent, reconstruct_request
from mitm_addon.sse import parse_sse

WIRE = Path(__file__).parents[2] / "fixtures" / "wire" / "anthropic_messages"


def load_json(name: str) -> Any:
    return json.loads((WIRE / name).read_bytes())


def load_events(name: str) -> list[SseEvent]:
    return parse_sse((WIRE / name).read_bytes())


def event(data: dict[str, Any]) -> SseEvent:
    return SseEvent(event=data["type"], data=json.dumps(data))


def start_event(**usage: int) -> SseEvent:
    message = {
        "id": "msg_01TestTestTestTestTestTe",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 10, "output_tokens": 1},
    }
    return event({"type": "message_start", "message": message})


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/v1/messages", True),
        ("post", "/v1/messages?beta=true", True),
        ("POST", "/anthropic/v1/messages", True),
        ("POST", "/v1/messages/count_tokens", False),
        ("POST", "/v1/messages/count_tokens?beta=true", False),
        ("POST", "/v1/messages/batches", False),
        ("GET", "/v1/messages/batches/msgbatch_01", False),
        ("GET", "/v1/messages", False),
        ("POST", "/v1/complete", False),
        ("POST", "/v1/threads/thread_1/messages", False),
    ],
)
def test_matches_only_message_creation(method: str, path: str, expected: bool) -> None:
    assert am.matches(method, path) is expected
    if expected:
        assert find_adapter(method, path) is am.ADAPTER


@pytest.mark.parametrize("name", ["request_tool.json", "request_tool_result.json"])
def test_reconstruct_gives_back_the_request_body(name: str) -> None:
    body = load_json(name)
    parsed = am.parse_request(body)
    assert parsed.items == body["messages"]
    assert "messages" not in parsed.params
    rebuilt = reconstruct_request(parsed.params, parsed.list_key, parsed.items, parsed.items_form)
    assert json.dumps(rebuilt, sort_keys=True) == json.dumps(body, sort_keys=True)


def test_request_exposes_model_stream_and_tool_names() -> None:
    parsed = am.parse_request(load_json("request_tool.json"))
    assert parsed.api == "anthropic_messages"
    assert (parsed.model, parsed.stream, parsed.list_key) == (
        "claude-sonnet-4-5-20250929",
        True,
        "messages",
    )
    assert parsed.tools == ["get_weather", "web_search"]
    assert parsed.items_form == "list"
    assert {"system", "tools", "metadata", "max_tokens"} <= parsed.params.keys()
    assert parsed.previous_response_id is None


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": "hi"},
        {"model": "m"},
        {"model": 3, "messages": []},
        {"model": "m", "messages": [], "stream": "yes"},
        {"model": "m", "messages": [], "tools": {"name": "x"}},
        {"model": "m", "messages": [], "tools": ["x"]},
    ],
)
def test_malformed_request_is_a_parse_error(body: dict[str, Any]) -> None:
    with pytest.raises(ParseError):
        am.parse_request(body)


def test_json_response_with_a_tool_call() -> None:
    body = load_json("response_tool.json")
    parsed = am.parse_response(body)
    assert parsed.response == body
    assert parsed.response_id == "msg_01HCDu5LRGeP2o7s2xGmxyx8"
    assert parsed.model == "claude-sonnet-4-5-20250929"
    assert parsed.stop_reason == "tool_use"
    assert parsed.tool_calls == ["get_weather"]
    assert parsed.complete and parsed.error is None
    assert parsed.usage == am.Usage(
        input_tokens=472, output_tokens=89, cache_read_tokens=11264, cache_write_tokens=2048
    )
    assert parsed.output_items == [{"role": "assistant", "content": body["content"]}]


def test_output_items_are_what_the_next_request_sends_back() -> None:
    output = am.parse_response(load_json("response_tool.json")).output_items
    next_request = am.parse_request(load_json("request_tool_result.json"))
    assert next_request.items[1] == output[0]
    streamed = am.parse_stream(load_events("stream_tool.sse")).output_items
    assert streamed == output


@pytest.mark.parametrize(
    ("stream", "json_body"),
    [("stream_tool.sse", "response_tool.json"), ("stream_text.sse", "response_text.json")],
)
def test_stream_assembles_the_same_message_as_the_json_api(stream: str, json_body: str) -> None:
    streamed = am.parse_stream(load_events(stream))
    direct = am.parse_response(load_json(json_body))
    assert streamed.response == direct.response
    assert streamed == direct


@pytest.mark.parametrize("name", ["stream_tool.sse", "stream_text.sse"])
def test_assembled_message_is_accepted_by_the_sdk(name: str) -> None:
    assembled = am.parse_stream(load_events(name)).response
    message = anthropic.types.Message.model_validate(assembled)
    assert message.model_dump(mode="json", exclude_unset=True) == assembled


@pytest.mark.parametrize("name", ["stream_tool.sse", "stream_text.sse", "stream_error.sse"])
def test_fixture_events_are_valid_sdk_stream_events(name: str) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(anthropic.types.RawMessageStreamEvent)
    events = load_events(name)
    assert all(e.event == json.loads(e.data)["type"] for e in events)
    for e in events:
        if e.event not in ("ping", "error"):
            adapter.validate_python(json.loads(e.data))
    for name_ in ("response_tool.json", "response_text.json"):
        anthropic.types.Message.model_validate(load_json(name_))


def test_sdk_accumulator_builds_the_same_message() -> None:
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot = None
    for e in load_events("stream_tool.sse"):
        if e.event != "ping":
            snapshot = accumulate_event(event=json.loads(e.data), current_snapshot=snapshot)
    assert snapshot is not None
    sdk = snapshot.to_dict(mode="json")
    # The SDK copies message_delta's optional stop_details even when the event has none.
    assert sdk.pop("stop_details", None) is None
    assert sdk == am.parse_stream(load_events("stream_tool.sse")).response


def test_truncated_stream_is_incomplete() -> None:
    events = load_events("stream_tool.sse")
    full = am.parse_stream(events)
    assert full.complete
    for cut in range(len(events)):
        partial = am.parse_stream(events[:cut])
        assert not partial.complete
        if cut == 0:
            assert partial.response is None and partial.output_items == []
        else:
            assert partial.response_id == full.response_id
    # Cut inside the tool input: the block keeps its start input rather than raising.
    stop = next(i for i, e in enumerate(events) if '"partial_json":", ' in e.data)
    partial = am.parse_stream(events[:stop])
    assert partial.response is not None
    assert partial.response["content"][1] == {
        "type": "tool_use",
        "id": "toolu_01A09q90qw90lq917835lq9W",
        "name": "get_weather",
        "input": {},
    }


def test_error_event_is_reported_and_leaves_the_stream_incomplete() -> None:
    parsed = am.parse_stream(load_events("stream_error.sse"))
    assert parsed.error == "overloaded_error: Overloaded"
    assert not parsed.complete
    assert parsed.response is not None
    assert parsed.response["content"] == [{"type": "text", "text": "Let me"}]


def test_error_body_is_reported() -> None:
    parsed = am.parse_response(load_json("error.json"))
    assert parsed.response is None and parsed.output_items == []
    assert parsed.error is not None and parsed.error.startswith("invalid_request_error: max_tokens")


def test_usage_merges_message_start_and_message_delta() -> None:
    events = [
        start_event(input_tokens=5, cache_read_input_tokens=100, output_tokens=1),
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 42, "input_tokens": None},
            }
        ),
        event({"type": "message_stop"}),
    ]
    parsed = am.parse_stream(events)
    assert parsed.response is not None
    assert parsed.response["usage"] == {
        "input_tokens": 5,
        "cache_read_input_tokens": 100,
        "output_tokens": 42,
    }
    assert parsed.usage == am.Usage(input_tokens=5, output_tokens=42, cache_read_tokens=100)
    assert parsed.stop_reason == "end_turn" and parsed.complete


def test_citations_and_redacted_thinking_assemble() -> None:
    citation = {
        "type": "char_location",
        "cited_text": "18 °C",
        "document_index": 0,
        "document_title": "forecast",
        "start_char_index": 0,
        "end_char_index": 5,
        "file_id": None,
    }
    events = [
        start_event(),
        event(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3p"},
            }
        ),
        event({"type": "content_block_stop", "index": 0}),
        event(
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "text", "text": "", "citations": []},
            }
        ),
        event(
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "citations_delta", "citation": citation},
            }
        ),
        event(
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "text_delta", "text": "It is 18 °C."},
            }
        ),
        event({"type": "content_block_stop", "index": 1}),
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 9},
            }
        ),
        event({"type": "message_stop"}),
    ]
    parsed = am.parse_stream(events)
    assert parsed.response is not None
    assert parsed.response["content"] == [
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3p"},
        {"type": "text", "text": "It is 18 °C.", "citations": [citation]},
    ]
    anthropic.types.Message.model_validate(parsed.response)


def test_tool_without_arguments_keeps_empty_input() -> None:
    events = [
        start_event(),
        event(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_01Xy",
                    "name": "list_files",
                    "input": {},
                },
            }
        ),
        event(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": ""},
            }
        ),
        event({"type": "content_block_stop", "index": 0}),
        event({"type": "message_stop"}),
    ]
    parsed = am.parse_stream(events)
    assert parsed.response is not None
    assert parsed.response["content"][0]["input"] == {}
    assert parsed.tool_calls == ["list_files"]


def test_unknown_events_and_deltas_are_skipped() -> None:
    events = [
        start_event(),
        event({"type": "future_event", "x": 1}),
        event(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
        ),
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "future_delta"}}),
        event({"type": "message_stop"}),
    ]
    assert am.parse_stream(events).complete


@pytest.mark.parametrize(
    "datas",
    [
        ["not json"],
        ['["a list"]'],
        ['{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'],
        [
            start_event().data,
            '{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"x"}}',
        ],
        [
            start_event().data,
            '{"type":"content_block_start","index":2,"content_block":{"type":"text"}}',
        ],
        [start_event().data, '{"type":"content_block_start","index":0}'],
        [start_event().data, '{"type":"content_block_stop","index":"0"}'],
        [
            start_event().data,
            '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
            '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":5}}',
        ],
        [
            start_event().data,
            '{"type":"content_block_start","index":0,'
            '"content_block":{"type":"tool_use","id":"t","name":"n","input":{}}}',
            '{"type":"content_block_delta","index":0,'
            '"delta":{"type":"input_json_delta","partial_json":"{oops"}}',
            '{"type":"content_block_stop","index":0}',
        ],
        ['{"type":"message_start","message":{"content":"text"}}'],
    ],
)
def test_malformed_stream_is_a_parse_error(datas: list[str]) -> None:
    with pytest.raises(ParseError):
        am.parse_stream([SseEvent(event=None, data=d) for d in datas])


@pytest.mark.parametrize(
    "body",
    [[], {"type": "message"}, {"type": "message", "content": {}}, {"type": "other"}, "text"],
)
def test_malformed_response_is_a_parse_error(body: Any) -> None:
    with pytest.raises(ParseError):
        am.parse_response(body)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 3) | st.sampled_from(["", "x", "text", "{"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["type", "index", "delta", "content_block", "message", "usage", "text"]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["index", "delta", "content_block", "message", "usage", "text", "partial_json", "error"]
)
_event_type = st.sampled_from(
    [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "error",
        "ping",
    ]
)


@settings(database=None, max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            _json,
            st.builds(lambda t, d: {**d, "type": t}, _event_type, st.dictionaries(_keys, _json)),
            st.builds(
                lambda t, i, d: {**d, "type": t, "index": i},
                _event_type,
                st.integers(0, 2),
                st.dictionaries(_keys, _json),
            ),
        ),
        max_size=8,
    )
)
def test_arbitrary_events_raise_only_parse_error(datas: list[Any]) -> None:
    events = [start_event()] + [SseEvent(None, json.dumps(d)) for d in datas]
    for sequence in (events, events[1:]):
        with contextlib.suppress(ParseError):
            am.parse_stream(sequence)
