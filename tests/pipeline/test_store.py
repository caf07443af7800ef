"""pipeline.store: the views over a run directory, computed on demand or stitched once."""

from __future__ import annotations

from pathlib import Path

from pipeline import store
from tests.pipeline.runs import Agent, Step, write_agents

TREE_QUERIES = (
    "select * from edges order by child_call_id",
    "select * from call_nodes order by call_id",
    "select rollout_id, n_calls, depth, fan_out from trajectories order by rollout_id",
)


def _run(root: Path) -> None:
    steps = [
        Step(text="looking", calls=[("shell", {"cmd": "ls"})], results=[("a.txt", False)]),
        Step(text="done"),
    ]
    agents = [
        (Agent("openai_chat", f"r{i}", "be brief", f"task {i}", [], steps, call_prefix=f"c{i}-"), i)
        for i in range(3)
    ]
    write_agents(root, agents)


def test_a_stitched_connection_answers_as_the_plain_views_do(tmp_path: Path) -> None:
    _run(tmp_path)
    plain, stitched = store.connect(tmp_path), store.connect(tmp_path, stitched=True)
    for query in TREE_QUERIES:
        rows = plain.sql(query).fetchall()
        assert rows and stitched.sql(query).fetchall() == rows, query
    assert {k: v for k, v in store.audits(stitched).items() if v} == {}


def test_a_stitched_connection_reads_the_tree_from_its_stored_tables(tmp_path: Path) -> None:
    _run(tmp_path)
    con = store.connect(tmp_path, stitched=True)
    for name in store.STITCHED_VIEWS:
        plan = "\n".join(row[1] for row in con.sql(f"EXPLAIN SELECT * FROM {name}").fetchall())
        assert f"_stored_{name}" in plan and "read_parquet" not in plan.lower(), plan


def test_queries_naming_a_derived_view_are_told_apart_from_base_table_ones() -> None:
    assert store.names_derived("select * from TRAJECTORIES where reward > 0")
    assert store.names_derived("select e.kind from calls c join edges e on true")
    assert not store.names_derived("select model, count(*) from calls group by model")
