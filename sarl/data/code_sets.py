"""Code problems with executable tests: GRP's code RL set (KodCode-Light-RL-10K, GRP App. E.2) and its code
benchmarks (MBPP, MBPP+, HumanEval, HumanEval+, LiveCodeBench v5; GRP Sec. 4.1, Tables 1 and 3).

A record is a row of verl's layout (`sarl.data.build.record`) with `ability: code` and the ground truth
`{"tests": SOURCE, "prelude": ..., "stdin": ...}` of `sarl.data.code_tests` (what `reward=code_exec` and the code
benchmarks of `eval.run` execute). `code_format` in the data config picks how a source row becomes a prompt and
tests:

    kodcode        question; pytest file -> tests (pytest_to_tests)
    mbpp           text + its asserts shown (Austin et al. 2021's prompt); asserts + setup code -> tests
    humaneval      the prompt (signature + docstring) in EvalPlus's instruction; test + check(entry_point)
    evalplus_mbpp  the MBPP+ prompt in EvalPlus's instruction; test_imports + test (inputs/results loop)
    livecodebench  LiveCodeBench's prompt (starter code or stdin); public + private cases

Checks, each counted: id, question and convertible tests present (unusable rows are listed: the build fails
unless drop_invalid); the date window (`filters.date_from` / `date_to`, LiveCodeBench's contest date); and with
`verify` set, each row's canonical solution (`fields.solution`) must pass its tests in `sarl.checking.code.sandbox`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from sarl.checking.code.sandbox import Sandbox, problem_of
from sarl.data import code_tests
from sarl.data.build import (
    BUILDERS,
    Built,
    DataValidationError,
    Steps,
    _blank,
    _plain,
    _text,
    check_fields,
    extras,
    problem,
    record,
    row_ids,
    settle,
)

log = logging.getLogger(__name__)

STYLE = "code_exec"  # reward_model.style of a code row: scored by running its tests

# EvalPlus's instruction for chat models (evalplus/provider/utility.py, `make_raw_chat_prompt`)
EVALPLUS_INSTRUCTION = (
    "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
)
# LiveCodeBench's generation prompt (lcb_runner/prompts/code_generation.py, the chat format)
LCB_STARTER = (
    "### Format: You will use the following starter code to write the solution to the problem and enclose your "
    "code within delimiters."
)
LCB_STDIN = (
    "### Format: Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test "
    "on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python program "
    "runs, it reads the inputs, runs the algorithm and writes output to STDOUT."
)


def _list(value: Any) -> list[str]:
    value = _plain(value)
    if isinstance(value, str):
        return [value] if value.strip() else []
    return [str(v) for v in value or [] if str(v).strip()]


def _fenced(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


# Each converter: (row, fields) -> (user prompt without the suffix, ground truth, canonical program or None).
Converted = tuple[str, dict[str, Any], str | None]


def _kodcode(row: Mapping[str, Any], fields: Mapping[str, Any]) -> Converted:
    tests = _text(_plain(row.get(fields["tests"])))
    if tests is None:
        raise ValueError(f"no tests in field {fields['tests']!r}")
    return row[fields["question"]].strip(), code_tests.gold(code_tests.pytest_to_tests(tests)), _solution(row, fields)


def _mbpp(row: Mapping[str, Any], fields: Mapping[str, Any]) -> Converted:
    asserts = _list(row.get(fields["tests"]))
    setup = _list(row.get(fields["setup"])) if fields.get("setup") else []
    prompt = (
        f"You are an expert Python programmer, and here is your task: {row[fields['question']].strip()} "
        "Your code should pass these tests:\n\n" + "\n".join(asserts)
    )
    return prompt, code_tests.gold(code_tests.assert_tests(asserts, setup)), _solution(row, fields)


def _humaneval(row: Mapping[str, Any], fields: Mapping[str, Any]) -> Converted:
    prompt, entry = row[fields["question"]], str(_plain(row.get(fields["entry_point"])) or "")
    test = _text(row.get(fields["tests"]))
    if test is None:
        raise ValueError(f"no test in field {fields['tests']!r}")
    prelude = code_tests.prompt_prelude(prompt, entry)
    truth = code_tests.gold(code_tests.check_tests(test, entry), prelude)
    body = _text(row.get(fields["solution"])) if fields.get("solution") else None
    return f"{EVALPLUS_INSTRUCTION}\n{_fenced(prompt)}", truth, (prompt + body) if body else None


def _evalplus_mbpp(row: Mapping[str, Any], fields: Mapping[str, Any]) -> Converted:
    test = _text(row.get(fields["tests"]))
    if test is None:
        raise ValueError(f"no test in field {fields['tests']!r}")
    imports = _list(row.get(fields["setup"])) if fields.get("setup") else []
    truth = code_tests.gold(code_tests.evalplus_tests(test, imports))
    return f"{EVALPLUS_INSTRUCTION}\n{_fenced(row[fields['question']])}", truth, _solution(row, fields)


def _livecodebench(row: Mapping[str, Any], fields: Mapping[str, Any]) -> Converted:
    meta = row.get(fields["metadata"]) if fields.get("metadata") else None
    truth = code_tests.livecodebench_tests(row.get(fields["public_tests"]), row.get(fields["private_tests"]), meta)
    starter = _text(row.get(fields["starter_code"])) if fields.get("starter_code") else None
    if truth["stdin"]:
        fmt = f"{LCB_STDIN}\n```python\n# YOUR CODE HERE\n```"
    elif starter is None:
        raise ValueError("a functional problem without starter code")
    else:
        fmt = f"{LCB_STARTER}\n{_fenced(starter)}"
    question = row[fields["question"]].strip()
    prompt = f"### Question:\n{question}\n\n{fmt}\n\n### Answer: (use the provided format with backticks)\n\n"
    return prompt, truth, None


def _solution(row: Mapping[str, Any], fields: Mapping[str, Any]) -> str | None:
    return _text(row.get(fields["solution"])) if fields.get("solution") else None


FORMATS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], Converted]] = {
    "kodcode": _kodcode,
    "mbpp": _mbpp,
    "humaneval": _humaneval,
    "evalplus_mbpp": _evalplus_mbpp,
    "livecodebench": _livecodebench,
}


def in_window(value: Any, date_from: str | None, date_to: str | None) -> bool:
    """An ISO date (or date-time) within [date_from, date_to], both inclusive (days); None bounds are open."""
    day = str(_plain(value))[:10]
    return (date_from is None or day >= str(date_from)) and (date_to is None or day <= str(date_to))


def build_code(cfg: Mapping[str, Any], rows: list[dict[str, Any]], steps: Steps, drop_invalid: bool) -> Built:
    """Code problems (`code_format`, see the module docstring): prompt + `prompt_suffix`, ground truth the
    problem's tests; optional date window; optional check that each canonical solution passes (`verify`)."""
    name, split, fields = cfg["name"], cfg["split"], cfg["fields"]
    fmt = str(cfg.get("code_format"))
    if fmt not in FORMATS:
        raise DataValidationError(f"dataset '{name}': code_format {fmt!r} is not one of {', '.join(FORMATS)}")
    check_fields(name, rows, fields)
    ids = row_ids(name, rows, fields.get("id"))
    flt = cfg.get("filters") or {}
    date_from, date_to = flt.get("date_from"), flt.get("date_to")
    if date_from or date_to:
        if not fields.get("date"):
            raise DataValidationError(f"dataset '{name}': filters.date_from/date_to need fields.date")
        window = [i for i, r in enumerate(rows) if in_window(r.get(fields["date"]), date_from, date_to)]
        steps(f"{fields['date']} in [{date_from or '...'}, {date_to or '...'}]", len(window))
    else:
        window = list(range(len(rows)))
    suffix = cfg.get("prompt_suffix") or ""
    problems, candidates = [], []
    for index in window:
        row, rid = rows[index], ids[index]
        if rid is None:
            problems.append(problem(rid, index, f"no id in field {fields['id']!r}"))
            continue
        if _blank(row.get(fields["question"])):
            problems.append(problem(rid, index, f"no question in field {fields['question']!r}"))
            continue
        try:
            prompt, truth, solution = FORMATS[fmt](row, fields)
        except (ValueError, SyntaxError, KeyError, TypeError) as err:
            problems.append(problem(rid, index, f"tests: {err}"))
            continue
        candidates.append({"index": index, "id": rid, "prompt": prompt + suffix, "gold": truth, "solution": solution})
    steps("id, question and convertible tests present", len(candidates))
    verify = cfg.get("verify") or None
    if verify:
        failed = verify_solutions(candidates, verify)
        problems += [problem(c["id"], c["index"], failed[c["index"]]) for c in candidates if c["index"] in failed]
        candidates = [c for c in candidates if c["index"] not in failed]
        steps("canonical solution passes its tests (sarl.checking.code.sandbox)", len(candidates))
    problems.sort(key=lambda p: p["index"])
    settle(name, problems, drop_invalid)
    records = []
    for c in candidates:
        info = {"index": c["index"], "id": c["id"], **extras(rows[c["index"]], fields)}
        rec = record(name, split, "code", [{"role": "user", "content": c["prompt"]}], c["gold"], info)
        rec["reward_model"]["style"] = STYLE
        records.append(rec)
    notes: dict[str, Any] = {"code_format": fmt}
    if verify:
        notes["verified_solutions"] = len(candidates)
    return Built(splits={split: records}, dropped=problems, notes=notes)


BUILDERS["code"] = build_code


def verify_solutions(candidates: list[dict[str, Any]], verify: Mapping[str, Any]) -> dict[int, str]:
    """Row index -> why its canonical solution does not pass its tests in the sandbox (`verify.sandbox`:
    conf/reward/code_exec.yaml's sandbox keys; `verify.max_workers`). A row without a solution is reported."""
    from tqdm import tqdm

    sandbox = Sandbox(**dict(verify.get("sandbox") or {}))
    problem_ = sandbox.check_ready()
    if problem_:
        raise DataValidationError(f"verify: the sandbox cannot run programs here ({problem_}); set verify=null")
    bad = {c["index"]: "no canonical solution to verify (fields.solution)" for c in candidates if not c["solution"]}
    jobs = [c for c in candidates if c["solution"]]
    size = 256
    with tqdm(total=len(jobs), desc="verify solutions", unit="row", disable=len(jobs) < 512) as bar:
        for start in range(0, len(jobs), size):
            chunk = jobs[start : start + size]
            runs = sandbox.run_many(
                [(c["solution"], problem_of(c["gold"])) for c in chunk],
                verify.get("max_workers"),
            )
            for c, result in zip(chunk, runs):
                if result.outcome != "passed":
                    detail = f" ({result.detail})" if result.detail else ""
                    bad[c["index"]] = f"the canonical solution does not pass its tests: {result.outcome}{detail}"
            bar.update(len(chunk))
    log.info("verified %d canonical solutions: %d fail", len(jobs), len(bad))
    return bad
