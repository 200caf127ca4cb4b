"""EVOL-RL reward: worked numbers, edge cases and the majority-over-minority guarantee (EVOL-RL App. B.2, C.4-C.5)."""

import random

import numpy as np
import pytest
from baseline_fakes import TableEmbedder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baselines.evol_rl import EvolRLReward, is_valid_answer, novelty_scores, reasoning_text
from sarl.contract.reward import RolloutBatch

EPS = 1e-8


def response(reasoning: str, answer: str | None) -> str:
    tail = f"The answer is \\boxed{{{answer}}}." if answer is not None else "I give up."
    return f"<think>\n{reasoning}\n</think>\n\n{tail}"


def group(responses, gid="q"):
    return RolloutBatch(prompts=[""] * len(responses), responses=responses, group_ids=[gid] * len(responses))


# Hand-made group: three responses answer 4 (majority), one answers 7 (minority).
VECTORS = {"r0": [1, 0, 0], "r1": [0.6, 0.8, 0], "r2": [0, 1, 0], "r3": [0, 0, 1]}
GROUP = [response("r0", "4"), response("r1", "4"), response("r2", "4"), response("r3", "7")]


def test_worked_example():
    """S01 = 0.6, S12 = 0.8, every other pair 0 (alpha = 0.5).

    majority: s̄0 = (0.6+0)/2 = 0.3, m0 = 0.6 -> u0 = 1 - (0.15+0.30) = 0.55
              s̄1 = (0.6+0.8)/2 = 0.7, m1 = 0.8 -> u1 = 1 - (0.35+0.40) = 0.25
              s̄2 = (0+0.8)/2 = 0.4, m2 = 0.8 -> u2 = 1 - (0.20+0.40) = 0.40
              ũ = (u - 0.25) / (0.30 + 1e-8) = (1 - 3.3e-8, 0, 0.5) -> r = (1.0, 0.5, 0.75)
    minority: r3 alone in its band -> ũ = 0 -> r = -1; s̄3 undefined, u3 = 1 - m3 = 1.
    """
    outs = EvolRLReward(TableEmbedder(VECTORS))(group(GROUP))
    assert [o.score for o in outs] == pytest.approx([0.5 + 0.5 * 0.3 / (0.3 + EPS), 0.5, 0.75, -1.0])
    assert [o.diagnostics["novelty"] for o in outs] == pytest.approx([0.55, 0.25, 0.40, 1.0])
    assert [o.diagnostics["majority"] for o in outs] == [1, 1, 1, 0]
    assert all(o.diagnostics["valid"] == 1 and o.diagnostics["majority_ratio"] == 0.75 for o in outs)
    assert all(o.failed is None for o in outs)


def test_invalid_responses_get_minus_one_and_are_not_embedded():
    emb = TableEmbedder(VECTORS)
    extra = [response("r4", None), response("r5", "x"), response("r6", "")]  # no box, no digit, empty box
    outs = EvolRLReward(emb)(group(GROUP + extra))
    assert [o.score for o in outs[4:]] == [-1.0, -1.0, -1.0]
    assert [o.diagnostics["valid"] for o in outs] == [1, 1, 1, 1, 0, 0, 0]
    assert "novelty" not in outs[4].diagnostics
    # the invalid rows change neither the others' rewards nor their novelty (they take no part in s̄, m)
    assert [o.score for o in outs[:4]] == pytest.approx([1.0, 0.5, 0.75, -1.0], abs=1e-7)
    assert outs[0].diagnostics["majority_ratio"] == pytest.approx(3 / 7)
    assert sorted(emb.calls[0]) == ["r0", "r1", "r2", "r3"]


def test_edge_cases_follow_the_paper_formula():
    emb = TableEmbedder({"a": [1, 0], "b": [0, 1], "c": [1, 0]})
    # group of size 1: majority, alone in its band -> ũ = 0 -> 0.5 (the authors' code gives 1.0)
    (single,) = EvolRLReward(emb)(group([response("a", "3")]))
    assert single.score == 0.5 and "novelty" not in single.diagnostics
    # all invalid -> all -1
    assert [o.score for o in EvolRLReward(emb)(group([response("a", None), response("b", "none")]))] == [-1, -1]
    # all the same answer: everyone is majority; identical reasoning -> equal u -> ũ = 0 -> 0.5 (code: 0.75)
    same = EvolRLReward(emb)(group([response("a", "2"), response("c", "2")]))
    assert [o.score for o in same] == [0.5, 0.5]
    # two-way tie: canonical order picks "2" (shorter/lexicographic first), minority "3" in [-1, -0.5)
    tie = EvolRLReward(emb)(group([response("a", "3"), response("b", "2")]))
    assert [o.diagnostics["majority"] for o in tie] == [0, 1] and [o.score for o in tie] == [-1.0, 0.5]


def test_equivalent_answers_share_the_majority(grader):
    emb = TableEmbedder({"a": [1, 0], "b": [0, 1], "c": [0.6, 0.8]})
    responses = [response("a", "\\frac12"), response("b", "0.5"), response("c", "1")]
    outs = EvolRLReward(emb, grader=grader)(group(responses))
    assert [o.diagnostics["majority"] for o in outs] == [1, 1, 0]


def test_embedding_failures_never_use_random_vectors():
    emb = TableEmbedder({"r0": [1, 0, 0], "r1": [0.6, 0.8, 0], "r3": [0, 0, 1]})  # r2 is missing
    outs = EvolRLReward(emb)(group(GROUP))
    assert outs[2].failed == "not in table: 'r2'" and outs[2].score == 0.5  # bottom of its band
    assert "novelty" not in outs[2].diagnostics
    # the others are scored without r2: majority {r0, r1}: u0 = 1-(0.3+0.3) = 0.4 = u1 -> ũ = 0
    assert [outs[i].score for i in (0, 1, 3)] == [0.5, 0.5, -1.0]
    crashed = EvolRLReward(TableEmbedder(crash=True))(group(GROUP + [None]))
    assert [o.score for o in crashed] == [0.5, 0.5, 0.5, -1.0, -1.0]
    assert crashed[0].failed == "embedding error: ConnectionError: embedding server is down"
    assert crashed[4].failed == "unusable response: a NoneType, not a str"


def test_order_independent_under_shuffling():
    table = {f"t{k}": v for k, v in enumerate(np.random.default_rng(0).normal(size=(12, 5)).tolist())}
    answers = ["1", "1", "2", "1", None, "3", "5", "5", "6", "5", "5", "x"]
    responses = [response(f"t{k}", a) for k, a in enumerate(answers)]
    gids = ["a"] * 6 + ["b"] * 6
    reward = EvolRLReward(TableEmbedder(table))
    base = reward(RolloutBatch([""] * 12, responses, gids))
    for seed in range(3):
        perm = list(range(12))
        random.Random(seed).shuffle(perm)
        outs = reward(RolloutBatch([""] * 12, [responses[i] for i in perm], [gids[i] for i in perm]))
        for new, old in enumerate(perm):
            assert outs[new].score == pytest.approx(base[old].score, abs=1e-12)
            assert outs[new].diagnostics == pytest.approx(base[old].diagnostics, abs=1e-12)


vectors = st.lists(st.floats(-1, 1, allow_nan=False), min_size=3, max_size=3).filter(lambda v: np.linalg.norm(v) > 1e-3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["1", "2", "3", None]), vectors), min_size=1, max_size=10))
def test_every_majority_response_outranks_every_minority_response(rows):
    table = {f"t{k}": v for k, (_, v) in enumerate(rows)}
    outs = EvolRLReward(TableEmbedder(table))(group([response(f"t{k}", a) for k, (a, _) in enumerate(rows)]))
    majority = [o.score for o in outs if o.diagnostics["majority"] == 1]
    minority = [o.score for o in outs if o.diagnostics["valid"] == 1 and o.diagnostics["majority"] == 0]
    invalid = [o.score for o in outs if o.diagnostics["valid"] == 0]
    assert all(0.5 <= s < 1.0 for s in majority)  # App. B.2 bands
    assert all(-1.0 <= s < -0.5 for s in minority)
    assert invalid == [-1.0] * len(invalid)
    if majority and minority:
        assert min(majority) > max(minority)
    if any(a is not None for a, _ in rows):
        assert majority  # some valid answer -> a majority class exists
    assert all(0.0 <= o.diagnostics.get("novelty_normalized", 0.0) < 1.0 for o in outs)


def test_helpers():
    assert is_valid_answer("x = 3") and not is_valid_answer("x") and not is_valid_answer(None)
    assert reasoning_text("<think>\nplan\n</think>\\boxed{1}") == "plan"
    assert reasoning_text("<think></think>just \\boxed{1}") == "<think></think>just \\boxed{1}"  # empty think
    assert reasoning_text("plain \\boxed{1}") == "plain \\boxed{1}"
    sim = np.array([[1.0, 0.2], [0.2, 1.0]])
    u, u_tilde = novelty_scores(sim, np.array([True, False]))
    assert u.tolist() == pytest.approx([0.8, 0.8]) and u_tilde.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="alpha"):
        EvolRLReward(TableEmbedder(), alpha=1.5)


def test_ground_truth_label_bands_by_the_verifier_not_the_vote(grader):
    """EVOL-RL App. D.4 (supervised GRPO + EVOL-RL's components, Fig. 6): the upper band is the verifier's.

    GROUP with gold "7": the verifier accepts r3 only, so the bands are the vote's swapped and the novelty the same
    (u = 0.55, 0.25, 0.40 in the three-response band, test_worked_example): the incorrect band's ũ = (1, 0, 0.5)
    gives r = -1 + 0.5 ũ = (-0.5, -1, -0.75); r3 alone in the correct band -> ũ = 0 -> r = 0.5. The vote would
    have given (1.0, 0.5, 0.75, -1.0).
    """
    batch = RolloutBatch([""] * 4, GROUP, ["q"] * 4, ground_truths=["7"] * 4)
    outs = EvolRLReward(TableEmbedder(VECTORS), grader=grader, label="ground_truth")(batch)
    assert [o.score for o in outs] == pytest.approx([-1.0 + 0.5 * 0.3 / (0.3 + EPS), -1.0, -0.75, 0.5])
    assert [o.diagnostics["correct"] for o in outs] == [0, 0, 0, 1]
    assert all(o.diagnostics["correct_ratio"] == 0.25 and "majority" not in o.diagnostics for o in outs)
    assert [o.diagnostics["novelty"] for o in outs] == pytest.approx([0.55, 0.25, 0.40, 1.0])
    voted = EvolRLReward(TableEmbedder(VECTORS), grader=grader)(batch)  # the default: the vote, golds unused
    assert [o.score for o in voted] == pytest.approx([1.0, 0.5, 0.75, -1.0], abs=1e-7)


def test_ground_truth_label_validity_is_a_boxed_answer_and_a_usable_gold(grader):
    """With a verifier a digit-free answer that the verifier accepts is valid (App. C.4's digit rule is the vote's);
    no box is invalid (-1), and a row without a gold is invalid and failed with the ground-truth reward's reason."""
    emb = TableEmbedder({"a": [1, 0], "b": [0, 1], "c": [0.6, 0.8]})
    responses = [response("a", "x"), response("b", "y"), response("c", None), response("a", "x")]
    batch = RolloutBatch([""] * 4, responses, ["p", "p", "p", "n"], ground_truths=["x", "x", "x", None])
    outs = EvolRLReward(emb, grader=grader, label="ground_truth")(batch)
    # group p: "x" correct and alone in its band (0.5), "y" incorrect and alone in its band (-1), no box -1
    assert [o.score for o in outs] == [0.5, -1.0, -1.0, -1.0]
    assert [o.diagnostics["valid"] for o in outs] == [1, 1, 0, 0]
    assert outs[3].failed == "no ground truth" and outs[0].failed is None
    assert [o.score for o in EvolRLReward(emb, grader=grader)(batch)[:2]] == [-1.0, -1.0]  # the vote: no digit
    with pytest.raises(ValueError, match="reward.label='gold'"):
        EvolRLReward(emb, label="gold")
