"""Rows of the other methods' papers carry those papers' settings into the verl config, and the train keys for
lr schedules, validation temperature and truncation masking reach verl (defaults: verl's own, so SARL's rows
do not change)."""

import pytest
from omegaconf import OmegaConf
from testkit import structured_prompt_rows, verl_config_for

from sarl.launch.compose import compose_train_config

pytest.importorskip("verl")
from sarl.backends.verl.config import build_verl_config, compose_verl_base  # noqa: E402


@pytest.mark.slow
def test_evol_rl_paper_row_has_the_papers_table_2_and_3_settings(tmp_path, tiny_qwen3_dir):
    """EVOL-RL App. C.2 and C.6 (Tables 2-3): train batch 8 prompts, PPO mini-batch 1 prompt (x 32 trained
    rollouts = "effective size of 32"), so 8 / 1 = 8 updates per step; micro-batch 2; 64 votes, 32 trained;
    responses up to 12,288 tokens; temperature 1.0, validation 0.6 (sampled); lr 5e-7; KL loss 0.001;
    entropy 0.003; clip high 0.28; novelty alpha 0.5."""
    cfg, v = verl_config_for(["+exp=evol_rl_paper"], tmp_path, tiny_qwen3_dir)
    a, r, d = v.actor_rollout_ref.actor, v.actor_rollout_ref.rollout, v.data
    assert d.train_batch_size == 8 and a.ppo_mini_batch_size == 1 and a.ppo_micro_batch_size_per_gpu == 2
    assert d.train_batch_size // a.ppo_mini_batch_size == 8  # optimiser updates per step
    assert r.n == 32 and v.trainer.v1.sarl.n_votes == 64 and a.ppo_mini_batch_size * r.n == 32
    assert d.max_response_length == 12288
    assert r.temperature == 1.0 and r.val_kwargs.temperature == 0.6 and r.val_kwargs.do_sample is True
    assert a.optim.lr == 5e-7 and a.use_kl_loss is True and a.kl_loss_coef == 0.001
    assert a.entropy_coeff == 0.003 and a.clip_ratio_high == 0.28
    assert v.algorithm.adv_estimator == "grpo"
    assert v.reward.custom_reward_function.reward_kwargs.reward.alpha == 0.5
    # App. C.2: Qwen3-4B-Base; its 8B rows by one override
    assert compose_train_config(["+exp=evol_rl_paper"])[0].model.path == "Qwen/Qwen3-4B-Base"
    # App. C.1, C.3: MATH-TRAIN with SimpleRL-Zoo's system prompt
    assert cfg.data.name == "math_train" and cfg.data.prompt_suffix is None
    assert cfg.data.system_prompt == "Please reason step by step, and put your final answer within \\boxed{}."
    assert compose_train_config(["+exp=evol_rl_paper", "model=qwen3_8b_base"])[0].model.path == "Qwen/Qwen3-8B-Base"
    # App. C.5: the Qwen3-4B embedding model, on its own server with the share its weights need
    assert cfg.embedding.model == cfg.embedding_server.model == "Qwen/Qwen3-Embedding-4B" and cfg.embedding.dim == 2560
    assert cfg.embedding_server.gpu_memory_utilization == 0.13
    assert r.gpu_memory_utilization == 0.65  # beside it (decisions §2.4)
    # the like-for-like row keeps SARL Table 6's batch sizes, response length and greedy validation
    _, same = verl_config_for(["+exp=grpo_evol_rl_math"], tmp_path, tiny_qwen3_dir)
    assert same.data.train_batch_size == 256 and same.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert same.data.max_response_length == 8192 and same.actor_rollout_ref.rollout.val_kwargs.do_sample is False


@pytest.mark.slow
def test_defaults_are_verls_own_so_sarl_rows_do_not_change(tmp_path, tiny_qwen3_dir):
    base = compose_verl_base()
    _, v = verl_config_for(["+exp=ppo_sarl_math"], tmp_path, tiny_qwen3_dir)  # actor and critic
    for section in ("actor_rollout_ref.actor.optim", "critic.optim"):
        got, verl = OmegaConf.select(v, section), OmegaConf.select(base, section)
        for key in ("lr_scheduler_type", "min_lr_ratio", "lr_warmup_steps_ratio"):
            assert got[key] == verl[key], f"{section}.{key}"
    assert v.actor_rollout_ref.rollout.val_kwargs == base.actor_rollout_ref.rollout.val_kwargs


@pytest.mark.slow
def test_lr_schedule_and_validation_temperature_reach_verl(tmp_path, tiny_qwen3_dir):
    overrides = [
        "+exp=ppo_sarl_math",
        "train.lr_schedule=cosine",
        "train.min_lr_ratio=0.1",
        "train.lr_warmup_ratio=0.05",
        "train.val_temperature=0.7",
    ]
    _, v = verl_config_for(overrides, tmp_path, tiny_qwen3_dir)
    for optim in (v.actor_rollout_ref.actor.optim, v.critic.optim):
        assert optim.lr_scheduler_type == "cosine" and optim.min_lr_ratio == 0.1
        assert optim.lr_warmup_steps_ratio == 0.05
    assert v.actor_rollout_ref.rollout.val_kwargs.temperature == 0.7
    assert v.actor_rollout_ref.rollout.val_kwargs.do_sample is True


@pytest.mark.parametrize("exp", structured_prompt_rows())
def test_structured_reasoning_rows_use_a_cosine_schedule_with_a_tenth_floor(exp, tmp_path):
    """Structured Reasoning Sec. 5.1 "Training Details": "Cosine scheduler with 0.1x floor"."""
    cfg, v = verl_config_for([f"+exp={exp}"], tmp_path, validate=False)
    assert cfg.train.lr_schedule == "cosine" and cfg.train.min_lr_ratio == 0.1 and cfg.train.lr_warmup_ratio == 0.0
    assert v.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert v.actor_rollout_ref.actor.optim.min_lr_ratio == 0.1
    # App. A.4.4: weight decay 1e-4, truncated completions masked; App. A.4: tags redrawn per sampled prompt
    assert v.actor_rollout_ref.actor.optim.weight_decay == 1e-4
    assert v.trainer.v1.sarl.mask_truncated is True and v.trainer.v1.sarl.resample_tags is True


@pytest.mark.parametrize(
    "override,match",
    [
        ("train.lr_schedule=linear", "train.lr_schedule='linear' is not valid; choose one of: constant, cosine"),
        ("train.min_lr_ratio=0.1", "is the floor of a cosine schedule"),
        ("train.min_lr_ratio=1.5", r"train.min_lr_ratio must lie in \[0, 1\]"),
        ("train.lr_warmup_ratio=1.0", r"train.lr_warmup_ratio must lie in \[0, 1\)"),
        ("train.val_temperature=-1", "train.val_temperature must be >= 0"),
    ],
)
def test_bad_schedule_temperature_and_masking_say_why(override, match, tmp_path):
    cfg, _ = compose_train_config(["+exp=grpo_sarl_math", override])
    with pytest.raises(ValueError, match=match):
        build_verl_config(cfg, OmegaConf.to_container(cfg.reward, resolve=True), str(tmp_path), "x")


def test_the_schedule_and_truncation_masking_reach_trl(tmp_path):
    """backend=trl: the same train.* keys as on verl (transformers' cosine with a floor, TRL's masking)."""
    from sarl.backends.trl.run import grpo_args
    from sarl.launch.compose import compose_train_config

    cfg, _ = compose_train_config(["+exp=smoke"])
    args = grpo_args(cfg, tmp_path)
    assert args.lr_scheduler_type == "constant" and not args.mask_truncated_completions
    overrides = ["train.lr_schedule=cosine", "train.min_lr_ratio=0.1", "train.mask_truncated=true"]
    cfg, _ = compose_train_config(["+exp=smoke", *overrides])
    args = grpo_args(cfg, tmp_path)
    assert args.lr_scheduler_type == "cosine_with_min_lr" and args.lr_scheduler_kwargs == {"min_lr_rate": 0.1}
    assert args.mask_truncated_completions


def test_grpo_code_exec_is_grpo_with_the_execution_reward_on_grps_code_setting(tmp_path, tiny_qwen3_dir):
    """The baseline of grp_code_paper: GRP's base model (Sec. 4.1) and code RL set (App. E.2, KodCode-Light-RL-10K),
    8K responses (Sec. 4.1), GRPO with reward=code_exec (all-pass, decisions §8), no SFT stage; the RL
    hyperparameters the paper does not give are SARL Table 6's."""
    cfg, v = verl_config_for(["+exp=grpo_code_exec"], tmp_path, tiny_qwen3_dir)
    assert compose_train_config(["+exp=grpo_code_exec"])[0].model.path == "Qwen/Qwen3-4B-Base"
    assert cfg.get("pipeline") is None and cfg.data.name == "grp_code_rl" and cfg.data.setting == "code"
    assert v.algorithm.adv_estimator == "grpo" and v.data.max_response_length == 8192
    reward = v.reward.custom_reward_function.reward_kwargs.reward
    assert reward._target_ == "baselines.code_exec.CodeExecReward" and reward.score == "all_pass"
    a, r = v.actor_rollout_ref.actor, v.actor_rollout_ref.rollout
    assert r.n == 8 and v.data.train_batch_size == 256 and a.optim.lr == 1e-6 and a.kl_loss_coef == 0.001  # Table 6


def test_dr_grpo_paper_row_is_verls_dr_grpo_on_the_7b_free_form_setting(tmp_path, tiny_qwen3_dir):
    """Structured Reasoning Table 15 "+ Dr.GRPO" (App. B.1: the length-normalized GRPO variant "on free-form
    reasoning", the hyperparameters of the other rows): no std in the group advantage, each response's token losses
    summed and divided by one constant (the 4k response budget, decisions §5.1); the accuracy reward on the plain
    DeepScaleR prompt; DS-Distill-Qwen-7B at lr 1e-6, 6 completions at T=0.6, 500 steps, KL 1e-3, no SFT stage."""
    from sarl.train import UnsupportedOnBackend, check_supported

    cfg, v = verl_config_for(["+exp=dr_grpo_paper"], tmp_path, tiny_qwen3_dir)
    assert compose_train_config(["+exp=dr_grpo_paper"])[0].model.path == "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
    a, r, d = v.actor_rollout_ref.actor, v.actor_rollout_ref.rollout, v.data
    assert v.algorithm.adv_estimator == "grpo" and v.algorithm.norm_adv_by_std_in_grpo is False
    assert a.loss_agg_mode == "seq-mean-token-sum-norm" and a.loss_scale_factor == 4096 == d.max_response_length
    assert cfg.get("pipeline") is None and cfg.data.name == "deepscaler" and cfg.train.resample_tags is False
    assert v.reward.custom_reward_function.reward_kwargs.reward._target_ == "baselines.ground_truth.GroundTruthReward"
    assert a.optim.lr == 1e-6 and r.n == 6 and r.temperature == 0.6 and v.trainer.total_training_steps == 500
    assert a.use_kl_loss and a.kl_loss_coef == 1e-3 and v.trainer.v1.sarl.mask_truncated is True
    assert r.gpu_memory_utilization == 0.6  # App. A.4.4's 70% does not fit beside the 7B actor (decisions §5.1)
    # the algorithm carries its verl keys to any row; TRL has no Dr.GRPO here and says so
    _, other = verl_config_for(["+exp=grpo_gt_math", "algorithm=dr_grpo"], tmp_path, tiny_qwen3_dir)
    assert other.algorithm.norm_adv_by_std_in_grpo is False
    assert other.actor_rollout_ref.actor.loss_scale_factor == other.data.max_response_length == 8192
    _, plain = verl_config_for(["+exp=grpo_gt_math"], tmp_path, tiny_qwen3_dir)
    assert (
        plain.algorithm.norm_adv_by_std_in_grpo is True and plain.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    )
    trl, choices = compose_train_config(["+exp=dr_grpo_paper", "backend=trl"])
    with pytest.raises(UnsupportedOnBackend, match="algorithm=dr_grpo has no TRL trainer"):
        check_supported(trl, choices)


def test_evol_rl_variant_rows_change_only_what_their_cell_removes():
    """EVOL-RL Table 1 "w/TTRL", Table 4's ablations (App. D.1) and App. D.4's supervised run: evol_rl_paper with
    the novelty reward (-> TTRL's), the entropy term (0.003 -> 0), the high clip (0.28 -> 0.2) or the vote (-> the
    verifier, 32 rollouts all trained, 2 epochs) changed, and nothing else of Tables 2-3."""
    base, _ = compose_train_config(["+exp=evol_rl_paper"])
    evol, ttrl = "baselines.evol_rl.EvolRLReward", "baselines.ttrl.TTRLReward"
    rows = {"evol_rl_ttrl_paper": ("math_train", ttrl, 0.0, 0.2)}
    for key, data in (("math500", "math500_train"), ("aime24", "aime24_train")):
        rows[f"evol_rl_{key}_no_cliphigh_paper"] = (data, evol, 0.003, 0.2)
        rows[f"evol_rl_{key}_no_ent_paper"] = (data, evol, 0.0, 0.28)
        rows[f"evol_rl_{key}_no_cliphigh_ent_paper"] = (data, evol, 0.0, 0.2)
        rows[f"evol_rl_{key}_no_novelty_paper"] = (data, ttrl, 0.003, 0.28)
    same = ("train_batch_size", "ppo_mini_batch_size", "actor_lr", "kl_loss_coef", "temperature", "val_temperature")
    for exp, (data, target, entropy, clip_high) in rows.items():
        cfg, _ = compose_train_config([f"+exp={exp}"])
        got = (cfg.data.name, cfg.reward._target_, cfg.train.entropy_coeff, cfg.train.clip_ratio_high)
        assert got == (data, target, entropy, clip_high), exp
        assert (cfg.train.rollout_n, cfg.train.n_trained, cfg.model.path) == (64, 32, base.model.path), exp
        assert all(cfg.train[k] == base.train[k] for k in same) and cfg.train.clip_ratio_low == 0.2, exp
        assert target == evol or "alpha" not in cfg.reward, exp  # no EVOL-RL key reaches TTRL's reward
    rlvr, _ = compose_train_config(["+exp=evol_rl_rlvr_paper"])
    assert (rlvr.reward._target_, rlvr.reward.label, rlvr.data.name) == (evol, "ground_truth", "math_train")
    assert (rlvr.train.rollout_n, rlvr.train.n_trained, rlvr.train.total_epochs) == (32, 32, 2)
    assert (rlvr.train.entropy_coeff, rlvr.train.clip_ratio_high) == (0.003, 0.28)
    assert base.reward.label == "majority" and base.reward.alpha == 0.5
