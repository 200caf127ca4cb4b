"""GRP's code sets (sarl/data/code_sets.py, sarl/data/code_tests.py): the code RL set (KodCode-Light-RL-10K) and
the benchmarks MBPP, MBPP+, HumanEval, HumanEval+ and LiveCodeBench v5, built from small copies in their source
layouts (tests/fixtures/data/), their tests run in the sandbox of sarl/checking/code/: every row's own solution
passes, a wrong one fails."""

import base64
import io
import json
import pickle
import re
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sarl.checking.code.sandbox import Sandbox, problem_of
from sarl.data import code_tests
from sarl.data.build import DataValidationError
from sarl.data.prepare import compose_prepare_config, prepare

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
SETS = {  # name: (expected count of the real set, source, code_format, fixture rows)
    "grp_code_rl": (10000, ("KodCode/KodCode-Light-RL-10K", None, "train"), "kodcode", 3),
    "mbpp": (500, ("google-research-datasets/mbpp", "full", "test"), "mbpp", 3),
    "mbpp_plus": (378, ("evalplus/mbppplus", None, "test"), "evalplus_mbpp", 2),
    "humaneval": (164, ("openai/openai_humaneval", None, "test"), "humaneval", 5),
    "humaneval_plus": (164, ("evalplus/humanevalplus", None, "test"), "humaneval", 3),
    "livecodebench_v5": (880, ("json", None, "train"), "livecodebench", 3),
}
# LiveCodeBench ships no solutions: right and wrong programs for the fixture problems
LCB_PROGRAMS = {
    "abc999_a": (
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "a, b = map(int, input().split())\nprint(a * b)\n",
    ),
    "9001": (
        "class Solution:\n    def halve(self, nums: List[int]) -> List[float]:\n        return [x / 2 for x in nums]\n",
        "class Solution:\n    def halve(self, nums: List[int]) -> List[int]:\n        return [x >> 1 for x in nums]\n",
    ),
    "1999_B": (
        "n = int(input())\na = sorted(map(int, input().split()))\nprint(a[-1] + a[-2])\nprint(a[0] + a[1])\n",
        "n = int(input())\na = sorted(map(int, input().split()))\nprint(a[-1] + a[-2])\n",
    ),
}


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(timeout_s=10.0, memory_mb=2048)


def build(tmp_path, name, *overrides, local_file=None):
    cfg = compose_prepare_config(
        [f"dataset={name}", f"paths.root={tmp_path}", f"source.local_file={local_file or FIXTURES / f'{name}.jsonl'}"]
        + list(overrides)
    )
    return prepare(cfg)


def rows_of(tmp_path, name):
    split = "train" if name == "grp_code_rl" else "test"
    return pq.read_table(tmp_path / "data" / name / f"{split}.parquet").to_pylist()


def source_rows(name):
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]


def test_expected_counts_and_sources_are_the_papers():
    for name, (count, (hf_id, hf_config, split), fmt, _) in SETS.items():
        cfg = compose_prepare_config([f"dataset={name}"])
        assert cfg.expected_count == count, name
        assert (cfg.source.hf_id, cfg.source.hf_config, cfg.source.split) == (hf_id, hf_config, split), name
        assert cfg.code_format == fmt and cfg.builder == "code", name
    lcb = compose_prepare_config(["dataset=livecodebench_v5"]).source.data_files
    assert [f.rsplit("/", 1)[1] for f in lcb] == [
        "test.jsonl",
        "test2.jsonl",
        "test3.jsonl",
        "test4.jsonl",
        "test5.jsonl",
    ]
    assert compose_prepare_config(["dataset=grp_code_rl"]).max_response_length == 8192  # GRP Sec. 4.1: 8K


@pytest.mark.parametrize("name", SETS)
def test_every_fixture_builds_with_its_solutions_verified(tmp_path, name):
    n = SETS[name][3]
    manifest = build(tmp_path, name, f"expected_count={n}")
    steps = [s["step"] for s in manifest["counts"]]
    if name != "livecodebench_v5":  # each row's own solution passed its converted tests in the sandbox
        assert (
            steps[-1] == "canonical solution passes its tests (sarl.checking.code.sandbox)"
            and manifest["verified_solutions"] == n
        )
    rows = rows_of(tmp_path, name)
    assert len(rows) == n and {r["ability"] for r in rows} == {"code"}
    for r in rows:
        truth = r["reward_model"]["ground_truth"]
        assert r["reward_model"]["style"] == "code_exec" and set(truth) == {"tests", "prelude", "stdin"}
        assert r["extra_info"]["user_prompt"] == r["prompt"][-1]["content"]
    with pytest.raises(DataValidationError, match=f"{n} rows in split .* expected {SETS[name][0]}"):
        build(tmp_path, name, "verify=null")


def wrong_programs(name, row):
    """Programs that must fail: nothing defined, and the function under test returning None."""
    entry = {
        "grp_code_rl": lambda: row["test_info"][0]["function_name"],
        "mbpp": lambda: re.match(r"assert (?:isclose\()?(\w+)\(", row["test_list"][0]).group(1),
        "mbpp_plus": lambda: re.match(r"assert set\((\w+)\(|assert (\w+)\(", row["test_list"][0]).group(1, 2),
        "humaneval": lambda: row["entry_point"],
        "humaneval_plus": lambda: row["entry_point"],
    }[name]()
    entry = next(e for e in entry if e) if isinstance(entry, tuple) else entry
    return ["pass\n", f"def {entry}(*args, **kwargs):\n    return None\n"]


def canonical(name, row):
    if name in ("humaneval", "humaneval_plus"):
        return row["prompt"] + row["canonical_solution"]
    return row["solution"] if name == "grp_code_rl" else row["code"]


@pytest.mark.parametrize("name", [n for n in SETS if n != "livecodebench_v5"])
def test_each_rows_solution_passes_and_a_wrong_one_fails(tmp_path, sandbox, name):
    build(tmp_path, name, "expected_count=null", "verify=null")
    built = {r["extra_info"]["id"]: r["reward_model"]["ground_truth"] for r in rows_of(tmp_path, name)}
    id_key = {"grp_code_rl": "question_id"}.get(name, "task_id")
    for row in source_rows(name):
        truth = built[str(row[id_key])]
        right = sandbox.run(canonical(name, row), problem_of(truth))
        assert right.outcome == "passed", (name, row[id_key], right)
        for wrong in wrong_programs(name, row):
            result = sandbox.run(wrong, problem_of(truth))
            assert result.outcome == "failed" and result.score() == 0.0, (name, row[id_key], wrong, result)


def test_livecodebench_stdin_and_functional_cases(tmp_path, sandbox):
    build(tmp_path, "livecodebench_v5", "expected_count=3")
    built = {r["extra_info"]["id"]: r for r in rows_of(tmp_path, "livecodebench_v5")}
    for pid, (right, wrong) in LCB_PROGRAMS.items():
        truth = built[pid]["reward_model"]["ground_truth"]
        assert truth["stdin"] == (pid != "9001") and truth["prelude"] == code_tests.LCB_PRELUDE
        assert sandbox.run(right, problem_of(truth)).outcome == "passed", pid
        assert sandbox.run(wrong, problem_of(truth)).outcome == "failed", pid
    # public + private (compressed) cases: one assert each
    assert built["abc999_a"]["reward_model"]["ground_truth"]["tests"].count("\nassert _lcb_case(") == 3
    prompt = built["9001"]["prompt"][0]["content"]
    assert prompt.startswith("### Question:\nGiven an integer array nums") and "def halve(self, nums" in prompt
    assert "Read the inputs from stdin" in built["abc999_a"]["prompt"][0]["content"]
    assert built["9001"]["extra_info"]["platform"] == "leetcode"


def test_livecodebench_date_window(tmp_path):
    window = ["filters.date_from=2024-08-01", "filters.date_to=2025-01-31", "expected_count=2"]
    manifest = build(tmp_path, "livecodebench_v5", *window)
    assert {r["extra_info"]["id"] for r in rows_of(tmp_path, "livecodebench_v5")} == {"9001", "1999_B"}
    assert manifest["counts"][1] == {"step": "contest_date in [2024-08-01, 2025-01-31]", "rows": 2, "dropped": 1}


def test_livecodebench_private_cases_are_unpickled_as_plain_text_only():
    cases = [{"input": "1\n", "output": "1\n", "testtype": "stdin"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()
    assert code_tests.lcb_cases(packed) == cases
    hostile = base64.b64encode(zlib.compress(pickle.dumps(io.StringIO("x")))).decode()  # a class in the pickle
    with pytest.raises(ValueError, match="neither JSON nor LiveCodeBench's compressed form"):
        code_tests.lcb_cases(hostile)


def test_humaneval_prompt_helpers_run_before_the_program(tmp_path, sandbox):
    build(tmp_path, "humaneval", "expected_count=5", "verify=null")
    truth = {r["extra_info"]["id"]: r["reward_model"]["ground_truth"] for r in rows_of(tmp_path, "humaneval")}
    t10 = truth["HumanEval/10"]
    assert "def is_palindrome" in t10["prelude"] and "make_palindrome" not in t10["prelude"]
    assert t10["tests"].rstrip().endswith("check(make_palindrome)")
    program = (
        "def make_palindrome(string: str) -> str:\n    for i in range(len(string) + 1):\n"
        "        if is_palindrome(string[i:]):\n            return string + string[:i][::-1]\n"
    )  # uses the prompt's helper without repeating it
    assert sandbox.run(program, problem_of(t10)).outcome == "passed"
    assert truth["HumanEval/0"]["prelude"] == "from typing import List\n"  # the annotations' import


KODCODE_FEATURES = """
import pytest
from solution import clip as c

@pytest.mark.parametrize("x, expected", [(-1, 0), (5, 5), (11, 10)])
def test_clip(x, expected):
    assert c(x) == expected

@pytest.mark.parametrize("x", [0.5])
@pytest.mark.parametrize("scale", [2, 4])
def test_scaled(x, scale):
    assert c(x * scale) == pytest.approx(x * scale)

def test_type():
    with pytest.raises(TypeError):
        c("a")

@pytest.mark.skip(reason="not run")
def test_skipped():
    assert False
"""


def test_kodcode_pytest_features_run_without_pytest(sandbox):
    tests = code_tests.pytest_to_tests(KODCODE_FEATURES)
    assert "from solution" not in tests and "import pytest\n" not in tests
    right = "def clip(x):\n    return min(max(x, 0), 10)\n"
    result = sandbox.run(right, tests)
    assert result.outcome == "passed" and (result.passed, result.asserts) == (4, 4)
    no_upper = "def clip(x):\n    return max(x, 0)\n"  # the third parameter set of test_clip fails
    result = sandbox.run(no_upper, tests)
    assert result.outcome == "failed" and (result.passed, result.asserts) == (3, 4)
    no_type_check = (
        "def clip(x):\n    try:\n        return min(max(x, 0), 10)\n    except TypeError:\n        return 0\n"
    )
    assert sandbox.run(no_type_check, tests).passed == 3  # pytest.raises: "DID NOT RAISE"


def test_a_test_file_needing_an_unknown_fixture_is_reported(tmp_path):
    rows = source_rows("grp_code_rl")[:2]
    rows[1]["test"] = (
        "from solution import safe_divide\n\ndef test_env(monkeypatch):\n    assert safe_divide(4, 2) == 2\n"
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataValidationError, match=r"Leetcode_2: tests: test_env asks for the pytest fixture\(s\)"):
        build(tmp_path, "grp_code_rl", "expected_count=1", local_file=bad)
    manifest = build(tmp_path, "grp_code_rl", "expected_count=1", "drop_invalid=true", local_file=bad)
    assert [d["id"] for d in manifest["dropped_rows"]] == ["Leetcode_2"]


def test_a_canonical_solution_that_fails_its_tests_is_reported(tmp_path):
    rows = source_rows("mbpp")
    rows[1]["code"] = "def square_perimeter(a):\n  return 2 * a"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataValidationError, match="17: the canonical solution does not pass its tests: failed"):
        build(tmp_path, "mbpp", "expected_count=2", local_file=bad)
