"""``CI=true`` turns every skip into a failure (tests/conftest.py), so that a prerequisite
CI failed to install cannot pass unseen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import pytest

def test_skips_inside():
    pytest.skip("no chromium here")

@pytest.mark.skipif(True, reason="no harness binary here")
def test_skipped_by_marker():
    pass
"""
MODULE_PROBE = """
import pytest

pytest.skip("no iptables here", allow_module_level=True)

def test_never_collected():
    pass
"""


def run_probe(source: str, ci: bool) -> subprocess.CompletedProcess[str]:
    """pytest on a probe test file under this repository's tests/conftest.py."""
    root = Path(__file__).resolve().parents[1]
    probe_dir = root / "tests" / f"_ci_probe_{os.getpid()}"
    probe_dir.mkdir()
    try:
        (probe_dir / "test_probe.py").write_text(source)
        env = {k: v for k, v in os.environ.items() if k != "CI"}
        if ci:
            env["CI"] = "true"
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe_dir)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for p in probe_dir.iterdir():
            p.unlink()
        probe_dir.rmdir()


@pytest.mark.parametrize("source", [PROBE, MODULE_PROBE], ids=["in-tests", "whole-module"])
def test_a_skip_fails_under_ci_and_stays_a_skip_elsewhere(source: str) -> None:
    ci = run_probe(source, ci=True)
    assert ci.returncode in (1, 2), ci.stdout  # 2: a module failed to collect
    assert "skipped under CI=true, which refuses skips" in ci.stdout
    assert " passed" not in ci.stdout
    local = run_probe(source, ci=False)
    assert local.returncode in (0, 5), local.stdout  # 5: nothing collected (a whole-module skip)
    assert "skipped" in local.stdout and "failed" not in local.stdout
