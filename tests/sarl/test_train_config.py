"""Every config group option and every paper row composes; the verl config built from each
row validates against the pinned verl's own schema and carries SARL Tables 6-7 exactly."""

import pytest
import yaml
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf
from testkit import fake_vllm_python, train_dry_run, verl_config_for

from sarl.launch.compose import compose_train_config, compose_user_config
from sarl.runtime.errors import UserError
from sarl.runtime.files import CONF_DIR
from sarl.runtime.rows import experiments, metadata_problems, paper_experiments
from sarl.runtime.runs import experiment_name, resolve_run_dir
from sarl.train import UnsupportedOnBackend, check_supported

pytest.importorskip("verl")
from sarl.backends.verl.config import build_verl_config  # noqa: E402

GROUPS = ["model", "algorithm", "reward", "embedding", "data", "backend", "launcher", "logger", "paths"]
EXPERIMENTS = experiments()  # every conf/exp/ name
# the paper rows (conf/exp/ files whose `paper:` block names a paper table) and the code rows (in no paper table)


def options(group):
    paths = sorted((CONF_DIR / group).glob("*.yaml"))
    if group == "data":  # evaluation benchmarks (role: eval) are prepared by sarl.data.prepare, never trained on
        paths = [p for p in paths if OmegaConf.load(p).get("role") != "eval"]
    return [p.stem for p in paths]


def test_every_experiment_says_which_paper_table_rows_it_is():
    problems = metadata_problems()
    assert not problems, "conf/exp/ paper metadata:\n" + "\n".join(problems)
    assert paper_experiments() and set(paper_experiments()) <= set(EXPERIMENTS)


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if group == "embedding" and option == "policy_hidden":
        overrides.append("embedding.model=/path/to/policy")
    cfg, choices = compose_train_config(overrides)
    assert choices[group] == option
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(MissingConfigException) as err:
        compose_train_config(["reward=sarl_c"])
    for name in ("sarl", "sarl_c_only", "sarl_l_only"):
        assert name in str(err.value)


def test_a_misspelt_option_is_one_line_naming_the_nearest_ones():
    """A misspelt row among ~50 is not answered with all of them on one line: the nearest names, the group's
    folder; a small group lists every option."""
    from sarl.launch.compose import compose_user_config
    from sarl.runtime.errors import UserError

    with pytest.raises(UserError) as err:
        compose_user_config(["+exp=grpo_sarl_mth"])
    said = str(err.value)
    assert said.startswith("exp=grpo_sarl_mth: no such option; did you mean grpo_sarl_math"), said
    assert "options in conf/exp/; --help lists them" in said and "evol_rl_aime24" not in said
    with pytest.raises(UserError) as err:
        compose_user_config(["backend=verll"])
    said = str(err.value)
    assert said.startswith("backend=verll: no such option; did you mean verl or verl_cpu"), said
    assert said.endswith("(choose one of: trl, verl, verl_cpu)"), said


@pytest.mark.slow
@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_composes_and_builds_a_valid_verl_config_or_says_why_not(exp, tmp_path, tiny_qwen3_dir):
    cfg, choices = compose_train_config([f"+exp={exp}"])
    assert experiment_name(choices) == exp
    if cfg.get("pipeline"):  # one stage or more: each is checked in tests/sarl/test_paper_rows.py
        from sarl.launch.pipeline import stages_of

        assert len(stages_of(cfg)) >= 1
        return
    try:
        check_supported(cfg, choices)
    except UnsupportedOnBackend as err:
        assert "not" in str(err) and len(str(err)) > 40
        return
    if cfg.backend.name == "trl":  # an in-process TRL run: its trainer arguments build
        from sarl.backends.trl.run import dry_run_config

        printed = dry_run_config(cfg, tmp_path)
        assert printed["trainer"] in ("GRPOTrainer", "DPOTrainer") and printed["args"]["output_dir"]
        return
    own_model = {
        **{e: "Qwen/Qwen3-4B-Base" for e in EXPERIMENTS if e.startswith("evol_rl_")},  # evol_rl_paper and its variants
        "maxflow_freeform_paper": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
        "dr_grpo_paper": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
        "grpo_code_exec": "Qwen/Qwen3-4B-Base",  # GRP's code setting (grp_code_paper's base model)
    }
    assert cfg.model.path == own_model.get(exp, "Qwen/Qwen3-4B")  # the other papers' rows: their paper's model
    _, vcfg = verl_config_for([f"+exp={exp}"], tmp_path, tiny_qwen3_dir)
    assert vcfg.trainer.experiment_name == exp


def assert_tables_6_7(v, math: bool, model_dir: str):
    a, r, d, t = v.actor_rollout_ref.actor, v.actor_rollout_ref.rollout, v.data, v.trainer
    assert r.n == 8 and d.train_batch_size == 256 and a.ppo_mini_batch_size == 256
    assert a.ppo_micro_batch_size_per_gpu == 32 and v.critic.ppo_micro_batch_size_per_gpu == 32
    assert a.optim.lr == 1e-6 and v.critic.optim.lr == 1e-5
    assert d.max_prompt_length == 1024 and d.max_response_length == (8192 if math else 4096)
    assert d.filter_overlong_prompts is True and d.truncation == "error" and d.shuffle is False
    assert a.use_kl_loss is True and a.kl_loss_coef == 0.001 and a.kl_loss_type == "low_var_kl"
    assert a.entropy_coeff == 0 and v.algorithm.use_kl_in_reward is False and t.critic_warmup == 0
    assert t.total_epochs == (15 if math else 5) and t.save_freq == 20 and t.test_freq == 5
    assert a.strategy == "fsdp2" and a.use_dynamic_bsz is True
    assert v.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert v.actor_rollout_ref.model.enable_activation_offload is True
    # PPO's critic beside the actor: the largest rollout share its memory plan fits at 90% (decisions §7)
    assert r.gpu_memory_utilization == (0.65 if v.critic.enable else 0.7) and r.name == "vllm"
    assert t.nnodes == 1 and t.n_gpus_per_node == 8 and t.resume_mode == "auto"
    assert v.actor_rollout_ref.model.path == model_dir and v.critic.model.path == model_dir


@pytest.mark.slow
@pytest.mark.parametrize(
    "exp,math,adv,clustering",
    [
        ("grpo_sarl_math", True, "grpo", "kmeans"),
        ("ppo_sarl_math", True, "gae", "kmeans"),
        ("grpo_sarl_open", False, "grpo", "hdbscan"),
        ("ppo_sarl_open", False, "gae", "hdbscan"),
        ("grpo_sarl_c_only_math", True, "grpo", "kmeans"),
    ],
)
def test_paper_hyperparameters(exp, math, adv, clustering, tmp_path, tiny_qwen3_dir):
    cfg, v = verl_config_for([f"+exp={exp}"], tmp_path, tiny_qwen3_dir)
    assert_tables_6_7(v, math, tiny_qwen3_dir)
    assert v.algorithm.adv_estimator == adv
    assert v.critic.enable is (adv == "gae")
    fn = v.reward.custom_reward_function
    assert fn.path == "pkg://sarl.backends.verl.reward" and fn.name == "compute_score"
    rew = fn.reward_kwargs.reward
    assert rew.clustering == clustering and rew.embedder.model == "Qwen/Qwen3-Embedding-0.6B"
    assert cfg.embedding_server.gpu_memory_utilization == 0.05
    assert v.trainer.default_local_dir == f"{tmp_path}/checkpoints"


@pytest.mark.slow
def test_misspelt_backend_override_fails_at_composition(tmp_path):
    cfg, choices = compose_train_config(
        ["+exp=grpo_sarl_math", "+backend.overrides.actor_rollout_ref.actor.clip_ratio_hi=0.28"]
    )
    with pytest.raises(KeyError, match="clip_ratio_hi"):
        build_verl_config(cfg, {}, str(tmp_path), "x")
    cfg, _ = compose_train_config(
        ["+exp=grpo_sarl_math", "+backend.overrides.actor_rollout_ref.actor.clip_ratio_high=0.28"]
    )
    assert build_verl_config(cfg, {}, str(tmp_path), "x").actor_rollout_ref.actor.clip_ratio_high == 0.28


def test_a_key_added_where_only_named_keys_are_read_is_refused_and_free_form_additions_stay():
    """`+train.dry_runn=true` adds a key nothing reads (Hydra's advice for a misspelt key): refused with the nearest
    key. The project's own `+` uses add to free-form mappings (verl's raw keys, a reward's arguments), or override
    with `++`: they compose."""
    with pytest.raises(UserError, match=r"^\+train.dry_runn: no such key.*; did you mean train.dry_run\?$"):
        compose_user_config(["+exp=smoke", "+train.dry_runn=true"])
    cfg, _ = compose_user_config(
        [
            "+exp=smoke",
            "+backend.overrides.trainer.val_before_train=false",
            "++model.build.cache_dir=/tmp/policies",
            "+reward.extra=1",
            "+launcher.extra=1",
        ]
    )
    assert cfg.backend.overrides.trainer.val_before_train is False and cfg.model.build.cache_dir == "/tmp/policies"
    assert cfg.reward.extra == 1 and cfg.launcher.extra == 1


def test_dpo_row_runs_on_trl_and_says_so_on_verl():
    cfg, choices = compose_train_config(["+exp=dpo_open"])
    assert cfg.backend.name == "trl"
    check_supported(cfg, choices)
    cfg, choices = compose_train_config(["+exp=dpo_open", "backend=verl"])
    with pytest.raises(UnsupportedOnBackend, match="backend=trl"):
        check_supported(cfg, choices)


def test_run_dir_has_date_time_and_slurm_job_and_is_found_again_on_requeue(tmp_path):
    import datetime as dt

    cfg, _ = compose_train_config([f"paths.root={tmp_path}"])
    now = dt.datetime(2026, 11, 21, 9, 30, 5)
    local = resolve_run_dir(cfg, "grpo_sarl_math", env={}, now=now)
    assert local == tmp_path / "runs" / "grpo_sarl_math" / "2026-11-21_09-30-05"
    first = resolve_run_dir(cfg, "grpo_sarl_math", env={"SLURM_JOB_ID": "4242"}, now=now)
    assert first.name == "2026-11-21_09-30-05_j4242"
    first.mkdir(parents=True)
    later = resolve_run_dir(cfg, "grpo_sarl_math", env={"SLURM_JOB_ID": "4242"}, now=now + dt.timedelta(hours=3))
    assert later == first  # the requeued job resumes in its own directory


@pytest.mark.slow
def test_dry_run_prints_only_the_verl_config_on_stdout(tmp_path):
    proc = train_dry_run("+exp=grpo_sarl_math", f"paths.root={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    v = yaml.safe_load(proc.stdout)  # stdout is YAML and nothing else
    assert v["actor_rollout_ref"]["rollout"]["n"] == 8 and v["algorithm"]["adv_estimator"] == "grpo"
    note, last = proc.stderr.strip().splitlines()[-2:]
    assert "-m sarl.backends.verl.main --config-path" in last and "--config-name verl_trainer" in last
    run_dir = last.split("--config-path ")[1].split()[0]  # the file the command reads is named as not yet written
    assert note == f"# dry run: nothing written; a real run writes {run_dir}/verl_trainer.yaml and runs:"
    assert "hydra.run.dir=" in last and "hydra.output_subdir=verl_hydra" in last
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_train_starts_uses_and_stops_the_embedding_server(tmp_path):
    """embedding=vllm_server with url "auto": the server is started as a child, health-checked,
    its URL handed to the reward, and stopped afterwards (a stand-in for vLLM speaks the same HTTP)."""
    import os

    from hydra.utils import instantiate

    from sarl.serving.auto import embedding_server_for

    fake_python = fake_vllm_python(tmp_path)
    cfg, _ = compose_train_config(
        [
            "embedding=vllm_server",
            f"embedding_server.python={fake_python}",
            "embedding_server.startup_timeout_s=60",
            "embedding.dim=3",
        ]
    )
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    assert reward_cfg["embedder"]["url"] == "auto"
    with embedding_server_for(cfg, reward_cfg):
        url = reward_cfg["embedder"]["url"]
        assert url.startswith("http://127.0.0.1:")
        reward = instantiate(reward_cfg)
        (out,) = reward(
            __import__("sarl.contract.reward", fromlist=["x"]).RolloutBatch.from_responses(["<think>a\n\nbb</think>"])
        )
        assert out.failed is None and out.diagnostics["n_steps"] == 2
        pids = [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and b"fake_vllm.py" in open(f"/proc/{p}/cmdline", "rb").read()
        ]
        assert pids
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
