"""The SARL structure reward (SARL Sec. 3, Algorithm 1; decisions §1).

response -> steps -> unit step embeddings -> per-response clusters -> reasoning map
-> SR = C/2 + 1/(1+L)  (or the C-only / L-only ablation).

`structure_rewards_from_embeddings` is the batched clustering + graph stage (the hot
path); `StructureReward` is the reward object every backend calls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch
from sarl.contract.threads import limited
from sarl.structure.cluster import DEFAULT_K_RULE, check_k_rule, cluster_batch, load_kernels, method_labeler
from sarl.structure.embed.base import Embedder
from sarl.structure.graph import VARIANTS, GraphMetrics, graph_metrics_batch
from sarl.structure.steps import NO_THINK_MODES, ParsedSteps, parse_steps

log = logging.getLogger(__name__)


def structure_metrics_from_embeddings(
    embeddings: Sequence[np.ndarray],
    method: str = "kmeans",
    seed: int = 0,
    k_rule: str = DEFAULT_K_RULE,
    threads: int | None = 1,
) -> tuple[list[np.ndarray], GraphMetrics]:
    """Cluster labels and reasoning-map metrics (C, L, nodes, edges) for many responses; `threads` responses are
    clustered at a time (`cluster_batch`), with the same labels whatever their number."""
    labels = cluster_batch(embeddings, method=method, seed=seed, k_rule=k_rule, threads=threads)
    return labels, graph_metrics_batch(labels)


def structure_rewards_from_embeddings(
    embeddings: list[np.ndarray],
    method: str = "kmeans",
    variant: str = "sarl",
    seed: int = 0,
    k_rule: str = DEFAULT_K_RULE,
) -> list[float]:
    """SR (SARL Eq. 6, or an ablation variant) for each response's (M_i x d) unit step embeddings."""
    if variant not in VARIANTS:
        raise ValueError(f"structure reward variant {variant!r} not found; choose one of: {', '.join(VARIANTS)}")
    _, metrics = structure_metrics_from_embeddings(embeddings, method=method, seed=seed, k_rule=k_rule)
    return metrics.rewards(variant).tolist()


@dataclass
class StructureAnalysis:
    """Everything the reward saw for one response: its steps, step clusters and output."""

    steps: list[str]
    labels: np.ndarray | None
    output: RewardOutput


READY_CHECK_TEXT = "The sum of 2 and 3 is 5."


def embedder_problem(embedder: Embedder) -> str | None:
    """Why `embedder` cannot embed (it is asked to embed one short text), None if it can."""
    where = getattr(embedder, "base_url", None)
    name = type(embedder).__name__ + (f" at {where}" if where else "")
    try:
        result = embedder.embed([READY_CHECK_TEXT])
    except Exception as err:  # any crash of the dependency is the answer, not a bug of the check
        reason = f"{type(err).__name__}: {err}"
    else:
        if not result.failed:
            return None
        reason = next(iter(result.failed.values()))
    health = getattr(embedder, "health", None)
    down = " (its /health does not answer either)" if callable(health) and not health() else ""
    return (
        f"embedder {name} cannot embed a test text{down}: {reason}; start the embedding server or point "
        "embedding.url at a running one"
    )


class StructureReward(RewardFunction):
    """The SARL structure reward as a reward object: `reward(batch) -> list[RewardOutput]`.

    Each output carries `score` (SR or the ablation variant) and diagnostics `sr`, `C`,
    `L` (absent when undefined), `n_steps`, `n_nodes`, `n_edges` and the flags
    `no_think`, `truncated`, `steps_capped`. A response whose steps could not be embedded
    gets `failed_score` and `failed=<reason>`; nothing raises on model output.
    """

    diagnostic_keys = ("sr", "C", "L", "n_steps", "n_nodes", "n_edges", "no_think", "truncated", "steps_capped")
    failure_label = "structure reward"

    def __init__(
        self,
        embedder: Embedder,
        variant: str = "sarl",
        clustering: str = "kmeans",
        seed: int = 0,
        delimiter: str = "\n\n",
        delimiter_regex: bool = False,
        no_think: str = "whole",
        max_steps: int = 1024,
        failed_score: float = 0.0,
        k_rule: str = DEFAULT_K_RULE,
        threads: int | None = 1,
    ) -> None:
        super().__init__(threads)
        if variant not in VARIANTS:
            raise ValueError(f"structure reward variant {variant!r} not found; choose one of: {', '.join(VARIANTS)}")
        method_labeler(clustering)  # a ValueError naming the methods there are
        check_k_rule(k_rule, clustering)
        if no_think not in NO_THINK_MODES:
            raise ValueError(f"no_think={no_think!r} is not valid; choose one of: {', '.join(NO_THINK_MODES)}")
        self.embedder = embedder
        self.variant = variant
        self.clustering = clustering
        self.k_rule = k_rule
        self.seed = seed
        self.delimiter = delimiter
        self.delimiter_regex = delimiter_regex
        self.no_think = no_think
        self.max_steps = max_steps
        self.failed_score = float(failed_score)
        load_kernels()  # numba's compiled kernels, loaded now so that no call pays for them (not at import)

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        return [a.output for a in self._analyze(batch)]

    def check_ready(self) -> str | None:
        """Why the embedder cannot be used (`sarl.contract.reward.Reward.check_ready`), None if it can."""
        return embedder_problem(self.embedder)

    def _parse(self, text: object) -> ParsedSteps | str:
        try:
            return parse_steps(
                text, self.delimiter, self.no_think, regex=self.delimiter_regex, max_steps=self.max_steps
            )
        except (TypeError, ValueError) as err:
            return f"unparseable response: {err}"

    def analyze(self, batch: RolloutBatch) -> list[StructureAnalysis]:
        """Steps, clusters and reward output of every response in the batch (failures counted as by a call)."""
        out = self._analyze(batch)
        self.count_failures([a.output for a in out])
        return out

    def _analyze(self, batch: RolloutBatch) -> list[StructureAnalysis]:
        parsed = [self._parse(text) for text in batch.responses]
        all_steps = [s for p in parsed if isinstance(p, ParsedSteps) for s in p.steps]
        failed: dict[int, str] = {i: p for i, p in enumerate(parsed) if isinstance(p, str)}
        try:
            result = self.embedder.embed(all_steps, threads=self.threads)
            vectors, step_failed = result.vectors, result.failed
        except Exception as err:  # an embedder crash fails the batch's responses, not the run
            log.exception("embedder %s failed on %d steps", type(self.embedder).__name__, len(all_steps))
            vectors, step_failed = (
                None,
                {j: f"embedding error: {type(err).__name__}: {err}" for j in range(len(all_steps))},
            )
        embeddings: dict[int, np.ndarray] = {}
        offset = 0
        for i, p in enumerate(parsed):
            if not isinstance(p, ParsedSteps):
                continue
            span = range(offset, offset + len(p.steps))
            offset = span.stop
            reasons = [step_failed[j] for j in span if j in step_failed] if step_failed else None
            if reasons:
                failed[i] = reasons[0]
            else:
                embeddings[i] = vectors[span.start : span.stop] if vectors is not None else np.zeros((0, 0))
        ok = sorted(embeddings)
        labels: dict[int, np.ndarray] = {}
        try:
            with limited(self.threads):  # Gram products, clustering, graph metrics: the reward's thread cap
                clusters, metrics = structure_metrics_from_embeddings(
                    [embeddings[i] for i in ok], self.clustering, self.seed, self.k_rule, self.threads
                )
            scores = metrics.rewards(self.variant)
            full = metrics.rewards("sarl")
        except Exception as err:  # defensive: the batched stage must not take the run down
            log.exception("structure stage failed on %d responses", len(ok))
            for i in ok:
                failed[i] = f"structure error: {type(err).__name__}: {err}"
            ok = []
        out: list[StructureAnalysis] = []
        row = {i: r for r, i in enumerate(ok)}
        for i, p in enumerate(parsed):
            steps = p.steps if isinstance(p, ParsedSteps) else []
            diag: dict[str, float] = dict(p.flags) if isinstance(p, ParsedSteps) else {}
            diag["n_steps"] = float(len(steps))
            if i in row:
                r = row[i]
                labels[i] = clusters[r]
                diag.update(
                    sr=float(full[r]),
                    C=float(metrics.C[r]),
                    n_nodes=float(metrics.n_nodes[r]),
                    n_edges=float(metrics.n_edges[r]),
                )
                if not np.isnan(metrics.L[r]):
                    diag["L"] = float(metrics.L[r])
                output = RewardOutput(score=float(scores[r]), diagnostics=diag)
            else:
                output = RewardOutput(score=self.failed_score, diagnostics=diag, failed=failed[i])
            out.append(StructureAnalysis(steps=steps, labels=labels.get(i), output=output))
        return out
