"""bench_rollouts: its figures and table are computed from what both sides measured."""

from __future__ import annotations

from bench.bench_rollouts import render, task_lines
from k8s_jobs import parse_tasks


def test_figures_are_the_ratio_of_the_two_sides() -> None:
    forge = {"rollouts": 8, "wall_s": 30.0, "per_minute": 16.0, "cpu_s": 32.0}
    bare = {"rollouts": 8, "wall_s": 24.0, "per_minute": 20.0, "cpu_s": 24.0}
    figures, table = render(forge, bare, parallel=4)
    assert figures == {
        "rollouts.per_minute": 16.0,
        "rollouts.bare_per_minute": 20.0,
        "rollouts.ratio_vs_bare": 0.8,
        "rollouts.cpu_s_per_rollout": 4.0,
        "rollouts.bare_cpu_s_per_rollout": 3.0,
    }
    assert "| ratio forge / bare | | | 0.80 | |" in table


def test_the_benchmark_tasks_are_valid_task_specs() -> None:
    tasks = parse_tasks(task_lines(3), "bench.jsonl")
    assert [t.id for t in tasks] == ["write-0", "write-1", "write-2"]
