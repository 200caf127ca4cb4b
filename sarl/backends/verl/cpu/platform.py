"""A "cpu" platform for verl 0.9.1, and the four places where verl assumes an accelerator, made to work on CPU.

verl picks its device through its platform registry (verl/plugin/platform/platform_manager.py): `VERL_PLATFORM=cpu`
selects the platform registered here, in every process that imports verl with this module in
`VERL_USE_EXTERNAL_MODULES` (`backend=verl_cpu` sets both; sarl.backends.verl.cpu). Nothing here runs in a GPU run.

What verl needs of a device, and what the CPU gives it:
- device "cpu", collective backend "gloo", no-op stream/synchronise/cache calls, memory counters from the process
  (`device_module`, the `torch.<device>` namespace verl calls `get_torch_device()` on: `mem_get_info`,
  `max_memory_allocated`, rng state, a non-empty `get_device_name` for verl/utils/flops_counter.py:76-85);
- Ray: every resource pool asks for the platform's Ray resource (verl/single_controller/ray/base.py:146-148, 404,
  629) and only GPU/NPU are counted (:226-242), so the platform names "GPU" and Ray is started with a logical
  `num_gpus` (`ray_kwargs.ray_init.num_gpus`, written by sarl.backends.verl.cpu.cpu_values); no GPU is touched;
- `patch_verl()`: verl builds the process group's backend as "cpu:gloo,<device>:<backend>"
  (verl/utils/distributed.py:64, 89), which torch rejects for device cpu ("Duplicate device type cpu"): plain
  "gloo";
  the FSDP engines are registered for cuda and npu only (verl/workers/engine/fsdp/transformer_impl.py:1143,
  1594): registered for cpu too; the forward-only reference is offloaded with `CPUOffloadPolicy(pin_memory=True)`
  (transformer_impl.py:462), and pinning needs an accelerator: pin_memory=False.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from sarl.backends.verl.cpu import PLATFORM  # VERL_PLATFORM

DEVICE_NAME = "CPU (sarl.backends.verl.cpu)"


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _device_module() -> types.ModuleType:
    """`torch.cpu` with what verl calls on a device module that torch.cpu lacks (memory counters answer for this
    process's resident memory; rng state is the CPU generator's)."""
    module = types.ModuleType("sarl_cpu_device", "torch.cpu as a verl device module (sarl.backends.verl.cpu)")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    def memory_allocated(device: Any = None) -> int:
        return _rss_bytes()

    extras = {
        "empty_cache": lambda: None,
        "synchronize": lambda device=None: None,
        "ipc_collect": lambda: None,
        "set_per_process_memory_fraction": lambda fraction, device=None: None,
        "mem_get_info": mem_get_info,
        "memory_allocated": memory_allocated,
        "memory_reserved": memory_allocated,
        "max_memory_allocated": memory_allocated,
        "max_memory_reserved": memory_allocated,
        "reset_peak_memory_stats": lambda device=None: None,
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "get_device_name": lambda device=None: DEVICE_NAME,
        "get_device_capability": lambda device=None: (None, None),
        "set_device": lambda device: None,
        "device_count": lambda: 1,
        "is_available": lambda: True,
    }
    for name, fn in extras.items():
        setattr(module, name, fn)
    return module


CPU_DEVICE = _device_module()


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's device abstraction on the CPU: one logical "GPU" per process as Ray sees it, gloo collectives."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM  # only when chosen

    def current_device(self) -> str:
        return "cpu"  # verl moves tensors with `.to(get_device_id())`: the CPU has no index

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # Ray sets it for its logical GPUs; nothing reads it on CPU

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical: Ray starts with ray_init.num_gpus; verl's pools count only GPU/NPU

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


class _UnpinnedCPUOffloadPolicy:
    """`CPUOffloadPolicy(pin_memory=...)` as verl's FSDP2 engine calls it, always with pin_memory=False."""

    def __new__(cls, *args: Any, pin_memory: bool = True, **kwargs: Any) -> Any:
        from torch.distributed.fsdp import CPUOffloadPolicy

        return CPUOffloadPolicy(*args, pin_memory=False, **kwargs)


def patch_verl() -> None:
    """The three verl places that assume an accelerator (module docstring), patched in this process."""
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if not getattr(original, "_sarl_cpu", False):

        def initialize_global_process_group_ray(timeout_second: Any = None, backend: Optional[str] = None) -> None:
            return original(timeout_second=timeout_second, backend=backend or "gloo")

        initialize_global_process_group_ray._sarl_cpu = True  # type: ignore[attr-defined]
        distributed.initialize_global_process_group_ray = initialize_global_process_group_ray

        def initialize_global_process_group(timeout_second: int = 36000) -> tuple[int, int, int]:
            """verl's torchrun entry (the SFT trainer; verl/utils/distributed.py:62-75) with plain gloo."""
            import datetime

            torch.distributed.init_process_group(
                backend="gloo",
                timeout=datetime.timedelta(seconds=timeout_second),
                init_method=os.environ.get("DIST_INIT_METHOD", None),
            )
            return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

        distributed.initialize_global_process_group = initialize_global_process_group

    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    for model_type, engine in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        registered = EngineRegistry._engines.get(model_type, {}).get("fsdp2", {})
        if PLATFORM not in registered:  # once per process, however often this runs
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device=[PLATFORM])(engine)
    transformer_impl.CPUOffloadPolicy = _UnpinnedCPUOffloadPolicy
