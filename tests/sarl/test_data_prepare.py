"""`python -m sarl.data.prepare dataset=NAME` on small fixtures of real public problems (tests/fixtures/data):
the verl parquet and TRL JSONL layouts, every normalisation and check, the manifest, the CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from testkit import structured_prompt_rows

from sarl.data.build import DataValidationError
from sarl.data.prepare import BUILDERS, compose_prepare_config, prepare
from sarl.data.sources import sha256_file
from sarl.runtime.files import CONF_DIR

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
REPO = Path(__file__).resolve().parents[2]
SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."
OTHER_PAPERS_FIXTURES = {
    "aime24": "aime24.jsonl",
    "aime24_train": "aime24.jsonl",
    "gsm8k": "gsm8k.jsonl",
    "olympiadbench": "olympiadbench.jsonl",
    "gpqa_diamond": "gpqa_diamond.jsonl",
    "mmlu": "mmlu.jsonl",
    "lsat_ar": "lsat_ar.jsonl",
    "drop": "drop.jsonl",
    "math_train": "math_train.jsonl",
    "math500_train": "math500.jsonl",
    "grp_math_pool": "deepscaler.jsonl",
    "grp_math_rl_5k": "grp_math_pool.jsonl",
}
CODE_SETS = ("grp_code_rl", "mbpp", "mbpp_plus", "humaneval", "humaneval_plus", "livecodebench_v5")
FIXTURE_FILES = {
    "aime_1983_2024": "aime_1983_2024.csv",
    "aime_1983_2024_structured": "aime_1983_2024.csv",
    "aime25": "aime25.jsonl",
    "aime25_structured": "aime25.jsonl",
    "amc23": "amc23.jsonl",
    "math500": "math500.jsonl",
    "minerva_math": "minerva_math.jsonl",
    "wildbench_v2": "wildbench_v2.json",
    "openrubrics_v2": "openrubrics_v2.jsonl",
    "deepscaler": "deepscaler.jsonl",
    "deepscaler_structured": "deepscaler.jsonl",
    "s1k": "s1k.jsonl",
    "kodcode_light_rl_10k": "kodcode_light_rl_10k.jsonl",
    **OTHER_PAPERS_FIXTURES,  # test_data_benchmarks.py
    **{name: f"{name}.jsonl" for name in CODE_SETS},  # test_data_code_sets.py
}


def build(tmp_path, name, *overrides, local_file=None):
    cfg = compose_prepare_config(
        [
            f"dataset={name}",
            f"paths.root={tmp_path}",
            f"source.local_file={local_file or FIXTURES / FIXTURE_FILES[name]}",
            *overrides,
        ]
    )
    return prepare(cfg)


def parquet_rows(tmp_path, name, split):
    return pq.read_table(tmp_path / "data" / name / f"{split}.parquet").to_pylist()


def trl_rows(tmp_path, name, split):
    lines = (tmp_path / "data" / name / f"{split}.trl.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def by_id(rows):
    return {r["extra_info"]["id"]: r for r in rows}


# ---------------------------------------------------------------------------------------------------------
# AIME 1983-2024 (the math training set)
# ---------------------------------------------------------------------------------------------------------


def test_aime_1983_2024_in_verl_and_trl_layouts(tmp_path):
    manifest = build(tmp_path, "aime_1983_2024", "expected_count=6")
    rows = parquet_rows(tmp_path, "aime_1983_2024", "train")
    ids = ["1983-1", "1983-3", "2000-II-9", "2022-II-8", "2024-II-1", "2024-II-2"]
    assert [r["extra_info"]["id"] for r in rows] == ids
    assert [r["extra_info"]["index"] for r in rows] == list(range(6))  # position in the source
    rows = by_id(rows)
    first = rows["1983-1"]
    assert first["data_source"] == "aime_1983_2024" and first["ability"] == "math"
    assert first["prompt"] == [
        {
            "role": "user",
            "content": "Let $x$ , $y$ and $z$ all exceed $1$ and let $w$ be a positive number such that "
            "$\\log_xw=24$ , $\\log_y w = 40$ and $\\log_{xyz}w=12$ . Find $\\log_zw$ ." + SUFFIX,
        }
    ]
    assert first["reward_model"] == {"style": "rule", "ground_truth": ["60"]}
    assert first["extra_info"] == {
        "index": 0,
        "id": "1983-1",
        "split": "train",
        "year": "1983",
        "problem_number": "1",
        "part": None,  # empty before 2000 (one AIME a year)
        "user_prompt": first["prompt"][0]["content"],  # what verl's per-sample reward function gets as the prompt
    }
    # normalisation: leading zeros, zero itself, several accepted answers kept for grading
    assert rows["1983-3"]["reward_model"]["ground_truth"] == ["20"]  # written "020" in the fixture
    assert rows["2000-II-9"]["reward_model"]["ground_truth"] == ["0"]
    assert rows["2022-II-8"]["reward_model"]["ground_truth"] == ["80", "81"]  # "080 or 081 (both were accepted)"
    assert rows["2022-II-8"]["extra_info"]["part"] == "II"
    assert manifest["rows_with_several_accepted_answers"] == {"2022-II-8": ["80", "81"]}

    trl = trl_rows(tmp_path, "aime_1983_2024", "train")
    assert len(trl) == 6 and set(trl[0]) == {"prompt", "ground_truth", "data_source", "extra_info"}
    for line, row in zip(trl, parquet_rows(tmp_path, "aime_1983_2024", "train")):
        assert line["prompt"] == row["prompt"] and line["extra_info"] == row["extra_info"]
        assert line["ground_truth"] == row["reward_model"]["ground_truth"]


def test_a_system_prompt_is_a_system_turn_before_the_question(tmp_path):
    """EVOL-RL App. C.3: SimpleRL-Zoo's system prompt, the question alone as the user turn; user_prompt (what the
    rewards read) is the user turn; the manifest records the system prompt."""
    system = "Please reason step by step, and put your final answer within \\boxed{}."
    manifest = build(tmp_path, "aime_1983_2024", "expected_count=6", f"+system_prompt='{system}'", "prompt_suffix=null")
    plain = tmp_path / "plain"
    build(plain, "aime_1983_2024", "expected_count=6")
    plain_rows = by_id(parquet_rows(plain, "aime_1983_2024", "train"))
    for rid, row in by_id(parquet_rows(tmp_path, "aime_1983_2024", "train")).items():
        question = plain_rows[rid]["prompt"][0]["content"].removesuffix(SUFFIX)
        assert list(row["prompt"]) == [{"role": "system", "content": system}, {"role": "user", "content": question}]
        assert row["extra_info"]["user_prompt"] == question
    assert manifest["config"]["system_prompt"] == system


def test_structured_aime_has_seed_004s_prompt_with_tags_randomised_per_row(tmp_path):
    """Structured Reasoning App. A.8 prompt; App. A.4 RL-time randomisation: the top 5 tags plus 0-5 others, shuffled,
    drawn per row from (prompt_seed, row id): rows differ, a rebuild is identical, the answers are unchanged."""
    import re

    from sarl.formats.tags import TAGS, TOP_TAGS, randomized_prompt

    build(tmp_path, "aime_1983_2024_structured", "expected_count=6")
    rows = by_id(parquet_rows(tmp_path, "aime_1983_2024_structured", "train"))
    plain = tmp_path / "plain"
    build(plain, "aime_1983_2024", "expected_count=6")
    plain_rows = by_id(parquet_rows(plain, "aime_1983_2024", "train"))
    tag_sets = []
    for rid, row in rows.items():
        content = row["prompt"][0]["content"]
        question = plain_rows[rid]["prompt"][0]["content"].removesuffix(SUFFIX)
        assert content == randomized_prompt(question, seed=0, key=rid)
        assert question in content and "\\boxed{ }" in content and SUFFIX not in content
        listing = content.split("reasoning: ", 1)[1].split(".\n", 1)[0]
        tags = re.findall(r"<([a-z_]+)>", listing)
        assert set(TOP_TAGS) <= set(tags) <= set(TAGS) and 5 <= len(tags) <= 10 and len(set(tags)) == len(tags)
        tag_sets.append(tuple(tags))
        assert row["reward_model"] == plain_rows[rid]["reward_model"]
    assert len(set(tag_sets)) > 1  # randomised per row, not one prompt for all
    again = tmp_path / "again"
    build(again, "aime_1983_2024_structured", "expected_count=6")
    assert by_id(parquet_rows(again, "aime_1983_2024_structured", "train")) == rows
    with pytest.raises(Exception, match="prompt_style"):
        build(tmp_path / "bad", "aime_1983_2024", "expected_count=6", "+prompt_style=fancy")


def test_structured_validation_set_has_the_fixed_template_with_all_tags(tmp_path):
    """aime25_structured, the structured experiments' validation set: Structured Reasoning App. A.8's
    "Mathematical Problem Solving Template" with all 23 tags in the paper's order for every row, the same problems
    and golds as aime25."""
    from sarl.formats.tags import TAGS
    from sarl.launch.compose import compose_train_config

    build(tmp_path, "aime25_structured", "expected_count=3")
    build(tmp_path, "aime25", "expected_count=3")
    plain = by_id(parquet_rows(tmp_path, "aime25", "test"))
    rows = by_id(parquet_rows(tmp_path, "aime25_structured", "test"))
    assert rows.keys() == plain.keys()
    listing = ", ".join(f"<{t}>" for t in TAGS)
    for rid, row in rows.items():
        question = plain[rid]["prompt"][0]["content"].removesuffix(SUFFIX)
        assert row["prompt"][0]["content"] == (
            f"Please use the following tags at the beginning of each sentence in your reasoning: {listing}.\n"
            f"{question}\nPlease reason step by step, and put your final answer within \\boxed{{ }}."
        )
        assert row["reward_model"] == plain[rid]["reward_model"] and row["data_source"] == "aime25_structured"
    # the structured experiments train and validate with tagged prompts
    for exp in structured_prompt_rows():
        cfg, _ = compose_train_config([f"+exp={exp}", f"paths.root={tmp_path}"])
        assert cfg.data.val_files == str(tmp_path / "data" / "aime25_structured" / "test.parquet")


def test_the_manifest_pins_the_source_and_every_output(tmp_path):
    manifest = build(tmp_path, "aime_1983_2024", "expected_count=6")
    out = tmp_path / "data" / "aime_1983_2024"
    assert json.loads((out / "manifest.json").read_text()) == manifest
    src = manifest["source"]
    assert src["kind"] == "local_file" and src["format"] == "csv" and src["rows"] == 6
    assert src["sha256"] == sha256_file(FIXTURES / "aime_1983_2024.csv")
    assert [s["step"] for s in manifest["counts"]] == [
        "loaded",
        "id, question and answer present",
        "gold answers parse (sarl.checking.grading, math-verify)",
    ]
    assert [s["rows"] for s in manifest["counts"]] == [6, 6, 6]
    train = manifest["outputs"]["train"]
    assert train["rows"] == 6 and train["parquet"] == "aime_1983_2024/train.parquet"
    assert train["sha256"]["parquet"] == sha256_file(out / "train.parquet")
    assert train["sha256"]["trl"] == sha256_file(out / "train.trl.jsonl")
    assert manifest["config"]["answers"]["several"] and manifest["config"]["prompt_suffix"] == SUFFIX
    assert manifest["expected_count"] == 6 and manifest["dropped_rows"] == []
    written = sorted(p.name for p in out.iterdir())
    assert written == ["manifest.json", "train.parquet", "train.trl.jsonl"]  # no temporary files left


def test_a_rebuild_is_identical(tmp_path):
    first = build(tmp_path / "a", "aime_1983_2024", "expected_count=6")
    second = build(tmp_path / "b", "aime_1983_2024", "expected_count=6")
    assert first["outputs"] == second["outputs"]  # same hashes


def test_the_expected_count_is_checked_and_nothing_is_written_on_failure(tmp_path):
    with pytest.raises(DataValidationError, match=r"6 rows in split 'train'.*expected 933.*expected_count=6"):
        build(tmp_path, "aime_1983_2024")  # the paper's 933
    assert not (tmp_path / "data").exists()


def test_the_verl_parquet_loads_with_datasets_as_verl_reads_it(tmp_path):
    import datasets

    build(tmp_path, "aime_1983_2024", "expected_count=6")
    path = str(tmp_path / "data" / "aime_1983_2024" / "train.parquet")
    ds = datasets.load_dataset("parquet", data_files=path, split="train")
    assert ds[3]["reward_model"]["ground_truth"] == ["80", "81"] and ds[3]["prompt"][0]["role"] == "user"
    trl = datasets.load_dataset("json", data_files=path.replace(".parquet", ".trl.jsonl"), split="train")
    assert trl[3]["ground_truth"] == ["80", "81"]


# ---------------------------------------------------------------------------------------------------------
# Gold answers that do not parse
# ---------------------------------------------------------------------------------------------------------


def test_unparseable_gold_answers_are_reported_by_id_and_fail_the_build(tmp_path):
    # Minerva Math's real gold "np.arcsin(10/13)" (row 2) is code, not math; without the config's fix:
    with pytest.raises(DataValidationError) as err:
        build(tmp_path, "minerva_math", "answers.fixes=null", "expected_count=4")
    message = str(err.value)
    assert "1 rows are unusable" in message and "\n  2: gold answer 'np.arcsin(10/13)' does not parse" in message
    assert "drop_invalid=true" in message
    assert not (tmp_path / "data").exists()


def test_drop_invalid_drops_them_and_lists_them_in_the_manifest(tmp_path):
    manifest = build(tmp_path, "minerva_math", "answers.fixes=null", "drop_invalid=true", "expected_count=3")
    rows = parquet_rows(tmp_path, "minerva_math", "test")
    assert [r["extra_info"]["id"] for r in rows] == ["0", "1", "3"]  # no id column: the row position
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 3]  # stable: the dropped row leaves a gap
    assert [r["reward_model"]["ground_truth"] for r in rows] == [["1.6"], ["4.5e33"], ["0.49"]]
    (dropped,) = manifest["dropped_rows"]
    assert dropped["id"] == "2" and dropped["index"] == 2 and "np.arcsin(10/13)" in dropped["reason"]
    assert [s["rows"] for s in manifest["counts"]] == [4, 4, 3]


def test_the_question_is_stripped_before_the_instruction_is_appended(tmp_path):
    src = tmp_path / "one.jsonl"
    src.write_text(json.dumps({"id": "x", "problem": "  What is $1+1$? \n", "answer": "2"}) + "\n")
    build(tmp_path, "aime25", "expected_count=1", local_file=src)
    (row,) = parquet_rows(tmp_path, "aime25", "test")
    assert row["prompt"][0]["content"] == "What is $1+1$?" + SUFFIX


def test_a_gold_fix_in_the_config_replaces_the_sources_gold_and_is_recorded(tmp_path):
    manifest = build(tmp_path, "minerva_math", "expected_count=4")  # conf/data/minerva_math.yaml fixes row 2
    rows = parquet_rows(tmp_path, "minerva_math", "test")
    assert rows[2]["reward_model"]["ground_truth"] == ["\\arcsin\\left(\\frac{10}{13}\\right)"]
    assert manifest["gold_fixes"] == {
        "2": {"source": "np.arcsin(10/13)", "fixed": "\\arcsin\\left(\\frac{10}{13}\\right)"}
    }
    with pytest.raises(DataValidationError, match=r"answers.fixes names ids that are not in the source: \['7'\]"):
        build(tmp_path, "aime25", "expected_count=3", "+answers.fixes.7=1")


def test_missing_questions_and_answers_are_reported_too(tmp_path):
    bad = tmp_path / "aime25_bad.jsonl"
    rows = [json.loads(line) for line in (FIXTURES / "aime25.jsonl").read_text().splitlines()]
    rows[0]["answer"] = ""
    rows[1]["problem"] = "  "
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataValidationError) as err:
        build(tmp_path, "aime25", "expected_count=3", local_file=bad)
    assert "0: answer field 'answer': empty answer ''" in str(err.value)
    assert "3: no question in field 'problem'" in str(err.value)


# ---------------------------------------------------------------------------------------------------------
# Evaluation sets
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,expected,first_id,first_truth,first_extra",
    [
        ("aime25", 30, "0", ["70"], {}),
        (
            "amc23",
            40,
            "0",
            ["27"],
            {"url": "https://artofproblemsolving.com/wiki/index.php/2023_AMC_12A_Problems/Problem_1"},
        ),
        (
            "math500",
            500,
            "test/precalculus/807.json",
            ["\\left( 3, \\frac{\\pi}{2} \\right)"],
            {"subject": "Precalculus", "level": 2},
        ),
    ],
)
def test_math_evaluation_sets(tmp_path, name, expected, first_id, first_truth, first_extra):
    with pytest.raises(DataValidationError, match=f"expected {expected}"):  # the real set's size is checked
        build(tmp_path, name)
    build(tmp_path, name, "expected_count=3")
    rows = parquet_rows(tmp_path, name, "test")
    first = rows[0]
    prompt = first["prompt"][0]["content"]
    assert first["extra_info"] == {"index": 0, "id": first_id, "split": "test", **first_extra, "user_prompt": prompt}
    assert first["reward_model"] == {"style": "rule", "ground_truth": first_truth}
    assert first["prompt"][0]["content"].endswith(SUFFIX) and first["ability"] == "math"
    assert first["data_source"] == name
    assert (tmp_path / "data" / name / "test.trl.jsonl").exists()


def test_amc23_float_answers_become_integers(tmp_path):
    build(tmp_path, "amc23", "expected_count=3")
    truths = [r["reward_model"]["ground_truth"] for r in parquet_rows(tmp_path, "amc23", "test")]
    assert truths == [["27"], ["8"], ["18"]]  # 27.0, 8.0, 18.0 in the source


def test_wildbench_v2_keeps_the_conversation_checklist_and_tags(tmp_path):
    with pytest.raises(DataValidationError, match="expected 1024"):
        build(tmp_path, "wildbench_v2")
    build(tmp_path, "wildbench_v2", "expected_count=2")
    rows = parquet_rows(tmp_path, "wildbench_v2", "test")
    multi = rows[1]
    conversation = [
        {"role": "user", "content": "I am planning a three-day trip to Lisbon in March. What should I see?"},
        {"role": "assistant", "content": "Day 1: Alfama and the castle; day 2: Belem; day 3: a day trip to Sintra."},
        {
            "role": "user",
            "content": "That is a lot of walking. Can you redo the plan for someone who cannot walk more than two "
            "kilometres a day?",
        },
    ]
    assert multi["prompt"] == conversation and multi["ability"] == "open"
    assert multi["reward_model"] == {"style": "none", "ground_truth": ""}
    info = multi["extra_info"]
    assert info["id"] == "1" and info["index"] == 1 and info["split"] == "test"
    assert info["conversation"] == conversation and info["session_id"] == "5e8d02b7c1f94a6d9b3e7f10c2a4d856"
    assert info["primary_tag"] == "Planning" and info["secondary_tags"] == ["Advice seeking", "Information seeking"]
    assert len(info["checklist"]) == 3 and info["checklist"][0].startswith("Does the plan keep walking")
    assert info["intent"].startswith("The user wants an accessible")
    assert info["user_prompt"] == conversation[-1]["content"]  # the turn the response answers
    trl = trl_rows(tmp_path, "wildbench_v2", "test")
    assert trl[1]["ground_truth"] is None and trl[1]["extra_info"]["checklist"] == info["checklist"]


def test_a_wildbench_row_without_checklist_or_user_turn_is_reported(tmp_path):
    rows = json.loads((FIXTURES / "wildbench_v2.json").read_text())
    rows[0]["checklist"] = []
    rows[1]["conversation_input"] = rows[1]["conversation_input"][:2]  # ends with the assistant
    bad = tmp_path / "wb.json"
    bad.write_text(json.dumps(rows))
    with pytest.raises(DataValidationError) as err:
        build(tmp_path, "wildbench_v2", "expected_count=2", local_file=bad)
    assert "0: no checklist" in str(err.value) and "1: the conversation does not end with a user turn" in str(err.value)
    rows[1]["conversation_input"][0]["role"] = "robot"
    bad.write_text(json.dumps(rows[1:]))
    with pytest.raises(DataValidationError, match="message 0 is not a"):
        build(tmp_path, "wildbench_v2", "expected_count=1", local_file=bad)


# ---------------------------------------------------------------------------------------------------------
# Config errors
# ---------------------------------------------------------------------------------------------------------


def test_a_field_mapping_to_a_missing_column_lists_the_columns(tmp_path):
    columns = r"no column for fields.question='question'.*'answer', 'id', 'problem'"
    with pytest.raises(DataValidationError, match=columns):
        build(tmp_path, "aime25", "fields.question=question", "expected_count=3")


def test_duplicate_ids_fail(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES / "aime25.jsonl").read_text().splitlines()]
    rows[2]["id"] = rows[0]["id"]
    bad = tmp_path / "dup.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataValidationError, match=r"not unique.*\['0'\].*fields.id=null"):
        build(tmp_path, "aime25", "expected_count=3", local_file=bad)


def test_every_data_file_is_a_dataset_option_and_a_wrong_name_lists_them():
    from hydra.errors import MissingConfigException
    from omegaconf import OmegaConf

    names = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml") if "builder" in OmegaConf.load(p))
    assert set(names) == set(FIXTURE_FILES)  # every buildable set has a fixture test
    for name in names:
        cfg = compose_prepare_config([f"dataset={name}"])
        assert cfg.name == name and cfg.builder in BUILDERS
        assert cfg.expected_count > 0 and cfg.split in {"train", "test"}
    with pytest.raises(MissingConfigException, match="aime25"):
        compose_prepare_config(["dataset=aime23"])


# ---------------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------------


def run_cli(tmp_path, *args, **env):
    full_env = {**os.environ, "SARL_ROOT": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "-m", "sarl.data.prepare", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env=full_env,
    )


@pytest.mark.slow
def test_cli_builds_and_prints_the_counts(tmp_path):
    proc = run_cli(tmp_path, "dataset=amc23", f"source.local_file={FIXTURES / 'amc23.jsonl'}", "expected_count=3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rows after each step" in proc.stdout and "gold answers parse" in proc.stdout
    assert (tmp_path / "data" / "amc23" / "test.parquet").exists()
    assert (tmp_path / "data" / "amc23" / "manifest.json").exists()


@pytest.mark.slow
def test_cli_with_an_unreachable_hub_source_gives_one_clear_error(tmp_path):
    """No network and nothing cached: the error names the data set and the local-file override, at once."""
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = run_cli(tmp_path, "dataset=aime25", **offline)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("error: dataset 'aime25': cannot load 'math-ai/aime25', split 'test'")
    assert "python -m sarl.data.prepare dataset=aime25 source.local_file=" in err
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "data").exists()
