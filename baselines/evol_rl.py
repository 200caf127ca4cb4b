"""EVOL-RL: majority selection + novelty variation (Zhou et al. 2025, EVOL-RL; decisions §2.4 "EVOL-RL").

Per prompt with G responses (EVOL-RL App. B.2, C.4, C.5):
1. Validity (C.4): the content of the last `\\boxed{}` must contain a digit; invalid -> r = -1.
2. Majority (B.2): y_i = +1 if the answer is in the majority class of the valid answers (TTRL's vote,
   `baselines.ttrl.majority_vote`), else -1 (minority).
3. Novelty (B.2, C.5): unit embeddings v_i of each valid response's reasoning, S = V V^T;
   s̄_i = mean S_ij over the other responses of its own band (majority or minority),
   m_i = max S_ij over all other responses; u_i = 1 - (alpha s̄_i + (1 - alpha) m_i);
   ũ_i = (u_i - min u) / (max u - min u + eps), min/max within the band (C.5).
4. Reward (B.2): r = 0.5 + 0.5 ũ (majority, in [0.5, 1)), r = -1 + 0.5 ũ (minority, in [-1, -0.5)).
Every majority response therefore outranks every minority one.

`label="ground_truth"` is EVOL-RL App. D.4's supervised variant (GRPO with a ground-truth verifier, "RLVR", plus
EVOL-RL's components, Fig. 6): the upper band is the responses the verifier accepts
(`baselines.ground_truth.GroundTruthReward`), the lower band the others, and a response is valid when it has a final
`\\boxed{}` answer at all (C.4's digit rule serves the vote, which a verifier replaces; decisions §2.4).

Choices where the paper is silent (see the class docstring): invalid responses are not embedded and
take no part in s̄ or m (as in the authors' code); the reasoning is the `<think>` block (decisions §1 rules), or
the whole response when that is empty; cosine similarities are not clipped (the authors' code clips to
[0, 1], the paper does not). Training settings that go with it (clip_ratio_high 0.28, entropy coefficient
0.003, 64 votes / 32 trained via `sarl.contract.selection.select_for_training`, lr 5e-7, temperature 1.0; C.6)
belong to the training config, not to the reward.
"""

from __future__ import annotations

import logging
import re

import numpy as np

from baselines.ground_truth import GroundTruthReward
from baselines.ttrl import majority_vote
from sarl.checking.grading.extract import extract_answers
from sarl.checking.grading.grader import Grader, default_grader
from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch
from sarl.contract.threads import limited
from sarl.structure.embed.base import Embedder, embed_rows
from sarl.structure.steps import extract_reasoning, sanitize

log = logging.getLogger(__name__)

# where the upper band comes from: TTRL's vote (B.2) or a verifier (App. D.4)
LABEL_SOURCES = ("majority", "ground_truth")

_DIGIT = re.compile(r"\d")


def is_valid_answer(answer: str | None) -> bool:
    """EVOL-RL App. C.4: a final `\\boxed{}` answer that contains at least one digit."""
    return answer is not None and _DIGIT.search(answer) is not None


def reasoning_text(response: str) -> str:
    """The reasoning part that EVOL-RL embeds: the `<think>` block (decisions §1), else the whole response."""
    clean, _ = sanitize(response)
    reasoning, _, _ = extract_reasoning(clean, "whole")
    return reasoning.strip() or clean.strip()


def novelty_scores(
    sim: np.ndarray, majority: np.ndarray, alpha: float = 0.5, eps: float = 1e-8
) -> tuple[np.ndarray, np.ndarray]:
    """Raw novelty u (NaN where undefined) and band-normalised novelty ũ for one group's valid responses.

    `sim` is S = V V^T (G' x G', unit vectors), `majority` the boolean band of each response.
    EVOL-RL App. B.2: u_i = 1 - (alpha s̄_i + (1 - alpha) m_i); App. C.5: ũ = (u - min) / (max - min + eps)
    within each band. Edge cases (paper silent): a response alone in its band has no s̄_i, so u_i = 1 - m_i;
    a response alone in the group has no m_i either, so u_i is undefined (NaN). Both are alone in their band,
    where min-max normalisation gives ũ = 0 whatever u is, so neither choice changes a reward.
    """
    n = len(sim)
    u = np.full(n, np.nan)
    for i in range(n):
        others = np.arange(n) != i
        if not others.any():
            continue
        m_i = sim[i, others].max()  # max similarity to any other response (B.2)
        peers = others & (majority == majority[i])
        if peers.any():
            s_bar = sim[i, peers].mean()  # mean similarity within its own band (B.2)
            u[i] = 1.0 - (alpha * s_bar + (1.0 - alpha) * m_i)  # EVOL-RL App. B.2
        else:
            u[i] = 1.0 - m_i
    u_tilde = np.zeros(n)
    for band in (majority, ~majority):
        members = band & ~np.isnan(u)
        if members.any():
            lo, hi = u[members].min(), u[members].max()
            u_tilde[members] = (u[members] - lo) / (hi - lo + eps)  # EVOL-RL App. C.5
    return u, u_tilde


class EvolRLReward(RewardFunction):
    """EVOL-RL reward: -1 invalid; 0.5 + 0.5 ũ majority; -1 + 0.5 ũ minority (EVOL-RL App. B.2).

    Diagnostics: `valid`, `majority` (1 for the majority band), `majority_ratio` (majority class size /
    group size), `novelty` (raw u_i, absent when undefined), `novelty_normalized` (ũ_i, valid rows).
    With `label="ground_truth"` (App. D.4) the bands are the verifier's: `correct` and `correct_ratio` in place of
    `majority` and `majority_ratio`; a row whose gold is missing or unusable is invalid and `failed` with the
    ground-truth reward's reason.

    Decisions where the paper is silent:
    - invalid responses are neither embedded nor part of s̄_i or m_i (the authors' code drops them too);
      "any other response in the entire batch" (B.2) is read as the other valid responses of the prompt;
    - a group of size 1, or a band of size 1, gets ũ = 0 (the C.5 formula with eps), so r = 0.5 or -1;
      the authors' code gives 1.0 / -0.5 there and 0.75 / -0.75 when all u in a band are equal, the paper's
      formula gives ũ = 0: we follow the paper;
    - all responses invalid: every r = -1, majority_ratio = 0;
    - a valid response whose reasoning cannot be embedded gets `failed` with the reason and ũ = 0 (the
      bottom of its band: the vote still counts, the novelty is unknown), and the others' s̄, m are
      computed without it; never random vectors (the authors' code substituted random embeddings).
    """

    group_reward = True  # needs all rollouts of a prompt together (RolloutBatch.group_ids)
    failure_label = "EVOL-RL reward"

    def __init__(
        self,
        embedder: Embedder,
        alpha: float = 0.5,
        eps: float = 1e-8,
        grader: Grader | None = None,
        answer_in_unclosed_think: bool = False,
        threads: int | None = 1,
        label: str = "majority",
    ) -> None:
        super().__init__(threads)
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        if label not in LABEL_SOURCES:
            raise ValueError(
                f"reward.label={label!r}: must be one of {list(LABEL_SOURCES)} (EVOL-RL App. B.2 / App. D.4)"
            )
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.embedder = embedder
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.grader = grader
        self.answer_in_unclosed_think = (
            answer_in_unclosed_think  # sarl.checking.grading.extract.extract_answer's switch
        )
        self.label = label

    def check_ready(self) -> str | None:
        """Why the embedder cannot be used (`sarl.contract.reward.Reward.check_ready`), None if it can."""
        # deferred: imports scikit-learn, networkx and pandas (sarl.structure.reward)
        from sarl.structure.reward import embedder_problem

        return embedder_problem(self.embedder)

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        grader = self.grader or default_grader()
        answers, failed = extract_answers(batch.responses, answer_in_unclosed_think=self.answer_in_unclosed_think)
        graded = None
        if self.label == "ground_truth":  # App. D.4: the verifier's bands; valid = a final \\boxed{} answer
            graded = GroundTruthReward(grader, self.answer_in_unclosed_think).score(batch)
            failed.update({i: g.failed for i, g in enumerate(graded) if g.failed and i not in failed})
            valid = [a is not None and i not in failed for i, a in enumerate(answers)]
        else:
            valid = [is_valid_answer(a) for a in answers]  # App. C.4
        band, ratio = ("correct", "correct_ratio") if graded is not None else ("majority", "majority_ratio")
        # the reasoning of each valid response is embedded (App. B.2)
        texts = {i: reasoning_text(batch.responses[i]) for i, ok in enumerate(valid) if ok}
        vectors = embed_rows(self.embedder, texts, len(batch), failed)
        out: list[RewardOutput | None] = [None] * len(batch)
        for rows in batch.groups().values():
            upper, upper_ratio = _bands(rows, answers, valid, graded, grader)
            embedded = [i for i in rows if valid[i] and i not in failed]
            u = dict.fromkeys(embedded, np.nan)
            u_tilde = {i: 0.0 for i in rows if valid[i]}
            if embedded:
                v = vectors[embedded].astype(np.float64)
                with limited(self.threads):  # the group's Gram product and novelty: the reward's thread cap
                    gram = v @ v.T
                    raw, norm = novelty_scores(gram, np.array([upper[i] for i in embedded]), self.alpha, self.eps)
                u.update(zip(embedded, raw.tolist()))
                u_tilde.update(zip(embedded, norm.tolist()))
            for i in rows:
                diag = {"valid": float(valid[i]), band: float(upper[i]), ratio: upper_ratio}
                if not valid[i]:
                    out[i] = RewardOutput(-1.0, diag, failed.get(i))  # invalid (App. B.2)
                    continue
                diag["novelty_normalized"] = u_tilde[i]
                if not np.isnan(u.get(i, np.nan)):
                    diag["novelty"] = u[i]
                # EVOL-RL App. B.2: majority (App. D.4: correct) band [0.5, 1], minority (incorrect) band [-1, -0.5]
                score = (0.5 + 0.5 * u_tilde[i]) if upper[i] else (-1.0 + 0.5 * u_tilde[i])
                out[i] = RewardOutput(score, diag, failed.get(i))
        return out  # type: ignore[return-value]


def _bands(
    rows: list[int], answers: list[str | None], valid: list[bool], graded: list[RewardOutput] | None, grader: Grader
) -> tuple[dict[int, bool], float]:
    """Which of a group's rows are in the upper band, and the band's share of the group: the majority class of the
    valid answers (App. B.2, TTRL's vote), or with a verifier's grades (App. D.4) the valid rows it accepts."""
    if graded is not None:
        upper = {i: valid[i] and graded[i].score == 1.0 for i in rows}
        return upper, sum(upper.values()) / len(rows)
    vote = majority_vote([answers[i] if valid[i] else None for i in rows], grader)
    majority = {i: vote.majority is not None and vote.labels[k] == vote.majority for k, i in enumerate(rows)}
    return majority, vote.count / len(rows)
