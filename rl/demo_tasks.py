"""The learning demo's task suite: small shell tasks for the ``toy`` harness, each with a
verifier, split into train and held-out tasks.

Every task's workspace holds a ``task.sh`` that does the job when run with bash (and
only describes it with ``--dry-run``); the instruction states the goal, and the verifier
checks the files the job leaves. An agent solves a task by running the script, rather
than reading it, dry-running it or looking around: the habit the demo's expert has only
some of the time (``rl.demo_rl``), and the one RL has to find.

``python -m rl.demo_tasks`` writes ``data/tasks/demo-rl.jsonl`` (seeded: the same file
each time; a test checks the shipped file is current).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "data" / "tasks" / "demo-rl.jsonl"
N_TASKS = 300
N_HELDOUT = 60
SEED = 20261203
TIMEOUT_S = 60

WORDS = [
    "amber",
    "apple",
    "basil",
    "cedar",
    "cloud",
    "coral",
    "delta",
    "ember",
    "fern",
    "frost",
    "garnet",
    "harbor",
    "hazel",
    "iris",
    "jade",
    "juniper",
    "lemon",
    "maple",
    "meadow",
    "mint",
    "nova",
    "olive",
    "onyx",
    "pearl",
    "pine",
    "quartz",
    "raven",
    "river",
    "sage",
    "slate",
    "spruce",
    "stone",
    "tide",
    "topaz",
    "willow",
]
FILES = ("out.txt", "result.txt", "answer.txt", "log.txt", "data.txt", "report.txt")
DIRS = ("build", "logs", "cache", "assets", "tmp", "docs")
SUBDIRS = ("a", "b", "new", "v1", "old", "main", "src", "bin", "lib", "v2", "test", "data")

SCRIPT = """#!/usr/bin/env bash
# {goal}
set -euo pipefail
if [[ "${{1:-}}" == --dry-run ]]; then
  echo "would: {goal}"
  exit 0
fi
{action}
echo "done: {goal}"
"""
PHRASES = (
    "{Goal}. The workspace's task.sh does this.",
    "Please {goal}; use task.sh in the workspace.",
    "{Goal} (task.sh is provided for it).",
    "Your job: {goal}. A script, task.sh, is in the working directory.",
)


def _write(r: random.Random) -> dict[str, Any]:
    word, name = r.choice(WORDS), r.choice(FILES)
    return {
        "kind": "write",
        "goal": f"write the word {word} to {name}",
        "action": f"printf '%s\\n' {word} > {name}",
        "verify": f'test "$(cat {name} 2>/dev/null)" = {word}',
    }


def _count(r: random.Random) -> dict[str, Any]:
    n, name = r.randint(3, 40), r.choice(FILES)
    return {
        "kind": "count",
        "goal": f"list the numbers 1 to {n} in {name}, one per line",
        "action": f"seq 1 {n} > {name}",
        "verify": f'test "$(seq 1 {n})" = "$(cat {name} 2>/dev/null)"',
    }


def _sum(r: random.Random) -> dict[str, Any]:
    a, b, name = r.randint(2, 500), r.randint(2, 500), r.choice(FILES)
    return {
        "kind": "sum",
        "goal": f"store the sum of {a} and {b} in {name}",
        "action": f"echo $(( {a} + {b} )) > {name}",
        "verify": f'test "$(cat {name} 2>/dev/null)" = {a + b}',
    }


def _mkdir(r: random.Random) -> dict[str, Any]:
    path = f"{r.choice(DIRS)}/{r.choice(SUBDIRS)}"
    return {
        "kind": "mkdir",
        "goal": f"create the directory {path}",
        "action": f"mkdir -p {path}",
        "verify": f"test -d {path}",
    }


def _copy(r: random.Random) -> dict[str, Any]:
    source, dest = f"{r.choice(WORDS)}.txt", r.choice(FILES)
    text = " ".join(r.sample(WORDS, 4)) + "\n"
    return {
        "kind": "copy",
        "goal": f"copy {source} to {dest}",
        "action": f"cp {source} {dest}",
        "verify": f"cmp -s {source} {dest}",
        "files": {source: text},
    }


def _upper(r: random.Random) -> dict[str, Any]:
    word, source, dest = r.choice(WORDS), f"{r.choice(WORDS)}.txt", r.choice(FILES)
    return {
        "kind": "upper",
        "goal": f"write the word in {source} in capitals to {dest}",
        "action": f"tr a-z A-Z < {source} > {dest}",
        "verify": f'test "$(cat {dest} 2>/dev/null)" = {word.upper()}',
        "files": {source: word + "\n"},
    }


KINDS: tuple[Callable[[random.Random], dict[str, Any]], ...] = (
    _write,
    _count,
    _sum,
    _mkdir,
    _copy,
    _upper,
)


def normalise(instruction: str) -> str:
    """An instruction compared as words: lower case, punctuation and spacing dropped."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", instruction.lower()).split())


def make_tasks(
    n: int = N_TASKS, heldout: int = N_HELDOUT, seed: int = SEED
) -> list[dict[str, Any]]:
    """``n`` task specs (``k8s_jobs.tasks`` format), the last ``heldout`` of a seeded
    shuffle marked ``metadata.split = heldout``, the rest ``train``.

    Every task has its own goal, so no two tasks share a normalised instruction or a
    solution (``task.sh``): a held-out task is never a train task reworded, nor one whose
    answer a policy saw in training."""
    r = random.Random(seed)
    tasks: list[dict[str, Any]] = []
    goals: set[str] = set()
    for i in range(n):
        for _ in range(10_000):  # bounded: each kind has more goals than tasks
            job = KINDS[i % len(KINDS)](r)
            if job["goal"] not in goals:
                break
        else:
            raise ValueError(f"no new {job['kind']} goal left for task {i}")
        goal = job["goal"]
        goals.add(goal)
        instruction = r.choice(PHRASES).format(goal=goal, Goal=goal[0].upper() + goal[1:])
        files = {"task.sh": SCRIPT.format(goal=goal, action=job["action"]), **job.get("files", {})}
        tasks.append(
            {
                "id": f"{job['kind']}-{i:03d}",
                "instruction": instruction,
                "harness": "toy",
                "timeout": TIMEOUT_S,
                "workspace": {"files": files},
                "verifier": {"command": job["verify"]},
                "metadata": {"kind": job["kind"], "split": "train"},
            }
        )
    order = list(range(n))
    r.shuffle(order)
    for i in order[n - heldout :]:
        tasks[i]["metadata"]["split"] = "heldout"
    return tasks


def to_jsonl(tasks: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(t, sort_keys=True) + "\n" for t in tasks)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rl.demo_tasks", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    tasks = make_tasks()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(to_jsonl(tasks))
    held = sum(t["metadata"]["split"] == "heldout" for t in tasks)
    print(f"{args.out}: {len(tasks)} tasks ({len(tasks) - held} train, {held} held-out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
