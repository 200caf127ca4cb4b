"""Per-response clustering of step embeddings into latent reasoning functions
(SARL Sec. 3.2 Eq. 3, App. A.1; decisions §1.3 "Clustering").

Each response is clustered on its own Gram matrix G = X X^T (the one product whose cost grows
with the embedding dimension: a compiled kernel for KMeans, `sarl.structure.gram.gram`; BLAS in
float64 for HDBSCAN, as scikit-learn computes it); everything after it works on M x M matrices
in loops compiled by numba (`sarl.structure.kernels`, `sarl.structure.hdbscan_kernels`), so the
cost per response is the product plus a few M^2 passes, memory is a few M x M arrays, and a
response's labels never depend on the other responses in the batch. Finiteness is checked on G's
diagonal.

- KMeans: k = min(M, max(1, rule(M)), #distinct embeddings) with decisions §1's rule
  round(sqrt(M)) by default (`k_rule`, see `K_RULES` for the ablation's others);
  greedy k-means++ seeding from a fixed seed (draws shared by every response), then
  Lloyd iterations to convergence, written in kernel form (centroid distances from G).
- HDBSCAN: Euclidean distance, min_cluster_size = max(2, min(5, floor(M/4))),
  min_samples = max(1, min_cluster_size - 1). Distances (in scikit-learn's order of
  operations), core distances, mutual reachability, Prim's minimum spanning tree (as
  scikit-learn's `mst_from_mutual_reachability` visits nodes, so ties break the same
  way), the single-linkage tree, condensed tree, excess-of-mass selection and labelling
  are compiled ports of scikit-learn's routines; the edges are sorted by numpy's argsort
  as scikit-learn sorts them. Labels equal `sklearn.cluster.HDBSCAN(algorithm="brute")`.

`sarl.structure.reference` writes the same clustering the obvious way (numpy, plain Python, scikit-learn's public
`HDBSCAN`), one function beside each compiled one; tests/sarl/test_cluster_reference.py holds them equal.

The compiled kernels (numba's, `KERNEL_MODULES`) are imported on first use, not with this module:
`from sarl import StructureReward` loads neither numba nor scikit-learn. `load_kernels` loads them
(~0.5 s: numba's import and the kernels from its on-disk cache); `StructureReward` calls it when it is built.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from sarl.contract.threads import limited, run_each

# One edge of HDBSCAN's minimum spanning tree, the record scikit-learn sorts: its private
# `sklearn.cluster._hdbscan._linkage.MST_edge_dtype` (scikit-learn 1.6-1.9, pyproject's pin) restated with the same
# fields, types and order, so that `np.argsort` of the distance field orders tied edges as scikit-learn's own call.
MST_EDGE_DTYPE = np.dtype([("current_node", np.int64), ("next_node", np.int64), ("distance", np.float64)])


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


def kmeans_draws(seed: int, rows: int) -> np.ndarray:
    """The uniform draws of greedy k-means++ (Arthur & Vassilvitskii 2007) for up to `rows` centres: row j holds
    centre j's, one per local trial. numpy fills the array row-major from one stream and the number of columns is
    fixed, so row j is the same whatever `rows` (no response's draws depend on the batch's largest k)."""
    return np.random.default_rng(seed).random((rows, _U_COLUMNS))


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


def method_k_rule(method: str, k_rule: str) -> str:
    """The k rule `method` clusters with, given a reward's `k_rule`: that rule for KMeans; HDBSCAN infers its own
    number of clusters (the default rule, the only one it accepts)."""
    return k_rule if method == "kmeans" else DEFAULT_K_RULE


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
    """A 2-D float32/float64 array; finiteness is checked on its Gram matrix (`_gram`)."""
    x = np.asarray(embeddings)
    if x.size == 0:
        return np.zeros((0, x.shape[-1] if x.ndim == 2 else 0))
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim != 2:
        raise ValueError(f"embeddings[{i}] must be a 2-D array (steps x dim), got shape {x.shape}")
    if len(x) == 1 and not np.isfinite(x).all():  # no Gram matrix is made for one step
        raise ValueError(f"embeddings[{i}] contains NaN or infinite values")
    return x


def _gram(x: np.ndarray, i: int, dtype=None) -> np.ndarray:
    """X X^T of response i in its own precision (or `dtype`). A NaN or infinity in X makes a diagonal
    entry (a sum of squares) non-finite, so the M diagonal entries stand for the M x d check; a finite X
    whose squares overflow float32 is multiplied again in float64."""
    x = np.ascontiguousarray(x if dtype is None else x.astype(dtype, copy=False))
    with np.errstate(over="ignore", invalid="ignore"):  # overflow and NaN are found on the diagonal
        g = x @ x.T
    if not np.isfinite(np.diagonal(g)).all():
        if not np.isfinite(x).all():
            raise ValueError(f"embeddings[{i}] contains NaN or infinite values")
        x = x.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            g = x @ x.T
        if not np.isfinite(np.diagonal(g)).all():
            raise ValueError(f"embeddings[{i}] has squared norms beyond float64's range; normalise the embeddings")
    return g


def _n_distinct(x: np.ndarray) -> int:
    """Number of distinct rows, compared bytewise."""
    rows = np.ascontiguousarray(x).view(np.dtype((np.void, x.dtype.itemsize * x.shape[1])))
    return len(np.unique(rows))


# The modules of compiled kernels, imported on first use (`load_kernels`).
KERNEL_MODULES = ("sarl.structure.kernels", "sarl.structure.gram", "sarl.structure.hdbscan_kernels")


def load_kernels() -> None:
    """Imports the compiled kernels (KERNEL_MODULES): numba's import and the kernels loaded from its on-disk cache,
    ~0.5 s (compiled into it once per installation, a few seconds). `StructureReward` calls it when it is built, so
    that no reward call pays for it."""
    for module in KERNEL_MODULES:
        importlib.import_module(module)


def mst_edge_order(src: np.ndarray, dst: np.ndarray, dist: np.ndarray) -> np.ndarray:
    """The order scikit-learn sorts the spanning tree's edges in before its single linkage: `np.argsort` of the
    distance field of its edge records (numpy's default sort, so ties keep the order it gives them)."""
    mst = np.empty(len(src), dtype=MST_EDGE_DTYPE)
    mst["current_node"], mst["next_node"], mst["distance"] = src, dst, dist
    return np.argsort(mst["distance"])


def _hdbscan_labels(x: np.ndarray, g: np.ndarray, m: int) -> np.ndarray:
    """HDBSCAN labels of one response's m steps (float64 `x`, Gram matrix `g`) as `HDBSCAN(algorithm="brute")` runs
    them (SARL App. A.1; Campello et al. 2013): the minimum spanning tree of the mutual-reachability graph
    (`sarl.structure.hdbscan_kernels.hdbscan_mst`), its edges sorted as scikit-learn sorts them (`mst_edge_order`),
    then single linkage, condensed tree, excess of mass and labelling (`hdbscan_kernels.hdbscan_tree_labels`)."""
    # deferred: numba and the compiled kernels (~0.5 s), not paid by `from sarl import StructureReward`
    from sarl.structure.hdbscan_kernels import hdbscan_mst, hdbscan_tree_labels

    min_cluster_size, min_samples = hdbscan_params(m)
    src, dst, dist = hdbscan_mst(g, np.einsum("ij,ij->i", x, x), min_samples)  # row_norms as scikit-learn
    order = mst_edge_order(src, dst, dist)
    return hdbscan_tree_labels(src[order], dst[order], dist[order], min_cluster_size)


@dataclass(frozen=True)
class Shared:
    """What a response's labels may depend on besides its own steps, the same for every response of a batch: the
    seeded k-means++ draws (row j whatever the batch's largest k), KMeans' k per step count, the k rule, the
    iteration cap."""

    draws: np.ndarray
    k_of: dict[int, int]
    k_rule: str
    max_iter: int


def kmeans_response(x: np.ndarray, i: int, shared: Shared) -> np.ndarray:
    """KMeans labels of response i's steps (M >= 2): its Gram matrix, then the compiled greedy k-means++ seeding and
    Lloyd iterations (`sarl.structure.kernels`)."""
    # deferred (both): numba and the compiled kernels (~0.5 s), not paid by `from sarl import StructureReward`
    from sarl.structure.gram import gram
    from sarl.structure.kernels import kmeans_labels, squared_distances

    g = gram(x)
    d2, min_off, finite = squared_distances(g)
    if not finite:  # NaN or infinity in X (ValueError), or float32 squares that overflow: float64 decides
        g = _gram(x, i, np.float64)
        d2, min_off, _ = squared_distances(g)
    # Only a response with (near-)coincident steps can have fewer distinct rows than steps.
    k = kmeans_k(len(x), _n_distinct(x), shared.k_rule) if min_off < 1e-6 else shared.k_of[len(x)]
    n_trials = 2 + int(math.log(k))  # scikit-learn's local trials of greedy k-means++
    if n_trials > _U_COLUMNS:
        raise ValueError(f"k = {k} clusters needs {n_trials} k-means++ trials; at most {_U_COLUMNS} are drawn")
    return kmeans_labels(g, d2, k, shared.draws, n_trials, shared.max_iter)


def hdbscan_response(x: np.ndarray, i: int, shared: Shared) -> np.ndarray:
    """HDBSCAN labels of response i's steps (M >= 2), distances in float64 as scikit-learn computes them (ties break
    alike); noise keeps -1."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    return _hdbscan_labels(x, _gram(x, i), len(x))


# The clustering methods by name (`reward.clustering`): a response's steps (M >= 2), its index in the batch (for
# messages) and the batch's `Shared` -> one integer label per step. `sarl.structure.reference.REFERENCE` holds the
# plain version of each, and tests/sarl/test_cluster_reference.py holds the two equal (CONTRIBUTING.md).
LABELERS: dict[str, Callable[[np.ndarray, int, Shared], np.ndarray]] = {
    "kmeans": kmeans_response,
    "hdbscan": hdbscan_response,
}


def method_labeler(method: str) -> Callable[[np.ndarray, int, Shared], np.ndarray]:
    """The labeler of `method`, or a ValueError naming the methods there are."""
    if method not in LABELERS:
        raise ValueError(f"clustering method {method!r} not found; choose one of: {', '.join(LABELERS)}")
    return LABELERS[method]


def cluster_batch(
    embeddings: Sequence[np.ndarray],
    method: str = "kmeans",
    seed: int = 0,
    max_iter: int = 300,
    k_rule: str = DEFAULT_K_RULE,
    threads: int | None = 1,
) -> list[np.ndarray]:
    """One integer label per step for every response.

    HDBSCAN noise keeps label -1 here; the reasoning map treats it as one node (decisions §1).
    `k_rule` picks KMeans' cluster count (see `K_RULES`); HDBSCAN infers its own and
    accepts only the default. Responses are clustered one at a time (memory: a few M x M
    arrays of the response at hand), and the result for a response does not depend on the
    other responses in the batch. `threads` > 1: that many responses at a time, side by side
    (`sarl.contract.threads.run_each`), each with a one-thread BLAS; the labels are the same.
    """
    labeler = method_labeler(method)
    check_k_rule(k_rule, method)
    xs = [_check(e, i) for i, e in enumerate(embeddings)]
    out: list[np.ndarray] = [np.zeros(len(x), dtype=np.int64) for x in xs]
    lengths = {i: len(x) for i, x in enumerate(xs) if len(x) >= 2}
    if len({x.shape[1] for i, x in enumerate(xs) if i in lengths}) > 1:
        raise ValueError("all embeddings must have the same dimension")
    k_of = {m: kmeans_k(m, rule=k_rule) for m in {len(x) for x in xs}}
    kmax = max(k_of.values(), default=1) or 1
    shared = Shared(kmeans_draws(seed, kmax), k_of, k_rule, max_iter)  # row j the same whatever kmax

    def one(i: int) -> None:
        out[i] = labeler(xs[i], i, shared)

    for i in lengths:
        xs[i] = np.ascontiguousarray(xs[i])
    if (threads or 1) > 1 and len(lengths) > 1:
        with limited(1):  # `threads` responses at a time, one BLAS thread each: no more threads than asked for
            run_each(list(lengths), one, threads)
    else:
        run_each(list(lengths), one, 1)
    return out


def cluster_steps(
    embeddings: np.ndarray, method: str = "kmeans", seed: int = 0, k_rule: str = DEFAULT_K_RULE
) -> np.ndarray:
    """One integer label per step of one response (decisions §1.3 "Clustering")."""
    return cluster_batch([embeddings], method=method, seed=seed, k_rule=k_rule)[0]
