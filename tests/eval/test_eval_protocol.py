"""Evaluation protocols (conf/eval/protocol/, eval.protocol): each paper's plan as the paper states it, the dry
run, the one-line errors for missing data, and a whole protocol run (a seed sweep over two
response caps) against a loopback OpenAI-compatible server whose answers make the metrics known in advance."""

import json

import pytest
from eval_helpers import FakeChatServer, chat_reply, fixture_rows, write_benchmarks
from testkit import run_module

from eval import run as eval_run
from eval.config import compose_eval_config
from eval.data import load_benchmark
from eval.generate import sample_seed
from eval.protocol import check_runnable, resolve_plan, sampling_config
from sarl.runtime.errors import UserError
from sarl.runtime.files import CONF_DIR

PROTOCOLS = ("sarl", "evol_rl", "grp", "structured", "structured_temperature", "smoke")


def plan_of(protocol, *overrides):
    return resolve_plan(compose_eval_config(["ckpt=x", f"protocol={protocol}", *overrides]))


def by_label(plan):
    return {e.label: e for e in plan.entries}


def test_every_protocol_file_composes_and_resolves():
    assert sorted(p.stem for p in (CONF_DIR / "eval" / "protocol").glob("*.yaml")) == sorted(PROTOCOLS)
    for name in PROTOCOLS:
        plan = plan_of(name)
        assert plan.protocol == name and plan.entries


def test_sarl_is_the_default_and_reads_conf_eval_yaml():
    cfg = compose_eval_config(["ckpt=x"])
    plan = resolve_plan(cfg)
    assert plan.protocol == "sarl" and len(plan.groups()) == 1
    assert [e.name for e in plan.entries] == ["aime25", "amc23", "math500", "minerva_math", "wildbench_v2"]
    assert all(e.sampling == sampling_config(cfg) for e in plan.entries)  # the one sampling of conf/eval.yaml
    assert [(e.n, e.metrics) for e in plan.entries[:4]] == [(8, ("avg@k",))] * 4
    assert (plan.entries[4].kind, plan.entries[4].n) == ("wildbench", 1)
    custom = plan_of("sarl", "benchmarks.math=[toy_aime]", "benchmarks.wildbench=[]", "sampling.n=2")
    assert [(e.name, e.n) for e in custom.entries] == [("toy_aime", 2)]


def test_evol_rl_pass_at_1_and_16_of_32_rollouts():
    plan = plan_of("evol_rl")
    assert [e.name for e in plan.entries] == ["math500", "aime24", "aime25", "amc23", "gpqa_diamond"]
    for e in plan.entries:
        assert (e.kind, e.n, e.metrics, e.ks) == ("math", 32, ("pass@1", "pass@16"), [1, 16])
        assert (e.sampling.temperature, e.sampling.max_tokens) == (0.6, 12288)  # EVOL-RL App. C.6 Table 2, C.2


def test_grp_avg_at_3_and_16_with_32k_on_aime():
    plan = by_label(plan_of("grp"))
    n = {name: e.n for name, e in plan.items()}
    assert n == {
        "gsm8k": 3,
        "math500": 3,
        "livecodebench_v5": 3,
        "amc23": 16,
        "aime24": 16,
        "aime25": 16,
        "mbpp": 16,
        "mbpp_plus": 16,
        "humaneval": 16,
        "humaneval_plus": 16,
    }
    assert all(e.metrics == ("avg@k",) for e in plan.values())
    caps = {name: e.sampling.max_tokens for name, e in plan.items()}
    assert caps.pop("aime24") == caps.pop("aime25") == 32768 and set(caps.values()) == {8192}
    assert {name for name, e in plan.items() if e.kind == "code"} == {
        "mbpp",
        "mbpp_plus",
        "humaneval",
        "humaneval_plus",
        "livecodebench_v5",
    }


def test_structured_pass_at_1_over_seeds_at_five_caps():
    plan = plan_of("structured")
    names = list(dict.fromkeys(e.name for e in plan.entries))
    assert names == ["aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench", "drop", "lsat_ar", "mmlu"]
    caps = sorted({e.sampling.max_tokens for e in plan.entries})
    assert caps == [512, 1024, 2048, 4096, 8192] and len(plan.entries) == 9 * 5 and len(plan.groups()) == 5
    for e in plan.entries:
        assert e.seeds == (10 if e.name in ("aime24", "aime25", "amc23") else 3)
        assert e.metrics == ("pass@1_seeds",) and e.sampling.temperature == 0.6
    assert "math500/max_tokens=512" in by_label(plan)


def test_structured_temperature_table():
    plan = plan_of("structured_temperature")
    assert list(dict.fromkeys(e.name for e in plan.entries)) == ["math500", "olympiadbench", "lsat_ar"]
    temps = sorted({e.sampling.temperature for e in plan.entries})
    assert temps == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert {e.sampling.max_tokens for e in plan.entries} == {8192} and {e.seeds for e in plan.entries} == {3}


def test_smoke_asks_the_shipped_heldout_prompts_as_the_smoke_run_trained_and_samples(tmp_path):
    """protocol=smoke: avg@4 on the smoke run's 64 held-out prompts read from the package (no data preparation), each
    row's own messages (the training format: no system prompt, no suffix, no chat_template_kwargs) and gold, sampled
    as the run's held-out report samples them (conf/exp/smoke.yaml `heldout:`)."""
    from eval.protocol import load_benchmarks
    from sarl.checking.grading.gold import gold_answers
    from sarl.launch.compose import compose_train_config
    from sarl.runtime.files import read_jsonl, resolve_path

    cfg = compose_eval_config(["ckpt=x", "protocol=smoke", f"paths.data_dir={tmp_path / 'none'}"])
    plan = resolve_plan(cfg)
    (e,) = plan.entries
    assert (e.name, e.kind, e.n, e.metrics, e.ks) == ("smoke_heldout", "math", 4, ("avg@k",), [4])
    smoke, _ = compose_train_config(["+exp=smoke"])
    heldout = smoke.heldout
    assert e.file == heldout.files == smoke.data.trl_val_files == "pkg://sarl.smoke/data/heldout.trl.jsonl"
    s = e.sampling
    assert (s.temperature, s.top_p, s.top_k) == (heldout.temperature, heldout.top_p, None)  # report: top_k=0, none
    assert s.max_tokens == heldout.max_new_tokens == smoke.data.max_response_length
    assert s.chat_template_kwargs == {}
    check_runnable(plan, cfg.paths.data_dir)  # no prepared data needed
    (bench,) = load_benchmarks(cfg, plan.entries)
    rows = read_jsonl(resolve_path(e.file), "held-out prompts")
    assert len(rows) == len(bench.problems) == 64 and len({p.id for p in bench.problems}) == 64
    assert [p.messages for p in bench.problems] == [r["prompt"] for r in rows]
    assert [p.gold for p in bench.problems] == [gold_answers(r["ground_truth"]) for r in rows]
    assert len(load_benchmarks(compose_eval_config(["protocol=smoke", "limit=4"]), plan.entries)[0].problems) == 4


def test_a_protocol_file_names_only_its_own_benchmarks(tmp_path):
    with pytest.raises(UserError, match=r"files names \['aime25'\], not benchmarks of the protocol"):
        plan_of("smoke", "+protocol.files.aime25=/data/aime25.parquet")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": [{"role": "user", "content": "1+1?"}], "ground_truth": "2"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"benchmark 'mine' \(.*bad.jsonl\), row 1: not a JSON object"):
        load_benchmark(bad, "mine", "math")
    missing = plan_of("smoke", f"protocol.files.smoke_heldout={tmp_path / 'gone.jsonl'}")
    with pytest.raises(UserError, match=r"benchmark 'smoke_heldout' of protocol smoke: .*gone.jsonl .* is not a file"):
        check_runnable(missing, tmp_path)


def test_every_reported_paper_table_reads_benchmarks_its_protocol_evaluates():
    """notebooks/reported/<table>.yaml (the papers' tables the notebooks rebuild): each names a protocol, and every
    column at every sweep value it prints (or the one it reads, `at`) is a label of that protocol's plan."""
    from pathlib import Path

    import yaml

    reported = sorted((Path(__file__).resolve().parents[2] / "notebooks" / "reported").glob("*.yaml"))
    assert {p.stem for p in reported} >= {"structured_7b", "structured_table10", "evol_rl_ablation"}
    for path in reported:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert spec["protocol"] in PROTOCOLS, path.name
        plan = plan_of(spec["protocol"])
        if spec["cell"] == ["mean", "std"]:  # over the protocol's sweep (Structured Reasoning Table 4)
            assert set(spec["columns"]) <= {e.name for e in plan.entries}, path.name
            continue
        if spec.get("gain_over"):  # a column per sweep value of another table (Structured Reasoning Table 15)
            other = yaml.safe_load((path.parent / f"{spec['gain_over']['table']}.yaml").read_text(encoding="utf-8"))
            assert other["protocol"] == spec["protocol"], path.name
            assert set(spec["columns"]) <= set(other["rows"][0]["values"]), path.name
            assert spec["gain_over"]["average"] in {a["key"] for a in other["averages"]}, path.name
            continue
        suffixes = [f"/{spec['sweep']}={v}" for v in spec["rows"][0]["values"]] if spec.get("sweep") else [""]
        if spec.get("at"):
            suffixes = ["".join(f"/{k}={v}" for k, v in spec["at"].items())]
        labels = set(by_label(plan))
        assert {b + s for b in spec["columns"] for s in suffixes} <= labels, path.name
        n = len(spec["columns"]) + len(spec.get("averages") or [])
        for row in spec["rows"]:
            blocks = row["values"].values() if spec.get("sweep") else [row["values"]]
            assert all(len(v) == n and all(len(c) == len(spec["cell"]) for c in v) for v in blocks), row["id"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dry_run_prints_the_plan_without_a_checkpoint(protocol, tmp_path):
    proc = run_module("eval.run", f"protocol={protocol}", "dry_run=true", f"paths.data_dir={tmp_path}", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert out.startswith(f"protocol {protocol} (")
    assert "benchmark" in out and "max_tokens" in out and "seeds" in out and "top_p" in out
    for e in plan_of(protocol).entries:
        assert f"\n{e.label} " in out
        if e.file:  # shipped in the package (protocol smoke): nothing to prepare
            assert f"data of {e.name}: {e.file}\n" in out and f"data missing: {e.name}" not in out
        else:
            assert f"data missing: {e.name}: python -m sarl.data.prepare dataset={e.name}" in out
    if protocol == "grp":
        assert "dataset=gsm8k\n" in out  # conf/data/gsm8k.yaml exists: no "not written yet"
        assert "code benchmarks: each sample's last code block runs against the tests (code.sandbox)" in out


def test_user_errors_are_one_line(tmp_path, caplog):
    data = tmp_path / "data"
    args = ["ckpt=x", "generator=openai", "generator.url=http://127.0.0.1:9/v1", f"paths.data_dir={data}"]
    args += [f"paths.root={tmp_path}", "logger=none"]
    assert eval_run.main([*args, "protocol=nope"]) == 2
    assert f"protocol='nope'; choose one of: {', '.join(sorted(PROTOCOLS))}" in caplog.text
    caplog.clear()
    assert eval_run.main([*args, "protocol=evol_rl"]) == 2
    assert (
        f"benchmark 'math500' of protocol evol_rl: {data}/math500/test.parquet does not exist; prepare it first "
        "(python -m sarl.data.prepare dataset=math500) or set paths.data_dir" in caplog.text
    )
    caplog.clear()
    assert eval_run.main([*args, "protocol=evol_rl", "only=[gpqa_diamond]"]) == 2
    assert "(python -m sarl.data.prepare dataset=gpqa_diamond) or set paths.data_dir" in caplog.text
    caplog.clear()
    assert eval_run.main([*args, "protocol=grp", "only=[mbpp]"]) == 2
    assert f"benchmark 'mbpp' of protocol grp: {data}/mbpp/test.parquet does not exist" in caplog.text
    caplog.clear()
    assert eval_run.main([*args, "protocol=grp", "only=[aime23]"]) == 2
    assert "only=['aime23']: ['aime23'] not in protocol grp" in caplog.text
    assert all(r.exc_info is None for r in caplog.records)


# -- a whole protocol run --------------------------------------------------------------------------------------

SEEDS = 4
CAPS = (32, 256)  # below 64 tokens the server truncates every response (no answer)


def answering_server():
    """toy_aime: aime-1 always right; aime-2 right only for sample 0. A cap below 64 tokens truncates."""
    rows = {r["question"]: r for r in fixture_rows() if r["benchmark"] == "toy_aime"}
    sample_of = {
        (row["id"], sample_seed(0, "toy_aime", row["id"], i)): i for row in rows.values() for i in range(SEEDS)
    }

    def respond(server, body):
        row = rows[body["messages"][-1]["content"]]
        if body["max_tokens"] < 64:
            return 200, chat_reply("<think>\nStill thinking", "length", {"completion_tokens": body["max_tokens"]})
        i = sample_of[(row["id"], body["seed"])]
        answer = row["gold"] if row["id"] == "aime-1" or i == 0 else "7"
        return 200, chat_reply(f"<think>\nWork.\n</think>\n\n$\\boxed{{{answer}}}$", "stop", {"completion_tokens": 9})

    return FakeChatServer(respond)


def test_a_protocol_run_scores_its_metrics_per_setting(tmp_path):
    data = tmp_path / "data"
    write_benchmarks(data, fixture_rows())
    server = answering_server()
    metrics = "['pass@1_seeds','pass@2','avg@k']"
    args = [
        "ckpt=tiny",
        "protocol=structured",
        f"protocol.benchmarks=[{{names:[toy_aime],kind:math,n:{SEEDS},metrics:{metrics}}}]",
        f"protocol.sweep.max_tokens=[{CAPS[0]},{CAPS[1]}]",
        "generator=openai",
        f"generator.url={server.url}",
        "generator.concurrency=2",
        f"paths.root={tmp_path}",
        f"paths.data_dir={data}",
        f"run_dir={tmp_path / 'run'}",
        f"cache_dir={tmp_path / 'cache'}",
        "structure.enabled=false",
        "logger=none",
    ]
    try:
        assert eval_run.main(args) == 0
        assert len(server.requests) == 2 * SEEDS * len(CAPS)
        assert {b["max_tokens"] for b in server.requests} == set(CAPS)
        assert {b["temperature"] for b in server.requests} == {0.6} and all("top_k" not in b for b in server.requests)
        results = json.loads((tmp_path / "run" / "results.json").read_text())
        assert eval_run.main([*args, f"run_dir={tmp_path / 'again'}"]) == 0
        assert len(server.requests) == 2 * SEEDS * len(CAPS)  # the second run is served from the cache
    finally:
        server.close()
    assert results["protocol"]["name"] == "structured" and results["protocol"]["paper"] == "Structured Reasoning"
    benches = results["math"]["benchmarks"]
    assert set(benches) == {f"toy_aime/max_tokens={c}" for c in CAPS}
    full = benches["toy_aime/max_tokens=256"]["metrics"]
    # per seed: 100, 50, 50, 50 -> 62.5 ± 25 (ddof=1); pass@2 = (1 + (1 - C(3,2)/C(4,2))) / 2 = 75
    assert full["pass@1_mean"] == pytest.approx(62.5) and full["pass@1_std"] == pytest.approx(25.0)
    assert full["pass@1_per_seed"] == [100.0, 50.0, 50.0, 50.0]
    assert full["pass@2"] == pytest.approx(75.0) and full["avg@4"] == pytest.approx(62.5)
    cut = benches["toy_aime/max_tokens=32"]
    assert cut["metrics"]["pass@1_mean"] == 0.0 and cut["truncation_rate"] == 100.0
    sweep = results["math"]["sweep"]["toy_aime"]
    assert sweep["metric"] == "pass@1_mean" and sweep["values"] == {"32": 0.0, "256": 62.5}
    assert sweep["mean"] == pytest.approx(31.25) and sweep["std"] == pytest.approx(62.5 / 2**0.5)
    assert set(results["math"]["overall"]) == {"max_tokens=32", "max_tokens=256"}
    plan = {e["label"]: e for e in results["protocol"]["benchmarks"]}
    assert (
        plan["toy_aime/max_tokens=32"]["sampling"]["max_tokens"] == 32 and plan["toy_aime/max_tokens=32"]["seeds"] == 4
    )
    markdown = (tmp_path / "run" / "results.md").read_text()
    assert "| toy_aime/max_tokens=256 | 4 | 256 | 0.6 | 62.50 ± 25.00 | 75.00 | 62.50 |" in markdown
    assert "| toy_aime | pass@1_mean | 0.00 | 62.50 | 31.25 ± 44.19 |" in markdown
    problems = [json.loads(line) for line in (tmp_path / "run" / "problems.jsonl").read_text().splitlines()]
    assert {p["benchmark"] for p in problems} == set(benches)
