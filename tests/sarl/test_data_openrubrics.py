"""OpenRubrics-v2 preparation (SARL App. B.1): instruction-only prompts, the two-response length filter with a
configurable tokenizer, de-duplication by a hash of the normalised instruction, the validation sample and the
DPO pairs in TRL's conversational format."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sarl.data.build import instruction_key, token_counter
from sarl.data.prepare import compose_prepare_config, prepare
from sarl.data.sources import DataSourceError
from sarl.formats.pairs import conversational_pairs

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "openrubrics_v2.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def build(tmp_path, *overrides):
    cfg = compose_prepare_config(
        ["dataset=openrubrics_v2", f"paths.root={tmp_path}", f"source.local_file={FIXTURE}", *overrides]
    )
    return prepare(cfg)


def read(tmp_path, name):
    path = tmp_path / "data" / "openrubrics_v2" / name
    if name.endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text().splitlines()]


WHITESPACE = ["filters.tokenizer=whitespace", "filters.min_response_tokens=100", "val.size=2"]


def test_filters_counts_prompts_and_outputs(tmp_path):
    manifest = build(tmp_path, *WHITESPACE, "expected_count=4")
    # rows: 0 sky (kept), 1 letter (kept), 2 sky again in other case/spacing (duplicate), 3 one-word answer
    # (short), 4 both short, 5 gym (kept; a tie), 6 Fibonacci (kept)
    assert [(s["step"], s["rows"]) for s in manifest["counts"]] == [
        ("loaded", 7),
        ("id and instruction present", 7),
        ("both responses >= 100 tokens (whitespace)", 5),
        ("duplicate instructions dropped (hash of normalised text)", 4),
    ]
    train = read(tmp_path, "train.parquet")
    assert [r["extra_info"]["index"] for r in train] == [0, 1, 5, 6]
    first = train[0]
    # the instruction alone is the prompt: no instruction appended
    assert first["prompt"] == [{"role": "user", "content": ROWS[0]["instruction"]}]
    assert first["ability"] == "open" and first["data_source"] == "openrubrics_v2"
    assert first["reward_model"] == {"style": "none", "ground_truth": ""}
    assert first["extra_info"] == {
        "index": 0,
        "id": "0",
        "split": "train",
        "source": "ultrafeedback",
        "user_prompt": ROWS[0]["instruction"],
    }

    trl = read(tmp_path, "train.trl.jsonl")
    assert [t["prompt"] for t in trl] == [r["prompt"] for r in train]
    assert all(t["ground_truth"] is None for t in trl)

    val = read(tmp_path, "val.parquet")
    assert len(val) == 2 and {r["extra_info"]["index"] for r in val} <= {0, 1, 5, 6}
    assert all(r["extra_info"]["split"] == "val" for r in val)
    assert manifest["val"] == {"rows": 2, "seed": 0, "drawn_from": "train", "held_out": False}
    assert manifest["token_filter"] == {"tokenizer": "whitespace", "min_response_tokens": 100}


def test_dpo_pairs_come_from_the_kept_rows_in_trls_conversational_format(tmp_path):
    manifest = build(tmp_path, *WHITESPACE, "expected_count=4")
    dpo = read(tmp_path, "dpo.jsonl")
    assert len(dpo) == 3  # rows 0 (A), 1 (B), 6 (A); row 5 is a tie
    assert manifest["dpo"] == {"pairs": 3, "from_rows": 4, "skipped": {"tie": 1}}
    assert manifest["outputs"]["dpo"]["rows"] == 3 and manifest["outputs"]["dpo"]["jsonl"] == "openrubrics_v2/dpo.jsonl"
    letter = dpo[1]
    assert letter == {
        "prompt": [{"role": "user", "content": ROWS[1]["instruction"]}],
        "chosen": [{"role": "assistant", "content": ROWS[1]["response_b"]}],  # winner "B"
        "rejected": [{"role": "assistant", "content": ROWS[1]["response_a"]}],
    }
    assert dpo[0]["chosen"][0]["content"] == ROWS[0]["response_a"]  # winner "A"


def test_the_papers_count_is_checked(tmp_path):
    from sarl.data.build import DataValidationError

    with pytest.raises(DataValidationError, match="expected 3294"):
        build(tmp_path, *WHITESPACE)


@pytest.mark.slow
def test_length_filter_boundary_with_a_real_bpe_tokenizer(tmp_path, byte_tokenizer):
    """The filter keeps responses of exactly the threshold and drops one token shorter (App. B.1)."""
    tok_dir = tmp_path / "tok"
    byte_tokenizer.save_pretrained(tok_dir)
    count = token_counter(str(tok_dir))
    texts = [ROWS[6]["response_a"], ROWS[6]["response_b"]]
    assert count(texts) == [len(byte_tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    shortest_fib = min(count(texts))
    lengths = {i: min(count([r["response_a"], r["response_b"]])) for i, r in enumerate(ROWS)}
    assert sorted(lengths.values()).count(shortest_fib) == 1  # row 6 decides alone at this threshold
    kept_at = {}
    for threshold in (shortest_fib, shortest_fib + 1):
        root = tmp_path / str(threshold)
        build(root, f"filters.tokenizer={tok_dir}", f"filters.min_response_tokens={threshold}", "expected_count=null")
        kept_at[threshold] = {r["extra_info"]["index"] for r in read(root, "train.parquet")}
    expected = {i for i, n in lengths.items() if n >= shortest_fib and i != 2}  # row 2 is a duplicate of row 0
    assert kept_at[shortest_fib] == expected and 6 in expected
    assert kept_at[shortest_fib + 1] == expected - {6}


def test_a_missing_response_counts_as_zero_tokens(tmp_path):
    rows = [dict(ROWS[0]), dict(ROWS[1])]
    rows[1]["response_b"] = None
    src = tmp_path / "or.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = compose_prepare_config(
        [
            "dataset=openrubrics_v2",
            f"paths.root={tmp_path}",
            f"source.local_file={src}",
            *WHITESPACE,
            "expected_count=1",
        ]
    )
    manifest = prepare(cfg)
    assert manifest["counts"][2]["rows"] == 1


def test_a_row_without_instruction_is_reported(tmp_path):
    from sarl.data.build import DataValidationError

    rows = [dict(r) for r in ROWS]
    rows[3]["instruction"] = " "
    src = tmp_path / "or.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    over = [f"source.local_file={src}", *WHITESPACE, "expected_count=4"]
    with pytest.raises(DataValidationError, match="3: no instruction in field 'instruction'"):
        prepare(compose_prepare_config(["dataset=openrubrics_v2", f"paths.root={tmp_path}", *over]))
    manifest = prepare(
        compose_prepare_config(["dataset=openrubrics_v2", f"paths.root={tmp_path}", *over, "drop_invalid=true"])
    )
    assert [d["id"] for d in manifest["dropped_rows"]] == ["3"]


@pytest.mark.slow  # imports transformers
def test_an_unavailable_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(DataSourceError, match=r"tokenizer '/nonexistent/tok' \(filters.tokenizer\) cannot be loaded"):
        build(tmp_path, "filters.tokenizer=/nonexistent/tok")


@pytest.mark.parametrize(
    "a,b,same",
    [
        ("Explain X.", "explain x.", True),
        ("Explain  X.\n", "  Explain X.", True),
        ("Ｅｘｐｌａｉｎ X.", "Explain X.", True),  # full-width letters (NFKC)
        ("Explain X.", "Explain Y.", False),
        ("Explain X.", "Explain X!", False),
    ],
)
def test_instruction_key(a, b, same):
    assert (instruction_key(a) == instruction_key(b)) is same
    assert len(instruction_key(a)) == 64


def test_conversational_pairs():
    pairs = [{"prompt": "p", "chosen": "c", "rejected": "r"}]
    assert conversational_pairs(pairs) == [
        {
            "prompt": [{"role": "user", "content": "p"}],
            "chosen": [{"role": "assistant", "content": "c"}],
            "rejected": [{"role": "assistant", "content": "r"}],
        }
    ]


def test_trl_reads_the_dpo_file(tmp_path):
    import datasets

    build(tmp_path, *WHITESPACE, "expected_count=4")
    ds = datasets.load_dataset("json", data_files=str(tmp_path / "data/openrubrics_v2/dpo.jsonl"), split="train")
    assert ds.column_names == ["prompt", "chosen", "rejected"] and len(ds) == 3
    from trl.data_utils import is_conversational

    assert is_conversational(ds[0])
