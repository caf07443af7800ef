"""``forge sql``: any query over the views, printed as a table, CSV or JSON, or saved as Parquet."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forge_cli import cmd_sql
from mitm_addon.launch import ForgeError
from pipeline.shards import write_shard
from tests.pipeline.runs import call_row, reward_row, rollout_row


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    write_shard(
        root,
        "calls",
        "calls",
        [
            call_row("c1", 0, rollout_id="r-1", model="m", tools=["shell"], error="a\nb"),
            call_row("c2", 1, rollout_id="r-1", model="m", tools=["shell"]),
            call_row("c3", 0, rollout_id="r-2", model="m", tools=["shell"]),
        ],
    )
    write_shard(root, "rollouts", "rollouts", [rollout_row("r-1", "t"), rollout_row("r-2", "t")])
    write_shard(root, "rewards", "rewards", [reward_row("r-1", 1.0), reward_row("r-2", 0.0)])
    return root


def forge_sql(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="forge")
    cmd_sql.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sql", *argv])
    return int(args.func(args))


QUERY = "select rollout_id, n_calls, reward from trajectories order by rollout_id"


def test_table_output_lines_up_the_columns(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert forge_sql("--data", str(run_dir), QUERY) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["rollout_id", "n_calls", "reward"]
    assert lines[2].split() == ["r-1", "2", "1.0"] and lines[3].split() == ["r-2", "1", "0.0"]
    assert lines[-1] == "(2 rows)"
    assert lines[2].index("2") == lines[0].index("n_calls")


def test_csv_and_json_output(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forge_sql("--data", str(run_dir), "--format", "csv", QUERY)
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows == [["rollout_id", "n_calls", "reward"], ["r-1", "2", "1.0"], ["r-2", "1", "0.0"]]
    forge_sql(
        "--data",
        str(run_dir),
        "--format",
        "json",
        "select call_id, tools, started_at, error from calls order by call_id limit 1",
    )
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {
        "call_id": "c1",
        "tools": ["shell"],
        "started_at": "2026-01-01T00:00:00+00:00",
        "error": "a\nb",
    }


def test_parquet_needs_out_and_says_where_it_wrote(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ForgeError, match="--out"):
        forge_sql("--data", str(run_dir), "--format", "parquet", QUERY)
    out = tmp_path / "out" / "t.parquet"
    assert forge_sql("--data", str(run_dir), "--format", "parquet", "--out", str(out), QUERY) == 0
    assert str(out) in capsys.readouterr().err
    assert pq.read_table(out).to_pydict() == {
        "rollout_id": ["r-1", "r-2"],
        "n_calls": [2, 1],
        "reward": [1.0, 0.0],
    }


def test_csv_to_a_file(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    forge_sql("--data", str(run_dir), "--format", "csv", "--out", str(out), QUERY)
    assert out.read_text().splitlines()[0] == "rollout_id,n_calls,reward"


def test_the_query_can_come_from_stdin(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("select count(*) as n from calls"))
    forge_sql("--data", str(run_dir), "--format", "csv", "-")
    assert capsys.readouterr().out.splitlines() == ["n", "3"]


def test_errors_say_what_went_wrong(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ForgeError, match="query failed: .*no_such_table"):
        forge_sql("--data", str(run_dir), "select * from no_such_table")
    with pytest.raises(ForgeError, match="no such run directory"):
        forge_sql("--data", str(tmp_path / "missing"), QUERY)
    with pytest.raises(ForgeError, match="empty query"):
        forge_sql("--data", str(run_dir), "  ")


def test_long_cells_are_cut_in_tables(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forge_sql("--data", str(run_dir), "select repeat('x', 500) as long")
    out = capsys.readouterr().out.splitlines()
    assert out[2].endswith("…") and len(out[2]) == 60


def test_grpo_rules_apply_to_the_groups_view(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One group (task t) with rewards 1 and 0: normalised by default, raw under Dr. GRPO."""
    query = "select rollout_id, advantage from groups order by rollout_id"
    assert forge_sql("--data", str(run_dir), "--format", "json", query) == 0
    default = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert default[0]["advantage"] == pytest.approx(0.5 / (0.5**0.5 + 1e-6))
    argv = ["--data", str(run_dir), "--format", "json", "--grpo", "normalize_std=false", query]
    assert forge_sql(*argv) == 0
    raw = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["advantage"] for r in raw] == pytest.approx([0.5, -0.5])
    with pytest.raises(ForgeError, match="expected true or false"):
        forge_sql("--data", str(run_dir), "--grpo", "normalize_std=sometimes", query)
