"""Ground-truth reward (SARL Table 2 "w/ Ground-Truth"; decisions §2.1 "Ground truth").

r = 1 if the final answer (last `\\boxed{}` after `</think>`) is equivalent to the gold answer under
math-verify, `verify(gold, pred)` with the gold first; else 0. A gold may be a list of accepted answers
(any match counts).
"""

from __future__ import annotations

from sarl.checking.grading.extract import extract_answer
from sarl.checking.grading.gold import gold_answers
from sarl.checking.grading.grader import Grader, default_grader
from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch


class GroundTruthReward(RewardFunction):
    """1 if the response's answer matches its gold answer, else 0.

    Diagnostics: `acc` (= the score), `no_answer` (no `\\boxed{}` answer; score 0), `grader_timeout`
    (a math-verify check timed out and counted as "not equivalent"). A row whose gold answer is missing
    (None), malformed or does not parse gets score 0 and `failed` with the reason: never a silent 0 or 1.
    Gold answers are validated when the data is prepared (`sarl.checking.grading.gold.validate_gold_rows`); the runtime
    check is the safety net. A response whose `<think>` never closes has no answer, as in the evaluation;
    `answer_in_unclosed_think=True` takes the last box of the unfinished thinking instead
    (`sarl.checking.grading.extract.extract_answer`).
    """

    diagnostic_keys = ("acc", "no_answer", "grader_timeout")
    failure_label = "ground-truth reward"

    def __init__(self, grader: Grader | None = None, answer_in_unclosed_think: bool = False) -> None:
        super().__init__()
        self.grader = grader
        self.answer_in_unclosed_think = answer_in_unclosed_think

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        grader = self.grader or default_grader()
        golds = batch.ground_truths if batch.ground_truths is not None else [None] * len(batch)
        return [self._score(response, gold, grader) for response, gold in zip(batch.responses, golds)]

    def _score(self, response: object, gold: object, grader: Grader) -> RewardOutput:
        if gold is None:
            return RewardOutput(0.0, failed="no ground truth")
        try:
            accepted = gold_answers(gold)
        except ValueError as err:
            return RewardOutput(0.0, failed=f"unusable ground truth: {err}")
        unparseable = [a for a in accepted if not grader.parses(a).ok]
        if unparseable:
            return RewardOutput(0.0, failed=f"unparseable ground truth: {unparseable[0]!r} (validate it at data prep)")
        if not isinstance(response, str):
            return RewardOutput(0.0, failed=f"unusable response: a {type(response).__name__}, not a str")
        answer = extract_answer(response, answer_in_unclosed_think=self.answer_in_unclosed_think)
        if answer is None:
            return RewardOutput(0.0, {"acc": 0.0, "no_answer": 1.0, "grader_timeout": 0.0})
        verdict = grader.check_any(answer, accepted)  # verify(gold, pred), gold first (decisions §2)
        diagnostics = {"acc": float(verdict.ok), "no_answer": 0.0, "grader_timeout": float(verdict.timed_out)}
        return RewardOutput(float(verdict.ok), diagnostics)
