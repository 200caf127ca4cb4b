"""Answer extraction, math equivalence, equivalence classes, timeouts and gold validation (sarl.checking.grading)."""

import random
import re
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarl.checking.grading import extract as extract_module
from sarl.checking.grading import grader as grading
from sarl.checking.grading.cost import ORDINARY, Cost
from sarl.checking.grading.extract import extract_answer
from sarl.checking.grading.gold import validate_gold, validate_gold_rows
from sarl.checking.grading.grader import Grader, equivalence_classes, is_equivalent

PATHOLOGICAL = "9^{9^{9}}"  # sympy tries to build a 370-million-digit integer: never finishes


@pytest.fixture
def no_cost_estimate(monkeypatch):
    """Every answer reaches the worker unbudgeted: the timeout, the last layer of the bound, is what is tested
    (the cost estimate and the budget: tests/eval/test_grading_bounded.py)."""
    monkeypatch.setattr("sarl.checking.grading.grader.estimate_cost", lambda answer: Cost(ORDINARY))


@pytest.mark.parametrize(
    "text, answer",
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{2}", "2"),  # the last one
        ("<think>maybe \\boxed{3}</think>The answer is \\boxed{4}", "4"),
        ("<think>only here \\boxed{3}</think>no box after thinking", None),  # thinking is stripped
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not grouping
        ("$\\boxed 5$", "5"),  # \boxed without braces
        ("\\fbox{7}", "7"),
        ("\\boxed{7} and a truncated \\boxed{12", "7"),  # the last well-formed one
        ("\\boxed{}", None),
        ("no answer here", None),
        ("\\boxedx{3}", None),  # another command
        (None, None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def _reference_box_content(text, start):
    """The argument of the box command ending at `start`, scanning its braces from there on: the former
    implementation of `extract_answer` (quadratic over many unclosed boxes), kept as the test oracle."""
    if text[start : start + 1].isalpha():
        return None
    j = start
    while j < len(text) and text[j] in " \t":
        j += 1
    if text[j : j + 1] == "{":
        depth, k = 0, j
        while k < len(text):
            if text[k] == "\\":
                k += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                return text[j + 1 : k].strip() or None
            k += 1
        return None
    if j > start:
        return re.match(r"[^$\n]*", text[j:]).group(0).strip() or None
    return None


def _reference_extract(text):
    cut = text.rfind("</think>")
    if cut >= 0:
        text = text[cut + len("</think>") :]
    for m in reversed(list(re.finditer(r"\\(?:boxed|fbox)", text))):
        content = _reference_box_content(text, m.end())
        if content:
            return content
    return None


PIECES = (  # commands, braces, escapes, blanks, delimiters, an answer, the end of thinking
    ["\\boxed", "\\fbox", "\\boxedx", "{", "}", "\\{", "\\}", "\\\\", "\\"]
    + [" ", "\t", "\n", "$", "1", "x", "</think>"]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30))
def test_extract_answer_matches_the_brace_scanning_reference(pieces):
    """One pass of brace matching finds the same argument as scanning from each box command on its own."""
    text = "".join(pieces)
    assert extract_answer(text) == _reference_extract(text)


@pytest.mark.parametrize(
    "text, answer",
    [
        ("\\boxed{" * 15000, None),  # a generation cut off while repeating "\boxed{": 105 KB
        ("\\boxed{1" * 12500, None),
        ("\\boxed{a}" + "\\boxed{" * 15000, "a"),  # the last well-formed box before 15000 unclosed ones
        ("\\boxed{" + "{" * 100_000, None),  # nested opens
        ("\\fbox{\\boxed{" * 8000, None),
        ("\\boxed{" + "}{" * 50_000, None),  # unbalanced braces
        ("\\boxed $" * 12500, None),
        ("\\boxed{7}" + "\\boxed{\\{" * 10000, "7"),
    ],
)
def test_extract_answer_is_linear_on_pathological_text(text, answer, monkeypatch):
    """About 100 KB each, tens of milliseconds here: the former extraction rescanned the rest of the text for every
    unclosed `\\boxed{`, 39-41 s on 70-90 KB of such text and 119 s on the first input here. Linearity itself is
    asserted by the pass count; the wall-clock bound is one a loaded CI machine keeps, far below the quadratic
    scan's."""
    passes = []
    real = extract_module._matching_braces
    monkeypatch.setattr(extract_module, "_matching_braces", lambda t, s: passes.append(s) or real(t, s))
    start = time.perf_counter()
    assert extract_answer(text) == answer
    assert time.perf_counter() - start < 10.0
    assert len(passes) <= 1  # the braces are matched in one pass, whatever the number of box commands


def test_braced_boxes_after_the_last_closing_brace_are_skipped_without_matching_braces(monkeypatch):
    """A generation cut off while repeating `\\boxed{` has no `}` after its boxes: none can close, so none is
    matched (the slowest pathological answer of `sarl.bench suite=grading`)."""
    passes = []
    real = extract_module._matching_braces
    monkeypatch.setattr(extract_module, "_matching_braces", lambda t, s: passes.append(s) or real(t, s))
    assert extract_answer("\\boxed{" * 15000 + "1") is None and passes == []
    assert extract_answer("\\boxed{a}" + "\\boxed{" * 15000) == "a" and passes == [0 + len("\\boxed")]


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("16", "016"),  # AIME leading zeros
        ("016", "16"),
        ("\\frac12", "0.5"),
        ("0.5", "\\frac{1}{2}"),
        ("1/2", "\\dfrac{1}{2}"),
        ("\\dfrac{1}{2}", "1/2"),
        ("5\\text{ cm}", "5"),  # units
        ("\\text{5 cm}", "5"),
        ("\\mbox{5}", "5"),
        ("\\text{(A)}", "A"),
        ("x = 5", "5"),
        ("5", "x = 5"),
        ("50\\%", "50"),  # percent
        ("50", "50\\%"),
        ("30^\\circ", "30"),  # degrees
        ("30°", "30"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("1+x^2", "x^2+1"),
        ("1,000", "1000"),
        ("\\{2, 1\\}", "\\{1, 2\\}"),
        ("28 percent", "$28\\%$"),  # math-verify reads the words as \%, the gold's \% is dropped: both go
        ("28 pct", "$28\\%$"),
        ("28 percentage", "28"),
        ("28\\text{ percent}", "28\\%"),
        ("32,\\! 349", "32349"),  # \! and a blank after a comma: math-verify's thousands separator
        ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
        ("32349", "$32,\\! 349$"),
        ("1,2,3", "$1$ and $2$ and $3$"),  # not stripped to "1$ and $2$ and $3"
        ("\\{1, 2, 3\\}", "$1$ and $2$ and $3$"),
    ],
)
def test_equivalent_answers(pred, gold, grader):
    assert grader.check(pred, gold).ok
    assert is_equivalent(pred, gold, grader=grader)


@pytest.mark.parametrize(
    "pred, gold",
    [
        *[("2", "3"), ("17", "016"), ("B", "A"), ("(1,2)", "(2,1)"), ("0.5", "50\\%"), ("", "5"), ("5", "")],
        *[("27 percent", "$28\\%$"), ("32,\\! 348", "32349"), ("1,2", "$1$ and $2$ and $3$"), ("percent", "28")],
    ],
)
def test_different_answers(pred, gold, grader):
    assert not grader.check(pred, gold).ok


def test_gold_goes_first(monkeypatch, grader):
    """verify(gold, pred): the worker receives the gold as `gold` (math-verify is not symmetric)."""
    sent = []
    real_ask = Grader._ask
    monkeypatch.setattr(Grader, "_ask", lambda self, payload: sent.append(payload) or real_ask(self, payload))
    grader.check("\\frac{3}{4}", "0.75")
    assert sent == [{"op": "verify", "gold": "0.75", "pred": "\\frac{3}{4}"}]


def test_fast_path_and_cache(grader):
    before = grader.stats()
    assert grader.check("0042", "42").ok and not grader.check("41", "42").ok
    assert grader.check("\\frac{7}{9}", "\\frac{7}{9}").ok  # equal strings
    mid = grader.stats()
    assert mid.get("worker_calls", 0) == before.get("worker_calls", 0)
    assert mid["fast_path"] == before.get("fast_path", 0) + 3
    for _ in range(3):
        assert grader.check("\\frac{14}{18}", "\\frac{7}{9}").ok
    after = grader.stats()
    assert after["worker_calls"] == mid.get("worker_calls", 0) + 1
    assert after["cache_hits"] == mid.get("cache_hits", 0) + 2


def test_model_text_is_never_evaluated(tmp_path, grader):
    sentinel = tmp_path / "pwned"
    pred = f"__import__('pathlib').Path({str(sentinel)!r}).touch()"
    assert not grader.check(pred, "5").ok
    assert not grader.check(f"1+{pred}", "5").ok
    assert not sentinel.exists()


def test_equal_answers_vote_together(grader):
    answers = ["\\frac12", "0.5", "1/2", None, "016", "16", "\\dfrac{1}{2}", "3", ""]
    labels = equivalence_classes(answers, grader=grader)
    assert labels == [0, 0, 0, None, 1, 1, 0, 2, None]


def test_classes_do_not_depend_on_order(grader):
    answers = ["\\frac{2}{4}", "0.5", "1/2", "2", "02", "\\sqrt{4}", "x", "4/2", None]
    labels, reps = grader.classes(answers)
    partition = {frozenset(a for a, c in zip(answers, labels) if c == k) for k in set(labels) - {None}}
    for seed in range(5):
        shuffled = answers[:]
        random.Random(seed).shuffle(shuffled)
        labels2, reps2 = grader.classes(shuffled)
        assert {frozenset(a for a, c in zip(shuffled, labels2) if c == k) for k in set(labels2) - {None}} == partition
        assert sorted(reps2) == sorted(reps)  # same representatives


# The timeout of the timeout tests: a fresh worker's first check (sympy's first use) takes about 0.2 s on an idle
# 2-core machine and several times that on a loaded one, and must finish within it; PATHOLOGICAL never does.
TIMEOUT_S = 3.0


def test_timeout_is_counted_and_does_not_hang(no_cost_estimate):
    g = Grader(timeout_s=TIMEOUT_S)
    try:
        assert g.check("1/2", "0.5").ok  # worker up
        start = time.monotonic()
        verdict = g.check(PATHOLOGICAL, "5")
        assert time.monotonic() - start < TIMEOUT_S + 10  # the timeout and the kill, not a hang
        assert verdict == grading.Verdict(False, timed_out=True)
        assert g.stats()["timeouts"] == 1
        assert g.check(PATHOLOGICAL, "5").timed_out  # cached: no second wait
        assert g.stats()["timeouts"] == 1
        assert g.check("\\frac{3}{6}", "0.5").ok  # a fresh worker took over
        assert g.stats()["worker_starts"] == 2
    finally:
        g.close()


def test_timeout_works_off_the_main_thread(no_cost_estimate):
    g = Grader(timeout_s=TIMEOUT_S)
    results = []

    def work():
        results.append(g.check("9^{9^{9^{9}}}", "7"))
        results.append(g.check("0.25", "\\frac14"))

    try:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert results == [grading.Verdict(False, timed_out=True), grading.Verdict(True)]
        assert g.stats()["timeouts"] == 1
    finally:
        g.close()


def test_module_level_api_uses_the_configured_grader():
    g = grading.configure(timeout_s=TIMEOUT_S)
    try:
        assert grading.default_grader() is g
        assert not is_equivalent("9^{9^{9^{9^{9}}}}", "3")  # over the cost bound: never reaches the worker
        assert grading.stats()["budget_exceeded"] == 1 and grading.stats().get("worker_calls", 0) == 0
        assert equivalence_classes(["1/2", "0.5", "2"]) == [0, 0, 1]
    finally:
        grading.configure()  # back to the default timeout


def test_validate_gold(grader):
    assert validate_gold("016", grader=grader) == ["016"]
    assert validate_gold(16, grader=grader) == ["16"]
    assert validate_gold(["80", " 81 "], grader=grader) == ["80", "81"]
    assert validate_gold("\\frac{\\pi}{2}", grader=grader) == ["\\frac{\\pi}{2}"]
    for bad, message in [
        (None, "NoneType"),
        ([], "empty list"),
        ("", "empty answer"),
        (True, "bool"),
        ("?", "'\\?' does not parse"),
        ("{", "'\\{' does not parse"),
        (["5", "\\frac{"], "does not parse"),
    ]:
        with pytest.raises(ValueError, match=message):
            validate_gold(bad, grader=grader)


def test_validate_gold_rows_reports_every_bad_row(grader):
    rows = [
        {"id": "a", "answer": "12"},
        {"id": "b", "answer": "?"},
        {"id": "c"},
        {"id": "d", "answer": None},
        {"id": "e", "answer": ["1", "2"]},
    ]
    with pytest.raises(ValueError) as err:
        validate_gold_rows(rows, grader=grader)
    message = str(err.value)
    assert message.startswith("3 of 5 rows")
    assert all(f"\n  {row_id}:" in message for row_id in "bcd") and "\n  a:" not in message
    assert validate_gold_rows([rows[0], rows[4]], grader=grader) == [["12"], ["1", "2"]]


# The longest gold answer of the evaluation benchmarks (Minerva Math, 210 characters, braces 3 deep).
LONGEST_GOLD = (
    "\\omega_{n}^{2} e^{-\\zeta \\omega_{n} t} \\cos \\left(\\omega_{n} \\sqrt{1-\\zeta^{2}} t\\right)"
    "-\\frac{\\zeta \\omega_{n}^{2}}{\\sqrt{1-\\zeta^{2}}} e^{-\\zeta \\omega_{n} t} "
    "\\sin \\left(\\omega_{n} \\sqrt{1-\\zeta^{2}} t\\right)"
)
OVERSIZED = [
    "1+" * 50_000 + "1",  # 100 KB
    "9" * (grading.MAX_ANSWER_CHARS + 1) + "x",
    "{" * (grading.MAX_BRACE_DEPTH + 1) + "1" + "}" * (grading.MAX_BRACE_DEPTH + 1),
    "\\frac{1}{" * 5_000 + "2" + "}" * 5_000,  # both limits
    "{" * 100_000,  # unbalanced
]


def test_oversized_answers_are_rejected_before_math_verify():
    """Beyond MAX_ANSWER_CHARS characters or MAX_BRACE_DEPTH nested braces, as prediction or gold: not
    equivalent, counted under `rejected`, and the worker is never started. Each takes well under 50 ms here; the
    wall-clock bound, for all of them together, is one a loaded CI machine keeps (one answer that reached
    math-verify would start the worker, which is asserted apart, and cost seconds)."""
    g = Grader(timeout_s=5.0)
    try:
        start = time.perf_counter()
        verdicts = [g.check(a, "5") for a in OVERSIZED] + [g.check("5", a) for a in OVERSIZED]
        verdicts += [g.parses(a) for a in OVERSIZED]
        elapsed = time.perf_counter() - start
        assert verdicts == [grading.Verdict(False, rejected=True)] * (3 * len(OVERSIZED))
        assert elapsed < 5.0
        stats = g.stats()
        assert stats["rejected"] == 3 * len(OVERSIZED)
        assert stats.get("worker_starts", 0) == 0 and stats.get("worker_calls", 0) == 0
        labels, _ = g.classes([OVERSIZED[0], OVERSIZED[0], None])
        assert labels == [0, 0, None] and g.stats().get("worker_calls", 0) == 0  # its own class, unchecked
        with pytest.raises(ValueError, match="beyond the grading size limits"):
            validate_gold(OVERSIZED[1], grader=g)
    finally:
        g.close()


def test_the_size_limits_spare_real_answers(grader):
    """The limits' edges, and the longest real gold answer, still go to math-verify."""
    assert len(LONGEST_GOLD) == 210
    before = grader.stats().get("rejected", 0)
    at_length = "+".join(["x"] * 499) + "+xy"
    assert len(at_length) == grading.MAX_ANSWER_CHARS
    depth = grading.MAX_BRACE_DEPTH  # 1/(1/(...1/2)): braces `depth` deep, 2 when even, 1/2 when odd
    at_depth = "\\frac{1}{" * (depth - 1) + "\\frac{1}{2}" + "}" * (depth - 1)
    calls = grader.stats().get("worker_calls", 0)
    assert grader.check(at_length, "499x+xy") == grading.Verdict(True)
    assert grader.check(at_depth, "2" if depth % 2 == 0 else "\\frac{1}{2}") == grading.Verdict(True)
    assert grader.stats()["worker_calls"] == calls + 2
    assert grader.check(LONGEST_GOLD.replace("\\left(", "(").replace("\\right)", ")"), LONGEST_GOLD).ok
    assert grader.parses(LONGEST_GOLD).ok
    assert grader.check("\\frac{1}{" + at_depth + "}", "1").rejected  # one level deeper
    assert grader.stats()["rejected"] == before + 1  # that one only
