"""GRPO groups: the SQL against the plain-loop reference, and each setting's stated rule."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.grpo import (
    GroupInput,
    GroupSettings,
    RolloutAdvantage,
    apply_settings,
    compute_group_stats,
    compute_groups,
    reference_group_stats,
    reference_groups,
    sql_settings,
)
from pipeline.store import sql_text

# The grouping macros read only group_inputs, so these tests feed it directly.
GROUPING_SQL = [
    "220_grpo_settings",
    "222_grpo_groups",
    "223_groups",
    "224_grpo_group_stats",
    "225_group_stats",
]
INPUTS = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("policy_version", pa.int64()),
        ("status", pa.string()),
        ("reward", pa.float64()),
        ("details_json", pa.string()),
    ]
)


def grouping(inputs: list[GroupInput]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.register("_inputs", pa.Table.from_pylist([asdict(i) for i in inputs], schema=INPUTS))
    con.execute("CREATE VIEW group_inputs AS SELECT * FROM _inputs")
    for name in GROUPING_SQL:
        con.execute(sql_text(name))
    return con


def gi(
    rollout_id: str,
    reward: float | None,
    task: str | None = "t",
    version: int | None = 0,
    status: str = "complete",
    details: dict[str, object] | None = None,
) -> GroupInput:
    return GroupInput(
        rollout_id, task, version, status, reward, None if details is None else json.dumps(details)
    )


def by_id(rows: list[RolloutAdvantage]) -> dict[str, RolloutAdvantage]:
    return {r.rollout_id: r for r in rows}


def assert_same(sql: list[RolloutAdvantage], ref: list[RolloutAdvantage]) -> None:
    assert [r.rollout_id for r in sql] == [r.rollout_id for r in ref]
    for a, b in zip(sql, ref, strict=True):
        exact = (
            "rollout_id",
            "group_id",
            "task_id",
            "policy_version",
            "status",
            "group_size",
            "included",
            "drop_reason",
        )
        assert {f: getattr(a, f) for f in exact} == {f: getattr(b, f) for f in exact}
        for f in ("reward", "group_mean", "group_std", "group_spread", "advantage"):
            x, y = getattr(a, f), getattr(b, f)
            assert (x is None) == (y is None), (f, a, b)
            if x is not None:
                assert x == pytest.approx(y, rel=1e-9, abs=1e-9), (f, a, b)


# Rewards on a 1/8 grid (what verifiers give) or with three decimals: distinct rewards then
# differ by at least 1e-3, so both float paths agree to 1e-9.
rewards = st.one_of(
    st.none(),
    st.integers(0, 8).map(lambda i: i / 8),
    st.floats(-5, 5, allow_nan=False).map(lambda x: round(x, 3)),
)
statuses = st.sampled_from(["complete"] * 6 + ["partial", "timed_out", "crashed", "infra_error"])
details = st.one_of(
    st.none(),
    st.builds(lambda c: json.dumps({"partial_credit": c}), st.integers(0, 4).map(lambda i: i / 4)),
    st.just('{"partial_credit": "half"}'),
    st.just('{"other": 1}'),
    st.just("not json"),
)
inputs_lists = st.lists(
    st.builds(
        GroupInput,
        rollout_id=st.just(""),
        task_id=st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
        policy_version=st.one_of(st.none(), st.integers(0, 6)),
        status=statuses,
        reward=rewards,
        details_json=details,
    ),
    max_size=30,
).map(lambda xs: [replace(x, rollout_id=f"r{i:02d}") for i, x in enumerate(xs)])
group_settings = st.builds(
    GroupSettings,
    normalize_std=st.booleans(),
    unbiased_std=st.booleans(),
    eps=st.sampled_from([0.0, 1e-6, 1e-4, 0.1]),
    zero_spread=st.sampled_from(["drop", "keep"]),
    single_member=st.sampled_from(["drop", "zero", "raw"]),
    partial=st.sampled_from(["drop", "zero", "credit"]),
    version_window=st.integers(1, 4),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=inputs_lists, s=group_settings)
def test_sql_groups_equal_the_plain_loop_reference(
    inputs: list[GroupInput], s: GroupSettings
) -> None:
    con = grouping(inputs)
    expected = reference_groups(inputs, s)
    assert_same(compute_groups(con, s), expected)
    assert compute_group_stats(con, s) == reference_group_stats(inputs, s)
    # The same settings set as variables drive the argument-less views.
    apply_settings(con, s)
    cur = con.execute("SELECT * FROM groups")
    names = [d[0] for d in cur.description]
    assert_same(
        [RolloutAdvantage(**dict(zip(names, r, strict=True))) for r in cur.fetchall()], expected
    )


@settings(max_examples=200, deadline=None)
@given(inputs=inputs_lists, s=group_settings)
def test_included_advantages_of_a_group_sum_to_zero(
    inputs: list[GroupInput], s: GroupSettings
) -> None:
    sums: dict[str, list[float]] = {}
    for r in reference_groups(inputs, s):
        if r.included and r.group_size > 1:
            assert r.advantage is not None
            sums.setdefault(r.group_id, []).append(r.advantage)
    for advantages in sums.values():
        assert math.fsum(advantages) == pytest.approx(
            0.0, abs=1e-9 * len(advantages) * max(1.0, *map(abs, advantages))
        )


def test_advantage_is_reward_minus_mean_over_std_plus_eps() -> None:
    inputs = [gi("r1", 1.0), gi("r2", 0.0), gi("r3", 0.0), gi("r4", 1.0)]
    rows = by_id(compute_groups(grouping(inputs)))
    std = math.sqrt(1 / 3)  # sample std of 1, 0, 0, 1
    assert rows["r1"].group_mean == 0.5 and rows["r1"].group_std == pytest.approx(std)
    assert rows["r1"].advantage == pytest.approx(0.5 / (std + 1e-6))
    assert rows["r2"].advantage == pytest.approx(-0.5 / (std + 1e-6))
    assert all(r.included and r.group_id == "t@v0" and r.group_size == 4 for r in rows.values())


def test_population_std_when_unbiased_std_is_off() -> None:
    inputs = [gi("r1", 1.0), gi("r2", 0.0)]
    rows = by_id(compute_groups(grouping(inputs), GroupSettings(unbiased_std=False)))
    assert rows["r1"].group_std == 0.5
    assert rows["r1"].advantage == pytest.approx(0.5 / (0.5 + 1e-6))


def test_dr_grpo_leaves_the_std_out() -> None:
    inputs = [gi("r1", 1.0), gi("r2", 0.0), gi("r3", 0.0), gi("r4", 0.0)]
    rows = by_id(compute_groups(grouping(inputs), GroupSettings(normalize_std=False)))
    assert rows["r1"].advantage == pytest.approx(0.75)
    assert rows["r2"].advantage == pytest.approx(-0.25)


def test_groups_with_zero_spread_are_dropped_by_default_and_kept_at_zero_on_request() -> None:
    inputs = [
        gi("r1", 0.1),
        gi("r2", 0.1),
        gi("r3", 0.1),
        gi("s1", 1.0, task="u"),
        gi("s2", 0.0, task="u"),
    ]
    con = grouping(inputs)
    dropped = by_id(compute_groups(con))
    assert [dropped[r].drop_reason for r in ("r1", "r2", "r3")] == ["zero_spread"] * 3
    assert not dropped["r1"].included and dropped["r1"].advantage is None
    assert dropped["s1"].included
    kept = by_id(compute_groups(con, GroupSettings(zero_spread="keep")))
    assert [kept[r].advantage for r in ("r1", "r2", "r3")] == [0.0, 0.0, 0.0]
    assert kept["r1"].included and kept["r1"].drop_reason is None
    stats = compute_group_stats(con)
    assert (stats.n_groups_zero_spread, stats.n_rollouts_zero_spread) == (1, 3)
    assert (stats.n_groups_included, stats.n_rollouts_included) == (1, 2)


@pytest.mark.parametrize(
    ("rule", "normalize_std", "included", "advantage"),
    [
        ("drop", True, False, None),
        ("zero", True, True, 0.0),
        ("raw", True, True, 0.7 / (1 + 1e-6)),  # verl: mean 0, std 1
        ("raw", False, True, 0.7),
    ],
)
def test_single_member_groups_follow_the_stated_rule(
    rule: str, normalize_std: bool, included: bool, advantage: float | None
) -> None:
    s = GroupSettings(single_member=rule, normalize_std=normalize_std)  # type: ignore[arg-type]
    (row,) = compute_groups(grouping([gi("r1", 0.7)]), s)
    assert (row.group_size, row.group_mean, row.group_std) == (1, 0.7, None)
    assert row.included == included
    assert row.drop_reason == (None if included else "single_member")
    assert row.advantage == (None if advantage is None else pytest.approx(advantage))


def test_partial_rollouts_are_dropped_zeroed_or_given_partial_credit() -> None:
    inputs = [
        gi("ok1", 1.0),
        gi("ok2", 0.0),
        gi("cut", 0.9, status="timed_out", details={"partial_credit": 0.5}),
        gi("dead", None, status="crashed"),
        gi("half", None, status="partial", details={"tests_passed": 0.25}),
    ]
    con = grouping(inputs)

    dropped = by_id(compute_groups(con))
    assert {r: dropped[r].drop_reason for r in ("cut", "dead", "half")} == dict.fromkeys(
        ("cut", "dead", "half"), "partial"
    )
    assert dropped["ok1"].group_size == 2 and dropped["ok1"].group_mean == 0.5

    zeroed = by_id(compute_groups(con, GroupSettings(partial="zero")))
    assert [zeroed[r].reward for r in ("cut", "dead", "half")] == [0.0, 0.0, 0.0]
    assert zeroed["ok1"].group_size == 5 and zeroed["ok1"].group_mean == pytest.approx(0.2)
    assert all(r.included for r in zeroed.values())

    credit = GroupSettings(partial="credit")
    credited = by_id(compute_groups(con, credit))
    assert credited["cut"].reward == 0.5 and credited["cut"].included
    # Without a credit under the key the rollout is dropped, not given 0.
    assert credited["dead"].drop_reason == "partial" and credited["half"].drop_reason == "partial"
    other_key = by_id(compute_groups(con, replace(credit, partial_credit_key="tests_passed")))
    assert other_key["half"].reward == 0.25 and other_key["cut"].drop_reason == "partial"

    stats = compute_group_stats(con, credit)
    assert (
        stats.n_rollouts_partial,
        stats.n_rollouts_partial_dropped,
        stats.n_rollouts_partial_rewarded,
    ) == (3, 2, 1)


def test_infra_errors_and_ungraded_rollouts_never_enter_a_group() -> None:
    inputs = [
        gi("r1", 1.0),
        gi("r2", 0.0),
        gi("infra", 1.0, status="infra_error"),
        gi("todo", None),
        gi("nan", math.nan),
        gi("notask", 1.0, task=None),
    ]
    con = grouping(inputs)
    for s in (GroupSettings(), GroupSettings(partial="zero")):
        rows = by_id(compute_groups(con, s))
        assert rows["infra"].drop_reason == "infra_error"
        assert rows["todo"].drop_reason == "no_reward" and rows["nan"].drop_reason == "no_reward"
        assert "notask" not in rows
        assert rows["r1"].group_size == 2
    stats = compute_group_stats(con)
    assert (
        stats.n_rollouts,
        stats.n_rollouts_infra_error,
        stats.n_rollouts_no_reward,
        stats.n_rollouts_no_task,
    ) == (5, 1, 2, 1)


def test_groups_span_one_policy_version_window() -> None:
    inputs = [gi(f"r{v}{i}", float(i), version=v) for v in range(4) for i in range(2)]
    inputs.append(gi("rec", 1.0, version=None))
    con = grouping(inputs)
    assert {r.group_id for r in compute_groups(con)} == {
        "t@v0",
        "t@v1",
        "t@v2",
        "t@v3",
        "t@unversioned",
    }
    wide = compute_groups(con, GroupSettings(version_window=2))
    assert {r.group_id for r in wide} == {"t@v0-1", "t@v2-3", "t@unversioned"}
    assert by_id(wide)["r00"].group_size == 4


def test_the_sql_defaults_are_the_python_defaults() -> None:
    con = grouping([])
    row = con.execute("SELECT * FROM grpo_settings()").fetchone()
    names = [d[0] for d in con.description]
    assert dict(zip(names, row, strict=True)) == asdict(GroupSettings())
    custom = GroupSettings(normalize_std=False, eps=0.5, partial="credit", version_window=3)
    assert sql_settings(con, custom) == custom


def test_the_groups_view_follows_variables_set_from_python_or_sql() -> None:
    inputs = [gi("r1", 1.0), gi("r2", 0.0), gi("r3", 0.0)]
    con = grouping(inputs)
    cur = con.execute("SELECT * FROM groups")
    names = [d[0] for d in cur.description]
    view = [RolloutAdvantage(**dict(zip(names, row, strict=True))) for row in cur.fetchall()]
    assert view == compute_groups(con, GroupSettings())
    apply_settings(con, GroupSettings(normalize_std=False))
    (adv,) = con.execute("SELECT advantage FROM groups WHERE rollout_id = 'r1'").fetchone() or (
        None,
    )
    assert adv == pytest.approx(2 / 3)
    con.execute("SET VARIABLE forge_grpo_normalize_std = true")
    con.execute("SET VARIABLE forge_grpo_eps = 1")
    (adv,) = con.execute("SELECT advantage FROM groups WHERE rollout_id = 'r1'").fetchone() or (
        None,
    )
    assert adv == pytest.approx((2 / 3) / (math.sqrt(1 / 3) + 1))
    # An argument beats the variable.
    (adv,) = con.execute(
        "SELECT advantage FROM grpo_groups(eps := 0) WHERE rollout_id = 'r1'"
    ).fetchone() or (None,)
    assert adv == pytest.approx((2 / 3) / math.sqrt(1 / 3))


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("grpo_groups(zero_spread := 'skip')", "zero_spread must be drop or keep"),
        ("grpo_groups(single_member := 'one')", "single_member must be drop, zero or raw"),
        ("grpo_groups(partial := 'keep')", "partial must be drop, zero or credit"),
        ("grpo_groups(version_window := 0)", "version_window must be >= 1"),
        ("grpo_groups(eps := -1)", "eps must be a finite number >= 0"),
        ("grpo_groups(partial_credit_key := 'a\"b')", "partial_credit_key"),
    ],
)
def test_bad_settings_fail_in_sql_with_the_valid_choices(sql: str, message: str) -> None:
    con = grouping([gi("r1", 1.0), gi("r2", 0.0)])
    with pytest.raises(duckdb.InvalidInputException, match=message):
        con.execute(f"SELECT * FROM {sql}").fetchall()


def test_bad_settings_fail_in_python_with_the_valid_choices() -> None:
    with pytest.raises(ValueError, match="drop, keep"):
        GroupSettings(zero_spread="skip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="version_window must be >= 1"):
        GroupSettings(version_window=0)
    with pytest.raises(ValueError, match="eps"):
        GroupSettings(eps=math.inf)


def test_groups_from_recorded_shards_match_the_reference(tmp_path: Path) -> None:
    from tests.pipeline.test_trajectories import (
        call,
        flat_nodes,
        my_audits,
        open_run,
        reward,
        rollout,
        write_run,
    )

    calls, rollouts, rewards_ = [], [], []
    for i in range(12):
        rid = f"r{i:02d}"
        status = "timed_out" if i == 5 else "complete"
        calls += [
            call(f"{rid}-a", rid, at_s=i, policy_version=i % 2),
            call(f"{rid}-b", rid, at_s=i + 0.5, policy_version=i % 2),
        ]
        rollouts.append(rollout(rid, task_id=f"task{i % 3}", harness="toy", status=status))
        if i != 7:
            rewards_.append(reward(rid, float(i % 4 == 0), details_json='{"partial_credit":0.5}'))
    run = write_run(tmp_path, calls, rollouts, rewards_)
    con = open_run(run, flat_nodes(calls))
    cur = con.execute("SELECT * FROM group_inputs")
    names = [d[0] for d in cur.description]
    inputs = [GroupInput(**dict(zip(names, row, strict=True))) for row in cur.fetchall()]
    assert len(inputs) == 12 and {i.policy_version for i in inputs} == {0, 1}
    for s in (
        GroupSettings(),
        GroupSettings(partial="credit", zero_spread="keep", version_window=2),
    ):
        assert_same(compute_groups(con, s), reference_groups(inputs, s))
        apply_settings(con, s)
        assert set(my_audits(con).values()) == {0}
