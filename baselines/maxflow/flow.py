"""The capacity graph and the max-flow step importance of the MaxFlow reward (Structured Reasoning Sec. 4.3 (a)-(c),
Eq. 4, App. E.2, F); the decisions are listed in `baselines.maxflow`.

`capacity_graph` keeps the edges above tau (and the weak ones that connectivity needs); `step_importance` is
F and dF_k = F - F_{-k} for every intermediate node (Dinic with residual reuse); `quality_from_importance`
is Eq. (4).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

TAU = 0.05  # Structured Reasoning Sec. 4.3 (a), App. E.2
TOP_FRACTION = 0.25  # Structured Reasoning Sec. 4.3 (c)


def capacity_graph(step_att: np.ndarray, tau: float = TAU) -> np.ndarray:
    """Capacity matrix C (C[u, v] = capacity of edge u -> v) of the reasoning graph: for j < i an edge
    j -> i with capacity A_ij where A_ij > tau (Structured Reasoning Sec. 4.3 (a); direction: module
    docstring), plus the weak edges (0 < A_ij <= tau) without which the answer (the last node) could not be
    reached from the question (node 0): App. E.2 prunes them "while maintaining connectivity" (the rule and
    its order: module docstring)."""
    a = np.asarray(step_att, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"step attention must be n x n, got shape {a.shape}")
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    lower = np.tril(a, -1)
    cap = np.where(lower > 0, lower, 0.0).T.copy()  # every attended pair, earlier -> later
    weak = sorted((float(cap[u, v]), int(u), int(v)) for u, v in zip(*np.nonzero((cap > 0) & (cap <= tau))))
    n = len(cap)
    if not weak:
        return cap
    succ = [set(np.flatnonzero(row).tolist()) for row in cap]
    path = _st_path_edges(succ, 0, n - 1)
    for _, u, v in weak:  # App. E.2: weakest first, each pruned unless it cuts question -> answer
        succ[u].discard(v)
        if path is not None and (u, v) in path:
            rerouted = _st_path_edges(succ, 0, n - 1)
            if rerouted is None:
                succ[u].add(v)  # a cut edge: kept to maintain connectivity
                continue
            path = rerouted
        cap[u, v] = 0.0
    return cap


def _st_path_edges(succ: list[set[int]], s: int, t: int) -> set[tuple[int, int]] | None:
    """The edges of one directed s -> t path (breadth-first search over successor sets), or None if t is
    unreachable from s. Only an edge on this path can cut s from t when removed, so `capacity_graph`
    searches again only for those."""
    parent = {s: s}
    queue = deque([s])
    while queue and t not in parent:
        u = queue.popleft()
        for v in succ[u]:
            if v not in parent:
                parent[v] = u
                queue.append(v)
    if t not in parent:
        return None
    edges = set()
    v = t
    while v != s:
        edges.add((parent[v], v))
        v = parent[v]
    return edges


# -- max flow: Dinic with residual reuse ------------------------------------------------------------------


def _check_capacity(capacity: Any) -> np.ndarray:
    cap = np.asarray(capacity, dtype=np.float64)
    if cap.ndim != 2 or cap.shape[0] != cap.shape[1]:
        raise ValueError(f"capacity must be a square matrix, got shape {cap.shape}")
    if not np.isfinite(cap).all() or (cap < 0).any():
        raise ValueError("capacities must be finite and non-negative")
    cap = cap.copy()
    np.fill_diagonal(cap, 0.0)  # a self loop carries no s-t flow
    return cap


def _neighbours(cap: np.ndarray) -> list[list[int]]:
    """Residual neighbours of every node: both directions of every edge, in index order."""
    both = (cap > 0) | (cap.T > 0)
    return [np.flatnonzero(row).tolist() for row in both]


def _dinic(
    res: list[list[float]],
    nbrs: list[list[int]],
    s: int,
    t: int,
    eps: float,
    limit: float = math.inf,
    blocked: int = -1,
) -> float:
    """Augments `res` (residual capacities, changed in place) with Dinic's algorithm until no s-t path is
    left or `limit` is reached; returns the flow added. `blocked` is a node treated as removed."""
    n = len(res)
    total = 0.0
    while total < limit - eps:
        level = [-1] * n
        if blocked >= 0:
            level[blocked] = n + 1  # never reached, never on a level path
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            ru, lu = res[u], level[u] + 1
            for v in nbrs[u]:
                if level[v] < 0 and ru[v] > eps:
                    level[v] = lu
                    queue.append(v)
        if level[t] < 0:
            break
        it = [0] * n
        while total < limit - eps:  # blocking flow: augmenting paths in the level graph
            path: list[int] = []
            u = s
            while u != t:
                adj, i, ru, want = nbrs[u], it[u], res[u], level[u] + 1
                while i < len(adj) and not (level[adj[i]] == want and ru[adj[i]] > eps):
                    i += 1
                it[u] = i
                if i < len(adj):
                    path.append(u)
                    u = adj[i]
                elif u == s:
                    break
                else:  # dead end: drop u from the level graph and retreat
                    level[u] = -1
                    u = path.pop()
                    it[u] += 1
            if u != t:
                break
            path.append(t)
            push = limit - total
            for a, b in zip(path, path[1:]):
                push = min(push, res[a][b])
            for a, b in zip(path, path[1:]):
                res[a][b] -= push
                res[b][a] += push
            total += push
    return total


def _cancel_through(res: list[list[float]], nbrs: list[list[int]], k: int, eps: float) -> float | None:
    """Removes the flow through node k from a max flow of a DAG in index order, in place: the flow on
    k's in-edges goes back to the source along flow edges (nodes in decreasing order), the flow on its
    out-edges on to the sink (increasing order). For u < v the flow on u -> v is res[v][u]. Returns the
    flow removed, or None if the flow does not decompose (float trouble): the caller starts afresh."""
    n = len(res)
    excess = [0.0] * n
    for u in nbrs[k]:
        if u < k:
            excess[u] += res[k][u]
    deficit = [0.0] * n
    for w in nbrs[k]:
        if w > k:
            deficit[w] += res[w][k]
    through = sum(excess)
    if not _pass_on(res, nbrs, excess, k, eps, to_source=True):
        return None
    if not _pass_on(res, nbrs, deficit, k, eps, to_source=False):
        return None
    return through


def _pass_on(
    res: list[list[float]], nbrs: list[list[int]], amount: list[float], k: int, eps: float, to_source: bool
) -> bool:
    """One half of `_cancel_through`, in place: the nodes between k and the source (decreasing order) pass
    `amount` on to their lower neighbours, back to the source, or the nodes between k and the sink (increasing
    order) to their higher neighbours, on to the sink, cancelling flow edges as they go (the flow between u and v
    is res[max(u, v)][min(u, v)]). False if a node is left with more than float noise."""
    n = len(res)
    for u in range(k - 1, 0, -1) if to_source else range(k + 1, n - 1):
        e = amount[u]
        if e <= eps:
            continue
        for v in nbrs[u]:
            if (v >= u) if to_source else (v <= u):
                continue
            hi, lo = (u, v) if to_source else (v, u)
            d = min(res[hi][lo], e)
            if d > 0:
                res[hi][lo] -= d
                res[lo][hi] += d
                amount[v] += d
                e -= d
                if e <= eps:
                    break
        if e > eps * (1 + n):
            return False
    return True


def max_flow_value(capacity: Any, source: int = 0, sink: int = -1) -> float:
    """Maximum flow from `source` to `sink` (C[u, v] = capacity of edge u -> v), Dinic's algorithm."""
    cap = _check_capacity(capacity)
    n = len(cap)
    s, t = source % n, sink % n
    if s == t:
        return 0.0
    eps = 1e-12 * max(1.0, float(cap.max(initial=0.0)))
    return _dinic(cap.tolist(), _neighbours(cap), s, t, eps)


def step_importance(capacity: Any) -> tuple[float, np.ndarray]:
    """F and dF_k = F - F_{-k} for every intermediate node k (Structured Reasoning Sec. 4.3 (b)); node 0 is the
    source, the last node the sink; dF is 0 at both. Dinic plus residual reuse (App. F, Algorithm 2)."""
    cap = _check_capacity(capacity)
    n = len(cap)
    if n < 2:
        raise ValueError(f"a flow graph needs a source and a sink, got {n} node(s)")
    s, t = 0, n - 1
    eps = 1e-12 * max(1.0, float(cap.max(initial=0.0)))
    nbrs = _neighbours(cap)
    pristine = cap.tolist()
    res = [row[:] for row in pristine]
    flow = _dinic(res, nbrs, s, t, eps)
    delta = np.zeros(n)
    dag = not np.tril(cap).any()  # every edge goes from a lower to a higher index
    for k in range(1, n - 1):
        if dag:
            through = sum(res[k][u] for u in nbrs[k] if u < k)  # inflow of k in the max flow
            if through <= eps:
                continue  # the max flow avoids k: F_{-k} = F
            work = [row[:] for row in res]
            removed = _cancel_through(work, nbrs, k, eps)
            if removed is not None:
                added = _dinic(work, nbrs, s, t, eps, limit=removed, blocked=k)
                delta[k] = max(0.0, removed - added)
                continue
        work = [row[:] for row in pristine]
        delta[k] = max(0.0, flow - _dinic(work, nbrs, s, t, eps, blocked=k))
    return flow, delta


def maxflow_quality(capacity: np.ndarray) -> float:
    """Structured Reasoning Eq. (4): Q = 1 - sum_{k in K_top} dF_k / sum_k dF_k over the intermediate nodes, K_top the
    ceil(25%) with the largest dF; node 0 the question, the last node the answer. Q = 0 when sum dF = 0 or
    there are fewer than 2 intermediate nodes."""
    cap = _check_capacity(capacity)
    if len(cap) - 2 < 2:
        return 0.0
    _, delta = step_importance(cap)
    return quality_from_importance(delta)


def quality_from_importance(delta: np.ndarray) -> float:
    """Eq. (4) from dF (source and sink included, as `step_importance` returns it)."""
    inner = np.asarray(delta, dtype=np.float64)[1:-1]
    total = float(inner.sum())
    if len(inner) < 2 or total <= 1e-12:
        return 0.0
    top = math.ceil(TOP_FRACTION * len(inner))
    return float(1.0 - np.sort(inner)[::-1][:top].sum() / total)  # Structured Reasoning Eq. (4)
