"""The compiled clustering against its plain reference (`sarl.structure.reference`): each kernel equal to the
reference function beside it, bit for bit or label for label, on random responses and adversarial ones (distances
that tie, duplicate steps, all-identical steps, zero steps, two to five steps, squares that overflow float32), and
both HDBSCANs equal to scikit-learn's public `HDBSCAN(algorithm="brute")`."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarl.structure import reference
from sarl.structure.cluster import cluster_steps, hdbscan_params, kmeans_draws, kmeans_k, mst_edge_order
from sarl.structure.gram import gram
from sarl.structure.hdbscan_kernels import hdbscan_mst, hdbscan_tree_labels
from sarl.structure.kernels import kmeans_labels, squared_distances


def random_responses(rng, n, dim, dtype):
    """Unit-norm responses of 2-119 steps: planted functions or none, some with half their steps repeated."""
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


def adversarial(rng):
    """Two to 40 steps: all identical, all zero, 0.0 beside -0.0, two points repeated, a line of equally spaced
    steps, random, and float32 steps whose squares overflow."""
    out = []
    for m in (2, 3, 4, 5, 6, 8, 9, 17, 40):
        pairs = np.repeat(rng.normal(size=(2, 5)), (m + 1) // 2, axis=0)[:m]
        signed_zero = np.tile([[1.0, 0.0]], (m, 1))
        signed_zero[::2, 1] = -0.0
        out += [np.ones((m, 4)), np.zeros((m, 3)), signed_zero, pairs, np.arange(m, dtype=float)[:, None]]
        out += [rng.normal(size=(m, 2)), (1e20 * rng.normal(size=(m, 6))).astype(np.float32)]
    return out


RNG = np.random.default_rng(11)
RESPONSES = random_responses(RNG, 60, 24, np.float32) + random_responses(RNG, 30, 48, np.float64)
HARD = tie_heavy(RNG, 90) + adversarial(RNG)


def kmeans_inputs(x):
    """(G, D, k, u, trials) as `cluster_batch` gives them to `kmeans_labels` for one response."""
    g = gram(np.ascontiguousarray(x))
    d2, _, finite = squared_distances(g)
    if not finite:
        g = gram(np.ascontiguousarray(x, dtype=np.float64))
        d2 = squared_distances(g)[0]
    k = kmeans_k(len(x), len({row.tobytes() for row in x}))
    return g, d2, k, kmeans_draws(4, k), 2 + int(math.log(k))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_gram_kernel_equals_numpys_product_to_rounding(dtype):
    """The one pair not equal bit for bit: the kernel sums each dot product in another order than BLAS (its own
    test, against long double: tests/sarl/test_cluster_kernels.py)."""
    eps = np.finfo(dtype).eps
    for x in RESPONSES:
        x = np.ascontiguousarray(x, dtype=dtype)
        g, r = gram(x), reference.gram(x)
        norms = np.sqrt(np.outer(np.diagonal(r), np.diagonal(r)))
        assert g.dtype == r.dtype and (np.abs(g - r) <= 8 * x.shape[1] * eps * norms).all()


def test_squared_distances_equal_the_reference_bit_for_bit():
    for x in RESPONSES + HARD:
        g = gram(np.ascontiguousarray(x))
        d2, min_off, finite = squared_distances(g)
        r2, r_min, r_finite = reference.squared_distances(g)
        assert finite == r_finite
        if finite:
            assert d2.tobytes() == r2.tobytes() and min_off == r_min


def test_kmeans_labels_equal_the_reference():
    for x in RESPONSES + HARD:
        g, d2, k, u, trials = kmeans_inputs(x)
        got = kmeans_labels(g, d2, k, u, trials, 300)
        np.testing.assert_array_equal(got, reference.kmeans_labels(g, d2, k, u, trials, 300))
        assert len(np.unique(got)) <= k


def test_hdbscan_spanning_tree_equals_the_reference_bit_for_bit():
    for x in RESPONSES + HARD:
        x = np.ascontiguousarray(x, dtype=np.float64)
        args = (x @ x.T, np.einsum("ij,ij->i", x, x), hdbscan_params(len(x))[1])
        for a, b in zip(hdbscan_mst(*args), reference.hdbscan_mst(*args)):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_hdbscan_tree_labels_equal_the_reference_and_edges_sort_as_numpy_sorts_the_distances():
    """The compiled single linkage, condensed tree, excess of mass and labelling against the plain one on the same
    sorted spanning trees; the edges' order (scikit-learn's argsort of its edge records) is numpy's argsort of the
    distances, ties included."""
    for x in RESPONSES + HARD:
        x = np.ascontiguousarray(x, dtype=np.float64)
        mcs, ms = hdbscan_params(len(x))
        src, dst, dist = hdbscan_mst(x @ x.T, np.einsum("ij,ij->i", x, x), ms)
        order = mst_edge_order(src, dst, dist)
        np.testing.assert_array_equal(order, np.argsort(dist))
        edges = (src[order], dst[order], dist[order], mcs)
        np.testing.assert_array_equal(hdbscan_tree_labels(*edges), reference.hdbscan_tree_labels(*edges))


@pytest.mark.parametrize("method", ["kmeans", "hdbscan"])
def test_the_whole_clustering_equals_the_reference(method):
    """`cluster_steps` against `reference.cluster_steps` from the same Gram product (the compiled one: numpy's can
    round a near tie otherwise), and from numpy's where every product is exact (small integers)."""
    for seed, x in enumerate(RESPONSES + HARD):
        got = cluster_steps(x, method, seed=seed % 5)
        np.testing.assert_array_equal(got, reference.cluster_steps(x, method, seed=seed % 5, gram=gram))
    for x in tie_heavy(np.random.default_rng(3), 30)[::3]:  # integer grids
        np.testing.assert_array_equal(cluster_steps(x, method), reference.cluster_steps(x, method))


def test_hdbscan_equals_scikit_learns_public_hdbscan():
    for x in HARD:
        got = cluster_steps(x, "hdbscan")
        expected = reference.sklearn_hdbscan_labels(x)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(reference.cluster_steps(x, "hdbscan"), expected)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 14).flatmap(
        lambda m: st.lists(st.lists(st.integers(-1, 1), min_size=2, max_size=2), min_size=m, max_size=m)
    )
)
def test_tiny_tie_heavy_responses_cluster_as_the_reference_and_scikit_learn(points):
    """Two to 14 steps on a 3 x 3 grid: distances tie everywhere."""
    x = np.array(points, dtype=np.float64)
    for method in ("kmeans", "hdbscan"):
        np.testing.assert_array_equal(cluster_steps(x, method), reference.cluster_steps(x, method))
    np.testing.assert_array_equal(cluster_steps(x, "hdbscan"), reference.sklearn_hdbscan_labels(x))


def test_the_reference_refuses_what_the_compiled_path_refuses():
    for bad, match in (
        (np.full((3, 4), np.nan), "NaN"),
        (np.ones((2, 3, 4)), "2-D"),
        (1e200 * np.ones((3, 4)), "beyond float64"),
    ):
        for clustering in (cluster_steps, reference.cluster_steps):
            with pytest.raises(ValueError, match=match):
                clustering(bad)
    with pytest.raises(ValueError, match="kmeans, hdbscan"):
        reference.cluster_steps(np.ones((3, 4)), "dbscan")
    with pytest.raises(ValueError, match="KMeans only"):
        reference.cluster_steps(np.ones((3, 4)), "hdbscan", k_rule="log2")
    for m in (0, 1):
        assert reference.cluster_steps(np.ones((m, 4))).tolist() == cluster_steps(np.ones((m, 4))).tolist() == [0] * m
