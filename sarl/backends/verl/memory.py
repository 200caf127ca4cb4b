"""The GPU memory plan of a verl run: what each GPU holds, from the models' `config.json` and verl's config.

verl colocates everything on every GPU of the node (one resource pool): the vLLM rollout engine takes
`rollout.gpu_memory_utilization` of each GPU, and the FSDP shards of the actor, the reference and (PPO)
the critic live beside it. What runs beside verl's workers on one GPU of the node (the embedding server of
the structure reward, SARL App. B.2; the MaxFlow reward's attention model) is not known to Ray: the GPU
that holds most of it is the fullest and is the one planned (`shared` items, chosen by `sarl.preflight`).

Every figure is read from the verl config being planned (verl 0.9.1 file:line):
- dtypes: each model loads in its `fsdp_config.model_dtype` (fp32 in verl's ppo_trainer config; unset, fp32
  for a trained model and bf16 for a forward-only one: workers/engine/fsdp/transformer_impl.py:258-263);
  Adam's two moments and the gradients take the parameters' dtype.
- placement: the reference is forward-only (`ref.fsdp_config.forward_only: true`), and verl offloads a
  forward-only model's parameters to the host, FSDP1 with `CPUOffload(offload_params=True)`
  (transformer_impl.py:429-434), FSDP2 with `CPUOffloadPolicy` (:459-463), as it does any model with
  `offload_policy`. Its fp32 shard lives in host memory; on the GPU it is gathered one FSDP unit at a time
  for its forward pass (not counted, as activations are not). `param_offload`/`optimizer_offload` move the
  actor's and critic's shards to the host between phases and back for their own (workers/engine/base.py:314-328).
- logits: each forward pass (log-prob recompute, reference, actor update) builds the logits of one whole
  micro-batch over the vocabulary (`logits_gib`).

Phases, in the order of one step:
- generation: vLLM awake (its whole share), the actor's (and critic's) resident shards, the shared items,
  a CUDA context per process;
- log-probs: vLLM asleep (verl's `free_cache_engine` releases its cache and weights), the actor's
  recompute of the old log-probs: its parameters, resident optimizer, logits of one micro-batch;
- reference (a KL term): the reference's forward pass, logits of one of its micro-batches;
- update: the parameter, gradient and optimizer shards of the actor (and critic), the actor's logits.
Activations are not estimated (bounded by `use_dynamic_bsz`'s token budget per GPU and gradient
checkpointing with activation offload). Every phase also holds the NCCL communicator of each trained model's
worker process in a multi-GPU run (`sarl.runtime.memory.nccl_gib`: 1.11 GiB on 8 GPUs; vLLM's own tensor-parallel
communicator is inside its share, below).

vLLM's CUDA graphs (vllm 0.24.0, the version verl 0.9.1 pins, file:line): inside `gpu_memory_utilization` while it
generates, on top of the plan while it sleeps.
- Inside: the engine requests `total x gpu_memory_utilization` (v1/worker/utils.py:410-412), taken at start-up after
  its NCCL is initialised (v1/worker/gpu_worker.py:336-342), profiles the CUDA-graph memory by a dummy capture
  (:447-453, gpu_model_runner.py:6447-6593, logged "Estimated CUDA graph memory: X GiB total") and subtracts it from
  the KV cache within that request (:467-471, :489-493) unless VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 (default 1
  since v0.21.0: envs.py:1891-1896; neither verl nor this project sets it). So its share bounds the generation phase.
- On top while asleep: sleep mode releases only what was allocated in the sleep allocator's pools, the weights
  (:379) and the KV cache (:605); the graphs are captured outside them (:657-658), so their pool stays on the GPU
  in the log-prob, reference and update phases. Counted there as `VLLM_CUDA_GRAPH_GIB` unless
  `rollout.enforce_eager` (no capture, :657).

A plan above `LIMIT` (90%) of the GPU fails the preflight and `sarl.train`.

The embedding server's own budget is checked the way vLLM checks it at start-up: its weights, a
working-set estimate and the KV cache of one request of `max_model_len` tokens must fit in
`gpu_memory_utilization` of the GPU (vLLM refuses to start otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from sarl.runtime.memory import (
    CONTEXT_GIB,
    GIB,
    LIMIT,
    Item,
    MemoryPlan,
    Phase,
    dtype_bytes,
    nccl_item,
    parameter_count,
)

LOGIT_BYTES = 4  # float32: see logits_gib
# vLLM's CUDA graph pool at verl's default capture sizes, kept while it sleeps (module docstring). vLLM measures it at
# start-up only; its own estimate for Qwen3-8B at the default sizes (51 piecewise graphs up to 512 tokens, 35 full up
# to 256) is 0.52 GiB (its log, LMCache issue #3430), and that estimate undercounts (vLLM PR #51590): twice it, for
# the dense models of up to 8B the rows train.
VLLM_CUDA_GRAPH_GIB = 1.0


# -- model configs -------------------------------------------------------------------------------


def kv_bytes_per_token(config: dict[str, Any], dtype: str) -> int:
    """K and V of every layer for one token: 2 x layers x KV heads x head size x bytes."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes(dtype)


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
    weights = parameter_count(config) * dtype_bytes(dtype)
    tokens = max(length, 8192)
    activations = tokens * (4 * config["hidden_size"] + 2 * config["intermediate_size"]) * dtype_bytes(dtype)
    return EmbeddingBudget(
        budget_gib=gpu_memory_utilization * gpu_gib,
        weights_gib=weights / GIB,
        working_gib=CONTEXT_GIB + activations / GIB,
        kv_gib=length * kv_bytes_per_token(config, dtype) / GIB,
        max_model_len=length,
    )


def embedding_server_item(gpu_memory_utilization: float, gpu_gib: float) -> Item:
    """The embedding server on its GPU: its whole share (vLLM takes it at start-up), one process."""
    return Item("embedding server", gpu_memory_utilization * gpu_gib, "its gpu_memory_utilization", processes=1)


# -- the logits of one micro-batch ---------------------------------------------------------------


def micro_batch_tokens(
    use_dynamic_bsz: bool, max_token_len_per_gpu: int | None, micro_batch_size_per_gpu: int | None, seq_len: int
) -> int:
    """The most tokens one micro-batch of a GPU holds. With `use_dynamic_bsz`, verl packs sequences up to
    `max_token_len_per_gpu` and raises the number of micro-batches until every one fits it
    (utils/seqlen_balancing.py:441-456; Ulysses multiplies the budget and splits the packed sequence by the
    same factor: workers/engine/utils.py:110-111). Otherwise `micro_batch_size_per_gpu` whole sequences of
    up to `seq_len` (prompt + response) tokens."""
    if use_dynamic_bsz:
        return int(max_token_len_per_gpu)
    return int(micro_batch_size_per_gpu) * seq_len


def logits_gib(tokens: int, vocab_size: int) -> float:
    """One float32 (tokens, vocab) tensor: the logits of one micro-batch, as verl's log-probs and entropy see
    them. verl's FSDP engine runs the forward under torch.autocast(bfloat16)
    (workers/engine/fsdp/transformer_impl.py:1559-1566) and keeps the full-vocabulary logits of the packed
    micro-batch (:1382, `output.logits`; only `use_fused_kernels` avoids them, :1362-1367); the log-softmax
    of the log-probs (utils/torch_functional.py:202, row by row, its outputs kept for the backward of the
    update) and the softmax of the entropy (:243, computed at the log-prob recompute: trainer/ppo/v1/
    trainer_base.py:1653) are float32 under autocast. 16,384 tokens x 151,936 (Qwen3) = 9.3 GiB. The bfloat16
    logits beside it (half that) are not counted, as activations are not."""
    return tokens * vocab_size * LOGIT_BYTES / GIB


# -- the per-GPU plan ----------------------------------------------------------------------------


def _gib(n_params: int, world: int, bytes_per_param: int) -> float:
    return n_params * bytes_per_param / world / GIB


@dataclass
class _Trained:
    """The FSDP shards of a trained model (actor, critic) on one GPU, from its engine config."""

    name: str
    params_gib: float  # one shard in model_dtype
    dtype: str
    host: bool  # offload_policy: FSDP2 keeps shards, gradients and optimizer on the host throughout
    param_offload: bool  # moved to the host between this model's own phases
    optimizer_offload: bool

    @classmethod
    def of(cls, name: str, n_params: int, world: int, engine: Any) -> _Trained:
        dtype = str(engine.model_dtype or "fp32")  # unset: fp32 for a trained model (transformer_impl.py:258-261)
        return cls(
            name,
            _gib(n_params, world, dtype_bytes(dtype)),
            dtype,
            bool(engine.offload_policy),
            bool(engine.param_offload),
            bool(engine.optimizer_offload),
        )

    def resident(self, working: bool = False, training: bool = False) -> list[Item]:
        """Its shards while another model works (the defaults), while it computes (`working`), or while it
        trains (`training`: gradients too; offloaded shards are loaded back for the update)."""
        on_gpu = not self.host and (working or training or not self.param_offload)
        optimizer_on_gpu = not self.host and (training or not self.optimizer_offload)
        items = [
            Item(f"{self.name} parameters", self.params_gib if on_gpu else 0.0, f"{self.dtype} FSDP shard"),
            Item(f"{self.name} optimizer", 2 * self.params_gib if optimizer_on_gpu else 0.0, "Adam's two moments"),
        ]
        if training:
            items.append(Item(f"{self.name} gradients", self.params_gib if not self.host else 0.0))
        return items


def gpu_memory_plan(
    verl_cfg: Any, policy_config: dict[str, Any], gpu_gib: float, shared: Sequence[Item] = ()
) -> MemoryPlan:
    """The plan of one GPU of a verl run (see the module docstring) from verl's trainer config and the
    policy's config.json. `shared`: what runs on this GPU beside verl's workers (the embedding server, the
    MaxFlow reward's attention model), present in every phase. FSDP shards parameters, gradients and
    Adam's two moments over all GPUs of the run."""
    arr = verl_cfg.actor_rollout_ref
    world = int(verl_cfg.trainer.nnodes) * int(verl_cfg.trainer.n_gpus_per_node)
    n_actor = parameter_count(policy_config)
    vocab = int(policy_config["vocab_size"])
    seq_len = int(verl_cfg.data.max_prompt_length) + int(verl_cfg.data.max_response_length)
    fused = bool(arr.model.use_fused_kernels)  # no full-vocabulary logits (transformer_impl.py:1362)

    def logits(name: str, dynamic: bool, max_tokens: int | None, micro: int | None) -> Item:
        tokens = micro_batch_tokens(dynamic, max_tokens, micro, seq_len)
        gib = 0.0 if fused else logits_gib(tokens, vocab)
        return Item(f"{name} logits", gib, f"float32, {tokens} tokens x {vocab} vocabulary")

    actor = _Trained.of("actor", n_actor, world, arr.actor.fsdp_config)
    trained = [actor]
    processes = 2  # the worker process of actor, rollout and reference; vLLM's
    if verl_cfg.critic.enable:
        trained.append(
            _Trained.of("critic", parameter_count(policy_config, head="critic"), world, verl_cfg.critic.fsdp)
        )
        processes += 1
    critic = trained[1:]

    ref_items: list[Item] = []
    phases: list[Phase] = []
    if arr.actor.use_kl_loss or verl_cfg.algorithm.use_kl_in_reward:
        ref = arr.ref.fsdp_config
        dtype = str(ref.model_dtype or ("bf16" if ref.forward_only else "fp32"))  # transformer_impl.py:258-261
        host = bool(ref.forward_only or ref.offload_policy)
        shard = _gib(n_actor, world, dtype_bytes(dtype))
        note = (
            f"{dtype} shard of {shard:.1f} GiB on the host (forward-only: CPU offload)"
            if host
            else f"{dtype} FSDP shard"
        )
        ref_items = [Item("reference parameters", 0.0 if host else shard, note)]

    processes += sum(i.processes for i in shared)
    contexts = Item("CUDA contexts", CONTEXT_GIB * processes, f"{processes} processes x {CONTEXT_GIB} GiB")
    # one communicator per trained model's worker process (FSDP's collectives), on every GPU of the run
    nccl = nccl_item(len(trained), int(verl_cfg.trainer.n_gpus_per_node), int(verl_cfg.trainer.nnodes))
    always = [contexts, nccl]  # every phase
    idle = [i for t in trained for i in t.resident()]
    vllm = Item("vLLM rollout", float(arr.rollout.gpu_memory_utilization) * gpu_gib, "rollout.gpu_memory_utilization")
    phases.append(Phase("generation", [vllm, *idle, *ref_items, *shared, *always]))
    eager = bool(arr.rollout.enforce_eager)
    graphs = Item(
        "vLLM CUDA graphs",
        0.0 if eager else VLLM_CUDA_GRAPH_GIB,
        "enforce_eager: none captured" if eager else "its graph pool, kept while it sleeps (estimate)",
    )
    asleep = [graphs, *always]  # the phases with vLLM asleep
    dynamic = bool(arr.actor.use_dynamic_bsz)  # rollout.log_prob_use_dynamic_bsz must equal it (engine_workers.py:616)
    rollout = arr.rollout
    phases.append(
        Phase(
            "log-probs",
            [
                *actor.resident(working=True),
                *[i for t in critic for i in t.resident()],
                *ref_items,
                logits(
                    "actor", dynamic, rollout.log_prob_max_token_len_per_gpu, rollout.log_prob_micro_batch_size_per_gpu
                ),
                *shared,
                *asleep,
            ],
        )
    )
    if ref_items:
        r = arr.ref
        ref_logits = logits(
            "reference",
            bool(r.log_prob_use_dynamic_bsz),
            r.log_prob_max_token_len_per_gpu,
            r.log_prob_micro_batch_size_per_gpu,
        )
        phases.append(Phase("reference", [*idle, *ref_items, ref_logits, *shared, *asleep]))
    update = [i for t in trained for i in t.resident(training=True)]
    actor_logits = logits("actor", dynamic, arr.actor.ppo_max_token_len_per_gpu, arr.actor.ppo_micro_batch_size_per_gpu)
    phases.append(Phase("update", [*update, *ref_items, actor_logits, *shared, *asleep]))
    return MemoryPlan(gpu_gib=gpu_gib, phases=phases)


def rollout_utilization_that_fits(plan: MemoryPlan, current: float) -> float:
    """The largest rollout.gpu_memory_utilization (two decimals, rounded down) that brings the generation
    phase to LIMIT."""
    gen = plan.phase("generation")
    room = LIMIT * plan.gpu_gib - (gen.gib - current * plan.gpu_gib)
    return math.floor(100 * room / plan.gpu_gib) / 100


# -- the SFT stage -------------------------------------------------------------------------------


def sft_memory_plan(sft_cfg: Any, policy_config: dict[str, Any], gpu_gib: float) -> MemoryPlan:
    """The plan of one GPU of verl's SFT trainer (`verl.trainer.sft_trainer`, one torchrun process per GPU, FSDP
    engine) from its composed `sft_trainer_engine` config and the policy's config.json: no rollout, no reference.
    One phase, the update: the model's parameter, gradient and Adam shards in the engine's `model_dtype` (fp32 in
    verl's engine/fsdp.yaml) over all GPUs, moved to the host as the engine's offload settings say (as for the RL
    actor: `_Trained`); the float32 logits of one micro-batch (the engine's forward, as `logits_gib`): packed up to
    `data.max_token_len_per_gpu` tokens with `use_dynamic_bsz`, else `micro_batch_size_per_gpu` sequences of
    `data.max_length`; one CUDA context; one NCCL communicator on several GPUs. Activations are not estimated (gradient
    checkpointing: `model.enable_gradient_checkpointing`)."""
    t, d = sft_cfg.trainer, sft_cfg.data
    gpus, nodes = int(t.n_gpus_per_node), int(t.nnodes)
    vocab = int(policy_config["vocab_size"])
    model = _Trained.of("model", parameter_count(policy_config), gpus * nodes, sft_cfg.engine)
    tokens = micro_batch_tokens(
        bool(d.use_dynamic_bsz), d.max_token_len_per_gpu, d.micro_batch_size_per_gpu, int(d.max_length)
    )
    fused = bool(sft_cfg.model.get("use_fused_kernels", False))
    note = f"float32, {tokens} tokens x {vocab} vocabulary"
    logits = Item("logits", 0.0 if fused else logits_gib(tokens, vocab), note)
    context = Item("CUDA context", CONTEXT_GIB, "one torchrun process", processes=1)
    update = [*model.resident(training=True), logits, context, nccl_item(1, gpus, nodes)]
    return MemoryPlan(gpu_gib=gpu_gib, phases=[Phase("update", update)])
