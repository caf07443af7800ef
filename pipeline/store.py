"""Open a run directory's shards as DuckDB views: ``connect(data_dir)``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import duckdb
import pyarrow as pa

from pipeline.schema import TABLES


def sql_text(name: str) -> str:
    """The text of ``pipeline/sql/<name>.sql``."""
    return resources.files("pipeline").joinpath("sql", f"{name}.sql").read_text()


def connect(
    data_dir: str | Path, con: duckdb.DuckDBPyConnection | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per table (``calls``, ``messages``, ``endpoints``).

    Each view reads every complete shard under ``data_dir/<table>/``; a table with no
    shard yet is an empty view with the schema's columns.
    """
    con = con or duckdb.connect()
    root = Path(data_dir)
    for table, schema in TABLES.items():
        files = sorted(
            str(p) for p in (root / table).glob("*.parquet") if not p.name.startswith(".")
        )
        if files:
            listing = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            con.execute(
                f"CREATE OR REPLACE VIEW {table} AS "
                f"SELECT * FROM read_parquet([{listing}], union_by_name = true)"
            )
        else:
            con.register(f"_empty_{table}", pa.Table.from_pylist([], schema=schema))
            con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM _empty_{table}")
    return con
