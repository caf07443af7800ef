"""Bytes Forge stores for a GUI agent that re-sends its last screenshots on every call.

    python -m bench.bench_gui_storage

A 50-step computer-use trajectory (``bench.gui``: Anthropic's computer tool, a PNG
screenshot of a web form after every action, the last 5 re-sent in every request and
dropped from older tool results, so the conversation is rewritten every call) goes
through the recorder's own code: ``build_rows`` takes each inline image out into an
``images`` row, the writer's deduplication keeps each row once, ``write_shard`` writes
the zstd Parquet shards. Forge's bytes are the ``calls``, ``messages`` and ``images``
files on disk.

Baselines, measured in the same run: logging every call whole (one JSON line per call,
request body and response), the same lines as a zstd Parquet file, and the
screenshots' own bytes (each unique PNG once, as a folder of image files would hold
them). Ratios are Forge's bytes over the baseline's.
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
from bench.gui import body_bytes, computer_use_calls
from mitm_addon.capture import Capture
from mitm_addon.recorder import build_rows
from pipeline.shards import write_shard

OUT_DIR = Path(__file__).resolve().parent / "out" / "gui_storage"
STEPS = 50
KEEP = 5
_RAW_SCHEMA = pa.schema(
    [("call_id", pa.string()), ("request", pa.string()), ("response", pa.string())]
)


@dataclass
class GuiSizes:
    steps: int
    keep: int
    screenshots: int  # unique screenshots the trajectory sent
    screenshot_bytes: int  # their PNG bytes, each once
    screenshots_sent: int  # screenshots in all requests together
    request_bytes: int  # request bodies on the wire, all calls
    raw_jsonl_bytes: int
    raw_parquet_bytes: int
    forge_calls_bytes: int
    forge_messages_bytes: int
    forge_images_bytes: int
    images_rows: int
    seconds: float

    @property
    def forge_bytes(self) -> int:
        return self.forge_calls_bytes + self.forge_messages_bytes + self.forge_images_bytes


def gui_capture(
    index: int, request: bytes, response: bytes, rollout_id: str = "r-gui", t0: float = 1.78e9
) -> Capture:
    """The capture the proxy keeps of the trajectory's call ``index`` (a second apart)."""
    t = t0 + index
    return Capture(
        call_id=f"{int(t * 1000):012x}{index:04x}-{rollout_id}",
        run_id="bench-gui",
        transport="http",
        method="POST",
        scheme="https",
        host="api.anthropic.com",
        path="/v1/messages",
        started_at=t,
        rollout_id=rollout_id,
        request_headers={"content-type": "application/json"},
        request_body=request,
        status_code=200,
        response_headers={"content-type": "application/json"},
        response_body=response,
        first_byte_at=t + 0.5,
        ended_at=t + 0.6,
    )


def measure(steps: int = STEPS, keep: int = KEEP, out: Path = OUT_DIR) -> GuiSizes:
    started = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    (out / "raw").mkdir(parents=True)
    seen: set[str] = set()
    calls: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    raw_rows: list[dict[str, str]] = []
    unique: dict[bytes, None] = {}
    sent = request_bytes = 0
    with open(out / "raw" / "calls.jsonl", "wb") as jsonl:
        for i, (request, response, carried) in enumerate(computer_use_calls(steps, keep)):
            req, resp = body_bytes(request), body_bytes(response)
            request_bytes += len(req)
            sent += len(carried)
            unique.update(dict.fromkeys(carried))
            capture = gui_capture(i, req, resp)
            line = {"call_id": capture.call_id, "request": req.decode(), "response": resp.decode()}
            jsonl.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
            raw_rows.append(line)
            rows = build_rows(capture, lambda _: None)
            assert rows.call["parse_error"] is None, rows.call["parse_error"]
            calls.append(rows.call)
            for table, new in ((messages, rows.messages), (images, rows.images)):
                for row in new:
                    if row["hash"] not in seen:  # the writer keeps each hash once
                        seen.add(row["hash"])
                        table.append(row)
    pq.write_table(
        pa.Table.from_pylist(raw_rows, schema=_RAW_SCHEMA),
        out / "raw" / "calls.parquet",
        compression="zstd",
    )
    forge = out / "forge"
    write_shard(forge, "images", "bench-gui-000001", images)
    write_shard(forge, "messages", "bench-gui-000001", messages)
    write_shard(forge, "calls", "bench-gui-000001", calls)
    return GuiSizes(
        steps=steps,
        keep=keep,
        screenshots=len(unique),
        screenshot_bytes=sum(map(len, unique)),
        screenshots_sent=sent,
        request_bytes=request_bytes,
        raw_jsonl_bytes=(out / "raw" / "calls.jsonl").stat().st_size,
        raw_parquet_bytes=(out / "raw" / "calls.parquet").stat().st_size,
        forge_calls_bytes=_bytes(forge / "calls"),
        forge_messages_bytes=_bytes(forge / "messages"),
        forge_images_bytes=_bytes(forge / "images"),
        images_rows=len(images),
        seconds=time.perf_counter() - started,
    )


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.parquet"))


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def render(s: GuiSizes) -> tuple[dict[str, float], str]:
    figures = {
        "storage.gui_ratio_vs_raw": _round(s.forge_bytes / s.raw_jsonl_bytes),
        "storage.gui_ratio_vs_raw_zstd": _round(s.forge_bytes / s.raw_parquet_bytes),
        "storage.gui_ratio_vs_screenshots": _round(s.forge_bytes / s.screenshot_bytes),
    }
    mb = lambda n: f"{n / 1e6:,.2f}"  # noqa: E731
    table = "\n".join(
        [
            f"A {s.steps}-step computer-use trajectory re-sending its last {s.keep} "
            f"screenshots every call ({s.screenshots} unique PNG screenshots, "
            f"{s.screenshots_sent} sent in all), MB on disk.",
            "",
            "| stored as | MB | Forge / it |",
            "| --- | ---: | ---: |",
            f"| every request logged as JSON lines | {mb(s.raw_jsonl_bytes)} | "
            f"{figures['storage.gui_ratio_vs_raw']:.3g} |",
            f"| the same, zstd Parquet | {mb(s.raw_parquet_bytes)} | "
            f"{figures['storage.gui_ratio_vs_raw_zstd']:.3g} |",
            f"| the unique screenshots, one PNG file each | {mb(s.screenshot_bytes)} | "
            f"{figures['storage.gui_ratio_vs_screenshots']:.3g} |",
            f"| Forge: calls + messages + images shards | {mb(s.forge_bytes)} | 1 |",
            "",
            f"Forge's images shard holds {s.images_rows} rows ({mb(s.forge_images_bytes)} MB); "
            f"messages {mb(s.forge_messages_bytes)} MB, calls {mb(s.forge_calls_bytes)} MB.",
        ]
    )
    return figures, table + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_gui_storage", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--steps", type=int, default=STEPS, help="calls in the trajectory")
    parser.add_argument("--keep", type=int, default=KEEP, help="screenshots each call re-sends")
    parser.add_argument(
        "--results",
        type=Path,
        default=results.BENCH_DIR,
        help="folder of results.json and results.md to update (default: bench/)",
    )
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--work", type=Path, default=OUT_DIR, help="where files are written")
    parser.add_argument("--keep-files", action="store_true", help="keep the files in --work")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.keep < 1:
        parser.error("--steps and --keep must be at least 1")
    sizes = measure(args.steps, args.keep, args.work)
    figures, table = render(sizes)
    print(table)
    print(json.dumps(figures, indent=2))
    print(f"({sizes.seconds:.1f} s)", file=sys.stderr)
    if not args.no_record:
        results.record(
            "gui_storage",
            figures,
            table,
            {"sizes": asdict(sizes)},
            command=results.command_line("bench.bench_gui_storage", argv),
            json_path=args.results / "results.json",
            md_path=args.results / "results.md",
        )
    if not args.keep_files:
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
