"""What the MaxFlow reward adds to a run's GPU memory plan: its attention model, loaded on a GPU of the node
outside Ray's accounting (`reward.device`), once per process that builds the reward. `sarl.preflight` hands the
items to the back end's plan through the reward's hook (`MaxFlowReward.gpu_memory_items` is `maxflow_gpu_items`,
`RewardFunction.gpu_memory_items` in sarl/contract/reward.py).
"""

from __future__ import annotations

from typing import Any

from hydra.utils import get_class

from baselines.maxflow.attention import eager_pass_bytes, planned_gpu
from sarl.runtime import memory
from sarl.runtime.checks import Check
from sarl.runtime.models import find_model_config


def maxflow_nodes(reward_cfg: Any) -> list[dict]:
    """The MaxFlow rewards in a resolved reward config (itself, or a component of a combined reward): the nodes
    whose class's memory items are the attention model's (`gpu_memory_items`, as MaxFlowReward and any subclass;
    this module cannot import the reward, which imports it)."""
    found = []
    if isinstance(reward_cfg, dict):
        target = reward_cfg.get("_target_")
        try:
            hook = getattr(get_class(str(target)), "gpu_memory_items", None) if target else None
            if getattr(hook, "__func__", None) is attention_gpu_items:
                found.append(reward_cfg)
        except (ImportError, ValueError, TypeError):  # not a class (a function target), or not importable
            pass
        for value in reward_cfg.values():
            found += maxflow_nodes(value)
    elif isinstance(reward_cfg, list):
        for value in reward_cfg:
            found += maxflow_nodes(value)
    return found


def attention_model_items(node: dict, model_config: dict, copies: int, where: str, seq: int) -> list[memory.Item]:
    """The attention model in `copies` processes (`where` they run): weights (`AutoModel`, no LM head, in the
    reward's dtype) and the working set of one eager pass over the longest sequence, `seq` tokens (prompt +
    response) or the reward's `max_tokens` where smaller."""
    dtype = str(node.get("dtype") or "auto")
    dtype = memory.config_dtype(model_config) if dtype == "auto" else dtype
    size = memory.dtype_bytes(dtype)
    tokens = min(int(node.get("max_tokens") or seq), seq)
    weights = memory.parameter_count(model_config, head="base") * size / memory.GIB
    working = eager_pass_bytes(model_config, tokens, size) / memory.GIB
    return [
        memory.Item(f"MaxFlow attention model x{copies}", copies * weights, f"{dtype}, in {where}", processes=copies),
        memory.Item(f"MaxFlow attention pass x{copies}", copies * working, f"eager attention over {tokens} tokens"),
    ]


def maxflow_gpu_items(
    reward_cfg: Any, copies: int, where: str, seq: int, allow_download: bool = False, skip_missing: bool = False
) -> tuple[dict[int, list[memory.Item]], list[Check]]:
    """The attention models of the MaxFlow rewards in `reward_cfg`, by the GPU each is placed on (rewards on the
    CPU are left out). A model whose config.json cannot be had fails a check, or (skip_missing) is left out."""
    by_gpu: dict[int, list[memory.Item]] = {}
    problems = []
    for node in maxflow_nodes(reward_cfg):
        gpu = planned_gpu(node.get("device"))
        if gpu is None:
            continue
        model_config = find_model_config(str(node.get("model")), allow_download)
        if model_config is None:
            if not skip_missing:
                problems.append(
                    Check(
                        "memory plan",
                        False,
                        f"config.json of the MaxFlow reward's model {node.get('model')} not found",
                        "download it or point the reward's model at a local checkpoint",
                    )
                )
            continue
        by_gpu.setdefault(gpu, []).extend(attention_model_items(node, model_config, copies, where, seq))
    return by_gpu, problems


def attention_gpu_items(
    cls: type,
    reward_cfg: Any,
    copies: int,
    where: str,
    seq: int,
    allow_download: bool = False,
    skip_missing: bool = False,
) -> tuple[dict[int, list[memory.Item]], list[Check]]:
    """MaxFlowReward's `gpu_memory_items` (the reward hook `RewardFunction.gpu_memory_items`): `maxflow_gpu_items`."""
    return maxflow_gpu_items(reward_cfg, copies, where, seq, allow_download, skip_missing)
