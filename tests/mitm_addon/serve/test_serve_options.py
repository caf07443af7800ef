"""forge_mode=serve's options, parsed in configure: bad values are OptionsErrors, and a
served model call is held for the async hook instead of going to its provider."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mitmproxy import exceptions

from mitm_addon.addons.state import Route
from rl.tiny_model import qwen3_tokenizer_dir
from tests.mitm_addon.test_forge_addon import ForgeAddons, addon_context, llm_flow, state_of


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"forge_mode": "serve"}, "needs forge_policy"),
        ({"forge_mode": "serve", "forge_policy": "ftp://x", "forge_tokenizer": "/"}, "http://"),
        (
            {
                "forge_mode": "serve",
                "forge_policy": "http://127.0.0.1:9",
                "forge_tokenizer": "/nope",
            },
            "no tokenizer_config.json",
        ),
    ],
)
def test_bad_serve_settings_raise_options_error(
    tmp_path: Path, settings: dict[str, str], words: str
) -> None:
    a = ForgeAddons()
    with addon_context(a), pytest.raises(exceptions.OptionsError, match=words):
        a.configure(forge_dir=str(tmp_path / "run"), **settings)


def test_served_calls_are_held_for_the_policy_and_other_models_pass_through(
    tmp_path: Path,
) -> None:
    a = ForgeAddons()
    with addon_context(a):
        a.configure(
            forge_dir=str(tmp_path / "run"),
            forge_process_lookup=False,
            forge_mode="serve",
            forge_policy="http://127.0.0.1:9/v1",
            forge_tokenizer=str(qwen3_tokenizer_dir()),
            forge_serve_models="claude-*",
        )
        a.running()
        server = a.serving.server
        assert server is not None and server.client.base_url == "http://127.0.0.1:9"
        body = {
            "model": "claude-x",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
        }
        served = llm_flow("api.anthropic.com", "/v1/messages", json.dumps(body).encode())
        a.request(served)
        # Recorded, and rerouted to serve mode's own endpoint, never to the provider (the
        # e2e tests follow it there).
        assert state_of(served).route is Route.SERVED and state_of(served).capture is not None
        port = a.serving.endpoint.port
        assert (served.request.host, served.request.port) == ("127.0.0.1", port)
        assert served.request.path.startswith("/call/") and served.response is None
        other = llm_flow(
            "api.anthropic.com", "/v1/messages", json.dumps(dict(body, model="gpt-x")).encode()
        )
        a.request(other)
        assert state_of(other).route is Route.MODEL and state_of(other).capture is not None
        assert other.response is None  # to its provider
        ws = llm_flow("chatgpt.com", "/backend-api/codex/responses", b"")
        ws.request.method = "GET"
        ws.request.headers["upgrade"] = "websocket"
        a.request(ws)
        # A socket's calls each name their model: with forge_serve_models set, HTTP it is.
        assert ws.response is not None and ws.response.status_code == 426


def test_a_negative_serve_max_tokens_is_an_options_error(tmp_path: Path) -> None:
    a = ForgeAddons()
    with addon_context(a), pytest.raises(exceptions.OptionsError, match=">= 0"):
        a.configure(
            forge_dir=str(tmp_path / "run"),
            forge_mode="serve",
            forge_policy="http://127.0.0.1:9",
            forge_tokenizer=str(qwen3_tokenizer_dir()),
            forge_serve_max_tokens=-1,
        )


def test_a_policy_version_below_minus_one_is_an_options_error(tmp_path: Path) -> None:
    a = ForgeAddons()
    with addon_context(a), pytest.raises(exceptions.OptionsError, match="-1: none"):
        a.configure(
            forge_dir=str(tmp_path / "run"),
            forge_mode="serve",
            forge_policy="http://127.0.0.1:9",
            forge_tokenizer=str(qwen3_tokenizer_dir()),
            forge_policy_version=-2,
        )
