"""`python -m sarl.bench suite=grading` and `suite=reward_step` in quick mode: tables with every column,
pathological answers rejected cheaply, verdicts equal to plain math-verify. No timing is asserted."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from testkit import bench_config

from sarl.bench.__main__ import run
from sarl.bench.embed_http import cpu_by_process, cpu_list_size, process_tree, server_env
from sarl.bench.grading import answer_mix, ours, plain_math_verify
from sarl.bench.reward_step import paper_batch
from sarl.runtime.errors import UserError
from sarl.structure.steps import parse_steps


def test_answer_mix_is_realistic():
    rows = answer_mix(400, 0.05, 0)
    kinds = [r["kind"] for r in rows]
    assert kinds.count("oversized") == 10 and kinds.count("short") == 10
    assert 150 <= kinds.count("aime") <= 250 and 150 <= kinds.count("math") <= 250
    assert all("\\boxed{" in r["response"] for r in rows)


def test_verdicts_agree_with_plain_math_verify():
    from sarl.checking.grading.grader import Grader

    rows = answer_mix(160, 0.0, 3)
    grader = Grader(timeout_s=30.0)
    try:
        verdicts = [(ours(grader, r), plain_math_verify(r["response"], r["gold"])) for r in rows]
    finally:
        grader.close()
    assert all(a == b for a, b in verdicts), [r for r, (a, b) in zip(rows, verdicts) if a != b][:3]
    assert 0 < sum(a for a, _ in verdicts) < len(rows)  # both verdicts occur


def test_quick_grading_suite():
    console = Console(record=True, width=400)
    out = run(bench_config(["suite=grading", "quick=true"]), console)["grading"]
    text = console.export_text()
    for col in ("answers/s", "p99 ms", "rejected cheaply", "agreement with plain math-verify", "load average"):
        assert col in text
    assert "short pathological answers" in text and "over the budget" in text
    assert out["answers"] == 200 and out["pathological"] == 10 and out["oversized"] + out["short"] == 10
    assert out["rejected"] + out["pathological_no_answer"] == out["oversized"]
    assert set(out["short_latency_ms"]) == set(out["short_worker_cpu_ms"]) == {"p50", "p99", "max"}
    assert "worker CPU max ms" in text
    # the worker's CPU time is measured (not 0) and no answer's is over its wall time
    assert 0 < out["short_worker_cpu_ms"]["max"] <= out["short_latency_ms"]["max"]
    assert out["short_written_as_gold_correct"] == out["short_written_as_gold"]
    assert out["timeouts"] == 0 and out["agreement"] == 1.0


def test_paper_batch_has_the_configured_steps():
    batch = paper_batch(8, 20, 0)
    counts = [len(parse_steps(r).steps) for r in batch.responses]
    assert len(batch) == 8 and 10 <= sum(counts) / 8 <= 30
    assert len({s for r in batch.responses for s in parse_steps(r).steps}) == sum(counts)  # no repeated step


def test_quick_reward_step_suite():
    console = Console(record=True, width=400)
    result = run(bench_config(["suite=reward_step", "quick=true"]), console)
    out = result["reward_step"]
    text = console.export_text()
    # the host's figures at start and end, printed and kept: a result from another host of the same name compares
    for when in ("machine_start", "machine_end"):
        host = result[when]
        assert host["memory_copy_gb_s"] > 0.1 and host["gram_79x1024_per_s_1_thread"] > 10
        assert f"memory copy {host['memory_copy_gb_s']} GB/s" in text
    for row in ("split into steps", "clustering", "reasoning map + SR", "StructureReward(batch) without the model"):
        assert row in text
    assert "WordPiece tokens" in text and out["minilm_tokens"] > out["steps"]
    assert out["rollouts"] == 16 and set(out["kmeans"]) >= {
        "parse",
        "cluster",
        "graph",
        "embed bookkeeping",
        "reward call",
        "other",
    }


@pytest.mark.slow
def test_quick_embed_http_suite_against_the_real_vllm_server():
    if not (Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python").exists():
        pytest.skip(".venv-vllm is missing: run scripts/setup_vllm_cpu.sh")
    console = Console(record=True, width=400)
    out = run(bench_config(["suite=embed_http", "quick=true"]), console)["embed_http"]
    text = console.export_text()
    assert "HTTP throughput / in-process" in text and "texts/s" in text and "load average" in text
    assert out["failed"] == 0 and out["max_abs_diff"] < 1e-4 and out["min_cosine"] > 0.9999
    assert "cores busy" in text and "texts per CPU s" in text and "VLLM::Worker" in text
    assert out["server_env"] == {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    names = {p["name"] for p in out["server_processes"]}
    assert "VLLM::Worker" in names and out["http_cpu_s"] > 0 and out["in_process_cpu_s"] > 0


def test_server_thread_settings():
    assert server_env(2, "nobind") == {"OMP_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert server_env(2, "0-1")["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert [cpu_list_size(s) for s in ("0", "0-1", "0,2-3", "5")] == [1, 2, 3, 1]
    with pytest.raises(UserError, match="lists 2 CPUs but threads=1"):
        server_env(1, "0-1")
    for bad in ("x", "3-1", "0-", ""):
        with pytest.raises(UserError, match="is not a CPU list"):
            cpu_list_size(bad)


def test_cpu_seconds_of_a_process_tree_are_read_from_proc():
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)",
        ]
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            info = cpu_by_process(process_tree(os.getpid())).get(child.pid)
            if info and info["cpu_s"] >= 0.25:
                break
            time.sleep(0.1)
        assert child.pid in process_tree(os.getpid()) and os.getpid() in process_tree(os.getpid())
        assert info["cpu_s"] >= 0.25 and info["threads"] >= 1 and info["name"].startswith("python")
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_quick_smoke_effect_suite_reads_each_seeds_heldout_block(policy_cache, tmp_path):
    """One seed of the smoke run at its smallest, in its own process; the table and the verdicts come from the run's
    summary.json (the seed-level claim itself is the full suite's, reported in docs/results.md, not asserted here)."""
    from sarl.bench.smoke_effect import verdicts

    console = Console(record=True, width=400)
    cfg = bench_config(["suite=smoke_effect", "quick=true", "smoke_effect.fresh_policy=false"])
    cfg.smoke_effect.cache_dir = str(policy_cache)
    out = run(cfg, console, tmp_path)["smoke_effect"]
    (row,) = out["seeds"]
    assert row["seed"] == 0 and row["steps"] == 1 and row["wall_s"] > 0
    assert (row["heldout"]["prompts"], row["heldout"]["samples_per_prompt"]) == (2, 2)
    assert row["verdicts"] == verdicts(row["heldout"])
    assert (tmp_path / "seed0" / "train.log").is_file()
    text = console.export_text()
    for col in ("ΔSR [95% CI]", "Δacc. [95% CI]", "repeated tags", "SR up", "acc. holds", "load average"):
        assert col in text


def test_smoke_effect_verdicts():
    from sarl.bench.smoke_effect import verdicts

    def block(sr_ci, acc, acc_ci):
        return {"delta": {"sr_delta_ci95": sr_ci, "accuracy": acc, "accuracy_delta_ci95": acc_ci}}

    assert verdicts(block([0.01, 0.09], -0.01, [-0.05, 0.03])) == {"sr_up": True, "accuracy_holds": True}
    assert verdicts(block([-0.01, 0.09], -0.10, [-0.16, -0.04])) == {"sr_up": False, "accuracy_holds": False}
    # a fall no larger than the interval's half width holds even when the interval sits just below zero
    assert verdicts(block([0.02, 0.05], -0.03, [-0.07, -0.001]))["accuracy_holds"]


def test_quick_code_exec_suite():
    console = Console(record=True, width=400)
    out = run(bench_config(["suite=code_exec", "quick=true"]), console)["code_exec"]
    text = console.export_text()
    columns = ("programs/s", "vs the floor, same concurrency", "per CPU-second", "worst wall s")
    for col in (*columns, "load average"):
        assert col in text
    assert out["programs"] == 8 and out["all_passed"]
    sides = ["sandbox", "plain subprocess.run", "python -I -S (the floor)"]
    if "fork server" in out["isolation"]:  # the fork server's runners, and bubblewrap's beside them
        sides.append("sandbox through bubblewrap")
    if os.geteuid() == 0:  # and the sandbox of a caller that is not root, from a helper process as another uid
        sides.append("sandbox, caller not root")
        assert out["not_root_floor_ratio"] > 0 and "(the caller's)" in out["not_root_isolation"]
    assert set(out["programs_per_s"]) == {f"{s}, {how}" for s in sides for how in ("concurrent", "one at a time")}
    assert out["floor_ratio"] > 0 and f"{out['max_workers']} at a time on every concurrent side" in " ".join(
        text.split()
    )
    assert all(row["outcomes"] == [row["expected"]] for row in out["hostile"].values()), out["hostile"]
    # the 1 s limit plus the kill, with room for a loaded machine: unbounded, a hostile program runs 60 s or for ever
    assert all(row["worst_wall_s"] < 1.0 + 10.0 for row in out["hostile"].values()), out["hostile"]
    assert out["per_core_ratio"] > 0 and set(out["programs_per_cpu_s"]) == set(out["programs_per_s"])


def test_quick_export_suite():
    """A tiny model's verl checkpoint made a Hugging Face model both ways: the merger's bfloat16 (checked against the
    shards inside the timing) and verl's hf_model save's float32, twice the bytes."""
    console = Console(record=True, width=400)
    out = run(bench_config(["suite=export", "quick=true"]), console)["export"]
    text = console.export_text()
    for col in ("FSDP shard GB", "merger s", "merger GB", "hf_model s", "hf_model GB"):
        assert col in text
    (row,) = out["rows"]
    assert row["model"] == "tiny" and row["merger_s"] > 0 and row["hf_model_s"] > 0
    weights = 2 * row["parameters"]  # bfloat16, the tied head saved once
    assert weights <= row["merger_bytes"] < weights + 100_000
    assert 2 * weights <= row["hf_model_bytes"] < 2 * weights + 100_000  # float32, as the training weights


def test_help_lists_the_suites_not_the_training_groups():
    from testkit import run_module

    from sarl.bench.__main__ import SUITES

    proc = run_module("sarl.bench", "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) < 30 and lines[0].startswith("python -m sarl.bench [suite=NAME]")
    listed = {line.split()[0] for line in lines if line.startswith("  ") and line.split()}
    assert set(SUITES) <= listed and "reward" not in proc.stdout.split("suite=")[0]
