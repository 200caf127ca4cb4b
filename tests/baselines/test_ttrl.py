"""TTRL majority vote on literal examples (decisions §2.2 "TTRL")."""

import random

import pytest

from baselines.ttrl import TTRLReward, majority_vote
from sarl.contract.reward import RolloutBatch
from sarl.contract.selection import select_for_training


def boxed(*answers):
    return [f"<think>work</think>\\boxed{{{a}}}" if a is not None else "no idea" for a in answers]


def batch_of(groups: dict, golds: dict | None = None) -> RolloutBatch:
    responses, gids, gts = [], [], []
    for gid, answers in groups.items():
        responses += boxed(*answers)
        gids += [gid] * len(answers)
        gts += [golds[gid] if golds else None] * len(answers)
    return RolloutBatch(prompts=[""] * len(responses), responses=responses, group_ids=gids, ground_truths=gts)


def test_equivalent_answers_vote_together(grader):
    # 1/2 written three ways outvotes the two 3s
    outs = TTRLReward(n_votes=6, n_samples=6, grader=grader)(
        batch_of({"q": ["\\frac12", "0.5", "1/2", "3", "3", None]})
    )
    assert [o.score for o in outs] == [1, 1, 1, 0, 0, 0]
    assert outs[0].diagnostics["majority_ratio"] == pytest.approx(3 / 6)
    assert [o.diagnostics["no_answer"] for o in outs] == [0, 0, 0, 0, 0, 1]


def test_aime_leading_zeros_vote_together(grader):
    outs = TTRLReward(n_votes=4, n_samples=4, grader=grader)(batch_of({"q": ["016", "16", "17", "17 "]}))
    # "016"/"16" and "17"/"17 " tie 2-2: the canonical order (shortest, then lexicographic) picks 16
    assert [o.score for o in outs] == [1, 1, 0, 0]


def test_diagnostics_against_hidden_gold(grader):
    batch = batch_of({"right": ["4", "4", "4", "5"], "wrong": ["7", "7", "3", None]}, {"right": "4", "wrong": "3"})
    outs = TTRLReward(n_votes=4, n_samples=4, grader=grader)(batch)
    right, wrong = outs[:4], outs[4:]
    assert [o.score for o in right] == [1, 1, 1, 0] and [o.score for o in wrong] == [1, 1, 0, 0]
    assert [o.diagnostics["label_accuracy"] for o in outs] == [1.0] * 4 + [0.0] * 4
    assert [o.diagnostics["acc"] for o in outs] == [1, 1, 1, 0, 0, 0, 1, 0]
    assert [o.diagnostics["reward_accuracy"] for o in outs] == [1, 1, 1, 1, 0, 0, 0, 1]
    assert [o.diagnostics["majority_ratio"] for o in outs] == [0.75] * 4 + [0.5] * 4


def test_gold_is_never_used_for_the_reward(grader):
    groups = {"q": ["7", "7", "3", "3", "3"]}
    with_gold = TTRLReward(n_votes=5, n_samples=5, grader=grader)(batch_of(groups, {"q": "7"}))
    without = TTRLReward(n_votes=5, n_samples=5, grader=grader)(batch_of(groups))
    assert [o.score for o in with_gold] == [o.score for o in without] == [0, 0, 1, 1, 1]
    assert "label_accuracy" not in without[0].diagnostics


def test_no_answers_at_all(grader):
    outs = TTRLReward(n_votes=3, n_samples=3, grader=grader)(batch_of({"q": [None, None, None]}, {"q": "1"}))
    assert [o.score for o in outs] == [0, 0, 0]
    assert outs[0].diagnostics["majority_ratio"] == 0.0 and outs[0].diagnostics["label_accuracy"] == 0.0


def test_order_independent_under_shuffling(grader):
    batch = batch_of(
        {"a": ["2", "1", "\\frac{4}{2}", "1.0"], "b": ["x", "y", None, "y"], "c": ["5", "6", "7", "8"]},
        {"a": "2", "b": "y", "c": "8"},
    )
    reward = TTRLReward(n_votes=4, n_samples=4, grader=grader)
    base = reward(batch)
    for seed in range(3):
        perm = list(range(len(batch)))
        random.Random(seed).shuffle(perm)
        shuffled = RolloutBatch(
            prompts=[batch.prompts[i] for i in perm],
            responses=[batch.responses[i] for i in perm],
            group_ids=[batch.group_ids[i] for i in perm],
            ground_truths=[batch.ground_truths[i] for i in perm],
        )
        outs = reward(shuffled)
        for new, old in enumerate(perm):
            assert outs[new].score == base[old].score
            assert outs[new].diagnostics == base[old].diagnostics
    # group "a" ties 2-2 between {2, 4/2} and {1, 1.0}: canonical order picks "1"; group "c": "5"
    assert [o.score for o in base] == [0, 1, 0, 1, 0, 1, 0, 1, 1, 0, 0, 0]


def test_majority_vote_helper(grader):
    vote = majority_vote(["0.5", None, "\\frac{1}{2}", "2"], grader)
    assert vote.labels == [0, None, 0, 1] and vote.majority == 0 and vote.count == 2 and vote.label == "0.5"


def test_bad_responses_never_raise(grader):
    batch = RolloutBatch(prompts=[""] * 3, responses=[None, "\\boxed{1}", "\\boxed{1}"], group_ids=["g"] * 3)
    outs = TTRLReward(n_votes=3, n_samples=3, grader=grader)(batch)
    assert [o.score for o in outs] == [0, 1, 1]
    assert outs[0].failed == "unusable response: a NoneType, not a str"


def test_group_size_mismatch_is_counted_not_fatal(grader):
    reward = TTRLReward(n_votes=4, n_samples=2, grader=grader)
    outs = reward(batch_of({"a": ["1", "1", "2"], "b": ["3", "3", "3", "3"]}))
    assert [o.score for o in outs] == [1, 1, 0, 1, 1, 1, 1]
    assert reward.warning_counts["group_size_mismatch"] == 1
    with pytest.raises(ValueError, match="n_votes=4 rows per group.*'a': 3"):
        reward.training_rows(["a"] * 3 + ["b"] * 4)


def test_select_for_training_is_seeded_per_group():
    gids = ["a"] * 8 + ["b"] * 8
    keep = select_for_training(gids, n_samples=4, seed=0)
    assert len(keep) == 8 and keep == sorted(keep)
    assert sum(i < 8 for i in keep) == 4 and sum(i >= 8 for i in keep) == 4
    assert select_for_training(gids, 4, 0) == keep  # deterministic
    assert select_for_training(gids, 4, 1) != keep  # the seed matters
    # a group's choice depends on (seed, group id), not on its position or on the other groups
    a_alone = select_for_training(["a"] * 8, 4, 0)
    swapped = select_for_training(["b"] * 8 + ["a"] * 8 + ["c"] * 5, 4, 0)
    assert [i - 8 for i in swapped if 8 <= i < 16] == a_alone == [i for i in keep if i < 8]
    interleaved = select_for_training(["a", "b"] * 8, 4, 0)
    assert [i // 2 for i in interleaved if i % 2 == 0] == a_alone


def test_select_for_training_validates():
    with pytest.raises(ValueError, match="fewer than n_samples=4.*'b': 3"):
        select_for_training(["a"] * 4 + ["b"] * 3, 4, 0)
    with pytest.raises(ValueError, match="n_samples <= n_votes"):
        TTRLReward(n_votes=4, n_samples=8)
    ttrl = TTRLReward(n_votes=64, n_samples=32, seed=3)
    keep = ttrl.training_rows([f"p{k}" for k in range(2) for _ in range(64)])
    assert len(keep) == 64 and len(set(keep)) == 64
