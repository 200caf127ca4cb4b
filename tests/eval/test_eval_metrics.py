"""eval.metrics on worked values: the unbiased pass@k of Chen et al. 2021 (and its agreement with the binomial
form), avg@k, and pass@1 as mean ± std over seeds (ddof=1, decisions §3.1)."""

import math
from math import comb

import pytest

from eval.metrics import (
    SEED_STD_DDOF,
    benchmark_metrics,
    check_metric,
    mean_pass_at_k,
    mean_std,
    pass_at_k,
    per_seed_pass_at_1,
)


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 1, 0.4),  # pass@1 = c / n
        (16, 1, 16, 1.0),  # k = n: any correct sample is drawn
        (16, 0, 1, 0.0),  # no correct sample
        (32, 0, 16, 0.0),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (10, 3, 5, 1 - comb(7, 5) / comb(10, 5)),  # 1 - 21/252
        (32, 32, 16, 1.0),
    ],
)
def test_pass_at_k_worked_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_the_binomial_estimator_without_forming_binomials():
    for n in (1, 2, 7, 32):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    assert 0.0 < pass_at_k(1000, 1, 1) < pass_at_k(1000, 1, 500) < 1.0  # stable for large n (no huge binomials)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in ((5, 6, 1), (5, 2, 6), (5, 2, 0), (5, -1, 1)):
        with pytest.raises(ValueError, match="0 <= c <= n and 1 <= k <= n"):
            pass_at_k(n, c, k)


def test_mean_pass_at_k_and_avg_at_k_over_problems():
    correct = [[True, True, True, True], [True, False, False, False]]
    assert mean_pass_at_k(correct, 1) == pytest.approx(62.5)  # pass@1 = avg@n
    assert mean_pass_at_k(correct, 2) == pytest.approx(75.0)  # (1 + 0.5) / 2
    out = benchmark_metrics(correct, ["avg@k", "pass@1", "pass@2"])
    assert out == pytest.approx({"avg@4": 62.5, "pass@1": 62.5, "pass@2": 75.0})


def test_pass_at_1_mean_and_std_over_seeds():
    # sample s of each problem is seed s: per-seed pass@1 100, 50, 50, 50 -> mean 62.5, sample std 25
    correct = [[True, True, True, True], [True, False, False, False]]
    assert per_seed_pass_at_1(correct) == [100.0, 50.0, 50.0, 50.0]
    out = benchmark_metrics(correct, ["pass@1_seeds"])
    assert out["pass@1_mean"] == pytest.approx(62.5) and out["pass@1_std"] == pytest.approx(25.0)
    assert out["pass@1_per_seed"] == [100.0, 50.0, 50.0, 50.0]


def test_std_over_seeds_is_the_sample_std():
    assert SEED_STD_DDOF == 1
    mu, sd = mean_std([30.0, 50.0])
    assert (mu, sd) == pytest.approx((40.0, math.sqrt(200.0)))  # ddof=1; ddof=0 would give 10
    assert mean_std([30.0, 50.0], ddof=0) == pytest.approx((40.0, 10.0))
    assert mean_std([42.0]) == (42.0, None)  # one seed: no std
    with pytest.raises(ValueError):
        mean_std([])


def test_metric_names_are_checked_against_the_samples():
    check_metric("pass@16", 32)
    with pytest.raises(ValueError, match="needs at least 16 samples"):
        check_metric("pass@16", 8)
    with pytest.raises(ValueError, match="choose avg@k, pass@K"):
        check_metric("maj@16", 32)
    with pytest.raises(ValueError, match="one sample per seed"):
        per_seed_pass_at_1([[True, False], [True]])
