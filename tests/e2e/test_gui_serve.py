"""The browser-use agent served by a vision policy: ``forge serve-policy`` serves the tiny
Qwen3-VL, ``forge record --mode serve`` answers the agent with it, every call is served
token-exact (its screenshot as the model's own image tokens) and recorded with its image
references; the snapshot carries the screenshots once, and one GRPO step and one SFT
step train on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file

from forge_cli.main import main as forge
from mitm_addon.launch import free_port
from mitm_addon.serve.vision import VisionTokens, image_runs
from pipeline.images import image_size
from pipeline.snapshot import read_manifest
from pipeline.store import audits, connect
from tests.e2e.test_gui_harness import PYTHON, RUNNER, unavailable
from tests.support.forge_proxy import files_containing, password_args
from tests.support.gui_site import TASKS, gui_site

pytestmark = [pytest.mark.slow, pytest.mark.harness]

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-test-browser-serve-9d2e"  # must never reach disk
TASK = "sign-up"
ROLLOUT = f"{TASK}-served"


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "forge serve-policy exited"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("forge serve-policy did not become healthy")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, confdir: Path, tiny_vl_model: Path) -> dict[str, Any]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("gui-serve")
    out = tmp / "run"
    port = free_port()
    policy_url = f"http://127.0.0.1:{port}"
    log = (tmp / "policy.log").open("wb")
    policy = subprocess.Popen(
        [sys.executable, "-m", "forge_cli.main", "serve-policy", "--model", str(tiny_vl_model),
         "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_healthy(policy_url, policy)
        task = TASKS[TASK]
        with gui_site() as site:
            argv = [
                sys.executable, "-m", "forge_cli.main", "record", "--out", str(out),
                "--rollout", ROLLOUT, "--task", TASK, "--harness", "browser-use",
                "--confdir", str(confdir), "--mode", "serve", "--policy", policy_url,
                "--serve-max-tokens", "48", *password_args(tmp / "secrets"), "--",
                str(PYTHON), str(RUNNER), "--task", task.instruction,
                "--url", site.url(task.start), "--max-steps", "3",
                "--result", str(tmp / "result.json"),
            ]  # fmt: skip
            env = {"PATH": os.environ["PATH"], "HOME": str(tmp / "home"), "OPENAI_API_KEY": KEY}
            done = subprocess.run(
                argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=420
            )
            passed = site.verify(task)
    finally:
        policy.terminate()
        policy.wait(30)
        log.close()
    return {"out": out, "tmp": tmp, "done": done, "passed": passed, "model": tiny_vl_model}


def test_every_call_is_served_token_exact_with_its_screenshot_as_image_tokens(
    served: dict[str, Any],
) -> None:
    done = served["done"]
    # The random policy's replies are not the agent's JSON: it gives up (exit 1), unharmed.
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((served["tmp"] / "result.json").read_text())
    assert result["done"] is False and result["errors"]
    assert served["passed"] is False  # the verifier: no form submitted
    con = connect(served["out"])
    calls = con.execute(
        "SELECT call_id, api, status, drift, prompt_parent_call_id, policy_version, "
        "prompt_ids, completion_ids, completion_logprobs, request_images "
        "FROM calls WHERE rollout_id = ? ORDER BY started_at",
        [ROLLOUT],
    ).fetchall()
    # Each unreadable reply is a failure; the agent stops at its third (max_failures=2).
    assert len(calls) == 3
    vocab = json.loads((served["model"] / "config.json").read_text())
    tokens = VisionTokens(
        vocab["vision_start_token_id"], vocab["vision_end_token_id"], vocab["image_token_id"]
    )
    for _, api, status, drift, parent, version, prompt, completion, logprobs, images in calls:
        assert (api, status, drift, parent, version) == ("openai_chat", "complete", "CLEAN", None, 0)
        # One screenshot a step (1920 x 1080 here): stored by hash, 60 image tokens in the
        # prompt the policy was given, which the call row keeps whole.
        (image,) = images
        (width, height, data) = con.execute(
            "SELECT width, height, data FROM images WHERE hash = ?", [image]
        ).fetchone()
        assert (width, height) == image_size(bytes(data)) == (1920, 1080)
        assert image_runs(prompt, tokens) == [60]
        assert 1 <= len(completion) <= 48 and len(logprobs) == len(completion)
        assert not {tokens.start, tokens.end, tokens.pad} & set(completion)
    stitched = connect(served["out"], stitched=True)
    assert {k: v for k, v in audits(stitched).items() if v} == {}
    assert files_containing(served["out"], [KEY]) == []


def test_one_grpo_step_and_one_sft_step_train_on_the_screenshots(served: dict[str, Any]) -> None:
    out, tmp, model = served["out"], served["tmp"], served["model"]
    assert forge(["reward", "--data", str(out), "--rollout", ROLLOUT,
                  "--reward", "1" if served["passed"] else "0"]) == 0  # fmt: skip
    snap = tmp / "snap"
    # One rollout that gave up (crashed: counted as failed) is a group of one: kept, its
    # advantage its reward, 0.
    assert forge(["snapshot", "--data", str(out), "--out", str(snap), "--grpo", "partial=zero",
                  "--grpo", "single_member=raw", "--grpo", "zero_spread=keep"]) == 0  # fmt: skip
    manifest = read_manifest(snap)
    assert manifest["audits"] == {k: 0 for k in manifest["audits"]}
    samples = pq.read_table(snap / manifest["tables"]["samples"]["path"]).to_pylist()
    con = connect(out)
    calls = con.execute(
        "SELECT call_id, request_images FROM calls WHERE rollout_id = ? ORDER BY call_id",
        [ROLLOUT],
    ).fetchall()
    # browser-use rebuilds its conversation every step: one sample per call, each naming
    # the screenshot its tokens show; the snapshot holds each screenshot once.
    assert sorted((s["call_ids"], s["images"]) for s in samples) == sorted(
        ([c], imgs) for c, imgs in calls
    )
    images = pq.read_table(snap / manifest["tables"]["images"]["path"]).to_pylist()
    assert sorted(i["hash"] for i in images) == sorted({h for _, imgs in calls for h in imgs})
    before = load_file(str(model / "model.safetensors"))
    for mode in ("grpo", "sft"):
        ckpt = tmp / f"step-{mode}"
        argv = ["train", "--snapshot", str(snap), "--model", str(model), "--out", str(ckpt),
                "--lr", "1e-2"] + (["--sft"] if mode == "sft" else [])  # fmt: skip
        assert forge(argv) == 0
        (metrics,) = [
            json.loads(line) for line in (ckpt / "train_metrics.jsonl").read_text().splitlines()
        ]
        after = load_file(str(ckpt / "model.safetensors"))
        moved = {k for k, v in after.items() if not (v == before[k]).all()}
        if mode == "grpo":
            # The trainer recomputed the policy's logprobs from the same ids and pixels.
            assert metrics["loss/ppo_kl"] == pytest.approx(0.0, abs=1e-5)
            assert metrics["batch/samples"] == len(samples)
            assert metrics["adv/min"] == metrics["adv/max"] == 0.0  # nothing to learn from
            assert metrics["grad/norm"] == 0.0
        else:
            assert metrics["loss/sft"] > 0
            assert any(k.startswith("model.visual.") for k in moved)
            assert any(k.startswith("model.language_model.") for k in moved)
