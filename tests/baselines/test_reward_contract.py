"""Every reward a `conf/reward/*.yaml` file names satisfies the reward contract (sarl.contract.reward.Reward) and
counts its failures once, through `RewardFunction.__call__`."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from sarl.contract.reward import Reward, RewardFunction, RolloutBatch, contract_problems, reward_class

CONF = Path(__file__).resolve().parents[2] / "conf"
REWARDS = sorted(p.stem for p in (CONF / "reward").glob("*.yaml"))
FAKE_EMBEDDER = {"_target_": "baseline_fakes.TableEmbedder", "dim": 4}  # knows no text: every embedding fails


def reward_config(name, model_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="score", overrides=[f"reward={name}"]).reward
    nodes = [cfg, *cfg.get("components", {}).values()]
    for node in nodes:
        if node.get("embedder") is not None:
            node.embedder = FAKE_EMBEDDER  # no model download in tests
        if "model" in node and "layers" in node:  # MaxFlow: the tiny policy's attention, on CPU
            node.model, node.layers, node.device = model_path, [-1], "cpu"
    return cfg


def test_every_reward_config_is_tested():
    assert len(REWARDS) >= 12 and {"sarl", "ground_truth", "ttrl", "lcs_maxflow", "code_exec"} <= set(REWARDS)


@pytest.mark.parametrize("name", REWARDS)
def test_reward_config_satisfies_the_contract_and_counts_failures_once(name, tiny_qwen3):
    cfg = reward_config(name, tiny_qwen3[0])
    cls = reward_class(cfg._target_)  # what the verl bridge reads before building the reward
    assert issubclass(cls, RewardFunction) and contract_problems(cls) == []
    reward = instantiate(cfg)
    assert isinstance(reward, Reward) and contract_problems(reward) == []
    assert isinstance(reward.group_reward, bool) and reward.group_reward == cls.group_reward
    assert isinstance(reward.needs_prompt, bool) and all(isinstance(k, str) for k in reward.diagnostic_keys)
    ready = reward.check_ready()
    assert ready is None or "cannot embed" in ready  # the fake embedder knows no text
    batch = RolloutBatch(
        prompts=["What is 2 plus 3?"] * 4,
        responses=["<think>2 plus 3</think> \\boxed{5}", "<think>so</think> \\boxed{6}", None, "\\boxed{5}"],
        group_ids=["g"] * 4,
        ground_truths=["5", "5", "5", None],
    )
    outputs = reward(batch)
    failed = [o.failed.split(":")[0] for o in outputs if o.failed]
    assert len(outputs) == 4 and failed, f"{name}: the unusable rows did not fail"
    assert sorted(reward.failure_counts.elements()) == sorted(failed)  # counted once, by reason category
    reward(batch)
    assert sum(reward.failure_counts.values()) == 2 * len(failed)


def test_a_class_without_the_contract_is_refused():
    class Bare:
        def __call__(self, batch):
            return []

    assert contract_problems(Bare) == ["group_reward", "needs_prompt", "diagnostic_keys", "check_ready"]
    assert "failure_counts" in contract_problems(Bare())
    with pytest.raises(TypeError, match="Bare is not a reward: it lacks group_reward"):
        from sarl.contract.reward import check_reward

        check_reward(Bare())
