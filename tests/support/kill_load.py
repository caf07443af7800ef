"""Kill the proxy under load and account for every call: the kill test's client side.

Client threads call the three APIs through the proxy, streamed and not, one call after
another on a kept-alive connection, each call named by a query parameter (``?call=``: a
call the proxy only began has a record without bodies, and its path), and one WebSocket
session (named by its proxy credentials) sends ``response.create`` after
``response.create``. The proxy is SIGKILLed at a random moment,
then started again on the same directory (recovering its write-ahead log) and stopped.

A call is *finished* when its client had the whole reply: a non-streamed SDK call that
returned, a stream whose last event (``[DONE]``, ``message_stop``, ``response.completed``)
arrived (the client stops reading there, as Codex does), a socket call whose
``response.completed`` arrived. A call is *sent* once the upstream received it.

Every finished call must be recorded complete; every sent call recorded (complete or
incomplete); none recorded twice.
"""

from __future__ import annotations

import json
import random
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from mitm_addon.launch import RunningProxy
from pipeline.store import connect
from tests.support.forge_proxy import (
    ANTHROPIC_KEY,
    COOKIE_VALUE,
    OPENAI_KEY,
    forge_proxy,
    kill_proxy,
)
from tests.support.upstream import ScriptedUpstream

KINDS = (
    "chat",
    "chat-stream",
    "messages",
    "messages-stream",
    "responses",
    "responses-stream",
)
_TERMINAL = {
    "chat-stream": "data: [DONE]",
    "messages-stream": "event: message_stop",
    "responses-stream": "event: response.completed",
}
# A reply long enough to reach the client in several reads (JSON) and many events (SSE).
REPLY = " ".join(f"word{i}" for i in range(120))
_CLIENT_TIMEOUT_S = 15.0


@dataclass
class Ledger:
    """What the clients saw: by call nonce, its kind, and whether it finished."""

    kinds: dict[str, str] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    socket_finished: dict[str, int] = field(default_factory=dict)  # session -> calls done
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, nonce: str, kind: str) -> None:
        with self.lock:
            self.kinds[nonce] = kind

    def finish(self, nonce: str) -> None:
        with self.lock:
            self.finished.add(nonce)


@dataclass
class RoundResult:
    killed_after_s: float
    started: int  # calls the clients began
    finished: int  # calls whose whole reply a client had
    sent: int  # calls the upstream received
    complete: int  # records complete
    incomplete: int  # records incomplete
    missing_finished: list[str]  # finished, not recorded complete
    missing_sent: list[str]  # received upstream, not recorded at all
    duplicated: list[str]  # recorded more than once

    @property
    def ok(self) -> bool:
        return not (self.missing_finished or self.missing_sent or self.duplicated)

    def line(self) -> str:
        return (
            f"killed {self.killed_after_s:.2f}s into the load: {self.started} started, {self.finished} "
            f"finished, {self.sent} sent; recorded {self.complete} complete, "
            f"{self.incomplete} incomplete; missing {len(self.missing_finished)} finished, "
            f"{len(self.missing_sent)} sent; {len(self.duplicated)} duplicated"
        )


def upstream() -> ScriptedUpstream:
    """The scripted provider every round talks to (the events paced, so calls overlap)."""
    return ScriptedUpstream([{"text": REPLY}], first_event_delay_s=0.005)


def run_round(
    out: Path, confdir: Path, up: ScriptedUpstream, seed: int, clients: int = 32
) -> RoundResult:
    """One round: load, a SIGKILL at a random moment, a restart that recovers the log."""
    rng = random.Random(seed)
    ups = {"api.openai.com": up.base_url, "api.anthropic.com": up.base_url}
    ledger = Ledger()
    stop = threading.Event()
    prefix = f"s{seed}"
    kill_after = rng.uniform(0.0, 1.5)  # once calls are flowing
    with forge_proxy(out, confdir, ups) as proxy:
        ctx = ssl.create_default_context(cafile=str(proxy.ca_cert))
        threads = [
            threading.Thread(
                target=_client_loop,
                args=(proxy, ctx, ledger, stop, f"{prefix}c{i}", KINDS[i % len(KINDS)]),
                daemon=True,
            )
            for i in range(clients)
        ]
        threads.append(
            threading.Thread(
                target=_socket_loop, args=(proxy, ctx, ledger, stop, f"{prefix}ws"), daemon=True
            )
        )
        for t in threads:
            t.start()
        _wait_for_load(ledger)
        time.sleep(kill_after)
        kill_proxy(proxy)
        stop.set()
        for t in threads:
            t.join(_CLIENT_TIMEOUT_S + 5)
    with forge_proxy(out, confdir, ups):
        pass  # the restart recovers the write-ahead log; the stop builds its shards
    return account(out, up, ledger, prefix, kill_after)


def _wait_for_load(ledger: Ledger, calls: int = 8, timeout_s: float = 30.0) -> None:
    """Until the clients have finished a few calls (the proxy is up, its certificates made)."""
    deadline = time.monotonic() + timeout_s
    while len(ledger.finished) < calls:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ledger.finished)} calls finished in {timeout_s:.0f} s")
        time.sleep(0.02)


def account(
    out: Path, up: ScriptedUpstream, ledger: Ledger, prefix: str, killed_after_s: float
) -> RoundResult:
    rows = (
        connect(out)
        .execute("SELECT rollout_id, path, status FROM calls ORDER BY started_at")
        .fetchall()
    )
    by_nonce: dict[str, list[str]] = {}  # by the call's name, or the socket's
    for rollout, path, status in rows:
        query = parse_qs(urlsplit(path).query).get("call")
        by_nonce.setdefault(query[0] if query else rollout or "", []).append(status)
    sent = [_nonce_of(r.body) for r in up.received]
    sent = [s for s in sent if s is not None and s.startswith(prefix)]
    missing_finished = []
    for nonce in sorted(ledger.finished):
        if by_nonce.get(nonce) != ["complete"]:
            missing_finished.append(f"{nonce} ({ledger.kinds[nonce]}): {by_nonce.get(nonce)}")
    for session, done in ledger.socket_finished.items():
        statuses = by_nonce.get(session, [])
        if statuses[:done] != ["complete"] * done:
            missing_finished.append(f"{session} (websocket): {done} done, {statuses}")
    http_sent = [s for s in sent if "#" not in s]
    socket_sent: dict[str, int] = {}
    for s in sent:
        if "#" in s:
            session = s.split("#")[0]
            socket_sent[session] = socket_sent.get(session, 0) + 1
    missing_sent = [s for s in http_sent if s not in by_nonce]
    for session, n in socket_sent.items():
        if len(by_nonce.get(session, [])) < n:
            missing_sent.append(f"{session}: {n} sent, {len(by_nonce.get(session, []))} recorded")
    duplicated = [n for n, st in by_nonce.items() if len(st) > 1 and n in ledger.kinds]
    statuses = [status for _, _, status in rows]
    return RoundResult(
        killed_after_s=killed_after_s,
        started=len(ledger.kinds),
        finished=len(ledger.finished) + sum(ledger.socket_finished.values()),
        sent=len(sent),
        complete=statuses.count("complete"),
        incomplete=statuses.count("incomplete"),
        missing_finished=missing_finished,
        missing_sent=missing_sent,
        duplicated=duplicated,
    )


def _nonce_of(body: object) -> str | None:
    """The nonce a client put in its request (the user text)."""
    text = json.dumps(body)
    start = text.find("nonce:")
    if start < 0:
        return None
    end = start + 6
    while end < len(text) and (text[end].isalnum() or text[end] in "#-"):
        end += 1
    return text[start + 6 : end]


def _client_loop(
    proxy: RunningProxy,
    ctx: ssl.SSLContext,
    ledger: Ledger,
    stop: threading.Event,
    name: str,
    first_kind: str,
) -> None:
    """Calls one after another, each kind in turn, until the proxy is gone."""
    import anthropic
    import openai

    start = KINDS.index(first_kind)
    with httpx.Client(
        proxy=f"http://{name}:x@127.0.0.1:{proxy.port}",
        verify=ctx,
        timeout=_CLIENT_TIMEOUT_S,
        headers={"cookie": f"session={COOKIE_VALUE}"},
    ) as client:
        sdks = Sdks(
            client,
            openai.OpenAI(api_key=OPENAI_KEY, http_client=client, max_retries=0),
            anthropic.Anthropic(api_key=ANTHROPIC_KEY, http_client=client, max_retries=0),
        )
        for i in range(100_000):
            if stop.is_set():
                return
            kind = KINDS[(start + i) % len(KINDS)]
            nonce = f"{name}-{i}"
            ledger.start(nonce, kind)
            try:
                done = _CALLS[kind](sdks, nonce)
            except (httpx.HTTPError, OSError, ValueError, RuntimeError):
                return  # the proxy died under it
            except (openai.APIError, anthropic.APIError):
                return
            if done:
                ledger.finish(nonce)


@dataclass
class Sdks:
    http: httpx.Client
    openai: Any
    anthropic: Any


def _chat(c: Sdks, nonce: str) -> bool:
    reply = c.openai.chat.completions.create(
        model="gpt-4.1",
        messages=[{"role": "user", "content": f"nonce:{nonce}"}],
        extra_query={"call": nonce},
    )
    return bool(reply.choices[0].message.content == REPLY)


def _messages(c: Sdks, nonce: str) -> bool:
    reply = c.anthropic.messages.create(
        model="claude-sonnet-4-5-20250929",
        max_tokens=2048,
        messages=[{"role": "user", "content": f"nonce:{nonce}"}],
        extra_query={"call": nonce},
    )
    return bool(reply.content[0].type == "text" and reply.content[0].text == REPLY)


def _responses(c: Sdks, nonce: str) -> bool:
    reply = c.openai.responses.create(
        model="gpt-4.1", input=f"nonce:{nonce}", extra_query={"call": nonce}
    )
    return bool(reply.output_text == REPLY)


def _stream(
    url: str, body: dict[str, object], headers: dict[str, str], kind: str
) -> Callable[[Sdks, str], bool]:
    terminal = _TERMINAL[kind]

    def call(c: Sdks, nonce: str) -> bool:
        payload = json.loads(json.dumps(body).replace("TEXT", f"nonce:{nonce}"))
        with c.http.stream("POST", url, params={"call": nonce}, json=payload, headers=headers) as r:
            if r.status_code != 200:
                return False
            for line in r.iter_lines():
                if line.startswith(terminal):
                    return True  # the whole reply is here: stop reading, as Codex does
        return False

    return call


_OPENAI_HEADERS = {"authorization": f"Bearer {OPENAI_KEY}"}
_ANTHROPIC_HEADERS = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
_USER = [{"role": "user", "content": "TEXT"}]
_CALLS: dict[str, Callable[[Sdks, str], bool]] = {
    "chat": _chat,
    "messages": _messages,
    "responses": _responses,
    "chat-stream": _stream(
        "https://api.openai.com/v1/chat/completions",
        {"model": "gpt-4.1", "stream": True, "messages": _USER},
        _OPENAI_HEADERS,
        "chat-stream",
    ),
    "messages-stream": _stream(
        "https://api.anthropic.com/v1/messages",
        {
            "model": "claude-sonnet-4-5-20250929",
            "max_tokens": 2048,
            "stream": True,
            "messages": _USER,
        },
        _ANTHROPIC_HEADERS,
        "messages-stream",
    ),
    "responses-stream": _stream(
        "https://api.openai.com/v1/responses",
        {"model": "gpt-4.1", "stream": True, "input": "TEXT"},
        _OPENAI_HEADERS,
        "responses-stream",
    ),
}


def _socket_loop(
    proxy: RunningProxy, ctx: ssl.SSLContext, ledger: Ledger, stop: threading.Event, session: str
) -> None:
    """One Responses WebSocket, as Codex keeps one: a call after another on it."""
    from websockets.exceptions import WebSocketException
    from websockets.sync.client import connect as ws_connect

    ledger.socket_finished[session] = 0
    try:
        with ws_connect(
            "wss://api.openai.com/v1/responses",
            proxy=f"http://{session}:x@127.0.0.1:{proxy.port}",
            ssl=ctx,
            additional_headers={"authorization": f"Bearer {OPENAI_KEY}"},
            open_timeout=_CLIENT_TIMEOUT_S,
        ) as ws:
            for i in range(100_000):
                if stop.is_set():
                    return
                create = {
                    "type": "response.create",
                    "model": "gpt-5-codex",
                    "input": [{"role": "user", "content": f"nonce:{session}#{i}"}],
                    "stream": True,
                    "store": False,
                }
                ws.send(json.dumps(create))
                while True:
                    event = json.loads(ws.recv(timeout=_CLIENT_TIMEOUT_S))
                    if event["type"] in ("response.failed", "error"):
                        return
                    if event["type"] == "response.completed":
                        break
                with ledger.lock:
                    ledger.socket_finished[session] += 1
    except (WebSocketException, OSError, TimeoutError):
        return
