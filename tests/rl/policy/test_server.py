"""``forge serve-policy`` over real HTTP: vLLM's completion shape, pause / resume with
429 and Retry-After, weights loaded with a version number."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.policy import held_after, policy_server

PROMPT = [151644, 872, 198, 14990, 151645, 198, 151644, 77091, 198]


def call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None, r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


@pytest.fixture(scope="module")
def server(tiny_models: tuple[Path, Path]) -> Iterator[Any]:
    with policy_server(tiny_models[0], pause_wait_s=0.3) as s:
        yield s


def test_completion_returns_token_ids_and_logprobs_in_vllms_shape(server: Any) -> None:
    status, models, _ = call(server.base_url, "GET", "/v1/models")
    model = models["data"][0]["id"]
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 5,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "seed": 1,
    }
    status, out, _ = call(server.base_url, "POST", "/v1/completions", body)
    assert status == 200 and out["object"] == "text_completion"
    choice = out["choices"][0]
    assert choice["prompt_token_ids"] == PROMPT and len(choice["token_ids"]) == 5
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert len(choice["logprobs"]["token_logprobs"]) == 5 and choice["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}
    assert call(server.base_url, "GET", "/health")[0] == 200


def test_paused_server_answers_429_with_retry_after_then_serves_after_resume(server: Any) -> None:
    body = {"prompt": PROMPT, "max_tokens": 2}
    assert call(server.base_url, "POST", "/pause", {})[1] == {"paused": True}
    try:
        status, out, headers = call(server.base_url, "POST", "/v1/completions", body)
        assert status == 429 and headers["retry-after"] == "1"
        # A call that arrives while paused waits (bounded) and runs once resumed.
        results: list[int] = []
        waiter = threading.Thread(
            target=lambda: results.append(call(server.base_url, "POST", "/v1/completions", body)[0])
        )
        server.service.settings.pause_wait_s = 30.0
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and results == []
    finally:
        call(server.base_url, "POST", "/resume", {})
        server.service.settings.pause_wait_s = 0.3
    waiter.join(60)
    assert results == [200]


def test_loaded_weights_carry_their_version_into_every_completion(
    server: Any, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    status, out, _ = call(
        server.base_url, "POST", "/load_weights", {"path": str(tiny_models[0]), "version": 7}
    )
    assert status == 200 and out == {"policy_version": 7}
    out = call(server.base_url, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})[1]
    assert out["policy_version"] == 7
    assert call(server.base_url, "GET", "/v1/models")[1]["data"][0]["policy_version"] == 7
    # A folder without weights is refused; the served version stays.
    status, out, _ = call(
        server.base_url, "POST", "/load_weights", {"path": str(tmp_path), "version": 8}
    )
    assert status == 400 and "no .safetensors" in out["error"]["message"]
    assert call(server.base_url, "GET", "/v1/models")[1]["data"][0]["policy_version"] == 7


def test_bad_completion_requests_get_a_clear_400(server: Any) -> None:
    for body, words in [
        ({"prompt": [], "max_tokens": 1}, "non-empty list"),
        ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
        ({"prompt": [10**9]}, "token ids must lie"),
        ({"prompt": [10**9], "stream": True}, "token ids must lie"),
    ]:
        status, out, _ = call(server.base_url, "POST", "/v1/completions", body)
        assert status == 400 and words in out["error"]["message"], out


def stream_events(base: str, body: dict[str, Any], on_first: Any = None) -> list[Any]:
    """The data of each server-sent event of a streamed completion; ``on_first`` runs when
    the first has arrived."""
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode())
    req.add_header("content-type", "application/json")
    out: list[Any] = []
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["content-type"] == "text/event-stream"
        for line in r:
            if line.startswith(b"data: "):
                data = line[6:].strip()
                out.append(data.decode() if data == b"[DONE]" else json.loads(data))
                if len(out) == 1 and on_first is not None:
                    on_first()
    return out


def test_a_streamed_completion_is_the_same_completion_sent_token_by_token(server: Any) -> None:
    body = {
        "prompt": PROMPT,
        "max_tokens": 6,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "seed": 3,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    _, whole, _ = call(server.base_url, "POST", "/v1/completions", body)
    events = stream_events(server.base_url, dict(body, stream=True))
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert [len(c["choices"][0]["token_ids"]) for c in chunks] == [1] * 6
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == whole["choices"][0][
        "token_ids"
    ]
    assert [lp for c in chunks for lp in c["choices"][0]["logprobs"]["token_logprobs"]] == (
        whole["choices"][0]["logprobs"]["token_logprobs"]
    )
    assert [c["choices"][0]["prompt_token_ids"] for c in chunks] == [PROMPT] + [None] * 5
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6


def test_each_token_is_sent_before_the_next_is_sampled(server: Any) -> None:
    """The engine is held after its first token until the client has that token: a
    server that sent the completion whole would never let it go on."""
    with held_after(server, 0) as (first_seen, held):
        body = {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True, "return_token_ids": True}
        events = stream_events(server.base_url, dict(body, stream=True), first_seen.set)
    assert held == [True] and len(events) == 5


def test_concurrent_requests_are_queued_not_interleaved(server: Any) -> None:
    """Seeded completions sent at once equal the same completions sent one by one."""
    bodies = [
        {"prompt": PROMPT, "max_tokens": 6, "seed": s, "return_token_ids": True} for s in range(4)
    ]
    alone = [call(server.base_url, "POST", "/v1/completions", b)[1] for b in bodies]
    together: dict[int, Any] = {}
    threads = [
        threading.Thread(
            target=lambda i=i, b=b: together.__setitem__(
                i, call(server.base_url, "POST", "/v1/completions", b)[1]
            )
        )
        for i, b in enumerate(bodies)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, single in enumerate(alone):
        assert together[i]["choices"][0]["token_ids"] == single["choices"][0]["token_ids"]


def test_the_cli_server_answers_and_stops_on_sigterm(tiny_models: tuple[Path, Path]) -> None:
    """`forge serve-policy &` then `kill %1`, as the README does: the process exits."""
    import signal
    import subprocess
    import sys
    import time

    from mitm_addon.launch import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "forge_cli.main", "serve-policy"]
    proc = subprocess.Popen(
        [*cmd, "--model", str(tiny_models[0]), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "serving" in proc.stdout.readline()
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body, _ = call(f"http://127.0.0.1:{port}", "GET", "/v1/models")
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.2)
        assert status == 200 and body["data"][0]["root"] == str(tiny_models[0].resolve())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
