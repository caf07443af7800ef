"""Realistic synthetic shards: ``python -m bench.gen_shards --out DIR --calls 1000000 --seed 0``.

Rollouts of Claude Code- and Codex-shaped agents (``bench.harnesses``) are grouped by task
(``--group-size`` rollouts per task and policy version), run on a few simulated hosts
(one proxy run per host and policy version, shards rotated every 5,000 calls as the
recorder's default), and written as the recorder writes them: ``calls``, ``messages``,
``rollouts`` and ``rewards`` shards through ``pipeline.shards.write_shard``.

Two sinks turn a simulated call into rows:

* ``--rows build_rows``: the request and the streamed response are rendered as bytes
  and go through ``mitm_addon.recorder.build_rows``, exactly as the proxy records them
  (about 1 ms per call: for tests and the storage benchmark).
* ``--rows direct`` (default): the same rows computed incrementally, hashing only the
  items a call adds (``pipeline.canonical``'s contract, ``split_params``'s refs); fast
  enough for a million calls. The rows themselves are built by the recorder's own
  functions (``capture_row``, ``request_columns``, ``response_columns``,
  ``usage_columns``, ``call_status``, ``message_row``) from what the simulation knows
  already, so the two sinks cannot drift apart; ``tests/bench`` checks that both give
  identical shards.

The output depends only on ``--calls``, ``--seed`` and the model options, not on
``--workers``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harnesses import Simulation
from bench.synth import (
    LIST_KEY,
    CallSpec,
    RolloutPlan,
    Task,
    Text,
    World,
    build_world,
    hex_id,
    make_task,
    plan_rollout,
    render_anthropic_sse,
    render_responses_sse,
)
from mitm_addon.capture import Capture
from mitm_addon.protocols.base import ParsedRequest, ParsedResponse
from mitm_addon.recorder import (
    MAX_BODY_BYTES,
    api_of,
    build_rows,
    call_status,
    capture_row,
    message_row,
    parse_response_body,
    request_columns,
    response_columns,
    split_params,
    usage_columns,
)
from mitm_addon.tokens import count_tokens
from pipeline.canonical import REF_KEY, REF_MIN_BYTES, canonical_json, chain_hashes, item_hash
from pipeline.shards import write_shard

# The recorder's default rotation (mitm_addon.config: rotate_rows).
ROTATE_ROWS = 5000
# Simulated hosts, each with one proxy run per policy version; a task always runs on
# the same host, so the rows that rollouts of one task share are deduplicated in one
# process. Fixed, so that the output does not depend on --workers.
HOSTS = 4
# Groups launched together on one host (a wave of group_size * WAVE_GROUPS rollouts).
WAVE_GROUPS = 8
# Calls per rollout on average with the default model (measured), used to size the
# task pool so that each task recurs in about VERSIONS policy versions.
MEAN_CALLS_PER_ROLLOUT = 35.7
VERSIONS = 4
T0 = datetime(2026, 1, 5, tzinfo=UTC).timestamp()
ROLLOUT_SOURCE = "proxy_auth"
MANIFEST = "bench.json"  # what was generated, written last
# canonical_json with its encoder built once (json.dumps builds one per call): same text.
_canonical = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode
# Stand in for parts of a response that are encoded already, then spliced in.
_SLOT, _SLOT2 = "\x00forge-bench-slot-1\x00", "\x00forge-bench-slot-2\x00"
_SLOT_JSON, _SLOT2_JSON = _canonical(_SLOT), _canonical(_SLOT2)


@dataclass
class Settings:
    """What to generate."""

    calls: int = 1_000_000
    """Total calls (exact)."""
    seed: int = 0
    group_size: int = 8
    """Rollouts per task and policy version (a GRPO group)."""
    codex_share: float = 0.25
    """Share of tasks run with the Codex-shaped harness (the rest: Claude Code-shaped)."""
    quirks: bool = True
    """Reproduce the harnesses' resend quirks (moving cache_control, Codex passthrough
    metadata); False makes every continuation an exact hash-chain extension."""
    rows: str = "direct"
    """direct or build_rows (see the module docstring)."""
    workers: int = 2


# -- planning (deterministic, in the parent) ----------------------------------------------


def plan_all(settings: Settings, text: Text) -> list[RolloutPlan]:
    """Every rollout, with its task, group, host, run and start time, adding up to
    exactly ``settings.calls`` calls."""
    groups = settings.calls / (MEAN_CALLS_PER_ROLLOUT * settings.group_size)
    n_tasks = max(1, round(groups / VERSIONS))
    tasks: dict[int, Task] = {}
    plans: list[RolloutPlan] = []
    budget, g = settings.calls, 0
    while budget > 0:
        t, version = g % n_tasks, g // n_tasks
        if t not in tasks:
            tasks[t] = make_task(settings.seed, t, text, settings.codex_share)
        task = tasks[t]
        host = t % HOSTS
        for _ in range(settings.group_size):
            if budget <= 0:
                break
            plan = plan_rollout(
                settings.seed,
                len(plans),
                task,
                budget,
                version=version,
                group_id=f"grp-{task.task_id}-v{version}",
                host=host,
                run_id=run_id(settings.seed, host, version),
                start=0.0,
            )
            budget -= plan.calls
            plans.append(plan)
        g += 1
    _schedule(plans, settings.group_size)
    return plans


def run_id(seed: int, host: int, version: int) -> str:
    rng = random.Random(f"{seed}:run:{host}:{version}")
    return f"run-{hex_id(rng, 24)}"


def _schedule(plans: list[RolloutPlan], group_size: int) -> None:
    """Start times: versions one after another; on each host, waves of groups."""
    by_version: dict[int, list[RolloutPlan]] = {}
    for p in plans:
        by_version.setdefault(p.version, []).append(p)
    start = T0
    for version in sorted(by_version):
        end = start
        for host in range(HOSTS):
            wave_start = start
            for wave in _waves([p for p in by_version[version] if p.host == host], group_size):
                rng = random.Random(f"wave:{wave[0].index}")
                for p in wave:
                    p.start = wave_start + rng.uniform(0.0, 5.0)
                wave_start += max(p.max_seconds for p in wave) + 5.0
            end = max(end, wave_start)
        start = end + 600.0  # training step between collection rounds


def _waves(plans: list[RolloutPlan], group_size: int) -> Iterable[list[RolloutPlan]]:
    groups: list[list[RolloutPlan]] = []
    for p in plans:
        if not groups or groups[-1][0].group_id != p.group_id:
            groups.append([])
        groups[-1].append(p)
    for i in range(0, len(groups), WAVE_GROUPS):
        yield [p for g in groups[i : i + WAVE_GROUPS] for p in g]


def global_hashes(world: World) -> set[str]:
    """Rows that rollouts on every host share (system prompts, tools, Codex's developer
    instructions): written once by the parent, not by each host."""
    out = set()
    for value in world.constants():
        c = canonical_json(value)
        if len(c) >= REF_MIN_BYTES:
            out.add(item_hash(c, None))
    out.update(h for h, _, _ in chain_hashes(world.codex_developer))
    params, parts = split_params(world.script_params())
    out.update(h for h, _, _ in parts)
    out.add(item_hash(canonical_json(params), None))
    return out


# -- rows -----------------------------------------------------------------------------------


def _ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def spec_capture(
    spec: CallSpec,
    headers: dict[str, str],
    *,
    transport: str,
    request_body: bytes = b"",
    request_wire_bytes: int = 0,
    response_body: bytes = b"",
    stream_events: int | None = None,
) -> Capture:
    """The capture the proxy would keep of a simulated call (bodies as the sink needs)."""
    return Capture(
        call_id=spec.call_id,
        run_id=spec.run_id,
        transport=transport,
        method="POST",
        scheme="https",
        host=spec.host,
        path=spec.path,
        started_at=spec.started_at,
        rollout_id=spec.rollout_id,
        rollout_source=ROLLOUT_SOURCE,
        client_conn_id=spec.client_conn_id,
        request_headers=headers,
        request_body=request_body,
        request_wire_bytes=request_wire_bytes,
        status_code=spec.status_code,
        response_headers=spec.response_headers,
        response_body=response_body,
        response_wire_bytes=spec.response_wire_bytes,
        stream_events=stream_events,
        first_byte_at=spec.first_byte_at,
        ended_at=spec.ended_at,
        pid=spec.pid,
        parent_pids=list(spec.parent_pids or []),
        process_name=spec.process_name,
    )


class Collector:
    """Rows of one host, deduplicated by hash as the recorder's writer does."""

    def __init__(self, shared: set[str]) -> None:
        self.shared = shared
        self.seen: set[str] = set()
        self.calls: list[tuple[float, str, dict[str, Any]]] = []
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.shared_rows: dict[str, tuple[int, dict[str, Any]]] = {}
        self.rollout_index = 0

    def is_new(self, h: str) -> bool:
        if h in self.seen:
            return False
        self.seen.add(h)
        return True

    def message(self, row: dict[str, Any]) -> None:
        """A row already known to be new (``is_new``)."""
        if row["hash"] in self.shared:
            self.shared_rows.setdefault(row["hash"], (self.rollout_index, row))
        else:
            self.messages.setdefault(row["first_call_id"], []).append(row)

    def call(self, row: dict[str, Any], ended_at: float) -> None:
        self.calls.append((ended_at, row["call_id"], row))

    def drain(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Calls in the order they ended (as a proxy records them) and their new messages."""
        self.calls.sort(key=lambda c: (c[0], c[1]))
        calls = [c for _, _, c in self.calls]
        messages = [m for c in calls for m in self.messages.pop(c["call_id"], ())]
        assert not self.messages, "messages of a call that was never recorded"
        self.calls = []
        return calls, messages


class _Memo:
    """Canonical JSON of the objects requests embed again and again, computed once.

    World constants (system prompts, tools) stay for the whole run; objects of one
    rollout (its metadata, settings) are dropped when the next rollout starts. Each
    entry keeps its object, so that its id cannot be reused while it is cached.
    """

    def __init__(self, constants: Iterable[Any]) -> None:
        self.world: dict[int, tuple[Any, str, int, int]] = {}
        self.local: dict[int, tuple[Any, str, int, int]] = {}
        self.ref_hash: dict[int, str] = {}
        self.lists: dict[int, tuple[list[Any], list[tuple[str, str, Any]]]] = {}
        self.keys: dict[str, int] = {}
        for value in constants:
            c = _canonical(value)
            self.world[id(value)] = (value, c, len(c), len(c.encode()))

    def new_rollout(self) -> None:
        self.local.clear()

    def canon(self, value: Any) -> tuple[str | None, int, int]:
        """(canonical JSON, or None when only its length is known; chars; bytes)."""
        hit = self.world.get(id(value)) or self.local.get(id(value))
        if hit is not None:
            return hit[1], hit[2], hit[3]
        if isinstance(value, list) and value and any(id(e) in self.world for e in value):
            parts = [self.canon(e) for e in value]
            chars = 2 + sum(p[1] for p in parts) + len(parts) - 1
            nbytes = 2 + sum(p[2] for p in parts) + len(parts) - 1
            return None, chars, nbytes
        c = _canonical(value)
        entry = (value, c, len(c), len(c.encode()))
        if isinstance(value, dict | list):
            self.local[id(value)] = entry
        return c, entry[2], entry[3]

    def split_list(self, value: list[Any]) -> tuple[list[Any], list[tuple[str, str, Any]]]:
        """A list as split_params stores it (its large elements as refs), and those parts;
        computed once for the world's lists (the tools)."""
        cached = self.lists.get(id(value))
        if cached is not None:
            return cached
        elements: list[Any] = []
        parts: list[tuple[str, str, Any]] = []
        for element in value:
            ec, echars, _ = self.canon(element)
            if echars >= REF_MIN_BYTES:
                h, ec = self.ref(element, ec)
                parts.append((h, ec, element))
                elements.append({REF_KEY: h})
            else:
                elements.append(element)
        if id(value) in self.world:
            self.lists[id(value)] = (elements, parts)
        return elements, parts

    def ref(self, value: Any, canonical: str | None) -> tuple[str, str]:
        """(hash, canonical JSON) of a part stored as its own row."""
        if canonical is None:
            canonical = _canonical(value)
        if id(value) in self.world:
            h = self.ref_hash.get(id(value))
            if h is None:
                h = self.ref_hash[id(value)] = item_hash(canonical, None)
            return h, canonical
        return item_hash(canonical, None), canonical

    def key_bytes(self, key: str) -> int:
        """Bytes of ``"key":`` in a JSON object."""
        n = self.keys.get(key)
        if n is None:
            n = self.keys[key] = len(json.dumps(key, ensure_ascii=False).encode()) + 1
        return n


class DirectSink:
    """Rows computed incrementally, with the semantics of ``build_rows`` + the writer."""

    def __init__(self, collector: Collector, memo: _Memo) -> None:
        self.out = collector
        self.memo = memo

    def _new(self, h: str, parent: str | None, c: str, item: Any, call_id: str, kind: str) -> None:
        if self.out.is_new(h):
            self.out.message(message_row(h, parent, c, item, call_id, kind))

    def _params(self, params: dict[str, Any], call_id: str) -> tuple[str, int]:
        """split_params + the params row; returns (params hash, bytes of the body minus items)."""
        memo = self.memo
        split: dict[str, Any] = {}
        body_bytes = 0
        for key, value in params.items():
            c, chars, nbytes = memo.canon(value)
            body_bytes += memo.key_bytes(key) + nbytes
            if chars < REF_MIN_BYTES:
                split[key] = value
            elif isinstance(value, list):
                elements, parts = memo.split_list(value)
                for h, ec, element in parts:
                    self._new(h, None, ec, element, call_id, "param")
                split[key] = elements
            else:
                h, c = memo.ref(value, c)
                self._new(h, None, c, value, call_id, "param")
                split[key] = {REF_KEY: h}
        pc = _canonical(split)
        ph = item_hash(pc, None)
        self._new(ph, None, pc, split, call_id, "params")
        return ph, body_bytes

    def _request_items(self, spec: CallSpec) -> tuple[str | None, int]:
        """Hash the items not hashed yet; returns (head hash, bytes of the item list)."""
        chain, n = spec.chain, spec.n_items
        del chain.hashes[chain.valid :]
        del chain.nbytes[chain.valid :]
        parent = chain.hashes[-1] if chain.hashes else None
        for i in range(chain.valid, n):
            item = chain.items[i]
            c = _canonical(item)
            h = item_hash(c, parent)
            nbytes = len(c.encode())
            chain.hashes.append(h)
            chain.nbytes.append(nbytes)
            if self.out.is_new(h):
                self.out.message(message_row(h, parent, c, item, spec.call_id, "item", nbytes))
            parent = h
        chain.valid = n
        head = chain.hashes[n - 1] if n else None
        return head, 2 + sum(chain.nbytes[:n]) + max(0, n - 1)

    def __call__(self, spec: CallSpec) -> None:
        params_hash, params_bytes = self._params(spec.params, spec.call_id)
        head, items_bytes = self._request_items(spec)
        list_key = LIST_KEY[spec.api]
        request_bytes = (
            2 + params_bytes + self.memo.key_bytes(list_key) + items_bytes + len(spec.params)
        )
        headers = dict(spec.headers)
        headers["content-length"] = str(request_bytes)
        capture = spec_capture(
            spec,
            headers,
            transport="sse" if spec.response is not None else "http",
            request_wire_bytes=request_bytes,
            response_body=spec.error_body or b"",  # a streamed response is not rendered
            stream_events=spec.stream_events,
        )
        request = ParsedRequest(
            api=spec.api,
            model=spec.params.get("model"),
            stream=spec.params.get("stream", False),
            list_key=list_key,
            items=spec.chain.items[: spec.n_items],
            items_form="list",
            params=spec.params,
            tools=spec.tool_names,
        )
        row = capture_row(capture)
        row["api"] = api_of(capture)
        row.update(request_columns(request, params_hash, head))
        # Maps as (key, value) lists: the same Parquet, and pyarrow converts them 8x faster.
        row["request_headers"] = list(headers.items())
        row["response_headers"] = list(spec.response_headers.items()) or None
        response: ParsedResponse
        if spec.response is not None:
            response = self._response(spec, head, row)
        else:
            # An error body, parsed as the recorder parses it (it has no usage: estimated).
            response, _ = parse_response_body(capture, spec.api, MAX_BODY_BYTES)
            row.update(response_columns(response, None, None))
        row.update(usage_columns(capture, request, response, count_tokens))
        row["status"], row["error"] = call_status(capture, response, None)
        self.out.call(row, spec.ended_at)

    def _response(self, spec: CallSpec, head: str | None, row: dict[str, Any]) -> ParsedResponse:
        """Hash the output items and fill the response's columns; returns the response as
        the recorder's parser would have assembled it."""
        parent = head
        canons = []
        for item in spec.output_items:
            c = _canonical(item)
            h = item_hash(c, parent)
            canons.append(c)
            self._new(h, parent, c, item, spec.call_id, "item")
            parent = h
        response = spec.response
        assert response is not None
        # The response embeds what is encoded already (its output items; for Responses,
        # the echoed tools): encode the rest and splice those in.
        if spec.api == "openai_responses":
            tools = self.memo.canon(response["tools"])[0] or _canonical(response["tools"])
            text = _canonical(dict(response, output=_SLOT, tools=_SLOT2))
            text = text.replace(_SLOT_JSON, "[" + ",".join(canons) + "]", 1)
            text = text.replace(_SLOT2_JSON, tools, 1)
        else:  # the output item is {"content": <the message's content>, "role": "assistant"}
            content = canons[0][len('{"content":') : -len(',"role":"assistant"}')]
            text = _canonical(dict(response, content=_SLOT)).replace(_SLOT_JSON, content, 1)
        parsed = ParsedResponse(
            response=response,
            output_items=spec.output_items,
            response_id=spec.response_id,
            model=response.get("model"),
            stop_reason=spec.stop_reason,
            usage=spec.usage,
            tool_calls=spec.tool_calls,
        )
        row.update(response_columns(parsed, parent if spec.output_items else None, text))
        return parsed


class BuildRowsSink:
    """Rows from the recorder's own code: bodies rendered as bytes, then ``build_rows``."""

    def __init__(self, collector: Collector) -> None:
        self.out = collector

    def capture(self, spec: CallSpec) -> Capture:
        body = dict(spec.params)
        body[LIST_KEY[spec.api]] = spec.chain.items[: spec.n_items]
        raw = canonical_json(body).encode()
        headers = dict(spec.headers)
        headers["content-length"] = str(len(raw))
        if spec.response is not None:
            render = (
                render_anthropic_sse if spec.api == "anthropic_messages" else render_responses_sse
            )
            response_body, transport = render(spec.response), "sse"
        else:
            assert spec.error_body is not None
            response_body, transport = spec.error_body, "http"
        return spec_capture(
            spec, headers, transport=transport, request_body=raw, response_body=response_body
        )

    def __call__(self, spec: CallSpec) -> None:
        self.record(spec)

    def record(self, spec: CallSpec) -> tuple[Capture, dict[str, Any]]:
        """Record one call; returns its capture and its calls row."""
        capture = self.capture(spec)
        rows = build_rows(capture, lambda _: None, estimate_tokens=count_tokens)
        for m in rows.messages:
            if self.out.is_new(m["hash"]):
                self.out.message(m)
        self.out.call(rows.call, spec.ended_at)
        return capture, rows.call


# -- one host ----------------------------------------------------------------------------------


@dataclass
class HostResult:
    host: int
    calls: int = 0
    messages: int = 0
    rollouts: int = 0
    shared_rows: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)


_WORLD: World | None = None  # set in the parent before the workers fork


def _sink(settings: Settings, collector: Collector, world: World) -> Callable[[CallSpec], None]:
    if settings.rows == "build_rows":
        return BuildRowsSink(collector)
    if settings.rows == "direct":
        return DirectSink(collector, _Memo(world.constants()))
    raise ValueError(f"rows must be direct or build_rows, got {settings.rows!r}")


def generate_host(args: tuple[Settings, Path, int, list[RolloutPlan]]) -> HostResult:
    """Simulate one host's rollouts and write its shards."""
    settings, out, host, plans = args
    assert _WORLD is not None
    world = _WORLD
    result = HostResult(host=host)
    collector = Collector(global_hashes(world))
    sink = _sink(settings, collector, world)
    pending_calls: list[dict[str, Any]] = []
    pending_messages: list[dict[str, Any]] = []
    seq: dict[str, int] = {}
    ended: dict[str, float] = {}

    def flush(run: str, force: bool) -> None:
        while pending_calls and (force or len(pending_calls) >= ROTATE_ROWS):
            calls = pending_calls[:ROTATE_ROWS]
            ids = {c["call_id"] for c in calls}
            n_msg = 0
            while n_msg < len(pending_messages) and pending_messages[n_msg]["first_call_id"] in ids:
                n_msg += 1
            seq[run] = seq.get(run, 0) + 1
            name = f"{run}-{seq[run]:06d}"
            if n_msg:
                write_shard(out, "messages", name, pending_messages[:n_msg])
            write_shard(out, "calls", name, calls)
            result.calls += len(calls)
            result.messages += n_msg
            del pending_calls[: len(calls)]
            del pending_messages[:n_msg]

    by_run: dict[str, list[RolloutPlan]] = {}
    for p in plans:
        by_run.setdefault(p.run_id, []).append(p)
    for run, run_plans in by_run.items():
        for wave in _waves(run_plans, settings.group_size):
            for p in wave:
                collector.rollout_index = p.index
                if isinstance(sink, DirectSink):
                    sink.memo.new_rollout()
                ended[p.rollout_id] = Simulation(world, p, sink, settings.quirks).run()
            calls, messages = collector.drain()
            pending_calls.extend(calls)
            pending_messages.extend(messages)
            flush(run, force=False)
        flush(run, force=True)
        rollouts, rewards = outcome_rows(settings.seed, run_plans, ended)
        write_shard(out, "rollouts", f"{run}-rollouts", rollouts)
        write_shard(out, "rewards", f"{run}-rewards", rewards)
        result.rollouts += len(rollouts)
    result.shared_rows = collector.shared_rows
    return result


# -- rollouts and rewards --------------------------------------------------------------------

_EXIT = {"complete": 0, "partial": 0, "timed_out": 124, "crashed": 1}


def outcome_rows(
    seed: int, plans: list[RolloutPlan], ended: dict[str, float]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runner's rollouts rows and the verifier's rewards rows."""
    rollouts, rewards = [], []
    for p in plans:
        rng = random.Random(f"{seed}:outcome:{p.index}")
        end = ended[p.rollout_id] + (
            rng.uniform(5.0, 60.0) if p.status == "timed_out" else rng.uniform(0.2, 2.0)
        )
        harness = p.task.harness
        rollouts.append(
            {
                "rollout_id": p.rollout_id,
                "task_id": p.task.task_id,
                "harness": harness,
                "group_id": p.group_id,
                "policy_version": p.version,
                "status": p.status,
                "exit_code": _EXIT[p.status],
                "started_at": _ts(p.start),
                "ended_at": _ts(end),
                "command": ["claude", "-p", "--output-format", "json", p.task.prompt[:200]]
                if harness == "claude"
                else ["codex", "exec", "--json", p.task.prompt[:200]],
                "metadata_json": canonical_json({"repo": p.task.repo, "task": p.task.task_id}),
                "written_at": _ts(end + 0.5),
            }
        )
        if p.status == "crashed" and rng.random() < 0.5:
            continue  # the verifier never ran
        success = p.task.success_rate * (1.0 if p.status == "complete" else 0.3)
        if p.task.graded:
            total = rng.randint(3, 12)
            passed = sum(rng.random() < success for _ in range(total))
            credit = passed / total
            details = {"partial_credit": credit, "tests_passed": passed, "tests_total": total}
            reward = credit if p.status == "complete" else 0.0
        else:
            solved = p.status == "complete" and rng.random() < success
            details = {"solved": solved}
            reward = 1.0 if solved else 0.0
        row = {
            "rollout_id": p.rollout_id,
            "reward": reward,
            "status": p.status,
            "details_json": canonical_json(details),
            "source": "verifier",
            "written_at": _ts(end + rng.uniform(5.0, 120.0)),
        }
        rewards.append(row)
        if rng.random() < 0.01:  # a person corrected the grade later: the latest row wins
            rewards.append(
                dict(row, reward=1.0 - reward, source="forge reward", written_at=_ts(end + 86400.0))
            )
    return rollouts, rewards


# -- the whole data set ---------------------------------------------------------------------------


@dataclass
class Generated:
    out: Path
    calls: int
    messages: int
    rollouts: int
    seconds: float


def generate(
    settings: Settings,
    out: Path,
    text: Text | None = None,
    plans: list[RolloutPlan] | None = None,
) -> Generated:
    """Write the shards of ``settings`` (or of the given rollout plans) under ``out``,
    which must not hold shards yet."""
    global _WORLD
    started = time.perf_counter()
    for table in ("calls", "messages", "rollouts", "rewards"):
        if any((out / table).glob("*.parquet")):
            raise FileExistsError(f"{out / table} already holds shards; choose an empty --out")
    text = text or Text(settings.seed)
    _WORLD = build_world(settings.seed, text)
    count_tokens("")  # load the encoding once, before the workers fork
    plans = plans if plans is not None else plan_all(settings, text)
    work = [
        (settings, out, host, [p for p in plans if p.host == host])
        for host in range(HOSTS)
        if any(p.host == host for p in plans)
    ]
    if settings.workers > 1 and len(work) > 1:
        with multiprocessing.get_context("fork").Pool(min(settings.workers, len(work))) as pool:
            results = pool.map(generate_host, work, chunksize=1)
    else:
        results = [generate_host(w) for w in work]
    shared: dict[str, tuple[int, dict[str, Any]]] = {}
    for r in results:
        for h, (index, row) in r.shared_rows.items():
            if h not in shared or index < shared[h][0]:
                shared[h] = (index, row)
    rows = [row for _, row in sorted(shared.values(), key=lambda x: (x[0], x[1]["hash"]))]
    if rows:
        write_shard(out, "messages", f"{plans[0].run_id}-000000", rows)
    done = Generated(
        out=out,
        calls=sum(r.calls for r in results),
        messages=sum(r.messages for r in results) + len(rows),
        rollouts=sum(r.rollouts for r in results),
        seconds=time.perf_counter() - started,
    )
    (out / MANIFEST).write_text(
        json.dumps(
            {
                "settings": manifest_settings(settings),
                "seconds": round(done.seconds, 1),
                "calls": done.calls,
                "messages": done.messages,
                "rollouts": done.rollouts,
            },
            indent=2,
        )
    )
    return done


def manifest_settings(settings: Settings) -> dict[str, Any]:
    """What determines the output (not --workers)."""
    return {k: v for k, v in asdict(settings).items() if k != "workers"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gen_shards", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="run directory to create")
    parser.add_argument("--calls", type=int, default=Settings.calls)
    parser.add_argument("--seed", type=int, default=Settings.seed)
    parser.add_argument("--group-size", type=int, default=Settings.group_size)
    parser.add_argument("--codex-share", type=float, default=Settings.codex_share)
    parser.add_argument(
        "--no-quirks",
        action="store_true",
        help="exact resends: no moving cache_control, no Codex passthrough metadata",
    )
    parser.add_argument("--rows", choices=["direct", "build_rows"], default=Settings.rows)
    parser.add_argument("--workers", type=int, default=Settings.workers)
    parser.add_argument("--force", action="store_true", help="delete --out first")
    args = parser.parse_args(argv)
    if args.force and args.out.exists():
        shutil.rmtree(args.out)
    settings = Settings(
        calls=args.calls,
        seed=args.seed,
        group_size=args.group_size,
        codex_share=args.codex_share,
        quirks=not args.no_quirks,
        rows=args.rows,
        workers=args.workers,
    )
    done = generate(settings, args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*.parquet"))
    print(
        f"wrote {done.calls:,} calls, {done.messages:,} messages, {done.rollouts:,} rollouts "
        f"({size / 1e6:,.1f} MB of Parquet) to {done.out} in {done.seconds:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
