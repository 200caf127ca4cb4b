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

On the CPU (`backend.use_cpu: true`, the tests) the ranks shard all the same, over gloo: accelerate 1.15 turns FSDP
on only for GPU-like devices (state.py:986-1016; on the CPU it picks MULTI_CPU, state.py:769 and 800-813, i.e.
DDP), so the worker runs the rank in `fsdp_on_the_cpu`, which does what that branch does when the state is
MULTI_CPU. The rest is accelerate's and the Trainer's own FSDP path (fsdp2_prepare_model, the FULL_STATE_DICT
save). Each rank records what took effect (`sharding/rank-N.json`: `watch_sharding`) and stops with one line if its
model is not sharded: a run asked to shard never trains with DDP instead.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

from sarl.runtime import signals, weights
from sarl.runtime.checks import Check

WORKER_MODULE = "sarl.backends.trl.worker"
DISTRIBUTED = (None, "fsdp")
SHARDING_SUBDIR = "sharding"  # each rank's record of what FSDP did (`watch_sharding`)


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


def worker_torchrun_args(run_dir: Path, n_processes: int) -> list[str]:
    """torchrun's arguments on this node: `n_processes` ranks of the worker on the run directory's config."""
    return signals.torchrun_args(n_processes, WORKER_MODULE, [str(run_dir)])


def worker_launch_command(run_dir: Path, n_processes: int) -> list[str]:
    """torchrun (`python -m torch.distributed.run`, this interpreter) with `worker_torchrun_args`."""
    return signals.torchrun_command(n_processes, WORKER_MODULE, [str(run_dir)])


def is_main_process() -> bool:
    """Rank 0 of a torchrun launch, or the only process: the one that writes the run's files and logs to W&B."""
    return int(os.environ.get("RANK", "0")) == 0


def distributed_problem(cfg: DictConfig) -> str | None:
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
    (`torch.cuda.device_count`): one per process, and a GPU for bf16 unless the run is forced onto the CPU. On the
    CPU, several processes need the GPUs hidden: FSDP2 builds its device mesh on the accelerator torch sees (torch
    `distributed/fsdp/_fully_shard/_fsdp_init.py:198-211`), which would put the shards on a GPU."""
    import torch

    n, have = processes(cfg), torch.cuda.device_count()
    if cfg.backend.use_cpu and n > 1 and have:
        why = f"backend.use_cpu=true with {n} FSDP processes and {have} visible GPU(s): FSDP2 would shard onto GPU 0"
        return [Check("GPUs", False, why, "hide the GPUs (CUDA_VISIBLE_DEVICES=) or set backend.use_cpu=false")]
    if cfg.backend.use_cpu:
        return []  # the CPU: the processes shard over gloo (`fsdp_on_the_cpu`)
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


class ShardingNotInEffect(RuntimeError):
    """FSDP was asked for (`backend.distributed: fsdp`) and the rank's model is not sharded by it."""


@contextlib.contextmanager
def fsdp_on_the_cpu(cfg: DictConfig) -> Iterator[None]:
    """Within this block, an accelerate state built on the CPU (MULTI_CPU, gloo) with the FSDP plugin the Trainer
    built from its arguments becomes an FSDP state, as accelerate 1.15 makes it for GPUs (state.py:1013-1016: the
    type, the plugin's mixed precision from `bf16`, the plugin). Only for `backend.use_cpu` with several
    processes; a GPU run's state is accelerate's own (nothing is patched)."""
    if not (cfg.backend.use_cpu and processes(cfg) > 1):
        yield
        return
    from unittest import mock

    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def init_with_fsdp(state: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        init(state, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and state.distributed_type == DistributedType.MULTI_CPU:
            state.distributed_type = DistributedType.FSDP
            if state._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(state._mixed_precision)
            state.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = state.distributed_type  # as state.py:1037

    with mock.patch.object(AcceleratorState, "__init__", init_with_fsdp):
        yield


def _base_name(module: Any) -> str:
    """The class name of a module: under fully_shard, of the class it had (fully_shard gives the module a class
    `FSDP<name>` derived from FSDPModule and it: torch `distributed/fsdp/_fully_shard/_fsdp_init.py:421-430`)."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(module)
    if isinstance(module, FSDPModule):
        cls = next(base for base in cls.__bases__ if base is not FSDPModule)
    return cls.__name__


def sharding(model: Any, layer_names: list[str] | None = None) -> dict[str, Any]:
    """What FSDP2 did to `model` in this rank: its FSDP units (class name: count), the layers of the wrapped
    classes and how many are units of their own, and its parameter elements held here against the whole model's."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    units: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            units[_base_name(module)] = units.get(_base_name(module), 0) + 1
    names = list(layer_names or getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if _base_name(m) in names]
    params = list(model.parameters())
    return {
        "fsdp_units": units,
        "layers": len(layers),
        "layers_sharded": sum(isinstance(m, FSDPModule) for m in layers),
        "local_numel": sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params),
        "numel": sum(p.numel() for p in params),
        "dtensor_params": sum(isinstance(p, DTensor) for p in params),
        "params": len(params),
        "device": str(params[0].device) if params else None,
    }


def sharding_record(trainer: Any) -> dict[str, Any]:
    """The rank's record: accelerate's state and FSDP plugin as they took effect, and `sharding` of the policy (as
    prepared for training) and of the reference model."""
    state = trainer.accelerator.state
    plugin = getattr(state, "fsdp_plugin", None)
    record: dict[str, Any] = {
        "rank": int(os.environ.get("RANK", "0")),
        "world_size": int(trainer.accelerator.num_processes),
        "distributed_type": str(state.distributed_type).split(".")[-1],
        "backend": getattr(state, "backend", None),
        "fsdp_version": getattr(plugin, "fsdp_version", None),
    }
    if plugin is not None:
        policy = plugin.auto_wrap_policy
        record.update(
            auto_wrap_policy=getattr(getattr(policy, "func", policy), "__name__", None),
            state_dict_type=plugin.state_dict_type.name if plugin.state_dict_type is not None else None,
            reshard_after_forward=plugin.reshard_after_forward,
            param_dtype=str(getattr(plugin.mixed_precision_policy, "param_dtype", None)),
        )
    names = getattr(plugin, "transformer_cls_names_to_wrap", None)
    record["policy"] = sharding(trainer.model, names)
    ref = getattr(trainer, "ref_model", None)
    record["reference"] = sharding(ref, names) if ref is not None else None
    return record


def sharding_problem(record: dict[str, Any]) -> str | None:
    """Why `record` shows a rank that is not sharded by FSDP (None if it is)."""
    policy = record["policy"]
    if record["distributed_type"] != "FSDP":
        return f"accelerate's state is {record['distributed_type']}, not FSDP"
    if not policy["dtensor_params"] or policy["local_numel"] >= policy["numel"]:
        return f"the policy's parameters are not sharded ({policy['local_numel']} of {policy['numel']} here)"
    if record.get("auto_wrap_policy") and policy["layers_sharded"] < policy["layers"]:
        return f"{policy['layers_sharded']} of the {policy['layers']} decoder layers are FSDP units of their own"
    return None


def watch_sharding(trainer: Any, cfg: DictConfig, run_dir: Path) -> None:
    """For a run of several processes: stop now if the Trainer's accelerator has no FSDP, and, once the models are
    prepared (the start of training), write the rank's `sharding_record` to `sharding/rank-N.json` and stop if
    its model is not sharded (`ShardingNotInEffect`, one line). Nothing for one process."""
    if processes(cfg) == 1:
        return
    if not getattr(trainer, "is_fsdp_enabled", False):
        state = trainer.accelerator.state.distributed_type
        raise ShardingNotInEffect(
            f"backend.distributed=fsdp: accelerate's state is {str(state).split('.')[-1]}, not FSDP (no sharding); "
            "not training with every rank holding the whole model"
        )
    from transformers import TrainerCallback

    class ShardingRecord(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record = sharding_record(trainer)
            out = run_dir / SHARDING_SUBDIR
            out.mkdir(exist_ok=True)
            (out / f"rank-{record['rank']}.json").write_text(json.dumps(record, indent=2))
            problem = sharding_problem(record)
            if problem:
                raise ShardingNotInEffect(f"backend.distributed=fsdp: {problem} (rank {record['rank']})")

    trainer.add_callback(ShardingRecord())


def save_final(trainer: Any, directory: Path) -> tuple[Any, int | None]:
    """Save the trained model to `directory` (every rank calls it) and return what
    `sarl.runtime.weights.weights_problem` checks the save against: `weights.trained_state` of the model in one
    process; under FSDP with FULL_STATE_DICT the whole state, gathered once onto rank 0's host (accelerate
    `get_state_dict`: every rank must call it, the others get nothing), saved by the Trainer from that same state
    and returned to rank 0 (None elsewhere), so the check compares every saved tensor with its trained one without
    a second gather. The gathered state holds tied parameters (the embedding and the LM head) as two copies: they
    are made one tensor again first, as in the model, so the save keeps one of them as a one-process save does
    (transformers drops only tensors that share storage, modeling_utils.py:452-480) instead of writing the
    embedding matrix twice. The count of values is left to the tensor-by-tensor check (None)."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    full = "FULL_STATE_DICT" in str(getattr(plugin, "state_dict_type", ""))
    if not getattr(trainer, "is_fsdp_enabled", False) or not full:
        trainer.save_model(str(directory))
        return weights.trained_state(trainer.accelerator.unwrap_model(trainer.model))
    state = trainer.accelerator.get_state_dict(trainer.model)
    if not state:
        return None, None  # not rank 0
    first: dict[int, str] = {}
    for name, param in trainer.model.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(param), name)
        if owner != name and owner in state and name in state:
            state[name] = state[owner]
    if trainer.args.should_save:
        # Trainer.save_model's FSDP branch with the state gathered above (transformers 5.9.0 trainer.py:3775-3779):
        # model, config, tokenizer and training arguments
        trainer._save(str(directory), state_dict=state)
    return state, None
