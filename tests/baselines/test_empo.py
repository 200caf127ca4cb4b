"""EMPO semantic-cluster probabilities on hand-made groups (decisions §2.3 "EMPO")."""

import math
import random

import numpy as np
import pytest
from baseline_fakes import TableEmbedder

from baselines.empo import EMPOReward, final_answer_text, single_linkage_clusters
from sarl.contract.reward import RolloutBatch


def group(responses, gid="q"):
    return RolloutBatch(prompts=[""] * len(responses), responses=responses, group_ids=[gid] * len(responses))


def boxed(*answers):
    return [f"<think>...</think>\\boxed{{{a}}}" if a is not None else "<think>...</think>no answer" for a in answers]


def test_math_cluster_probabilities(grader):
    # clusters: {1/2 x4}, {2 x2}, {3}, and one response without an answer (its own singleton)
    outs = EMPOReward(grader=grader)(group(boxed("\\frac12", "0.5", "1/2", "2", "2", None, "3", "\\dfrac{1}{2}")))
    assert [o.score for o in outs] == [0.5, 0.5, 0.5, 0.25, 0.25, 0.0, 0.125, 0.5]
    assert [o.diagnostics["cluster_prob"] for o in outs] == [o.score for o in outs]
    entropy = -(0.5 * math.log(0.5) + 0.25 * math.log(0.25) + 2 * 0.125 * math.log(0.125))
    assert all(o.diagnostics["semantic_entropy"] == pytest.approx(entropy) for o in outs)  # 1.2130
    assert all(o.diagnostics["max_cluster_prob"] == 0.5 and o.diagnostics["filtered"] == 0.0 for o in outs)
    assert outs[5].diagnostics["no_answer"] == 1.0


def test_confidence_filter_zeroes_the_group(grader):
    # every answer distinct: max cluster probability 1/8 < low = 0.3 (EMPO's filter)
    outs = EMPOReward(grader=grader)(group(boxed(*range(8))))
    assert [o.score for o in outs] == [0.0] * 8
    assert all(o.diagnostics["filtered"] == 1.0 for o in outs)
    assert outs[0].diagnostics["cluster_prob"] == 0.125
    assert outs[0].diagnostics["semantic_entropy"] == pytest.approx(math.log(8))
    # a filter above 0.5 also zeroes a confident group
    confident = EMPOReward(low=0.3, high=0.5, grader=grader)(group(boxed(1, 1, 1, 2)))
    assert [o.score for o in confident] == [0.0] * 4
    unfiltered = EMPOReward(low=0.0, high=1.0, grader=grader)(group(boxed(*range(8))))
    assert [o.score for o in unfiltered] == [0.125] * 8


def test_groups_are_keyed_by_group_id_and_order_free(grader):
    responses = boxed(1, 1, 2, 5, 5, 5, 1, 2)
    gids = ["a", "a", "a", "b", "b", "b", "a", "b"]
    batch = RolloutBatch(prompts=[""] * 8, responses=responses, group_ids=gids)
    reward = EMPOReward(grader=grader)
    base = reward(batch)
    # group a: {1 x3, 2 x1}; group b: {5 x3, 2 x1}; the filter looks at the max (0.75): both kept
    assert [o.score for o in base] == [0.75, 0.75, 0.25, 0.75, 0.75, 0.75, 0.75, 0.25]
    perm = list(range(8))
    random.Random(1).shuffle(perm)
    outs = reward(RolloutBatch([""] * 8, [responses[i] for i in perm], [gids[i] for i in perm]))
    for new, old in enumerate(perm):
        assert outs[new].score == base[old].score and outs[new].diagnostics == pytest.approx(base[old].diagnostics)


def test_open_ended_single_linkage():
    theta = math.acos(0.95)
    vec = {  # a~b and b~c at 0.95, a.c = 0.805 < 0.9 (linked through b), d apart
        "A": [1, 0],
        "B": [math.cos(theta), math.sin(theta)],
        "C": [math.cos(2 * theta), math.sin(2 * theta)],
        "D": [0, 1],
    }
    responses = ["<think>x</think>\nA", "<think>y</think>B", "<think>z</think> C ", "<think>w</think>D", "<think>cut"]
    reward = EMPOReward(mode="open_ended", threshold=0.9, embedder=TableEmbedder(vec))
    outs = reward(group(responses))
    assert [o.score for o in outs] == [0.6, 0.6, 0.6, 0.2, 0.0]
    assert outs[4].diagnostics["no_answer"] == 1.0 and outs[4].failed is None  # truncated thinking
    assert single_linkage_clusters(np.array([vec[k] for k in "ABCD"]), 0.9) == [0, 0, 0, 1]
    assert single_linkage_clusters(np.array([vec[k] for k in "DCBA"]), 0.9) == [0, 1, 1, 1]


def test_open_ended_embedding_failures_are_reported():
    responses = ["</think>A", "</think>A", "</think>unknown text", None]
    outs = EMPOReward(mode="open_ended", embedder=TableEmbedder({"A": [1, 0]}))(group(responses))
    assert [o.score for o in outs] == [0.5, 0.5, 0.0, 0.0]
    assert outs[2].failed.startswith("not in table") and outs[3].failed.startswith("unusable response")
    crashed = EMPOReward(mode="open_ended", embedder=TableEmbedder(crash=True))(group(responses))
    assert [o.score for o in crashed] == [0.0] * 4
    assert crashed[0].failed == "embedding error: ConnectionError: embedding server is down"


def test_final_answer_text():
    assert final_answer_text("<think>a</think>\n\nThe plan.") == "The plan."
    assert final_answer_text("reasoning</think>answer") == "answer"
    assert final_answer_text("no tags at all") == "no tags at all"
    assert final_answer_text("<think>never closed") is None
    assert final_answer_text("<think>a</think>   ") is None
    assert final_answer_text("<think>a</think>\x00\x01\x7f") is None  # nothing once sanitised: nothing to embed


def test_options_are_checked():
    with pytest.raises(ValueError, match="math, open_ended"):
        EMPOReward(mode="semantic")
    with pytest.raises(ValueError, match="pass an embedder"):
        EMPOReward(mode="open_ended")
    with pytest.raises(ValueError, match="low <= high"):
        EMPOReward(low=0.8, high=0.5)
