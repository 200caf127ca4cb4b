"""Every reward config (conf/reward/*.yaml) composes and instantiates into the `Reward` its `_target_` names, with
the settings its paper gives."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig
from testkit import tiny_qwen3

from sarl.contract.reward import Reward

CONF = Path(__file__).resolve().parents[2] / "conf"
REWARDS = sorted(p.stem for p in (CONF / "reward").glob("*.yaml"))
FAKE_EMBEDDER = {"_target_": "baseline_fakes.TableEmbedder", "dim": 4}

# settings the configs must carry (attribute -> value), where a paper or a decision fixes them
EXPECTED = {
    "ttrl": {"n_votes": 8, "n_samples": 8, "seed": 0},
    "empo": {"mode": "math", "threshold": 0.9, "low": 0.3, "high": 1.0, "embedder": None},
    "empo_open_ended": {"mode": "open_ended", "low": 0.3, "high": 1.0},
    "evol_rl": {"alpha": 0.5, "eps": 1e-8},  # EVOL-RL Table 3, App. C.5
    "sarl": {"variant": "sarl", "clustering": "kmeans", "k_rule": "sqrt", "delimiter": "\n\n"},  # SARL Sec. 3.2
    "sarl_c_only": {"variant": "c_only"},
    "sarl_l_only": {"variant": "l_only"},
    "lcs": {"lcs_weight": 1.0, "format_weight": 1.0},  # Structured Reasoning App. A.4.4
    "maxflow": {"tau": 0.05, "maxflow_weight": 2.0, "format_weight": 1.0},  # Structured Reasoning Sec. 4.3, A.4.4
    "lcs_maxflow": {"weights": {"maxflow": 1.0, "lcs": 1.0}},  # Structured Reasoning Table 11: FLOW:LCS 1:1
    "code_exec": {"mode": "all_pass"},  # GRP Eq. 14: a binary r_acc (decisions §8)
    "grp_code": {"outcome": "code_exec", "combine": "sum"},  # GRP on code: r_acc the execution outcome (decisions §4)
}


def reward_config(name, model_dir=None):
    """The composed reward config, with a table embedder for any embedder (no model download in tests) and the
    tiny checkpoint for any reward that reads a policy's attention (`model: null` outside sarl.train)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="score", overrides=[f"reward={name}"])

    def patch(node):
        if "embedder" in node and node.embedder is not None:
            node.embedder = FAKE_EMBEDDER
        if "model" in node and node.model is None and model_dir is not None:
            node.model = model_dir
        for value in node.values():
            if isinstance(value, DictConfig):
                patch(value)

    patch(cfg.reward)
    return cfg.reward


@pytest.fixture(scope="module")
def five_layer_checkpoint(tmp_path_factory, byte_tokenizer):
    """A tiny checkpoint deep enough for the MaxFlow reward's layers (the last five, Structured Reasoning Sec. 4.3)."""
    path = tmp_path_factory.mktemp("tiny_qwen3_5_layers")
    tiny_qwen3(
        byte_tokenizer, path, weights=True, num_hidden_layers=5, hidden_size=64, intermediate_size=128, head_dim=32
    )
    return str(path)


@pytest.mark.parametrize("name", REWARDS)
def test_every_reward_config_instantiates(name, five_layer_checkpoint):
    cfg = reward_config(name, model_dir=five_layer_checkpoint)
    reward = instantiate(cfg)
    assert type(reward) is get_class(cfg._target_) and isinstance(reward, Reward)
    for key, value in EXPECTED.get(name, {}).items():
        assert getattr(reward, key) == value, key
    if "embedder" in cfg and cfg.embedder is not None:
        assert type(reward.embedder).__name__ == "TableEmbedder"


def test_joint_weighs_flow_and_lcs_one_to_one_with_the_format_score_once(five_layer_checkpoint):
    """Structured Reasoning Table 11, FLOW:LCS 1:1: score = 1 * r_maxflow + 1 * r_lcs + 1 * format (decisions §5)."""
    joint = instantiate(reward_config("lcs_maxflow", model_dir=five_layer_checkpoint))
    flow, lcs = joint.components["maxflow"], joint.components["lcs"]
    assert joint.weights["maxflow"] * flow.maxflow_weight == joint.weights["lcs"] * lcs.lcs_weight == 1.0
    assert joint.weights["maxflow"] * flow.format_weight + joint.weights["lcs"] * lcs.format_weight == 1.0


def test_expectations_name_existing_reward_configs():
    assert set(EXPECTED) <= set(REWARDS)


def test_embedder_comes_from_the_embedding_group():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="score", overrides=["reward=evol_rl", "embedding=vllm_server"])
    assert cfg.reward.embedder._target_ == "sarl.serving.http.HTTPEmbedder"
    assert cfg.reward.embedder.model == "Qwen/Qwen3-Embedding-0.6B"
