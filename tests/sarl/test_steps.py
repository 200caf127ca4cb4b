"""decisions §1.1 "Steps": think-block extraction, splitting and flags."""

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sarl.structure.steps as steps_module
from sarl.structure.steps import extract_reasoning, parse_steps, sanitize, split_steps


def test_think_block_is_the_reasoning():
    text = "<think>\nA.\n\nB.\n\n\n\nC.\n</think>\n\nFinal \\boxed{1}."
    assert split_steps(text) == ["A.", "B.", "C."]


def test_unclosed_think_is_truncated_generation():
    p = parse_steps("<think>one\n\ntwo")
    assert p.steps == ["one", "two"] and p.truncated and not p.no_think


def test_close_without_open_means_template_opened_it():
    p = parse_steps("one\n\ntwo</think>answer\n\nmore")
    assert p.steps == ["one", "two"] and not p.truncated and not p.no_think


@pytest.mark.parametrize("mode,expected", [("whole", ["a", "b"]), ("empty", [])])
def test_no_think_modes(mode, expected):
    p = parse_steps("a\n\nb", no_think=mode)
    assert p.steps == expected and p.no_think


def test_unknown_no_think_mode_names_the_choices():
    with pytest.raises(ValueError, match="whole, empty"):
        extract_reasoning("x", no_think="all")


def test_regex_delimiter_and_custom_delimiter():
    assert split_steps("<think>a\nb\n\nc</think>", delimiter="\n") == ["a", "b", "c"]
    assert split_steps("<think>Step 1: a Step 2: b</think>", delimiter=r"Step \d+:", regex=True) == ["a", "b"]


def test_max_steps_keeps_the_first_steps_and_records_it():
    p = parse_steps("<think>" + "\n\n".join(f"s{i}" for i in range(10)) + "</think>", max_steps=4)
    assert p.steps == ["s0", "s1", "s2", "s3"] and p.steps_capped and p.n_steps_raw == 10


def test_windows_newlines_split_like_unix():
    assert split_steps("<think>a\r\n\r\nb</think>") == ["a", "b"]


def test_sanitize_control_chars_and_invalid_unicode():
    clean, changed = sanitize("a\x00b\x07c\ud800d\tkeep\nline")
    assert changed and clean == "abc\ufffdd\tkeep\nline"
    clean.encode("utf-8")  # valid UTF-8 now


def test_empty_and_whitespace_responses_have_no_steps():
    assert split_steps("") == []
    assert split_steps("<think>\n\n   \n\n</think>") == []


def test_empty_delimiter_is_an_error():
    with pytest.raises(ValueError, match="delimiter"):
        split_steps("a", delimiter="")


def general_sanitize(text: str) -> tuple[str, bool]:
    """`sanitize` without its fast path."""
    clean = steps_module._SURROGATE.sub("\ufffd", text)
    clean = clean.replace("\r\n", "\n").replace("\r", "\n")
    clean = steps_module._CONTROL.sub("", clean)
    clean = unicodedata.normalize("NFC", clean)
    return clean, clean != text


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0xFF), max_size=60) | st.text(max_size=60))
def test_sanitize_fast_path_gives_what_the_general_path_gives(text):
    """The fast path (newlines, ASCII controls deleted by bytes.translate, NFC if needed) gives the general result."""
    assert sanitize(text) == general_sanitize(text)


def test_the_fast_paths_see_every_control_character_surrogate_and_unnormalised_form():
    for c in [*map(chr, range(0xA0)), "\ud800", "\udfff", "e\u0301"]:
        # ASCII around it, and not; a deleted control that leaves a sequence to compose; carriage returns beside it
        for text in (f"a{c}b", f"\u00e9{c}b", f"e{c}\u0301", f"\r\n{c}\u00e9\r", f"a\r{c}\r\nb"):
            assert sanitize(text) == general_sanitize(text)
    assert sanitize("caf\u00e9 \u2264 1") == ("caf\u00e9 \u2264 1", False)
