"""Shared results of every benchmark: ``bench/results.json`` and ``bench/results.md``.

Each benchmark records its own entry (its figures, its Markdown table, the command,
the machine and the date); recording one benchmark keeps every other entry, so the
files grow as benchmarks are added. ``results.md`` is rendered from ``results.json``.

``results.json``::

    {"figures": {"pipeline.stitch_ratio_vs_scan_1m": 41.2, ...},   # every benchmark's
     "missing": {"rollouts.per_minute": "why it is null", ...},     # null figures' reasons
     "benchmarks": {"pipeline": {"figures": {...}, "table": "| ... |", "command": "...",
                                 "machine": "...", "date": "...", "details": {...}}}}
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_JSON = BENCH_DIR / "results.json"
RESULTS_MD = BENCH_DIR / "results.md"

# Figures the README quotes (issue 7): always present in results.json, null with a reason
# in "missing" until the benchmark that measures them has run (never a made-up value).
REQUIRED_FIGURES: dict[str, str] = {
    "proxy.latency_ratio_vs_mitmdump": "bench.bench_proxy has not run",
    "proxy.ttft_added_ms": "bench.bench_proxy has not run",
    "proxy.throughput_ratio_vs_mitmdump_c64": "bench.bench_proxy has not run",
    "proxy.latency_ratio_vs_litellm": "bench.bench_proxy has not run",
    "proxy.throughput_ratio_vs_litellm_c64": "bench.bench_proxy has not run",
    "storage.ratio_vs_raw_100turn": "bench.bench_storage has not run (100 turns)",
    "storage.gui_ratio_vs_raw": "bench.bench_gui_storage has not run",
    "pipeline.stitch_ratio_vs_scan_1m": "bench.bench_pipeline has not run at 1,000,000 calls",
    "rollouts.per_minute": "bench.bench_rollouts has not run",
}


def machine() -> str:
    """CPU model, cores, memory and OS, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages * size / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores{memory}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def command_line(module: str, argv: list[str] | None) -> str:
    """The command that reproduces a benchmark's run (its --results folder left out)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--results" in args:
        i = args.index("--results")
        del args[i : i + 2]
    return " ".join(["python", "-m", module, *(shlex.quote(a) for a in args)])


def load(path: Path = RESULTS_JSON) -> dict[str, Any]:
    if not path.exists():
        return {"figures": {}, "benchmarks": {}, "missing": {}}
    data: dict[str, Any] = json.loads(path.read_text())
    data.setdefault("figures", {})
    data.setdefault("benchmarks", {})
    data.setdefault("missing", {})
    return data


def _tidy(data: dict[str, Any]) -> dict[str, Any]:
    """Reasons only for figures that are null; both maps sorted by key."""
    figures = data["figures"]
    data["missing"] = {
        k: r for k, r in sorted(data["missing"].items()) if k in figures and figures[k] is None
    }
    data["figures"] = dict(sorted(figures.items()))
    return data


def add_required(json_path: Path = RESULTS_JSON, md_path: Path = RESULTS_MD) -> list[str]:
    """Write every figure of ``REQUIRED_FIGURES`` that no benchmark has measured as null,
    with its reason; returns those keys. ``run_all`` calls it after the benchmarks."""
    data = load(json_path)
    added = []
    for key, reason in REQUIRED_FIGURES.items():
        if data["figures"].get(key) is None:
            data["figures"][key] = None
            data["missing"].setdefault(key, reason)
            added.append(key)
    data = _tidy(data)
    _write(json_path, json.dumps(data, indent=2) + "\n")
    _write(md_path, render_markdown(data))
    return added


def record(
    name: str,
    figures: dict[str, float | None],
    table: str,
    details: dict[str, Any] | None = None,
    command: str | None = None,
    json_path: Path = RESULTS_JSON,
    md_path: Path = RESULTS_MD,
    missing: dict[str, str] | None = None,
) -> None:
    """Add (or replace) benchmark ``name`` in the results files, keeping the others.

    A figure of ``None`` must come with its reason in ``missing``.
    """
    absent = [k for k, v in figures.items() if v is None and k not in (missing or {})]
    if absent:
        raise ValueError(f"figures {absent} are None without a reason in missing")
    data = load(json_path)
    old = data["benchmarks"].get(name, {}).get("figures", {})
    for key in old:  # figures this benchmark no longer reports
        data["figures"].pop(key, None)
        data["missing"].pop(key, None)
    data["figures"].update(figures)
    data["missing"].update(missing or {})
    data = _tidy(data)
    data["benchmarks"][name] = {
        "figures": figures,
        "table": table,
        "command": command or "",
        "machine": machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "details": details or {},
    }
    data["benchmarks"] = dict(sorted(data["benchmarks"].items()))
    _write(json_path, json.dumps(data, indent=2) + "\n")
    _write(md_path, render_markdown(data))


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def render_markdown(data: dict[str, Any]) -> str:
    """results.md: every figure, then each benchmark's table with its command, machine, date."""
    lines = [
        "# Forge benchmark results",
        "",
        "Generated from `bench/results.json` by the benchmarks (`make bench` or "
        "`python -m bench.run_all`); do not edit by hand.",
        "",
        f"Rendered {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} on {machine()}; each "
        "benchmark's own machine and date are under its heading.",
        "",
        "| figure | value | benchmark | date |",
        "| --- | ---: | --- | --- |",
    ]
    owner = {k: n for n, b in data["benchmarks"].items() for k in b.get("figures", {})}
    missing = data.get("missing", {})
    for key, value in data["figures"].items():
        bench = data["benchmarks"].get(owner.get(key, ""), {})
        shown = format_value(value) if value is not None else f"n/a ({missing.get(key, '?')})"
        lines.append(f"| `{key}` | {shown} | {owner.get(key, '-')} | {bench.get('date', '')} |")
    for name, bench in data["benchmarks"].items():
        lines += [
            "",
            f"## {name}",
            "",
            f"`{bench.get('command', '')}`  ",
            f"{bench.get('machine', '')}, {bench.get('date', '')}",
            "",
            bench.get("table", "").rstrip(),
        ]
    return "\n".join(lines) + "\n"


def format_value(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e6:
            return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def size_label(n: int) -> str:
    """1m for 1,000,000, 100k for 100,000, 2k for 2,000, 1500 for 1,500."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)
