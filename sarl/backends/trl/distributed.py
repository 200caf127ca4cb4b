"""A TRL run over the GPUs of one node (`backend.distributed: fsdp`; the DPO row `dpo_open`): one training process
per GPU, the policy and the reference sharded by FSDP2 through accelerate (decisions §7.5).

`sarl.train` writes the run's records (`config.yaml`, `meta.json`), runs the cheap checks (the GPUs, the memory
plan: `sarl.backends.trl.checks`) and starts

    python -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=N -m sarl.backends.trl.worker RUN_DIR

as the leader of its own process group (`sarl.runtime.signals.run_in_own_group`: Ctrl-C, SIGTERM or a SLURM
preemption stops torchrun and every rank). Each rank reads the resolved config and runs
`sarl.backends.trl.run.train`. The FSDP settings are transformers' `TrainingArguments.fsdp` and `fsdp_config`
(from `backend.fsdp_config`, said so that transformers 5.9.0 hears them: `fsdp_args`, `fsdp_environment`): the
Trainer builds accelerate's FSDP plugin from them (transformers 5.9.0 trainer.py:797-805) and its mixed precision
from `bf16` (accelerate 1.15 state.py:1015), so no accelerate config file is involved and a dry run prints them
with the other arguments. One process (`distributed: null`, the smoke
rows) runs in `sarl.train`'s own process as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sarl.runtime import signals
from sarl.runtime.checks import Check

WORKER_MODULE = "sarl.backends.trl.worker"
DISTRIBUTED = (None, "fsdp")


def processes(cfg: DictConfig) -> int:
    """Training processes of the run: one per GPU of the node (`train.n_gpus_per_node`) under
    `backend.distributed: fsdp`, else one."""
    return int(cfg.train.n_gpus_per_node) if cfg.backend.get("distributed") == "fsdp" else 1


def fsdp_args(cfg: DictConfig) -> dict[str, Any]:
    """TrainingArguments of FSDP for a run of several processes (none for one)."""
    if processes(cfg) == 1:
        return {}
    config = OmegaConf.to_container(cfg.backend.fsdp_config, resolve=True)
    # transformers 5.9 (the GPU node's, requirements/gpu.lock) wraps layers only for an `auto_wrap` option in
    # `fsdp` (training_args.py `_process_fsdp_args`), whatever fsdp_config says; later versions read both
    options = ["full_shard" if config.get("reshard_after_forward", True) else "shard_grad_op"]
    if config.get("auto_wrap_policy") == "TRANSFORMER_BASED_WRAP":
        options.append("auto_wrap")
    return {"fsdp": options, "fsdp_config": config}


def fsdp_environment(cfg: DictConfig) -> dict[str, str]:
    """The FSDP settings transformers 5.9 does not pass on from `fsdp_config` to accelerate's plugin, which then
    reads them from the environment (accelerate 1.15 `FullyShardedDataParallelPlugin.set_state_dict_type`): the
    state-dict type, else FSDP2 saves sharded checkpoints and `final/` gets no whole model. Set in each rank before
    its Trainer is built."""
    if processes(cfg) == 1:
        return {}
    kind = cfg.backend.fsdp_config.get("state_dict_type")
    return {"FSDP_STATE_DICT_TYPE": str(kind)} if kind else {}


def torchrun_args(run_dir: Path, n_processes: int) -> list[str]:
    """torchrun's arguments on this node: `n_processes` ranks of the worker on the run directory's config."""
    return signals.torchrun_args(n_processes, WORKER_MODULE, [str(run_dir)])


def launch_command(run_dir: Path, n_processes: int) -> list[str]:
    """torchrun (`python -m torch.distributed.run`, this interpreter) with `torchrun_args`."""
    return signals.torchrun_command(n_processes, WORKER_MODULE, [str(run_dir)])


def is_main_process() -> bool:
    """Rank 0 of a torchrun launch, or the only process: the one that writes the run's files and logs to W&B."""
    return int(os.environ.get("RANK", "0")) == 0


def unsupported(cfg: DictConfig) -> str | None:
    """Why the run's `backend.distributed` cannot be used as configured (None if it can)."""
    mode = cfg.backend.get("distributed")
    if mode not in DISTRIBUTED:
        return f"backend.distributed={mode}: null (one process) or fsdp (one process per GPU of the node)"
    n = processes(cfg)
    if n == 1:
        return None
    if cfg.algorithm.name != "dpo":
        return (
            f"backend.distributed=fsdp runs algorithm=dpo (dpo_open); algorithm={cfg.algorithm.name} over several "
            "GPUs runs on backend=verl (or set backend.distributed=null for one process)"
        )
    if cfg.get("heldout"):
        return "heldout evaluates in one process: set heldout=null with backend.distributed=fsdp"
    mini, micro = int(cfg.train.ppo_mini_batch_size), int(cfg.train.micro_batch_size_per_gpu)
    if mini % (micro * n):
        return (
            f"train.ppo_mini_batch_size={mini} pairs per optimiser step must be a multiple of "
            f"train.micro_batch_size_per_gpu x train.n_gpus_per_node = {micro} x {n}: change the micro batch"
        )
    return None


def check_devices(cfg: DictConfig) -> list[Check]:
    """The GPUs the run's processes need, counted without creating a CUDA context in this process
    (`torch.cuda.device_count`): one per process, and a GPU for bf16 unless the run is forced onto the CPU."""
    import torch

    if cfg.backend.use_cpu:
        return []  # the CPU: the processes run over gloo (accelerate leaves FSDP off there)
    n, have = processes(cfg), torch.cuda.device_count()
    if n > 1 and have < n:
        return [
            Check(
                "GPUs",
                False,
                f"backend.distributed=fsdp starts train.n_gpus_per_node={n} processes, one per GPU; {have} visible",
                f"run on a node with {n} GPUs" + (f" or set train.n_gpus_per_node={have}" if have > 1 else ""),
            )
        ]
    if cfg.backend.bf16 and have == 0:
        fix = "run on a GPU node, or set backend.bf16=false"
        return [Check("GPUs", False, "backend.bf16=true and no CUDA GPU here", fix)]
    return []
