"""Grading throughput: `extract_answer` + `Grader.check` on a realistic mix of model answers.

The mix (seeded): AIME-style integer answers, MATH-style answers (fractions, roots, tuples, intervals,
expressions, decimals) written as the gold or as an equivalent or a different form, and a fraction of
pathological answers, half of each kind:

- oversized: thousands of digits, braces nested far beyond any gold answer, a response of repeated
  `\\boxed{`, which the grader's size limits (sarl.checking.grading MAX_ANSWER_CHARS, MAX_BRACE_DEPTH) reject before
  math-verify;
- short: `SHORT_PATHOLOGICAL`, short answers that ask sympy for astronomical numbers or slow symbolic work
  (power towers, factorial towers, huge binomials, sums over 10^12 terms, calculus), bounded by the grader's
  cost estimate and budget (sarl.checking.grading.cost, docs/grading.md "Bounded cost"); a quarter of them is graded
  against itself written the same way (correct), the rest against an integer.

Reported: answers/s, latency percentiles (all answers, and the short pathological ones separately, with the
math-verify worker's CPU time for each: the budget counts CPU time), cheap rejections, checks over the budget,
and the agreement of the verdicts with plain math-verify on the whole
response (untimed, ordinary answers).
"""

from __future__ import annotations

import logging
import time
from fractions import Fraction

import numpy as np
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from sarl.checking.grading.extract import extract_answer
from sarl.checking.grading.grader import MAX_ANSWER_CHARS, MAX_BRACE_DEPTH, Grader

# Short answers that cost plain math-verify its 5 s timeout (or hundreds of ms) on one CPU core.
SHORT_PATHOLOGICAL = (
    "9^{9^{9^{9^{9}}}}",
    "9^{9^{9^9}}",
    "9^{9^{9}}",
    "10^{10^{100}}",
    "10^{10^{10}}",
    "2^{2^{2^{2^{2^{2}}}}}",
    "2^{2^{64}}",
    "{9^9}^{9^9}",
    "10^{-10^{10}}",
    "\\frac{1}{9^{9^{9}}}",
    "1.5^{10^{9}}",
    "((100!)!)!",
    "9!!!!!!!",
    "(10^{9})!",
    "\\Gamma(10^{10})",
    "\\binom{10^{9}}{10^{5}}",
    "\\sum_{k=1}^{10^{12}} k^{k}",
    "\\sum_{k=1}^{n} k^{100}",
    "\\prod_{k=1}^{10^{9}} k",
    "\\int_{0}^{10^{100}} x^{x} \\, dx",
    "\\int x^{100} e^{x} \\, dx",
    "\\frac{d^{100}}{dx^{100}} x^{1000}",
    "\\lim_{n \\to \\infty} (1+\\frac{1}{n})^{n}",
    "2^{10^{100}} \\mod 7",
    "2^{10^{100}} \\pmod{7}",
    "\\sin(10^{100})",
    "e^{10^{10}}",
    "\\pi^{10^{6}}",
    "\\sqrt[10^{9}]{2}",
    "\\sqrt{" * 11 + "2" + "}" * 11,
    "\\left(" * 70 + "1" + "\\right)" * 70,
    "x^{x^{x^{x}}}",
    "x^{10^{9}}",
    "(x+1)^{1000}",
    "(x+1)^{1000}-(x-1)^{1000}",
    "(x+y+z)^{50}",
    "\\begin{pmatrix} 9^{9^{9}} & 1 \\\\ 1 & 1 \\end{pmatrix}",
    "1e999999",
    "0." + "3" * 990,
    "1" * 999,
)
PATHOLOGICAL_KINDS = ("oversized", "short")

FILLER = [
    "First, we set up the equation from the conditions given in the problem.",
    "Substituting the values, we simplify both sides and collect like terms.",
    "We check the boundary cases separately to make sure nothing is missed.",
    "By symmetry, it suffices to consider the case where the first term is positive.",
]


def _math_pair(rng: np.random.Generator) -> tuple[str, str, str]:
    """(gold, equivalent prediction, different prediction) in MATH-style notation."""
    kind = int(rng.integers(0, 7))
    a, b = int(rng.integers(1, 20)), int(rng.integers(2, 20))
    if kind == 0:
        f = Fraction(a, b)
        if f.denominator == 1:
            f = Fraction(a, b + 1)
        gold = f"\\frac{{{f.numerator}}}{{{f.denominator}}}"
        equal = [f"\\dfrac{{{f.numerator}}}{{{f.denominator}}}", f"{f.numerator}/{f.denominator}"][
            int(rng.integers(0, 2))
        ]
        return gold, equal, f"\\frac{{{f.numerator + 1}}}{{{f.denominator}}}"
    if kind == 1:
        n = int(rng.choice([2, 3, 5, 6, 7, 10, 11]))
        return f"{a}\\sqrt{{{n}}}", f"\\sqrt{{{a * a * n}}}", f"{a + 1}\\sqrt{{{n}}}"
    if kind == 2:
        return f"({a}, {b})", f"({a},{b})", f"({b}, {a})" if a != b else f"({a}, {b + 1})"
    if kind == 3:
        return f"[{a}, {a + b})", f"[{a},{a + b})", f"({a}, {a + b})"
    if kind == 4:
        return f"{a}x + {b}", f"{b} + {a}x", f"{a}x - {b}"
    if kind == 5:
        return f"\\frac{{{a}\\pi}}{{{b}}}", f"\\frac{{{a}}}{{{b}}}\\pi", f"\\frac{{{a + 1}\\pi}}{{{b}}}"
    d = a / 4
    return f"{d:g}", f"\\frac{{{a}}}{{4}}", f"{d + 0.5:g}"


def _oversized(rng: np.random.Generator) -> str:
    kind = int(rng.integers(0, 3))
    if kind == 0:  # a number of thousands of digits
        return "\\boxed{" + "".join(rng.choice(list("0123456789"), size=int(rng.integers(2000, 20000)))) + "}"
    if kind == 1:  # braces nested far deeper than any gold answer
        depth = int(rng.integers(40, 400))
        return "\\boxed{" + "\\frac{1}{" * depth + "2" + "}" * depth + "}"
    return "\\boxed{" * int(rng.integers(2000, 20000)) + "1"  # repeated, unclosed boxes


def answer_mix(n: int, pathological_fraction: float, seed: int) -> list[dict]:
    """n (response, gold, kind) rows: `pathological_fraction` bad (half oversized, half short), then half
    AIME-style and half MATH-style."""
    rng = np.random.default_rng(seed)
    rows = []
    n_bad = int(round(n * pathological_fraction))
    for i in range(n):
        body = " ".join(rng.choice(FILLER, size=int(rng.integers(1, 4))))
        if i < n_bad and i % 2 == 0:
            gold, pred, kind = str(int(rng.integers(0, 1000))), None, "oversized"
            response = body + "\n\n" + _oversized(rng)
        elif i < n_bad:
            pred, kind = SHORT_PATHOLOGICAL[int(rng.integers(0, len(SHORT_PATHOLOGICAL)))], "short"
            gold = pred if rng.random() < 0.25 else str(int(rng.integers(0, 1000)))
        elif rng.random() < 0.5:
            gold = int(rng.integers(0, 1000))
            r = rng.random()
            pred = str(gold) if r < 0.4 else f"{gold:03d}" if r < 0.5 else str(int(rng.integers(0, 1000)))
            kind, gold = "aime", str(gold)
        else:
            gold, equal, different = _math_pair(rng)
            r = rng.random()
            pred = gold if r < 0.3 else equal if r < 0.6 else different
            kind = "math"
        if pred is not None:
            response = f"{body}\n\nTherefore, the final answer is $\\boxed{{{pred}}}$."
        rows.append({"response": response, "gold": gold, "kind": kind})
    order = rng.permutation(n)
    return [rows[i] for i in order]


def _percentiles(latency: np.ndarray) -> dict[str, float]:
    if latency.size == 0:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0}
    return {q: 1e3 * float(np.percentile(latency, p)) for q, p in (("p50", 50), ("p99", 99), ("max", 100))}


def plain_math_verify(response: str, gold: str) -> bool:
    """What a user would write with math-verify alone: parse the boxed gold and the whole response."""
    from math_verify import parse, verify

    return bool(verify(parse("\\boxed{" + gold + "}"), parse(response)))


def ours(grader: Grader, row: dict) -> bool:
    pred = extract_answer(row["response"])
    return grader.check(pred, row["gold"]).ok if pred is not None else False


def run_grading(cfg: DictConfig, console: Console) -> dict:
    rows = answer_mix(cfg.answers, cfg.pathological_fraction, cfg.seed)
    grader = Grader(timeout_s=cfg.timeout_s)
    try:
        # start the math-verify worker and pay sympy's first-use costs (not timed)
        for pred, gold in (("\\frac{1}{2}", "0.5"), ("2", "1e3"), ("(1, 2)", "[1, 2)"), ("x^2+1", "1+x^2")):
            grader.check(pred, gold)
        start = grader.stats()
        latency = np.empty(len(rows))
        cpu = np.empty(len(rows))  # the worker's CPU seconds per answer (0 when it never reached the worker)
        kinds = np.array([r["kind"] for r in rows])
        grader_log = logging.getLogger("sarl.checking.grading.grader")
        level = grader_log.level
        grader_log.setLevel(logging.ERROR)  # one warning per rejection or budget: counted below instead
        try:
            t_all = time.perf_counter()
            for i, row in enumerate(rows):
                t0, c0 = time.perf_counter(), grader.worker_cpu_s
                ours(grader, row)
                latency[i] = time.perf_counter() - t0
                cpu[i] = grader.worker_cpu_s - c0
            total = time.perf_counter() - t_all
        finally:
            grader_log.setLevel(level)
        no_answer = sum(extract_answer(r["response"]) is None for r in rows if r["kind"] == "oversized")
        as_gold = [r for r in rows if r["kind"] == "short" and extract_answer(r["response"]) == r["gold"]]
        short_correct = sum(ours(grader, r) for r in as_gold)
        after = grader.stats()
        counts = {k: after.get(k, 0) - start.get(k, 0) for k in set(after) | set(start)}
        # Agreement with plain math-verify, untimed, on the first agreement_pairs ordinary answers.
        ordinary = [r for r in rows if r["kind"] not in PATHOLOGICAL_KINDS][: cfg.agreement_pairs]
        disagree = [r for r in ordinary if ours(grader, r) != plain_math_verify(r["response"], r["gold"])]
    finally:
        grader.close()
    out = {
        "answers": len(rows),
        "seconds": total,
        "answers_per_s": len(rows) / total,
        "latency_ms": _percentiles(latency),
        "pathological": int(np.isin(kinds, PATHOLOGICAL_KINDS).sum()),
        "pathological_max_ms": 1e3 * float(latency[np.isin(kinds, PATHOLOGICAL_KINDS)].max(initial=0.0)),
        "oversized": int((kinds == "oversized").sum()),
        "short": int((kinds == "short").sum()),
        "short_latency_ms": _percentiles(latency[kinds == "short"]),
        "short_worker_cpu_ms": _percentiles(cpu[kinds == "short"]),
        "short_written_as_gold": len(as_gold),
        "short_written_as_gold_correct": int(short_correct),
        "budget_exceeded": counts.get("budget_exceeded", 0),
        "rejected": counts.get("rejected", 0),
        "pathological_no_answer": int(no_answer),
        "timeouts": counts.get("timeouts", 0),
        "worker_calls": counts.get("worker_calls", 0),
        "cache_hits": counts.get("cache_hits", 0),
        "fast_path": counts.get("fast_path", 0),
        "agreement_pairs": len(ordinary),
        "agreement": 1.0 - len(disagree) / max(len(ordinary), 1),
        "disagreements": [{"gold": r["gold"], "response_tail": r["response"][-120:]} for r in disagree[:20]],
    }
    table = Table(title=f"grading {out['answers']} answers (extract_answer + Grader.check, timeout {cfg.timeout_s} s)")
    for col in (
        "answers/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "oversized",
        "rejected cheaply",
        "no box closed",
        "slowest pathological ms",
        "timeouts",
        "math-verify calls",
        "agreement with plain math-verify",
    ):
        table.add_column(col, justify="right")
    table.add_row(
        f"{out['answers_per_s']:.0f}",
        f"{out['latency_ms']['p50']:.2f}",
        f"{out['latency_ms']['p99']:.2f}",
        f"{out['latency_ms']['max']:.1f}",
        str(out["oversized"]),
        str(out["rejected"]),
        str(out["pathological_no_answer"]),
        f"{out['pathological_max_ms']:.1f}",
        str(out["timeouts"]),
        str(out["worker_calls"]),
        f"{100 * out['agreement']:.1f}% of {out['agreement_pairs']}",
    )
    console.print(table)
    short = Table(title=f"short pathological answers (grading budget {1e3 * grader.budget_s:.0f} ms of CPU time)")
    for col in (
        "short answers",
        "p50 ms",
        "p99 ms",
        "max ms",
        "worker CPU p99 ms",
        "worker CPU max ms",
        "over the budget",
        "written as the gold: correct",
    ):
        short.add_column(col, justify="right")
    short.add_row(
        str(out["short"]),
        f"{out['short_latency_ms']['p50']:.2f}",
        f"{out['short_latency_ms']['p99']:.2f}",
        f"{out['short_latency_ms']['max']:.1f}",
        f"{out['short_worker_cpu_ms']['p99']:.1f}",
        f"{out['short_worker_cpu_ms']['max']:.1f}",
        str(out["budget_exceeded"]),
        f"{out['short_written_as_gold_correct']} of {out['short_written_as_gold']}",
    )
    console.print(short)
    console.print(
        f"size limits: answers over {MAX_ANSWER_CHARS} characters or with braces nested over {MAX_BRACE_DEPTH} "
        "deep are rejected before math-verify; answers whose cost estimate is too high get no verdict or a "
        "budget (sarl.checking.grading.cost); both count as not equivalent."
    )
    return out
