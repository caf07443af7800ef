"""``toy``: a small multi-turn agent harness on the official ``openai`` SDK.

It is an ordinary client: it talks to api.openai.com (Chat Completions) and knows
nothing of Forge; run it under ``forge record`` to have its calls recorded. Tools:

* ``shell``: run a command in the working directory, return its output;
* ``consult``: start a child process (``python -m k8s_jobs.toy_harness --consult``) that
  makes its own LLM call and prints the answer, so one rollout spans two processes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any, cast

import openai
from openai.types.chat import (
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolUnionParam,
)

SYSTEM = "You are a careful coding agent. Use the shell tool to act; answer briefly when done."
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a bash command in the working directory.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "consult",
            "description": "Ask a second opinion from a helper process.",
            "parameters": {
                "type": "object",
                "properties": {"question": {"type": "string"}},
                "required": ["question"],
            },
        },
    },
]
_OUTPUT_CHARS = 4000  # tool output kept per call: enough for small tasks, bounded context
_TOOL_TIMEOUT_S = 60


def run_tool(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return f"error: arguments are not JSON: {arguments[:200]}"
    if name == "shell":
        proc = subprocess.run(
            ["bash", "-c", str(args.get("command", ""))],
            capture_output=True,
            text=True,
            timeout=_TOOL_TIMEOUT_S,
        )
        return (f"exit={proc.returncode}\n{proc.stdout}{proc.stderr}")[:_OUTPUT_CHARS]
    if name == "consult":
        proc = subprocess.run(
            [sys.executable, "-m", "k8s_jobs.toy_harness", "--consult", str(args.get("question", ""))],
            capture_output=True,
            text=True,
            timeout=_TOOL_TIMEOUT_S,
        )
        return (proc.stdout or proc.stderr)[:_OUTPUT_CHARS]
    return f"error: unknown tool {name!r}"


def consult(client: openai.OpenAI, model: str, question: str) -> str:
    reply = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": question},
        ],
    )
    return reply.choices[0].message.content or ""


def run_agent(client: openai.OpenAI, model: str, task: str, max_turns: int, stream: bool) -> int:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task},
    ]
    # The SDK types messages and tools as TypedDicts; our plain dicts have the same shape.
    params = cast("list[ChatCompletionMessageParam]", messages)  # the same list, retyped
    tools = cast("list[ChatCompletionToolUnionParam]", TOOLS)
    for _ in range(max_turns):
        message: ChatCompletionMessage
        if stream:
            with client.chat.completions.stream(model=model, messages=params, tools=tools) as s:
                message = s.get_final_completion().choices[0].message
        else:
            message = (
                client.chat.completions.create(model=model, messages=params, tools=tools)
                .choices[0]
                .message
            )
        # We offer only function tools, so every call the model makes is a function call.
        tool_calls = cast("list[ChatCompletionMessageFunctionToolCall] | None", message.tool_calls)
        turn: dict[str, Any] = {"role": "assistant", "content": message.content}
        if tool_calls:
            turn["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in tool_calls
            ]
        messages.append(turn)
        if not tool_calls:
            print(message.content or "")
            return 0
        for call in tool_calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": run_tool(call.function.name, call.function.arguments),
                }
            )
    print("toy: out of turns", file=sys.stderr)
    return 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="toy", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("task", help="what to do")
    p.add_argument("--model", default="gpt-4.1-mini")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--stream", action="store_true", help="ask for streamed replies")
    p.add_argument("--consult", action="store_true", help="(internal) answer one question and exit")
    args = p.parse_args(argv)
    client = openai.OpenAI(max_retries=0)
    if args.consult:
        print(consult(client, args.model, args.task))
        return 0
    return run_agent(client, args.model, args.task, args.max_turns, args.stream)


if __name__ == "__main__":
    sys.exit(main())
