"""What the GPU memory plans of both back ends share: a plan's items and phases, its limit, and a model's parameter
count and dtype sizes read from its `config.json` (no weights loaded).

A plan lists, phase by phase, what one GPU holds; its peak phase must stay within `LIMIT` of the GPU. verl's plan
(`sarl/backends/verl/memory.py`) and TRL's (`sarl/backends/trl/memory.py`) build their phases from these; the
preflight (`python -m sarl.preflight`) and `sarl.train` refuse a plan above the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3
LIMIT = 0.95  # share of a GPU the plan may fill
CONTEXT_GIB = 0.5  # CUDA context + library workspaces per process on a GPU (estimate)


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
