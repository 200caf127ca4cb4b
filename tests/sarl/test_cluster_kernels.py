"""The compiled structure-stage kernels (sarl.structure.kernels) against plain numpy references written from the same
definitions: KMeans labels and HDBSCAN's spanning tree equal bit for bit, whatever the batch."""

import math

import numpy as np
import pytest

from sarl.structure import gram as gram_module
from sarl.structure import kernels
from sarl.structure.cluster import _U_COLUMNS, cluster_batch, hdbscan_params, kmeans_k
from sarl.structure.gram import gram
from sarl.structure.kernels import hdbscan_mst, hdbscan_tree_labels, kmeans_labels, squared_distances


def reference_kmeans(x: np.ndarray, k: int, u: np.ndarray, max_iter: int = 300) -> np.ndarray:
    """Greedy k-means++ (scikit-learn's 2 + ln k local trials) and Lloyd's iterations in kernel form, in numpy
    one response at a time: the arithmetic sarl.structure.kernels.kmeans_labels compiles, from the same Gram matrix."""
    g = gram(np.ascontiguousarray(x)).astype(np.float64)
    m = len(x)
    sq = np.diagonal(g)
    d2 = np.maximum((sq[:, None] + sq[None, :]) - 2.0 * g, 0.0)
    np.fill_diagonal(d2, 0.0)
    trials = 2 + int(math.log(k))
    centers = [min(int(u[0, 0] * m), m - 1)]
    closest = np.where(d2[centers[0]] < 1e-12, 0.0, d2[centers[0]])
    for j in range(1, k):
        cum = np.cumsum(closest)
        cands = [int(np.argmax(cum > u[j, t] * cum[-1])) for t in range(trials)]
        rows = [np.where(d2[c] < 1e-12, 0.0, d2[c]) for c in cands]
        potentials = [np.cumsum(np.minimum(closest, r))[-1] for r in rows]
        best = int(np.argmin(potentials))
        centers.append(cands[best])
        closest = np.minimum(closest, rows[best])
    labels = d2[:, centers].argmin(1)
    for _ in range(max_iter):
        w = np.eye(k)[labels]
        counts = w.sum(0)
        gw = g @ w
        safe = np.maximum(counts, 1.0)
        cc = (w * gw).sum(0) / safe**2
        dist = sq[:, None] - 2.0 * gw / safe[None, :] + cc[None, :]
        dist[:, counts == 0] = np.inf
        new = dist.argmin(1)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels


def responses(rng, n, dim, dtype):
    out = []
    for _ in range(n):
        m = int(rng.integers(2, 120))
        if rng.random() < 0.5:  # planted functions
            k = kmeans_k(m)
            x = rng.normal(size=(k, dim))[rng.integers(0, k, m)] + 0.6 * rng.normal(size=(m, dim))
        else:
            x = rng.normal(size=(m, dim))
        if rng.random() < 0.15:  # repeated steps: k capped by the distinct rows
            x[: m // 2] = x[0]
        out.append((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(dtype))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kmeans_labels_equal_the_numpy_reference(dtype):
    rng = np.random.default_rng(11)
    xs = responses(rng, 150, 48, dtype)
    u = np.random.default_rng(4).random((kmeans_k(120), _U_COLUMNS))
    got = cluster_batch(xs, seed=4)
    for x, labels in zip(xs, got):
        k = kmeans_k(len(x), len(np.unique(x, axis=0)))
        np.testing.assert_array_equal(labels, reference_kmeans(x, k, u))
        assert len(np.unique(labels)) <= k


def test_kmeans_kernel_handles_the_edge_cases():
    u = np.random.default_rng(0).random((4, _U_COLUMNS))
    same = np.ones((5, 3), dtype=np.float32)  # every step the same: k = 1
    g = same @ same.T
    d2, min_off, finite = squared_distances(g)
    assert finite and min_off == 0.0 and not d2.any()
    assert kmeans_labels(g, d2, 1, u, 2, 300).tolist() == [0] * 5
    two = np.array([[1.0, 0.0], [0.0, 1.0]])
    g = two @ two.T
    d2, min_off, finite = squared_distances(g)
    assert min_off == pytest.approx(2.0) and kmeans_labels(g, d2, 2, u, 2, 300).tolist() in ([0, 1], [1, 0])
    bad = np.array([[np.nan, 0.0], [0.0, 1.0]])
    assert not squared_distances(bad @ bad.T)[2]


def test_embeddings_whose_squares_overflow_float32_are_clustered_in_float64():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(30, 16))
    big = (1e20 * x).astype(np.float32)  # finite, but every squared norm overflows float32
    labels = cluster_batch([big])[0]
    assert len(np.unique(labels)) == kmeans_k(30)
    with pytest.raises(ValueError, match="beyond float64's range"):
        cluster_batch([1e200 * x])
    with pytest.raises(ValueError, match=r"embeddings\[1\] contains NaN"):
        cluster_batch([x, np.full((1, 16), np.inf)])


def reference_mst(x: np.ndarray, min_samples: int):
    """scikit-learn's brute-force HDBSCAN path in numpy: `euclidean_distances` (its order of operations, norms
    by einsum as `row_norms`), core distances, mutual reachability, Prim's tree as
    `mst_from_mutual_reachability` builds it."""
    x = x.astype(np.float64)
    xx = np.einsum("ij,ij->i", x, x)
    d = -2 * (x @ x.T)
    d += xx[:, None]
    d += xx[None, :]
    d = np.sqrt(np.maximum(d, 0.0))
    np.fill_diagonal(d, 0.0)
    core = np.partition(d, min_samples - 1, axis=1)[:, min_samples - 1]
    mr = np.maximum(np.maximum(core[:, None], core[None, :]), d)
    m = len(x)
    in_tree, best, current, edges = np.zeros(m, bool), np.full(m, np.inf), 0, []
    for _ in range(m - 1):
        in_tree[current] = True
        best = np.minimum(best, mr[current])
        masked = np.where(in_tree, np.inf, best)
        nxt = int(masked.argmin())
        edges.append((current, nxt, masked[nxt]))
        current = nxt
    return edges


def tie_heavy(rng, n):
    """Responses whose distances tie often: small integer grids, repeated steps, tight clusters."""
    out = []
    for t in range(n):
        m = int(rng.integers(2, 90))
        if t % 3 == 0:
            x = rng.integers(0, 3, size=(m, 3)).astype(float)
        elif t % 3 == 1:
            x = rng.normal(size=(m, 4))
            x[: m // 3] = x[0]
        else:
            k = max(1, int(np.sqrt(m)))
            x = rng.normal(size=(k, 16))[rng.integers(0, k, m)] + 0.05 * rng.normal(size=(m, 16))
        out.append(x)
    return out


def test_hdbscan_tree_equals_the_numpy_reference():
    rng = np.random.default_rng(8)
    for x in responses(rng, 60, 24, np.float32) + tie_heavy(rng, 30):
        x64 = np.ascontiguousarray(x, dtype=np.float64)
        ms = hdbscan_params(len(x))[1]
        src, dst, dist = hdbscan_mst(x64 @ x64.T, np.einsum("ij,ij->i", x64, x64), ms)
        assert list(zip(src.tolist(), dst.tolist(), dist.tolist())) == reference_mst(x, ms)


def test_hdbscan_tree_labels_equal_scikit_learns_tree_routines():
    """The compiled single linkage, condensed tree and excess-of-mass selection against scikit-learn's own
    make_single_linkage + tree_to_labels on the same sorted spanning trees (ties included)."""
    from sklearn.cluster._hdbscan._linkage import MST_edge_dtype, make_single_linkage
    from sklearn.cluster._hdbscan._tree import tree_to_labels

    rng = np.random.default_rng(9)
    for x in tie_heavy(rng, 150) + responses(rng, 50, 8, np.float64):
        x = np.ascontiguousarray(x, dtype=np.float64)
        mcs, ms = hdbscan_params(len(x))
        src, dst, dist = hdbscan_mst(x @ x.T, np.einsum("ij,ij->i", x, x), ms)
        mst = np.empty(len(x) - 1, dtype=MST_edge_dtype)
        mst["current_node"], mst["next_node"], mst["distance"] = src, dst, dist
        order = np.argsort(mst["distance"])
        expected = tree_to_labels(make_single_linkage(mst[order]), mcs, "eom", False, 0.0, None)[0]
        np.testing.assert_array_equal(hdbscan_tree_labels(src[order], dst[order], dist[order], mcs), expected)


def test_hdbscan_labels_equal_scikit_learn_on_tie_heavy_data():
    import warnings

    from sklearn.cluster import HDBSCAN

    for x in tie_heavy(np.random.default_rng(10), 120):
        mcs, ms = hdbscan_params(len(x))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = HDBSCAN(min_cluster_size=mcs, min_samples=ms, algorithm="brute").fit(x).labels_
        np.testing.assert_array_equal(cluster_batch([x], method="hdbscan")[0], expected)


@pytest.mark.parametrize("method", ["kmeans", "hdbscan"])
def test_labels_do_not_depend_on_the_batch(method):
    rng = np.random.default_rng(5)
    embs = []
    for m in [2, 3, 5, 9, 10, 11, 12, 13, 30, 33, 35, 60]:
        x = rng.normal(size=(m, 24)).astype(np.float32)
        embs.append(x / np.linalg.norm(x, axis=1, keepdims=True))
    embs.append(np.repeat(embs[4][:3], 4, axis=0))  # duplicate steps: k capped by distinct rows
    alone = [cluster_batch([x], method=method)[0] for x in embs]
    for order in (range(len(embs)), reversed(range(len(embs)))):
        order = list(order)
        got = cluster_batch([embs[i] for i in order], method=method)
        assert all(np.array_equal(alone[i], g) for i, g in zip(order, got))


GRAM_VARIANTS = {
    "4x4": kernels.compiled(gram_module._GRAM_SIGNATURES, fastmath=gram_module._DOT)(gram_module._gram_4x4),
    "4x2": kernels.compiled(gram_module._GRAM_SIGNATURES, fastmath=gram_module._DOT)(gram_module._gram_4x2),
}


@pytest.mark.parametrize("variant", ["gram", *GRAM_VARIANTS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_products_equal_numpys_to_rounding_and_are_exactly_symmetric(variant, dtype):
    """kmeans_labels reads G by rows where the sums need columns, so G must be exactly symmetric; both block shapes
    (the one this machine does not use included) give X X^T to the rounding of a sum over d, in the input's precision,
    and the same bits whatever else was computed before."""
    fn = gram if variant == "gram" else GRAM_VARIANTS[variant]
    rng = np.random.default_rng(1)
    eps = np.finfo(dtype).eps
    for m in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 80, 401):
        for d in (1, 7, 96, 1024):
            x = np.ascontiguousarray(rng.normal(size=(m, d)).astype(dtype))
            g = fn(x)
            assert g.dtype == dtype and g.shape == (m, m)
            assert np.array_equal(g, g.T)
            exact = x.astype(np.longdouble) @ x.T.astype(np.longdouble)
            bound = 4 * d * eps * np.sqrt(np.outer(np.diagonal(exact), np.diagonal(exact)))  # |sum| <= |x_i| |x_j|
            assert (np.abs(g - exact) <= bound + np.finfo(dtype).tiny).all(), (variant, dtype, m, d)
            assert np.array_equal(fn(x.copy()), g)  # a fresh copy (other alignment): the same bits
            frozen = x.copy()
            frozen.setflags(write=False)  # as np.frombuffer or a read-only memory map gives them
            assert np.array_equal(fn(frozen), g)


@pytest.mark.parametrize("method", ["kmeans", "hdbscan"])
def test_read_only_embeddings_cluster_as_writable_ones(method):
    rng = np.random.default_rng(5)
    xs = [rng.normal(size=(m, 40)).astype(dtype) for m in (2, 9, 31) for dtype in (np.float32, np.float64)]
    frozen = [x.copy() for x in xs]
    for x in frozen:
        x.setflags(write=False)
    for a, b in zip(cluster_batch(xs, method=method), cluster_batch(frozen, method=method)):
        np.testing.assert_array_equal(a, b)


def test_gram_keeps_nan_and_infinity_on_the_diagonal():
    """Reassociation only: a NaN or an infinity in a step still makes its diagonal entry non-finite (the check
    squared_distances relies on), and float32 squares that overflow give infinity, not a wrapped value."""
    for dtype in (np.float32, np.float64):
        for bad in (np.nan, np.inf, -np.inf):
            x = np.ones((6, 33), dtype=dtype)
            x[4, 17] = bad
            g = gram(x)
            assert not np.isfinite(g[4, 4]) and np.isfinite(np.delete(np.diagonal(g), 4)).all()
            assert not squared_distances(g)[2]
    big = np.full((5, 8), 1e20, dtype=np.float32)
    assert np.isinf(np.diagonal(gram(big))).all()


def test_kernels_compile_in_memory_where_no_cache_directory_is_writable(monkeypatch):
    import sarl.structure.kernels as kernels

    real = kernels.njit

    def njit_without_cache(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file 'f.py'")
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "njit", njit_without_cache)

    @kernels.compiled("i8(i8)")
    def twice(x):
        return 2 * x

    assert twice(21) == 42
