"""``make demo``: record a harness with Forge, then stitch, reward, group, snapshot and query;
then a short training loop.

No LLM is reachable from a machine without internet, so a scripted provider stands
in for api.openai.com (it speaks the real Chat Completions wire format). The toy
harness (``k8s_jobs/toy_harness.py``, an ordinary openai-SDK program) runs unmodified under
``forge record``: two tasks, two rollouts each. A verifier checks each rollout's work
and writes its reward; then the pipeline's DuckDB views give trees, trajectories and
GRPO groups, and a snapshot is written.

The loop, short (``short_loop``): a sloppy scripted expert is recorded over 96 tasks of
the learning demo's suite, a tiny Qwen3 (built locally) is trained with SFT on its chats,
and ``forge loop`` runs two rounds of collect (the toy harness in serve mode, answered by
that policy), snapshot, one GRPO step and publish, the second round collecting with the
policy the first one trained. The curve prints each round's mean reward and what its
step did; ``make demo-rl`` measures held-out success.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from pipeline.store import connect

# (task id, instruction, file the verifier expects to hold "hi")
TASKS = [
    ("hello", "Create hello.txt containing hi.", "hello.txt"),
    ("greeting", "Create greeting.txt containing hi.", "greeting.txt"),
]
ROLLOUTS_PER_TASK = 2
QUERIES = {
    "trajectories": """
        SELECT rollout_id, task_id, status, reward, n_calls, depth, fan_out, n_agents, tokens_in, tokens_out
        FROM trajectories ORDER BY rollout_id""",
    "GRPO groups (advantage = (reward - mean) / std, gamma = 1)": """
        SELECT group_id, rollout_id, reward, round(advantage, 3) AS advantage, included, drop_reason
        FROM groups ORDER BY group_id, rollout_id""",
    "storage: content-addressed vs logging every request": """
        SELECT (SELECT sum(content_bytes) FROM messages) AS stored_bytes,
               (SELECT sum(request_bytes) FROM calls) AS raw_request_bytes""",
}


class ScriptedExpert:
    """Consult a helper process, then write hello.txt (right for one task, wrong for the
    other on every second rollout), then finish: groups with a spread of rewards."""

    def __init__(self) -> None:
        self._episodes = itertools.count()
        self._lock = threading.Lock()

    def __call__(self, conv: Any) -> Any:
        if conv.tool_results == 0:
            return {"tool_call": {"name": "consult", "arguments": {"question": "Which file?"}}}
        if conv.tool_results == 1:
            with self._lock:
                episode = next(self._episodes)
            task = str(conv.history[1].get("content", "")) if len(conv.history) > 1 else ""
            name = "hello.txt" if episode % 2 == 0 else task.split()[1] if task else "hello.txt"
            return {"tool_call": {"name": "shell", "arguments": {"command": f"echo hi > {name}"}}}
        return {"text": "Done: the file is written."}


def forge(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    """Run a forge command the way a user would, echoing it."""
    print(f"\n$ forge {' '.join(args)}", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "forge_cli.main", *args], cwd=cwd, env=env, timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"forge demo: `forge {args[0]}` failed with exit code {done.returncode}")


def show(con: Any, title: str, sql: str) -> None:
    print(f"\n-- {title}")
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    rows = cur.fetchall()
    widths = [max(len(str(x)) for x in [n, *[r[i] for r in rows]]) for i, n in enumerate(names)]
    print("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)))
    for r in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="forge-demo", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("--out", type=Path, default=Path("data/runs/demo"))
    p.add_argument("--snapshot", type=Path, default=Path("data/snapshots/demo"))
    p.add_argument("--loop", type=Path, default=Path("data/loop/make-demo"))
    p.add_argument("--no-loop", action="store_true", help="stop after the snapshot")
    args = p.parse_args(argv)
    from tests.support.upstream import ScriptedUpstream  # the scripted provider

    out, snapshot, loop = args.out.resolve(), args.snapshot.resolve(), args.loop.resolve()
    for old in (out, snapshot, loop):
        if old.exists():
            shutil.rmtree(old)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["OPENAI_API_KEY"] = "sk-demo-not-a-real-key"
    with ScriptedUpstream(ScriptedExpert(), side_text="It should hold the word hi.") as provider:
        print(f"forge demo: scripted provider for api.openai.com on {provider.base_url}")
        for (task_id, instruction, expected), n in itertools.product(
            TASKS, range(ROLLOUTS_PER_TASK)
        ):
            rollout = f"{task_id}-{n}"
            work = Path(tempfile.mkdtemp(prefix=f"forge-demo-{rollout}-"))
            forge(
                "record",
                "--out",
                str(out),
                "--rollout",
                rollout,
                "--task",
                task_id,
                "--harness",
                "toy",
                "--upstream",
                f"api.openai.com={provider.base_url}",
                "--",
                sys.executable,
                "-m",
                "k8s_jobs.toy_harness",
                instruction,
                cwd=work,
                env=env,
            )
            # The verifier: did the harness write the file the task asked for?
            target = work / expected
            ok = target.exists() and target.read_text().strip() == "hi"
            forge(
                "reward",
                "--data",
                str(out),
                "--rollout",
                rollout,
                "--reward",
                "1" if ok else "0",
                "--source",
                "demo verifier",
            )
            shutil.rmtree(work, ignore_errors=True)
    forge("tree", "--data", str(out), "--rollout", "hello-0")
    forge("view", "--data", str(out))
    con = connect(out, stitched=True)
    for title, sql in QUERIES.items():
        show(con, title, sql)
    forge("eval", "--data", str(out), "--k", "1,2")
    forge("snapshot", "--data", str(out), "--out", str(snapshot))
    print(f"\nforge demo: recorded run in {out}; snapshot in {snapshot}; pages in {out / 'view'}")
    if not args.no_loop:
        short_loop(loop, env)
    print(f'Try: .venv/bin/forge sql --data {args.out} "select * from edges"')
    return 0


# The short loop's tasks: train tasks of the learning demo's suite (rl/demo_tasks.py).
DEMO_RL_TASKS = Path(__file__).resolve().parent.parent / "data" / "tasks" / "demo-rl.jsonl"
EXPERT_TASKS = 96  # recorded by the sloppy expert, for SFT (as make demo-rl does)


def short_loop(loop: Path, env: dict[str, str]) -> None:
    """A habit learned in two rounds, at the smallest size that learns.

    A sloppy scripted expert (it runs the task's script 35% of the time, else reads it,
    dry-runs it or lists the files) is recorded over 96 train tasks of
    ``data/tasks/demo-rl.jsonl``; a tiny Qwen3 trained on those chats copies its habits,
    so its rollouts of one task differ, some pass and some fail. ``forge loop`` then
    runs two GRPO rounds: each group's spread of rewards gives advantages, the step moves
    the weights (its gradient norm is on the curve), and round 1 samples from the policy
    round 0 trained. ``make demo-rl`` measures what this does to held-out success."""
    from rl.demo_rl import ExpertScript
    from tests.support.upstream import ScriptedUpstream  # the scripted provider

    lines = [line for line in DEMO_RL_TASKS.read_text().splitlines() if line.strip()]
    train = [line for line in lines if json.loads(line)["metadata"]["split"] == "train"]
    loop.mkdir(parents=True)
    expert_tasks, loop_tasks = loop / "expert-tasks.jsonl", loop / "loop-tasks.jsonl"
    expert_tasks.write_text("\n".join(train[:EXPERT_TASKS]) + "\n")
    loop_tasks.write_text("\n".join(train[EXPERT_TASKS:]) + "\n")  # 3 a round, 6 rollouts each
    with ScriptedUpstream(ExpertScript(accuracy=0.35, seed=0)) as provider:
        forge(
            "rollout", "--tasks", str(expert_tasks), "--harness", "toy", "--parallel", "4",
            "--out", str(loop / "expert"), "--upstream", f"api.openai.com={provider.base_url}",
            env=env,
        )  # fmt: skip
    models = loop / "models"
    forge("init-model", "--tiny", "--out", str(models / "init"))
    forge("export", "sft", "--data", str(loop / "expert"), "--out", str(loop / "sft.parquet"))
    forge(
        "train", "--sft", "--chats", str(loop / "sft.parquet"), "--model", str(models / "init"),
        "--out", str(models / "sft"), "--lr", "1e-2", "--epochs", "10", "--weight-decay", "0",
        "--micro-batch-size", "16", "--mini-batch-size", "16", "--no-progress",
    )  # fmt: skip
    config = {
        "out": str(loop / "rl"),
        "model": str(models / "sft"),
        "tasks": str(loop_tasks),
        "harness": "toy",
        "rounds": 2,
        "tasks_per_round": 3,
        "n": 6,
        "parallel": 4,
        "serve_max_tokens": 48,
        "max_staleness": 0,  # round 1 samples from the policy round 0 trained
        "train": {"lr": 1e-3, "weight_decay": 0.0, "micro_batch_size": 16, "keep_optimizer": True},
    }
    (loop / "loop.yaml").write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    forge("loop", "--config", str(loop / "loop.yaml"), env=env)
    curve = [json.loads(line) for line in (loop / "rl" / "curve.jsonl").read_text().splitlines()]
    print(f"\n-- learning curve ({loop / 'rl' / 'curve.jsonl'})")
    print("round  policy  rollouts  mean reward  samples  loss     grad norm")
    for c in curve:
        loss = "-" if c["loss"] is None else f"{c['loss']:+.4f}"
        grad = "-" if c["grad_norm"] is None else f"{c['grad_norm']:.4f}"
        reward = "-" if c["mean_reward"] is None else f"{c['mean_reward']:.3f}"
        print(
            f"{c['round']:<6} v{c['policy_version']:<6} {c['rollouts']:<9} {reward:<12} "
            f"{c['samples']:<8} {loss:<8} {grad}"
        )
    print(
        "Each round's groups had a spread of rewards (samples > 0), so its step moved the "
        "weights (grad norm > 0);\ntwo rounds are too few to read a trend: make demo-rl "
        "measures held-out success over 4 rounds and 3 seeds."
        if all(c["samples"] and c["grad_norm"] for c in curve)
        else "A round had no spread of rewards and trained nothing (grad norm -)."
    )


if __name__ == "__main__":
    sys.exit(main())
