"""A grader timeout in the evaluation is visible: marked on its sample in problems.jsonl, counted per benchmark in
results.json, results.md and the W&B summary (it counts as "not equivalent", so it may hide a correct answer)."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from eval.data import Problem
from eval.protocol import Benchmark
from eval.results import flat_metrics, markdown_report, write_results
from eval.scoring import score_benchmarks

NEVER_FINISHES = "9^{9^{9^{9}}}"  # sympy tries to build an astronomically large integer


MESSAGES = [{"role": "user", "content": "q"}]


def record(text: str) -> dict:
    return {"text": text, "n_tokens": 5, "truncated": False, "finish_reason": "stop"}


def test_grader_timeouts_are_marked_and_counted(tmp_path):
    # NEVER_FINISHES is over the cost bound (a timed-out verdict without a wait); the timeout is math-verify's default,
    # so that the ordinary checks, a fresh worker's first included, finish within it on a loaded machine too
    cfg = OmegaConf.create({"grading": {"timeout_s": 5.0, "answer_in_unclosed_think": False}})
    golds = {"p1": ["3"], "p2": ["42"], "p3": ["3", NEVER_FINISHES]}
    problems = [Problem("aime", pid, i, MESSAGES, g) for i, (pid, g) in enumerate(golds.items())]
    records = {
        ("aime", "p1"): {0: record(f"\\boxed{{{NEVER_FINISHES}}}"), 1: record("\\boxed{3}")},
        ("aime", "p2"): {0: record("\\boxed{42}"), 1: record("no answer")},
        # the first gold times out (the cached verdict of p1), the second is the same text: correct, still marked
        ("aime", "p3"): {0: record(f"\\boxed{{{NEVER_FINISHES}}}"), 1: record("\\boxed{3}")},
    }
    math_part, _, rows = score_benchmarks(cfg, [Benchmark("aime", "math", problems, 2)], records, {}, {}, {}, None)

    marked = [[s["grader_timeout"] for s in row["samples"]] for row in rows]
    assert marked == [[True, False], [False, False], [True, False]]
    assert [[s["correct"] for s in row["samples"]] for row in rows] == [[False, True], [True, False], [True, True]]
    assert math_part["benchmarks"]["aime"]["grader_timeouts"] == 2

    results = {
        "run": {"name": "ckpt", "ckpt": "/ckpt", "sampling": {"n": 2}},
        "complete": True,
        "math": math_part,
        "wildbench": None,
        "lm_eval": None,
    }
    markdown = markdown_report(results, None)
    assert "Grader timeouts (math-verify gave no verdict in time; graded incorrect): aime 2." in markdown
    write_results(tmp_path, results, rows, markdown)
    assert json.loads((tmp_path / "results.json").read_text())["math"]["benchmarks"]["aime"]["grader_timeouts"] == 2
    lines = [json.loads(line) for line in (tmp_path / "problems.jsonl").read_text().splitlines()]
    assert [[s["grader_timeout"] for s in line["samples"]] for line in lines] == marked
    assert flat_metrics(results)["eval/aime/grader_timeouts"] == 2.0


def test_results_without_the_count_still_render():
    """results.json written before the count existed (a base run) renders with "-"."""
    bench = {"avg_at_k": 50.0, "k": 2, "mean_tokens": 5.0, "truncation_rate": 0.0, "no_answer_rate": 0.0}
    bench.update(n_samples=2, structure={})
    overall = {"avg": 50.0, "base_avg": None, "mean_tokens": 5.0, "delta_tokens": None}
    run = {"name": "old", "ckpt": "/old", "sampling": {}}
    results = {"run": run, "math": {"benchmarks": {"aime": bench}, "overall": overall}}
    assert "graded incorrect): aime -." in markdown_report(results, None)
