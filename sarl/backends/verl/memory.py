"""The GPU memory plan of a verl run: what each GPU holds, from the models' `config.json` and the config.

verl colocates everything on every GPU of the node (one resource pool): the vLLM rollout engine takes
`rollout.gpu_memory_utilization` of each GPU, and the FSDP shards of the actor, the reference and (PPO)
the critic live beside it. The embedding server of the structure reward (SARL App. A.3) runs on one of
those GPUs (`embedding_server.gpu`) with its own `gpu_memory_utilization`; Ray does not know of it, so
that GPU is the fullest and is the one planned here.

Two phases:
- generation: vLLM awake (its whole share), the training state that stays resident (parameter and
  optimizer shards unless offloaded; gradients are freed after each update), the embedding server,
  and a CUDA context per process;
- update: vLLM asleep (verl's `free_cache_engine` releases its cache and weights), the parameter,
  gradient and optimizer shards, the embedding server, the contexts. Activations are not estimated
  (they are bounded by `use_dynamic_bsz`'s token budget per GPU and gradient checkpointing).

A plan above `LIMIT` of the GPU fails the preflight and `sarl.train`.

The embedding server's own budget is checked the way vLLM checks it at start-up: its weights, a
working-set estimate and the KV cache of one request of `max_model_len` tokens must fit in
`gpu_memory_utilization` of the GPU (vLLM refuses to start otherwise).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1024**3
LIMIT = 0.95  # share of a GPU the plan may fill
CONTEXT_GIB = 0.5  # CUDA context + library workspaces per process on a GPU (estimate)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Item:
    name: str
    gib: float
    note: str = ""


@dataclass
class Phase:
    name: str
    items: list[Item] = field(default_factory=list)

    @property
    def gib(self) -> float:
        return sum(i.gib for i in self.items)


@dataclass
class MemoryPlan:
    gpu_gib: float
    phases: list[Phase]

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.gib)

    @property
    def fraction(self) -> float:
        return self.peak.gib / self.gpu_gib

    @property
    def ok(self) -> bool:
        return self.fraction <= LIMIT

    def summary(self) -> str:
        p = self.peak
        parts = ", ".join(f"{i.name} {i.gib:.1f}" for i in p.items if i.gib > 0)
        return f"{p.gib:.1f} of {self.gpu_gib:.1f} GiB ({self.fraction:.0%}) at {p.name}: {parts}"


# -- model configs -------------------------------------------------------------------------------


def find_model_config(path_or_repo: str, allow_download: bool = False) -> dict[str, Any] | None:
    """A model's config.json: from a local directory, the local Hugging Face cache, or (allow_download)
    the Hub. None where it cannot be had."""
    local = Path(os.path.expanduser(path_or_repo))
    if local.is_dir():
        f = local / "config.json"
        return json.loads(f.read_text()) if f.exists() else None
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    try:
        cached = try_to_load_from_cache(path_or_repo, "config.json")
    except Exception:  # an invalid repo id
        return None
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text())
    if not allow_download:
        return None
    try:
        return json.loads(Path(hf_hub_download(path_or_repo, "config.json")).read_text())
    except Exception:
        return None


def parameter_count(config: dict[str, Any], head: str = "causal_lm") -> int:
    """Exact parameter count of the model a config.json describes (built on the meta device: no memory),
    with a causal-LM head (actor, reference) or a one-label token-classification head (verl's critic)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    cfg = dict(config)
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        if head == "critic":
            hf.num_labels = 1
            model = AutoModelForTokenClassification.from_config(hf)
        else:
            model = AutoModelForCausalLM.from_config(hf)
    return sum(p.numel() for p in model.parameters())


def kv_bytes_per_token(config: dict[str, Any], dtype: str) -> int:
    """K and V of every layer for one token: 2 x layers x KV heads x head size x bytes."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[dtype]


# -- the embedding server ------------------------------------------------------------------------


@dataclass
class EmbeddingBudget:
    budget_gib: float
    weights_gib: float
    working_gib: float
    kv_gib: float  # one request of max_model_len tokens
    max_model_len: int

    @property
    def need_gib(self) -> float:
        return self.weights_gib + self.working_gib + self.kv_gib

    @property
    def ok(self) -> bool:
        return self.need_gib <= self.budget_gib

    @property
    def max_len_that_fits(self) -> int:
        per_token = self.kv_gib / self.max_model_len
        return max(0, int((self.budget_gib - self.weights_gib - self.working_gib) / per_token))

    def summary(self) -> str:
        return (
            f"needs {self.need_gib:.2f} GiB (weights {self.weights_gib:.2f} + working set {self.working_gib:.2f} + "
            f"KV cache of one {self.max_model_len}-token request {self.kv_gib:.2f}) "
            f"of a {self.budget_gib:.2f} GiB budget"
        )


def embedding_budget(
    config: dict[str, Any], gpu_memory_utilization: float, gpu_gib: float, max_model_len: int | None, dtype: str
) -> EmbeddingBudget:
    """The embedding server's need against its budget (see the module docstring). `max_model_len` None is
    vLLM's default: the model's whole context (`max_position_embeddings`). The working set is the CUDA
    context plus one forward pass over `max(max_model_len, 8192)` tokens (hidden states and MLP
    activations), an estimate."""
    length = int(max_model_len or config["max_position_embeddings"])
    weights = parameter_count(config) * DTYPE_BYTES[dtype]
    tokens = max(length, 8192)
    activations = tokens * (4 * config["hidden_size"] + 2 * config["intermediate_size"]) * DTYPE_BYTES[dtype]
    return EmbeddingBudget(
        budget_gib=gpu_memory_utilization * gpu_gib,
        weights_gib=weights / GIB,
        working_gib=CONTEXT_GIB + activations / GIB,
        kv_gib=length * kv_bytes_per_token(config, dtype) / GIB,
        max_model_len=length,
    )


# -- the per-GPU plan ----------------------------------------------------------------------------


def _shards(n_params: int, world: int, bytes_per_param: float, offloaded: bool) -> float:
    return 0.0 if offloaded else n_params * bytes_per_param / world / GIB


def gpu_memory_plan(
    verl_cfg: Any,
    policy_config: dict[str, Any],
    gpu_gib: float,
    embedding_server_utilization: float | None = None,
) -> MemoryPlan:
    """The plan of the fullest GPU of a verl run (the one with the embedding server, if any) from verl's
    trainer config. FSDP shards parameters, gradients and Adam's two moments over all GPUs of the run;
    the trained copies are float32 (verl's FSDP engine trains in float32 master weights), the reference
    is bfloat16."""
    arr = verl_cfg.actor_rollout_ref
    world = int(verl_cfg.trainer.nnodes) * int(verl_cfg.trainer.n_gpus_per_node)
    n_actor = parameter_count(policy_config)
    actor_fsdp = arr.actor.fsdp_config
    resident = [
        Item("actor parameters", _shards(n_actor, world, 4, actor_fsdp.param_offload), "float32 FSDP shard"),
        Item("actor optimizer", _shards(n_actor, world, 8, actor_fsdp.optimizer_offload), "Adam moments"),
    ]
    grads = [Item("actor gradients", _shards(n_actor, world, 4, False))]
    if verl_cfg.actor_rollout_ref.actor.use_kl_loss or verl_cfg.algorithm.use_kl_in_reward:
        ref_off = arr.ref.fsdp_config.param_offload
        resident.append(Item("reference parameters", _shards(n_actor, world, 2, ref_off), "bfloat16 FSDP shard"))
    processes = 1
    if verl_cfg.critic.enable:
        n_critic = parameter_count(policy_config, head="critic")
        cf = verl_cfg.critic.fsdp
        resident += [
            Item("critic parameters", _shards(n_critic, world, 4, cf.param_offload)),
            Item("critic optimizer", _shards(n_critic, world, 8, cf.optimizer_offload)),
        ]
        grads.append(Item("critic gradients", _shards(n_critic, world, 4, False)))
        processes += 1
    shared = []
    if embedding_server_utilization:
        shared.append(Item("embedding server", embedding_server_utilization * gpu_gib, "its gpu_memory_utilization"))
        processes += 1
    rollout = float(arr.rollout.gpu_memory_utilization) * gpu_gib
    contexts = Item("CUDA contexts", CONTEXT_GIB * (processes + 1), f"{processes + 1} processes x {CONTEXT_GIB} GiB")
    vllm = Item("vLLM rollout", rollout, "rollout.gpu_memory_utilization")
    generation = Phase("generation", [vllm, *resident, *shared, contexts])
    update = Phase("update", [*resident, *grads, *shared, contexts])
    return MemoryPlan(gpu_gib=gpu_gib, phases=[generation, update])


def rollout_utilization_that_fits(plan: MemoryPlan, current: float) -> float:
    """The largest rollout.gpu_memory_utilization (two decimals, rounded down) that brings the plan to LIMIT."""
    gen = next(p for p in plan.phases if p.name == "generation")
    room = LIMIT * plan.gpu_gib - (gen.gib - current * plan.gpu_gib)
    return math.floor(100 * room / plan.gpu_gib) / 100
