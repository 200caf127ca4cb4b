"""The final answer of a response: the last `\\boxed{...}` (or `\\boxed ...`, `\\fbox{...}`) after the thinking
part (`extract_answer`), and the final answer part itself (`strip_thinking`)."""

from __future__ import annotations

import re
from typing import Sequence

from sarl.steps import THINK_CLOSE, THINK_OPEN

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)")


def extract_answer(text: str) -> str | None:
    """The final answer: the content of the last well-formed, non-empty `\\boxed{...}` (nested braces
    matched), `\\boxed ...` (up to `$` or the end of the line) or `\\fbox{...}` after the last `</think>`;
    None if there is none (or `text` is not a string)."""
    if not isinstance(text, str):
        return None
    cut = text.rfind(THINK_CLOSE)
    if cut >= 0:
        text = text[cut + len(THINK_CLOSE) :]
    for match in reversed(list(_BOX_COMMAND.finditer(text))):
        content = _box_content(text, match.end())
        if content:
            return content
    return None


def _box_content(text: str, start: int) -> str | None:
    """Argument of a `\\boxed`/`\\fbox` command whose name ends at `start`, or None if malformed."""
    if text[start : start + 1].isalpha():  # \boxedx, \fboxsep: another command
        return None
    j = start
    while j < len(text) and text[j] in " \t":
        j += 1
    if text[j : j + 1] == "{":
        depth = 0
        k = j
        while k < len(text):
            ch = text[k]
            if ch == "\\":  # \{ and \} are literal braces, not grouping
                k += 2
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : k].strip() or None
            k += 1
        return None  # unbalanced: truncated generation
    if j > start:  # "\boxed 5": the argument runs to "$" or the end of the line
        return re.match(r"[^$\n]*", text[j:]).group(0).strip() or None
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
