"""decisions §1.3 "Clustering": k rule, HDBSCAN parameters, agreement with scikit-learn."""

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from sarl.structure.cluster import K_RULES, cluster_batch, cluster_steps, hdbscan_params, kmeans_k
from sarl.structure.reference import sklearn_hdbscan_labels


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def blobs(rng, m, d, n_centres, spread):
    centres = rng.normal(size=(n_centres, d))
    truth = rng.integers(0, n_centres, m)
    return unit(centres[truth] + rng.normal(scale=spread, size=(m, d))), truth


@pytest.mark.parametrize(
    "m,k", [(0, 0), (1, 1), (2, 1), (3, 2), (4, 2), (6, 2), (7, 3), (12, 3), (13, 4), (80, 9), (1024, 32)]
)
def test_kmeans_k_is_rounded_sqrt(m, k):
    assert kmeans_k(m) == k


def test_kmeans_k_capped_by_distinct_embeddings():
    assert kmeans_k(100, n_distinct=3) == 3
    x = np.repeat(unit(np.eye(4)[:2]), 50, axis=0)  # 100 steps, 2 distinct vectors
    labels = cluster_steps(x)
    assert len(set(labels.tolist())) == 2


# Worked values of every k rule (sweeps/k_rule.yaml), before the distinct-embedding cap.
K_RULE_TABLE = {
    #              M:  1  2  3  4  6  7 12 13 80 100 1024
    "sqrt": [1, 1, 2, 2, 2, 3, 3, 4, 9, 10, 32],
    "sqrt_floor": [1, 1, 1, 2, 2, 2, 3, 3, 8, 10, 32],
    "sqrt_ceil": [1, 2, 2, 2, 3, 3, 4, 4, 9, 10, 32],
    "sqrt_half": [1, 1, 1, 1, 2, 2, 2, 3, 6, 7, 23],
    "log2": [1, 1, 2, 2, 3, 3, 4, 4, 6, 7, 10],
    "fixed:4": [1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4],
}
K_RULE_M = [1, 2, 3, 4, 6, 7, 12, 13, 80, 100, 1024]


@pytest.mark.parametrize("rule", list(K_RULE_TABLE))
def test_k_rules_worked_values(rule):
    assert [kmeans_k(m, rule=rule) for m in K_RULE_M] == K_RULE_TABLE[rule]
    assert kmeans_k(0, rule=rule) == 0
    assert kmeans_k(100, n_distinct=3, rule=rule) == 3


def test_every_named_k_rule_has_worked_values_and_the_default_is_specs():
    assert set(K_RULES) <= set(K_RULE_TABLE)
    assert all(kmeans_k(m) == kmeans_k(m, rule="sqrt") for m in range(0, 2000))


@pytest.mark.parametrize("rule", ["sqrt", "sqrt_half", "log2", "fixed:5"])
def test_k_rule_sets_the_number_of_clusters(rule):
    """Well-separated blobs with more centres than any rule asks for: exactly k(M) clusters come out."""
    rng = np.random.default_rng(4)
    for m in (9, 30, 64, 150):
        x = unit(rng.normal(size=(m, 64)))  # m distinct directions, nearly orthogonal
        labels = cluster_steps(x, k_rule=rule)
        assert len(np.unique(labels)) == kmeans_k(m, rule=rule), (rule, m)


@pytest.mark.parametrize("bad", ["sqrt2", "fixed:0", "fixed:-1", "fixed:x", "", None])
def test_unknown_k_rule_names_the_choices(bad):
    with pytest.raises(ValueError, match="sqrt, sqrt_floor, sqrt_ceil, sqrt_half, log2, fixed:K"):
        kmeans_k(10, rule=bad)
    with pytest.raises(ValueError, match="k rule"):
        cluster_steps(unit(np.eye(4)), k_rule=bad)


def test_k_rule_is_kmeans_only():
    with pytest.raises(ValueError, match="KMeans only"):
        cluster_steps(unit(np.eye(4)), "hdbscan", k_rule="log2")


@pytest.mark.parametrize(
    "m,mcs,ms", [(2, 2, 1), (7, 2, 1), (8, 2, 1), (12, 3, 2), (16, 4, 3), (20, 5, 4), (80, 5, 4), (4000, 5, 4)]
)
def test_hdbscan_params(m, mcs, ms):
    assert hdbscan_params(m) == (mcs, ms)


def test_tiny_responses_form_one_node():
    for method in ("kmeans", "hdbscan"):
        assert cluster_steps(np.zeros((0, 8)), method).shape == (0,)
        assert cluster_steps(unit(np.ones((1, 8))), method).tolist() == [0]


@pytest.mark.parametrize("seed", range(6))
def test_hdbscan_labels_equal_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        m = int(rng.integers(2, 120))
        x, _ = blobs(rng, m, int(rng.choice([16, 384])), int(rng.integers(1, 7)), rng.uniform(0.05, 1.5))
        np.testing.assert_array_equal(cluster_steps(x, "hdbscan"), sklearn_hdbscan_labels(x))


def test_hdbscan_noise_and_separated_clusters():
    rng = np.random.default_rng(0)
    x, truth = blobs(rng, 60, 32, 3, 0.02)
    labels = cluster_steps(x, "hdbscan")
    assert adjusted_rand_score(truth, labels) == pytest.approx(1.0)


def test_kmeans_recovers_well_separated_clusters():
    rng = np.random.default_rng(1)
    for m in (9, 16, 49, 100):
        k = kmeans_k(m)
        centres = unit(rng.normal(size=(k, 64)))
        truth = np.arange(m) % k
        x = unit(centres[truth] + rng.normal(scale=0.01, size=(m, 64)))
        assert adjusted_rand_score(truth, cluster_steps(x)) == pytest.approx(1.0)


def test_kmeans_quality_matches_scikit_learn():
    """Same objective as sklearn's KMeans(n_init=1): inertia within 2% on average."""
    rng = np.random.default_rng(2)
    ratios = []
    for _ in range(150):
        m = int(rng.integers(4, 120))
        x, _ = blobs(rng, m, 64, int(rng.integers(1, 10)), rng.uniform(0.05, 1.5))
        labels = cluster_steps(x)
        ours = sum(((x[labels == c] - x[labels == c].mean(0)) ** 2).sum() for c in np.unique(labels))
        ref = KMeans(n_clusters=kmeans_k(m), n_init=1, random_state=0).fit(x).inertia_
        ratios.append(ours / ref)
    assert np.mean(ratios) < 1.02


@pytest.mark.parametrize("method", ["kmeans", "hdbscan"])
def test_same_response_same_labels_whatever_the_batch(method):
    rng = np.random.default_rng(3)
    xs = [blobs(rng, int(rng.integers(2, 40)), 16, 3, 0.5)[0].astype(np.float32) for _ in range(40)]
    together = cluster_batch(xs, method, seed=7)
    shuffled_idx = rng.permutation(len(xs))
    shuffled = cluster_batch([xs[i] for i in shuffled_idx], method, seed=7)
    side_by_side = cluster_batch(xs, method, seed=7, threads=3)  # three responses at a time
    for pos, i in enumerate(shuffled_idx):
        np.testing.assert_array_equal(shuffled[pos], together[i])
        np.testing.assert_array_equal(cluster_steps(xs[i], method, seed=7), together[i])
        np.testing.assert_array_equal(side_by_side[i], together[i])


@pytest.mark.parametrize("rule", ["sqrt", "log2"])
def test_labels_do_not_depend_on_the_longest_response_in_the_batch(rule):
    """The k-means++ draws are the same whatever the batch's largest k (a longer response added
    to the batch once changed every other response's seeding)."""
    rng = np.random.default_rng(5)
    long = unit(rng.normal(size=(900, 8)))
    for _ in range(30):
        x = unit(rng.normal(size=(int(rng.integers(4, 60)), 8)))
        alone = cluster_steps(x, seed=3, k_rule=rule)
        np.testing.assert_array_equal(cluster_batch([x, long], seed=3, k_rule=rule)[0], alone)
        np.testing.assert_array_equal(cluster_batch([long, x], seed=3, k_rule=rule)[1], alone)


def test_bad_embeddings_raise_clear_errors():
    with pytest.raises(ValueError, match="NaN"):
        cluster_steps(np.full((3, 4), np.nan))
    with pytest.raises(ValueError, match="2-D"):
        cluster_steps(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="kmeans, hdbscan"):
        cluster_steps(np.ones((3, 4)), "dbscan")


def test_importing_the_reward_loads_no_compiled_kernels_and_no_scikit_learn():
    """`from sarl import StructureReward` loads neither numba (the compiled kernels), scikit-learn nor networkx (the
    references); building a reward loads the kernels (`load_kernels`), so that no call pays for them."""
    import subprocess
    import sys
    from pathlib import Path

    heavy = ("numba", "sklearn", "scipy", "networkx", "sarl.structure.kernels", "sarl.structure.hdbscan_kernels")
    code = (
        "import sys\nfrom sarl import StructureReward\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
        "from sarl.structure.embed.base import Embedder\n"
        "class Fixed(Embedder):\n    def _embed_unique(self, texts):\n        return [[1.0, 0.0]] * len(texts), {}\n"
        "StructureReward(Fixed(dim=2))\n"
        "print(sorted(m for m in ('numba', 'sarl.structure.kernels', 'sarl.structure.gram', "
        "'sarl.structure.hdbscan_kernels', 'sklearn') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "[]",
        "['numba', 'sarl.structure.gram', 'sarl.structure.hdbscan_kernels', 'sarl.structure.kernels']",
    ]
