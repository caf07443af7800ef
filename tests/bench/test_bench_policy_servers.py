"""bench_policy_servers: its figures and table come from what both servers measured."""

from __future__ import annotations

from bench.bench_policy_servers import render, task_lines
from k8s_jobs import parse_tasks


def test_figures_are_the_ratio_of_the_two_servers() -> None:
    forge = {"rollouts": 16, "wall_s": 60.0, "per_minute": 16.0}
    vllm = {"rollouts": 16, "wall_s": 30.0, "per_minute": 32.0}
    figures, table = render(forge, vllm, start_s=41.2, publish_s=0.5, parallel=4)
    assert figures == {
        "policy_servers.forge_per_minute": 16.0,
        "policy_servers.vllm_per_minute": 32.0,
        "policy_servers.vllm_ratio_vs_forge": 2.0,
        "policy_servers.vllm_start_s": 41.2,
        "policy_servers.publish_s": 0.5,
    }
    assert "| ratio vLLM / forge | | | 2.00 |" in table


def test_every_task_has_the_scripted_replys_target() -> None:
    tasks = parse_tasks(task_lines(3), "bench.jsonl")
    assert [t.id for t in tasks] == ["write-0", "write-1", "write-2"]
    assert {t.instruction.split(": ", 1)[1] for t in tasks} == {"create out.txt containing hi."}
