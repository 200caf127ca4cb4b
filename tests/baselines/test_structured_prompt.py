"""Training-time tag randomisation helpers of sarl.formats.tags (Structured Reasoning App. A.4)."""

import pytest


def test_question_of_inverts_the_tagged_prompt_and_refuses_other_text():
    from sarl.formats.tags import question_of, randomized_prompt, structured_prompt

    question = "Find x.\nGiven x + 1 = 2."  # a question with its own ".\n"
    assert question_of(structured_prompt(question)) == question
    assert question_of(randomized_prompt(question, seed=1, key="k")) == question
    with pytest.raises(ValueError, match="not a Structured Reasoning tagged-step prompt"):
        question_of(question + " Let's think step by step.")


def test_redrawn_tags_depend_on_seed_and_key_only():
    from sarl.formats.tags import draw_key, redraw_tags, structured_prompt

    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": structured_prompt("q")}]
    a = redraw_tags(messages, 0, draw_key("r1", 0))
    assert a == redraw_tags(messages, 0, draw_key("r1", 0)) and a[0] == messages[0]
    assert messages[1]["content"] == structured_prompt("q")  # the input is not changed
    draws = {redraw_tags(messages, 0, draw_key("r1", e))[1]["content"] for e in range(8)}
    assert len(draws) > 1  # a new draw per epoch
