"""Verifiers: exit codes and JSON verdicts become rewards; a verifier that cannot grade is
an environment failure, not a reward of 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s_jobs.tasks import Verifier
from k8s_jobs.verifier import VerifierError, parse_verifier_output, run_verifier


def test_exit_code_zero_is_reward_one() -> None:
    assert parse_verifier_output("exit_code", 0, "").reward == 1.0
    failed = parse_verifier_output("exit_code", 2, "boom")
    assert (failed.reward, failed.details) == (0.0, {"exit_code": 2})


def test_json_verdict_on_the_last_line_wins_whatever_the_exit_code() -> None:
    out = 'running tests\n{"reward": 0.25, "details": {"passed": 1, "failed": 3}}\n\n'
    result = parse_verifier_output("json", 1, out)
    assert result.reward == 0.25 and result.details == {"passed": 1, "failed": 3, "exit_code": 1}


@pytest.mark.parametrize(
    "out",
    [
        "",
        "no json here",
        '{"score": 1}',
        '{"reward": "high"}',
        '{"reward": NaN}',
        "[1]",
        '{"reward": 1, "details": [1]}',
        '{"reward": true}',
    ],
)
def test_json_verdicts_that_cannot_grade_raise(out: str) -> None:
    with pytest.raises(VerifierError):
        parse_verifier_output("json", 0, out)


def test_a_verifier_runs_in_the_workdir_with_its_environment(tmp_path: Path) -> None:
    (tmp_path / "answer.txt").write_text("42\n")
    verifier = Verifier(
        command='echo "{\\"reward\\": $(cat answer.txt), \\"details\\": {\\"who\\": \\"$WHO\\"}}"',
        reward="json",
    )
    result = run_verifier(
        verifier, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "WHO": "me"}, log_dir=tmp_path
    )
    assert result.reward == 42.0 and result.details["who"] == "me"
    assert (tmp_path / "verifier.stdout").exists()


def test_a_verifier_past_its_timeout_cannot_grade(tmp_path: Path) -> None:
    verifier = Verifier(command="sleep 30", timeout_s=0.5)
    with pytest.raises(VerifierError, match="timeout"):
        run_verifier(verifier, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, log_dir=tmp_path)


def test_a_verifier_that_does_not_start_cannot_grade(tmp_path: Path) -> None:
    verifier = Verifier(command=("/nonexistent/verify",))
    with pytest.raises(VerifierError, match="did not start"):
        run_verifier(verifier, cwd=tmp_path, env={}, log_dir=tmp_path)
