"""Immutable dataset snapshots: ``write_snapshot(con, data_dir, out, filters)``.

A snapshot is a directory that ``datasets`` loads offline and a trainer reads as Parquet::

    s001/
      manifest.json                            sources (shards + sha256), rows, filters, versions
      README.md                                dataset card: one ``datasets`` config per table
      data/train-00000-of-00001.parquet        samples (the default config's train split)
      trajectories/trajectories-00000-of-00001.parquet
      groups/groups-00000-of-00001.parquet
      calls/calls-00000-of-00001.parquet       call metadata and tree place, no bodies or ids
      images/images-00000-of-00001.parquet     the images the samples show, once each, by hash

``datasets.load_dataset("parquet", data_dir="s001")`` gives the samples as its train
split (the ``data/<split>-NNNNN-of-NNNNN`` file layout); ``load_dataset("s001",
"trajectories")`` reads another table through the card's configs. ``datasets`` refuses
empty splits, so a snapshot without samples (a record-mode run) loads only table by table. The snapshot is
written to a temporary directory next to ``out`` and renamed into place, so it appears
whole or not at all; an existing ``out`` is never written into (``SnapshotExists``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import store
from pipeline.atomic import atomic_directory, fsync_dir, fsync_file
from pipeline.grpo import GroupSettings, apply_settings, sql_settings
from pipeline.samples import SAMPLES, iter_samples
from pipeline.schema import IMAGES, SCHEMA_VERSION, TABLES

logger = logging.getLogger(__name__)

FORMAT = "forge.snapshot/1"
# Relative paths of each table's file; samples sit where datasets looks for a train split.
FILES = {
    "samples": "data/train-00000-of-00001.parquet",
    "trajectories": "trajectories/trajectories-00000-of-00001.parquet",
    "groups": "groups/groups-00000-of-00001.parquet",
    "calls": "calls/calls-00000-of-00001.parquet",
    # The images the samples show (a vision policy's), each once, by hash.
    "images": "images/images-00000-of-00001.parquet",
}
# Calls columns left out of a snapshot: bodies, headers and token lists (samples hold those).
CALLS_LEFT_OUT = (
    "response_json",
    "request_headers",
    "response_headers",
    "prompt_ids",
    "completion_ids",
    "completion_logprobs",
)
_BATCH_ROWS = 65_536
# Views that several snapshot tables (and the audits) read: computed once per snapshot
# when the snapshot opens its own connection (stitching a run is the costly part).
# Allow-listed identifiers, in dependency order; names not defined are skipped.
MATERIALIZE = ("stitch_edges", "edges", "call_nodes", "trajectories", "groups", "token_calls")
_HASH_CHUNK = 1 << 20


class SnapshotExists(FileExistsError):
    """The output directory exists: snapshots are never modified."""


class SnapshotError(RuntimeError):
    """A run directory whose tables do not make a whole snapshot."""


class FilterError(ValueError):
    """A trajectory filter that is not one SQL expression over ``trajectories``."""


@dataclass(frozen=True)
class TrajectoryFilter:
    """Which rollouts to keep, by their ``trajectories`` row; empty: all of them."""

    where: str | None = None
    """A SQL boolean expression over trajectories' columns, e.g. ``harness = 'codex'``."""
    min_reward: float | None = None
    """Keep rollouts whose reward is at least this (ungraded rollouts are left out)."""
    statuses: tuple[str, ...] = ()
    """Keep rollouts with one of these statuses (complete, partial, crashed, timed_out)."""

    @property
    def empty(self) -> bool:
        return self.where is None and self.min_reward is None and not self.statuses

    def describe(self) -> dict[str, Any]:
        return {"where": self.where, "min_reward": self.min_reward, "status": list(self.statuses)}


# $min_reward and $statuses are parameters; the user's --where expression is appended as
# SQL text (it is the user's own query, like `forge sql`), checked to be one expression.
_SELECT_ROLLOUTS = """
SELECT rollout_id
FROM trajectories
WHERE ($min_reward IS NULL OR reward >= $min_reward)
    AND (len($statuses) = 0 OR list_contains($statuses, status))
"""


def select_rollouts(con: duckdb.DuckDBPyConnection, filters: TrajectoryFilter) -> list[str]:
    """Ids of the trajectories the filter keeps, sorted."""
    sql = _SELECT_ROLLOUTS
    if filters.where is not None:
        where = filters.where.strip()
        probe = f"SELECT 1 FROM trajectories WHERE ({where})"
        try:
            statements = con.extract_statements(probe)
        except duckdb.Error as e:
            raise FilterError(f"--where {filters.where!r} is not a SQL expression: {e}") from e
        if len(statements) != 1 or ";" in where:
            raise FilterError(f"--where {filters.where!r} must be one SQL expression")
        sql += f"    AND ({where})\n"
    params = {"min_reward": filters.min_reward, "statuses": list(filters.statuses)}
    try:
        rows = con.sql(sql + "ORDER BY rollout_id", params=params).fetchall()
    except duckdb.Error as e:
        raise FilterError(f"the trajectory filter failed: {e}") from e
    return [str(r[0]) for r in rows]


@dataclass(frozen=True)
class SourceShard:
    table: str
    path: str  # relative to the data directory
    rows: int
    bytes: int
    sha256: str


@dataclass
class SnapshotResult:
    path: Path
    rows: dict[str, int] = field(default_factory=dict)
    audits: dict[str, int] = field(default_factory=dict)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_sources(data_dir: Path) -> list[Path]:
    return [p for table in TABLES for p in store.shard_paths(data_dir, table)]


def describe_sources(data_dir: Path, paths: Iterable[Path]) -> list[SourceShard]:
    out = []
    for p in paths:
        out.append(
            SourceShard(
                table=p.parent.name,
                path=p.relative_to(data_dir).as_posix(),
                rows=pq.ParquetFile(p).metadata.num_rows,
                bytes=p.stat().st_size,
                sha256=sha256_file(p),
            )
        )
    return out


def open_stable(data_dir: Path, attempts: int = 3) -> tuple[duckdb.DuckDBPyConnection, list[Path]]:
    """``store.connect`` plus the shards its views read: listed before and after
    connecting, retried while a writer adds shards in between."""
    for _ in range(attempts):
        before = list_sources(data_dir)
        con = store.connect(data_dir, stitched=True)
        if list_sources(data_dir) == before:
            return con, before
        con.close()
    raise RuntimeError(f"shards kept appearing under {data_dir}; stop the writer and retry")


def materialize(con: duckdb.DuckDBPyConnection, names: Iterable[str] = MATERIALIZE) -> None:
    """Replace each view in ``names`` by a table of its rows, in this connection only.

    A connection's views read a fixed list of shards, so their rows cannot change: the
    tables give the same answers, computed once.
    """
    views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views()").fetchall()}
    for name in names:
        if name not in MATERIALIZE:
            raise ValueError(f"{name!r} is not a view snapshots materialize: {MATERIALIZE}")
        if name in views:
            con.execute(f"CREATE OR REPLACE TEMP TABLE _forge_rows_{name} AS FROM {name}")
            con.execute(f"CREATE OR REPLACE VIEW {name} AS FROM _forge_rows_{name}")


def forge_version() -> str:
    try:
        return importlib.metadata.version("forge-rl")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _calls_query(con: duckdb.DuckDBPyConnection) -> str:
    """Calls metadata joined with its place in the tree (names from the live views)."""
    calls = [r[0] for r in con.sql("SELECT column_name FROM (DESCRIBE calls)").fetchall()]
    nodes = [r[0] for r in con.sql("SELECT column_name FROM (DESCRIBE call_nodes)").fetchall()]
    keep = [c for c in calls if c not in CALLS_LEFT_OUT]
    extra = [n for n in nodes if n not in calls]
    # Identifiers come from the catalogue, quoted: no user text reaches this SQL.
    columns = [f'c."{c}"' for c in keep] + [f'n."{n}"' for n in extra]
    return (
        f"SELECT {', '.join(columns)} FROM calls AS c "
        "LEFT JOIN call_nodes AS n USING (call_id) "
        "WHERE $all OR c.rollout_id IN (SELECT rollout_id FROM _forge_snapshot_rollouts) "
        "ORDER BY c.call_id"
    )


_TRAJECTORIES = """
SELECT * FROM trajectories
WHERE $all OR rollout_id IN (SELECT rollout_id FROM _forge_snapshot_rollouts)
ORDER BY rollout_id
"""
_GROUPS = """
SELECT * FROM groups
WHERE $all OR rollout_id IN (SELECT rollout_id FROM _forge_snapshot_rollouts)
ORDER BY group_id, rollout_id
"""


_IMAGES = """
SELECT hash, any_value(media_type) AS media_type, any_value(bytes) AS bytes,
    any_value(width) AS width, any_value(height) AS height, any_value(data) AS data
FROM images
WHERE hash IN (SELECT hash FROM _forge_snapshot_images)
GROUP BY hash
ORDER BY hash
"""


def _noting_images(
    batches: Iterator[pa.RecordBatch], shown: set[str]
) -> Iterator[pa.RecordBatch]:
    """``batches`` of samples as they are, each one's image hashes added to ``shown``."""
    for batch in batches:
        shown.update(pc.unique(batch.column("images").flatten()).to_pylist())
        yield batch


def _write_images(con: duckdb.DuckDBPyConnection, tmp: Path, hashes: set[str]) -> int:
    """The images ``hashes`` (those the samples name), once each (schema: ``IMAGES``
    without ``first_call_id``)."""
    table = pa.table({"hash": pa.array(sorted(hashes), pa.string())})
    con.register("_forge_snapshot_images", table)
    try:
        schema = pa.schema([f for f in IMAGES if f.name != "first_call_id"])
        reader = con.sql(_IMAGES).to_arrow_reader(_BATCH_ROWS)
        rows = _write_parquet(tmp / FILES["images"], schema, iter(reader))
    finally:
        con.unregister("_forge_snapshot_images")
    if rows != len(hashes):
        raise SnapshotError(f"the samples show {len(hashes)} images, the run holds {rows} of them")
    return rows


def _write_parquet(path: Path, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> int:
    """Write batches to ``path`` (an empty file with the schema when there are none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    with open(path, "wb") as f:
        with pq.ParquetWriter(f, schema, compression="zstd") as writer:
            for batch in batches:
                if batch.num_rows:
                    writer.write_batch(batch.cast(schema) if batch.schema != schema else batch)
                    rows += batch.num_rows
        f.flush()
        os.fsync(f.fileno())
    return rows


def _write_query(con: duckdb.DuckDBPyConnection, path: Path, sql: str, all_rows: bool) -> int:
    reader = con.sql(sql, params={"all": all_rows}).to_arrow_reader(_BATCH_ROWS)
    return _write_parquet(path, reader.schema, iter(reader))


def _card(name: str, manifest: dict[str, Any]) -> str:
    configs = []
    for table, rel in FILES.items():
        pattern = rel.rsplit("-", 3)[0] + "-*.parquet"
        configs += [
            f"- config_name: {table}",
            *(["  default: true"] if table == "samples" else []),
            "  data_files:",
            "  - split: train",
            f"    path: {pattern}",
        ]
    rows = "\n".join(f"| {t} | `{FILES[t]}` | {manifest['tables'][t]['rows']} |" for t in FILES)
    return "\n".join(
        [
            "---",
            "configs:",
            *configs,
            "---",
            "",
            f"# Forge snapshot `{name}`",
            "",
            f"Written by Forge {manifest['forge_version']} at {manifest['created_at']} from "
            f"`{manifest['source']['data_dir']}` (shard schema version "
            f"{manifest['schema_version']}). Immutable: `manifest.json` lists every source "
            "shard with its sha256, the filters and each table's rows.",
            "",
            "| table | file | rows |",
            "| --- | --- | --- |",
            rows,
            "",
            "```python",
            "import datasets",
            f'samples = datasets.load_dataset("parquet", data_dir="{name}")["train"]',
            f'trajectories = datasets.load_dataset("{name}", "trajectories")["train"]',
            "```",
            "",
        ]
    )


def write_snapshot(
    data_dir: str | Path,
    out: str | Path,
    filters: TrajectoryFilter | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
    audit: bool = True,
    group_settings: GroupSettings | None = None,
) -> SnapshotResult:
    """Write the snapshot of ``data_dir`` (filtered by trajectories) to the new directory ``out``.

    ``con`` is a connection over ``data_dir`` (``store.connect``); without one the
    directory is opened here. ``group_settings`` are the GRPO rules of the ``groups`` and
    ``samples`` tables (default: those in force on ``con``, else the defaults); the
    manifest records the ones used. Raises SnapshotExists when ``out`` exists.
    """
    data_dir = Path(data_dir).resolve()
    out = Path(out)
    filters = filters or TrajectoryFilter()
    if out.exists():
        raise SnapshotExists(
            f"{out} already exists and snapshots are never modified: "
            "write to a new directory (e.g. the next number, s002)"
        )
    own = con is None
    if con is None:
        con, sources = open_stable(data_dir)
    else:
        sources = list_sources(data_dir)
    if group_settings is not None:
        apply_settings(con, group_settings)  # before the groups are materialized
    if own:
        materialize(con)
    rollouts = None if filters.empty else select_rollouts(con, filters)

    out.parent.mkdir(parents=True, exist_ok=True)
    result = SnapshotResult(path=out)
    try:
        with atomic_directory(out) as tmp:
            con.register(
                "_forge_snapshot_rollouts",
                pa.table({"rollout_id": pa.array(rollouts or [], pa.string())}),
            )
            all_rows = rollouts is None
            shown: set[str] = set()  # the images the samples name, noted as they are written
            result.rows["samples"] = _write_parquet(
                tmp / FILES["samples"], SAMPLES, _noting_images(iter_samples(con, rollouts), shown)
            )
            result.rows["trajectories"] = _write_query(
                con, tmp / FILES["trajectories"], _TRAJECTORIES, all_rows
            )
            result.rows["groups"] = _write_query(con, tmp / FILES["groups"], _GROUPS, all_rows)
            result.rows["calls"] = _write_query(
                con, tmp / FILES["calls"], _calls_query(con), all_rows
            )
            con.unregister("_forge_snapshot_rollouts")
            result.rows["images"] = _write_images(con, tmp, shown)
            if audit:
                if own and rollouts is None:
                    # The file holds every sample: audit it (the Arrow path) instead of
                    # recomputing the SQL view. Audits cover the whole run, filtered or not.
                    written = str(tmp / FILES["samples"]).replace("'", "''")
                    con.execute(f"CREATE OR REPLACE VIEW samples AS FROM read_parquet('{written}')")
                result.audits = _run_audits(con)

            created_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
            manifest: dict[str, Any] = {
                "format": FORMAT,
                "name": out.name,
                "created_at": created_at,
                "forge_version": forge_version(),
                "schema_version": SCHEMA_VERSION,
                "filters": filters.describe(),
                "grpo": asdict(sql_settings(con)),
                "rollouts": len(rollouts) if rollouts is not None else result.rows["trajectories"],
                "tables": {
                    table: {
                        "path": rel,
                        "rows": result.rows[table],
                        "bytes": (tmp / rel).stat().st_size,
                        "sha256": sha256_file(tmp / rel),
                    }
                    for table, rel in FILES.items()
                },
                "source": {
                    "data_dir": str(data_dir),
                    "shards": [asdict(s) for s in describe_sources(data_dir, sources)],
                },
                "pipeline_sql": {
                    name: hashlib.sha256(store.sql_text(name[:-4]).encode()).hexdigest()
                    for name in store.derived_sql_files()
                },
                "audits": result.audits if audit else None,
            }
            (tmp / "manifest.json").write_text(
                json.dumps(manifest, indent=2, sort_keys=True) + "\n"
            )
            (tmp / "README.md").write_text(_card(out.name, manifest))
            for path in sorted(tmp.rglob("*"), reverse=True):
                if path.is_file():
                    fsync_file(path)
                    # Read-only: a reminder that a snapshot is never modified.
                    path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
                fsync_dir(path if path.is_dir() else path.parent)
            if out.exists():
                raise SnapshotExists(f"{out} appeared while the snapshot was written; not replaced")
    finally:
        if own:
            con.close()
    logger.debug("snapshot %s: %s", out, result.rows)
    return result


def _run_audits(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in store.audit_names():
        body = store.sql_text(name).rstrip().rstrip(";")
        rows = con.sql(f"SELECT count(*) FROM ({body})").fetchall()
        out[name] = int(rows[0][0]) if rows else 0
    return out


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the snapshot at ``path``."""
    data: dict[str, Any] = json.loads((Path(path) / "manifest.json").read_text())
    return data
