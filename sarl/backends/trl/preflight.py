"""The TRL back end's preflight checks: what TRL refuses, the GPUs its processes need, the model, the DPO memory
plan (sarl/backends/trl/memory.py), W&B. The TRL back end (sarl/backends/trl/backend.py) hands them to
`sarl.preflight`'s table, and the cheap ones to `sarl.train` before a launch."""

from __future__ import annotations

from omegaconf import DictConfig

from sarl.backends.trl import memory as trl_memory
from sarl.backends.trl.distributed import check_devices, processes
from sarl.backends.trl.run import row_checks
from sarl.runtime.checks import Check
from sarl.runtime.node_checks import check_gpus, check_wandb, gpu_gib
from sarl.serving.checks import check_model_files


def trl_cheap_checks(cfg: DictConfig) -> list[Check]:
    """What sarl.train checks before a TRL run: the GPUs its processes need and the DPO memory plan against
    `backend.gpu_memory_gib` (measuring the GPU would leave a CUDA context in sarl.train's process, on the GPU
    of rank 0)."""
    gib, source = gpu_gib(cfg, measure=False)
    return [*check_devices(cfg), *trl_memory.check_trl_memory_plan(cfg, gib, source, skip_missing=True)]


def trl_preflight(cfg: DictConfig) -> list[Check]:
    """Every check for a TRL row: what TRL refuses, the training file, the GPUs (one per process), the model, the
    memory plan (DPO), W&B."""
    checks = [*row_checks(cfg), *([] if cfg.backend.use_cpu else [check_gpus(cfg, processes(cfg))])]
    if cfg.model.get("path"):
        checks.append(check_model_files(cfg, {}))
    return [*checks, *trl_memory.check_trl_memory_plan(cfg, *gpu_gib(cfg), allow_download=True), check_wandb(cfg)]
