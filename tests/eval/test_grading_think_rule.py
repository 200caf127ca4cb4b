"""One rule for where a response's answer is, held by the training rewards and the evaluation alike.

The answer is the last `\\boxed{}` after the last `</think>`; a `<think>` that never closes (a generation cut
off while thinking) has no answer; a response without think tags is answered by its whole text. The switch
`answer_in_unclosed_think=True` (conf/reward/*.yaml, conf/eval.yaml `grading.answer_in_unclosed_think`) reads
the unfinished thinking's last box instead, in training and evaluation alike.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import get_class
from omegaconf import OmegaConf

from baselines.empo import EMPOReward, final_answer_text
from baselines.evol_rl import EvolRLReward
from baselines.ground_truth import GroundTruthReward
from baselines.ttrl import TTRLReward
from eval.config import compose_eval_config
from eval.data import Problem
from eval.protocol import Benchmark
from eval.scoring import score_benchmarks
from sarl.checking.grading.extract import extract_answer, strip_thinking
from sarl.contract.reward import RolloutBatch
from sarl.structure.embed.base import Embedder

# name -> (response, its answer under the rule, its answer with answer_in_unclosed_think=True)
RESPONSES = {
    "closed think": ("<think>maybe \\boxed{3}</think>So the answer is \\boxed{4}.", "4", "4"),
    "unclosed think": ("<think>maybe \\boxed{3}, or else", None, "3"),
    "no think": ("The answer is \\boxed{4}.", "4", "4"),
    "</think> only": ("maybe \\boxed{3}</think>So \\boxed{4}", "4", "4"),  # <think> was in the prompt
    "</think> only, no box after": ("maybe \\boxed{3}</think>no box here", None, None),
    "think reopened after </think>": ("<think>a</think>\\boxed{4}<think>maybe \\boxed{3}", "3", "3"),  # after the last
}
NAMES = list(RESPONSES)
TEXTS = [RESPONSES[n][0] for n in NAMES]
CANDIDATES = ("3", "4")  # every answer above is one of these or None


class HashEmbedder(Embedder):
    """A deterministic stand-in for an embedding model (EVOL-RL embeds the reasoning of valid responses)."""

    def _embed_unique(self, texts):
        vectors = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:32], dtype=np.uint8) + 1.0 for t in texts]
        return vectors, {}


def expected(unclosed: bool) -> list[str | None]:
    return [RESPONSES[n][2 if unclosed else 1] for n in NAMES]


def answer_from_correctness(correct: dict[str, bool]) -> str | None:
    """The answer a reward or the evaluation graded, from whether it was correct against each candidate gold."""
    matched = [c for c in CANDIDATES if correct[c]]
    assert len(matched) <= 1
    return matched[0] if matched else None


def evaluation_answers(unclosed: bool) -> tuple[list[str | None], list[str | None]]:
    """`eval.run`'s answers and, from its correctness against each candidate gold, the answers it graded."""
    cfg = OmegaConf.create({"grading": {"timeout_s": 5.0, "answer_in_unclosed_think": unclosed}})
    benchmarks, records = [], {}
    for gold in CANDIDATES:
        bench = f"gold{gold}"
        problems = [Problem(bench, n, i, [{"role": "user", "content": "q"}], [gold]) for i, n in enumerate(NAMES)]
        benchmarks.append(Benchmark(bench, "math", problems, 1))
        for name, text in zip(NAMES, TEXTS):
            records[(bench, name)] = {0: {"text": text, "n_tokens": 9, "truncated": False, "finish_reason": "stop"}}
    _, _, rows = score_benchmarks(cfg, benchmarks, records, {}, {}, {}, None)
    by_gold = {gold: [r for r in rows if r["benchmark"] == f"gold{gold}"] for gold in CANDIDATES}
    extracted = [r["answers"][0] for r in by_gold[CANDIDATES[0]]]
    graded = [
        answer_from_correctness({gold: by_gold[gold][k]["samples"][0]["correct"] for gold in CANDIDATES})
        for k in range(len(NAMES))
    ]
    return extracted, graded


def batch_with_gold(gold: str) -> RolloutBatch:
    return RolloutBatch([""] * len(TEXTS), TEXTS, ground_truths=[gold] * len(TEXTS))


def ground_truth_answers(unclosed: bool, grader) -> list[str | None]:
    reward = GroundTruthReward(grader, answer_in_unclosed_think=unclosed)
    scores = {gold: [o.score == 1.0 for o in reward(batch_with_gold(gold))] for gold in CANDIDATES}
    return [answer_from_correctness({g: scores[g][k] for g in CANDIDATES}) for k in range(len(TEXTS))]


def ttrl_answers(unclosed: bool, grader) -> list[str | None]:
    """TTRL's answers through its diagnostics against the hidden gold (`acc`), one response per group."""
    reward = TTRLReward(n_votes=1, n_samples=1, grader=grader, answer_in_unclosed_think=unclosed)
    acc = {gold: [o.diagnostics["acc"] == 1.0 for o in reward(batch_with_gold(gold))] for gold in CANDIDATES}
    return [answer_from_correctness({g: acc[g][k] for g in CANDIDATES}) for k in range(len(TEXTS))]


def sibling_batch() -> RolloutBatch:
    """Each response in a group with the answers 3, 3 and 4, so its cluster or vote band names its answer."""
    responses, groups = [], []
    for k, text in enumerate(TEXTS):
        responses += [text, "\\boxed{3}", "\\boxed{3}", "\\boxed{4}"]
        groups += [str(k)] * 4
    return RolloutBatch([""] * len(responses), responses, group_ids=groups)


def empo_answers(unclosed: bool, grader) -> list[str | None]:
    """EMPO (math): the response's cluster probability is 3/4 with answer 3, 2/4 with 4, 0 without."""
    out = EMPOReward(mode="math", grader=grader, answer_in_unclosed_think=unclosed)(sibling_batch())
    by_prob = {0.75: "3", 0.5: "4", 0.0: None}
    return [by_prob[out[4 * k].diagnostics["cluster_prob"]] for k in range(len(TEXTS))]


def evol_rl_answers(unclosed: bool, grader) -> list[str | None]:
    """EVOL-RL: invalid without an answer; with answer 3 in the majority band; with 4 a tie of 2 against 2
    that the canonical order gives to 3, so minority."""
    reward = EvolRLReward(HashEmbedder(), grader=grader, answer_in_unclosed_think=unclosed)
    out = reward(sibling_batch())
    answers = []
    for k in range(len(TEXTS)):
        d = out[4 * k].diagnostics
        answers.append(None if not d["valid"] else "3" if d["majority"] else "4")
    return answers


@pytest.mark.parametrize("unclosed", [False, True], ids=["rule", "answer_in_unclosed_think"])
def test_training_rewards_and_evaluation_find_the_same_answers(unclosed, grader):
    want = expected(unclosed)
    assert [extract_answer(t, answer_in_unclosed_think=unclosed) for t in TEXTS] == want
    extracted, graded = evaluation_answers(unclosed)
    assert extracted == want
    assert graded == want
    assert ground_truth_answers(unclosed, grader) == want
    assert ttrl_answers(unclosed, grader) == want
    assert empo_answers(unclosed, grader) == want
    assert evol_rl_answers(unclosed, grader) == want


def test_no_answer_is_flagged_alike(grader):
    """The rewards' `no_answer` diagnostic and the evaluation's missing answer fall on the same responses."""
    batch = batch_with_gold("4")
    missing = [a is None for a in expected(False)]
    assert [o.diagnostics["no_answer"] == 1.0 for o in GroundTruthReward(grader)(batch)] == missing
    assert [o.diagnostics["no_answer"] == 1.0 for o in TTRLReward(1, 1, grader=grader)(batch)] == missing
    assert [o.diagnostics["no_answer"] == 1.0 for o in EMPOReward(grader=grader)(batch)] == missing
    assert [a is None for a in evaluation_answers(False)[0]] == missing


@pytest.mark.parametrize("unclosed", [False, True])
def test_open_ended_answers_follow_the_same_rule(unclosed):
    """EMPO's open-ended final answers and the WildBench judge's input are `strip_thinking`'s part."""
    for text in TEXTS:
        part = strip_thinking(text, answer_in_unclosed_think=unclosed)
        assert final_answer_text(text, unclosed) == (part or None)
    assert strip_thinking("<think>cut off", answer_in_unclosed_think=unclosed) == ("<think>cut off" if unclosed else "")


@pytest.mark.parametrize("name", ["ground_truth", "ttrl", "empo", "empo_open_ended", "evol_rl"])
def test_the_switch_is_in_the_reward_configs_and_off(name):
    conf = str(Path(__file__).resolve().parents[2] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        reward = compose(config_name="score", overrides=[f"reward={name}"]).reward
    assert reward.answer_in_unclosed_think is False
    assert "answer_in_unclosed_think" in inspect.signature(get_class(reward._target_)).parameters


def test_the_switch_is_in_the_evaluation_config_and_off():
    assert compose_eval_config([]).grading.answer_in_unclosed_think is False
