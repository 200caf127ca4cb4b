"""Test doubles shared by the sarl tests."""

import hashlib

import numpy as np

from sarl.contract.reward import RewardFunction, RewardOutput
from sarl.structure.embed.base import Embedder


class KeywordEmbedder(Embedder):
    """Deterministic test embedder: a step's vector is the one-hot of the first keyword it
    contains (plan / calc / check / answer, else 'other') plus a small hash-seeded jitter.
    Texts listed in `bad` get the given raw vector instead (NaN, zero, wrong size)."""

    KEYWORDS = ("plan", "calc", "check", "answer")

    def __init__(self, dim: int = 16, bad: dict | None = None):
        super().__init__(dim=dim)
        self.size = dim
        self.bad = bad or {}
        self.calls: list[list[str]] = []

    def _embed_unique(self, texts):
        self.calls.append(list(texts))
        out = []
        for t in texts:
            if t in self.bad:
                out.append(np.asarray(self.bad[t], dtype=np.float64))
                continue
            v = np.zeros(self.size)
            hit = next((i for i, k in enumerate(self.KEYWORDS) if k in t.lower()), len(self.KEYWORDS))
            v[hit] = 1.0
            seed = int.from_bytes(hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest()[:4], "little")
            v += np.random.default_rng(seed).normal(scale=0.01, size=self.size)
            out.append(v)
        return out, {}


class PromptRecorder(RewardFunction):
    """A prompt-dependent reward test double (like MaxFlow, `needs_prompt`): scores 1 and records every
    prompt it is given. `name` only makes configs differ (the verl bridge builds one object per config)."""

    needs_prompt = True

    def __init__(self, name: str = "") -> None:
        super().__init__()
        self.name = name
        self.prompts: list[str] = []

    def score(self, batch):
        self.prompts.extend(batch.prompts)
        return [RewardOutput(1.0) for _ in batch.responses]
