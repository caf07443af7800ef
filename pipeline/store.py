"""Open a run directory as DuckDB views: ``connect(data_dir)``.

``connect`` makes one view per stored table (``calls``, ``messages``, ``endpoints``,
``rollouts``, ``rewards``) over every complete shard under ``data_dir/<table>/``, with
exactly the columns and types of ``pipeline.schema`` (shards written before a column
existed read it as NULL), then runs every ``pipeline/sql/NNN_*.sql`` file in order:
each defines one derived view or macro (``edges``, ``trajectories``, ``groups``, ...).
Audits (``pipeline/sql/audit_*.sql``) are queries run by ``audits()``.

The views are recomputed by every query that reads them. ``connect(..., stitched=True)``
(what the ``forge`` commands use) computes the call tree once, into temporary tables,
so that queries reading it several times do not stitch again; the tree is then that of
the shards present at connect time.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

import duckdb
import pyarrow as pa

from pipeline.schema import TABLES

# Views computed once by connect(stitched=True), in dependency order.
STITCHED_VIEWS = ("stitch_edges", "call_nodes")

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


class StoreError(ValueError):
    """A run directory whose shards cannot be read (the message names them)."""


def connect(
    data_dir: str | Path,
    con: duckdb.DuckDBPyConnection | None = None,
    *,
    stitched: bool = False,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection over one run directory, with every Forge view defined.

    With ``stitched``, the call tree (STITCHED_VIEWS) is computed now, once, and the
    views read that result from then on (see ``materialize``).
    """
    con = con or duckdb.connect()
    # Shards are immutable once renamed into place: their footers can be cached, which
    # saves re-reading them each time a view over them is bound.
    con.execute("SET parquet_metadata_cache = true")
    for table, schema in TABLES.items():
        # The empty typed table fixes the columns and their types; shards union in by name.
        con.register(f"_schema_{table}", pa.Table.from_pylist([], schema=schema))
        files = [str(p) for p in shard_paths(data_dir, table)]
        if files:
            listing = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            try:
                con.execute(
                    f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM _schema_{table} UNION ALL "
                    f"BY NAME SELECT * FROM read_parquet([{listing}], union_by_name = true)"
                )
            except duckdb.Error as e:  # a file that is not Parquet, or not readable
                message = str(e).splitlines()[0]
                raise StoreError(
                    f"cannot read the {table} shards under {data_dir}: {message}"
                ) from None
        else:
            con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM _schema_{table}")
    for name in derived_sql_files():
        con.execute(_sql_dir().joinpath(name).read_text())
    if stitched:
        materialize(con)
    return con


_DEFINES = re.compile(r"CREATE\s+OR\s+REPLACE\s+(?:VIEW|MACRO)\s+([a-z_][a-z0-9_]*)", re.I)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def derived_names() -> frozenset[str]:
    """Names of the views and macros pipeline/sql defines."""
    return frozenset(
        m.group(1).lower()
        for name in derived_sql_files()
        for m in _DEFINES.finditer(_sql_dir().joinpath(name).read_text())
    )


def names_derived(query: str) -> bool:
    """Whether the query text names a derived view or macro (a word match: a column or
    alias of the same name counts too, which only costs computing the tree)."""
    return not derived_names().isdisjoint(w.lower() for w in _WORD.findall(query))


def materialize(con: duckdb.DuckDBPyConnection, names: tuple[str, ...] = STITCHED_VIEWS) -> None:
    """Compute each named view once into a temporary table and point the view at it, in
    order (a later view then reads the earlier tables). Every view that reads them, e.g.
    ``trajectories`` through ``call_nodes``, stops recomputing the stitching."""
    for name in names:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _stored_{name} AS FROM {name}")
        con.execute(f"CREATE OR REPLACE VIEW {name} AS FROM _stored_{name}")


def audits(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Rows returned by each audit query (every one must be 0)."""
    out: dict[str, int] = {}
    for name in audit_names():
        query = f"SELECT count(*) FROM ({sql_text(name).rstrip().rstrip(';')})"
        # fetchall, not fetchone: DuckDB 2.0 keeps a fetchone result open on the connection.
        ((n,),) = con.execute(query).fetchall()
        out[name] = int(n)
    return out
