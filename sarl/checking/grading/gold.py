"""Gold answers at data preparation: a gold answer that does not parse is an error there, not a silent 0."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from sarl.checking.grading.grader import Grader, default_grader


def gold_answers(gold: Any) -> list[str]:
    """A gold answer or list of accepted answers as a list of non-empty strings; ValueError otherwise."""
    if hasattr(gold, "tolist") and not isinstance(gold, (str, bytes)):
        gold = gold.tolist()  # a NumPy array of accepted answers, as parquet columns are read back
    items = list(gold) if isinstance(gold, (list, tuple)) else [gold]
    if not items:
        raise ValueError("gold answer is an empty list: give at least one accepted answer")
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ValueError(f"gold answer {item!r} is a {type(item).__name__}; expected a str or a number")
        text = str(item).strip()
        if not text:
            raise ValueError(f"gold answer {gold!r} contains an empty answer")
        out.append(text)
    return out


def validate_gold(gold: Any, *, grader: Grader | None = None) -> list[str]:
    """The accepted answers of `gold` as strings; ValueError naming the answer if one does not parse."""
    answers = gold_answers(gold)
    grader = grader or default_grader()
    for answer in answers:
        verdict = grader.parses(answer)
        if not verdict.ok:
            why = "math-verify extracts nothing from it"
            if verdict.budget_exceeded:
                why = "its grading cost is over the budget, docs/grading.md"
            elif verdict.timed_out:
                why = "math-verify timed out on it"
            elif verdict.rejected:
                why = "it is beyond the grading size limits, docs/grading.md"
            raise ValueError(f"gold answer {answer!r} does not parse ({why}); fix or drop it when preparing the data")
    return answers


def validate_gold_rows(
    rows: Iterable[Mapping[str, Any]], id_key: str = "id", answer_key: str = "answer", *, grader: Grader | None = None
) -> list[list[str]]:
    """`validate_gold` for every row; one ValueError listing ALL offending row ids and reasons."""
    validated: list[list[str]] = []
    problems: list[str] = []
    n = 0
    for n, row in enumerate(rows, start=1):
        row_id = row.get(id_key, f"<row {n - 1}>")
        try:
            validated.append(validate_gold(row[answer_key], grader=grader))
        except KeyError:
            problems.append(f"{row_id}: no {answer_key!r} field")
        except ValueError as err:
            problems.append(f"{row_id}: {err}")
    if problems:
        listing = "\n  ".join(problems)
        raise ValueError(f"{len(problems)} of {n} rows have unusable gold answers ({id_key}: reason):\n  {listing}")
    return validated
