"""LCS reward of Structured Reasoning (Sec. 4.3 "The Longest Common Subsequence Reward", Eq. 6-7).

For the n completions of a prompt, per ordered pair (i, j), i != j:
- LCS(r_i, r_j): the longest common subsequence of their step tags (standard DP, tag equality);
- for each matched step k with token lengths l_ik, l_jk, the length suppression factor
  ratio_k = l_jk / (2 l_ik) if l_ik > l_jk, else 1 - l_ik / (2 l_jk);
- L_lcs = sum_k ratio_k l_ik; L_i = the total token length of r_i's steps;
- Score(i, j) = L_lcs/L_i (both correct), -L_lcs/L_i (both wrong), 1 - L_lcs/L_i (i correct, j wrong),
  -1 + L_lcs/L_i (i wrong, j correct)  (Eq. 6);
- r_lcs(i) = mean over j != i of Score(i, j)  (Eq. 7).
The reward is w_lcs r_lcs + w_format format (App. A.4.4: format score weight 1.0; r_lcs is already on the
format score's [-1, 1] scale, "length-normalized").

Decisions where the paper is silent:
- several LCSs of equal length: backtracking from the ends of both sequences, a match is taken whenever the
  tags agree, and on a tie the last step of r_i is skipped first (so matches sit as late as possible in r_j);
- an untagged step (tag "") matches nothing but counts in L_i;
- L_i = 0 (no steps, or only empty ones): L_lcs/L_i := 0; both lengths 0: ratio_k := 1/2 (its value at
  l_ik = l_jk; the term is 0 anyway);
- a group of one completion: r_lcs = 0 (no pair);
- no correct completion in the group: no LCS term, r_lcs = 0 for every completion, so the score is the
  format part alone (Sec. 4.3: "The LCS reward requires at least one correct completion as reference"; the
  paper does not say what replaces it, and 0 is the term's absence). Only completions whose correctness
  was judged count: a row without a gold answer is no reference. Such rows say so in `no_reference`.
- step lengths count the step's text without the tag markup (`sarl.contract.token_count`: the policy tokenizer
  when configured, else whitespace words);
- a completion whose correctness cannot be judged (no gold answer) takes no part in its group's pairs, scores
  `failed_score` and says why.
"""

from __future__ import annotations

from typing import Any, Sequence

from baselines.ground_truth import GroundTruthReward
from sarl.checking.grading.grader import Grader, default_grader
from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch
from sarl.contract.token_count import TokenCounter
from sarl.formats.tags import format_score, parse_structured


def lcs_matches(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    """Index pairs (k_a, k_b) of a longest common subsequence of `a` and `b` ("" matches nothing), in order.

    The standard DP table dp[i][j] (Structured Reasoning Sec. 4.3), each row computed bit-parallel (Hyyro's
    bit-vector LCS): row i is one integer whose bit j is set when dp[i][j + 1] = dp[i][j], so dp[i][j] is j less
    the set bits below j. A few integer operations of |b| bits per row instead of |b| Python steps: a response of
    10,000 steps against another costs milliseconds, not seconds. The backtracking reads the same table; ties as in the
    module docstring."""
    n, m = len(a), len(b)
    if not n or not m:
        return []
    full = (1 << m) - 1
    where: dict[str, int] = {}  # tag -> the bits of b's steps with that tag
    for j, tag in enumerate(b):
        if tag:
            where[tag] = where.get(tag, 0) | (1 << j)
    rows = [full]  # dp[0][j] = 0: no increase anywhere
    v = full
    for tag in a:
        u = v & where.get(tag, 0) if tag else 0
        v = ((v + u) | (v - u)) & full  # v - u = v & ~match (u is a subset of v)
        rows.append(v)

    def dp(i: int, j: int) -> int:
        return j - (rows[i] & ((1 << j) - 1)).bit_count()

    pairs = []
    i, j = n, m
    while i > 0 and j > 0:
        if a[i - 1] and a[i - 1] == b[j - 1]:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif dp(i - 1, j) >= dp(i, j - 1):
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


def length_ratio(l_i: float, l_j: float) -> float:
    """Structured Reasoning Sec. 4.3 length suppression factor: l_j / (2 l_i) if l_i > l_j, else
    1 - l_i / (2 l_j)."""
    if l_i > l_j:
        return l_j / (2.0 * l_i)
    if l_j == 0:
        return 0.5  # both empty (decision; the term ratio * l_i is 0 anyway)
    return 1.0 - l_i / (2.0 * l_j)


def weighted_lcs_share(
    tags_i: Sequence[str], lengths_i: Sequence[float], tags_j: Sequence[str], lengths_j: Sequence[float]
) -> float:
    """L_lcs / L_i with L_lcs = sum_k ratio_k l_ik over the LCS matches (Structured Reasoning Sec. 4.3);
    0 if L_i = 0."""
    total = float(sum(lengths_i))
    if total <= 0:
        return 0.0
    matched = sum(length_ratio(lengths_i[a], lengths_j[b]) * lengths_i[a] for a, b in lcs_matches(tags_i, tags_j))
    return matched / total


def pair_score(share: float, correct_i: bool, correct_j: bool) -> float:
    """Structured Reasoning Eq. (6) from share = L_lcs / L_i."""
    if correct_i and correct_j:
        return share
    if not correct_i and not correct_j:
        return -share
    if correct_i:
        return 1.0 - share
    return -1.0 + share


def lcs_rewards(tag_seqs: list[list[str]], step_lengths: list[list[int]], correct: list[bool]) -> list[float]:
    """r_lcs of every completion of one prompt (Structured Reasoning Eq. 6-7): the mean of Score(i, j) over
    j != i; 0 for all when no completion is correct (Sec. 4.3, module docstring)."""
    n = len(tag_seqs)
    if len(step_lengths) != n or len(correct) != n:
        raise ValueError(
            f"lcs_rewards needs one entry per completion: {n} tag sequences, {len(step_lengths)} length lists, "
            f"{len(correct)} correctness flags"
        )
    for i, (tags, lengths) in enumerate(zip(tag_seqs, step_lengths)):
        if len(tags) != len(lengths):
            raise ValueError(f"completion {i} has {len(tags)} tags but {len(lengths)} step lengths")
        if any(x < 0 for x in lengths):
            raise ValueError(f"completion {i} has a negative step length: {list(lengths)}")
    if n < 2 or not any(correct):  # Sec. 4.3: LCS "requires at least one correct completion as reference"
        return [0.0] * n
    out = []
    for i in range(n):
        total = 0.0
        for j in range(n):
            if j != i:
                share = weighted_lcs_share(tag_seqs[i], step_lengths[i], tag_seqs[j], step_lengths[j])
                total += pair_score(share, bool(correct[i]), bool(correct[j]))
        out.append(total / (n - 1))  # Structured Reasoning Eq. (7)
    return out


class LCSReward(RewardFunction):
    """Structured Reasoning's LCS group reward: lcs_weight * r_lcs + format_weight * format.

    Diagnostics: `acc`, `format`, `r_lcs`, `n_steps`, `untagged_prefix`, `truncated`, `group_size` (the
    completions compared), `no_reference` (1 when none of them is correct: no LCS term, Sec. 4.3).
    Correctness is the ground-truth check (`sarl.checking.grading`, last `\\boxed{}` after `</think>`).
    """

    group_reward = True  # Eq. (7) compares a completion with its siblings (RolloutBatch.group_ids)
    diagnostic_keys = (
        "acc",
        "format",
        "r_lcs",
        "n_steps",
        "untagged_prefix",
        "truncated",
        "group_size",
        "no_reference",
    )
    failure_label = "LCS reward"

    def __init__(
        self,
        lcs_weight: float = 1.0,
        format_weight: float = 1.0,
        tokenizer: Any = None,
        failed_score: float = 0.0,
        grader: Grader | None = None,
    ) -> None:
        super().__init__()
        self.lcs_weight = float(lcs_weight)
        self.format_weight = float(format_weight)
        self.count_tokens = TokenCounter(tokenizer)
        self.failed_score = float(failed_score)
        self.grader = grader

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        graded = GroundTruthReward(self.grader or default_grader())(batch)
        parsed = [parse_structured(r, "tags") for r in batch.responses]
        out: list[RewardOutput | None] = [None] * len(batch)
        for rows in batch.groups().values():
            judged = [i for i in rows if graded[i].failed is None]
            correct = [graded[i].diagnostics["acc"] == 1.0 for i in judged]
            r_lcs = lcs_rewards(
                [parsed[i].tag_sequence for i in judged],
                [[self.count_tokens(s.text) for s in parsed[i].steps] for i in judged],
                correct,
            )
            no_reference = float(not any(correct))
            lcs_of = dict(zip(judged, r_lcs))
            for i in rows:
                p, fmt = parsed[i], format_score(parsed[i])
                diag = {
                    "acc": graded[i].diagnostics.get("acc", 0.0),
                    "format": fmt,
                    "n_steps": float(len(p.steps)),
                    "untagged_prefix": float(p.untagged_prefix),
                    "truncated": float(p.truncated),
                    "group_size": float(len(judged)),
                    "no_reference": no_reference,
                }
                if i not in lcs_of:
                    out[i] = RewardOutput(self.failed_score, diag, graded[i].failed)
                    continue
                diag["r_lcs"] = lcs_of[i]
                out[i] = RewardOutput(self.lcs_weight * lcs_of[i] + self.format_weight * fmt, diag)
        return out  # type: ignore[return-value]
