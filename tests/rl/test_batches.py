"""Training batches from snapshot samples: padding, masks, advantages, uids, micro-batches."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline.samples import SAMPLES
from rl.batches import (
    BatchError,
    Sample,
    collate,
    group_stats,
    iter_batches,
    read_group_stats,
    read_samples,
    samples_from_table,
    split_micro_batches,
)
from tests.rl.conftest import make_samples


def sample(sid: str, ids: list[int], mask: list[int], adv: float = 0.5,
           lps: list[float] | None = None, group: str | None = "g") -> Sample:  # fmt: skip
    return Sample(sid, group, tuple(ids), tuple(mask), None if lps is None else tuple(lps), adv)


def test_collate_pads_right_and_masks_only_completion_tokens() -> None:
    batch = collate(
        [
            sample("a", [5, 6, 7, 8], [0, 0, 1, 1], lps=[0, 0, -0.1, -0.2]),
            sample("b", [5, 9], [0, 1], lps=[0, -0.3]),
        ],
        pad_id=0,
    )
    assert batch.input_ids.tolist() == [[5, 6, 7, 8], [5, 9, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert torch.allclose(batch.old_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [0, -0.3, 0, 0]]))
    assert batch.n_loss_tokens == 3 and len(batch) == 2


def test_advantage_is_broadcast_to_every_trained_token_and_zero_elsewhere() -> None:
    batch = collate([sample("a", [1, 2, 3, 4, 5], [0, 1, 0, 1, 1], adv=-0.75)])
    assert batch.advantages.tolist() == [[0, -0.75, 0, -0.75, -0.75]]


def test_group_id_becomes_the_uid() -> None:
    batch = collate([sample("a", [1, 2], [0, 1], group="t@v0"), sample("b", [1, 2], [0, 1])])
    assert batch.uid == ("t@v0", "g") and batch.sample_ids == ("a", "b")


def test_unknown_logprobs_are_flagged_not_invented() -> None:
    batch = collate([sample("a", [1, 2], [0, 1], lps=[0, -1]), sample("b", [1, 2], [0, 1])])
    assert batch.old_logprobs_known.tolist() == [True, False]
    assert batch.old_logprobs[1].tolist() == [0, 0]


def test_a_sample_trained_from_its_first_token_is_refused() -> None:
    with pytest.raises(BatchError, match="first token"):
        sample("a", [1, 2], [1, 1])


def test_mismatched_lengths_and_non_finite_advantages_are_refused() -> None:
    with pytest.raises(BatchError, match="mask values"):
        sample("a", [1, 2, 3], [0, 1])
    with pytest.raises(BatchError, match="logprobs"):
        sample("a", [1, 2], [0, 1], lps=[0.0])
    with pytest.raises(BatchError, match="not finite"):
        sample("a", [1, 2], [0, 1], adv=float("nan"))


def test_micro_batches_keep_order_and_respect_count_and_token_budget() -> None:
    samples = [sample(str(i), [1] * n, [0] + [1] * (n - 1)) for i, n in enumerate([3, 5, 2, 8, 4])]
    chunks = split_micro_batches(samples, micro_batch_size=2)
    assert [[s.sample_id for s in c] for c in chunks] == [["0", "1"], ["2", "3"], ["4"]]
    chunks = split_micro_batches(samples, micro_batch_size=10, max_tokens=10)
    assert [[s.sample_id for s in c] for c in chunks] == [["0", "1"], ["2"], ["3"], ["4"]]
    for chunk in chunks:
        assert len(chunk) * max(len(s.input_ids) for s in chunk) <= 10
    assert [s for c in chunks for s in c] == samples
    batches = list(iter_batches(samples, micro_batch_size=2))
    assert [tuple(b.input_ids.shape) for b in batches] == [(2, 5), (2, 8), (1, 4)]


def test_a_sample_over_the_token_budget_is_an_error_not_truncated() -> None:
    with pytest.raises(BatchError, match="never truncated"):
        split_micro_batches([sample("a", [1] * 12, [0] + [1] * 11)], 4, max_tokens=10)


def test_group_stats_count_groups_with_zero_spread() -> None:
    samples = [
        sample("a", [1, 2], [0, 1], adv=1.0, group="t"),
        sample("b", [1, 2], [0, 1], adv=-1.0, group="t"),
        sample("c", [1, 2], [0, 1], adv=0.0, group="u"),
        sample("d", [1, 2], [0, 1], adv=0.0, group="u"),
    ]
    stats = group_stats(samples)
    assert stats["groups/count"] == 2 and stats["groups/zero_spread"] == 1
    assert stats["adv/mean"] == 0 and stats["samples/loss_tokens"] == 4


def test_snapshot_samples_load_as_the_snapshot_wrote_them(snapshot_dir: Path) -> None:
    table = pq.read_table(snapshot_dir / "data" / "train-00000-of-00001.parquet")
    samples = {s.sample_id: s for s in read_samples(snapshot_dir)}
    assert len(samples) == table.num_rows == 4
    for row in table.to_pylist():
        s = samples[row["sample_id"]]
        assert list(s.input_ids) == row["input_ids"] and list(s.loss_mask) == row["loss_mask"]
        assert s.group_id == row["group_id"] and s.advantage == row["advantage"]
    r1 = samples["a1"]  # a1 then its CLEAN continuation a2
    assert r1.input_ids == (2, 3, 4, 5, 6, 7) and r1.loss_mask == (0, 0, 1, 0, 1, 1)
    assert r1.old_logprobs == pytest.approx((0, 0, -0.5, 0, -0.5, -0.6))
    batch = collate(list(samples.values()))
    # Two GRPO groups (tasks t and u), each with one positive and one negative advantage.
    assert len(set(batch.uid)) == 2
    assert batch.uid[0] == batch.uid[1] != batch.uid[2] == batch.uid[3]
    per_sample = batch.advantages.sum(-1) / batch.loss_mask.sum(-1)
    assert sorted(per_sample.sign().tolist()) == [-1, -1, 1, 1]


def test_snapshot_group_stats_count_the_zero_spread_groups_grpo_dropped(
    snapshot_dir: Path,
) -> None:
    stats = read_group_stats(snapshot_dir)
    assert stats == {
        "groups/total": 3,
        "groups/zero_spread": 1,
        "rollouts/dropped/zero_spread": 2,
    }
    assert {s.group_id for s in read_samples(snapshot_dir)} == {"t@v0", "u@v0"}


def test_hand_built_samples_table_with_the_snapshot_schema(tmp_path: Path) -> None:
    rows = [
        {"sample_id": "x", "rollout_id": "r", "group_id": "g", "call_ids": ["x"],
         "input_ids": [3, 4, 5], "loss_mask": [0, 1, 1], "old_logprobs": None,
         "advantage": 0.25, "policy_version": 2, "policy_version_max": 2, "n_tokens": 3,
         "n_loss_tokens": 2, "n_calls": 1},
    ]  # fmt: skip
    path = tmp_path / "samples.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SAMPLES), path)
    (s,) = samples_from_table(pq.read_table(path))
    assert s.old_logprobs is None and s.policy_version == 2 and s.n_loss_tokens == 2


def test_a_directory_that_is_not_a_snapshot_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BatchError, match="no manifest.json"):
        read_samples(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(BatchError, match="format"):
        read_samples(tmp_path)


def test_generated_samples_are_valid_and_varied() -> None:
    samples = make_samples(8)
    assert len({len(s.input_ids) for s in samples}) > 1
    assert all(s.n_loss_tokens > 0 for s in samples)
