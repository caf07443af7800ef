"""``forge loop`` with ``policy_server: vllm``: one vLLM engine for the whole loop, the
round 0 checkpoint published into it before round 1 collects, without a restart.

``make test-vllm`` installs vLLM (``make vllm-setup``) and runs this module with
``FORGE_VLLM_PYTHON`` pointing at that venv's python."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from forge_cli.main import main as forge_main
from pipeline.store import connect
from tests.e2e.test_smollm2 import BRIEF_TASK

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        not os.environ.get("FORGE_VLLM_PYTHON"),
        reason="vLLM runs from its own venv: make test-vllm (FORGE_VLLM_PYTHON)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
HELLO = '<tool_call>{"name":"shell","arguments":{"command": "echo hi >hello.txt"}}</tool_call>'


def calls_of(run: Path) -> list[dict[str, Any]]:
    cur = connect(run).execute(
        "SELECT policy_version, prompt_ids, completion_ids, completion_logprobs FROM calls "
        "WHERE status = 'complete'"
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def max_logprob_gap(model: Path, calls: list[dict[str, Any]]) -> float:
    """The largest gap between recorded logprobs and ``model``'s, token by token."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl.policy.engine import logprobs_of

    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    gap = 0.0
    for c in calls:
        ours = logprobs_of(policy, list(c["prompt_ids"]), list(c["completion_ids"]))
        recorded = torch.tensor(list(c["completion_logprobs"]))
        gap = max(gap, float((ours - recorded).abs().max()))
    return gap


def tiny_policy(tmp_path: Path) -> tuple[Path, str, float]:
    """The tiny Qwen3 scripted to write hello.txt (a sampled reply sometimes leaves the
    script, so a group's rewards differ), the first demo task, and the logprob tolerance."""
    model = tmp_path / "tiny-hello"
    args = ["init-model", "--tiny", "--out", str(model), "--reply-margin", "15", "--reply", HELLO]
    assert forge_main(args) == 0
    return model, (ROOT / "data/tasks/demo.jsonl").read_text().splitlines()[0], 1e-3


def smollm2_policy(tmp_path: Path) -> tuple[Path, str, float]:
    """SmolLM2-135M-Instruct (forge init-model --smollm2), asked for a short greeting and
    scored by brevity, so sampled replies of different lengths differ in reward. vLLM's
    CPU kernels and the trainer's agree to about 1e-2 on a 30-layer model."""
    model = tmp_path / "smollm2"
    assert forge_main(["init-model", "--smollm2", "--out", str(model)]) == 0
    return model, json.dumps(BRIEF_TASK), 2e-2


@pytest.mark.parametrize("policy", [tiny_policy, smollm2_policy], ids=["tiny", "smollm2"])
def test_a_two_round_loop_on_vllm_publishes_the_new_weights_between_rounds(
    policy: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # its own mitmproxy CA
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    for key in [k for k in os.environ if k.lower().endswith("_proxy")]:
        monkeypatch.delenv(key)
    model, task, tolerance = policy(tmp_path)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(task + "\n")
    config = {
        "out": str(tmp_path / "loop"),
        "model": str(model),
        "tasks": str(tasks),
        "harness": "toy",
        "rounds": 2,
        "n": 8,
        "parallel": 4,
        "serve_max_tokens": 24,
        "policy_server": "vllm",
        "train": {"lr": 1e-2 if policy is tiny_policy else 1e-4, "micro_batch_size": 4},
    }
    (tmp_path / "loop.yaml").write_text(json.dumps(config) + "\n")
    assert forge_main(["loop", "--config", str(tmp_path / "loop.yaml")]) == 0

    loop = tmp_path / "loop"
    said = capsys.readouterr().err
    assert said.count("starting vLLM") == 1  # one engine for both rounds
    assert "round 1: published" in said and "as policy version 1 in" in said
    state = json.loads((loop / "state.json").read_text())
    assert [r["policy_version"] for r in state["rounds"]] == [0, 1]
    first, second = calls_of(loop / "runs/round-0"), calls_of(loop / "runs/round-1")
    assert len(first) >= 8 and len(second) >= 8
    assert {c["policy_version"] for c in first} == {0}
    assert {c["policy_version"] for c in second} == {1}
    # Round 1 was sampled by the published weights: its recorded logprobs are the step-1
    # checkpoint's (up to vLLM's CPU kernels), not the starting model's.
    step1 = loop / "checkpoints/step-1"
    new_gap, old_gap = max_logprob_gap(step1, second), max_logprob_gap(model, second)
    assert new_gap < tolerance < old_gap, (new_gap, old_gap)
    assert max_logprob_gap(model, first) < tolerance
