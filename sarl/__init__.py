"""SARL: structure-aware reinforcement learning for reasoning LLMs.

The public API for use as a library (`from sarl import StructureReward, RolloutBatch`): the names in `__all__`,
each loaded from the module that defines it on first use (PEP 562), so that `import sarl` and the commands
(`python -m sarl.train`) do not pay for them. Everything else is imported from its module.
"""

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "StructureReward": "sarl.structure.reward",
    "RolloutBatch": "sarl.contract.reward",
    "RewardOutput": "sarl.contract.reward",
    "RewardFunction": "sarl.contract.reward",
    "build_reward": "sarl.contract.reward",
    "Embedder": "sarl.structure.embed.base",
    "EmbeddingResult": "sarl.structure.embed.base",
    "SentenceTransformerEmbedder": "sarl.structure.embed.local",
    "HiddenStateEmbedder": "sarl.structure.embed.hidden",
    "HTTPEmbedder": "sarl.serving.http",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
