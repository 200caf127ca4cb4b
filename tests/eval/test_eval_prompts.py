"""Evaluation prompts (conf/eval/prompt/, eval.prompts; docs/decisions.md §3.1 "Prompts"): each protocol asks its
benchmarks with its paper's prompt, applied to the raw question read back from the prepared rows, grades the answer
that prompt asks for, prints it in the dry run, and asks every `*_paper` row's benchmarks as the row was trained
unless decisions §3.1 lists the row, the benchmarks and why."""

from __future__ import annotations

import json
import re
from fnmatch import fnmatch
from pathlib import Path

import pytest
from eval_helpers import FakeChatServer, chat_reply
from omegaconf import OmegaConf

from eval import run as eval_run
from eval.config import compose_eval_config
from eval.prompts import (
    Template,
    data_config,
    data_template,
    load_templates,
    template_names,
)
from eval.protocol import format_plan, load_benchmarks, resolve_plan
from sarl.checking.grading.extract import extract_answer_line
from sarl.runtime.errors import UserError
from sarl.runtime.files import read_jsonl, resolve_path
from sarl.runtime.rows import protocols_of_table, row_protocols

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "docs" / "decisions.md"
EVOL_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

# Source rows in each set's own columns, as the Hub gives them (conf/data/<name>.yaml `fields`).
SOURCES = {
    "math500": [
        {"unique_id": "test/a/1.json", "problem": "What is $2+3$?", "answer": "5", "subject": "A", "level": 1},
        {"unique_id": "test/a/2.json", "problem": "Solve {x}: x-1=0.", "answer": "1", "subject": "A", "level": 2},
    ],
    "drop": [
        {
            "query_id": "q1",
            "passage": "Tom scored 3 goals.",
            "question": "How many goals?",
            "answers_spans": {"spans": ["3"], "types": ["number"]},
            "section_id": "s1",
        },
    ],  # fmt: skip
    "lsat_ar": [
        {
            "query": "Q: Which one is first? Answer Choices: (A)x (B)y A: Among A through E, the answer is",
            "choices": ["(A)red", "(B)blue", "(C)green", "(D)gray", "(E)pink"],
            "gold": [1],
        },
        {
            "query": "Q: Which one is last? Answer Choices: ...",
            "choices": ["(A)a", "(B)b", "(C)c", "(D)d", "(E)e"],
            "gold": [4],
        },
    ],  # fmt: skip
    "gpqa_diamond": [
        {
            "Record ID": "r1",
            "Question": "Which particle is charged?",
            "Correct Answer": "electron",
            "Incorrect Answer 1": "neutron",
            "Incorrect Answer 2": "photon",
            "Incorrect Answer 3": "neutrino",
            "Subdomain": "Physics",
            "High-level domain": "Physics",
        },
    ],  # fmt: skip
}


def prepare(data_dir: Path, name: str) -> list[dict]:
    """The set built as `python -m sarl.data.prepare dataset=NAME` builds it, from SOURCES: its records."""
    from sarl.data import benchmark_sets  # noqa: F401  (registers the choice and reading builders)
    from sarl.data.build import BUILDERS, Steps
    from sarl.data.writers import write_parquet

    spec = data_config(name)
    built = BUILDERS[spec["builder"]](spec, SOURCES[name], Steps(name), False)
    records = built.splits[spec["split"]]
    write_parquet(records, data_dir / name / "test.parquet")
    return records


def loaded(data_dir: Path, protocol: str, *overrides: str) -> dict:
    cfg = compose_eval_config(["ckpt=x", f"protocol={protocol}", f"paths.data_dir={data_dir}", *overrides])
    plan = resolve_plan(cfg)
    return {b.label: b for b in load_benchmarks(cfg, plan.entries)}


def test_every_template_file_loads_and_the_structured_one_is_the_training_prompt():
    """conf/eval/prompt/structured.yaml writes exactly what sarl.formats.tags trains with (App. A.8), and
    reads back the question of a prompt with a per-row tag draw (App. A.4)."""
    from sarl.formats.tags import TAGS, randomized_prompt, structured_prompt

    assert {"sarl", "evol_rl", "structured"} <= set(template_names())
    for name in template_names():
        assert load_templates(name)["math"].slots().count("question") == 1, name
    tagged = load_templates("structured")
    assert tagged["math"].tags == TAGS
    question = "If {x} + 1 = 3, what is x?"
    assert tagged["math"].render(question) == [{"role": "user", "content": structured_prompt(question)}]
    drawn = [{"role": "user", "content": randomized_prompt(question, seed=0, key="r7")}]
    assert tagged["math"].question_of(drawn) == question
    choice = tagged["choice"].render("Which?", ["red", "blue", "green", "gray", "pink"])[0]["content"]
    assert "\nWhich?\n\nA) red\nB) blue\nC) green\nD) gray\nE) pink\n\nPlease reason step by step, and answer" in choice
    assert choice.endswith("'Answer: $LETTER' (without quotes) where LETTER is one of ABCDE.")
    assert choice.startswith(structured_prompt("Which?").split("\n")[0] + "\n")  # the same 23 tags, in order


def test_a_malformed_template_is_a_one_line_error(tmp_path, monkeypatch):
    import eval.prompts as prompts

    monkeypatch.setattr(prompts, "PROMPT_DIR", tmp_path)
    (tmp_path / "bad.yaml").write_text("system: null\nmath: {user: 'no question here'}\n")
    with pytest.raises(UserError, match=r"conf/eval/prompt/bad.yaml: math.user has no \{question\}"):
        load_templates("bad")
    (tmp_path / "bad.yaml").write_text("system: null\nmath: {user: '{question}', answer: letter}\n")
    with pytest.raises(UserError, match=r"math.answer='letter'; choose one of: boxed, answer_line"):
        load_templates("bad")
    with pytest.raises(UserError, match=r"prompt 'nope': conf/eval/prompt/nope.yaml does not exist"):
        load_templates("nope")


def test_the_sarl_template_is_the_prepared_prompt_and_the_data_templates_read_back_their_questions(tmp_path):
    """conf/eval/prompt/sarl.yaml is what the benchmarks are prepared with; the template of each set's data config
    (`data_template`) reads back the question of every row the builders write."""
    sarl = load_templates("sarl")
    assert data_template(data_config("math500")) == sarl["math"]
    assert data_template(data_config("gpqa_diamond")) == sarl["choice"]
    for name in SOURCES:
        for rec in prepare(tmp_path, name):
            t = data_template(data_config(name))
            question = t.question_of(rec["prompt"], rec["extra_info"].get("options"))
            assert question is not None, (name, rec["prompt"])
            assert t.render(question, rec["extra_info"].get("options")) == rec["prompt"]


def test_protocols_ask_the_raw_question_with_their_papers_prompt(tmp_path):
    for name in SOURCES:
        prepare(tmp_path, name)
    evol = loaded(tmp_path, "evol_rl", "only=[math500,gpqa_diamond]")
    asked = evol["math500"].problems[1].messages
    assert asked == [{"role": "system", "content": EVOL_SYSTEM}, {"role": "user", "content": "Solve {x}: x-1=0."}]
    gpqa = evol["gpqa_diamond"].problems[0]
    assert gpqa.messages[0] == {"role": "system", "content": EVOL_SYSTEM}
    options = "\n".join(f"({letter}) {o}" for letter, o in zip("ABCD", gpqa.extra_info["options"]))
    assert gpqa.messages[1]["content"] == (
        f"Which particle is charged?\n\n{options}\n\n"
        "Give the letter of the correct option (A, B, C or D) as the final answer."
    )
    tagged = loaded(tmp_path, "structured_temperature", "only=[math500,lsat_ar]", "protocol.sweep.temperature=[0.6]")
    math = tagged["math500/temperature=0.6"].problems[0].messages
    assert math == load_templates("structured")["math"].render("What is $2+3$?")
    lsat = tagged["lsat_ar/temperature=0.6"].problems[0].messages[0]["content"]
    assert "\nWhich one is first?\n\nA) red\nB) blue\nC) green\nD) gray\nE) pink\n\n" in lsat
    drop = loaded(tmp_path, "structured", "only=[drop]", "protocol.sweep.max_tokens=[512]")["drop/max_tokens=512"]
    assert (
        "\nPassage: Tom scored 3 goals.\n\nQuestion: How many goals?\nPlease reason"
        in drop.problems[0].messages[0]["content"]
    )
    as_prepared = loaded(tmp_path, "evol_rl", "only=[math500]", "prompt=prepared")["math500"].problems[0].messages
    assert as_prepared == [
        {"role": "user", "content": "What is $2+3$? " + data_config("math500")["prompt_suffix"].strip()}
    ]


def test_a_row_its_data_config_did_not_build_is_a_one_line_error(tmp_path):
    prepare(tmp_path, "math500")
    import pyarrow.parquet as pq

    path = tmp_path / "math500" / "test.parquet"
    rows = pq.read_table(path).to_pylist()
    rows[1]["prompt"] = [{"role": "user", "content": "Solve it, another way."}]
    from sarl.data.writers import write_parquet

    write_parquet(rows, path)
    with pytest.raises(UserError, match=r"benchmark 'math500', problem 'test/a/2.json': its prompt is not the one "):
        loaded(tmp_path, "evol_rl", "only=[math500]")
    rows[1]["extra_info"]["question"] = "Solve it."  # a raw question in the row is read as it is
    write_parquet(rows, path)
    assert loaded(tmp_path, "evol_rl", "only=[math500]")["math500"].problems[1].messages[1]["content"] == "Solve it."


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("<think>\nAnswer: A\n</think>\nSo.\nAnswer: C", "C"),
        ("**Answer:** (B)", "B"),
        ("Final Answer: $D$", "D"),
        ("Answer: \\boxed{E}", "E"),
        ("Answer: Because it is red.", None),
        ("<think>\nAnswer: A", None),  # never closed: no final answer
        ("The answer is \\boxed{A}", None),  # the template asks for "Answer: X"
        ("Answer: A\nAnswer: B\nAnswer: C\nAnswer: D", "D"),  # every letter listed: only the last one counts
        ("Answer: ABCD", None),  # all letters in one: no answer
        ("Answer: A, B, C or D", None),  # a hedge over the options: no answer
        ("Answer: A/B", None),
        ("Answer: (A) and (B)", None),
        ("Answer: \\boxed{A} or \\boxed{B}", None),
        ("Answer: B (I think)", "B"),  # what follows one letter is not another option
        ("Answer: C, because x is large", "C"),
    ],
)
def test_answer_line_reads_the_last_answer_letter(text, letter):
    assert extract_answer_line(text) == letter


def test_a_multiple_choice_template_is_graded_on_its_answer_letter(tmp_path):
    """protocol=structured on LSAT-AR: the server answers problem 1 with "Answer: <gold>" and problem 2 with the
    gold letter boxed but no answer line, so pass@1 is 50 at every seed; the prompt it saw is App. A.8's."""
    data = tmp_path / "data"
    records = prepare(data, "lsat_ar")
    gold = {r["extra_info"]["options"][0]: r["reward_model"]["ground_truth"][0] for r in records}
    seen = []

    def respond(server, body):
        content = body["messages"][-1]["content"]
        seen.append(content)
        first = next(o for o in gold if f"A) {o}\n" in content)
        text = f"Answer: {gold[first]}" if first == "red" else f"\\boxed{{{gold[first]}}}"
        return 200, chat_reply(f"<think>\nWork.\n</think>\n\n{text}", "stop", {"completion_tokens": 9})

    server = FakeChatServer(respond)
    args = ["ckpt=tiny", "model_kind=trained", "protocol=structured", "only=[lsat_ar]",
            "protocol.sweep.max_tokens=[256]", "generator=openai", f"generator.url={server.url}",
            f"paths.root={tmp_path}", f"paths.data_dir={data}",
            f"run_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}", "structure.enabled=false",
            "logger=none"]  # fmt: skip
    try:
        assert eval_run.main(args) == 0
    finally:
        server.close()
    assert len(seen) == 2 * 3 and all("where LETTER is one of ABCDE." in c for c in seen)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    metrics = results["math"]["benchmarks"]["lsat_ar/max_tokens=256"]["metrics"]
    assert metrics["pass@1_per_seed"] == [50.0, 50.0, 50.0]
    assert results["protocol"]["benchmarks"][0]["prompt"]["answer"] == "answer_line"
    assert all(c.startswith("Please use the following tags") for c in seen)  # App. A.8's tagged template


TAG_SENTENCE = "Please use the following tags at the beginning of each sentence in your reasoning: {tags}.\n"


def test_the_untagged_template_is_the_tagged_one_without_its_tag_sentence():
    """conf/eval/prompt/structured_plain.yaml, how Structured Reasoning's untrained models are asked, is App. A.8's
    template with the tag instruction removed and nothing else changed (decisions §3.1 "Untrained models")."""
    tagged, plain = load_templates("structured"), load_templates("structured_plain")
    assert set(tagged) == set(plain) == {"math", "choice"}
    for part in tagged:
        t, p = tagged[part], plain[part]
        assert t.user == TAG_SENTENCE + p.user and not p.tags and "tag" not in p.user
        assert (t.system, t.answer, t.option, t.separator) == (p.system, p.answer, p.option, p.separator)


def test_a_model_no_training_run_wrote_is_asked_as_the_paper_asked_its_untrained_models(tmp_path):
    """protocol=structured on MATH500: a Hub id (model_kind auto -> base) is asked without the tags, a checkpoint
    a sarl.train run wrote (its meta.json above it) with them, and model_kind=base|trained overrides the guess;
    results.json says which. The served model's name is the checkpoint (generator=openai)."""
    data = tmp_path / "data"
    prepare(data, "math500")
    run = tmp_path / "runs" / "lcs_paper" / "2026-01-01_00-00-00"
    (run / "final").mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"experiment": "lcs_paper"}))
    seen: list[str] = []

    def respond(server, body):
        seen.append(body["messages"][-1]["content"])
        return 200, chat_reply("<think>\nWork.\n</think>\n\n\\boxed{5}", "stop", {"completion_tokens": 9})

    server = FakeChatServer(respond)
    common = ["protocol=structured", "only=[math500]", "protocol.sweep.max_tokens=[256]", "generator=openai",
              f"generator.url={server.url}", f"paths.root={tmp_path}", f"paths.data_dir={data}",
              f"cache_dir={tmp_path / 'cache'}", "structure.enabled=false", "logger=none"]  # fmt: skip
    kinds = {}
    try:
        for label, extra in [("hub", ["ckpt=deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]),
                             ("run", [f"ckpt={run / 'final'}"]),
                             ("run_as_base", [f"ckpt={run / 'final'}", "model_kind=base"]),
                             ("hub_as_trained", ["ckpt=deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
                                                 "model_kind=trained"])]:  # fmt: skip
            seen.clear()
            assert eval_run.main([*common, *extra, f"run_dir={tmp_path / label}"]) == 0, label
            results = json.loads((tmp_path / label / "results.json").read_text())
            assert results["run"]["model_kind"] == results["protocol"]["model_kind"]
            assert results["protocol"]["prompt_by_model_kind"] == ["math500"]
            kinds[label] = (results["run"]["model_kind"], {c.startswith("Please use the following tags") for c in seen})
    finally:
        server.close()
    assert kinds == {"hub": ("base", {False}), "run": ("trained", {True}), "run_as_base": ("base", {False}),
                     "hub_as_trained": ("trained", {True})}  # fmt: skip
    plain = load_templates("structured_plain")["math"].render("What is $2+3$?")[-1]["content"]
    assert plain == "What is $2+3$?\nPlease reason step by step, and put your final answer within \\boxed{ }."


def test_the_dry_run_prints_each_benchmarks_prompt(tmp_path):
    for protocol, expected in [
        ("evol_rl", [f"    system: {EVOL_SYSTEM}",
                     "  math500, aime24, aime25, amc23: conf/eval/prompt/evol_rl.yaml (math)"]),
        ("structured", ["  lsat_ar, mmlu: conf/eval/prompt/structured.yaml (choice)",
                        "    answer: the letter of the last 'Answer: X' after the thinking"]),
        ("sarl", ["  aime25, amc23, math500, minerva_math: as prepared (conf/data/<benchmark>.yaml)",
                  "    user:   {question} Let's think step by step and output the final answer within \\boxed{}."]),
    ]:  # fmt: skip
        out = format_plan(resolve_plan(compose_eval_config(["ckpt=x", f"protocol={protocol}"])), tmp_path)
        lines = out.splitlines()
        assert all(line in lines for line in expected), (protocol, out)
        assert lines[1].split()[-1] == "prompt"


# -- every paper row is evaluated with its training prompt -------------------------------------------------------

EXCEPTIONS = re.compile(r"<!-- prompt-exceptions: begin -->\n(.*?)<!-- prompt-exceptions: end -->", re.DOTALL)
ENTRY = re.compile(r"^- ((?:`[\w*]+`(?:, )?)+) on ((?:`\w+`(?:, )?)+): (.{40,})$", re.DOTALL)


def prompt_exceptions() -> dict[tuple[str, str], str]:
    """decisions §3.1's list: (row or row pattern, benchmark) -> why the row is evaluated with another prompt than it
    trains with (a pattern such as `evol_rl*_paper` names every row it matches, fnmatch)."""
    block = EXCEPTIONS.search(DECISIONS.read_text(encoding="utf-8"))
    assert block, "docs/decisions.md §3.1 has no <!-- prompt-exceptions: begin/end --> list"
    out = {}
    for item in re.split(r"\n(?=- )", block.group(1).strip()):
        found = ENTRY.match(" ".join(item.split()))
        assert found, f"decisions §3.1 prompt exception not `- `row`, ... on `bench`, ...: reason`: {item[:80]}"
        for row in re.findall(r"`([\w*]+)`", found.group(1)):
            for bench in re.findall(r"`(\w+)`", found.group(2)):
                out[(row, bench)] = found.group(3)
    return out


def training_templates(row: str) -> tuple[str, list[Template] | list[list[dict]]]:
    """The row's setting and its training prompt: the template its data config builds, or (a set of shipped
    traces, whose prompts are in their file) those prompts."""
    from sarl.launch.compose import compose_train_config

    cfg, _ = compose_train_config([f"+exp={row}"])
    data = OmegaConf.to_container(cfg.data, resolve=False)
    built = data_template(data) if data.get("builder") else None
    if built is not None:
        return str(data["setting"]), [built]
    files = str(data.get("sft_files") or "")
    assert files.startswith("pkg://"), f"{row}: data {data['name']} has no builder and no shipped prompts to read"
    return str(data["setting"]), [r["prompt"] for r in read_jsonl(resolve_path(files), files)]


def asks_as_trained(trained: list, asked: Template | None) -> bool:
    if asked is None:
        return False
    if isinstance(trained[0], Template):
        return trained[0].form() == asked.form()
    return all(asked.question_of(messages) is not None for messages in trained)  # every shipped prompt is its


def test_every_paper_row_is_evaluated_with_its_training_prompt():
    """For every conf/exp/*_paper.yaml row, each protocol of its tables' paper (no table: its note's) asks each
    benchmark of the row's setting (math or code) with the row's training prompt, unless decisions §3.1 lists that
    row and benchmark with a reason; and every listed pair is one that needs it (no stale entry)."""
    exceptions = prompt_exceptions()
    mismatched, checked = set(), set()
    rows = sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*_paper.yaml"))
    assert len(rows) >= 15
    for row in rows:
        paper = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "exp" / f"{row}.yaml").paper)
        protocols = row_protocols(paper)  # a row of no table (a figure): its note's paper ("EVOL-RL App. D.4, ...")
        assert protocols, (
            f"{row}: none of its tables {paper['tables']} is of a paper with a protocol (conf/eval/protocol)"
        )
        setting, trained = training_templates(row)
        for protocol in protocols:
            plan = resolve_plan(compose_eval_config(["ckpt=x", f"protocol={protocol}"]), "trained")
            for e in plan.entries:
                if e.kind != setting or (row, e.name) in checked:
                    continue
                checked.add((row, e.name))
                if not asks_as_trained(trained, e.prompt.form if e.prompt else None):
                    mismatched.add((row, e.name))
    excused = {(pattern, bench): {(r, b) for r, b in mismatched if b == bench and fnmatch(r, pattern)}
               for pattern, bench in exceptions}  # fmt: skip
    unexplained = sorted(mismatched - set().union(*excused.values()))
    assert not unexplained, (
        f"evaluated with another prompt than trained, with no reason in decisions §3.1: {unexplained}"
    )
    stale = sorted(pair for pair, pairs in excused.items() if not pairs)
    assert not stale, f"decisions §3.1 lists these as evaluated with another prompt, but they are not: {stale}"
    assert ("evol_rl_paper", "math500") in checked and ("lcs_paper", "aime24") in checked


def test_rows_map_to_their_papers_protocols():
    assert row_protocols({"tables": [{"table": "SARL Table 2"}, {"table": "SARL Table 4"}]}) == ["sarl"]
    assert row_protocols({"tables": [], "note": "EVOL-RL App. D.4, Fig. 6"}) == ["evol_rl"]
    assert row_protocols({"tables": [], "note": "not a row of a paper table: the CPU smoke run"}) == []
    assert row_protocols(None) == []
    assert protocols_of_table("EVOL-RL Table 1") == ["evol_rl"]
    assert protocols_of_table("Structured Reasoning Table 11") == ["structured", "structured_temperature"]
    assert protocols_of_table("GRP Table 2") == ["grp"]
    assert protocols_of_table("SARL Table 2") == ["sarl"]
    assert protocols_of_table("Nobody's Table 1") == []


BASE_PROMPTS = re.compile(r"<!-- base-prompts: begin -->\n(.*?)<!-- base-prompts: end -->", re.DOTALL)


def base_prompt_decisions() -> set[tuple[str, str]]:
    """decisions §3.1's list of (protocol, benchmark) asked otherwise for untrained models, each with a reason."""
    block = BASE_PROMPTS.search(DECISIONS.read_text(encoding="utf-8"))
    assert block, "docs/decisions.md §3.1 has no <!-- base-prompts: begin/end --> list"
    out = set()
    for item in re.split(r"\n(?=- )", block.group(1).strip()):
        found = ENTRY.match(" ".join(item.split()))
        assert found, f"decisions §3.1 base prompt entry not `- `protocol`, ... on `bench`, ...: reason`: {item[:80]}"
        out |= {(p, b) for p in re.findall(r"`(\w+)`", found.group(1)) for b in re.findall(r"`(\w+)`", found.group(2))}
    return out


def test_untrained_models_are_asked_as_each_paper_asked_them():
    """The base-model case of the test above. Per protocol, the benchmarks asked otherwise for an untrained model
    (model_kind=base) are exactly those decisions §3.1 lists, and the plan names them; for every paper row, the
    model it starts from is asked by its paper's protocols with the row's own prompt, except there, where the
    prompt is the row's without the tags (Structured Reasoning Table 17, "Without Guidance")."""
    listed, differs = base_prompt_decisions(), set()
    for protocol in sorted(p.stem for p in (ROOT / "conf" / "eval" / "protocol").glob("*.yaml")):
        cfg = compose_eval_config(["ckpt=x", f"protocol={protocol}"])
        trained, base = resolve_plan(cfg, "trained"), resolve_plan(cfg, "base")
        assert (trained.model_kind, base.model_kind) == ("trained", "base") and trained.by_kind == base.by_kind
        for t, b in zip(trained.entries, base.entries, strict=True):
            t_form, b_form = (e.prompt.form if e.prompt else None for e in (t, b))
            if (t_form.form() if t_form else None) != (b_form.form() if b_form else None):
                differs.add((protocol, t.name))
                assert t_form.tags and not b_form.tags and t_form.user == TAG_SENTENCE + b_form.user, (protocol, t)
        assert {b for p, b in differs if p == protocol} == set(base.by_kind), protocol
    assert differs == listed, (
        f"asked otherwise for base models: {sorted(differs)}; decisions §3.1 lists {sorted(listed)}"
    )
    for row in sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*_paper.yaml")):
        from sarl.runtime.rows import _entries

        tables = {r.table for r in _entries(ROOT / "conf" / "exp" / f"{row}.yaml")[0]}
        if any(t.startswith("Structured Reasoning") for t in tables):
            plan = resolve_plan(compose_eval_config(["ckpt=x", "protocol=structured"]), "base")
            assert all(not e.prompt.form.tags for e in plan.entries), row  # DS-Distill: no tags (Table 17)
