"""Policy hidden-state embedder (SARL draft, App. A.1 "Implementation A"):
e_t = (1/L_t) sum_j h^l_{t,j}, the mean of layer l's hidden states over the L_t tokens
of step s_t, then unit-normalised (SARL Sec. 3.2)."""

from __future__ import annotations

from typing import Any

import numpy as np

from sarl.structure.embed.base import Embedder


class HiddenStateEmbedder(Embedder):
    """Mean-pooled hidden states of a chosen layer of a transformers model, one step per chunk.

    `model` is a loaded `PreTrainedModel` or a path/id to load with AutoModel;
    `layer` indexes `hidden_states` (0 = embedding output, -1 = last layer).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        layer: int = -1,
        batch_size: int = 16,
        max_tokens: int = 512,
        device: str | None = None,
    ) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        if isinstance(model, str):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModel.from_pretrained(model)
        elif tokenizer is None:
            raise ValueError("HiddenStateEmbedder needs the tokenizer that goes with the given model")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.model = model.to(device) if device else model
        self.tokenizer = tokenizer
        self.layer = layer
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self._torch = torch
        super().__init__(dim=int(model.config.hidden_size))

    def _embed_unique(self, texts: list[str]) -> tuple[np.ndarray, dict[int, str]]:
        torch = self._torch
        out: list[np.ndarray] = []  # (batch, hidden_size) float32 means, one array per batch
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(texts), self.batch_size):
                chunk = texts[start : start + self.batch_size]
                enc = self.tokenizer(
                    chunk, return_tensors="pt", padding=True, truncation=True, max_length=self.max_tokens
                ).to(device)
                with torch.no_grad():
                    hidden = self.model(**enc, output_hidden_states=True).hidden_states[self.layer]
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                out.append(mean.float().cpu().numpy())
        finally:
            self.model.train(was_training)
        return np.concatenate(out) if out else np.empty((0, self.dim), dtype=np.float32), {}
