"""backend=verl and backend=verl_cpu behind the back-end interface (sarl/backends/base.py, conf/backend/verl.yaml's
`impl`): verl's trainer config written into the run directory and verl's entry point launched on it (RL), or
torchrun on verl's SFT trainer (`algorithm=sft`, sarl.backends.verl.sft). `backend.cpu: true` (verl_cpu) runs the
same trainer on a CPU (sarl/backends/verl/cpu): the smoke data as parquet, no GPU to check or plan.

verl's own modules load in ~9 s: they are imported where a run needs them, not when this module is.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, read_write

from sarl.backends.verl import cpu
from sarl.backends.verl import preflight as verl_preflight
from sarl.backends.verl.process import quiet_verl_notices, run_verl_process
from sarl.backends.verl.steps import step_plan
from sarl.data.checks import check_data
from sarl.reports.curves import run_curves
from sarl.runtime.checkpoints import FINAL_SUBDIR, evaluate_hint, export_final, last_checkpoint
from sarl.runtime.checks import Check
from sarl.runtime.errors import UserError
from sarl.runtime.node_checks import check_gpus, check_wandb
from sarl.runtime.runs import (
    dry_run_command,
    experiment_name,
    node_env,
    resolve_run_dir,
    run_record,
    wandb_env,
    wandb_record,
)
from sarl.runtime.weights import verl_actor_problem, weights_problem
from sarl.serving.auto import check_reward_dependencies, check_reward_endpoints, planned_embedding_server
from sarl.serving.checks import check_embedding_server, check_model_files
from sarl.smoke.policy import with_local_policy

log = logging.getLogger("sarl.train.verl")

VERL_CONFIG_NAME = "verl_trainer"


def launch_command(run_dir: Path, entry_module: str) -> list[str]:
    """The verl entry point `backend.entry_module` (ours: verl's PPO main with our TaskRunner) on the config file
    this run wrote; Hydra's own records and log of that process go into the run directory (not `outputs/` under
    the working directory)."""
    return [
        sys.executable,
        "-m",
        entry_module,
        "--config-path",
        str(run_dir),
        "--config-name",
        VERL_CONFIG_NAME,
        f"hydra.run.dir={run_dir}",
        "hydra.output_subdir=verl_hydra",
    ]


def with_cpu_data(cfg: DictConfig, run_dir: Path) -> None:
    """`backend=verl_cpu` on a data group with TRL prompts only (the smoke sets): verl's parquet of them in the run
    directory (its planned path in a dry run)."""
    if not cfg.backend.get("cpu", False) or cfg.data.get("train_files") or not cfg.data.get("trl_train_files"):
        return
    if cfg.train.dry_run:
        folder = run_dir / cpu.PARQUET_SUBDIR
        train, val = str(folder / "train.parquet"), str(folder / "val.parquet") if cfg.data.get("trl_val_files") else ""
    else:
        train, val = cpu.write_smoke_parquet(cfg, run_dir)
    with read_write(cfg.data):
        cfg.data.train_files = train
        cfg.data.val_files = val or train


def saved_weights_problem(run_dir: Path) -> str | None:
    """Why a finished verl run has no usable final model (None if it has one): its `final/` is made from its last
    checkpoint (verl RL's FSDP shards merged and checked against them; verl SFT's Hugging Face copy linked) and must
    load. (TRL checks its `final/` itself, against the trained tensors: sarl.backends.trl.run.)"""
    last = last_checkpoint(run_dir)
    if last is not None and last.kind == "verl":
        problem = verl_actor_problem(last.path)  # every rank's shard is there before the merge reads them
        if problem:
            return problem
    return export_final(run_dir) or weights_problem(run_dir / FINAL_SUBDIR)


@dataclass
class VerlRun:
    """An RL run prepared once (its dry run, its cheap checks and its launch read the same): verl's trainer config,
    the resolved reward config as building it left it (the planned embedding server's URL in), the embedding server
    it starts (or None), the command, the training length."""

    config: DictConfig
    reward_cfg: dict
    server: Any
    cmd: list[str]
    length: str


class VerlBackend:
    """verl's RL trainers (PPO, GRPO and the other advantage estimators) and its SFT trainer."""

    def __init__(self) -> None:
        self.runs: dict[Path, VerlRun] = {}

    def refuse(self, cfg: DictConfig) -> str | None:
        from sarl.structure.embed.hidden import asks_for_live_policy  # deferred: imports numba and scipy

        algorithm = cfg.algorithm.name
        if algorithm == "dpo":
            return "algorithm=dpo is not a verl trainer: run it with backend=trl (TRL's DPOTrainer)"
        if algorithm != "sft" and asks_for_live_policy(cfg.reward.get("embedder")):
            return (
                "embedding=policy_hidden (model: policy) embeds with the policy being trained, which verl's reward "
                "workers do not hold (decisions §1.2): run it with backend=trl, or use embedding=vllm_server on verl"
            )
        return None

    def prepare(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path) -> VerlRun:
        """Write verl's trainer config for this RL run (once per run directory): the policy built where the model
        group builds one, the CPU's parquet (verl_cpu), the reward's endpoints checked, the config validated
        against verl's schema."""
        if run_dir in self.runs:
            return self.runs[run_dir]
        # deferred: imports verl (~9 s)
        from sarl.backends.verl.config import build_verl_config, validate_verl_config

        if int(cfg.train.save_freq) <= 0:  # verl's RL trainer saves only then (and then always the last step too)
            raise UserError(
                f"train.save_freq={cfg.train.save_freq}: verl's RL trainer saves nothing unless it is > 0, and a run "
                "must end with its weights; set train.save_freq to a positive number of steps (the last step is saved)"
            )
        with_cpu_data(cfg, run_dir)
        experiment = experiment_name(choices)
        reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
        server = planned_embedding_server(cfg, reward_cfg)  # its URL goes into verl's config
        check_reward_endpoints(cfg, reward_cfg)
        run_vars = wandb_env(cfg, experiment, run_dir, probe_host=not cfg.train.dry_run)
        if not cfg.train.dry_run:  # this node's settings (the Hub's offline mode, the collectives' interface)
            run_vars = {**node_env(), **run_vars}
        verl_cfg = build_verl_config(cfg, reward_cfg, str(run_dir), experiment, env_vars=run_vars)
        validate_verl_config(verl_cfg)
        plan = step_plan(cfg)
        length = (
            f"# training length: {plan.describe()}\n"
            if plan
            else "# training length: unknown until the data is prepared\n"
        )
        self.runs[run_dir] = VerlRun(
            verl_cfg, reward_cfg, server, launch_command(run_dir, cfg.backend.entry_module), length
        )
        return self.runs[run_dir]

    def dry_run(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path, overrides: list[str]) -> int:
        """verl's trainer config on stdout, the command on stderr (the SFT trainer's for `algorithm=sft`)."""
        quiet_verl_notices(bool(cfg.backend.get("cpu", False)))
        with_local_policy(cfg)
        if cfg.algorithm.name == "sft":
            from sarl.backends.verl.sft import run_verl_sft  # deferred: imports verl (~9 s)

            return run_verl_sft(cfg, choices, experiment_name(choices), run_dir)
        run = self.prepare(cfg, choices, run_dir)
        sys.stdout.write(OmegaConf.to_yaml(run.config))
        sys.stderr.write(run.length + dry_run_command(run.cmd, [run_dir / f"{VERL_CONFIG_NAME}.yaml"]))
        return 0

    def cheap_checks(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path) -> list[Check]:
        """The data, the run directory and its disk, the memory plan, the rewards' own checks (the code sandbox);
        UserError where verl's entry point cannot be imported. The SFT trainer checks its memory plan itself,
        once its config is built (sarl.backends.verl.sft.run_verl_sft)."""
        quiet_verl_notices(bool(cfg.backend.get("cpu", False)))
        with_local_policy(cfg)
        if cfg.algorithm.name == "sft":
            return []
        run = self.prepare(cfg, choices, run_dir)
        log.info("%s", run.length.removeprefix("# ").rstrip())
        try:
            importlib.import_module(cfg.backend.entry_module)  # the entry point the run launches
        except ImportError as err:
            raise UserError(
                f"verl's V1 trainer cannot be imported here ({err}); install this package (pip install -e .), "
                "on a GPU node with `pip install -r requirements/gpu.lock`"
            ) from err
        reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)  # as composed (verl's config rewrote the run's)
        return verl_preflight.verl_cheap_checks(cfg, run.config, run_dir, reward_cfg)

    def launch(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path) -> int:
        """The trainer to its final model (`final/`, checked to load), then the RL curves and how to evaluate."""
        if cfg.algorithm.name == "sft":
            from sarl.backends.verl.sft import run_verl_sft  # deferred: imports verl (~9 s)

            rc = run_verl_sft(cfg, choices, experiment_name(choices), run_dir)
        else:
            rc = self.launch_rl(cfg, choices, run_dir)
        if rc:
            return rc
        problem = saved_weights_problem(run_dir)  # no run ends without its weights
        if problem:
            log.error("the run saved no usable model: %s", problem)
            return 1
        if cfg.algorithm.name != "sft":  # the RL curves, as a TRL run draws them (sarl.reports.curves)
            try:
                log.info("curves: %s", run_curves(run_dir))
            except ValueError as err:  # a run that logged no training signal: said, the model stands
                log.warning("no curves drawn: %s", err)
        log.info("%s", evaluate_hint(run_dir, bool(cfg.model.get("build"))))
        return 0

    def launch_rl(self, cfg: DictConfig, choices: dict[str, Any], run_dir: Path) -> int:
        # deferred: imports verl (~9 s)
        from sarl.backends.verl.config import process_env, reward_cores_problem

        run = self.prepare(cfg, choices, run_dir)
        cores = reward_cores_problem(cfg, run.reward_cfg)
        if cores:  # slower, not wrong: said, and the run goes on
            log.warning("%s", cores)
        meta, env = run_record(cfg, choices, experiment_name(choices), run_dir)
        with run.server if run.server is not None else contextlib.nullcontext():
            check_reward_dependencies(run.reward_cfg)  # the server is up: a dead endpoint stops the run before verl
            (run_dir / f"{VERL_CONFIG_NAME}.yaml").write_text(OmegaConf.to_yaml(run.config))
            if "wandb" in cfg.logger.backends:
                wandb_record(cfg, meta, run_dir, env)
            log.info("launching: %s", shlex.join(run.cmd))
            total = run.config.trainer.get("total_training_steps")
            return run_verl_process(run.cmd, run_dir, {**env, **process_env(cfg, run_dir)}, total)

    def preflight(self, cfg: DictConfig, choices: dict[str, Any], stages: list[Check]) -> list[Check]:
        """Every check of a verl row: the node's GPUs and stack (the CPU stack for verl_cpu), the attention
        implementation, the pipeline's stages (`stages`), then the trainer config and what it needs: the models,
        the memory plan, the embedding server, the data, the run directory, W&B, the rewards' own checks."""
        # deferred (both): import verl (~9 s)
        from sarl.backends.verl.attention import check_attention
        from sarl.backends.verl.config import build_verl_config

        experiment = experiment_name(choices)
        run_dir = resolve_run_dir(cfg, experiment)
        reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
        attention = check_attention(str(cfg.backend.attn_implementation))
        if cfg.backend.get("cpu", False):  # backend=verl_cpu: the CPU stack, no GPU
            checks = [*verl_preflight.check_cpu_stack(), attention]
        else:
            checks = [check_gpus(cfg), *verl_preflight.check_stack(), attention]
        if cfg.algorithm.name == "sft":  # verl's SFT trainer: no rollout, no reward
            own = stages if cfg.get("pipeline") else self.stage_checks(cfg, run_dir, experiment, "")
            return [*checks, check_model_files(cfg, {}), *own]
        checks += stages
        try:
            check_reward_endpoints(cfg, reward_cfg)
            verl_cfg = build_verl_config(cfg, copy.deepcopy(reward_cfg), str(run_dir), experiment)
        except Exception as err:
            checks.append(Check("verl config", False, str(err), "fix the override named above"))
            return checks
        checks.append(Check("verl config", True, f"{experiment}: composed against verl {cfg.backend.version}'s schema"))
        return [
            *checks,
            check_model_files(cfg, reward_cfg),
            *verl_preflight.check_memory_plan(cfg, verl_cfg, reward_cfg, allow_download=True),
            check_embedding_server(cfg, reward_cfg),
            check_data(cfg),
            verl_preflight.check_run_dir(cfg, verl_cfg, run_dir, allow_download=True),
            check_wandb(cfg),
            *verl_preflight.reward_checks(reward_cfg),
        ]

    def stage_checks(
        self, cfg: DictConfig, run_dir: Path, experiment: str, stage: str, allow_download: bool = True
    ) -> list[Check]:
        """The memory plan of a verl SFT run (`algorithm=sft`: a row, or the stage `stage` of a pipeline); none for
        an RL stage (its row's own checks)."""
        if cfg.algorithm.name != "sft":
            return []
        from sarl.backends.verl.sft import build_verl_sft_config  # deferred: imports verl (~9 s)

        try:
            sft_cfg = build_verl_sft_config(cfg, str(run_dir), experiment)
        except Exception as err:
            return [Check("verl SFT config", False, f"{experiment}: {err}", "fix the override named above")]
        return verl_preflight.check_sft_memory_plan(cfg, sft_cfg, stage, allow_download)
