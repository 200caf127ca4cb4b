"""The final answer of a response, one rule for the training rewards and the evaluation.

- `strip_thinking`: the final answer part: the text after the last `</think>`; nothing when a `<think>`
  never closes (the generation was cut off while thinking); the whole text when there is no think tag.
- `extract_answer`: the last `\\boxed{...}` (or `\\boxed ...`, `\\fbox{...}`) of that part.
- `extract_answer_line`: the letter of the last "Answer: X" of that part, for a multiple-choice prompt that asks
  for "Answer: $LETTER" (Structured Reasoning App. A.8; conf/eval/prompt/structured.yaml).

`answer_in_unclosed_think=True` is the other reading, for a method that takes the last box of an unfinished
thinking as its answer: the whole text then counts when `<think>` never closes. The rewards take it as a
constructor argument (conf/reward/*.yaml) and the evaluation as `grading.answer_in_unclosed_think`
(conf/eval.yaml); both default to the rule above (docs/grading.md).
"""

from __future__ import annotations

import re
from typing import Sequence

from sarl.structure.steps import THINK_CLOSE, THINK_OPEN

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character (\{, \}, \\) or a grouping brace
_BLANKS = re.compile(r"[ \t]*")
_REST_OF_LINE = re.compile(r"[^$\n]*")
# "Answer: B", "**Answer:** B", "Answer: (B)", "Answer: $B$", "Answer: \\boxed{B}": the capital letter after the colon
_ANSWER_LINE = re.compile(
    r"(?i:answer)[ \t]*\**[ \t]*:[ \t]*\**[ \t]*(?:\$|\\\(|\\boxed\{|\\text\{|\\textbf\{|\(|\*\*)*[ \t]*"
    r"([A-Z])(?![A-Za-z0-9])"
    # a hedge is no answer: the letter followed by a list of others ("A, B, C or D", "A/B", "(A) and (B)")
    r"(?![)}\]$*\\]*[ \t]*(?:[,/;&]|(?i:or|and)(?![A-Za-z]))[ \t]*(?:\$|\\\(|\\boxed\{|\\text\{|\(|\*\*)*[ \t]*"
    r"[A-Z](?![A-Za-z0-9]))"
)


def extract_answer(text: str, *, answer_in_unclosed_think: bool = False) -> str | None:
    """The final answer: the content of the last well-formed, non-empty `\\boxed{...}` (nested braces
    matched), `\\boxed ...` (up to `$` or the end of the line) or `\\fbox{...}` in the final answer part
    (`strip_thinking`); None if there is none (or `text` is not a string).

    Linear in the length of `text`: the braces are matched in one pass, so a truncated generation with
    thousands of unclosed `\\boxed{` costs no more than reading it once; boxes after the last `}` are
    known to be unclosed without matching any brace.
    """
    if not isinstance(text, str):
        return None
    text = strip_thinking(text, answer_in_unclosed_think=answer_in_unclosed_think)
    starts = [m.end() for m in _BOX_COMMAND.finditer(text)]
    if not starts:
        return None
    last_close = text.rfind("}")
    closing: dict[int, int] | None = None  # matched only once a box that can close is reached
    for start in reversed(starts):
        if start > last_close and text.startswith("{", start):
            continue  # a braced argument with no "}" after it: unclosed (truncated), as _box_content finds
        if closing is None:
            closing = _matching_braces(text, starts[0])
        content = _box_content(text, start, closing)
        if content:
            return content
    return None


def extract_answer_line(text: str, *, answer_in_unclosed_think: bool = False) -> str | None:
    """The letter (A-Z) of the last "Answer: X" in the final answer part (`strip_thinking`), markup around the
    letter allowed ("**Answer:** (B)", "Answer: $B$", "Answer: \\boxed{B}"); None if there is none. The letter
    must stand alone: "Answer: Because ..." is no answer, nor is a hedge over several letters ("Answer: A, B, C or
    D", "Answer: A/B")."""
    if not isinstance(text, str):
        return None
    found = _ANSWER_LINE.findall(strip_thinking(text, answer_in_unclosed_think=answer_in_unclosed_think))
    return found[-1] if found else None


def _matching_braces(text: str, start: int) -> dict[int, int]:
    """Position of every `{` from `start` on -> position of its matching `}` (an unclosed `{` is absent).

    `\\{` and `\\}` are literal braces, not grouping. Every `{` that follows a command name is reached at a
    token boundary (the character before it is a letter or a blank, never a backslash), so one pass from the
    first command matches each argument exactly as scanning from that argument alone would.
    """
    closing: dict[int, int] = {}
    opened: list[int] = []
    for token in _BRACE_TOKEN.finditer(text, start):
        ch = token.group()
        if ch == "{":
            opened.append(token.start())
        elif ch == "}" and opened:
            closing[opened.pop()] = token.start()
    return closing


def _box_content(text: str, start: int, closing: dict[int, int]) -> str | None:
    """Argument of a `\\boxed`/`\\fbox` command whose name ends at `start`, or None if malformed."""
    if text[start : start + 1].isalpha():  # \boxedx, \fboxsep: another command
        return None
    j = _BLANKS.match(text, start).end()
    if text[j : j + 1] == "{":
        k = closing.get(j)
        if k is None:  # unbalanced: truncated generation
            return None
        return text[j + 1 : k].strip() or None
    if j > start:  # "\boxed 5": the argument runs to "$" or the end of the line
        return _REST_OF_LINE.match(text, j).group(0).strip() or None
    return None


def extract_answers(
    responses: Sequence[object], *, answer_in_unclosed_think: bool = False
) -> tuple[list[str | None], dict[int, str]]:
    """`extract_answer` of every response, and row -> reason for responses that are not text."""
    failed = {
        i: f"unusable response: a {type(r).__name__}, not a str"
        for i, r in enumerate(responses)
        if not isinstance(r, str)
    }
    answers = [
        None if i in failed else extract_answer(r, answer_in_unclosed_think=answer_in_unclosed_think)
        for i, r in enumerate(responses)
    ]
    return answers, failed


def strip_thinking(text: str, *, answer_in_unclosed_think: bool = False) -> str:
    """The final answer part of a response (answers are graded after stripping the thinking part): the text
    after the last `</think>` (also when the chat template put `<think>` in the prompt); "" when a `<think>`
    never closes (generation truncated while thinking: there is no final answer), or the whole text with
    `answer_in_unclosed_think`; the whole text when there is no think tag at all. "" for a non-string."""
    if not isinstance(text, str):
        return ""
    cut = text.rfind(THINK_CLOSE)
    if cut >= 0:
        return text[cut + len(THINK_CLOSE) :].strip()
    if THINK_OPEN in text and not answer_in_unclosed_think:
        return ""
    return text.strip()
