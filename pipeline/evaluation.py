"""pass@k and pass^k per task, grouped by harness, model and policy version.

pass@k is the chance that at least one of k trials succeeds, estimated without bias from
n trials with c successes as 1 - C(n - c, k) / C(n, k) (Chen et al. 2021, "Evaluating
Large Language Models Trained on Code"). pass^k is the chance that k trials all succeed,
C(c, k) / C(n, k) (τ-bench, Yao et al. 2024; ClawEval reports it too): it falls with k
where pass@k rises, so the pair shows capability and reliability. A trial succeeds when
its reward >= ``DEFAULT_THRESHOLD``. The SQL path is ``eval_pass_rates`` in
``pipeline/sql/233_eval_pass_rates.sql``; the plain loops here are its tests' reference.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import comb

import duckdb

DEFAULT_THRESHOLD = 1.0
"""A trial succeeds when reward >= 1.0: what a binary verifier (tests pass: 1, else 0)
gives a solved task. Lower it for graded rewards (e.g. 0.5 for "half the checks")."""


@dataclass(frozen=True)
class Trial:
    """One graded rollout (a row of the ``eval_trials`` view)."""

    harness: str | None
    model: str | None
    policy_version: int | None
    task_id: str
    reward: float | None


@dataclass(frozen=True)
class TaskPassRate:
    """pass@k and pass^k of one task for one k (a row of ``eval_pass_rates``).

    ``task_id`` is None in a summary row (the mean over the group's tasks)."""

    harness: str | None
    model: str | None
    policy_version: int | None
    task_id: str | None
    k: int
    n_trials: int
    n_success: int
    pass_at_k: float | None
    pass_hat_k: float | None


def _check(n: int, c: int, k: int) -> bool:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"successes must lie in [0, trials], got c={c}, n={n}")
    return k <= n


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """1 - C(n - c, k) / C(n, k): at least one of k trials (of n, c successes) succeeds.

    None when k > n (the estimator needs at least k trials)."""
    if not _check(n, c, k):
        return None
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float | None:
    """C(c, k) / C(n, k): all of k trials (of n, c successes) succeed. None when k > n."""
    if not _check(n, c, k):
        return None
    return comb(c, k) / comb(n, k)


def reference_pass_rates_of(outcomes: Sequence[bool], k: int) -> tuple[float | None, float | None]:
    """(pass@k, pass^k) by enumerating every k-subset of the trials (the definitions)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > len(outcomes):
        return None, None
    subsets = list(itertools.combinations(outcomes, k))
    any_ok = sum(1 for s in subsets if any(s))
    all_ok = sum(1 for s in subsets if all(s))
    return any_ok / len(subsets), all_ok / len(subsets)


def reference_pass_rates(
    trials: Iterable[Trial], ks: Sequence[int], threshold: float = DEFAULT_THRESHOLD
) -> list[TaskPassRate]:
    """``eval_pass_rates`` as a plain loop over trials, enumerating k-subsets."""
    outcomes: dict[tuple[str | None, str | None, int | None, str], list[bool]] = {}
    for t in trials:
        key = (t.harness, t.model, t.policy_version, t.task_id)
        outcomes.setdefault(key, []).append(t.reward is not None and t.reward >= threshold)
    out: list[TaskPassRate] = []
    for (harness, model, version, task), results in outcomes.items():
        for k in ks:
            at, hat = reference_pass_rates_of(results, k)
            out.append(
                TaskPassRate(harness, model, version, task, k, len(results), sum(results), at, hat)
            )
    return sorted(out, key=sort_key)


def sort_key(r: TaskPassRate) -> tuple[object, ...]:
    """The order of ``eval_pass_rates``: harness, model, version (NULLs first), task, k."""
    return (
        r.harness is not None,
        r.harness or "",
        r.model is not None,
        r.model or "",
        r.policy_version is not None,
        r.policy_version or 0,
        r.task_id is not None,
        r.task_id or "",
        r.k,
    )


EVAL_SQL = "SELECT * FROM eval_pass_rates(ks := $ks, threshold := $threshold)"


def compute_pass_rates(
    con: duckdb.DuckDBPyConnection, ks: Sequence[int], threshold: float = DEFAULT_THRESHOLD
) -> list[TaskPassRate]:
    """Rows of ``eval_pass_rates`` on a connection from ``pipeline.store.connect``."""
    for k in ks:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
    cursor = con.execute(EVAL_SQL, {"ks": list(ks), "threshold": float(threshold)})
    names = [d[0] for d in cursor.description]
    return [TaskPassRate(**dict(zip(names, row, strict=True))) for row in cursor.fetchall()]


def summarize(rates: Iterable[TaskPassRate]) -> list[TaskPassRate]:
    """Mean pass@k and pass^k over the tasks of each (harness, model, policy version, k),
    over the tasks with at least k trials; n_trials and n_success are totals."""
    by_group: dict[tuple[str | None, str | None, int | None, int], list[TaskPassRate]] = {}
    for r in rates:
        by_group.setdefault((r.harness, r.model, r.policy_version, r.k), []).append(r)
    out: list[TaskPassRate] = []
    for (harness, model, version, k), rows in by_group.items():
        at = [r.pass_at_k for r in rows if r.pass_at_k is not None]
        hat = [r.pass_hat_k for r in rows if r.pass_hat_k is not None]
        out.append(
            TaskPassRate(
                harness=harness,
                model=model,
                policy_version=version,
                task_id=None,
                k=k,
                n_trials=sum(r.n_trials for r in rows),
                n_success=sum(r.n_success for r in rows),
                pass_at_k=sum(at) / len(at) if at else None,
                pass_hat_k=sum(hat) / len(hat) if hat else None,
            )
        )
    return sorted(out, key=sort_key)
