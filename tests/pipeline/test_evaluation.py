"""pass@k and pass^k: the estimators against their definitions, the SQL against the loop."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.evaluation import (
    TaskPassRate,
    Trial,
    compute_pass_rates,
    pass_at_k,
    pass_hat_k,
    reference_pass_rates,
    reference_pass_rates_of,
    summarize,
)
from pipeline.store import sql_text

EVAL_SQL = ["230_eval_pass_at_k", "231_eval_pass_hat_k", "233_eval_pass_rates"]
TRIALS = pa.schema(
    [
        ("harness", pa.string()),
        ("model", pa.string()),
        ("policy_version", pa.int64()),
        ("task_id", pa.string()),
        ("reward", pa.float64()),
    ]
)


def evaluating(trials: list[Trial]) -> duckdb.DuckDBPyConnection:
    """A connection whose eval_trials are ``trials`` (the macros read nothing else)."""
    con = duckdb.connect()
    con.register("_trials", pa.Table.from_pylist([asdict(t) for t in trials], schema=TRIALS))
    con.execute("CREATE VIEW eval_trials AS SELECT * FROM _trials")
    for name in EVAL_SQL:
        con.execute(sql_text(name))
    return con


counts = st.integers(1, 12).flatmap(
    lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n + 2))
)


@given(counts)
def test_pass_at_k_and_pass_hat_k_equal_their_definitions(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    outcomes = [True] * c + [False] * (n - c)
    at, hat = reference_pass_rates_of(outcomes, k)
    if k > n:
        assert pass_at_k(n, c, k) is None and pass_hat_k(n, c, k) is None and at is None
        return
    assert pass_at_k(n, c, k) == pytest.approx(at, abs=1e-12)
    assert pass_hat_k(n, c, k) == pytest.approx(hat, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.integers(1, 200).flatmap(
            lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n + 1))
        ),
        max_size=20,
    )
)
def test_sql_estimators_equal_the_python_ones(cases: list[tuple[int, int, int]]) -> None:
    con = evaluating([])
    for n, c, k in cases:
        at, hat = con.execute(
            "SELECT pass_at_k(?, ?, ?), pass_hat_k(?, ?, ?)", [n, c, k] * 2
        ).fetchone() or (None, None)
        expected_at, expected_hat = pass_at_k(n, c, k), pass_hat_k(n, c, k)
        assert (at is None) == (expected_at is None) and (hat is None) == (expected_hat is None)
        if expected_at is not None:
            assert at == pytest.approx(expected_at, rel=1e-9, abs=1e-12)
            assert hat == pytest.approx(expected_hat, rel=1e-9, abs=1e-12)


def test_known_values() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_hat_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 1, 3) == pytest.approx(0.6)  # 1 - C(4,3)/C(5,3) = 1 - 4/10
    assert pass_hat_k(5, 4, 3) == pytest.approx(0.4)  # C(4,3)/C(5,3)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_hat_k(4, 4, 4) == 1.0
    assert pass_at_k(3, 1, 4) is None
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_at_k(3, 1, 0)


trials_lists = st.lists(
    st.builds(
        Trial,
        harness=st.sampled_from(["claude", "codex", None]),
        model=st.sampled_from(["m1", "m2"]),
        policy_version=st.one_of(st.none(), st.integers(0, 2)),
        task_id=st.sampled_from(["t1", "t2", "t3"]),
        reward=st.one_of(st.none(), st.sampled_from([0.0, 0.5, 0.99, 1.0, 2.0])),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    trials=trials_lists,
    ks=st.lists(st.integers(1, 5), min_size=1, max_size=3, unique=True),
    threshold=st.sampled_from([0.5, 1.0]),
)
def test_sql_pass_rates_equal_the_plain_loop(
    trials: list[Trial], ks: list[int], threshold: float
) -> None:
    got = compute_pass_rates(evaluating(trials), ks, threshold)
    expected = reference_pass_rates(trials, sorted(ks), threshold)
    assert [
        (r.harness, r.model, r.policy_version, r.task_id, r.k, r.n_trials, r.n_success) for r in got
    ] == [
        (r.harness, r.model, r.policy_version, r.task_id, r.k, r.n_trials, r.n_success)
        for r in expected
    ]
    for a, b in zip(got, expected, strict=True):
        for x, y in ((a.pass_at_k, b.pass_at_k), (a.pass_hat_k, b.pass_hat_k)):
            assert (x is None) == (y is None)
            if x is not None:
                assert x == pytest.approx(y, rel=1e-9, abs=1e-12)


def test_the_threshold_decides_success() -> None:
    trials = [Trial("h", "m", None, "t", r) for r in (1.0, 0.5, 0.0, None)]
    con = evaluating(trials)
    (strict,) = compute_pass_rates(con, [1])
    (lenient,) = compute_pass_rates(con, [1], threshold=0.5)
    assert (strict.n_trials, strict.n_success, strict.pass_at_k) == (4, 1, 0.25)
    assert (lenient.n_success, lenient.pass_at_k) == (2, 0.5)
    con.execute("SET VARIABLE forge_eval_threshold = 0.5")
    assert con.execute("SELECT n_success FROM eval_pass_rates()").fetchall() == [(2,)]


def test_pass_rates_are_grouped_by_harness_model_and_policy_version() -> None:
    trials = [
        Trial("claude", "m1", 1, "t", 1.0),
        Trial("claude", "m1", 1, "t", 0.0),
        Trial("claude", "m1", 2, "t", 1.0),
        Trial("codex", "m1", 1, "t", 1.0),
        Trial("claude", "m2", 1, "t", 0.0),
    ]
    rows = compute_pass_rates(evaluating(trials), [1, 2])
    keyed = {
        (r.harness, r.model, r.policy_version, r.k): (r.n_trials, r.pass_at_k, r.pass_hat_k)
        for r in rows
    }
    assert keyed[("claude", "m1", 1, 1)] == (2, 0.5, 0.5)
    assert keyed[("claude", "m1", 1, 2)] == (2, 1.0, 0.0)
    assert keyed[("claude", "m1", 2, 2)] == (1, None, None)  # fewer trials than k
    assert keyed[("codex", "m1", 1, 1)] == (1, 1.0, 1.0)
    assert keyed[("claude", "m2", 1, 1)] == (1, 0.0, 0.0)


def test_summary_is_the_mean_over_tasks_with_enough_trials() -> None:
    rates = [
        TaskPassRate("h", "m", None, "a", 2, 2, 1, 1.0, 0.0),
        TaskPassRate("h", "m", None, "b", 2, 4, 4, 1.0, 1.0),
        TaskPassRate("h", "m", None, "c", 2, 1, 1, None, None),
    ]
    (mean,) = summarize(rates)
    assert (mean.task_id, mean.n_trials, mean.n_success, mean.pass_at_k, mean.pass_hat_k) == (
        None,
        7,
        6,
        1.0,
        0.5,
    )


def test_bad_k_fails_in_sql_and_python() -> None:
    con = evaluating([Trial("h", "m", None, "t", 1.0)])
    with pytest.raises(duckdb.InvalidInputException, match="k values must be integers >= 1"):
        con.execute("SELECT * FROM eval_pass_rates(ks := [0, 1])").fetchall()
    with pytest.raises(ValueError, match="k must be >= 1"):
        compute_pass_rates(con, [0])


def test_trials_from_recorded_shards(tmp_path: Path) -> None:
    from tests.pipeline.test_trajectories import (
        call,
        flat_nodes,
        open_run,
        reward,
        rollout,
        write_run,
    )

    specs = {
        # rollout: (status, reward) — what counts as a trial and as a success.
        "r-ok": ("complete", 1.0),
        "r-fail": ("complete", 0.0),
        "r-cut": ("timed_out", None),  # a trial, failed
        "r-infra": ("infra_error", None),  # not a trial
        "r-todo": ("complete", None),  # not graded yet: not a trial
    }
    calls = [call(f"{rid}-1", rid, model="m1") for rid in specs]
    rollouts = [rollout(rid, task_id="t", harness="toy", status=s) for rid, (s, _) in specs.items()]
    rewards = [reward(rid, r) for rid, (_, r) in specs.items() if r is not None]
    con = open_run(write_run(tmp_path, calls, rollouts, rewards), flat_nodes(calls))
    assert sorted(r for (r,) in con.execute("SELECT rollout_id FROM eval_trials").fetchall()) == [
        "r-cut",
        "r-fail",
        "r-ok",
    ]
    (row,) = compute_pass_rates(con, [1])
    assert (row.harness, row.model, row.policy_version, row.n_trials, row.n_success) == (
        "toy",
        "m1",
        None,
        3,
        1,
    )
    assert row.pass_at_k == pytest.approx(1 / 3)
