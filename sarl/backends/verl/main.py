"""verl's PPO entry point with our trainer:

    python -m sarl.backends.verl.main --config-path RUN_DIR --config-name verl_trainer

The same steps as `verl.trainer.main_ppo.main` (device, verl's config checks, Ray, the task
runner), through verl's hook for recipes, `run_ppo(config, task_runner_class)`, with
`SarlTaskRunner`, whose Ray actor registers `SarlTrainer` (trainer.v1.trainer_mode "sarl").
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from sarl.backends.verl.config import TRAINER_NAME
from sarl.backends.verl.trainer import SarlTaskRunner


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
    run_ppo(config, task_runner_class=SarlTaskRunner)


if __name__ == "__main__":
    main()
