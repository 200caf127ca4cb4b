"""Structured Reasoning's step tags: the prompt, its RL-time tag randomisation, the tagged-step
parser shared by the MaxFlow and LCS rewards, and the format score.

- 23 tags, in the prompt's order (Structured Reasoning App. A.8 "Mathematical Problem Solving Template").
- The prompt asks for a tag "at the beginning of each sentence"; a step starts at a tag and runs to the next
  one (closing tags optional). The free-form ablation (Structured Reasoning App. B) splits on "\\n\\n" instead.
- RL-time randomisation (Structured Reasoning App. A.4 "Tag Randomization for Robustness"): keep the top 5 tags, add 0-5
  random others, shuffle.

Decisions where the paper is silent:
- the "top 5 tags" are not listed; `TOP_TAGS` takes the ones the paper names as most frequent (Table 13's
  "verify", "summarize"; App. A.5's backbone assumption -> decompose/formalize -> verify); configurable;
- tags match case-insensitively (`<Verify>` is `verify`); an unknown tag (`<foo>`) is text, counted;
- text before the first tag is one untagged step (tag None), flagged `untagged_prefix`;
- a step's span starts at its opening tag; its text is the content with the tag markup removed;
- the answer is the text after the last `</think>` (the response's conclusion); the reasoning is the
  `<think>` block with decisions §1's rules (`</think>` alone: everything before it; no tag at all: the whole
  response, flagged `no_think`; `<think>` alone: truncated);
- format score (weight 1.0 in the paper, undefined there): 1 if the reasoning is closed by `</think>`, has
  at least one tagged step and no untagged prefix, and a `\\boxed{}` answer follows `</think>`; else 0.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from sarl.checking.grading.extract import extract_answer
from sarl.structure.steps import THINK_CLOSE, THINK_OPEN, sanitize

# Structured Reasoning App. A.8, in the prompt's order.
TAGS: tuple[str, ...] = (
    "rephrase",
    "inference",
    "analogy",
    "equivalent",
    "association",
    "reverse",
    "summarize",
    "verify",
    "complete",
    "decompose",
    "counterexample",
    "assumption",
    "constraint",
    "case_analysis",
    "contradiction",
    "abstraction",
    "formalize",
    "generalize",
    "specialize",
    "critique",
    "alternative",
    "consequence",
    "intuition",
)
# Our reading of "the top 5 tags" (App. A.4): Table 13's top tags and App. A.5's backbone.
TOP_TAGS: tuple[str, ...] = ("verify", "summarize", "assumption", "decompose", "formalize")
STEP_MODES = ("tags", "paragraphs")

_TAG_SET = frozenset(TAGS)
_ANY_TAG = re.compile(r"<(/?)([A-Za-z_]+)>")
_CLOSING_TAG = re.compile(r"</(?:" + "|".join(TAGS) + r")>", re.IGNORECASE)


def structured_prompt(question: str, tags: Sequence[str] = TAGS) -> str:
    """The math prompt of Structured Reasoning App. A.8 with the given tags (default: all 23, in the paper's order)."""
    unknown = [t for t in tags if t not in _TAG_SET]
    if unknown:
        raise ValueError(f"unknown tags {unknown}; choose from: {', '.join(TAGS)}")
    listing = ", ".join(f"<{t}>" for t in tags)
    return (
        f"Please use the following tags at the beginning of each sentence in your reasoning: {listing}.\n"
        f"{question}\n"
        "Please reason step by step, and put your final answer within \\boxed{ }."
    )


def randomized_tags(
    rng: np.random.Generator, top: Sequence[str] = TOP_TAGS, max_extra: int = 5, tags: Sequence[str] = TAGS
) -> list[str]:
    """Structured Reasoning App. A.4: the `top` tags plus 0..max_extra random others from the rest, shuffled."""
    missing = [t for t in top if t not in tags]
    if missing:
        raise ValueError(f"top tags {missing} are not among the tags")
    rest = [t for t in tags if t not in top]
    if not 0 <= max_extra <= len(rest):
        raise ValueError(f"max_extra must lie in [0, {len(rest)}], got {max_extra}")
    n_extra = int(rng.integers(0, max_extra + 1))
    extra = [rest[i] for i in rng.choice(len(rest), size=n_extra, replace=False)]
    chosen = list(top) + extra
    return [chosen[i] for i in rng.permutation(len(chosen))]


def randomized_prompt(question: str, seed: int, key: str, top: Sequence[str] = TOP_TAGS, max_extra: int = 5) -> str:
    """The RL-time prompt of one question: its tag draw depends only on (seed, key), e.g. the row id, so a
    data set built twice gives the same prompts."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8", "surrogatepass")).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return structured_prompt(question, randomized_tags(rng, top, max_extra))


_PROMPT_HEAD = "Please use the following tags at the beginning of each sentence in your reasoning: "
_PROMPT_TAIL = "\nPlease reason step by step, and put your final answer within \\boxed{ }."


def question_of(prompt: str) -> str:
    """The question of a prompt written by `structured_prompt` (its inverse); ValueError for any other text."""
    first, sep, rest = prompt.partition(".\n")
    if not (first.startswith(_PROMPT_HEAD) and sep and rest.endswith(_PROMPT_TAIL)):
        raise ValueError("not a Structured Reasoning tagged-step prompt (sarl.formats.tags.structured_prompt)")
    return rest[: -len(_PROMPT_TAIL)]


def tags_of_prompt(prompt: str) -> list[str]:
    """The tags a prompt written by `structured_prompt` lists, in its order; ValueError for any other text."""
    question_of(prompt)  # the same check of the prompt's frame
    listing = prompt[len(_PROMPT_HEAD) :].partition(".\n")[0]
    return [t.strip()[1:-1] for t in listing.split(",")]


def redraw_tags(messages: Sequence[dict], seed: int, key: str) -> list[dict]:
    """Training-time tag randomisation (Structured Reasoning App. A.4 "Tag Randomization for Robustness": "for each
    question, we retain the top 5 tags and randomly sample 0-5 additional tags ..., shuffling their order"):
    the chat messages with the last user message's tagged prompt redrawn from (seed, key). The key names the
    question and the draw (row id and epoch), so each sampling of a prompt gets its own tag set, reproducibly."""
    out = [dict(m) for m in messages]
    last = max((i for i, m in enumerate(out) if m.get("role") == "user"), default=None)
    if last is None:
        raise ValueError("no user message to redraw the tags of")
    out[last]["content"] = randomized_prompt(question_of(str(out[last]["content"])), seed=seed, key=key)
    return out


def draw_key(row_id: object, epoch: int) -> str:
    """The key of one training-time draw: the row's id and the epoch it is sampled in."""
    return f"{row_id}@epoch{int(epoch)}"


@dataclass
class Step:
    """One reasoning step: its tag (None if untagged), its text without tag markup, and its character span
    [start, end) in the sanitised response (`StructuredResponse.text`), the opening tag included."""

    tag: str | None
    text: str
    start: int
    end: int


@dataclass
class StructuredResponse:
    """A response split into steps and answer, with the flags the rewards report."""

    text: str  # the sanitised response that the spans index
    mode: str  # "tags" or "paragraphs"
    steps: list[Step]
    answer: str  # the text after the last </think> ("" if none)
    answer_start: int | None  # where the answer text starts in `text` (None if no answer text)
    closed: bool  # the reasoning ends with </think>
    truncated: bool  # <think> without </think>
    no_think: bool  # neither <think> nor </think>
    untagged_prefix: bool  # text before the first tag (tags mode)
    unknown_tags: int  # <name> tags that are not among the 23 (tags mode)
    tag_counts: Counter = field(default_factory=Counter)

    @property
    def tag_sequence(self) -> list[str]:
        """The step tags in order, "" for an untagged step (it matches nothing in LCS)."""
        return [s.tag or "" for s in self.steps]


def _reasoning_span(text: str) -> tuple[int, int, bool, bool, bool]:
    """(start, end, closed, truncated, no_think) of the reasoning in `text` (decisions §1's rules)."""
    open_at = text.find(THINK_OPEN)
    if open_at >= 0:
        start = open_at + len(THINK_OPEN)
        close_at = text.find(THINK_CLOSE, start)
        if close_at < 0:
            return start, len(text), False, True, False
        return start, close_at, True, False, False
    close_at = text.find(THINK_CLOSE)
    if close_at >= 0:
        return 0, close_at, True, False, False
    return 0, len(text), False, False, True


def _stripped_span(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def parse_structured(response: str, mode: str = "tags") -> StructuredResponse:
    """Steps and answer of a response; never raises on model text (a non-str is an empty response).

    `mode="tags"`: a step starts at one of the 23 tags and runs to the next one; `"paragraphs"`: the
    free-form ablation, steps split on "\\n\\n" (every tag None).
    """
    if mode not in STEP_MODES:
        raise ValueError(f"step mode {mode!r} is not valid; choose one of: {', '.join(STEP_MODES)}")
    text, _ = sanitize(response) if isinstance(response, str) else ("", False)
    r_start, r_end, closed, truncated, no_think = _reasoning_span(text)
    answer_start = None
    answer = ""
    close_at = text.rfind(THINK_CLOSE)
    if close_at >= 0:
        a0, a1 = _stripped_span(text, close_at + len(THINK_CLOSE), len(text))
        if a1 > a0:
            answer_start, answer = a0, text[a0:a1]
    steps: list[Step] = []
    unknown = 0
    untagged_prefix = False
    if mode == "paragraphs":
        pos = r_start
        for piece in text[r_start:r_end].split("\n\n"):
            s0, s1 = _stripped_span(text, pos, pos + len(piece))
            if s1 > s0:
                steps.append(Step(None, text[s0:s1], s0, s1))
            pos += len(piece) + 2
    else:
        opens: list[tuple[int, int, str]] = []  # (tag start, content start, tag)
        for m in _ANY_TAG.finditer(text, r_start, r_end):
            name = m.group(2).lower()
            if name not in _TAG_SET:
                unknown += 1
            elif not m.group(1):
                opens.append((m.start(), m.end(), name))
        first = opens[0][0] if opens else r_end
        p0, p1 = _stripped_span(text, r_start, first)
        if p1 > p0:
            untagged_prefix = True
            steps.append(Step(None, text[p0:p1], p0, p1))
        for k, (tag_at, content_at, name) in enumerate(opens):
            stop = opens[k + 1][0] if k + 1 < len(opens) else r_end
            content = _CLOSING_TAG.sub("", text[content_at:stop]).strip()
            _, s1 = _stripped_span(text, tag_at, stop)
            steps.append(Step(name, content, tag_at, s1))
    return StructuredResponse(
        text=text,
        mode=mode,
        answer=answer,
        answer_start=answer_start,
        steps=steps,
        tag_counts=Counter(s.tag for s in steps if s.tag),
        closed=closed,
        truncated=truncated,
        no_think=no_think,
        untagged_prefix=untagged_prefix,
        unknown_tags=unknown,
    )


def format_score(parsed: StructuredResponse) -> float:
    """Our format score (the paper gives it weight 1.0 but no definition): 1 if the reasoning is closed by
    `</think>`, has a tagged step and no untagged prefix (free-form mode: any step), and a `\\boxed{}` answer
    follows; else 0."""
    if parsed.mode == "tags":
        steps_ok = any(s.tag for s in parsed.steps) and not parsed.untagged_prefix
    else:
        steps_ok = bool(parsed.steps)
    boxed = extract_answer(parsed.text) is not None  # the answer after the last </think>, as graded
    return float(parsed.closed and steps_ok and boxed)
