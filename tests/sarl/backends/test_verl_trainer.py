"""Our verl V1 trainer (sarl.backends.verl.trainer) on verl 0.9.1's own classes, built from the
config sarl.train writes: the plain functions on literal values, the config for group rewards,
the entry point, and (slow) the reward hook against a real TransferQueue in a local Ray, plus
the TaskRunner shim in a Ray actor process."""

import math
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from testkit import verl_config_for

pytest.importorskip("transfer_queue")

import transfer_queue as tq  # noqa: E402
from verl.trainer.ppo.v1 import get_trainer_cls  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from sarl.backends.verl.backend import launch_command  # noqa: E402
from sarl.backends.verl.config import TRAINER_NAME, validate_verl_config  # noqa: E402
from sarl.backends.verl.trainer import (  # noqa: E402
    SarlTaskRunner,
    SarlTrainer,
    group_sessions,
    is_truncated,
    jagged_scores,
    left_out_sessions,
    parse_key,
    rollout_batch,
    streamed_reward_metrics,
    trained_sessions,
)
from sarl.contract.reward import RewardsFailedError  # noqa: E402
from sarl.contract.selection import select_for_training  # noqa: E402

# -- plain functions ----------------------------------------------------------------------------


def test_keys_parse_into_uid_session_and_output_index():
    uid = "3f2a9c1e-7b4d-4e55-9a0b-1c2d3e4f5a6b"  # verl's uids are uuid4 strings
    assert parse_key(f"{uid}_12_0") == (uid, 12, 0)
    for bad in ("no-session", f"{uid}_x_0", f"{uid}_1"):
        with pytest.raises(ValueError, match="session_id"):
            parse_key(bad)


def test_sessions_group_rows_with_the_last_output_last():
    keys = ["a_1_0", "b_0_0", "a_0_1", "a_0_0", "b_1_0"]  # completion order, a_0 has two outputs
    assert group_sessions(keys) == {("a", 1): [0], ("b", 0): [1], ("a", 0): [3, 2], ("b", 1): [4]}


def test_trained_subset_is_seeded_per_prompt_and_ignores_completion_order():
    sessions = [("p", i) for i in range(8)] + [("q", i) for i in range(8)]
    keep, short = trained_sessions(sessions, 3, seed=5)
    assert short == 0 and len(keep) == 6
    assert sum(s[0] == "p" for s in keep) == 3 and sum(s[0] == "q" for s in keep) == 3
    shuffled = [sessions[i] for i in np.random.default_rng(0).permutation(len(sessions))]
    assert trained_sessions(shuffled, 3, seed=5) == (keep, 0)  # any arrival order, same subset
    # exactly select_for_training over the session ids in order (TTRL's seeded draw)
    p_rows = select_for_training(["p"] * 8, 3, 5)
    assert [s for s in keep if s[0] == "p"] == [("p", i) for i in p_rows]
    draws = {tuple(trained_sessions(sessions, 3, seed=s)[0]) for s in range(6)}
    assert len(draws) > 1  # the seed matters


def test_a_prompt_with_failed_rollouts_keeps_what_it_has_and_is_counted():
    sessions = [("p", i) for i in range(4)] + [("q", 0), ("q", 2)]
    keep, short = trained_sessions(sessions, 3, seed=0)
    assert short == 1 and ("q", 0) in keep and ("q", 2) in keep and len(keep) == 5


def test_failed_sessions_and_groups_without_two_usable_ones_are_left_out():
    failed = {("p", 0): False, ("p", 1): True, ("p", 2): False, ("q", 0): True, ("q", 1): False, ("r", 0): False}
    out, dropped = left_out_sessions(failed, min_usable=2)
    assert out == {("p", 1), ("q", 0), ("q", 1), ("r", 0)} and dropped == 2  # q has one usable, r one session
    out, dropped = left_out_sessions(failed, min_usable=1)  # GAE: no group baseline, only failures go
    assert out == {("p", 1), ("q", 0)} and dropped == 0


def test_the_stop_message_counts_failed_rewards_and_truncated_responses_apart():
    """With train.mask_truncated, a batch left with no usable reward names what failed and what was cut."""
    from types import SimpleNamespace

    state = SimpleNamespace(failed_streak=0, max_failed_steps=1, global_steps=7)
    with pytest.raises(RewardsFailedError, match=r"last: 0 of 8 rewards failed, 8 truncated responses left out"):
        SarlTrainer._count_failed_step(state, None, True, 0, 8, {}, n_truncated=8)
    state.failed_streak = 0
    with pytest.raises(RewardsFailedError, match=r"last: 3 of 8 rewards failed, 4 truncated .*, no group has two"):
        SarlTrainer._count_failed_step(state, None, True, 3, 8, {}, n_truncated=4)
    state.failed_streak = 0
    with pytest.raises(RewardsFailedError, match=r"last: 8 of 8 rewards failed\)"):
        SarlTrainer._count_failed_step(state, None, True, 8, 8, {})


def test_a_response_is_truncated_when_it_reaches_the_cap_without_an_end_token():
    assert is_truncated([5, 6, 7], cap=3, eos_ids={9})
    assert not is_truncated([5, 6, 9], cap=3, eos_ids={9})  # ends exactly at the cap: complete
    assert not is_truncated([5, 6], cap=3, eos_ids={9})
    assert is_truncated([5, 6, 7, 8], cap=3, eos_ids=set())


def test_group_rewards_read_the_rows_user_prompt_not_the_templated_one():
    """The group path scores the user prompt the data row carries, as the per-response path does (MaxFlow's node 0
    in the joint LCS + MaxFlow rows); the decoded chat-templated prompt only where the row has none."""
    batch = rollout_batch(
        ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "templated"],
        ["4", "5"],
        ["u0", "u1"],
        [{"ground_truth": "4"}, {"ground_truth": "5"}],
        ["s", "s"],
        [{"user_prompt": "What is 2+2?"}, {"index": 1}],
    )
    assert batch.prompts == ["What is 2+2?", "templated"]
    assert batch.ground_truths == ["4", "5"]


def test_jagged_scores_put_the_score_on_the_last_token():
    rm, empty = jagged_scores([0.5, -1.0, 2.0], [3, 1, 0])
    rows = rm.unbind()
    assert rows[0].tolist() == [0.0, 0.0, 0.5] and rows[1].tolist() == [-1.0] and rows[2].numel() == 0
    assert empty == 1 and rm.offsets().tolist() == [0, 3, 4, 4]


def test_streamed_metrics_from_the_reward_info_verl_keeps_per_rollout():
    infos = [
        {"reward_extra_info": {"score": 1.0, "C": 1.0, "L": 1.0, "failed": 0.0}, "min_global_steps": 0},
        {"reward_extra_info": {"score": 0.5, "C": 0.0, "L": math.nan, "failed": 0.0}},
        {"reward_extra_info": {"score": 0.0, "C": 0.0, "L": math.nan, "failed": 1.0}},
        {"min_global_steps": 0},  # no reward info: counted, never silently dropped
    ]
    m = streamed_reward_metrics(infos)
    assert m["reward/score/mean"] == pytest.approx(0.5) and m["reward/score/std"] == pytest.approx(math.sqrt(1 / 6))
    assert m["reward/C/mean"] == pytest.approx(1 / 3) and m["reward/L/mean"] == 1.0  # L over rows defining it
    assert m["reward/failed"] == 1.0 and m["reward/missing_info"] == 1.0


# -- config -------------------------------------------------------------------------------------


def verl_config(tmp_path, model_dir, *overrides):
    return verl_config_for(overrides, tmp_path, model_dir, validate=False)[1]


@pytest.mark.slow
@pytest.mark.parametrize("exp", ["grpo_ttrl64_math", "grpo_evol_rl_math"])
def test_group_reward_rows_vote_on_64_and_train_on_32(exp, tmp_path, tiny_qwen3_dir):
    v = verl_config(tmp_path, tiny_qwen3_dir, f"+exp={exp}")
    validate_verl_config(v)
    assert v.trainer.use_v1 is True and v.trainer.v1.trainer_mode == TRAINER_NAME
    assert v.actor_rollout_ref.rollout.n == 32 and v.trainer.v1[TRAINER_NAME].n_votes == 64
    assert v.reward.custom_reward_function.path is None and v.reward.num_workers == 0  # no per-sample path
    assert v.reward.custom_reward_function.reward_kwargs.reward._target_.startswith("baselines.")


def test_per_response_rewards_keep_the_streaming_reward_function(tmp_path, tiny_qwen3_dir):
    v = verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_sarl_math")
    assert v.trainer.v1.trainer_mode == TRAINER_NAME and v.actor_rollout_ref.rollout.n == 8
    assert v.reward.custom_reward_function.path == "pkg://sarl.backends.verl.reward" and v.reward.num_workers == 8
    with pytest.raises(ValueError, match="needs a group reward"):
        verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_sarl_math", "train.n_trained=4")
    with pytest.raises(ValueError, match="must lie in"):
        verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_ttrl_math", "train.n_trained=9")


def test_ttrl_votes_must_match_the_rollouts(tmp_path, tiny_qwen3_dir):
    v = verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_ttrl_math", "train.rollout_n=16", "train.n_trained=4")
    assert v.trainer.v1[TRAINER_NAME].n_votes == 16 and v.actor_rollout_ref.rollout.n == 4  # conf/reward/ttrl follows
    with pytest.raises(ValueError, match="reward.n_votes=16 but train.rollout_n=8"):
        verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_ttrl_math", "reward.n_votes=16")
    with pytest.raises(ValueError, match="reward.n_samples=16 but train.n_trained=32"):
        verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_ttrl64_math", "reward.n_samples=16")


def test_the_algorithm_config_registers_its_advantage_estimator(tmp_path, tiny_qwen3_dir):
    """PASC-GRPO's `scae` is registered from conf/algorithm/pasc_grpo.yaml (adv_estimator_register), in the
    trainer's process; verl's own estimators register nothing."""
    from verl.trainer.ppo import core_algos

    from sarl.backends.verl.trainer import register_adv_estimator

    assert (
        verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_sarl_math").trainer.v1[TRAINER_NAME].adv_estimator_register
        is None
    )
    v = verl_config(tmp_path, tiny_qwen3_dir, "+exp=pasc_grpo_grp_math")
    assert v.algorithm.adv_estimator == "scae"
    assert v.trainer.v1[TRAINER_NAME].adv_estimator_register == "baselines.pasc_grpo.register_verl"
    core_algos.ADV_ESTIMATOR_REGISTRY.pop("scae", None)
    register_adv_estimator(v)
    assert core_algos.get_adv_estimator_fn("scae").__name__ == "compute_scae_outcome_advantage"


# -- the trainer object -------------------------------------------------------------------------

TTRL4 = ["reward=ttrl", "train.rollout_n=4", "train.n_trained=2", "reward.n_votes=4", "reward.n_samples=2"]


@pytest.fixture
def ttrl_trainer(tmp_path, tiny_qwen3_dir, byte_tokenizer):
    """verl's registry gives our class for the configured name; __init__ is verl's own on the real
    config (no GPU is touched before `init()`); the tokenizer is what `_setup` would load."""
    config = verl_config(tmp_path, tiny_qwen3_dir, *TTRL4)
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    trainer.tokenizer = byte_tokenizer
    return trainer


def test_registered_trainer_runs_verls_sync_mode_with_the_vote_settings(ttrl_trainer):
    t = ttrl_trainer
    assert type(t) is SarlTrainer and t.trainer_mode == "sync" and t.config.trainer.v1.trainer_mode == "sync"
    assert t.group_reward and t.n_votes == 4 and t.selection_seed == 0 and t.reward.n_samples == 2
    assert type(t.replay_buffer).__name__ == "ReplayBuffer"  # the sync buffer, not the async one


def test_setup_hides_the_reward_workers_from_the_agent_loop_and_the_step(ttrl_trainer, monkeypatch):
    class Manager:
        reward_loop_worker_handles = ["worker"]
        marker = "inner"

    monkeypatch.setattr(PPOTrainer, "_setup", lambda self: setattr(self, "reward_loop_manager", Manager()))
    ttrl_trainer._setup()
    assert ttrl_trainer.get_reward_handles() is None  # what TaskRunnerV1 hands the agent loop (l.130)
    assert ttrl_trainer.reward_loop_manager.reward_loop_worker_handles is None  # what _step_once reads
    assert ttrl_trainer.reward_loop_manager.marker == "inner"


def test_per_response_reward_keeps_verls_streaming_workers(tmp_path, tiny_qwen3_dir, monkeypatch):
    class Manager:
        reward_loop_worker_handles = ["worker"]

    config = verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_sarl_math")
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    assert not trainer.group_reward and trainer.reward is None  # the reward lives in verl's reward workers
    monkeypatch.setattr(PPOTrainer, "_setup", lambda self: setattr(self, "reward_loop_manager", Manager()))
    trainer._setup()
    assert trainer.get_reward_handles() == ["worker"]


def test_train_batches_ask_the_agent_loop_for_n_votes_rollouts(ttrl_trainer):
    ttrl_trainer.global_steps = 3
    ttrl_trainer.train_dataloader = [{"raw_prompt": np.array([[{"role": "user", "content": "q"}]] * 2, dtype=object)}]
    ttrl_trainer.train_dataloader_it = None
    ttrl_trainer.config.data.train_batch_size = 2
    batch = ttrl_trainer._next_train_batch()
    assert batch["__rollout_n__"] == 4 and batch["global_steps"] == 3
    assert all(chunk["__rollout_n__"] == 4 for chunk in batch.chunk(2))  # as AgentLoopManagerTQ splits it


def test_group_trainer_refuses_dapo_filtering(tmp_path, tiny_qwen3_dir):
    config = verl_config(tmp_path, tiny_qwen3_dir, *TTRL4)
    config.algorithm.filter_groups.enable = True
    with pytest.raises(ValueError, match="filter_groups"):
        SarlTrainer(config)


def test_entry_point_runs_verls_ppo_with_our_task_runner(tmp_path, tiny_qwen3_dir, monkeypatch):
    import sarl.backends.verl.main as entry

    (tmp_path / "verl_trainer.yaml").write_text(OmegaConf.to_yaml(verl_config(tmp_path, tiny_qwen3_dir, *TTRL4)))
    seen = {}
    monkeypatch.setattr(
        entry, "run_ppo", lambda config, task_runner_class: seen.update(config=config, cls=task_runner_class)
    )
    monkeypatch.chdir(tmp_path)
    args = launch_command(tmp_path, "sarl.backends.verl.main")[3:]  # sarl.train's own arguments
    monkeypatch.setattr(sys, "argv", ["main", *args])
    entry.main()
    assert seen["cls"] is SarlTaskRunner and seen["config"].trainer.v1.trainer_mode == TRAINER_NAME
    assert seen["config"].actor_rollout_ref.rollout.n == 2
    assert (tmp_path / "verl_hydra" / "config.yaml").is_file() and not (tmp_path / "outputs").exists()


# -- against a real TransferQueue (local Ray, CPU) ----------------------------------------------


@pytest.fixture(scope="module")
def transfer_queue():
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="sarl-test")
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield tq
    tq.close()
    ray.shutdown()


def put_rollouts(tokenizer, partition, rollouts):
    """Rows laid out as verl's agent loop puts them (agent_loop_tq.py:176-216): the output's fields,
    the dataset row's fields, a `{uid}_{session}_{index}` key and the status tags."""
    keys, fields, tags = [], [], []
    for uid, session, prompt, response, gold in rollouts:
        p = torch.tensor(tokenizer(prompt, add_special_tokens=False)["input_ids"], dtype=torch.int64)
        r = torch.tensor(tokenizer(response, add_special_tokens=False)["input_ids"], dtype=torch.int64)
        keys.append(f"{uid}_{session}_0")
        fields.append(
            {
                "prompts": p,
                "responses": r,
                "response_mask": torch.ones_like(r),
                "input_ids": torch.cat([p, r]),
                "num_turns": 2,
                "extra_fields": {"min_global_steps": 0, "max_global_steps": 0},
                "uid": uid,
                "session_id": session,
                "data_source": "math",
                "reward_model": {"ground_truth": gold, "style": "rule"},
                "extra_info": {"index": 0},
                "raw_prompt": [{"role": "user", "content": prompt}],
            }
        )
        tags.append({"status": "success", "seq_len": len(p) + len(r), "min_global_steps": 0, "max_global_steps": 0})
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields), tags=tags)
    return tq.KVBatchMeta(partition_id=partition, keys=keys, tags=tags)


# two prompts, four votes each, arriving interleaved; p1's majority answer is 4 (3 of 4), p2's is 7 (2 of 4)
VOTES = {
    ("p1", 0): "x \\boxed{4}",
    ("p1", 1): "y \\boxed{5}",
    ("p1", 2): "z \\boxed{4}",
    ("p1", 3): "w \\boxed{4}",
    ("p2", 0): "\\boxed{7}",
    ("p2", 1): "none",
    ("p2", 2): "a \\boxed{7}",
    ("p2", 3): "b \\boxed{8}",
}
GOLD = {"p1": "4", "p2": "8"}


def rollouts_in_completion_order():
    order = [("p2", 3), ("p1", 1), ("p1", 0), ("p2", 0), ("p1", 3), ("p2", 2), ("p1", 2), ("p2", 1)]
    return [(u, s, f"question {u}", VOTES[(u, s)], GOLD[u]) for u, s in order]


@pytest.mark.slow
def test_group_reward_scores_by_uid_writes_verls_fields_and_keeps_n_trained(transfer_queue, ttrl_trainer):
    batch = put_rollouts(ttrl_trainer.tokenizer, "train", rollouts_in_completion_order())
    metrics = {}
    out = ttrl_trainer._compute_reward_colocate(batch, metrics=metrics)

    expected = {
        k: float(k[0] == "p1" and VOTES[k].endswith("{4}") or k[0] == "p2" and VOTES[k].endswith("{7}")) for k in VOTES
    }
    keep, _ = trained_sessions(list(VOTES), 2, seed=0)
    assert sorted(parse_key(k)[:2] for k in out.keys) == keep  # 2 of each prompt's 4 votes
    assert [t for t in out.tags] == [batch.tags[batch.keys.index(k)] for k in out.keys]
    listed = tq.kv_list("train")["train"]
    assert set(listed) == set(out.keys)  # the dropped votes are gone from TransferQueue

    data = tq.kv_batch_get(
        keys=out.keys, partition_id="train", select_fields=["rm_scores", "responses", "extra_fields"]
    )
    for key, scores, resp, extra in zip(
        out.keys, data["rm_scores"].unbind(), data["responses"].unbind(), data.get("extra_fields").tolist()
    ):
        session = parse_key(key)[:2]
        assert len(scores) == len(resp) and scores[-1].item() == expected[session] and scores[:-1].abs().sum() == 0
        info = extra["reward_extra_info"]
        assert info["score"] == expected[session] and extra["min_global_steps"] == 0  # verl's own fields kept
        assert info["majority_ratio"] == (0.75 if session[0] == "p1" else 0.5)
        assert info["acc"] == float(VOTES[session].endswith("{" + GOLD[session[0]] + "}"))

    # metrics over all 8 votes: rewards 1,0,1,1 | 1,0,1,0; TTRL diagnostics against the hidden gold
    assert metrics["reward/score/mean"] == pytest.approx(5 / 8) and metrics["reward/failed"] == 0.0
    assert metrics["reward/no_answer/mean"] == pytest.approx(1 / 8)  # "none": no answer, reward 0, not a failure
    assert metrics["reward/majority_ratio/mean"] == pytest.approx(0.625)
    assert metrics["reward/label_accuracy/mean"] == pytest.approx(0.5)  # p1's label is right, p2's is not
    assert metrics["reward/acc/mean"] == pytest.approx(4 / 8)
    assert metrics["reward/voted_sessions"] == 8 and metrics["reward/trained_sessions"] == 4
    assert metrics["reward/short_groups"] == 0 and metrics["reward/empty_responses"] == 0
    tq.kv_clear(keys=out.keys, partition_id="train")


@pytest.mark.slow
def test_validation_batches_are_scored_and_kept_whole(transfer_queue, ttrl_trainer):
    batch = put_rollouts(ttrl_trainer.tokenizer, "val", rollouts_in_completion_order())
    out = ttrl_trainer._compute_reward_colocate(batch)  # _validate passes no metrics (l.1083)
    assert out.keys == batch.keys
    data = tq.kv_batch_get(keys=out.keys, partition_id="val", select_fields=["rm_scores", "extra_fields"])
    # what verl's _validate reads: the summed rm_scores and the reward info of each rollout
    assert data["rm_scores"].sum(dim=1).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert all("acc" in e["reward_extra_info"] for e in data.get("extra_fields").tolist())
    tq.kv_clear(keys=out.keys, partition_id="val")


@pytest.mark.slow
def test_per_response_metrics_are_added_to_verls_step_metrics(transfer_queue, tmp_path, tiny_qwen3_dir, byte_tokenizer):
    """verl's own `_compute_metrics` on a trained batch, then our `reward/*` from the streamed info."""
    config = verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_sarl_math")
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    trainer.tokenizer = byte_tokenizer
    trainer._init_resource_pool_mgr()
    batch = put_rollouts(byte_tokenizer, "train", [("u", s, "q", "<think>a\n\nb</think> 1", "1") for s in range(3)])
    infos = [
        {"score": 0.5, "sr": 0.5, "L": 1.0, "failed": 0.0},
        {"score": 0.0, "sr": 0.0, "L": math.nan, "failed": 1.0},
        {"score": 1.0, "sr": 1.0, "L": 1.0, "failed": 0.0},
    ]
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["responses", "extra_fields"])
    lengths = [len(r) for r in data["responses"].unbind()]
    rm, _ = jagged_scores([i["score"] for i in infos], lengths)
    zeros = torch.nested.as_nested_tensor([torch.zeros(n) for n in lengths], layout=torch.jagged)
    extra = [{**e, "reward_extra_info": i} for e, i in zip(data.get("extra_fields").tolist(), infos)]
    fields = {"rm_scores": rm, "advantages": zeros, "returns": zeros, "extra_fields": extra}
    from verl.utils import tensordict_utils as tu

    tq.kv_batch_put(keys=batch.keys, partition_id="train", fields=tu.get_tensordict(fields))
    metrics = {}
    trainer._compute_metrics(batch, metrics, {"step": 1.0, "gen": 0.5}, global_steps=1, epoch=0)
    assert metrics["critic/score/mean"] == pytest.approx(0.5)  # verl's own metric, still there
    assert metrics["reward/score/mean"] == pytest.approx(0.5) and metrics["reward/failed"] == 1.0
    assert metrics["reward/sr/mean"] == pytest.approx(0.5) and metrics["reward/L/mean"] == 1.0
    assert metrics["reward/missing_info"] == 0.0
    tq.kv_clear(keys=batch.keys, partition_id="train")


def put_reward_infos(batch, failed_rows):
    from verl.utils import tensordict_utils as tu

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    extra = [
        {**e, "reward_extra_info": {"score": 0.0 if i in failed_rows else 1.0, "failed": float(i in failed_rows)}}
        for i, e in enumerate(data.get("extra_fields").tolist())
    ]
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=tu.get_tensordict({"extra_fields": extra}))


@pytest.mark.slow
def test_failed_rewards_are_cleared_from_the_training_batch_before_advantages(
    transfer_queue, tmp_path, tiny_qwen3_dir, byte_tokenizer, monkeypatch
):
    """Per-response rewards (the reward info verl's agent loop stored): p1 keeps its 3 usable sessions, p2 has
    one usable of 4 and is dropped; what reaches verl's batch balancing (and the advantage) is p1's three."""
    config = verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_sarl_math")
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    trainer.tokenizer = byte_tokenizer
    batch = put_rollouts(byte_tokenizer, "train", rollouts_in_completion_order())
    failed_rows = {i for i, key in enumerate(batch.keys) if key in ("p1_1_0", "p2_0_0", "p2_1_0", "p2_3_0")}
    put_reward_infos(batch, failed_rows)
    seen = []
    monkeypatch.setattr(PPOTrainer, "_balance_batch", lambda self, b, metrics, **kw: seen.append(b) or b)
    metrics = {}
    out = trainer._balance_batch(batch, metrics)
    assert sorted(out.keys) == ["p1_0_0", "p1_2_0", "p1_3_0"] and seen == [out]
    assert metrics["reward/left_out"] == 5.0 and metrics["reward/groups_dropped"] == 1.0
    stored = set(tq.kv_list(partition_id="train").get("train", {}))
    assert stored == {"p1_0_0", "p1_2_0", "p1_3_0"}  # the left-out rows are cleared from TransferQueue
    tq.kv_clear(keys=out.keys, partition_id="train")


def all_failed_batch(tokenizer):
    batch = put_rollouts(tokenizer, "train", rollouts_in_completion_order())
    put_reward_infos(batch, set(range(len(batch))))
    return batch


@pytest.mark.slow
def test_a_step_with_no_usable_reward_skips_its_update_and_max_failed_steps_stop_the_run(
    transfer_queue, tmp_path, tiny_qwen3_dir, byte_tokenizer, monkeypatch
):
    """train.max_failed_steps=2 reaches the trainer; for a training batch with no usable reward the rest of
    verl's step (log-probs, advantages, updates) does not run and the step's data metrics skip it; a batch with
    usable rewards resets the count; the second such batch in a row stops the run."""
    config = verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_sarl_math", "train.max_failed_steps=2")
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    trainer.tokenizer = byte_tokenizer
    trainer.global_steps = 1
    assert trainer.max_failed_steps == 2 and trainer.failed_streak == 0
    batches = []
    update = []

    def verls_step(self, metrics, timing_raw, sample_batch_size):  # verl's _step_once from step 3 on
        batch = self._balance_batch(batches.pop(0), metrics)
        update.append(batch.keys)  # what old_log_prob ... update_actor would run on
        return batch

    monkeypatch.setattr(PPOTrainer, "_balance_batch", lambda self, b, metrics, **kw: b)
    monkeypatch.setattr(PPOTrainer, "_step_once", verls_step)

    batches.append(all_failed_batch(byte_tokenizer))
    metrics = {}
    out = trainer._step_once(metrics, {}, 4)
    assert len(out.keys) == 8 and out.partition_id == "train" and update == []  # no update for this batch
    assert metrics["reward/update_skipped"] == 1.0 and metrics["reward/failed_streak"] == 1.0
    assert metrics["reward/left_out"] == 8.0
    step_metrics = {}
    trainer._compute_metrics(out, step_metrics, {"step": 1.0}, global_steps=1, epoch=0)
    assert step_metrics == {"training/global_step": 1, "training/epoch": 0}
    tq.kv_clear(keys=out.keys, partition_id="train")  # what verl's fit does after the step

    trainer.global_steps = 2  # a usable batch trains and resets the count
    batches.append(put_rollouts(byte_tokenizer, "train", rollouts_in_completion_order()))
    put_reward_infos(batches[0], set())
    metrics = {}
    out = trainer._step_once(metrics, {}, 4)
    assert len(out.keys) == 8 and update == [out.keys]
    assert metrics["reward/update_skipped"] == 0.0 and metrics["reward/failed_streak"] == 0.0
    tq.kv_clear(keys=out.keys, partition_id="train")

    for step in (3, 4):
        trainer.global_steps = step
        batches.append(all_failed_batch(byte_tokenizer))
        if step == 3:
            tq.kv_clear(keys=trainer._step_once({}, {}, 4).keys, partition_id="train")
            continue
        with pytest.raises(RewardsFailedError, match=r"no usable reward in 2 consecutive steps \(up to step 4; "
                           r"train.max_failed_steps=2; last: 8 of 8 rewards failed\)"):  # fmt: skip
            trainer._step_once({}, {}, 4)
    tq.kv_clear(keys=list(tq.kv_list(partition_id="train").get("train", {})), partition_id="train")
    assert len(update) == 1


def test_max_failed_steps_reaches_the_verl_trainer_config(tmp_path, tiny_qwen3_dir):
    assert verl_config(tmp_path, tiny_qwen3_dir).trainer.v1[TRAINER_NAME].max_failed_steps == 3  # conf/train.yaml
    v = verl_config(tmp_path, tiny_qwen3_dir, "train.max_failed_steps=null")
    assert v.trainer.v1[TRAINER_NAME].max_failed_steps is None
    v = verl_config(tmp_path, tiny_qwen3_dir, *TTRL4, "train.max_failed_steps=5")
    assert v.trainer.v1[TRAINER_NAME].max_failed_steps == 5 and v.trainer.v1[TRAINER_NAME].n_votes == 4


def test_entry_point_stops_with_one_line_when_the_rewards_keep_failing(tmp_path, tiny_qwen3_dir, monkeypatch, capsys):
    import sarl.backends.verl.main as entry

    (tmp_path / "verl_trainer.yaml").write_text(OmegaConf.to_yaml(verl_config(tmp_path, tiny_qwen3_dir, *TTRL4)))

    def failing_run(config, task_runner_class):
        try:
            raise RewardsFailedError("no usable reward in 3 consecutive steps")
        except RewardsFailedError as err:
            raise RuntimeError("the Ray task failed") from err  # the error arrives wrapped

    monkeypatch.setattr(entry, "run_ppo", failing_run)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main", *launch_command(tmp_path, "sarl.backends.verl.main")[3:]])
    with pytest.raises(SystemExit) as info:
        entry.main()
    assert info.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "training stopped: no usable reward in 3 consecutive steps"
    )
    monkeypatch.setattr(entry, "run_ppo", lambda config, task_runner_class: 1 / 0)
    with pytest.raises(SystemExit):  # any other error is not ours to shorten: Hydra reports it as ever
        entry.main()
    err = capsys.readouterr().err
    assert "ZeroDivisionError" in err and "training stopped" not in err


@pytest.mark.slow
def test_a_rewards_failed_error_in_a_ray_actor_is_found_behind_rays_error(transfer_queue):
    import ray

    from sarl.backends.verl.main import rewards_failed

    @ray.remote
    def stop():
        raise RewardsFailedError("no usable reward in 2 consecutive steps")

    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(stop.remote())
    found = rewards_failed(info.value)
    assert type(found) is RewardsFailedError and str(found) == "no usable reward in 2 consecutive steps"
    assert rewards_failed(RuntimeError("other")) is None


@pytest.mark.slow
def test_truncated_responses_are_left_out_of_reward_and_gradient_when_masking_is_on(
    transfer_queue, tmp_path, tiny_qwen3_dir, byte_tokenizer, monkeypatch
):
    """train.mask_truncated (Structured Reasoning App. A.4.4): p1 loses its one cut response (the one that ends
    in the end token at the cap is complete and stays), p2 keeps one usable of four and is dropped; with masking
    off every response is trained on."""
    cap, eos = 6, byte_tokenizer.eos_token_id
    ids = {"cut": [5] * cap, "ended": [5] * (cap - 1) + [eos], "short": [5, 6], "question": [7, 8]}

    def tokens(text, add_special_tokens=False):  # the token ids put_rollouts stores, chosen directly
        return {"input_ids": ids[text]}

    kinds = {("p1", 0): "cut", ("p1", 1): "short", ("p1", 2): "short", ("p1", 3): "ended"}
    kinds.update({("p2", 0): "cut", ("p2", 1): "cut", ("p2", 2): "cut", ("p2", 3): "short"})
    rollouts = [(u, s, "question", kind, "4") for (u, s), kind in kinds.items()]
    monkeypatch.setattr(PPOTrainer, "_balance_batch", lambda self, b, metrics, **kw: b)
    for masked in (True, False):
        config = verl_config(
            tmp_path,
            tiny_qwen3_dir,
            "+exp=grpo_sarl_math",
            f"train.mask_truncated={str(masked).lower()}",
            f"train.max_response_length={cap}",
        )
        assert config.trainer.v1[TRAINER_NAME].mask_truncated is masked
        trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
        trainer.tokenizer = byte_tokenizer
        batch = put_rollouts(tokens, "train", rollouts)
        put_reward_infos(batch, set())
        metrics = {}
        out = trainer._balance_batch(batch, metrics)
        if masked:
            assert sorted(out.keys) == ["p1_1_0", "p1_2_0", "p1_3_0"]
            assert metrics["response/truncated_left_out"] == 4.0
            assert metrics["reward/left_out"] == 5.0 and metrics["reward/groups_dropped"] == 1.0
        else:
            assert sorted(out.keys) == sorted(batch.keys) and "response/truncated_left_out" not in metrics
        tq.kv_clear(keys=out.keys, partition_id="train")


def tagged_rows(n):
    from sarl.formats.tags import structured_prompt

    prompts = [[{"role": "user", "content": structured_prompt(f"question {i}")}] for i in range(n)]
    infos = [{"index": i, "id": f"r{i}", "user_prompt": p[0]["content"]} for i, p in enumerate(prompts)]
    return prompts, infos


def test_tags_are_redrawn_per_sampled_prompt_seeded_by_row_and_epoch(tmp_path, tiny_qwen3_dir):
    """train.resample_tags (Structured Reasoning App. A.4): the prompt the agent loop renders and the
    user_prompt the rewards read carry the draw of (seed, row id, epoch)."""
    from sarl.formats.tags import TOP_TAGS, draw_key, question_of, randomized_prompt

    config = verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_lcs_math", "train.resample_tags=true", "seed=3")
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    assert trainer.resample_tags_seed == 3
    prompts, infos = tagged_rows(2)
    trainer.steps_per_epoch = 2
    trainer.config.data.train_batch_size = 2
    seen = {}
    for step in (1, 2, 3):
        trainer.global_steps = step
        trainer.train_dataloader = [{"raw_prompt": np.array(prompts, dtype=object), "extra_info": np.array(infos)}]
        trainer.train_dataloader_it = None
        batch = trainer._next_train_batch()
        got = [m[0]["content"] for m in list(batch["raw_prompt"])]
        epoch = (step - 1) // 2
        assert got == [randomized_prompt(f"question {i}", seed=3, key=draw_key(f"r{i}", epoch)) for i in range(2)]
        assert [e["user_prompt"] for e in list(batch["extra_info"])] == got
        assert all(
            question_of(g) == f"question {i}" and all(f"<{t}>" in g for t in TOP_TAGS) for i, g in enumerate(got)
        )
        seen[step] = got
        assert trainer._tags_redrawn[1] == 2  # drawn: logged as data/tag_sets_drawn (changed: data/tag_sets_changed)
    assert seen[1] == seen[2] and seen[3] != seen[1]  # one draw per epoch
    off = verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_sarl_math")  # off by default
    assert off.trainer.v1[TRAINER_NAME].resample_tags is False
    on = verl_config(tmp_path, tiny_qwen3_dir, "+exp=grpo_lcs_math")  # on in the Structured Reasoning rows
    assert on.trainer.v1[TRAINER_NAME].resample_tags is True


def test_trl_redraws_the_tags_of_a_generation_batch_per_epoch():
    import json
    from types import SimpleNamespace

    from sarl.backends.trl.trainer import SarlGRPOTrainer
    from sarl.formats.tags import draw_key, randomized_prompt

    prompts, infos = tagged_rows(2)
    rows = [{"prompt": p, "extra_info_json": json.dumps(e)} for p, e in zip(prompts, infos) for _ in range(3)]
    fake = SimpleNamespace(state=SimpleNamespace(epoch=1.4), resample_tags_seed=5)
    out = SarlGRPOTrainer._with_redrawn_tags(fake, rows)
    want = [randomized_prompt(f"question {i}", seed=5, key=draw_key(f"r{i}", 1)) for i in range(2)]
    assert [r["prompt"][0]["content"] for r in out] == [want[0]] * 3 + [want[1]] * 3  # a group shares its prompt
    assert [json.loads(r["extra_info_json"])["user_prompt"] for r in out] == [want[0]] * 3 + [want[1]] * 3


@pytest.mark.slow
def test_task_runner_actor_finds_our_trainer_in_its_own_process(transfer_queue, tmp_path, tiny_qwen3_dir):
    """verl's TaskRunnerV1 looks the trainer up inside its Ray actor (main_ppo.py:141): ours is
    registered there (its failure comes from SarlTrainer's own check), verl's is not.
    Must stay the last test of this module: the actor's `run` closes TransferQueue when it ends, and a later
    test that uses TransferQueue would wait on it forever."""
    import ray
    from verl.trainer.main_ppo import TaskRunnerV1

    config = verl_config(tmp_path, tiny_qwen3_dir, *TTRL4)
    config.algorithm.filter_groups.enable = True
    with pytest.raises(ray.exceptions.RayTaskError, match="Unknown trainer 'sarl'"):
        ray.get(TaskRunnerV1.remote().run.remote(config))
    with pytest.raises(ray.exceptions.RayTaskError, match="disable filter_groups"):
        ray.get(SarlTaskRunner.remote().run.remote(config))
