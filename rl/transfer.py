"""``make transfer``: policies trained in one harness, measured in every harness.

Does a policy trained in one harness work in another, and which harness is easiest to
learn?

For each harness A of ``--harnesses`` (default toy, codex, claude), the learning demo's
recipe (``rl.demo_rl``) runs in A: a sloppy expert recorded through A, SFT on its chats,
GRPO rounds in A's serve mode, held-out success through A. Every harness gets the same
model (the tiny Qwen3 with a ``--sliding-window`` of 64 tokens), the same tasks and the
same sizes. Then every seed's SFT and SFT+RL checkpoints from A are measured on the same
held-out tasks through each other harness B. It writes, under ``--out``:

- ``results.json``: the settings, held-out success for every (trained in, evaluated in,
  stage, seed), each harness's learning curve and held-out behaviour before and after RL;
- ``results.md``: the transfer table (SFT+RL, with SFT alone beside it), the curves and
  the behaviour;
- ``learnability.png``: the mean reward of each RL round, one line per harness.

``--reuse`` keeps a harness's finished demo (``OUT/A/results.json`` with the same
settings) instead of training again; a stopped cross-harness run is resumed.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl import demo_rl

HARNESSES = ("toy", "codex", "claude")
STAGES = ("sft", "rl")
# The demo's options that define the recipe; a reused run must match them all.
RECIPE = (
    "model", "seeds", "expert_accuracy", "expert_tasks", "sft_epochs", "sft_lr", "rounds",
    "tasks_per_round", "n", "rl_lr", "keep_optimizer", "serve_max_tokens", "heldout",
    "sliding_window", "micro_batch_size",
)  # fmt: skip


@dataclass(frozen=True)
class Trained:
    """One harness's finished demo: its settings and per-seed results (``results.json``)."""

    harness: str
    out: Path
    results: dict[str, Any]

    @property
    def seeds(self) -> list[dict[str, Any]]:
        return list(self.results["seeds"])


def _say(message: str) -> None:
    print(f"forge transfer: {message}", file=sys.stderr, flush=True)


def demo_args(harness: str, args: argparse.Namespace) -> argparse.Namespace:
    """The learning demo's options for ``harness`` under this run's recipe."""
    p = demo_rl.parser()
    argv = ["--harness", harness, "--out", str(args.out / harness)]
    for name in RECIPE:
        value = getattr(args, name)
        if value is None or name == "keep_optimizer":
            continue
        argv += [f"--{name.replace('_', '-')}" if name != "n" else "-n", str(value)]
    argv += ["--keep-optimizer" if args.keep_optimizer else "--no-keep-optimizer"]
    if args.parallel is not None:
        argv += ["--parallel", str(args.parallel)]
    if args.confdir is not None:
        argv += ["--confdir", str(args.confdir)]
    return demo_rl.complete_args(p, p.parse_args(argv))


def _recipe(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: settings.get(k) for k in RECIPE}


def train_in(harness: str, args: argparse.Namespace) -> Trained:
    """The demo's recipe in ``harness`` (or its earlier run, with ``--reuse``)."""
    dargs = demo_args(harness, args)
    results_file = dargs.out / "results.json"
    wanted = _recipe({k: v for k, v in vars(dargs).items()})
    if args.reuse and results_file.is_file():
        done = json.loads(results_file.read_text())
        if _recipe(done["settings"]) == wanted:
            _say(f"{harness}: reusing {results_file}")
            return Trained(harness, dargs.out, done)
        _say(f"{harness}: {results_file} has other settings; training again")
    _say(f"{harness}: the demo's recipe into {dargs.out}")
    demo_rl.run(dargs)
    return Trained(harness, dargs.out, json.loads(results_file.read_text()))


def evaluate_elsewhere(
    trained: Trained, harness: str, held: list[Any], args: argparse.Namespace
) -> dict[str, list[float]]:
    """Held-out success through ``harness`` of each seed's checkpoints from ``trained``:
    {stage: [success per seed]} (the demo's own figures where ``harness`` is its own)."""
    if harness == trained.harness:
        return {stage: [float(s[stage]) for s in trained.seeds] for stage in STAGES}
    dargs = demo_args(trained.harness, args)
    out: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for seed in trained.seeds:
        for stage in STAGES:
            policy = trained.out / seed["policies"][stage]
            run_dir = trained.out / f"seed-{seed['seed']}" / f"in-{harness}-{stage}"
            rate = demo_rl.measure_heldout(policy, held, run_dir, harness, dargs)
            _say(
                f"trained in {trained.harness}, seed {seed['seed']}, {stage}: "
                f"{100 * rate:.1f}% of {len(held)} held-out tasks through {harness}"
            )
            out[stage].append(rate)
    return out


def mean_curve(trained: Trained) -> list[float | None]:
    """Mean reward of each RL round over the seeds (None where no seed has one)."""
    curves = [s["curve"] for s in trained.seeds]
    rounds = max(len(c) for c in curves)
    out: list[float | None] = []
    for k in range(rounds):
        values = [c[k] for c in curves if k < len(c) and c[k] is not None]
        out.append(statistics.mean(values) if values else None)
    return out


def table(matrix: dict[str, dict[str, dict[str, list[float]]]], harnesses: list[str]) -> str:
    """The transfer table in Markdown: rows trained in, columns evaluated in; each cell
    SFT+RL, with SFT alone in brackets (means over seeds)."""
    lines = [
        "| trained in \\ evaluated in | " + " | ".join(harnesses) + " |",
        "|---|" + "---|" * len(harnesses),
    ]
    for a in harnesses:
        cells = []
        for b in harnesses:
            rl = 100 * statistics.mean(matrix[a][b]["rl"])
            sft = 100 * statistics.mean(matrix[a][b]["sft"])
            cell = f"{rl:.1f}% (SFT {sft:.1f}%)"
            cells.append(f"**{cell}**" if a == b else cell)
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def behaviour_lines(trained: dict[str, Trained]) -> str:
    """Held-out behaviour in each harness's own runs, before and after RL."""
    names = list(demo_rl.BEHAVIOUR)
    lines = [
        "| harness | stage | " + " | ".join(demo_rl.BEHAVIOUR[n] for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for h, t in trained.items():
        for stage, label in (("sft", "SFT"), ("rl", "SFT+RL")):
            row = t.results["heldout_behaviour"][stage]
            cells = ["-" if row[n] is None else f"{row[n]:.2f}" for n in names]
            lines.append(f"| {h} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_learnability(trained: dict[str, Trained], path: Path) -> bool:
    """Mean reward per RL round, one line per harness (seeds faint); False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _say("matplotlib is not installed: no learnability.png")
        return False
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for k, (h, t) in enumerate(trained.items()):
        colour = f"C{k}"
        for s in t.seeds:
            xs = [i for i, m in enumerate(s["curve"]) if m is not None]
            ys = [m for m in s["curve"] if m is not None]
            ax.plot(xs, ys, color=colour, alpha=0.25, linewidth=1)
        mean = mean_curve(t)
        xs = [i for i, m in enumerate(mean) if m is not None]
        ax.plot(xs, [m for m in mean if m is not None], color=colour, marker="o", label=h)
    rounds = max(len(mean_curve(t)) for t in trained.values())
    ax.set_xticks(range(rounds))
    ax.set_xlabel("RL round")
    ax.set_ylabel("mean reward (train tasks)")
    ax.set_ylim(0, 1)
    ax.set_title("One recipe in each harness (mean of seeds; seeds faint)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def report(
    trained: dict[str, Trained],
    matrix: dict[str, dict[str, dict[str, list[float]]]],
    args: argparse.Namespace,
    wall_s: float,
) -> str:
    """Write results.json, results.md and learnability.png; return the table."""
    harnesses = list(trained)
    md = table(matrix, harnesses)
    data = {
        "transfer": matrix,
        "transfer_mean": {
            a: {b: {st: statistics.mean(v) for st, v in cell.items()} for b, cell in row.items()}
            for a, row in matrix.items()
        },
        "curves": {h: [s["curve"] for s in t.seeds] for h, t in trained.items()},
        "mean_curves": {h: mean_curve(t) for h, t in trained.items()},
        "heldout_behaviour": {h: t.results["heldout_behaviour"] for h, t in trained.items()},
        "demo_wall_s": {h: t.results["wall_s"] for h, t in trained.items()},
        "settings": {
            "harnesses": harnesses,
            "recipe": _recipe(vars(demo_args(harnesses[0], args))),
            "parallel": args.parallel,
            "demo_settings": {h: t.results["settings"] for h, t in trained.items()},
        },
        "wall_s": round(wall_s, 1),
    }
    (args.out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    curves = [
        f"| {h} | " + " | ".join("-" if m is None else f"{m:.2f}" for m in mean_curve(t)) + " |"
        for h, t in trained.items()
    ]
    rounds = max(len(mean_curve(t)) for t in trained.values())
    (args.out / "results.md").write_text(
        f"{md}\n\nHeld-out success (mean of {args.seeds} seeds): the policy trained in the "
        "row's harness, measured through the column's. Bold: the harness it was trained in.\n\n"
        "| mean reward by RL round | " + " | ".join(str(k) for k in range(rounds)) + " |\n"
        "|---|" + "---|" * rounds + "\n" + "\n".join(curves) + "\n\n"
        f"{behaviour_lines(trained)}\n\nWall time {wall_s / 60:.1f} min.\n"
    )
    plot_learnability(trained, args.out / "learnability.png")
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rl.transfer", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument(
        "--harnesses",
        default=",".join(HARNESSES),
        help=f"comma-separated, of {', '.join(HARNESSES)} (default: all three)",
    )
    p.add_argument("--out", type=Path, default=Path("data/transfer"))
    p.add_argument("--reuse", action="store_true", help="keep finished demos with equal settings")
    p.add_argument(
        "--model",
        choices=sorted(demo_rl.MODEL_DEFAULTS),
        default="tiny",
        help="the policy (the recipe options below default to the demo's for it)",
    )
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--expert-accuracy", type=float, default=0.35)
    p.add_argument("--expert-tasks", type=int, default=None)
    p.add_argument("--sft-epochs", type=int, default=None)
    p.add_argument("--sft-lr", type=float, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--tasks-per-round", type=int, default=None)
    p.add_argument("-n", type=int, default=None)
    p.add_argument("--rl-lr", type=float, default=None)
    p.add_argument("--keep-optimizer", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--serve-max-tokens", type=int, default=48)
    p.add_argument("--heldout", type=int, default=None)
    p.add_argument(
        "--sliding-window",
        type=int,
        default=None,
        help="the tiny model's attention window in every harness (default 64)",
    )
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--parallel", type=int, default=None)
    p.add_argument("--confdir", type=Path, default=None, help="mitmproxy CA directory")
    args = p.parse_args(argv)
    if args.model == "tiny" and args.sliding_window is None:
        args.sliding_window = 64  # one model for every harness: the real harnesses' default
    harnesses = [h.strip() for h in args.harnesses.split(",") if h.strip()]
    unknown = [h for h in harnesses if h not in HARNESSES]
    if unknown or not harnesses or len(set(harnesses)) != len(harnesses):
        p.error(f"--harnesses takes distinct names of {', '.join(HARNESSES)}, not {args.harnesses}")
    logging.basicConfig(level=logging.INFO, format="forge transfer: %(message)s")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    first = demo_args(harnesses[0], args)  # the model's defaults, filled in once
    for name in RECIPE:
        setattr(args, name, getattr(first, name))
    args.parallel = first.parallel
    started = time.monotonic()
    trained = {h: train_in(h, args) for h in harnesses}
    held = demo_rl.heldout_tasks(first)
    matrix = {
        a: {b: evaluate_elsewhere(trained[a], b, held, args) for b in harnesses} for a in harnesses
    }
    report(trained, matrix, args, time.monotonic() - started)
    print((args.out / "results.md").read_text())
    print(f"forge transfer: results in {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
