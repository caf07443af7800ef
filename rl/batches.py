"""Training batches from a snapshot's ``samples`` table: padded tensors per micro-batch.

A snapshot sample is one token sequence (prompt, completion, prompt delta, completion,
...) with a loss mask on the model's own tokens, the sampling logprobs of those tokens
and the rollout's advantage (gamma = 1: the terminal advantage is broadcast to every
trained token). ``collate`` turns rows into right-padded ``(B, T)`` tensors; the GRPO
group id becomes veRL's ``uid``. Everything here is pure except ``read_samples``.

A vision policy's sample names the images its tokens show (``images``: hashes, in the
order of their runs of image pads); ``collate`` given a ``SampleImages`` (the snapshot's
images table and the model's image processor) adds their pixel inputs to the batch.

Token alignment: every tensor is indexed by token position ``t``. The logprob of token
``t`` comes from the logits at ``t - 1``, so position 0 is never trained (a sample whose
first token is in the loss mask is refused).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import torch

if TYPE_CHECKING:
    from rl.vision_inputs import SampleImages

SNAPSHOT_FORMAT = "forge.snapshot/1"
SAMPLES_FILE = "data/train-00000-of-00001.parquet"
# Columns a trainer reads; the snapshot holds more (call ids, token counts).
COLUMNS = (
    "sample_id",
    "group_id",
    "input_ids",
    "loss_mask",
    "old_logprobs",
    "advantage",
    "policy_version",
)


class BatchError(ValueError):
    """Samples that cannot be trained on as given (the message says why and what to do)."""


@dataclass(frozen=True)
class Sample:
    """One training sequence, as a snapshot's ``samples`` row holds it."""

    sample_id: str
    group_id: str | None
    input_ids: tuple[int, ...]  # (n_tokens,)
    loss_mask: tuple[int, ...]  # (n_tokens,) 1 on completion tokens
    old_logprobs: tuple[float, ...] | None  # (n_tokens,) 0 off the mask; None: unknown
    advantage: float
    policy_version: int | None = None
    images: tuple[str, ...] = ()  # hashes of the images shown, in token order

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if n == 0:
            raise BatchError(f"sample {self.sample_id}: no tokens")
        if len(self.loss_mask) != n:
            raise BatchError(
                f"sample {self.sample_id}: {len(self.loss_mask)} mask values for {n} tokens"
            )
        if self.old_logprobs is not None and len(self.old_logprobs) != n:
            raise BatchError(
                f"sample {self.sample_id}: {len(self.old_logprobs)} logprobs for {n} tokens"
            )
        if self.loss_mask[0]:
            raise BatchError(
                f"sample {self.sample_id}: its first token is in the loss mask, but a token "
                "is predicted from the one before it; a sample must start with prompt tokens"
            )
        if not math.isfinite(self.advantage):
            raise BatchError(f"sample {self.sample_id}: advantage {self.advantage} is not finite")

    @property
    def n_loss_tokens(self) -> int:
        return sum(1 for m in self.loss_mask if m)


@dataclass(frozen=True)
class Batch:
    """Right-padded tensors of one micro-batch; ``(B, T)`` unless noted."""

    input_ids: torch.Tensor  # (B, T) int64, pad_id past each sample's end
    attention_mask: torch.Tensor  # (B, T) int64, 1 on real tokens
    loss_mask: torch.Tensor  # (B, T) float32, 1 on trained (completion) tokens
    old_logprobs: torch.Tensor  # (B, T) float32, 0 off the mask and where unknown
    old_logprobs_known: torch.Tensor  # (B,) bool: the sample carried its sampling logprobs
    advantages: torch.Tensor  # (B, T) float32, the sample's advantage on masked tokens, else 0
    uid: tuple[str, ...]  # (B,) GRPO group id (veRL's uid)
    sample_ids: tuple[str, ...]  # (B,)
    # A vision model's inputs for the images of the rows (pixel_values, image_grid_thw,
    # mm_token_type_ids); empty when no row shows one.
    vision: dict[str, torch.Tensor] | None = None

    @property
    def n_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def samples_from_table(table: pa.Table) -> list[Sample]:
    """``Sample`` per row of a ``samples`` table (the snapshot's schema)."""
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise BatchError(f"the samples table lacks columns {missing}; is it a Forge snapshot?")
    out = []
    columns = list(COLUMNS) + (["images"] if "images" in table.column_names else [])
    for row in table.select(columns).to_pylist():
        lp = row["old_logprobs"]
        out.append(
            Sample(
                sample_id=str(row["sample_id"]),
                group_id=row["group_id"],
                input_ids=tuple(row["input_ids"] or ()),
                loss_mask=tuple(row["loss_mask"] or ()),
                old_logprobs=None if lp is None else tuple(lp),
                advantage=float(row["advantage"] if row["advantage"] is not None else math.nan),
                policy_version=row["policy_version"],
                images=tuple(row.get("images") or ()),
            )
        )
    return out


def read_samples(snapshot: str | Path) -> list[Sample]:
    """The samples of the snapshot directory ``snapshot`` (checked against its manifest)."""
    root = Path(snapshot)
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise BatchError(f"{root} has no manifest.json: write one with `forge snapshot`")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (ValueError, OSError) as e:
        raise BatchError(f"{manifest_path}: not a snapshot manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise BatchError(f"{manifest_path}: not a snapshot manifest (not a JSON object)")
    if manifest.get("format") != SNAPSHOT_FORMAT:
        raise BatchError(
            f"{root}: snapshot format {manifest.get('format')!r}, this trainer reads "
            f"{SNAPSHOT_FORMAT!r}"
        )
    rel = manifest.get("tables", {}).get("samples", {}).get("path", SAMPLES_FILE)
    try:
        table = pq.read_table(root / rel)
    except (pa.ArrowException, OSError) as e:
        raise BatchError(f"{root / rel}: cannot read the snapshot's samples ({e})") from None
    return samples_from_table(table)


def read_images(snapshot: str | Path) -> dict[str, bytes]:
    """The raw images of a snapshot by hash (empty for one without an images table)."""
    root = Path(snapshot)
    manifest = json.loads((root / "manifest.json").read_text())
    rel = manifest.get("tables", {}).get("images", {}).get("path")
    if rel is None or not (root / rel).is_file():
        return {}
    table = pq.read_table(root / rel, columns=["hash", "data"])
    return dict(zip(table.column("hash").to_pylist(), table.column("data").to_pylist(), strict=True))


def read_group_stats(snapshot: str | Path) -> dict[str, float]:
    """Group metrics of the snapshot's ``groups`` table, which also holds the rollouts the
    GRPO rules dropped: ``groups/zero_spread`` counts groups whose members all had one
    reward (dropped by default, so absent from the samples), ``rollouts/dropped/<reason>``
    the rollouts left out per reason."""
    root = Path(snapshot)
    manifest = json.loads((root / "manifest.json").read_text())
    rel = manifest.get("tables", {}).get("groups", {}).get("path")
    if rel is None or not (root / rel).is_file():
        return {}
    rows = pq.read_table(root / rel, columns=["group_id", "drop_reason"]).to_pylist()
    zero = {r["group_id"] for r in rows if r["drop_reason"] == "zero_spread"}
    out = {
        "groups/total": float(len({r["group_id"] for r in rows})),
        "groups/zero_spread": float(len(zero)),
    }
    for r in rows:
        if r["drop_reason"] is not None:
            key = f"rollouts/dropped/{r['drop_reason']}"
            out[key] = out.get(key, 0.0) + 1.0
    return out


def crop_to_reach(sample: Sample, reach: int) -> Sample:
    """``sample`` without the tokens that no trained logit can see: those more than
    ``reach`` positions before the position that predicts its first trained token.

    For a model whose every layer attends ``window`` tokens (itself included), a hidden
    state depends on the ``layers x (window - 1)`` tokens before it and no others
    (``attention_reach``); rotary position embeddings depend on relative positions only,
    so the logprobs of the cropped sample are the full one's, up to float rounding.
    """
    if reach < 0:
        raise BatchError(f"reach must be >= 0, not {reach}")
    first = next((i for i, m in enumerate(sample.loss_mask) if m), None)
    start = 0 if first is None else max(0, first - 1 - reach)
    if start == 0:
        return sample
    lp = sample.old_logprobs
    if sample.images:
        raise BatchError(f"sample {sample.sample_id} shows images: it cannot be cropped")
    return replace(
        sample,
        input_ids=sample.input_ids[start:],
        loss_mask=sample.loss_mask[start:],
        old_logprobs=None if lp is None else lp[start:],
    )


def collate(
    samples: Sequence[Sample], pad_id: int = 0, images: SampleImages | None = None
) -> Batch:
    """Right-pad ``samples`` to the longest one: one ``Batch``; with ``images``, the
    pixel inputs of the images the samples show."""
    if not samples:
        raise BatchError("no samples to collate")
    b, t = len(samples), max(len(s.input_ids) for s in samples)
    input_ids = torch.full((b, t), pad_id, dtype=torch.int64)
    attention = torch.zeros((b, t), dtype=torch.int64)
    mask = torch.zeros((b, t), dtype=torch.float32)
    old = torch.zeros((b, t), dtype=torch.float32)
    known = torch.zeros(b, dtype=torch.bool)
    adv = torch.zeros((b, t), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        input_ids[i, :n] = torch.tensor(s.input_ids, dtype=torch.int64)
        attention[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        if s.old_logprobs is not None:
            old[i, :n] = torch.tensor(s.old_logprobs, dtype=torch.float32) * mask[i, :n]
            known[i] = True
        adv[i, :n] = s.advantage * mask[i, :n]
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=mask,
        old_logprobs=old,
        old_logprobs_known=known,
        advantages=adv,
        uid=tuple(s.group_id or s.sample_id for s in samples),
        sample_ids=tuple(s.sample_id for s in samples),
        vision=images.inputs(samples, input_ids) if images is not None else None,
    )


def split_micro_batches(
    samples: Sequence[Sample], micro_batch_size: int, max_tokens: int | None = None
) -> list[list[Sample]]:
    """Consecutive chunks of at most ``micro_batch_size`` samples and, when given, at most
    ``max_tokens`` padded tokens (rows x longest row); order is kept."""
    if micro_batch_size < 1:
        raise BatchError(f"micro_batch_size must be at least 1, not {micro_batch_size}")
    out: list[list[Sample]] = []
    current: list[Sample] = []
    longest = 0
    for s in samples:
        n = len(s.input_ids)
        if max_tokens is not None and n > max_tokens:
            raise BatchError(
                f"sample {s.sample_id} has {n} tokens, over the micro-batch budget of "
                f"{max_tokens}: raise --max-tokens (samples are never truncated)"
            )
        grown = max(longest, n) * (len(current) + 1)
        if current and (
            len(current) >= micro_batch_size or (max_tokens is not None and grown > max_tokens)
        ):
            out.append(current)
            current, longest = [], 0
        current.append(s)
        longest = max(longest, n)
    if current:
        out.append(current)
    return out


def iter_batches(
    samples: Sequence[Sample],
    micro_batch_size: int,
    max_tokens: int | None = None,
    pad_id: int = 0,
    images: SampleImages | None = None,
) -> Iterator[Batch]:
    """Padded micro-batches of ``samples``, in order."""
    for chunk in split_micro_batches(samples, micro_batch_size, max_tokens):
        yield collate(chunk, pad_id, images)


def group_stats(samples: Sequence[Sample]) -> dict[str, float]:
    """Advantage and group metrics of a set of samples (``adv/*``, ``groups/*``).

    A group with zero spread (every advantage 0: all rewards equal) gives no gradient.
    """
    if not samples:
        return {"groups/count": 0.0, "groups/zero_spread": 0.0, "samples/count": 0.0}
    by_group: dict[str, list[float]] = {}
    for s in samples:
        by_group.setdefault(s.group_id or s.sample_id, []).append(s.advantage)
    advs = [s.advantage for s in samples]
    zero = sum(1 for values in by_group.values() if all(abs(a) < 1e-12 for a in values))
    tokens = [s.n_loss_tokens for s in samples]
    return {
        "adv/mean": sum(advs) / len(advs),
        "adv/min": min(advs),
        "adv/max": max(advs),
        "groups/count": float(len(by_group)),
        "groups/zero_spread": float(zero),
        "samples/count": float(len(samples)),
        "samples/loss_tokens": float(sum(tokens)),
        "samples/unknown_logprobs": float(sum(1 for s in samples if s.old_logprobs is None)),
    }
