# veRL and Ray carry no annotations on the trainer, worker-group and Ray calls made here.
# mypy: disallow-untyped-calls=False
"""GRPO over a snapshot's samples through veRL's own single controller on Ray.

veRL's ``RayPPOTrainer`` drives the step: its Hydra config (``ppo_trainer.yaml``, composed
with the user's overrides), its data-loader seam (``train_dataset``, ``collate_fn``) fed with
the snapshot's samples, its ``RayResourcePool`` and ``RayWorkerGroup`` of
``ActorRolloutRefWorker`` actors (role ``actor``: the FSDP ``TrainingWorker`` and no rollout
engine), and its own ``_balance_batch``, ``_compute_old_log_prob``, ``_update_actor`` and
``_save_checkpoint``. Forge's rollouts come from the real harness and its advantages from
the pipeline, so the steps of ``fit`` that generate, score and estimate advantages are the
ones left out. Scaling out is veRL's: ``ray start`` on each node, ``trainer.nnodes`` and
``trainer.n_gpus_per_node``.

On CPUs (``trainer.device=cpu``, or a local cluster on a machine without a GPU) each Ray
worker process installs Forge's CPU platform (``rl/verl_backend/cpu.py``) through Ray's
``worker_process_setup_hook``, before veRL's engine is imported there, and a worker-group
member joins its gloo process group there (veRL's own join names a backend torch refuses
on CPU); the resource pool asks for CPU bundles instead of GPUs.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf, open_dict

from rl.batches import Sample

__all__ = ["RayResult", "compose", "on_cpu", "setup_worker", "train"]

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SETUP_HOOK = "rl.verl_backend.ray_run.setup_worker"

# What Forge's data asks of veRL's defaults, whatever the devices: the advantages are the
# pipeline's GRPO ones (no critic), each sample is one row (rollout.n 1), nothing is
# generated or validated, metrics go to the caller.
FORGE_OVERRIDES = (
    "algorithm.adv_estimator=grpo",
    "critic.enable=false",
    "actor_rollout_ref.rollout.n=1",
    "trainer.val_before_train=false",
    "trainer.total_epochs=1",  # one pass over the snapshot, as the other backends
    "trainer.logger=[console]",
    "data.dataloader_num_workers=0",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    # veRL's checkpoint with the full Hugging Face weights: the new policy Forge serves.
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
)

# A cluster without GPUs: veRL's GPU-only defaults (flash-attention packing, bf16, FSDP1,
# torch.compile) replaced by what runs on the CPU; one process per node unless asked.
CPU_OVERRIDES = (
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
)


@dataclass(frozen=True)
class RayResult:
    metrics: dict[str, float]
    checkpoint: Path  # veRL's actor checkpoint; its huggingface/ holds the new weights
    weights: Path  # that huggingface/ folder (from_pretrained loads it)
    processes: int
    nodes: int
    device: str


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook`` on a cluster without GPUs, in every worker process
    as it starts: the CPU platform, and for a worker-group member its process group."""
    from rl.verl_backend import cpu

    cpu.install()
    # A RayWorkerGroup member: veRL set RANK, WORLD_SIZE and MASTER_* in its runtime env.
    # veRL's own join (verl/utils/distributed.py, initialize_global_process_group_ray) asks
    # torch for backend "cpu:gloo,{device}:{backend}", which is "cpu:gloo,cpu:gloo" here and
    # refused as a duplicate; it joins only when no group exists, so the group is made here
    # with the same gloo collective.
    if os.environ.get("WG_BACKEND") == "ray" and "RANK" in os.environ:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(
                backend="gloo",
                rank=int(os.environ["RANK"]),
                world_size=int(os.environ["WORLD_SIZE"]),
            )


def on_cpu(config: DictConfig) -> bool:
    """Whether the run is on CPUs: ``trainer.device=cpu``, or a local cluster on a machine
    without a GPU. (The workers never ask torch: a CUDA query before Ray sets a worker's
    visible devices would pin them.)"""
    if str(config.trainer.device) == "cpu":
        return True
    remote = os.environ.get("RAY_ADDRESS") or config.ray_kwargs.ray_init.get("address")
    if remote:
        return False  # veRL's default trainer.device=cuda: a GPU cluster
    import torch

    return not torch.cuda.is_available()


def compose(overrides: Sequence[str] = (), cpu: bool = False) -> DictConfig:
    """veRL's ``ppo_trainer.yaml`` through Hydra with Forge's defaults, then ``overrides``
    (Hydra's syntax: ``key=value``, ``+key=value`` for a key the file lacks)."""
    import verl.trainer
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = Path(verl.trainer.__file__).parent / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        defaults = [*FORGE_OVERRIDES, *(CPU_OVERRIDES if cpu else ())]
        return hydra_compose("ppo_trainer", overrides=[*defaults, *overrides])


def _init_ray(config: DictConfig, cpu: bool) -> None:
    """Join the cluster ``ray start`` made (``RAY_ADDRESS`` or ``ray_kwargs.ray_init.address``)
    or start a local one, with veRL's runtime env plus Forge's worker setup hook."""
    import ray

    if ray.is_initialized():
        return
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    init_kwargs = cast(
        "dict[str, Any]",
        OmegaConf.to_container(config.ray_kwargs.get("ray_init", {}), resolve=True),
    )
    runtime_env = OmegaConf.to_container(
        OmegaConf.merge(get_ppo_ray_runtime_env(config), init_kwargs.pop("runtime_env", {}) or {}),
        resolve=True,
    )
    assert isinstance(runtime_env, dict)
    runtime_env = {k: v for k, v in runtime_env.items() if v is not None}
    if cpu:
        runtime_env.setdefault("worker_process_setup_hook", SETUP_HOOK)
    env_vars = runtime_env.setdefault("env_vars", {})
    # Forge on every node: installed there, or this checkout on a shared path.
    path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env_vars.setdefault("PYTHONPATH", os.pathsep.join(dict.fromkeys(path)))
    init_kwargs = {k: v for k, v in init_kwargs.items() if v is not None}
    ray.init(runtime_env=runtime_env, **init_kwargs)


class _Samples:
    """The snapshot's samples as a map-style dataset for veRL's ``StatefulDataLoader``."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        self.samples = list(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i]


def _trainer_class() -> Any:
    """``RayPPOTrainer`` with the actor-only worker group and a ``fit`` over recorded samples."""
    import torch
    from verl.single_controller.ray import (
        RayClassWithInitArgs,
        RayResourcePool,
    )
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import Role
    from verl.utils.metric import reduce_metrics

    class SnapshotPPOTrainer(RayPPOTrainer):
        def init_workers(self) -> None:
            """veRL's ``init_workers`` for the actor alone: no rollout, reward or critic."""
            if self.use_reference_policy or self.use_critic or self.use_rm:
                raise ValueError(
                    "the Ray path trains the actor alone: set actor_rollout_ref.actor.use_kl_loss"
                    "=false, algorithm.use_kl_in_reward=false, critic.enable=false and "
                    "reward.reward_model.enable=false"
                )
            manager = self.resource_pool_manager
            if self.device_name != "cpu":
                manager.create_resource_pool()  # veRL's own: one GPU per process
            else:  # veRL's pool asks for GPUs there; the same pool over CPU bundles
                for name, per_node in manager.resource_pool_spec.items():
                    manager.resource_pool_dict[name] = RayResourcePool(
                        process_on_nodes=per_node,
                        use_gpu=False,
                        max_colocate_count=1,
                        name_prefix=name,
                    )
            pool = manager.resource_pool_dict["global_pool"]
            actor = RayClassWithInitArgs(
                cls=self.role_worker_mapping[Role.ActorRollout],
                config=self.config.actor_rollout_ref,
                role="actor",
            )
            self.actor_rollout_wg = self.ray_worker_group_cls(
                resource_pool=pool,
                ray_cls_with_init=actor,
                device_name=self.device_name,
                ray_wait_register_center_timeout=self.config.trainer.ray_wait_register_center_timeout,
            )
            self.actor_rollout_wg.init_model()

        def fit(self) -> list[dict[str, float]]:
            """``RayPPOTrainer.fit`` from the recorded batch on: balance, old (and rollout)
            logprobs, the actor update; a checkpoint after the last step."""
            from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode
            from verl.utils.debug.metrics import calculate_debug_metrics

            steps: list[dict[str, float]] = []
            self.global_steps = 0
            actor_cfg = self.config.actor_rollout_ref.actor
            rollout_corr = self.config.algorithm.get("rollout_correction", None)
            bypass = bool(rollout_corr and rollout_corr.get("bypass_mode", False))
            for _epoch in range(self.config.trainer.total_epochs):
                for batch in self.train_dataloader:
                    self.global_steps += 1
                    metrics: dict[str, float] = {}
                    batch.meta_info["temperature"] = (
                        self.config.actor_rollout_ref.rollout.temperature
                    )
                    # The policy server's logprobs are veRL's rollout logprobs (all or none).
                    sampled = batch.pop(batch_keys=["old_log_probs"]).batch["old_log_probs"]
                    if batch.non_tensor_batch["old_log_probs_known"].all():
                        batch.batch["rollout_log_probs"] = sampled
                    if self.config.trainer.balance_batch:
                        self._balance_batch(batch, metrics=metrics)
                    mask = batch.batch["attention_mask"]
                    batch.meta_info["global_token_num"] = torch.sum(mask, dim=-1).tolist()
                    batch.meta_info["images_seqlens"] = []
                    if bypass:
                        apply_bypass_mode(batch, rollout_corr, actor_cfg.policy_loss)
                    else:
                        old, old_mfu = self._compute_old_log_prob(batch)
                        entropys = old.batch.pop("entropys")
                        metrics["actor/entropy"] = float(
                            agg_loss(
                                loss_mat=entropys,
                                loss_mask=batch.batch["response_mask"],
                                loss_agg_mode=actor_cfg.loss_agg_mode,
                                loss_scale_factor=actor_cfg.loss_scale_factor,
                            )
                        )
                        metrics["perf/mfu/actor_infer"] = float(old_mfu)
                        batch = batch.union(old)
                    if "rollout_log_probs" in batch.batch:
                        metrics.update(calculate_debug_metrics(batch))
                    # advantages: the pipeline's GRPO ones, already on the response tokens
                    out = self._update_actor(batch)
                    metrics.update(reduce_metrics(out.meta_info["metrics"]))
                    metrics["training/global_step"] = self.global_steps
                    steps.append({k: float(v) for k, v in metrics.items()})
            self._save_checkpoint()
            return steps

    return SnapshotPPOTrainer


def train(
    samples: list[Sample],
    overrides: Sequence[str] = (),
    log_line: Callable[[str], None] = lambda _msg: None,
) -> RayResult:
    """One pass of veRL's Ray trainer over ``samples``; ``overrides`` are veRL's Hydra ones
    (``actor_rollout_ref.model.path=...``, ``trainer.default_local_dir=...``,
    ``trainer.nnodes=2``, ...). The new weights are veRL's checkpoint's ``huggingface/``."""
    import ray

    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    asked = compose(overrides)
    cpu = on_cpu(asked)
    _init_ray(asked, cpu)
    if cpu:
        setup_worker()  # the driver too: veRL's pool and groups read the platform
    n = len(samples)
    sized = [f"data.train_batch_size={n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={n}"]
    config = compose([*sized, *overrides], cpu=cpu)
    OmegaConf.resolve(config)

    from verl.trainer.main_ppo_v0 import BaseTaskRunner
    from verl.utils.config import omega_conf_to_dataclass

    from rl.verl_backend.dataproto import to_dataproto

    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tokenizer = model_config.tokenizer
    pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else 0
    runner = BaseTaskRunner()  # veRL's role mapping and pool spec (nnodes x n_gpus_per_node)
    runner.add_actor_rollout_worker(config)  # ActorRolloutRefWorker, on the global pool
    with open_dict(config):
        manager = runner.init_resource_pool_mgr(config)
    dataset = _Samples(samples)
    trainer = _trainer_class()(
        config=config,
        tokenizer=tokenizer,
        role_worker_mapping=runner.role_worker_mapping,
        resource_pool_manager=manager,
        train_dataset=dataset,
        val_dataset=dataset,  # never generated from: val_before_train is off
        collate_fn=lambda rows: to_dataproto(rows, pad_id=pad_id),
        device_name=str(config.trainer.device),
    )
    processes = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    log_line(
        f"veRL RayPPOTrainer: {config.trainer.nnodes} node(s) x {config.trainer.n_gpus_per_node} "
        f"process(es) on {'cpu' if cpu else 'gpu'}, {n} samples, Ray at "
        f"{ray.get_runtime_context().gcs_address}"
    )
    trainer.init_workers()
    steps = trainer.fit()
    checkpoint = (
        Path(config.trainer.default_local_dir) / f"global_step_{trainer.global_steps}" / "actor"
    )
    metrics = steps[-1] if steps else {}
    return RayResult(
        metrics=metrics,
        checkpoint=checkpoint,
        weights=checkpoint / "huggingface",
        processes=processes,
        nodes=int(config.trainer.nnodes),
        device="cpu" if cpu else "cuda",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rl.verl_backend.ray_run data.train_files=SNAPSHOT
    actor_rollout_ref.model.path=MODEL trainer.default_local_dir=DIR [veRL overrides]``:
    one line of JSON (the last step's metrics and the new weights' folder) on stdout."""
    import json
    import sys

    from rl.batches import read_samples

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    overrides = list(sys.argv[1:] if argv is None else argv)
    snapshot = Path(str(compose(overrides).data.train_files))
    samples = read_samples(snapshot)
    if not samples:
        raise SystemExit(f"data.train_files={snapshot}: the snapshot has no samples")
    result = train(samples, overrides, log_line=log.info)
    line = {
        **result.metrics,
        "samples/count": len(samples),
        "weights": str(result.weights),
        "processes": result.processes,
        "nodes": result.nodes,
        "device": result.device,
    }
    print(json.dumps(line, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
