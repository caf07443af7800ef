"""Serve mode against a real vLLM (CPU build, its own venv): the same client code and the
same recorded columns as with ``forge serve-policy``.

``make test-vllm`` installs vLLM (``make vllm-setup``) and runs this module with
``FORGE_VLLM_PYTHON`` pointing at that venv's python; without it the test is skipped.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mitm_addon.launch import free_port
from pipeline.store import connect
from tests.e2e.test_serve_sdks import anthropic_turns
from tests.support.forge_proxy import OPENAI_KEY, anthropic_client, forge_proxy
from tests.support.policy import policy_server
from tests.support.serve_runs import serve_settings

VLLM_PYTHON = os.environ.get("FORGE_VLLM_PYTHON")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not VLLM_PYTHON, reason="vLLM runs from its own venv: make test-vllm (FORGE_VLLM_PYTHON)"
    ),
]
_START_S = 400  # the CPU engine takes about 40 s to start on 2 cores, more when busy
# Columns serve mode fills for every served call, whichever server answers.
TOKEN_COLUMNS = ("prompt_ids", "completion_ids", "completion_logprobs", "finish_reason", "drift")


@contextlib.contextmanager
def vllm_server(model: Path, log: Path) -> Iterator[str]:
    """``vllm serve`` of the model folder on a free loopback port; yields its base URL."""
    assert VLLM_PYTHON
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    cmd = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "8192", "--seed", "0"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + _START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not start in {_START_S} s:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def record_toy(
    tmp_path: Path, confdir: Path, name: str, url: str, model: Path
) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["OPENAI_API_KEY"] = OPENAI_KEY
    out = tmp_path / name / "run"
    work = tmp_path / name / "work"  # empty in both runs: the harness lists it
    work.mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "forge_cli.main", "record", "--out", str(out), "--confdir",
         str(confdir), "--mode", "serve", "--policy", url, "--tokenizer", str(model), "--",
         sys.executable, "-m", "k8s_jobs.toy_harness", "list the files", "--max-turns", "3"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    # The scripted policy calls `ls` every turn: the toy harness runs out of turns.
    assert done.returncode == 3, done.stderr[-4000:]
    con = connect(out)
    cursor = con.execute("SELECT * FROM calls ORDER BY started_at")
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def record_streamed(
    tmp_path: Path, confdir: Path, name: str, url: str, model: Path
) -> list[dict[str, Any]]:
    """Two streamed Anthropic tool turns (the official SDK) through a serving mitmdump."""
    out = tmp_path / name / "stream"
    with (
        forge_proxy(out, confdir, {}, extra=serve_settings(url, model)) as proxy,
        anthropic_client(proxy) as client,
    ):
        anthropic_turns(client, "claude-x", True, 2)
    cursor = connect(out).execute("SELECT * FROM calls ORDER BY started_at")
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def prefix_cache(url: str) -> tuple[float, float]:
    """(prompt tokens looked up in vLLM's prefix cache, tokens found), from /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    totals = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        for kind in totals:
            if line.startswith(f"vllm:prefix_cache_{kind}_total"):
                totals[kind] += float(line.rsplit(" ", 1)[1])
    return totals["queries"], totals["hits"]


def test_serve_mode_with_vllm_records_what_it_records_with_the_embedded_server(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    model = tiny_models[1]  # scripted: both servers sample the same tokens
    with policy_server(model) as embedded:
        ours = record_toy(tmp_path, confdir, "embedded", embedded.base_url, model)
        ours += record_streamed(tmp_path, confdir, "embedded", embedded.base_url, model)
    with vllm_server(model, tmp_path / "vllm.log") as url:
        theirs = record_toy(tmp_path, confdir, "vllm", url, model)
        queries, hits = prefix_cache(url)
        theirs += record_streamed(tmp_path, confdir, "vllm", url, model)
    # The toy harness's later prompts extend the earlier ones token for token (spliced):
    # vLLM finds their prefixes in its cache.
    print(f"vLLM prefix cache over the toy run: {hits:.0f} of {queries:.0f} prompt tokens")
    assert queries > 0 and hits > 0, (queries, hits)
    assert len(ours) == len(theirs) == 5
    assert [c["stream"] for c in theirs] == [False] * 3 + [True] * 2
    for a, b in zip(ours, theirs, strict=True):
        filled = {c for c in TOKEN_COLUMNS if a[c] is not None}
        assert filled == {c for c in TOKEN_COLUMNS if b[c] is not None} == set(TOKEN_COLUMNS)
        assert (a["drift"], a["finish_reason"], a["tool_calls"]) == (
            b["drift"],
            b["finish_reason"],
            b["tool_calls"],
        )
        assert a["prompt_ids"] == b["prompt_ids"] and a["completion_ids"] == b["completion_ids"]
        diffs = [
            abs(x - y)
            for x, y in zip(a["completion_logprobs"], b["completion_logprobs"], strict=True)
        ]
        assert max(diffs) <= 1e-3, diffs
        assert a["status"] == b["status"] == "complete"
