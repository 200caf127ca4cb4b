"""`python -m sarl.bench` (suite=structure) in quick mode: every column of the table is printed, the
machine/load/date lines are there, and the label checks hold. No timing is asserted."""

import json
import re

import numpy as np
import pytest
from omegaconf import OmegaConf
from rich.console import Console
from testkit import bench_config, run_module

from sarl.bench.__main__ import effective_config, run
from sarl.bench.structure import COLUMNS, baseline_rewards, make_family, step_counts, step_text_stream
from sarl.runtime.errors import UserError


def test_step_counts_follow_the_spread_of_real_responses():
    cfg = bench_config().structure
    ms = step_counts(20000, cfg, np.random.default_rng(0))
    assert ms.min() == 2 and ms.max() == 400
    assert 55 <= np.median(ms) <= 65


def test_families_have_the_configured_shapes():
    cfg = effective_config(bench_config(["quick=true"]))
    for name, dim in (("random", cfg.dim), ("planted", cfg.dim)):
        embs, truth = make_family(name, cfg, 5, 0)
        assert all(x.shape[1] == dim and x.dtype == np.float32 for x in embs)
        assert np.allclose([np.linalg.norm(x, axis=1) for x in embs[:1]], 1.0, atol=1e-5)
        assert (truth is None) == (name == "random")
    stream = step_text_stream()
    assert len(stream) >= 400 and len(set(stream)) == len(stream)  # windows up to M = 400 repeat no text


def test_baseline_is_scikit_learn_and_networkx():
    embs, _ = make_family("planted", effective_config(bench_config(["quick=true"])), 3, 0)
    scores, labels = baseline_rewards(embs, "kmeans", 0)
    assert len(scores) == 3 and all(0.0 <= s <= 1.5 for s in scores)
    assert [len(a) for a in labels] == [len(x) for x in embs]


def test_quick_structure_suite_prints_every_column_and_labels_agree():
    console = Console(record=True, width=400)
    out = run(bench_config(["quick=true"]), console)
    text = console.export_text()
    for col in COLUMNS:
        assert col in text, col
    assert text.count("cores") >= 2 and text.count("load average") >= 2 and "UTC" in text
    assert "threads: 1 for both sides" in text
    rows = out["structure"]["rows"]
    assert {(r["family"], r["method"]) for r in rows} == {
        (f, m) for f in ("random", "planted", "minilm") for m in ("kmeans", "hdbscan")
    }
    for r in rows:
        assert len(r["ours_times_s"]) == len(r["baseline_times_s"]) == 3
        if r["method"] == "hdbscan":
            assert r["equal_brute"] == r["responses"]  # labels equal scikit-learn's algorithm="brute"
            assert r["same_sr"] == 1.0
        else:
            assert r["inertia_ratio"] <= 1.01  # KMeans objective within 1% of scikit-learn's on average
    planted = next(r for r in rows if r["family"] == "planted" and r["method"] == "kmeans")
    assert planted["ari_ours_truth"] >= 0.9
    assert next(r for r in rows if r["family"] == "minilm")["dim"] == 384
    for r in rows:  # the roofline is ours' own Gram product; numpy's BLAS product is timed beside it
        assert r["roofline_ms"] > 0 and r["blas_gram_ms"] > 0 and len(r["blas_gram_times_s"]) == 3
    (gram,) = out["structure"]["gram"]  # quick mode: one shape
    assert (gram["steps"], gram["dim"]) == (9, 1024) and gram["blocks"] in ("4 x 4", "4 x 2")
    assert gram["kernel_us"] > 0 and gram["numpy_us"] > 0
    assert gram["speedup"] == pytest.approx(gram["numpy_us"] / gram["kernel_us"])
    assert "Gram products of one response" in text and "kernel speed-up" in text
    scale = out["structure"]["scale"]
    assert set(scale["kmeans"]) == {"first_ms", "later_ms", "first_over_later", "peak_mb"}
    assert scale["startup"]["cold_import_s"] > 0 and scale["startup"]["warm_import_s"] > 0
    assert "into an empty cache" in text and scale["kernel_scratch_mb"] > 0


def test_unknown_suite_is_a_user_error():
    with pytest.raises(UserError, match="suite='nope'"):
        effective_config(bench_config(["suite=nope"]))


@pytest.mark.slow
def test_structure_suite_from_the_command_line_idle_and_beside_a_busy_process_it_stops(tmp_path):
    """`load=1`: the suite idle, then beside one busy process that the bench started and stops (by its pid), both
    speed-ups side by side in one run."""
    import psutil

    structure = ["structure.families=[random]", "structure.methods=[hdbscan]", "structure.scale_responses=0"]
    args = ("quick=true", "load=1", "load_max_s=300", *structure, f"hydra.run.dir={tmp_path}")
    proc = run_module("sarl.bench", *args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "speed-up" in proc.stdout and "load average" in proc.stdout
    assert "speed-up over the naive loop, idle and beside 1 busy processes" in proc.stdout
    (pid,) = [int(x) for x in re.findall(r"load: 1 busy processes \(pids (\d+),", proc.stdout)]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # stopped
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["suite"] == "structure" and result["machine_start"]["cores"] >= 1 and result["load"] == 1
    assert set(result["structure"]) == {"idle", "loaded"} and result["structure"]["loaded"]["rows"]
    assert OmegaConf.create(result["config"]).n_responses == 12
    proc = run_module("sarl.bench", "suite=nope", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2 and "suite='nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_a_negative_load_is_one_line(capsys):
    with pytest.raises(UserError, match="load=-1"):
        run(bench_config(["suite=grading", "quick=true", "load=-1"]), Console(width=120))
