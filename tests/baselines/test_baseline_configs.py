"""Every baseline reward config composes and instantiates (conf/reward/*.yaml)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from baselines.empo import EMPOReward
from baselines.evol_rl import EvolRLReward
from baselines.ground_truth import GroundTruthReward
from baselines.ttrl import TTRLReward
from sarl.interface import Reward

CONF = str(Path(__file__).resolve().parents[2] / "conf")
FAKE_EMBEDDER = {"_target_": "baseline_fakes.TableEmbedder", "dim": 4}


def reward_config(name):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="score", overrides=[f"reward={name}"])
    if "embedder" in cfg.reward and cfg.reward.embedder is not None:
        cfg.reward.embedder = FAKE_EMBEDDER  # no model download in tests
    return cfg.reward


@pytest.mark.parametrize(
    "name, cls, params",
    [
        ("ground_truth", GroundTruthReward, {}),
        ("ttrl", TTRLReward, {"n_votes": 8, "n_samples": 8, "seed": 0}),
        ("empo", EMPOReward, {"mode": "math", "threshold": 0.9, "low": 0.3, "high": 1.0, "embedder": None}),
        ("empo_open_ended", EMPOReward, {"mode": "open_ended", "low": 0.3, "high": 1.0}),
        ("evol_rl", EvolRLReward, {"alpha": 0.5, "eps": 1e-8}),
    ],
)
def test_baseline_configs_instantiate(name, cls, params):
    reward = instantiate(reward_config(name))
    assert isinstance(reward, cls) and isinstance(reward, Reward)
    for key, value in params.items():
        assert getattr(reward, key) == value
    if name in ("empo_open_ended", "evol_rl"):
        assert type(reward.embedder).__name__ == "TableEmbedder"


def test_embedder_comes_from_the_embedding_group():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="score", overrides=["reward=evol_rl", "embedding=vllm_server"])
    assert cfg.reward.embedder._target_ == "sarl.embed.http.HTTPEmbedder"
    assert cfg.reward.embedder.model == "Qwen/Qwen3-Embedding-0.6B"
