"""Gold answers as the data sets write them -> the normalised list of accepted answers.

- "080" -> "80": an integer loses its leading zeros (AIME answers are written 000-999 on the answer sheet).
- 27.0 or "27.0" -> "27": an integral decimal is an integer (math-ai/amc23 stores answers as floats).
- "$\\frac{1}{2}$" -> "\\frac{1}{2}": outer dollar signs and surrounding whitespace go.
- "080 or 081 (both were accepted)" -> ["80", "81"]: where a data set's config names a separator of several
  accepted answers (`answers.several`) and a trailing remark (`answers.remark`), every accepted answer is kept
  for grading (AIME 2022 II Problem 8).
- a list (e.g. ["27.0"]) is a list of accepted answers, each normalised.

The result is always a list of distinct, non-empty strings, so one parquet column holds every row; a
missing or empty answer is a ValueError that names it (the builder reports the row by id).
"""

from __future__ import annotations

import math
import re
from typing import Any

_INTEGER = re.compile(r"([+-]?)(\d+)(?:\.0*)?")


def normalise_answer(answer: str) -> str:
    """One accepted answer, normalised (see the module docstring); ValueError if nothing is left."""
    s = answer.strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$" and "$" not in s.strip("$"):  # not `$1$ and $2$`
        s = s.strip("$").strip()
    m = _INTEGER.fullmatch(s)
    if m is not None:
        digits = m.group(2).lstrip("0") or "0"
        s = "-" + digits if m.group(1) == "-" and digits != "0" else digits
    if not s:
        raise ValueError(f"empty answer {answer!r}")
    return s


def accepted_answers(value: Any, several: str | None = None, remark: str | None = None) -> list[str]:
    """The accepted answers of one row's gold `value` (a str, a number or a list of them), normalised.

    `several`: a regex between accepted answers in one string (None: the string is one answer);
    `remark`: a regex for a trailing remark dropped before splitting (only when `several` matches).
    """
    items = _as_list(value)
    if not items:
        raise ValueError("no gold answer")
    out: list[str] = []
    for item in items:
        text = _as_text(item)
        parts = [text]
        if several and re.search(several, text):
            if remark:
                text = re.sub(remark, "", text)
            parts = re.split(several, text)
        for part in parts:
            answer = normalise_answer(part)
            if answer not in out:
                out.append(answer)
    return out


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy arrays and scalars
        value = value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _as_text(item: Any) -> str:
    if isinstance(item, bool) or item is None:
        raise ValueError(f"gold answer {item!r} is not a number or text")
    if isinstance(item, float):
        if not math.isfinite(item):
            raise ValueError(f"gold answer {item!r} is not finite")
        return str(int(item)) if item.is_integer() else repr(item)
    if isinstance(item, (int, str)):
        return str(item)
    raise ValueError(f"gold answer {item!r} is a {type(item).__name__}; expected text or a number")
