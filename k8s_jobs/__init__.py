"""Rollouts at scale: task specs, harness templates, the local runner and Kubernetes Jobs.

Python API (the CLI's ``forge rollout`` and ``forge k8s render`` call the same)::

    from k8s_jobs import load_tasks, run_rollouts, RolloutOptions
    tasks = load_tasks("data/tasks/demo.jsonl")
    summary = run_rollouts(tasks, RolloutOptions(out_dir=Path("data/runs/r1"), harness="toy",
                                                 n=4, parallel=8))
    summary.results  # one RolloutResult per rollout: status, reward, attempts
"""

from __future__ import annotations

from k8s_jobs.harnesses import HarnessTemplate, builtin_harnesses, load_harness_config
from k8s_jobs.local import RolloutOptions, RolloutResult, RunSummary, run_rollouts
from k8s_jobs.tasks import Task, TaskError, load_tasks, parse_tasks

__all__ = [
    "HarnessTemplate",
    "RolloutOptions",
    "RolloutResult",
    "RunSummary",
    "Task",
    "TaskError",
    "builtin_harnesses",
    "load_harness_config",
    "load_tasks",
    "parse_tasks",
    "run_rollouts",
]
