"""Snapshots: Parquet tables + manifest, never rewritten, loadable by `datasets` offline."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from forge_cli import cmd_snapshot
from mitm_addon.launch import ForgeError
from pipeline import snapshot
from pipeline.schema import SCHEMA_VERSION
from pipeline.shards import write_shard
from pipeline.snapshot import (
    FILES,
    FilterError,
    SnapshotExists,
    TrajectoryFilter,
    read_manifest,
    select_rollouts,
    write_snapshot,
)
from pipeline.store import connect
from tests.pipeline.runs import call_row, reward_row, rollout_row


def token_call(call_id: str, s: float, rollout: str, drift: str, parent: str | None,
               prompt: list[int], completion: list[int]) -> dict[str, Any]:  # fmt: skip
    return call_row(
        call_id,
        s,
        rollout_id=rollout,
        model="policy",
        drift=drift,
        prompt_parent_call_id=parent,
        prompt_ids=prompt,
        completion_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        policy_version=1,
        response_json='{"big": "body"}',
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Three rollouts of one task (rewards 1, 0, 1; r3 timed out), in two calls shards."""
    root = tmp_path / "run"
    write_shard(
        root,
        "calls",
        "calls-0",
        [
            token_call("a1", 0, "r1", "FORK", None, [1, 2], [3]),
            token_call("a2", 1, "r1", "CLEAN", "a1", [4], [5, 6]),
        ],
    )
    write_shard(
        root,
        "calls",
        "calls-1",
        [
            token_call("b1", 0, "r2", "FORK", None, [1, 2], [7]),
            token_call("c1", 0, "r3", "FORK", None, [1, 2], [8]),
        ],
    )
    write_shard(
        root,
        "rollouts",
        "rollouts",
        [
            rollout_row("r1", "t"),
            rollout_row("r2", "t"),
            rollout_row("r3", "t", status="timed_out"),
        ],
    )
    write_shard(
        root,
        "rewards",
        "rewards",
        [reward_row("r1", 1.0), reward_row("r2", 0.0), reward_row("r3", 1.0)],
    )
    return root


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot_of(run_dir: Path, out: Path, filters: TrajectoryFilter | None = None) -> Path:
    write_snapshot(run_dir, out, filters, con=connect(run_dir))
    return out


def test_the_manifest_lists_sources_rows_filters_and_versions(
    run_dir: Path, tmp_path: Path
) -> None:
    out = snapshot_of(run_dir, tmp_path / "snaps" / "s001", TrajectoryFilter(min_reward=0.5))
    manifest = read_manifest(out)
    assert manifest["format"] == "forge.snapshot/1" and manifest["name"] == "s001"
    assert manifest["schema_version"] == SCHEMA_VERSION and manifest["forge_version"]
    assert manifest["created_at"].endswith("Z")
    assert manifest["filters"] == {"where": None, "min_reward": 0.5, "status": []}
    shards = {s["path"]: s for s in manifest["source"]["shards"]}
    assert set(shards) == {
        "calls/calls-0.parquet",
        "calls/calls-1.parquet",
        "rollouts/rollouts.parquet",
        "rewards/rewards.parquet",
    }
    for rel, shard in shards.items():
        assert shard["sha256"] == sha256(run_dir / rel)
        assert shard["rows"] == pq.ParquetFile(run_dir / rel).metadata.num_rows
    assert manifest["rollouts"] == 2  # r1 and r3 have reward >= 0.5
    for table, rel in FILES.items():
        entry = manifest["tables"][table]
        assert entry["path"] == rel and entry["sha256"] == sha256(out / rel)
        assert entry["rows"] == pq.ParquetFile(out / rel).metadata.num_rows
    assert manifest["tables"]["trajectories"]["rows"] == 2
    assert manifest["tables"]["calls"]["rows"] == 3
    assert manifest["pipeline_sql"]["330_samples.sql"]
    assert {k: v for k, v in manifest["audits"].items() if k.startswith("audit_samples")} == {
        "audit_samples_completion_once": 0,
        "audit_samples_lengths": 0,
        "audit_samples_logprobs_length": 0,
        "audit_samples_unresolved": 0,
    }


def test_samples_hold_the_included_rollouts_and_calls_hold_no_bodies(
    run_dir: Path, tmp_path: Path
) -> None:
    out = snapshot_of(run_dir, tmp_path / "s001")
    samples = pq.read_table(out / FILES["samples"]).to_pylist()
    # r3 timed out: dropped by the default GRPO partial rule, so r1 and r2 form the group.
    assert {s["rollout_id"] for s in samples} == {"r1", "r2"}
    (r1,) = [s for s in samples if s["rollout_id"] == "r1"]
    assert r1["call_ids"] == ["a1", "a2"] and r1["input_ids"] == [1, 2, 3, 4, 5, 6]
    assert r1["loss_mask"] == [0, 0, 1, 0, 1, 1] and r1["advantage"] > 0
    calls = pq.read_table(out / FILES["calls"])
    assert "response_json" not in calls.column_names
    assert "prompt_ids" not in calls.column_names
    assert {"agent_key", "parent_call_id", "depth"} <= set(calls.column_names)
    assert calls.num_rows == 4


def test_writing_into_an_existing_snapshot_is_refused(run_dir: Path, tmp_path: Path) -> None:
    out = snapshot_of(run_dir, tmp_path / "s001")
    before = {p: sha256(p) for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SnapshotExists, match="never modified"):
        write_snapshot(run_dir, out, con=connect(run_dir))
    assert {p: sha256(p) for p in out.rglob("*") if p.is_file()} == before
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SnapshotExists):
        write_snapshot(run_dir, empty, con=connect(run_dir))
    assert list(empty.iterdir()) == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failed_snapshot_leaves_nothing_behind(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any) -> int:
        raise RuntimeError("disk full")

    monkeypatch.setattr(snapshot, "_write_query", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        snapshot_of(run_dir, tmp_path / "snaps" / "s001")
    assert list((tmp_path / "snaps").iterdir()) == []


def test_filters_select_trajectories(run_dir: Path) -> None:
    con = connect(run_dir)
    assert select_rollouts(con, TrajectoryFilter(min_reward=1.0)) == ["r1", "r3"]
    assert select_rollouts(con, TrajectoryFilter(statuses=("timed_out",))) == ["r3"]
    assert select_rollouts(con, TrajectoryFilter(where="rollout_id <> 'r1'")) == ["r2", "r3"]
    assert (
        select_rollouts(
            con, TrajectoryFilter(where="n_calls = 1", min_reward=1.0, statuses=("complete",))
        )
        == []
    )
    with pytest.raises(FilterError):
        select_rollouts(con, TrajectoryFilter(where="no_such_column > 1"))
    with pytest.raises(FilterError):
        select_rollouts(con, TrajectoryFilter(where="true; DROP VIEW calls"))
    assert con.sql("SELECT count(*) FROM calls").fetchall() == [(4,)]


def load_offline(code: str, home: Path) -> str:
    """Run ``code`` in a fresh interpreter with the Hugging Face hub unreachable."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))},
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(home),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_snapshot_loads_with_datasets_offline(run_dir: Path, tmp_path: Path) -> None:
    out = snapshot_of(run_dir, tmp_path / "s001")
    code = f"""
import json, datasets
ds = datasets.load_dataset("parquet", data_dir={str(out)!r})
train = ds["train"]
trajectories = datasets.load_dataset({str(out)!r}, "trajectories")["train"]
calls = datasets.load_dataset({str(out)!r}, "calls")["train"]
print(json.dumps({{
    "splits": sorted(ds),
    "samples": sorted(train["sample_id"]),
    "columns": train.column_names,
    "first": train.sort("sample_id")[0],
    "trajectories": sorted(trajectories["rollout_id"]),
    "calls": calls.num_rows,
}}))
"""
    got = json.loads(load_offline(code, tmp_path / "hf"))
    assert got["splits"] == ["train"]
    assert got["samples"] == ["a1", "b1"]
    assert {"input_ids", "loss_mask", "old_logprobs", "advantage", "group_id"} <= set(
        got["columns"]
    )
    assert got["first"]["input_ids"] == [1, 2, 3, 4, 5, 6]
    assert got["first"]["loss_mask"] == [0, 0, 1, 0, 1, 1]
    assert got["trajectories"] == ["r1", "r2", "r3"] and got["calls"] == 4


def test_a_record_mode_snapshot_has_no_samples_and_loads_its_tables(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_shard(root, "calls", "calls", [call_row("a", 0, rollout_id="r1")])
    out = snapshot_of(root, tmp_path / "s001")
    assert read_manifest(out)["tables"]["samples"]["rows"] == 0
    assert pq.read_schema(out / FILES["samples"]).names[:2] == ["sample_id", "rollout_id"]
    # datasets refuses empty splits, so the tables load through the card's configs.
    code = f"""
import datasets
print(list(datasets.load_dataset({str(out)!r}, "trajectories")["train"]["rollout_id"]))
"""
    assert load_offline(code, tmp_path / "hf").strip() == "['r1']"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="forge")
    cmd_snapshot.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_the_cli_writes_a_snapshot_and_refuses_to_rewrite_it(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "snapshots" / "s001"
    args = parse(["snapshot", "--data", str(run_dir), "--out", str(out), "--min-reward", "1",
                  "--status", "complete"])  # fmt: skip
    assert args.func(args) == 0
    assert str(out) in capsys.readouterr().out
    manifest = read_manifest(out)
    assert manifest["filters"]["status"] == ["complete"] and manifest["rollouts"] == 1
    assert manifest["audits"] and not any(manifest["audits"].values()), manifest["audits"]
    assert manifest["tables"]["samples"]["rows"] == 1
    with pytest.raises(ForgeError, match="already exists"):
        args.func(args)
    bad = parse(["snapshot", "--data", str(run_dir), "--out", str(tmp_path / "s2"),
                 "--where", "nope("])  # fmt: skip
    with pytest.raises(ForgeError, match="--where"):
        bad.func(bad)
    assert not (tmp_path / "s2").exists()
    # Unfiltered, the audits read the samples file as written.
    whole = parse(["snapshot", "--data", str(run_dir), "--out", str(tmp_path / "s3")])
    assert whole.func(whole) == 0
    manifest = read_manifest(tmp_path / "s3")
    assert not any(manifest["audits"].values()) and manifest["tables"]["samples"]["rows"] == 2


def test_the_sources_are_the_shards_the_views_read(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_connect = snapshot.store.connect
    opened: list[int] = []

    def connect_while_a_shard_lands(data_dir: Path, **kwargs: Any) -> duckdb.DuckDBPyConnection:
        con = real_connect(data_dir, **kwargs)
        if not opened:  # a writer adds a shard right after the first connect
            write_shard(run_dir, "rewards", "rewards-late", [reward_row("r2", 1.0)])
        opened.append(1)
        return con

    monkeypatch.setattr(snapshot.store, "connect", connect_while_a_shard_lands)
    con, sources = snapshot.open_stable(run_dir)
    assert len(opened) == 2, "the listing changed, so the store was opened again"
    assert [p.name for p in sources] == [
        "calls-0.parquet",
        "calls-1.parquet",
        "rollouts.parquet",
        "rewards-late.parquet",
        "rewards.parquet",
    ]
    assert con.sql("SELECT count(*) FROM rewards").fetchall() == [(4,)]


def test_grpo_rules_from_the_cli_change_the_samples_and_are_in_the_manifest(
    run_dir: Path, tmp_path: Path
) -> None:
    """r3 timed out: dropped by default, kept with reward 0 under --grpo partial=zero."""
    default = parse(["snapshot", "--data", str(run_dir), "--out", str(tmp_path / "s1")])
    assert default.func(default) == 0
    manifest = read_manifest(tmp_path / "s1")
    assert manifest["grpo"]["partial"] == "drop" and manifest["grpo"]["eps"] == 1e-6
    assert manifest["tables"]["samples"]["rows"] == 2

    zero = parse(["snapshot", "--data", str(run_dir), "--out", str(tmp_path / "s2"),
                  "--grpo", "partial=zero", "--grpo", "normalize_std=false"])  # fmt: skip
    assert zero.func(zero) == 0
    manifest = read_manifest(tmp_path / "s2")
    assert manifest["grpo"]["partial"] == "zero" and manifest["grpo"]["normalize_std"] is False
    samples = pq.read_table(tmp_path / "s2" / FILES["samples"]).to_pylist()
    by_rollout = {s["rollout_id"]: s["advantage"] for s in samples}
    # Dr. GRPO: rewards 1, 0, 0 minus their mean 1/3, no std division.
    assert by_rollout == pytest.approx({"r1": 2 / 3, "r2": -1 / 3, "r3": -1 / 3})

    for bad, words in (("partial=maybe", "partial must be one of"), ("nope=1", "NAME=VALUE")):
        args = parse(["snapshot", "--data", str(run_dir), "--out", str(tmp_path / "s3"),
                      "--grpo", bad])  # fmt: skip
        with pytest.raises(ForgeError, match=words):
            args.func(args)
    assert not (tmp_path / "s3").exists()
