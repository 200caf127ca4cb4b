"""The verl reward bridge on real verl objects (DataProto, NaiveRewardManager) built on CPU
from real tokenizer output."""

import asyncio
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from fakes import KeywordEmbedder
from omegaconf import OmegaConf

from sarl.backends.verl.reward import is_group_reward, reward_dataproto, rollout_batch_from_dataproto, row_metrics
from sarl.contract.reward import RewardFunction, RewardOutput
from sarl.structure.reward import StructureReward

verl = pytest.importorskip("verl")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "data"

RESPONSES = [
    "<think>plan it\n\ncalc one\n\ncheck it\n\nplan two\n\ncalc two\n\ncheck two\n\n"
    "plan 3\n\ncalc 3\n\ncheck 3</think> 1",
    "<think>plan\n\ncalc</think> 2",
    "no reasoning at all",
    "<think>calc a\n\ncheck b\n\ncalc c\n\ncheck d</think> 4",
]


@pytest.fixture(scope="module")
def tokenizer(byte_tokenizer):
    return byte_tokenizer


def test_per_response_reward_on_a_dataproto(tokenizer, verl_batch):
    data = verl_batch(tokenizer, ["question a"] * 4, RESPONSES, ["u1", "u1", "u2", "u2"])
    reward = StructureReward(KeywordEmbedder())
    out, metrics = reward_dataproto(data, reward, tokenizer)
    scores = out.batch["rm_scores"]
    assert scores.shape == data.batch["responses"].shape
    resp_len = data.batch["attention_mask"][:, data.batch["prompts"].shape[1] :].sum(1)
    decoded = rollout_batch_from_dataproto(data, tokenizer)
    assert decoded.responses == RESPONSES and decoded.group_ids == ["u1", "u1", "u2", "u2"]
    expected = [o.score for o in reward(decoded)]
    for i in range(4):
        assert scores[i, resp_len[i] - 1].item() == pytest.approx(expected[i])
        assert scores[i].sum().item() == pytest.approx(expected[i])
    assert expected[0] == pytest.approx(1.0)  # plan -> calc -> check triangle
    assert set(out.meta_info["reward_extra_keys"]) == set(StructureReward.diagnostic_keys) | {"failed"}
    assert np.isnan(out.non_tensor_batch["L"][2]) and out.non_tensor_batch["n_nodes"][2] == 1
    assert metrics["reward/failed"] == 0 and "reward/C/mean" in metrics and "reward/sr/mean" in metrics
    merged = data.union(out)  # verl merges reward output into the batch by union
    assert "rm_scores" in merged.batch.keys()


class GroupRank(RewardFunction):
    """A group reward test double: 1 for the longest response of each prompt, else 0."""

    group_reward = True
    diagnostic_keys = ("group_size",)

    def score(self, batch):
        outs = [None] * len(batch)
        for _, idx in batch.groups().items():
            best = max(idx, key=lambda i: (len(batch.responses[i]), -i))
            for i in idx:
                outs[i] = RewardOutput(score=float(i == best), diagnostics={"group_size": float(len(idx))})
        return outs


def test_group_reward_sees_each_prompts_rollouts_whatever_the_order(tokenizer, verl_batch):
    responses = ["a", "bbbb", "cc", "dddddd", "e", "ff"]
    uids = ["p1", "p2", "p1", "p2", "p1", "p2"]  # interleaved, as balance_batch may leave them
    data = verl_batch(tokenizer, ["q"] * 6, responses, uids)
    out, _ = reward_dataproto(data, GroupRank(), tokenizer)
    scores = out.batch["rm_scores"].sum(1).tolist()
    assert scores == [0, 0, 1, 1, 0, 0]  # "cc" wins p1, "dddddd" wins p2
    assert out.non_tensor_batch["group_size"].tolist() == [3.0] * 6
    perm = [5, 0, 3, 2, 4, 1]
    out2, _ = reward_dataproto(data.select_idxs(perm), GroupRank(), tokenizer)
    assert out2.batch["rm_scores"].sum(1).tolist() == [scores[i] for i in perm]


def test_row_metrics_worked_values_and_a_non_number_is_an_error():
    rows = [
        {"score": 1.0, "C": 1.0, "L": np.nan, "failed": 0.0},
        {"score": 0.0, "C": np.nan, "L": np.nan, "failed": 1.0},
    ]
    # C over the rows that define it; L defined nowhere gives no metric; failed is a count
    assert row_metrics(rows) == {
        "reward/score/mean": 0.5,
        "reward/score/std": 0.5,
        "reward/failed": 1.0,
        "reward/C/mean": 1.0,
    }
    with pytest.raises(TypeError, match="'C'"):
        row_metrics([{"score": 1.0, "C": "high"}])


def test_group_rewards_are_known_by_their_class_without_building_them():
    assert is_group_reward({"_target_": "baselines.ttrl.TTRLReward", "n_votes": 4})
    assert is_group_reward({"_target_": "baselines.evol_rl.EvolRLReward", "embedder": {"_target_": "nowhere.Missing"}})
    assert not is_group_reward({"_target_": "sarl.structure.reward.StructureReward"}) and not is_group_reward({})


def test_missing_uid_is_a_clear_error(tokenizer, verl_batch):
    data = verl_batch(tokenizer, ["q"], ["a"], ["u"])
    data.non_tensor_batch.pop("uid")
    with pytest.raises(KeyError, match="uid"):
        reward_dataproto(data, GroupRank(), tokenizer)


def test_per_sample_path_through_verls_own_reward_manager(tokenizer, verl_batch):
    """verl loads our compute_score from config and its NaiveRewardManager calls it once per
    sample; concurrent calls are micro-batched into one reward call."""
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    import sarl.backends.verl.reward as bridge

    reward_cfg = {
        "_target_": "sarl.structure.reward.StructureReward",
        "embedder": {"_target_": "fakes.KeywordEmbedder"},
    }
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://sarl.backends.verl.reward",
                    "name": "compute_score",
                    "reward_kwargs": {"reward": reward_cfg},
                }
            }
        }
    )
    fn = get_custom_reward_fn(config)
    data = verl_batch(tokenizer, ["q"] * 4, RESPONSES, ["u1", "u1", "u2", "u2"])

    async def run_all():
        manager = NaiveRewardManager(config, tokenizer, fn)
        return await asyncio.gather(*[manager.run_single(data[i : i + 1]) for i in range(len(data))])

    results = asyncio.run(run_all())
    obj = bridge.reward_from_config(reward_cfg)
    assert len(obj.embedder.calls) == 1  # four samples, one batched reward call
    direct = StructureReward(KeywordEmbedder())(bridge.rollout_batch_from_dataproto(data, tokenizer))
    assert [r["reward_score"] for r in results] == pytest.approx([o.score for o in direct])
    keys = {tuple(sorted(r["reward_extra_info"])) for r in results}
    assert len(keys) == 1  # every sample reports the same keys, as verl stacks them
    assert {"score", "sr", "C", "L", "failed"} <= set(next(iter(keys)))


def _custom_reward_config(reward_cfg):
    """The part of verl's trainer config that its reward loop reads for a custom reward function."""
    return OmegaConf.create(
        {
            "reward": {
                "reward_manager": {"source": "register", "name": "naive"},  # verl 0.9.1's default
                "custom_reward_function": {
                    "path": "pkg://sarl.backends.verl.reward",
                    "name": "compute_score",
                    "reward_kwargs": {"reward": reward_cfg},
                },
            }
        }
    )


@pytest.mark.parametrize(
    "dataset, source",  # the three prompt styles of the math builder: plain, structured, structured_fixed
    [
        ("aime_1983_2024", "aime_1983_2024.csv"),
        ("aime_1983_2024_structured", "aime_1983_2024.csv"),
        ("aime25_structured", "aime25.jsonl"),
    ],
)
def test_verls_reward_manager_gives_a_prompt_reward_the_prepared_user_prompt(
    dataset, source, tmp_path, tokenizer, verl_batch
):
    """Rows written by `sarl.data.prepare`, through verl's own reward manager (the one its reward loop loads
    for reward.custom_reward_function): the reward sees the user message the policy was prompted with."""
    from verl.trainer.ppo.reward import load_reward_manager

    import sarl.backends.verl.reward as bridge
    from sarl.data.prepare import compose_prepare_config, prepare

    prepare(
        compose_prepare_config(
            [f"dataset={dataset}", f"paths.root={tmp_path}", f"source.local_file={FIXTURES / source}"]
            + ["expected_count=null"]
        )
    )
    (parquet,) = (tmp_path / "data" / dataset).glob("*.parquet")
    rows = pq.read_table(parquet).to_pylist()[:3]
    user_prompts = [r["prompt"][-1]["content"] for r in rows]
    data = verl_batch(tokenizer, user_prompts, ["<think>a</think> 1"] * 3, ["u1", "u2", "u3"])
    for key in ("data_source", "reward_model", "extra_info"):
        data.non_tensor_batch[key] = np.array([r[key] for r in rows], dtype=object)
    reward_cfg = {"_target_": "fakes.PromptRecorder", "name": dataset}
    config = _custom_reward_config(reward_cfg)

    async def run_all():
        manager = load_reward_manager(config, tokenizer)
        return await asyncio.gather(*[manager.run_single(data[i : i + 1]) for i in range(len(data))])

    results = asyncio.run(run_all())
    assert [r["reward_score"] for r in results] == [1.0, 1.0, 1.0]
    assert sorted(bridge.reward_from_config(reward_cfg).prompts) == sorted(user_prompts)
    assert all(p.strip() for p in user_prompts)


def test_a_prompt_reward_on_a_row_without_the_prepared_prompt_fails_naming_data_preparation():
    import sarl.backends.verl.reward as bridge

    reward_cfg = {"_target_": "fakes.PromptRecorder", "name": "no-prompt"}
    with pytest.raises(KeyError, match="user_prompt.*python -m sarl.data.prepare"):
        asyncio.run(bridge.compute_score("aime", "<think>a</think> 1", ["1"], {"index": 0}, reward=reward_cfg))
    assert bridge.reward_from_config(reward_cfg).prompts == []


def test_group_path_takes_the_prepared_user_prompt_over_the_decoded_template(tokenizer, verl_batch):
    data = verl_batch(tokenizer, ["q a", "q b"], ["a", "b"], ["u1", "u2"])
    data.non_tensor_batch["extra_info"] = np.array([{"index": 0, "user_prompt": "What is x?"}, {"index": 1}])
    batch = rollout_batch_from_dataproto(data, tokenizer)
    assert batch.prompts == ["What is x?", "q b"]  # the second row has none: its decoded prompt tokens


def test_a_reward_that_cannot_be_built_fails_each_call_counted_on_both_paths(tokenizer, verl_batch, monkeypatch):
    """A reward whose constructor raises in a reward worker (per-sample path) or in the trainer (group path) scores
    every response as a failed reward naming the error (left out, counted: the trainer stops the run after
    train.max_failed_steps), built once per process, not an exception into verl's reward loop."""
    import sarl.backends.verl.reward as bridge

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "fixtures" / "rewards"))
    monkeypatch.setattr(bridge, "_REWARDS", {})
    cfg = {"_target_": "sarl_raising_reward.RaisingInitReward"}
    data = verl_batch(tokenizer, ["q"] * 4, RESPONSES, ["u1", "u1", "u2", "u2"])

    async def per_sample():
        return await asyncio.gather(*[bridge.compute_score("math", r, None, {}, reward=cfg) for r in RESPONSES])

    rows = asyncio.run(per_sample())
    assert rows == [{"score": 0.0, "failed": 1.0}] * 4
    obj = bridge.reward_from_config(cfg)
    assert isinstance(obj, bridge.RewardNotBuilt) and obj is bridge.reward_from_config(cfg)  # built (tried) once
    assert (
        obj.why
        == "RaisingInitReward could not be built: FileNotFoundError: the reward's model file is not on this node"
    )
    out, metrics = reward_dataproto(data, obj, tokenizer)  # the group path: what the trainer does with it
    assert metrics["reward/failed"] == 4.0 and out.batch["rm_scores"].sum().item() == 0.0
