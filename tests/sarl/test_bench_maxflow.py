"""`python -m sarl.bench suite=maxflow`: the max-flow benchmark agrees with networkx and reports timings;
the default suite is unchanged."""

import json

import numpy as np
import pytest
from omegaconf import OmegaConf
from rich.console import Console
from testkit import bench_config, run_module

from baselines.maxflow.flow import step_importance
from sarl.bench.maxflow import attention_like_capacity, bench_maxflow, dense_capacity, networkx_importance


def test_default_suite_is_the_structure_benchmark():
    cfg = bench_config()
    assert cfg.suite == "structure" and list(cfg.structure.methods) == ["kmeans", "hdbscan"]
    assert list(cfg.maxflow.families) == ["attention", "dense"]
    assert len(cfg.maxflow.sizes) == len(cfg.maxflow.graphs)


def test_benchmark_graphs_are_dags_shaped_like_the_paper():
    rng = np.random.default_rng(0)
    att = attention_like_capacity(12, rng, 0.05)
    assert not np.tril(att).any() and (att[att > 0] > 0.05).all()  # thresholded, earlier -> later
    assert att[:, 1:].sum(0).max() <= 1.0 + 1e-12  # a node's attention over earlier nodes sums to <= 1
    dense = dense_capacity(6, rng)
    assert (np.triu(dense, 1) > 0).sum() == 15 and not np.tril(dense).any()


def test_bench_rows_agree_with_networkx():
    cfg = OmegaConf.create(
        {
            "families": ["attention", "dense"],
            "sizes": [6, 10],
            "graphs": [4, 2],
            "tau": 0.05,
            "tolerance": 1e-9,
            "seed": 1,
        }
    )
    rows = bench_maxflow(cfg, console=Console(quiet=True))
    assert [(r["family"], r["nodes"], r["graphs"]) for r in rows] == [
        ("attention", 6, 4),
        ("attention", 10, 2),
        ("dense", 6, 4),
        ("dense", 10, 2),
    ]
    assert all(r["max_abs_diff"] <= 1e-9 and r["ours_s"] > 0 and r["networkx_s"] > 0 for r in rows)
    cap = dense_capacity(8, np.random.default_rng(3))
    flow, delta = step_importance(cap)
    ref_flow, ref_delta = networkx_importance(cap)
    assert flow == pytest.approx(ref_flow) and delta == pytest.approx(ref_delta)
    with pytest.raises(ValueError, match="differ in length"):
        bench_maxflow(OmegaConf.merge(cfg, {"graphs": [1]}), console=Console(quiet=True))


@pytest.mark.slow
def test_maxflow_suite_from_the_command_line(tmp_path):
    proc = run_module(
        "sarl.bench", "suite=maxflow", "maxflow.sizes=[6,8]", "maxflow.graphs=[3,2]", f"hydra.run.dir={tmp_path}"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "speed-up" in proc.stdout and "identical to networkx" in proc.stdout
    rows = json.loads((tmp_path / "bench.json").read_text())["maxflow"]
    assert len(rows) == 4 and all(r["speedup"] > 0 for r in rows)
