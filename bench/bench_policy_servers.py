"""Serve-mode rollouts per minute: vLLM against ``forge serve-policy``, same tasks, same run.

    python -m bench.bench_policy_servers            # 2 tasks x 8 rollouts, 4 at a time
    python -m bench.bench_policy_servers --tasks 4 -n 8 --parallel 8

Both sides serve the same policy, a tiny Qwen3 scripted to answer every conversation with
one tool call (``forge init-model --tiny --reply``), to the toy harness in serve mode
through ``rl.loop.serve_and_run``, as ``forge loop`` collects a round:

* ``forge``: the embedded policy server (``forge serve-policy``'s engine), started for
  the round as the loop does with ``policy_server: forge``;
* ``vllm``: one ``vllm serve`` (vLLM's CPU build from ``.venv-vllm``, ``make vllm-setup``;
  ``FORGE_VLLM_PYTHON`` for another), started once, as the loop does with
  ``policy_server: vllm``; its start-up is reported apart, not counted in the rate.

The forge side runs first, then vLLM, then the same checkpoint is published into the
running engine as version 1 (``rl.policy.vllm.VLLMServer.publish``: pause, reload, reset
the prefix cache, resume) and timed. Every rollout must succeed on both sides (the scripted
reply solves the task, and the policy repeats it until the toy harness is out of turns,
so every rollout is the same number of served calls), so the rates compare the same work. Figures
``policy_servers.{forge,vllm}_per_minute``, ``policy_servers.vllm_ratio_vs_forge``,
``policy_servers.vllm_start_s`` and ``policy_servers.publish_s``, recorded in
bench/results.json unless ``--no-record``. Not part of ``bench.run_all``: it needs vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import results

OUT_DIR = results.BENCH_DIR / "out" / "policy-servers"
REPLY = '<tool_call>{"name":"shell","arguments":{"command": "echo hi >out.txt"}}</tool_call>'


def task_lines(n_tasks: int) -> str:
    """File-writing tasks the scripted reply solves: each writes its own target file, so
    one policy (one reply) needs one target: ``out.txt`` in a fresh workdir per rollout."""
    return "\n".join(
        json.dumps(
            {
                "id": f"write-{i}",
                "instruction": f"Task {i}: create out.txt containing hi.",
                "harness": "toy",
                "timeout": 300,
                "verifier": 'test "$(cat out.txt)" = hi',
            }
        )
        for i in range(n_tasks)
    )


def side(summary: Any, wall_s: float) -> dict[str, Any]:
    rewards = [r.reward or 0.0 for r in summary.results]
    return {
        "rollouts": len(summary.results),
        "wall_s": wall_s,
        "per_minute": 60.0 * len(summary.results) / wall_s if wall_s else 0.0,
        "statuses": sorted({r.status for r in summary.results}),
        "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
    }


def render(
    forge: dict[str, Any], vllm: dict[str, Any], start_s: float, publish_s: float, parallel: int
) -> tuple[dict[str, float], str]:
    ratio = vllm["per_minute"] / forge["per_minute"] if forge["per_minute"] else 0.0
    figures = {
        "policy_servers.forge_per_minute": round(forge["per_minute"], 2),
        "policy_servers.vllm_per_minute": round(vllm["per_minute"], 2),
        "policy_servers.vllm_ratio_vs_forge": round(ratio, 3),
        "policy_servers.vllm_start_s": round(start_s, 1),
        "policy_servers.publish_s": round(publish_s, 3),
    }
    table = "\n".join(
        [
            f"| policy server (tiny Qwen3, toy harness in serve mode, parallel {parallel}) "
            "| rollouts | wall s | rollouts/min |",
            "| --- | ---: | ---: | ---: |",
            f"| forge serve-policy (embedded) | {forge['rollouts']} | {forge['wall_s']:.1f} "
            f"| {forge['per_minute']:.1f} |",
            f"| vLLM (CPU build), started once ({start_s:.0f} s, not counted) "
            f"| {vllm['rollouts']} | {vllm['wall_s']:.1f} | {vllm['per_minute']:.1f} |",
            f"| ratio vLLM / forge | | | {ratio:.2f} |",
            f"| weight publish into the running vLLM (pause, reload, resume) | | "
            f"{publish_s:.2f} | |",
        ]
    )
    return figures, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_policy_servers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", type=int, default=2, help="tasks (default 2)")
    parser.add_argument("-n", type=int, default=8, help="rollouts per task (default 8)")
    parser.add_argument("--parallel", type=int, default=4, help="rollouts at once (default 4)")
    parser.add_argument("--max-tokens", type=int, default=32, help="served tokens per call")
    parser.add_argument("--vllm-python", default=None, help="vLLM's python (FORGE_VLLM_PYTHON)")
    parser.add_argument(
        "--results",
        type=Path,
        default=results.BENCH_DIR,
        help="folder of results.json and results.md to update (default: bench/)",
    )
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if min(args.tasks, args.n, args.parallel, args.max_tokens) < 1:
        parser.error("--tasks, -n, --parallel and --max-tokens must be at least 1")

    from k8s_jobs import parse_tasks
    from rl.loop import serve_and_run
    from rl.policy.vllm import VLLMError, VLLMServer, vllm_python
    from rl.tiny_model import build_tiny_model, script_reply

    try:
        python = vllm_python(args.vllm_python)
    except VLLMError as e:
        print(f"bench_policy_servers: {e}", file=sys.stderr)
        return 2
    OUT_DIR.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="policy-servers-", dir=OUT_DIR.parent))
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-real-key")
    try:
        model = work / "policy"
        build_tiny_model(model, seed=0)
        script_reply(model, REPLY)
        tasks = parse_tasks(task_lines(args.tasks), "bench.jsonl")
        common: dict[str, Any] = {
            "harness": "toy",
            "n": args.n,
            "parallel": args.parallel,
            "serve_max_tokens": args.max_tokens,
            "confdir": work / "conf",
            "progress": False,
        }
        started = time.monotonic()
        summary = serve_and_run(model, 0, tasks, work / "forge", **common)
        forge = side(summary, time.monotonic() - started)

        started = time.monotonic()
        with VLLMServer(model, 0, work / "vllm.log", python=python) as vllm:
            start_s = time.monotonic() - started
            started = time.monotonic()
            summary = serve_and_run(
                model, 0, tasks, work / "vllm", policy_url=vllm.base_url, **common
            )
            served = side(summary, time.monotonic() - started)
            publish_s = vllm.publish(model, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, s in (("forge", forge), ("vllm", served)):
        # The scripted policy repeats its tool call until the toy harness runs out of
        # turns: every rollout ends "partial" (out of turns) with its file written.
        if s["statuses"] != ["partial"] or s["mean_reward"] != 1.0:
            print(f"bench_policy_servers: {name} rollouts did not all succeed: {s}", file=sys.stderr)
            return 1
    figures, table = render(forge, served, start_s, publish_s, args.parallel)
    print(table)
    print(json.dumps(figures, indent=2))
    if not args.no_record:
        results.record(
            "policy_servers",
            figures,
            table,
            {"forge": forge, "vllm": served, "parallel": args.parallel, "cpus": os.cpu_count()},
            command=results.command_line("bench.bench_policy_servers", argv),
            json_path=args.results / "results.json",
            md_path=args.results / "results.md",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
