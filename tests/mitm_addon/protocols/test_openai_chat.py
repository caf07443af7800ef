"""OpenAI Chat Completions adapter against wire fixtures in the API's real formats."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import openai.types.chat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mitm_addon.protocols import find_adapter
from mitm_addon.protocols import openai_chat as oc
from mitm_addon.protocols.base import ParseError, SseEvent, Usage, reconstruct_request
from mitm_addon.sse import parse_sse

WIRE = Path(__file__).parents[2] / "fixtures" / "wire" / "openai_chat"
DONE = SseEvent(event=None, data="[DONE]")


def load_json(name: str) -> Any:
    return json.loads((WIRE / name).read_bytes())


def load_events(name: str) -> list[SseEvent]:
    return parse_sse((WIRE / name).read_bytes())


def chunk(choices: list[dict[str, Any]], **extra: Any) -> SseEvent:
    body = {
        "id": "chatcmpl-Test",
        "object": "chat.completion.chunk",
        "created": 1754932117,
        "model": "gpt-4.1-2025-04-14",
        "system_fingerprint": "fp_b3f1157249",
        "choices": choices,
        **extra,
    }
    return SseEvent(event=None, data=json.dumps(body))


def delta(index: int, finish_reason: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"index": index, "delta": fields, "logprobs": None, "finish_reason": finish_reason}


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/v1/chat/completions", True),
        ("POST", "/chat/completions", True),
        ("post", "/openai/deployments/gpt4/chat/completions?api-version=2024-10-21", True),
        ("POST", "/api/v1/chat/completions/", True),
        ("GET", "/v1/chat/completions", False),
        ("POST", "/v1/chat/completions/chatcmpl-abc", False),
        ("GET", "/v1/chat/completions/chatcmpl-abc/messages", False),
        ("POST", "/v1/completions", False),
        ("POST", "/v1/responses", False),
    ],
)
def test_matches_only_chat_completion_creation(method: str, path: str, expected: bool) -> None:
    assert oc.matches(method, path) is expected
    if expected:
        assert find_adapter(method, path) is oc.ADAPTER


def test_reconstruct_gives_back_the_request_body() -> None:
    body = load_json("request_tool.json")
    parsed = oc.parse_request(body)
    assert parsed.items == body["messages"] and parsed.items_form == "list"
    rebuilt = reconstruct_request(parsed.params, parsed.list_key, parsed.items, parsed.items_form)
    assert json.dumps(rebuilt, sort_keys=True) == json.dumps(body, sort_keys=True)


def test_request_exposes_model_stream_and_tool_names() -> None:
    parsed = oc.parse_request(load_json("request_tool.json"))
    assert (parsed.api, parsed.model, parsed.stream) == ("openai_chat", "gpt-4.1", True)
    assert parsed.tools == ["get_weather"]
    assert parsed.params["stream_options"] == {"include_usage": True}
    custom = oc.parse_request(
        {
            "model": "gpt-5",
            "messages": [],
            "tools": [{"type": "custom", "custom": {"name": "apply_patch"}}],
        }
    )
    assert custom.tools == ["apply_patch"] and custom.stream is False


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": "hi"},
        {"model": "m"},
        {"model": "m", "messages": [], "stream": 1},
        {"model": "m", "messages": [], "tools": "get_weather"},
        [],
    ],
)
def test_malformed_request_is_a_parse_error(body: Any) -> None:
    with pytest.raises(ParseError):
        oc.parse_request(body)


def test_json_response_with_a_tool_call() -> None:
    body = load_json("response_tool.json")
    parsed = oc.parse_response(body)
    assert parsed.response == body
    assert parsed.response_id == "chatcmpl-C3kPZ8yQm1VbXo7tRgLw2NfHsEa9d"
    assert parsed.model == "gpt-4.1-2025-04-14"
    assert parsed.stop_reason == "tool_calls"
    assert parsed.tool_calls == ["get_weather"]
    assert parsed.usage == Usage(input_tokens=82, output_tokens=23, cache_read_tokens=0)
    assert parsed.complete and parsed.error is None
    assert parsed.output_items == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": body["choices"][0]["message"]["tool_calls"],
        }
    ]
    openai.types.chat.ChatCompletion.model_validate(body)


def test_stream_assembles_the_same_completion_as_the_json_api() -> None:
    streamed = oc.parse_stream(load_events("stream_tool.sse"))
    direct = oc.parse_response(load_json("response_tool.json"))
    assert direct.response is not None and streamed.response is not None
    # Chunks carry no empty annotations list; everything else is the same object.
    del direct.response["choices"][0]["message"]["annotations"]
    assert streamed.response == direct.response
    assert streamed == direct


@pytest.mark.parametrize("name", ["stream_tool.sse", "stream_text.sse"])
def test_assembled_completion_is_accepted_by_the_sdk(name: str) -> None:
    events = load_events(name)
    assert events[-1] == DONE
    for e in events[:-1]:
        openai.types.chat.ChatCompletionChunk.model_validate(json.loads(e.data))
    assembled = oc.parse_stream(events).response
    completion = openai.types.chat.ChatCompletion.model_validate(assembled)
    assert completion.model_dump(mode="json", exclude_unset=True) == assembled


def test_text_stream_assembles_content_and_output_item() -> None:
    parsed = oc.parse_stream(load_events("stream_text.sse"))
    text = "It's 18 °C in Paris with light rain — take an umbrella. ☔"
    assert parsed.complete and parsed.stop_reason == "stop"
    assert parsed.output_items == [{"role": "assistant", "content": text}]
    assert parsed.usage is None  # no stream_options.include_usage: no usage chunk
    assert parsed.tool_calls == []


def test_truncated_stream_is_incomplete() -> None:
    events = load_events("stream_tool.sse")
    assert oc.parse_stream(events).complete
    for cut in range(len(events)):
        partial = oc.parse_stream(events[:cut])
        assert not partial.complete
        if cut == 0:
            assert partial.response is None
    # A stream that ends in [DONE] without any finish_reason is cut short too.
    without_finish = [e for e in events if '"finish_reason":"tool_calls"' not in e.data]
    assert not oc.parse_stream(without_finish).complete
    # Arguments cut mid-JSON stay as the text received so far.
    partial = oc.parse_stream(events[:5])
    assert partial.output_items[0]["tool_calls"][0]["function"]["arguments"] == '{"location":"Paris'


def test_multiple_choices_keep_their_index() -> None:
    events = [
        chunk([delta(0, role="assistant", content=""), delta(1, role="assistant", content="")]),
        chunk([delta(1, content="B")]),
        chunk([delta(0, content="A")]),
        chunk([delta(1, content="b", refusal=None)]),
        chunk([delta(1, "stop"), delta(0, "length")]),
        DONE,
    ]
    parsed = oc.parse_stream(events)
    assert parsed.complete
    assert parsed.response is not None
    choices = parsed.response["choices"]
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in choices] == [
        (0, "A", "length"),
        (1, "Bb", "stop"),
    ]
    assert parsed.output_items == [{"role": "assistant", "content": "A"}]
    assert parsed.stop_reason == "length"
    openai.types.chat.ChatCompletion.model_validate(parsed.response)


def test_refusal_and_reasoning_text_concatenate() -> None:
    events = [
        chunk([delta(0, role="assistant", content=None, refusal="")]),
        chunk([delta(0, refusal="I can't help")]),
        chunk([delta(0, refusal=" with that.", reasoning_content="policy")]),
        chunk([delta(0, "stop")]),
        DONE,
    ]
    parsed = oc.parse_stream(events)
    assert parsed.response is not None
    message = parsed.response["choices"][0]["message"]
    assert message["refusal"] == "I can't help with that."
    assert message["reasoning_content"] == "policy"
    assert parsed.output_items == [
        {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    ]


def test_parallel_tool_calls_assemble_by_index() -> None:
    def call(index: int, **fields: Any) -> dict[str, Any]:
        return {"index": index, **fields}

    events = [
        chunk(
            [
                delta(
                    0,
                    role="assistant",
                    content=None,
                    tool_calls=[
                        call(
                            0, id="call_A", type="function", function={"name": "a", "arguments": ""}
                        )
                    ],
                )
            ]
        ),
        chunk(
            [
                delta(
                    0,
                    tool_calls=[
                        call(
                            1, id="call_B", type="function", function={"name": "b", "arguments": ""}
                        )
                    ],
                )
            ]
        ),
        chunk([delta(0, tool_calls=[call(1, function={"arguments": '{"y":'})])]),
        chunk([delta(0, tool_calls=[call(0, function={"arguments": "{}"})])]),
        chunk([delta(0, tool_calls=[call(1, function={"arguments": "2}"})])]),
        chunk([delta(0, "tool_calls")], usage=None),
        chunk([], usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}),
        DONE,
    ]
    parsed = oc.parse_stream(events)
    assert parsed.complete and parsed.tool_calls == ["a", "b"]
    assert parsed.output_items[0]["tool_calls"] == [
        {"id": "call_A", "type": "function", "function": {"name": "a", "arguments": "{}"}},
        {"id": "call_B", "type": "function", "function": {"name": "b", "arguments": '{"y":2}'}},
    ]
    assert parsed.usage == Usage(input_tokens=9, output_tokens=4)


def test_logprobs_concatenate() -> None:
    def lp(token: str) -> dict[str, Any]:
        return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}

    events = [
        chunk(
            [
                {
                    **delta(0, role="assistant", content="a"),
                    "logprobs": {"content": [lp("a")], "refusal": None},
                }
            ]
        ),
        chunk([{**delta(0, content="b"), "logprobs": {"content": [lp("b")], "refusal": None}}]),
        chunk([delta(0, "stop")]),
        DONE,
    ]
    parsed = oc.parse_stream(events)
    assert parsed.response is not None
    assert parsed.response["choices"][0]["logprobs"] == {
        "content": [lp("a"), lp("b")],
        "refusal": None,
    }
    openai.types.chat.ChatCompletion.model_validate(parsed.response)


def test_error_chunk_and_error_body_are_reported() -> None:
    error = {
        "message": "The server had an error",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    events = [
        chunk([delta(0, role="assistant", content="Hi")]),
        SseEvent(None, json.dumps({"error": error})),
    ]
    parsed = oc.parse_stream(events)
    assert parsed.error == "server_error: The server had an error"
    assert not parsed.complete
    body = oc.parse_response(load_json("error.json"))
    assert body.response is None and body.output_items == []
    assert body.error is not None and body.error.startswith("tokens: Rate limit reached")


@pytest.mark.parametrize(
    "datas",
    [
        ["{not json"],
        ["[1, 2]"],
        ['{"id":"x","choices":{}}'],
        ['{"id":"x","choices":[{"index":"0","delta":{}}]}'],
        ['{"id":"x","choices":[{"index":0,"delta":[]}]}'],
        ['{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"function":{}}]}}]}'],
        ['{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":7}]}'],
    ],
)
def test_malformed_stream_is_a_parse_error(datas: list[str]) -> None:
    with pytest.raises(ParseError):
        oc.parse_stream([SseEvent(None, d) for d in datas])


@pytest.mark.parametrize(
    "body",
    [[], {"object": "chat.completion.chunk", "choices": []}, {"choices": {}}, {"choices": [1]}],
)
def test_malformed_response_is_a_parse_error(body: Any) -> None:
    with pytest.raises(ParseError):
        oc.parse_response(body)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-1, 2) | st.sampled_from(["", "x", "stop"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "index",
                    "delta",
                    "content",
                    "tool_calls",
                    "function",
                    "arguments",
                    "usage",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=14,
)


@settings(database=None, max_examples=300, deadline=None)
@given(st.lists(_json, max_size=6))
def test_arbitrary_chunks_raise_only_parse_error(datas: list[Any]) -> None:
    with contextlib.suppress(ParseError):
        oc.parse_stream([SseEvent(None, json.dumps(d)) for d in datas] + [DONE])
