"""The other papers' benchmarks and training sets (EVOL-RL, GRP, Structured Reasoning): each built by
`python -m sarl.data.prepare` from a few rows in its real source's layout (tests/fixtures/data), with the expected
count of the real set checked; the multiple-choice, reading and extracted-gold builders; GRP's stratified RL set."""

import json
import subprocess
import sys

import pytest
from test_data_prepare import FIXTURES, REPO, SUFFIX, build, by_id, parquet_rows, trl_rows

from sarl.data.benchmark_sets import after_hashes, gold_index, last_boxed, letters_phrase, span_answers, strip_label
from sarl.data.build import DataValidationError
from sarl.data.prepare import compose_prepare_config
from sarl.data.sources import DataSourceError
from sarl.data.stratify import GRP_BINS, allocate, parse_bins, read_success_rates, select

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."  # EVOL-RL App. C.3
CHOICE = "\n\nLet's think step by step and output the letter of the correct option ({}) within \\boxed{{}}."
RATES = FIXTURES / "grp_math_rates.jsonl"


def test_expected_counts_are_the_real_sets(tmp_path):
    counts = {
        "aime24": 30,
        "aime24_train": 30,
        "gsm8k": 1319,  # the GSM8K test split
        "olympiadbench": 675,  # OE_TO_maths_en_COMP
        "gpqa_diamond": 198,
        "mmlu": 1531,  # MMLU-ALL-VALID: all subjects, validation split
        "lsat_ar": 230,  # AGIEval lsat-ar
        "drop": 9535,  # ucinlp/drop validation
        "math_train": 7500,  # the MATH training split
        "math500_train": 500,
        "grp_math_pool": 40315,  # all of DeepScaleR
        "grp_math_rl_5k": 5000,  # GRP App. E.2
    }
    for name, expected in counts.items():
        cfg = compose_prepare_config([f"dataset={name}"])
        assert cfg.expected_count == expected, name
        assert cfg.role == ("train" if name.endswith(("_train", "_5k")) else "eval"), name
    with pytest.raises(DataValidationError, match="3 rows in split 'test' after every step, expected 1531"):
        build(tmp_path, "mmlu")  # the real set's size is checked (nothing is written on failure)


# ---------------------------------------------------------------------------------------------------------
# Math sets: AIME24, GSM8K, OlympiadBench, and EVOL-RL's training sets
# ---------------------------------------------------------------------------------------------------------


def test_aime24_golds_drop_leading_zeros_and_keep_the_url(tmp_path):
    build(tmp_path, "aime24", "expected_count=3")
    rows = parquet_rows(tmp_path, "aime24", "test")
    assert [r["extra_info"]["id"] for r in rows] == ["60", "61", "62"]
    assert [r["reward_model"]["ground_truth"] for r in rows] == [["204"], ["25"], ["809"]]  # "025" in the source
    assert rows[0]["prompt"][0]["content"].endswith(SUFFIX) and rows[0]["extra_info"]["url"].endswith("Problem_1")


def test_gsm8k_gold_is_the_number_after_the_hashes(tmp_path):
    build(tmp_path, "gsm8k", "expected_count=3")
    rows = parquet_rows(tmp_path, "gsm8k", "test")
    assert [r["reward_model"]["ground_truth"] for r in rows] == [["18"], ["3"], ["70000"]]  # "#### 70,000"
    assert rows[0]["prompt"][0]["content"].startswith("Janet’s ducks") and rows[0]["extra_info"]["id"] == "0"
    assert after_hashes("a\n#### 1,234,567") == "1234567" and after_hashes("#### 3.5") == "3.5"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no final answer"}) + "\n")
    with pytest.raises(DataValidationError, match=r'0: answer field \'answer\': no "####" final answer'):
        build(tmp_path / "b", "gsm8k", "expected_count=1", local_file=bad)


def test_olympiadbench_reads_its_answer_list(tmp_path):
    build(tmp_path, "olympiadbench", "expected_count=3")
    rows = by_id(parquet_rows(tmp_path, "olympiadbench", "test"))
    assert rows["1607"]["reward_model"]["ground_truth"] == ["\\frac{1}{2 n+2}"]  # "$...$" dropped
    assert rows["1612"]["reward_model"]["ground_truth"] == ["(1,8,19), (2,7,13), (4,5,7)"]
    assert rows["1606"]["extra_info"]["subfield"] == "Combinatorics"


def test_math_train_gold_is_the_last_box_and_the_prompt_evol_rls(tmp_path):
    manifest = build(tmp_path, "math_train", "expected_count=3")
    rows = parquet_rows(tmp_path, "math_train", "train")
    assert [r["reward_model"]["ground_truth"] for r in rows] == [["0"], ["\\frac{1}{4}"], ["5\\sqrt{2}"]]
    assert list(rows[2]["prompt"]) == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Simplify $\\sqrt{50}$."},
    ]
    assert rows[1]["extra_info"]["type"] == "Counting & Probability" and manifest["gold_extracted"] == "last_boxed"
    assert last_boxed("so $\\boxed{1}$, no: $\\boxed{\\frac{a}{b}}$.") == "\\frac{a}{b}"
    with pytest.raises(ValueError, match="no \\\\boxed"):
        last_boxed("no box")


@pytest.mark.parametrize(
    "name,fixture_first_id", [("math500_train", "test/precalculus/807.json"), ("aime24_train", "60")]
)
def test_evol_rl_test_sets_as_training_sets(tmp_path, name, fixture_first_id):
    build(tmp_path, name, "expected_count=3")
    first = trl_rows(tmp_path, name, "train")[0]
    assert first["extra_info"]["id"] == fixture_first_id and first["extra_info"]["split"] == "train"
    assert first["prompt"][0] == {"role": "system", "content": SYSTEM} and not first["prompt"][1]["content"].endswith(
        SUFFIX
    )
    cfg = compose_prepare_config([f"dataset={name}", f"paths.root={tmp_path}"])
    assert cfg.train_files == str(tmp_path / "data" / name / "train.parquet") and cfg.max_response_length == 12288
    # AIME24 is written 16 times over, as EVOL-RL's released training file (decisions §2.4), copy k numbered k
    rows = trl_rows(tmp_path, name, "train")
    repeat = 16 if name == "aime24_train" else 1
    assert cfg.get("repeat", 1) == repeat and len(rows) == 3 * repeat
    assert [r["extra_info"]["id"] for r in rows] == [r["extra_info"]["id"] for r in rows[:3]] * repeat
    assert [r["extra_info"].get("copy", 0) for r in rows] == [k for k in range(repeat) for _ in range(3)]
    assert rows[3 * repeat - 1]["prompt"] == rows[2]["prompt"]


def test_a_set_prepared_before_its_repeat_is_named_not_trained_on(tmp_path):
    """The run's data check counts expected_count x repeat: AIME24 prepared once over (an older config) fails it."""
    from omegaconf import OmegaConf

    from sarl.data.checks import check_data

    build(tmp_path, "aime24_train", "expected_count=3")
    train = tmp_path / "data" / "aime24_train" / "train.parquet"
    data = {"name": "aime24_train", "train_files": str(train), "val_files": str(train), "expected_count": 3}
    assert check_data(OmegaConf.create({"data": {**data, "repeat": 16}})).ok
    build(tmp_path, "aime24_train", "expected_count=3", "repeat=1")
    check = check_data(OmegaConf.create({"data": {**data, "repeat": 16}}))
    assert not check.ok and "has 3 rows, conf/data/aime24_train.yaml expects 3 x repeat 16" in check.detail
    assert "python -m sarl.data.prepare dataset=aime24_train" in check.fix
    with pytest.raises(DataValidationError, match="repeat=0 must be an integer >= 1"):
        build(tmp_path, "aime24_train", "expected_count=3", "repeat=0")


# ---------------------------------------------------------------------------------------------------------
# Multiple choice: GPQA-Diamond, MMLU, LSAT-AR
# ---------------------------------------------------------------------------------------------------------


def test_gpqa_options_are_shuffled_per_row_and_the_gold_letter_follows_the_correct_answer(tmp_path):
    build(tmp_path, "gpqa_diamond", "expected_count=3")
    source = {r["Record ID"]: r for r in map(json.loads, (FIXTURES / "gpqa_diamond.jsonl").read_text().splitlines())}
    rows = parquet_rows(tmp_path, "gpqa_diamond", "test")
    letters = []
    for row in rows:
        info, (letter,) = row["extra_info"], row["reward_model"]["ground_truth"]
        src = source[info["id"]]
        assert info["options"][ord(letter) - ord("A")] == src["Correct Answer"]  # the gold letter is the correct one
        assert sorted(info["options"]) == sorted(
            [src["Correct Answer"], src["Incorrect Answer 1"], src["Incorrect Answer 2"], src["Incorrect Answer 3"]]
        )
        assert [info["options"][info["source_positions"].index(i)] for i in range(4)][0] == src["Correct Answer"]
        prompt = row["prompt"][0]["content"]
        assert prompt.startswith(src["Question"] + "\n\n(A) ") and prompt.endswith(CHOICE.format("A, B, C or D"))
        assert row["reward_model"]["style"] == "rule" and info["domain"] and info["subdomain"]
        letters.append(letter)
    assert letters != ["A"] * 3  # the source puts the correct answer first: shuffled, the gold is not always A
    again = tmp_path / "again"
    build(again, "gpqa_diamond", "expected_count=3")
    assert parquet_rows(again, "gpqa_diamond", "test") == rows  # seeded by (seed, Record ID): a rebuild is identical
    reseeded = tmp_path / "reseeded"
    build(reseeded, "gpqa_diamond", "expected_count=3", "choices.seed=1")
    assert [r["extra_info"]["options"] for r in parquet_rows(reseeded, "gpqa_diamond", "test")] != [
        r["extra_info"]["options"] for r in rows
    ]
    unshuffled = tmp_path / "unshuffled"
    build(unshuffled, "gpqa_diamond", "expected_count=3", "choices.shuffle=false")
    assert [r["reward_model"]["ground_truth"] for r in parquet_rows(unshuffled, "gpqa_diamond", "test")] == [["A"]] * 3


def test_mmlu_gold_is_the_letter_of_the_answer_index(tmp_path):
    manifest = build(tmp_path, "mmlu", "expected_count=3")
    rows = parquet_rows(tmp_path, "mmlu", "test")
    assert [r["reward_model"]["ground_truth"] for r in rows] == [["B"], ["B"], ["D"]]
    assert rows[0]["prompt"][0]["content"] == (
        "Find the degree for the given field extension Q(sqrt(2)) over Q.\n\n(A) 0\n(B) 2\n(C) 1\n(D) 3"
        + CHOICE.format("A, B, C or D")
    )
    assert rows[1]["extra_info"]["subject"] == "anatomy" and rows[1]["extra_info"]["options"][1] == "Cranial"
    assert manifest["gold_letters"] == {"B": 2, "D": 1} and manifest["options_shuffled"] is False


def test_lsat_ar_cuts_agievals_answer_tail_and_relabels_the_options(tmp_path):
    build(tmp_path, "lsat_ar", "expected_count=2")
    rows = parquet_rows(tmp_path, "lsat_ar", "test")
    assert [r["reward_model"]["ground_truth"] for r in rows] == [["A"], ["C"]]
    prompt = rows[0]["prompt"][0]["content"]
    assert prompt.startswith("Written for this fixture. Five runners")
    assert "Answer Choices" not in prompt and "Among A through E" not in prompt
    assert "could be the order of finish, from first to last?\n\n(A) F, G, J, H, K\n(B) G, F, J, H, K\n" in prompt
    assert prompt.endswith(CHOICE.format("A, B, C, D or E"))


def test_choice_helpers_and_unusable_rows(tmp_path):
    assert strip_label("(A)Mary") == "Mary" and strip_label("B) x") == "x" and strip_label("plain") == "plain"
    assert gold_index([2], 5) == 2 and gold_index("c", 4) == 2 and gold_index(0, 4) == 0
    with pytest.raises(ValueError, match="not one of the 4 options"):
        gold_index(4, 4)
    assert letters_phrase(2) == "A or B"
    bad = tmp_path / "bad.jsonl"
    rows = [
        {"question": "q1", "subject": "s", "choices": ["a", "b"], "answer": 7},
        {"question": "q2", "subject": "s", "choices": ["a", ""], "answer": 0},
        {"question": "q3", "subject": "s", "choices": ["a", "b"], "answer": 1},
    ]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataValidationError, match=r"(?s)0: gold 7 is not one of the 2 options.*1: option\(s\) B empty"):
        build(tmp_path, "mmlu", "expected_count=1", local_file=bad)
    manifest = build(tmp_path, "mmlu", "expected_count=1", "drop_invalid=true", local_file=bad)
    assert [d["id"] for d in manifest["dropped_rows"]] == ["0", "1"]


# ---------------------------------------------------------------------------------------------------------
# DROP
# ---------------------------------------------------------------------------------------------------------


def test_drop_keeps_every_accepted_answer_and_the_article_free_form(tmp_path):
    build(tmp_path, "drop", "expected_count=3")
    rows = by_id(parquet_rows(tmp_path, "drop", "test"))
    assert rows["q-test-1"]["reward_model"] == {"style": "rule", "ground_truth": ["2"]}  # duplicates merged
    assert rows["q-test-2"]["reward_model"]["ground_truth"] == ["the Bears", "Bears"]
    assert rows["q-test-3"]["reward_model"]["ground_truth"] == ["Spain Great Britain"]  # multi-span: joined
    prompt = rows["q-test-2"]["prompt"][0]["content"]
    assert (
        prompt.startswith("Passage: Written for this fixture.") and "\n\nQuestion: Which team scored first?" in prompt
    )
    assert prompt.endswith(SUFFIX) and rows["q-test-2"]["extra_info"]["section_id"] == "nfl_test_1"
    assert span_answers({"spans": ["An  apple"]}, "spans") == ["An apple", "apple"]
    with pytest.raises(ValueError, match="no accepted answer"):
        span_answers({"spans": []}, "spans")


def test_the_evaluation_reads_and_grades_the_new_sets(tmp_path):
    """eval.run's loader takes every new benchmark as kind math; sarl.checking.grading grades a boxed letter / span."""
    from eval.data import load_benchmark
    from sarl.checking.grading.extract import extract_answer
    from sarl.checking.grading.grader import default_grader

    build(tmp_path, "mmlu", "expected_count=3")
    build(tmp_path, "drop", "expected_count=3")
    mmlu = load_benchmark(tmp_path / "data" / "mmlu" / "test.parquet", "mmlu", "math")
    drop = {p.id: p for p in load_benchmark(tmp_path / "data" / "drop" / "test.parquet", "drop", "math")}
    grader = default_grader()
    assert mmlu[2].gold == ["D"]
    assert grader.check_any(extract_answer("... so the answer is \\boxed{D}."), mmlu[2].gold).ok
    assert grader.check_any(extract_answer("\\boxed{(D)}"), mmlu[2].gold).ok
    assert not grader.check_any(extract_answer("\\boxed{C}"), mmlu[2].gold).ok
    assert grader.check_any("Bears", drop["q-test-2"].gold).ok and grader.check_any("2.0", drop["q-test-1"].gold).ok
    assert not grader.check_any("Lions", drop["q-test-2"].gold).ok


# ---------------------------------------------------------------------------------------------------------
# GRP's stratified RL set (GRP App. E.2)
# ---------------------------------------------------------------------------------------------------------

# grp_math_rates.jsonl: success counts of 4 for problems 0-19 (and one aime25 row, not read)
BY_BIN = {"1/4": ["1", "8", "10", "19"], "2/4": ["2", "7", "11"], "3/4": ["3", "6", "12", "15", "16"]}
BY_BIN["4/4"] = ["4", "5", "13", "14", "17", "18"]  # problems 0 and 9: 0 of 4, dropped


def test_allocation_in_grps_proportions():
    weights = [b["weight"] for b in GRP_BINS]
    assert allocate(5000, weights) == [1000, 1000, 1500, 1500]  # GRP App. E.2: 5,000 at 1:1:1.5:1.5
    assert allocate(10, weights) == [2, 2, 3, 3]
    assert allocate(14, weights) == [3, 3, 4, 4]  # 2.8, 2.8, 4.2, 4.2: the largest remainders
    assert allocate(15, weights) == [3, 3, 5, 4]  # 3, 3, 4.5, 4.5: a tie goes to the earlier bin


def test_worked_selection_of_15_of_20_problems():
    rates = read_success_rates(RATES, "grp_math_pool")
    assert len(rates) == 20 and rates["3"] == 0.75 and "99" not in rates
    ids = [str(i) for i in range(20)]
    sel = select(ids, rates, 15, parse_bins(None), seed=0)
    assert sel.available == {"1/4": 4, "2/4": 3, "3/4": 5, "4/4": 6} and sel.unbinned == 2
    assert sel.wanted == {"1/4": 3, "2/4": 3, "3/4": 5, "4/4": 4}
    assert sel.chosen["2/4"] == BY_BIN["2/4"] and sel.chosen["3/4"] == BY_BIN["3/4"]  # every problem of the bin
    assert sel.chosen["1/4"] == ["1", "8", "10"] and sel.chosen["4/4"] == ["4", "5", "14", "18"]  # seed 0, pinned
    assert all(set(sel.chosen[b]) <= set(BY_BIN[b]) for b in BY_BIN)
    assert select(ids, rates, 15, parse_bins(None), seed=0).chosen == sel.chosen  # deterministic
    assert select(ids, rates, 15, parse_bins(None), seed=1).chosen != sel.chosen
    with pytest.raises(
        ValueError, match=r"^bin 2/4 \(success rate in \(0.25, 0.5\]\) has 3 problems, 4 needed for n=18 "
    ):
        select(ids, rates, 18, parse_bins(None), seed=0)


@pytest.mark.parametrize(
    "text,error",
    [
        (
            '{"id": "1", "success_rate": 0.5}\n{"id": "1", "success_rate": 1}\n',
            "line 2: problem 1 has a success rate already",
        ),
        ('{"id": "1", "success_rate": 1.5}\n', "line 1: needs problem_id with n_correct and n_samples"),
    ],
)
def test_success_rates_file_errors_name_the_line(tmp_path, text, error):
    bad = tmp_path / "r.jsonl"
    bad.write_text(text)
    with pytest.raises(DataSourceError, match=error):
        read_success_rates(bad)


def test_success_rates_of_an_unknown_benchmark():
    with pytest.raises(DataSourceError, match="has no rows for benchmark 'nope'"):
        read_success_rates(RATES, "nope")


def test_grp_math_rl_set_is_built_stratified(tmp_path):
    rates = f"stratify.rates={RATES}"
    manifest = build(tmp_path, "grp_math_rl_5k", rates, "stratify.n=15", "expected_count=15")
    rows = parquet_rows(tmp_path, "grp_math_rl_5k", "train")
    chosen = ["1", "8", "10", *BY_BIN["2/4"], *BY_BIN["3/4"], "4", "5", "14", "18"]
    assert [r["extra_info"]["id"] for r in rows] == sorted(chosen, key=int)  # the pool's order
    first = rows[0]
    assert first["extra_info"]["stratum"] == "1/4" and first["extra_info"]["success_rate"] == 0.25
    assert first["prompt"][0]["content"] == "What is 1 + 1?" + SUFFIX and first["reward_model"]["ground_truth"] == ["2"]
    steps = {s["step"]: s["rows"] for s in manifest["counts"]}
    assert steps["problems with a success rate"] == 20 and steps["in a bin (all-failed dropped)"] == 18
    assert [b["chosen"] for b in manifest["stratify"]["bins"]] == [3, 3, 5, 4]
    with pytest.raises(DataValidationError, match="stratify.rates is not set"):
        build(tmp_path / "x", "grp_math_rl_5k", "expected_count=15")
    with pytest.raises(DataValidationError, match="bin 2/4 .* has 3 problems, 4 needed for n=18"):
        build(tmp_path / "y", "grp_math_rl_5k", rates, "stratify.n=18", "expected_count=18")
    with pytest.raises(DataValidationError, match=r"rl_5k': 1 problems of .* are not in the pool \(e.g. \['99'\]\)"):
        build(tmp_path / "z", "grp_math_rl_5k", rates, "stratify.benchmark=null", "expected_count=15")


def test_stratify_cli_shows_the_bins_and_fails_in_one_line():
    cmd = [sys.executable, "-m", "sarl.data.stratify", str(RATES), "--benchmark", "grp_math_pool"]
    ok = subprocess.run([*cmd, "--n", "15"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "20 problems rated; 2 in no bin" in ok.stdout and "n=15 fits" in ok.stdout
    bad = subprocess.run([*cmd, "--n", "18"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "error: bin 2/4 (success rate in (0.25, 0.5]) has 3 problems, 4 needed for n=18 in proportions 1:1:1.5:1.5; "
        "lower stratify.n or rate more problems"
    ]
