"""EMPO: semantic entropy minimisation (Zhang et al. 2025, "Right Question is Already Half the Answer";
decisions §2.3 "EMPO").

Cluster a prompt's G responses by meaning; reward each response with the empirical probability of its
cluster, p(c) = |c| / G, whose expectation is minimised semantic entropy H = -sum_c p(c) log p(c).

- math: clusters = equivalence classes of the final `\\boxed{}` answers (math-verify, as EMPO's code).
- open_ended (SARL Sec. 4.3): clusters of the final answers (text after `</think>`) by embedding: answers
  whose unit embeddings have cosine similarity >= `threshold` are linked, and clusters are the connected
  components (single linkage), which does not depend on the order of the responses.

Responses without an answer (or whose answer could not be embedded) get reward 0; like empty answers in
EMPO's code, each counts as its own singleton cluster in G, in H and in the max cluster probability.
Confidence filter (EMPO's `confidence_lower_bound` / `confidence_upper_bound`, 0.3 / 1.0): a group whose
largest cluster probability lies outside [low, high] gets reward 0 for every response (`filtered=1`).
"""

from __future__ import annotations

import logging
import math
from collections import Counter

import numpy as np

from sarl.checking.grading.extract import extract_answers, strip_thinking
from sarl.checking.grading.grader import Grader, default_grader
from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch
from sarl.contract.threads import limited
from sarl.structure.embed.base import Embedder, embed_rows
from sarl.structure.steps import sanitize

log = logging.getLogger(__name__)

MODES = ("math", "open_ended")


def final_answer_text(text: str, answer_in_unclosed_think: bool = False) -> str | None:
    """The final answer of an open-ended response (`sarl.checking.grading.extract.strip_thinking`, the rule of the math
    answers): the text after the last `</think>`; the whole response if it has no think tags; None if the
    thinking never closed (truncated; the whole response with `answer_in_unclosed_think`) or the answer is
    empty, also once sanitised (control characters only: no text to embed, `sarl.structure.steps.sanitize`)."""
    answer = strip_thinking(text, answer_in_unclosed_think=answer_in_unclosed_think)
    return answer if sanitize(answer)[0].strip() else None


def single_linkage_clusters(vectors: np.ndarray, threshold: float) -> list[int]:
    """Connected components of the graph linking unit vectors with cosine similarity >= threshold.

    Labels follow the first member's position, so a permutation of the rows permutes the labels only.
    """
    n = len(vectors)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    similar = (vectors @ vectors.T) >= threshold
    for i, j in zip(*np.nonzero(np.triu(similar, k=1))):
        parent[root(int(j))] = root(int(i))
    first: dict[int, int] = {}
    return [first.setdefault(root(i), len(first)) for i in range(n)]


class EMPOReward(RewardFunction):
    """Reward = empirical probability of the response's semantic cluster within its group (EMPO).

    Diagnostics: `cluster_prob` (p of the response's cluster; 0 without an answer), `semantic_entropy`
    (per group, copied to its rows), `max_cluster_prob` (per group), `filtered` (1 if the confidence filter
    zeroed the group), `no_answer`.
    """

    group_reward = True  # needs all rollouts of a prompt together (RolloutBatch.group_ids)
    failure_label = "EMPO reward"

    def __init__(
        self,
        mode: str = "math",
        threshold: float = 0.9,
        low: float = 0.3,
        high: float = 1.0,
        embedder: Embedder | None = None,
        grader: Grader | None = None,
        answer_in_unclosed_think: bool = False,
        threads: int | None = 1,
    ) -> None:
        super().__init__(threads)
        if mode not in MODES:
            raise ValueError(f"EMPO mode {mode!r} not found; choose one of: {', '.join(MODES)}")
        if mode == "open_ended" and embedder is None:
            raise ValueError("EMPO mode 'open_ended' clusters answers by embedding: pass an embedder")
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"EMPO filter needs 0 <= low <= high <= 1, got low={low}, high={high}")
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(f"cosine similarity threshold must lie in [-1, 1], got {threshold}")
        self.mode = mode
        self.threshold = float(threshold)
        self.low = float(low)
        self.high = float(high)
        self.embedder = embedder
        self.grader = grader
        self.answer_in_unclosed_think = (
            answer_in_unclosed_think  # sarl.checking.grading.extract.extract_answer's switch
        )

    def check_ready(self) -> str | None:
        """Why the embedder cannot be used (`sarl.contract.reward.Reward.check_ready`), None if it can or
        if there is none (the math setting groups answers by equivalence and embeds nothing)."""
        if self.embedder is None:
            return None
        # deferred: imports scikit-learn, networkx and pandas (sarl.structure.reward)
        from sarl.structure.reward import embedder_problem

        return embedder_problem(self.embedder)

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        unclosed = self.answer_in_unclosed_think
        answers, failed = extract_answers(batch.responses, answer_in_unclosed_think=unclosed)
        vectors = None
        if self.mode != "math":
            answers = [
                final_answer_text(r, unclosed) if i not in failed else None for i, r in enumerate(batch.responses)
            ]
            texts = {i: sanitize(a)[0] for i, a in enumerate(answers) if a is not None and i not in failed}
            vectors = embed_rows(self.embedder, texts, len(answers), failed)
        out: list[RewardOutput | None] = [None] * len(batch)
        for rows in batch.groups().values():
            answered = [i for i in rows if answers[i] is not None and i not in failed]
            labels = self._clusters(answered, answers, vectors)
            sizes = Counter(labels.values())
            g = len(rows)
            # every response without a usable answer is a singleton cluster (EMPO's code: empty answers)
            probs = [n / g for n in sizes.values()] + [1 / g] * (g - len(answered))
            entropy = -sum(p * math.log(p) for p in probs)  # semantic entropy H (EMPO)
            max_prob = max(probs)
            filtered = not self.low <= max_prob <= self.high  # EMPO confidence filter
            for i in rows:
                p = sizes[labels[i]] / g if i in labels else 0.0
                diag = {
                    "cluster_prob": p,
                    "semantic_entropy": entropy,
                    "max_cluster_prob": max_prob,
                    "filtered": float(filtered),
                    "no_answer": float(answers[i] is None),
                }
                out[i] = RewardOutput(0.0 if filtered else p, diag, failed.get(i))
        return out  # type: ignore[return-value]

    def _clusters(self, rows: list[int], answers: list[str | None], vectors: np.ndarray | None) -> dict[int, int]:
        """Cluster label per answered row of one group."""
        if not rows:
            return {}
        if self.mode == "math":
            grader = self.grader or default_grader()
            labels, _ = grader.classes([answers[i] for i in rows])
        else:
            with limited(self.threads):  # the group's cosine similarities: the reward's thread cap
                labels = single_linkage_clusters(vectors[rows].astype(np.float64), self.threshold)
        return dict(zip(rows, labels))
