"""Both routes from verl to a reward, on CPU from real tokenizer output: a per-response reward through verl's own
reward manager calling our `compute_score` (what verl's reward workers run), a group reward through the trainer's
`score_sessions` (what `SarlTrainer._compute_reward_colocate` runs on a sampled batch)."""

import asyncio
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from fakes import KeywordEmbedder, PromptRecorder
from omegaconf import OmegaConf

from sarl.backends.verl.reward import is_group_reward
from sarl.contract.metrics import row_metrics
from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch
from sarl.structure.reward import StructureReward

verl = pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
from sarl.backends.verl.trainer import score_sessions  # noqa: E402

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


def sampled_columns(tokenizer, prompts, responses, golds=None, extra_info=None):
    """A sampled batch's columns as `_compute_reward_colocate` reads them from TransferQueue: token ids for the prompt
    and the response, the dataset row's reward_model, data_source and extra_info."""
    n = len(responses)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in (*prompts, *responses)]
    return {
        "prompts": ids[:n],
        "responses": ids[n:],
        "reward_model": [{"ground_truth": g, "style": "rule"} for g in (golds or [None] * n)],
        "data_source": ["math"] * n,
        "extra_info": extra_info or [{"index": i} for i in range(n)],
    }


def decoder(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


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


def test_group_reward_sees_each_prompts_rollouts_whatever_the_order(tokenizer):
    """The trainer's group route: rows in completion order (a prompt's sessions interleaved), scored grouped by the uid
    of their TransferQueue keys; any order gives each row the same reward info."""
    responses = ["a", "bbbb", "cc", "dddddd", "e", "ff"]
    keys = ["p1_0_0", "p2_0_0", "p1_1_0", "p2_1_0", "p1_2_0", "p2_2_0"]  # interleaved, as they finish
    cols = sampled_columns(tokenizer, ["q"] * 6, responses)
    sessions, infos, per_row = score_sessions(GroupRank(), keys, cols, decoder(tokenizer))
    assert [i["score"] for i in per_row] == [0, 0, 1, 1, 0, 0]  # "cc" wins p1, "dddddd" wins p2
    assert [i["group_size"] for i in per_row] == [3.0] * 6 and len(sessions) == len(infos) == 6
    perm = [5, 0, 3, 2, 4, 1]
    permuted = {name: [col[i] for i in perm] for name, col in cols.items()}
    _, _, per_row2 = score_sessions(GroupRank(), [keys[i] for i in perm], permuted, decoder(tokenizer))
    assert per_row2 == [per_row[i] for i in perm]


def test_a_sessions_reward_is_its_final_outputs_copied_to_its_other_outputs(tokenizer):
    """An agent loop may emit several outputs per session (verl rewards the last and copies it): the group reward sees
    one row per session, and its info lands on every output of the session."""
    keys = ["p1_0_1", "p1_1_0", "p1_0_0"]  # session 0 has two outputs, its final one (index 1) first
    cols = sampled_columns(tokenizer, ["q"] * 3, ["final longest", "b", "x"])
    sessions, infos, per_row = score_sessions(GroupRank(), keys, cols, decoder(tokenizer))
    assert sessions == {("p1", 0): [2, 0], ("p1", 1): [1]} and [i["group_size"] for i in infos] == [2.0, 2.0]
    assert [i["score"] for i in per_row] == [1.0, 0.0, 1.0]  # "x" (not final) carries its session's reward


def test_a_row_whose_key_names_no_prompt_uid_is_a_clear_error(tokenizer):
    with pytest.raises(ValueError, match="session_id"):
        score_sessions(GroupRank(), ["no-uid"], sampled_columns(tokenizer, ["q"], ["a"]), decoder(tokenizer))


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
    direct = StructureReward(KeywordEmbedder())(RolloutBatch.from_columns(responses=RESPONSES))
    assert [r["reward_score"] for r in results] == pytest.approx([o.score for o in direct])
    assert direct[0].score == pytest.approx(1.0)  # plan -> calc -> check triangle
    infos = [r["reward_extra_info"] for r in results]
    assert {tuple(sorted(i)) for i in infos} == {tuple(sorted({*StructureReward.diagnostic_keys, "score", "failed"}))}
    assert np.isnan(infos[2]["L"]) and infos[2]["n_nodes"] == 1  # every key on every row, as verl stacks them
    metrics = row_metrics(infos)  # what SarlTrainer._compute_metrics logs from them
    assert metrics["reward/failed"] == 0 and "reward/C/mean" in metrics and "reward/sr/mean" in metrics


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


def test_group_route_takes_the_prepared_user_prompt_over_the_decoded_template(tokenizer):
    prompts = PromptRecorder()
    cols = sampled_columns(
        tokenizer, ["q a", "q b"], ["a", "b"], extra_info=[{"index": 0, "user_prompt": "What is x?"}, {"index": 1}]
    )
    score_sessions(prompts, ["u1_0_0", "u2_0_0"], cols, decoder(tokenizer))
    assert prompts.prompts == ["What is x?", "q b"]  # the second row has none: its decoded prompt tokens


def test_a_reward_that_cannot_be_built_fails_each_call_counted_on_both_paths(tokenizer, monkeypatch):
    """A reward whose constructor raises in a reward worker (per-sample path) or in the trainer (group path) scores
    every response as a failed reward naming the error (left out, counted: the trainer stops the run after
    train.max_failed_steps), built once per process, not an exception into verl's reward loop."""
    import sarl.backends.verl.reward as bridge

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "fixtures" / "rewards"))
    monkeypatch.setattr(bridge, "_REWARDS", {})
    cfg = {"_target_": "sarl_raising_reward.RaisingInitReward"}

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
    keys = ["u1_0_0", "u1_1_0", "u2_0_0", "u2_1_0"]
    _, infos, per_row = score_sessions(obj, keys, sampled_columns(tokenizer, ["q"] * 4, RESPONSES), decoder(tokenizer))
    assert row_metrics(infos)["reward/failed"] == 4.0 and [i["score"] for i in per_row] == [0.0] * 4  # group route
