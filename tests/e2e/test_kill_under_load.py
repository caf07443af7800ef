"""SIGKILL under load: no call a client finished is lost, no call the upstream got is missing.

Three rounds here; ``make soak`` (``FORGE_SOAK=1``) runs twenty, with more clients."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.forge_proxy import SECRETS, files_containing
from tests.support.kill_load import run_round, upstream

SOAK = os.environ.get("FORGE_SOAK") == "1"
ROUNDS = 20 if SOAK else 3
CLIENTS = 48 if SOAK else 32


@pytest.mark.slow
def test_killed_proxy_under_load_loses_no_finished_call(tmp_path: Path, confdir: Path) -> None:
    results = []
    with upstream() as up:
        for seed in range(ROUNDS):
            out = tmp_path / f"round{seed}"
            result = run_round(out, confdir, up, seed, clients=CLIENTS)
            print(f"round {seed}: {result.line()}")
            results.append(result)
            assert files_containing(out, SECRETS) == []
    failed = [(i, r) for i, r in enumerate(results) if not r.ok]
    assert failed == [], "\n".join(
        f"round {i}: {r.line()}\n  finished, not complete: {r.missing_finished[:5]}\n"
        f"  sent, not recorded: {r.missing_sent[:5]}\n  duplicated: {r.duplicated[:5]}"
        for i, r in failed
    )
    # The load was real: calls finished in every round, and every round killed calls mid-way.
    assert all(r.finished >= 10 for r in results), [r.line() for r in results]
    assert all(r.incomplete >= 1 for r in results), [r.line() for r in results]
