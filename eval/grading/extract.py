"""The final answer of a response: the last `\\boxed{...}` (or `\\boxed ...`, `\\fbox{...}`) after the thinking
part (`extract_answer`), and the final answer part itself (`strip_thinking`)."""

from __future__ import annotations

import re
from typing import Sequence

from sarl.steps import THINK_CLOSE, THINK_OPEN

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character (\{, \}, \\) or a grouping brace
_BLANKS = re.compile(r"[ \t]*")
_REST_OF_LINE = re.compile(r"[^$\n]*")


def extract_answer(text: str) -> str | None:
    """The final answer: the content of the last well-formed, non-empty `\\boxed{...}` (nested braces
    matched), `\\boxed ...` (up to `$` or the end of the line) or `\\fbox{...}` after the last `</think>`;
    None if there is none (or `text` is not a string).

    Linear in the length of `text`: the braces are matched in one pass, so a truncated generation with
    thousands of unclosed `\\boxed{` costs no more than reading it once.
    """
    if not isinstance(text, str):
        return None
    cut = text.rfind(THINK_CLOSE)
    if cut >= 0:
        text = text[cut + len(THINK_CLOSE) :]
    starts = [m.end() for m in _BOX_COMMAND.finditer(text)]
    if not starts:
        return None
    closing = _matching_braces(text, starts[0])
    for start in reversed(starts):
        content = _box_content(text, start, closing)
        if content:
            return content
    return None


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


def extract_answers(responses: Sequence[object]) -> tuple[list[str | None], dict[int, str]]:
    """`extract_answer` of every response, and row -> reason for responses that are not text."""
    failed = {
        i: f"unusable response: a {type(r).__name__}, not a str"
        for i, r in enumerate(responses)
        if not isinstance(r, str)
    }
    return [None if i in failed else extract_answer(r) for i, r in enumerate(responses)], failed


def strip_thinking(text: str) -> str:
    """The final answer part of a response (SPEC 3: answers are graded after stripping the thinking part):
    the text after the last `</think>`; "" when a `<think>` block never closes (generation truncated while
    thinking: there is no final answer); the whole text when there is no think tag at all."""
    if not isinstance(text, str):
        return ""
    cut = text.rfind(THINK_CLOSE)
    if cut >= 0:
        return text[cut + len(THINK_CLOSE) :].strip()
    if THINK_OPEN in text:
        return ""
    return text.strip()
