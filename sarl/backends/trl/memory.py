"""The GPU memory plan of a DPO run on TRL (`backend=trl`, `algorithm=dpo`): what one GPU holds, phase by phase,
from the policy's config.json and the run's settings; `docs/gpu.md` ("DPO on TRL") has dpo_open's numbers.

Every term, with where it comes from (trl 1.16.0, accelerate 1.15.0, transformers 5.9.0, torch 2.13 file:line):
- world: the processes the model is sharded over: one per GPU under `backend.distributed: fsdp`
  (`train.n_gpus_per_node`), else one (no sharding; sarl.backends.trl.distributed).
- policy: loaded in float32 (sarl/backends/trl/run.py), which FSDP under mixed precision keeps as its master copy
  (accelerate utils/fsdp_utils.py:814-820 upcasts anything else); its gradients take the parameters' dtype and
  AdamW keeps two moments of it (torch optim/adam.py:178-185): 4 + 4 + 8 bytes per parameter, / world.
- gathered policy (world > 1): FSDP2 gathers one decoder layer at a time, in the compute dtype, and prefetches the
  next (two layers); the unit of the final norm and the LM head (with the embedding when tied) stays gathered from
  its forward to its backward (accelerate utils/fsdp_utils.py:879, reshard_after_forward False).
- reference: loaded in the compute dtype (bfloat16 with `backend.bf16`, decisions §7.5); TRL shards it as one
  FSDP unit (trl models/utils.py:338, `fully_shard` on the whole model), so its forward gathers it whole.
- autocast's weight cache (one process, bf16): accelerate runs the forward under torch.autocast, whose cache keeps
  the bfloat16 copy of every trained weight until the forward ends (torch amp/autocast_mode.py:218,
  `cache_enabled`): the whole policy again, in bf16. Under FSDP the gathered weights are already bf16: no cache.
- tokens of one micro-batch: DPO runs the chosen and the rejected completion of each pair in one batch
  (trl trainer/dpo_trainer.py:169, 349; "batch is [chosen, rejected]", :1316), padded to the longest, at most
  `max_length` (= train.max_prompt_length + train.max_response_length): 2 x micro-batch x max_length.
- stored activations: with gradient checkpointing, each decoder layer's input (transformers modeling_layers.py:34,
  GradientCheckpointingLayer) in the residual stream's dtype (bf16 under FSDP's mixed precision; fp32 where autocast
  computes on fp32 weights, as it leaves embeddings and additions in fp32), and the LM head's input; without it,
  every layer's working set.
- a layer's working set: the tensors its ops keep for the backward (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", Sec. 4.1, counted for this layer: two RMSNorms, input and output
  4h; attention with q/k norms and FlashAttention/SDPA, no s x s scores, 3q + 3kv; SwiGLU 4i) per token, in the
  compute dtype. The backward of a checkpointed layer holds its recomputed working set and gradients of the same
  sizes (2x, an upper bound).
- LM head backward: TRL's fused head never builds the (tokens x vocabulary) logits (trl trainer/utils.py:1548,
  chunks of 32,768 tokens) but accumulates the head's weight gradient in float32 (trl kernels/
  chunked_logprob.py:410): vocabulary x hidden x 4 bytes.
- one CUDA context per process (sarl.runtime.memory.CONTEXT_GIB), and under FSDP one NCCL communicator per process
  (policy and reference are sharded over the same group; sarl.runtime.memory.nccl_gib: 1.11 GiB on 8 GPUs).

Phases of one micro-batch, in TRL's order (dpo_trainer.py:1299, :1338, then the backward):
- policy forward: the training state, the stored activations, the gathered units, autocast's cache;
- reference forward: the same without the cache, plus the reference gathered whole and one layer's working set;
- policy backward: the training state, the stored activations, the gathered units, the layer's backward, the LM
  head's float32 gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig

from sarl.backends.trl.distributed import processes
from sarl.runtime.checks import Check
from sarl.runtime.memory import CONTEXT_GIB, GIB, Item, MemoryPlan, Phase, nccl_item, parameter_count
from sarl.runtime.models import find_model_config

MAX_GPUS = 8  # the GPUs of one node (TRL runs on one node)
MASTER_BYTES = 4  # float32 parameters, gradients, and each of AdamW's two moments


@dataclass(frozen=True)
class Setting:
    """What the plan depends on besides the model."""

    world: int  # processes the model is sharded over (1: no FSDP)
    fsdp: bool  # backend.distributed: fsdp (world = train.n_gpus_per_node)
    micro_pairs: int  # preference pairs per micro-batch of a process (train.micro_batch_size_per_gpu)
    max_length: int  # tokens of a prompt + completion
    bf16: bool
    checkpointing: bool


def setting(cfg: DictConfig) -> Setting:
    t, b = cfg.train, cfg.backend
    return Setting(
        world=processes(cfg),
        fsdp=cfg.backend.get("distributed") == "fsdp",
        micro_pairs=int(t.micro_batch_size_per_gpu),
        max_length=int(t.max_prompt_length) + int(t.max_response_length),  # DPOConfig.max_length (run.py)
        bf16=bool(b.bf16),
        checkpointing=bool(b.gradient_checkpointing),
    )


@dataclass(frozen=True)
class Sizes:
    """The model's sizes the plan reads from its config.json."""

    params: int
    layer_params: int
    layers: int
    hidden: int
    head: int  # vocabulary x hidden: the LM head's (and tied embedding's) weight
    per_token_layer: int  # elements one decoder layer keeps per token for its backward (module docstring)

    @classmethod
    def of(cls, config: dict[str, Any]) -> Sizes:
        h, i = int(config["hidden_size"]), int(config["intermediate_size"])
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or h // heads)
        q, kv = heads * head_dim, int(config.get("num_key_value_heads") or heads) * head_dim
        one, two = (parameter_count({**config, "num_hidden_layers": n}) for n in (1, 2))
        return cls(
            params=parameter_count(config),
            layer_params=two - one,  # exact, whatever the layer holds
            layers=int(config["num_hidden_layers"]),
            hidden=h,
            head=int(config["vocab_size"]) * h,
            per_token_layer=4 * h + 3 * q + 3 * kv + 4 * i,  # Korthikanti et al. 2022 Sec. 4.1, for this layer
        )


def dpo_memory_plan(sizes: Sizes, s: Setting, gpu_gib: float) -> MemoryPlan:
    """The plan of one GPU of a DPO run (module docstring)."""
    c = 2 if s.bf16 else 4  # compute dtype: bf16 under backend.bf16, else fp32
    residual = 2 if (s.bf16 and s.world > 1) else 4  # bf16 under FSDP's param_dtype; fp32 under plain autocast
    n, w = sizes.params, s.world
    tokens = 2 * s.micro_pairs * s.max_length  # chosen + rejected (dpo_trainer.py:1316)
    layer = tokens * sizes.per_token_layer * c / GIB

    def gib(x: float) -> float:
        return x / GIB

    state = [
        Item("policy parameters", gib(MASTER_BYTES * n / w), f"float32 master, 1/{w} of {n:,}"),
        Item("policy gradients", gib(MASTER_BYTES * n / w), "float32"),
        Item("AdamW moments", gib(2 * MASTER_BYTES * n / w), "two, float32"),
        Item("reference parameters", gib(c * n / w), f"{'bf16' if s.bf16 else 'fp32'}, 1/{w}"),
    ]
    if s.checkpointing:
        stored = sizes.layers * tokens * sizes.hidden * residual + tokens * sizes.hidden * c
        stored_note = f"{sizes.layers} layer inputs + the LM head's input, {tokens:,} tokens"
    else:
        stored = sizes.layers * tokens * sizes.per_token_layer * c + tokens * sizes.hidden * c
        stored_note = f"every layer's working set, {tokens:,} tokens"
    activations = Item("stored activations", gib(stored), stored_note)
    gathered = []
    if w > 1:
        gathered = [
            Item("gathered LM head", gib(sizes.head * c), "its FSDP unit stays gathered forward to backward"),
            Item("gathered layers", gib(2 * sizes.layer_params * c), "the layer computing and the next"),
        ]
    cache = [Item("autocast weight cache", gib(2 * n), "bf16 copy of the policy")] if (s.bf16 and w == 1) else []
    context = Item("CUDA context", CONTEXT_GIB, "one process", processes=1)
    nccl = [nccl_item(1, w)] if w > 1 else []
    reference = [Item("reference gathered", gib(c * n), "TRL shards it as one FSDP unit")] if w > 1 else []
    return MemoryPlan(
        gpu_gib=gpu_gib,
        phases=[
            Phase("policy forward", [*state, activations, *gathered, *cache, context, *nccl]),
            Phase(
                "reference forward",
                [
                    *state,
                    activations,
                    *gathered[:1],
                    *reference,
                    Item("reference layer", layer, "its working set"),
                    context,
                    *nccl,
                ],
            ),
            Phase(
                "policy backward",
                [
                    *state,
                    activations,
                    *gathered,
                    Item("layer backward", (2 if s.checkpointing else 1) * layer, "working set and its gradients"),
                    Item("LM head gradient", gib(sizes.head * 4), "float32 (TRL's fused head)"),
                    context,
                    *nccl,
                ],
            ),
        ],
    )


def fixes(sizes: Sizes, s: Setting, gpu_gib: float) -> list[str]:
    """The single changes that make the plan fit, most direct first: gradient checkpointing, bf16, the fewest GPUs
    of the node that fit, the largest micro-batch that fits."""
    out = []
    if not s.checkpointing and dpo_memory_plan(sizes, replace(s, checkpointing=True), gpu_gib).ok:
        out.append("backend.gradient_checkpointing=true")
    if not s.bf16 and dpo_memory_plan(sizes, replace(s, bf16=True), gpu_gib).ok:
        out.append("backend.bf16=true")
    gpus = [w for w in range(s.world + 1, MAX_GPUS + 1) if dpo_memory_plan(sizes, replace(s, world=w), gpu_gib).ok]
    if gpus:
        sharded = "" if s.fsdp else "backend.distributed=fsdp "
        out.append(f"{sharded}train.n_gpus_per_node={gpus[0]}")
    micro = [
        m for m in range(s.micro_pairs - 1, 0, -1) if dpo_memory_plan(sizes, replace(s, micro_pairs=m), gpu_gib).ok
    ]
    if micro:
        out.append(f"train.micro_batch_size_per_gpu={micro[0]}")
    return out


def planned(cfg: DictConfig) -> bool:
    """Whether a TRL run has a GPU plan: DPO on a model from a path or the Hub, not forced onto the CPU. A policy
    built on this machine (the smoke rows) trains on the CPU; GRPO and SFT on TRL are not planned."""
    return cfg.algorithm.name == "dpo" and bool(cfg.model.get("path")) and not cfg.backend.use_cpu


def check_trl_memory_plan(
    cfg: DictConfig, gpu_gib: float, source: str, allow_download: bool = False, skip_missing: bool = False
) -> list[Check]:
    """The plan of one GPU of the run against `gpu_gib` (its `source`: measured or backend.gpu_memory_gib); a policy
    whose config.json cannot be had fails the check, or (skip_missing) gives none."""
    if not planned(cfg):
        return []
    policy = find_model_config(str(cfg.model.path), allow_download)
    if policy is None:
        if skip_missing:
            return []
        where = f"local directory, HF cache{', Hub' if allow_download else ''}"
        fix = "download the model (hf download) or set model.path to a local checkpoint"
        return [Check("memory plan", False, f"config.json of model.path={cfg.model.path} not found ({where})", fix)]
    sizes, s = Sizes.of(policy), setting(cfg)
    plan = dpo_memory_plan(sizes, s, gpu_gib)
    fix = ""
    if not plan.ok:
        found = fixes(sizes, s, gpu_gib)
        fix = ("set " + ", or ".join(found)) if found else "no single change fits: see docs/gpu.md (DPO on TRL)"
    detail = f"{s.world} GPU(s), {s.micro_pairs} pairs per micro-batch: {plan.summary()} [GPU size: {source}]"
    return [Check("memory plan", plan.ok, detail, fix)]
