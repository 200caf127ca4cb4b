"""Train a policy with a reward from conf/: one command per row of the SARL paper.

    python -m sarl.train +exp=grpo_sarl_math
    python -m sarl.train +exp=grpo_sarl_math train.dry_run=true    # verl config on stdout, command on stderr
    python -m sarl.train algorithm=ppo reward=sarl_c_only data=aime_1983_2024

The config is composed with Hydra's compose API (so that verl's own packaged config can be
composed afterwards as the schema of the backend config); arguments are Hydra overrides.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import json
import logging
import os
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from sarl.errors import UserError, composition_error_message, debug_requested
from sarl.signals import stop_process_group

log = logging.getLogger("sarl.train")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
VERL_CONFIG_NAME = "verl_trainer"


class NotLandedError(RuntimeError):
    """A config that composes but names a part the project does not have yet."""


def compose_train_config(overrides: list[str]) -> tuple[DictConfig, dict[str, Any]]:
    """conf/train.yaml with the given Hydra overrides, and the chosen option of every group."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sarl_train"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    return _without_hydra(cfg)


def compose_user_config(overrides: list[str]) -> tuple[DictConfig, dict[str, Any]]:
    """`compose_train_config` for a command line: a misspelt key, an unknown option or an invalid value is a
    UserError naming it (Hydra's message, first lines), checked before anything runs."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg, choices = compose_train_config(overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(composition_error_message(err)) from err
    validate_train_values(cfg)
    return cfg, choices


# key -> (predicate, what it must be); checked where the config is read, before any model is loaded
VALUE_RULES: dict[str, tuple[Any, str]] = {
    "train.rollout_n": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.n_trained": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.train_batch_size": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.ppo_mini_batch_size": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.micro_batch_size_per_gpu": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.max_prompt_length": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.max_response_length": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.total_epochs": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.save_freq": (lambda v: isinstance(v, int) and (v >= 1 or v == -1), "an integer >= 1 (or -1: never)"),
    "train.test_freq": (lambda v: isinstance(v, int) and (v >= 1 or v == -1), "an integer >= 1 (or -1: never)"),
    "train.nnodes": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.n_gpus_per_node": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "train.actor_lr": (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    "train.critic_lr": (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    "train.kl_loss_coef": (lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0"),
    "train.entropy_coeff": (lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0"),
    "train.temperature": (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    "train.clip_ratio_low": (lambda v: isinstance(v, (int, float)) and 0 <= v < 1, "a number in [0, 1)"),
    "train.clip_ratio_high": (lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0"),
    "train.dry_run": (lambda v: isinstance(v, bool), "true or false"),
    "train.lr_schedule": (lambda v: v in ("constant", "cosine"), "constant or cosine"),
    "train.min_lr_ratio": (lambda v: isinstance(v, (int, float)) and 0 <= v <= 1, "a number in [0, 1]"),
    "train.lr_warmup_ratio": (lambda v: isinstance(v, (int, float)) and 0 <= v < 1, "a number in [0, 1)"),
    "train.mask_truncated": (lambda v: isinstance(v, bool), "true or false"),
    "train.max_failed_steps": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1 (or null: never stop)"),
    "embedding_server.gpu_memory_utilization": (lambda v: isinstance(v, (int, float)) and 0 < v < 1, "in (0, 1)"),
    "backend.rollout_gpu_memory_utilization": (lambda v: isinstance(v, (int, float)) and 0 < v < 1, "in (0, 1)"),
}


def validate_train_values(cfg: DictConfig) -> None:
    """Every value of VALUE_RULES that the config has, checked; the first bad one is a UserError."""
    for key, (ok, what) in VALUE_RULES.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value is None:
            continue
        if isinstance(value, bool) and what != "true or false":
            ok_value = False
        else:
            ok_value = ok(value)
        if not ok_value:
            raise UserError(f"{key}={value!r}: must be {what}")


def _without_hydra(cfg: DictConfig) -> tuple[DictConfig, dict[str, Any]]:
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    cfg.paths.root = str(Path(cfg.paths.root).resolve())
    return cfg, choices


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


def check_landed(cfg: DictConfig, choices: dict[str, Any]) -> None:
    """Fail at once, with a message, for a row whose reward, algorithm or backend is not here yet."""
    from hydra.utils import get_class

    backend, algorithm = cfg.backend.name, cfg.algorithm.name
    if cfg.data.get("role") == "eval":
        raise NotLandedError(
            f"data={choices.get('data')} is an evaluation benchmark (role: eval), not a training set; "
            "train on aime_1983_2024 or openrubrics_v2 and evaluate with `python -m eval.run`"
        )
    if backend == "trl":
        from sarl.backends.trl.run import unsupported

        why = unsupported(cfg)
        if why:
            raise NotLandedError(why)
    if backend == "verl" and algorithm == "dpo":
        raise NotLandedError("algorithm=dpo is not a verl trainer: run it with backend=trl (TRL's DPOTrainer)")
    if algorithm == "dpo":
        return  # DPO learns from preference pairs; the reward group is not used
    target = cfg.reward.get("_target_")
    try:
        get_class(target)
    except Exception as err:
        raise NotLandedError(f"reward '{choices['reward']}' ({target}) has not landed yet: {err}") from err


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


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("sarl", "verl", "vllm", "torch", "transformers", "trl"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def git_commit() -> str:
    repo = Path(__file__).resolve().parent.parent
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
    (a restarted run continues the same W&B run), WANDB_RESUME=allow, and the entity (`logger.entity`)."""
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
    return out


def starts_embedding_server(reward_cfg: dict) -> bool:
    """Whether the reward's embedder is the HTTP client with url "auto": sarl.train then starts the server."""
    embedder = reward_cfg.get("embedder") or {}
    return embedder.get("_target_") == "sarl.embed.http.HTTPEmbedder" and embedder.get("url") == "auto"


def planned_embedding_server(cfg: DictConfig, reward_cfg: dict) -> Any | None:
    """The standalone embedding server when the reward's embedder asks for url "auto" (not started yet), with
    its URL written into `reward_cfg` now, so that the config verl receives carries it. One node: bound and
    reached at 127.0.0.1. Several nodes (`train.nnodes` > 1): verl's reward workers run on every node, so the
    server listens on all interfaces and is reached at this node's routable address. Pinned to the GPU
    `embedding_server.gpu` of the node's visible GPUs (the one the memory plan charges)."""
    if not starts_embedding_server(reward_cfg):
        return None
    embedder = reward_cfg["embedder"]
    from sarl.embed.server import EmbeddingServer
    from sarl.network import routable_ip

    s = cfg.embedding_server
    nnodes = int(OmegaConf.select(cfg, "train.nnodes", default=1))
    if s.host != "auto":
        bind, advertise = str(s.host), str(s.host)
    elif nnodes > 1:
        head = os.environ.get("RAY_ADDRESS", "").rpartition(":")[0] or None
        try:
            bind, advertise = "0.0.0.0", routable_ip(head)
        except OSError as err:
            raise UserError(
                f"embedding_server.host=auto on {nnodes} nodes: {err}; set embedding_server.host=<this node's IP>"
            ) from err
    else:
        bind = advertise = "127.0.0.1"
    max_model_len = s.max_model_len
    from sarl.backends.verl.memory import find_model_config

    context = (find_model_config(str(s.model)) or {}).get("max_position_embeddings")
    if max_model_len and context and int(max_model_len) > int(context):  # vLLM refuses a longer one
        log.info("embedding_server.max_model_len=%s exceeds %s's context: serving %s", max_model_len, s.model, context)
        max_model_len = int(context)
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    gpu = int(s.gpu)
    device = visible[gpu] if gpu < len(visible) else str(gpu)
    server = EmbeddingServer(
        s.model,
        served_name=embedder.get("model"),
        python=s.python or sys.executable,
        host=bind,
        advertise_host=advertise,
        port=s.port,
        gpu_memory_utilization=s.gpu_memory_utilization,
        max_model_len=max_model_len,
        extra_args=[*(["--dtype", str(s.dtype)] if s.dtype else []), *s.extra_args],
        env={"CUDA_VISIBLE_DEVICES": device},
        startup_timeout_s=s.startup_timeout_s,
    )
    embedder["url"] = server.url
    return server


@contextlib.contextmanager
def embedding_server_for(cfg: DictConfig, reward_cfg: dict) -> Iterator[None]:
    """Start the standalone embedding server when the reward's embedder asks for url "auto";
    stop it (by its process id) when the run ends, fails or is interrupted."""
    server = planned_embedding_server(cfg, reward_cfg)
    with server if server is not None else contextlib.nullcontext():
        yield


def check_reward_endpoints(cfg: DictConfig, reward_cfg: dict) -> None:
    """On several nodes, a reward server at a loopback address is reachable from one node only: refuse it."""
    nnodes = int(OmegaConf.select(cfg, "train.nnodes", default=1))
    url = (reward_cfg.get("embedder") or {}).get("url")
    if nnodes <= 1 or not isinstance(url, str) or url == "auto":
        return
    from urllib.parse import urlparse

    from sarl.network import is_loopback

    host = urlparse(url).hostname or ""
    if is_loopback(host):
        raise UserError(
            f"embedding.url={url} is a loopback address but train.nnodes={nnodes}: verl's reward workers on the "
            "other nodes cannot reach it; give the server's routable address, or embedding.url=auto"
        )


def check_reward_dependencies(reward_cfg: dict) -> None:
    """The reward's embedding endpoint (its external dependency on verl: the reward itself is built in verl's
    workers) embeds one text; a dead one is a UserError naming it, before any GPU work."""
    embedder = reward_cfg.get("embedder") or {}
    if embedder.get("_target_") != "sarl.embed.http.HTTPEmbedder":
        return
    from hydra.utils import instantiate

    from sarl.reward import embedder_problem

    problem = embedder_problem(instantiate(embedder))
    if problem:
        raise UserError(f"the reward cannot run: {problem}")


def run(cfg: DictConfig, choices: dict[str, Any], overrides: list[str] | None = None) -> int:
    experiment = experiment_name(choices)
    check_landed(cfg, choices)
    if cfg.launcher.name != "local" and not cfg.train.dry_run:  # submit this same command (slurm/launcher.py)
        from slurm.launcher import dispatch, train_argv

        return dispatch("sarl.train", train_argv(overrides or [], cfg), cfg.launcher)
    run_dir = resolve_run_dir(cfg, experiment)
    if cfg.backend.name == "trl":
        return run_trl(cfg, choices, experiment, run_dir, overrides or [])
    return run_verl(cfg, choices, experiment, run_dir)


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
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta, {**os.environ, **wandb_env(cfg, experiment, run_dir)}


def run_trl(cfg: DictConfig, choices: dict[str, Any], experiment: str, run_dir: Path, overrides: list[str]) -> int:
    """backend=trl: TRL's trainer in this process (sarl.backends.trl.run)."""
    from sarl.backends.trl import run as trl

    if cfg.train.dry_run:
        sys.stdout.write(OmegaConf.to_yaml(OmegaConf.create(trl.dry_run_config(cfg, run_dir))))
        cmd = [sys.executable, "-m", "sarl.train", *[o for o in overrides if not o.startswith("train.dry_run")]]
        sys.stderr.write(shlex.join([*cmd, f"run_dir={run_dir}"]) + "\n")
        return 0
    meta, env = run_record(cfg, choices, experiment, run_dir)
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    with embedding_server_for(cfg, reward_cfg), _patched_environ(env):
        return trl.train(cfg, run_dir, meta, env, reward_cfg=reward_cfg)


def run_verl(cfg: DictConfig, choices: dict[str, Any], experiment: str, run_dir: Path) -> int:
    """backend=verl: write verl's trainer config and launch verl's entry point on it."""
    from sarl.backends.verl.config import build_verl_config, validate_verl_config

    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    server = planned_embedding_server(cfg, reward_cfg)  # its URL goes into verl's config
    check_reward_endpoints(cfg, reward_cfg)
    wandb_vars = wandb_env(cfg, experiment, run_dir)
    verl_cfg = build_verl_config(cfg, reward_cfg, str(run_dir), experiment, env_vars=wandb_vars)
    validate_verl_config(verl_cfg)
    cmd = launch_command(run_dir, cfg.backend.entry_module)
    if cfg.train.dry_run:
        sys.stdout.write(OmegaConf.to_yaml(verl_cfg))
        sys.stderr.write(shlex.join(cmd) + "\n")
        return 0
    try:
        importlib.import_module(cfg.backend.entry_module)  # the entry point the run launches
    except ImportError as err:
        raise NotLandedError(
            f"verl's V1 trainer cannot be imported here ({err}); install this package (pip install -e .), "
            "on a GPU node with `pip install -e .[gpu]`"
        ) from err
    from sarl.preflight import run_cheap_checks

    run_cheap_checks(cfg, verl_cfg, run_dir)
    meta, env = run_record(cfg, choices, experiment, run_dir)
    with server if server is not None else contextlib.nullcontext():
        check_reward_dependencies(reward_cfg)  # the server is up: a dead endpoint stops the run before verl starts
        (run_dir / f"{VERL_CONFIG_NAME}.yaml").write_text(OmegaConf.to_yaml(verl_cfg))
        if "wandb" in cfg.logger.backends:
            _wandb_record(cfg, meta, run_dir, env)
        log.info("launching: %s", shlex.join(cmd))
        proc = subprocess.Popen(cmd, cwd=run_dir, env=env, start_new_session=True)
        try:
            return proc.wait()
        except BaseException:
            stop_process_group(proc, grace_s=60)  # SIGTERM to verl's group, SIGKILL if it is still there
            raise


def wandb_init(cfg: DictConfig, meta: dict, run_dir: Path, env: dict[str, str]):
    """The run's W&B run (stable id from `env`, resumed if it exists) with the resolved config, commit and versions."""
    import wandb

    return wandb.init(
        id=env["WANDB_RUN_ID"],
        resume="allow",
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        dir=str(run_dir),
        config={"sarl": OmegaConf.to_container(cfg, resolve=True), "meta": meta},
    )


def _wandb_record(cfg: DictConfig, meta: dict, run_dir: Path, env: dict[str, str]) -> None:
    """Send the resolved config, commit and versions to the W&B run that verl will then log to."""
    with _patched_environ(env):
        w = wandb_init(cfg, meta, run_dir, env)
        w.save(str(run_dir / "config.yaml"), base_path=str(run_dir), policy="now")
        w.save(str(run_dir / "meta.json"), base_path=str(run_dir), policy="now")
        w.finish()


@contextlib.contextmanager
def _patched_environ(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(argv: list[str] | None = None) -> int:
    """SIGTERM and SIGHUP end the run like an error (sarl.signals): its children are stopped, exit 128+signal."""
    from sarl.signals import Terminated, signals_as_exceptions

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s] %(message)s")
    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg, choices = compose_user_config(overrides)
    except UserError as err:
        if debug_requested():
            raise
        log.error("%s", err)
        return 2
    try:
        with signals_as_exceptions():
            return run(cfg, choices, overrides)
    except (NotLandedError, UserError) as err:
        log.error("%s", err)
        return 2
    except Terminated as err:
        log.error("%s: the run stopped, and its child processes with it", err)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
