"""Token counts of text pieces (GRP's I(v), GRP Eq. 9; LCS step lengths, Structured Reasoning Eq. 6; response
lengths when an OpenAI-compatible server reports no usage, `eval.run`).

With a tokenizer (a loaded one, or a path/id loaded on first use with `AutoTokenizer`), a count is the number
of tokens the tokenizer gives without special tokens; without one (the default), the number of
whitespace-separated words, so the rewards run with no model at hand. Choose the policy's tokenizer to count
as the papers do.
"""

from __future__ import annotations

import re
from typing import Any

# A lone surrogate is no text a tokenizer takes (a fast tokenizer raises TypeError): model text can hold one, e.g. a GRP
# node's content decoded from the JSON escape "\ud800" (sarl.formats.graph), so it is counted as U+FFFD, as
# `sarl.structure.steps.sanitize` writes it.
_SURROGATE = re.compile("[\ud800-\udfff]")


class TokenCounter:
    """`counter(text) -> int`; total on model text (a lone surrogate counts as U+FFFD)."""

    def __init__(self, tokenizer: Any = None) -> None:
        self._spec = tokenizer
        self._tokenizer = None if isinstance(tokenizer, str) else tokenizer

    @property
    def name(self) -> str:
        if self._spec is None:
            return "whitespace words"
        return self._spec if isinstance(self._spec, str) else type(self._spec).__name__

    def __call__(self, text: str) -> int:
        if self._spec is None:
            return len(text.split())
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._spec)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: U+FFFD in its place (above)
            text = _SURROGATE.sub("\ufffd", text)
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])
