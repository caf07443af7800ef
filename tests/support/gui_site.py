"""Browser tasks for the GUI harness: a local web site, its verifier, and a scripted model
that answers the browser-use agent in its own reply format.

``GuiSite`` serves a few pages on 127.0.0.1 from its own thread and logs every request
it gets, so a verifier can check what the browser did (the form it submitted, the page
it reached). ``browser_use_script(plan)`` is a script hook for
``tests.support.upstream.ScriptedUpstream``: browser-use sends one system prompt and one
user message per step (the task, its history, the page's interactive elements as
``[N]<tag attrs />`` lines, ``<step_info>StepK``, and a screenshot); the hook reads the
step number, finds each planned action's element by tag and text, and answers with the
JSON object the agent's schema asks for (``thinking`` ... ``action``).
"""

from __future__ import annotations

import html
import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PAGES: dict[str, str] = {
    "/form.html": """<!doctype html><html><head><title>Sign up</title></head><body>
<h1>Sign up</h1>
<form action="/thanks.html" method="get">
  <label for="name">Name</label>
  <input id="name" name="name" type="text" placeholder="Your name">
  <button id="submit" type="submit">Submit</button>
</form></body></html>""",
    "/thanks.html": """<!doctype html><html><head><title>Thanks</title></head><body>
<h1>Thanks for signing up</h1></body></html>""",
    "/shop.html": """<!doctype html><html><head><title>Shop</title></head><body>
<h1>Shop</h1>
<p><a href="/about.html">About us</a></p>
<p><a href="/pricing.html">Pricing</a></p>
</body></html>""",
    "/pricing.html": """<!doctype html><html><head><title>Pricing</title></head><body>
<h1>Pricing</h1><p>Basic: 9 EUR a month.</p></body></html>""",
    "/about.html": """<!doctype html><html><head><title>About</title></head><body>
<h1>About us</h1><p>We sell things.</p></body></html>""",
}


@dataclass(frozen=True)
class BrowserTask:
    """One task: where the browser starts, what the agent is told, and its verifier."""

    task_id: str
    start: str  # a path of PAGES
    instruction: str
    verify: Callable[[list[str]], bool]  # over the paths (with query) the site served


def _submitted_name(paths: list[str], name: str) -> bool:
    return any(
        urlsplit(p).path == "/thanks.html" and parse_qs(urlsplit(p).query).get("name") == [name]
        for p in paths
    )


TASKS: dict[str, BrowserTask] = {
    "sign-up": BrowserTask(
        "sign-up",
        "/form.html",
        "Fill the sign-up form with the name Ada and submit it.",
        lambda paths: _submitted_name(paths, "Ada"),
    ),
    "pricing": BrowserTask(
        "pricing",
        "/shop.html",
        "Open the shop's pricing page.",
        lambda paths: any(urlsplit(p).path == "/pricing.html" for p in paths),
    ),
}


class GuiSite:
    """The pages on a free loopback port, with the log of what was requested."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self._lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                with site._lock:
                    site.requests.append(self.path)
                page = PAGES.get(urlsplit(self.path).path)
                body = (page or "<h1>Not found</h1>").encode()
                self.send_response(200 if page else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def paths(self) -> list[str]:
        with self._lock:
            return list(self.requests)

    def verify(self, task: BrowserTask) -> bool:
        return task.verify(self.paths())


@contextmanager
def gui_site() -> Iterator[GuiSite]:
    site = GuiSite()
    site._thread.start()
    try:
        yield site
    finally:
        site._server.shutdown()
        site._server.server_close()


# --------------------------------------------------------------------- the scripted model

_ELEMENT = re.compile(r"^\s*(?:\|[A-Z]+\([a-z]+\)\|)?\[(\d+)\]<(\w+)([^>]*?)\s*/?>\s*$")
_STEP = re.compile(r"<step_info>\s*Step\s*(\d+)")


def page_elements(text: str) -> list[tuple[int, str, str]]:
    """(index, tag, attributes and the text under it) of each interactive element that
    browser-use lists in a step's message."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = _ELEMENT.match(line)
        if m is None:
            continue
        words = [m.group(3).strip()]
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if following.startswith("\t") and not _ELEMENT.match(following):
            words.append(following.strip())  # the element's text
        out.append((int(m.group(1)), m.group(2), html.unescape(" ".join(filter(None, words)))))
    return out


def _step_text(body: Mapping[str, Any]) -> str:
    messages = body.get("messages") or []
    parts = messages[-1].get("content") if messages else None
    if isinstance(parts, str):
        return parts
    return "\n".join(p.get("text", "") for p in parts or [] if isinstance(p, dict))


def resolve_action(
    action: Mapping[str, Any], elements: list[tuple[int, str, str]]
) -> dict[str, Any]:
    """One planned action with ``find: "<tag> <words>"`` replaced by the element's index."""
    ((name, params),) = action.items()
    params = dict(params)
    find = params.pop("find", None)
    if find is not None:
        tag, _, words = find.partition(" ")
        hits = [i for i, t, label in elements if t == tag and words.lower() in label.lower()]
        if not hits:
            raise LookupError(f"no <{tag}> with {words!r} among {elements}")
        params["index"] = hits[0]
    return {name: params}


def browser_use_script(
    plan: Sequence[Sequence[Mapping[str, Any]]],
) -> Callable[[Any], dict[str, Any]]:
    """A script hook answering step K with the K-th list of actions of ``plan`` (the
    last one repeating)."""

    def reply(conv: Any) -> dict[str, Any]:
        text = _step_text(conv.body)
        m = _STEP.search(text)
        step = int(m.group(1)) if m else 1
        actions = plan[min(step, len(plan)) - 1]
        elements = page_elements(text)
        output = {
            "thinking": f"Step {step} of the plan.",
            "evaluation_previous_goal": "Success" if step > 1 else "Start",
            "memory": f"step {step}",
            "next_goal": ", ".join(next(iter(a)) for a in actions),
            "current_plan_item": None,
            "plan_update": None,
            "action": [resolve_action(a, elements) for a in actions],
        }
        return {"text": json.dumps(output)}

    return reply
