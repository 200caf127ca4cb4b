"""The clustering of the structure reward written the obvious way: the plain reference of every compiled kernel of
`sarl.structure.cluster` (SARL Sec. 3.2 Eq. 3, App. A.1; decisions §1.3 "Clustering"), in numpy and plain Python,
one function beside each compiled one and named after it, with the same arguments and the same results.
tests/sarl/test_cluster_reference.py holds each pair equal (bit for bit, label for label) on random and adversarial
responses: ties, duplicate steps, all-identical steps, two to five steps.

- `gram`: `sarl.structure.gram.gram` (equal to rounding: the kernel sums each dot product in another order);
- `squared_distances`, `kmeans_labels`: `sarl.structure.kernels`'s;
- `hdbscan_mst`, `hdbscan_tree_labels`: `sarl.structure.hdbscan_kernels`'s;
- `cluster_steps`: `sarl.structure.cluster.cluster_steps`, the whole clustering of one response;
- `sklearn_hdbscan_labels`: scikit-learn's public `HDBSCAN(algorithm="brute")`, whose labels both HDBSCANs equal.

The reasoning map's reference is `sarl.structure.graph`'s networkx functions (compiled:
`sarl.structure.kernels.graph_metrics_flat`), the step norm's `sarl.structure.embed.base.row_norms` (compiled:
`sarl.structure.kernels.normalise_rows`). Slow (Python loops over a response's steps): for tests and the bench,
never the reward's path. scikit-learn is imported only by `sklearn_hdbscan_labels`.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from sarl.structure.cluster import (
    DEFAULT_K_RULE,
    check_k_rule,
    hdbscan_params,
    kmeans_draws,
    kmeans_k,
    method_labeler,
)

# Distances below this count as duplicates in the k-means++ seeding (as the compiled `_ZERO`).
DUPLICATE = 1e-12


def gram(x: np.ndarray) -> np.ndarray:
    """X X^T of one response by numpy (BLAS), in X's precision (SARL App. A.1: the distances of Eq. 3 come from it).
    Mirrors `sarl.structure.gram.gram`, which sums each dot product in another order: equal to rounding. Squares that
    overflow give infinity (`cluster_steps` then multiplies again in float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x @ x.T


def squared_distances(g: np.ndarray) -> tuple[np.ndarray, float, bool]:
    """(D, min_off, finite) from a Gram matrix: D_ij = ||x_i - x_j||^2 = (G_ii + G_jj) - 2 G_ij in float64, clipped
    at 0, zero diagonal; min_off the smallest off-diagonal entry (inf for one step); finite whether every G_ii is.
    Mirrors `sarl.structure.kernels.squared_distances`."""
    g = g.astype(np.float64)
    sq = np.diagonal(g)
    with np.errstate(invalid="ignore"):  # inf - inf where G is not finite: D is then not used
        d2 = (sq[:, None] + sq[None, :]) - 2.0 * g  # ||x_i||^2 + ||x_j||^2 - 2 <x_i, x_j> (SARL Eq. 3's distances)
    d2 = np.where(d2 < 0.0, 0.0, d2)
    np.fill_diagonal(d2, 0.0)
    off = d2[~np.eye(len(g), dtype=bool)]
    return d2, float(off.min(initial=np.inf)), bool(np.isfinite(sq).all())


def kmeans_labels(g: np.ndarray, d2: np.ndarray, k: int, u: np.ndarray, n_trials: int, max_iter: int) -> np.ndarray:
    """KMeans labels 0..k-1 of one response (SARL Eq. 3, App. A.1: k clusters of the step embeddings) from its Gram
    matrix `g` and squared distances `d2`: greedy k-means++ seeding (Arthur & Vassilvitskii 2007) from the draws `u`
    with `n_trials` candidates a centre, then Lloyd's iterations in kernel form until no label moves or `max_iter`.
    Mirrors `sarl.structure.kernels.kmeans_labels`: the same sums in the same order, the first best on ties."""
    m = len(g)
    if k <= 1 or m < 2:
        return np.zeros(m, dtype=np.int64)
    g = g.astype(np.float64)

    def without_duplicates(row: np.ndarray) -> np.ndarray:
        return np.where(row < DUPLICATE, 0.0, row)

    # Seeding: the first centre uniform; each next one the best of n_trials candidates drawn with probability
    # D(x)^2 (k-means++, Arthur & Vassilvitskii 2007), best = the lowest potential sum_i min(D(x_i)^2, d(x_i, c)^2).
    centers = [min(int(u[0, 0] * m), m - 1)]
    closest = without_duplicates(d2[centers[0]])
    for j in range(1, k):
        cum = np.cumsum(closest)
        candidates = [int(np.argmax(cum > u[j, t] * cum[-1])) for t in range(n_trials)]  # none passes: step 0
        rows = [without_duplicates(d2[c]) for c in candidates]
        potentials = [np.cumsum(np.minimum(closest, row))[-1] for row in rows]  # summed in step order
        best = int(np.argmin(potentials))
        centers.append(candidates[best])
        closest = np.minimum(closest, rows[best])
    labels = d2[:, centers].argmin(axis=1)
    # Lloyd's iterations in kernel form: ||x_i - c_j||^2 = G_ii - 2 S_ij / n_j + (sum_{l in j} S_lj) / n_j^2 with
    # S_ij = sum_{l in j} G_il (the centroid c_j is the mean of cluster j's steps; SARL App. A.1's KMeans).
    sq = np.diagonal(g)
    for _ in range(max_iter):
        counts = np.bincount(labels, minlength=k).astype(np.float64)
        s = np.zeros((k, len(g)))
        np.add.at(s, labels, g)  # s[j] += row l of G for each step l of cluster j, in step order
        cc = np.zeros(k)
        np.add.at(cc, labels, s[labels, np.arange(m)])  # sum_{l in j} S_lj, in step order
        safe = np.maximum(counts, 1.0)
        cc = cc / (safe * safe)
        dist = (sq[:, None] - 2.0 * s.T / safe[None, :]) + cc[None, :]
        dist[:, counts == 0.0] = np.inf  # an empty cluster takes no step
        new = dist.argmin(axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels.astype(np.int64)


def hdbscan_mst(g: np.ndarray, xx: np.ndarray, min_samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source, target, distance) of the m - 1 edges, in Prim's order, of the minimum spanning tree of the
    mutual-reachability graph (HDBSCAN, Campello et al. 2013; SARL App. A.1) of the steps whose float64 Gram matrix
    is `g` and squared norms `xx`. Mirrors `sarl.structure.hdbscan_kernels.hdbscan_mst`, which is scikit-learn's
    `euclidean_distances`, core distances and `mst_from_mutual_reachability` of `HDBSCAN(algorithm="brute")`."""
    m = len(g)
    v = (-2.0 * g + xx[:, None]) + xx[None, :]  # scikit-learn's order of operations: -2 <x_i, x_j> + |x_i|^2 + |x_j|^2
    d = np.sqrt(np.where(v > 0.0, v, 0.0))
    np.fill_diagonal(d, 0.0)
    core = np.sort(d, axis=1)[:, min_samples - 1]  # core distance: the min_samples-th nearest, the step included
    reach = np.maximum(np.maximum(core[:, None], core[None, :]), d)  # mutual reachability (Campello et al. 2013)
    # Prim's algorithm from step 0: the closest step not in the tree (lowest index on ties) joins it, its edge
    # recorded from the step added last.
    in_tree, best, current = np.zeros(m, dtype=bool), np.full(m, np.inf), 0
    src, dst, dist = [], [], []
    for _ in range(m - 1):
        in_tree[current] = True
        best = np.minimum(best, reach[current])
        remaining = np.where(in_tree, np.inf, best)
        nxt = int(remaining.argmin())
        src.append(current)
        dst.append(nxt)
        dist.append(remaining[nxt])
        current = nxt
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(dist, dtype=np.float64)


def hdbscan_tree_labels(src: np.ndarray, dst: np.ndarray, dist: np.ndarray, min_cluster_size: int) -> np.ndarray:
    """HDBSCAN's labels (-1: noise) from the minimum spanning tree's edges sorted by distance (Campello et al. 2013;
    SARL App. A.1): the single-linkage hierarchy, the tree condensed at `min_cluster_size`, each cluster's stability,
    excess-of-mass selection (never the root) and each point's label. Mirrors
    `sarl.structure.hdbscan_kernels.hdbscan_tree_labels`, which ports scikit-learn's `make_single_linkage` and
    `tree_to_labels(..., "eom", allow_single_cluster=False)`."""
    n = len(src) + 1
    # Single linkage: the i-th edge joins the two clusters its ends are in, as node n + i, at its distance.
    top = list(range(2 * n - 1))  # top[a] == a: a is not merged yet

    def merged(a: int) -> int:
        while top[a] != a:
            a = top[a]
        return a

    children: dict[int, tuple[int, int]] = {}
    size, height = [1] * n + [0] * (n - 1), [0.0] * (2 * n - 1)
    for i, (a, b, d) in enumerate(zip(src.tolist(), dst.tolist(), dist.tolist())):
        left, right = merged(a), merged(b)
        children[n + i] = (left, right)
        size[n + i], height[n + i] = size[left] + size[right], d
        top[left] = top[right] = n + i

    def below(node: int, kids: dict[int, tuple[int, ...]]) -> list[int]:
        """`node` and the nodes under it in `kids`, breadth first, left before right."""
        out, queue = [], deque([node])
        while queue:
            out.append(queue.popleft())
            queue.extend(kids.get(out[-1], ()))
        return out

    # Condensed tree: from the root down, a merge of two sides of at least min_cluster_size points is a split into
    # two new clusters; a smaller side's points fall out of the cluster at lambda = 1 / distance, a larger one goes on
    # as the same cluster. Rows (parent cluster, child cluster or point, lambda, size); clusters numbered from n.
    root = 2 * n - 2
    cluster_of, next_id = {root: n}, n + 1
    rows: list[tuple[int, int, float, int]] = []
    fallen: set[int] = set()
    for node in below(root, children):
        if node < n or node in fallen:
            continue
        lam = 1.0 / height[node] if height[node] > 0.0 else np.inf
        sides = children[node]
        if all(size[side] >= min_cluster_size for side in sides):
            for side in sides:
                cluster_of[side], next_id = next_id, next_id + 1
                rows.append((cluster_of[node], cluster_of[side], lam, size[side]))
            continue
        for side in sides:
            if size[side] >= min_cluster_size:
                cluster_of[side] = cluster_of[node]
                continue
            for sub in below(side, children):
                if sub < n:
                    rows.append((cluster_of[node], sub, lam, 1))
                fallen.add(sub)
    # Stability of cluster C: sum over its rows of (lambda - lambda_birth(C)) x size (Campello et al. 2013).
    birth = {n: 0.0, **{child: lam for _, child, lam, _ in rows if child >= n}}
    stability: dict[int, float] = {}
    for parent, _, lam, count in rows:
        stability[parent] = stability.get(parent, 0.0) + (lam - birth[parent]) * count
    # Excess of mass: from the last cluster back to the root's children, a cluster is kept unless its two child
    # clusters are together more stable (then it passes their sum up); a kept one drops every cluster under it.
    kids: dict[int, tuple[int, ...]] = {}
    parent_of: dict[int, int] = {}
    for parent, child, _, _ in rows:
        if child >= n:
            kids[parent] = kids.get(parent, ()) + (child,)
            parent_of[child] = parent
    clusters = sorted(stability)
    selected = {c: c != n for c in clusters}
    for c in reversed(clusters[1:]):
        subtree = sum(stability[kid] for kid in kids.get(c, ()))
        if subtree > stability[c]:
            selected[c], stability[c] = False, subtree
        else:
            for sub in below(c, kids)[1:]:
                selected[sub] = False
    # Labels: a point belongs to the first selected cluster at or above the one it fell out of; none: noise.
    number = {c: i for i, c in enumerate(c for c in clusters if selected[c])}
    labels = np.full(n, -1, dtype=np.int64)
    for parent, point, _, _ in rows:
        if point < n:
            c = parent
            while c != n and not selected[c]:
                c = parent_of[c]
            labels[point] = number.get(c, -1)
    return labels


def _n_distinct(x: np.ndarray) -> int:
    """Distinct steps, compared byte for byte (as `sarl.structure.cluster`)."""
    return len({row.tobytes() for row in x})


def kmeans_reference(x: np.ndarray, seed: int, k_rule: str, max_iter: int, gram=gram) -> np.ndarray:
    """KMeans of one response's M >= 2 steps: k = the k rule's, capped at the distinct steps, greedy k-means++ from
    the seeded draws, then Lloyd iterations (`sarl.structure.cluster.kmeans_response`)."""
    g = gram(np.ascontiguousarray(x))
    d2, _, finite = squared_distances(g)
    if not finite:  # finite steps whose squares overflow float32: float64
        g = gram(np.ascontiguousarray(x, dtype=np.float64))
        d2, _, finite = squared_distances(g)
        if not finite:
            raise ValueError("embeddings have squared norms beyond float64's range; normalise the embeddings")
    k = kmeans_k(len(x), _n_distinct(x), k_rule)
    n_trials = 2 + int(math.log(k))  # scikit-learn's local trials of greedy k-means++
    return kmeans_labels(g, d2, k, kmeans_draws(seed, k), n_trials, max_iter)


def hdbscan_reference(x: np.ndarray, seed: int, k_rule: str, max_iter: int, gram=gram) -> np.ndarray:
    """HDBSCAN of one response's M >= 2 steps with `hdbscan_params`, distances in float64 as scikit-learn computes
    them (`sarl.structure.cluster.hdbscan_response`)."""
    x = x.astype(np.float64)
    min_cluster_size, min_samples = hdbscan_params(len(x))
    src, dst, dist = hdbscan_mst(x @ x.T, np.einsum("ij,ij->i", x, x), min_samples)
    order = np.argsort(dist)  # numpy's default sort, as scikit-learn sorts its edges
    return hdbscan_tree_labels(src[order], dst[order], dist[order], min_cluster_size)


# The plain version of each method of `sarl.structure.cluster.LABELERS`, by the same name.
REFERENCE = {"kmeans": kmeans_reference, "hdbscan": hdbscan_reference}


def cluster_steps(
    embeddings: np.ndarray,
    method: str = "kmeans",
    seed: int = 0,
    k_rule: str = DEFAULT_K_RULE,
    max_iter: int = 300,
    gram=gram,
) -> np.ndarray:
    """One label per step of one response (SARL Eq. 3, App. A.1; decisions §1.3) by `REFERENCE[method]`; fewer than
    two steps: one cluster. Mirrors `sarl.structure.cluster.cluster_steps`. `gram` makes the KMeans Gram matrix:
    numpy's product by default, whose rounding can break a near tie otherwise than the compiled kernel's; pass
    `sarl.structure.gram.gram` for the compiled path's labels exactly."""
    method_labeler(method)  # the same methods as the compiled path, the same error
    if method not in REFERENCE:
        raise ValueError(f"clustering method {method!r} has no plain version in sarl.structure.reference.REFERENCE")
    check_k_rule(k_rule, method)
    x = np.asarray(embeddings)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.size and x.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D array (steps x dim), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("embeddings contain NaN or infinite values")
    if len(x) < 2:
        return np.zeros(len(x), dtype=np.int64)
    return REFERENCE[method](x, seed=seed, k_rule=k_rule, max_iter=max_iter, gram=gram)


def sklearn_hdbscan_labels(embeddings: np.ndarray, algorithm: str = "brute") -> np.ndarray:
    """scikit-learn's public `HDBSCAN` with decisions §1.3's parameters (SARL App. A.1), one response: the labels
    `cluster_steps(x, "hdbscan")` and the compiled path equal with `algorithm="brute"`."""
    import warnings

    from sklearn.cluster import HDBSCAN  # deferred: scikit-learn's import (~1 s), for the reference only

    x = np.asarray(embeddings)
    if len(x) < 2:
        return np.zeros(len(x), dtype=np.int64)
    min_cluster_size, min_samples = hdbscan_params(len(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples, algorithm=algorithm)
        return model.fit(x).labels_.astype(np.int64)
