"""OpenRubrics-v2 rows -> DPO preference pairs (decisions §2.5 "DPO")."""

import logging

from sarl.formats.pairs import dpo_pairs_from_openrubrics


def row(winner, a="Answer A", b="Answer B", instruction="Write a poem."):
    return {"instruction": instruction, "response_a": a, "response_b": b, "winner": winner, "rubric": "1. x"}


def test_winner_encodings():
    for winner in ["A", "a", " response_a ", "model_a", "[[A]]", "Response_A"]:
        assert dpo_pairs_from_openrubrics([row(winner)]) == [
            {"prompt": "Write a poem.", "chosen": "Answer A", "rejected": "Answer B"}
        ]
    for winner in ["B", "response_b", "model_b", "[[B]]"]:
        assert dpo_pairs_from_openrubrics([row(winner)])[0]["chosen"] == "Answer B"


def test_ties_and_unknown_values_are_skipped_and_counted(caplog):
    rows = [
        row("A"),
        row("tie"),
        row("Tie (bothbad)"),
        row(0),
        row("C"),
        row(None),
        row("B", a=None),
        row("A", instruction="  "),
        row("B", a="same", b="same"),
    ]
    with caplog.at_level(logging.INFO, logger="sarl.formats.pairs"):
        pairs = dpo_pairs_from_openrubrics(iter(rows))
    assert len(pairs) == 1 and isinstance(pairs, list)
    assert pairs.skipped == {"tie": 2, "unknown winner": 3, "missing field": 2, "identical responses": 1}
    assert "unknown winner values" in caplog.text and "'C'" in caplog.text and "'0': 1" in caplog.text
    assert dpo_pairs_from_openrubrics([]).skipped == {}
