"""Upstream faults through a real mitmdump: the official SDK sees what it sees without the
proxy, the call is recorded with its status and error, and the proxy carries on.

Each case makes the same SDK call twice against a ScriptedUpstream that injects the
fault, once directly and once through Forge, compares what the client saw (exception
type, status code, events and text received before the failure), finds the recorded
row (by a model name unique to the case), then makes a normal call through the same
proxy, which must be recorded complete.
"""

from __future__ import annotations

import dataclasses
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pyarrow.parquet as pq
import pytest

from mitm_addon.launch import RunningProxy
from tests.support.forge_proxy import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    SECRETS,
    files_containing,
    forge_proxy,
)
from tests.support.upstream import Fault, ScriptedUpstream

APIS = ("anthropic_messages", "openai_chat", "openai_responses")
TEXT = "The answer is forty-two, and it comes in several words to make a stream."
CLIENT_TIMEOUT_S = 1.5  # the stall case's client gives up after this
STALL_S = CLIENT_TIMEOUT_S + 3.0
ROW_WAIT_S = 20.0


@dataclasses.dataclass(frozen=True)
class Case:
    fault: Fault
    stream: bool
    status: str  # recorded status
    error: str  # text the recorded error contains
    timeout_s: float = 20.0
    bug: str | None = None  # a known Forge bug this case shows (strict xfail)


# A reset mid-stream reaches the client as ECONNRESET (httpx ReadError) directly, and as a
# connection closed early (RemoteProtocolError) through any proxy that terminates TLS:
# mitmproxy closes the client connection, it cannot forward the RST. The SDK does not
# wrap either; the client sees the same events, then a transport error.
SAME_TRANSPORT_ERROR = {"ReadError": "TransportError", "RemoteProtocolError": "TransportError"}


CASES = {
    "http-500": Case(Fault("status", status=500, times=1), False, "error", "HTTP 500"),
    "http-529-stream": Case(Fault("status", status=529, times=1), True, "error", "HTTP 529"),
    "reset-mid-stream": Case(
        Fault("reset_mid_stream", after_events=3, times=1), True, "incomplete", ""
    ),
    "reset-before-reply": Case(
        Fault("reset_mid_stream", times=1),
        False,
        "incomplete",
        "",
    ),
    "stall-past-client-timeout": Case(
        Fault("stall_mid_stream", after_events=3, stall_s=STALL_S, times=1),
        True,
        "incomplete",
        "",
        timeout_s=CLIENT_TIMEOUT_S,
    ),
    "invalid-json": Case(Fault("invalid_json", times=1), False, "error", "JSON"),
    "invalid-json-stream": Case(
        Fault("invalid_json", after_events=3, times=1),
        True,
        "error",
        "JSON",
    ),
    "error-event": Case(Fault("error_event", after_events=3, times=1), True, "error", "rror"),
}


@dataclasses.dataclass(frozen=True)
class Seen:
    """What a client saw of one call."""

    exception: str | None
    status_code: int | None
    events: tuple[str, ...]
    text: str


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream([{"text": TEXT}]) as up:
        yield up


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, confdir: Path, upstream: ScriptedUpstream
) -> Iterator[tuple[RunningProxy, Path]]:
    out = tmp_path_factory.mktemp("faults") / "run"
    ups = {"api.openai.com": upstream.base_url, "api.anthropic.com": upstream.base_url}
    # One shard per call, so each case finds its row while the proxy runs.
    with forge_proxy(out, confdir, ups, extra=["forge_rotate_rows=1"]) as running:
        yield running, out
    assert files_containing(out, SECRETS) == [], "a dummy key reached disk"


def make_client(
    api: str, timeout_s: float, up: ScriptedUpstream, proxy: RunningProxy | None
) -> Any:
    if proxy is None:
        http = httpx.Client(timeout=timeout_s)
        base = {"base_url": up.base_url if api == "anthropic_messages" else up.openai_base_url}
    else:
        verify = ssl.create_default_context(cafile=str(proxy.ca_cert))
        http = httpx.Client(proxy=proxy.url, verify=verify, timeout=timeout_s)
        base = {}
    if api == "anthropic_messages":
        return anthropic.Anthropic(api_key=ANTHROPIC_KEY, http_client=http, max_retries=0, **base)
    return openai.OpenAI(api_key=OPENAI_KEY, http_client=http, max_retries=0, **base)


def call(api: str, client: Any, model: str, stream: bool) -> Seen:
    """One SDK call; what the client received, up to and including how it ended."""
    events: list[str] = []
    text: list[str] = []
    try:
        if api == "anthropic_messages":
            result = client.messages.create(
                model=model,
                max_tokens=64,
                stream=stream,
                messages=[{"role": "user", "content": "the answer?"}],
            )
            if stream:
                for event in result:
                    events.append(event.type)
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        text.append(event.delta.text)
            else:
                events.append(result.type)
                text += [b.text for b in result.content if b.type == "text"]
        elif api == "openai_chat":
            result = client.chat.completions.create(
                model=model, stream=stream, messages=[{"role": "user", "content": "the answer?"}]
            )
            if stream:
                for chunk in result:
                    events.append(chunk.object)
                    text += [c.delta.content for c in chunk.choices if c.delta.content]
            else:
                events.append(result.object)
                text.append(result.choices[0].message.content or "")
        else:
            result = client.responses.create(model=model, input="the answer?", stream=stream)
            if stream:
                for event in result:
                    events.append(event.type)
                    if event.type == "response.output_text.delta":
                        text.append(event.delta)
            else:
                events.append(result.object)
                text.append(result.output_text)
    except Exception as e:  # what the client sees is the point: compared below
        return Seen(type(e).__name__, getattr(e, "status_code", None), tuple(events), "".join(text))
    finally:
        client.close()
    return Seen(None, None, tuple(events), "".join(text))


_shards_read: dict[Path, list[dict[str, Any]]] = {}


def recorded(out: Path, model: str) -> list[dict[str, Any]]:
    """The calls rows for ``model``, once one is in a shard (or after ROW_WAIT_S)."""
    deadline = time.monotonic() + ROW_WAIT_S
    while True:
        for path in (out / "calls").glob("*.parquet"):
            if path not in _shards_read:
                _shards_read[path] = pq.read_table(
                    path, columns=["model", "api", "status", "error"]
                ).to_pylist()
        rows = [r for rows in _shards_read.values() for r in rows if r["model"] == model]
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def normalised(seen: Seen) -> Seen:
    exception = SAME_TRANSPORT_ERROR.get(seen.exception or "", seen.exception)
    return dataclasses.replace(seen, exception=exception)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=c.bug) if c.bug else ())
        for name, c in sorted(CASES.items())
    ],
)
@pytest.mark.parametrize("api", APIS)
def test_fault_looks_the_same_through_the_proxy_and_is_recorded(
    api: str, case: str, upstream: ScriptedUpstream, proxy: tuple[RunningProxy, Path]
) -> None:
    running, out = proxy
    spec = CASES[case]
    model = f"m-{api}-{case}"

    upstream.set_fault(spec.fault)
    direct = call(api, make_client(api, spec.timeout_s, upstream, None), model, spec.stream)
    upstream.set_fault(spec.fault)
    proxied = call(api, make_client(api, spec.timeout_s, upstream, running), model, spec.stream)
    upstream.set_fault(None)

    assert direct.exception is not None or case == "error-event", direct  # the fault bit

    # Nothing else is disturbed: the next call through the same proxy is recorded complete.
    after = f"{model}-after"
    seen = call(api, make_client(api, 20.0, upstream, running), after, spec.stream)
    assert seen.exception is None and seen.text == TEXT
    (after_row,) = recorded(out, after)
    assert after_row["status"] == "complete" and after_row["error"] is None

    (row,) = recorded(out, model)
    assert row["api"] == api

    def client_saw_the_same() -> None:
        assert normalised(proxied) == normalised(direct)

    def recorded_with_status_and_error() -> None:
        assert row["status"] == spec.status, row["error"]
        assert row["error"] and spec.error in row["error"], row["error"]

    # The check a known bug breaks goes last, so that the others still run on its case.
    checks = [client_saw_the_same, recorded_with_status_and_error]
    if case == "reset-before-reply":
        checks.reverse()
    for check in checks:
        check()
