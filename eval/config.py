"""conf/eval.yaml composed from `python -m eval.run`'s command line (Hydra overrides, the generator, judge and
protocol choices as group overrides), the generator this machine can run (`usable_generator`: the default vLLM gives
way to Transformers where vLLM cannot be imported), the names of a run (its generator back end, its name, its run
directory) and the building of a configured object (`build`: a generator, a judge).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from eval.cache import safe_name
from sarl.runtime.errors import UserError, composition_error_message, refuse_new_keys
from sarl.runtime.files import CONF_DIR
from sarl.runtime.runs import resolve_run_dir

log = logging.getLogger("eval.run")  # a part of `python -m eval.run`: its messages keep that name

BACKENDS = ("vllm", "openai", "transformers")  # conf/eval/generator/<name>.yaml
GENERATOR_GROUP, JUDGE_GROUP = "eval/generator@generator", "eval/judge@judge"  # the groups in conf/eval.yaml
PROTOCOL_GROUP = "eval/protocol@protocol"
# the sections whose keys the code reads by name only: a key added to one (`+sampling.new_key=...`) would be ignored
EVAL_CLOSED_SECTIONS = ("sampling", "grading", "paths")


def compose_eval_config(overrides: list[str]) -> DictConfig:
    """conf/eval.yaml with Hydra overrides; paths made absolute. A misspelt key (the nearest one named), a key
    added to a section whose keys are read by name only (EVAL_CLOSED_SECTIONS) or an unknown option is a UserError
    naming it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = group_overrides(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_eval"):
            cfg = compose(config_name="eval", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(composition_error_message(err)) from err
    refuse_new_keys(overrides, cfg, EVAL_CLOSED_SECTIONS)
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


def generator_chosen(overrides: list[str]) -> bool:
    """Whether the command line chooses the generator or sets one of its keys (`generator=NAME`,
    `generator.backend=NAME`, `generator.KEY=V`): then it is used as given, never replaced (`usable_generator`)."""
    return any(o.partition("=")[0].lstrip("+~").split(".")[0] == "generator" for o in overrides)


def vllm_unavailable() -> str | None:
    """Why vLLM cannot run in this process, or None when it can: not installed (no `vllm` module to find), or its
    import fails (a broken install: a CUDA library missing, a torch it was not built for). The import is the one
    the vLLM generator makes next anyway, so it costs nothing extra where vLLM works."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "is not installed here"
    try:
        importlib.import_module("vllm")
    except Exception as err:  # any failure of the import: the generator cannot run here
        first = (str(err).strip().splitlines() or [""])[0]
        return f"cannot be imported here ({type(err).__name__}: {first})"
    return None


def usable_generator(cfg: DictConfig, chosen: bool) -> DictConfig:
    """`cfg` with a generator this machine can run. vLLM (the default, conf/eval/generator/vllm.yaml) that cannot
    be imported here: when the user did not choose the generator (`chosen`, `generator_chosen`), Transformers
    (conf/eval/generator/transformers.yaml), said in one line, so that `python -m eval.run ckpt=DIR` works on a
    CPU-only machine; when they chose it, a UserError naming the fix. Any other generator is returned as it is."""
    from omegaconf import OmegaConf

    if generator_name(cfg) != "vllm":
        return cfg
    reason = vllm_unavailable()
    if reason is None:
        return cfg
    if chosen:
        raise UserError(
            f"generator=vllm but vLLM {reason}: install the gpu extra (pip install -e '.[gpu]'), or choose "
            "generator=transformers (CPU, slow) or generator=openai generator.url=URL (a running server)"
        )
    log.info("vLLM %s: generating with Transformers (generator=transformers; slow, for CPU checks)", reason)
    cfg.generator = OmegaConf.load(CONF_DIR / "eval" / "generator" / "transformers.yaml")  # the group's option
    return cfg


def generator_name(cfg: DictConfig) -> str:
    """The chosen generator back end, from its builder (`eval.generate.<name>_generator`)."""
    return str(cfg.generator._target_).rpartition(".")[2].removesuffix("_generator")


RUN_LEVELS = 4  # final/ is 1 below its run's directory; verl's checkpoints/global_step_N/actor/huggingface/ is 4


def training_run(ckpt: str) -> dict[str, str] | None:
    """The `sarl.train` run that wrote the checkpoint: the nearest directory at or above it (at most RUN_LEVELS up)
    holding the run's meta.json, which names its row (`experiment`). Returns the row, the run's directory and its
    date (the directory's name, `<date>_<time>`); None for a Hub id or a checkpoint from elsewhere."""
    path = Path(ckpt).expanduser()
    if not path.is_dir():
        return None
    path = path.resolve()
    for folder in [path, *path.parents][: RUN_LEVELS + 1]:
        meta = folder / "meta.json"
        if not meta.is_file():
            continue
        try:
            row = json.loads(meta.read_text(encoding="utf-8")).get("experiment")
        except (OSError, ValueError, AttributeError):
            return None
        return {"row": row, "run_dir": str(folder), "date": folder.name} if isinstance(row, str) and row else None
    return None


def run_name(cfg: DictConfig) -> str:
    """`name=` if given; else the row of the training run that wrote the checkpoint (so `notebooks/tables.py` finds
    it under its row); else the checkpoint directory's name (a Hub id's last part)."""
    if cfg.name:
        return str(cfg.name)
    trained = training_run(str(cfg.ckpt))
    return trained["row"] if trained else Path(str(cfg.ckpt).rstrip("/")).name


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


def eval_run_dir(cfg: DictConfig, name: str) -> Path:
    return resolve_run_dir(cfg, f"eval/{safe_name(name)}")
