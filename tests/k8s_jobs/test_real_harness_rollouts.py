"""The built-in ``claude`` and ``codex`` templates, run for real by the local backend: the
pinned CLIs (.harnesses/), unmodified, behind the shared proxy, against the scripted
provider; two rollouts each at once, graded, their calls under their own rollout ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k8s_jobs import RolloutOptions, parse_tasks, run_rollouts
from pipeline.store import connect
from tests.support import harnesses
from tests.support.toy_agent import toy_agent
from tests.support.upstream import ScriptedUpstream

pytestmark = [pytest.mark.slow, pytest.mark.harness]

TASK = {
    "id": "hello",
    "instruction": "Create hello.txt containing hi.",
    "timeout": 240,
    "verifier": 'test "$(cat hello.txt)" = hi',
}
HOSTS = {"claude": "api.anthropic.com", "codex": "api.openai.com"}


@pytest.mark.parametrize("name", ["claude", "codex"])
def test_builtin_template_runs_the_real_harness_unattended(
    name: str, tmp_path: Path, confdir: Path
) -> None:
    reason = harnesses.unavailable_reason(name)
    if reason:
        pytest.skip(reason)
    tasks = parse_tasks(json.dumps(TASK), "real.jsonl")
    with ScriptedUpstream(toy_agent) as up:
        summary = run_rollouts(
            tasks,
            RolloutOptions(
                out_dir=tmp_path / "run",
                harness=name,
                n=2,
                parallel=2,
                upstreams=[f"{HOSTS[name]}={up.base_url}"],
                confdir=confdir,
                max_attempts=1,
            ),
        )
    results = {r.rollout_id: (r.status, r.reward) for r in summary.results}
    logs = {
        r.rollout_id: (tmp_path / "run" / "logs" / r.rollout_id / "harness.stderr").read_text()[
            -2000:
        ]
        for r in summary.results
    }
    assert results == {"hello.0": ("complete", 1.0), "hello.1": ("complete", 1.0)}, logs
    con = connect(tmp_path / "run")
    rows = con.execute(
        "SELECT rollout_id, n_calls, status FROM trajectories ORDER BY rollout_id"
    ).fetchall()
    assert [r[0] for r in rows] == ["hello.0", "hello.1"]
    assert all(n >= 2 and status == "complete" for _, n, status in rows), rows
