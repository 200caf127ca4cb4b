"""conf/eval.yaml composed from `python -m eval.run`'s command line (Hydra overrides, the generator, judge and
protocol choices as group overrides), the names of a run (its generator back end, its name, its run directory) and
the building of a configured object (`build`: a generator, a judge).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from eval.cache import safe_name
from sarl.runtime.errors import UserError, composition_error_message
from sarl.runtime.files import CONF_DIR

log = logging.getLogger("eval.run")  # a part of `python -m eval.run`: its messages keep that name

BACKENDS = ("vllm", "openai", "transformers")  # conf/eval/generator/<name>.yaml
GENERATOR_GROUP, JUDGE_GROUP = "eval/generator@generator", "eval/judge@judge"  # the groups in conf/eval.yaml
PROTOCOL_GROUP = "eval/protocol@protocol"


def compose_eval_config(overrides: list[str]) -> DictConfig:
    """conf/eval.yaml with Hydra overrides; paths made absolute. A misspelt key or an unknown option is a
    UserError naming it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = group_overrides(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_eval"):
            cfg = compose(config_name="eval", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(composition_error_message(err)) from err
    cfg.paths.root = str(Path(cfg.paths.root).resolve())
    return cfg


def group_overrides(overrides: list[str]) -> list[str]:
    """The command line with the generator, judge and protocol choices as Hydra's group overrides: `generator=NAME`
    picks conf/eval/generator/NAME.yaml (its settings are then `generator.KEY`), `judge=NAME` conf/eval/judge/NAME.yaml,
    `protocol=NAME` conf/eval/protocol/NAME.yaml.
    The former keys still work: `generator.backend=NAME` is `generator=NAME`, and `generator.NAME.KEY=V` is
    `generator.KEY=V` when NAME is the chosen back end and is ignored otherwise (it had no effect)."""
    backend = "vllm"
    for override in overrides:
        key, eq, value = override.partition("=")
        if eq and key in ("generator", "generator.backend"):
            if value not in BACKENDS:
                raise UserError(f"{key}={value!r}; choose one of: {', '.join(BACKENDS)}")
            backend = value
    out = []
    for override in overrides:
        key, eq, value = override.partition("=")
        bare = key.lstrip("+~")
        prefix = key[: len(key) - len(bare)]
        parts = bare.split(".")
        if eq and bare in ("generator", "generator.backend"):
            out.append(f"{GENERATOR_GROUP}={value}")
        elif eq and bare == "judge":
            out.append(f"{JUDGE_GROUP}={value}")
        elif eq and bare == "protocol":
            names = sorted(p.stem for p in (CONF_DIR / "eval" / "protocol").glob("*.yaml"))
            if value not in names:
                raise UserError(f"protocol={value!r}; choose one of: {', '.join(names)}")
            out.append(f"{PROTOCOL_GROUP}={value}")
        elif len(parts) > 2 and parts[0] == "generator" and parts[1] in BACKENDS:
            if parts[1] == backend:
                out.append(f"{prefix}generator.{'.'.join(parts[2:])}{eq}{value}")
            else:
                log.info("%s has no effect with generator=%s: ignored", override, backend)
        else:
            out.append(override)
    return out


def generator_name(cfg: DictConfig) -> str:
    """The chosen generator back end, from its builder (`eval.generate.<name>_generator`)."""
    return str(cfg.generator._target_).rpartition(".")[2].removesuffix("_generator")


def run_name(cfg: DictConfig) -> str:
    return str(cfg.name) if cfg.name else Path(str(cfg.ckpt).rstrip("/")).name


def build(node: DictConfig, *args: Any) -> Any:
    """`hydra.utils.instantiate(node, *args)` (plain containers for the settings); an error of the builder is
    raised as itself, not wrapped in Hydra's InstantiationException."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, *args, _convert_="all")
    except InstantiationException as err:
        if err.__cause__ is not None:
            raise err.__cause__ from None
        raise


def resolve_run_dir(cfg: DictConfig, name: str) -> Path:
    from sarl.runtime.runs import resolve_run_dir as train_run_dir

    return train_run_dir(cfg, f"eval/{safe_name(name)}")
