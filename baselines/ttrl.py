"""TTRL: majority vote as the pseudo-label (Zuo et al. 2025, arXiv:2504.16084; decisions §2.2 "TTRL").

Per prompt (group): extract each response's final answer (last `\\boxed{}`), group equivalent answers
(math equivalence, not raw strings), take the largest class as the pseudo-label, and reward 1 for an answer
in that class, else 0; no answer -> 0.

`n_votes` rollouts vote and a seeded random `n_samples` of them are trained on (TTRL: 64 votes / 32 trained;
SARL's comparison: 8 / 8). The reward scores all `n_votes` rows (every vote is needed); the backend then
keeps `TTRLReward.training_rows(group_ids)` (or `select_for_training`) before computing advantages:

    outputs = ttrl(batch)                       # all n_votes rows of every prompt
    keep = ttrl.training_rows(batch.group_ids)  # n_samples rows per prompt, sorted row indices
    batch, outputs = batch[keep], [outputs[i] for i in keep]
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from sarl.checking.grading.extract import extract_answers
from sarl.checking.grading.gold import gold_answers
from sarl.checking.grading.grader import Grader, default_grader
from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch
from sarl.contract.selection import select_for_training

log = logging.getLogger(__name__)


@dataclass
class Vote:
    """A group's majority vote: class id per answer, the winning class, its representative and size."""

    labels: list[int | None]
    majority: int | None
    label: str | None
    count: int


def majority_vote(answers: Sequence[str | None], grader: Grader) -> Vote:
    """The largest class of equivalent answers (None = no answer, never votes).

    Ties go to the class that comes first in the canonical order of `Grader.classes` (its representative
    is the shortest, then lexicographically smallest answer), so the vote does not depend on row order.
    """
    labels, representatives = grader.classes(list(answers))
    sizes = Counter(c for c in labels if c is not None)
    if not sizes:
        return Vote(labels, None, None, 0)
    winner = min(sizes, key=lambda c: (-sizes[c], len(representatives[c]), representatives[c]))
    return Vote(labels, winner, representatives[winner], sizes[winner])


class TTRLReward(RewardFunction):
    """Majority-vote reward: 1 if the response's answer is in its group's largest answer class, else 0.

    Diagnostics: `majority_ratio` (largest class size / group size, no-answer rows included as in TTRL's
    code), `no_answer`, and, against the hidden gold when `batch.ground_truths` has it (NEVER used for the
    reward): `label_accuracy` (the pseudo-label is equivalent to the gold; per group, copied to its rows),
    `acc` (the response is correct), `reward_accuracy` (reward == acc).

    A group whose size differs from `n_votes` is still scored (the vote is well defined for any size) but
    counted in `warning_counts["group_size_mismatch"]` and logged; `training_rows` raises on it instead.
    """

    group_reward = True  # needs all rollouts of a prompt together (RolloutBatch.group_ids)
    failure_label = "TTRL reward"

    def __init__(
        self,
        n_votes: int = 8,
        n_samples: int = 8,
        seed: int = 0,
        grader: Grader | None = None,
        answer_in_unclosed_think: bool = False,
    ) -> None:
        super().__init__()
        if not 1 <= n_samples <= n_votes:
            raise ValueError(f"TTRL needs 1 <= n_samples <= n_votes, got n_samples={n_samples}, n_votes={n_votes}")
        self.n_votes = n_votes
        self.n_samples = n_samples
        self.seed = seed
        self.grader = grader
        self.answer_in_unclosed_think = (
            answer_in_unclosed_think  # sarl.checking.grading.extract.extract_answer's switch
        )
        self.warning_counts: Counter[str] = Counter()

    def training_rows(self, group_ids: Sequence[str]) -> list[int]:
        """`select_for_training` with this reward's n_samples and seed; every group must have n_votes rows."""
        sizes = Counter(str(g) for g in group_ids)
        wrong = {gid: n for gid, n in sizes.items() if n != self.n_votes}
        if wrong:
            raise ValueError(f"TTRL expects n_votes={self.n_votes} rows per group; got (group id: rows) {wrong}")
        return select_for_training(group_ids, self.n_samples, self.seed)

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        grader = self.grader or default_grader()
        answers, failed = extract_answers(batch.responses, answer_in_unclosed_think=self.answer_in_unclosed_think)
        out: list[RewardOutput | None] = [None] * len(batch)
        mismatched = 0
        for rows in batch.groups().values():
            mismatched += len(rows) != self.n_votes
            vote = majority_vote([answers[i] for i in rows], grader)
            majority_ratio = vote.count / len(rows)  # TTRL: majority count / all rollouts of the prompt
            for k, i in enumerate(rows):
                in_majority = vote.majority is not None and vote.labels[k] == vote.majority
                reward = float(in_majority)
                diag = {"majority_ratio": majority_ratio, "no_answer": float(answers[i] is None)}
                diag.update(self._gold_diagnostics(answers[i], vote.label, reward, batch, i, grader))
                out[i] = RewardOutput(reward, diag, failed.get(i))
        if mismatched:
            self.warning_counts["group_size_mismatch"] += mismatched
            log.warning("TTRL: %d groups do not have n_votes=%d rows; scored anyway", mismatched, self.n_votes)
        return out  # type: ignore[return-value]

    @staticmethod
    def _gold_diagnostics(
        answer: str | None, label: str | None, reward: float, batch: RolloutBatch, i: int, grader: Grader
    ) -> dict[str, float]:
        """TTRL's label_accuracy / reward_accuracy against the hidden gold (diagnostics only)."""
        gold = batch.ground_truths[i] if batch.ground_truths is not None else None
        if gold is None:
            return {}
        try:
            accepted = gold_answers(gold)
        except ValueError:
            return {}

        def matches(x: str | None) -> bool:
            return x is not None and any(grader.check(x, g).ok for g in accepted)

        acc = float(matches(answer))
        return {"label_accuracy": float(matches(label)), "acc": acc, "reward_accuracy": float(reward == acc)}
