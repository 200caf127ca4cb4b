"""Benchmark metrics from per-problem sample correctness (docs/decisions.md §3.1): avg@k, the unbiased pass@k of
n samples, and pass@1 as mean ± std over seeds. All in percent.

- avg@k (SARL Sec. 4.1; GRP Sec. 4.1): per problem the mean 0/1 correctness of its k samples, then the mean over
  problems (`sarl.checking.grading.scores.avg_at_k`).
- pass@k from n >= k samples of which c are correct: 1 - C(n-c, k) / C(n, k), the unbiased estimator of Chen et
  al. 2021 (*Evaluating Large Language Models Trained on Code*, arXiv:2107.03374, Sec. 2.1), computed as their
  numpy code does, as a product that never forms the binomials; then the mean over problems (EVOL-RL Table 1:
  pass@1 and pass@16 of 32 rollouts).
- pass@1 over seeds (Structured Reasoning Sec. 5.1, Tables 2-4 and 10): sample s of every problem is drawn with
  seed s; pass@1 of seed s is the share of problems whose sample s is correct; reported as the mean and the
  sample standard deviation (ddof=1) of those per-seed values.

A metric is named in a protocol (conf/eval/protocol/) as `avg@k`, `pass@K` (K an integer) or `pass@1_seeds`.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

from sarl.checking.grading.scores import avg_at_k

SEED_STD_DDOF = 1  # the std over seeds is the sample standard deviation (decisions §3.1)
METRIC_PATTERN = re.compile(r"^(avg@k|pass@(\d+)|pass@1_seeds)$")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples drawn without replacement from n (c correct) is correct:
    1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i), as Chen et al. 2021's numpy code computes it."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k in percent: the mean over problems of `pass_at_k(n, c, k)` of each problem's samples."""
    if not correct:
        raise ValueError("pass@k of no problems: give at least one problem's samples")
    values = [pass_at_k(len(samples), sum(bool(s) for s in samples), k) for samples in correct]
    return 100.0 * sum(values) / len(values)


def mean_std(values: Sequence[float], ddof: int = SEED_STD_DDOF) -> tuple[float, float | None]:
    """The mean and standard deviation (`ddof` degrees of freedom); the std is None for fewer than ddof + 1
    values."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean ± std of no values")
    mu = sum(values) / len(values)
    if len(values) <= ddof:
        return mu, None
    return mu, math.sqrt(sum((v - mu) ** 2 for v in values) / (len(values) - ddof))


def per_seed_pass_at_1(correct: Sequence[Sequence[bool]]) -> list[float]:
    """pass@1 in percent of each seed: sample s of every problem is the response drawn with seed s."""
    if not correct:
        raise ValueError("pass@1 over seeds of no problems")
    n = len(correct[0])
    if n == 0 or any(len(samples) != n for samples in correct):
        raise ValueError("pass@1 over seeds needs one sample per seed for every problem (the same count)")
    return [100.0 * sum(bool(samples[s]) for samples in correct) / len(correct) for s in range(n)]


def check_metric(name: str, n: int) -> None:
    """A ValueError unless `name` is a known metric computable from n samples per problem."""
    match = METRIC_PATTERN.match(name)
    if match is None:
        raise ValueError(f"metric {name!r} not known; choose avg@k, pass@K (K an integer) or pass@1_seeds")
    if match.group(2) is not None and not 1 <= int(match.group(2)) <= n:
        raise ValueError(f"metric {name}: needs at least {match.group(2)} samples per problem, the protocol has {n}")


def benchmark_metrics(correct: Sequence[Sequence[bool]], metrics: Sequence[str]) -> dict[str, float | list | None]:
    """The named metrics (`avg@<n>`, `pass@K`, `pass@1_mean` / `pass@1_std` / `pass@1_per_seed`) of one benchmark,
    from each problem's samples' correctness."""
    n = len(correct[0]) if correct else 0
    out: dict[str, float | list | None] = {}
    for name in metrics:
        check_metric(name, n)
        if name == "avg@k":
            out[f"avg@{n}"] = avg_at_k([list(s) for s in correct])
        elif name == "pass@1_seeds":
            per_seed = per_seed_pass_at_1(correct)
            out["pass@1_mean"], out["pass@1_std"] = mean_std(per_seed)
            out["pass@1_per_seed"] = per_seed
        else:
            out[name] = mean_pass_at_k(correct, int(name.split("@")[1]))
    return out
