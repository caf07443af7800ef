"""bench_gui_storage: a short GUI trajectory measured and recorded, and what its figures divide."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import bench_gui_storage


def test_a_short_trajectory_stores_each_screenshot_once_and_records_its_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    argv = ["--steps", "10", "--keep", "4", "--results", str(tmp_path), "--work", str(work)]
    assert bench_gui_storage.main(argv) == 0
    assert "| Forge: calls + messages + images shards |" in capsys.readouterr().out
    data = json.loads((tmp_path / "results.json").read_text())
    bench = data["benchmarks"]["gui_storage"]
    sizes = bench["details"]["sizes"]
    # 10 calls: the first three carry 1, 2, 3 screenshots, the other seven 4 each.
    assert (sizes["screenshots"], sizes["screenshots_sent"], sizes["images_rows"]) == (10, 34, 10)
    forge = sizes["forge_calls_bytes"] + sizes["forge_messages_bytes"] + sizes["forge_images_bytes"]
    assert bench["figures"] == {
        "storage.gui_ratio_vs_raw": float(f"{forge / sizes['raw_jsonl_bytes']:.4g}"),
        "storage.gui_ratio_vs_raw_zstd": float(f"{forge / sizes['raw_parquet_bytes']:.4g}"),
        "storage.gui_ratio_vs_screenshots": float(f"{forge / sizes['screenshot_bytes']:.4g}"),
    }
    assert bench["figures"]["storage.gui_ratio_vs_raw"] < 0.5  # 34 sent, 10 kept
    assert bench["command"].startswith("python -m bench.bench_gui_storage --steps 10 --keep 4")
    assert not work.exists()


def test_bad_sizes_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        bench_gui_storage.main(["--steps", "0", "--no-record"])
    assert stop.value.code == 2
    assert "--steps and --keep must be at least 1" in capsys.readouterr().err
