"""The veRL backend of ``forge train``: snapshot samples become veRL ``DataProto`` batches
that veRL's own FSDP training engine (``verl.workers.engine_workers.TrainingWorker``) updates
the policy with.

- ``dataproto``: pure conversion of samples to veRL's padded layout.
- ``config``: ``rl/config/grpo.yaml`` (OmegaConf, Hydra-style ``key=value`` overrides) to
  veRL's config dataclasses.
- ``cpu``: a CPU platform for veRL (it has none), registered through its platform plugin,
  so the same engine runs on a machine without a GPU.
- ``run``: one GRPO pass, world size 1 or one process per GPU under ``torchrun``.
"""
