"""One GRPO pass of veRL's FSDP training engine over a snapshot's samples.

The path is veRL's own, as its ``RayPPOTrainer`` drives it: ``DataProto`` ->
``to_tensordict`` -> ``left_right_2_no_padding`` -> ``TrainingWorker.infer_batch`` (old
logprobs, and the reference's when the KL loss is on) -> ``TrainingWorker.train_mini_batch``
(FSDP forward/backward, ``verl.workers.utils.losses.ppo_loss`` over ``core_algos``, the
optimizer step per mini-batch). One process per device: world size 1 by default; under
``torchrun --nproc-per-node N`` each process takes its share of the rows (FSDP shards the
weights across them) and rank 0 writes the checkpoint.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from mitm_addon.launch import free_port
from rl.batches import Sample
from rl.verl_backend import config as vconfig
from rl.verl_backend.dataproto import to_dataproto

__all__ = ["VerlResult", "train"]


@dataclass(frozen=True)
class VerlResult:
    metrics: dict[str, float]
    state_dict: dict[str, torch.Tensor] | None  # full weights on rank 0, None elsewhere
    rank: int
    world_size: int
    device: str


def _init_distributed(cuda: bool) -> tuple[int, int]:
    """Join the process group ``torchrun`` described, or make one of world size 1."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            os.environ.update(
                RANK="0",
                LOCAL_RANK="0",
                WORLD_SIZE="1",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(free_port()),
            )
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _mean(value: Any) -> float:
    if isinstance(value, (list, tuple)):
        vals = [float(v) for v in value]
        return sum(vals) / len(vals) if vals else float("nan")
    return float(value)


def train(
    samples: list[Sample],
    model_path: Path,
    cfg: DictConfig,
    pad_id: int = 0,
    log: Callable[[str], None] = lambda _msg: None,
) -> VerlResult:
    """Update the policy at ``model_path`` on ``samples``; the new weights come back."""
    cuda = torch.cuda.is_available()
    if not cuda:
        from rl.verl_backend import cpu

        cpu.install()  # before verl.workers.engine is imported
    rank, world = _init_distributed(cuda)
    actor_cfg = vconfig.actor_config(cfg, model_path, len(samples), world)
    mini = actor_cfg.ppo_mini_batch_size

    # veRL lists each engine it could not import (Megatron, TorchTitan, ...) as a warning.
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    torch.manual_seed(int(cfg.seed))
    worker = TrainingWorker(
        config=TrainingWorkerConfig(
            model_type="language_model",
            model_config=actor_cfg.model_config,
            engine_config=actor_cfg.engine,
            optimizer_config=actor_cfg.optim,
            checkpoint_config=actor_cfg.checkpoint,
        )
    )
    worker.reset()  # from_pretrained, FSDP wrap, optimizer and scheduler
    worker.set_loss_fn(partial(ppo_loss, config=actor_cfg))
    log(
        f"veRL engine {type(worker.engine).__name__} on {'cuda' if cuda else 'cpu'}, "
        f"{world} process(es), {len(samples)} samples, micro-batches of "
        f"{actor_cfg.ppo_micro_batch_size_per_gpu}"
    )

    data = to_dataproto(samples, pad_id=pad_id)
    if world > 1:
        data = data.chunk(world)[rank]

    def tensordict(**extra: Any) -> Any:
        td = left_right_2_no_padding(data.to_tensordict())
        tu.assign_non_tensor(td, **extra)
        return td

    # The actor's logprobs before the update: veRL's old logprobs, and the reference's.
    td = tensordict(calculate_entropy=False, compute_loss=False)
    current = no_padding_2_padding(tu.get(worker.infer_batch(td), "log_probs"), td).float().cpu()
    mask = data.batch["response_mask"].bool()
    known = torch.as_tensor(data.non_tensor_batch["old_log_probs_known"], dtype=torch.bool)
    sampled = data.batch["old_log_probs"]
    metrics: dict[str, float] = {}
    both = mask & known[:, None]
    if both.any():
        metrics["old_logprobs/abs_diff_sampling"] = float((sampled - current)[both].abs().mean())
    recompute = cfg.old_log_probs == "recompute"
    old = current if recompute else torch.where(known[:, None], sampled, current)
    data.batch["old_log_probs"] = old * mask
    if actor_cfg.use_kl_loss:
        data.batch["ref_log_prob"] = current * mask
    data.meta_info["multi_turn"] = True

    td = tensordict(
        calculate_entropy=actor_cfg.entropy_coeff != 0,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini,
        mini_batch_size=mini,
        epochs=actor_cfg.ppo_epochs,
        seed=actor_cfg.data_loader_seed,
        dataloader_kwargs={"shuffle": actor_cfg.shuffle},
        compute_loss=True,
    )
    out = worker.train_mini_batch(td)
    for key, value in tu.get(out, "metrics").items():
        metrics[key] = _mean(value)

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # BaseEngine does not declare ``module``; the FSDP engines set it in their __init__.
    state = get_model_state_dict(
        worker.engine.module,  # type: ignore[attr-defined]
        options=StateDictOptions(full_state_dict=True, cpu_offload=True),
    )
    dist.barrier()
    return VerlResult(
        metrics=metrics,
        # A full (unsharded) state dict holds plain tensors.
        state_dict=cast("dict[str, torch.Tensor]", state) if rank == 0 else None,
        rank=rank,
        world_size=world,
        device="cuda" if cuda else "cpu",
    )
