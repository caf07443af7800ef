"""End-to-end fixtures: a real mitmdump with Forge's addon between real SDK clients and a
scripted upstream that speaks the providers' wire formats."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mitm_addon.launch import RunningProxy
from tests.support.forge_proxy import SECRETS, files_containing, forge_proxy
from tests.support.upstream import ScriptedUpstream

# Answer with a shell tool call, then with text: a two-turn agent episode.
SCRIPT = [
    {"tool_call": {"name": "shell", "arguments": {"command": "echo hi > hello.txt"}}},
    {"text": "Done: hello.txt holds hi."},
]


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(SCRIPT) as up:
        yield up


@dataclass
class Recording:
    proxy: RunningProxy
    out: Path
    upstream: ScriptedUpstream


@pytest.fixture
def recording(tmp_path: Path, confdir: Path, upstream: ScriptedUpstream) -> Iterator[Recording]:
    """A recording proxy; on teardown it is stopped and its output scanned for secrets."""
    out = tmp_path / "run"
    ups = {"api.openai.com": upstream.base_url, "api.anthropic.com": upstream.base_url}
    with forge_proxy(out, confdir, ups, rollout="r-e2e") as proxy:
        yield Recording(proxy, out, upstream)
    assert files_containing(out, SECRETS) == [], "a dummy key reached disk"
