"""A rollout server back end for verl 0.9.1 that samples with the Hugging Face model: `rollout.name=hf`.

verl's V1 trainer generates through server back ends only (vLLM, SGLang, TensorRT-LLM: the adapter registry in
verl/workers/rollout/base.py:89-93 and the replica registry in verl/workers/rollout/replica.py:388-390); its
`HFRollout` is synchronous and unregistered. This module registers "hf" in both registries, shaped as verl's
vLLM back end is (`vLLMReplica` / `vLLMHttpServer` / `ServerAdapter`):

- `HFReplica`: one Ray actor per replica (`HFServer`, `num_cpus=0`, on the node of the replica's first worker),
  named `hf_server_<replica>_0` as verl names a vLLM server, so the adapter finds it by name;
- `HFServer`: the model (`transformers.AutoModelForCausalLM`, fp32) and the token-in/token-out `generate` that
  verl's agent loop calls (`LLMServerClient.generate`, verl/workers/rollout/llm_server.py:150): the requests
  that arrive together are sampled as one left-padded batch (vLLM batches them too) with the request's
  temperature, top_p, top_k and `max_tokens` (verl's response length by default), greedy at temperature 0,
  and the raw log-probabilities of the sampled tokens when asked (`logprobs`, as vLLM's default
  `logprobs_mode`); sleep, wake-up and cache calls are no-ops (nothing to free on the CPU);
- `HFServerAdapter`: the rollout verl builds inside each actor worker (`get_rollout_class`); verl's "naive"
  weight sync (verl/workers/engine_workers.py:728-830, `update_weights`) hands it the actor's full weights as
  `(name, tensor)` pairs after every update, and it loads them into the server's model (strictly: a name the
  model lacks, or a model weight not sent other than a tied one, is an error). Each sync is written to
  `$SARL_ROLLOUT_SYNC_LOG` (a JSON line: replica, step, tensors, a digest of the weights), which the CPU tests read
  to see that the rollout's weights change after every step; each actor rank writes its part in every sync (rank,
  replica, whether it pushed to the server, its Ray node) to `$SARL_ROLLOUT_SYNC_RANKS_LOG`.

Several ranks (`train.n_gpus_per_node` > 1): each replica of `rollout.tensor_model_parallel_size` ranks has one
server holding the whole model (the HF sampler does not split a model), to which the replica's first rank pushes
the weights that all its ranks gathered together from their FSDP shards; tensor parallelism 1 gives a replica, and
a server, per rank.

Used by `backend=verl_cpu` only (sarl.backends.verl.cpu); nothing of it is imported in a GPU run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Generator, Optional

import ray
import torch
from verl.workers.config import HFModelConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

log = logging.getLogger(__name__)

NAME = "hf"  # rollout.name
SYNC_LOG_ENV = "SARL_ROLLOUT_SYNC_LOG"
NODE_ENV_SEEN = ("HF_HUB_OFFLINE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")  # logged per rank with its sync
SYNC_RANKS_LOG_ENV = "SARL_ROLLOUT_SYNC_RANKS_LOG"  # one line per actor rank and sync: its part, its Ray node
MAX_BATCH = 64  # requests sampled together


def server_name(replica_rank: int) -> str:
    """The Ray actor name of a replica's server (verl's "<name>_server_<replica>_<node>")."""
    return f"{NAME}_server_{replica_rank}_0"


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """A short digest of a model's weights (names, shapes and values), to tell one sync's weights from another's."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class _Request:
    prompt_ids: list[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    logprobs: bool
    future: asyncio.Future = field(repr=False)

    def key(self) -> tuple:
        return (self.temperature, self.top_p, self.top_k, self.logprobs)


def sample_batch(model: Any, requests: list[_Request], pad_id: int, eos_ids: set[int]) -> list[dict[str, Any]]:
    """Sample every request of one sampling setting together: left-padded prompts, each response cut after its
    first end-of-sequence token or at its own `max_tokens`; the raw log-probability of each sampled token."""
    from transformers import GenerationConfig

    first = requests[0]
    width = max(len(r.prompt_ids) for r in requests)
    ids = torch.full((len(requests), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(requests), width), dtype=torch.long)
    for i, r in enumerate(requests):
        ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        mask[i, width - len(r.prompt_ids) :] = 1
    greedy = first.temperature <= 0
    gen = GenerationConfig(
        max_new_tokens=max(r.max_tokens for r in requests),
        do_sample=not greedy,
        temperature=None if greedy else float(first.temperature),
        top_p=None if greedy else float(first.top_p),
        top_k=None if greedy or first.top_k <= 0 else int(first.top_k),
        pad_token_id=pad_id,
        eos_token_id=sorted(eos_ids),
        bos_token_id=None,
        return_dict_in_generate=True,
        output_logits=first.logprobs,
    )
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
    new = out.sequences[:, width:]
    logprobs = None
    if first.logprobs:
        logits = torch.stack(out.logits, dim=1).float()  # [batch, new tokens, vocab], before any processing
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    results = []
    for i, r in enumerate(requests):
        tokens = new[i].tolist()[: r.max_tokens]
        end = next((j + 1 for j, t in enumerate(tokens) if t in eos_ids), len(tokens))
        results.append(
            {
                "token_ids": tokens[:end],
                "log_probs": logprobs[i, :end].tolist() if logprobs is not None else None,
                "stop_reason": "completed",
            }
        )
    return results


class HFServer:
    """One replica's model and its token-in/token-out `generate` (see the module docstring)."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.utils.config import omega_conf_to_dataclass

        self.config = omega_conf_to_dataclass(config)
        self.model_config = model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        path = model_config.local_path
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
        self.model.eval()
        tokenizer = AutoTokenizer.from_pretrained(model_config.local_tokenizer_path or path)
        eos = getattr(model_config, "generation_config", None)
        eos_ids = getattr(eos, "eos_token_id", None) if eos is not None else None
        eos_ids = eos_ids if eos_ids is not None else tokenizer.eos_token_id
        self.eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids]) - {None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.tied = {name for name in self._tied_names()}
        self.global_steps: Optional[int] = None
        self.syncs = 0
        self._pending: list[_Request] = []
        self._lock: Optional[asyncio.Lock] = None
        self._drained: Optional[asyncio.Event] = None

    def _tied_names(self) -> list[str]:
        if getattr(self.model.config, "tie_word_embeddings", False):
            return [n for n, _ in self.model.named_parameters(remove_duplicate=False) if n.startswith("lm_head.")]
        return []

    def ready(self) -> str:
        return server_name(self.replica_rank)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        **kwargs: Any,
    ) -> Any:
        if image_data or video_data:
            raise ValueError("the hf rollout (sarl.backends.verl.cpu) samples text only")
        prompt_ids = [int(t) for t in prompt_ids]
        room = int(self.config.max_model_len or (self.config.prompt_length + self.config.response_length))
        room -= len(prompt_ids)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in max_model_len")
        params = dict(sampling_params)
        max_tokens = int(params.pop("max_tokens", params.pop("max_new_tokens", self.config.response_length)))
        request = _Request(
            prompt_ids=prompt_ids,
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1)),
            max_tokens=max(1, min(max_tokens, int(self.config.response_length), room)),
            logprobs=bool(params.get("logprobs", False)),
            future=asyncio.get_running_loop().create_future(),
        )
        self._pending.append(request)
        await self._run_pending()
        result = await request.future
        return TokenOutput(**result, extra_fields={"global_steps": self.global_steps})

    async def _run_pending(self) -> None:
        """Sample what is pending, one batch at a time; requests that arrive meanwhile wait for the next batch."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        await asyncio.sleep(0.005)  # let the requests sent together arrive together
        async with self._lock:
            while self._pending:
                key = self._pending[0].key()
                batch = [r for r in self._pending if r.key() == key][:MAX_BATCH]
                self._pending = [r for r in self._pending if r not in batch]
                try:
                    results = await asyncio.to_thread(sample_batch, self.model, batch, self.pad_id, self.eos_ids)
                except Exception as err:  # each waiting request gets the error
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(err)
                    continue
                for r, res in zip(batch, results, strict=True):
                    if not r.future.done():
                        r.future.set_result(res)

    def update_weights(self, state: dict[str, torch.Tensor], global_steps: Optional[int] = None) -> dict[str, Any]:
        """Load the actor's weights (all of them, by name); returns what was loaded and the digest."""
        own = dict(self.model.state_dict())
        unknown = sorted(set(state) - set(own))
        missing = sorted(set(own) - set(state) - self.tied)
        if unknown or missing:
            raise ValueError(
                f"weight sync: {len(unknown)} names the rollout model lacks {unknown[:3]}, "
                f"{len(missing)} of its weights not sent {missing[:3]}"
            )
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
        self.syncs += 1
        if global_steps is not None:
            self.global_steps = global_steps
        digest = weights_digest(dict(self.model.state_dict()))
        record = {
            "replica": self.replica_rank,
            "sync": self.syncs,
            "global_steps": global_steps,
            "tensors": len(state),
            "digest": digest,
        }
        path = os.environ.get(SYNC_LOG_ENV)
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({**record, "time": time.time()}) + "\n")
        return record

    def weights_digest(self) -> str:
        return weights_digest(dict(self.model.state_dict()))

    # verl's server calls that free or restore accelerator memory, profile or gate requests: nothing to do here
    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def wait_for_requests_to_drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0.01)

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFReplica(RolloutReplica):
    """A replica served by one `HFServer` actor (verl's `vLLMReplica`, without HTTP)."""

    async def launch_servers(self) -> None:
        node_id = None
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(lambda w: ray.get_runtime_context().get_node_id())
        options: dict[str, Any] = {"name": server_name(self.replica_rank), "num_cpus": 0}
        options["max_concurrency"] = self.max_concurrency
        if node_id is not None:
            options["scheduling_strategy"] = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            )
        env = {k: v for k, v in os.environ.items() if k.startswith(("SARL_", "VERL_"))}
        options["runtime_env"] = {"env_vars": env}
        server = ray.remote(HFServer).options(**options).remote(self.config, self.model_config, self.replica_rank)
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{NAME}-replica-{self.replica_rank}"

    async def sleep(self) -> None:
        return None


class HFServerAdapter(BaseRollout):
    """The rollout inside an actor worker: forwards verl's weight sync to this replica's `HFServer`."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        c = self.config
        world = c.tensor_model_parallel_size * c.data_parallel_size * c.pipeline_model_parallel_size
        self.rank = rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.has_server = rank % world == 0
        self.server_handle = None
        self.sleep_level = 1

    def _server(self) -> Any:
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        global_steps: Optional[int] = None,
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the hf rollout takes wire_format='named_tensors', got {wire_format!r}")
        state = {}
        tensors = 0
        for name, tensor in weights:  # every rank walks the generator (it gathers shards collectively)
            tensors += 1
            if self.has_server:
                full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
                state[name] = full.detach().to("cpu").clone()
        if self.has_server:
            await self._server().update_weights.remote(state, global_steps)
        path = os.environ.get(SYNC_RANKS_LOG_ENV)
        if path:  # each rank's part in the sync, and its Ray node (the CPU tests read where the ranks ran)
            line = {"rank": self.rank, "replica": self.replica_rank, "server": self.has_server, "tensors": tensors}
            line.update({"global_steps": global_steps, "node": ray.get_runtime_context().get_node_id()})
            line["env"] = {k: os.environ.get(k) for k in NODE_ENV_SEEN}  # what reached this rank's node
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")

    def generate_sequences(self, prompts: Any) -> Any:
        raise NotImplementedError("the hf rollout is a server back end: verl's agent loop calls HFServer.generate")
