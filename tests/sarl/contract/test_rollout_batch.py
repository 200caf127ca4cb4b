"""`RolloutBatch.from_columns`: the one place a back end builds the batch a reward sees, on literal columns."""

import json

import pytest

from sarl.contract.reward import USER_PROMPT_KEY, RolloutBatch


def test_the_rows_user_prompt_is_the_prompt_over_the_back_ends_own():
    """verl's trainer, its reward workers, TRL and sarl.score all give a reward the data row's user message; the back
    end's own prompt (a decoded chat template, a JSONL row's "prompt") only where the row has none."""
    batch = RolloutBatch.from_columns(
        responses=["4", "5", "6"],
        prompts=["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "templated", None],
        extra_info=[{USER_PROMPT_KEY: "What is 2+2?", "index": 0}, {"index": 1}, None],
    )
    assert batch.prompts == ["What is 2+2?", "templated", ""]
    assert batch.extra_info == [{USER_PROMPT_KEY: "What is 2+2?", "index": 0}, {"index": 1}, {}]
    no_prompts = RolloutBatch.from_columns(responses=["a", "b"], extra_info=[{USER_PROMPT_KEY: "Q"}, {}])
    assert no_prompts.prompts == ["Q", ""]  # verl's per-sample calls have no prompt of their own


def test_the_gold_answer_from_verls_reward_model_column_or_a_plain_value():
    from_verl = RolloutBatch.from_columns(
        responses=["a", "b", "c"], reward_models=[{"ground_truth": "4", "style": "rule"}, {"style": "rule"}, None]
    )
    assert from_verl.ground_truths == ["4", None, None]
    code = {"tests": "assert f(1) == 2"}  # a plain gold answer may itself be a dict (code rewards)
    plain = RolloutBatch.from_columns(responses=["a", "b"], ground_truths=[code, ["1", "one"]])
    assert plain.ground_truths == [code, ["1", "one"]]
    assert RolloutBatch.from_columns(responses=["a"]).ground_truths is None
    with pytest.raises(ValueError, match="not both"):
        RolloutBatch.from_columns(responses=["a"], ground_truths=["1"], reward_models=[{"ground_truth": "1"}])


def test_extra_info_is_copied_json_is_read_and_anything_else_refused():
    info = {"index": 3}
    batch = RolloutBatch.from_columns(responses=["a", "b", "c"], extra_info=[info, json.dumps({"index": 4}), ""])
    assert batch.extra_info == [{"index": 3}, {"index": 4}, {}]
    batch.extra_info[0]["index"] = 99
    assert info == {"index": 3}  # a reward that writes into its row's extra_info leaves the back end's alone
    assert RolloutBatch.from_columns(responses=["a"]).extra_info is None
    with pytest.raises(TypeError, match="JSON object"):
        RolloutBatch.from_columns(responses=["a"], extra_info=["[1, 2]"])
    with pytest.raises(TypeError, match="dict or a JSON string"):
        RolloutBatch.from_columns(responses=["a"], extra_info=[7])


def test_group_ids_sources_and_token_ids_are_normalised_and_lengths_checked():
    batch = RolloutBatch.from_columns(
        responses=["a", "b", "c"],
        group_ids=[7, "7", 8],
        data_sources=["math", None, "code"],
        response_token_ids=[(1, 2), [3], []],
    )
    assert batch.group_ids == ["7", "7", "8"] and batch.groups() == {"7": [0, 1], "8": [2]}
    assert batch.data_sources == ["math", "", "code"] and batch.response_token_ids == [[1, 2], [3], []]
    assert RolloutBatch.from_columns(responses=["a", "b"]).group_ids == ["0", "1"]  # one group per row
    with pytest.raises(ValueError, match="group_ids has 1 rows but responses has 2"):
        RolloutBatch.from_columns(responses=["a", "b"], group_ids=["g"])
    with pytest.raises(ValueError, match="prompts has 1 rows"):
        RolloutBatch.from_columns(responses=["a", "b"], prompts=["p"], extra_info=[{}, {}])
