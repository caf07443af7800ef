"""A CPU platform for veRL, registered through its platform plugin (``set_platform``).

veRL 0.9.1 ships CUDA, ROCm and NPU platforms and falls back to CUDA when none is found,
so on a machine without a GPU its FSDP engine calls ``torch.cuda.set_device``. This
platform names the device ``cpu`` and the collective backend ``gloo``; FSDP2, the
optimizer and the loss then run unchanged. Memory figures are reported as 0. It must be
installed before ``verl.workers.engine`` is imported (the engine reads the device name at
import), and only where no GPU is present. The engine registry lists the FSDP engine under
``cuda`` only; ``VERL_ENGINE_DEVICE=cuda`` (veRL's documented override) selects it.
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["install"]


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


# What veRL calls on get_torch_device() along the training path.
_DEVICE_MODULE = types.SimpleNamespace(
    max_memory_allocated=_zero,
    max_memory_reserved=_zero,
    memory_allocated=_zero,
    memory_reserved=_zero,
    mem_get_info=lambda *_a, **_k: (0, 0),
    reset_peak_memory_stats=_nothing,
    empty_cache=_nothing,
    synchronize=_nothing,
    set_device=_nothing,
    is_available=lambda: True,
    device_count=lambda: 1,
    current_device=lambda: "cpu",
    get_device_name=lambda *_a, **_k: "CPU",
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state,
    Stream=torch.cpu.Stream,
    current_stream=torch.cpu.current_stream,
    stream=torch.cpu.stream,
)


def install() -> None:
    """Make veRL run on the CPU in this process (before ``verl.workers.engine`` is imported)."""
    from verl.plugin.platform import platform_manager
    from verl.plugin.platform.platform_base import PlatformBase

    class CPUPlatform(PlatformBase):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: _DEVICE_MODULE)

        def is_available(self) -> bool:
            return True

        # The base says int, but veRL only uses it as tensor.to(get_device_id()), where "cpu" works.
        def current_device(self) -> str:  # type: ignore[override]
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    platform_manager.set_platform(CPUPlatform())
