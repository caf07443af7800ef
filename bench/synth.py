"""Synthetic harness traffic: the pieces a simulated rollout is made of.

Text, ids, the world (system prompts, tool lists, instructions that every request
repeats), tasks, rollout plans, and what a sink receives for each call (``CallSpec``),
with the event streams a provider would send. ``bench.harnesses`` runs the plans.
"""

from __future__ import annotations

import base64
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mitm_addon.protocols.base import Usage

# -- text -------------------------------------------------------------------------------

# Characters of the shared pool every message slices its text from. Far larger than
# zstd's window inside one Parquet page (1 MiB), so random slices do not compress
# against each other: the stored bytes reflect the word-level entropy of the text.
TEXT_POOL_CHARS = 16 * 1024 * 1024
_SHIFTS = 4


def _words(text: str) -> list[str]:
    return text.split()


_SYLLABLES = _words(
    "ba be bi bo bu da de di do du fa fe fi fo ga ge go ka ke ki ko ku la le li lo lu ma me "
    "mi mo mu na ne ni no nu pa pe pi po ra re ri ro ru sa se si so su ta te ti to tu va ve "
    "vi vo za ze zi zo ch sh th st tr pl qu ex in on an er al or"
)
_CODE = _words(
    "def return self None True False import from class if else for in while with as try "
    "except raise assert lambda yield async await = == != ( ) [ ] { } : , . -> + - * / % "
    "0 1 2 3 10 100 # // /* */ => const let var function export interface type string int "
    "bool null undefined error Error test tests src lib main index util config path file "
    "data value key name id result response request json parse write read open close"
)
_ENGLISH = _words(
    "the of and to a in is it that for on was with he as I his be at by had not are but "
    "from or have an they which one you were all we her she there would their will when "
    "who him been has more if no out so said what up its about than into them can only "
    "other time new some could these two may first then do any like my now over such our "
    "man me even most made after also did many off before must well back through years "
    "much where your way down should because each just those people how too little state "
    "good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year come since "
    "against go came right used take three file function test change fix update check"
)


def _vocabulary(rng: random.Random) -> list[str]:
    made = {"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(4000)}
    words = _ENGLISH + _CODE + sorted(made)
    rng.shuffle(words)
    return words


class Text:
    """A pool of word-salad text (Zipf-distributed words, code punctuation, newlines)."""

    def __init__(self, seed: int, chars: int = TEXT_POOL_CHARS) -> None:
        rng = random.Random(f"{seed}:text")
        vocab = _vocabulary(rng)
        # Zipf's law, s = 1.1: a few words carry most of the text, as in prose and code.
        seps = [(" ", 80), ("\n", 8), ("\n    ", 5), (", ", 4), (". ", 3)]
        tokens, cum, total = [], [], 0.0
        for i, word in enumerate(vocab):
            for sep, weight in seps:
                total += weight / (i + 1) ** 1.1
                tokens.append(word + sep)
                cum.append(total)
        # A quarter of the pool is drawn; the rest are letter substitutions of it (same
        # statistics, different bytes), which is much faster to make.
        base_chars = chars // _SHIFTS
        base = "".join(rng.choices(tokens, cum_weights=cum, k=base_chars // 6 + 1))[:base_chars]
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.pool = "".join(
            base.translate(str.maketrans(letters, letters[k:] + letters[:k]))
            for k in range(0, 26, 26 // _SHIFTS)
        )[:chars]

    def take(self, rng: random.Random, n: int) -> str:
        """``n`` characters (at least 1) from a random place in the pool."""
        n = max(1, min(n, len(self.pool) - 1))
        at = rng.randrange(len(self.pool) - n)
        return self.pool[at : at + n]


def lognormal_int(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    """A size drawn from a log-normal (median, sigma), clipped to [lo, hi]."""
    return max(lo, min(hi, int(median * math.exp(rng.gauss(0.0, sigma)))))


# -- ids --------------------------------------------------------------------------------

_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def hex_id(rng: random.Random, digits: int) -> str:
    return f"{rng.getrandbits(4 * digits):0{digits}x}"


def b62_id(rng: random.Random, chars: int) -> str:
    return "".join(rng.choices(_B62, k=chars))


def uuid4(rng: random.Random) -> str:
    h = hex_id(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:]}"


def call_id_at(rng: random.Random, t: float, counter: int) -> str:
    """A call id as ``mitm_addon.ids.new_id`` makes one, for a call started at ``t``."""
    return f"{int(t * 1000):012x}{counter & 0xFFFFFF:06x}{rng.getrandbits(24):06x}"


def b64_blob(rng: random.Random, n_bytes: int) -> str:
    """Opaque, incompressible text (signatures, encrypted reasoning)."""
    return base64.b64encode(rng.getrandbits(8 * n_bytes).to_bytes(n_bytes, "little")).decode()


# -- the constant parts of every request ------------------------------------------------


def _schema(rng: random.Random, text: Text, props: list[str], doc_chars: int) -> dict[str, Any]:
    per = max(20, doc_chars // max(1, len(props)))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "additionalProperties": False,
        "properties": {p: {"description": text.take(rng, per), "type": "string"} for p in props},
        "required": props[:1],
        "type": "object",
    }


def _cc_tool(
    rng: random.Random, text: Text, name: str, size: int, props: list[str]
) -> dict[str, Any]:
    return {
        "description": text.take(rng, int(size * 0.7)),
        "input_schema": _schema(rng, text, props, int(size * 0.2)),
        "name": name,
    }


# Claude Code's tools: (name, approximate JSON bytes, input properties); about 20 kB.
_CC_TOOLS = [
    ("Agent", 4200, ["description", "prompt", "subagent_type"]),
    ("Bash", 3400, ["command", "description", "timeout", "run_in_background"]),
    ("Glob", 700, ["pattern", "path"]),
    ("Grep", 1800, ["pattern", "path", "glob", "output_mode", "-n", "-i"]),
    ("ExitPlanMode", 600, ["plan"]),
    ("Read", 1500, ["file_path", "offset", "limit"]),
    ("Edit", 1100, ["file_path", "old_string", "new_string", "replace_all"]),
    ("Write", 700, ["file_path", "content"]),
    ("NotebookEdit", 900, ["notebook_path", "cell_id", "new_source"]),
    ("WebFetch", 1000, ["url", "prompt"]),
    ("TodoWrite", 2600, ["todos"]),
    ("WebSearch", 800, ["query", "allowed_domains"]),
    ("BashOutput", 500, ["bash_id", "filter"]),
    ("KillShell", 300, ["shell_id"]),
    ("Skill", 900, ["command"]),
]
# Codex's tools: about 9 kB, as Codex 0.171.0 sent them.
_CODEX_TOOLS = [
    ("exec_command", 1500, ["cmd", "workdir", "yield_time_ms", "max_output_tokens"]),
    ("write_stdin", 780, ["session_id", "chars", "yield_time_ms"]),
    ("update_plan", 900, ["explanation", "plan"]),
    ("view_image", 400, ["path"]),
    ("spawn_agent", 1400, ["message", "agent_type"]),
    ("wait_agent", 600, ["ids", "timeout_ms"]),
    ("request_user_input", 1300, ["questions"]),
]


@dataclass
class World:
    """Everything constant across rollouts: system prompts, tool lists, instructions."""

    text: Text
    cc_system: list[dict[str, Any]]  # without the per-call billing block
    cc_tools: list[dict[str, Any]]
    cc_sub_system: list[dict[str, Any]]
    cc_sub_tools: list[dict[str, Any]]
    cc_reminder: str
    cc_compact_prompt: str
    title_system: list[dict[str, Any]]
    summary_system: list[dict[str, Any]]
    script_system: str
    codex_tools: list[dict[str, Any]]
    codex_developer: list[dict[str, Any]]  # the first input items of every Codex request

    def script_params(self) -> dict[str, Any]:
        """What a tool's script sends besides its messages: the same for every rollout."""
        return {
            "max_tokens": 4096,
            "model": "claude-sonnet-4-5-20250929",
            "stream": True,
            "system": self.script_system,
        }

    def constants(self) -> list[Any]:
        """The constant objects that requests embed (their JSON is computed once)."""
        return [
            *self.cc_system,
            *self.cc_tools,
            self.cc_tools,
            self.cc_sub_tools,
            *self.cc_sub_system,
            *self.title_system,
            *self.summary_system,
            self.script_system,
            *self.codex_tools,
            self.codex_tools,
        ]


def build_world(seed: int, text: Text | None = None) -> World:
    rng = random.Random(f"{seed}:world")
    text = text or Text(seed)
    cc_tools = [_cc_tool(rng, text, n, s, p) for n, s, p in _CC_TOOLS]
    by_name = {t["name"]: t for t in cc_tools}
    codex_tools: list[dict[str, Any]] = [
        {
            "description": text.take(rng, int(s * 0.7)),
            "name": n,
            "parameters": _schema(rng, text, p, int(s * 0.2)),
            "strict": False,
            "type": "function",
        }
        for n, s, p in _CODEX_TOOLS
    ]
    codex_tools.insert(
        3,
        {
            "description": "Use the `apply_patch` tool to edit files. " + text.take(rng, 300),
            "format": {"definition": text.take(rng, 500), "syntax": "lark", "type": "grammar"},
            "name": "apply_patch",
            "type": "custom",
        },
    )
    codex_tools.append({"type": "web_search"})
    ephemeral = {"type": "ephemeral"}
    return World(
        text=text,
        cc_system=[
            {"text": "You are Claude Code, Anthropic's official CLI for Claude.", "type": "text"},
            {
                "cache_control": {"scope": "global", "type": "ephemeral"},
                "text": text.take(rng, 2500),
                "type": "text",
            },
            {"cache_control": ephemeral, "text": text.take(rng, 7400), "type": "text"},
        ],
        cc_tools=cc_tools,
        cc_sub_system=[
            {
                "text": "You are an agent for Claude Code, Anthropic's official CLI for Claude.",
                "type": "text",
            },
            {"cache_control": ephemeral, "text": text.take(rng, 3200), "type": "text"},
        ],
        cc_sub_tools=[by_name[n] for n in ("Bash", "Glob", "Grep", "Read", "Edit", "Write")],
        cc_reminder="<system-reminder>\n" + text.take(rng, 640) + "\n</system-reminder>",
        cc_compact_prompt="Your task is to create a detailed summary of the conversation so far. "
        + text.take(rng, 1100),
        title_system=[
            {
                "text": "Generate a concise, sentence-case title (3-7 words) for this coding "
                "session. " + text.take(rng, 600),
                "type": "text",
            },
        ],
        summary_system=[
            {
                "text": "Summarize what the agent did in the last few steps in one line. "
                + text.take(rng, 520),
                "type": "text",
            },
        ],
        script_system="You review code changes and answer with findings. " + text.take(rng, 900),
        codex_tools=codex_tools,
        codex_developer=[
            {
                "content": [
                    {
                        "text": "You are Codex, a coding agent based on GPT-5. "
                        + text.take(rng, 12000),
                        "type": "input_text",
                    }
                ],
                "role": "developer",
                "type": "message",
            },
            {
                "content": [
                    {"text": "<skills_instructions>\n" + text.take(rng, 5200), "type": "input_text"}
                ],
                "role": "developer",
                "type": "message",
            },
        ],
    )


# -- tasks and rollout plans --------------------------------------------------------------


@dataclass
class Task:
    index: int
    task_id: str
    harness: str  # claude or codex
    prompt: str
    environment: str  # Claude Code's environment block / Codex's environment_context
    repo: str
    success_rate: float
    graded: bool  # the verifier gives partial credit (tests passed / tests run)


def make_task(seed: int, index: int, text: Text, codex_share: float) -> Task:
    rng = random.Random(f"{seed}:task:{index}")
    repo = f"{text.take(rng, 8).strip().replace(' ', '-') or 'repo'}-{index}"
    return Task(
        index=index,
        task_id=f"task-{index:05d}",
        harness="codex" if rng.random() < codex_share else "claude",
        prompt=f"In the repository {repo}: "
        + text.take(rng, lognormal_int(rng, 500, 0.6, 80, 2500)),
        environment=text.take(rng, lognormal_int(rng, 3500, 0.3, 1500, 7000)),
        repo=repo,
        success_rate=rng.betavariate(1.2, 1.2),
        graded=rng.random() < 0.25,
    )


@dataclass
class RolloutPlan:
    """What one rollout will do; the simulation follows it call for call."""

    index: int
    rollout_id: str
    seed: str
    task: Task
    version: int
    group_id: str
    host: int
    run_id: str
    start: float
    status: str  # complete, timed_out, crashed, partial
    main_turns: int
    spawns: dict[int, list[int]] = field(default_factory=dict)  # turn -> sub-agent turns
    children: dict[int, int] = field(default_factory=dict)  # turn -> child process calls
    summaries: list[int] = field(default_factory=list)  # turns followed by a summary call
    title: bool = False
    compact_at: int | None = None
    error_calls: int = 0  # crashed: failing calls (the harness's retries) at the end

    @property
    def calls(self) -> int:
        return (
            self.main_turns
            + sum(sum(v) for v in self.spawns.values())
            + sum(self.children.values())
            + len(self.summaries)
            + int(self.title)
            + int(self.compact_at is not None)
            + self.error_calls
        )

    @property
    def max_seconds(self) -> float:
        """An upper bound of the rollout's wall time (every call and tool gap is capped)."""
        return self.calls * CALL_SECONDS_MAX + 60.0


# Caps of the timing model: time to first byte, generation and the tool run after a call.
TTFB_MAX_S, GENERATION_MAX_S, TOOL_MAX_S = 3.0, 12.0, 5.0
CALL_SECONDS_MAX = TTFB_MAX_S + GENERATION_MAX_S + TOOL_MAX_S


def plan_rollout(seed: int, index: int, task: Task, budget: int, **place: Any) -> RolloutPlan:
    """A rollout of at most ``budget`` calls (exactly ``budget`` when that is smaller
    than what it would have made)."""
    rng = random.Random(f"{seed}:plan:{index}")
    claude = task.harness == "claude"
    u = rng.random()
    status = (
        "complete"
        if u < 0.92
        else "timed_out"
        if u < 0.96
        else "crashed"
        if u < 0.98
        else "partial"
    )
    plan = RolloutPlan(
        index=index,
        rollout_id=f"ro-{index:07d}-{hex_id(rng, 6)}",
        seed=f"{seed}:rollout:{index}",
        task=task,
        status=status,
        main_turns=lognormal_int(rng, 22, 0.75, 2, 200),
        title=claude,
        **place,
    )
    t = plan.main_turns
    if status == "crashed":
        plan.error_calls = rng.randint(1, 3)
    if rng.random() < (0.35 if claude else 0.15) and t >= 4:
        for _ in range(rng.choice((1, 1, 2))):
            turn = rng.randrange(1, t - 1)
            parallel = 1 if rng.random() < 0.75 else rng.randint(2, 3)
            plan.spawns[turn] = [lognormal_int(rng, 8, 0.6, 2, 40) for _ in range(parallel)]
    if rng.random() < 0.06 and t >= 3:
        turn = rng.randrange(0, t - 1)
        if turn not in plan.spawns:
            plan.children[turn] = rng.randint(1, 4)
    if claude:
        plan.summaries = sorted({rng.randrange(0, t) for _ in range(t // 15)})
        if t >= 60 and rng.random() < 0.5:
            plan.compact_at = int(t * rng.uniform(0.5, 0.7))
            plan.spawns.pop(plan.compact_at, None)
            plan.children.pop(plan.compact_at, None)
    _fit(plan, budget)
    return plan


def _fit(plan: RolloutPlan, budget: int) -> None:
    """Shrink the plan to exactly ``budget`` calls when it would make more."""
    if plan.calls <= budget:
        return
    plan.spawns.clear()
    plan.children.clear()
    plan.summaries.clear()
    plan.compact_at = None
    plan.error_calls = min(plan.error_calls, 1)
    plan.title = plan.title and budget >= 3
    fixed = int(plan.title) + plan.error_calls
    if budget - fixed < 1:
        plan.title, plan.error_calls, fixed = False, 0, 0
    plan.main_turns = budget - fixed


# -- what a sink receives -----------------------------------------------------------------


class Chain:
    """A conversation as the harness sends it: items, with hashes cached by the sink.

    ``valid`` is how many leading items still have the hashes in ``hashes``; replacing an
    item (Claude Code moving ``cache_control``) invalidates it and everything after it.
    """

    __slots__ = ("items", "hashes", "nbytes", "valid")

    def __init__(self, items: list[Any] | None = None) -> None:
        self.items: list[Any] = list(items or [])
        self.hashes: list[str] = []
        self.nbytes: list[int] = []
        self.valid = 0

    def append(self, item: Any) -> None:
        self.items.append(item)

    def replace(self, index: int, item: Any) -> None:
        self.items[index] = item
        self.valid = min(self.valid, index)

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class CallSpec:
    """One call as the harness made it, and what the recorder's parsers would extract."""

    rollout_index: int
    call_id: str
    run_id: str
    rollout_id: str
    api: str  # anthropic_messages or openai_responses
    host: str
    path: str
    headers: dict[str, str]  # request headers, without content-length
    response_headers: dict[str, str]
    pid: int | None
    parent_pids: list[int] | None
    process_name: str | None
    client_conn_id: str
    started_at: float
    first_byte_at: float
    ended_at: float
    params: dict[str, Any]  # the request body minus its items
    chain: Chain
    n_items: int  # the request carried chain.items[:n_items]
    status_code: int
    response: dict[str, Any] | None  # the assembled response (None for an error)
    output_items: list[Any]
    error_body: bytes | None  # the error response body (JSON), for failed calls
    # What the protocol adapter extracts (the direct sink uses these; build_rows derives them).
    response_id: str | None = None
    stop_reason: str | None = None
    tool_calls: list[str] = field(default_factory=list)
    tool_names: list[str] = field(default_factory=list)
    usage: Usage | None = None
    stream_events: int | None = None
    response_wire_bytes: int = 0


Sink = Callable[[CallSpec], None]
LIST_KEY = {"anthropic_messages": "messages", "openai_responses": "input"}
_SSE_CHUNK = 160  # characters of text per streamed delta event


def anthropic_stream_events(content: list[dict[str, Any]]) -> int:
    """Events of the stream ``render_anthropic_sse`` writes for this content."""
    n = 3  # message_start, message_delta, message_stop
    for block in content:
        n += 2 + _deltas(block)
    return n


def _deltas(block: dict[str, Any]) -> int:
    if block["type"] == "text":
        return max(1, math.ceil(len(block["text"]) / _SSE_CHUNK))
    return 1  # tool_use: one input_json_delta; thinking: one signature_delta


def render_anthropic_sse(response: dict[str, Any]) -> bytes:
    """The response as the Messages API streams it (message_start ... message_stop)."""
    out: list[str] = []

    def event(name: str, data: dict[str, Any]) -> None:
        out.append(f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n")

    usage = dict(response["usage"], output_tokens=1)
    shell = {k: v for k, v in response.items() if k not in ("content", "usage")}
    shell.update(content=[], stop_reason=None, stop_sequence=None, usage=usage)
    event("message_start", {"type": "message_start", "message": shell})
    for i, block in enumerate(response["content"]):
        kind = block["type"]
        if kind == "text":
            event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": i,
                    "content_block": {"type": "text", "text": ""},
                },
            )
            text = block["text"]
            for at in range(0, max(1, len(text)), _SSE_CHUNK):
                event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "text_delta", "text": text[at : at + _SSE_CHUNK]},
                    },
                )
        elif kind == "tool_use":
            start = dict(block, input={})
            event(
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": start},
            )
            event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": i,
                    "delta": {
                        "type": "input_json_delta",
                        "partial_json": json.dumps(block["input"], ensure_ascii=False),
                    },
                },
            )
        else:  # thinking, display omitted: no thinking text, a signature
            event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": i,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                },
            )
            event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": i,
                    "delta": {"type": "signature_delta", "signature": block["signature"]},
                },
            )
        event("content_block_stop", {"type": "content_block_stop", "index": i})
    event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": response["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": response["usage"]["output_tokens"]},
        },
    )
    event("message_stop", {"type": "message_stop"})
    return "".join(out).encode()


def render_responses_sse(response: dict[str, Any]) -> bytes:
    """The response as the Responses API streams it (created, items, completed)."""
    out: list[str] = []

    def event(name: str, data: dict[str, Any]) -> None:
        out.append(f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n")

    shell = dict(response, output=[], status="in_progress", usage=None)
    event("response.created", {"type": "response.created", "response": shell})
    for i, item in enumerate(response["output"]):
        event(
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": i, "item": item},
        )
        event(
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": i, "item": item},
        )
    event("response.completed", {"type": "response.completed", "response": response})
    return "".join(out).encode()
