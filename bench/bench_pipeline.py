"""Stitch and group N recorded calls, timed against a plain DuckDB scan of the same files.

    python -m bench.bench_pipeline --calls 1000000

"Stitch and group" is what a snapshot does: every view that ``edges``, ``call_nodes``,
``trajectories`` and ``groups`` are built from is materialised in dependency order
(``CREATE TABLE ... AS SELECT * FROM view``, and the view then reads the table), on a
connection from ``pipeline.store.connect``. The baseline is one plain scan of the same
Parquet files through the same ``pipeline.store`` views, reading every column that the
stitching plan reads (found with ``EXPLAIN``): the least any stitching could cost.
Both are measured side by side in one run: a warm-up scan, then best of ``--repeat``.

The shards come from ``bench.gen_shards`` (cached under ``bench/out/``), or ``--data``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb

from bench import results
from bench.gen_shards import MANIFEST, Settings, generate, manifest_settings
from pipeline import store
from pipeline.schema import TABLES

TARGETS = ("edges", "call_nodes", "trajectories", "groups")
OUT_DIR = Path(__file__).resolve().parent / "out"
_COMMENT = re.compile(r"--[^\n]*")
_DEFINES = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(VIEW|MACRO)\s+(\w+)", re.IGNORECASE)


# -- which views, which columns ---------------------------------------------------------------


def derived_definitions() -> list[tuple[str, str, str]]:
    """(kind, name, sql) of every view and macro of pipeline/sql, in the order they run."""
    out: list[tuple[str, str, str]] = []
    for file in store.derived_sql_files():
        sql = store.sql_text(file[: -len(".sql")])
        out.extend((m.group(1).upper(), m.group(2).lower(), sql) for m in _DEFINES.finditer(sql))
    return out


def materialisation_order(targets: tuple[str, ...] = TARGETS) -> list[str]:
    """The views the targets are built from (through views and macros), targets included,
    in the order pipeline/sql defines them (so each comes after what it reads)."""
    defs = derived_definitions()
    names = {name for _, name, _ in defs}
    code = {name: _COMMENT.sub("", sql) for _, name, sql in defs}
    refs = {
        name: {o for o in names if o != name and re.search(rf"\b{o}\b", code[name], re.I)}
        for name in names
    }
    missing = [t for t in targets if t not in names]
    if missing:
        raise LookupError(f"pipeline/sql defines no view {missing}; is the pipeline complete?")
    needed: set[str] = set()
    stack = list(targets)
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(refs.get(name, ()))
    return [name for kind, name, _ in defs if kind == "VIEW" and name in needed]


def sql_fingerprint() -> str:
    """sha256 over every pipeline/sql file (name and text), in order."""
    digest = hashlib.sha256()
    folder = resources.files("pipeline").joinpath("sql")
    for path in sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=str):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _walk_plan(node: Any, out: list[list[str]]) -> None:
    if isinstance(node, list):
        for child in node:
            _walk_plan(child, out)
        return
    info = node.get("extra_info") or {}
    if node.get("name") == "READ_PARQUET" and isinstance(info, dict):
        projections = info.get("Projections") or []
        out.append([projections] if isinstance(projections, str) else list(projections))
    for child in node.get("children", []):
        _walk_plan(child, out)


def scanned_columns(
    con: duckdb.DuckDBPyConnection, targets: tuple[str, ...] = TARGETS
) -> dict[str, list[str]]:
    """table -> the columns the targets' plans read from its Parquet files."""
    reads: list[list[str]] = []
    for target in targets:
        for _, plan in con.execute(f"EXPLAIN (FORMAT json) SELECT * FROM {target}").fetchall():
            _walk_plan(json.loads(plan), reads)
    columns: dict[str, set[str]] = {}
    for projection in reads:
        wanted = set(projection)
        # A plan does not name its files; a projection belongs to every table that has
        # all of its columns (rarely more than one: the scan then reads a little more).
        for table, schema in TABLES.items():
            if wanted and wanted <= set(schema.names):
                columns.setdefault(table, set()).update(wanted)
    return {t: sorted(c, key=TABLES[t].names.index) for t, c in columns.items()}


def scan_sql(table: str, columns: list[str]) -> str:
    """One pass over the columns: strings measured, everything else hashed."""
    schema = TABLES[table]
    terms = ["count(*)"]
    for name in columns:
        if str(schema.field(name).type) == "string":
            terms.append(f"sum(strlen({name}))")
        else:
            terms.append(f"bit_xor(hash({name}))")
    return f"SELECT {', '.join(terms)} FROM {table}"


# -- the measurement ---------------------------------------------------------------------------


@dataclass
class Measurement:
    calls: int
    data: str
    scan_seconds: list[float] = field(default_factory=list)
    pipeline_seconds: list[float] = field(default_factory=list)
    view_seconds: dict[str, float] = field(default_factory=dict)  # best run's, per view
    rows: dict[str, int] = field(default_factory=dict)
    columns: dict[str, list[str]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    generate_seconds: float | None = None
    threads: int = 0
    memory_limit: str = ""
    bytes: int = 0
    sql_sha: str = ""  # sha256 of pipeline/sql/*.sql: which version of the views was timed

    @property
    def scan(self) -> float:
        return min(self.scan_seconds)

    @property
    def pipeline(self) -> float:
        return min(self.pipeline_seconds)

    @property
    def ratio(self) -> float:
        return self.pipeline / self.scan


def default_memory_limit() -> str:
    """Half the machine's memory: DuckDB's default (80%) leaves too little on a shared
    machine, and what does not fit spills to the temporary directory."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return "8GB"
    return f"{max(1, total // 2**31)}GB"


MEMORY_LIMIT = default_memory_limit()


def _connect(data: Path, tmp: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"temp_directory": str(tmp), "memory_limit": MEMORY_LIMIT})
    return store.connect(data, con)


def time_scan(data: Path, columns: dict[str, list[str]], tmp: Path) -> float:
    con = _connect(data, tmp)
    try:
        started = time.perf_counter()
        for table, cols in columns.items():
            con.execute(scan_sql(table, cols)).fetchall()
        return time.perf_counter() - started
    finally:
        con.close()


def time_pipeline(
    data: Path, order: list[str], tmp: Path, progress: bool = False
) -> tuple[float, dict[str, float], dict[str, int]]:
    con = _connect(data, tmp)
    seconds: dict[str, float] = {}
    rows: dict[str, int] = {}
    try:
        started = time.perf_counter()
        for view in order:
            t = time.perf_counter()
            con.execute(f"CREATE TABLE bench_{view} AS SELECT * FROM {view}")
            con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM bench_{view}")
            seconds[view] = time.perf_counter() - t
            if progress:
                print(f"  {view}: {seconds[view]:.2f} s", file=sys.stderr, flush=True)
        total = time.perf_counter() - started
        for view in TARGETS:
            (rows[view],) = con.execute(f"SELECT count(*) FROM bench_{view}").fetchone() or (0,)
        return total, seconds, rows
    finally:
        con.close()


def prepare_data(
    calls: int, seed: int, workers: int, data: Path | None, work: Path = OUT_DIR
) -> tuple[Path, float | None]:
    """The shards to measure: ``data``, or generated once under ``work``."""
    if data is not None:
        return data, None
    target = work / f"pipeline-{results.size_label(calls)}-seed{seed}"
    settings = Settings(calls=calls, seed=seed, workers=workers)
    manifest = target / MANIFEST
    if manifest.exists():
        made = json.loads(manifest.read_text())
        if made.get("settings") == manifest_settings(settings):
            return target, made.get("seconds")
    if target.exists():
        shutil.rmtree(target)
    return target, generate(settings, target).seconds


def measure(
    calls: int,
    seed: int = 0,
    repeat: int = 3,
    workers: int = 2,
    data: Path | None = None,
    work: Path = OUT_DIR,
) -> Measurement:
    path, gen_seconds = prepare_data(calls, seed, workers, data, work)
    tmp = work / "duckdb-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    m = Measurement(
        calls=calls, data=str(path), generate_seconds=gen_seconds, memory_limit=MEMORY_LIMIT
    )
    m.bytes = sum(
        p.stat().st_size for t in ("calls", "messages") for p in store.shard_paths(path, t)
    )
    m.order = materialisation_order()
    m.sql_sha = sql_fingerprint()
    con = _connect(path, tmp)
    try:
        m.columns = scanned_columns(con)
        (m.threads,) = con.execute("SELECT current_setting('threads')").fetchone() or (0,)
        (n,) = con.execute("SELECT count(*) FROM calls").fetchone() or (0,)
        m.calls = int(n)
    finally:
        con.close()
    try:
        _repeat(m, path, tmp, repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return m


def _repeat(m: Measurement, path: Path, tmp: Path, repeat: int) -> None:
    time_scan(path, m.columns, tmp)  # warm-up: the files are in the page cache for both
    best = float("inf")
    for i in range(repeat):
        m.scan_seconds.append(time_scan(path, m.columns, tmp))
        print(f"run {i + 1}/{repeat}: scan {m.scan_seconds[-1]:.2f} s", file=sys.stderr)
        total, per_view, rows = time_pipeline(path, m.order, tmp, progress=True)
        m.pipeline_seconds.append(total)
        print(f"run {i + 1}/{repeat}: stitch and group {total:.2f} s", file=sys.stderr)
        if total < best:
            best, m.view_seconds, m.rows = total, per_view, rows


def render(m: Measurement) -> tuple[dict[str, float], str]:
    label = results.size_label(m.calls)
    figures = {
        f"pipeline.stitch_ratio_vs_scan_{label}": round(m.ratio, 2),
        f"pipeline.stitch_seconds_{label}": round(m.pipeline, 2),
        f"pipeline.scan_seconds_{label}": round(m.scan, 3),
    }
    n_cols = sum(len(c) for c in m.columns.values())
    lines = [
        f"Stitch and group {m.calls:,} calls ({m.bytes / 1e6:,.0f} MB of calls + messages "
        f"shards), DuckDB {duckdb.__version__}, {m.threads} threads, memory limit "
        f"{m.memory_limit}, best of "
        f"{len(m.pipeline_seconds)} after a warm-up scan.",
        "",
        "| step | seconds | rows |",
        "| --- | ---: | ---: |",
        f"| plain scan ({n_cols} columns of {', '.join(m.columns)}) | {m.scan:.2f} | |",
    ]
    for view in m.order:
        rows = f"{m.rows[view]:,}" if view in m.rows else ""
        lines.append(f"| {view} | {m.view_seconds.get(view, 0.0):.2f} | {rows} |")
    lines += [
        f"| **stitch and group (total)** | **{m.pipeline:.2f}** | |",
        f"| **ratio to the scan** | **{m.ratio:.1f}x** | |",
        "",
        "Every run, seconds: scan "
        + ", ".join(f"{s:.2f}" for s in m.scan_seconds)
        + "; stitch and group "
        + ", ".join(f"{s:.2f}" for s in m.pipeline_seconds)
        + f". pipeline/sql: {m.sql_sha[:12]}.",
    ]
    return figures, "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_pipeline", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--workers", type=int, default=2, help="processes generating shards")
    parser.add_argument("--data", type=Path, help="measure these shards instead of generating")
    parser.add_argument(
        "--work",
        type=Path,
        default=OUT_DIR,
        help="where generated shards are cached (default: bench/out)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=results.BENCH_DIR,
        help="folder of results.json and results.md to update (default: bench/)",
    )
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    m = measure(args.calls, args.seed, args.repeat, args.workers, args.data, args.work)
    figures, table = render(m)
    print(table)
    print(json.dumps(figures, indent=2))
    if not args.no_record:
        details = {k: v for k, v in asdict(m).items() if k != "columns"}
        details["columns"] = m.columns
        results.record(
            "pipeline",
            figures,
            table,
            details,
            command=results.command_line("bench.bench_pipeline", argv),
            json_path=args.results / "results.json",
            md_path=args.results / "results.md",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
