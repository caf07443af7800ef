"""Serve mode's call handler against the embedded policy server: long conversations stay
CLEAN and their stored ids rebuild every prompt the policy was given."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mitm_addon.serve.handler import Server, TokenRecord
from rl.policy.engine import logprobs_of
from tests.support.policy import policy_server

TOOL = {
    "name": "shell",
    "description": "Run a command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def served(tiny_models: tuple[Path, Path]) -> Iterator[tuple[Server, Any, list[list[int]]]]:
    """(handler, policy server, the prompts the engine was given, in order)."""
    with policy_server(tiny_models[1]) as policy:
        prompts: list[list[int]] = []
        generate = policy.service.engine.generate

        def recording(prompt_ids: list[int], params: Any, *images: Any) -> Any:
            prompts.append(list(prompt_ids))
            return generate(prompt_ids, params, *images)

        policy.service.engine.generate = recording
        yield Server(policy.base_url, tiny_models[1]), policy, prompts


def anthropic_call(
    server: Server, call_id: str, messages: list[Any], system: Any = None
) -> tuple[dict[str, Any], TokenRecord]:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": messages, "tools": [TOOL]}
    if system is not None:
        body["system"] = system
    answer = server.answer(call_id, "POST", "/v1/messages", json.dumps(body).encode())
    assert answer.status == 200, answer.body
    assert answer.tokens is not None
    return json.loads(answer.body), answer.tokens


@pytest.mark.slow
def test_fifty_tool_turns_are_all_clean_and_stored_ids_rebuild_every_prompt(
    served: tuple[Server, Any, list[list[int]]],
) -> None:
    server, policy, prompts = served
    prompts.clear()
    messages: list[Any] = [{"role": "user", "content": "list the files, fifty times"}]
    records: list[TokenRecord] = []
    for n in range(50):
        reply, tokens = anthropic_call(server, f"t{n:02d}", messages)
        records.append(tokens)
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        assert [u["input"] for u in uses] == [{"command": "ls"}]
        messages.append({"role": "assistant", "content": reply["content"]})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": u["id"], "content": f"file{n}.txt"}
                    for u in uses
                ],
            }
        )
    assert [r.drift for r in records] == ["CLEAN"] * 50
    assert records[0].prompt_parent_call_id is None
    assert [r.prompt_parent_call_id for r in records[1:]] == [f"t{n:02d}" for n in range(49)]
    rebuilt: list[int] = []
    for n, r in enumerate(records):
        previous = records[n - 1] if n else None
        prefix = rebuilt + previous.completion_ids if previous else []
        rebuilt = prefix + r.prompt_ids
        assert rebuilt == prompts[n], f"call {n}: stored ids do not rebuild the prompt"
        assert r.prompt_tokens == len(rebuilt)
    # And the logprobs recorded at sampling are those of a forward pass over the same ids.
    last = records[-1]
    recomputed = logprobs_of(policy.service.engine.model, rebuilt, last.completion_ids).tolist()
    assert last.completion_logprobs is not None
    assert (
        max(abs(a - b) for a, b in zip(recomputed, last.completion_logprobs, strict=True)) <= 1e-4
    )


def test_requests_it_cannot_serve_get_the_apis_error_shape(
    served: tuple[Server, Any, list[list[int]]],
) -> None:
    server = served[0]
    bad = server.answer("x1", "POST", "/v1/messages", b"{not json")
    assert bad.status == 400 and json.loads(bad.body)["type"] == "error"
    bad = server.answer(
        "x2", "POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": []}).encode()
    )
    assert bad.status == 400 and "no message" in json.loads(bad.body)["error"]["message"]
    bad = server.answer(
        "x3",
        "POST",
        "/v1/responses",
        json.dumps({"model": "m", "input": "hi", "previous_response_id": "resp_nope"}).encode(),
    )
    assert bad.status == 400 and "unknown to this proxy" in json.loads(bad.body)["error"]["message"]


def test_token_counts_and_model_lists_are_answered_locally(
    served: tuple[Server, Any, list[list[int]]],
) -> None:
    server = served[0]
    messages = [{"role": "user", "content": "list the files"}]
    body = json.dumps({"model": "claude-sonnet-4-5", "messages": messages, "tools": [TOOL]})
    counted = server.answer_local(
        "api.anthropic.com", "POST", "/v1/messages/count_tokens", body.encode()
    )
    n = json.loads(counted.body)["input_tokens"]
    _, tokens = anthropic_call(server, "count-check", messages)
    assert n == tokens.prompt_tokens
    listed = server.answer_local("api.openai.com", "GET", "/v1/models", b"")
    assert json.loads(listed.body)["data"][0]["object"] == "model"
    other = server.answer_local("api.openai.com", "GET", "/v1/organization/usage", b"")
    assert other.status == 404 and "not answered in serve mode" in other.body.decode()


def test_recorded_logprobs_of_a_random_policy_equal_a_forward_pass(
    tiny_models: tuple[Path, Path],
) -> None:
    """fp32 on CPU: the logprobs stored with a call are the ones a trainer recomputes."""
    with policy_server(tiny_models[0]) as policy:
        server = Server(policy.base_url, tiny_models[0])
        body = {
            "model": "gpt-4.1",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "say something"}],
        }
        answer = server.answer("r1", "POST", "/v1/chat/completions", json.dumps(body).encode())
        assert answer.status == 200 and answer.tokens is not None
        t = answer.tokens
        assert len(t.completion_ids) == 16 and t.finish_reason == "length"
        recomputed = logprobs_of(policy.service.engine.model, t.prompt_ids, t.completion_ids)
    assert t.completion_logprobs is not None
    diffs = [abs(a - b) for a, b in zip(recomputed.tolist(), t.completion_logprobs, strict=True)]
    assert max(diffs) <= 1e-4
    assert json.loads(answer.body)["choices"][0]["finish_reason"] == "length"


def test_a_max_tokens_cap_shortens_replies_below_what_the_harness_asked(
    tiny_models: tuple[Path, Path],
) -> None:
    """forge_serve_max_tokens: a random policy asked for 4096 tokens writes 5 and stops
    with the API's length reason; without the cap the harness's own max_tokens holds."""
    with policy_server(tiny_models[0]) as policy:
        capped = Server(policy.base_url, tiny_models[0], max_tokens_cap=5)
        body: dict[str, Any] = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}
        answer = capped.answer("r1", "POST", "/v1/chat/completions", json.dumps(body).encode())
        assert answer.status == 200 and answer.tokens is not None
        assert len(answer.tokens.completion_ids) == 5 and answer.tokens.finish_reason == "length"
        assert json.loads(answer.body)["choices"][0]["finish_reason"] == "length"

        body["max_tokens"] = 3
        answer = capped.answer("r2", "POST", "/v1/chat/completions", json.dumps(body).encode())
        assert answer.tokens is not None and len(answer.tokens.completion_ids) == 3

        body["max_tokens"] = 7
        free = Server(policy.base_url, tiny_models[0])
        answer = free.answer("r3", "POST", "/v1/chat/completions", json.dumps(body).encode())
        assert answer.tokens is not None and len(answer.tokens.completion_ids) == 7


def test_claude_codes_billing_header_changing_every_call_keeps_the_chain_clean(
    served: tuple[Server, Any, list[list[int]]],
) -> None:
    """Claude Code's first system block carries a hash that changes on every request; it
    is a request attribute for Anthropic's API, not prompt text (pipeline.volatile)."""
    server, _, prompts = served
    prompts.clear()
    messages: list[Any] = [{"role": "user", "content": "list the files"}]
    records: list[TokenRecord] = []
    for n, cch in enumerate(["22b4f", "7899c", "156b8"]):
        system = [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.332.4a9; "
                f"cc_entrypoint=sdk-cli; cch={cch}; cc_turn_index={n};",
            },
            {
                "type": "text",
                "text": "You are a Claude agent.",
                "cache_control": {"type": "ephemeral"},
            },
        ]
        reply, tokens = anthropic_call(server, f"b{n}", messages, system)
        records.append(tokens)
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        messages.append({"role": "assistant", "content": reply["content"]})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": u["id"], "content": "a.txt"}
                    for u in uses
                ],
            }
        )
    assert [(r.drift, r.prompt_parent_call_id) for r in records] == [
        ("CLEAN", None),
        ("CLEAN", "b0"),
        ("CLEAN", "b1"),
    ]
    text = server.renderer.tokenizer.decode(prompts[-1])
    assert "You are a Claude agent." in text and "billing" not in text
