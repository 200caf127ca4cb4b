"""What every process of a verl run needs from us, GPU or CPU: imported by `import verl` itself.

`sarl.train` puts this module in `VERL_USE_EXTERNAL_MODULES` (verl 0.9.1 `verl/__init__.py`: each module named
there is imported when verl is), in the environment of the launched entry point and in Ray's runtime_env, so
the driver, the task runner, every Ray worker (actor, reference, critic, rollout, reward) and every torchrun
rank of an SFT stage import it before they build a model. It does three things:

- **trl's value head** (docs/decisions.md §7.2): verl's `apply_monkey_patch`
  (verl/models/transformers/monkey_patch.py:352-359), which runs for every actor and reference model,
  imports `AutoModelForCausalLMWithValueHead` from `trl.experimental.ppo` or `trl` only to set its
  `state_dict`; trl 1.16 (the TRL back end's pin) has neither, so every verl model build failed with an
  ImportError. `install_value_head_shim` gives verl a class to patch where trl has none; creating a model
  from it raises, naming the reason (verl's only other use, the critic's TRL fallback in
  `verl/utils/model.py:load_valuehead_model`, is replaced by `sarl.backends.verl.attention`).
- **metrics.jsonl survives a resume**: verl's file logger (`trainer.logger` "file", `VERL_FILE_LOGGER_PATH`) opens
  its file with "wb" (verl/utils/tracking.py:541), so a resumed run erased the steps logged before the stop;
  `append_file_logger` opens it for appending (a repeated step's later record wins where it is read,
  sarl.reports.figures.read_metrics_history).
- **the critic's attention**: importing `sarl.backends.verl.attention` replaces verl's critic loader, which
  hard-codes flash_attention_2, in this process. verl's own `critic.model.external_lib` import runs only where
  the critic's `HFModelConfig` is built (the task runner); the Ray worker that loads the critic gets a pickled
  copy and never ran it, so without this module the critic loaded with flash_attention_2 in the worker.
"""

from __future__ import annotations

import sys
import types

MODULE = __name__  # what VERL_USE_EXTERNAL_MODULES names
SHIM_MODULE = "trl.experimental.ppo"


class AutoModelForCausalLMWithValueHead:
    """Where trl has no `AutoModelForCausalLMWithValueHead` (trl >= 1.x): the class verl's monkey patch sets
    `state_dict` on. Nothing in a sarl run creates one; doing so is an error that says why."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "trl.AutoModelForCausalLMWithValueHead is not in this trl (the TRL back end pins trl 1.16); "
            "sarl's verl runs load the critic through sarl.backends.verl.attention.load_valuehead_model"
        )

    @classmethod
    def from_pretrained(cls, *args: object, **kwargs: object) -> AutoModelForCausalLMWithValueHead:
        return cls(*args, **kwargs)


def trl_has_value_head() -> bool:
    """Whether `from trl.experimental.ppo import ...` or `from trl import ...` finds the class (verl's two tries)."""
    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead as _  # noqa: F401

        return True
    except ImportError:
        pass
    try:
        from trl import AutoModelForCausalLMWithValueHead as _  # noqa: F401, F811

        return True
    except ImportError:
        return False


def install_value_head_shim() -> bool:
    """Make verl's first import (`trl.experimental.ppo`) find `AutoModelForCausalLMWithValueHead`; True if the
    shim was installed, False where trl has the class itself (left alone)."""
    if trl_has_value_head():
        return False
    shim = types.ModuleType(SHIM_MODULE, "sarl's stand-in for trl's PPO value head (sarl.backends.verl.patches)")
    shim.AutoModelForCausalLMWithValueHead = AutoModelForCausalLMWithValueHead
    sys.modules[SHIM_MODULE] = shim
    return True


def append_file_logger() -> None:
    """verl's `FileLogger` appending to its file instead of truncating it (module docstring)."""
    from verl.utils import tracking

    if getattr(tracking.FileLogger, "_sarl_appends", False):
        return
    opened = tracking.FileLogger.__init__

    def __init__(self, project_name: str, experiment_name: str) -> None:
        real_open = open

        def appending(path, mode="r", *args, **kwargs):  # noqa: ANN001, ANN202
            return real_open(path, "ab" if mode == "wb" else mode, *args, **kwargs)

        tracking.open = appending  # the module's `open`, for this call only
        try:
            opened(self, project_name, experiment_name)
        finally:
            del tracking.open

    tracking.FileLogger.__init__ = __init__
    tracking.FileLogger._sarl_appends = True


install_value_head_shim()
append_file_logger()

import sarl.backends.verl.attention  # noqa: E402, F401  (replaces verl's critic loader in this process)
