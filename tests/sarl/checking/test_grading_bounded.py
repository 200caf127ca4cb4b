"""The grading cost bound (sarl.checking.grading.cost, the budget in sarl.checking.grading.worker; docs/grading.md
"Bounded cost").

Short pathological answers (power towers, factorial towers, huge binomials, sums over 10^12 terms, calculus,
deep `\\left(` nesting) are graded "not equivalent" within a bound, without a worker restart, and an answer
written exactly as its gold is still correct. The 50 ms figure is measured by `python -m sarl.bench
suite=grading`; the bound asserted here is generous, so that a loaded machine does not fail the tests.
"""

import json
import signal
import time
from pathlib import Path

import pytest

from sarl.bench.grading import SHORT_PATHOLOGICAL, answer_mix
from sarl.checking.grading import worker
from sarl.checking.grading.cost import EXPENSIVE, HOPELESS, ORDINARY, estimate_cost
from sarl.checking.grading.extract import extract_answer
from sarl.checking.grading.gold import validate_gold
from sarl.checking.grading.grader import Grader, Verdict, _normalise

# Per answer. The bench measures the real figure (about 50 ms); this wall-clock bound is one a loaded 2-core CI
# machine keeps: half the worker's 5 s timeout, still far below an unbudgeted check (the 70-deep `\left(` nesting
# below runs past 30 s without the budget). A kill at the timeout is ruled out apart, by the verdict and the
# worker-start count.
UNIT_TEST_BOUND_S = 2.5
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "eval" / "math_verify_cases.json"
OVER_BUDGET = Verdict(False, timed_out=True, budget_exceeded=True)


@pytest.fixture(scope="module")
def warm_grader():
    """One grader whose worker has paid sympy's first-use costs (numbers, intervals, polynomials)."""
    g = Grader(timeout_s=5.0)
    for pred, gold in (("\\frac{1}{2}", "0.5"), ("2", "1e3"), ("(1, 2)", "[1, 2)"), ("x^2+1", "1+x^2")):
        g.check(pred, gold)
    yield g
    g.close()


@pytest.mark.parametrize("answer", SHORT_PATHOLOGICAL)
def test_each_short_pathological_answer_is_graded_within_the_bound(answer, warm_grader):
    starts = warm_grader.stats()["worker_starts"]
    start = time.perf_counter()
    verdict = warm_grader.check(answer, "5")
    elapsed = time.perf_counter() - start
    assert not verdict.ok
    assert elapsed < UNIT_TEST_BOUND_S, f"{answer[:60]!r} took {elapsed:.3f} s"
    assert not verdict.timed_out or verdict.budget_exceeded  # never the timeout that kills the worker
    assert warm_grader.stats()["worker_starts"] == starts
    assert warm_grader.check(answer, answer) == Verdict(True)  # written exactly as the gold: correct


@pytest.mark.parametrize(
    "answer, level",
    [
        ("9^{9^{9^{9^{9}}}}", HOPELESS),
        ("9^{9^{9}}", HOPELESS),  # 370 million digits
        ("10^{10^{100}}", HOPELESS),
        ("10^{-10^{10}}", HOPELESS),  # tiny, but as costly
        ("2^{2^{2^{2^{2^{2}}}}}", HOPELESS),
        ("((100!)!)!", HOPELESS),
        ("9!!!!!!!", HOPELESS),
        ("\\Gamma(10^{10})", HOPELESS),
        ("\\binom{10^{9}}{10^{5}}", HOPELESS),
        ("2^{10^{100}} \\mod 7", HOPELESS),
        ("\\begin{pmatrix} 9^{9^{9}} & 1 \\\\ 1 & 1 \\end{pmatrix}", HOPELESS),
        ("\\sum_{k=1}^{10^{12}} k^{k}", HOPELESS),
        ("\\prod_{k=1}^{10^{9}} k", HOPELESS),
        ("\\sum_{k=1}^{10^{4}} k^{k}", EXPENSIVE),
        ("\\int x^{100} e^{x} \\, dx", EXPENSIVE),
        ("\\lim_{n \\to \\infty} (1+\\frac{1}{n})^{n}", EXPENSIVE),
        ("\\frac{d^{100}}{dx^{100}} x^{1000}", EXPENSIVE),
        ("(x+1)^{1000}", EXPENSIVE),
        ("x^{x^{x^{x}}}", EXPENSIVE),
        ("\\sin(10^{100})", EXPENSIVE),
        ("\\sqrt{\\sqrt{\\sqrt{\\sqrt{2}}}}", EXPENSIVE),
        ("\\left(" * 4 + "1" + "\\right)" * 4, EXPENSIVE),
        ("2^{10000}", EXPENSIVE),  # 3011 digits
        # real answers stay ordinary
        ("2^{2014}", ORDINARY),  # 607 digits
        ("\\binom{2014}{1007}", ORDINARY),
        ("10!", ORDINARY),
        ("5!!", ORDINARY),
        ("3^{3^{3}}", ORDINARY),
        ("x^{x^{x}}", ORDINARY),
        ("(x+1)^{20}", ORDINARY),
        ("(x+y+z)^{10}", EXPENSIVE),
        ("\\sum_{k=1}^{100} k^{2}", ORDINARY),
        ("\\sum_{k=0}^{n-1} F_k F_{n-k-1}", ORDINARY),
        ("\\sqrt{\\sqrt{\\sqrt{2}}}", ORDINARY),
        ("\\frac{d}{2}", ORDINARY),
        ("\\left( \\frac{1}{5}, \\left( 2 \\right) \\right)", ORDINARY),
        ("1" * 999, ORDINARY),
        ("[3, 8)", ORDINARY),
    ],
)
def test_cost_estimate(answer, level):
    assert estimate_cost(answer).level == level, estimate_cost(answer)


def test_real_answers_are_never_bounded():
    """math-verify's regression cases (both sides) and the bench's ordinary mix are ordinary: the bound leaves
    their verdicts to math-verify (tests/eval/test_grading_math_verify.py holds those verdicts)."""
    cases = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]
    answers = [c["gold"] for c in cases] + [extract_answer(c["pred"]) or c["pred"] for c in cases]
    answers += [a for r in answer_mix(2000, 0.0, 0) for a in (r["gold"], extract_answer(r["response"]))]
    bounded = [a for a in answers if estimate_cost(_normalise(a)).level != ORDINARY]
    assert bounded == []


def test_hopeless_answers_never_reach_the_worker():
    g = Grader(timeout_s=5.0)
    try:
        assert g.check("9^{9^{9^{9}}}", "7") == OVER_BUDGET
        assert g.check("7", "((100!)!)!") == OVER_BUDGET  # a gold, too
        assert g.check("9^{9^{9^{9}}}", "9^{9^{9^{9}}}") == Verdict(True)  # fast path: equal strings
        assert g.stats()["budget_exceeded"] == 2 and g.stats().get("worker_starts", 0) == 0
        with pytest.raises(ValueError, match="grading cost is over the budget"):
            validate_gold("10^{10^{100}}", grader=g)
    finally:
        g.close()


def test_the_budget_stops_a_check_without_restarting_the_worker():
    g = Grader(timeout_s=5.0, budget_s=0.03)
    try:
        assert g.check("1/2", "0.5").ok  # worker up
        deep = "\\left(" * 70 + "1" + "\\right)" * 70  # math-verify's parser needs seconds for it
        start = time.perf_counter()
        assert g.check(deep, "1") == OVER_BUDGET
        assert time.perf_counter() - start < UNIT_TEST_BOUND_S
        assert g.check(deep, "1") == OVER_BUDGET and g.stats()["cache_hits"] == 1  # cached
        assert g.check("\\frac{3}{6}", "0.5").ok  # the same worker serves on
        stats = g.stats()
        assert stats["worker_starts"] == 1 and stats.get("timeouts", 0) == 0 and stats["budget_exceeded"] == 1
    finally:
        g.close()


def test_the_budget_counts_the_worker_s_cpu_time_not_the_wall_clock():
    """Waiting for a core (here: sleeping) does not spend the budget, so a busy machine does not cut off more
    checks than an idle one; computing does."""
    previous = signal.signal(worker.BUDGET_SIGNAL, worker._on_budget)  # as the worker installs it
    try:
        start = time.perf_counter()
        assert worker._within_budget(0.05, lambda: time.sleep(0.3) or "done") == "done"  # 0.3 s of wall time
        assert time.perf_counter() - start >= 0.3

        def compute() -> None:
            end = time.process_time() + 2.0
            while time.process_time() < end:
                pass

        start = time.process_time()
        with pytest.raises(worker.BudgetExceeded):
            worker._within_budget(0.05, compute)
        assert time.process_time() - start < 1.0  # stopped near 50 ms of CPU time, not after the 2 s
    finally:
        signal.signal(worker.BUDGET_SIGNAL, previous)


def test_expensive_answers_within_the_budget_keep_math_verify_s_verdict():
    g = Grader(timeout_s=5.0, budget_s=2.0)  # generous: the verdict, not the speed, is tested
    try:
        assert g.check("(x+y)^{60}", "(y+x)^{60}") == Verdict(True)  # sympy orders the sums alike
        assert g.check("2^{10000}", "2^{5000} \\cdot 2^{5000}") == Verdict(True)
        assert g.check("2^{10000}", "2^{9999}") == Verdict(False)
    finally:
        g.close()


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        Grader(budget_s=0)
