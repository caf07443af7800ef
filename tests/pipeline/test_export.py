"""SFT export: each agent chain as OpenAI chat messages + tools, from all three API formats."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from forge_cli import cmd_export
from pipeline.export import (
    SFT,
    anthropic_messages,
    chat_messages,
    iter_sft_examples,
    openai_tools,
    responses_messages,
    write_sft,
)
from pipeline.shards import write_shard
from pipeline.snapshot import TrajectoryFilter
from pipeline.store import connect
from tests.pipeline.runs import Agent, Step, reward_row, rollout_row, write_agents

SHELL = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
APIS = ["anthropic_messages", "openai_chat", "openai_responses"]


def steps() -> list[Step]:
    return [
        Step(
            text="Let me look.",
            reasoning="List the files first.",
            calls=[("Bash", {"command": "ls"})],
            results=[("a.txt", False)],
        ),
        Step(
            calls=[("Bash", {"command": "cat a.txt"}), ("Bash", {"command": "pwd"})],
            results=[("hi", False), ("/w", False)],
        ),
        Step(text="Done."),
    ]


def the_same_task_in(api: str, rollout: str, **kw: Any) -> Agent:
    return Agent(api, rollout, "You are helpful.", "Do the task.", [("Bash", "Run", SHELL)],
                 steps(), **kw)  # fmt: skip


def normalised(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with tool call ids replaced by their order (ids differ per API)."""
    ids: dict[str, str] = {}
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        for c in m.get("tool_calls") or []:
            c["id"] = ids.setdefault(c["id"], f"id{len(ids)}")
        if "tool_call_id" in m:
            m["tool_call_id"] = ids[m["tool_call_id"]]
        out.append(m)
    return out


EXPECTED = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Do the task."},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "id0",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command": "ls"}'},
            },
        ],
    },  # fmt: skip
    {"role": "tool", "tool_call_id": "id0", "name": "Bash", "content": "a.txt"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "id1",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command": "cat a.txt"}'},
            },
            {
                "id": "id2",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command": "pwd"}'},
            },
        ],
    },  # fmt: skip
    {"role": "tool", "tool_call_id": "id1", "name": "Bash", "content": "hi"},
    {"role": "tool", "tool_call_id": "id2", "name": "Bash", "content": "/w"},
    {"role": "assistant", "content": "Done."},
]
EXPECTED_TOOLS = [
    {"type": "function",
     "function": {"name": "Bash", "description": "Run", "parameters": SHELL}},
]  # fmt: skip


@pytest.fixture
def three_apis(tmp_path: Path) -> Path:
    """The same rollout recorded through each API (Responses with previous_response_id)."""
    agents = [
        (the_same_task_in(api, f"r-{api}", previous_response_id=api == "openai_responses"), i * 100)
        for i, api in enumerate(APIS)
    ]
    write_agents(tmp_path, agents)
    write_shard(tmp_path, "rollouts", "rollouts", [rollout_row(f"r-{a}", "t") for a in APIS])
    write_shard(
        tmp_path,
        "rewards",
        "rewards",
        [reward_row("r-anthropic_messages", 1.0), reward_row("r-openai_chat", 1.0),
         reward_row("r-openai_responses", 0.0)],
    )  # fmt: skip
    return tmp_path


def test_all_three_api_formats_give_the_same_openai_conversation(three_apis: Path) -> None:
    examples = {e["api"]: e for e in iter_sft_examples(connect(three_apis))}
    assert set(examples) == set(APIS)
    for api, example in examples.items():
        messages = normalised(example["messages"])
        want = EXPECTED
        if api != "openai_chat":  # Chat has no reasoning in its messages
            want = [dict(m) for m in EXPECTED]
            want[2] = {**want[2], "reasoning_content": "List the files first."}
        assert messages == want, api
        assert json.loads(example["tools"]) == EXPECTED_TOOLS, api
        assert (example["n_messages"], example["n_tool_calls"]) == (8, 3)
        assert example["agent_key"] == "main" and example["task_id"] == "t"


def test_filters_by_reward_and_status(three_apis: Path) -> None:
    con = connect(three_apis)
    kept = [e["api"] for e in iter_sft_examples(con, TrajectoryFilter(min_reward=1.0))]
    assert sorted(kept) == ["anthropic_messages", "openai_chat"]
    assert list(iter_sft_examples(con, TrajectoryFilter(statuses=("partial",)))) == []
    only = iter_sft_examples(con, TrajectoryFilter(where="rollout_id = 'r-openai_chat'"))
    assert [e["api"] for e in only] == ["openai_chat"]


def test_the_export_loads_with_datasets_offline(three_apis: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft" / "demo.parquet"
    result = write_sft(connect(three_apis), out, TrajectoryFilter(min_reward=1.0))
    assert result.rows == 2 and pq.read_schema(out).names == SFT.names
    code = f"""
import json, datasets
ds = datasets.load_dataset("parquet", data_files={str(out)!r})["train"]
row = ds.sort("api")[0]
print(json.dumps({{"n": ds.num_rows, "tools": row["tools"], "messages": row["messages"]}}))
"""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))},
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["n"] == 2
    assert got["tools"] == EXPECTED_TOOLS, "tools come back as a list of dicts"
    assert got["messages"][3]["role"] == "tool" and got["messages"][3]["content"] == "a.txt"


def claude_code_with_a_sub_agent(root: Path) -> None:
    """A main agent that runs an Agent tool, its sub-agent (headers), and a title side call."""
    session = {"x-claude-code-session-id": "s1"}
    main = Agent(
        "anthropic_messages", "r1", "You are Claude Code.", "Find x.",
        [("Agent", "Start a sub-agent", {"type": "object"}), ("Bash", "Run", SHELL)],
        [Step(calls=[("Agent", {"prompt": "find x"})], results=[("x is in a.py", False)]),
         Step(text="x is in a.py.")],
        model="claude-opus", headers=session, move_cache_control=True,
    )  # fmt: skip
    sub = Agent(
        "anthropic_messages", "r1", "You are a sub-agent.", "find x",
        [("Grep", "Search", {"type": "object"})],
        [Step(calls=[("Grep", {"pattern": "x"})], results=[("a.py:1:x", False)]),
         Step(text="x is in a.py")],
        model="claude-opus", call_prefix="s", spacing_s=0.2,
        headers={**session, "x-claude-code-agent-id": "agent-1"},
    )  # fmt: skip
    title = Agent(
        "anthropic_messages", "r1", "Write a title.", "Find x.", [], [Step(text="Finding x")],
        model="claude-haiku", call_prefix="t", headers=session,
    )  # fmt: skip
    write_agents(root, [(main, 0.0), (sub, 0.2), (title, 0.1)])
    write_shard(root, "rollouts", "rollouts", [rollout_row("r1", "t", harness="claude")])
    write_shard(root, "rewards", "rewards", [reward_row("r1", 1.0)])


def test_sub_agents_are_their_own_examples_and_side_calls_none(tmp_path: Path) -> None:
    claude_code_with_a_sub_agent(tmp_path)
    examples = sorted(iter_sft_examples(connect(tmp_path)), key=lambda e: e["example_id"])
    assert [(e["example_id"], e["agent_key"]) for e in examples] == [
        ("r1-c001", "main"),
        ("r1-s001", "agent-1"),
    ]
    main, sub = (normalised(e["messages"]) for e in examples)
    assert [m["role"] for m in main] == ["system", "user", "assistant", "tool", "assistant"]
    assert main[2]["tool_calls"][0]["function"]["name"] == "Agent"
    assert main[-1]["content"] == "x is in a.py."
    assert sub[0] == {"role": "system", "content": "You are a sub-agent."}
    assert sub[-1]["content"] == "x is in a.py"
    assert [t["function"]["name"] for t in json.loads(examples[1]["tools"])] == ["Grep"]


# --- Converters on the shapes real harnesses send --------------------------------------


def test_anthropic_blocks_become_chat_messages() -> None:
    params = {"system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}
    items = [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image", "source": {"type": "base64"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "x"},
            {"type": "redacted_thinking", "data": "zz"},
            {"type": "text", "text": "Running it."},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "false"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
             "content": [{"type": "text", "text": "exit 1"}]},
            {"type": "text", "text": "<system-reminder>go on</system-reminder>"}]},
    ]  # fmt: skip
    assert anthropic_messages(params, items) == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "look\n\n[image]"},
        {"role": "assistant", "content": "Running it.", "reasoning_content": "hm",
         "tool_calls": [{"id": "t1", "type": "function",
                         "function": {"name": "Bash", "arguments": '{"command": "false"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "name": "Bash", "content": "exit 1"},
        {"role": "user", "content": "<system-reminder>go on</system-reminder>"},
    ]  # fmt: skip


def test_responses_items_become_chat_messages() -> None:
    params = {"instructions": "Be Codex."}
    items = [
        "hello",
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}],
         "encrypted_content": "gAAA"},
        {"type": "message", "role": "assistant", "id": "m1",
         "content": [{"type": "output_text", "text": "Patching.", "annotations": []}]},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin"},
        {"type": "local_shell_call", "call_id": "c2", "action": {"command": ["ls"]}},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"},
        {"type": "local_shell_call_output", "call_id": "c2", "output": "a.py"},
        {"type": "web_search_call", "id": "ws", "status": "completed"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Done."}]},
    ]  # fmt: skip
    assert responses_messages(params, items) == [
        {"role": "system", "content": "Be Codex."},
        {"role": "user", "content": "hello"},
        {"role": "system", "content": "d"},
        {"role": "assistant", "content": "Patching.", "reasoning_content": "plan",
         "tool_calls": [
             {"id": "c1", "type": "function",
              "function": {"name": "apply_patch", "arguments": '{"input": "*** Begin"}'}},
             {"id": "c2", "type": "function",
              "function": {"name": "local_shell", "arguments": '{"command": ["ls"]}'}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "apply_patch", "content": "ok"},
        {"role": "tool", "tool_call_id": "c2", "name": "local_shell", "content": "a.py"},
        {"role": "assistant", "content": "Done."},
    ]  # fmt: skip


def test_chat_messages_are_normalised() -> None:
    items = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None,
         "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": "r"},
    ]  # fmt: skip
    assert chat_messages({}, items) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\n\nb"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": None, "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": None, "name": "f", "content": "r"},
    ]  # fmt: skip


def test_only_client_tools_are_exported() -> None:
    anthropic = {
        "tools": [
            {"name": "Bash", "description": "Run", "input_schema": SHELL},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        ]
    }
    responses = {
        "tools": [
            {"type": "function", "name": "shell", "parameters": SHELL, "strict": False},
            {"type": "custom", "name": "apply_patch", "description": "Patch files"},
            {"type": "web_search"},
        ]
    }
    chat = {"functions": [{"name": "f", "parameters": {"type": "object"}}]}
    assert [t["function"]["name"] for t in openai_tools("anthropic_messages", anthropic)] == [
        "Bash"
    ]
    got = openai_tools("openai_responses", responses)
    assert [t["function"]["name"] for t in got] == ["shell", "apply_patch"]
    assert got[1]["function"]["parameters"]["properties"] == {"input": {"type": "string"}}
    assert openai_tools("openai_chat", chat) == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    # fmt: skip


def test_the_cli_writes_the_file_and_says_where(
    three_apis: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    parser = argparse.ArgumentParser(prog="forge")
    cmd_export.add_parser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "out" / "sft.parquet"
    args = parser.parse_args(["export", "sft", "--data", str(three_apis), "--out", str(out),
                              "--min-reward", "1", "--status", "complete"])  # fmt: skip
    assert args.func(args) == 0
    assert f"2 SFT example(s) written to {out}" in capsys.readouterr().out
    assert pq.read_metadata(out).num_rows == 2


# --- Real wire bodies (tests/fixtures/wire) --------------------------------------------

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"


def wire_call(call_id: str, rollout: str, t: float, api: str, request: str, stream: str) -> Any:
    from mitm_addon.capture import Capture

    host, path = {
        "anthropic_messages": ("api.anthropic.com", "/v1/messages"),
        "openai_chat": ("api.openai.com", "/v1/chat/completions"),
        "openai_responses": ("api.openai.com", "/v1/responses"),
    }[api]
    return Capture(
        call_id=call_id,
        run_id="run-1",
        transport="sse",
        method="POST",
        scheme="https",
        host=host,
        path=path,
        started_at=1_767_225_600.0 + t,
        ended_at=1_767_225_600.5 + t,
        rollout_id=rollout,
        request_body=(WIRE / api / request).read_bytes(),
        status_code=200,
        response_headers={"content-type": "text/event-stream"},
        response_body=(WIRE / api / stream).read_bytes(),
    )


def test_recorded_wire_bodies_export_as_openai_messages(tmp_path: Path) -> None:
    from mitm_addon.recorder import build_rows

    captures = [
        wire_call("a1", "ra", 0, "anthropic_messages", "request_tool.json", "stream_tool.sse"),
        wire_call("a2", "ra", 5, "anthropic_messages", "request_tool_result.json",
                  "stream_text.sse"),
        wire_call("c1", "rc", 0, "openai_chat", "request_tool.json", "stream_tool.sse"),
        wire_call("o1", "ro", 0, "openai_responses", "request_tool.json", "stream_tool.sse"),
    ]  # fmt: skip
    calls, messages = [], {}
    for capture in captures:
        rows = build_rows(capture, lambda _: None)
        assert rows.call["status"] == "complete", rows.call
        calls.append(rows.call)
        messages.update({m["hash"]: m for m in rows.messages})
    write_shard(tmp_path, "calls", "calls", calls)
    write_shard(tmp_path, "messages", "messages", list(messages.values()))
    examples = {e["example_id"]: e for e in iter_sft_examples(connect(tmp_path))}
    assert sorted(examples) == ["a2", "c1", "o1"], "a1 is continued by a2"

    anthropic = examples["a2"]["messages"]
    assert [m["role"] for m in anthropic] == ["system", "user", "assistant", "tool", "assistant"]
    assert anthropic[0]["content"].startswith("You are Claude Code")
    assert anthropic[2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"location": "Paris, France", "unit": "celsius"}',
    }
    assert anthropic[3]["content"] == "18 °C, light rain, wind 12 km/h"
    assert anthropic[4]["reasoning_content"].startswith("The user wants the weather")
    assert anthropic[4]["content"].startswith("It's 18 °C in Paris")
    for example in examples.values():
        tools = json.loads(example["tools"])
        assert [t["function"]["name"] for t in tools] == ["get_weather"], "server tools left out"
    for call_id in ("c1", "o1"):
        chat = examples[call_id]["messages"]
        assert [m["role"] for m in chat] == ["system", "user", "assistant"]
        assert chat[0]["content"] == "You are a helpful assistant."
        assert chat[1]["content"] == "What's the weather like in Paris today?"
        (call,) = chat[2]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {
            "location": "Paris, France",
            "unit": "celsius",
        }
