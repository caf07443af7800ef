"""The trajectories view: one row per rollout, its status rule, tree shape, tokens, time."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from pipeline.shards import write_shard
from pipeline.store import audit_names, connect, derived_sql_files, sql_text

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

# The columns of call_nodes as the stitching views define them.
NODES = pa.schema(
    [
        ("call_id", pa.string()),
        ("rollout_id", pa.string()),
        ("parent_call_id", pa.string()),
        ("edge_kind", pa.string()),
        ("depth", pa.int64()),
        ("root_call_id", pa.string()),
        ("agent_key", pa.string()),
        ("is_side_call", pa.bool_()),
        ("is_prewarm", pa.bool_()),
    ]
)


def stitching_defined() -> bool:
    """Whether pipeline/sql already defines call_nodes (the stitching views)."""
    pattern = re.compile(r"\bVIEW\s+call_nodes\b", re.IGNORECASE)
    return any(pattern.search(sql_text(name[:-4])) for name in derived_sql_files())


def call(
    call_id: str,
    rollout_id: str | None,
    *,
    at_s: float = 0.0,
    duration_s: float = 1.0,
    model: str = "big-model",
    api: str = "openai_chat",
    status: str = "complete",
    input_tokens: int | None = 100,
    output_tokens: int | None = 10,
    cache_read_tokens: int | None = None,
    cache_write_tokens: int | None = None,
    policy_version: int | None = None,
) -> dict[str, Any]:
    start = T0 + timedelta(seconds=at_s)
    return {
        "call_id": call_id,
        "rollout_id": rollout_id,
        "api": api,
        "model": model,
        "status": status,
        "started_at": start,
        "ended_at": start + timedelta(seconds=duration_s),
        "duration_ms": duration_s * 1000,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_tokens": cache_read_tokens,
        "cache_write_tokens": cache_write_tokens,
        "policy_version": policy_version,
    }


def node(
    call_id: str,
    rollout_id: str,
    parent: str | None,
    kind: str | None,
    depth: int,
    root: str,
    agent: str = "main",
    side: bool = False,
) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "rollout_id": rollout_id,
        "parent_call_id": parent,
        "edge_kind": kind,
        "depth": depth,
        "root_call_id": root,
        "agent_key": agent,
        "is_side_call": side,
        "is_prewarm": False,
    }


def flat_nodes(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chain per rollout in call order (a stand-in tree for tests about other columns)."""
    out: list[dict[str, Any]] = []
    last: dict[str, tuple[str, int, str]] = {}
    for c in sorted(calls, key=lambda c: (c["started_at"], c["call_id"])):
        rid = c["rollout_id"]
        if rid is None:
            continue
        if rid in last:
            parent, depth, root = last[rid]
            out.append(node(c["call_id"], rid, parent, "continues", depth + 1, root))
            last[rid] = (c["call_id"], depth + 1, root)
        else:
            out.append(node(c["call_id"], rid, None, None, 0, c["call_id"]))
            last[rid] = (c["call_id"], 0, c["call_id"])
    return out


def open_run(data: Path, nodes: list[dict[str, Any]]) -> duckdb.DuckDBPyConnection:
    """connect(data) with call_nodes replaced by ``nodes``: these tests check what
    trajectories makes of a tree, not how stitching builds it."""
    con = duckdb.connect()
    con.register("_test_call_nodes", pa.Table.from_pylist(nodes, schema=NODES))
    real = stitching_defined()
    if not real:
        con.execute("CREATE VIEW call_nodes AS SELECT * FROM _test_call_nodes")
    connect(data, con)
    if real:
        con.execute("CREATE OR REPLACE VIEW call_nodes AS SELECT * FROM _test_call_nodes")
    return con


def write_run(
    root: Path,
    calls: list[dict[str, Any]],
    rollouts: Sequence[dict[str, Any]] = (),
    rewards: Sequence[dict[str, Any]] = (),
) -> Path:
    write_shard(root, "calls", "calls-0", calls)
    if rollouts:
        write_shard(root, "rollouts", "rollouts-0", list(rollouts))
    if rewards:
        write_shard(root, "rewards", "rewards-0", list(rewards))
    return root


def rollout(rollout_id: str, **kw: Any) -> dict[str, Any]:
    return {"rollout_id": rollout_id, "written_at": T0 + timedelta(hours=1), **kw}


def reward(rollout_id: str, value: float | None, **kw: Any) -> dict[str, Any]:
    return {"rollout_id": rollout_id, "reward": value, "written_at": T0 + timedelta(hours=2), **kw}


def trajectories(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    cur = con.execute("SELECT * FROM trajectories")
    names = [d[0] for d in cur.description]
    return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def my_audits(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Rows returned by the trajectories and groups audits."""
    out: dict[str, int] = {}
    for name in audit_names():
        if name.startswith(("audit_trajectories_", "audit_groups_")):
            query = sql_text(name).rstrip().rstrip(";")
            (n,) = con.execute(f"SELECT count(*) FROM ({query})").fetchone() or (0,)
            out[name] = int(n)
    return out


def test_one_row_per_rollout_seen_in_rollouts_calls_or_rewards(tmp_path: Path) -> None:
    calls = [call("a1", "r-a"), call("a2", "r-a", at_s=2), call("b1", "r-b"), call("x1", None)]
    run = write_run(
        tmp_path,
        calls,
        rollouts=[rollout("r-a", task_id="t1", harness="codex"), rollout("r-c", status="crashed")],
        rewards=[reward("r-a", 1.0), reward("r-d", 0.0, status="crashed")],
    )
    rows = trajectories(open_run(run, flat_nodes(calls)))
    assert sorted(rows) == ["r-a", "r-b", "r-c", "r-d"]
    assert rows["r-a"]["task_id"] == "t1" and rows["r-a"]["harness"] == "codex"
    assert rows["r-a"]["n_calls"] == 2 and rows["r-a"]["reward"] == 1.0
    assert rows["r-b"]["task_id"] is None and rows["r-b"]["reward"] is None
    assert rows["r-c"]["n_calls"] == 0 and rows["r-c"]["depth"] is None
    assert rows["r-c"]["status"] == "crashed" and rows["r-d"]["status"] == "crashed"


@pytest.mark.parametrize(
    ("runner", "verifier", "incomplete_call", "expected"),
    [
        (None, None, False, "complete"),
        (None, None, True, "partial"),
        ("complete", None, True, "partial"),
        ("complete", "partial", False, "partial"),
        ("timed_out", "complete", False, "timed_out"),
        ("complete", "crashed", True, "crashed"),
        ("crashed", "timed_out", False, "crashed"),
        ("infra_error", "crashed", False, "infra_error"),
        (None, "timed_out", False, "timed_out"),
        ("finished", "complete", False, "finished"),
    ],
)
def test_status_is_the_worst_of_runner_verifier_and_incomplete_calls(
    tmp_path: Path, runner: str | None, verifier: str | None, incomplete_call: bool, expected: str
) -> None:
    calls = [
        call("c1", "r"),
        call("c2", "r", at_s=2, status="incomplete" if incomplete_call else "complete"),
    ]
    run = write_run(
        tmp_path,
        calls,
        rollouts=[rollout("r", status=runner)],
        rewards=[reward("r", 1.0, status=verifier)],
    )
    con = open_run(run, flat_nodes(calls))
    assert trajectories(con)["r"]["status"] == expected
    # A status outside the list passes through and its audit reports it.
    assert my_audits(con)["audit_trajectories_status"] == (expected == "finished")


def test_latest_rollout_and_reward_rows_win(tmp_path: Path) -> None:
    calls = [call("c1", "r")]
    run = write_run(
        tmp_path,
        calls,
        rollouts=[
            rollout("r", task_id="t", status="crashed", written_at=T0),
            rollout("r", task_id="t", status="complete", written_at=T0 + timedelta(minutes=5)),
        ],
        rewards=[
            reward("r", 0.0, written_at=T0 + timedelta(minutes=9)),
            reward("r", 1.0, written_at=T0 + timedelta(minutes=10), source="forge reward"),
        ],
    )
    con = open_run(run, flat_nodes(calls))
    row = trajectories(con)["r"]
    assert (row["status"], row["reward"]) == ("complete", 1.0)
    assert con.execute("SELECT count(*) FROM rollouts_latest").fetchone() == (1,)
    assert con.execute("SELECT source FROM rewards_latest").fetchone() == ("forge reward",)


def test_depth_fan_out_and_agents_come_from_the_call_tree(tmp_path: Path) -> None:
    # Main agent m1 -> m2 -> m3; m1 also asked a small model for a title (side call);
    # m2 launched a sub-agent s1 -> s2 -> s3 whose s2 launched a sub-sub-agent u1.
    calls = [
        call("m1", "r", at_s=0),
        call("t1", "r", at_s=1, model="small-model"),
        call("m2", "r", at_s=2),
        call("s1", "r", at_s=3, model="sub-model"),
        call("s2", "r", at_s=4, model="sub-model"),
        call("u1", "r", at_s=5, model="sub-model"),
        call("s3", "r", at_s=6, model="sub-model"),
        call("m3", "r", at_s=7),
    ]
    nodes = [
        node("m1", "r", None, None, 0, "m1"),
        node("t1", "r", "m1", "spawns", 1, "m1", agent="title", side=True),
        node("m2", "r", "m1", "continues", 1, "m1"),
        node("s1", "r", "m2", "spawns", 2, "m1", agent="sub"),
        node("s2", "r", "s1", "continues", 3, "m1", agent="sub"),
        node("u1", "r", "s2", "spawns", 4, "m1", agent="subsub"),
        node("s3", "r", "s2", "continues", 4, "m1", agent="sub"),
        node("m3", "r", "m2", "continues", 2, "m1"),
    ]
    run = write_run(tmp_path, calls, rollouts=[rollout("r", task_id="t")])
    row = trajectories(open_run(run, nodes))["r"]
    assert row["n_calls"] == 8
    assert row["depth"] == 4
    assert row["fan_out"] == 2  # m1 (m2, t1), m2 (s1, m3), s2 (u1, s3)
    assert row["n_agents"] == 3  # main, sub, subsub; the title call is no agent
    assert row["models"] == ["big-model", "small-model", "sub-model"]
    # The main model serves most non-side calls: sub-model has 4, big-model 3.
    assert row["model"] == "sub-model"


def test_main_model_ignores_side_calls_and_breaks_ties_by_name(tmp_path: Path) -> None:
    calls = [
        call("a", "r", model="zeta"),
        call("b", "r", at_s=1, model="alpha"),
        call("c", "r", at_s=2, model="small"),
        call("d", "r", at_s=3, model="small"),
    ]
    nodes = flat_nodes(calls)
    for n in nodes:
        n["is_side_call"] = n["call_id"] in ("c", "d")
    run = write_run(tmp_path, calls)
    assert trajectories(open_run(run, nodes))["r"]["model"] == "alpha"


def test_tokens_in_count_anthropic_cache_tokens_once_and_openai_cached_tokens_not_twice(
    tmp_path: Path,
) -> None:
    calls = [
        # Anthropic: input_tokens is the uncached part; cache reads and writes come on top.
        call(
            "a",
            "r",
            api="anthropic_messages",
            input_tokens=10,
            output_tokens=5,
            cache_read_tokens=1000,
            cache_write_tokens=50,
        ),
        # OpenAI: input_tokens already holds the 400 cached ones.
        call(
            "b",
            "r",
            at_s=2,
            api="openai_responses",
            input_tokens=500,
            output_tokens=7,
            cache_read_tokens=400,
        ),
        call("c", "r", at_s=4, input_tokens=None, output_tokens=None),
    ]
    run = write_run(tmp_path, calls)
    row = trajectories(open_run(run, flat_nodes(calls)))["r"]
    assert (row["tokens_in"], row["tokens_out"]) == (10 + 1000 + 50 + 500, 12)


def test_wall_time_is_the_runners_else_first_call_to_last_call(tmp_path: Path) -> None:
    calls = [
        call("a1", "r-a", at_s=0, duration_s=2),
        call("a2", "r-a", at_s=10, duration_s=5),
        call("b1", "r-b", at_s=3, duration_s=1),
    ]
    run = write_run(
        tmp_path,
        calls,
        rollouts=[rollout("r-b", started_at=T0, ended_at=T0 + timedelta(seconds=60))],
    )
    rows = trajectories(open_run(run, flat_nodes(calls)))
    assert rows["r-a"]["wall_ms"] == 15_000.0
    assert rows["r-a"]["started_at"] == T0 and rows["r-a"]["ended_at"] == T0 + timedelta(seconds=15)
    assert rows["r-b"]["wall_ms"] == 60_000.0


def test_policy_versions_come_from_the_calls_else_from_the_launch(tmp_path: Path) -> None:
    calls = [
        call("a1", "r-a", policy_version=3),
        call("a2", "r-a", at_s=2, policy_version=5),
        call("b1", "r-b"),
    ]
    run = write_run(
        tmp_path,
        calls,
        rollouts=[rollout("r-a", policy_version=2), rollout("r-b", policy_version=7)],
    )
    rows = trajectories(open_run(run, flat_nodes(calls)))
    assert (rows["r-a"]["policy_version_min"], rows["r-a"]["policy_version_max"]) == (3, 5)
    assert (rows["r-b"]["policy_version_min"], rows["r-b"]["policy_version_max"]) == (7, 7)


def test_audits_return_no_rows_on_a_consistent_run(tmp_path: Path) -> None:
    calls = [call(f"c{i}", f"r{i % 3}", at_s=i) for i in range(9)] + [call("z", None)]
    run = write_run(
        tmp_path,
        calls,
        rollouts=[rollout(f"r{i}", task_id="t", status="complete") for i in range(3)]
        + [rollout("r-dead", task_id="t", status="crashed")],
        rewards=[reward(f"r{i}", float(i % 2)) for i in range(3)],
    )
    assert set(my_audits(open_run(run, flat_nodes(calls))).values()) == {0}


def test_a_reward_for_an_unknown_rollout_is_reported_by_an_audit(tmp_path: Path) -> None:
    calls = [call("c1", "r-17")]
    run = write_run(tmp_path, calls, rewards=[reward("r-71", 1.0)])
    result = my_audits(open_run(run, flat_nodes(calls)))
    assert result["audit_trajectories_without_calls"] == 1
    assert result["audit_trajectories_calls_counted"] == 0


@pytest.mark.skipif(
    not stitching_defined(), reason="the stitching views (call_nodes) are not written yet"
)
def test_trajectories_build_on_the_real_stitching_views(tmp_path: Path) -> None:
    calls = [call("a1", "r-a"), call("a2", "r-a", at_s=2), call("b1", "r-b")]
    run = write_run(
        tmp_path, calls, rollouts=[rollout("r-a", task_id="t"), rollout("r-b", task_id="t")]
    )
    con = connect(run)
    rows = trajectories(con)
    assert sorted(rows) == ["r-a", "r-b"]
    assert rows["r-a"]["n_calls"] == 2 and rows["r-a"]["depth"] is not None
    assert set(my_audits(con).values()) == {0}
