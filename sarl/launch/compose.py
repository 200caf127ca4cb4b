"""The training config: conf/train.yaml composed with Hydra's compose API and checked.

`compose_train_config` is what the tests and tools use; `compose_user_config` is the same for a command line
(a misspelt key, an unknown option or an invalid value is a UserError naming it); `check_model_paths` checks,
before anything is built or written, that the model the run names can be had here.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from sarl.runtime.errors import UserError, composition_error_message, refuse_new_keys
from sarl.runtime.files import CONF_DIR
from sarl.runtime.hub import check_model_source
from sarl.runtime.overrides import merged_overrides

log = logging.getLogger("sarl.train")  # a part of `python -m sarl.train`: its messages keep that name

# the sections whose keys the code reads by name only: a key added to one (`+train.new_key=...`) would be ignored
CLOSED_SECTIONS = ("train", "paths", "format_check")


def compose_train_config(overrides: list[str]) -> tuple[DictConfig, dict[str, Any]]:
    """conf/train.yaml with the given Hydra overrides, and the chosen option of every group."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_train"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    return _without_hydra(cfg)


def compose_user_config(overrides: list[str], named: list[str] | None = None) -> tuple[DictConfig, dict[str, Any]]:
    """`compose_train_config` for a command line: a misspelt key (the nearest one named), a key added to a section
    whose keys are read by name only (CLOSED_SECTIONS), an unknown option or an invalid value is a UserError naming
    it, checked before anything runs.

    A back end that names a function in `backend.recompose` (`backend=verl_cpu`: `sarl.backends.verl.cpu.
    cpu_overrides`, the row made small for the CPU) has the row composed a second time with the overrides that
    function returns for it, leaving alone every key in `named` (what the command line names; all of `overrides`
    when None)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg, choices = compose_train_config(overrides)
        if cfg.backend.get("recompose") and not cfg.get("pipeline"):
            extra = config_function("backend.recompose", str(cfg.backend.recompose))(
                cfg, overrides if named is None else named
            )
            cfg, choices = compose_train_config(merged_overrides(overrides, extra))
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(composition_error_message(err)) from err
    refuse_new_keys(overrides if named is None else named, cfg, CLOSED_SECTIONS)
    validate_train_values(cfg)
    return cfg, choices


def config_function(key: str, dotted: str) -> Any:
    """The function config key `key` names by its dotted path (`module.function`); UserError if it cannot be
    imported."""
    module, _, name = dotted.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        fn = None
    if not callable(fn):
        raise UserError(f"{key}={dotted!r}: not an importable function (module.function)")
    return fn


def check_model_paths(cfg: DictConfig) -> None:
    """model.path and model.tokenizer_path (when set) name a model this machine can load: a checkpoint directory,
    or a Hub id in the local Hugging Face cache or on a Hub that can be reached (sarl.runtime.hub); else a
    UserError, before anything is built or written. A dry run loads nothing: a Hub id it could not fetch now is
    one line of note."""
    for key, filename in (("path", "config.json"), ("tokenizer_path", "tokenizer_config.json")):
        value = cfg.model.get(key)
        if value:
            note = check_model_source(f"model.{key}", str(value), filename, dry_run=bool(cfg.train.dry_run))
            if note:
                log.info("%s", note)


# key -> (predicate, what it must be); checked where the config is read, before any model is loaded
VALUE_RULES: dict[str, tuple[Any, str]] = {
    "train.rollout_n": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.n_trained": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.train_batch_size": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.ppo_mini_batch_size": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.micro_batch_size_per_gpu": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.max_prompt_length": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.max_response_length": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.total_epochs": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.total_training_steps": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1 (or null: the epochs)"),
    "train.save_freq": (lambda v: isinstance(v, int) and (v >= 1 or v == -1), "an integer >= 1 (or -1: never)"),
    "train.test_freq": (lambda v: isinstance(v, int) and (v >= 1 or v == -1), "an integer >= 1 (or -1: never)"),
    "train.nnodes": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.n_gpus_per_node": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.actor_lr": (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    "train.critic_lr": (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    "train.kl_loss_coef": (lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0"),
    "train.entropy_coeff": (lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0"),
    "train.weight_decay": (lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0"),
    "train.temperature": (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    "train.clip_ratio_low": (lambda v: isinstance(v, (int, float)) and 0 <= v < 1, "a number in [0, 1)"),
    "train.clip_ratio_high": (lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0"),
    "train.dry_run": (lambda v: isinstance(v, bool), "true or false"),
    "train.lr_schedule": (lambda v: v in ("constant", "cosine"), "constant or cosine"),
    "train.min_lr_ratio": (lambda v: isinstance(v, (int, float)) and 0 <= v <= 1, "a number in [0, 1]"),
    "train.lr_warmup_ratio": (lambda v: isinstance(v, (int, float)) and 0 <= v < 1, "a number in [0, 1)"),
    "train.mask_truncated": (lambda v: isinstance(v, bool), "true or false"),
    "train.resample_tags": (lambda v: isinstance(v, bool), "true or false"),
    "train.max_failed_steps": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1 (or null: never stop)"),
    "heldout.n_prompts": (lambda v: isinstance(v, int) and v >= 2, "an integer >= 2"),
    "heldout.samples_per_prompt": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "heldout.bootstrap": (lambda v: isinstance(v, int) and v >= 100, "an integer >= 100"),
    "heldout.temperature": (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    "heldout.top_p": (lambda v: isinstance(v, (int, float)) and 0 < v <= 1, "a number in (0, 1]"),
    "embedding_server.gpu_memory_utilization": (lambda v: isinstance(v, (int, float)) and 0 < v < 1, "in (0, 1)"),
    "backend.rollout_gpu_memory_utilization": (lambda v: isinstance(v, (int, float)) and 0 < v < 1, "in (0, 1)"),
    "reward.threads": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1 (or null: leave the thread pools)"),
}


def validate_train_values(cfg: DictConfig) -> None:
    """Every value of VALUE_RULES that the config has, checked; the first bad one is a UserError."""
    for key, (ok, what) in VALUE_RULES.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value is None:
            continue
        if isinstance(value, bool) and what != "true or false":
            ok_value = False
        else:
            ok_value = ok(value)
        if not ok_value:
            raise UserError(f"{key}={value!r}: must be {what}")


def _without_hydra(cfg: DictConfig) -> tuple[DictConfig, dict[str, Any]]:
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    cfg.paths.root = str(Path(cfg.paths.root).resolve())
    return cfg, choices
