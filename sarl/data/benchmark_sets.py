"""Builders for the other papers' benchmarks and training sets (EVOL-RL, GRP, Structured Reasoning) whose source
rows are not plain (question, answer) pairs. Every one writes records that `eval.run` grades like a math answer
(the last `\\boxed{}` of a response against the accepted answers in `reward_model.ground_truth`, with
`sarl.checking.grading`), so one evaluation path serves every benchmark of the protocols (docs/decisions.md §7.4).

- `math_solution`: the gold is extracted from a worked solution, then the set is built by `build_math`:
  `answers.extract: after_hashes` (GSM8K: the text after the last "####", thousands separators dropped) or
  `last_boxed` (MATH: the last `\\boxed{}` of the solution, `sarl.checking.grading.extract.extract_answer`'s rule).
- `choice`: multiple choice (GPQA-Diamond, MMLU, LSAT-AR). The prompt lists the options as "(A) ...", "(B) ...",
  and asks for the letter in `\\boxed{}`; the gold is the letter. The options come from a list column
  (`fields.choices`) or from a correct-answer column plus incorrect-answer columns (`fields.correct`,
  `fields.incorrect`). `choices.shuffle: true` shuffles them per row, seeded by (`choices.seed`, row id): GPQA
  writes the correct answer first, so without it every gold would be "A".
- `reading`: reading comprehension with span or number answers (DROP): prompt = passage + question, gold = every
  distinct accepted answer of the row, each also without a leading article ("the Bears" -> also "Bears").

Rows the builders cannot use are reported by id (`settle`), as in `sarl.data.build`.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from typing import Any, Callable, Mapping, Sequence

from sarl.checking.grading.extract import extract_answer
from sarl.data.build import (
    BUILDERS,
    Built,
    DataValidationError,
    Steps,
    _plain,
    _text,
    build_math,
    check_fields,
    extras,
    math_prompt,
    problem,
    record,
    row_ids,
    settle,
)

LETTERS = string.ascii_uppercase
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_ARTICLE = re.compile(r"^(?:a|an|the)\s+", re.IGNORECASE)
_OPTION_LABEL = re.compile(r"^\s*\(?([A-Za-z])\)\s*")  # "(A)text", "(A) text", "A) text"


# ---------------------------------------------------------------------------------------------------------
# Golds extracted from a worked solution: GSM8K (####), MATH-TRAIN (\boxed{})
# ---------------------------------------------------------------------------------------------------------


def after_hashes(solution: Any) -> str:
    """GSM8K's final answer: the text after the last "####", with thousands separators dropped
    ("#### 70,000" -> "70000"); ValueError when there is none."""
    text = solution if isinstance(solution, str) else ""
    if "####" not in text:
        raise ValueError('no "####" final answer in the solution')
    answer = _THOUSANDS.sub("", text.rsplit("####", 1)[1]).strip()
    if not answer:
        raise ValueError('nothing after the last "####"')
    return answer


def last_boxed(solution: Any) -> str:
    """MATH's final answer: the content of the last `\\boxed{}` (or `\\fbox{}`) of the solution; ValueError when
    there is none."""
    answer = extract_answer(solution) if isinstance(solution, str) else None
    if not answer:
        raise ValueError("no \\boxed{} answer in the solution")
    return answer


EXTRACTORS: dict[str, Callable[[Any], str]] = {"after_hashes": after_hashes, "last_boxed": last_boxed}


def build_math_solution(cfg: Mapping[str, Any], rows: list[dict[str, Any]], steps: Steps, drop_invalid: bool) -> Built:
    """`build_math` on rows whose `fields.answer` column is a worked solution: the gold is extracted by
    `answers.extract` (after_hashes | last_boxed) first; a row it finds nothing in is unusable (by id)."""
    name, fields = cfg["name"], cfg["fields"]
    how = (cfg.get("answers") or {}).get("extract")
    if how not in EXTRACTORS:
        raise DataValidationError(
            f"dataset '{name}': answers.extract={how!r} is not one of {', '.join(EXTRACTORS)} (conf/data/{name}.yaml)"
        )
    check_fields(name, rows, fields)
    ids = row_ids(name, rows, fields.get("id"))
    extracted, problems = [], []
    for index, (row, rid) in enumerate(zip(rows, ids)):
        try:
            gold = EXTRACTORS[how](row.get(fields["answer"]))
        except ValueError as err:
            problems.append(problem(rid, index, f"answer field {fields['answer']!r}: {err}"))
            gold = None
        extracted.append({**row, fields["answer"]: gold})
    steps(f"gold extracted from the solution ({how})", len(rows) - len(problems))
    settle(name, problems, drop_invalid)  # fails here, listing them, unless drop_invalid
    built = build_math(cfg, extracted, steps, drop_invalid)
    reasons = {p["index"]: p for p in problems}  # the extraction's reason, not "no gold answer"
    dropped = [reasons.get(p["index"], p) for p in built.dropped]
    return Built(splits=built.splits, dropped=dropped, notes={**built.notes, "gold_extracted": how})


# ---------------------------------------------------------------------------------------------------------
# Multiple choice: GPQA-Diamond, MMLU, LSAT-AR
# ---------------------------------------------------------------------------------------------------------


def row_rng(seed: int, key: str) -> random.Random:
    """A generator that depends only on (seed, key): a row keeps its option order whatever else changes."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8", "surrogatepass")).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def strip_label(option: str) -> str:
    """An option without the letter label its source writes before it ("(A)Mary" -> "Mary")."""
    return _OPTION_LABEL.sub("", option, count=1).strip()


def gold_index(value: Any, n_options: int) -> int:
    """The correct option's position from an index (0-based int, or a one-element list of it, as AGIEval's
    `gold`) or a letter; ValueError when it is not one of the options."""
    value = _plain(value)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, str) and len(value.strip()) == 1 and value.strip().upper() in LETTERS:
        index = LETTERS.index(value.strip().upper())
    elif isinstance(value, int) and not isinstance(value, bool):
        index = value
    else:
        raise ValueError(f"gold {value!r} is neither an option index nor a letter")
    if not 0 <= index < n_options:
        raise ValueError(f"gold {value!r} is not one of the {n_options} options")
    return index


def choice_prompt_text(question: str, options: Sequence[str]) -> str:
    """The question followed by its lettered options, one a line."""
    listing = "\n".join(f"({LETTERS[i]}) {opt}" for i, opt in enumerate(options))
    return f"{question.strip()}\n\n{listing}"


def letters_phrase(n: int) -> str:
    """'A, B, C or D' for n = 4."""
    letters = list(LETTERS[:n])
    return letters[0] if n == 1 else ", ".join(letters[:-1]) + " or " + letters[-1]


def _question_text(row: Mapping[str, Any], fields: Mapping[str, Any], opts: Mapping[str, Any]) -> str | None:
    question = _text(row.get(fields["question"]))
    if question is None:
        return None
    cut = opts.get("question_cut")  # AGIEval's query repeats the options after "Answer Choices:"
    if cut and cut in question:
        question = question[: question.rindex(cut)]
    prefix = opts.get("question_prefix")  # AGIEval's query starts with "Q: "
    if prefix and question.startswith(prefix):
        question = question[len(prefix) :]
    return _text(question)


def _options(row: Mapping[str, Any], fields: Mapping[str, Any]) -> tuple[list[str], int]:
    """The options of a row as text and the correct one's position, from a list column and a gold column, or
    from a correct-answer column and incorrect-answer columns (the correct one first)."""
    if fields.get("choices"):
        raw = _plain(row.get(fields["choices"]))
        if not isinstance(raw, list) or len(raw) < 2:
            raise ValueError(f"choices field {fields['choices']!r} is not a list of at least two options")
        options = [strip_label(str(o)) if o is not None else "" for o in raw]
        correct = gold_index(row.get(fields["answer"]), len(options))
    else:
        options = [_text(row.get(fields["correct"])) or ""]
        options += [_text(row.get(col)) or "" for col in fields["incorrect"]]
        correct = 0
    empty = [LETTERS[i] for i, o in enumerate(options) if not o.strip()]
    if empty:
        raise ValueError(f"option(s) {', '.join(empty)} empty")
    if len(options) > len(LETTERS):
        raise ValueError(f"{len(options)} options: more than there are letters")
    return [o.strip() for o in options], correct


def build_choice(cfg: Mapping[str, Any], rows: list[dict[str, Any]], steps: Steps, drop_invalid: bool) -> Built:
    """Multiple choice (see the module docstring). Prompt: question, the lettered options, then `prompt_suffix`
    with "{letters}" replaced by the row's letters ("A, B, C or D"); a structured `prompt_style` wraps the
    question and options instead. Ground truth: [the correct letter]. extra_info keeps the options in prompt order
    and, where they were shuffled, the source position of each."""
    name, split, fields = cfg["name"], cfg["split"], cfg["fields"]
    opts = cfg.get("choices") or {}
    shuffle, seed = bool(opts.get("shuffle")), int(opts.get("seed") or 0)
    if not fields.get("choices") and not (fields.get("correct") and fields.get("incorrect")):
        raise DataValidationError(
            f"dataset '{name}': set fields.choices (a list column, with fields.answer) or fields.correct and "
            f"fields.incorrect (conf/data/{name}.yaml)"
        )
    mapping = {k: v for k, v in fields.items() if k != "incorrect"}
    incorrect = {f"incorrect_{i}": col for i, col in enumerate(fields.get("incorrect") or [])}
    mapping["extra"] = {**(fields.get("extra") or {}), **incorrect}
    check_fields(name, rows, mapping)
    ids = row_ids(name, rows, fields.get("id"))
    style = cfg.get("prompt_style") or "plain"
    suffix = cfg.get("prompt_suffix") or ""
    wrap = None if style == "plain" else math_prompt(cfg)
    problems, records = [], []
    for index, (row, rid) in enumerate(zip(rows, ids)):
        try:
            if rid is None:
                raise ValueError(f"no id in field {fields['id']!r}")
            question = _question_text(row, fields, opts)
            if question is None:
                raise ValueError(f"no question in field {fields['question']!r}")
            options, correct = _options(row, fields)
        except ValueError as err:
            problems.append(problem(rid, index, str(err)))
            continue
        order = list(range(len(options)))
        if shuffle:
            row_rng(seed, rid).shuffle(order)
        shown = [options[i] for i in order]
        letter = LETTERS[order.index(correct)]
        body = choice_prompt_text(question, shown)
        content = body + suffix.replace("{letters}", letters_phrase(len(shown))) if wrap is None else wrap(body, rid)
        info = {"index": index, "id": rid, "options": shown, **extras(row, fields)}
        if shuffle:
            info["source_positions"] = order
        rec = record(name, split, "choice", [{"role": "user", "content": content}], [letter], info)
        rec["reward_model"]["style"] = "rule"
        records.append(rec)
    steps("id, question, options and gold present", len(records))
    settle(name, problems, drop_invalid)
    letters = {}
    for rec in records:
        g = rec["reward_model"]["ground_truth"][0]
        letters[g] = letters.get(g, 0) + 1
    notes = {"gold_letters": dict(sorted(letters.items())), "options_shuffled": shuffle}
    if shuffle:
        notes["shuffle_seed"] = seed
    return Built(splits={split: records}, dropped=problems, notes=notes)


# ---------------------------------------------------------------------------------------------------------
# Reading comprehension: DROP
# ---------------------------------------------------------------------------------------------------------


def span_answers(value: Any, key: str | None) -> list[str]:
    """Every distinct accepted answer of a row (a list of strings, or a dict holding that list under `key`,
    as ucinlp/drop's `answers_spans.spans`), each followed by its form without a leading article."""
    value = _plain(value)
    if key is not None:
        value = _plain(value.get(key)) if isinstance(value, Mapping) else None
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        text = " ".join(str(item).split()) if item is not None else ""
        for form in (text, _ARTICLE.sub("", text)):
            if form and form not in out:
                out.append(form)
    if not out:
        raise ValueError("no accepted answer")
    return out


def build_reading(cfg: Mapping[str, Any], rows: list[dict[str, Any]], steps: Steps, drop_invalid: bool) -> Built:
    """Reading comprehension (DROP): prompt = "Passage: ...\\n\\nQuestion: ..." + `prompt_suffix` (or the
    structured prompt around it); ground truth = `span_answers` of `fields.answer` (`answers.key` names the
    list inside a dict column). The answers are kept as text, not validated by math-verify (most are words)."""
    name, split, fields = cfg["name"], cfg["split"], cfg["fields"]
    key = (cfg.get("answers") or {}).get("key")
    check_fields(name, rows, fields)
    ids = row_ids(name, rows, fields.get("id"))
    prompt_of = math_prompt(cfg)
    problems, records = [], []
    for index, (row, rid) in enumerate(zip(rows, ids)):
        passage, question = _text(row.get(fields["passage"])), _text(row.get(fields["question"]))
        try:
            if rid is None:
                raise ValueError(f"no id in field {fields['id']!r}")
            if passage is None or question is None:
                raise ValueError(f"no passage or question in fields {fields['passage']!r}, {fields['question']!r}")
            answers = span_answers(row.get(fields["answer"]), key)
        except ValueError as err:
            problems.append(problem(rid, index, f"{err}"))
            continue
        body = f"Passage: {passage.strip()}\n\nQuestion: {question.strip()}"
        rec = record(name, split, "reading", [{"role": "user", "content": prompt_of(body, rid)}], answers,
                     {"index": index, "id": rid, **extras(row, fields)})  # fmt: skip
        rec["reward_model"]["style"] = "rule"
        records.append(rec)
    steps("id, passage, question and an answer present", len(records))
    settle(name, problems, drop_invalid)
    return Built(splits={split: records}, dropped=problems)


BUILDERS.update({"math_solution": build_math_solution, "choice": build_choice, "reading": build_reading})
