"""Open a run directory as DuckDB views: ``connect(data_dir)``.

``connect`` makes one view per stored table (``calls``, ``messages``, ``endpoints``,
``rollouts``, ``rewards``) over every complete shard under ``data_dir/<table>/``, with
exactly the columns and types of ``pipeline.schema`` (shards written before a column
existed read it as NULL), then runs every ``pipeline/sql/NNN_*.sql`` file in order:
each defines one derived view or macro (``edges``, ``trajectories``, ``groups``, ...).
Audits (``pipeline/sql/audit_*.sql``) are queries run by ``audits()``.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

import duckdb
import pyarrow as pa

from pipeline.schema import TABLES

_DERIVED = re.compile(r"^\d{3}_[a-z0-9_]+\.sql$")
_AUDIT = re.compile(r"^audit_[a-z0-9_]+\.sql$")


def _sql_dir() -> Traversable:
    return resources.files("pipeline").joinpath("sql")


def sql_text(name: str) -> str:
    """The text of ``pipeline/sql/<name>.sql``."""
    return _sql_dir().joinpath(f"{name}.sql").read_text()


def derived_sql_files() -> list[str]:
    """Names of the view/macro files, in the order they are run."""
    return sorted(p.name for p in _sql_dir().iterdir() if _DERIVED.match(p.name))


def audit_names() -> list[str]:
    return sorted(p.name[: -len(".sql")] for p in _sql_dir().iterdir() if _AUDIT.match(p.name))


def shard_paths(data_dir: str | Path, table: str) -> list[Path]:
    directory = Path(data_dir) / table
    return sorted(p for p in directory.glob("*.parquet") if not p.name.startswith("."))


def connect(
    data_dir: str | Path, con: duckdb.DuckDBPyConnection | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection over one run directory, with every Forge view defined."""
    con = con or duckdb.connect()
    for table, schema in TABLES.items():
        # The empty typed table fixes the columns and their types; shards union in by name.
        con.register(f"_schema_{table}", pa.Table.from_pylist([], schema=schema))
        files = [str(p) for p in shard_paths(data_dir, table)]
        if files:
            listing = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            con.execute(
                f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM _schema_{table} "
                f"UNION ALL BY NAME SELECT * FROM read_parquet([{listing}], union_by_name = true)"
            )
        else:
            con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM _schema_{table}")
    for name in derived_sql_files():
        con.execute(_sql_dir().joinpath(name).read_text())
    return con


def audits(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Rows returned by each audit query (every one must be 0)."""
    out: dict[str, int] = {}
    for name in audit_names():
        query = f"SELECT count(*) FROM ({sql_text(name).rstrip().rstrip(';')})"
        # fetchall, not fetchone: DuckDB 2.0 keeps a fetchone result open on the connection.
        ((n,),) = con.execute(query).fetchall()
        out[name] = int(n)
    return out
