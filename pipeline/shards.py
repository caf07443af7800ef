"""Atomic Parquet shards: temporary file, fsync, rename, fsync of the directory."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.atomic import atomic_file
from pipeline.schema import TABLES, with_version


def write_shard(root: Path, table: str, name: str, rows: list[dict[str, Any]]) -> Path:
    """Write rows of ``table`` to ``root/<table>/<name>.parquet`` so it appears whole or not at all."""
    directory = root / table
    directory.mkdir(parents=True, exist_ok=True)
    schema = with_version(TABLES[table])
    data = pa.Table.from_pylist(rows, schema=schema)
    final = directory / f"{name}.parquet"
    # A fixed temporary name: remove_stale_temporaries finds what a killed write left.
    with atomic_file(final, tmp=directory / f".{name}.parquet.tmp") as f:
        pq.write_table(data, f, compression="zstd")
    return final


def shard_files(root: Path, table: str) -> list[Path]:
    """Complete shards of a table (temporary files of an interrupted write are ignored)."""
    directory = root / table
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.parquet") if not p.name.startswith("."))


def read_column_values(root: Path, table: str, columns: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in shard_files(root, table):
        out.extend(pq.read_table(path, columns=columns).to_pylist())
    return out


def remove_stale_temporaries(root: Path) -> int:
    """Delete temporary files left by a write that was killed; returns how many."""
    n = 0
    for table in TABLES:
        directory = root / table
        if directory.is_dir():
            for p in directory.glob(".*.parquet.tmp"):
                p.unlink(missing_ok=True)
                n += 1
    return n


def write_rows(root: Path, table: str, rows: list[dict[str, Any]], name: str | None = None) -> Path:
    """Write rows to a new shard named by time and a random suffix (for small writers:
    rollout and reward rows)."""
    shard = name or f"{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(4).hex()}"
    return write_shard(root, table, shard, rows)
