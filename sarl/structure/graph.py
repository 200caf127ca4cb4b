"""Reasoning map and its small-world metrics (SARL Sec. 3.2-3.3, Eqs. 4-6).

Two implementations of the same definitions:
- `reasoning_map`, `clustering_coefficient`, `average_path_length`, `structure_reward`:
  the readable networkx reference, one response at a time.
- `graph_metrics_batch`: the same numbers for many responses at once in one compiled
  loop (`sarl.structure.kernels`; the training hot path). Tests check that both agree.
networkx and the compiled loop are imported on first use: `from sarl import StructureReward` loads neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import networkx as nx

VARIANTS = ("sarl", "c_only", "l_only")


def reasoning_map(labels: Sequence[int]) -> nx.Graph:
    """Undirected graph G(tau): nodes are the clusters that occur, one edge per distinct
    transition between consecutive steps in different clusters; no self loops (SARL Sec. 3.2)."""
    import networkx as nx  # deferred: ~0.1 s, for the reference only

    G = nx.Graph()
    labels = [int(x) for x in labels]
    G.add_nodes_from(dict.fromkeys(labels))
    for a, b in zip(labels, labels[1:]):
        if a != b:
            G.add_edge(a, b)
    return G


def clustering_coefficient(G: nx.Graph) -> float:
    """C(G): mean local clustering coefficient over nodes with degree >= 2 (SARL Eq. 4); 0 if none."""
    nontrivial = [v for v in G.nodes if G.degree(v) >= 2]
    if not nontrivial:
        return 0.0
    import networkx as nx  # deferred: ~0.1 s, for the reference only

    local = nx.clustering(G, nontrivial)
    return float(sum(local[v] for v in nontrivial) / len(nontrivial))


def average_path_length(G: nx.Graph) -> float | None:
    """L(G): mean hop distance over ordered pairs (v_i, v_j), i != j, v_j reachable from v_i
    (SARL Eq. 5); None when there is no such pair."""
    import networkx as nx  # deferred: ~0.1 s, for the reference only

    total, pairs = 0, 0
    for source, dists in nx.all_pairs_shortest_path_length(G):
        for target, d in dists.items():
            if target != source:
                total += d
                pairs += 1
    return total / pairs if pairs else None


def reward_from_metrics(C: float, L: float | None, variant: str = "sarl") -> float:
    """SR = C/2 + 1/(1+L) (SARL Eq. 6); `c_only` = C/2 and `l_only` = 1/(1+L) (SARL Table 5/10).

    An undefined L (no reachable pair) contributes 0.
    """
    return float(_combine(C / 2.0, 0.0 if L is None else 1.0 / (1.0 + L), variant))


def _combine(c_term, l_term, variant: str):
    """SARL Eq. (6) from its two terms, or one term alone for the Table 5/10 ablations."""
    if variant == "sarl":
        return c_term + l_term
    if variant == "c_only":
        return c_term
    if variant == "l_only":
        return l_term
    raise ValueError(f"structure reward variant {variant!r} not found; choose one of: {', '.join(VARIANTS)}")


def structure_reward(G: nx.Graph, variant: str = "sarl") -> float:
    """The structure reward of a reasoning map (SARL Eq. 6, or an ablation variant)."""
    return reward_from_metrics(clustering_coefficient(G), average_path_length(G), variant)


@dataclass
class GraphMetrics:
    """Per-response metrics of many reasoning maps; `L` is NaN where undefined."""

    C: np.ndarray
    L: np.ndarray
    n_nodes: np.ndarray
    n_edges: np.ndarray

    def rewards(self, variant: str = "sarl") -> np.ndarray:
        """SARL Eq. (6) (or its ablation variant) for every response, NaN-free."""
        c_term = self.C / 2.0
        l_term = np.zeros_like(self.L)
        defined = ~np.isnan(self.L)
        l_term[defined] = 1.0 / (1.0 + self.L[defined])
        return _combine(c_term, l_term, variant)


def graph_metrics_batch(label_seqs: Sequence[np.ndarray]) -> GraphMetrics:
    """C, L, node and edge counts of every response's reasoning map (SARL Eqs. 4-5), one compiled loop over
    the responses (`sarl.structure.kernels.graph_metrics_flat`); the same numbers as the networkx reference above."""
    # deferred: numba and the compiled kernels (~0.5 s), not paid by `from sarl import StructureReward`
    from sarl.structure.kernels import graph_metrics_flat

    seqs = [np.asarray(s, dtype=np.int64).ravel() for s in label_seqs]
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
    C, L, n_nodes, n_edges = graph_metrics_flat(np.ascontiguousarray(flat, dtype=np.int64), offsets)
    return GraphMetrics(C=C, L=L, n_nodes=n_nodes, n_edges=n_edges)
