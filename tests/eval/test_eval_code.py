"""Code benchmarks in `eval.run` (eval/code.py): GRP's protocol run end to end against a loopback OpenAI-compatible
server on fixture MBPP and LiveCodeBench sets built by `sarl.data.prepare`; each response's last code block runs in
the sandbox: right code scores 1, wrong code, no code, a syntax error, a timeout and a hostile program score 0 and
are counted (a hostile program's effects stay in its sandbox); avg@16 (MBPP) and avg@3 (LiveCodeBench) come out as
the paper's protocol states."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from eval_helpers import REPO, FakeChatServer, chat_reply

from eval import run as eval_run
from eval.code import code_sample
from eval.generate import sample_seed
from sarl.data.prepare import compose_prepare_config, prepare

FIXTURES = REPO / "tests" / "fixtures" / "data"
PWNED = Path("/tmp/sarl-test-eval-code-pwned")  # what the hostile program tries to create


def fenced(code):
    return f"```python\n{code}```"


MBPP = {  # problem id -> sample index -> the final answer's code (None: no code block)
    "11": lambda i: (
        "def remove_Occ(s, ch):\n    s = s.replace(ch, '', 1)\n    i = s.rfind(ch)\n"
        "    return s if i < 0 else s[:i] + s[i + 1 :]\n"
        if i % 2 == 0
        else "def remove_Occ(s, ch):\n    return s[1:-1]\n"
    ),
    "17": lambda i: {
        0: (  # hostile: the file is made inside its sandbox only, and an always-equal answer is not plain data
            f"import os\nos.system('touch {PWNED}')\nclass Any(int):\n    def __eq__(self, other):\n"
            "        return True\ndef square_perimeter(a):\n    return Any(0)\n"
        ),
        1: None,
        2: "def square_perimeter(a)\n    return 4 * a\n",  # a syntax error
    }.get(i, "def square_perimeter(a):\n    return 4 * a\n"),
    "900": lambda i: "import math\ndef circle_area(r):\n    return math.pi * r ** 2\n",
}
LCB = {
    "abc999_a": lambda i: "a, b = map(int, input().split())\nprint(a + b)\n",
    "9001": lambda i: [
        "class Solution:\n    def halve(self, nums: List[int]) -> List[float]:\n        return [x / 2 for x in nums]\n",
        "class Solution:\n    def halve(self, nums):\n        return [x // 2 for x in nums]\n",
        "class Solution:\n    def halve(self, nums):\n        while True:\n            pass\n",  # a timeout
    ][i],
    "1999_B": lambda i: (
        "import sys\nn, *a = map(int, sys.stdin.read().split())\na.sort()\nprint(a[-1] + a[-2])\nprint(a[0] + a[1])\n"
    ),
}


def prepared(tmp_path, name):
    cfg = compose_prepare_config(
        [f"dataset={name}", f"paths.root={tmp_path}", f"source.local_file={FIXTURES / f'{name}.jsonl'}"]
        + ["expected_count=null", "verify=null"]
    )
    prepare(cfg)
    return pq.read_table(tmp_path / "data" / name / "test.parquet").to_pylist()


THOUGHT = fenced("def remove_Occ(s, ch):\n    return s\n")  # a wrong block inside the thinking: not the answer


def code_server(rows):
    """Answers each prompt of `rows` ({benchmark: parquet rows}) with the code of MBPP / LCB for its sample index:
    thinking with a wrong code block first, then the final answer."""
    by_prompt = {r["prompt"][-1]["content"]: (b, r["extra_info"]["id"]) for b, rs in rows.items() for r in rs}
    answers = {"mbpp": MBPP, "livecodebench_v5": LCB}
    index = {(b, pid, sample_seed(0, b, pid, i)): i for b, rs in rows.items() for pid in answers[b] for i in range(16)}

    def respond(server, body):
        bench, pid = by_prompt[body["messages"][-1]["content"]]
        code = answers[bench][pid](index[(bench, pid, body["seed"])])
        final = fenced(code) if code is not None else "I could not solve it."
        text = f"<think>\nA first try:\n{THOUGHT}\n</think>\n\nHere it is:\n{final}\n"
        return 200, chat_reply(text, "stop", {"completion_tokens": 50})

    return FakeChatServer(respond)


def test_grp_protocol_scores_code_by_execution(tmp_path):
    rows = {"mbpp": prepared(tmp_path, "mbpp"), "livecodebench_v5": prepared(tmp_path, "livecodebench_v5")}
    server = code_server(rows)
    args = [
        "ckpt=tiny",
        "protocol=grp",
        "only=[mbpp,livecodebench_v5]",
        "generator=openai",
        f"generator.url={server.url}",
        "generator.concurrency=4",
        f"paths.root={tmp_path}",
        f"run_dir={tmp_path / 'run'}",
        f"cache_dir={tmp_path / 'cache'}",
        "structure.enabled=false",
        "logger=none",
        "code.max_workers=2",
        "code.timeout_s_by_benchmark.livecodebench_v5=3",
    ]
    try:
        assert eval_run.main(args) == 0
        assert len(server.requests) == 3 * 16 + 3 * 3  # GRP Sec. 4.1: avg@16 on MBPP, avg@3 on LiveCodeBench
        assert {b["max_tokens"] for b in server.requests} == {8192}
        assert eval_run.main([*args, f"run_dir={tmp_path / 'again'}"]) == 0  # generations and runs from the cache
        assert len(server.requests) == 3 * 16 + 3 * 3
    finally:
        server.close()
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    mbpp, lcb = results["math"]["benchmarks"]["mbpp"], results["math"]["benchmarks"]["livecodebench_v5"]
    # MBPP: 11 right on the 8 even samples, 17 right on 13 of 16 (hostile, no code, syntax error), 900 always
    assert mbpp["metrics"] == {"avg@16": pytest.approx(100 * (8 + 13 + 16) / 48)}
    assert mbpp["code_outcomes"] == {"passed": 37, "failed": 9, "no_code_block": 1, "syntax_error": 1}
    assert mbpp["no_answer_rate"] == pytest.approx(100 / 48)
    # LiveCodeBench: the stdin problems always right; the functional one right, wrong, then a timeout
    assert lcb["metrics"] == {"avg@3": pytest.approx(100 * 7 / 9)}
    assert lcb["code_outcomes"] == {"passed": 7, "failed": 1, "timeout": 1}
    assert again["math"]["benchmarks"]["mbpp"]["code_outcomes"] == mbpp["code_outcomes"]
    problems = [json.loads(line) for line in (tmp_path / "run" / "problems.jsonl").read_text().splitlines()]
    p17 = next(p for p in problems if p["benchmark"] == "mbpp" and p["problem_id"] == "17")
    assert p17["n_correct"] == 13 and None in p17["answers"]  # None: the sample without a code block
    assert sorted(a for a in p17["answers"] if a not in ("passed", None)) == ["failed", "syntax_error"]
    assert not PWNED.exists()
    assert "| mbpp | 16 | 8192 | 0.6 | 77.08 |" in (tmp_path / "run" / "results.md").read_text()


def test_a_sample_without_a_response_is_incorrect():
    assert code_sample(None) == {"answer": None, "correct": False, "code_outcome": "no_response"}
    assert code_sample({"outcome": "no_code_block"})["answer"] is None
    assert code_sample({"outcome": "passed"}) == {"answer": "passed", "correct": True, "code_outcome": "passed"}


HOSTILE_OUTPUT = [  # sample index % 4 -> a program whose failure text is hostile to store (issue: a lone surrogate
    # in an exception made SampleCache.put raise, so the sample was never cached and every rerun died there)
    "def remove_Occ(s, ch):\n    raise ValueError('\\ud800')\n",
    "import sys\ndef remove_Occ(s, ch):\n    sys.stdout.write('\\x00' * 10 + 'x' * 3_000_000)\n    return s\n",
    "def remove_Occ(s, ch):\n    raise ValueError('\\udfff' + 'y' * 2_000_000)\n",
    MBPP["11"](0),  # right
]


def test_an_evaluation_finishes_whatever_the_programs_print_or_raise(tmp_path):
    """Programs that raise a lone surrogate, print NUL bytes and megabytes: each is a failed program (scored like
    any other), the evaluation finishes, and a rerun reads every sample from the cache with the same outcomes."""
    rows = {"mbpp": prepared(tmp_path, "mbpp")}
    by_prompt = {r["prompt"][-1]["content"]: r["extra_info"]["id"] for r in rows["mbpp"]}
    index = {sample_seed(0, "mbpp", pid, i): i for pid in MBPP for i in range(16)}

    def respond(server, body):
        pid = by_prompt[body["messages"][-1]["content"]]
        code = HOSTILE_OUTPUT[index[body["seed"]] % 4] if pid == "11" else MBPP[pid](index[body["seed"]])
        final = fenced(code) if code is not None else "I could not solve it."
        return 200, chat_reply(f"<think>\nok\n</think>\n\n{final}\n", "stop", {"completion_tokens": 50})

    server = FakeChatServer(respond)
    args = [
        "ckpt=tiny",
        "protocol=grp",
        "only=[mbpp]",
        "generator=openai",
        f"generator.url={server.url}",
        "generator.concurrency=4",
        f"paths.root={tmp_path}",
        f"cache_dir={tmp_path / 'cache'}",
        "structure.enabled=false",
        "logger=none",
        "code.max_workers=2",
    ]
    try:
        assert eval_run.main([*args, f"run_dir={tmp_path / 'run'}"]) == 0
        first = len(server.requests)
        assert eval_run.main([*args, f"run_dir={tmp_path / 'again'}"]) == 0  # every sample from the cache
        assert len(server.requests) == first
    finally:
        server.close()
    outcomes = [
        json.loads((tmp_path / d / "results.json").read_text())["math"]["benchmarks"]["mbpp"]["code_outcomes"]
        for d in ("run", "again")
    ]
    assert outcomes[0] == outcomes[1]
    # 11: the two raising programs fail (8), the megabytes hit the output limit (4), the right one passes (4); 17 and
    # 900 as in the test above: every hostile text a verdict for its program, none masked as the harness's
    assert outcomes[0] == {"passed": 33, "failed": 9, "output_limit": 4, "no_code_block": 1, "syntax_error": 1}
