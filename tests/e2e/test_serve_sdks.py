"""Serve mode end to end: the official SDKs, through a real mitmdump, answered by the
embedded policy server running a tiny Qwen3 model; no provider is contacted."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mitm_addon.launch import RunningProxy
from pipeline.store import connect
from tests.e2e.test_record_sdks import (
    SHELL_TOOL_ANTHROPIC,
    SHELL_TOOL_CHAT,
    SHELL_TOOL_RESPONSES,
)
from tests.support.forge_proxy import (
    SECRETS,
    anthropic_client,
    files_containing,
    forge_proxy,
    openai_client,
)
from tests.support.policy import held_after, policy_server
from tests.support.serve_runs import scripted_policy as scripted_policy_server
from tests.support.serve_runs import serve_settings

pytestmark = pytest.mark.slow  # a tiny model sampled on two shared cores: seconds per call


@pytest.fixture(scope="module")
def scripted_policy(tiny_models: tuple[Path, Path]) -> Iterator[Any]:
    with policy_server(tiny_models[1]) as server:
        yield server


@pytest.fixture(scope="module")
def serving(
    tmp_path_factory: pytest.TempPathFactory,
    confdir: Path,
    scripted_policy: Any,
    tiny_models: tuple[Path, Path],
) -> Iterator[tuple[RunningProxy, Path]]:
    """One serving proxy for the module; shards flushed every second so rows show up."""
    out = tmp_path_factory.mktemp("serve") / "run"
    extra = [*serve_settings(scripted_policy.base_url, tiny_models[1]), "forge_rotate_seconds=1"]
    with forge_proxy(out, confdir, {}, extra=extra, rollout="r-serve") as proxy:
        yield proxy, out
    assert files_containing(out, SECRETS) == [], "a dummy key reached disk"


def rows(out: Path, model: str, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The calls rows of one model, once ``count`` of them are in shards."""
    deadline = time.monotonic() + timeout_s
    while True:
        found: list[dict[str, Any]] = []
        if (out / "calls").is_dir() and any((out / "calls").glob("*.parquet")):
            cur = connect(out).execute(
                "SELECT * FROM calls WHERE model = ? ORDER BY call_id", [model]
            )
            names = [d[0] for d in cur.description]
            found = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def anthropic_turns(client: Any, model: str, stream: bool, turns: int) -> list[Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    finals = []
    for _ in range(turns):
        kwargs = {
            "model": model,
            "max_tokens": 64,
            "messages": messages,
            "tools": [SHELL_TOOL_ANTHROPIC],
        }
        if stream:
            with client.messages.stream(**kwargs) as s:
                final = s.get_final_message()
        else:
            final = client.messages.create(**kwargs)
        finals.append(final)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in final.content]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "a.txt b.txt"}
            for b in final.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    return finals


def chat_turns(client: Any, model: str, stream: bool, turns: int) -> list[Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    finals = []
    for _ in range(turns):
        kwargs = {"model": model, "messages": messages, "tools": [SHELL_TOOL_CHAT]}
        if stream:
            with client.chat.completions.stream(**kwargs) as s:
                final = s.get_final_completion()
        else:
            final = client.chat.completions.create(**kwargs)
        finals.append(final)
        msg = final.choices[0].message
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in msg.tool_calls or []
        ]
        # As most clients send a turn back: without the reasoning.
        messages.append({"role": "assistant", "content": msg.content, "tool_calls": calls})
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "content": "a.txt b.txt"} for c in calls
        ]
    return finals


def responses_turns(client: Any, model: str, stream: bool, turns: int) -> list[Any]:
    items: list[Any] = [{"role": "user", "content": "list the files"}]
    finals = []
    for _ in range(turns):
        kwargs = {"model": model, "input": items, "tools": [SHELL_TOOL_RESPONSES]}
        if stream:
            with client.responses.stream(**kwargs) as s:
                final = s.get_final_response()
        else:
            final = client.responses.create(**kwargs)
        finals.append(final)
        items += [item.model_dump(exclude_none=True) for item in final.output]
        items += [
            {"type": "function_call_output", "call_id": item.call_id, "output": "a.txt b.txt"}
            for item in final.output
            if item.type == "function_call"
        ]
    return finals


def tool_calls_of(api: str, final: Any) -> list[tuple[str, dict[str, Any]]]:
    if api == "anthropic_messages":
        return [(b.name, b.input) for b in final.content if b.type == "tool_use"]
    if api == "openai_chat":
        calls = final.choices[0].message.tool_calls or []
        return [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    return [(i.name, json.loads(i.arguments)) for i in final.output if i.type == "function_call"]


RUNNERS = {
    "anthropic_messages": (anthropic_client, anthropic_turns),
    "openai_chat": (openai_client, chat_turns),
    "openai_responses": (openai_client, responses_turns),
}
# Drift of the second call: the Chat client sends the turn back without its reasoning,
# so the same messages no longer render to the same tokens and are spliced (REALIGN).
SECOND_DRIFT = {
    "anthropic_messages": "CLEAN",
    "openai_chat": "REALIGN",
    "openai_responses": "CLEAN",
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("api", list(RUNNERS))
def test_every_api_is_answered_by_the_policy_and_recorded_with_its_tokens(
    serving: tuple[RunningProxy, Path], scripted_policy: Any, api: str, stream: bool
) -> None:
    proxy, out = serving
    make_client, run = RUNNERS[api]
    model = f"{api}-{'sse' if stream else 'json'}"  # tells this test's rows apart
    with make_client(proxy) as client:
        finals = run(client, model, stream, 2)
    for final in finals:
        assert tool_calls_of(api, final) == [("shell", {"command": "ls"})]
    first, second = rows(out, model, 2)
    for row in (first, second):
        assert row["api"] == api and row["status"] == "complete", row["error"]
        assert row["parse_error"] is None, row["parse_error"]
        assert row["stream"] is stream and row["transport"] == ("sse" if stream else "http")
        assert row["tool_calls"] == ["shell"] and row["finish_reason"] == "stop"
        assert row["policy_version"] == 0 and row["rollout_id"] == "r-serve"
        assert len(row["completion_logprobs"]) == len(row["completion_ids"]) > 0
        assert row["output_tokens"] == len(row["completion_ids"])
        assert row["upstream_url"] == scripted_policy.base_url
    assert first["input_tokens"] == len(first["prompt_ids"])
    assert first["drift"] == "CLEAN" and first["prompt_parent_call_id"] is None
    assert second["drift"] == SECOND_DRIFT[api]
    if second["drift"] == "CLEAN":
        assert second["prompt_parent_call_id"] == first["call_id"]
        assert len(second["prompt_ids"]) < len(first["prompt_ids"])  # a delta
    else:
        whole = first["prompt_ids"] + first["completion_ids"]
        assert second["prompt_ids"][: len(whole)] == whole  # spliced, token for token


@pytest.fixture(scope="module")
def talking(
    tmp_path_factory: pytest.TempPathFactory, confdir: Path, tiny_models: tuple[Path, Path]
) -> Iterator[tuple[RunningProxy, Any]]:
    """A proxy serving a policy scripted to answer in words, not a tool call."""
    tmp = tmp_path_factory.mktemp("talking")
    with scripted_policy_server(tiny_models[0], tmp, "Hello there, my good friend!") as policy:
        extra = serve_settings(policy.base_url, tmp / "model")
        with forge_proxy(tmp / "run", confdir, {}, extra=extra) as proxy:
            yield proxy, policy


def first_text_then_rest(api: str, client: Any, seen: threading.Event) -> str:
    """Stream one reply with the API's SDK; ``seen`` is set at its first text delta."""
    text: list[str] = []
    messages = [{"role": "user", "content": "hi"}]
    if api == "anthropic_messages":
        with client.messages.stream(model="m", max_tokens=32, messages=messages) as s:
            for event in s:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    seen.set()
                    text.append(event.delta.text)
    elif api == "openai_chat":
        for chunk in client.chat.completions.create(model="m", messages=messages, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                seen.set()
                text.append(chunk.choices[0].delta.content)
    else:
        for event in client.responses.create(model="m", input=messages, stream=True):
            if event.type == "response.output_text.delta":
                seen.set()
                text.append(event.delta)
    return "".join(text)


@pytest.mark.parametrize("api", list(RUNNERS))
def test_a_streamed_reply_reaches_the_harness_while_the_policy_is_still_sampling(
    talking: tuple[RunningProxy, Any], api: str
) -> None:
    """The policy is held after its second token until the harness has read a text
    delta: a proxy that sent the reply whole would keep it waiting (and fail here)."""
    proxy, policy = talking
    with held_after(policy, 1) as (seen, held), RUNNERS[api][0](proxy) as client:
        text = first_text_then_rest(api, client, seen)
    assert held == [True]
    assert text == "Hello there, my good friend!"


def test_a_policy_server_that_is_down_gets_the_apis_error_and_the_call_is_recorded(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    import anthropic

    out = tmp_path / "run"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    settings = serve_settings(dead, tiny_models[1])
    with (
        forge_proxy(out, confdir, {}, extra=settings) as proxy,
        anthropic_client(proxy) as client,
        pytest.raises(anthropic.APIStatusError) as e,
    ):
        client.messages.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.status_code == 503 and "policy server" in str(e.value)
    [row] = rows(out, "claude-x", 1)
    assert row["status_code"] == 503 and row["drift"] is None
