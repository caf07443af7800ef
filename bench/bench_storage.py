"""Bytes Forge stores for 10-, 100- and 1000-turn trajectories, against raw request logging.

    python -m bench.bench_storage

One trajectory per harness shape and length (``bench.harnesses``: a Claude Code-shaped and
a Codex-shaped main agent, tool call and tool result every turn) goes through the
recorder's own code: each call's request and streamed response are rendered as bytes,
``mitm_addon.recorder.build_rows`` makes the rows, the writer's deduplication keeps each
messages row once, and ``pipeline.shards.write_shard`` writes the zstd Parquet shards.
Forge's bytes are the ``calls`` and ``messages`` files on disk.

The baselines log every call whole, as a plain logging proxy would: one JSON line per
call holding the request body and the response (assembled, which is smaller than the
event stream on the wire), and the same lines as a zstd Parquet file (one row per call,
the compression Forge's shards use), so that compression alone is not credited to the
content addressing. Ratios are Forge's bytes over the baseline's (below 1: Forge is
smaller).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench import results
from bench.gen_shards import ROTATE_ROWS, T0, BuildRowsSink, Collector, run_id
from bench.harnesses import Simulation
from bench.synth import CallSpec, RolloutPlan, Text, build_world, make_task
from pipeline.shards import write_shard

OUT_DIR = Path(__file__).resolve().parent / "out" / "storage"
TURNS = (10, 100, 1000)
HARNESSES = ("claude", "codex")
_RAW_SCHEMA = pa.schema(
    [("call_id", pa.string()), ("request", pa.string()), ("response", pa.string())]
)
_RAW_BATCH = 32  # raw rows per Parquet write (a 1000-turn request is several MB)
# Calls recorded per trajectory length: 100 trajectories of 10 turns, 10 of 100, 1 of 1000.
MIN_CALLS = 1000


@dataclass
class Sizes:
    """Bytes per trajectory."""

    harness: str
    turns: int
    trajectories: int  # measured together, in one run directory
    forge_calls_bytes: int
    forge_messages_bytes: int
    raw_jsonl_bytes: int
    raw_parquet_bytes: int
    request_bytes: int  # request bodies as sent, summed
    seconds: float

    @property
    def forge_bytes(self) -> int:
        return self.forge_calls_bytes + self.forge_messages_bytes

    @property
    def ratio_raw(self) -> float:
        return self.forge_bytes / self.raw_jsonl_bytes

    @property
    def ratio_raw_zstd(self) -> float:
        return self.forge_bytes / self.raw_parquet_bytes


class _RawLog:
    """The baselines: a JSON Lines file and a zstd Parquet file of whole calls."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = directory / "raw.jsonl"
        self.parquet_path = directory / "raw.parquet"
        self.jsonl = self.jsonl_path.open("wb")
        self.parquet = pq.ParquetWriter(self.parquet_path, _RAW_SCHEMA, compression="zstd")
        self.batch: list[dict[str, str]] = []
        self.request_bytes = 0

    def add(self, call_id: str, request: bytes, response: bytes) -> None:
        self.request_bytes += len(request)
        self.jsonl.write(
            b'{"call_id":"%s","request":%s,"response":%s}\n' % (call_id.encode(), request, response)
        )
        self.batch.append(
            {"call_id": call_id, "request": request.decode(), "response": response.decode()}
        )
        if len(self.batch) >= _RAW_BATCH:
            self._flush()

    def _flush(self) -> None:
        if self.batch:
            self.parquet.write_table(pa.Table.from_pylist(self.batch, schema=_RAW_SCHEMA))
            self.batch = []

    def close(self) -> tuple[int, int]:
        self._flush()
        self.parquet.close()
        self.jsonl.close()
        return self.jsonl_path.stat().st_size, self.parquet_path.stat().st_size


class _Recorder(BuildRowsSink):
    """build_rows + the writer's deduplication, and the same call to the raw log."""

    def __init__(self, collector: Collector, raw: _RawLog) -> None:
        super().__init__(collector)
        self.raw = raw

    def __call__(self, spec: CallSpec) -> None:
        capture, call = self.record(spec)
        # The assembled response, or the error body (what a logging proxy would keep).
        response = call["response_json"]
        body = response.encode() if response is not None else capture.response_body
        self.raw.add(spec.call_id, capture.request_body, body)


def trajectory_plan(seed: int, harness: str, turns: int, index: int, text: Text) -> RolloutPlan:
    """One rollout: the main agent alone, ``turns`` calls, a tool call every turn but the last."""
    task = make_task(seed, index, text, codex_share=1.0 if harness == "codex" else 0.0)
    return RolloutPlan(
        index=index,
        rollout_id=f"storage-{harness}-{turns}-{index}",
        seed=f"{seed}:storage:{harness}:{turns}:{index}",
        task=task,
        version=0,
        group_id="storage",
        host=0,
        run_id=run_id(seed, 0, 0),
        start=T0 + index * 3600.0,
        status="complete",
        main_turns=turns,
    )


def measure_one(
    seed: int, harness: str, turns: int, text: Text, out: Path, min_calls: int = 1000
) -> Sizes:
    """Trajectories of ``turns`` turns, enough for MIN_CALLS calls in one run directory
    (so Parquet's per-file overhead and the run's one copy of the system prompt and
    tools are shared as in a real run); sizes are per trajectory."""
    started = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    world = build_world(seed, text)
    n = max(1, -(-min_calls // turns))
    collector = Collector(set())
    raw = _RawLog(out / "raw")
    recorder = _Recorder(collector, raw)
    for index in range(n):
        Simulation(world, trajectory_plan(seed, harness, turns, index, text), recorder).run()
    jsonl_bytes, parquet_bytes = raw.close()
    calls, messages = collector.drain()
    forge, run = out / "forge", run_id(seed, 0, 0)
    for i in range(0, len(calls), ROTATE_ROWS):  # as the writer rotates its shards
        ids = {c["call_id"] for c in calls[i : i + ROTATE_ROWS]}
        name = f"{run}-{i // ROTATE_ROWS + 1:06d}"
        write_shard(forge, "messages", name, [m for m in messages if m["first_call_id"] in ids])
        write_shard(forge, "calls", name, calls[i : i + ROTATE_ROWS])
    return Sizes(
        harness=harness,
        turns=turns,
        trajectories=n,
        forge_calls_bytes=_bytes(forge / "calls") // n,
        forge_messages_bytes=_bytes(forge / "messages") // n,
        raw_jsonl_bytes=jsonl_bytes // n,
        raw_parquet_bytes=parquet_bytes // n,
        request_bytes=raw.request_bytes // n,
        seconds=time.perf_counter() - started,
    )


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.parquet"))


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f}" if n < 1e8 else f"{n / 1e6:,.0f}"


def render(sizes: list[Sizes]) -> tuple[dict[str, float], str]:
    figures: dict[str, float] = {}
    lines = [
        "Bytes on disk per trajectory (main agent, a tool call every turn), MB; "
        f"{sizes[0].trajectories * sizes[0].turns:,} calls or more recorded per row (e.g. "
        f"{sizes[0].trajectories} trajectories of {sizes[0].turns} turns) in one run "
        "directory. Forge: calls + messages shards (zstd Parquet) from build_rows + "
        "write_shard. Raw: one JSON line per call (request body + response); raw zstd: the "
        "same rows in a zstd Parquet file.",
        "",
        "| harness | turns | raw JSONL | raw zstd Parquet | Forge | Forge / raw | "
        "Forge / raw zstd | Forge kB per turn |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in sizes:
        prefix = "storage." if s.harness == "claude" else f"storage.{s.harness}_"
        figures[f"{prefix}ratio_vs_raw_{s.turns}turn"] = _round(s.ratio_raw)
        figures[f"{prefix}ratio_vs_raw_zstd_{s.turns}turn"] = _round(s.ratio_raw_zstd)
        lines.append(
            f"| {s.harness} | {s.turns:,} | {_mb(s.raw_jsonl_bytes)} | "
            f"{_mb(s.raw_parquet_bytes)} | {_mb(s.forge_bytes)} | {s.ratio_raw:.3g} | "
            f"{s.ratio_raw_zstd:.3g} | {s.forge_bytes / s.turns / 1e3:,.1f} |"
        )
    lines += [
        "",
        "`storage.ratio_vs_raw_<N>turn` is the Claude Code-shaped row (Forge / raw JSONL); "
        "Codex-shaped figures carry `codex_`.",
    ]
    return figures, "\n".join(lines) + "\n"


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def measure(
    seed: int,
    turns: tuple[int, ...],
    harnesses: tuple[str, ...],
    work: Path = OUT_DIR,
    min_calls: int = MIN_CALLS,
) -> list[Sizes]:
    text = Text(seed)
    out = []
    for harness in harnesses:
        for n in turns:
            s = measure_one(seed, harness, n, text, work / f"{harness}-{n}", min_calls)
            print(
                f"{harness} {n} turns: Forge {s.forge_bytes:,} B, raw {s.raw_jsonl_bytes:,} B "
                f"({s.seconds:.1f} s)",
                file=sys.stderr,
            )
            out.append(s)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_storage", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--turns", default=",".join(map(str, TURNS)), help="trajectory lengths, comma-separated"
    )
    parser.add_argument(
        "--harness", default=",".join(HARNESSES), help="claude, codex or both (comma-separated)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--results",
        type=Path,
        default=results.BENCH_DIR,
        help="folder of results.json and results.md to update (default: bench/)",
    )
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument(
        "--min-calls",
        type=int,
        default=MIN_CALLS,
        help="calls recorded per length (trajectories = this / turns)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=OUT_DIR,
        help="where the shards and raw logs are written (default: bench/out/storage)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the files in --work")
    args = parser.parse_args(argv)
    turns = tuple(int(t) for t in args.turns.split(","))
    harnesses = tuple(h.strip() for h in args.harness.split(","))
    bad = [h for h in harnesses if h not in HARNESSES]
    if bad:
        parser.error(f"unknown harness {bad}; choose from {', '.join(HARNESSES)}")
    sizes = measure(args.seed, turns, harnesses, args.work, args.min_calls)
    figures, table = render(sizes)
    print(table)
    print(json.dumps(figures, indent=2))
    if not args.no_record:
        details: dict[str, Any] = {"sizes": [asdict(s) for s in sizes]}
        results.record(
            "storage",
            figures,
            table,
            details,
            command=results.command_line("bench.bench_storage", argv),
            json_path=args.results / "results.json",
            md_path=args.results / "results.md",
        )
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
