"""Run directories, their records and W&B: what every entry point (training, evaluation) shares.

A run directory is `<paths.runs_dir>/<experiment>/<date>_<time>[_j<SLURM job id>]` (`resolve_run_dir`); it holds
the resolved `config.yaml` and `meta.json` (commit, package versions, command, job id: `run_record`). W&B
runs offline without an API key and keeps one run id per run directory, so a restarted run continues it
(`wandb_env`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def experiment_name(choices: dict[str, Any]) -> str:
    """The exp file's name, else <algorithm>_<reward>_<data>."""
    return choices.get("exp") or f"{choices['algorithm']}_{choices['reward']}_{choices['data']}"


def resolve_run_dir(
    cfg: DictConfig, experiment: str, env: dict[str, str] | None = None, now: dt.datetime | None = None
) -> Path:
    """A directory no other job shares: date and time, plus the SLURM job id under SLURM.
    A requeued SLURM job finds its own directory again (same job id) and resumes from it."""
    env = os.environ if env is None else env
    if cfg.run_dir:
        return Path(cfg.run_dir).resolve()
    base = Path(cfg.paths.runs_dir) / experiment
    job = env.get("SLURM_JOB_ID")
    if job:
        existing = sorted(base.glob(f"*_j{job}")) if base.exists() else []
        if existing:
            return existing[-1]
    stamp = (now or dt.datetime.now()).strftime("%Y-%m-%d_%H-%M-%S")
    return base / (f"{stamp}_j{job}" if job else stamp)


def dry_run_command(cmd: list[str], writes: list[Path]) -> str:
    """What a dry run prints on stderr after the config: the files a real run writes before it launches (the
    command names them; the dry run wrote nothing), then the command."""
    import shlex

    return f"# dry run: nothing written; a real run writes {', '.join(map(str, writes))} and runs:\n{shlex.join(cmd)}\n"


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("sarl", "verl", "vllm", "torch", "transformers", "trl"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def git_commit() -> str:
    repo = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def wandb_key_available(env: dict[str, str]) -> bool:
    """Whether W&B has an API key: WANDB_API_KEY, or an api.wandb.ai entry in ~/.netrc (`wandb login`)."""
    netrc = Path.home() / ".netrc"
    return bool(env.get("WANDB_API_KEY")) or (netrc.exists() and "api.wandb.ai" in netrc.read_text())


def wandb_offline_unless_logged_in(env: dict[str, str]) -> None:
    """WANDB_MODE=offline when there is no API key (env or ~/.netrc)."""
    if not wandb_key_available(env) and "WANDB_MODE" not in env:
        env["WANDB_MODE"] = "offline"
        log.info("no W&B API key: WANDB_MODE=offline")


def wandb_env(cfg: DictConfig, experiment: str, run_dir: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The W&B settings of the run, for this process, verl's process and, through Ray's runtime_env, verl's
    trainer actor and workers (which run with the environment of the Ray daemons, not of this process):
    WANDB_MODE=offline without an API key (env or ~/.netrc), a stable WANDB_RUN_ID from the run directory
    (a restarted run continues the same W&B run), WANDB_RESUME=allow, the entity (`logger.entity`), and for a
    sweep's run its name and group (`sweep.name`/`sweep.point`, sarl.launch.sweep)."""
    environ = os.environ if environ is None else environ
    if "wandb" not in cfg.logger.backends:
        return {}
    out: dict[str, str] = {}
    probe = dict(environ)
    wandb_offline_unless_logged_in(probe)
    if probe.get("WANDB_MODE"):
        out["WANDB_MODE"] = probe["WANDB_MODE"]
    out["WANDB_RUN_ID"] = environ.get("WANDB_RUN_ID") or f"{experiment}-{run_dir.name}".replace("/", "-")
    out["WANDB_RESUME"] = environ.get("WANDB_RESUME") or "allow"
    entity = cfg.logger.entity or environ.get("WANDB_ENTITY")
    if entity:
        out["WANDB_ENTITY"] = str(entity)
    out["WANDB_DIR"] = str(run_dir)
    sweep = cfg.get("sweep")
    if sweep and sweep.get("name") and sweep.get("point"):  # the same name by the multirun and the W&B agent
        out["WANDB_NAME"] = f"{sweep.name}/{sweep.point}"
        out["WANDB_RUN_GROUP"] = str(sweep.name)
    return out


def run_record(cfg: DictConfig, choices: dict[str, Any], experiment: str, run_dir: Path) -> tuple[dict, dict[str, str]]:
    """Create the run directory, save the resolved config and meta.json (commit, versions, job id), and
    return the meta and the environment of the run (W&B offline without a key, a stable W&B run id)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "experiment": experiment,
        "choices": choices,
        "git_commit": git_commit(),
        "versions": versions(),
        "command": sys.argv,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    env = wandb_env(cfg, experiment, run_dir)
    if env.get("WANDB_RUN_ID"):  # eval.run adds its scores to this W&B run (eval.results.log_to_training_run)
        meta["wandb_run_id"] = env["WANDB_RUN_ID"]
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta, {**os.environ, **env}


def wandb_init(cfg: DictConfig, meta: dict, run_dir: Path, env: dict[str, str]):
    """The run's W&B run (stable id from `env`, resumed if it exists) with the resolved config, commit and versions."""
    import wandb

    return wandb.init(
        id=env["WANDB_RUN_ID"],
        resume="allow",
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        dir=str(run_dir),
        name=env.get("WANDB_NAME"),  # a sweep's point (sarl.launch.sweep); None: W&B's own name
        group=env.get("WANDB_RUN_GROUP"),
        config={"sarl": OmegaConf.to_container(cfg, resolve=True), "meta": meta},
    )


def wandb_record(cfg: DictConfig, meta: dict, run_dir: Path, env: dict[str, str]) -> None:
    """Send the resolved config, commit and versions to the W&B run that verl will then log to."""
    with patched_environ(env):
        w = wandb_init(cfg, meta, run_dir, env)
        w.save(str(run_dir / "config.yaml"), base_path=str(run_dir), policy="now")
        w.save(str(run_dir / "meta.json"), base_path=str(run_dir), policy="now")
        w.finish()


@contextlib.contextmanager
def patched_environ(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
