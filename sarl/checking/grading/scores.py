"""Benchmark scores from per-sample correctness: avg@k (SARL Sec. 4.1)."""

from __future__ import annotations


def avg_at_k(correct: list[list[bool]]) -> float:
    """avg@k in percent (SARL Sec. 4.1, decisions §3): per problem the mean of its k samples' 0/1 correctness,
    then the mean over problems, times 100. Every problem must have the same k >= 1 samples."""
    if not correct:
        raise ValueError("avg@k of no problems: give at least one problem's samples")
    k = len(correct[0])
    for i, samples in enumerate(correct):
        if len(samples) == 0 or len(samples) != k:
            raise ValueError(
                f"avg@k needs the same k >= 1 samples per problem: problem 0 has {k}, problem {i} has {len(samples)}"
            )
    per_problem = [sum(bool(c) for c in samples) / k for samples in correct]
    return 100.0 * sum(per_problem) / len(per_problem)
