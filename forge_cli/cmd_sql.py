"""``forge sql``: run SQL over a run directory's views and print or save the result.

Every relation of the pipeline is a view: the stored tables (``calls``, ``messages``,
``endpoints``, ``rollouts``, ``rewards``) and the derived ones (``edges``, ``call_nodes``,
``trajectories``, ``groups``, ``samples``, ``behaviour``, ...; one per
``pipeline/sql/NNN_*.sql`` file). The same views open from Python::

    from pipeline.store import connect
    con = connect("data/runs/demo")            # a duckdb connection
    con.sql("select * from trajectories").show()

Formats: ``table`` (aligned text, long cells cut), ``csv``, ``json`` (one JSON object
per line) and ``parquet`` (needs ``--out``).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterator, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import duckdb

from forge_cli.cmd_snapshot import add_grpo_argument, group_settings_from
from mitm_addon.launch import ForgeError
from pipeline.grpo import apply_settings
from pipeline.store import connect, names_derived

__all__ = ["add_parser", "run"]

FORMATS = ("table", "csv", "json", "parquet")
# Cells wider than this are cut in table output (use csv or json for whole values).
_TABLE_CELL_CHARS = 60
_FETCH_ROWS = 10_000


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sql",
        help="run SQL over a run directory's views",
        description="Run a SQL query (DuckDB dialect) over every view of a run directory: "
        "calls, messages, rollouts, rewards, edges, call_nodes, trajectories, groups, "
        "samples, behaviour and the others in pipeline/sql. From Python, "
        "pipeline.store.connect(DIR) gives the same views.",
    )
    p.add_argument("--data", type=Path, required=True, help="run directory")
    p.add_argument("query", help="SQL query, or - to read it from standard input")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format")
    p.add_argument("--out", type=Path, default=None, help="write to this file, not stdout")
    add_grpo_argument(p)
    p.set_defaults(func=run)


def _plain(value: Any) -> Any:
    """A JSON-ready value: timestamps as ISO text, decimals as floats, bytes as hex."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _csv_value(value: Any) -> Any:
    """Lists and structs as JSON text; other values as the csv module writes them."""
    if isinstance(value, list | dict):
        return json.dumps(_plain(value), ensure_ascii=False)
    return _plain(value)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    text = value if isinstance(value, str) else json.dumps(_plain(value), ensure_ascii=False)
    text = text.replace("\n", "\\n")
    return text if len(text) <= _TABLE_CELL_CHARS else text[: _TABLE_CELL_CHARS - 1] + "…"


def _rows(relation: duckdb.DuckDBPyRelation) -> Iterator[tuple[Any, ...]]:
    reader = relation.to_arrow_reader(_FETCH_ROWS)
    for batch in reader:
        columns = [c.to_pylist() for c in batch.columns]
        yield from zip(*columns, strict=True)


def write_table(names: Sequence[str], rows: Sequence[tuple[Any, ...]], out: IO[str]) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(n), *(len(r[i]) for r in cells)]) for i, n in enumerate(names)]
    out.write("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip() + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def run(args: argparse.Namespace) -> int:
    query = sys.stdin.read() if args.query == "-" else args.query
    if not query.strip():
        raise ForgeError("empty query: pass SQL, e.g. forge sql --data DIR 'select * from calls'")
    if not args.data.is_dir():
        raise ForgeError(f"--data {args.data}: no such run directory")
    if args.format == "parquet" and args.out is None:
        raise ForgeError("--format parquet writes a file: add --out FILE.parquet")
    settings = group_settings_from(args)
    # A query over a derived view computes the call tree once, not once per reference.
    con = connect(args.data, stitched=names_derived(query))
    try:
        if settings is not None:
            apply_settings(con, settings)
        try:
            relation = con.sql(query)
        except duckdb.Error as e:
            raise ForgeError(f"query failed: {e}") from None
        if relation is None:
            raise ForgeError("the query returned no result: forge sql runs SELECT-like queries")
        names = list(relation.columns)
        try:
            if args.format == "parquet":
                args.out.parent.mkdir(parents=True, exist_ok=True)
                relation.write_parquet(str(args.out), compression="zstd")
            else:
                _write_text(args, names, relation)
        except duckdb.Error as e:
            raise ForgeError(f"query failed: {e}") from None
    finally:
        con.close()
    if args.out is not None:
        print(f"forge: result written to {args.out}", file=sys.stderr)
    return 0


def _write_text(
    args: argparse.Namespace, names: list[str], relation: duckdb.DuckDBPyRelation
) -> None:
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    out: IO[str] = open(args.out, "w", newline="") if args.out else sys.stdout  # noqa: SIM115
    try:
        if args.format == "table":
            write_table(names, list(_rows(relation)), out)
        elif args.format == "csv":
            writer = csv.writer(out)
            writer.writerow(names)
            for row in _rows(relation):
                writer.writerow([_csv_value(v) for v in row])
        else:
            for row in _rows(relation):
                record = dict(zip(names, (_plain(v) for v in row), strict=True))
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
