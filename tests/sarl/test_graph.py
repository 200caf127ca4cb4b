"""SARL Eqs. (4)-(6) on decisions §1's worked values, and the batched metrics against networkx."""

import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarl.structure.graph import (
    average_path_length,
    clustering_coefficient,
    graph_metrics_batch,
    reasoning_map,
    structure_reward,
)

# (label sequence, C, L, SR) from decisions §1.6 "Worked values".
WORKED = [
    ([0], 0.0, None, 0.0),  # one node, no edge
    ([0, 0, 0], 0.0, None, 0.0),  # repeats add nothing, no self loop
    ([0, 1], 0.0, 1.0, 0.5),  # one edge
    ([0, 1, 2], 0.0, 4 / 3, 3 / 7),  # path a-b-c: the paper's near-linear chain, SR = 0.43
    ([0, 1, 2, 0], 1.0, 1.0, 1.0),  # triangle
    ([0, 1, 2, 3, 0, 2, 1, 3], 1.0, 1.0, 1.0),  # K4: "four functions, 6 edges, SR = 1.0"
    ([0, 1, 0, 2, 0, 3], 0.0, 1.5, 0.4),  # star, centre + 3 leaves
]


@pytest.mark.parametrize("labels,C,L,SR", WORKED)
def test_worked_values(labels, C, L, SR):
    G = reasoning_map(labels)
    assert clustering_coefficient(G) == pytest.approx(C)
    if L is None:
        assert average_path_length(G) is None
    else:
        assert average_path_length(G) == pytest.approx(L)
    assert structure_reward(G) == pytest.approx(SR)
    m = graph_metrics_batch([np.array(labels)])
    assert m.rewards("sarl")[0] == pytest.approx(SR)


def test_reasoning_map_is_undirected_with_one_edge_per_transition():
    G = reasoning_map([0, 1, 0, 1, 1, 0])
    assert set(G.nodes) == {0, 1} and G.number_of_edges() == 1


def test_ablation_variants():
    G = reasoning_map([0, 1, 2, 0, 3])  # triangle + pendant: C = (1 + 1 + 1/3) / 3
    C, L = clustering_coefficient(G), average_path_length(G)
    assert C == pytest.approx(7 / 9)
    assert structure_reward(G, "c_only") == pytest.approx(C / 2)
    assert structure_reward(G, "l_only") == pytest.approx(1 / (1 + L))
    assert structure_reward(G) == pytest.approx(C / 2 + 1 / (1 + L))
    with pytest.raises(ValueError, match="sarl, c_only, l_only"):
        structure_reward(G, "c")


def test_clustering_coefficient_ignores_degree_one_nodes():
    # Triangle plus a leaf: nodes of degree >= 2 are 0 (deg 3), 1, 2 -> C = (1/3 + 1 + 1) / 3.
    G = nx.Graph([(0, 1), (1, 2), (2, 0), (0, 3)])
    assert clustering_coefficient(G) == pytest.approx((1 / 3 + 1 + 1) / 3)


def test_path_length_over_reachable_pairs_only():
    G = nx.Graph([(0, 1), (2, 3), (3, 4)])  # two components
    # ordered reachable pairs: (0,1),(1,0): 1 each; 2-3-4 path: 4 pairs at 1, 2 at 2
    assert average_path_length(G) == pytest.approx((2 + 4 + 4) / 8)


labels_strategy = st.lists(st.integers(min_value=0, max_value=12), min_size=0, max_size=80)


@settings(max_examples=300, deadline=None)
@given(labels_strategy)
def test_batched_metrics_equal_networkx(labels):
    G = reasoning_map(labels)
    m = graph_metrics_batch([np.array(labels, dtype=np.int64)])
    assert m.C[0] == pytest.approx(clustering_coefficient(G), abs=1e-12)
    L = average_path_length(G)
    assert (L is None and math.isnan(m.L[0])) or m.L[0] == pytest.approx(L, abs=1e-12)
    assert (m.n_nodes[0], m.n_edges[0]) == (G.number_of_nodes(), G.number_of_edges())


@settings(max_examples=300, deadline=None)
@given(labels_strategy, st.randoms(use_true_random=False))
def test_sr_in_unit_interval_and_invariant_to_renaming(labels, rnd):
    names = list(range(13))
    rnd.shuffle(names)
    renamed = [names[x] * 7 - 20 for x in labels]  # any injective renaming, negatives included
    for variant in ("sarl", "c_only", "l_only"):
        a = structure_reward(reasoning_map(labels), variant)
        b = structure_reward(reasoning_map(renamed), variant)
        assert 0.0 <= a <= 1.0 and not math.isnan(a)
        assert a == pytest.approx(b)
    batch = graph_metrics_batch([np.array(labels, dtype=np.int64), np.array(renamed, dtype=np.int64)]).rewards()
    assert batch[0] == pytest.approx(batch[1])


def test_batch_of_mixed_sizes_agrees_with_one_at_a_time():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, rng.integers(1, 30), size=rng.integers(0, 200)) for _ in range(300)]
    together = graph_metrics_batch(seqs)
    for i, s in enumerate(seqs):
        alone = graph_metrics_batch([s])
        assert together.C[i] == alone.C[0]
        assert (np.isnan(together.L[i]) and np.isnan(alone.L[0])) or together.L[i] == alone.L[0]
