"""Train a policy with a reward from conf/: one command per row of the SARL paper.

    python -m sarl.train +exp=grpo_sarl_math
    python -m sarl.train +exp=grpo_sarl_math train.dry_run=true    # verl config on stdout, command on stderr
    python -m sarl.train algorithm=ppo reward=sarl_c_only data=aime_1983_2024

The config is composed with Hydra's compose API (so that verl's own packaged config can be
composed afterwards as the schema of the backend config); arguments are Hydra overrides.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sarl.backends.trl import distributed
from sarl.backends.trl import run as trl
from sarl.backends.trl.preflight import run_trl_cheap_checks
from sarl.backends.trl.run import unsupported
from sarl.backends.verl import cpu
from sarl.backends.verl.process import quiet_verl_notices, run_verl_process
from sarl.backends.verl.steps import step_plan
from sarl.contract.reward import reward_class
from sarl.launch import sweep
from sarl.launch.compose import check_model_paths, compose_user_config
from sarl.launch.format_preflight import check_format
from sarl.launch.pipeline import run_pipeline, saved_weights_problem, split_stage_overrides
from sarl.preflight import run_cheap_checks
from sarl.reports.curves import run_curves
from sarl.runtime import torch_threads
from sarl.runtime.checkpoints import evaluate_hint
from sarl.runtime.errors import UserError, debug_requested
from sarl.runtime.hub import offline_if_unreachable, offline_note
from sarl.runtime.runs import (
    dry_run_command,
    experiment_name,
    node_env,
    patched_environ,
    resolve_run_dir,
    run_record,
    wandb_env,
    wandb_record,
)
from sarl.runtime.signals import Terminated, run_in_own_group, signals_as_exceptions
from sarl.runtime.usage import Usage, asks_for_help, usage
from sarl.serving.auto import (
    check_reward_dependencies,
    check_reward_endpoints,
    embedding_server_for,
    planned_embedding_server,
)
from sarl.smoke.policy import policy_path
from slurm import launcher

log = logging.getLogger("sarl.train")

VERL_CONFIG_NAME = "verl_trainer"


class UnsupportedOnBackend(RuntimeError):
    """A config that composes but that the chosen back end cannot run (an evaluation set as training data, DPO
    on verl, a TRL limit, a reward class that cannot be imported, verl missing): exit 2 with the reason."""


SAMPLES = "pkg://sarl.samples/"  # the hand-written sample sets shipped in the package (sarl/samples/)


def shipped_sample(cfg: DictConfig) -> tuple[str, str] | None:
    """(data key, value) of a data file of the run that is one of the package's sample sets, or None."""
    for key in ("sft_files", "train_files", "trl_train_files", "dpo_files"):
        value = cfg.data.get(key)
        if isinstance(value, str) and value.startswith(SAMPLES):
            return f"data.{key}", value
    return None


def is_paper_row(cfg: DictConfig, choices: dict[str, Any]) -> bool:
    """A row that reproduces a paper's table or figure: a conf/exp/*_paper.yaml file, or one naming a table."""
    paper = cfg.get("paper") or {}
    return str(choices.get("exp") or "").endswith("_paper") or bool(paper.get("tables"))


def check_paper_data(cfg: DictConfig, choices: dict[str, Any]) -> None:
    """Before a real run: a paper row does not train on the package's sample sets (they serve backend=verl_cpu,
    dry runs and the tiny test policy), which would pass every size check on a cluster and train silently."""
    backend = cfg.backend.name
    sample = shipped_sample(cfg)
    if (
        sample
        and is_paper_row(cfg, choices)
        and not (cfg.backend.get("cpu") or cfg.train.dry_run or cfg.model.get("build"))
    ):
        key, value = sample
        raise UserError(
            f"{key}={value} is the handful of sample traces shipped with the package, not the paper's set: a paper "
            f"row ({choices.get('exp')}) on {backend} would train on them silently. Write the full set first "
            f"({cfg.data.get('synthesize_hint') or 'python -m sarl.data.synthesize, docs/synthesize.md'}) and pass "
            f"{key}=PATH; the samples serve backend=verl_cpu, dry runs and the tiny test policy"
        )


def check_supported(cfg: DictConfig, choices: dict[str, Any]) -> None:
    """Fail at once, with the reason and what to choose instead, for a row the chosen back end cannot run."""
    from sarl.structure.embed.hidden import asks_for_live_policy  # deferred: imports numba and scipy

    backend, algorithm = cfg.backend.name, cfg.algorithm.name
    if cfg.data.get("role") == "eval":
        raise UnsupportedOnBackend(
            f"data={choices.get('data')} is an evaluation benchmark (role: eval), not a training set; "
            "train on aime_1983_2024 or openrubrics_v2 and evaluate with `python -m eval.run`"
        )
    if (algorithm == "sft") != (cfg.data.get("role") == "sft"):
        raise UserError(
            f"algorithm={algorithm} with data={choices.get('data')}: SFT trains on an SFT data group (data=sft_*, "
            "with sft_files) and every other algorithm on prompts; pick matching groups"
        )
    if backend == "trl":
        why = unsupported(cfg)
        if why:
            raise UnsupportedOnBackend(why)
    if backend == "verl" and algorithm == "dpo":
        raise UnsupportedOnBackend("algorithm=dpo is not a verl trainer: run it with backend=trl (TRL's DPOTrainer)")
    if backend == "verl" and algorithm not in ("dpo", "sft") and asks_for_live_policy(cfg.reward.get("embedder")):
        raise UnsupportedOnBackend(
            "embedding=policy_hidden (model: policy) embeds with the policy being trained, which verl's reward "
            "workers do not hold (decisions §1.2): run it with backend=trl, or use embedding=vllm_server on verl"
        )
    if algorithm in ("dpo", "sft"):
        return  # DPO learns from preference pairs, SFT from traces; the reward group is not used
    target = cfg.reward.get("_target_")
    try:
        reward_class(target)  # importable, and a reward (sarl.contract.reward.Reward)
    except Exception as err:
        raise UnsupportedOnBackend(f"reward '{choices['reward']}' ({target}) cannot be used: {err}") from err


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


def run(
    cfg: DictConfig,
    choices: dict[str, Any],
    overrides: list[str] | None = None,
    stage_overrides: dict[str, list[str]] | None = None,
) -> int:
    """One training run, or the stages of an exp file's `pipeline` in order (sarl.launch.pipeline)."""
    experiment = experiment_name(choices)
    pipeline = cfg.get("pipeline")
    if not pipeline:
        if stage_overrides:
            raise UserError(f"STAGE:key=value overrides ({', '.join(stage_overrides)}) need an exp with a pipeline")
        check_supported(cfg, choices)
        check_paper_data(cfg, choices)
    if cfg.launcher.name != "local":  # submit this same command (slurm/launcher.py); a dry run shows the job
        staged = [f"{k}:{o}" for k, items in (stage_overrides or {}).items() for o in items]
        argv = launcher.train_argv([*(overrides or []), *staged], cfg)
        if not cfg.train.dry_run:
            return launcher.dispatch("sarl.train", argv, cfg.launcher)
        job_argv = [a for a in argv if not a.startswith("train.dry_run")]
        sys.stderr.write(launcher.submission_plan("sarl.train", job_argv, cfg.launcher))
    point = sweep.run_point(cfg, choices)
    if point is not None:  # a sweep's run: named by its point, whichever route ran it (sarl.launch.sweep)
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.sweep.point = point[1]
    run_dir = resolve_run_dir(cfg, experiment if point is None else sweep.run_subdir(experiment, *point))
    if pipeline:
        return run_pipeline(cfg, experiment, overrides or [], stage_overrides or {}, run_dir, run_stage=run)
    if not cfg.train.dry_run:
        check_format(cfg)  # a reward that reads a format, on a policy that writes it (format_check)
    if cfg.backend.name == "trl":
        return run_trl(cfg, choices, experiment, run_dir, overrides or [])
    quiet_verl_notices(bool(cfg.backend.get("cpu", False)))
    with_local_policy(cfg)
    if cfg.algorithm.name == "sft":
        from sarl.backends.verl.sft import run_verl_sft  # deferred: imports verl (~9 s)

        rc = run_verl_sft(cfg, choices, experiment, run_dir)
    else:
        rc = run_verl(cfg, choices, experiment, run_dir)
    if rc or cfg.train.dry_run:
        return rc

    problem = saved_weights_problem(cfg, run_dir)  # no run ends without its weights
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


def run_trl(cfg: DictConfig, choices: dict[str, Any], experiment: str, run_dir: Path, overrides: list[str]) -> int:
    """backend=trl: TRL's trainer in this process (sarl.backends.trl.run), or one process per GPU under torchrun
    (`backend.distributed: fsdp`, sarl.backends.trl.distributed) in its own process group."""
    n = distributed.processes(cfg)
    if cfg.train.dry_run:
        sys.stdout.write(OmegaConf.to_yaml(OmegaConf.create(trl.dry_run_config(cfg, run_dir))))
        kept = [o for o in overrides if not o.startswith(("train.dry_run", "run_dir="))]
        sys.stderr.write(shlex.join([sys.executable, "-m", "sarl.train", *kept, f"run_dir={run_dir}"]) + "\n")
        if n > 1:
            sys.stderr.write(dry_run_command(distributed.launch_command(run_dir, n), [run_dir / "config.yaml"]))
        return 0

    run_trl_cheap_checks(cfg)  # the GPUs the processes need, the memory plan
    if n > 1:
        with_local_policy(cfg)  # built once here, not by every rank
    meta, env = run_record(cfg, choices, experiment, run_dir)
    if n > 1:
        cmd = distributed.launch_command(run_dir, n)
        log.info("launching %d TRL processes: %s", n, shlex.join(cmd))
        return run_in_own_group(cmd, cwd=Path.cwd(), env=env)  # Ctrl-C or SIGTERM stops torchrun's whole group
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    with embedding_server_for(cfg, reward_cfg), patched_environ(env):
        return trl.train(cfg, run_dir, meta, env, reward_cfg=reward_cfg)


def with_local_policy(cfg: DictConfig) -> None:
    """A model group without a path (`model=tiny_qwen3`) gets the policy built on this machine (cached), whose
    directory verl loads like any other checkpoint."""
    if cfg.model.get("path") or not cfg.model.get("build"):
        return
    from omegaconf import read_write

    torch_threads.apply(cfg.backend.get("torch_threads", "auto"))  # the build runs in this process
    with read_write(cfg.model):
        cfg.model.path = str(policy_path(cfg))


def with_cpu_data(cfg: DictConfig, run_dir: Path) -> None:
    """`backend=verl_cpu` on a data group with TRL prompts only (the smoke sets): verl's parquet of them in the run
    directory (its planned path in a dry run)."""
    if not cfg.backend.get("cpu", False) or cfg.data.get("train_files") or not cfg.data.get("trl_train_files"):
        return
    from omegaconf import read_write

    if cfg.train.dry_run:
        folder = run_dir / cpu.DATA_DIR
        train, val = str(folder / "train.parquet"), str(folder / "val.parquet") if cfg.data.get("trl_val_files") else ""
    else:
        train, val = cpu.write_smoke_parquet(cfg, run_dir)
    with read_write(cfg.data):
        cfg.data.train_files = train
        cfg.data.val_files = val or train


def run_verl(cfg: DictConfig, choices: dict[str, Any], experiment: str, run_dir: Path) -> int:
    """backend=verl: write verl's trainer config and launch verl's entry point on it."""
    # deferred: imports verl (~9 s)
    from sarl.backends.verl.config import build_verl_config, process_env, validate_verl_config

    if int(cfg.train.save_freq) <= 0:  # verl's RL trainer saves only then (and then always the last step too)
        raise UserError(
            f"train.save_freq={cfg.train.save_freq}: verl's RL trainer saves nothing unless it is > 0, and a run "
            "must end with its weights; set train.save_freq to a positive number of steps (the last step is saved)"
        )
    with_cpu_data(cfg, run_dir)
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    server = planned_embedding_server(cfg, reward_cfg)  # its URL goes into verl's config
    check_reward_endpoints(cfg, reward_cfg)
    run_vars = wandb_env(cfg, experiment, run_dir, probe_host=not cfg.train.dry_run)
    if not cfg.train.dry_run:  # this node's settings (the Hub's offline mode, the collectives' interface)
        run_vars = {**node_env(), **run_vars}
    verl_cfg = build_verl_config(cfg, reward_cfg, str(run_dir), experiment, env_vars=run_vars)
    validate_verl_config(verl_cfg)
    cmd = launch_command(run_dir, cfg.backend.entry_module)
    plan = step_plan(cfg)
    length = (
        f"# training length: {plan.describe()}\n" if plan else "# training length: unknown until the data is prepared\n"
    )
    if cfg.train.dry_run:
        sys.stdout.write(OmegaConf.to_yaml(verl_cfg))
        sys.stderr.write(length + dry_run_command(cmd, [run_dir / f"{VERL_CONFIG_NAME}.yaml"]))
        return 0
    log.info("%s", length.removeprefix("# ").rstrip())
    try:
        importlib.import_module(cfg.backend.entry_module)  # the entry point the run launches
    except ImportError as err:
        raise UnsupportedOnBackend(
            f"verl's V1 trainer cannot be imported here ({err}); install this package (pip install -e .), "
            "on a GPU node with `pip install -r requirements/gpu.lock`"
        ) from err
    from sarl.backends.verl.config import reward_cores_problem  # deferred: imports verl (~9 s)

    run_cheap_checks(cfg, verl_cfg, run_dir)
    cores = reward_cores_problem(cfg, reward_cfg)
    if cores:  # slower, not wrong: said, and the run goes on
        log.warning("%s", cores)
    meta, env = run_record(cfg, choices, experiment, run_dir)
    with server if server is not None else contextlib.nullcontext():
        check_reward_dependencies(reward_cfg)  # the server is up: a dead endpoint stops the run before verl starts
        (run_dir / f"{VERL_CONFIG_NAME}.yaml").write_text(OmegaConf.to_yaml(verl_cfg))
        if "wandb" in cfg.logger.backends:
            wandb_record(cfg, meta, run_dir, env)
        log.info("launching: %s", shlex.join(cmd))
        total = verl_cfg.trainer.get("total_training_steps")
        return run_verl_process(cmd, run_dir, {**env, **process_env(cfg, run_dir)}, total)


USAGE = Usage(
    synopsis=(
        "python -m sarl.train +exp=ROW [KEY=VALUE ...] [GROUP=OPTION ...] [STAGE:KEY=VALUE ...]",
        "python -m sarl.train +exp=ROW train.dry_run=true   # the back end's config on stdout, the command on stderr",
        "python -m sarl.train +exp=ROW backend=verl_cpu     # the row's own verl trainer on CPU, 2 steps",
        "python -m sarl.train -m sweep.name=NAME [KEY=a,b]  # a grid of sweeps/NAME.yaml (or key=a,b), point by point",
    ),
    about=(
        "Train a policy with a reward: a paper row (conf/exp/ROW.yaml) or any combination of the groups below, on "
        "verl (GPU clusters; verl_cpu on a laptop) or TRL (CPU or one GPU). The run directory gets config.yaml, "
        "meta.json, metrics.jsonl, checkpoints and final/, the model `python -m eval.run ckpt=<run dir>` evaluates."
    ),
    keys=(
        ("train.dry_run", "true: compose, check and print what would run; nothing is started or written"),
        ("run_dir", "the run directory (default runs/<row>/<date>_<time>); an existing one resumes its checkpoints"),
        ("seed", "the data order's and the sampler's seed"),
        (
            "train.KEY",
            "SARL Tables 6-7's settings: rollout_n, train_batch_size, actor_lr, kl_loss_coef, save_freq, ...",
        ),
        ("backend.KEY", "the back end's settings: max_steps (TRL), n_gpus_per_node, rollout_tensor_parallel_size, ..."),
        ("STAGE:KEY", "a pipeline row's stage only, e.g. sft:data.sft_files=FILE rl:train.total_training_steps=100"),
    ),
    groups=(
        ("+exp", "exp", "a paper row (README 'Paper rows')"),
        ("algorithm", "algorithm", "the RL (or SFT, DPO) algorithm"),
        ("reward", "reward", "the reward"),
        ("data", "data", "the training set (sarl.data.prepare builds it)"),
        ("model", "model", "the policy"),
        ("backend", "backend", "the trainer"),
        ("embedding", "embedding", "the structure reward's embedder"),
        ("launcher", "launcher", "run here (local) or submit to SLURM"),
        ("logger", "logger", "where metrics go besides metrics.jsonl"),
    ),
    more="More: docs/commands.md, docs/reproduce.md (the command of every paper table).",
)


def main(argv: list[str] | None = None) -> int:
    """SIGTERM and SIGHUP end the run like an error (sarl.runtime.signals): its children are stopped, exit
    128+signal."""
    args = list(sys.argv[1:] if argv is None else argv)
    if asks_for_help(args):
        sys.stdout.write(usage(USAGE))
        return 0
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s] %(message)s")
    offline_if_unreachable()  # before anything imports huggingface_hub: no Hub retries here or in the children
    torch_threads.wait_policy_env()  # before torch loads OpenMP, here and in the TRL ranks (sarl.runtime.torch_threads)
    if any(a in sweep.MULTIRUN_FLAGS for a in args):
        return multirun([a for a in args if a not in sweep.MULTIRUN_FLAGS])

    overrides, stage_overrides = split_stage_overrides(args)
    try:
        cfg, choices = compose_user_config(overrides)
        if not cfg.get("pipeline"):  # a pipeline checks each stage's model (sarl.launch.pipeline)
            check_model_paths(cfg)
    except UserError as err:
        if debug_requested():
            raise
        log.error("%s", err)
        return 2
    if offline_note():  # said once the command's checks passed: a one-line error stays one line
        log.info("%s", offline_note())
    try:
        with signals_as_exceptions():
            return run(cfg, choices, overrides, stage_overrides)
    except (UnsupportedOnBackend, UserError) as err:
        log.error("%s", err)
        return 2
    except Terminated as err:
        log.error("%s: the run stopped, and its child processes with it", err)
        return err.exit_code


def multirun(args: list[str]) -> int:
    """`-m`: every point of the sweep, one `sarl.train` command each (run here, or submitted by the launcher), in
    order; the exit code is the first failure's (sarl.launch.sweep)."""
    try:
        points = sweep.expand(args)
    except UserError as err:
        log.error("%s", err)
        return 2
    log.info("multirun: %d point(s)", len(points))
    codes = []
    for i, point in enumerate(points, 1):
        log.info("multirun point %d/%d: %s", i, len(points), shlex.join(point))
        codes.append(main(point))
    failed = [(i, rc) for i, rc in enumerate(codes, 1) if rc]
    if failed:
        log.error("multirun: %d of %d point(s) failed: %s", len(failed), len(points), failed)
        return failed[0][1]
    log.info("multirun: %d point(s) done", len(points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
