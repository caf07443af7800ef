"""The proxy overhead benchmark at a tiny size, its upstream's wire format, its maths."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from bench import bench_proxy, proxy_contenders, results
from bench.proxy_load import percentile
from bench.proxy_upstream import render_completion, render_stream_events

RATIOS_VS_MITMDUMP = (
    "proxy.latency_ratio_vs_mitmdump",
    "proxy.throughput_ratio_vs_mitmdump_c64",
)
VS_LITELLM = ("proxy.latency_ratio_vs_litellm", "proxy.throughput_ratio_vs_litellm_c64")


def positive(value: Any) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value > 0


def test_upstream_bodies_parse_as_the_openai_sdk_types() -> None:
    completion = ChatCompletion.model_validate_json(render_completion(5, 1_700_000_000))
    assert completion.choices[0].message.content == "word0 word1 word2 word3 word4"
    events = render_stream_events(3, 1_700_000_000)
    assert events[-1] == b"data: [DONE]\n\n"
    chunks = [
        ChatCompletionChunk.model_validate_json(e.removeprefix(b"data: ")) for e in events[:-1]
    ]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "word0 word1 word2 "
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentile_agrees_with_statistics_quantiles(n: int) -> None:
    values = [float((i * 37) % 101) for i in range(n)]
    assert percentile(values, 0) == min(values) and percentile(values, 100) == max(values)
    if n > 1:
        inclusive = statistics.quantiles(values, n=100, method="inclusive")
        assert percentile(values, 50) == pytest.approx(inclusive[49])
        assert percentile(values, 99) == pytest.approx(inclusive[98])


def test_a_null_figure_needs_a_reason(tmp_path: Path) -> None:
    j, md = tmp_path / "results.json", tmp_path / "results.md"
    with pytest.raises(ValueError, match="without a reason"):
        results.record("proxy", {"proxy.x": None}, "| t |", json_path=j, md_path=md)
    results.record(
        "proxy", {"proxy.x": None}, "| t |", json_path=j, md_path=md, missing={"proxy.x": "why"}
    )
    assert json.loads(j.read_text())["missing"] == {"proxy.x": "why"}
    results.record("proxy", {"proxy.x": 2.0}, "| t |", json_path=j, md_path=md)
    assert json.loads(j.read_text())["missing"] == {}


def test_required_figures_are_null_with_a_reason_until_measured(tmp_path: Path) -> None:
    j, md = tmp_path / "results.json", tmp_path / "results.md"
    results.record(
        "storage", {"storage.ratio_vs_raw_100turn": 0.2}, "| s |", json_path=j, md_path=md
    )
    added = results.add_required(j, md)
    data = json.loads(j.read_text())
    assert set(results.REQUIRED_FIGURES) <= set(data["figures"])
    assert "storage.ratio_vs_raw_100turn" not in added
    assert data["figures"]["storage.ratio_vs_raw_100turn"] == 0.2
    assert data["figures"]["rollouts.per_minute"] is None
    assert set(data["missing"]) == set(added) and all(data["missing"].values())
    assert "rollouts.per_minute" in md.read_text() and "n/a (" in md.read_text()


def run_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str], skip: list[str]) -> Any:
    out = tmp_path / "results"
    argv = ["--scale", "0.02", "--rounds", "1", "--results", str(out)]
    assert bench_proxy.main(argv + [f"--skip={s}" for s in skip]) == 0
    printed = capsys.readouterr().out
    assert "| contender | p50 ms | p99 ms |" in printed
    assert "Forge vs bare mitmdump: latency p50 " in printed
    assert "Forge vs LiteLLM (its best: " in printed
    data = json.loads((out / "results.json").read_text())
    md = (out / "results.md").read_text()
    assert "## proxy" in md and " cores" in md and " UTC" in md
    return data


def check_contenders(data: Any, names: set[str]) -> None:
    contenders = data["benchmarks"]["proxy"]["details"]["contenders"]
    assert set(contenders) == names
    for m in contenders.values():
        for key in ("p50_ms", "p99_ms", "ttft_p50_ms", "ttft_p99_ms", "stream_p50_ms"):
            assert positive(m[key]), (m["name"], key, m[key])
        assert m["p99_ms"] >= m["p50_ms"]
        assert set(m["calls_per_s"]) == {"1", "8", "64"}
        assert all(positive(v) for v in m["calls_per_s"].values())
        if m["name"] != "direct":  # a few streams may take less than a clock tick (10 ms)
            assert positive(m["cpu_ms_per_call"]) and m["cpu_ms_per_stream"] >= 0
    assert contenders["forge"]["recorded_calls"] > 0


@pytest.mark.slow  # 25-80 s here: three proxies start, and 64 TLS tunnels open through each
def test_tiny_run_prints_and_records_finite_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_tiny(tmp_path, capsys, ["litellm"])
    figures = data["figures"]
    for key in RATIOS_VS_MITMDUMP:
        assert positive(figures[key]), (key, figures[key])
    assert math.isfinite(figures["proxy.ttft_added_ms"])  # may be below 0: it is a difference
    for key in VS_LITELLM:  # not measured in this run: null, with the reason
        assert figures[key] is None and "litellm" in data["missing"][key]
    for name in ("mitmdump", "forge"):
        assert positive(figures[f"proxy.{name}_cpu_ms_per_call"])
        assert positive(figures[f"proxy.{name}_calls_per_s_c64"])
    check_contenders(data, {"direct", "mitmdump", "forge"})


@pytest.mark.slow
@pytest.mark.skipif(
    not (proxy_contenders.LITELLM_VENV / "bin" / "litellm").exists(),
    reason="LiteLLM's bench venv is not installed (make bench-setup)",
)
def test_tiny_run_with_litellm_compares_forge_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_tiny(tmp_path, capsys, [])
    for key in (*RATIOS_VS_MITMDUMP, *VS_LITELLM):
        assert positive(data["figures"][key]), (key, data["figures"][key])
    assert data["missing"] == {}
    check_contenders(data, {"direct", "mitmdump", "forge", "litellm", "litellm-workers"})
    # The ratios are against LiteLLM at its best of one worker and one per core.
    best = data["figures"]["proxy.litellm_best_workers"]
    per_core = data["figures"]["proxy.litellm_workers_calls_per_s_c64"]
    single = data["figures"]["proxy.litellm_calls_per_s_c64"]
    assert best == (1 if single >= per_core else os.cpu_count())
