"""What the GPU memory plans of both back ends share: a plan's items and phases, its limit, and a model's parameter
count and dtype sizes read from its `config.json` (no weights loaded).

A plan lists, phase by phase, what one GPU holds; its peak phase must stay within `LIMIT` of the GPU. verl's plans
(RL and SFT: `sarl/backends/verl/memory.py`) and TRL's (`sarl/backends/trl/memory.py`)
build their phases from these; the preflight (`python -m sarl.preflight`) and `sarl.train` refuse a plan above the
limit.

`LIMIT` is 90%: the plans count what each phase holds, not what the CUDA caching allocator keeps reserved beyond it
(fragmentation of freed blocks between phases), the activations the plans do not estimate, or the error of the
estimates themselves (CUDA contexts, working sets, NCCL's channel count, vLLM's CUDA graphs); a tenth of the GPU is
left for them (8 GiB of an 80 GB H100).

NCCL (`nccl_gib`): every process that joins a collective over several GPUs holds one communicator per process group
for the whole run. Its buffers, from NCCL's documented defaults and source (NCCL 2.2x, src/init.cc and
src/include/device.h; src/transport/nvls.cc):
- per channel and connection, one buffer per protocol: Simple `NCCL_BUFFSIZE` 4 MiB (DEFAULT_BUFFSIZE 1 << 22),
  LL128 120 elements x 640 threads x 8 steps x 8 bytes = 4.69 MiB (DEFAULT_LL128_BUFFSIZE), LL 8 lines x 512 threads
  x 8 steps x 16 bytes = 0.5 MiB (DEFAULT_LL_BUFFSIZE): 9.19 MiB;
- connections a rank receives on per channel: one for the ring (its predecessor), two for the tree (its parent and
  its child on a node's chain: the broadcast down and the reduction up); NCCL connects them at the first collective
  of each algorithm (NCCL_RUNTIME_CONNECT), and a run of FSDP's all-gather, reduce-scatter and small all-reduces uses
  both, so both are counted;
- channels: 32 on an NVSwitch H100 node (NCCL's log: "32 coll channels"; MAXCHANNELS caps it);
- NVLink SHARP, on H100/H200 with more than two GPUs of a node (`ncclNvlsInit`: NCCL_NVLS_ENABLE, gpuCount > 2): each
  rank maps `nvlsTotalSize` = NVLS channels (NCCL_NVLS_NCHANNELS 16) x 2 x chunk (NCCL_NVLS_CHUNKSIZE 128 KiB) x
  NCCL_STEPS (8) x the node's ranks (`ncclNvlsBufferSetup`): 256 MiB on 8 GPUs.
8 GPUs: 32 x 3 x 9.19 MiB + 256 MiB = 1.11 GiB per communicator; zero for a run on one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3
LIMIT = 0.90  # share of a GPU the plan may fill (module docstring)
CONTEXT_GIB = 0.5  # CUDA context + library workspaces per process on a GPU (estimate)
MIB = 1024**2
# NCCL's buffers of one communicator (module docstring)
NCCL_CONNECTION_BYTES = 4 * MIB + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16  # Simple + LL128 + LL, one channel's peer
NCCL_CHANNELS = 32  # on an NVSwitch H100 node
NCCL_CONNECTIONS = 3  # ring 1 + tree 2 per channel
NCCL_NVLS_PER_RANK = 16 * 2 * 128 * 1024 * 8  # NVLS channels x (reduce, broadcast) x chunk x NCCL_STEPS: 32 MiB


@dataclass
class Item:
    """One thing on the planned GPU; `processes`: the CUDA processes it brings (each with a context)."""

    name: str
    gib: float
    note: str = ""
    processes: int = 0


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

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)

    def summary(self) -> str:
        p = self.peak
        parts = ", ".join(f"{i.name} {i.gib:.1f}" for i in p.items if i.gib > 0)
        return f"{p.gib:.1f} of {self.gpu_gib:.1f} GiB ({self.fraction:.0%}) at {p.name}: {parts}"


def nccl_gib(gpus_per_node: int, nodes: int = 1) -> float:
    """The GPU memory one NCCL communicator holds on each rank of a group of `gpus_per_node` x `nodes` GPUs (module
    docstring): the ring's and tree's buffers of every channel, and NVLink SHARP's where a node has more than two."""
    if gpus_per_node * nodes <= 1:
        return 0.0
    nvls = NCCL_NVLS_PER_RANK * gpus_per_node if gpus_per_node > 2 else 0
    return (NCCL_CHANNELS * NCCL_CONNECTIONS * NCCL_CONNECTION_BYTES + nvls) / GIB


def nccl_item(communicators: int, gpus_per_node: int, nodes: int = 1) -> Item:
    """`communicators` NCCL communicators (one per process in a collective group, `nccl_gib` each) on one GPU."""
    per = nccl_gib(gpus_per_node, nodes)
    note = f"{communicators} communicator(s) x {per:.2f} GiB" if per else "one GPU: no communicator"
    return Item("NCCL buffers", communicators * per, note)


def parameter_count(config: dict[str, Any], head: str = "causal_lm") -> int:
    """Exact parameter count of the model a config.json describes (built on the meta device: no memory),
    with a causal-LM head (actor, reference), a one-label token-classification head (verl's critic) or none
    (`base`: `AutoModel`, as the MaxFlow reward loads it)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForTokenClassification

    cfg = dict(config)
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        if head == "critic":
            hf.num_labels = 1
            model = AutoModelForTokenClassification.from_config(hf)
        elif head == "base":
            model = AutoModel.from_config(hf)
        else:
            model = AutoModelForCausalLM.from_config(hf)
    return sum(p.numel() for p in model.parameters())


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype as verl's configs and config.json files spell it (fp32, bf16, float32,
    bfloat16, ...), parsed by verl's own `PrecisionType`."""
    from verl.utils.torch_dtypes import PrecisionType

    try:
        return PrecisionType.to_dtype(name).itemsize
    except RuntimeError as err:
        raise ValueError(f"unknown dtype {name!r}: use fp32, bf16 or fp16 (or float32, bfloat16, float16)") from err


def config_dtype(config: dict[str, Any]) -> str:
    """The dtype `from_pretrained(dtype="auto")` loads a checkpoint in: its config's `torch_dtype` (`dtype` in
    newer files), float32 where it names none."""
    return str(config.get("torch_dtype") or config.get("dtype") or "float32")
