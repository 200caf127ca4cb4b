"""Answer grading shared by the baseline rewards and the benchmarks (decisions §2.1 "Ground truth", §3).

- `extract_answer`: the final answer of a response: the last `\\boxed{...}` (or `\\boxed ...`, `\\fbox{...}`)
  after the thinking part (`sarl.checking.grading.extract`).
- `is_equivalent(pred, gold)`: math-verify with the gold answer first, `verify(gold, pred)`.
- `equivalence_classes`: answers grouped by math equivalence (the vote of TTRL, EMPO and EVOL-RL).
- `validate_gold` / `validate_gold_rows`: a gold answer that does not parse is an error at data preparation
  (`sarl.checking.grading.gold`).
- `avg_at_k`: the benchmark score (`sarl.checking.grading.scores`).

math-verify's own timeout uses `signal.alarm`, which fails off the main thread. Every check therefore runs
with math-verify's timeouts disabled inside a persistent worker process (`sarl.checking.grading.grader`,
`sarl.checking.grading.worker`). An answer beyond `MAX_ANSWER_CHARS` or `MAX_BRACE_DEPTH` never reaches the worker
(`stats()["rejected"]`); nor does one whose pre-parse cost estimate (`sarl.checking.grading.cost`) finds an
astronomically large number, and one with an expensive feature is stopped inside the worker after
`DEFAULT_BUDGET_S` (both `stats()["budget_exceeded"]`); a check that does not answer within `timeout_s` kills
the worker, which is replaced on the next check (`stats()["timeouts"]`). Each counts as "not equivalent" and
is logged (docs/grading.md "Bounded cost").
Model text is only ever handed to math-verify's parser, never to Python's `eval`.

The names above are its public API (`from sarl.checking.grading import is_equivalent`), with `Grader` and
`Verdict`: each loaded from the module that defines it on first use (PEP 562).
"""

import importlib

_PUBLIC = {
    "extract_answer": "sarl.checking.grading.extract",
    "is_equivalent": "sarl.checking.grading.grader",
    "equivalence_classes": "sarl.checking.grading.grader",
    "Grader": "sarl.checking.grading.grader",
    "Verdict": "sarl.checking.grading.grader",
    "validate_gold": "sarl.checking.grading.gold",
    "validate_gold_rows": "sarl.checking.grading.gold",
    "avg_at_k": "sarl.checking.grading.scores",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
