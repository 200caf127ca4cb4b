"""Baseline rewards behind the one reward interface (decisions §2): ground truth, TTRL, EMPO, EVOL-RL, DPO pairs;
and the other structure-aware methods of the papers: GRP/PASC-GRPO (GRP), LCS and MaxFlow (Structured Reasoning),
with a weighted-sum combinator for joint rewards.

The public API: the reward classes in `__all__` (`from baselines import GroundTruthReward`), each loaded from the
module that defines it on first use (PEP 562).
"""

import importlib

_PUBLIC = {
    "GroundTruthReward": "baselines.ground_truth",
    "TTRLReward": "baselines.ttrl",
    "EMPOReward": "baselines.empo",
    "EvolRLReward": "baselines.evol_rl",
    "GRPReward": "baselines.grp",
    "LCSReward": "baselines.lcs",
    "MaxFlowReward": "baselines.maxflow.reward",
    "CodeExecReward": "baselines.code_exec",
    "WeightedSumReward": "baselines.combine",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
