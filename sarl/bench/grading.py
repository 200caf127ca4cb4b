"""Grading throughput: `extract_answer` + `Grader.check` on a realistic mix of model answers.

The mix (seeded): AIME-style integer answers, MATH-style answers (fractions, roots, tuples, intervals,
expressions, decimals) written as the gold or as an equivalent or a different form, and a fraction of
pathological answers (thousands of digits, braces nested far beyond any gold answer, a response of
repeated `\\boxed{`), which the grader's size limits (eval.grading MAX_ANSWER_CHARS, MAX_BRACE_DEPTH) reject
before math-verify. Reported: answers/s, latency percentiles, cheap rejections and the agreement of the
verdicts with plain math-verify on the whole response (untimed).
"""

from __future__ import annotations

import logging
import time
from fractions import Fraction

import numpy as np
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from eval.grading import Grader, extract_answer
from eval.grading.grader import MAX_ANSWER_CHARS, MAX_BRACE_DEPTH

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


def _pathological(rng: np.random.Generator) -> str:
    kind = int(rng.integers(0, 3))
    if kind == 0:  # a number of thousands of digits
        return "\\boxed{" + "".join(rng.choice(list("0123456789"), size=int(rng.integers(2000, 20000)))) + "}"
    if kind == 1:  # braces nested far deeper than any gold answer
        depth = int(rng.integers(40, 400))
        return "\\boxed{" + "\\frac{1}{" * depth + "2" + "}" * depth + "}"
    return "\\boxed{" * int(rng.integers(2000, 20000)) + "1"  # repeated, unclosed boxes


def answer_mix(n: int, pathological_fraction: float, seed: int) -> list[dict]:
    """n (response, gold, kind) rows: half AIME-style, the rest MATH-style, `pathological_fraction` bad."""
    rng = np.random.default_rng(seed)
    rows = []
    n_bad = int(round(n * pathological_fraction))
    for i in range(n):
        body = " ".join(rng.choice(FILLER, size=int(rng.integers(1, 4))))
        if i < n_bad:
            gold, pred, kind = str(int(rng.integers(0, 1000))), None, "pathological"
            response = body + "\n\n" + _pathological(rng)
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
        grader.check("\\frac{1}{2}", "0.5")  # starts the math-verify worker (not timed)
        start = grader.stats()
        latency = np.empty(len(rows))
        kinds = np.array([r["kind"] for r in rows])
        grader_log = logging.getLogger("eval.grading.grader")
        level = grader_log.level
        grader_log.setLevel(logging.ERROR)  # one warning per rejection: counted below instead of printed
        try:
            t_all = time.perf_counter()
            for i, row in enumerate(rows):
                t0 = time.perf_counter()
                ours(grader, row)
                latency[i] = time.perf_counter() - t0
            total = time.perf_counter() - t_all
        finally:
            grader_log.setLevel(level)
        no_answer = sum(extract_answer(r["response"]) is None for r in rows if r["kind"] == "pathological")
        after = grader.stats()
        counts = {k: after.get(k, 0) - start.get(k, 0) for k in set(after) | set(start)}
        # Agreement with plain math-verify, untimed, on the first agreement_pairs ordinary answers.
        ordinary = [r for r in rows if r["kind"] != "pathological"][: cfg.agreement_pairs]
        disagree = [r for r in ordinary if ours(grader, r) != plain_math_verify(r["response"], r["gold"])]
    finally:
        grader.close()
    out = {
        "answers": len(rows),
        "seconds": total,
        "answers_per_s": len(rows) / total,
        "latency_ms": {q: 1e3 * float(np.percentile(latency, p)) for q, p in (("p50", 50), ("p99", 99), ("max", 100))},
        "pathological": int((kinds == "pathological").sum()),
        "pathological_max_ms": 1e3 * float(latency[kinds == "pathological"].max(initial=0.0)),
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
        "pathological",
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
        str(out["pathological"]),
        str(out["rejected"]),
        str(out["pathological_no_answer"]),
        f"{out['pathological_max_ms']:.1f}",
        str(out["timeouts"]),
        str(out["worker_calls"]),
        f"{100 * out['agreement']:.1f}% of {out['agreement_pairs']}",
    )
    console.print(table)
    console.print(
        f"size limits: answers over {MAX_ANSWER_CHARS} characters or with braces nested over {MAX_BRACE_DEPTH} "
        "deep are rejected before math-verify (counted as not equivalent)."
    )
    return out
