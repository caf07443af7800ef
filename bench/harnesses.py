"""Claude Code- and Codex-shaped rollouts, call by call.

A rollout is simulated as its harness would drive the API: a main agent chain whose
conversation grows by the model's output and the tool results, sub-agents launched
from a tool call (Claude Code's ``Agent`` tool, Codex's ``spawn_agent``) or from a
child process that a tool ran, side calls (session title, summaries: no tools, a small
model) and, in long Claude Code rollouts, a compaction. Each call is handed to a sink
as a ``CallSpec``: the request's parameters and conversation, the assembled response,
the headers and timing; ``bench.gen_shards`` turns it into Forge's rows.

The shapes follow what the real harnesses sent through Forge's own recorder (Claude
Code 2.1.332 and Codex 0.171.0, pinned in ``.harnesses/``):

* Claude Code resends a ~10 kB system prompt and ~20 kB of tools with a small billing
  block that changes on every call, and keeps ``cache_control`` on the last message
  only, so the message that was last loses it on the next call (the stored chain forks
  there, and the assistant message is re-hashed under its new parent).
* Codex (``store: false``) resends its whole input, developer instructions included,
  and adds ``internal_chat_message_metadata_passthrough`` to the items it echoes back.

``quirks=False`` turns both off: every continuation is then an exact hash-chain
extension.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from bench.synth import (
    GENERATION_MAX_S,
    TOOL_MAX_S,
    TTFB_MAX_S,
    CallSpec,
    Chain,
    RolloutPlan,
    Sink,
    World,
    anthropic_stream_events,
    b62_id,
    b64_blob,
    call_id_at,
    hex_id,
    lognormal_int,
    uuid4,
)
from mitm_addon.protocols.base import Usage

# -- the simulation -------------------------------------------------------------------------


class _Clock:
    """Timing of one agent: calls one after another, tools in between."""

    def __init__(self, rng: random.Random, t: float) -> None:
        self.rng, self.t = rng, t

    def call(self, output_tokens: int) -> tuple[float, float, float]:
        start = self.t
        ttfb = min(TTFB_MAX_S, 0.3 + self.rng.expovariate(1.5))
        gen = min(GENERATION_MAX_S, output_tokens / self.rng.uniform(40.0, 90.0))
        self.t = start + ttfb + gen
        return start, start + ttfb, self.t

    def tool(self) -> None:
        self.t += min(TOOL_MAX_S, self.rng.lognormvariate(-0.5, 1.2))


@dataclass
class _Agent:
    """One agent's identity on the wire."""

    headers: dict[str, str]
    params: dict[str, Any]
    chain: Chain
    clock: _Clock
    pid: int | None
    parent_pids: list[int] | None
    process_name: str | None
    conn: str = ""
    calls: int = 0
    context_chars: int = 0
    plain: list[Any] = field(default_factory=list)  # items without cache_control
    turn_id: str = ""  # Codex: the user turn its items are tagged with


class Simulation:
    """Runs one rollout plan, handing every call to ``sink`` as it completes."""

    def __init__(self, world: World, plan: RolloutPlan, sink: Sink, quirks: bool = True) -> None:
        self.world, self.plan, self.sink, self.quirks = world, plan, sink, quirks
        self.rng = random.Random(plan.seed)
        self.text = world.text
        self.counter = 0
        self.session = uuid4(self.rng)
        self.pid = self.rng.randint(300, 4_000_000)
        self.parent_pids = [self.rng.randint(100, 299), 1]
        self.user_id = json.dumps(
            {"device_id": hex_id(self.rng, 64), "account_uuid": "", "session_id": self.session},
            separators=(",", ":"),
        )
        self.ended_at = plan.start
        # Values that every request of this session repeats (the same objects each time).
        self.metadata = {"user_id": self.user_id}
        self.context_management = {"edits": [{"keep": "all", "type": "clear_thinking_20251015"}]}
        self.thinking = {"display": "omitted", "type": "adaptive"}

    # -- shared helpers

    def _call_id(self, t: float) -> str:
        self.counter += 1
        return call_id_at(self.rng, t, self.plan.index * 4096 + self.counter)

    def _conn(self, agent: _Agent) -> str:
        if not agent.conn or agent.calls % 25 == 0:  # keep-alive, reconnecting now and then
            agent.conn = uuid4(self.rng)
        agent.calls += 1
        return agent.conn

    def _emit(
        self,
        agent: _Agent,
        *,
        api: str,
        host: str,
        path: str,
        response: dict[str, Any] | None,
        output: list[Any],
        out_tokens: int,
        headers: dict[str, str],
        response_headers: dict[str, str],
        **parsed: Any,
    ) -> CallSpec:
        start, first, end = agent.clock.call(out_tokens)
        self.ended_at = max(self.ended_at, end)
        spec = CallSpec(
            rollout_index=self.plan.index,
            call_id=self._call_id(start),
            run_id=self.plan.run_id,
            rollout_id=self.plan.rollout_id,
            api=api,
            host=host,
            path=path,
            headers=headers,
            response_headers=response_headers,
            pid=agent.pid,
            parent_pids=agent.parent_pids,
            process_name=agent.process_name,
            client_conn_id=self._conn(agent),
            started_at=start,
            first_byte_at=first,
            ended_at=end,
            params=agent.params,
            chain=agent.chain,
            n_items=len(agent.chain),
            response=response,
            output_items=output,
            **parsed,
        )
        self.sink(spec)
        return spec

    def run(self) -> float:
        """Simulate the rollout; returns when its last call ended."""
        if self.plan.task.harness == "claude":
            self._claude()
        else:
            self._codex()
        return self.ended_at

    # -- Claude Code ----------------------------------------------------------------------

    def _cc_headers(
        self, request_class: str, extra: dict[str, str] | None = None
    ) -> dict[str, str]:
        h = {
            "accept": "application/json",
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
            "context-management-2025-06-27,fine-grained-tool-streaming-2025-05-14",
            "anthropic-dangerous-direct-browser-access": "true",
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
            "user-agent": "claude-cli/2.1.332 (external, cli)",
            "x-api-key": "[REDACTED]",
            "x-app": "cli",
            "x-claude-code-session-id": self.session,
            "x-claude-code-request-class": request_class,
            "x-client-request-id": uuid4(self.rng),
            "x-stainless-arch": "x64",
            "x-stainless-lang": "js",
            "x-stainless-os": "Linux",
            "x-stainless-package-version": "0.128.0",
            "x-stainless-retry-count": "0",
            "x-stainless-runtime": "node",
            "x-stainless-runtime-version": "v22.12.0",
            "x-stainless-timeout": "600",
            "connection": "keep-alive",
            "host": "api.anthropic.com",
            "accept-encoding": "gzip, deflate, br, zstd",
        }
        if extra:
            h.update(extra)
        return h

    def _cc_response_headers(self) -> dict[str, str]:
        return {
            "content-type": "text/event-stream; charset=utf-8",
            "request-id": "req_011C" + b62_id(self.rng, 20),
            "anthropic-organization-id": "00000000-0000-4000-8000-000000000000",
            "cache-control": "no-cache",
            "via": "1.1 google",
            "cf-ray": hex_id(self.rng, 16) + "-SJC",
        }

    def _cc_params(self, agent_kind: str, model: str, prev_message: str | None) -> dict[str, Any]:
        w, rng = self.world, self.rng
        billing = {
            "text": "x-anthropic-billing-header: cc_version=2.1.332.fa9; cc_entrypoint=cli; "
            f"cch={hex_id(rng, 5)}; cc_prompt_id={self.session}; cc_turn_index={self.counter};",
            "type": "text",
        }
        if agent_kind == "title":
            return {
                "max_tokens": 512,
                "metadata": self.metadata,
                "model": model,
                "stream": True,
                "system": [billing, *w.title_system],
                "temperature": 0,
            }
        if agent_kind == "summary":
            return {
                "max_tokens": 256,
                "metadata": self.metadata,
                "model": model,
                "stream": True,
                "system": [billing, *w.summary_system],
                "temperature": 0,
            }
        system = w.cc_system if agent_kind == "main" else w.cc_sub_system
        tools = w.cc_tools if agent_kind == "main" else w.cc_sub_tools
        return {
            "context_management": self.context_management,
            "diagnostics": {"previous_message_id": prev_message},
            "max_tokens": 32000,
            "metadata": self.metadata,
            "model": model,
            "stream": True,
            "system": [billing, *system],
            "thinking": self.thinking,
            "tools": tools,
        }

    def _cc_render(self, item: dict[str, Any], last: bool) -> dict[str, Any]:
        """The item as Claude Code sends it: ``cache_control`` on the last message only."""
        if not self.quirks:
            return item
        content = item["content"]
        if item["role"] == "system":  # a list with cache_control when last, else a string
            if last:
                return {
                    "content": [
                        {"cache_control": {"type": "ephemeral"}, "text": content, "type": "text"}
                    ],
                    "role": "system",
                }
            return item
        if not last or item["role"] != "user":
            return item
        return {
            "content": [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}],
            "role": item["role"],
        }

    def _cc_push(self, agent: _Agent, items: list[dict[str, Any]], chars: int) -> None:
        """Append items (about ``chars`` long) to the agent's conversation, moving
        cache_control to the new last one."""
        chain = agent.chain
        if chain.items:
            chain.replace(len(chain) - 1, self._cc_render(agent.plain[-1], False))
        for i, item in enumerate(items):
            agent.plain.append(item)
            chain.append(self._cc_render(item, i == len(items) - 1))
        agent.context_chars += chars

    def _cc_results(
        self,
        agent: _Agent,
        blocks: list[dict[str, Any]],
        results: list[tuple[str, str, bool]],
        out_chars: int,
    ) -> None:
        """The model's message and the tool results, as the next request carries them."""
        self._cc_push(
            agent,
            [
                {"content": blocks, "role": "assistant"},
                {
                    "content": [
                        {"content": r, "is_error": e, "tool_use_id": tid, "type": "tool_result"}
                        for tid, r, e in results
                    ],
                    "role": "user",
                },
            ],
            out_chars + sum(len(r) + 90 for _, r, _ in results),
        )

    def _cc_turn(
        self,
        agent: _Agent,
        blocks: list[dict[str, Any]],
        stop: str,
        model: str,
        request_class: str,
        headers_extra: dict[str, str] | None = None,
    ) -> CallSpec:
        rng = self.rng
        out_chars = sum(len(json.dumps(b)) for b in blocks)
        out_tokens = max(1, out_chars // 4 + rng.randint(0, 40))
        ctx = max(1, agent.context_chars // 4) + 4000
        new = min(ctx, rng.randint(50, 3000))
        input_tokens = rng.randint(1, 12)
        usage = {
            "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": new},
            "cache_creation_input_tokens": new,
            "cache_read_input_tokens": ctx - new,
            "input_tokens": input_tokens,
            "output_tokens": out_tokens,
            "service_tier": "standard",
        }
        response = {
            "content": blocks,
            "id": "msg_01" + b62_id(rng, 22),
            "model": model,
            "role": "assistant",
            "stop_reason": stop,
            "stop_sequence": None,
            "type": "message",
            "usage": usage,
        }
        return self._emit(
            agent,
            api="anthropic_messages",
            host="api.anthropic.com",
            path="/v1/messages?beta=true",
            response=response,
            output=[{"content": blocks, "role": "assistant"}],
            out_tokens=out_tokens,
            headers=self._cc_headers(request_class, headers_extra),
            response_headers=self._cc_response_headers(),
            status_code=200,
            error_body=None,
            response_id=response["id"],
            stop_reason=stop,
            tool_calls=[b["name"] for b in blocks if b["type"] == "tool_use"],
            tool_names=[t["name"] for t in agent.params.get("tools") or []],
            usage=Usage(input_tokens, out_tokens, ctx - new, new),
            stream_events=anthropic_stream_events(blocks),
            response_wire_bytes=int(out_chars * 1.15) + 95 * anthropic_stream_events(blocks),
        )

    def _cc_tool_use(self, name: str) -> tuple[dict[str, Any], str, bool]:
        """A tool_use block of ``name`` and the text of its result."""
        rng, take = self.rng, self.text.take
        path = f"/workspace/{self.plan.task.repo}/src/{take(rng, 10).strip().replace(' ', '_')}.py"
        if name == "Bash":
            inp: dict[str, Any] = {
                "command": take(rng, rng.randint(20, 160)),
                "description": take(rng, rng.randint(15, 50)),
            }
            result = take(rng, lognormal_int(rng, 600, 1.1, 10, 12000))
        elif name == "Read":
            inp = {"file_path": path}
            result = take(rng, lognormal_int(rng, 2500, 0.8, 100, 16000))
        elif name == "Edit":
            inp = {
                "file_path": path,
                "new_string": take(rng, lognormal_int(rng, 300, 0.7, 10, 3000)),
                "old_string": take(rng, lognormal_int(rng, 250, 0.7, 10, 3000)),
            }
            result = f"The file {path} has been updated. " + take(rng, rng.randint(100, 900))
        elif name == "Write":
            inp = {
                "content": take(rng, lognormal_int(rng, 1500, 0.7, 50, 10000)),
                "file_path": path,
            }
            result = f"File created successfully at: {path}"
        elif name == "Grep":
            inp = {
                "output_mode": "content",
                "path": f"/workspace/{self.plan.task.repo}",
                "pattern": take(rng, rng.randint(4, 30)),
            }
            result = take(rng, lognormal_int(rng, 800, 0.9, 20, 8000))
        elif name == "Glob":
            inp = {"pattern": "**/" + take(rng, rng.randint(3, 15)).strip() + "*.py"}
            result = take(rng, lognormal_int(rng, 400, 0.8, 20, 4000))
        else:  # TodoWrite
            inp = {
                "todos": [
                    {
                        "activeForm": take(rng, 30),
                        "content": take(rng, 40),
                        "status": rng.choice(["pending", "in_progress", "completed"]),
                    }
                    for _ in range(rng.randint(2, 6))
                ]
            }
            result = "Todos have been modified successfully. " + take(rng, 120)
        block = {"id": "toolu_01" + b62_id(rng, 22), "input": inp, "name": name, "type": "tool_use"}
        return block, result, rng.random() < 0.05

    _CC_TOOL_MIX = (
        ["Bash"] * 35
        + ["Read"] * 25
        + ["Edit"] * 15
        + ["Grep"] * 10
        + ["Glob"] * 5
        + ["Write"] * 5
        + ["TodoWrite"] * 5
    )

    def _cc_blocks(self, tool_uses: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rng, blocks = self.rng, []
        if rng.random() < 0.3:
            blocks.append(
                {
                    "signature": b64_blob(rng, rng.randint(200, 600)),
                    "thinking": "",
                    "type": "thinking",
                }
            )
        if rng.random() < 0.6 or not tool_uses:
            blocks.append(
                {
                    "text": self.text.take(rng, lognormal_int(rng, 220, 0.8, 20, 3000)),
                    "type": "text",
                }
            )
        return blocks + tool_uses

    def _cc_agent(self, first_items: list[dict[str, Any]], chars: int, clock: _Clock) -> _Agent:
        agent = _Agent(
            headers={},
            params={},
            chain=Chain(),
            clock=clock,
            pid=self.pid,
            parent_pids=self.parent_pids,
            process_name="claude",
        )
        self._cc_push(agent, first_items, chars)
        return agent

    def _claude(self) -> None:
        plan, rng, w = self.plan, self.rng, self.world
        model = "claude-sonnet-4-5-20250929"
        clock = _Clock(rng, plan.start + rng.uniform(0.5, 3.0))
        first: list[dict[str, Any]] = [
            {
                "content": [
                    {"text": w.cc_reminder, "type": "text"},
                    {"text": plan.task.prompt, "type": "text"},
                ],
                "role": "user",
            },
            {"content": plan.task.environment, "role": "system"},
        ]
        main = self._cc_agent(
            first, len(plan.task.prompt) + len(plan.task.environment) + 800, clock
        )
        if plan.title:
            self._cc_side("title", clock.t + 0.05, [{"content": plan.task.prompt, "role": "user"}])
        prev_message: str | None = None
        turns = plan.main_turns
        for turn in range(turns):
            last = turn == turns - 1
            ending = last and plan.status == "complete"
            spawns = plan.spawns.get(turn, [])
            child_calls = plan.children.get(turn, 0)
            uses: list[tuple[dict[str, Any], str, bool]] = []
            if not ending:
                if spawns:
                    for _ in spawns:
                        prompt = self.text.take(rng, lognormal_int(rng, 900, 0.5, 200, 4000))
                        uses.append(
                            (
                                {
                                    "id": "toolu_01" + b62_id(rng, 22),
                                    "input": {
                                        "description": self.text.take(rng, 30),
                                        "prompt": prompt,
                                        "subagent_type": "general-purpose",
                                    },
                                    "name": "Agent",
                                    "type": "tool_use",
                                },
                                prompt,
                                False,
                            )
                        )
                elif child_calls:
                    uses.append(self._cc_tool_use("Bash"))
                else:
                    n = 1 if rng.random() < 0.8 else rng.randint(2, 3)
                    uses.extend(self._cc_tool_use(rng.choice(self._CC_TOOL_MIX)) for _ in range(n))
            blocks = self._cc_blocks([u[0] for u in uses])
            main.params = self._cc_params("main", model, prev_message)
            spec = self._cc_turn(
                main, blocks, "end_turn" if not uses else "tool_use", model, "main"
            )
            prev_message = spec.response_id
            if turn in plan.summaries:
                self._cc_side(
                    "summary",
                    clock.t + 0.1,
                    [{"content": "Recent actions:\n" + self.text.take(rng, 1200), "role": "user"}],
                )
            if not uses:
                break
            results = []
            if spawns:
                t0 = clock.t
                ends = []
                for (use, prompt, _), sub_turns in zip(uses, spawns, strict=True):
                    sub_clock = _Clock(rng, t0 + rng.uniform(0.05, 0.5))
                    final = self._cc_subagent(prompt, sub_turns, sub_clock, use["id"])
                    ends.append(sub_clock.t)
                    results.append((use["id"], final, False))
                clock.t = max(ends) + rng.uniform(0.05, 0.3)
            else:
                if child_calls:
                    self._child_process(child_calls, clock)
                clock.tool()
                results = [(u["id"], r, e) for u, r, e in uses]
            if last and plan.status != "crashed":
                break  # timed out or cut at max turns with the tools still running
            self._cc_results(main, blocks, results, spec.response_wire_bytes)
            if plan.compact_at == turn:
                main = self._cc_compact(main, model)
        for _ in range(plan.error_calls):
            main.params = self._cc_params("main", model, prev_message)
            self._error(
                main,
                "anthropic_messages",
                529,
                {"error": {"message": "Overloaded", "type": "overloaded_error"}, "type": "error"},
            )
            clock.t += rng.uniform(1.0, 5.0)

    def _cc_side(self, kind: str, t: float, items: list[dict[str, Any]]) -> None:
        model = "claude-haiku-4-5-20251001"
        agent = _Agent(
            headers={},
            params=self._cc_params(kind, model, None),
            chain=Chain(items),
            clock=_Clock(self.rng, t),
            pid=self.pid,
            parent_pids=self.parent_pids,
            process_name="claude",
        )
        text = (
            json.dumps({"title": self.text.take(self.rng, self.rng.randint(20, 60))})
            if kind == "title"
            else self.text.take(self.rng, self.rng.randint(40, 160))
        )
        self._cc_turn(agent, [{"text": text, "type": "text"}], "end_turn", model, "auxiliary")

    def _cc_subagent(self, prompt: str, turns: int, clock: _Clock, tool_use_id: str) -> str:
        rng = self.rng
        agent_id = "a" + hex_id(rng, 16)
        headers = {
            "x-claude-code-agent-id": agent_id,
            "x-claude-code-agent-type": "general-purpose",
        }
        agent = self._cc_agent(
            [{"content": [{"text": prompt, "type": "text"}], "role": "user"}],
            len(prompt) + 4000,
            clock,
        )
        agent.headers = headers
        model = "claude-sonnet-4-5-20250929"
        prev = None
        final = ""
        for turn in range(turns):
            ending = turn == turns - 1
            uses = [] if ending else [self._cc_tool_use(rng.choice(self._CC_TOOL_MIX[:-5]))]
            blocks = self._cc_blocks([u[0] for u in uses])
            agent.params = self._cc_params("sub", model, prev)
            spec = self._cc_turn(
                agent, blocks, "tool_use" if uses else "end_turn", model, "subagent", agent.headers
            )
            prev = spec.response_id
            if ending:
                final = "\n".join(b["text"] for b in blocks if b["type"] == "text")
                break
            clock.tool()
            self._cc_results(
                agent, blocks, [(u["id"], r, e) for u, r, e in uses], spec.response_wire_bytes
            )
        return final

    def _cc_compact(self, main: _Agent, model: str) -> _Agent:
        """Summarise the conversation, then continue in a new one that starts from the summary."""
        rng, w = self.rng, self.world
        self._cc_push(
            main,
            [{"content": [{"text": w.cc_compact_prompt, "type": "text"}], "role": "user"}],
            len(w.cc_compact_prompt),
        )
        main.params = self._cc_params("main", model, None)
        summary = self.text.take(rng, lognormal_int(rng, 4000, 0.3, 1500, 9000))
        self._cc_turn(main, [{"text": summary, "type": "text"}], "end_turn", model, "compaction")
        return self._cc_agent(
            [
                {
                    "content": [
                        {"text": w.cc_reminder, "type": "text"},
                        {
                            "text": "This session is being continued from a previous conversation "
                            "that ran out of context. The conversation is summarized below:\n"
                            + summary,
                            "type": "text",
                        },
                    ],
                    "role": "user",
                },
                {"content": self.plan.task.environment, "role": "system"},
            ],
            len(summary) + len(self.plan.task.environment) + 800,
            main.clock,
        )

    def _child_process(self, calls: int, clock: _Clock) -> None:
        """A tool runs a script that calls the API itself: its own process, no harness headers.

        A third of the time the process has exited before the proxy could look it up, so
        only timing links it to the call whose tool ran it.
        """
        rng = self.rng
        found = rng.random() < 0.67
        pid = rng.randint(300, 4_000_000)
        shell = rng.randint(300, 4_000_000)
        agent = _Agent(
            headers={},
            params={},
            chain=Chain(),
            clock=_Clock(rng, clock.t + 0.3),
            pid=pid if found else None,
            parent_pids=[shell, self.pid, *self.parent_pids] if found else None,
            process_name="python3" if found else None,
        )
        agent.params = self.world.script_params()
        agent.chain.append(
            {"content": "Review this diff:\n" + self.text.take(rng, 1500), "role": "user"}
        )
        headers = {
            "accept": "application/json",
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
            "user-agent": "Anthropic/Python 0.69.0",
            "x-api-key": "[REDACTED]",
            "x-stainless-lang": "python",
            "x-stainless-package-version": "0.69.0",
            "x-stainless-runtime": "CPython",
            "host": "api.anthropic.com",
        }
        for k in range(calls):
            blocks = [
                {
                    "text": self.text.take(rng, lognormal_int(rng, 500, 0.6, 50, 3000)),
                    "type": "text",
                }
            ]
            rng_usage = rng.randint(200, 4000)
            response = {
                "content": blocks,
                "id": "msg_01" + b62_id(rng, 22),
                "model": "claude-sonnet-4-5-20250929",
                "role": "assistant",
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "type": "message",
                "usage": {"input_tokens": rng_usage, "output_tokens": len(blocks[0]["text"]) // 4},
            }
            self._emit(
                agent,
                api="anthropic_messages",
                host="api.anthropic.com",
                path="/v1/messages",
                response=response,
                output=[{"content": blocks, "role": "assistant"}],
                out_tokens=len(blocks[0]["text"]) // 4,
                headers=dict(headers),
                response_headers=self._cc_response_headers(),
                status_code=200,
                error_body=None,
                response_id=response["id"],
                stop_reason="end_turn",
                tool_calls=[],
                tool_names=[],
                usage=Usage(rng_usage, len(blocks[0]["text"]) // 4, None, None),
                stream_events=anthropic_stream_events(blocks),
                response_wire_bytes=len(blocks[0]["text"]) + 95 * anthropic_stream_events(blocks),
            )
            if k < calls - 1:
                agent.chain.append({"content": blocks, "role": "assistant"})
                agent.chain.append(
                    {"content": "Continue: " + self.text.take(rng, 200), "role": "user"}
                )
        clock.t = max(clock.t, agent.clock.t)

    def _error(self, agent: _Agent, api: str, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body, separators=(",", ":")).encode()
        headers = (
            self._cc_headers("main")
            if api == "anthropic_messages"
            else self._codex_headers(agent.headers)
        )
        self._emit(
            agent,
            api=api,
            host=headers["host"],
            path="/v1/messages?beta=true" if api == "anthropic_messages" else "/v1/responses",
            response=None,
            output=[],
            out_tokens=0,
            headers=headers,
            response_headers={"content-type": "application/json", "content-length": str(len(raw))},
            status_code=status,
            error_body=raw,
            tool_names=[t.get("name", t.get("type")) for t in agent.params.get("tools") or []],
            response_wire_bytes=len(raw),
        )

    # -- Codex ----------------------------------------------------------------------------

    def _codex_headers(self, ids: dict[str, str]) -> dict[str, str]:
        return {
            "version": "0.171.0",
            "originator": "codex_exec",
            "user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) dumb (codex_exec; 0.171.0)",
            "accept": "text/event-stream",
            "content-type": "application/json",
            "authorization": "[REDACTED]",
            "x-client-request-id": ids["session-id"],
            "x-codex-turn-metadata": ids["turn-metadata"],
            "accept-encoding": "zstd,gzip",
            "host": "api.openai.com",
            **{k: v for k, v in ids.items() if k != "turn-metadata"},
        }

    def _codex_agent(
        self, thread: str, parent_thread: str | None, clock: _Clock, task_text: str
    ) -> _Agent:
        rng, w = self.rng, self.world
        turn_id = uuid4(rng)
        metadata = {
            "installation_id": uuid4(rng),
            "session_id": self.session,
            "thread_id": thread,
            "turn_id": turn_id,
            "agent_name": "/root",
            "window_id": f"{thread}:0",
            "sandbox": "none",
            "model": "gpt-5.5",
            "reasoning_effort": "medium",
            "turn_started_at_unix_ms": int(clock.t * 1000),
        }
        ids = {
            "session-id": self.session,
            "thread-id": thread,
            "turn-metadata": json.dumps(metadata, separators=(",", ":")),
        }
        if parent_thread:
            ids["x-codex-parent-thread-id"] = parent_thread
            ids["x-openai-subagent"] = "thread_spawn"
        client_metadata = {
            "mcp_attribution": '{"status":"none"}',
            "root_turn_id": turn_id,
            "session_id": self.session,
            "thread_id": thread,
            "turn_id": turn_id,
            "x-codex-installation-id": metadata["installation_id"],
            "x-codex-turn-metadata": ids["turn-metadata"],
        }
        params = {
            "client_metadata": client_metadata,
            "include": ["reasoning.encrypted_content"],
            "model": "gpt-5.5",
            "parallel_tool_calls": True,
            "prompt_cache_key": thread,
            "reasoning": {"effort": "medium"},
            "store": False,
            "stream": True,
            "text": {"verbosity": "low"},
            "tool_choice": "auto",
            "tools": w.codex_tools,
        }
        env = (
            "<environment_context>\n  <cwd>/workspace/" + self.plan.task.repo + "</cwd>\n"
            "  <shell>bash</shell>\n"
            + self.plan.task.environment[:600]
            + "\n</environment_context>"
        )
        items = [
            *w.codex_developer,
            {"content": [{"text": env, "type": "input_text"}], "role": "user", "type": "message"},
            self._codex_echo(
                {
                    "content": [{"text": task_text, "type": "input_text"}],
                    "id": "msg_" + uuid4(rng),
                    "role": "user",
                    "type": "message",
                },
                turn_id,
                clock.t,
            ),
        ]
        agent = _Agent(
            headers=ids,
            params=params,
            chain=Chain(items),
            clock=clock,
            pid=self.pid,
            parent_pids=self.parent_pids,
            process_name="codex",
        )
        agent.turn_id = turn_id
        agent.context_chars = 22000
        return agent

    def _codex_echo(
        self, item: dict[str, Any], turn_id: str, t: float | None = None
    ) -> dict[str, Any]:
        """The item as Codex sends it back: with its passthrough metadata."""
        if not self.quirks:
            return item
        meta: dict[str, Any] = {"turn_id": turn_id}
        if t is not None:
            meta["create_time"] = round(t, 6)
        return {**item, "internal_chat_message_metadata_passthrough": meta}

    def _codex_turn(self, agent: _Agent, output: list[dict[str, Any]]) -> CallSpec:
        rng, w = self.rng, self.world
        out_chars = sum(len(json.dumps(i)) for i in output)
        out_tokens = max(1, out_chars // 4)
        ctx = agent.context_chars // 4
        cached = int(ctx * rng.uniform(0.8, 0.98))
        created = int(agent.clock.t)
        usage = {
            "input_tokens": ctx,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": rng.randint(0, out_tokens)},
            "total_tokens": ctx + out_tokens,
        }
        response = {
            "background": False,
            "completed_at": created + 2,
            "created_at": created,
            "error": None,
            "id": "resp_" + hex_id(rng, 48),
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": None,
            "max_tool_calls": None,
            "metadata": {},
            "model": "gpt-5.5",
            "object": "response",
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "prompt_cache_key": agent.params["prompt_cache_key"],
            "prompt_cache_retention": None,
            "reasoning": {"effort": "medium", "summary": None},
            "safety_identifier": None,
            "service_tier": "default",
            "status": "completed",
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "low"},
            "tool_choice": "auto",
            "tools": w.codex_tools,
            "top_logprobs": 0,
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
        }
        names = [i["name"] for i in output if i["type"].endswith("_call")]
        return self._emit(
            agent,
            api="openai_responses",
            host="api.openai.com",
            path="/v1/responses",
            response=response,
            output=output,
            out_tokens=out_tokens,
            headers=self._codex_headers(agent.headers),
            response_headers={
                "content-type": "text/event-stream; charset=utf-8",
                "x-request-id": "req_" + hex_id(rng, 32),
                "openai-processing-ms": str(rng.randint(200, 9000)),
                "x-codex-primary-used-percent": str(rng.randint(0, 100)),
            },
            status_code=200,
            error_body=None,
            response_id=response["id"],
            stop_reason="completed",
            tool_calls=names,
            tool_names=[t.get("name", t.get("type")) for t in w.codex_tools],
            usage=Usage(ctx, out_tokens, cached, None),
            stream_events=2 + 2 * len(output),
            response_wire_bytes=2 * (out_chars + 9800) + 70 * (2 + 2 * len(output)),
        )

    def _codex_output(
        self, call: str | None
    ) -> tuple[list[dict[str, Any]], list[tuple[str, str, str | None]]]:
        """Output items of one turn and the tool calls in it (call_id, kind, payload)."""
        rng, take = self.rng, self.text.take
        out: list[dict[str, Any]] = [
            {
                "encrypted_content": b64_blob(rng, rng.randint(600, 2400)),
                "id": "rs_" + hex_id(rng, 48),
                "summary": [],
                "type": "reasoning",
            }
        ]
        if call is None or rng.random() < 0.5:
            out.append(
                {
                    "content": [
                        {
                            "annotations": [],
                            "logprobs": [],
                            "text": take(rng, lognormal_int(rng, 250, 0.8, 20, 3000)),
                            "type": "output_text",
                        }
                    ],
                    "id": "msg_" + hex_id(rng, 48),
                    "role": "assistant",
                    "status": "completed",
                    "type": "message",
                }
            )
        calls: list[tuple[str, str, str | None]] = []
        if call == "spawn_agent":
            prompt = take(rng, lognormal_int(rng, 900, 0.5, 200, 4000))
            cid = "call_" + b62_id(rng, 24)
            out.append(
                {
                    "arguments": json.dumps({"agent_type": "worker", "message": prompt}),
                    "call_id": cid,
                    "id": "fc_" + hex_id(rng, 48),
                    "name": "spawn_agent",
                    "status": "completed",
                    "type": "function_call",
                }
            )
            calls.append((cid, "spawn", prompt))
        elif call is not None:
            for _ in range(1 if rng.random() < 0.85 else 2):
                cid = "call_" + b62_id(rng, 24)
                if rng.random() < 0.2:
                    patch = (
                        "*** Begin Patch\n*** Update File: src/x.py\n"
                        + take(rng, lognormal_int(rng, 900, 0.7, 50, 6000))
                        + "\n*** End Patch"
                    )
                    out.append(
                        {
                            "call_id": cid,
                            "id": "ctc_" + hex_id(rng, 48),
                            "input": patch,
                            "name": "apply_patch",
                            "status": "completed",
                            "type": "custom_tool_call",
                        }
                    )
                    calls.append((cid, "patch", None))
                else:
                    cmd = take(rng, rng.randint(15, 160))
                    out.append(
                        {
                            "arguments": json.dumps({"cmd": cmd}),
                            "call_id": cid,
                            "id": "fc_" + hex_id(rng, 48),
                            "name": "exec_command",
                            "status": "completed",
                            "type": "function_call",
                        }
                    )
                    calls.append((cid, "exec", None))
        return out, calls

    def _codex_result(self, agent: _Agent, cid: str, kind: str, payload: Any) -> dict[str, Any]:
        rng, take = self.rng, self.text.take
        turn_id = agent.turn_id
        if kind == "patch":
            return self._codex_echo(
                {
                    "call_id": cid,
                    "output": json.dumps(
                        {
                            "metadata": {"duration_seconds": 0.0, "exit_code": 0},
                            "output": "Success. Updated the following files:\nM src/x.py\n",
                        }
                    ),
                    "type": "custom_tool_call_output",
                },
                turn_id,
                agent.clock.t,
            )
        text = payload if kind == "spawn" else take(rng, lognormal_int(rng, 700, 1.1, 10, 12000))
        output = (
            f"Chunk ID: {hex_id(rng, 6)}\nWall time: {rng.uniform(0, 3):.4f} seconds\n"
            f"Process exited with code {0 if rng.random() < 0.9 else 1}\n"
            f"Original token count: {len(text) // 4}\nOutput:\n{text}"
        )
        return self._codex_echo(
            {
                "call_id": cid,
                "id": "fco_" + uuid4(rng),
                "output": output,
                "type": "function_call_output",
            },
            turn_id,
            agent.clock.t,
        )

    def _codex_push(
        self, agent: _Agent, output: list[dict[str, Any]], results: list[dict[str, Any]]
    ) -> None:
        turn_id = agent.turn_id
        for item in output:
            agent.chain.append(self._codex_echo(item, turn_id))
        for item in results:
            agent.chain.append(item)
        agent.context_chars += sum(len(json.dumps(i)) for i in results) + 3000

    def _codex(self) -> None:
        plan, rng = self.plan, self.rng
        clock = _Clock(rng, plan.start + rng.uniform(0.5, 3.0))
        main = self._codex_agent(self.session, None, clock, plan.task.prompt)
        turns = plan.main_turns
        for turn in range(turns):
            last = turn == turns - 1
            ending = last and plan.status == "complete"
            spawns = plan.spawns.get(turn, [])
            kind = None if ending else "spawn_agent" if spawns else "exec"
            output, calls = self._codex_output(kind)
            if spawns and len(spawns) > 1:  # parallel spawns: one spawn_agent call per agent
                for _ in spawns[1:]:
                    more, more_calls = self._codex_output("spawn_agent")
                    output.extend(i for i in more if i["type"] == "function_call")
                    calls.extend(more_calls)
            self._codex_turn(main, output)
            if not calls or (last and plan.status != "crashed"):
                break
            results = []
            if spawns:
                t0, ends = clock.t, []
                for (cid, _, prompt), sub_turns in zip(calls, spawns, strict=True):
                    sub_clock = _Clock(rng, t0 + rng.uniform(0.05, 0.5))
                    final = self._codex_subagent(prompt or "", sub_turns, sub_clock)
                    ends.append(sub_clock.t)
                    results.append(self._codex_result(main, cid, "spawn", final))
                clock.t = max(ends) + rng.uniform(0.05, 0.3)
            else:
                if turn in plan.children:
                    self._child_process(plan.children[turn], clock)
                clock.tool()
                results = [self._codex_result(main, cid, k, p) for cid, k, p in calls]
            self._codex_push(main, output, results)
        for _ in range(plan.error_calls):
            self._error(
                main,
                "openai_responses",
                500,
                {
                    "error": {
                        "code": "server_error",
                        "message": "The server had an error "
                        "while processing your request. Sorry about that!",
                        "param": None,
                        "type": "server_error",
                    }
                },
            )
            clock.t += rng.uniform(1.0, 5.0)

    def _codex_subagent(self, prompt: str, turns: int, clock: _Clock) -> str:
        agent = self._codex_agent(uuid4(self.rng), self.session, clock, prompt)
        final = ""
        for turn in range(turns):
            ending = turn == turns - 1
            output, calls = self._codex_output(None if ending else "exec")
            self._codex_turn(agent, output)
            if ending:
                final = "\n".join(
                    c["text"] for i in output if i["type"] == "message" for c in i["content"]
                )
                break
            clock.tool()
            self._codex_push(
                agent, output, [self._codex_result(agent, c, k, p) for c, k, p in calls]
            )
        return final
