"""verl's PPO entry point with our trainer:

    python -m sarl.backends.verl.main --config-path RUN_DIR --config-name verl_trainer

The same steps as `verl.trainer.main_ppo.main` (device, verl's config checks, Ray, the task
runner), through verl's hook for recipes, `run_ppo(config, task_runner_class)`, with
`SarlTaskRunner`, whose Ray actor registers `SarlTrainer` (trainer.v1.trainer_mode "sarl").
A run stopped because its rewards kept failing (`RewardsFailedError`, raised in the Ray actor) ends
with one line on stderr and exit code 1, not Ray's traceback.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from sarl.backends.verl.config import TRAINER_NAME
from sarl.backends.verl.trainer import SarlTaskRunner
from sarl.contract.reward import RewardsFailedError


def rewards_failed(err: BaseException) -> RewardsFailedError | None:
    """The `RewardsFailedError` behind `err`: itself, or the cause of a Ray task error (`.cause`) or chain."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)
        if isinstance(exc, RewardsFailedError) and not isinstance(cause, BaseException):
            return exc
        todo += [cause if isinstance(cause, BaseException) else None, exc.__cause__, exc.__context__]
    return None


@hydra.main(config_path=None, config_name=None, version_base=None)
def main(config: DictConfig) -> None:
    if "trainer" not in config:
        raise SystemExit("usage: python -m sarl.backends.verl.main --config-path RUN_DIR --config-name verl_trainer")
    if not config.trainer.use_v1 or config.trainer.v1.trainer_mode != TRAINER_NAME:
        raise ValueError(
            f"sarl's trainer is verl's V1 trainer mode {TRAINER_NAME!r}: set trainer.use_v1=true and "
            f"trainer.v1.trainer_mode={TRAINER_NAME} (sarl.train does)"
        )
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    try:
        run_ppo(config, task_runner_class=SarlTaskRunner)
    except Exception as err:
        stop = rewards_failed(err)
        if stop is None:
            raise
        print(f"training stopped: {stop}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
