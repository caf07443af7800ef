"""``make demo``: record a harness with Forge, then stitch, reward, group, snapshot and query;
then a short training loop.

No LLM is reachable from a machine without internet, so a scripted provider stands
in for api.openai.com (it speaks the real Chat Completions wire format). The toy
harness (``k8s_jobs/toy_harness.py``, an ordinary openai-SDK program) runs unmodified under
``forge record``: two tasks, two rollouts each. A verifier checks each rollout's work
and writes its reward; then the pipeline's DuckDB views give trees, trajectories and
GRPO groups, and a snapshot is written.

The loop, short: a tiny Qwen3 (built locally) is trained with SFT on the recorded chats,
then ``forge loop`` runs two rounds of collect (the toy harness in serve mode, answered by
that policy), snapshot, one GRPO step and publish, the second round collecting with the
policy the first one trained. Two CPU minutes of training teach a tiny model little:
this shows the machinery; ``make demo-rl`` shows learning.
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
        short_loop(out, loop)
    print(f'Try: .venv/bin/forge sql --data {args.out} "select * from edges"')
    return 0


def short_loop(run: Path, loop: Path) -> None:
    """SFT a tiny policy on the recorded chats, then two rounds of ``forge loop``."""
    models = loop / "models"
    forge("init-model", "--tiny", "--out", str(models / "init"))
    forge("export", "sft", "--data", str(run), "--out", str(loop / "sft.parquet"))
    forge(
        "train", "--sft", "--chats", str(loop / "sft.parquet"), "--model", str(models / "init"),
        "--out", str(models / "sft"), "--lr", "1e-2", "--epochs", "8", "--no-progress",
    )  # fmt: skip
    config = {
        "out": str(loop),
        "model": str(models / "sft"),
        "tasks": str(Path(__file__).resolve().parent.parent / "data" / "tasks" / "demo.jsonl"),
        "harness": "toy",
        "rounds": 2,
        "n": 4,
        "parallel": 4,
        "serve_max_tokens": 48,
        # A barely trained policy mostly fails: keep groups without a spread of rewards
        # (their advantages are 0) so that each round takes its step.
        "grpo": {"zero_spread": "keep", "partial": "zero"},
        "train": {"lr": 1e-3},
    }
    (loop / "loop.yaml").write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    forge("loop", "--config", str(loop / "loop.yaml"))
    print(f"\n-- learning curve ({loop / 'curve.jsonl'})")
    print((loop / "curve.jsonl").read_text(), end="")


if __name__ == "__main__":
    sys.exit(main())
