"""The reward's kernels run on the threads its config gives them (`reward.threads`), not on pools sized to the node."""

import numpy as np
import pytest
from omegaconf import OmegaConf

import sarl.structure.cluster as cluster
import sarl.structure.kernels as kernels
import sarl.structure.reward as structure_reward
from sarl.backends.verl.config import reward_cores_problem
from sarl.bench.reward_step import StandInEmbedder, paper_batch
from sarl.contract.reward import RolloutBatch, build_reward
from sarl.contract.threads import limited, pool_sizes, run_each
from sarl.launch.compose import compose_train_config, validate_train_values
from sarl.runtime.errors import UserError
from sarl.structure.embed import base


def test_limited_caps_every_pool_inside_and_restores_it():
    before = pool_sizes()
    assert before  # numpy's BLAS at least
    with limited(1):
        assert set(pool_sizes().values()) == {1}
    assert pool_sizes() == before
    with limited(None):
        assert pool_sizes() == before
    with pytest.raises(ValueError, match="at least 1 thread"):
        with limited(0):
            pass


def test_the_structure_stage_runs_on_the_rewards_threads(monkeypatch):
    seen = []
    real = structure_reward.structure_metrics_from_embeddings

    def spy(*args, **kwargs):
        seen.append(pool_sizes())
        return real(*args, **kwargs)

    monkeypatch.setattr(structure_reward, "structure_metrics_from_embeddings", spy)
    node = {"_target_": "sarl.structure.reward.StructureReward", "embedder": {"_target_": "fakes.KeywordEmbedder"}}
    batch = RolloutBatch(
        prompts=["q"] * 2, responses=["<think>plan\n\ncalc\n\ncheck</think> 1", "<think>a\n\nb</think>"]
    )
    reward = build_reward({**node, "threads": 1})
    reward(batch)
    assert reward.threads == 1 and set(seen[-1].values()) == {1}
    assert build_reward(node).threads == 1  # no key: the class default, 1
    unlimited = build_reward({**node, "threads": None})
    unlimited(batch)
    assert unlimited.threads is None and seen[-1] == pool_sizes()  # null: the pools as the process has them
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(Exception, match="reward.threads"):  # Hydra wraps the constructor's ValueError
            build_reward({**node, "threads": bad})
    with pytest.raises(UserError, match=r"reward.threads=0: must be an integer >= 1"):  # sarl.train says it in a line
        validate_train_values(compose_train_config(["+exp=grpo_sarl_math", "reward.threads=0"])[0])


def test_a_joint_rewards_components_share_its_cap():
    cfg, _ = compose_train_config(["+exp=grpo_lcs_maxflow_math", "reward.threads=2"])
    composed = OmegaConf.to_container(cfg.reward, resolve=True)
    assert composed["threads"] == 2 and composed["components"]["maxflow"]["threads"] == 1  # from maxflow.yaml
    structure = {"_target_": "sarl.structure.reward.StructureReward", "embedder": {"_target_": "fakes.KeywordEmbedder"}}
    node = {  # the same shape with components that build here (no attention model)
        "_target_": "baselines.combine.WeightedSumReward",
        "components": {"a": {**structure, "threads": 1}, "b": {**structure, "threads": 1}},
        "weights": {"a": 1.0, "b": 1.0},
        "threads": 2,
    }
    reward = build_reward(node)
    assert reward.threads == 2 and {c.threads for c in reward.components.values()} == {2}  # the joint reward's cap


def test_reward_workers_times_threads_must_fit_the_nodes_cores():
    cfg, _ = compose_train_config(["+exp=grpo_sarl_math"])
    reward = {"_target_": "sarl.structure.reward.StructureReward", "threads": 1}
    assert cfg.backend.reward_num_workers == 8
    assert reward_cores_problem(cfg, reward, cores=64) is None
    problem = reward_cores_problem(cfg, {**reward, "threads": 16}, cores=64)
    assert problem.startswith("backend.reward_num_workers=8 x reward.threads=16 = 128 threads, more than the 64 cores")
    group = {"_target_": "baselines.ttrl.TTRLReward", "threads": 2}  # a group reward: the trainer is its one process
    assert reward_cores_problem(cfg, group, cores=2) is None


def test_run_each_runs_every_item_once_and_raises_the_first_failure_as_a_loop_would():
    for threads in (None, 1, 2, 5):
        seen = []
        run_each(range(50), seen.append, threads)
        assert sorted(seen) == list(range(50))

    def fail(i):
        if i in (7, 31):
            raise ValueError(f"item {i}")

    for threads in (1, 4):
        with pytest.raises(ValueError, match="item 7"):
            run_each(range(50), fail, threads)


def test_the_reward_on_two_threads_gives_what_one_thread_gives():
    """The steps are normalised and the responses clustered side by side, each with a one-thread BLAS."""

    batch = paper_batch(rollouts=40, steps_mean=12, seed=3)
    outputs = {}
    for threads in (1, 2):
        reward = structure_reward.StructureReward(StandInEmbedder(32, seed=0), threads=threads)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(base, "CHUNK_ROWS", 16)  # several chunks of steps
            outputs[threads] = reward(batch)
    assert [o.score for o in outputs[2]] == [o.score for o in outputs[1]]
    assert [o.diagnostics for o in outputs[2]] == [o.diagnostics for o in outputs[1]]
    seen = []
    real = kernels.kmeans_labels

    def spy(*args):
        seen.append(pool_sizes())
        return real(*args)

    with pytest.MonkeyPatch.context() as mp, limited(2):
        mp.setattr(kernels, "kmeans_labels", spy)
        cluster.cluster_batch(list(np.random.default_rng(0).normal(size=(6, 5, 4))), threads=2)
    blas = [{api: n for api, n in pools.items() if api in ("openblas", "mkl", "blis")} for pools in seen]
    assert len(seen) == 6 and all(set(pools.values()) == {1} for pools in blas)  # 2 responses x 1 BLAS thread
