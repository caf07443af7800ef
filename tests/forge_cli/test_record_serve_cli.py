"""``forge record --mode serve``: a harness answered by the policy server, no provider."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.store import connect
from tests.support.forge_proxy import OPENAI_KEY, SECRETS, files_containing
from tests.support.policy import policy_server


@pytest.mark.slow
def test_record_in_serve_mode_answers_the_toy_harness_from_the_policy(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["OPENAI_API_KEY"] = OPENAI_KEY
    with policy_server(tiny_models[1]) as policy:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "forge_cli.main",
                "record",
                "--out",
                str(tmp_path / "run"),
                "--confdir",
                str(confdir),
                "--mode",
                "serve",
                "--policy",
                policy.base_url,  # the tokenizer: the folder the server reports
                "--",
                sys.executable,
                "-m",
                "k8s_jobs.toy_harness",
                "list the files",
                "--max-turns",
                "3",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    # The scripted policy calls `ls` every turn, so the toy harness runs out of turns.
    assert done.returncode == 3, done.stderr
    rows = (
        connect(tmp_path / "run")
        .execute("SELECT status, drift, tool_calls, upstream_url FROM calls ORDER BY call_id")
        .fetchall()
    )
    assert [r[0] for r in rows] == ["complete"] * 3
    # The toy harness sends turns back without their reasoning: spliced, not re-rendered.
    assert [r[1] for r in rows] == ["CLEAN", "REALIGN", "REALIGN"]
    assert all(r[2] == ["shell"] and r[3] == policy.base_url for r in rows)
    assert files_containing(tmp_path / "run", SECRETS) == []


def test_serve_mode_without_a_policy_says_what_is_missing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "forge_cli.main", "record", "--mode", "serve", "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--mode serve needs --policy URL" in done.stderr
