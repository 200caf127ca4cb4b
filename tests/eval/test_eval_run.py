"""`python -m eval.run` end to end on the fixture benchmarks: the tiny chat model answers (transformers
in-process, or a real vLLM CPU server), math-verify grades after the thinking part, MiniLM gives the structure
statistics, a loopback judge scores WildBench; resume after an interruption; results files, Δ columns, W&B."""

import json
import math
import shutil
from pathlib import Path

import pytest
from eval_helpers import (
    FIXTURES,
    FakeChatServer,
    chat_reply,
    fixture_judge,
    fixture_rows,
    response_token_count,
    write_benchmarks,
)
from testkit import vllm_python_or_skip

from eval import run as eval_run
from eval.config import BACKENDS, compose_eval_config, generator_name, run_name
from eval.data import load_benchmark
from eval.generate import TransformersGenerator
from eval.protocol import Benchmark, sampling_config
from eval.scoring import judge_all
from sarl.runtime.errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, UserError
from sarl.runtime.files import CONF_DIR

pytestmark = pytest.mark.slow

# What the tiny model's answers are worth (tests/fixtures/eval/benchmarks.jsonl), with max_tokens=48:
# toy_aime: 2+2 -> 4 (right), 3*3 -> 6 (wrong): 50 %;
# toy_math: 10/2 -> 5 (right), one half -> \frac{1}{2} vs 0.5 (right), count to ten -> truncated, no answer: 66.67 %.
EXPECTED_AVG = {"toy_aime": 50.0, "toy_math": 200.0 / 3}
# WildBench (judge scores in the fixture; the empty answer of wb-6 scores 1 without a judge call):
# Creative (wb-1 8, wb-6 1) -> -10; Planning (wb-2 7, wb-3 9) -> 60; Math (wb-3 9) -> 80; Info (wb-4 6) -> 20;
# Code (wb-5 5) -> 0; WB = (0.5*-10 + 1.25*60 + 80 + 0.75*20 + 1.25*0) / 4.75 = 165 / 4.75.
EXPECTED_CATEGORIES = {
    "Creative Tasks": -10.0,
    "Planning & Reasoning": 60.0,
    "Math & Data Analysis": 80.0,
    "Information/Advice seeking": 20.0,
    "Coding & Debugging": 0.0,
}
EXPECTED_WB = 165 / 4.75
MAX_TOKENS = 48


def overrides(model, data_dir, root, judge_url, **extra):
    args = {
        "ckpt": model,
        "name": "tiny",
        "paths.root": str(root),
        "paths.data_dir": str(data_dir),
        "run_dir": str(root / "run"),
        "cache_dir": str(root / "cache"),
        "benchmarks.math": "[toy_aime,toy_math]",
        "benchmarks.wildbench": "[toy_wildbench]",
        "base_results": str(FIXTURES / "base_results.json"),
        "sampling.n": 2,
        "sampling.max_tokens": MAX_TOKENS,
        "generator.backend": "transformers",
        "generator.transformers.device": "cpu",
        "generator.transformers.dtype": "float32",
        "judge.url": judge_url,
        "judge.model": "test-judge",
        "judge.template": str(FIXTURES / "judge_template.md"),
        "judge.backoff_s": 0.01,
        "judge.max_retries": 1,
        "logger": "none",
        "torch_threads": 1,
        **extra,
    }
    return [f"{k}={v}" for k, v in args.items()]


def read_results(root):
    run = Path(root) / "run"
    return (
        json.loads((run / "results.json").read_text()),
        (run / "results.md").read_text(),
        [json.loads(line) for line in (run / "problems.jsonl").read_text().splitlines()],
    )


@pytest.fixture(scope="module")
def judge_server():
    server = FakeChatServer(fixture_judge())
    yield server
    server.close()


@pytest.fixture(scope="module")
def full_run(tiny_chat_model, tmp_path_factory, judge_server):
    """One uninterrupted evaluation with the transformers back end."""
    import torch

    root = tmp_path_factory.mktemp("full_run")
    data = root / "data"
    write_benchmarks(data, fixture_rows())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = eval_run.main(overrides(tiny_chat_model, data, root, judge_server.url))
    finally:
        torch.set_num_threads(threads)
    return code, root, data


def check_math(results, model_dir):
    benches = results["math"]["benchmarks"]
    for name, expected in EXPECTED_AVG.items():
        assert benches[name]["avg_at_k"] == pytest.approx(expected)
        assert benches[name]["k"] == 2
    overall = results["math"]["overall"]
    assert overall["avg"] == pytest.approx((50.0 + 200 / 3) / 2)
    assert overall["base_avg"] == pytest.approx(45.0)
    assert overall["delta_pct"] == pytest.approx((58.33 - 45.0) / 45.0 * 100)
    rows = {r["id"]: r for r in fixture_rows()}
    aime_tokens = [response_token_count(model_dir, rows[i]["response"]) for i in ("aime-1", "aime-2")]
    assert benches["toy_aime"]["mean_tokens"] == pytest.approx(sum(aime_tokens) / 2)
    math_tokens = [response_token_count(model_dir, rows[i]["response"]) for i in ("math-1", "math-2")] + [MAX_TOKENS]
    assert benches["toy_math"]["mean_tokens"] == pytest.approx(sum(math_tokens) / 3)
    assert benches["toy_aime"]["truncation_rate"] == 0.0
    assert benches["toy_math"]["truncation_rate"] == pytest.approx(100 / 3)
    assert benches["toy_math"]["no_answer_rate"] == pytest.approx(100 / 3)
    assert overall["delta_tokens"] == pytest.approx(overall["mean_tokens"] - 45.0)


def check_wildbench(results):
    wb = results["wildbench"]["benchmarks"]["toy_wildbench"]
    assert wb["categories"] == pytest.approx(EXPECTED_CATEGORIES)
    assert wb["wb_score"] == pytest.approx(EXPECTED_WB)
    assert wb["delta_pct"] == pytest.approx((round(EXPECTED_WB, 2) - 30.0) / 30.0 * 100)
    assert (wb["n_tasks"], wb["n_samples"], wb["n_judged"], wb["n_empty"], wb["n_failed"]) == (6, 6, 5, 1, 0)


def test_full_evaluation(full_run, judge_server, tiny_chat_model):
    code, root, _ = full_run
    assert code == 0
    results, markdown, problems = read_results(root)
    assert results["complete"] is True
    check_math(results, tiny_chat_model)
    check_wildbench(results)
    # the judge saw each non-empty final answer once, without its thinking; the empty one was not sent
    prompts = [b["messages"][0]["content"] for b in judge_server.requests]
    assert len(prompts) == 5
    assert not any("<think>" in p or "</think>" in p for p in prompts)
    assert any("<<<Soft rain on the roof, a quiet poem.>>>" in p for p in prompts)
    assert any("USER: I need a trip plan.\n\nASSISTANT: Where to?" in p for p in prompts)
    # structure statistics of every response
    by_id = {(p["benchmark"], p["problem_id"]): p for p in problems}
    assert len(problems) == 11
    aime1 = by_id[("toy_aime", "aime-1")]
    assert aime1["n_correct"] == 2 and aime1["answers"] == ["4", "4"]
    assert all(s["structure"]["n_steps"] == 3 and s["structure"]["failed"] is None for s in aime1["samples"])
    count = by_id[("toy_math", "math-3")]["samples"]
    assert all(s["truncated"] and s["answer"] is None and s["structure"]["truncated"] for s in count)
    for summary in [*results["math"]["benchmarks"].values(), *results["wildbench"]["benchmarks"].values()]:
        st = summary["structure"]
        assert st["n"] == summary["n_samples"] and st["n_failed"] == 0
        assert 0.0 <= st["sr_mean"] <= 1.0 and st["steps_mean"] >= 1
    # the tables
    assert "| tiny | 50.00 | 66.67 | 58.33 (+29.6%) |" in markdown
    assert "| base-toy | 40.00 | 50.00 | 45.00 |" in markdown
    assert f"| tiny | -10.00 | 60.00 | 80.00 | 20.00 | 0.00 | {EXPECTED_WB:.2f} (+15.8%) |" in markdown
    assert "Response length in tokens (SARL Table 8)" in markdown
    assert "| toy_aime | 4 | 0.0 | 0.0 | 0.250 (+25.0%) |" in markdown  # SR 0.25 vs the base's 0.2 (Fig. 2a)
    assert (root / "run" / "config.yaml").exists() and (root / "run" / "eval.log").exists()
    log = (root / "run" / "eval.log").read_text()
    assert "torch: 1 intra-op thread (torch_threads=1), 1 inter-op" in log
    assert f"generator: loading transformers on {tiny_chat_model} ..." in log  # the silent load says it runs
    assert f"generator: loading transformers on {tiny_chat_model}: done in " in log
    assert json.loads((root / "run" / "meta.json").read_text())["git_commit"]


def test_interrupted_evaluation_resumes_where_it_stopped(
    full_run, tiny_chat_model, tmp_path, monkeypatch, one_torch_thread
):
    """Interrupt generation after 4 responses, then rerun with a judge failing one task (exit 3, recorded as
    failed), then rerun with a good judge: only what is missing is redone, and the results equal an
    uninterrupted run's."""
    _, full_root, data = full_run
    calls = []
    real_one = TransformersGenerator._one

    def interrupted(self, request):
        if len(calls) == 4:
            raise KeyboardInterrupt
        calls.append(request.key)
        return real_one(self, request)

    monkeypatch.setattr(TransformersGenerator, "_one", interrupted)
    judge = FakeChatServer(fixture_judge())
    try:
        assert eval_run.main(overrides(tiny_chat_model, data, tmp_path, judge.url)) == EXIT_INTERRUPTED
        assert len(calls) == 4 and judge.requests == []
        assert len(list((tmp_path / "cache").glob("fp-*/**/*.json"))) == 4  # one file per finished sample

        monkeypatch.setattr(TransformersGenerator, "_one", lambda self, r: (calls.append(r.key), real_one(self, r))[1])
        good = fixture_judge()

        def flaky(server, body):  # wb-3's judgement comes back without a score
            if "The mean is 4." in body["messages"][0]["content"]:
                return 200, chat_reply("I cannot decide.")
            return good(server, body)

        judge.respond = flaky
        assert eval_run.main(overrides(tiny_chat_model, data, tmp_path, judge.url)) == EXIT_INCOMPLETE
        assert len(calls) == 2 * 5 + 6  # every response once: 4 before the interruption, 12 now
        assert len(set(calls)) == len(calls)
        results, markdown, _ = read_results(tmp_path)
        assert results["complete"] is False and "1 WildBench judgements failed" in results["incomplete_reason"]
        wb = results["wildbench"]["benchmarks"]["toy_wildbench"]
        assert wb["n_failed"] == 1 and wb["n_judged"] == 4
        assert "Incomplete" in markdown
        n_judge_requests = len(judge.requests)

        judge.respond = good
        assert eval_run.main(overrides(tiny_chat_model, data, tmp_path, judge.url)) == 0
        assert len(calls) == 16  # nothing generated again
        assert len(judge.requests) == n_judge_requests + 1  # only the failed judgement is asked again
    finally:
        judge.close()
    resumed, _, resumed_problems = read_results(tmp_path)
    full, _, full_problems = read_results(full_root)
    assert resumed["complete"] is True
    assert resumed["math"] == full["math"]
    assert resumed["wildbench"] == full["wildbench"]
    assert resumed_problems == full_problems


def test_fully_cached_run_logs_to_wandb_without_loading_the_model(full_run, tiny_chat_model, monkeypatch, tmp_path):
    _, root, data = full_run

    def no_model(*a, **k):
        raise AssertionError("a fully cached evaluation must not load the model")

    monkeypatch.setattr(TransformersGenerator, "__init__", no_model)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    judge = FakeChatServer(fixture_judge())
    try:
        args = overrides(tiny_chat_model, data, root, judge.url, logger="wandb", run_dir=str(tmp_path / "again"))
        assert eval_run.main(args) == 0
        assert judge.requests == []
    finally:
        judge.close()
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    first, _, _ = read_results(root)
    assert again["math"] == first["math"] and again["wildbench"] == first["wildbench"]


def test_a_run_is_named_after_its_training_row_and_a_copied_checkpoint_reuses_its_samples(
    full_run, tiny_chat_model, monkeypatch, tmp_path
):
    """No `name=`: the run takes the row of the sarl.train run that wrote the checkpoint (its meta.json), so
    notebooks/tables.py finds it; the cache is keyed by the checkpoint's contents, so the same weights under another
    path and another name generate nothing again."""
    _, root, data = full_run
    trained = tmp_path / "runs" / "grpo_sarl_math" / "2026-01-02_03-04-05"
    shutil.copytree(tiny_chat_model, trained / "final")
    (trained / "meta.json").write_text(json.dumps({"experiment": "grpo_sarl_math", "git_commit": None}))

    def no_model(*a, **k):
        raise AssertionError("the copied checkpoint's samples are cached: no model may be loaded")

    monkeypatch.setattr(TransformersGenerator, "__init__", no_model)
    judge = FakeChatServer(fixture_judge())
    try:
        args = [a for a in overrides(str(trained / "final"), data, root, judge.url) if not a.startswith("name=")]
        args = [a for a in args if not a.startswith("run_dir=")] + [f"paths.runs_dir={tmp_path / 'runs'}"]
        assert eval_run.main(args) == 0
        assert judge.requests == []
    finally:
        judge.close()
    (run_dir,) = (tmp_path / "runs" / "eval" / "grpo_sarl_math").iterdir()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["run"]["name"] == "grpo_sarl_math"
    assert results["run"]["trained_by"] == {
        "row": "grpo_sarl_math",
        "run_dir": str(trained.resolve()),
        "date": "2026-01-02_03-04-05",
    }
    first, _, _ = read_results(root)
    assert results["math"] == first["math"]


def test_config_errors_name_the_problem(tiny_chat_model, eval_data_dir, tmp_path, monkeypatch, caplog):
    """A user's mistake is one logged line and exit code 2, before any model is loaded."""
    assert eval_run.main([f"paths.root={tmp_path}"]) == 2
    assert "no checkpoint" in caplog.text
    tgi = overrides(tiny_chat_model, eval_data_dir, tmp_path, "http://127.0.0.1:9/v1", **{"generator.backend": "tgi"})
    assert eval_run.main(tgi) == 2
    assert "choose one of: vllm, openai, transformers" in caplog.text
    missing = {"benchmarks.math": "[aime25]"}
    assert eval_run.main(overrides(tiny_chat_model, eval_data_dir, tmp_path, "http://127.0.0.1:9/v1", **missing)) == 2
    assert "prepare it first" in caplog.text
    bad_threads = overrides(tiny_chat_model, eval_data_dir, tmp_path, "http://127.0.0.1:9/v1", torch_threads="many")
    assert eval_run.main(bad_threads) == 2
    assert "torch_threads='many': use auto (the free CPUs), null (torch's default) or a number >= 1" in caplog.text
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # the WildBench judge, checked before any model loads or any response is generated
    key = "the WildBench judge: the WildBench judge at https://api.openai.com/v1 needs an API key in $OPENAI_API_KEY"
    assert eval_run.main(overrides(tiny_chat_model, eval_data_dir, tmp_path, "https://api.openai.com/v1")) == 2
    assert caplog.records[-1].getMessage().startswith(key)
    for template, problem in (("missing.md", "does not exist"), ("base_results.json", "lacks the placeholders")):
        bad = {"judge.template": FIXTURES / template}
        assert eval_run.main(overrides(tiny_chat_model, eval_data_dir, tmp_path, "http://127.0.0.1:9/v1", **bad)) == 2
        assert problem in caplog.records[-1].getMessage()
    selecting = overrides(tiny_chat_model, eval_data_dir, tmp_path, "https://api.openai.com/v1", select="last")
    assert eval_run.main(selecting) == 2  # before the first checkpoint's held-out pass
    assert caplog.records[-1].getMessage().startswith(key)
    assert not any((tmp_path / "cache").iterdir()) and not (tmp_path / "run").exists()  # nothing generated or written
    cfg = compose_eval_config(["ckpt=x", f"judge.template={FIXTURES / 'judge_template.md'}"])
    pending = {("toy_wildbench", "wb-1", 0): "<think>x</think> an answer to judge"}
    problem = load_benchmark(eval_data_dir / "toy_wildbench" / "test.parquet", "toy_wildbench", "wildbench")[0]
    with pytest.raises(RuntimeError, match=r"needs an API key in \$OPENAI_API_KEY"):
        judge_all(cfg, [Benchmark("toy_wildbench", "wildbench", [problem], 1)], pending, tmp_path, tmp_path)


def test_default_config_is_the_papers_protocol():
    cfg = compose_eval_config(["ckpt=/models/Qwen3-4B"])
    assert list(cfg.benchmarks.math) == ["aime25", "amc23", "math500", "minerva_math"]
    assert list(cfg.benchmarks.wildbench) == ["wildbench_v2"]
    assert cfg.sampling.n == 8
    assert (cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.top_k) == (0.6, 0.95, 20)
    assert cfg.judge.model == "gpt-4o-2024-05-13" and cfg.judge.temperature == 0.0 and cfg.judge.max_tokens == 1024
    assert cfg.structure.clustering.math == "kmeans" and cfg.structure.clustering.wildbench == "hdbscan"
    assert run_name(cfg) == "Qwen3-4B"
    assert math.isclose(sampling_config(cfg).temperature, 0.6)


@pytest.mark.vllm
def test_full_evaluation_through_a_vllm_cpu_server(tiny_chat_model, tmp_path):
    """generator.backend=openai with url=auto: a real vLLM CPU server on the checkpoint, started and stopped by
    the evaluation; token counts from the server's usage."""
    python = vllm_python_or_skip()
    data = tmp_path / "data"
    write_benchmarks(data, fixture_rows())
    judge = FakeChatServer(fixture_judge())
    try:
        server_args = {
            "generator.backend": "openai",
            "generator.openai.url": "auto",
            "generator.openai.server.python": python,
            "generator.openai.server.cpu": "true",
            "generator.openai.server.max_model_len": 256,
            "generator.openai.server.extra_args": "[--enforce-eager]",
            "generator.openai.server.startup_timeout_s": 400,
            "generator.openai.concurrency": 4,
        }
        assert eval_run.main(overrides(tiny_chat_model, data, tmp_path, judge.url, **server_args)) == 0
    finally:
        judge.close()
    results, markdown, _ = read_results(tmp_path)
    check_math(results, tiny_chat_model)
    check_wildbench(results)
    assert (tmp_path / "run" / "vllm_server.log").exists()
    assert "| tiny | 50.00 | 66.67 | 58.33 (+29.6%) |" in markdown


def test_lm_eval_tasks_join_the_report(full_run, tiny_chat_model, tmp_path, lm_eval_tasks):
    _, root, data = full_run
    answers = {"2+2": "4", "3*3": "9", "10/2": "3"}
    lm_server = FakeChatServer(
        lambda s, body: (
            200,
            chat_reply("The answer is " + next(a for q, a in answers.items() if q in body["messages"][-1]["content"])),
        )
    )
    judge = FakeChatServer(fixture_judge())
    try:
        args = overrides(
            tiny_chat_model,
            data,
            root,
            judge.url,
            run_dir=str(tmp_path / "with_lm_eval"),
            **{
                "lm_eval.tasks": "[toy_qa]",
                "lm_eval.k": 2,
                "lm_eval.model": "local-chat-completions",
                "lm_eval.include_path": str(lm_eval_tasks),
                "lm_eval.include_defaults": "false",
                "lm_eval.batch_size": 1,
                "+lm_eval.model_args.model": "tiny",
                "+lm_eval.model_args.base_url": f"'{lm_server.url}/chat/completions'",
                "+lm_eval.model_args.num_concurrent": 1,
            },
        )
        assert eval_run.main(args) == 0
    finally:
        lm_server.close()
        judge.close()
    results = json.loads((tmp_path / "with_lm_eval" / "results.json").read_text())
    toy = results["lm_eval"]["tasks"]["toy_qa"]
    assert toy["metrics"]["exact_match,strict-match"] == pytest.approx(200 / 3)
    assert len(lm_server.requests) == 3 * 2
    markdown = (tmp_path / "with_lm_eval" / "results.md").read_text()
    assert "| toy_qa | exact_match,strict-match | 66.67 | 3 |" in markdown


def test_a_checkpoint_resaved_in_place_is_evaluated_anew(full_run, tiny_chat_model, tmp_path, caplog):
    """The cache is keyed by the checkpoint's contents: after a re-save at the same path (a resumed run
    rewriting final/), nothing of the old model's generations, structure statistics or judgements is reused,
    and the change is said in one line."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    _, root, data = full_run
    ckpt = tmp_path / "final"
    shutil.copytree(tiny_chat_model, ckpt)
    judge = FakeChatServer(fixture_judge())
    try:
        args = overrides(str(ckpt), data, tmp_path, judge.url, cache_dir=str(tmp_path / "cache"))
        assert eval_run.main(args) == 0
        model = AutoModelForCausalLM.from_pretrained(ckpt)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        model.save_pretrained(ckpt)  # re-saved in place
        caplog.clear()
        assert eval_run.main(args) == 0
    finally:
        judge.close()
    assert "changed since it was last evaluated" in caplog.text
    assert "generation: 0 of" in caplog.text and "structure statistics: 0 cached" in caplog.text


def test_cached_statistics_belong_to_their_text_and_a_null_text_is_not_an_answer(
    full_run, tiny_chat_model, tmp_path, caplog
):
    """A structure record made for another text is recomputed; a generation record whose text is null is
    warned about (file named) and generated again, not read as "no answer"."""
    import shutil

    _, root, data = full_run
    cache = tmp_path / "cache"
    shutil.copytree(root / "cache", cache)
    structure_file = sorted(cache.rglob("structure-*/toy_aime/*/0.json"))[0]
    entry = json.loads(structure_file.read_text())
    entry["record"]["text_hash"] = "0" * 16  # made for another response
    structure_file.write_text(json.dumps(entry))
    gens = [p for p in cache.rglob("toy_math/*/1.json") if "/gen-" in str(p) and "structure-" not in str(p)]
    gen_file = sorted(gens)[0]
    entry = json.loads(gen_file.read_text())
    entry["record"]["text"] = None
    gen_file.write_text(json.dumps(entry))
    judge = FakeChatServer(fixture_judge())
    try:
        args = overrides(tiny_chat_model, data, tmp_path, judge.url, cache_dir=str(cache))
        assert eval_run.main(args) == 0
    finally:
        judge.close()
    assert str(gen_file) in caplog.text and "not a valid sample record" in caplog.text
    assert "generation: 15 of 16 responses cached, 1 to generate" in caplog.text
    # the stale record is recomputed; the regenerated sample has its old text again (same per-sample seed), so
    # its statistics, keyed by that text, stand
    assert "structure statistics: 15 cached, 1 to compute" in caplog.text


def test_generator_and_judge_are_config_groups_and_the_former_keys_still_work():
    """generator=NAME picks conf/eval/generator/NAME.yaml (built with hydra.utils.instantiate); the former
    generator.backend=NAME and generator.NAME.KEY=V mean the same, a key of a back end not chosen is ignored."""
    new = compose_eval_config(["ckpt=x", "generator=openai", "generator.url=http://h:8000/v1", "judge.model=j"])
    old = compose_eval_config(
        ["ckpt=x", "generator.backend=openai", "generator.openai.url=http://h:8000/v1", "generator.vllm.dtype=half"]
        + ["judge.model=j"]
    )
    assert new.generator == old.generator and new.judge == old.judge
    assert new.generator._target_ == "eval.generate.openai_generator" and new.generator.url == "http://h:8000/v1"
    assert generator_name(new) == "openai" and generator_name(compose_eval_config(["ckpt=x"])) == "vllm"
    assert new.judge._target_ == "eval.wildbench.openai_judge" and new.judge.model == "j"
    for name in BACKENDS:
        assert (CONF_DIR / "eval" / "generator" / f"{name}.yaml").is_file()
    with pytest.raises(UserError, match="choose one of: vllm, openai, transformers"):
        compose_eval_config(["ckpt=x", "generator=tgi"])


def test_a_key_added_to_sampling_is_refused_and_one_added_to_its_free_form_mapping_stays():
    """`+sampling.tempreature=1` adds a key nothing reads (Hydra's advice for a misspelt key): refused with the
    nearest key; the chat template's arguments (`sampling.chat_template_kwargs`) are free-form."""
    with pytest.raises(UserError, match=r"^\+sampling.tempreature: .*; did you mean sampling.temperature\?$"):
        compose_eval_config(["ckpt=x", "+sampling.tempreature=1"])
    cfg = compose_eval_config(["ckpt=x", "+sampling.chat_template_kwargs.reasoning_effort=low"])
    assert cfg.sampling.chat_template_kwargs.reasoning_effort == "low"


def test_the_judge_is_built_from_its_group(monkeypatch):
    from hydra.utils import instantiate

    monkeypatch.setenv("TEST_JUDGE_KEY", "k")
    cfg = compose_eval_config(["ckpt=x", "judge.url=http://127.0.0.1:9/v1", "judge.api_key_env=TEST_JUDGE_KEY"])
    judge = instantiate(cfg.judge, "TEMPLATE {$model_output}", _convert_="all")
    try:
        assert type(judge).__name__ == "WildBenchJudge" and judge.model == cfg.judge.model
    finally:
        judge.close()
