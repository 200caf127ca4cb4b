"""`embedding=policy_hidden` on backend=trl: the SARL draft's Implementation A (App. A.1), step embeddings from the
hidden states of the policy being trained, "straightforward during training ... using HuggingFace TRL".

The reward's embedder is built unbound (`embedding.model: policy`, sarl.structure.embed.hidden) and bound here to the
policy before the reward's readiness check, then to the module TRL's trainer updates (accelerate's unwrapped model;
the same object in one process). The optimiser changes that module's weights in place, so every reward call
embeds with the current weights: a no-grad forward of each step, mean-pooled at `embedding.layer`.

GRPO on TRL runs in one process (sarl.backends.trl.distributed refuses it under FSDP), so the module is whole; a
sharded policy would need FSDP's full-parameter gathering around the forward. On verl the reward workers hold no
actor weights: sarl.train refuses the combination (decisions §1.2).

Per reward call the reward logs `embedding/policy_texts` (distinct steps embedded by the policy's forward) and
`embedding/drift` = 1 - cos(e_probe, e_probe at the run's first call) for one fixed probe sentence: 0 at the first
call, above 0 once the weights have moved (how far the embedding space has drifted since the run, or its resume,
began).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sarl.structure.embed.hidden import HiddenStateEmbedder, asks_for_live_policy

PROBE_TEXT = "The sum of 2 and 3 is 5."


class LivePolicyEmbedding:
    """The run's live policy embedder (`embedder`), bound to the trained model, and its per-call metrics."""

    def __init__(self, node: dict, model: Any, tokenizer: Any) -> None:
        from hydra.utils import instantiate

        embedder = instantiate(node)
        if not (isinstance(embedder, HiddenStateEmbedder) and embedder.live):
            raise ValueError(f"{node.get('_target_')} with model={node.get('model')!r} is not the live policy embedder")
        embedder.bind(model, tokenizer)
        self.embedder = embedder
        self._first_probe: np.ndarray | None = None
        self._texts_logged = 0

    def follow(self, trainer: Any) -> None:
        """Embed with the module `trainer` updates from now on."""
        self.embedder.bind(trainer.accelerator.unwrap_model(trainer.model), self.embedder.tokenizer)
        self._texts_logged = self.embedder.texts_embedded  # the readiness check's text is not a step

    def metrics(self) -> dict[str, float]:
        """This call's `embedding/policy_texts` and `embedding/drift` (module docstring)."""
        texts = self.embedder.texts_embedded - self._texts_logged
        probe = self.embedder.embed([PROBE_TEXT]).vectors[0]  # NaN if it failed: drift NaN, not logged
        self._texts_logged = self.embedder.texts_embedded
        if self._first_probe is None:
            self._first_probe = probe
            return {"embedding/policy_texts": float(texts), "embedding/drift": 0.0}
        a, b = probe.astype(np.float64), self._first_probe.astype(np.float64)
        drift = 1.0 - float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))  # in float64: 0 for the same vector
        return {"embedding/policy_texts": float(texts), "embedding/drift": drift}


def frozen_copy(node: dict, model: Any, tokenizer: Any) -> HiddenStateEmbedder:
    """The same embedder on a frozen copy of `model` as it is now (the starting policy): the held-out SR's fixed
    instrument, so that before and after training are measured in one embedding space."""
    import copy

    return HiddenStateEmbedder(
        copy.deepcopy(model),
        tokenizer,
        layer=int(node.get("layer", -1)),
        batch_size=int(node.get("batch_size", 16)),
        max_tokens=int(node.get("max_tokens", 512)),
        special_tokens=False,  # as the live embedder tokenizes
    )


def live_policy_embedding(reward_node: dict, model: Any, tokenizer: Any) -> LivePolicyEmbedding | None:
    """The live embedder of a reward node whose `embedder` asks for the policy (None for any other reward)."""
    node = reward_node.get("embedder")
    return LivePolicyEmbedding(node, model, tokenizer) if asks_for_live_policy(node) else None
