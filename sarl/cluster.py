"""Per-response clustering of step embeddings into latent reasoning functions
(SARL Sec. 3.2 Eq. 3, App. A.1; decisions §1.3 "Clustering").

Both methods run batched: responses with the same number of steps M are stacked,
their Gram matrices come from one batched matrix product, and everything after
that works on M x M matrices instead of M x d embeddings.

- KMeans: k = min(M, max(1, rule(M)), #distinct embeddings) with decisions §1's rule
  round(sqrt(M)) by default (`k_rule`, see `K_RULES` for the ablation's others);
  k-means++ seeding from a fixed seed, then Lloyd iterations to convergence, written
  in kernel form (centroid distances from the Gram matrix).
- HDBSCAN: Euclidean distance, min_cluster_size = max(2, min(5, floor(M/4))),
  min_samples = max(1, min_cluster_size - 1). Core distances, mutual reachability
  and Prim's minimum spanning tree are computed batched (Prim exactly as
  scikit-learn's `mst_from_mutual_reachability` visits nodes, so ties break the
  same way); the single-linkage tree, condensed tree and excess-of-mass selection
  are scikit-learn's own routines. Labels equal `sklearn.cluster.HDBSCAN(algorithm="brute")`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

import numpy as np
from sklearn.cluster._hdbscan._linkage import MST_edge_dtype, make_single_linkage
from sklearn.cluster._hdbscan._tree import tree_to_labels

METHODS = ("kmeans", "hdbscan")


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


# KMeans cluster-count rules, k before the caps as a function of the number of steps M.
# "sqrt" is the paper's and the default: SARL App. A.1 uses "k ~ sqrt(M)", decisions §1 fixes
# round(sqrt(M)) with halves rounded up. The others exist for the k-rule ablation
# (sweeps/k_rule.yaml); "fixed:K" (any K >= 1) is also accepted.
K_RULES = {
    "sqrt": lambda m: _round_half_up(math.sqrt(m)),  # SARL App. A.1, decisions §1
    "sqrt_floor": lambda m: math.isqrt(m),  # floor(sqrt(M))
    "sqrt_ceil": lambda m: math.isqrt(m - 1) + 1,  # ceil(sqrt(M)), exact in integers
    "sqrt_half": lambda m: _round_half_up(math.sqrt(m / 2)),  # rule of thumb k ~ sqrt(M/2)
    "log2": lambda m: _round_half_up(math.log2(m)),  # k ~ log2(M)
}
DEFAULT_K_RULE = "sqrt"
# Columns of the shared k-means++ draws: one per local trial, 2 + ln k <= 16 for any k < e^14.
_U_COLUMNS = 16


def check_k_rule(rule: str, method: str = "kmeans") -> str:
    """`rule` if it names a k rule (a key of K_RULES or "fixed:K" with K >= 1) that `method` can use
    (HDBSCAN infers its own number of clusters: only the default), else ValueError."""
    if not (
        isinstance(rule, str)
        and (rule in K_RULES or (rule.startswith("fixed:") and rule[6:].isdigit() and int(rule[6:]) >= 1))
    ):
        raise ValueError(f"k rule {rule!r} not found; choose one of: {', '.join(K_RULES)}, fixed:K (K >= 1)")
    if method != "kmeans" and rule != DEFAULT_K_RULE:
        raise ValueError(f"k_rule={rule!r} applies to KMeans only; {method} infers the number of clusters")
    return rule


def kmeans_k(n_steps: int, n_distinct: int | None = None, rule: str = DEFAULT_K_RULE) -> int:
    """k = min(M, max(1, rule(M))), capped at the number of distinct embeddings (decisions §1);
    the default rule gives decisions §1's k = min(M, max(1, round(sqrt(M))))."""
    check_k_rule(rule)
    if n_steps <= 0:
        return 0
    raw = int(rule[6:]) if rule.startswith("fixed:") else K_RULES[rule](n_steps)
    k = min(n_steps, max(1, raw))
    return min(k, n_distinct) if n_distinct is not None else k


def hdbscan_params(n_steps: int) -> tuple[int, int]:
    """(min_cluster_size, min_samples) for M steps (SARL App. A.1; decisions §1)."""
    min_cluster_size = max(2, min(5, n_steps // 4))
    return min_cluster_size, max(1, min_cluster_size - 1)


def _check(embeddings: np.ndarray, i: int) -> np.ndarray:
    x = np.asarray(embeddings)
    if x.size == 0:
        return np.zeros((0, x.shape[-1] if x.ndim == 2 else 0))
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim != 2:
        raise ValueError(f"embeddings[{i}] must be a 2-D array (steps x dim), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"embeddings[{i}] contains NaN or infinite values")
    return x


def _n_distinct(x: np.ndarray) -> int:
    """Number of distinct rows, compared bytewise."""
    rows = np.ascontiguousarray(x).view(np.dtype((np.void, x.dtype.itemsize * x.shape[1])))
    return len(np.unique(rows))


def _squared_distances(gram: np.ndarray) -> np.ndarray:
    sq = np.diagonal(gram, axis1=-2, axis2=-1)
    d2 = sq[..., :, None] + sq[..., None, :] - 2.0 * gram
    np.maximum(d2, 0.0, out=d2)
    idx = np.arange(gram.shape[-1])
    d2[..., idx, idx] = 0.0
    return d2


def _kmeans_bucket(gram: np.ndarray, d2: np.ndarray, ks: np.ndarray, u: np.ndarray, max_iter: int) -> np.ndarray:
    """Lloyd's KMeans in kernel form for b responses of m steps each; ks[i] clusters for
    response i; d2 holds the squared step-to-step distances."""
    b, m, _ = gram.shape
    kmax = int(ks.max())
    rows = np.arange(b)
    # Greedy k-means++ seeding (Arthur & Vassilvitskii 2007, with scikit-learn's
    # 2 + ln k local trials, k the response's own): first centre uniform, then the
    # D^2-sampled candidate that lowers the potential most. The draws u are shared by
    # every response and u[j, t] does not depend on the batch, so a response's clusters
    # never depend on its position or on the other responses.
    trials = 2 + np.log(np.maximum(ks, 1)).astype(np.int64)  # (b,)
    n_trials = int(trials.max())
    if n_trials > u.shape[1]:
        raise ValueError(f"k = {kmax} clusters needs {n_trials} k-means++ trials; at most {u.shape[1]} are drawn")
    extra_trial = np.arange(n_trials)[None, :] >= trials[:, None]  # (b, T)
    centers = np.zeros((b, kmax), dtype=np.int64)
    centers[:, 0] = np.minimum((u[0, 0] * m).astype(np.int64), m - 1)
    closest = d2[rows, centers[:, 0]].copy()
    closest[closest < 1e-12] = 0.0
    for j in range(1, kmax):
        cum = np.cumsum(closest, axis=1)
        # candidates (b, T): first index whose cumulative D^2 passes u * total
        cand = (cum[:, None, :] > u[j, :n_trials][None, :, None] * cum[:, -1:, None]).argmax(axis=2)
        cand_d = d2[rows[:, None], cand]  # (b, T, m)
        cand_d[cand_d < 1e-12] = 0.0
        potential = np.minimum(closest[:, None, :], cand_d).sum(-1)
        potential[extra_trial] = np.inf
        best = potential.argmin(1)
        live = ks > j
        centers[:, j] = np.where(live, cand[rows, best], centers[:, 0])
        np.minimum(closest, np.where(live[:, None], cand_d[rows, best], np.inf), out=closest)
    active = np.arange(kmax)[None, :] < ks[:, None]
    init_d = np.take_along_axis(d2, centers[:, None, :].repeat(m, 1), axis=2)
    labels = np.where(active[:, None, :], init_d, np.inf).argmin(-1)
    sq = np.diagonal(gram, axis1=1, axis2=2)
    eye = np.eye(kmax)
    for _ in range(max_iter):
        W = eye[labels]  # (b, m, k) one-hot assignments
        counts = W.sum(1)
        GW = np.matmul(gram, W)
        safe = np.maximum(counts, 1.0)
        # ||x_i - c_j||^2 = <x_i,x_i> - 2 <x_i,c_j> + <c_j,c_j>, with c_j the mean of cluster j.
        cc = (W * GW).sum(1) / safe**2
        dist = sq[:, :, None] - 2.0 * GW / safe[:, None, :] + cc[:, None, :]
        dist[np.broadcast_to((counts == 0)[:, None, :], dist.shape)] = np.inf
        new = dist.argmin(-1)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels


def _prim_mst(mr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prim's MST on b mutual-reachability matrices at once, visiting nodes in the
    order of scikit-learn's `mst_from_mutual_reachability` (start at 0, lowest index on ties)."""
    b, m, _ = mr.shape
    rows = np.arange(b)
    in_tree = np.zeros((b, m), dtype=bool)
    best = np.full((b, m), np.inf)
    current = np.zeros(b, dtype=np.int64)
    src = np.empty((b, m - 1), dtype=np.int64)
    dst = np.empty((b, m - 1), dtype=np.int64)
    dist = np.empty((b, m - 1), dtype=np.float64)
    for i in range(m - 1):
        in_tree[rows, current] = True
        np.minimum(best, mr[rows, current], out=best)
        masked = np.where(in_tree, np.inf, best)
        nxt = masked.argmin(1)
        src[:, i], dst[:, i], dist[:, i] = current, nxt, masked[rows, nxt]
        current = nxt
    return src, dst, dist


def _hdbscan_bucket(gram: np.ndarray) -> np.ndarray:
    b, m, _ = gram.shape
    min_cluster_size, min_samples = hdbscan_params(m)
    d = np.sqrt(_squared_distances(gram))
    core = np.partition(d, min_samples - 1, axis=2)[:, :, min_samples - 1]
    mr = np.maximum(np.maximum(core[:, :, None], core[:, None, :]), d)
    src, dst, dist = _prim_mst(mr)
    labels = np.empty((b, m), dtype=np.int64)
    mst = np.empty(m - 1, dtype=MST_edge_dtype)
    for r in range(b):
        mst["current_node"], mst["next_node"], mst["distance"] = src[r], dst[r], dist[r]
        tree = make_single_linkage(mst[np.argsort(mst["distance"])])
        labels[r] = tree_to_labels(tree, min_cluster_size, "eom", False, 0.0, None)[0]
    return labels


def cluster_batch(
    embeddings: Sequence[np.ndarray],
    method: str = "kmeans",
    seed: int = 0,
    max_iter: int = 300,
    k_rule: str = DEFAULT_K_RULE,
) -> list[np.ndarray]:
    """One integer label per step for every response, batched over responses of equal length.

    HDBSCAN noise keeps label -1 here; the reasoning map treats it as one node (decisions §1).
    `k_rule` picks KMeans' cluster count (see `K_RULES`); HDBSCAN infers its own and
    accepts only the default. The result for a response does not depend on the other
    responses in the batch.
    """
    if method not in METHODS:
        raise ValueError(f"clustering method {method!r} not found; choose one of: {', '.join(METHODS)}")
    check_k_rule(k_rule, method)
    xs = [_check(e, i) for i, e in enumerate(embeddings)]
    out: list[np.ndarray] = [np.zeros(len(x), dtype=np.int64) for x in xs]
    buckets: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, x in enumerate(xs):
        if len(x) >= 2:
            buckets[x.shape].append(i)
    kmax = max((kmeans_k(len(x), rule=k_rule) for x in xs), default=1) or 1
    # A fixed number of columns keeps every u[j, t] the same whatever kmax (numpy fills
    # row-major from one stream), so no response's draws depend on the batch.
    u = np.random.default_rng(seed).random((kmax, _U_COLUMNS))
    for (m, _), idx in buckets.items():
        # HDBSCAN distances in float64 as scikit-learn computes them (ties break alike);
        # KMeans keeps the embeddings' precision for the one large product.
        dtype = np.float64 if method == "hdbscan" else np.result_type(*(xs[i] for i in idx))
        stack = np.stack([xs[i] for i in idx]).astype(dtype, copy=False)
        gram = np.matmul(stack, stack.transpose(0, 2, 1)).astype(np.float64, copy=False)
        if method == "kmeans":
            # Only responses with (near-)coincident steps can have fewer distinct rows than steps.
            d2 = _squared_distances(gram)
            diag = np.arange(m)
            d2[:, diag, diag] = np.inf
            maybe_dup = d2.min(axis=(1, 2)) < 1e-6
            d2[:, diag, diag] = 0.0
            ks = np.array([kmeans_k(m, _n_distinct(xs[i]) if dup else m, k_rule) for i, dup in zip(idx, maybe_dup)])
            labels = _kmeans_bucket(gram, d2, ks, u, max_iter)
        else:
            labels = _hdbscan_bucket(gram)
        for row, i in enumerate(idx):
            out[i] = labels[row]
    return out


def cluster_steps(
    embeddings: np.ndarray, method: str = "kmeans", seed: int = 0, k_rule: str = DEFAULT_K_RULE
) -> np.ndarray:
    """One integer label per step of one response (decisions §1.3 "Clustering")."""
    return cluster_batch([embeddings], method=method, seed=seed, k_rule=k_rule)[0]
