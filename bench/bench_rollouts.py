"""Rollouts per minute on the local backend, against the same harness run bare.

    python -m bench.bench_rollouts                 # quick: 2 tasks x 4 rollouts, 4 at a time
    python -m bench.bench_rollouts --tasks 8 -n 4 --parallel 8   # the issue's 32 at 8

Both sides run the toy harness (``k8s_jobs/toy_harness.py``, the openai SDK in a subprocess) on
the same file-writing tasks against one scripted provider (``tests/support/upstream.py``,
the Chat Completions wire format) at the same parallelism:

* ``forge``: ``k8s_jobs.run_rollouts``: one Forge proxy recording every call, a fresh
  workdir and HOME per rollout, process-group deadlines, the verifier, rollouts and
  rewards rows;
* ``bare``: the same harness processes talking to the provider directly
  (``OPENAI_BASE_URL``), no proxy, no verifier, nothing recorded.

The bare side runs first. Figures: ``rollouts.per_minute`` (Forge),
``rollouts.bare_per_minute``, ``rollouts.ratio_vs_bare`` (Forge's throughput over the bare
one) and ``rollouts.cpu_s_per_rollout`` / ``rollouts.bare_cpu_s_per_rollout`` (CPU seconds of
this process and its children per rollout: proxy, harnesses, verifiers; steadier than wall
time on a shared machine), recorded in bench/results.json unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import results
from k8s_jobs import RolloutOptions, parse_tasks, run_rollouts
from tests.support.toy_agent import toy_agent
from tests.support.upstream import ScriptedUpstream

OUT_DIR = results.BENCH_DIR / "out" / "rollouts"


def cpu_s() -> float:
    """CPU seconds (user + system) of this process and its waited-for children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def task_lines(n_tasks: int) -> str:
    return "\n".join(
        json.dumps(
            {
                "id": f"write-{i}",
                "instruction": f"Create f{i}.txt containing hi.",
                "timeout": 300,
                "verifier": f'test "$(cat f{i}.txt)" = hi',
            }
        )
        for i in range(n_tasks)
    )


def run_forge(base_url: str, n_tasks: int, n: int, parallel: int, work: Path) -> dict[str, Any]:
    tasks = parse_tasks(task_lines(n_tasks), "bench.jsonl")
    cpu = cpu_s()
    summary = run_rollouts(
        tasks,
        RolloutOptions(
            out_dir=work / "run",
            harness="toy",
            n=n,
            parallel=parallel,
            upstreams=[f"api.openai.com={base_url}"],
            confdir=work / "conf",
            work_root=work / "rollouts",
        ),
    )
    statuses = sorted({r.status for r in summary.results})
    return {
        "rollouts": len(summary.results),
        "wall_s": summary.wall_s,
        "per_minute": summary.per_minute,
        "cpu_s": cpu_s() - cpu,
        "statuses": statuses,
        "mean_reward": summary.mean_reward,
    }


def run_bare(
    openai_base_url: str, n_tasks: int, n: int, parallel: int, work: Path
) -> dict[str, Any]:
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "OPENAI_BASE_URL": openai_base_url,
        "OPENAI_API_KEY": "sk-bench-dummy",
        "PYTHONPATH": str(results.BENCH_DIR.parent),
        "LANG": "C.UTF-8",
    }

    def one(i: int) -> int:
        task = i // n
        cwd = work / "bare" / str(i)
        cwd.mkdir(parents=True)
        argv = [sys.executable, "-m", "k8s_jobs.toy_harness", f"Create f{task}.txt containing hi."]
        # A session of its own, as the runner gives each harness: with Linux's scheduler
        # autogroups each session gets a fair CPU share, so anything else would skew wall time.
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env | {"HOME": str(cwd)},
            capture_output=True,
            timeout=300,
            start_new_session=True,
        )
        return done.returncode

    started, cpu = time.monotonic(), cpu_s()
    with ThreadPoolExecutor(parallel) as pool:
        codes = list(pool.map(one, range(n_tasks * n)))
    wall, cpu = time.monotonic() - started, cpu_s() - cpu
    return {
        "rollouts": len(codes),
        "wall_s": wall,
        "per_minute": 60.0 * len(codes) / wall,
        "cpu_s": cpu,
        "exit_codes": sorted(set(codes)),
    }


def render(
    forge: dict[str, Any], bare: dict[str, Any], parallel: int
) -> tuple[dict[str, float], str]:
    ratio = forge["per_minute"] / bare["per_minute"] if bare["per_minute"] else 0.0
    figures = {
        "rollouts.per_minute": round(forge["per_minute"], 2),
        "rollouts.bare_per_minute": round(bare["per_minute"], 2),
        "rollouts.ratio_vs_bare": round(ratio, 3),
        "rollouts.cpu_s_per_rollout": round(forge["cpu_s"] / forge["rollouts"], 3),
        "rollouts.bare_cpu_s_per_rollout": round(bare["cpu_s"] / max(bare["rollouts"], 1), 3),
    }
    table = "\n".join(
        [
            f"| side (toy harness, parallel {parallel}) | rollouts | wall s | rollouts/min "
            "| CPU s/rollout |",
            "| --- | ---: | ---: | ---: | ---: |",
            f"| forge rollout (proxy, recording, verifier) | {forge['rollouts']} | "
            f"{forge['wall_s']:.1f} | {forge['per_minute']:.1f} | "
            f"{figures['rollouts.cpu_s_per_rollout']:.2f} |",
            f"| bare harness, direct to the provider | {bare['rollouts']} | "
            f"{bare['wall_s']:.1f} | {bare['per_minute']:.1f} | "
            f"{figures['rollouts.bare_cpu_s_per_rollout']:.2f} |",
            f"| ratio forge / bare | | | {ratio:.2f} | |",
        ]
    )
    return figures, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_rollouts", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", type=int, default=2, help="tasks (default 2)")
    parser.add_argument("-n", type=int, default=4, help="rollouts per task (default 4)")
    parser.add_argument("--parallel", type=int, default=4, help="rollouts at once (default 4)")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare-harness baseline")
    parser.add_argument(
        "--results",
        type=Path,
        default=results.BENCH_DIR,
        help="folder of results.json and results.md to update (default: bench/)",
    )
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if min(args.tasks, args.n, args.parallel) < 1:
        parser.error("--tasks, -n and --parallel must be at least 1")
    OUT_DIR.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rollouts-", dir=OUT_DIR.parent))
    try:
        with ScriptedUpstream(toy_agent) as up:
            bare = (
                {"rollouts": 0, "wall_s": 0.0, "per_minute": 0.0, "cpu_s": 0.0}
                if args.no_bare
                else run_bare(up.openai_base_url, args.tasks, args.n, args.parallel, work)
            )
            forge = run_forge(up.base_url, args.tasks, args.n, args.parallel, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if forge["statuses"] != ["complete"] or forge["mean_reward"] != 1.0:
        print(f"bench_rollouts: rollouts did not all succeed: {forge}", file=sys.stderr)
        return 1
    figures, table = render(forge, bare, args.parallel)
    if args.no_bare:
        figures = {k: v for k, v in figures.items() if "bare" not in k}
    print(table)
    print(json.dumps(figures, indent=2))
    if not args.no_record:
        results.record(
            "rollouts",
            figures,
            table,
            {"forge": forge, "bare": bare, "parallel": args.parallel, "cpus": os.cpu_count()},
            command=results.command_line("bench.bench_rollouts", argv),
            json_path=args.results / "results.json",
            md_path=args.results / "results.md",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
