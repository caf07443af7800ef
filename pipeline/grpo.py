"""GRPO groups and advantages: settings, a plain-loop reference, and the SQL path.

The SQL (``pipeline/sql/220_grpo_settings.sql`` .. ``225_group_stats.sql``) is what
Forge runs; ``reference_groups`` is the same rule written as a plain loop, kept for the
tests that check the SQL against it. Group key: task within a policy-version window.
Advantage per rollout = (reward - group mean) / (group std + eps); gamma = 1, so the
trainer gives every trained token of the rollout this one terminal advantage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import duckdb

ZeroSpread = Literal["drop", "keep"]
SingleMember = Literal["drop", "zero", "raw"]
Partial = Literal["drop", "zero", "credit"]

# Statuses of a rollout that did not complete; `partial` settings apply to them.
UNFINISHED = ("partial", "timed_out", "crashed")
DROP_REASONS = ("zero_spread", "single_member", "partial", "no_reward", "infra_error")


@dataclass(frozen=True)
class GroupSettings:
    """How rollouts become GRPO groups and advantages (SQL: ``grpo_groups(...)``)."""

    normalize_std: bool = True
    """Divide by the group's std, as GRPO does (Shao et al. 2024, DeepSeekMath). False is
    Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
    Perspective"), which drops it because it weights easy and hard questions unequally."""

    unbiased_std: bool = True
    """Sample std (divisor n - 1), as ``torch.std`` in verl's
    ``compute_grpo_outcome_advantage`` and TRL's ``GRPOTrainer``; False: population std."""

    eps: float = 1e-6
    """Added to the std before dividing (verl's default ``epsilon``)."""

    zero_spread: ZeroSpread = "drop"
    """A group whose members all got the same reward carries no signal: ``drop`` it, as
    DAPO's dynamic sampling filters such groups out (Yu et al. 2025), or ``keep`` it with
    advantages exactly 0 (only KL or entropy terms then act on it)."""

    single_member: SingleMember = "drop"
    """A group of one member has no baseline. ``drop`` (default); ``zero``: keep it with
    advantage 0; ``raw``: verl's rule stated openly (mean 0, std 1), advantage =
    reward / (1 + eps), or reward without std normalisation."""

    partial: Partial = "drop"
    """Rollouts that did not complete (partial, timed_out, crashed): ``drop`` them, as
    DAPO's overlong filtering masks truncated samples (Yu et al. 2025); ``zero``: reward
    0, unfinished counts as failed; ``credit``: the verifier's partial credit from
    ``rewards.details_json`` (dropped when it holds none)."""

    partial_credit_key: str = "partial_credit"
    """Top-level key of ``rewards.details_json`` holding the partial credit (a number)."""

    version_window: int = 1
    """Width of the policy-version windows a group spans: window k holds versions
    [k * w, k * w + w - 1]. 1 groups only rollouts of the same policy version (on-policy);
    wider windows let asynchronous rollouts of nearby versions share a group."""

    def __post_init__(self) -> None:
        choices: dict[str, tuple[str, ...]] = {
            "zero_spread": ("drop", "keep"),
            "single_member": ("drop", "zero", "raw"),
            "partial": ("drop", "zero", "credit"),
        }
        for name, valid in choices.items():
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(
                    f"GroupSettings.{name} must be one of {', '.join(valid)}, got {value!r}"
                )
        if not (math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"GroupSettings.eps must be a finite number >= 0, got {self.eps!r}")
        if self.version_window < 1:
            raise ValueError(
                f"GroupSettings.version_window must be >= 1, got {self.version_window!r}"
            )
        if not self.partial_credit_key or any(ch in self.partial_credit_key for ch in '"\\'):
            raise ValueError(
                'GroupSettings.partial_credit_key must be a non-empty key without " or \\, '
                f"got {self.partial_credit_key!r}"
            )


@dataclass(frozen=True)
class GroupInput:
    """What grouping reads from one rollout (a row of the ``group_inputs`` view)."""

    rollout_id: str
    task_id: str | None
    policy_version: int | None
    status: str | None
    reward: float | None
    details_json: str | None = None


@dataclass(frozen=True)
class RolloutAdvantage:
    """One row of ``groups``: a rollout's group, its group's statistics, its advantage."""

    rollout_id: str
    group_id: str
    task_id: str
    policy_version: int | None
    status: str
    reward: float | None
    group_size: int
    group_mean: float | None
    group_std: float | None
    group_spread: float | None
    advantage: float | None
    included: bool
    drop_reason: str | None


@dataclass(frozen=True)
class GroupStats:
    """Counts of each grouping case (a row of ``group_stats``)."""

    n_groups: int
    n_rollouts: int
    n_groups_included: int
    n_rollouts_included: int
    n_groups_zero_spread: int
    n_rollouts_zero_spread: int
    n_groups_single_member: int
    n_groups_empty: int
    n_rollouts_partial: int
    n_rollouts_partial_dropped: int
    n_rollouts_partial_rewarded: int
    n_rollouts_no_reward: int
    n_rollouts_infra_error: int
    n_rollouts_no_task: int


def group_id_of(task_id: str, policy_version: int | None, version_window: int) -> str:
    """``task@v<lo>`` (or ``task@v<lo>-<hi>`` for wider windows, ``task@unversioned``)."""
    if policy_version is None:
        return f"{task_id}@unversioned"
    lo = (policy_version // version_window) * version_window
    return (
        f"{task_id}@v{lo}" if version_window == 1 else f"{task_id}@v{lo}-{lo + version_window - 1}"
    )


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    value = float(x)
    return value if math.isfinite(value) else None


def partial_credit(details_json: str | None, key: str) -> float | None:
    """The number under ``key`` in a verifier's details JSON, or None."""
    if details_json is None:
        return None
    try:
        details = json.loads(details_json)
    except ValueError:
        return None
    return _finite(details.get(key)) if isinstance(details, dict) else None


def reference_groups(
    rollouts: Iterable[GroupInput], settings: GroupSettings = GroupSettings()
) -> list[RolloutAdvantage]:
    """The grouping rule as a plain loop (the tests' reference for ``grpo_groups``)."""
    # Step 1: the reward each rollout contributes, or why it is dropped before grouping.
    prepared: list[tuple[GroupInput, str, str, float | None, str | None]] = []
    for r in rollouts:
        if r.task_id is None:
            continue
        status = r.status or "complete"
        reward: float | None
        early: str | None
        if status == "infra_error":
            reward, early = None, "infra_error"
        elif status != "complete":
            if settings.partial == "zero":
                reward = 0.0
            elif settings.partial == "credit":
                reward = partial_credit(r.details_json, settings.partial_credit_key)
            else:
                reward = None
            early = None if reward is not None else "partial"
        else:
            reward = _finite(r.reward)
            early = None if reward is not None else "no_reward"
        gid = group_id_of(r.task_id, r.policy_version, settings.version_window)
        prepared.append((r, status, gid, reward, early))

    # Step 2: statistics over each group's members.
    members: dict[str, list[float]] = {}
    for _, _, group, used, dropped in prepared:
        members.setdefault(group, [])
        if dropped is None and used is not None:
            members[group].append(used)
    stats: dict[str, tuple[int, float | None, float | None, float | None]] = {}
    for gid, rewards in members.items():
        n = len(rewards)
        if n == 0:
            stats[gid] = (0, None, None, None)
            continue
        mean = sum(rewards) / n
        squares = sum((x - mean) ** 2 for x in rewards)
        divisor = n - 1 if settings.unbiased_std else n
        std = math.sqrt(squares / divisor) if divisor > 0 else None
        stats[gid] = (n, mean, std, max(rewards) - min(rewards))

    # Steps 3 and 4: the group-level rules, then the advantage.
    out: list[RolloutAdvantage] = []
    for r, status, gid, reward, early in prepared:
        size, group_mean, group_std, spread = stats[gid]
        reason: str | None = early
        if reason is None and size == 1 and settings.single_member == "drop":
            reason = "single_member"
        elif reason is None and size > 1 and spread == 0 and settings.zero_spread == "drop":
            reason = "zero_spread"
        advantage: float | None = None
        if reason is None and reward is not None and group_mean is not None:
            if size == 1:
                if settings.single_member == "zero":
                    advantage = 0.0
                else:  # raw: mean 0, std 1
                    advantage = reward / (1.0 + settings.eps) if settings.normalize_std else reward
            elif spread == 0:
                advantage = 0.0
            elif settings.normalize_std:
                assert group_std is not None  # two or more members
                advantage = (reward - group_mean) / (group_std + settings.eps)
            else:
                advantage = reward - group_mean
        assert r.task_id is not None
        out.append(
            RolloutAdvantage(
                rollout_id=r.rollout_id,
                group_id=gid,
                task_id=r.task_id,
                policy_version=r.policy_version,
                status=status,
                reward=reward,
                group_size=size,
                group_mean=group_mean,
                group_std=group_std,
                group_spread=spread,
                advantage=advantage,
                included=reason is None,
                drop_reason=reason,
            )
        )
    out.sort(key=lambda a: (a.group_id, a.rollout_id))
    return out


def reference_group_stats(
    rollouts: Iterable[GroupInput], settings: GroupSettings = GroupSettings()
) -> GroupStats:
    """``group_stats`` as a plain loop over ``reference_groups``."""
    inputs = list(rollouts)
    rows = reference_groups(inputs, settings)
    groups = {a.group_id for a in rows}
    zero = [
        a
        for a in rows
        if a.group_size > 1 and a.group_spread == 0 and a.drop_reason in (None, "zero_spread")
    ]
    unfinished = [a for a in rows if a.status not in ("complete", "infra_error")]
    return GroupStats(
        n_groups=len(groups),
        n_rollouts=len(rows),
        n_groups_included=len({a.group_id for a in rows if a.included}),
        n_rollouts_included=sum(a.included for a in rows),
        n_groups_zero_spread=len({a.group_id for a in zero}),
        n_rollouts_zero_spread=len(zero),
        n_groups_single_member=len({a.group_id for a in rows if a.group_size == 1}),
        n_groups_empty=len({a.group_id for a in rows if a.group_size == 0}),
        n_rollouts_partial=len(unfinished),
        n_rollouts_partial_dropped=sum(a.drop_reason == "partial" for a in rows),
        n_rollouts_partial_rewarded=sum(a.reward is not None for a in unfinished),
        n_rollouts_no_reward=sum(a.drop_reason == "no_reward" for a in rows),
        n_rollouts_infra_error=sum(a.drop_reason == "infra_error" for a in rows),
        n_rollouts_no_task=sum(r.task_id is None for r in inputs),
    )


# The macro arguments, in the order of GroupSettings (names are the fields', so the
# placeholders are checked identifiers, not user text).
_ARGS = ", ".join(f"{f.name} := ${f.name}" for f in fields(GroupSettings))
GROUPS_SQL = f"SELECT * FROM grpo_groups({_ARGS})"
GROUP_STATS_SQL = f"SELECT * FROM grpo_group_stats({_ARGS})"
SETTINGS_SQL = f"SELECT * FROM grpo_settings({_ARGS})"


def compute_groups(
    con: duckdb.DuckDBPyConnection, settings: GroupSettings = GroupSettings()
) -> list[RolloutAdvantage]:
    """Rows of ``grpo_groups`` under ``settings`` on a connection from ``pipeline.store.connect``."""
    cursor = con.execute(GROUPS_SQL, asdict(settings))
    names = [d[0] for d in cursor.description]
    return [RolloutAdvantage(**dict(zip(names, row, strict=True))) for row in cursor.fetchall()]


def compute_group_stats(
    con: duckdb.DuckDBPyConnection, settings: GroupSettings = GroupSettings()
) -> GroupStats:
    """The row of ``grpo_group_stats`` under ``settings``."""
    cursor = con.execute(GROUP_STATS_SQL, asdict(settings))
    names = [d[0] for d in cursor.description]
    row = cursor.fetchone()
    assert row is not None  # an aggregate without GROUP BY returns one row
    return GroupStats(**dict(zip(names, row, strict=True)))


def sql_settings(
    con: duckdb.DuckDBPyConnection, settings: GroupSettings | None = None
) -> GroupSettings:
    """The settings as ``grpo_settings`` resolves them (a check that SQL sees the same);
    without ``settings``, the ones in force on ``con`` (``apply_settings``, else defaults)."""
    args = asdict(settings) if settings else {f.name: None for f in fields(GroupSettings)}
    cursor = con.execute(SETTINGS_SQL, args)
    names = [d[0] for d in cursor.description]
    row = cursor.fetchone()
    assert row is not None
    return GroupSettings(**dict(zip(names, row, strict=True)))


def apply_settings(con: duckdb.DuckDBPyConnection, settings: GroupSettings) -> None:
    """Make ``settings`` the ones the ``groups`` and ``group_stats`` views use on ``con``
    (``SET VARIABLE forge_grpo_<field>``), e.g. before a snapshot or ``forge sql``."""
    for f in fields(GroupSettings):
        # f.name is a dataclass field, not user text; the value is a bound parameter.
        con.execute(
            f"SET VARIABLE forge_grpo_{f.name} = $value", {"value": getattr(settings, f.name)}
        )


def parse_settings(items: Iterable[str]) -> GroupSettings:
    """``GroupSettings`` from ``NAME=VALUE`` texts (``forge snapshot --grpo``), each value
    read as its field's type: ``zero_spread=keep``, ``normalize_std=false``, ``eps=1e-4``."""
    kinds = {f.name: f.type for f in fields(GroupSettings)}
    values: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in kinds:
            raise ValueError(
                f"--grpo {item!r}: expected NAME=VALUE with NAME one of {', '.join(kinds)}"
            )
        kind, text = str(kinds[name]), text.strip()
        try:
            if kind == "bool":
                if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError("expected true or false")
                values[name] = text.lower() in ("true", "1", "yes")
            elif kind == "float":
                values[name] = float(text)
            elif kind == "int":
                values[name] = int(text)
            else:
                values[name] = text
        except ValueError as e:
            raise ValueError(f"--grpo {item!r}: {e}") from None
    return GroupSettings(**values)
