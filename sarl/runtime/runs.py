"""Run directories, their records and W&B: what every entry point (training, evaluation) shares.

A run directory is `<paths.runs_dir>/<experiment>/<date>_<time>[_j<SLURM job id>]` (`resolve_run_dir`); it holds
the resolved `config.yaml` and `meta.json` (commit, package versions, command, job id: `run_record`). W&B
runs offline without an API key or a reachable server and keeps one run id per run directory, so a restarted run
continues it (`wandb_env`).
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
from urllib.parse import urlsplit

from omegaconf import DictConfig, OmegaConf

from sarl.runtime.network import reachable, route_address

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


WANDB_URL = "https://api.wandb.ai"  # W&B's cloud; WANDB_BASE_URL names a self-hosted server


def wandb_url(env: dict[str, str]) -> str:
    """The W&B server the runs log to: WANDB_BASE_URL, else W&B's cloud."""
    return env.get("WANDB_BASE_URL") or WANDB_URL


def wandb_key_available(env: dict[str, str]) -> bool:
    """Whether W&B has an API key: WANDB_API_KEY, or an entry for the server's host in ~/.netrc (`wandb login`)."""
    netrc = Path(env.get("HOME") or Path.home()) / ".netrc"
    host = urlsplit(wandb_url(env)).hostname or "api.wandb.ai"
    return bool(env.get("WANDB_API_KEY")) or (netrc.exists() and host in netrc.read_text())


_SAID: set[str] = set()  # the offline lines this process printed


def wandb_offline_when_unusable(env: dict[str, str], probe_host: bool = True) -> None:
    """WANDB_MODE=offline in `env` unless the user set WANDB_MODE: when there is no API key (env or ~/.netrc), and
    when there is one but the W&B server (`wandb_url`) cannot be reached from this node (`probe_host`: one TCP
    connection, through the environment's proxy where one applies; a compute node without internet and a key on a
    shared home would otherwise wait for wandb.init's 90 s timeout and then raise). Each reason is said once per
    process, in one line; every child started with `env` (torchrun's ranks, verl's Ray actors through its
    runtime_env) inherits the mode and decides nothing again."""
    if "WANDB_MODE" in env:
        return
    if not wandb_key_available(env):
        env["WANDB_MODE"] = "offline"
        _say_once("no W&B API key: WANDB_MODE=offline", logging.INFO)
    elif probe_host and not reachable(wandb_url(env)):
        env["WANDB_MODE"] = "offline"
        host, port = route_address(wandb_url(env))
        _say_once(
            f"W&B ({host}:{port}) cannot be reached from this node: WANDB_MODE=offline, the logs stay in the run "
            "directory's wandb/ (`wandb sync` them from a machine that reaches W&B)",
            logging.WARNING,
        )


def _say_once(line: str, level: int) -> None:
    if line not in _SAID:
        _SAID.add(line)
        log.log(level, "%s", line)


def wandb_env(
    cfg: DictConfig, experiment: str, run_dir: Path, environ: dict[str, str] | None = None, probe_host: bool = True
) -> dict[str, str]:
    """The W&B settings of the run, for this process, verl's process and, through Ray's runtime_env, verl's
    trainer actor and workers (which run with the environment of the Ray daemons, not of this process):
    WANDB_MODE=offline without an API key or a reachable W&B server (`wandb_offline_when_unusable`; `probe_host`
    False: a dry run, which connects to nothing), a stable WANDB_RUN_ID from the run directory
    (a restarted run continues the same W&B run), WANDB_RESUME=allow, the entity (`logger.entity`), and for a
    sweep's run its name and group (`sweep.name`/`sweep.point`, sarl.launch.sweep)."""
    environ = os.environ if environ is None else environ
    if "wandb" not in cfg.logger.backends:
        return {}
    out: dict[str, str] = {}
    probe = dict(environ)
    wandb_offline_when_unusable(probe, probe_host)
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


# The settings of a run that every node's processes need, copied from the driver's environment into Ray's
# runtime_env (the other nodes' Ray daemons were started before the driver decided them): the Hub's offline mode
# and cache (sarl.runtime.hub.offline_if_unreachable), the network interface of the collectives (slurm.launcher
# sets them from launcher.ray_interface or the route to the head), NCCL's own tuning. No secrets (tokens, keys):
# the runtime_env is written into the run directory's verl_trainer.yaml.
NODE_ENV_VARS = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
)
NODE_ENV_PREFIXES = ("NCCL_",)  # NCCL_IB_HCA, NCCL_DEBUG, ...: tuning a cluster's docs tell users to export


def node_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The run's settings every node needs (`NODE_ENV_VARS`, `NODE_ENV_PREFIXES`) as this process has them."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in NODE_ENV_VARS or k.startswith(NODE_ENV_PREFIXES)}


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
        mode=env.get("WANDB_MODE"),  # offline when unusable (wandb_offline_when_unusable), not only os.environ's
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
