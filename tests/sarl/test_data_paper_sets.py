"""The seed papers' own data sets: DeepScaleR-Preview (plain and structured prompt), S1K, KodCode-Light-RL-10K,
built from small local copies in their source layouts (no hub at test time), with the expected counts."""

import pytest
from test_data_prepare import build, parquet_rows, trl_rows

from sarl.data.build import DataValidationError
from sarl.data.prepare import compose_prepare_config
from sarl.formats.tags import TAGS

SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."


def test_expected_counts_are_the_papers():
    counts = {
        "deepscaler": 40315,  # GRP App. E.1 "40.3k"; Structured Reasoning Sec. 5.1 "40K"
        "deepscaler_structured": 40315,
        "s1k": 1000,  # Structured Reasoning Sec. 5.1: "1,000 high-quality problems"
        "kodcode_light_rl_10k": 10000,  # GRP App. E.2
    }
    for name, expected in counts.items():
        assert compose_prepare_config([f"dataset={name}"]).expected_count == expected


def test_deepscaler_rows_have_the_plain_prompt_and_parsed_golds(tmp_path):
    manifest = build(tmp_path, "deepscaler", "expected_count=3")
    rows = parquet_rows(tmp_path, "deepscaler", "train")
    assert [r["extra_info"]["id"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["prompt"][0]["content"] == "What is the sum of the positive divisors of 12?" + SUFFIX
    assert rows[1]["reward_model"] == {"style": "rule", "ground_truth": ["\\frac{5}{6}"]}
    assert manifest["counts"][-1]["rows"] == 3
    with pytest.raises(DataValidationError, match="3 rows in split 'train' after every step, expected 40315"):
        build(tmp_path, "deepscaler")


def test_deepscaler_structured_has_the_tagged_prompt(tmp_path):
    build(tmp_path, "deepscaler_structured", "expected_count=3")
    prompt = parquet_rows(tmp_path, "deepscaler_structured", "train")[0]["prompt"][0]["content"]
    assert prompt.startswith("Please use the following tags at the beginning of each sentence in your reasoning:")
    assert "What is the sum of the positive divisors of 12?" in prompt and sum(f"<{t}>" in prompt for t in TAGS) >= 5


def test_s1k_and_kodcode_keep_their_references_verbatim(tmp_path):
    build(tmp_path, "s1k", "expected_count=2")
    rows = parquet_rows(tmp_path, "s1k", "train")
    assert rows[1]["ability"] == "stem" and rows[1]["extra_info"]["cot_type"] == "science"
    assert rows[1]["reward_model"] == {"style": "reference", "ground_truth": "F = ma = 2 kg * 3 m/s^2 = 6 N."}
    build(tmp_path, "kodcode_light_rl_10k", "expected_count=2")
    rows = trl_rows(tmp_path, "kodcode_light_rl_10k", "train")
    assert rows[0]["extra_info"]["id"] == "Test_1" and rows[0]["ground_truth"].startswith("from solution import add")
    assert parquet_rows(tmp_path, "kodcode_light_rl_10k", "train")[0]["reward_model"]["style"] == "unit_tests"


def test_a_problem_without_a_reference_is_reported(tmp_path):
    bad = tmp_path / "bad.jsonl"
    row = '{"question_id": "%s", "question": "q", "test": "%s", "test_info": [], "subset": "s"}\n'
    bad.write_text(row % ("A", "") + row % ("B", "t"))
    with pytest.raises(DataValidationError, match="A: no reference in field 'test'"):
        build(tmp_path, "kodcode_light_rl_10k", "expected_count=1", local_file=bad)
    build(tmp_path, "kodcode_light_rl_10k", "expected_count=1", "drop_invalid=true", local_file=bad)
