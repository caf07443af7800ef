"""HTML pages for ``forge view`` (pure: data in, one self-contained HTML string out).

Every recorded value is untrusted (a model or a tool may have written it), so every
value goes through ``html.escape``; the page's own script is allowed by its SHA-256 in a
Content-Security-Policy that also forbids any network access, so markup that slipped
through could neither run nor load anything.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from html import escape
from importlib import resources
from typing import Any

from forge_cli.view.model import CallView, Message, RolloutView

__all__ = ["page_file_name", "render_index", "render_rollout_page"]

_ROLES = {"system", "developer", "user", "assistant", "tool", "item"}
_KINDS = {"continues", "spawns", "compacts"}
_DRIFTS = {"CLEAN", "REALIGN", "TRIM", "FORK"}


def _asset(name: str) -> str:
    return resources.files("forge_cli.view").joinpath("assets", name).read_text()


def _e(value: Any) -> str:
    """Text for HTML content or a quoted attribute value."""
    return escape("" if value is None else str(value), quote=True)


def _tokens(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def _duration(ms: float | None) -> str:
    if ms is None:
        return ""
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _signed(x: float | None) -> str:
    return "" if x is None else f"{x:+.3f}"


def _number(x: float | None) -> str:
    return "" if x is None else f"{x:g}"


def page_file_name(rollout_id: str) -> str:
    """A file name for the rollout's page: its id where that is a safe name, else the
    id's safe characters and a hash of the id (so two ids never share a file)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", rollout_id).strip(".")[:80]
    if safe != rollout_id or not safe:
        safe = f"{safe}-{hashlib.sha256(rollout_id.encode()).hexdigest()[:10]}"
    return f"{safe}.html"


# --------------------------------------------------------------------------- messages


def _arguments(text: Any) -> str:
    """Tool-call arguments, indented when they are JSON."""
    if not isinstance(text, str):
        return json.dumps(text, indent=1, ensure_ascii=False)
    try:
        return json.dumps(json.loads(text), indent=1, ensure_ascii=False)
    except ValueError:
        return text


def _message(m: Message) -> str:
    role = m.get("role")
    role_class = role if role in _ROLES else "other"
    label = _e(role)
    if m.get("name"):
        label += f' <span class="name">{_e(m["name"])}</span>'
    if m.get("tool_call_id"):
        label += f' <code class="ref">{_e(m["tool_call_id"])}</code>'
    kind = "tool-result" if role == "tool" else "msg"
    parts = [f'<div class="{kind} role-{role_class}"><div class="role">{label}</div>']
    if m.get("reasoning_content"):
        parts.append(
            '<details class="reasoning"><summary>reasoning</summary>'
            f'<pre class="text">{_e(m["reasoning_content"])}</pre></details>'
        )
    content = m.get("content")
    if content not in (None, ""):
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        parts.append(f'<pre class="text{" raw" if m.get("raw") else ""}">{_e(text)}</pre>')
    for item in m.get("tool_calls") or []:
        call: dict[str, Any] = item if isinstance(item, dict) else {}
        function = call.get("function")
        fn: dict[str, Any] = function if isinstance(function, dict) else {}
        parts.append(
            f'<div class="tool-call"><span class="tname">{_e(fn.get("name"))}</span> '
            f'<code class="ref">{_e(call.get("id"))}</code>'
            f'<pre class="args">{_e(_arguments(fn.get("arguments")))}</pre></div>'
        )
    parts.append("</div>")
    return "".join(parts)


# --------------------------------------------------------------------------- one call


def _head(c: CallView, advantage: float | None) -> str:
    kind = c.edge_kind if c.edge_kind in _KINDS else None
    parts = []
    if kind:
        parts.append(
            f'<span class="edge kind-{kind}">{kind} <small>({_e(c.evidence)})</small></span>'
        )
    parts += [
        f'<code class="cid">{_e(c.call_id)}</code>',
        f'<span class="agent">[{_e(c.agent_key)}]</span>',
        f'<span class="model">{_e(c.model or "?")}</span>',
    ]
    mark = "~" if c.usage_estimated else ""
    parts.append(
        f'<span class="tok">in {mark}{_tokens(_prompt_tokens(c))} · '
        f"out {mark}{_tokens(c.output_tokens)}</span>"
    )
    if c.duration_ms is not None:
        parts.append(f'<span class="lat">{_duration(c.duration_ms)}</span>')
    if c.drift:
        drift = c.drift if c.drift in _DRIFTS else "other"
        parts.append(f'<span class="drift drift-{drift}">{_e(c.drift)}</span>')
    if advantage is not None:
        parts.append(f'<span class="adv">adv {_signed(advantage)}</span>')
    labels = []
    if c.is_side_call:
        labels.append("side call")
    if c.is_prewarm:
        labels.append("prewarm")
    if c.edge_kind == "compacts":
        labels.append("compaction")
    if c.status not in ("complete", None):
        labels.append(c.status)
    parts += [f'<span class="label">{_e(x)}</span>' for x in labels]
    if c.tool_calls:
        parts.append(f'<span class="tools">→ {_e(", ".join(c.tool_calls))}</span>')
    if c.actions:
        parts.append(f'<span class="actions">GUI: {_e(", ".join(c.actions))}</span>')
    shown = sum(1 for s in c.shots if s.src)
    if shown:
        parts.append(f'<span class="label">{shown} image{"s" if shown > 1 else ""}</span>')
    return " ".join(parts)


def _prompt_tokens(c: CallView) -> int | None:
    if c.input_tokens is None:
        return None
    if c.api == "anthropic_messages":  # Anthropic counts cached prompt tokens apart
        return c.input_tokens + (c.cache_read_tokens or 0) + (c.cache_write_tokens or 0)
    return c.input_tokens


def _token_detail(c: CallView) -> str:
    parts = [f"in {_tokens(c.input_tokens)}", f"out {_tokens(c.output_tokens)}"]
    if c.cache_read_tokens is not None:
        parts.append(f"cache read {_tokens(c.cache_read_tokens)}")
    if c.cache_write_tokens is not None:
        parts.append(f"cache write {_tokens(c.cache_write_tokens)}")
    return ", ".join(parts) + (" (estimated by tiktoken)" if c.usage_estimated else "")


def _meta(c: CallView, advantage: float | None, t0: datetime | None) -> str:
    offset = ""
    if c.started_at is not None and t0 is not None:
        offset = f" (+{(c.started_at - t0).total_seconds():.1f} s)"
    rows: list[tuple[str, str]] = [
        ("call", _e(c.call_id)),
        (
            "parent",
            f"{_e(c.parent_call_id)} ({_e(c.edge_kind)}, {_e(c.evidence)})"
            if c.parent_call_id
            else "root",
        ),
        ("agent", _e(c.agent_key)),
        ("model", _e(c.model)),
        ("api", _e(c.api)),
        ("status", _e(c.status)),
        ("started", _e(c.started_at.isoformat() if c.started_at else "") + _e(offset)),
        ("latency", _e(_duration(c.duration_ms))),
        ("first byte", _e(_duration(c.ttfb_ms))),
        ("tokens", _e(_token_detail(c))),
        ("drift", _e(c.drift)),
        ("advantage", _e(_signed(advantage))),
        ("policy version", _e(c.policy_version)),
        ("stop reason", _e(c.stop_reason)),
        ("tools offered", _e(", ".join(c.tools or []))),
        ("tools called", _e(", ".join(c.tool_calls or []))),
        ("GUI actions", _e(", ".join(c.actions or []))),
    ]
    if c.error:
        rows.append(("error", f'<pre class="text error">{_e(c.error)}</pre>'))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="meta">{body}</table>'


def _short(ref: str) -> str:
    return ref[:15] + "…" if ref.startswith("i1:") else ref


def _shots(c: CallView) -> str:
    """The images the call's new items carry: each shown at its first appearance on the
    page (a data: URL, the only images the page's policy allows), named after that."""
    parts = ['<div class="shots"><h4>images</h4>']
    for s in c.shots:
        if s.src is not None:
            size = f" {s.width}×{s.height}" if s.width and s.height else ""
            parts.append(
                f'<figure class="shot"><img src="{_e(s.src)}" alt="image {_e(s.ref)}" '
                f'data-ref="{_e(s.ref)}"><figcaption><code>{_e(_short(s.ref))}</code>'
                f"{_e(size)}</figcaption></figure>"
            )
        elif s.first_call is not None:
            parts.append(
                f'<span class="shot-ref"><code>{_e(_short(s.ref))}</code> again '
                f"(shown at call <code>{_e(s.first_call)}</code>)</span>"
            )
        elif s.ref.startswith("i1:"):
            parts.append(f'<span class="shot-ref"><code>{_e(s.ref)}</code> (not stored)</span>')
        else:
            parts.append(f'<span class="shot-ref">linked, not loaded: {_e(s.ref)}</span>')
    parts.append("</div>")
    return "".join(parts)


def _content(c: CallView, advantage: float | None, t0: datetime | None) -> str:
    summary = f"{len(c.request)} new message(s), {len(c.response)} in the response"
    if c.earlier_messages:
        summary += f"; {c.earlier_messages} earlier in the parent call"
    parts = [f'<details class="content"><summary>{_e(summary)}</summary>', _meta(c, advantage, t0)]
    if c.note:
        parts.append(f'<p class="note">{_e(c.note)}</p>')
    if c.request:
        parts.append('<div class="msgs request"><h4>request</h4>')
        parts += [_message(m) for m in c.request]
        parts.append("</div>")
    if c.shots:
        parts.append(_shots(c))
    if c.response:
        parts.append('<div class="msgs response"><h4>response</h4>')
        parts += [_message(m) for m in c.response]
        parts.append("</div>")
    if c.raw_request or c.raw_response:
        raw = json.dumps(
            {"request_items": c.raw_request, "response_items": c.raw_response},
            indent=1,
            ensure_ascii=False,
        )
        parts.append(
            '<details class="raw"><summary>recorded items (JSON)</summary>'
            f'<pre class="text raw">{_e(raw)}</pre></details>'
        )
    parts.append("</details>")
    return "".join(parts)


def _call_open(c: CallView, index: int, advantage: float | None, t0: datetime | None) -> str:
    classes = ["call"]
    if c.edge_kind in _KINDS:
        classes.append(f"kind-{c.edge_kind}")
    if c.is_side_call:
        classes.append("side")
    if c.status not in ("complete", None):
        classes.append("failed")
    return (
        f'<details class="{" ".join(classes)}" open id="call-{index}" '
        f'data-call-id="{_e(c.call_id)}"><summary class="head">{_head(c, advantage)}</summary>'
        + _content(c, advantage, t0)
    )


def _tree(calls: Sequence[CallView], advantage: float | None) -> str:
    """The calls as nested lanes. A conversation reads down one lane: a call's
    continuation (its last `continues` child) follows it in its lane, and its other
    children (sub-agents, side calls, compactions, retries) open lanes inside it. Built
    with an explicit stack: a 1000-turn conversation is a 1000-call lane."""
    ids = {c.call_id for c in calls}
    index = {c.call_id: i for i, c in enumerate(calls)}
    children: dict[str | None, list[CallView]] = {}
    for c in calls:
        parent = c.parent_call_id if c.parent_call_id in ids else None
        children.setdefault(parent, []).append(c)
    t0 = min((c.started_at for c in calls if c.started_at is not None), default=None)
    out: list[str] = []
    stack: list[str | CallView] = []
    for root in reversed(children.get(None, [])):
        stack += ["</div>", root, '<div class="lane root">']
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        out.append(_call_open(item, index[item.call_id], advantage, t0))
        kids = children.get(item.call_id, [])
        following = [k for k in kids if k.edge_kind == "continues"]
        main = following[-1] if following else None
        branches = [k for k in kids if k is not main]
        todo: list[str | CallView] = []
        if branches:
            todo.append('<div class="branches">')
            for b in branches:
                kind = b.edge_kind if b.edge_kind in _KINDS else "root"
                todo += [f'<div class="lane branch kind-{kind}">', b, "</div>"]
            todo.append("</div>")
        todo.append("</details>")
        if main is not None:
            todo.append(main)
        stack.extend(reversed(todo))
    return "".join(out)


# --------------------------------------------------------------------------- pages


def _document(title: str, body: str) -> str:
    script = _asset("view.js")
    if "</script" in script.lower():
        raise ValueError("view.js must not contain '</script'")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{digest}'"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request
        f"<title>{_e(title)}</title><style>{_asset('view.css')}</style></head>"
        f"<body>{body}<script>{script}</script></body></html>\n"
    )


def _facts(pairs: Iterable[tuple[str, str]]) -> str:
    return '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


_CONTROLS = (
    '<div class="controls">'
    '<input id="search" type="search" placeholder="Search messages, tools, ids… ( / )" '
    'autocomplete="off" aria-label="search the calls">'
    '<label><input type="checkbox" id="only-matches"> only matching calls</label>'
    '<button type="button" id="open-all">open all</button>'
    '<button type="button" id="close-all">close messages</button>'
    '<span id="match-count" aria-live="polite"></span></div>'
)


def render_rollout_page(r: RolloutView, index_href: str | None = None) -> str:
    """One rollout's page: its facts, then its call tree with every call's messages."""
    back = f'<a class="back" href="{_e(index_href)}">← all rollouts</a>' if index_href else ""
    group = ""
    if r.group_id is not None:
        group = f"{_e(r.group_id)} (size {_e(r.group_size)}, mean {_number(r.group_mean)}, "
        group += f"std {_number(r.group_std)}"
        group += f", dropped: {_e(r.drop_reason)})" if r.drop_reason else ")"
    facts = _facts(
        [
            ("task", _e(r.task_id)),
            ("harness", _e(r.harness)),
            ("status", _e(r.status)),
            ("reward", _e(_number(r.reward))),
            ("advantage", _e(_signed(r.advantage))),
            ("group", group),
            ("models", _e(", ".join(r.models))),
            ("calls", _e(len(r.calls))),
            ("agents", _e(r.n_agents)),
            ("depth", _e(r.depth)),
            ("fan-out", _e(r.fan_out)),
            ("tokens", f"in {_tokens(r.tokens_in)} · out {_tokens(r.tokens_out)}"),
            ("wall time", _e(_duration(r.wall_ms))),
        ]
    )
    tree = _tree(r.calls, r.advantage) or '<p class="note">No calls recorded for this rollout.</p>'
    body = (
        f"<header>{back}<h1>Rollout <code>{_e(r.rollout_id)}</code></h1>{facts}{_CONTROLS}"
        f'</header><main id="tree" data-calls="{len(r.calls)}">{tree}</main>'
    )
    return _document(f"Forge rollout {r.rollout_id}", body)


def render_index(rollouts: Sequence[RolloutView], run_name: str) -> str:
    """The index of a run's pages: a row per rollout, linking to its page."""
    head = (
        "<tr><th>rollout</th><th>task</th><th>harness</th><th>status</th><th>reward</th>"
        "<th>advantage</th><th>calls</th><th>agents</th><th>depth</th><th>tokens in</th>"
        "<th>tokens out</th><th>wall time</th></tr>"
    )
    rows = "".join(
        f'<tr><td><a href="{_e(page_file_name(r.rollout_id))}">{_e(r.rollout_id)}</a></td>'
        f"<td>{_e(r.task_id)}</td><td>{_e(r.harness)}</td><td>{_e(r.status)}</td>"
        f"<td>{_e(_number(r.reward))}</td><td>{_e(_signed(r.advantage))}</td>"
        f"<td>{r.n_calls}</td><td>{r.n_agents}</td><td>{_e(r.depth)}</td>"
        f"<td>{_tokens(r.tokens_in)}</td><td>{_tokens(r.tokens_out)}</td>"
        f"<td>{_e(_duration(r.wall_ms))}</td></tr>"
        for r in rollouts
    )
    body = (
        f"<header><h1>Run <code>{_e(run_name)}</code>: {len(rollouts)} rollout(s)</h1>"
        '<div class="controls"><input id="filter" type="search" placeholder="Filter rollouts… ( / )"'
        ' autocomplete="off" aria-label="filter the rollouts"><span id="match-count"></span></div>'
        f'</header><main><table id="rollouts"><thead>{head}</thead><tbody>{rows}</tbody></table></main>'
    )
    return _document(f"Forge run {run_name}", body)
