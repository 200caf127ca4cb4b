"""The compiled structure-stage kernels (sarl.structure.kernels, gram, hdbscan_kernels) on their own: edge cases,
overflow and NaN, read-only inputs, labels whatever the batch, both Gram block shapes, compiling without a cache.
Their equality with the plain reference beside them (sarl.structure.reference): tests/sarl/test_cluster_reference.py."""

import numpy as np
import pytest

from sarl.structure import gram as gram_module
from sarl.structure import kernels
from sarl.structure.cluster import cluster_batch, kmeans_draws, kmeans_k
from sarl.structure.gram import gram
from sarl.structure.kernels import kmeans_labels, squared_distances


def test_kmeans_kernel_handles_the_edge_cases():
    u = kmeans_draws(0, 4)
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
