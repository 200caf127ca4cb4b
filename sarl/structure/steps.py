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


# Derived from the two patterns above: the ASCII control characters, deleted by bytes.translate in sanitize's fast
# path, and the C1 controls (U+0080-U+009F) as UTF-8 writes them, C2 followed by one byte of 80-9F.
_ASCII_CONTROL = bytes(c for c in range(0x80) if _CONTROL.match(chr(c)))
_C1_UTF8 = re.compile(
    b"\xc2[" + b"".join(re.escape(chr(c).encode()[1:]) for c in range(0x80, 0xC0) if _CONTROL.match(chr(c))) + b"]"
)


def sanitize(text: str) -> tuple[str, bool]:
    """Make model output safe to embed: valid UTF-8, no control characters, "\\n" newlines.

    Lone surrogates (invalid unicode) become U+FFFD. Returns (text, changed).
    """
    # Without a lone surrogate or a C1 control (the usual case), the general path below reduces to C loops, several
    # times a regex's speed: newlines, then the ASCII controls deleted by bytes.translate, then NFC if needed.
    clean = text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
    try:
        raw = clean.encode("utf-8")  # a lone surrogate raises
    except UnicodeEncodeError:
        raw = None
    if raw is not None:
        kept = raw.translate(None, _ASCII_CONTROL)
        if len(kept) != len(raw):
            clean = kept.decode("utf-8")  # ASCII bytes deleted from valid UTF-8: still valid
        if len(kept) == len(clean):  # ASCII: no C1 control, already NFC
            return clean, clean != text
        if not _C1_UTF8.search(kept):
            if not unicodedata.is_normalized("NFC", clean):
                clean = unicodedata.normalize("NFC", clean)
            return clean, clean != text
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
        start += len(THINK_OPEN)
        end = text.find(THINK_CLOSE, start)  # one copy of the reasoning, not two
        if end < 0:
            return text[start:], False, True
        return text[start:end], False, False
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
    steps = [step for piece in pieces if (step := piece.strip())]
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
