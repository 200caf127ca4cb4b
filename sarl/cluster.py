"""Per-response clustering of step embeddings into latent reasoning functions
(SARL Sec. 3.2 Eq. 3, App. A.1; decisions §1.3 "Clustering").

Both methods run batched: responses sorted by their number of steps M are cut into
chunks of at most `chunk_steps` padded steps (lengths within 1.25x of each other),
each response's Gram matrix X X^T is zero-padded into its chunk, and everything after
that works on padded M x M matrices instead of M x d embeddings. Padding never changes
a result (padded steps are never centres, members or MST nodes before real ones, and
sums over steps run in step order), and memory is bounded by the chunk, not the batch.

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
    """||x_i - x_j||^2 = <x_i,x_i> + <x_j,x_j> - 2 <x_i,x_j>, clipped at 0, zero diagonal (in place
    on one new array: the chunk's largest temporaries are its p x p matrices)."""
    sq = np.diagonal(gram, axis1=-2, axis2=-1)
    d2 = sq[..., :, None] + sq[..., None, :]
    d2 -= 2.0 * gram
    np.maximum(d2, 0.0, out=d2)
    idx = np.arange(gram.shape[-1])
    d2[..., idx, idx] = 0.0
    return d2


def _kmeans_chunk(
    gram: np.ndarray, d2: np.ndarray, ms: np.ndarray, ks: np.ndarray, u: np.ndarray, max_iter: int
) -> np.ndarray:
    """Lloyd's KMeans in kernel form for b responses padded to p steps; response i has ms[i] steps
    (its Gram rows/columns beyond ms[i] are zero) and ks[i] clusters; d2 holds the squared
    step-to-step distances. Padded steps never become centres or cluster members and every sum
    over steps runs in step order, so a response's labels do not depend on the padding."""
    b, p, _ = gram.shape
    kmax = int(ks.max())
    rows = np.arange(b)
    valid = np.arange(p)[None, :] < ms[:, None]  # (b, p)
    for r in np.flatnonzero(ms < p):
        d2[r, :, ms[r] :] = 0.0  # (in place) padded columns add nothing to any potential
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
    centers[:, 0] = np.minimum((u[0, 0] * ms).astype(np.int64), ms - 1)
    closest = d2[rows, centers[:, 0]].copy()
    closest[closest < 1e-12] = 0.0
    for j in range(1, kmax):
        cum = np.cumsum(closest, axis=1)  # padded tail repeats the total: never the first index past u * total
        # candidates (b, T): first index whose cumulative D^2 passes u * total
        cand = (cum[:, None, :] > u[j, :n_trials][None, :, None] * cum[:, -1:, None]).argmax(axis=2)
        cand_d = d2[rows[:, None], cand]  # (b, T, p)
        cand_d[cand_d < 1e-12] = 0.0
        # sequential sum (cumsum's last entry): trailing zeros of the padding leave it bit-identical
        potential = np.cumsum(np.minimum(closest[:, None, :], cand_d), axis=-1)[..., -1]
        potential[extra_trial] = np.inf
        best = potential.argmin(1)
        live = ks > j
        centers[:, j] = np.where(live, cand[rows, best], centers[:, 0])
        np.minimum(closest, np.where(live[:, None], cand_d[rows, best], np.inf), out=closest)
    active = np.arange(kmax)[None, :] < ks[:, None]
    init_d = np.take_along_axis(d2, centers[:, None, :].repeat(p, 1), axis=2)
    labels = np.where(active[:, None, :], init_d, np.inf).argmin(-1)
    labels[~valid] = kmax  # the all-zero row of `eye`: padded steps belong to no cluster
    eye = np.eye(kmax + 1, kmax)
    # Lloyd iterations on the responses that have not converged yet: a converged response is a fixed
    # point (same labels, same centroids), so dropping it from the batch changes nothing.
    todo = np.arange(b)
    g, lab = gram, labels
    for _ in range(max_iter):
        W = eye[lab]  # (b', p, k) one-hot assignments
        counts = W.sum(1)  # reductions over axis 1 add rows in step order
        GW = np.matmul(g, W)
        safe = np.maximum(counts, 1.0)
        # ||x_i - c_j||^2 = <x_i,x_i> - 2 <x_i,c_j> + <c_j,c_j>, with c_j the mean of cluster j.
        cc = (W * GW).sum(1) / safe**2
        sq = np.diagonal(g, axis1=1, axis2=2)
        dist = sq[:, :, None] - 2.0 * GW / safe[:, None, :] + cc[:, None, :]
        dist[np.broadcast_to((counts == 0)[:, None, :] | ~active[todo][:, None, :], dist.shape)] = np.inf
        new = dist.argmin(-1)
        new[~valid[todo]] = kmax
        moved = (new != lab).any(1)
        labels[todo] = new
        if not moved.any():
            break
        if not moved.all():
            todo = todo[moved]
            g = gram[todo]
        lab = labels[todo]
    return labels


def _prim_mst(mr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prim's MST on b mutual-reachability matrices at once, visiting nodes in the
    order of scikit-learn's `mst_from_mutual_reachability` (start at 0, lowest index on ties).
    Padded nodes (infinite distance to every node) are visited last."""
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


def _hdbscan_chunk(gram: np.ndarray, ms: np.ndarray) -> list[np.ndarray]:
    """HDBSCAN labels of b responses padded to p steps (response i has ms[i] steps)."""
    b, p, _ = gram.shape
    d = _squared_distances(gram)
    np.sqrt(d, out=d)
    short = np.flatnonzero(ms < p)
    for r in short:  # padded steps are infinitely far from everything
        d[r, ms[r] :, :] = np.inf
        d[r, :, ms[r] :] = np.inf
    params = [hdbscan_params(int(m)) for m in ms]
    kth = sorted({ms_ - 1 for _, ms_ in params})
    part = np.partition(d, kth, axis=2)  # selection only: the core distances are exact values of d
    core = part[np.arange(b), :, [ms_ - 1 for _, ms_ in params]]  # (b, p)
    mr = np.maximum(core[:, :, None], core[:, None, :])
    np.maximum(mr, d, out=mr)
    src, dst, dist = _prim_mst(mr)
    out = []
    for r, m in enumerate(ms):
        mst = np.empty(m - 1, dtype=MST_edge_dtype)
        mst["current_node"], mst["next_node"], mst["distance"] = src[r, : m - 1], dst[r, : m - 1], dist[r, : m - 1]
        tree = make_single_linkage(mst[np.argsort(mst["distance"])])
        out.append(tree_to_labels(tree, params[r][0], "eom", False, 0.0, None)[0].astype(np.int64))
    return out


def _chunks(lengths: dict[int, int], chunk_steps: int, max_pad: float) -> list[list[int]]:
    """Responses (index -> steps) sorted by steps and cut into chunks of at most chunk_steps padded
    steps in all, each padded to its longest response, that longest at most max_pad times its shortest."""
    order = sorted(lengths, key=lambda i: (lengths[i], i))
    chunks: list[list[int]] = []
    current: list[int] = []
    for i in order:
        m = lengths[i]
        if current and ((len(current) + 1) * m > chunk_steps or m > max_pad * lengths[current[0]]):
            chunks.append(current)
            current = []
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


def _padded_gram(xs: list[np.ndarray], idx: list[int], p: int, dtype) -> np.ndarray:
    """Gram matrices of responses idx, zero-padded to p x p, in float64, one product X X^T per
    response in its own precision (or `dtype`): BLAS's symmetric rank-k update, the same call
    numpy makes for each matrix of a stacked product, so each Gram is the same whatever else the
    chunk holds and no stacked copy of the embeddings is made."""
    gram = np.zeros((len(idx), p, p), dtype=np.float64)
    for row, i in enumerate(idx):
        x = xs[i] if dtype is None else xs[i].astype(dtype, copy=False)
        x = np.ascontiguousarray(x)
        m = len(x)
        gram[row, :m, :m] = x @ x.T
    return gram


def cluster_batch(
    embeddings: Sequence[np.ndarray],
    method: str = "kmeans",
    seed: int = 0,
    max_iter: int = 300,
    k_rule: str = DEFAULT_K_RULE,
    chunk_steps: int = 8192,
) -> list[np.ndarray]:
    """One integer label per step for every response, batched over responses of similar length.

    HDBSCAN noise keeps label -1 here; the reasoning map treats it as one node (decisions §1).
    `k_rule` picks KMeans' cluster count (see `K_RULES`); HDBSCAN infers its own and
    accepts only the default. Responses are processed in chunks of at most `chunk_steps`
    padded steps (a longer response forms a chunk of its own), so memory is bounded by the
    chunk, not by the batch. The result for a response does not depend on the other
    responses in the batch.
    """
    if method not in METHODS:
        raise ValueError(f"clustering method {method!r} not found; choose one of: {', '.join(METHODS)}")
    check_k_rule(k_rule, method)
    xs = [_check(e, i) for i, e in enumerate(embeddings)]
    out: list[np.ndarray] = [np.zeros(len(x), dtype=np.int64) for x in xs]
    lengths = {i: len(x) for i, x in enumerate(xs) if len(x) >= 2}
    if len({x.shape[1] for i, x in enumerate(xs) if i in lengths}) > 1:
        raise ValueError("all embeddings must have the same dimension")
    kmax = max((kmeans_k(len(x), rule=k_rule) for x in xs), default=1) or 1
    # A fixed number of columns keeps every u[j, t] the same whatever kmax (numpy fills
    # row-major from one stream), so no response's draws depend on the batch.
    u = np.random.default_rng(seed).random((kmax, _U_COLUMNS))
    for idx in _chunks(lengths, chunk_steps, max_pad=1.25):
        ms = np.array([lengths[i] for i in idx])
        p = int(ms.max())
        # HDBSCAN distances in float64 as scikit-learn computes them (ties break alike);
        # KMeans keeps the embeddings' precision for the one large product.
        gram = _padded_gram(xs, idx, p, np.float64 if method == "hdbscan" else None)
        if method == "kmeans":
            # Only responses with (near-)coincident steps can have fewer distinct rows than steps.
            d2 = _squared_distances(gram)
            diag = np.arange(p)
            d2[:, diag, diag] = np.inf
            maybe_dup = [d2[r, :m, :m].min() < 1e-6 for r, m in enumerate(ms)]  # real steps only
            d2[:, diag, diag] = 0.0
            ks = np.array(
                [kmeans_k(m, _n_distinct(xs[i]) if dup else m, k_rule) for i, m, dup in zip(idx, ms, maybe_dup)]
            )
            labels = _kmeans_chunk(gram, d2, ms, ks, u, max_iter)
            for row, i in enumerate(idx):
                out[i] = labels[row, : ms[row]]
        else:
            for i, lab in zip(idx, _hdbscan_chunk(gram, ms)):
                out[i] = lab
    return out


def cluster_steps(
    embeddings: np.ndarray, method: str = "kmeans", seed: int = 0, k_rule: str = DEFAULT_K_RULE
) -> np.ndarray:
    """One integer label per step of one response (decisions §1.3 "Clustering")."""
    return cluster_batch([embeddings], method=method, seed=seed, k_rule=k_rule)[0]
