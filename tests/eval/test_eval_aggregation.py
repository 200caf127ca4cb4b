"""Aggregation on worked values: avg@k, the answer after the thinking part, and SARL Tables 2, 3 and 8 rebuilt
from their per-benchmark / per-category columns (numbers copied from SARL)."""

import math

import pytest

from eval.results import benchmark_average, mean, relative_change, table_delta_pct, with_delta
from eval.wildbench import (
    CATEGORY_WEIGHTS,
    category_score,
    category_scores,
    task_categories,
    wb_score_macro,
)
from sarl.checking.grading.extract import strip_thinking
from sarl.checking.grading.scores import avg_at_k

# SARL Table 2: AIME25, AMC23, MATH500, Minerva -> Avg (Δ%); Δ% printed to one decimal, None for the base.
TABLE_2 = {
    "Base": ((31.67, 82.81, 90.10, 53.45), 64.51, None),
    "PPO w/ Ground-Truth": ((41.67, 86.56, 92.75, 59.74), 70.18, 8.8),
    "PPO w/ SARL": ((42.92, 85.00, 92.53, 61.08), 70.38, 9.1),
    "GRPO w/ Ground-Truth": ((46.67, 84.38, 93.15, 62.45), 71.66, 11.1),
    "GRPO w/ EMPO": ((44.58, 86.56, 93.23, 61.44), 71.45, 10.8),
    "GRPO w/ TTRL": ((42.91, 86.56, 93.15, 61.86), 71.12, 10.2),
    "GRPO w/ SARL": ((45.83, 87.50, 93.30, 61.99), 72.16, 11.9),
}

# SARL Table 3: Creative, Planning, Math, Info, Code -> WB Score (Δ%).
TABLE_3 = {
    "Base": ((51.01, 36.23, 16.35, 48.71, 14.72), 29.91, None),
    "DPO w/ preference labels": ((51.16, 37.82, 17.06, 48.37, 14.34), 30.34, 1.4),
    "PPO w/ SARL": ((57.05, 45.87, 27.70, 53.47, 30.05), 40.26, 34.6),
    "GRPO w/ EMPO": ((51.01, 36.11, 17.62, 45.69, 12.92), 29.20, -2.4),
    "GRPO w/ SARL": ((55.34, 43.56, 26.83, 51.98, 29.91), 39.01, 30.4),
}

# SARL Table 8: lengths per benchmark -> Avg, Δ vs. Base (tokens).
TABLE_8 = {
    "Base": ((7728.0, 5884.1, 4182.6, 5151.7), 5736.6, 0.0),
    "PPO w/ Ground-Truth": ((7047.7, 4634.7, 3124.9, 4021.7), 4707.3, -1029.3),
    "PPO w/ SARL": ((7296.6, 5069.4, 3451.1, 4485.4), 5075.6, -661.0),
    "GRPO w/ Ground-Truth": ((6477.7, 3956.6, 2559.0, 3143.8), 4034.3, -1702.3),
    "GRPO w/ EMPO": ((6651.5, 4058.6, 2702.4, 3327.9), 4185.1, -1551.5),
    "GRPO w/ TTRL": ((6635.0, 4057.8, 2663.5, 3258.5), 4153.7, -1582.9),
    "GRPO w/ SARL": ((6984.9, 4506.9, 3029.4, 3829.9), 4587.8, -1148.8),
}
BENCHES = ("aime25", "amc23", "math500", "minerva_math")


@pytest.mark.parametrize("row", list(TABLE_2))
def test_table_2_avg_and_delta_from_the_benchmark_columns(row):
    scores, avg, delta = TABLE_2[row]
    ours = benchmark_average(dict(zip(BENCHES, scores)))
    assert ours == pytest.approx(avg, abs=0.005 + 1e-9)
    base = benchmark_average(dict(zip(BENCHES, TABLE_2["Base"][0])))
    if delta is not None:
        assert round(table_delta_pct(ours, base), 1) == delta
        assert with_delta(ours, base) == f"{avg:.2f} ({delta:+.1f}%)"


@pytest.mark.parametrize("row", list(TABLE_3))
def test_table_3_wb_score_and_delta_from_the_category_columns(row):
    cats, wb, delta = TABLE_3[row]
    ours = wb_score_macro(dict(zip(CATEGORY_WEIGHTS, cats)))
    # the five printed categories carry +-0.005 each (weighted mean: +-0.005) and the printed WB Score +-0.005
    assert ours == pytest.approx(wb, abs=0.01 + 1e-9)
    if delta is not None:  # the Δ% column is of the printed WB Score column
        base = TABLE_3["Base"][1]
        assert round(table_delta_pct(wb, base), 1) == delta
        assert with_delta(wb, base) == f"{wb:.2f} ({delta:+.1f}%)"


@pytest.mark.parametrize("row", list(TABLE_8))
def test_table_8_average_length_and_delta(row):
    lengths, avg, delta = TABLE_8[row]
    ours = mean(lengths)
    assert ours == pytest.approx(avg, abs=0.05 + 1e-9)
    assert round(ours - mean(TABLE_8["Base"][0]), 1) == pytest.approx(delta, abs=0.11)


def test_wb_score_weights_are_the_leaderboards():
    # 0.5, 1.25, 1.0, 0.75, 1.25 over 4.75 (decisions §3): one category at 100, the others 0, gives weight/4.75*100
    for category, weight in CATEGORY_WEIGHTS.items():
        scores = {c: (100.0 if c == category else 0.0) for c in CATEGORY_WEIGHTS}
        assert wb_score_macro(scores) == pytest.approx(100 * weight / 4.75)
    assert sum(CATEGORY_WEIGHTS.values()) == 4.75


def test_wb_score_needs_the_five_known_categories():
    scores = dict(zip(CATEGORY_WEIGHTS, TABLE_3["Base"][0]))
    with pytest.raises(ValueError, match="missing: Coding & Debugging"):
        wb_score_macro({c: s for c, s in scores.items() if c != "Coding & Debugging"})
    with pytest.raises(ValueError, match="unknown WildBench categories"):
        wb_score_macro({**scores, "Poetry": 1.0})


def test_category_score_maps_1_to_10_onto_minus_80_to_100():
    assert category_score([1.0]) == -80.0
    assert category_score([10.0]) == 100.0
    assert category_score([5.0, 5.0]) == 0.0
    assert category_score([7.0, 8.0]) == pytest.approx(50.0)  # (7.5 - 5) * 2 * 10
    with pytest.raises(ValueError):
        category_score([])


def test_tags_merge_into_five_categories_once_each():
    assert task_categories("Creative Writing", ["Editing", "Brainstorming"]) == ["Creative Tasks"]
    assert task_categories("Math", ["Data Analysis", "Reasoning"]) == ["Math & Data Analysis", "Planning & Reasoning"]
    assert task_categories("Others", []) == ["Creative Tasks"]
    assert task_categories("Advice seeking", None) == ["Information/Advice seeking"]
    with pytest.raises(ValueError, match="'Poetry' is not known"):
        task_categories("Poetry", [])


def test_category_scores_count_a_task_in_each_of_its_categories():
    categories = {
        "t1": ["Creative Tasks"],
        "t2": ["Math & Data Analysis", "Planning & Reasoning"],
        "t3": ["Planning & Reasoning"],
    }
    out = category_scores({"t1": 8.0, "t2": 9.0, "t3": 7.0}, categories)
    assert out == {
        "Creative Tasks": pytest.approx(60.0),
        "Planning & Reasoning": pytest.approx(60.0),  # mean(9, 7) = 8
        "Math & Data Analysis": pytest.approx(80.0),
    }


def test_avg_at_k_worked_values():
    # per problem: 1/2, 1, 0 -> mean 0.5 -> 50 %
    assert avg_at_k([[True, False], [True, True], [False, False]]) == pytest.approx(50.0)
    # AMC23: 40 problems x 8 samples; 265 of 320 correct -> 82.8125 (SARL Table 2 prints 82.81)
    correct = [[True] * 8] * 33 + [[True] * 1 + [False] * 7] + [[False] * 8] * 6
    assert sum(map(sum, correct)) == 265
    assert avg_at_k(correct) == pytest.approx(82.8125)


def test_avg_at_k_rejects_ragged_or_empty_input():
    with pytest.raises(ValueError, match="no problems"):
        avg_at_k([])
    with pytest.raises(ValueError, match="problem 1 has 1"):
        avg_at_k([[True, False], [True]])
    with pytest.raises(ValueError, match="same k >= 1"):
        avg_at_k([[]])


@pytest.mark.parametrize(
    "text,final",
    [
        ("<think>\nA.\n\nB.\n</think>\n\nThe answer is 4.", "The answer is 4."),
        ("<think>\nA \\boxed{3}.\n</think>\n\n\\boxed{4}", "\\boxed{4}"),
        ("reasoning in the prompt's think block</think>\nfinal", "final"),
        ("<think>\ntruncated while thinking \\boxed{7}", ""),  # no final answer: the box inside thinking is not one
        ("no think tags at all \\boxed{2}", "no think tags at all \\boxed{2}"),
        (None, ""),
    ],
)
def test_strip_thinking_keeps_only_the_final_answer(text, final):
    assert strip_thinking(text) == final


def test_relative_change_and_formatting():
    assert relative_change(110.0, 100.0) == pytest.approx(10.0)
    assert relative_change(29.20, 29.91) == pytest.approx(-2.3738, abs=1e-4)
    assert with_delta(39.01, 29.91) == "39.01 (+30.4%)"
    assert with_delta(39.01, None) == "39.01"
    assert with_delta(None, 1.0) == "-"
    # the printed values: 71.12 vs 64.51 is +10.2% (SARL Table 2, TTRL); the unrounded base 64.5075 gives +10.3%
    assert round(relative_change(71.12, 64.5075), 1) == 10.3
    assert round(table_delta_pct(71.12, 64.5075), 1) == 10.2
    with pytest.raises(ValueError):
        relative_change(1.0, 0.0)
    assert mean([]) is None
    assert math.isclose(mean([1, 2]), 1.5)
