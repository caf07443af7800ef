"""What serve mode adds to a call, how soon a streamed reply starts, and how many of each
harness's continuations are spliced (CLEAN or REALIGN) rather than re-rendered.

    python -m bench.bench_serve                  # every figure (a few minutes on 2 cores)
    python -m bench.bench_serve --skip-harnesses # without running the harness CLIs

* ``serve.added_ms_12k`` / ``serve.added_ms_6k``: the median time serve mode spends on a
  CLEAN call besides the policy's own ``/v1/completions`` call (render the new messages,
  splice, decode and parse the completion, build the API reply, remember the call), at a
  Claude Code-shaped conversation of about 12k prompt tokens (Anthropic Messages) and a
  Codex-shaped one of about 6k (Responses): the handler's whole answer minus its own call
  to the policy server (the same ids a direct call would send), timed in the same call. The conversations are grown
  turn by turn by the scripted policy and ``bench.synth``'s system prompts and tools.
  ``serve.added_ms_24k`` repeats the first at twice the history: work proportional to
  the new messages keeps it flat.
* ``serve.ttft_ms``: the median time to the first text delta of a streamed Anthropic
  call through a real mitmdump in serve mode (the Anthropic SDK as client), the policy
  scripted to answer 13 tokens of words; ``serve.reply_ms`` the time to the end of that
  reply, and ``serve.ttft_direct_ms`` the time to the first token of the same prompt
  streamed from the policy server directly (the baseline, run alternately).
* ``serve.clean_rate.<harness>``: the share of continuations (calls after an agent's
  first) that are CLEAN or REALIGN when the harness runs unmodified under
  ``forge record --mode serve`` (``tests/support/serve_runs.py``, as the drift tests).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import results
from bench.synth import build_world

GOAL_ADDED_MS = 5.0
MEASURED_CALLS = 12


class _Timed:
    """Wraps the serve handler's policy client: the time of each policy call."""

    def __init__(self, complete: Callable[..., Any]) -> None:
        self.complete, self.last_s = complete, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.complete(*args, **kwargs)
        finally:
            self.last_s = time.perf_counter() - start


def _claude_body(world: Any, messages: list[Any]) -> dict[str, Any]:
    billing = {
        "type": "text",
        "text": f"x-anthropic-billing-header: cc_version=2.1.332.4a9; cch={len(messages):05x};",
    }
    return {
        "model": "claude-opus-5-5",
        "max_tokens": 64,
        "stream": True,
        "system": [billing, *world.cc_system],
        "tools": world.cc_tools,
        "messages": messages,
    }


def _codex_body(world: Any, items: list[Any]) -> dict[str, Any]:
    return {
        "model": "gpt-5.5",
        "stream": True,
        "max_output_tokens": 64,
        "tools": world.codex_tools,
        "input": [*world.codex_developer, *items],
    }


def added_ms(
    policy_url: str, tokenizer: Path, api: str, target_tokens: int, seed: int
) -> dict[str, float]:
    """Median added ms of CLEAN calls once the prompt reaches ``target_tokens``, and at
    twice that."""
    from mitm_addon.serve.handler import Server

    world = build_world(seed)
    server = Server(policy_url, tokenizer)
    timed = _Timed(server.client.complete)
    server.client.complete = timed  # type: ignore[method-assign]
    result = "file contents: " + " ".join(f"line{i}" for i in range(120))
    anthropic = api == "anthropic_messages"
    turns: list[Any] = [{"role": "user", "content": "fix the failing test"}]
    samples: dict[int, list[float]] = {target_tokens: [], 2 * target_tokens: []}
    sizes: dict[int, list[int]] = {target_tokens: [], 2 * target_tokens: []}
    n = 0
    while len(samples[2 * target_tokens]) < MEASURED_CALLS:
        body = _claude_body(world, turns) if anthropic else _codex_body(world, turns)
        path = "/v1/messages" if anthropic else "/v1/responses"
        start = time.perf_counter()
        answer = server.answer(f"c{n}", "POST", path, json.dumps(body).encode())
        total = time.perf_counter() - start
        if answer.status != 200 or answer.tokens is None:
            raise SystemExit(f"bench_serve: call {n} failed: {answer.body[:300]!r}")
        tokens = answer.tokens
        if n and tokens.drift != "CLEAN":
            raise SystemExit(f"bench_serve: call {n} is {tokens.drift}, not CLEAN")
        for size, got in samples.items():
            if size <= tokens.prompt_tokens and len(got) < MEASURED_CALLS:
                got.append((total - timed.last_s) * 1000)
                sizes[size].append(tokens.prompt_tokens)
                break
        turns += _next_turn(answer, anthropic, result, n)
        n += 1
    return {
        "prompt_tokens": float(statistics.median(sizes[target_tokens])),
        "prompt_tokens_2x": float(statistics.median(sizes[2 * target_tokens])),
        "added_ms": statistics.median(samples[target_tokens]),
        "added_ms_2x": statistics.median(samples[2 * target_tokens]),
        "calls": float(n),
    }


def _next_turn(answer: Any, anthropic: bool, result: str, n: int) -> list[Any]:
    """The reply as the harness sends it back, and a tool result for each tool call."""
    events = [
        json.loads(line[5:])
        for line in answer.body.decode().splitlines()
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]")
    ]
    if anthropic:
        blocks: list[dict[str, Any]] = []
        for e in events:
            if e.get("type") == "content_block_start":
                blocks.append(dict(e["content_block"]))
            elif e.get("type") == "content_block_delta":
                d = e["delta"]
                if d.get("type") == "input_json_delta":
                    blocks[-1]["_json"] = blocks[-1].get("_json", "") + d["partial_json"]
                elif d.get("type") == "text_delta":
                    blocks[-1]["text"] = blocks[-1].get("text", "") + d["text"]
                elif d.get("type") == "thinking_delta":
                    blocks[-1]["thinking"] = blocks[-1].get("thinking", "") + d["thinking"]
                elif d.get("type") == "signature_delta":
                    blocks[-1]["signature"] = d["signature"]
        for b in blocks:
            if "_json" in b:
                b["input"] = json.loads(b.pop("_json") or "{}")
        uses = [b for b in blocks if b["type"] == "tool_use"]
        results_ = [
            {"type": "tool_result", "tool_use_id": u["id"], "content": f"{result} #{n}"}
            for u in uses
        ]
        return [{"role": "assistant", "content": blocks}, {"role": "user", "content": results_}]
    done = next(e for e in events if e.get("type") == "response.completed")
    output = done["response"]["output"]
    outs = [
        {"type": "function_call_output", "call_id": o["call_id"], "output": f"{result} #{n}"}
        for o in output
        if o["type"] == "function_call"
    ]
    return [*output, *outs]


TALK = "Hello there, my good friend! How are you doing today?"


def ttft_ms(random_model: Path, work: Path, calls: int = 20) -> dict[str, float]:
    """Medians over ``calls`` streamed Anthropic calls through mitmdump in serve mode,
    answered by a policy scripted to answer in words (``TALK``): the time to the first
    text delta (``serve.ttft_ms``) and to the end of the reply (``serve.reply_ms``);
    and, side by side, the time to the first token of the same prompt asked of the
    policy server directly (``serve.ttft_direct_ms``)."""
    import shutil
    import urllib.request

    from mitm_addon.serve.renderer import Renderer
    from rl.tiny_model import script_reply
    from tests.support.forge_proxy import anthropic_client, forge_proxy
    from tests.support.policy import policy_server
    from tests.support.serve_runs import serve_settings

    talking = work / "talking"
    shutil.copytree(random_model, talking)
    script_reply(talking, TALK)
    messages = [{"role": "user", "content": "list the files"}]
    prompt = Renderer(talking).render(messages, [])
    firsts: list[float] = []
    ends: list[float] = []
    direct: list[float] = []
    with (
        policy_server(talking) as policy,
        forge_proxy(
            work / "ttft", work / "confdir", {}, extra=serve_settings(policy.base_url, talking)
        ) as proxy,
        anthropic_client(proxy) as client,
    ):
        body = json.dumps(
            {"prompt": prompt, "max_tokens": 64, "stream": True, "return_token_ids": True}
        ).encode()
        for n in range(calls + 1):  # the first opens the connections: not counted
            start = time.perf_counter()
            text: list[str] = []
            with client.messages.stream(
                model="claude-sonnet-4-5", max_tokens=64, messages=messages
            ) as stream:
                for event in stream:
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        if not text:
                            first = (time.perf_counter() - start) * 1000
                        text.append(event.delta.text)
            end = (time.perf_counter() - start) * 1000
            assert "".join(text) == TALK, text
            start = time.perf_counter()
            request = urllib.request.Request(
                policy.base_url + "/v1/completions",
                data=body,
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(request) as response:
                for line in response:
                    if line.startswith(b"data: "):
                        direct_first = (time.perf_counter() - start) * 1000
                        break
                response.read()
            if n:
                firsts.append(first)
                ends.append(end)
                direct.append(direct_first)
    return {
        "serve.ttft_ms": statistics.median(firsts),
        "serve.reply_ms": statistics.median(ends),
        "serve.ttft_direct_ms": statistics.median(direct),
    }


def clean_rates(random_model: Path, work: Path) -> dict[str, float]:
    """serve.clean_rate.<harness>: CLEAN or REALIGN continuations / all continuations;
    serve.spliced_rate.<harness>: the same with TRIM (every completion spliced) too."""
    from tests.support import serve_runs

    figures: dict[str, float] = {}
    for name, run in serve_runs.HARNESS_RUNS.items():
        unavailable = run.unavailable()
        if unavailable:
            raise SystemExit(f"bench_serve: {name} cannot run: {unavailable}")
        print(f"-- {name}: serving {serve_runs.TURNS} tool turns", flush=True)
        calls = run.serve(random_model, work / name, work / "confdir").calls
        continuations = [c["drift"] for c in calls[1:]]  # one agent per run
        clean = sum(d in ("CLEAN", "REALIGN") for d in continuations)
        spliced = clean + sum(d == "TRIM" for d in continuations)
        print(f"   drift of each call: {' '.join(c['drift'] for c in calls)}", flush=True)
        figures[f"serve.clean_rate.{name}"] = round(clean / len(continuations), 4)
        figures[f"serve.spliced_rate.{name}"] = round(spliced / len(continuations), 4)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_serve", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-harnesses", action="store_true")
    parser.add_argument(
        "--results", type=Path, default=results.BENCH_DIR, help="folder of results.json/.md"
    )
    args = parser.parse_args(argv)
    from tests.support.policy import build_models, policy_server

    figures: dict[str, float | None] = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="forge-bench-serve-") as tmp:
        work = Path(tmp)
        random_model, scripted = build_models(work / "models")
        with policy_server(scripted) as policy:
            for api, target, key in (
                ("anthropic_messages", 12_000, "12k"),
                ("openai_responses", 6_000, "6k"),
            ):
                print(f"-- {api}: growing a conversation to {target} tokens", flush=True)
                got = added_ms(policy.base_url, scripted, api, target, args.seed)
                print(
                    f"   added {got['added_ms']:.2f} ms per CLEAN call at "
                    f"{got['prompt_tokens']:.0f} prompt tokens (median), {got['added_ms_2x']:.2f}"
                    f" ms at {got['prompt_tokens_2x']:.0f} ({int(got['calls'])} calls)",
                    flush=True,
                )
                figures[f"serve.added_ms_{key}"] = round(got["added_ms"], 3)
                if key == "12k":
                    figures["serve.added_ms_24k"] = round(got["added_ms_2x"], 3)
        times = ttft_ms(random_model, work)
        figures.update({k: round(v, 3) for k, v in times.items()})
        print(
            f"-- through mitmdump: first text after {times['serve.ttft_ms']:.2f} ms, whole "
            f"reply after {times['serve.reply_ms']:.2f} ms; the policy server's own first "
            f"token after {times['serve.ttft_direct_ms']:.2f} ms",
            flush=True,
        )
        if not args.skip_harnesses:
            figures.update(clean_rates(random_model, work))
    for key, value in figures.items():
        print(f"{key} = {value}")
    goal = figures["serve.added_ms_12k"]
    print(
        f"serve mode adds {goal:.2f} ms per CLEAN call at 12k tokens "
        f"(goal <= {GOAL_ADDED_MS:g} ms: {'met' if goal is not None and goal <= GOAL_ADDED_MS else 'MISSED'})"
    )
    table = "\n".join(f"| `{k}` | {v} |" for k, v in figures.items())
    results.record(
        "serve",
        figures,
        "| figure | value |\n| --- | ---: |\n" + table,
        details={"seconds": round(time.monotonic() - began, 1)},
        command=results.command_line("bench.bench_serve", argv),
        json_path=args.results / "results.json",
        md_path=args.results / "results.md",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
