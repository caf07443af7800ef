"""Training samples from serve-mode calls: CLEAN chains merged, forks apart, each completion once."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from pipeline.samples import SAMPLES, read_samples
from pipeline.shards import write_shard
from pipeline.store import audit_names, connect, sql_text
from tests.pipeline.runs import call_row, reward_row, rollout_row


def token_call(
    call_id: str,
    seconds: float,
    rollout: str,
    drift: str,
    parent: str | None,
    prompt: list[int],
    completion: list[int],
    logprobs: bool = True,
    version: int = 3,
    images: list[str] | None = None,
) -> dict[str, Any]:
    return call_row(
        call_id,
        seconds,
        rollout_id=rollout,
        drift=drift,
        prompt_parent_call_id=parent,
        prompt_ids=prompt,
        completion_ids=completion,
        completion_logprobs=[-(t % 7) / 10 - 0.05 for t in completion] if logprobs else None,
        policy_version=version,
        request_images=images,
    )


def lp(tokens: list[int]) -> list[float]:
    return [pytest.approx(-(t % 7) / 10 - 0.05, rel=1e-6) for t in tokens]


@pytest.fixture
def served(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    """r1: a CLEAN chain a-b-c, a retry d of c's turn, a sub-agent e, a REALIGN f;
    r2: one call without logprobs (same task: a group of two); r3: alone (dropped)."""
    calls = [
        token_call("a", 0, "r1", "FORK", None, [1, 2, 3], [10, 11]),
        token_call("b", 1, "r1", "CLEAN", "a", [4], [12]),
        token_call("c", 2, "r1", "CLEAN", "b", [5, 6], [13, 14]),
        token_call("d", 3, "r1", "CLEAN", "b", [7], [15]),
        token_call("e", 4, "r1", "FORK", None, [20, 21], [22]),
        token_call("f", 5, "r1", "REALIGN", "c", [1, 2, 3, 10, 11, 4, 12, 5, 6, 13, 14, 8], [16]),
        token_call("h", 0, "r2", "FORK", None, [1], [2], logprobs=False),
        token_call("k", 0, "r3", "FORK", None, [1], [3]),
        call_row("x", 9, rollout_id="r1"),  # a record-mode call: no token ids
    ]
    write_shard(tmp_path, "calls", "calls", calls)
    write_shard(
        tmp_path,
        "rollouts",
        "rollouts",
        [rollout_row("r1", "t"), rollout_row("r2", "t"), rollout_row("r3", "u")],
    )
    write_shard(
        tmp_path,
        "rewards",
        "rewards",
        [reward_row("r1", 1.0), reward_row("r2", 0.0), reward_row("r3", 1.0)],
    )
    return connect(tmp_path)


def sequences(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    table = con.sql("SELECT * FROM token_sequences").to_arrow_table()
    return {r["sample_id"]: r for r in table.to_pylist()}


def test_a_clean_chain_is_one_sequence_masked_on_the_models_tokens(
    served: duckdb.DuckDBPyConnection,
) -> None:
    a = sequences(served)["a"]
    assert a["call_ids"] == ["a", "b", "c"]
    assert a["input_ids"] == [1, 2, 3, 10, 11, 4, 12, 5, 6, 13, 14]
    assert a["loss_mask"] == [0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    assert a["old_logprobs"] == [0, 0, 0, *lp([10, 11]), 0, *lp([12]), 0, 0, *lp([13, 14])]
    assert (a["n_tokens"], a["n_loss_tokens"], a["n_calls"]) == (11, 5, 3)


def test_a_second_clean_child_starts_a_sequence_with_its_history_masked(
    served: duckdb.DuckDBPyConnection,
) -> None:
    d = sequences(served)["d"]
    assert d["call_ids"] == ["d"]
    assert d["input_ids"] == [1, 2, 3, 10, 11, 4, 12, 7, 15]
    assert d["loss_mask"] == [0] * 8 + [1]


def test_forks_and_realigned_calls_start_their_own_sequences(
    served: duckdb.DuckDBPyConnection,
) -> None:
    seqs = sequences(served)
    assert set(seqs) == {"a", "d", "e", "f", "h", "k"}
    assert seqs["e"]["input_ids"] == [20, 21, 22] and seqs["e"]["loss_mask"] == [0, 0, 1]
    assert seqs["f"]["loss_mask"] == [0] * 12 + [1], "f's prompt repeats trained tokens: mask 0"


def test_a_call_without_logprobs_leaves_its_sequence_without_old_logprobs(
    served: duckdb.DuckDBPyConnection,
) -> None:
    assert sequences(served)["h"]["old_logprobs"] is None


def test_samples_are_the_included_rollouts_with_their_advantage(
    served: duckdb.DuckDBPyConnection,
) -> None:
    rows = served.sql(
        "SELECT sample_id, rollout_id, group_id, advantage FROM samples ORDER BY sample_id"
    ).fetchall()
    assert [r[0] for r in rows] == ["a", "d", "e", "f", "h"], "r3 is a one-member group"
    advantage = {r[1]: r[3] for r in rows}
    assert advantage["r1"] == pytest.approx(-advantage["r2"]) and advantage["r1"] > 0
    assert {r[2] for r in rows} == {"t@v3"}


def test_the_sample_audits_return_no_rows(served: duckdb.DuckDBPyConnection) -> None:

    names = [n for n in audit_names() if n.startswith("audit_samples_")]
    assert len(names) >= 4
    for name in names:
        assert served.sql(_audit(name)).fetchall() == [], name


def test_a_clean_call_whose_parent_is_missing_is_reported(tmp_path: Path) -> None:
    write_shard(
        tmp_path,
        "calls",
        "calls",
        [
            token_call("a", 0, "r1", "FORK", None, [1], [2]),
            token_call("b", 1, "r1", "CLEAN", "gone", [3], [4]),
            token_call("c", 2, "r1", "CLEAN", "b", [5], [6]),
            token_call("z", 0, "r1", "CLEAN", "q", [5], [6]),
            call_row("q", 1, rollout_id="r1"),
        ],
    )
    con = connect(tmp_path)
    rows = dict(
        con.sql(
            "SELECT call_id, unresolved_reason FROM (" + _audit("audit_samples_unresolved") + ")"
        ).fetchall()
    )
    assert rows == {
        "b": "parent missing",
        "c": "parent unresolved",
        "z": "parent has no token ids",
    }


def _audit(name: str) -> str:
    return sql_text(name)


# --- The same maths as a plain loop, on random call forests ----------------------------


def random_calls(seed: int, n_rollouts: int = 4, per_rollout: int = 30) -> list[dict[str, Any]]:
    """Calls whose CLEAN parents are earlier calls (of the same rollout, rarely another)."""
    rng = random.Random(seed)
    calls: list[dict[str, Any]] = []
    t = 0.0
    for r in range(n_rollouts):
        mine: list[str] = []
        for k in range(per_rollout):
            t += 1
            call_id = f"r{r}-{k:03d}"
            tokens = lambda n: [rng.randrange(1, 1000) for _ in range(n)]  # noqa: E731
            if not mine or rng.random() < 0.2:
                drift = rng.choice(["FORK", "REALIGN"])
                parent = None
                prompt = tokens(rng.randrange(1, 6))
            else:
                drift = "CLEAN"
                pool = [c["call_id"] for c in calls] if rng.random() < 0.05 else mine
                # mostly the latest call (a chain), sometimes an older one (a branch)
                parent = pool[-1] if rng.random() < 0.7 else rng.choice(pool)
                prompt = tokens(rng.randrange(0, 4))
            calls.append(
                token_call(
                    call_id,
                    t,
                    f"r{r}",
                    drift,
                    parent,
                    prompt,
                    tokens(rng.randrange(1, 4)),
                    logprobs=rng.random() > 0.05,
                    version=rng.choice([3, 4]),
                    images=rng.choice(IMAGE_LISTS),
                )
            )
            mine.append(call_id)
    return calls


# What calls' request_images hold: none, screenshots by hash, an image given by URL.
_H1, _H2 = "i1:" + "1" * 40, "i1:" + "2" * 40
IMAGE_LISTS: list[list[str] | None] = [None, [], [_H1], [_H1, "https://example.com/a.png", _H2]]


def reference_sequences(calls: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The samples' sequences by a plain loop over the calls."""
    by_id = {c["call_id"]: c for c in calls}
    ordered = sorted(calls, key=lambda c: (c["started_at"], c["call_id"]))

    def is_delta(c: dict[str, Any]) -> bool:
        return c["drift"] == "CLEAN" and c["prompt_parent_call_id"] is not None

    def full_prompt(c: dict[str, Any]) -> list[int]:
        if not is_delta(c):
            return list(c["prompt_ids"])
        p = by_id[c["prompt_parent_call_id"]]
        return full_prompt(p) + p["completion_ids"] + c["prompt_ids"]

    extends: dict[str, dict[str, Any]] = {}
    for c in ordered:
        p = c["prompt_parent_call_id"]
        if is_delta(c) and by_id[p]["rollout_id"] == c["rollout_id"] and p not in extends:
            extends[p] = c
    continuing = {c["call_id"] for c in extends.values()}
    out: dict[str, dict[str, Any]] = {}
    for head in calls:
        if head["call_id"] in continuing:
            continue
        chain = [head]
        while chain[-1]["call_id"] in extends:
            chain.append(extends[chain[-1]["call_id"]])
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] | None = []
        for i, c in enumerate(chain):
            prompt = full_prompt(c) if i == 0 else c["prompt_ids"]
            ids += prompt + c["completion_ids"]
            mask += [0] * len(prompt) + [1] * len(c["completion_ids"])
            if logprobs is not None and c["completion_logprobs"] is not None:
                logprobs += [0.0] * len(prompt) + c["completion_logprobs"]
            else:
                logprobs = None
        out[head["call_id"]] = {
            "call_ids": [c["call_id"] for c in chain],
            "input_ids": ids,
            "loss_mask": mask,
            "old_logprobs": logprobs,
            "policy_version": min(c["policy_version"] for c in chain),
            # The images the last call showed (its request holds the whole conversation).
            "images": [h for h in chain[-1]["request_images"] or [] if h.startswith("i1:")],
        }
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sequences_equal_the_plain_loop_and_train_each_completion_once(
    tmp_path: Path, seed: int
) -> None:
    calls = random_calls(seed)
    write_shard(tmp_path, "calls", "calls", calls)
    got = sequences(connect(tmp_path))
    want = reference_sequences(calls)
    assert set(got) == set(want)
    for sample_id, w in want.items():
        g = got[sample_id]
        assert g["call_ids"] == w["call_ids"]
        assert g["input_ids"] == w["input_ids"]
        assert g["loss_mask"] == w["loss_mask"]
        assert g["policy_version"] == w["policy_version"]
        assert g["images"] == w["images"]
        if w["old_logprobs"] is None:
            assert g["old_logprobs"] is None
        else:
            assert g["old_logprobs"] == pytest.approx(w["old_logprobs"], rel=1e-6)
    # Each completion exactly once: the masked tokens are the completions, each call once.
    trained: dict[str, list[int]] = defaultdict(list)
    for seq in got.values():
        assert len(seq["input_ids"]) == len(seq["loss_mask"]) == seq["n_tokens"]
        for call_id in seq["call_ids"]:
            trained[call_id].append(1)
    assert all(len(v) == 1 for v in trained.values()) and len(trained) == len(calls)
    assert sum(s["n_loss_tokens"] for s in got.values()) == sum(
        len(c["completion_ids"]) for c in calls
    )


@pytest.mark.parametrize("batch_calls", [1, 3, 1000])
def test_the_arrow_fast_path_equals_the_samples_view(tmp_path: Path, batch_calls: int) -> None:
    calls = random_calls(7)
    write_shard(tmp_path, "calls", "calls", calls)
    write_shard(tmp_path, "rollouts", "rollouts", [rollout_row(f"r{i}", "t") for i in range(4)])
    write_shard(
        tmp_path, "rewards", "rewards", [reward_row(f"r{i}", float(i % 2)) for i in range(4)]
    )
    con = connect(tmp_path)
    # random versions put the rollouts in windows t@v3 and t@v4: some groups are kept
    view = con.sql("SELECT * FROM samples ORDER BY sample_id").to_arrow_table()
    assert view.num_rows > 0
    from pipeline.samples import iter_samples

    fast = pa.Table.from_batches(list(iter_samples(con, None, batch_calls)), schema=SAMPLES)
    assert fast.schema == SAMPLES
    assert fast.cast(view.schema).equals(view)
    some = sorted({r for r in view.column("rollout_id").to_pylist()})[:1]
    only = read_samples(con, some)
    assert set(only.column("rollout_id").to_pylist()) == set(some)


def test_samples_are_empty_in_record_mode(tmp_path: Path) -> None:
    write_shard(tmp_path, "calls", "calls", [call_row("a", 0, rollout_id="r1")])
    con = connect(tmp_path)
    assert con.sql("SELECT count(*) FROM samples").fetchall() == [(0,)]
    assert read_samples(con).num_rows == 0
