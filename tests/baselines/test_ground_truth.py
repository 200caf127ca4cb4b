"""Ground-truth reward on literal examples (decisions §2.1 "Ground truth")."""

import random

import pytest

from baselines.ground_truth import GroundTruthReward
from sarl.contract.reward import RolloutBatch


def score(grader, responses, golds):
    batch = RolloutBatch(prompts=[""] * len(responses), responses=responses, ground_truths=golds)
    return GroundTruthReward(grader=grader)(batch)


def test_correct_wrong_and_missing_answers(grader):
    outs = score(
        grader,
        [
            "<think>try \\boxed{3}</think>So the answer is \\boxed{016}.",
            "\\boxed{\\dfrac{1}{2}}",
            "\\boxed{17}",
            "I am not sure.",
            "\\boxed{80}",
        ],
        ["16", "0.5", "16", "16", ["080", "081"]],
    )
    assert [o.score for o in outs] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert [o.diagnostics["acc"] for o in outs] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert [o.diagnostics["no_answer"] for o in outs] == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert all(o.failed is None and o.diagnostics["grader_timeout"] == 0.0 for o in outs)


def test_missing_or_bad_gold_fails_loudly(grader):
    outs = score(grader, ["\\boxed{4}"] * 4, [None, "?", [], 4])
    assert [o.score for o in outs] == [0.0, 0.0, 0.0, 1.0]
    assert outs[0].failed == "no ground truth"
    assert outs[1].failed.startswith("unparseable ground truth: '?'")
    assert outs[2].failed.startswith("unusable ground truth: gold answer is an empty list")
    assert outs[3].failed is None


def test_no_ground_truths_at_all(grader):
    reward = GroundTruthReward(grader=grader)
    outs = reward(RolloutBatch.from_responses(["\\boxed{1}", "\\boxed{2}"]))
    assert [o.failed for o in outs] == ["no ground truth"] * 2
    assert reward.failure_counts["no ground truth"] == 2


def test_bad_responses_never_raise(grader):
    outs = score(grader, [None, 42, "", "\\boxed{"], ["1", "1", "1", "1"])
    assert [o.score for o in outs] == [0.0] * 4
    assert outs[0].failed == "unusable response: a NoneType, not a str"
    assert outs[1].failed == "unusable response: a int, not a str"
    assert outs[2].diagnostics["no_answer"] == 1.0 and outs[3].diagnostics["no_answer"] == 1.0


def test_order_independent(grader):
    responses = [f"\\boxed{{{k}}}" for k in (1, 2, 3, "\\frac{1}{2}", "0.5", "x")]
    golds = ["1", "3", "3", "0.5", "\\frac12", "y"]
    base = [o.score for o in score(grader, responses, golds)]
    perm = list(range(len(responses)))
    random.Random(0).shuffle(perm)
    shuffled = score(grader, [responses[i] for i in perm], [golds[i] for i in perm])
    assert [shuffled[perm.index(i)].score for i in range(len(responses))] == base == [1, 0, 1, 1, 1, 0]


@pytest.mark.parametrize("gold", ["1/2", "\\frac{1}{2}", ["0.5", "7"]])
def test_gold_forms(gold, grader):
    assert score(grader, ["\\boxed{0.5}"], [gold])[0].score == 1.0
