"""math-verify behind a cost bound and a process-level timeout (`Grader`), and the module-level API on a
shared default grader.

math-verify's own timeout uses `signal.alarm`, which fails off the main thread and counts whole seconds.
Every check therefore runs with math-verify's timeouts disabled inside a persistent worker process
(`python -c`, pipes, one JSON line per request; `sarl.checking.grading.worker`). The cost is bounded in three layers
(docs/grading.md, "Bounded cost"):

1. the pre-parse cost estimate (`sarl.checking.grading.cost`): an answer that denotes a number of over
   `HOPELESS_DIGITS` digits never reaches the worker; one with an expensive feature gets a budget;
2. the budget: the worker stops such a check after `budget_s` seconds of its CPU time (an interval timer in
   its main thread), and stays up;
3. the timeout: a check that does not answer within `timeout_s` kills the worker (replaced on the next check).

Each counts as "not equivalent", is logged, and is counted in `stats()` (`budget_exceeded`, `timeouts`).
Model text is only ever handed to math-verify's parser, never to Python's `eval`.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from sarl.checking.grading.cost import EXPENSIVE, HOPELESS, Cost, estimate_cost

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0  # math-verify's own default per comparison
# CPU seconds for a check with an expensive feature (sarl.checking.grading.cost); ordinary checks are not budgeted
# (math-verify needs up to about 0.5 s on a few real answers: relations, \left( pairs, sums; docs/grading.md)
DEFAULT_BUDGET_S = 0.02  # the answer's cost is this plus its longest step in C: under 50 ms measured
# Answers beyond these never reach math-verify (rejected as "not equivalent", counted in stats()["rejected"]).
# The gold answers of AIME 2024/2025, AMC 2023, MATH-500, Minerva Math and OlympiadBench are at most 210
# characters long and nest braces at most 3 deep (docs/grading.md).
MAX_ANSWER_CHARS = 1000
MAX_BRACE_DEPTH = 12
_WORKER_FILE = Path(__file__).resolve().with_name("worker.py")  # loaded by path: no package import there

# ---------------------------------------------------------------------------------------------------------
# Normalisation and the fast path
# ---------------------------------------------------------------------------------------------------------

_THIN_SPACES = re.compile(r"\\[,;:]")  # not \! : math-verify reads "32,\! 349" as 32349 by it
_WHITESPACE = re.compile(r"\s+")
_INTEGER = re.compile(r"([+-]?)(\d+)")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character (\{, \}, \\) or a grouping brace


def _normalise(answer: str) -> str:
    """Cosmetic normalisation: outer `$` (when they enclose the whole answer, not `$1$ and $2$`), thin spaces
    `\\,` `\\;` `\\:`, runs of whitespace, `\\dfrac`/`\\tfrac`, one final `.`."""
    s = answer.strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$" and "$" not in s.strip("$"):
        s = s.strip("$").strip()
    s = _THIN_SPACES.sub("", s)
    s = _WHITESPACE.sub(" ", s).strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if s.endswith(".") and not s.endswith(".."):
        s = s[:-1].rstrip()
    return s


def _brace_depth(s: str) -> int:
    """The deepest nesting of grouping braces in `s` (`\\{` and `\\}` are literal; a stray `}` is ignored)."""
    depth = deepest = 0
    for token in _BRACE_TOKEN.finditer(s):
        if token.group() == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif token.group() == "}" and depth:
            depth -= 1
    return deepest


def _canonical_integer(s: str) -> str | None:
    """'016' -> '16', '-0' -> '0'; None if `s` is not a plain integer (AIME leading zeros, decisions §2)."""
    m = _INTEGER.fullmatch(s)
    if m is None:
        return None
    digits = m.group(2).lstrip("0") or "0"
    return digits if digits == "0" or m.group(1) != "-" else "-" + digits


# ---------------------------------------------------------------------------------------------------------
# The grader: cache + fast path + worker process with a hard timeout
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Outcome of a check: `ok` (equivalent / parses), whether it got no verdict in time (`timed_out`: the
    timeout, or the cost bound, which also sets `budget_exceeded`) and whether an answer was rejected for its
    size before math-verify saw it (each makes one check's `ok` False; `check_any` reports them for the
    checks before the gold that matched)."""

    ok: bool
    timed_out: bool = False
    rejected: bool = False
    budget_exceeded: bool = False


class Grader:
    """math-verify behind a cost bound and a process-level timeout, with an LRU cache and a fast path.

    Thread-safe: checks from several threads are serialised on one worker. After a fork, the child starts
    its own worker. `stats()` counts checks, fast-path answers, cache hits, worker calls, timeouts (the
    worker killed), checks over the cost bound (`budget_exceeded`: the estimate or `budget_s`), worker
    errors, worker starts and answers rejected for their size (`rejected`: longer than `max_answer_chars`
    or braces nested deeper than `max_brace_depth`, after normalisation). `worker_cpu_s` sums the CPU seconds
    the worker spent on checks (each reply reports its own; a check killed at the timeout is not in it).
    """

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        budget_s: float = DEFAULT_BUDGET_S,
        cache_size: int = 1 << 16,
        startup_timeout_s: float = 120.0,
        max_answer_chars: int = MAX_ANSWER_CHARS,
        max_brace_depth: int = MAX_BRACE_DEPTH,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}")
        self.timeout_s = float(timeout_s)
        self.budget_s = float(budget_s)
        self.max_answer_chars = int(max_answer_chars)
        self.max_brace_depth = int(max_brace_depth)
        self.cache_size = int(cache_size)
        self.startup_timeout_s = float(startup_timeout_s)
        self.counts: Counter[str] = Counter()
        self.worker_cpu_s = 0.0
        self._cache: OrderedDict[tuple[str, str, str], Verdict] = OrderedDict()
        self._lock = threading.RLock()
        self._proc: subprocess.Popen | None = None
        self._stderr: Any = None
        self._buf = b""
        self._owner_pid = 0

    # -- public checks ----------------------------------------------------------------------------------

    def check(self, pred: str, gold: str) -> Verdict:
        """Is `pred` equivalent to `gold`? math-verify's `verify(gold, pred)`, gold first (decisions §2).

        `pred` must be a string (anything else is not equivalent); a numeric `gold` is read as its str().
        """
        with self._lock:
            self.counts["checks"] += 1
            p = _normalise(pred) if isinstance(pred, str) else ""
            g = _normalise(str(gold))
            if not p or not g:
                self.counts["fast_path"] += 1
                return Verdict(False)
            if self._rejected(p) or self._rejected(g):
                return Verdict(False, rejected=True)
            pi, gi = _canonical_integer(p), _canonical_integer(g)
            if pi is not None and gi is not None:
                self.counts["fast_path"] += 1
                return Verdict(pi == gi)
            if p == g:  # also a pathological answer written exactly as its gold
                self.counts["fast_path"] += 1
                return Verdict(True)
            cost = max(estimate_cost(p), estimate_cost(g), key=lambda c: c.level)
            if cost.level == HOPELESS:
                return self._over_budget(cost.reason, g, p)
            return self._cached(("verify", g, p), self._request(cost, op="verify", gold=g, pred=p))

    def check_any(self, pred: str, golds: Sequence[str]) -> Verdict:
        """`check` against each accepted gold answer until one matches: `ok` if one does; `timed_out` /
        `rejected` if a check on the way timed out / was rejected (each counted as not equivalent)."""
        timed_out = rejected = False
        for gold in golds:
            verdict = self.check(pred, gold)
            timed_out |= verdict.timed_out
            rejected |= verdict.rejected
            if verdict.ok:
                return Verdict(True, timed_out, rejected)
        return Verdict(False, timed_out, rejected)

    def parses(self, answer: str) -> Verdict:
        """Does math-verify turn `answer` (wrapped in `\\boxed{}` or `$...$` as needed) into a sympy object?"""
        s = _normalise(str(answer))
        if not s:
            return Verdict(False)
        if self._rejected(s):
            return Verdict(False, rejected=True)
        cost = estimate_cost(s)
        if cost.level == HOPELESS:
            return self._over_budget(cost.reason, s)
        return self._cached(("parses", s, ""), self._request(cost, op="parses", text=s))

    def classes(self, answers: Sequence[str | None]) -> tuple[list[int | None], list[str]]:
        """Equivalence classes of `answers` and one representative per class.

        Distinct answers are visited in a canonical order (shortest first, then lexicographic), each joins
        the first class whose representative verifies it (`verify(representative, answer)`), so the
        partition does not depend on the order of `answers`. Class ids follow first appearance in
        `answers`; None (no answer, or an empty one) gets None. Representatives are listed by class id.
        """
        keys = [_normalise(a) if isinstance(a, str) else "" for a in answers]
        representatives: list[str] = []
        class_of: dict[str, int] = {}
        for key in sorted({k for k in keys if k}, key=lambda k: (len(k), k)):
            for c, rep in enumerate(representatives):
                if self.check(key, rep).ok:
                    class_of[key] = c
                    break
            else:
                class_of[key] = len(representatives)
                representatives.append(key)
        renumber: dict[int, int] = {}
        labels: list[int | None] = []
        for key in keys:
            labels.append(renumber.setdefault(class_of[key], len(renumber)) if key else None)
        by_label = sorted(renumber, key=renumber.__getitem__)
        return labels, [representatives[c] for c in by_label]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def close(self) -> None:
        """Stop the worker process (a later check starts a new one)."""
        with self._lock:
            self._kill()

    # -- size limits, cost bound, cache and worker -------------------------------------------------------

    def _request(self, cost: Cost, **payload: str) -> dict[str, Any]:
        """The worker request; a check with an expensive feature carries the budget."""
        return {**payload, "budget_s": self.budget_s} if cost.level == EXPENSIVE else payload

    def _over_budget(self, why: str, *answers: str) -> Verdict:
        self.counts["budget_exceeded"] += 1
        log.warning("grading budget exceeded (%s) on %s; counted as not equivalent", why, _short_texts(answers))
        return Verdict(False, timed_out=True, budget_exceeded=True)

    def _rejected(self, answer: str) -> bool:
        """Is `answer` beyond the size limits? Counted and logged; the length is checked first, so the depth
        scan reads at most `max_answer_chars` characters."""
        if len(answer) > self.max_answer_chars:
            why = f"{len(answer)} characters (limit {self.max_answer_chars})"
        elif (depth := _brace_depth(answer)) > self.max_brace_depth:
            why = f"braces nested {depth} deep (limit {self.max_brace_depth})"
        else:
            return False
        self.counts["rejected"] += 1
        log.warning("answer rejected before math-verify: %s: %r; counted as not equivalent", why, answer[:200])
        return True

    def _cached(self, key: tuple[str, str, str], payload: dict[str, str]) -> Verdict:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.counts["cache_hits"] += 1
                return hit
            verdict = self._ask(payload)
            self._cache[key] = verdict  # timeouts too: a pathological answer costs one timeout, not one per row
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return verdict

    def _ask(self, payload: dict[str, str]) -> Verdict:
        self.counts["worker_calls"] += 1
        self._ensure_worker()
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps(payload) + "\n").encode("ascii"))
            self._proc.stdin.flush()
            reply = self._read_reply(time.monotonic() + self.timeout_s)
        except (OSError, EOFError, ValueError) as err:  # ValueError: a reply that is not JSON
            self.counts["worker_errors"] += 1
            log.warning("math-verify worker failed (%s: %s); counted as not equivalent", type(err).__name__, err)
            self._kill()
            return Verdict(False)
        if reply is None:
            self.counts["timeouts"] += 1
            log.warning(
                "math-verify timed out after %.1fs on %s; counted as not equivalent (%d timeouts so far)",
                self.timeout_s,
                _short(payload),
                self.counts["timeouts"],
            )
            self._kill()
            return Verdict(False, timed_out=True)
        self.worker_cpu_s += float(reply.get("cpu_s", 0.0))
        if reply.get("budget_exceeded"):
            return self._over_budget(f"over {1e3 * self.budget_s:.0f} ms", *_texts(payload))
        if "error" in reply:
            self.counts["worker_errors"] += 1
            log.warning("math-verify raised %s on %s; counted as not equivalent", reply["error"], _short(payload))
            return Verdict(False)
        return Verdict(bool(reply["result"]))

    def _ensure_worker(self) -> None:
        if self._proc is not None and self._owner_pid != os.getpid():
            self._proc = None  # forked child: the parent's worker is not ours to use or kill
        if self._proc is not None and self._proc.poll() is None:
            return
        self._kill()
        self._stderr = tempfile.TemporaryFile()
        boot = (
            "import importlib.util as u, sys; "
            f"s = u.spec_from_file_location('_sarl_grading_worker', {str(_WORKER_FILE)!r}); "
            "m = sys.modules[s.name] = u.module_from_spec(s); s.loader.exec_module(m); m._worker_main()"
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-u", "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            bufsize=-1,
            close_fds=True,
        )
        self._owner_pid = os.getpid()
        self._buf = b""
        self.counts["worker_starts"] += 1
        try:
            reply = self._read_reply(time.monotonic() + self.startup_timeout_s)
        except EOFError:
            reply = None
        if not reply or not reply.get("ready"):
            detail = reply.get("error") if reply else self._stderr_tail() or "no reply"
            self._kill()
            raise RuntimeError(f"the math-verify grading worker did not start: {detail}")

    def _read_reply(self, deadline: float) -> dict[str, Any] | None:
        """The worker's next JSON line, or None at the deadline; EOFError if the worker exited."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EOFError(f"worker exited with code {self._proc.poll()}: {self._stderr_tail()}")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-2000:].strip()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and self._owner_pid == os.getpid():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self._buf = b""


def _texts(payload: Mapping[str, Any]) -> list[str]:
    return [v for k, v in payload.items() if k in ("gold", "pred", "text")]


def _short_texts(texts: Sequence[str]) -> str:
    return " vs ".join(repr(t[:200]) for t in texts)


def _short(payload: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v[:200]!r}" for k, v in payload.items() if k in ("gold", "pred", "text"))


# ---------------------------------------------------------------------------------------------------------
# Module-level API on a shared default grader
# ---------------------------------------------------------------------------------------------------------

_default: Grader | None = None
_default_lock = threading.Lock()


def default_grader() -> Grader:
    """The process-wide grader used when none is passed (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Grader()
        return _default


def configure(
    timeout_s: float = DEFAULT_TIMEOUT_S, cache_size: int = 1 << 16, budget_s: float = DEFAULT_BUDGET_S
) -> Grader:
    """Replace the default grader (e.g. a 1 s timeout in tests); returns the new one."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
        _default = Grader(timeout_s=timeout_s, budget_s=budget_s, cache_size=cache_size)
        return _default


@atexit.register
def _close_default() -> None:
    if _default is not None:
        _default.close()


def is_equivalent(pred: str, gold: str, *, grader: Grader | None = None) -> bool:
    """Is the predicted answer equivalent to the gold one? `verify(gold, pred)`, gold first (decisions §2).

    The gold is wrapped in `\\boxed{}` (or `$...$`) so it parses; "016" equals "16"; `\\frac12`,
    `\\dfrac{1}{2}`, `1/2` and `0.5` are equal; `\\text{}`/`\\mbox{}` wrappers and units are dropped.
    A timeout, a check over the cost bound, or an answer beyond the size limits, is False (counted in
    `stats()`; `Grader.check` returns the `Verdict` that says which; docs/grading.md).
    """
    return (grader or default_grader()).check(pred, gold).ok


def equivalence_classes(answers: list[str | None], *, grader: Grader | None = None) -> list[int | None]:
    """Class id per answer, grouping by math equivalence (not raw strings); None stays None."""
    return (grader or default_grader()).classes(answers)[0]


def stats() -> dict[str, int]:
    """Counters of the default grader: checks, fast_path, cache_hits, worker_calls, timeouts, budget_exceeded,
    rejected, ..."""
    return default_grader().stats()
