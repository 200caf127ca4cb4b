"""The math-verify worker process: `Grader` starts `python -c` that loads this file by its path and runs
`_worker_main`. It imports math-verify and the standard library, never the caller's code.

A request may carry `budget_s`: the check then runs under an interval timer that counts the worker's CPU
time (`ITIMER_PROF`: user and system seconds of this process, delivered as SIGPROF to its main thread;
math-verify's own `signal.alarm` counts whole wall-clock seconds only). CPU time, not wall time: on a busy
node (other reward workers, a rollout engine) a wall-clock budget runs out while the worker waits for a core,
so the same answer would be cut off, and graded "not equivalent", more often the busier the machine. When the
timer fires, the check stops with `BudgetExceeded`, the reply says `budget_exceeded`, and the worker serves on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import time
from collections import OrderedDict
from typing import Any

_WORKER_PARSE_CACHE = 4096
_REFIRE_S = 0.005  # the timer fires again every 5 ms (of CPU time) until disarmed, in case library code swallowed it
BUDGET_TIMER, BUDGET_SIGNAL = signal.ITIMER_PROF, signal.SIGPROF  # the process's CPU time, all threads


class BudgetExceeded(BaseException):
    """Raised by the budget timer; a BaseException, so math-verify's `except Exception` lets it through."""


def _on_budget(signum: int, frame: Any) -> None:
    raise BudgetExceeded


def _within_budget(budget_s: float | None, work: Any) -> Any:
    """`work()` under a budget of `budget_s` CPU seconds (None: unbudgeted); BudgetExceeded when it runs out."""
    if budget_s is None:
        return work()
    try:
        signal.setitimer(BUDGET_TIMER, budget_s, _REFIRE_S)
        return work()
    finally:
        signal.setitimer(BUDGET_TIMER, 0)


_TEXT_NUMBER = re.compile(r"\\(?:text|mbox|textbf|textrm|mathrm)\{\s*([+-]?\d[\d,.]*)\s*([^{}]*)\}")
# a trailing percent sign, or the words math-verify reads as one ("28 percent", "28 pct", "\text{percentage}")
_PERCENT_WORD = r"percentage|percent|pct"
_TRAILING_PERCENT = re.compile(rf"\s*(?:\\?%|\\text\{{\s*(?:\\?%|{_PERCENT_WORD})\s*\}}|\b(?:{_PERCENT_WORD})\b)$")


def _latex_friendly(text: str) -> str:
    """Rewrites that math-verify's LaTeX parser needs: `\\text{5 cm}` -> `5\\text{ cm}` (its unit handling
    applies), `\\text{5}` -> `5`, a trailing percent sign or word dropped ("50\\%" = "50 percent" = 50),
    `°` -> `^{\\circ}`."""

    def repl(m: re.Match) -> str:
        unit = m.group(2).strip()
        return m.group(1) + (f"\\text{{ {unit}}}" if unit else "")

    text = _TEXT_NUMBER.sub(repl, text)
    text = _TRAILING_PERCENT.sub("", text)
    return text.replace("°", "^{\\circ}")


def _parse_answer(parse: Any, text: str) -> list:
    """math-verify's parse of a bare answer: as given if it carries math delimiters, else wrapped in
    `\\boxed{}`, then in `$...$` (e.g. `50\\%` parses only there); the first result holding a sympy object."""
    text = _latex_friendly(text)
    candidates = [text] if any(d in text for d in ("$", "\\boxed", "\\(", "\\[")) else []
    candidates += ["\\boxed{" + text + "}", "$" + text + "$"]
    fallback: list = []
    for candidate in candidates:
        result = parse(candidate, parsing_timeout=None)
        if any(not isinstance(r, str) for r in result):
            return result
        fallback = fallback or result
    return fallback


def _worker_main() -> None:
    """Serve JSON-line requests on stdin: {"op": "verify", "gold", "pred"} and {"op": "parses", "text"}."""
    protocol = os.fdopen(os.dup(1), "w", encoding="ascii")
    os.dup2(2, 1)  # stray prints from libraries go to stderr, never into the protocol
    sys.stdout = sys.stderr
    logging.disable(logging.CRITICAL)  # math-verify warns that its own timeouts are off: that is the design

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    try:
        from math_verify import LatexExtractionConfig, verify
        from math_verify import parse as mv_parse
    except Exception as err:  # reported to the parent, which raises with this reason
        send({"ready": False, "error": f"cannot import math_verify: {type(err).__name__}: {err}"})
        return
    signal.signal(BUDGET_SIGNAL, _on_budget)
    send({"ready": True})
    latex_only = [LatexExtractionConfig()]

    def parse(text: str, parsing_timeout: None = None) -> list:
        # LaTeX extraction only: math-verify's ExprExtractionConfig hands text to sympy's parse_expr (eval)
        return mv_parse(text, extraction_config=latex_only, parsing_timeout=parsing_timeout)

    cache: OrderedDict[str, list] = OrderedDict()

    def parsed(text: str) -> list:
        if text in cache:
            cache.move_to_end(text)
            return cache[text]
        result = cache[text] = _parse_answer(parse, text)
        if len(cache) > _WORKER_PARSE_CACHE:
            cache.popitem(last=False)
        return result

    def check(request: dict[str, Any]) -> bool:
        if request["op"] == "verify":
            gold, pred = parsed(request["gold"]), parsed(request["pred"])
            # math-verify: verify(gold, target), gold first; timeouts off, the parent enforces its own
            return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
        if request["op"] == "parses":  # a sympy object, not only math-verify's raw-string fallback
            return any(not isinstance(r, str) for r in parsed(request["text"]))
        raise ValueError(f"unknown op {request['op']!r}")

    for line in sys.stdin:
        start = time.process_time()  # each reply carries the CPU seconds the check cost this process
        try:
            request = json.loads(line)
            reply: dict[str, Any] = {"result": _within_budget(request.get("budget_s"), lambda: check(request))}
        except BudgetExceeded:
            reply = {"budget_exceeded": True}
        except Exception as err:
            reply = {"error": f"{type(err).__name__}: {err}"}
        send({**reply, "cpu_s": time.process_time() - start})
