"""The synthetic shard generator and the benchmarks, at small sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from bench import bench_pipeline, bench_storage, results
from bench.gen_shards import LIST_KEY, Settings, generate, plan_all, run_id
from bench.harnesses import Simulation
from bench.synth import CallSpec, RolloutPlan, Text, build_world, make_task
from pipeline import store
from pipeline.canonical import canonical_json
from pipeline.reconstruct import load_items, reconstruct_request
from pipeline.schema import TABLES, with_version

CALLS = 2000
# A smaller text pool than the default 16 MiB: quicker to build, same shapes.
POOL_CHARS = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def text() -> Text:
    return Text(0, chars=POOL_CHARS)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, text: Text) -> Path:
    out = tmp_path_factory.mktemp("gen") / "run"
    generate(Settings(calls=CALLS, seed=0, workers=1, codex_share=0.5, group_size=4), out, text)
    return out


def tables(data: Path) -> duckdb.DuckDBPyConnection:
    """The stored tables, loaded as DuckDB tables (quick point look-ups)."""
    con = duckdb.connect()
    for table in TABLES:
        files = [str(p) for p in store.shard_paths(data, table)]
        if files:
            con.execute(
                f"CREATE TABLE {table} AS FROM read_parquet(?, union_by_name = true)", [files]
            )
    return con


def test_plans_add_up_to_exactly_the_calls_asked_for(text: Text) -> None:
    for n in (1, 2, 3, 7, 100, 4321):
        plans = plan_all(Settings(calls=n, seed=1), text)
        assert sum(p.calls for p in plans) == n


def test_every_shard_has_exactly_the_schema(shards: Path) -> None:
    for table in ("calls", "messages", "rollouts", "rewards"):
        files = store.shard_paths(shards, table)
        assert files, table
        expected = with_version(TABLES[table])
        for path in files:
            schema = pq.read_schema(path)
            # Parquet names a list's element "element" where Arrow says "item": same type.
            assert schema.equals(expected), path
            assert schema.metadata == expected.metadata
            assert [f.metadata for f in schema] == [f.metadata for f in expected]


def test_the_data_set_is_what_was_asked_for(shards: Path) -> None:
    con = tables(shards)
    calls, ids = con.execute("SELECT count(*), count(DISTINCT call_id) FROM calls").fetchone()
    assert calls == ids == CALLS
    rows, hashes = con.execute("SELECT count(*), count(DISTINCT hash) FROM messages").fetchone()
    assert rows == hashes, "a messages row was written twice"
    apis = dict(con.execute("SELECT api, count(*) FROM calls GROUP BY api").fetchall())
    assert set(apis) == {"anthropic_messages", "openai_responses"}
    (sub_agents,) = con.execute(
        "SELECT count(*) FROM calls WHERE claude_agent_id IS NOT NULL "
        "OR codex_parent_thread_id IS NOT NULL"
    ).fetchone()
    (side,) = con.execute("SELECT count(*) FROM calls WHERE model LIKE '%haiku%'").fetchone()
    assert sub_agents > 0 and side > 0
    (orphans,) = con.execute(
        "SELECT count(*) FROM calls WHERE rollout_id NOT IN (SELECT rollout_id FROM rollouts)"
    ).fetchone()
    assert orphans == 0
    # Every item's parent is stored, and every call points at stored rows.
    (broken,) = con.execute(
        "SELECT count(*) FROM messages WHERE parent_hash IS NOT NULL "
        "AND parent_hash NOT IN (SELECT hash FROM messages)"
    ).fetchone()
    assert broken == 0


def _bodies(plans: list[RolloutPlan], world: Any, wanted: set[str]) -> dict[str, str]:
    """call_id -> canonical JSON of the request body the simulated harness sent."""
    bodies: dict[str, str] = {}

    def sink(spec: CallSpec) -> None:
        if spec.call_id in wanted:
            body = dict(spec.params)
            body[LIST_KEY[spec.api]] = spec.chain.items[: spec.n_items]
            bodies[spec.call_id] = canonical_json(body)

    for plan in plans:
        Simulation(world, plan, sink).run()
    return bodies


def _check_reconstruction(shards: Path, text: Text, where: str) -> int:
    """Rebuild the requests of the calls that ``where`` selects; compare with what was sent."""
    con = tables(shards)
    ids = [r[0] for r in con.execute(f"SELECT call_id FROM calls WHERE {where}").fetchall()]
    settings = Settings(calls=CALLS, seed=0, codex_share=0.5, group_size=4)
    sent = _bodies(plan_all(settings, text), build_world(0, text), set(ids))
    assert sorted(sent) == sorted(ids)
    items = load_items(con)
    for call_id in ids:
        assert canonical_json(reconstruct_request(con, call_id, items)) == sent[call_id]
    return len(ids)


def test_call_requests_reconstruct_exactly(shards: Path, text: Text) -> None:
    """A sample of the calls of every kind, and every call of a rare kind (reconstruction
    costs a query per call: the slow test does them all)."""
    where = (
        "hash(call_id) % 25 = 0 OR status <> 'complete' OR process_name = 'python3' OR pid IS NULL"
    )
    kinds = (
        tables(shards)
        .execute(
            f"SELECT count(DISTINCT api), count(claude_agent_id), count(codex_parent_thread_id), "
            f"count(*) FILTER (WHERE model LIKE '%haiku%') FROM calls WHERE {where}"
        )
        .fetchone()
    )
    assert kinds is not None and kinds[0] == 2 and all(kinds), kinds
    assert _check_reconstruction(shards, text, where) >= CALLS // 25


@pytest.mark.slow
def test_every_call_request_reconstructs_exactly(shards: Path, text: Text) -> None:
    assert _check_reconstruction(shards, text, "true") == CALLS


def materialise_all(con: duckdb.DuckDBPyConnection) -> None:
    """Every derived view as a table, in order (the audits then run in seconds)."""
    for kind, name, _ in bench_pipeline.derived_definitions():
        if kind == "VIEW":
            con.execute(f"CREATE TABLE m_{name} AS FROM {name}")
            con.execute(f"CREATE OR REPLACE VIEW {name} AS FROM m_{name}")


def _failing_audits(data: Path) -> dict[str, int]:
    names = {name for _, name, _ in bench_pipeline.derived_definitions()}
    missing = set(bench_pipeline.TARGETS) - names
    if missing or not store.audit_names():
        pytest.skip(f"the pipeline's views are not all there yet: {sorted(missing)}")
    con = store.connect(data)
    materialise_all(con)
    return {k: v for k, v in store.audits(con).items() if v}


def test_audits_return_no_rows(shards: Path) -> None:
    assert _failing_audits(shards) == {}


def test_audits_return_no_rows_on_every_feature(tmp_path: Path, text: Text) -> None:
    """Sub-agents in parallel, child processes with and without a pid, compaction, side
    calls and crashes with retried calls, in both harness shapes."""
    generate(Settings(seed=7, workers=1), tmp_path / "run", text, plans=featured_plans(text))
    assert _failing_audits(tmp_path / "run") == {}


def featured_plans(text: Text) -> list[RolloutPlan]:
    """Rollouts that exercise every feature of the model in a few dozen calls."""
    place = {"version": 0, "group_id": "g", "host": 0, "run_id": run_id(7, 0, 0)}

    def plan(index: int, harness: str, **kw: Any) -> RolloutPlan:
        task = make_task(7, index, text, codex_share=1.0 if harness == "codex" else 0.0)
        return RolloutPlan(
            index=index,
            rollout_id=f"r{index}",
            seed=f"7:{index}",
            task=task,
            start=1.77e9 + 1000 * index,
            **place,
            **kw,
        )

    return [
        plan(
            0,
            "claude",
            status="crashed",
            main_turns=8,
            spawns={2: [3, 2]},
            children={4: 2},
            summaries=[1, 6],
            title=True,
            compact_at=5,
            error_calls=3,
        ),
        plan(
            1,
            "codex",
            status="crashed",
            main_turns=7,
            spawns={2: [2, 3]},
            children={4: 3},
            error_calls=1,
        ),
        plan(2, "claude", status="timed_out", main_turns=3, title=True),
        plan(3, "codex", status="complete", main_turns=4, spawns={1: [2]}),
    ]


def read_all(data: Path) -> dict[str, list[tuple[Any, ...]]]:
    con = tables(data)
    out = {}
    for table in ("calls", "messages", "rollouts", "rewards"):
        out[table] = sorted(map(repr, con.execute(f"FROM {table}").fetchall()))
    return out


@pytest.mark.parametrize("quirks", [True, False])
def test_direct_rows_equal_the_recorders_rows(tmp_path: Path, text: Text, quirks: bool) -> None:
    """The fast path writes exactly what build_rows and the writer would have written."""
    plans = featured_plans(text)
    for rows in ("direct", "build_rows"):
        settings = Settings(seed=7, rows=rows, workers=1, quirks=quirks)
        generate(settings, tmp_path / rows, text, plans=featured_plans(text))
    direct, recorded = read_all(tmp_path / "direct"), read_all(tmp_path / "build_rows")
    assert sum(p.calls for p in plans) == len(direct["calls"])
    for table in direct:
        assert direct[table] == recorded[table], table
    con = tables(tmp_path / "direct")
    features = con.execute(
        "SELECT count(*) FILTER (WHERE status = 'error'), "
        "count(*) FILTER (WHERE request_headers['x-claude-code-request-class'] = 'compaction'), "
        "count(*) FILTER (WHERE process_name = 'python3'), "
        "count(*) FILTER (WHERE codex_parent_thread_id IS NOT NULL), "
        "count(*) FILTER (WHERE claude_agent_id IS NOT NULL) FROM calls"
    ).fetchone()
    assert all(features), features


def test_output_does_not_depend_on_the_worker_count(tmp_path: Path, text: Text) -> None:
    for workers in (1, 2):
        generate(Settings(calls=600, seed=3, workers=workers), tmp_path / str(workers), text)
    one = sorted(p.relative_to(tmp_path / "1") for p in (tmp_path / "1").rglob("*.parquet"))
    two = sorted(p.relative_to(tmp_path / "2") for p in (tmp_path / "2").rglob("*.parquet"))
    assert one == two
    for rel in one:
        assert (tmp_path / "1" / rel).read_bytes() == (tmp_path / "2" / rel).read_bytes(), rel


def test_results_merge_additively(tmp_path: Path) -> None:
    j, md = tmp_path / "results.json", tmp_path / "results.md"
    results.record(
        "proxy", {"proxy.latency_ratio_vs_mitmdump": 1.05}, "| a |", json_path=j, md_path=md
    )
    results.record(
        "storage", {"storage.x": 0.1, "storage.y": 0.2}, "| b |", json_path=j, md_path=md
    )
    results.record("storage", {"storage.x": 0.3}, "| c |", json_path=j, md_path=md)
    data = json.loads(j.read_text())
    assert data["figures"] == {"proxy.latency_ratio_vs_mitmdump": 1.05, "storage.x": 0.3}
    assert set(data["benchmarks"]) == {"proxy", "storage"}
    text = md.read_text()
    assert "| a |" in text and "| c |" in text and "| b |" not in text


@pytest.mark.slow
def test_benchmarks_run_end_to_end(shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    assert (
        bench_pipeline.main(
            [
                "--data",
                str(shards),
                "--repeat",
                "1",
                "--results",
                str(out),
                "--work",
                str(tmp_path / "work"),
            ]
        )
        == 0
    )
    assert (
        bench_storage.main(
            [
                "--turns",
                "3,12",
                "--min-calls",
                "24",
                "--results",
                str(out),
                "--work",
                str(tmp_path / "storage"),
            ]
        )
        == 0
    )
    figures = json.loads((out / "results.json").read_text())["figures"]
    assert figures[f"pipeline.stitch_ratio_vs_scan_{results.size_label(CALLS)}"] > 0
    for n in (3, 12):
        assert 0 < figures[f"storage.ratio_vs_raw_{n}turn"] < 1
        assert figures[f"storage.codex_ratio_vs_raw_{n}turn"] > 0
    assert "## pipeline" in (out / "results.md").read_text()
