"""The clustering settings said once, in conf/reward/sarl.yaml: the evaluation's structure statistics (conf/eval.yaml)
and the structure benchmarks (conf/bench.yaml) compose that file and restate none of its values, so a change of the
reward's setting reaches both."""

import shutil

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from testkit import bench_config

import eval.scoring as scoring
from eval.config import compose_eval_config
from eval.data import Problem
from eval.protocol import Benchmark
from sarl.bench.__main__ import effective_config
from sarl.bench.structure import reward_settings
from sarl.runtime.files import CONF_DIR

REWARD = yaml.safe_load((CONF_DIR / "reward" / "sarl.yaml").read_text())
# The reward's settings the structure statistics and benchmarks use, none restated where they are composed.
SETTINGS = ("variant", "clustering", "k_rule", "seed", "delimiter", "delimiter_regex", "no_think", "max_steps")


def test_eval_and_bench_compose_the_reward_file_and_restate_none_of_its_settings():
    composed = {
        "eval": compose_eval_config(["ckpt=x"]).structure.reward,
        "bench structure": bench_config().structure.reward,
        "bench reward_step": bench_config().reward_step.reward,
    }
    expected = {k: v for k, v in REWARD.items() if k != "embedder"}
    for where, node in composed.items():
        assert {k: v for k, v in OmegaConf.to_container(node).items() if k != "embedder"} == expected, where
    for name in ("eval.yaml", "bench.yaml"):
        text = (CONF_DIR / name).read_text()
        restated = [k for k in ("variant", "k_rule", "delimiter", "no_think", "max_steps") if f"  {k}:" in text]
        assert not restated, (name, restated)
    clustering = OmegaConf.to_container(compose_eval_config(["ckpt=x"]).structure.clustering)
    assert clustering["math"] == clustering["code"] == "${structure.reward.clustering}"  # the reward's own


def compose_from(conf, name):
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(config_name=name, overrides=["ckpt=x"] if name == "eval" else [])


def test_an_edit_of_the_reward_file_reaches_eval_and_bench(tmp_path):
    """conf/ copied, its reward/sarl.yaml edited: eval and bench compose the edited values."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    edited = {**REWARD, "clustering": "hdbscan", "k_rule": "log2", "seed": 7, "variant": "c_only", "max_steps": 9}
    (conf / "reward" / "sarl.yaml").write_text(yaml.safe_dump(edited))
    eval_cfg = compose_from(conf, "eval")
    bench = compose_from(conf, "bench")
    for node in (eval_cfg.structure.reward, bench.structure.reward, bench.reward_step.reward):
        assert {k: node[k] for k in SETTINGS} == {k: edited[k] for k in SETTINGS}
    assert (eval_cfg.structure.clustering.math, eval_cfg.structure.clustering.code) == ("hdbscan", "hdbscan")
    assert eval_cfg.structure.clustering.wildbench == "hdbscan"
    assert reward_settings(bench.structure.reward, "kmeans") == {"seed": 7, "k_rule": "log2"}
    assert reward_settings(bench.structure.reward, "hdbscan") == {"seed": 7, "k_rule": "sqrt"}  # no k rule


@pytest.mark.parametrize("clustering", ["kmeans", "hdbscan"])
def test_the_evaluation_builds_the_reward_from_its_settings(monkeypatch, tmp_path, clustering):
    """`eval.scoring.structure_all` builds the structure reward from `structure.reward` (a command-line change of
    it included) with the benchmark kind's clustering, the reward's own for math."""
    cfg = compose_eval_config(
        ["ckpt=x", "structure.reward.k_rule=log2", "structure.reward.seed=7", "structure.reward.variant=l_only",
         f"structure.reward.clustering={clustering}"]
    )  # fmt: skip
    OmegaConf.update(cfg, "embedding", {"_target_": "fakes.KeywordEmbedder"}, merge=False)
    built = []

    def spy(node, **kwargs):
        built.append(scoring_build(node, **kwargs))
        return built[-1]

    scoring_build = scoring.build_reward
    monkeypatch.setattr(scoring, "build_reward", spy)
    problems = [Problem("toy_math", "p1", 0, [{"role": "user", "content": "q"}])]
    texts = {("toy_math", "p1", 0): "<think>plan it\n\ncalc it\n\ncheck it\n\nplan again</think> 4"}
    records = scoring.structure_all(cfg, [Benchmark("toy_math", "math", problems, 1)], texts, tmp_path)
    (reward,) = built
    assert (reward.clustering, reward.seed, reward.variant) == (clustering, 7, "l_only")
    assert reward.k_rule == ("log2" if clustering == "kmeans" else "sqrt")
    assert records[("toy_math", "p1", 0)]["n_steps"] == 4 and records[("toy_math", "p1", 0)]["failed"] is None


def test_the_bench_sections_keep_the_reward_settings_in_quick_mode():
    for suite in ("structure", "reward_step"):
        section = effective_config(bench_config([f"suite={suite}", "quick=true", f"{suite}.reward.seed=5"]))
        assert section.reward.seed == 5 and section.reward.k_rule == REWARD["k_rule"]
        assert section.reward.embedder is None  # the suites make their own vectors
