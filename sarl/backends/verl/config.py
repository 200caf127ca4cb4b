"""Build verl's trainer config from a composed `conf/train.yaml`.

verl's own packaged Hydra config (`verl.trainer.config/ppo_trainer`) is the schema: it is
composed first, then every value below is written into it in struct mode, so a misspelt
or removed key fails here, at composition, not on the cluster.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from sarl.backends.verl import cpu
from sarl.backends.verl.attention import ATTENTION_MODULE, resolve_attn_implementation
from sarl.backends.verl.reward import is_group_reward
from sarl.reports.figures import METRICS_FILE

log = logging.getLogger(__name__)

REWARD_FN_PATH = "pkg://sarl.backends.verl.reward"
REWARD_FN_NAME = "compute_score"
# The V1 trainer that sarl.backends.verl.trainer registers with verl (`register_trainer`); its own
# settings live in `trainer.v1.<name>`, verl's convention for a trainer mode's section.
TRAINER_NAME = "sarl"
VERL_DEFAULT_ROLLOUT_TP = 2  # verl 0.9.1's rollout.tensor_model_parallel_size
LR_SCHEDULES = ("constant", "cosine")  # verl 0.9.1's FSDPOptimizerConfig.lr_scheduler_type


def verl_values(cfg: DictConfig, run_dir: str, experiment: str, group_reward: bool = False) -> dict[str, Any]:
    """Our config in verl's keys (SARL Tables 6-7 and App. B.2 live in `cfg.train`/`cfg.backend`).

    A group reward (TTRL, EMPO, EVOL-RL) is scored by the trainer on whole groups: verl generates
    `train.rollout_n` rollouts per prompt (the votes) and trains on `train.n_trained` of them, so
    verl's `rollout.n`, which sizes every training batch, is `n_trained`; no per-sample reward
    function and no reward workers. A per-response reward streams through `compute_score`."""
    t, b, a = cfg.train, cfg.backend, cfg.algorithm
    micro = t.micro_batch_size_per_gpu
    if not 1 <= t.n_trained <= t.rollout_n:
        raise ValueError(f"train.n_trained must lie in [1, train.rollout_n={t.rollout_n}], got {t.n_trained}")
    if not group_reward and t.n_trained != t.rollout_n:
        raise ValueError(
            f"train.n_trained={t.n_trained} < train.rollout_n={t.rollout_n} needs a group reward (TTRL, "
            "EVOL-RL vote on all rollouts and train on some); a per-response reward trains on every rollout"
        )
    _check_schedule_and_masking(t)
    tp = int(b.rollout_tensor_parallel_size or min(VERL_DEFAULT_ROLLOUT_TP, t.n_gpus_per_node))
    if tp < 1 or t.n_gpus_per_node % tp:
        raise ValueError(
            f"backend.rollout_tensor_parallel_size={tp} must divide train.n_gpus_per_node={t.n_gpus_per_node} "
            "(each vLLM replica spans that many GPUs of one node)"
        )
    values: dict[str, Any] = {
        "algorithm.adv_estimator": a.adv_estimator,
        "algorithm.use_kl_in_reward": t.use_kl_in_reward,
        "data.train_files": cfg.data.train_files,
        "data.val_files": cfg.data.val_files,
        "data.prompt_key": cfg.data.prompt_key,
        "data.train_batch_size": t.train_batch_size,
        "data.max_prompt_length": t.max_prompt_length,
        "data.max_response_length": t.max_response_length,
        "data.filter_overlong_prompts": t.filter_overlong_prompts,
        "data.truncation": t.truncation,
        "data.shuffle": t.shuffle,
        "data.seed": cfg.seed,
        "actor_rollout_ref.model.path": cfg.model.path,
        "actor_rollout_ref.model.enable_gradient_checkpointing": b.enable_gradient_checkpointing,
        "actor_rollout_ref.model.enable_activation_offload": b.enable_activation_offload,
        "actor_rollout_ref.actor.strategy": b.strategy,
        "actor_rollout_ref.actor.optim.lr": t.actor_lr,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": t.lr_schedule,
        "actor_rollout_ref.actor.optim.min_lr_ratio": t.min_lr_ratio,
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": t.lr_warmup_ratio,
        "actor_rollout_ref.actor.optim.weight_decay": t.weight_decay,
        "actor_rollout_ref.actor.ppo_mini_batch_size": t.ppo_mini_batch_size,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.actor.use_dynamic_bsz": b.use_dynamic_bsz,
        "actor_rollout_ref.actor.use_kl_loss": t.use_kl_loss,
        "actor_rollout_ref.actor.kl_loss_coef": t.kl_loss_coef,
        "actor_rollout_ref.actor.kl_loss_type": t.kl_loss_type,
        "actor_rollout_ref.actor.entropy_coeff": t.entropy_coeff,
        "actor_rollout_ref.actor.clip_ratio_low": t.clip_ratio_low,
        "actor_rollout_ref.actor.clip_ratio_high": t.clip_ratio_high,
        "actor_rollout_ref.rollout.name": b.rollout_engine,
        "actor_rollout_ref.rollout.n": t.n_trained,
        "actor_rollout_ref.rollout.temperature": t.temperature,
        "actor_rollout_ref.rollout.val_kwargs.temperature": t.val_temperature,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": t.val_temperature > 0,  # verl: False = greedy
        "actor_rollout_ref.rollout.gpu_memory_utilization": b.rollout_gpu_memory_utilization,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": tp,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro,
        "critic.enable": a.use_critic,
        "critic.strategy": b.strategy,
        "critic.optim.lr": t.critic_lr,
        "critic.optim.lr_scheduler_type": t.lr_schedule,
        "critic.optim.min_lr_ratio": t.min_lr_ratio,
        "critic.optim.lr_warmup_steps_ratio": t.lr_warmup_ratio,
        "critic.optim.weight_decay": t.weight_decay,
        "critic.model.path": cfg.model.path,
        "critic.model.enable_gradient_checkpointing": b.enable_gradient_checkpointing,
        "critic.model.enable_activation_offload": b.enable_activation_offload,
        "critic.ppo_micro_batch_size_per_gpu": micro,
        "reward.custom_reward_function.path": None if group_reward else REWARD_FN_PATH,
        "reward.custom_reward_function.name": REWARD_FN_NAME,
        "reward.num_workers": 0 if group_reward else b.reward_num_workers,
        "trainer.critic_warmup": t.critic_warmup,
        "trainer.total_epochs": t.total_epochs,
        "trainer.total_training_steps": t.get("total_training_steps"),
        "trainer.save_freq": t.save_freq,
        "trainer.test_freq": t.test_freq,
        "trainer.nnodes": t.nnodes,
        "trainer.n_gpus_per_node": t.n_gpus_per_node,
        "trainer.project_name": cfg.logger.project,
        "trainer.experiment_name": experiment,
        "trainer.default_local_dir": f"{run_dir}/checkpoints",
        "trainer.resume_mode": "auto",
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": TRAINER_NAME,
    }
    if cfg.model.tokenizer_path:
        values["actor_rollout_ref.model.tokenizer_path"] = cfg.model.tokenizer_path
    # the attention every model loads with (verl defaults to flash_attention_2; sarl/backends/verl/attention.py)
    attn = {"attn_implementation": resolve_attn_implementation(b.attn_implementation)}
    values["actor_rollout_ref.model.override_config"] = attn  # actor and reference
    values["critic.model.override_config"] = attn
    values["critic.model.external_lib"] = ATTENTION_MODULE  # the critic's loader honours it
    values["trainer.logger"] = with_file_logger(cfg.logger.backends)
    if b.get("cpu", False):  # backend=verl_cpu (sarl/backends/verl/cpu)
        values.update(cpu.cpu_verl_values(cfg))
    values.update(_flatten(OmegaConf.to_container(b.overrides, resolve=True)))
    return values


PATCH_MODULE = "sarl.backends.verl.patches"  # imported by every process of a verl run (VERL_USE_EXTERNAL_MODULES)


def with_file_logger(backends: Any) -> list[str]:
    """The run's loggers plus verl's file logger, which writes `metrics.jsonl` (`process_env`) in every verl run."""
    backends = [str(x) for x in backends]
    return [*backends, "file"] if "file" not in backends else backends


def process_env(cfg: DictConfig, run_dir: str | Path) -> dict[str, str]:
    """The environment every process of a verl run gets (the launched entry point, and through Ray's runtime_env
    every worker on every node; torchrun's ranks inherit it): our patches imported by `import verl`
    (sarl.backends.verl.patches; on `backend=verl_cpu` also the CPU plugin) and the path of `metrics.jsonl`."""
    modules = [PATCH_MODULE]
    env = {"VERL_FILE_LOGGER_PATH": str(Path(run_dir) / METRICS_FILE)}
    if cfg.backend.get("cpu", False):
        modules.append(cpu.PLUGIN_MODULE)
        env.update(cpu.cpu_process_env(Path(run_dir)))
    return {"VERL_USE_EXTERNAL_MODULES": ",".join(modules), **env}


def _check_schedule_and_masking(t: DictConfig) -> None:
    """The lr schedule, validation temperature and truncation keys of `train`, checked before verl sees them."""
    if t.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"train.lr_schedule={t.lr_schedule!r} is not valid; choose one of: {', '.join(LR_SCHEDULES)}")
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        raise ValueError(f"train.min_lr_ratio must lie in [0, 1] (a fraction of the peak lr), got {t.min_lr_ratio}")
    if t.lr_schedule == "constant" and t.min_lr_ratio != 0.0:
        raise ValueError(
            f"train.min_lr_ratio={t.min_lr_ratio} is the floor of a cosine schedule; set train.lr_schedule=cosine "
            "or train.min_lr_ratio=0"
        )
    if not 0.0 <= t.lr_warmup_ratio < 1.0:
        raise ValueError(f"train.lr_warmup_ratio must lie in [0, 1), got {t.lr_warmup_ratio}")
    if t.val_temperature < 0:
        raise ValueError(f"train.val_temperature must be >= 0 (0 = greedy), got {t.val_temperature}")
    # train.mask_truncated: verl 0.9.1 has no option for it; our trainer leaves truncated sessions out
    # (sarl.backends.verl.trainer.SarlTrainer._with_truncated), read from trainer.v1.sarl.mask_truncated


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c.d": 2} -> {"a.b": 1, "c.d": 2}: every override names one leaf key."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def compose_verl_base(config_name: str = "ppo_trainer") -> DictConfig:
    """verl's packaged config `config_name`, composed by Hydra exactly as verl's entry point composes it:
    `ppo_trainer` (`verl.trainer.main_ppo`), `sft_trainer_engine` (`verl.trainer.sft_trainer`)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        raise RuntimeError("compose_verl_base must run outside another Hydra context")
    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(config_name)


def verl_config_with(config_name: str, values: dict[str, Any], what: str, fix: str) -> DictConfig:
    """verl's packaged config `config_name` (`compose_verl_base`) with `values` (dotted key -> value) written over
    it; a key verl's config does not have is a KeyError saying that `what` has no such key and what to `fix`."""
    base = compose_verl_base(config_name)
    OmegaConf.set_struct(base, True)
    for key, value in values.items():
        try:
            OmegaConf.update(base, key, value, merge=False)
        except Exception as err:  # omegaconf raises several error types for a missing key
            raise KeyError(f"{what} has no config key {key!r} ({err.__class__.__name__}); {fix}") from err
    return base


def build_verl_config(
    cfg: DictConfig, reward_cfg: dict, run_dir: str, experiment: str, env_vars: dict[str, str] | None = None
) -> DictConfig:
    """verl's trainer config with our values; `reward_cfg` (the resolved reward node) travels
    to verl's reward workers (per-response rewards) or our trainer (group rewards) as
    `reward.custom_reward_function.reward_kwargs.reward`. `env_vars` (the W&B settings, and in a real run
    the driver's `sarl.runtime.runs.node_env`) go into Ray's runtime_env, so verl's trainer actor and workers get
    them on every node, whatever environment the Ray daemons were started with (verl's `run_ppo` merges it into its
    own runtime_env), with `process_env`'s."""
    group_reward = is_group_reward(reward_cfg)
    if group_reward:
        _check_votes(reward_cfg, cfg.train)
    base = verl_config_with(
        "ppo_trainer",
        verl_values(cfg, run_dir, experiment, group_reward),
        f"verl {cfg.backend.version}",
        "fix conf/backend/verl.yaml overrides or sarl/backends/verl/config.py",
    )
    with read_write(base.reward.custom_reward_function), open_dict(base.reward.custom_reward_function):
        base.reward.custom_reward_function.reward_kwargs = {"reward": reward_cfg}
    with read_write(base.trainer.v1), open_dict(base.trainer.v1):
        # read by sarl.backends.verl.trainer.SarlTrainer: votes per prompt, seed of the trained subset, the
        # function that registers the algorithm's advantage estimator with verl (conf/algorithm/*.yaml), and
        # the number of consecutive training batches with no usable reward after which the run stops (null: never)
        base.trainer.v1[TRAINER_NAME] = {
            "n_votes": cfg.train.rollout_n,
            "seed": cfg.seed,
            "adv_estimator_register": cfg.algorithm.get("adv_estimator_register"),
            "max_failed_steps": cfg.train.get("max_failed_steps"),
            "mask_truncated": bool(cfg.train.mask_truncated),  # SarlTrainer._with_truncated
            "resample_tags": bool(cfg.train.resample_tags),  # SarlTrainer._next_train_batch
        }
    env_vars = {**(env_vars or {}), **process_env(cfg, run_dir)}
    runtime_env = base.ray_kwargs.ray_init.runtime_env
    with read_write(runtime_env), open_dict(runtime_env):
        runtime_env.env_vars = dict(env_vars)
    if cfg.backend.get("cpu", False):
        cpu.with_cpu_settings(base)
    return base


def _check_votes(reward_cfg: dict, train: DictConfig) -> None:
    """A reward that counts its own votes (TTRL's n_votes / n_samples) must agree with the rollouts."""
    for key, value in (("n_votes", train.rollout_n), ("n_samples", train.n_trained)):
        if key in reward_cfg and reward_cfg[key] != value:
            name = "rollout_n" if key == "n_votes" else "n_trained"
            raise ValueError(
                f"reward.{key}={reward_cfg[key]} but train.{name}={value}: the trainer generates "
                f"train.rollout_n votes per prompt and trains on train.n_trained; set both alike"
            )


def validate_verl_config(config: DictConfig) -> None:
    """verl's own checks (`verl.utils.config.validate_config`), with its prints sent to stderr.

    With a critic, verl's checks build the critic's `HFModelConfig` (verl 0.9.1 verl/utils/config.py
    validate_config: `omega_conf_to_dataclass(config.critic)`), which loads the model's config and tokenizer, from
    the Hub if need be. When the critic's model is neither a local directory nor in the Hugging Face cache, the
    checks run on a copy whose critic model is a local stand-in (a config.json, no tokenizer), so that a dry run
    works offline; one line on stderr says that the model was not resolved here."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    use_critic = need_critic(config)
    unresolved = unresolved_model_paths(config.critic.model) if use_critic else []
    with contextlib.ExitStack() as stack:
        if unresolved:
            log.warning(
                "%s: not a local directory nor in the Hugging Face cache (%s); verl's config checks ran with a "
                "stand-in model config, the model itself was not checked",
                ", ".join(unresolved),
                _hf_cache_dir(),
            )
            stand_in = stack.enter_context(tempfile.TemporaryDirectory(prefix="sarl-stand-in-model-"))
            config = _with_stand_in_critic_model(config, stand_in)
        with contextlib.redirect_stdout(sys.stderr):
            validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=use_critic)


# HFModelConfig's path fields (verl 0.9.1 verl/workers/config/model.py) and a file each must have
MODEL_PATH_FILES = {"path": "config.json", "hf_config_path": "config.json", "tokenizer_path": "tokenizer_config.json"}


def unresolved_model_paths(model: DictConfig) -> list[str]:
    """`critic.model.<key>=<value>` for each path of a verl model section that is neither a local directory
    nor a Hub id whose files are in the local Hugging Face cache."""
    return [
        f"critic.model.{key}={model[key]}"
        for key, filename in MODEL_PATH_FILES.items()
        if model.get(key) and not _available_locally(str(model[key]), filename)
    ]


def _available_locally(path: str, filename: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    if os.path.isdir(path):
        return True
    try:
        return isinstance(try_to_load_from_cache(path, filename), str)
    except ValueError:  # not a valid Hub id either (huggingface_hub's HFValidationError)
        return False


def _hf_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _with_stand_in_critic_model(config: DictConfig, folder: str) -> DictConfig:
    """A copy of `config` whose critic model is `folder`, made a stand-in: a config.json of one architecture
    (HFModelConfig asserts exactly one) and `load_tokenizer: false`, an HFModelConfig field."""
    stand_in = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    (Path(folder) / "config.json").write_text(json.dumps(stand_in))
    checked = copy.deepcopy(config)
    with read_write(checked.critic.model), open_dict(checked.critic.model):
        checked.critic.model.path = folder
        checked.critic.model.hf_config_path = None
        checked.critic.model.tokenizer_path = None
        checked.critic.model.load_tokenizer = False
    return checked


def reward_cores_problem(cfg: DictConfig, reward_cfg: dict, cores: int | None = None) -> str | None:
    """Why the reward processes would ask for more threads than this node has cores (sarl.train says it as a
    warning after the GPU checks: oversubscribed pools are slow, not wrong). Each of verl's
    `backend.reward_num_workers` reward workers, or the trainer for a group reward, runs the reward's kernels on
    `reward.threads` threads: sarl/contract/threads.py), else None. `cores`: this process's CPUs (the allocation's,
    under SLURM)."""
    cores = cores or len(os.sched_getaffinity(0))
    threads = int(reward_cfg.get("threads") or 1)
    workers = 1 if is_group_reward(reward_cfg) else max(1, int(cfg.backend.reward_num_workers))
    if workers * threads <= cores:
        return None
    return (
        f"backend.reward_num_workers={workers} x reward.threads={threads} = {workers * threads} threads, more than the "
        f"{cores} cores here: their thread pools would spin against each other; lower reward.threads (1 is right for "
        "per-response kernels) or backend.reward_num_workers"
    )
