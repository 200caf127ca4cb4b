"""Reasoning steps of a response (SARL Sec. 3.2; decisions §1.1 "Steps").

The reasoning is the content of the `<think>...</think>` block, split on a
delimiter ("\\n\\n" for Qwen3) into stripped, non-empty steps.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
NO_THINK_MODES = ("whole", "empty")

# C0/C1 control characters except tab, newline and carriage return.
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass
class ParsedSteps:
    """Steps of one response plus the flags decisions §1 asks the reward output to record."""

    steps: list[str]
    no_think: bool = False
    truncated: bool = False
    n_steps_raw: int = 0
    steps_capped: bool = False
    sanitized: bool = False
    flags: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.flags = {
            "no_think": float(self.no_think),
            "truncated": float(self.truncated),
            "steps_capped": float(self.steps_capped),
        }


# Derived from the two patterns above. Anything sanitize would change but NFC: a surrogate, a control character or a
# carriage return (one scan); and the ASCII control characters, deleted by bytes.translate in its fast path.
_NEEDS_WORK = re.compile(f"{_SURROGATE.pattern}|{_CONTROL.pattern}|\r")
_ASCII_CONTROL = bytes(c for c in range(0x80) if _CONTROL.match(chr(c)))


def sanitize(text: str) -> tuple[str, bool]:
    """Make model output safe to embed: valid UTF-8, no control characters, "\\n" newlines.

    Lone surrogates (invalid unicode) become U+FFFD. Returns (text, changed).
    """
    if "\r" not in text:  # the usual cases, found clean in one scan: nothing to change
        if text.isascii():  # no surrogate, already NFC; only controls to find
            raw = text.encode("ascii")
            if len(raw.translate(None, _ASCII_CONTROL)) == len(raw):  # a C loop, several times a regex's speed
                return text, False
        elif not _NEEDS_WORK.search(text) and unicodedata.is_normalized("NFC", text):
            return text, False
    clean = _SURROGATE.sub("\ufffd", text)
    clean = clean.replace("\r\n", "\n").replace("\r", "\n")
    clean = _CONTROL.sub("", clean)
    clean = unicodedata.normalize("NFC", clean)
    return clean, clean != text


def extract_reasoning(text: str, no_think: str = "whole") -> tuple[str, bool, bool]:
    """The reasoning part of a response: (reasoning, no_think, truncated). decisions §1.

    - `<think>...</think>`: the block's content (the first block when several).
    - `<think>` without `</think>` (truncated generation): everything after `<think>`.
    - `</think>` without `<think>` (the template opened it in the prompt): everything before.
    - neither: the whole response (`no_think="whole"`) or nothing (`"empty"`).
    """
    if no_think not in NO_THINK_MODES:
        raise ValueError(f"no_think={no_think!r} is not valid; choose one of: {', '.join(NO_THINK_MODES)}")
    start = text.find(THINK_OPEN)
    if start >= 0:
        body = text[start + len(THINK_OPEN) :]
        end = body.find(THINK_CLOSE)
        if end < 0:
            return body, False, True
        return body[:end], False, False
    end = text.find(THINK_CLOSE)
    if end >= 0:
        return text[:end], False, False
    return (text if no_think == "whole" else ""), True, False


def parse_steps(
    text: str,
    delimiter: str = "\n\n",
    no_think: str = "whole",
    *,
    regex: bool = False,
    max_steps: int = 1024,
) -> ParsedSteps:
    """Steps of a response with decisions §1's flags; `max_steps` keeps the first steps only."""
    if not delimiter:
        raise ValueError("the step delimiter must be a non-empty string")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if not isinstance(text, str):
        raise TypeError(f"response must be a str, got {type(text).__name__}")
    clean, sanitized = sanitize(text)
    reasoning, is_no_think, truncated = extract_reasoning(clean, no_think)
    pieces = re.split(delimiter, reasoning) if regex else reasoning.split(delimiter)
    steps = [s.strip() for s in pieces]
    steps = [s for s in steps if s]
    n_raw = len(steps)
    return ParsedSteps(
        steps=steps[:max_steps],
        no_think=is_no_think,
        truncated=truncated,
        n_steps_raw=n_raw,
        steps_capped=n_raw > max_steps,
        sanitized=sanitized,
    )


def split_steps(text: str, delimiter: str = "\n\n", no_think: str = "whole", *, regex: bool = False) -> list[str]:
    """Steps s_1..s_M of a response's reasoning (SARL Sec. 3.2): split, stripped, empties dropped."""
    return parse_steps(text, delimiter, no_think, regex=regex, max_steps=2**62).steps
