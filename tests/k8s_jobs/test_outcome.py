"""The runner's pure rules: ids, groups, statuses, backoff, the progress line."""

from __future__ import annotations

import pytest

from k8s_jobs.outcome import (
    Progress,
    backoff_s,
    classify_exit,
    format_progress,
    group_id,
    rollout_id,
)


def test_retried_attempts_get_their_own_rollout_ids() -> None:
    assert rollout_id("t", 3) == "t.3"
    assert rollout_id("t", 3, attempt=2) == "t.3.r2"


def test_group_ids_follow_the_pipelines_format() -> None:
    assert group_id("t", None) == "t@unversioned"
    assert group_id("t", 7) == "t@v7"


@pytest.mark.parametrize(
    ("code", "timed_out", "status"),
    [
        (0, False, "complete"),
        (3, False, "partial"),
        (1, False, "crashed"),
        (-9, False, "crashed"),
        (None, True, "timed_out"),
        (0, True, "timed_out"),
    ],
)
def test_exit_classification(code: int | None, timed_out: bool, status: str) -> None:
    assert classify_exit(code, timed_out, partial_exit_codes=(3,)) == status


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_s(a, 1.0, 5.0) for a in range(5)] == [0.0, 1.0, 2.0, 4.0, 5.0]


def test_the_progress_line_shows_counts_and_mean_reward() -> None:
    line = format_progress(Progress(8, 2, 4, 1, 1, 3.0, 4), width=8)
    assert line == "[####....] 4/8 done  2 running  1 failed  1 retried  mean reward 0.750"
    assert format_progress(Progress(2, 1, 0, 0, 0, 0.0, 0), width=4).endswith("mean reward -")
