"""One embedded training step against a plain Hugging Face loop on the same model and batch.

    python -m bench.bench_train                  # 8 samples x 64 tokens, 7 rounds (~1 min)
    python -m bench.bench_train --samples 2 --tokens 8 --rounds 1 --no-record   # smoke run
    python -m bench.bench_train --model-dir DIR  # any Hugging Face causal-LM folder instead

Model: the tiny Qwen3 of ``rl/tiny_model.py`` (``TINY_CONFIG``: 2 layers, hidden 64, Qwen3's
151,936-token vocabulary, tied embeddings; ``build_tiny_model``'s seeded initialisation),
built in memory since no tokenizer is needed. Its cost is the vocabulary: the (B*T, 152k)
logits, their log-softmax and the 9.7M-parameter embedding's AdamW update, which every Qwen3 has
and which is where the trainer's own code (logprobs, loss, clipping) could add time; the
transformer layers are the same Hugging Face code on both sides. A step takes seconds on
2 cores, so timer noise is nothing next to the shared machine's, which the rounds spread.

Batch: ``--samples`` sequences of ``--tokens`` tokens (random ids, the first quarter prompt
and the rest completion in the loss mask, advantages +1/-1 in groups of 4, old logprobs the
model's own, as a recorded on-policy rollout carries them), cut into micro-batches of
``--micro-batch`` samples and padded (``rl.batches``) once, for both sides.

Sides, each with its own copy of the weights and its own AdamW (``TrainSettings``' lr and
weight decay), so that their steps never interfere:

* ``embedded``: ``rl.trainer.train_step``: per micro-batch a forward, token logprobs, veRL's
  vanilla GRPO policy loss (``core_algos``, token-mean over the mini-batch) and backward;
  then gradient clipping and the AdamW step;
* ``hf``: the loop one writes by hand: per micro-batch the base model's forward, the
  vocabulary logits at the trained positions only (``lm_head`` on their hidden states, as
  the embedded trainer does), cross-entropy (``reduction="none"``), the token-mean of
  -advantage x logprob and backward; then the AdamW step;
* ``train()``: ``rl.trainer.train`` over the samples, one step: what ``forge train`` runs
  per step (vocabulary check, collation, a fresh AdamW, group statistics) around the step.

One warm-up step each, then ``--rounds`` rounds of one step per side, the first side
rotating, so that load from elsewhere falls on all sides alike. Same dtype, the same
``torch.set_num_threads``. Figures (medians): ``train.step_seconds``,
``train.hf_step_seconds``, ``train.step_ratio_vs_hf`` (goal <= 1.2; wall time),
``train.step_cpu_ratio_vs_hf`` (the same in CPU seconds of this process, steadier when
other work shares the cores), ``train.call_seconds`` and ``train.call_ratio_vs_hf``,
recorded in bench/results.json unless ``--no-record``. On a small shared machine
``--threads 1`` is the steady measure: two OpenMP threads on two busy cores wait on each
other, and their steps then vary 3x from round to round.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench import results
from rl.batches import Batch, Sample, collate, split_micro_batches
from rl.tiny_model import TINY_CONFIG
from rl.trainer import TrainSettings, load_policy, token_logprobs, train, train_step

GOAL_RATIO = 1.2  # the bound on embedded / plain Hugging Face step time
GROUP_SIZE = 4  # GRPO group: advantages +1/-1 alternate within it
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SIDES = ("embedded", "hf", "train()")


def build_model(model_dir: Path | None, dtype: torch.dtype) -> Any:
    """The tiny Qwen3 (seeded as ``build_tiny_model`` seeds it), or ``model_dir``'s model."""
    if model_dir is not None:
        return load_policy(model_dir, dtype)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**TINY_CONFIG)).to(dtype)


def make_samples(model: Any, n: int, tokens: int, seed: int = 0) -> list[Sample]:
    """``n`` samples of ``tokens`` ids, old logprobs from ``model`` (on-policy)."""
    g = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    prompt = max(1, tokens // 4)
    ids = torch.randint(0, vocab, (n, tokens), generator=g)  # (n, tokens)
    mask = [0] * prompt + [1] * (tokens - prompt)
    bare = [
        Sample(
            sample_id=f"s{i:03d}",
            group_id=f"task{i // GROUP_SIZE}",
            input_ids=tuple(ids[i].tolist()),
            loss_mask=tuple(mask),
            old_logprobs=None,
            advantage=1.0 if i % 2 == 0 else -1.0,
            policy_version=0,
        )
        for i in range(n)
    ]
    batch = collate(bare)
    model.eval()
    with torch.no_grad():
        lps = token_logprobs(model, batch) * batch.loss_mask  # (n, tokens)
    return [
        Sample(s.sample_id, s.group_id, s.input_ids, s.loss_mask, tuple(lp.tolist()), s.advantage)
        for s, lp in zip(bare, lps, strict=True)
    ]


def hf_step(model: Any, optimizer: torch.optim.Optimizer, batches: list[Batch]) -> float:
    """One plain step: forward, masked token-mean policy-gradient loss, backward per
    micro-batch, then AdamW; returns the loss. Like the embedded trainer, it computes the
    vocabulary logits at the trained positions only (the base model's hidden states there,
    through ``lm_head``), not at every position: the fair hand-written loop."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    tokens = sum(b.n_loss_tokens for b in batches)
    total = 0.0
    for b in batches:
        hidden = model.model(input_ids=b.input_ids, attention_mask=b.attention_mask)
        at = b.loss_mask[:, 1:].bool()  # (B, T-1): position j predicts a trained token j+1
        logits = model.lm_head(hidden.last_hidden_state[:, :-1][at])  # (N, V)
        logp = -F.cross_entropy(logits.float(), b.input_ids[:, 1:][at], reduction="none")
        weights = (b.advantages * b.loss_mask)[:, 1:][at]  # (N,)
        loss = -(logp * weights).sum() / tokens
        loss.backward()
        total += float(loss.detach())
    optimizer.step()
    return total


def measure(
    model: Any,
    samples: list[Sample],
    settings: TrainSettings,
    rounds: int,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall, CPU) seconds per step of each side, ``rounds`` each after one warm-up,
    interleaved; CPU seconds are this process's, all threads (steadier on a shared machine)."""
    pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
    batches = [collate(c, pad_id) for c in split_micro_batches(samples, settings.micro_batch_size)]
    models = {name: copy.deepcopy(model) for name in SIDES}

    def adamw(m: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(m.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)

    optimizers = {name: adamw(models[name]) for name in ("embedded", "hf")}
    steps: dict[str, Callable[[], object]] = {
        "embedded": lambda: train_step(
            models["embedded"], optimizers["embedded"], batches, settings
        ),
        "hf": lambda: hf_step(models["hf"], optimizers["hf"], batches),
        "train()": lambda: train(models["train()"], samples, settings),
    }
    for name in SIDES:  # warm-up: allocator, AdamW state, lazy imports (veRL)
        steps[name]()
    wall: dict[str, list[float]] = {name: [] for name in SIDES}
    cpu: dict[str, list[float]] = {name: [] for name in SIDES}
    for r in range(rounds):
        k = r % len(SIDES)
        for name in SIDES[k:] + SIDES[:k]:
            began, began_cpu = time.perf_counter(), time.process_time()
            steps[name]()
            wall[name].append(time.perf_counter() - began)
            cpu[name].append(time.process_time() - began_cpu)
        progress(f"-- round {r + 1}/{rounds}: " + ", ".join(
            f"{n} {wall[n][-1]:.3f} s ({cpu[n][-1]:.3f} CPU s)" for n in SIDES
        ))  # fmt: skip
    return wall, cpu


def render(
    wall: dict[str, list[float]], cpu: dict[str, list[float]], shape: str
) -> tuple[dict[str, float], str]:
    """Figures (medians, ratios) and the Markdown table of ``measure``'s seconds."""
    med = {name: statistics.median(v) for name, v in wall.items()}
    med_cpu = {name: statistics.median(v) for name, v in cpu.items()}
    ratio = med["embedded"] / med["hf"]
    figures = {
        "train.step_seconds": round(med["embedded"], 4),
        "train.hf_step_seconds": round(med["hf"], 4),
        "train.step_ratio_vs_hf": round(ratio, 3),
        "train.step_cpu_ratio_vs_hf": round(med_cpu["embedded"] / med_cpu["hf"], 3),
        "train.call_seconds": round(med["train()"], 4),
        "train.call_ratio_vs_hf": round(med["train()"] / med["hf"], 3),
    }
    label = {
        "embedded": "embedded `train_step` (veRL GRPO loss, clip, AdamW)",
        "hf": "plain Hugging Face loop (PG loss, AdamW)",
        "train()": "embedded `train()`, one step (collate, fresh AdamW)",
    }
    lines = [
        f"| side ({shape}) | steps | median s | min s | max s | median CPU s | vs plain HF "
        "(wall, CPU) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in SIDES:
        v = wall[name]
        lines.append(
            f"| {label[name]} | {len(v)} | {med[name]:.3f} | {min(v):.3f} | {max(v):.3f} | "
            f"{med_cpu[name]:.3f} | {med[name] / med['hf']:.2f}, "
            f"{med_cpu[name] / med_cpu['hf']:.2f} |"
        )
    verdict = "met" if ratio <= GOAL_RATIO else "MISSED"
    lines += ["", f"step ratio embedded / plain HF: {ratio:.2f} (goal <= {GOAL_RATIO}: {verdict})"]
    return figures, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_train", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--samples", type=int, default=8, help="samples per step (default 8)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per sample (default 64)")
    parser.add_argument(
        "--micro-batch", type=int, default=4, help="samples per forward/backward (default 4)"
    )
    parser.add_argument("--rounds", type=int, default=7, help="timed steps per side (default 7)")
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="torch.set_num_threads"
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument(
        "--model-dir", type=Path, help="a Hugging Face model folder (default: the tiny Qwen3)"
    )
    parser.add_argument(
        "--results", type=Path, default=results.BENCH_DIR, help="folder of results.json/.md"
    )
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if min(args.samples, args.micro_batch, args.rounds, args.threads) < 1 or args.tokens < 2:
        parser.error("--samples, --micro-batch, --rounds and --threads >= 1; --tokens >= 2")
    torch.set_num_threads(args.threads)
    began = time.monotonic()
    model = build_model(args.model_dir, DTYPES[args.dtype])
    samples = make_samples(model, args.samples, args.tokens)
    settings = TrainSettings(micro_batch_size=args.micro_batch)
    wall, cpu = measure(model, samples, settings, args.rounds, lambda s: print(s, flush=True))
    shape = (
        f"{args.samples} x {args.tokens} tokens, micro-batch {args.micro_batch}, "
        f"{args.dtype}, {args.threads} threads"
    )
    figures, table = render(wall, cpu, shape)
    print()
    print(table)
    print(json.dumps(figures, indent=2))
    print(f"{time.monotonic() - began:.0f} s in all")
    if not args.no_record:
        args.results.mkdir(parents=True, exist_ok=True)
        results.record(
            "train",
            figures,
            table + "\n",
            details={
                "wall_s": wall,
                "cpu_s": cpu,
                "samples": args.samples,
                "tokens": args.tokens,
                "micro_batch": args.micro_batch,
                "dtype": args.dtype,
                "threads": args.threads,
                "model": str(args.model_dir) if args.model_dir else "tiny Qwen3 (TINY_CONFIG)",
                "parameters": sum(p.numel() for p in model.parameters()),
            },
            command=results.command_line("bench.bench_train", argv),
            json_path=args.results / "results.json",
            md_path=args.results / "results.md",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
