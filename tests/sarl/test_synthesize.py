"""`python -m sarl.data.synthesize` against a scripted OpenAI-compatible teacher on loopback: counts per stage,
re-asks carrying the failure as feedback, the outputs in the layouts verl's and TRL's SFT trainers read, the
manifest, resume from the cache, the CoT remainder, the error paths; and the shipped SFT fixtures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from testkit import fake_vllm_python

from baselines.grp import graph_rewards
from sarl.checking.grading.extract import extract_answer
from sarl.checking.grading.grader import default_grader
from sarl.data.synthesize.config import compose_synthesize_config
from sarl.data.synthesize.inputs import Prompt, load_prompt
from sarl.data.synthesize.run import synthesize
from sarl.data.synthesize.verify import graph_issues, parse_verdict, structured_issues
from sarl.formats.graph import parse_graph
from sarl.formats.tags import TAGS, parse_structured, structured_prompt
from sarl.launch.compose import compose_train_config

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO / "tests" / "eval"))  # eval_helpers: the loopback chat server
from eval_helpers import FakeChatServer, chat_reply  # noqa: E402

SAMPLES = REPO / "sarl" / "samples" / "sft"
PREFIX = "<rephrase>\nOkay, I will organize my thoughts process in a hierarchical manner.\n</rephrase>\n<"


def graph_text(nodes: list[tuple[str, int, list[int], str]], answer: str) -> str:
    lines = ["<think>"]
    for label, nid, parents, content in nodes:
        lines += [f"<{label}>", json.dumps({"id": nid, "parents_id": parents, "content": content}), f"</{label}>"]
    return "\n".join(lines + ["</think>", f"<answer>\\boxed{{{answer}}}</answer>"])


GOOD = {
    "P1": graph_text([("known", 1, [], "a = 3"), ("generate", 2, [1], "a + 4 = 7")], "7"),
    "P3": graph_text([("known", 1, [], "b = 5"), ("generate", 2, [1], "2b = 10")], "10"),
    "P4": graph_text([("known", 1, [], "c = 2"), ("generate", 2, [1], "c^3 = 8")], "8"),
    "P6": graph_text([("known", 1, [], "d = 6"), ("generate", 2, [1], "d - 1 = 5")], "5"),
}
# P4's first translation breaks GRP's rule "known nodes have no parents" (repairable with feedback).
BROKEN_P4 = graph_text([("known", 1, [], "c = 2"), ("known", 2, [1], "c^3 = 8")], "8")
PROBLEMS = [
    {"id": "P1", "question": "[P1] What is 3 + 4?", "answer": "7"},  # right first time
    {"id": "P2", "question": "[P2] What is 6 * 7?", "answer": "42"},  # always wrong: no verified trace
    {"id": "P3", "question": "[P3] What is 2 * 5?", "answer": "10"},  # wrong, then right (regeneration)
    {"id": "P4", "question": "[P4] What is 2^3?", "answer": "8"},  # translation repaired with feedback
    {"id": "P5", "question": "[P5] What is 9 - 1?", "answer": "8"},  # translation never valid: CoT remainder
    {"id": "P6", "question": "[P6] What is 6 - 1?", "answer": "5"},  # the LLM verifier objects once
]
ANSWERS = {p["id"]: p["answer"] for p in PROBLEMS}


class GRPTeacher:
    """Answers by problem ([Pn] in the request) and by request kind (sample, translate, refine, verify)."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()

    def __call__(self, server: FakeChatServer, body: dict[str, Any]) -> tuple:
        text = body["messages"][-1]["content"]
        pid = re.search(r"\[(P\d)\]", text).group(1)
        if "You check a reasoning graph" in text:
            kind = "verify"
        elif "Your previous translation was" in text:
            kind = "refine"
        elif "You translate a verified chain-of-thought" in text:
            kind = "translate"
        else:
            kind = "sample"
        with server.lock:
            self.calls[pid, kind] += 1
            n = self.calls[pid, kind]
        if kind == "sample":
            if pid == "P2" or (pid == "P3" and n == 1):
                return 200, chat_reply("So the answer is \\boxed{1}.", reasoning_content="guessing")
            return 200, chat_reply(f"The answer is \\boxed{{{ANSWERS[pid]}}}.", reasoning_content="step by step")
        if kind == "verify":
            if pid == "P6" and self.calls[pid, "verify"] == 1:
                issue = {"node": 2, "type": "node_label", "problem": "this is a check, label it reflect"}
                return 200, chat_reply(json.dumps({"passed": False, "issues": [issue]}))
            return 200, chat_reply('Verdict: {"passed": true, "issues": []}')
        if pid == "P5":
            return 200, chat_reply("<think>\nnot a graph at all\n</think>\n<answer>8</answer>")
        if pid == "P4" and kind == "translate":
            return 200, chat_reply(BROKEN_P4)
        return 200, chat_reply(GOOD[pid])


def teacher_server(respond: Any) -> FakeChatServer:
    server = FakeChatServer(respond)
    server.files["/v1/models"] = json.dumps({"object": "list", "data": [{"id": "teacher"}]})
    return server


@pytest.fixture
def grp_teacher():
    script = GRPTeacher()
    server = teacher_server(script)
    yield server, script
    server.close()


def write_problems(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_synth(tmp_path: Path, url: str, recipe: str, *extra: str) -> tuple[dict, int, Path]:
    out = tmp_path / "out"
    cfg = compose_synthesize_config(
        [
            f"recipe={recipe}",
            "source=local",
            f"input_file={tmp_path / 'problems.jsonl'}",
            f"teacher.url={url}",
            "teacher.model=teacher",
            "teacher.max_retries=0",
            f"out_dir={out}",
            "concurrency=3",
            *extra,
        ]
    )
    manifest, code = synthesize(cfg)
    return manifest, code, out


def test_grp_math_stages_feedback_outputs_and_resume(tmp_path, grp_teacher):
    server, script = grp_teacher
    write_problems(tmp_path / "problems.jsonl", PROBLEMS)
    manifest, code, out = run_synth(tmp_path, server.url, "grp_math", "recipe.sample.max_retries=2")
    assert code == 0 and manifest["complete"]
    c = manifest["counts"]
    assert c["problems"] == 6
    assert c["sample_requests"] == 1 + 3 + 2 + 1 + 1 + 1  # P2: 1 + 2 retries; P3: wrong then right
    assert (c["traces_verified"], c["verified_first_try"], c["verified_after_regeneration"]) == (5, 4, 1)
    assert c["no_verified_trace"] == 1
    assert c["translate_requests"] == 1 + 2 + 3 + 2 + 1  # P1, P4 (repaired), P5 (3 attempts), P6 (2), P3
    assert (c["graphs_first_try"], c["graphs_after_feedback"]) == (2, 2)  # P1, P3 | P4, P6
    assert c["unconverted"] == 1 and c["examples_cot"] == 1 and c["examples_graph"] == 4 and c["examples"] == 5
    assert c["verify_requests"] == 5  # P1, P3, P4 (after repair), P6 twice
    r = manifest["rejections"]
    assert r["sample/wrong_answer"] == 3 + 1
    assert r["check/known_has_parents"] == 1
    assert r["check/format"] == 3  # P5's three translations fail the parser
    assert r["verify/node_label"] == 1
    assert sum(script.calls.values()) == manifest["teacher_requests_this_run"] == 9 + 9 + 5

    # The re-asks carry the failure: the parser's for P4, the verifier's for P6.
    refines = [
        b["messages"][-1]["content"]
        for b in server.requests
        if "Your previous translation" in b["messages"][-1]["content"]
    ]
    p4 = [t for t in refines if "[P4]" in t]
    assert len(p4) == 1 and "[known_has_parents] node 2 (<known>) has parents" in p4[0] and BROKEN_P4 in p4[0]
    p6 = [t for t in refines if "[P6]" in t]
    assert len(p6) == 1 and "[node_label] node 2: this is a check, label it reflect" in p6[0]
    assert all(b["model"] == "teacher" for b in server.requests)

    # verl's SFT parquet: a messages column (user, assistant); TRL's prompt-completion jsonl.
    df = pd.read_parquet(out / "train.parquet")
    assert {"messages", "extra_info"} <= set(df.columns) and len(df) == 5
    kinds = {row["extra_info"]["id"]: row["extra_info"]["kind"] for _, row in df.iterrows()}
    assert kinds == {"P1": "graph", "P3": "graph", "P4": "graph", "P5": "cot", "P6": "graph"}
    trl = [json.loads(line) for line in (out / "train.trl.jsonl").read_text().splitlines()]
    assert len(trl) == 5 and all(set(t) == {"prompt", "completion"} for t in trl)
    by_q = {t["prompt"][0]["content"].split("]")[0][1:]: t["completion"][0]["content"] for t in trl}
    assert by_q["P4"] == GOOD["P4"] and by_q["P6"] == GOOD["P6"]
    assert by_q["P5"] == "<think>\nstep by step\n</think>\n\nThe answer is \\boxed{8}."  # the verified CoT trace
    for pid in ("P1", "P3", "P4", "P6"):
        assert parse_graph(by_q[pid]).error is None
    assert trl[0]["prompt"][0]["role"] == "user" and trl[0]["completion"][0]["role"] == "assistant"
    # the RL stage's prompt (conf/data/deepscaler.yaml prompt_suffix): GRP-SFT and PASC-GRPO see one prompt
    rl_suffix = compose_train_config(["+exp=grp_math_paper"])[0].data.prompt_suffix
    assert trl[0]["prompt"][0]["content"].endswith(rl_suffix)

    # The manifest: teacher, prompt files with their hashes, outputs with their hashes.
    assert manifest["teacher"] == {"url": server.url, "model": "teacher", "started_vllm": False}
    assert set(manifest["prompts"]) == {"sample", "translate", "refine", "verify"}
    for role, entry in manifest["prompts"].items():
        assert entry["sha256"] == load_prompt(Path(entry["file"]).name).sha256
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["counts"] == c and on_disk["outputs"]["rows"] == 5
    assert manifest["problems"] == {"total": 6, "finished": 6, "from_cache": 0, "failed": 0}

    # Resume: a second run asks the teacher nothing and writes the same set.
    before = len(server.requests)
    again, code, _ = run_synth(tmp_path, server.url, "grp_math", "recipe.sample.max_retries=2")
    assert code == 0 and len(server.requests) == before and again["teacher_requests_this_run"] == 0
    assert again["problems"]["from_cache"] == 6 and again["counts"] == c
    assert again["outputs"]["sha256"] == manifest["outputs"]["sha256"]

    # A changed prompt-relevant setting is a different cache key: only then is the teacher asked again.
    third, _, _ = run_synth(tmp_path, server.url, "grp_math", "recipe.sample.max_retries=1")
    assert third["problems"]["from_cache"] == 0 and len(server.requests) > before


def test_a_gold_that_does_not_parse_costs_no_teacher_call(tmp_path, grp_teacher):
    server, _ = grp_teacher
    write_problems(tmp_path / "problems.jsonl", [{"id": "P7", "question": "[P7] ?", "answer": "))"}])
    for recipe in ("grp_math", "structured"):
        manifest, code, _ = run_synth(tmp_path, server.url, recipe, f"out_dir={tmp_path / recipe}")
        assert code == 0 and manifest["rejections"]["input/gold_does_not_parse"] == 1
        assert manifest["counts"]["examples"] == 0 and not manifest["outputs"]
    assert server.requests == []


def test_grp_cot_remainder_can_be_dropped(tmp_path, grp_teacher):
    server, _ = grp_teacher
    write_problems(tmp_path / "problems.jsonl", [p for p in PROBLEMS if p["id"] in ("P1", "P5")])
    manifest, _, out = run_synth(tmp_path, server.url, "grp_math")
    assert manifest["counts"]["examples_cot"] == 1 and manifest["counts"]["examples"] == 2
    n_requests = len(server.requests)
    manifest, _, out = run_synth(tmp_path, server.url, "grp_math", "recipe.cot_remainder.keep=false")
    c = manifest["counts"]
    assert c["unconverted"] == 1 and c["unconverted_dropped"] == 1 and "examples_cot" not in c and c["examples"] == 1
    assert len(server.requests) == n_requests  # decided on the cached results
    assert [json.loads(x)["completion"][0]["content"] for x in (out / "train.trl.jsonl").read_text().splitlines()] == [
        GOOD["P1"]
    ]


def test_grp_code_reads_verified_dataset_traces(tmp_path, grp_teacher):
    server, script = grp_teacher
    code_answer = graph_text([("known", 1, [], "add two numbers"), ("generate", 2, [1], "return a + b")], "0")
    code_answer = code_answer.replace("\\boxed{0}", "```python\ndef add(a, b):\n    return a + b\n```")

    def respond(srv, body):
        text = body["messages"][-1]["content"]
        if "You check a reasoning graph" in text:
            return 200, chat_reply('{"passed": true, "issues": []}')
        assert "You translate a verified chain-of-thought" in text and "return a + b" in text  # criteria 8-9 prompt
        assert "8. Keep every piece of code" in text
        return 200, chat_reply(code_answer)

    server.respond = respond
    rows = [
        {
            "question_id": "K1",
            "question": "[P1] Write add(a, b).",
            "r1_correctness": "True",
            "conversations": [
                {"from": "user", "value": "q"},
                {"from": "assistant", "value": "<think>x</think>\n```python\ndef add(a, b):\n    return a + b\n```"},
            ],
        },
        {
            "question_id": "K2",
            "question": "[P2] Write sub(a, b).",
            "r1_correctness": "False",
            "conversations": [{"from": "user", "value": "q"}, {"from": "assistant", "value": "wrong"}],
        },
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "kod.parquet")
    cfg = compose_synthesize_config(
        [
            "recipe=grp_code",
            f"input_file={tmp_path / 'kod.parquet'}",
            f"teacher.url={server.url}",
            "teacher.model=teacher",
            f"out_dir={tmp_path / 'out'}",
        ]
    )
    manifest, code = synthesize(cfg)
    assert code == 0 and manifest["source"]["source"] == "kodcode"
    assert manifest["rejections"]["input/trace_not_verified"] == 1
    c = manifest["counts"]
    assert c["traces_from_dataset"] == 1 and "sample_requests" not in c and c["examples_graph"] == 1


class StructuredTeacher:
    """S1: correct and tagged in both samples; S2: correct once, wrong once; S3: an unknown tag (fails the
    checker), well tagged when re-asked with feedback; S4: always wrong."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()

    def __call__(self, server: FakeChatServer, body: dict[str, Any]) -> tuple:
        pid = re.search(r"\[(S\d)\]", body["messages"][0]["content"]).group(1)
        with server.lock:
            self.calls[pid] += 1
            n = self.calls[pid]
        answer = {"S1": "7", "S2": "7" if n == 1 else "1", "S3": "7", "S4": "1"}[pid]
        if pid == "S3" and body["messages"][-1]["role"] != "user":
            return 200, chat_reply(f"The answer is \\boxed{{{answer}}}.", reasoning_content="thinking> no allowed tag")
        if pid == "S3":  # the re-ask: a plain follow-up turn
            reasoning = "<think>\n<inference> 3 + 4 = 7.\n<verify> 7 - 4 = 3.\n</think>\n\n"
            return 200, chat_reply(reasoning + f"The answer is \\boxed{{{answer}}}.")
        extra = "\n<verify> 7 - 4 = 3.\n<summarize> Done." if pid == "S1" else ""
        reasoning = f"inference> 3 + 4 = 7.{extra}"
        return 200, chat_reply(f"The answer is \\boxed{{{answer}}}.", reasoning_content=reasoning)


def test_structured_samples_checks_selection(tmp_path):
    script = StructuredTeacher()
    server = teacher_server(script)
    try:
        rows = [{"id": s, "question": f"[{s}] What is 3 + 4?", "answer": "7"} for s in ("S1", "S2", "S3", "S4")]
        write_problems(tmp_path / "problems.jsonl", rows)
        manifest, code, out = run_synth(
            tmp_path,
            server.url,
            "structured",
            "recipe.samples_per_problem=2",
            "recipe.select.keep=2",
            "recipe.format_retries=1",
        )
    finally:
        server.close()
    assert code == 0
    c, r = manifest["counts"], manifest["rejections"]
    assert c["samples"] == 8 and c["samples_correct"] == 5 and c["samples_format_ok"] == 8
    assert c["format_reasks"] == 2 and c["sample_requests"] == 10
    assert r["format/unknown_tags"] == 2 and r["sample/wrong_answer"] == 3
    assert c["problems_with_valid_sample"] == 3 and r["select/beyond_keep"] == 1 and r["select/no_valid_sample"] == 1
    # App. A.14's request: the assistant prefix verbatim, the tags of App. A.8 in a drawn order.
    first = [b for b in server.requests if "[S1]" in b["messages"][0]["content"]]
    assert first[0]["messages"][-1] == {"role": "assistant", "reasoning_content": PREFIX, "content": "", "prefix": True}
    orders = [re.findall(r"<(\w+)>", b["messages"][0]["content"].split("\n")[0]) for b in first]
    assert all(sorted(o) == sorted(TAGS) for o in orders) and orders[0] != orders[1]
    # The re-ask carries the checker's failure.
    reasks = [b for b in server.requests if b["messages"][-1]["role"] == "user" and len(b["messages"]) == 3]
    assert len(reasks) == 2 and "not among the allowed ones" in reasks[0]["messages"][-1]["content"]
    # Selection: lowest correctness first (S2: 1 of 2), then the richest tags (S1: 3 tags over S3: 2 tags).
    trl = [json.loads(line) for line in (out / "train.trl.jsonl").read_text().splitlines()]
    df = pd.read_parquet(out / "train.parquet")
    assert [e["id"] for e in df["extra_info"]] == ["S2", "S1"]
    assert trl[1]["prompt"][0]["content"] == structured_prompt("[S1] What is 3 + 4?")
    s1 = trl[1]["completion"][0]["content"]
    assert s1.startswith("<think>\n" + PREFIX + "inference> 3 + 4 = 7.") and structured_issues(s1) == []
    assert parse_structured(s1).tag_sequence == ["rephrase", "inference", "verify", "summarize"]


def test_structured_prompt_file_matches_the_project_template():
    prompt = load_prompt("structured_math.txt")
    tags = list(reversed(TAGS))
    question = "What is {trace} + 1?"  # a placeholder-like text in the question stays as written
    assert prompt.render(question=question, tags=", ".join(f"<{t}>" for t in tags)) == structured_prompt(question, tags)
    assert load_prompt("structured_prefill.txt").text == PREFIX
    assert not any(line.startswith("##") for line in load_prompt("grp_translate_math.txt").text.splitlines())


def test_prompt_render_is_single_pass():
    p = Prompt("t", 'Q: {question}\nT: {trace}\n{"id": 1}', "x")
    assert p.render(question="{trace}", trace="a") == 'Q: {trace}\nT: a\n{"id": 1}'


def test_graph_issues_name_nodes_and_agree_with_grp_format_reward():
    grader = default_grader()
    bad = graph_text(
        [("known", 1, [], "x"), ("known", 2, [1], "y"), ("aggregate", 3, [2], "z"), ("refine", 4, [1, 3], "w")], "3"
    )
    kinds = [k for k, _ in graph_issues(parse_graph(bad), ["3"], "math", grader)]
    assert kinds == ["known_has_parents", "aggregate_parents", "refine_parents"]
    rewards = graph_rewards(parse_graph(bad))
    assert rewards["R_topo"] < 1.0
    assert [k for k, _ in graph_issues(parse_graph(bad.replace("{3}", "{4}")), ["3"], "math", grader)][
        -1
    ] == "answer_mismatch"
    assert graph_issues(parse_graph("<think>\nhello\n</think>"), ["3"], "math", grader) == [
        ("format", "text outside a label block")
    ]


def test_parse_verdict():
    assert parse_verdict('ok {"passed": true, "issues": []}') == {"passed": True, "issues": []}
    assert parse_verdict('{"passed": true, "issues": [{"node": 1}]}') is None  # disagrees with its issues
    assert parse_verdict("no json") is None


@pytest.mark.parametrize("name", ["grp_math.jsonl", "structured.jsonl"])
def test_shipped_sft_fixtures_pass_the_project_checkers(name):
    rows = [json.loads(line) for line in (SAMPLES / name).read_text().splitlines()]
    assert 5 <= len(rows) <= 8
    grader = default_grader()
    for row in rows:
        assert set(row) == {"prompt", "completion"}
        assert [m["role"] for m in row["prompt"]] == ["user"] and [m["role"] for m in row["completion"]] == [
            "assistant"
        ]
        text = row["completion"][0]["content"]
        if name.startswith("grp"):
            parse = parse_graph(text)
            gold = extract_answer("</think>" + parse.answer)
            assert graph_issues(parse, [gold], "math", grader) == []
            assert graph_rewards(parse)["R_fmt"] == 1.0
        else:
            assert row["prompt"][0]["content"].startswith("Please use the following tags")
            assert structured_issues(text) == [] and extract_answer(text) is not None


def test_outputs_load_in_verl_and_trl(tmp_path, grp_teacher, byte_tokenizer):
    """The parquet goes through verl's own SFT dataset (loss on the assistant turn only); the jsonl is what
    TRL calls conversational prompt-completion data."""
    from eval_helpers import CHAT_TEMPLATE
    from trl.data_utils import is_conversational

    server, _ = grp_teacher
    write_problems(tmp_path / "problems.jsonl", [PROBLEMS[0]])
    _, _, out = run_synth(tmp_path, server.url, "grp_math")
    trl = json.loads((out / "train.trl.jsonl").read_text().splitlines()[0])
    assert is_conversational(trl)
    verl_ds = pytest.importorskip("verl.utils.dataset.multiturn_sft_dataset")
    tok = byte_tokenizer
    tok.chat_template = CHAT_TEMPLATE
    ds = verl_ds.MultiTurnSFTDataset(
        [str(out / "train.parquet")], tok, {"max_length": 4096, "truncation": "error", "pad_mode": "no_padding"}
    )
    item = ds[0]
    mask = item["loss_mask"].bool()
    trained = tok.decode(item["input_ids"][mask])
    assert GOOD["P1"] in trained and "[P1]" not in trained


# -- the error paths, as the command runs them ------------------------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SARL_DEBUG", None)
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", "sarl.data.synthesize", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("sarl.data.synthesize: ") and all(n in line for n in needles), proc.stderr


@pytest.mark.slow
def test_user_errors_exit_2_without_traceback(tmp_path):
    problems = write_problems(tmp_path / "problems.jsonl", PROBLEMS[:1])
    common = ["source=local", f"input_file={problems}", f"out_dir={tmp_path / 'out'}"]
    _one_error(run_cli(*common, "teacher.model=t", cwd=tmp_path), "teacher.url is not set")
    _one_error(run_cli("recipe=nope", *common, cwd=tmp_path), "recipe", "grp_math")
    from sarl.runtime.network import free_port

    dead = f"http://127.0.0.1:{free_port()}/v1"
    _one_error(run_cli(*common, f"teacher.url={dead}", "teacher.model=t", cwd=tmp_path), "unreachable", dead)
    (tmp_path / "taken" / "train.parquet").mkdir(parents=True)
    _one_error(
        run_cli(*common[:2], f"out_dir={tmp_path / 'taken'}", f"teacher.url={dead}", "teacher.model=t", cwd=tmp_path),
        "train.parquet is a directory",
    )
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _one_error(
        run_cli(
            "source=local",
            f"input_file={problems}",
            f"out_dir={blocker / 'sub'}",
            f"teacher.url={dead}",
            "teacher.model=t",
            cwd=tmp_path,
        ),
        "out_dir",
    )


def test_failed_problems_exit_3_and_a_rerun_retries_only_them(tmp_path, grp_teacher):
    """A teacher answer that is not JSON fails the problem for good (no transport retries here); the run
    writes what finished, lists the failure, exits 3; the rerun asks only for the failed problem."""
    server, script = grp_teacher
    write_problems(tmp_path / "problems.jsonl", [PROBLEMS[0], PROBLEMS[2]])  # P1, P3

    def broken_for_p3(srv, body):
        if "[P3]" in body["messages"][-1]["content"]:
            return 200, b"<html>bad gateway</html>"
        return script(srv, body)

    server.respond = broken_for_p3
    manifest, code, out = run_synth(tmp_path, server.url, "grp_math")
    assert code == 3 and not manifest["complete"]
    assert manifest["problems"] == {"total": 2, "finished": 1, "from_cache": 0, "failed": 1}
    assert manifest["failed"][0]["id"] == "P3" and "ChatRequestError" in manifest["failed"][0]["error"]
    assert manifest["outputs"]["rows"] == 1
    server.respond = script
    n_before = len(server.requests)
    again, code, _ = run_synth(tmp_path, server.url, "grp_math")
    assert code == 0 and again["problems"]["from_cache"] == 1 and again["outputs"]["rows"] == 2
    assert all("[P3]" in b["messages"][-1]["content"] for b in server.requests[n_before:])


def test_structured_continue_prefill_for_vllm(tmp_path):
    """prefill=continue: the App. A.14 prefix opens the assistant turn and vLLM continues it."""

    def respond(srv, body):
        assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
        assert body["messages"][-1] == {"role": "assistant", "content": "<think>\n" + PREFIX}
        return 200, chat_reply("inference> 3 + 4 = 7.\n</think>\n\nSo \\boxed{7}.")

    server = teacher_server(respond)
    try:
        write_problems(tmp_path / "problems.jsonl", [{"id": "S1", "question": "What is 3 + 4?", "answer": "7"}])
        manifest, code, out = run_synth(
            tmp_path, server.url, "structured", "recipe.prefill=continue", "recipe.samples_per_problem=1"
        )
    finally:
        server.close()
    assert code == 0 and manifest["counts"]["examples_structured"] == 1
    text = json.loads((out / "train.trl.jsonl").read_text())["completion"][0]["content"]
    assert text == "<think>\n" + PREFIX + "inference> 3 + 4 = 7.\n</think>\n\nSo \\boxed{7}."


@pytest.mark.slow
def test_teacher_url_auto_starts_and_stops_a_vllm_server(tmp_path):
    """teacher.url=auto starts `PYTHON -m vllm.entrypoints.openai.api_server --model M ...` through
    sarl.serving.server.VLLMServer (here a stand-in script on loopback) and stops it when the run ends."""
    import httpx

    argv_file = tmp_path / "argv.json"
    answers = [
        ("You check a reasoning graph", '{"passed": true, "issues": []}'),
        ("You translate", GOOD["P1"]),
        ("", "The answer is \\boxed{7}."),
    ]
    python = fake_vllm_python(tmp_path, chat=answers, argv_file=argv_file)
    write_problems(tmp_path / "problems.jsonl", [PROBLEMS[0]])
    out = tmp_path / "out"
    cfg = compose_synthesize_config(
        [
            "source=local",
            f"input_file={tmp_path / 'problems.jsonl'}",
            "teacher.url=auto",
            "teacher.model=/models/teacher-7b",
            f"teacher.server.python={python}",
            "teacher.server.startup_timeout_s=60",
            f"out_dir={out}",
        ]
    )
    manifest, code = synthesize(cfg)
    assert code == 0 and manifest["teacher"]["started_vllm"] and manifest["counts"]["examples_graph"] == 1
    args = json.loads(argv_file.read_text())
    assert args[args.index("--model") + 1] == "/models/teacher-7b"
    assert args[args.index("--served-model-name") + 1] == "/models/teacher-7b"
    port = args[args.index("--port") + 1]
    with pytest.raises(httpx.HTTPError):  # stopped with the run
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2, trust_env=False)


def test_sources_prepared_set_and_s1k(tmp_path):
    """source=prepared reads a set of `python -m sarl.data.prepare` (the question is the prompt without the
    data config's suffix); source=s1k takes the gold from the reference solution's last \\boxed{}. Composed
    after sarl.data.prepare is imported (it registers a `dataset` config group process-wide)."""
    import sarl.data.prepare  # noqa: F401
    from sarl.data.synthesize.inputs import load_problems

    suffix = " Let's think step by step and output the final answer within \\boxed{}."
    prepared = tmp_path / "data" / "aime_1983_2024"
    prepared.mkdir(parents=True)
    rows = [
        {
            "prompt": [],
            "ground_truth": ["80", "81"],
            "data_source": "aime_1983_2024",
            "extra_info": {"id": "2022-II-8", "index": 0, "user_prompt": "Find N." + suffix},
        },
    ]
    write_problems(prepared / "train.trl.jsonl", rows)
    cfg = compose_synthesize_config(
        ["source=prepared", "dataset=aime_1983_2024", f"paths.data_dir={tmp_path / 'data'}", f"out_dir={tmp_path}"]
    )
    problems, record, skipped = load_problems(cfg)
    assert [(p.id, p.question, p.golds) for p in problems] == [("2022-II-8", "Find N.", ["80", "81"])]
    assert record["stripped_suffix"] == suffix and not skipped

    s1k = [
        {"question": "Compute 2 + 2.", "solution": "Clearly $2 + 2 = \\boxed{4}$."},
        {"question": "Prove it.", "solution": "A proof without a final answer."},
    ]
    pd.DataFrame(s1k).to_parquet(tmp_path / "s1k.parquet")
    cfg = compose_synthesize_config(
        ["recipe=structured", f"input_file={tmp_path / 's1k.parquet'}", f"out_dir={tmp_path}"]
    )
    problems, record, skipped = load_problems(cfg)
    assert [(p.id, p.golds) for p in problems] == [("s1k-0", ["4"])] and skipped == {"no_gold_answer": 1}
    assert record["source"] == "s1k"


def test_grp_translator_apart_from_the_teacher(tmp_path, grp_teacher):
    """GRP App. C.1 / D: traces from one model, translation and verification by another (translator.*)."""
    server, script = grp_teacher
    translator_script = GRPTeacher()
    translator = teacher_server(translator_script)
    translator.files["/v1/models"] = json.dumps({"data": [{"id": "translator"}]})
    try:
        write_problems(tmp_path / "problems.jsonl", [PROBLEMS[0]])
        manifest, code, _ = run_synth(
            tmp_path, server.url, "grp_math", f"translator.url={translator.url}", "translator.model=translator"
        )
    finally:
        translator.close()
    assert code == 0 and manifest["counts"]["examples_graph"] == 1
    assert dict(script.calls) == {("P1", "sample"): 1}
    assert dict(translator_script.calls) == {("P1", "translate"): 1, ("P1", "verify"): 1}
    assert all(b["model"] == "translator" for b in translator.requests)
    assert manifest["translator"] == {"url": translator.url, "model": "translator"}
    assert manifest["teacher_requests_this_run"] == 3
