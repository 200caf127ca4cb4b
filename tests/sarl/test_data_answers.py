"""Gold answer normalisation (sarl.data.answers) on worked values."""

import numpy as np
import pytest

from sarl.data.answers import accepted_answers, normalise_answer

AIME_SEVERAL = r"\s+or\s+"
AIME_REMARK = r"\s+\([A-Za-z ]+\)$"


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("080", "80"),  # AIME answer sheets write three digits
        ("016", "16"),
        ("000", "0"),
        ("0", "0"),
        ("-007", "-7"),
        ("+5", "5"),
        ("-0", "0"),
        ("27.0", "27"),  # math-ai/amc23 stores answers as floats
        ("27.000", "27"),
        ("0.49", "0.49"),  # a real decimal stays as written
        ("4.5e33", "4.5e33"),
        ("  \\frac{14}{3} ", "\\frac{14}{3}"),
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("p - q", "p - q"),
        ("$1$ and $2$ and $3$", "$1$ and $2$ and $3$"),  # the outer `$` do not enclose one answer
    ],
)
def test_normalise_answer(raw, expected):
    assert normalise_answer(raw) == expected


@pytest.mark.parametrize("raw", ["", "   ", "$$"])
def test_empty_answers_are_errors(raw):
    with pytest.raises(ValueError, match="empty answer"):
        normalise_answer(raw)


def test_several_accepted_answers_keep_all_of_them():
    # AIME 2022 II Problem 8, as the Kaggle CSV writes it
    raw = "080 or 081 (both were accepted)"
    assert accepted_answers(raw, several=AIME_SEVERAL, remark=AIME_REMARK) == ["80", "81"]
    # without the config it is one (unparseable) answer: the builder's gold check then reports it
    assert accepted_answers(raw) == [raw]


def test_the_remark_is_only_dropped_when_the_answer_has_several_parts():
    assert accepted_answers("(1, 2)", several=AIME_SEVERAL, remark=AIME_REMARK) == ["(1, 2)"]
    assert accepted_answers("5 (approx)", several=AIME_SEVERAL, remark=AIME_REMARK) == ["5 (approx)"]


@pytest.mark.parametrize(
    "value,expected",
    [
        (27.0, ["27"]),
        (0.5, ["0.5"]),
        (70, ["70"]),
        (np.int64(117), ["117"]),
        (np.float64(8.0), ["8"]),
        (["27.0"], ["27"]),  # Qwen2.5-Math's evaluation files: a list of accepted answers
        (["080", "80", "81"], ["80", "81"]),  # duplicates after normalisation collapse
        (np.array(["1", "2"]), ["1", "2"]),
    ],
)
def test_values_of_every_type(value, expected):
    assert accepted_answers(value) == expected


@pytest.mark.parametrize("value", [None, [], True, float("nan"), float("inf"), {"a": 1}, ["1", ""]])
def test_unusable_values_are_errors(value):
    with pytest.raises(ValueError):
        accepted_answers(value)
