"""Proxy overhead: direct, bare mitmdump, Forge (record mode) and LiteLLM's proxy, side by side.

    python -m bench.bench_proxy                 # quick sizes (under 3 minutes on 2 cores)
    python -m bench.bench_proxy --full          # 10x the calls
    python -m bench.bench_proxy --skip litellm  # without LiteLLM (no bench venv needed)

One local upstream (``bench.proxy_upstream``, its own process, HTTPS on loopback) answers
OpenAI Chat Completions at once, as JSON or as an SSE stream. Each contender in turn gets
the same calls from the same aiohttp client (``bench.proxy_load``): a warm-up, then
non-streamed calls one at a time (latency p50/p99 and calls/s at concurrency 1), streamed
calls one at a time (time to the first content delta), then fixed batches at concurrency
8 and 64 (calls/s). Proxy CPU is the user + system time of the proxy's process tree
(psutil) over the timed calls. "Added" figures subtract the direct connection's.

Route: HTTPS end to end, as real harnesses use the providers. Through mitmdump and Forge
the client sets the proxy (CONNECT tunnel, TLS to the upstream's address inside it,
keep-alive), as ``HTTPS_PROXY`` does; the proxy terminates that TLS with its own CA and
opens its own TLS connection to the upstream. LiteLLM is a gateway, not a forward proxy:
the client calls its HTTPS base URL and LiteLLM calls the upstream over HTTPS.

Figures (``proxy.*`` in ``bench/results.json``): ``latency_ratio_vs_mitmdump`` (Forge's
p50 latency / bare mitmdump's), ``ttft_added_ms`` (Forge's p50 time to first token minus
bare mitmdump's), ``throughput_ratio_vs_mitmdump_c64``, ``latency_ratio_vs_litellm``,
``throughput_ratio_vs_litellm_c64``, plus each contender's own figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import proxy_contenders as pc
from bench import results
from bench.bench_tls import write_pki
from bench.proxy_load import Call, Phase, percentile, render_request, run_calls

CONTENDERS = ("direct", "mitmdump", "forge", "litellm", "litellm-workers")
MODEL = "gpt-4.1-mini"
GOALS = {
    "latency_ratio_vs_mitmdump": ("<=", 1.1),
    "ttft_added_ms": ("<=", 1.0),
    "throughput_ratio_vs_mitmdump_c64": (">=", 0.8),
    "throughput_ratio_vs_litellm_c64": (">=", 5.0),
}


@dataclass(frozen=True)
class Sizes:
    warmup: int  # non-streamed calls at concurrency 8 before anything is timed
    latency: int  # non-streamed calls at concurrency 1
    streams: int  # streamed calls at concurrency 1
    c8: int
    c64: int


# Quick: under 3 minutes on 2 busy cores with LiteLLM (about 15 calls/s there) included.
# At concurrency 64 each slice gives every worker 4 calls: with one call each, a slice
# timed one burst (and whatever the pool's opening left to do), not a steady rate.
QUICK = Sizes(warmup=48, latency=120, streams=40, c8=240, c64=512)
FULL = Sizes(warmup=256, latency=1200, streams=400, c8=2400, c64=5120)


@dataclass(frozen=True)
class Measured:
    """One contender's figures; times in ms."""

    name: str
    version: str
    p50_ms: float
    p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    stream_p50_ms: float
    calls_per_s: dict[int, float]  # concurrency -> calls/s
    cpu_ms_per_call: float | None  # non-streamed calls, all concurrencies
    cpu_ms_per_stream: float | None
    recorded_calls: int | None = None  # Forge: rows in its calls shards


# (phase, streamed, concurrency, the Sizes field with its call count, slices per round:
# each slice opens a fresh pool, 64 TLS handshakes at concurrency 64, so fewer there)
PHASES = (
    ("latency", False, 1, "latency", 1.0),
    ("ttft", True, 1, "streams", 1.0),
    ("c8", False, 8, "c8", 1.0),
    ("c64", False, 64, "c64", 0.5),
)


def measure_all(
    contenders: list[pc.Contender], sizes: Sizes, rounds: int, stream_words: int
) -> tuple[dict[str, Measured], dict[str, int]]:
    """Every phase against every contender, interleaved; (figures, calls sent) by name.

    Each phase is cut into ``rounds`` slices and the contenders take turns slice by slice
    (the first one rotating), so a burst of load from elsewhere on the machine falls on all
    of them alike instead of on whichever ran at that moment.
    """
    plain, streamed = render_request(MODEL, False), render_request(MODEL, True)
    sent = dict.fromkeys((c.name for c in contenders), 0)

    def run(c: pc.Contender, stream: bool, calls: int, concurrency: int) -> Phase:
        cpu = c.cpu_seconds if c.process else None
        body = streamed if stream else plain
        phase = asyncio.run(run_calls(c.route, body, calls, concurrency, stream, stream_words, cpu))
        sent[c.name] += len(phase.calls) + concurrency  # + the pool-opening calls
        return phase

    for c in contenders:
        run(c, False, sizes.warmup, 8)
        run(c, True, max(1, sizes.warmup // 8), 1)
    done: dict[str, dict[str, list[Phase]]] = {c.name: {} for c in contenders}
    for phase, stream, concurrency, field, share in PHASES:
        total, n = getattr(sizes, field), max(1, round(rounds * share))
        slices = [total // n + (1 if i < total % n else 0) for i in range(n)]
        for i, calls in enumerate(n for n in slices if n):
            k = i % len(contenders)
            for c in contenders[k:] + contenders[:k]:
                done[c.name].setdefault(phase, []).append(run(c, stream, calls, concurrency))
        print(f"-- {phase}: done", flush=True)
    return {c.name: summarise(c, done[c.name]) for c in contenders}, sent


def summarise(c: pc.Contender, phases: dict[str, list[Phase]]) -> Measured:
    """One contender's figures from its slices of every phase."""

    def calls(name: str) -> list[Call]:
        return [call for p in phases[name] for call in p.calls]

    def rate(name: str) -> float:
        return len(calls(name)) / sum(p.wall_s for p in phases[name])

    def cpu_ms(names: tuple[str, ...]) -> float | None:
        chosen = [p for n in names for p in phases[n]]
        if any(p.cpu_s is None for p in chosen):
            return None
        return 1000 * sum(p.cpu_s or 0.0 for p in chosen) / sum(len(p.calls) for p in chosen)

    latencies = [x.latency_s * 1000 for x in calls("latency")]
    firsts = [x.ttft_s * 1000 for x in calls("ttft") if x.ttft_s is not None]
    return Measured(
        name=c.name,
        version=c.version(),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        ttft_p50_ms=percentile(firsts, 50),
        ttft_p99_ms=percentile(firsts, 99),
        stream_p50_ms=percentile([x.latency_s * 1000 for x in calls("ttft")], 50),
        calls_per_s={1: rate("latency"), 8: rate("c8"), 64: rate("c64")},
        cpu_ms_per_call=cpu_ms(("latency", "c8", "c64")),
        cpu_ms_per_stream=cpu_ms(("ttft",)),
    )


def count_recorded(forge_dir: Path) -> tuple[int, int]:
    """(calls Forge stored, those not stored whole: incomplete, unparsed or without request)."""
    import pyarrow.parquet as pq

    rows = bad = 0
    for path in (forge_dir / "calls").glob("*.parquet"):
        for row in pq.read_table(
            path, columns=["status", "parse_error", "request_head_hash"]
        ).to_pylist():
            rows += 1
            ok = row["status"] == "complete" and row["parse_error"] is None
            bad += not (ok and row["request_head_hash"])
    return rows, bad


def compute_figures(
    by_name: dict[str, Measured],
) -> tuple[dict[str, float | None], dict[str, str]]:
    """The ``proxy.*`` figures and, for each one that cannot be computed, the reason."""
    figures: dict[str, float | None] = {}
    missing: dict[str, str] = {}
    forge, direct = by_name.get("forge"), by_name.get("direct")
    # LiteLLM at its best: one worker or as many as the cores, whichever is faster.
    peers = [by_name[n] for n in ("litellm", "litellm-workers") if n in by_name]
    if peers:
        best = max(peers, key=lambda m: m.calls_per_s[64])
        by_name = {**by_name, "litellm-best": best}
        figures["proxy.litellm_best_workers"] = 1 if best.name == "litellm" else os.cpu_count()
    compared: dict[str, tuple[str, Callable[[Measured, Measured], float]]] = {
        "proxy.latency_ratio_vs_mitmdump": ("mitmdump", lambda f, o: f.p50_ms / o.p50_ms),
        "proxy.ttft_added_ms": ("mitmdump", lambda f, o: f.ttft_p50_ms - o.ttft_p50_ms),
        "proxy.throughput_ratio_vs_mitmdump_c64": (
            "mitmdump",
            lambda f, o: f.calls_per_s[64] / o.calls_per_s[64],
        ),
        "proxy.latency_ratio_vs_litellm": ("litellm-best", lambda f, o: f.p50_ms / o.p50_ms),
        "proxy.throughput_ratio_vs_litellm_c64": (
            "litellm-best",
            lambda f, o: f.calls_per_s[64] / o.calls_per_s[64],
        ),
    }
    for key, (other_name, compare) in compared.items():
        other = by_name.get(other_name)
        if forge is None or other is None:
            figures[key] = None
            absent = " and ".join(
                n for n, m in (("forge", forge), (other_name, other)) if m is None
            )
            missing[key] = f"{absent} not measured in this run"
        else:
            figures[key] = round(compare(forge, other), 4)
    for key, m in by_name.items():
        if m.name == "direct" or key == "litellm-best":
            continue
        figures[f"proxy.{m.name.replace('-', '_')}_calls_per_s_c64"] = round(m.calls_per_s[64], 1)
        if direct is not None:
            figures[f"proxy.{m.name.replace('-', '_')}_added_p50_ms"] = round(
                m.p50_ms - direct.p50_ms, 3
            )
        if m.cpu_ms_per_call is not None:
            figures[f"proxy.{m.name.replace('-', '_')}_cpu_ms_per_call"] = round(
                m.cpu_ms_per_call, 3
            )
    return figures, missing


def render_table(by_name: dict[str, Measured]) -> str:
    direct = by_name.get("direct")

    def added(value: float, base: float | None) -> str:
        return f"{value - base:+.2f}" if base is not None else "-"

    def num(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        "| contender | p50 ms | p99 ms | added p50 ms | added p99 ms | TTFT p50 ms "
        "| added TTFT ms | calls/s c1 | calls/s c8 | calls/s c64 | CPU ms/call "
        "| CPU ms/stream |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in by_name.values():
        lines.append(
            f"| {m.name}{f' ({m.version})' if m.version else ''} | {m.p50_ms:.2f} "
            f"| {m.p99_ms:.2f} | {added(m.p50_ms, direct and direct.p50_ms)} "
            f"| {added(m.p99_ms, direct and direct.p99_ms)} | {m.ttft_p50_ms:.2f} "
            f"| {added(m.ttft_p50_ms, direct and direct.ttft_p50_ms)} "
            f"| {m.calls_per_s[1]:.0f} | {m.calls_per_s[8]:.0f} | {m.calls_per_s[64]:.0f} "
            f"| {num(m.cpu_ms_per_call)} | {num(m.cpu_ms_per_stream)} |"
        )
    return "\n".join(lines) + "\n"


def render_ratios(figures: dict[str, float | None]) -> str:
    def show(key: str, unit: str = "x") -> str:
        value = figures.get(f"proxy.{key}")
        if value is None:
            return "n/a"
        text = f"{value:+.2f} ms" if unit == "ms" else f"{value:.2f}x"
        goal = GOALS.get(key)
        if goal:
            op, bound = goal
            ok = value <= bound if op == "<=" else value >= bound
            text += f" (goal {op} {bound:g}{' ms' if unit == 'ms' else 'x'}: {'met' if ok else 'MISSED'})"
        return text

    return "\n".join(
        [
            "Forge vs bare mitmdump: latency p50 "
            + show("latency_ratio_vs_mitmdump")
            + ", added TTFT "
            + show("ttft_added_ms", "ms")
            + ", throughput c64 "
            + show("throughput_ratio_vs_mitmdump_c64"),
            f"Forge vs LiteLLM (its best: {figures.get('proxy.litellm_best_workers') or '-'} "
            "worker(s)): latency p50 "
            + show("latency_ratio_vs_litellm")
            + ", throughput c64 "
            + show("throughput_ratio_vs_litellm_c64"),
        ]
    )


def render_vs_baseline(forge: Measured, baseline: Measured) -> str:
    """This checkout's Forge against another's, measured in the same rounds."""
    cpu = (
        f"{forge.cpu_ms_per_call / baseline.cpu_ms_per_call:.3f}x"
        if forge.cpu_ms_per_call and baseline.cpu_ms_per_call
        else "n/a"
    )
    return (
        f"Forge vs forge-baseline: latency p50 {forge.p50_ms / baseline.p50_ms:.3f}x, "
        f"p99 {forge.p99_ms / baseline.p99_ms:.3f}x, TTFT p50 "
        f"{forge.ttft_p50_ms / baseline.ttft_p50_ms:.3f}x, throughput c8 "
        f"{forge.calls_per_s[8] / baseline.calls_per_s[8]:.3f}x, c64 "
        f"{forge.calls_per_s[64] / baseline.calls_per_s[64]:.3f}x, CPU ms/call {cpu}"
    )


@contextlib.contextmanager
def start(
    name: str,
    upstream: str,
    pki: Any,
    work: Path,
    forge_set: Sequence[str] = (),
    baseline: Path | None = None,
) -> Iterator[pc.Contender]:
    if name == "direct":
        with pc.direct(upstream, pki.ca_cert) as c:
            yield c
    elif name in ("mitmdump", "forge"):
        extra = forge_set if name == "forge" else ()
        with pc.mitmdump(upstream, pki, work, addon=name == "forge", extra=extra) as c:
            yield c
    elif name == "forge-baseline":
        with pc.mitmdump(upstream, pki, work, addon=True, checkout=baseline) as c:
            yield c
    elif name == "litellm":
        with pc.litellm(upstream, pki, work, MODEL) as c:
            yield c
    else:
        with pc.litellm(upstream, pki, work, MODEL, workers=os.cpu_count() or 1) as c:
            yield c


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_proxy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--full", action="store_true", help="10x the calls of the quick default")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every call count (tests use 0.05)"
    )
    parser.add_argument("--skip", choices=CONTENDERS[1:], action="append", default=[])
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="slices each phase is cut into, taken in turn by the contenders (half as many "
        "at concurrency 64)",
    )
    parser.add_argument("--stream-words", type=int, default=20, help="content deltas per stream")
    parser.add_argument("--chunk-gap-ms", type=float, default=1.0, help="between stream deltas")
    parser.add_argument(
        "--results", type=Path, default=results.BENCH_DIR, help="folder of results.json/.md"
    )
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument(
        "--forge-set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="another option for the Forge contender (e.g. forge_process_lookup=false), to "
        "see what a setting costs; results are then not recorded",
    )
    parser.add_argument(
        "--baseline-checkout",
        type=Path,
        default=None,
        metavar="DIR",
        help="also run the Forge of another checkout (e.g. git worktree add DIR HEAD~1), "
        "as contender forge-baseline, to measure a change side by side; results are then "
        "not recorded",
    )
    args = parser.parse_args(argv)
    if args.forge_set or args.baseline_checkout:
        args.no_record = True  # the recorded figures are Forge's defaults, alone
    if args.baseline_checkout and not (args.baseline_checkout / pc.ADDON_IN_REPO).is_file():
        parser.error(f"--baseline-checkout {args.baseline_checkout}: no {pc.ADDON_IN_REPO} there")
    base = FULL if args.full else QUICK
    sizes = Sizes(
        *(max(1, math.ceil(getattr(base, f) * args.scale)) for f in Sizes.__dataclass_fields__)
    )
    skip = set(args.skip) | ({"litellm-workers"} if "litellm" in args.skip else set())
    names = [n for n in CONTENDERS if n not in skip]  # --skip litellm: either LiteLLM
    if args.baseline_checkout:
        names.insert(names.index("forge") + 1 if "forge" in names else 1, "forge-baseline")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="forge-bench-proxy-") as tmp:
        work = Path(tmp)
        pki = write_pki(work / "pki")
        with pc.upstream_server(pki, work, args.stream_words, args.chunk_gap_ms) as upstream:
            with contextlib.ExitStack() as stack:
                contenders = []
                for name in names:
                    print(f"-- {name}: starting", flush=True)
                    contenders.append(
                        stack.enter_context(
                            start(name, upstream, pki, work, args.forge_set, args.baseline_checkout)
                        )
                    )
                print(f"-- all started ({time.monotonic() - began:.0f} s); measuring", flush=True)
                by_name, sent = measure_all(contenders, sizes, args.rounds, args.stream_words)
            stats = pc.upstream_stats(upstream, pki)
        for forge in ("forge", "forge-baseline"):
            if forge not in by_name:
                continue
            # It has stopped (shards flushed): it recorded every call it passed.
            recorded, bad = count_recorded(work / f"{forge}-run")
            by_name[forge] = replace(by_name[forge], recorded_calls=recorded)
            if recorded != sent[forge] or bad:
                print(
                    f"error: {forge} recorded {recorded} calls of the {sent[forge]} it "
                    f"passed, {bad} of them not whole",
                    file=sys.stderr,
                )
                return 1
    figures, missing = compute_figures(by_name)
    table = render_table(by_name)
    ratios = render_ratios(figures)
    if "forge" in by_name and "forge-baseline" in by_name:
        ratios += "\n" + render_vs_baseline(by_name["forge"], by_name["forge-baseline"])
    print()
    print(table)
    print(ratios)
    print(
        f"\nupstream served {stats['requests']} requests on {stats['connections']} connections"
        f"{'; Forge recorded ' + str(by_name['forge'].recorded_calls) if 'forge' in by_name else ''}; "
        f"{time.monotonic() - began:.0f} s in all"
    )
    if not args.no_record:
        args.results.mkdir(parents=True, exist_ok=True)
        for key, reason in missing.items():
            missing[key] = f"{reason} (contenders: {', '.join(names)})"
        results.record(
            "proxy",
            figures,
            table + "\n" + ratios + "\n",
            details={
                "sizes": sizes.__dict__,
                "stream_words": args.stream_words,
                "chunk_gap_ms": args.chunk_gap_ms,
                "contenders": {n: m.__dict__ for n, m in by_name.items()},
                "upstream": stats,
            },
            command=results.command_line("bench.bench_proxy", argv),
            missing=missing,
            json_path=args.results / "results.json",
            md_path=args.results / "results.md",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
