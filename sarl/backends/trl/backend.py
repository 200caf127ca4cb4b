"""backend=trl behind the back-end interface (sarl/backends/base.py, conf/backend/trl.yaml's `impl`): TRL's trainer
in this process (sarl.backends.trl.run), or one process per GPU under torchrun (`backend.distributed: fsdp`,
sarl.backends.trl.distributed) in its own process group."""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sarl.backends.trl import distributed
from sarl.backends.trl.preflight import trl_cheap_checks, trl_preflight
from sarl.backends.trl.run import dry_run_config, train, unsupported
from sarl.runtime.checks import Check
from sarl.runtime.runs import dry_run_command, experiment_name, patched_environ, run_record
from sarl.runtime.signals import run_in_own_group
from sarl.serving.auto import embedding_server_for
from sarl.smoke.policy import with_local_policy

log = logging.getLogger("sarl.train.trl")


class TrlBackend:
    """TRL's GRPOTrainer, DPOTrainer or SFTTrainer (sarl/backends/trl/run.py: what it refuses, `unsupported`)."""

    def refuse(self, cfg: DictConfig) -> str | None:
        return unsupported(cfg)

    def dry_run(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path, overrides: list[str]) -> int:
        """The trainer and its arguments on stdout; this command (and torchrun's, for several processes) on
        stderr."""
        n = distributed.processes(cfg)
        sys.stdout.write(OmegaConf.to_yaml(OmegaConf.create(dry_run_config(cfg, run_dir))))
        kept = [o for o in overrides if not o.startswith(("train.dry_run", "run_dir="))]
        sys.stderr.write(shlex.join([sys.executable, "-m", "sarl.train", *kept, f"run_dir={run_dir}"]) + "\n")
        if n > 1:
            sys.stderr.write(dry_run_command(distributed.worker_launch_command(run_dir, n), [run_dir / "config.yaml"]))
        return 0

    def cheap_checks(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path) -> list[Check]:
        return trl_cheap_checks(cfg)  # the GPUs the processes need, the memory plan

    def launch(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path) -> int:
        n = distributed.processes(cfg)
        if n > 1:
            with_local_policy(cfg)  # built once here, not by every rank
        meta, env = run_record(cfg, choices, experiment_name(choices), run_dir)
        if n > 1:
            cmd = distributed.worker_launch_command(run_dir, n)
            log.info("launching %d TRL processes: %s", n, shlex.join(cmd))
            return run_in_own_group(cmd, cwd=Path.cwd(), env=env)  # Ctrl-C or SIGTERM stops torchrun's whole group
        reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
        with embedding_server_for(cfg, reward_cfg), patched_environ(env):
            return train(cfg, run_dir, meta, env, reward_cfg=reward_cfg)

    def preflight(self, cfg: DictConfig, choices: dict[str, Any], stages: list[Check]) -> list[Check]:
        """What TRL refuses, the training file, the GPUs, the model, the memory plan (DPO), W&B; then the pipeline
        stages' own checks (`stages`)."""
        return [*trl_preflight(cfg), *stages]

    def stage_checks(
        self, cfg: DictConfig, run_dir: Path, experiment: str, stage: str, allow_download: bool = True
    ) -> list[Check]:
        return []  # a TRL stage is checked by its own run (sarl.train), as a TRL row is
