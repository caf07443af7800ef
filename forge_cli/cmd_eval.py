"""``forge eval``: pass@k and pass^k per task, grouped by harness, model and policy version."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from mitm_addon.launch import ForgeError
from pipeline.evaluation import DEFAULT_THRESHOLD, TaskPassRate, compute_pass_rates, summarize
from pipeline.store import connect

__all__ = ["add_parser", "parse_ks", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="pass@k and pass^k per task, harness, model and policy version",
        description="For every task: pass@k, the unbiased estimate of the chance that at least "
        "one of k trials succeeds (Chen et al. 2021), and pass^k, the chance that all k succeed "
        "(τ-bench), from the rollouts' rewards; then their mean over the tasks of each harness, "
        "model and policy version. A trial succeeds when its reward >= --threshold. Rollouts "
        "that ended early (partial, timed_out, crashed) count as trials; ungraded complete ones "
        "and infra_error ones do not.",
    )
    p.add_argument("--data", type=Path, required=True, help="run directory")
    p.add_argument("--k", default="1", help="comma-separated k values (default 1), e.g. 1,3")
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"reward at or above which a trial succeeds (default {DEFAULT_THRESHOLD:g})",
    )
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(func=run)


def parse_ks(text: str) -> list[int]:
    """``"1,3"`` -> ``[1, 3]`` (sorted, without repeats)."""
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ForgeError(
            f"--k {text!r}: pass comma-separated whole numbers, e.g. --k 1,3"
        ) from None
    if not ks or ks[0] < 1:
        raise ForgeError(f"--k {text!r}: every k must be >= 1, e.g. --k 1,3")
    return ks


def _wide(rates: list[TaskPassRate], ks: list[int], scope: str) -> list[dict[str, Any]]:
    """One record per (harness, model, policy version, task) with pass@k, pass^k per k."""
    records: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rates:
        key = (r.harness, r.model, r.policy_version, r.task_id)
        rec = records.setdefault(
            key,
            {
                "scope": scope,
                "harness": r.harness,
                "model": r.model,
                "policy_version": r.policy_version,
                "task_id": r.task_id,
                "n_trials": r.n_trials,
                "n_success": r.n_success,
            },
        )
        rec[f"pass@{r.k}"] = r.pass_at_k
        rec[f"pass^{r.k}"] = r.pass_hat_k
    for rec in records.values():
        for k in ks:
            rec.setdefault(f"pass@{k}", None)
            rec.setdefault(f"pass^{k}", None)
    return list(records.values())


def build_records(rates: list[TaskPassRate], ks: list[int]) -> list[dict[str, Any]]:
    """Task records, each group's followed by its mean record (scope "mean", task_id None)."""
    tasks = _wide(rates, ks, "task")
    means = {
        (m["harness"], m["model"], m["policy_version"]): m
        for m in _wide(summarize(rates), ks, "mean")
    }
    out: list[dict[str, Any]] = []
    for i, rec in enumerate(tasks):
        out.append(rec)
        key = (rec["harness"], rec["model"], rec["policy_version"])
        following = tasks[i + 1] if i + 1 < len(tasks) else None
        if (
            following is None
            or (following["harness"], following["model"], following["policy_version"]) != key
        ):
            mean = dict(means[key])
            mean["n_tasks"] = sum(
                1 for t in tasks if (t["harness"], t["model"], t["policy_version"]) == key
            )
            out.append(mean)
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render_table(records: list[dict[str, Any]], ks: list[int]) -> str:
    rate_cols = [c for k in ks for c in (f"pass@{k}", f"pass^{k}")]
    header = ["harness", "model", "policy", "task", "trials", "ok", *rate_cols]
    rows = []
    for rec in records:
        task = rec["task_id"] if rec["scope"] == "task" else f"(mean of {rec['n_tasks']} tasks)"
        rows.append(
            [
                _cell(rec["harness"]),
                _cell(rec["model"]),
                _cell(rec["policy_version"]),
                task,
                _cell(rec["n_trials"]),
                _cell(rec["n_success"]),
                *(_cell(rec[c]) for c in rate_cols),
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines) + "\n"


def render_csv(records: list[dict[str, Any]], ks: list[int]) -> str:
    columns = ["scope", "harness", "model", "policy_version", "task_id", "n_trials", "n_success"]
    columns += [c for k in ks for c in (f"pass@{k}", f"pass^{k}")]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for rec in records:
        writer.writerow({c: "" if rec.get(c) is None else rec[c] for c in columns})
    return buf.getvalue()


def run(args: argparse.Namespace) -> int:
    data: Path = args.data
    if not data.is_dir():
        raise ForgeError(
            f"no run directory {data}: pass --data with a directory written by forge record"
        )
    ks = parse_ks(args.k)
    rates = compute_pass_rates(connect(data, stitched=True), ks, args.threshold)
    if not rates:
        raise ForgeError(
            f"no graded rollouts with a task in {data}: write the runner's rollouts rows (task_id) "
            "and rewards with `forge reward --data DIR --rollout ID --reward X`"
        )
    records = build_records(rates, ks)
    if args.format == "json":
        text = json.dumps(records, indent=2, ensure_ascii=False) + "\n"
    elif args.format == "csv":
        text = render_csv(records, ks)
    else:
        text = render_table(records, ks)
    sys.stdout.write(text)
    return 0
