"""``make demo-rl``: a model trained inside a harness gets better at its tasks there.

The harness is the toy one (``--harness toy``, the default), Codex CLI or Claude Code
(``--harness codex|claude``, the pinned CLIs, unmodified). The recipe, once per seed, on CPU:

1. expert: a scripted provider (``ExpertScript``) drives the harness through
   ``forge rollout`` in record mode over the train tasks of ``data/tasks/demo-rl.jsonl``.
   It is a sloppy expert: it runs the task's script only ``--expert-accuracy`` of the
   time and otherwise reads it, dry-runs it or lists the directory, then says it is done
   (recorded once, shared by the seeds);
2. SFT: a tiny Qwen3 built from a config (the real Qwen3 tokenizer, seeded weights) is
   trained on those recordings with ``forge train --sft``: it copies the expert's
   habits, the bad ones too. In a real harness its layers attend to the last 64 tokens
   (``--sliding-window``): with full attention over Codex's 7.7k-token prompt it did not
   learn the tool-call format;
3. held-out success of the SFT policy: the held-out tasks, the policy served by
   ``forge serve-policy``'s engine, the harness in serve mode;
4. RL: ``forge loop`` rounds (a sample of train tasks x a GRPO group, snapshot, one
   GRPO step, publish the checkpoint);
5. held-out success of the RL policy, measured as in 3.

It ends with ``held-out success: sft=NN.N% sft+rl=NN.N% seeds=S`` (means over seeds)
and writes ``results.json``, ``results.md`` and ``curve.png`` (mean reward by round)
under ``--out``."""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rl.demo_tasks import DEFAULT_OUT as DEFAULT_TASKS

# The policies the demo trains, and each one's recipe where it differs: the tiny random
# Qwen3 needs many epochs at a high learning rate to learn anything; the pretrained
# SmolLM2-135M-Instruct (``forge init-model --smollm2``) is fine-tuned: 2 epochs at 5e-5
# left its tool-call arguments unlearned (0 of 20 held-out tasks; it copied the tools'
# JSON schema), 4 epochs at 2e-4 learned them (SFT loss 0.04).
# Its sizes are cut so that one seed fits in about 40 minutes on 2 cores: its forward and
# backward passes cost 30 layers of width 576 where the tiny model's cost 2 of width 64.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {
        "sft_epochs": 10, "sft_lr": 1e-2, "rl_lr": 1e-3, "micro_batch_size": 16,
        "seeds": 3, "expert_tasks": 96, "rounds": 4, "tasks_per_round": 6, "n": 8,
        "parallel": 6,
    },
    "smollm2": {
        "sft_epochs": 4, "sft_lr": 2e-4, "rl_lr": 2e-5, "micro_batch_size": 4,
        "seeds": 1, "expert_tasks": 32, "rounds": 2, "tasks_per_round": 4, "n": 6,
        "parallel": 3, "heldout": 20,
    },
}  # fmt: skip

RIGHT = "bash task.sh"
SLOPPY = ("cat task.sh", "bash task.sh --dry-run", "ls")


# The demo's harnesses and the provider host each one calls (answered by the scripted
# expert in record mode, by the policy in serve mode).
HARNESS_HOSTS = {"toy": "api.openai.com", "codex": "api.openai.com", "claude": "api.anthropic.com"}


class ExpertScript:
    """The scripted provider's replies: one shell command, then "Done.".

    Whether the command is the right one is a seeded coin per task instruction, so the
    recording does not depend on the order rollouts run in. A real harness wraps the
    instruction in its own context (Codex's environment context, Claude Code's
    reminders, which name the rollout's working directory): given the task
    ``instructions``, the coin is tossed on the one the conversation holds.
    """

    def __init__(self, accuracy: float, seed: int, instructions: Sequence[str] = ()) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError("expert accuracy must lie in [0, 1]")
        self.accuracy = accuracy
        self.seed = seed
        # As JSON string bodies: how the instruction appears in the serialised history.
        self._needles = [(json.dumps(i)[1:-1], i) for i in instructions]

    def command(self, instruction: str) -> str:
        r = random.Random(f"{self.seed}:{instruction}")
        return RIGHT if r.random() < self.accuracy else r.choice(SLOPPY)

    def instruction(self, history: list[dict[str, Any]]) -> str:
        """The task instruction of a conversation: the known one it holds, else the text
        of its first user message."""
        if self._needles:
            text = json.dumps(history)
            for needle, instruction in self._needles:
                if needle in text:
                    return instruction
        user: dict[str, Any] = next((m for m in history if m.get("role") == "user"), {})
        return str(user.get("content", ""))

    def __call__(self, conv: Any) -> Any:
        if conv.tool_results == 0:
            command = self.command(self.instruction(conv.history))
            return {"tool_call": {"name": "shell", "arguments": {"command": command}}}
        return {"text": "Done."}


# The behaviour views' per-run rates (pipeline/sql/370_behaviour_summary.sql), in the
# order the report prints them, with the counts that say over what each was taken.
BEHAVIOUR = {
    "mean_tool_coverage": "tool coverage",
    "self_verification_rate": "self-verification",
    "mean_plan_completion": "plan completion",
    "error_recovery": "error recovery",
}
BEHAVIOUR_COUNTS = ("n_trajectories", "n_with_edits", "n_with_plan", "n_failed_results")


@dataclass
class SeedResult:
    seed: int
    sft: float
    rl: float
    curve: list[float | None] = field(default_factory=list)
    """Mean reward of each RL round's rollouts (train tasks)."""
    seconds: float = 0.0
    behaviour: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """The held-out runs' behaviour (``sft``, ``rl``): BEHAVIOUR's rates and the counts."""
    policies: dict[str, str] = field(default_factory=dict)
    """The checkpoints measured (``sft``, ``rl``), relative to the demo's output folder."""


def _say(message: str) -> None:
    print(f"forge demo-rl: {message}", file=sys.stderr, flush=True)


def record_expert(
    tasks: list[Any],
    out: Path,
    accuracy: float,
    seed: int,
    parallel: int,
    confdir: Path | None,
    harness: str = "toy",
) -> Path:
    """Record the expert through ``harness`` over ``tasks`` (one rollout each); export its
    chats (sub-agents' included) for SFT."""
    from k8s_jobs.local import RolloutOptions, run_rollouts
    from k8s_jobs.outcome import ProgressPrinter
    from tests.support.upstream import ScriptedUpstream

    run_dir, chats = out / "expert" / "run", out / "expert" / "sft.parquet"
    expert = ExpertScript(accuracy, seed, [t.instruction for t in tasks])
    with ScriptedUpstream(expert) as provider:
        _say(f"expert: {len(tasks)} rollouts in record mode against {provider.base_url}")
        printer = ProgressPrinter()
        try:
            summary = run_rollouts(
                tasks,
                RolloutOptions(
                    out_dir=run_dir,
                    harness=harness,
                    n=1,
                    parallel=parallel,
                    upstreams=[f"{HARNESS_HOSTS[harness]}={provider.base_url}"],
                    on_progress=printer,
                    **cast("dict[str, Any]", {"confdir": confdir} if confdir else {}),
                ),
            )
        finally:
            printer.close()
    _say(f"expert: mean reward {summary.mean_reward:.3f} over {len(summary.results)} rollouts")
    # Recorded text, not token ids: the chats are exported as `forge export sft` writes
    # them, and SFT on them tokenizes them with the policy's chat template.
    from pipeline.export import write_sft
    from pipeline.store import connect

    con = connect(run_dir, stitched=True)
    try:
        result = write_sft(con, chats)
    finally:
        con.close()
    _say(f"expert: {result.rows} SFT examples written to {chats}")
    return chats


def behaviour(run_dir: Path) -> dict[str, float | None]:
    """How the policy worked in one run: the ``behaviour_summary`` row of its rollouts
    (one harness and one model name per run; a rate is None where it is undefined, e.g.
    self-verification without edits)."""
    from pipeline.store import connect

    names = [*BEHAVIOUR, *BEHAVIOUR_COUNTS]
    con = connect(run_dir, stitched=True)
    try:
        rows = con.execute(f"SELECT {', '.join(names)} FROM behaviour_summary").fetchall()
    finally:
        con.close()
    if len(rows) != 1:
        raise ValueError(f"{run_dir}: expected one harness and model, got {len(rows)} rows")
    return {n: None if v is None else float(v) for n, v in zip(names, rows[0], strict=True)}


def success(summary: Any) -> float:
    """Share of rollouts the verifier passed (a rollout without a reward counts as failed)."""
    results = summary.results
    return sum(1 for r in results if (r.reward or 0.0) > 0) / len(results) if results else 0.0


def measure_heldout(
    policy: Path, held: list[Any], run_dir: Path, harness: str, args: argparse.Namespace
) -> float:
    """Held-out success of ``policy`` served to ``harness``: each task once, in serve mode,
    into ``run_dir``."""
    from rl.loop import serve_and_run
    from rl.trainer import read_policy_version

    summary = serve_and_run(
        policy,
        read_policy_version(policy),
        held,
        run_dir,
        harness=harness,
        n=1,
        parallel=args.parallel,
        serve_max_tokens=args.serve_max_tokens,
        confdir=args.confdir,
        progress=False,
    )
    return success(summary)


def pretrained_model(out: Path) -> Path:
    """SmolLM2-135M-Instruct under ``out/smollm2``, built on first use."""
    from rl.gguf_model import build_from_gguf, smollm2_gguf

    folder = out / "smollm2"
    if not (folder / "config.json").is_file():
        _say(f"building SmolLM2-135M-Instruct into {folder}")
        build_from_gguf(smollm2_gguf(), folder)
    return folder


def run_seed(seed: int, args: argparse.Namespace, expert: Path, held: list[Any]) -> SeedResult:
    from rl.loop import LoopConfig, run_loop
    from rl.losses import LossSettings
    from rl.tiny_model import build_tiny_model
    from rl.train import TrainJob, train
    from rl.trainer import TrainSettings

    started = time.monotonic()
    root = args.out / f"seed-{seed}"
    init, sft = root / "init", root / "sft"
    root.mkdir(parents=True, exist_ok=True)
    if args.model == "tiny":
        build_tiny_model(init, seed=seed, sliding_window=args.sliding_window)
    else:  # the pretrained weights, the same for every seed (SFT and RL are seeded)
        init = pretrained_model(args.out)
    sft_settings = TrainSettings(
        loss=LossSettings(),
        sft=True,
        lr=args.sft_lr,
        epochs=args.sft_epochs,
        weight_decay=0.0,
        micro_batch_size=args.micro_batch_size,
        mini_batch_size=16,
        seed=seed,
    )
    _say(f"seed {seed}: SFT of {init} on {expert} into {sft}")
    with open(root / "sft.log", "w") as log:
        train(
            TrainJob(model=init, out=sft, chats=expert, settings=sft_settings, progress=False),
            on_metrics=lambda line: print(line, file=log, flush=True),
        )

    def held_out(policy: Path, name: str) -> float:
        rate = measure_heldout(policy, held, root / name, args.harness, args)
        _say(f"seed {seed}: {policy.name} solves {100 * rate:.1f}% of {len(held)} held-out tasks")
        return rate

    before = held_out(sft, "heldout-sft")
    config = LoopConfig(
        out=root / "rl",
        model=sft,
        tasks=args.tasks,
        rounds=args.rounds,
        harness=args.harness,
        n=args.n,
        parallel=args.parallel,
        serve_max_tokens=args.serve_max_tokens,
        train={
            "lr": args.rl_lr,
            "weight_decay": 0.0,
            "micro_batch_size": args.micro_batch_size,
            "seed": seed,
            "keep_optimizer": args.keep_optimizer,
        },
        confdir=args.confdir,
        split="train",
        tasks_per_round=args.tasks_per_round,
        seed=seed,
    )
    state = run_loop(config)
    last = state.rounds[-1]
    final = Path(last.result())
    after = held_out(final, "heldout-rl")
    return SeedResult(
        seed,
        before,
        after,
        [r.mean_reward for r in state.rounds],
        time.monotonic() - started,
        {"sft": behaviour(root / "heldout-sft"), "rl": behaviour(root / "heldout-rl")},
        {"sft": str(sft.relative_to(args.out)), "rl": str(final.relative_to(args.out))},
    )


def _mean(values: list[float | None]) -> float | None:
    """The mean of the defined values (None when none is)."""
    kept = [v for v in values if v is not None]
    return statistics.mean(kept) if kept else None


def behaviour_table(results: list[SeedResult]) -> tuple[dict[str, Any], str]:
    """Held-out behaviour before and after RL, mean of the seeds: (for results.json, a
    Markdown table)."""
    means = {
        stage: {name: _mean([r.behaviour[stage][name] for r in results]) for name in BEHAVIOUR}
        for stage in ("sft", "rl")
    }
    lines = ["| held-out behaviour (mean of seeds) | SFT | SFT+RL |", "|---|---|---|"]
    for name, label in BEHAVIOUR.items():
        cells = [means[stage][name] for stage in ("sft", "rl")]
        lines.append(
            f"| {label} | " + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |"
        )
    return means, "\n".join(lines)


def report(results: list[SeedResult], out: Path, args: argparse.Namespace, wall_s: float) -> str:
    """Write results.json, results.md and curve.png; return the closing line."""
    sft = 100 * statistics.mean(r.sft for r in results)
    rl = 100 * statistics.mean(r.rl for r in results)
    line = f"held-out success: sft={sft:.1f}% sft+rl={rl:.1f}% seeds={len(results)}"
    behaviour_means, behaviour_md = behaviour_table(results)
    data = {
        "sft_heldout_success": sft / 100,
        "rl_heldout_success": rl / 100,
        "heldout_behaviour": behaviour_means,
        "seeds": [r.__dict__ for r in results],
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "wall_s": round(wall_s, 1),
    }
    (out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    rounds = max(len(r.curve) for r in results)
    lines = [
        "| seed | held-out SFT | held-out SFT+RL | "
        + " | ".join(f"round {k}" for k in range(rounds))
        + " |",
        "|---|---|---|" + "---|" * rounds,
    ]
    for r in results:
        curve = " | ".join("-" if m is None else f"{m:.2f}" for m in r.curve)
        lines.append(f"| {r.seed} | {100 * r.sft:.1f}% | {100 * r.rl:.1f}% | {curve} |")
    lines.append(
        f"| mean | {sft:.1f}% | {rl:.1f}% | " + " | ".join("" for _ in range(rounds)) + " |"
    )
    (out / "results.md").write_text(
        "\n".join(lines) + f"\n\nRounds: mean reward of each RL round's rollouts (train tasks). "
        f"Wall time {wall_s / 60:.1f} min.\n\n{behaviour_md}\n\n"
        "Behaviour: the behaviour views (pipeline/sql/360_behaviour.sql) over the held-out "
        "rollouts; '-' where a rate is undefined for every seed (no edits, no plan, no "
        "failed tool result).\n"
    )
    _plot(results, out / "curve.png", args.harness)
    return line


def _plot(results: list[SeedResult], path: Path, harness: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _say("matplotlib is not installed: no curve.png")
        return
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for r in results:
        xs = [k for k, m in enumerate(r.curve) if m is not None]
        ax.plot(xs, [m for m in r.curve if m is not None], marker="o", label=f"seed {r.seed}")
    ax.set_xticks(range(max(len(r.curve) for r in results)))
    ax.set_xlabel("RL round (policy version = round + 1)")
    ax.set_ylabel("mean reward (train tasks)")
    ax.set_ylim(0, 1)
    ax.set_title(f"forge demo-rl: GRPO in the {harness} harness")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _require_harness_cli(harness: str) -> None:
    """Stop before any work when the harness CLI is missing: the rollout runner finds it
    among the pinned CLIs (``make harnesses``) or on PATH."""
    from k8s_jobs.harnesses import resolve_executable

    if resolve_executable(harness) is None:
        raise SystemExit(f"forge demo-rl: {harness} is not installed (make harnesses installs it)")


def parser() -> argparse.ArgumentParser:
    """The demo's options (``python -m rl.demo_rl --help``)."""
    p = argparse.ArgumentParser(
        prog="python -m rl.demo_rl", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument(
        "--harness",
        choices=sorted(HARNESS_HOSTS),
        default="toy",
        help="the harness the expert is recorded in, RL runs in and held-out success is "
        "measured in (codex and claude: the pinned CLIs of .harnesses/)",
    )
    p.add_argument(
        "--model",
        choices=sorted(MODEL_DEFAULTS),
        default="tiny",
        help="the policy: a tiny random Qwen3 (default) or the pretrained SmolLM2-135M-Instruct",
    )
    p.add_argument("--out", type=Path, default=None, help="default data/demo-rl/HARNESS (-smollm2)")
    p.add_argument("--tasks", type=Path, default=DEFAULT_TASKS)
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..S-1 (tiny: 3)")
    p.add_argument("--expert-accuracy", type=float, default=0.35)
    p.add_argument(
        "--expert-tasks", type=int, default=None, help="train tasks the expert records (tiny: 96)"
    )
    p.add_argument("--sft-epochs", type=int, default=None, help="default: the model's recipe")
    p.add_argument("--sft-lr", type=float, default=None, help="default: the model's recipe")
    p.add_argument("--rounds", type=int, default=None, help="RL rounds per seed (tiny: 4)")
    p.add_argument("--tasks-per-round", type=int, default=None, help="(tiny: 6)")
    p.add_argument("-n", type=int, default=None, help="GRPO group size (tiny: 8)")
    p.add_argument("--rl-lr", type=float, default=None, help="default: the model's recipe")
    p.add_argument(
        "--keep-optimizer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="carry the AdamW state from round to round (default; --no-keep-optimizer: a "
        "fresh AdamW each round)",
    )
    p.add_argument("--parallel", type=int, default=None, help="(tiny: 6)")
    p.add_argument(
        "--sliding-window",
        type=int,
        default=None,
        help="the tiny model attends this many tokens back at most (default: full attention "
        "in the toy harness, 64 in a real one)",
    )
    p.add_argument("--serve-max-tokens", type=int, default=48)
    p.add_argument("--heldout", type=int, default=None, help="held-out tasks used (tiny: all 60)")
    p.add_argument("--confdir", type=Path, default=None, help="mitmproxy CA directory")
    p.add_argument(
        "--micro-batch-size",
        type=int,
        default=None,
        help="samples per forward/backward (default: the model's recipe; fewer for a "
        "harness with long prompts)",
    )
    return p


def complete_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the model's and the harness's defaults filled in and checked."""
    for key, value in MODEL_DEFAULTS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.model != "tiny" and args.sliding_window is not None:
        p.error("--sliding-window shapes the tiny model only")
    if args.model == "tiny" and args.sliding_window is None and args.harness != "toy":
        args.sliding_window = 64
    if args.seeds < 1 or args.rounds < 1:
        p.error("--seeds and --rounds must be at least 1")
    name = args.harness if args.model == "tiny" else f"{args.harness}-{args.model}"
    args.out = (args.out or Path("data/demo-rl") / name).resolve()
    args.tasks = args.tasks.resolve()
    return args


def heldout_tasks(args: argparse.Namespace) -> list[Any]:
    """The held-out tasks the demo measures (``--heldout`` of them, in file order)."""
    from k8s_jobs.tasks import load_tasks
    from rl.loop import select_split

    held = select_split(load_tasks(args.tasks), "heldout")
    return held[: args.heldout] if args.heldout else held


def run(args: argparse.Namespace) -> list[SeedResult]:
    """The whole recipe for every seed into ``args.out`` (replaced); writes the report."""
    from k8s_jobs.tasks import load_tasks
    from rl.loop import select_split

    started = time.monotonic()
    if args.harness != "toy":
        _require_harness_cli(args.harness)
    if args.out.exists():
        shutil.rmtree(args.out)
    train = select_split(load_tasks(args.tasks), "train")
    held = heldout_tasks(args)
    chats = record_expert(
        train[: args.expert_tasks],
        args.out,
        args.expert_accuracy,
        0,
        args.parallel,
        args.confdir,
        args.harness,
    )
    results = [run_seed(seed, args, chats, held) for seed in range(args.seeds)]
    wall = time.monotonic() - started
    line = report(results, args.out, args, wall)
    print((args.out / "results.md").read_text())
    print(f"forge demo-rl: {wall / 60:.1f} min; results in {args.out}")
    print(line, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = complete_args(p, p.parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="forge demo-rl: %(message)s")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
