"""Reasoning map and its small-world metrics (SARL Sec. 3.2-3.3, Eqs. 4-6).

Two implementations of the same definitions:
- `reasoning_map`, `clustering_coefficient`, `average_path_length`, `structure_reward`:
  the readable networkx reference, one response at a time.
- `graph_metrics_batch`: the same numbers for many responses at once with padded
  adjacency tensors (the training hot path). Tests check that both agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import networkx as nx
import numpy as np

VARIANTS = ("sarl", "c_only", "l_only")


def reasoning_map(labels: Sequence[int]) -> nx.Graph:
    """Undirected graph G(tau): nodes are the clusters that occur, one edge per distinct
    transition between consecutive steps in different clusters; no self loops (SARL Sec. 3.2)."""
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
    local = nx.clustering(G, nontrivial)
    return float(sum(local[v] for v in nontrivial) / len(nontrivial))


def average_path_length(G: nx.Graph) -> float | None:
    """L(G): mean hop distance over ordered pairs (v_i, v_j), i != j, v_j reachable from v_i
    (SARL Eq. 5); None when there is no such pair."""
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


def _dense_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel to 0..n-1 in order of first occurrence."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    return order[inverse]


def graph_metrics_batch(label_seqs: Sequence[np.ndarray], chunk_size: int = 512) -> GraphMetrics:
    """C, L, node and edge counts of every response's reasoning map, batched.

    Responses are sorted by node count and processed in chunks of padded adjacency
    tensors, so the cost is a few small batched matrix products per chunk.
    """
    n = len(label_seqs)
    dense = [
        _dense_labels(np.asarray(s, dtype=np.int64).ravel()) if len(s) else np.zeros(0, np.int64) for s in label_seqs
    ]
    n_nodes = np.array([int(d.max()) + 1 if d.size else 0 for d in dense], dtype=np.int64)
    C = np.zeros(n, dtype=np.float64)
    L = np.full(n, np.nan, dtype=np.float64)
    n_edges = np.zeros(n, dtype=np.int64)
    order = np.argsort(n_nodes, kind="stable")
    for start in range(0, n, chunk_size):
        idx = order[start : start + chunk_size]
        k = int(n_nodes[idx].max()) if idx.size else 0
        if k < 2:
            continue  # at most one node everywhere: no edge, C = 0, L undefined
        A = np.zeros((idx.size, k, k), dtype=np.float32)
        for row, i in enumerate(idx):
            seq = dense[i]
            a, b = seq[:-1], seq[1:]
            moved = a != b
            A[row, a[moved], b[moved]] = 1.0
            A[row, b[moved], a[moved]] = 1.0
        deg = A.sum(-1, dtype=np.float64)
        n_edges[idx] = (deg.sum(-1) / 2).astype(np.int64)
        # Eq. (4): triangles through v = (A^3)_vv / 2; local C_v = 2 T_v / (d_v (d_v - 1)).
        # (A^3)_vv = sum_k (A^2)_vk A_kv, A symmetric: one batched product and a row sum (integers, exact).
        tri = (np.matmul(A, A) * A).sum(-1, dtype=np.float64) / 2.0
        nontrivial = deg >= 2
        local = np.where(nontrivial, 2.0 * tri / np.maximum(deg * (deg - 1), 1.0), 0.0)
        n_nt = nontrivial.sum(-1)
        # Sequential sum: padding nodes sit at the end and add exact zeros, so a response's
        # C is bit-identical whatever chunk it lands in.
        C[idx] = np.where(n_nt > 0, np.cumsum(local, -1)[:, -1] / np.maximum(n_nt, 1), 0.0)
        # Eq. (5): hop distances by breadth-first frontier expansion on all sources at once.
        reached = np.broadcast_to(np.eye(k, dtype=bool), A.shape).copy()
        frontier = reached.copy()
        dist_sum = np.zeros(idx.size, dtype=np.float64)
        for hop in range(1, k):
            frontier = (np.matmul(frontier.astype(np.float32), A) > 0) & ~reached
            count = frontier.sum((-1, -2))
            if not count.any():
                break
            dist_sum += hop * count
            reached |= frontier
        pairs = reached.sum((-1, -2)) - k  # drop the k diagonal (self) entries
        L[idx] = np.where(pairs > 0, dist_sum / np.maximum(pairs, 1), np.nan)
    return GraphMetrics(C=C, L=L, n_nodes=n_nodes, n_edges=n_edges)
