"""bench_train: the embedded step against a plain HF loop at a tiny size, and its maths."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import bench_train

FIGURES = (
    "train.step_seconds",
    "train.hf_step_seconds",
    "train.step_ratio_vs_hf",
    "train.step_cpu_ratio_vs_hf",
    "train.call_seconds",
    "train.call_ratio_vs_hf",
)


def test_a_tiny_run_records_every_figure_positive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--samples", "2", "--tokens", "8", "--micro-batch", "1", "--rounds", "1"]
    assert bench_train.main([*argv, "--threads", "1", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| plain Hugging Face loop (PG loss, AdamW) | 1 |" in out
    assert "step ratio embedded / plain HF:" in out
    data = json.loads((tmp_path / "results.json").read_text())
    figures = data["benchmarks"]["train"]["figures"]
    assert sorted(figures) == sorted(FIGURES)
    assert all(math.isfinite(v) and v > 0 for v in figures.values())
    assert data["benchmarks"]["train"]["command"].startswith("python -m bench.bench_train")
    assert "## train" in (tmp_path / "results.md").read_text()


def test_figures_are_medians_and_their_ratios() -> None:
    wall = {"embedded": [3.0, 1.1, 1.2], "hf": [1.0, 5.0, 1.0], "train()": [1.5, 1.5, 9.0]}
    cpu = {"embedded": [2.0, 2.2, 2.1], "hf": [2.0, 2.0, 2.0], "train()": [3.0, 3.0, 3.0]}
    figures, table = bench_train.render(wall, cpu, "shape")
    assert figures == {
        "train.step_seconds": 1.2,
        "train.hf_step_seconds": 1.0,
        "train.step_ratio_vs_hf": 1.2,
        "train.step_cpu_ratio_vs_hf": 1.05,
        "train.call_seconds": 1.5,
        "train.call_ratio_vs_hf": 1.5,
    }
    assert "step ratio embedded / plain HF: 1.20 (goal <= 1.2: met)" in table


def test_the_batch_is_on_policy_and_fits_the_vocabulary() -> None:
    model = bench_train.build_model(None, bench_train.DTYPES["float32"])
    samples = bench_train.make_samples(model, 3, 8)
    assert [s.n_loss_tokens for s in samples] == [6, 6, 6]
    assert all(max(s.input_ids) < model.config.vocab_size for s in samples)
    # Old logprobs on the mask only, and about -log(vocabulary) for random weights.
    for s in samples:
        assert s.old_logprobs is not None
        lps = [lp for lp, m in zip(s.old_logprobs, s.loss_mask, strict=True) if m]
        assert all(-14.0 < lp < -10.0 for lp in lps)
        assert all(lp == 0.0 for lp, m in zip(s.old_logprobs, s.loss_mask, strict=True) if not m)


def test_the_plain_loop_takes_the_full_vocabulary_loops_loss_and_gradient() -> None:
    """Logits at the trained positions only change nothing but the cost: the baseline's
    loss and gradients are those of the loop that computes them at every position."""
    import copy

    import torch
    import torch.nn.functional as F

    from rl.batches import collate

    model = bench_train.build_model(None, bench_train.DTYPES["float32"])
    samples = bench_train.make_samples(model, 4, 12)
    batch = collate(samples)
    tokens = batch.n_loss_tokens
    full = copy.deepcopy(model)
    logits = full(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    labels = F.pad(batch.input_ids[:, 1:], (0, 1), value=-100)
    logp = -F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none"
    ).view_as(labels)
    expected = -(logp[:, :-1] * (batch.advantages * batch.loss_mask)[:, 1:]).sum() / tokens
    expected.backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # a step that moves nothing
    loss = bench_train.hf_step(model, optimizer, [batch])
    assert abs(loss - float(expected.detach())) < 1e-5
    for (name, a), (_, b) in zip(model.named_parameters(), full.named_parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name
