"""The tiny policy for serve-mode tests: built once per session with ``forge init-model``,
served by the embedded policy server on a free loopback port."""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from forge_cli.main import main as forge_main

# The scripted model's answer to every conversation: reasoning, then a shell tool call.
# (Its tokens must not repeat: see rl.tiny_model.script_reply.)
SCRIPTED_REPLY = (
    '<think>Listing files.</think><tool_call>{"name":"shell","arguments":{"command": "ls"}}'
    "</tool_call>"
)


def build_models(root: Path) -> tuple[Path, Path]:
    """(random tiny model, scripted tiny model), both made by the CLI."""
    random_dir, scripted_dir = root / "tiny-random", root / "tiny-scripted"
    assert forge_main(["init-model", "--tiny", "--out", str(random_dir), "--seed", "0"]) == 0
    shutil.copytree(random_dir, scripted_dir)
    from rl.tiny_model import script_reply

    script_reply(scripted_dir, SCRIPTED_REPLY)
    return random_dir, scripted_dir


@contextlib.contextmanager
def policy_server(model_dir: Path, **settings: object) -> Iterator[object]:
    """The embedded policy server in this process (its engine stays inspectable)."""
    from rl.policy.server import PolicyServer, ServerSettings

    server = PolicyServer(ServerSettings(model_dir=model_dir, port=0, **settings))  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def held_after(
    server: Any, token: int, timeout_s: float = 30.0
) -> Iterator[tuple[Any, list[bool]]]:
    """While open, the server's engine stops after sampling token number ``token`` (from
    0) until the event it yields is set: ``(event, held)``, ``held`` getting whether it
    was set within ``timeout_s``. A server that sent the completion whole would keep the
    client waiting for a token it never sends: ``held == [False]``."""
    engine = server.service.engine
    stream, release, held = engine.stream, threading.Event(), []

    def gated(prompt_ids: list[int], params: Any, *images: Any) -> Iterator[Any]:
        for n, step in enumerate(stream(prompt_ids, params, *images)):
            yield step
            if n == token:
                held.append(release.wait(timeout_s))

    engine.stream = gated
    try:
        yield release, held
    finally:
        del engine.stream
