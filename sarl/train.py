"""Train a policy with a reward from conf/: one command per row of the SARL paper.

    python -m sarl.train +exp=grpo_sarl_math
    python -m sarl.train +exp=grpo_sarl_math train.dry_run=true    # verl config on stdout, command on stderr
    python -m sarl.train algorithm=ppo reward=sarl_c_only data=aime_1983_2024

The config is composed with Hydra's compose API (so that verl's own packaged config can be
composed afterwards as the schema of the backend config); arguments are Hydra overrides.

compose -> check -> launch: `main` composes the row, `run` checks it (what its back end refuses, the paper's
data, the reward's output format, the back end's cheap checks) and launches it on the back end that
`conf/backend/<name>.yaml` names by `impl` (sarl/backends/base.py: its dry run, its checks, its launch).
"""

from __future__ import annotations

import logging
import shlex
import sys
from typing import Any

from omegaconf import DictConfig, open_dict

from sarl.backends.base import Backend, backend_for
from sarl.contract.reward import reward_class
from sarl.launch import sweep
from sarl.launch.compose import check_model_paths, compose_user_config
from sarl.launch.format_preflight import check_format
from sarl.launch.inputs import refuses_samples, shipped_sample
from sarl.launch.pipeline import run_pipeline, split_stage_overrides
from sarl.runtime import torch_threads
from sarl.runtime.checks import raise_failed
from sarl.runtime.errors import UserError, debug_requested
from sarl.runtime.hub import offline_if_unreachable, offline_note
from sarl.runtime.runs import experiment_name, resolve_run_dir
from sarl.runtime.signals import Terminated, signals_as_exceptions
from sarl.runtime.usage import Usage, asks_for_help, usage
from slurm import launcher

log = logging.getLogger("sarl.train")


class UnsupportedOnBackend(RuntimeError):
    """A config that composes but that the chosen back end cannot run (an evaluation set as training data, DPO
    on verl, a TRL limit, a reward class that cannot be imported: the back end's `refuse`): exit 2 with the
    reason."""


def check_paper_data(cfg: DictConfig, choices: dict[str, Any]) -> None:
    """Before a real run: a paper row does not train on the package's sample sets (they serve a back end that
    declares `backend.sample_data: true`, backend=verl_cpu, dry runs and the tiny test policy), which would pass every
    size check on a cluster and train silently."""
    backend = cfg.backend.name
    sample = shipped_sample(cfg)
    if sample and refuses_samples(cfg, choices):
        key, value = sample
        raise UserError(
            f"{key}={value} is the handful of sample traces shipped with the package, not the paper's set: a paper "
            f"row ({choices.get('exp')}) on {backend} would train on them silently. Write the full set first "
            f"({cfg.data.get('synthesize_hint') or 'python -m sarl.data.synthesize, docs/synthesize.md'}) and pass "
            f"{key}=PATH; the samples serve backend=verl_cpu, dry runs and the tiny test policy"
        )


def check_supported(cfg: DictConfig, choices: dict[str, Any], backend: Backend | None = None) -> None:
    """Fail at once, with the reason and what to choose instead, for a row the chosen back end (`backend`, else
    the one `cfg` names) cannot run: a data group of the wrong role, what the back end refuses, a reward class
    that cannot be imported."""
    algorithm = cfg.algorithm.name
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
    why = (backend or backend_for(cfg)).refuse(cfg)
    if why:
        raise UnsupportedOnBackend(why)
    if algorithm in ("dpo", "sft"):
        return  # DPO learns from preference pairs, SFT from traces; the reward group is not used
    target = cfg.reward.get("_target_")
    try:
        reward_class(target)  # importable, and a reward (sarl.contract.reward.Reward)
    except Exception as err:
        raise UnsupportedOnBackend(f"reward '{choices['reward']}' ({target}) cannot be used: {err}") from err


def run(
    cfg: DictConfig,
    choices: dict[str, Any],
    overrides: list[str] | None = None,
    stage_overrides: dict[str, list[str]] | None = None,
) -> int:
    """One training run, or the stages of an exp file's `pipeline` in order (sarl.launch.pipeline): the composed
    row checked (what its back end refuses, the paper's data, the reward's format), then its back end's dry run,
    or its cheap checks and its launch (sarl/backends/base.py)."""
    experiment = experiment_name(choices)
    pipeline = cfg.get("pipeline")
    backend = backend_for(cfg)
    if not pipeline:
        if stage_overrides:
            raise UserError(f"STAGE:key=value overrides ({', '.join(stage_overrides)}) need an exp with a pipeline")
        check_supported(cfg, choices, backend)
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
        with open_dict(cfg):
            cfg.sweep.point = point[1]
    run_dir = resolve_run_dir(cfg, experiment if point is None else sweep.run_subdir(experiment, *point))
    if pipeline:
        return run_pipeline(cfg, experiment, overrides or [], stage_overrides or {}, run_dir, run_stage=run)
    if cfg.train.dry_run:
        return backend.dry_run(cfg, choices, run_dir, overrides or [])
    check_format(cfg)  # a reward that reads a format, on a policy that writes it (format_check)
    raise_failed(backend.cheap_checks(cfg, choices, run_dir))  # PreflightError: one line per failure, exit 2
    return backend.launch(cfg, choices, run_dir)


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
