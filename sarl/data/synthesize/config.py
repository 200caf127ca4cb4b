"""The configuration of `python -m sarl.data.synthesize`: where conf/ is, conf/synthesize.yaml composed with
Hydra overrides (each conf/synthesize/recipe/NAME.yaml an option of its `recipe` group), and the checks of a
recipe's method, task and settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from sarl.runtime.errors import UserError, composition_error_message
from sarl.runtime.files import CONF_DIR

SYNTH_DIR = CONF_DIR / "synthesize"
PROMPTS_DIR = SYNTH_DIR / "prompts"
SYNTHESIS_METHODS = ("grp", "structured")
TASKS = ("math", "code")
PROMPT_ROLES = {
    "grp": ("sample", "translate", "refine", "verify"),
    "structured": ("sample", "prefill", "feedback"),
}


def register_recipes(store: Any = None) -> None:
    """Every conf/synthesize/recipe/NAME.yaml as option NAME of the `recipe` group of conf/synthesize.yaml."""
    from hydra.core.config_store import ConfigStore

    store = store or ConfigStore.instance()
    for path in sorted((SYNTH_DIR / "recipe").glob("*.yaml")):
        store.store(group="recipe", name=path.stem, node=OmegaConf.load(path), package="recipe")


def compose_synthesize_config(overrides: list[str]) -> DictConfig:
    """conf/synthesize.yaml with Hydra overrides; a misspelt key or an unknown recipe is a UserError."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_recipes()
    # sarl.data.prepare registers a `dataset` config group in Hydra's process-wide ConfigStore when it is
    # imported; here `dataset` is a plain key (source=prepared), which Hydra would read as that group
    repo = ConfigStore.instance().repo
    hidden = repo.pop("dataset", None)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_synthesize"):
            cfg = compose(config_name="synthesize", overrides=overrides)
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(composition_error_message(err)) from err
    finally:
        if hidden is not None:
            repo["dataset"] = hidden
    cfg.out_dir = str(Path(str(cfg.out_dir)).resolve())
    return cfg


def check_recipe(recipe: Mapping[str, Any]) -> None:
    if recipe.get("method") not in SYNTHESIS_METHODS or recipe.get("task") not in TASKS:
        raise UserError(
            f"recipe {recipe.get('name')}: method={recipe.get('method')} task={recipe.get('task')}; "
            f"method must be one of {SYNTHESIS_METHODS} and task one of {TASKS}"
        )
    if recipe["method"] == "structured" and recipe.get("prefill") not in ("deepseek", "continue", "none"):
        raise UserError(f"recipe.prefill={recipe.get('prefill')} is not valid; choose deepseek, continue or none")
    if recipe["method"] == "grp" and recipe.get("trace_source") not in ("teacher", "dataset"):
        raise UserError(f"recipe.trace_source={recipe.get('trace_source')} is not valid; choose teacher or dataset")
