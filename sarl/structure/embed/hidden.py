"""Policy hidden-state embedder (SARL draft, App. A.1 "Implementation A"):
e_t = (1/L_t) sum_j h^l_{t,j}, the mean of layer l's hidden states over the L_t tokens
of step s_t, then unit-normalised (SARL Sec. 3.2).

Two uses (decisions §1.2 "Embeddings"):
- live (`embedding.model: policy`, conf/embedding/policy_hidden.yaml): the policy being trained. The embedder is
  built unbound and the TRL back end binds it to the module its trainer updates in place
  (sarl.backends.trl.live), so every reward call embeds with the current weights; each step is run through the
  policy as its own chunk (the draft's "or on per-step chunks"), its L_t tokens without special tokens.
- frozen (`embedding.model: PATH`): a fixed checkpoint, loaded once (offline scoring, the held-out instrument).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sarl.structure.embed.base import Embedder

POLICY = "policy"  # embedding.model: the policy being trained, bound by the back end (backend=trl only)
TARGET = "sarl.structure.embed.hidden.HiddenStateEmbedder"


def asks_for_live_policy(node: Any) -> bool:
    """Whether an embedder config node (a dict or DictConfig) asks for the live policy: this class with
    `model: policy`."""
    return hasattr(node, "get") and node.get("_target_") == TARGET and node.get("model") == POLICY


class HiddenStateEmbedder(Embedder):
    """Mean-pooled hidden states of a chosen layer of a transformers model, one step per chunk.

    `model` is a loaded `PreTrainedModel`, a path/id to load with AutoModel, or `"policy"`: the live policy,
    bound later with `bind`. `layer` indexes `hidden_states` (0 = embedding output, -1 = last layer).
    `special_tokens`: whether the tokenizer adds its special tokens to each step (default: yes for a loaded
    model, no for the live policy). `forwards` and `texts_embedded` count the model's forward passes and the
    distinct texts they embedded.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        layer: int = -1,
        batch_size: int = 16,
        max_tokens: int = 512,
        device: str | None = None,
        special_tokens: bool | None = None,
    ) -> None:
        import torch

        self.layer = layer
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.forwards = 0
        self.texts_embedded = 0
        self._torch = torch
        self.live = isinstance(model, str) and model == POLICY
        # the tokenizer's special tokens around each step: an encoder's ([CLS] ... [SEP], pooled by its sentence
        # embedding) by default, none for the live policy (the step's own L_t tokens, the draft's equation)
        self.special_tokens = not self.live if special_tokens is None else bool(special_tokens)
        self.model: Any = None
        self.tokenizer: Any = None
        if self.live:  # bound by the back end once its trainer holds the policy
            super().__init__(dim=None)
            return
        if isinstance(model, str):
            from transformers import AutoModel, AutoTokenizer

            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModel.from_pretrained(model)
        elif tokenizer is None:
            raise ValueError("HiddenStateEmbedder needs the tokenizer that goes with the given model")
        super().__init__(dim=None)
        self._set_model(model.to(device) if device else model, tokenizer)

    def bind(self, model: Any, tokenizer: Any) -> None:
        """Embed with `model` from now on: the module the trainer updates in place, so later calls see its
        current weights (a live embedder only)."""
        if not self.live:
            raise ValueError("bind() is for the live policy embedder (embedding.model=policy); this one is frozen")
        self._set_model(model, tokenizer)

    def _set_model(self, model: Any, tokenizer: Any) -> None:
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.model = model
        self.tokenizer = tokenizer
        self.dim = int(model.config.hidden_size)

    def _embed_unique(self, texts: list[str]) -> tuple[np.ndarray, dict[int, str]]:
        if self.model is None:
            raise RuntimeError(
                "embedding=policy_hidden with embedding.model=policy embeds with the policy being trained, which only "
                "backend=trl binds; elsewhere set embedding.model to a checkpoint path (decisions §1.2)"
            )
        torch = self._torch
        out: list[np.ndarray] = []  # (batch, hidden_size) float32 means, one array per batch
        # the transformer without its LM head (same hidden states; no logits over the vocabulary)
        body = getattr(self.model, "base_model", None) or self.model
        device = next(self.model.parameters()).device
        extra = {"output_hidden_states": True, **({"use_cache": False} if self.live else {})}  # a policy: no KV cache
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(texts), self.batch_size):
                chunk = texts[start : start + self.batch_size]
                # right padding: a causal model's real tokens keep positions 0..L_t-1 and never attend to a pad
                enc = self.tokenizer(
                    chunk,
                    return_tensors="pt",
                    padding=True,
                    padding_side="right",
                    truncation=True,
                    max_length=self.max_tokens,
                    add_special_tokens=self.special_tokens,
                ).to(device)
                with torch.no_grad():
                    hidden = body(**enc, **extra).hidden_states[self.layer]
                self.forwards += 1
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                out.append(mean.float().cpu().numpy())
        finally:
            self.model.train(was_training)
        self.texts_embedded += len(texts)
        return np.concatenate(out) if out else np.empty((0, self.dim or 0), dtype=np.float32), {}
