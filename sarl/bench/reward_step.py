"""The structure reward of one paper training step on CPU, everything but the embedding model.

A batch of `rollouts` responses (SARL's setting: 2,048 rollouts a step) of about `steps_mean` reasoning
steps each, built from real step texts (the shipped traces and test fixtures, made unique per response),
goes through `StructureReward` exactly as training calls it, built from the reward's config (conf/reward/sarl.yaml
composed as the section's `reward`: its clustering settings and step splitting). The embedding model is replaced by
a stand-in that returns random unit vectors of `dim` dimensions (Qwen3-Embedding-0.6B's 1,024); its own time is
measured and left out. The token count of the step texts tells the GPU time of the real model from a
throughput figure (tokens/s): MiniLM's WordPiece tokenizer (shipped) is counted, Qwen3's BPE is not
available offline, so characters / 4 is printed beside it as the usual BPE estimate.
"""

from __future__ import annotations

import time

import numpy as np
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from sarl.bench.common import median
from sarl.bench.structure import step_text_stream
from sarl.contract.reward import RolloutBatch, build_reward
from sarl.structure.cluster import cluster_batch, method_k_rule
from sarl.structure.embed.base import Embedder
from sarl.structure.graph import graph_metrics_batch
from sarl.structure.steps import parse_steps


class StandInEmbedder(Embedder):
    """Random unit vectors for each distinct text; records the time spent making them."""

    def __init__(self, dim: int, seed: int) -> None:
        super().__init__(dim=dim)
        self.rng = np.random.default_rng(seed)
        self.model_s = 0.0
        self.embed_s = 0.0  # whole `embed` calls: the model plus the bookkeeping around it

    def embed(self, texts: list[str], threads: int | None = 1):
        t0 = time.perf_counter()
        try:
            return super().embed(texts, threads=threads)
        finally:
            self.embed_s += time.perf_counter() - t0

    def _embed_unique(self, texts: list[str]) -> tuple[np.ndarray, dict[int, str]]:
        t0 = time.perf_counter()
        x = self.rng.standard_normal((len(texts), self.dim), dtype=np.float32)
        self.model_s += time.perf_counter() - t0
        return x, {}  # one 2-D array, as the in-process models give it


def paper_batch(rollouts: int, steps_mean: int, seed: int) -> RolloutBatch:
    """Responses of N(steps_mean, steps_mean / 5) steps (at least 2) in <think> ... </think> form."""
    rng = np.random.default_rng(seed)
    stream = [t for t in step_text_stream() if "think>" not in t]  # a stray tag would end the reasoning early
    responses = []
    for i in range(rollouts):
        m = max(2, int(rng.normal(steps_mean, steps_mean / 5)))
        start = int(rng.integers(0, len(stream)))
        steps = [f"{stream[(start + j) % len(stream)]} ({i}.{j})" for j in range(m)]
        responses.append("<think>\n" + "\n\n".join(steps) + "\n</think>\n\nThe answer is $\\boxed{42}$.")
    return RolloutBatch.from_columns(
        responses=responses, prompts=["p"] * rollouts, group_ids=[i // 16 for i in range(rollouts)]
    )


def run_reward_step(cfg: DictConfig, console: Console, threads: int = 1) -> dict:
    """The reward call on `threads` threads (the reward's `threads`; the bench's `threads`), its stages timed alone."""
    batch = paper_batch(cfg.rollouts, cfg.steps_mean, cfg.seed)
    reward_cfg = cfg.reward

    def parse(text: str):
        return parse_steps(
            text,
            reward_cfg.delimiter,
            reward_cfg.no_think,
            regex=reward_cfg.delimiter_regex,
            max_steps=reward_cfg.max_steps,
        )

    parsed = [parse(r) for r in batch.responses]
    steps = [s for p in parsed for s in p.steps]
    chars = sum(len(s) for s in steps)
    from sarl.structure.embed.local import SentenceTransformerEmbedder  # deferred: torch loads in seconds

    tokenizer = SentenceTransformerEmbedder().model.tokenizer
    wordpiece = sum(len(ids) for ids in tokenizer(steps, add_special_tokens=True)["input_ids"])
    out: dict = {
        "rollouts": cfg.rollouts,
        "steps": len(steps),
        "steps_per_response": len(steps) / cfg.rollouts,
        "dim": cfg.dim,
        "threads": threads,
        "characters": chars,
        "minilm_tokens": wordpiece,
        "bpe_tokens_estimate": chars // 4,
    }
    rng = np.random.default_rng(cfg.seed)
    vectors = []
    for p in parsed:
        x = rng.standard_normal((len(p.steps), cfg.dim), dtype=np.float32)
        vectors.append(x / np.linalg.norm(x, axis=1, keepdims=True))
    for method in cfg.methods:
        stages: dict[str, list[float]] = {
            k: [] for k in ("parse", "cluster", "graph", "embed bookkeeping", "reward call", "stand-in model")
        }
        for _ in range(cfg.repeats):
            t0 = time.perf_counter()
            [parse(r) for r in batch.responses]
            t1 = time.perf_counter()
            k_rule = method_k_rule(method, reward_cfg.k_rule)
            labels = cluster_batch(vectors, method=method, seed=reward_cfg.seed, k_rule=k_rule, threads=threads)
            t2 = time.perf_counter()
            graph_metrics_batch(labels).rewards(reward_cfg.variant)
            t3 = time.perf_counter()
            embedder = StandInEmbedder(cfg.dim, cfg.seed)
            reward = build_reward(reward_cfg, embedder=embedder, clustering=method, k_rule=k_rule, threads=threads)
            t4 = time.perf_counter()
            outputs = reward(batch)
            t5 = time.perf_counter()
            assert not any(o.failed for o in outputs)
            for k, v in (
                ("parse", t1 - t0),
                ("cluster", t2 - t1),
                ("graph", t3 - t2),
                ("embed bookkeeping", embedder.embed_s - embedder.model_s),
                ("reward call", t5 - t4 - embedder.model_s),
                ("stand-in model", embedder.model_s),
            ):
                stages[k].append(v)
        out[method] = {k: median(v) for k, v in stages.items()}
        out[method]["other"] = out[method]["reward call"] - sum(
            out[method][k] for k in ("parse", "cluster", "graph", "embed bookkeeping")
        )
    title = (
        f"reward stage of one step: {cfg.rollouts} rollouts, {out['steps_per_response']:.1f} steps each, "
        f"dim {cfg.dim}, CPU, {threads} thread{'s' if threads > 1 else ''}, median of {cfg.repeats}"
    )
    table = Table(title=title)
    for col in ("stage", *(f"{m} s" for m in cfg.methods), *(f"{m} ms/response" for m in cfg.methods)):
        table.add_column(col, justify="right")
    labels_ = {
        "parse": "split into steps",
        "cluster": "clustering",
        "graph": "reasoning map + SR",
        "embed bookkeeping": "Embedder.embed around the model (dedup, validate, normalise)",
        "other": "the rest (outputs; reward call minus the stages timed alone, ~0 +- noise)",
        "reward call": "StructureReward(batch) without the model",
    }
    for key, name in labels_.items():
        vals = [out[m][key] for m in cfg.methods]
        table.add_row(name, *(f"{v:.3f}" for v in vals), *(f"{1e3 * v / cfg.rollouts:.3f}" for v in vals))
    console.print(table)
    console.print(
        f"embedding model input per step: {len(steps)} step texts, {chars} characters, {wordpiece} MiniLM "
        f"WordPiece tokens, about {chars // 4} BPE tokens (characters / 4; Qwen3's tokenizer is not offline here). "
        "GPU embedding time = tokens / the server's tokens per second."
    )
    return out
