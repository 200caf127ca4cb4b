"""Checks to run on the GPU node before spending GPU hours on a verl or a TRL run.

    python -m sarl.preflight +exp=grpo_sarl_math [overrides]
    python -m sarl.preflight +exp=dpo_open [overrides]

One table, one row per check, each ✓ or ✗ with what to do; exit code 0 only if every check passes
(1 if one fails, 2 for a config that does not compose). The same overrides as `python -m sarl.train`.
`sarl.train` runs the cheap ones itself before it launches: for verl `run_cheap_checks` (data, run directory and
disk, memory plan, embedding-server budget, code sandbox), for TRL `run_trl_cheap_checks` (the GPUs its processes
need, the DPO memory plan of sarl/backends/trl/memory.py); a failure stops it with one line and exit code 2.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from baselines.code_exec import sandbox_checks
from sarl.backends.verl import memory as verl_memory
from sarl.runtime import memory
from sarl.runtime.checks import Check, raise_failed
from sarl.runtime.errors import report_user_errors
from sarl.runtime.hub import offline_if_unreachable
from sarl.runtime.models import find_model_config

log = logging.getLogger("sarl.preflight")

# What the pinned verl was released against (verl 0.9.1's `vllm` extra: vllm==0.24.0, torch==2.11.0).
STACK = {"verl": "0.9.1", "vllm": "0.24.", "torch": "2.11."}
CHECKPOINT_BYTES_PER_PARAM = 4 + 8  # verl saves the float32 FSDP shards and Adam's two moments
# The oldest Linux driver each CUDA major version runs on: NVIDIA's CUDA Toolkit Release Notes, "CUDA minor version
# compatibility" table. `.[gpu]`'s torch 2.11 wheels are CUDA 13 builds.
MIN_DRIVER = {13: "580.65.06", 12: "525.60.13", 11: "450.80.02"}
DRIVER_FIX = (
    "update the driver, or install a torch built for the node's CUDA "
    "(pip install torch --index-url https://download.pytorch.org/whl/cu12X)"
)


def _version(pkg: str) -> str | None:
    """The installed version of distribution `pkg` (its metadata), or None where it is not installed."""
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def check_gpus(cfg: DictConfig, want: int | None = None) -> Check:
    """`want` CUDA GPUs (default `train.n_gpus_per_node`) visible and free."""
    want = int(cfg.train.n_gpus_per_node) if want is None else want
    try:
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as err:  # a broken CUDA install
        return Check("GPUs", False, f"torch cannot query CUDA: {err}", "check the driver and the torch build")
    if have >= want:
        busy = _gpus_in_use(want)
        if busy:
            detail = f"{have} CUDA GPU(s) visible, but already in use: {', '.join(busy)}"
            fix = "another job holds memory on these GPUs: ask SLURM for whole nodes (--exclusive) or free them"
            return Check("GPUs", False, detail, fix)
        return Check("GPUs", True, f"{have} CUDA GPU(s) visible, train.n_gpus_per_node={want}, all free")
    return Check(
        "GPUs",
        False,
        f"{have} CUDA GPU(s) visible, train.n_gpus_per_node={want}",
        f"run on a node with {want} GPUs (srun --gpus-per-node={want}) or set train.n_gpus_per_node={have or 'N'}",
    )


def _gpus_in_use(n: int, tolerance_gib: float = 2.0) -> list[str]:
    """GPUs among the first `n` on which more than `tolerance_gib` is already taken (by other processes)."""
    import torch

    out = []
    for i in range(n):
        free, total = torch.cuda.mem_get_info(i)
        used = (total - free) / memory.GIB
        if used > tolerance_gib:
            out.append(f"GPU {i}: {used:.1f} of {total / memory.GIB:.1f} GiB used")
    return out


def _numbers(version: str | None) -> tuple[int, ...]:
    """The numbers of a dotted version ("580.65.06" -> (580, 65, 6)), to compare numerically."""
    return tuple(int(n) for n in re.findall(r"\d+", version or ""))


def driver_problem(cuda: str | None, driver: str | None) -> str | None:
    """What is wrong with NVIDIA driver `driver` for a torch built for CUDA `cuda` (one line), or None where it is
    new enough, where either is unknown, or where `MIN_DRIVER` has no minimum for that CUDA major version."""
    major, have = _numbers(cuda)[:1], _numbers(driver)
    need = MIN_DRIVER.get(major[0]) if major and have else None
    if need is None or have >= _numbers(need):
        return None
    return f"torch built for CUDA {cuda} needs NVIDIA driver >= {need}; this node has {driver}"


def check_stack() -> list[Check]:
    """torch with CUDA and a driver new enough for its CUDA, vLLM, verl, flash-attn: importable and the versions verl
    was released with; an installed flash-attn whose compiled extension does not import fails."""
    out = []
    torch_v = _version("torch")
    try:
        import torch

        cuda, driver = torch.version.cuda, _driver_version()
        ok = bool(cuda) and torch.cuda.is_available() and bool(torch_v and torch_v.startswith(STACK["torch"]))
        detail = f"torch {torch_v}, CUDA {cuda or 'none (CPU build)'}, driver {driver or 'none'}"
        fix = "" if ok else f"pip install -e .[gpu] (torch {STACK['torch']}x with CUDA) on a node with an NVIDIA driver"
        if problem := driver_problem(cuda, driver):
            ok, detail, fix = False, problem, DRIVER_FIX
        elif driver and (major := _numbers(cuda)[:1]) and major[0] not in MIN_DRIVER:
            detail += f" (driver not checked: no known minimum for CUDA {cuda})"
    except ImportError:
        ok, detail, fix = False, "torch not importable", "pip install -e .[gpu]"
    out.append(Check("torch / CUDA / driver", ok, detail, fix))
    for pkg in ("vllm", "verl"):
        v = _version(pkg)
        ok = v is not None and v.startswith(STACK[pkg])
        fix = "" if ok else f"pip install -e .[gpu] (verl {STACK['verl']} wants {pkg} {STACK[pkg]}x)"
        out.append(Check(pkg, ok, f"{pkg} {v}" if v else f"{pkg} not installed", fix))
    from sarl.backends.verl.attention import check_flash_attn

    out.append(check_flash_attn(_version("flash-attn") or _version("flash_attn")))
    return out


def _driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it ("580.82.07"), or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def gpu_gib(cfg: DictConfig, measure: bool = True) -> tuple[float, str]:
    """The memory of one GPU: the first visible CUDA device's (`measure`), else `backend.gpu_memory_gib`."""
    try:
        import torch

        if measure and torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / memory.GIB, "measured"
    except Exception:  # no usable CUDA: plan against the configured GPU
        pass
    return float(cfg.backend.gpu_memory_gib), "backend.gpu_memory_gib"


def _embedding_server_utilization(cfg: DictConfig, reward_cfg: dict) -> float | None:
    from sarl.serving.auto import starts_embedding_server

    return float(cfg.embedding_server.gpu_memory_utilization) if starts_embedding_server(reward_cfg) else None


def maxflow_nodes(reward_cfg: Any) -> list[dict]:
    """The MaxFlow rewards in a resolved reward config (itself, or a component of a combined reward): each
    loads an attention model on a GPU of the node, outside Ray's accounting."""
    from hydra.utils import get_class

    from baselines.maxflow.reward import MaxFlowReward

    found = []
    if isinstance(reward_cfg, dict):
        target = reward_cfg.get("_target_")
        try:
            if target and issubclass(get_class(str(target)), MaxFlowReward):
                found.append(reward_cfg)
        except (ImportError, ValueError, TypeError):  # not a class (a function target), or not importable
            pass
        for value in reward_cfg.values():
            found += maxflow_nodes(value)
    elif isinstance(reward_cfg, list):
        for value in reward_cfg:
            found += maxflow_nodes(value)
    return found


def attention_model_items(node: dict, model_config: dict, verl_cfg: DictConfig) -> list[memory.Item]:
    """The MaxFlow reward's attention model on its GPU, once per process that builds the reward: one per
    reward worker (`reward.num_workers`, verl's per-response path), one in the trainer for a group reward
    (the joint FLOW:LCS reward). Weights (`AutoModel`, no LM head, in the reward's dtype) and the working set
    of one eager pass over the longest sequence: prompt + response, at most the reward's `max_tokens`."""
    from baselines.maxflow.attention import eager_pass_bytes

    per_sample = bool(verl_cfg.reward.custom_reward_function.path)
    copies = max(1, int(verl_cfg.reward.num_workers)) if per_sample else 1
    dtype = str(node.get("dtype") or "auto")
    dtype = memory.config_dtype(model_config) if dtype == "auto" else dtype
    size = memory.dtype_bytes(dtype)
    seq = int(verl_cfg.data.max_prompt_length) + int(verl_cfg.data.max_response_length)
    tokens = min(int(node.get("max_tokens") or seq), seq)
    weights = memory.parameter_count(model_config, head="base") * size / memory.GIB
    working = eager_pass_bytes(model_config, tokens, size) / memory.GIB
    where = f"{copies} reward workers" if copies > 1 else ("a reward worker" if per_sample else "the trainer")
    return [
        memory.Item(f"MaxFlow attention model x{copies}", copies * weights, f"{dtype}, in {where}", processes=copies),
        memory.Item(f"MaxFlow attention pass x{copies}", copies * working, f"eager attention over {tokens} tokens"),
    ]


def shared_gpu_items(
    cfg: DictConfig,
    verl_cfg: DictConfig,
    reward_cfg: dict,
    gib: float,
    allow_download: bool = False,
    skip_missing: bool = False,
) -> tuple[int, list[memory.Item], list[Check]]:
    """What runs beside verl's workers, on the GPU that holds most of it (its index among the node's visible
    GPUs, its items): the embedding server (`embedding_server.gpu`), the MaxFlow reward's attention model
    (`reward.device`). A model whose config.json cannot be had fails a check, or (skip_missing) is left out."""
    from baselines.maxflow.attention import planned_gpu

    by_gpu: dict[int, list[memory.Item]] = {}
    problems = []
    emb_util = _embedding_server_utilization(cfg, reward_cfg)
    if emb_util is not None:
        by_gpu.setdefault(int(cfg.embedding_server.gpu), []).append(verl_memory.embedding_server_item(emb_util, gib))
    for node in maxflow_nodes(reward_cfg):
        gpu = planned_gpu(node.get("device"))
        if gpu is None:
            continue
        model_config = find_model_config(str(node.get("model")), allow_download)
        if model_config is None:
            if not skip_missing:
                problems.append(
                    Check(
                        "memory plan",
                        False,
                        f"config.json of the MaxFlow reward's model {node.get('model')} not found",
                        "download it or point the reward's model at a local checkpoint",
                    )
                )
            continue
        by_gpu.setdefault(gpu, []).extend(attention_model_items(node, model_config, verl_cfg))
    if not by_gpu:
        return 0, [], problems
    fullest = max(sorted(by_gpu), key=lambda g: sum(i.gib for i in by_gpu[g]))
    return fullest, by_gpu[fullest], problems


def memory_plan_fix(plan: memory.MemoryPlan, verl_cfg: DictConfig, shared: list[memory.Item]) -> str:
    """What to change when the plan does not fit: one reward worker where each loads its own attention model
    (first: the other fixes are sized after it), the largest rollout share that fits (when generation is the
    peak), or a smaller micro-batch."""
    if any(i.name.startswith("MaxFlow attention model") and i.processes > 1 for i in shared):
        return "set backend.reward_num_workers=1 (each reward worker loads its own attention model), then check again"
    fixes = []
    if plan.peak.name == "generation":
        current = float(verl_cfg.actor_rollout_ref.rollout.gpu_memory_utilization)
        fits = verl_memory.rollout_utilization_that_fits(plan, current)
        if fits > 0:
            fixes.append(f"backend.rollout_gpu_memory_utilization={fits} (now {current})")
    else:
        fixes.append(
            "a smaller token budget per micro-batch (backend.overrides: actor_rollout_ref.actor."
            "ppo_max_token_len_per_gpu, rollout.log_prob_max_token_len_per_gpu, ref.log_prob_max_token_len_per_gpu)"
        )
    fixes.append("offload (backend.overrides: actor_rollout_ref.actor.fsdp_config.optimizer_offload=true)")
    return "set " + ", or ".join(fixes)


def check_memory_plan(
    cfg: DictConfig, verl_cfg: DictConfig, reward_cfg: dict, allow_download: bool = False, skip_missing: bool = False
) -> list[Check]:
    """The plan of the fullest GPU (model config.json, dtypes, FSDP/offload settings, micro-batch token budgets,
    vLLM's share, the embedding server, the MaxFlow reward's attention model) and the embedding server's own
    budget. A model whose config.json cannot be had fails its check, or (skip_missing) gives none."""
    if cfg.backend.get("cpu", False):
        return []  # backend=verl_cpu: no GPU to plan
    gib, source = gpu_gib(cfg)
    out = []
    policy = find_model_config(str(cfg.model.path), allow_download)
    if policy is None and skip_missing:
        pass
    elif policy is None:
        out.append(
            Check(
                "memory plan",
                False,
                f"config.json of model.path={cfg.model.path} not found (local directory, HF cache"
                f"{', Hub' if allow_download else ''})",
                "download the model (hf download) or set model.path to a local checkpoint",
            )
        )
    else:
        gpu, shared, problems = shared_gpu_items(cfg, verl_cfg, reward_cfg, gib, allow_download, skip_missing)
        out += problems
        plan = verl_memory.gpu_memory_plan(verl_cfg, policy, gib, shared)
        fix = "" if plan.ok else memory_plan_fix(plan, verl_cfg, shared)
        out.append(Check("memory plan", plan.ok, f"GPU {gpu}: {plan.summary()} [GPU size: {source}]", fix))
    if _embedding_server_utilization(cfg, reward_cfg) is not None:
        s = cfg.embedding_server
        emb = find_model_config(str(s.model), allow_download)
        if emb is None and skip_missing:
            pass
        elif emb is None:
            out.append(
                Check(
                    "embedding server budget",
                    False,
                    f"config.json of embedding_server.model={s.model} not found",
                    "download it or point embedding.model at a local directory",
                )
            )
        else:
            b = verl_memory.embedding_budget(emb, float(s.gpu_memory_utilization), gib, s.max_model_len, str(s.dtype))
            fix = (
                ""
                if b.ok
                else (
                    f"set embedding_server.max_model_len<={b.max_len_that_fits} or raise "
                    "embedding_server.gpu_memory_utilization"
                )
            )
            out.append(Check("embedding server budget", b.ok, b.summary(), fix))
    return out


def check_data(cfg: DictConfig) -> Check:
    """The training and validation files exist; the training set has `data.expected_count` rows."""
    problems, counts = [], []
    for key in ("train_files", "val_files"):
        path = Path(str(cfg.data[key]))
        if not path.is_file():
            problems.append(f"data.{key} = {path} does not exist")
            continue
        try:
            import pyarrow.parquet as pq

            n = pq.read_metadata(path).num_rows
        except Exception as err:
            problems.append(f"data.{key} = {path} is not a readable parquet file ({err})")
            continue
        counts.append(f"{key.split('_')[0]} {n} rows")
        expected = cfg.data.get("expected_count")
        if key == "train_files" and expected and n != int(expected):
            problems.append(f"{path} has {n} rows, conf/data/{cfg.data.name}.yaml expects {expected}")
        if n == 0:
            problems.append(f"{path} has no rows")
    if problems:
        return Check(
            "data",
            False,
            "; ".join(problems),
            f"python -m sarl.data.prepare dataset={cfg.data.name} (and the validation set)",
        )
    return Check("data", True, ", ".join(counts))


def check_run_dir(cfg: DictConfig, verl_cfg: DictConfig, run_dir: Path, allow_download: bool = False) -> Check:
    """The run directory can be written, and its disk holds the checkpoints the run will keep."""
    probe = run_dir
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        fix = "set paths.runs_dir or run_dir to a writable place"
        return Check("run directory", False, f"{probe} is not writable", fix)
    free = shutil.disk_usage(probe).free / memory.GIB
    policy = find_model_config(str(cfg.model.path), allow_download)
    if policy is None:
        return Check("run directory", True, f"{run_dir} writable, {free:.0f} GiB free (checkpoint size unknown)")
    per = memory.parameter_count(policy) * CHECKPOINT_BYTES_PER_PARAM * (2 if verl_cfg.critic.enable else 1)
    kept = _checkpoints_kept(cfg, verl_cfg)
    need = per * kept / memory.GIB
    detail = f"{run_dir}: {free:.0f} GiB free, {kept} checkpoint(s) of {per / memory.GIB:.0f} GiB = {need:.0f} GiB"
    if need > free:
        return Check(
            "run directory",
            False,
            detail,
            "free disk, point paths.runs_dir elsewhere, or keep fewer (backend.overrides: "
            "trainer.max_actor_ckpt_to_keep=2, trainer.max_critic_ckpt_to_keep=2)",
        )
    return Check("run directory", True, detail)


def _checkpoints_kept(cfg: DictConfig, verl_cfg: DictConfig) -> int:
    """How many checkpoints the run keeps: its saves (steps / save_freq), capped by max_actor_ckpt_to_keep."""
    t = verl_cfg.trainer
    steps = int(t.total_training_steps) if t.get("total_training_steps") else None
    if steps is None:
        try:
            import pyarrow.parquet as pq

            rows = pq.read_metadata(str(cfg.data.train_files)).num_rows
            steps = -(-rows // int(cfg.train.train_batch_size)) * int(t.total_epochs)
        except Exception:  # no data yet: one checkpoint at least
            steps = int(t.save_freq)
    saves = max(1, steps // max(1, int(t.save_freq)))
    keep = t.get("max_actor_ckpt_to_keep")
    return min(saves, int(keep)) if keep else saves


def check_wandb(cfg: DictConfig, environ: dict[str, str] | None = None) -> Check:
    environ = os.environ if environ is None else environ
    if "wandb" not in cfg.logger.backends:
        return Check("W&B", True, "not used (logger=none)")
    if _version("wandb") is None:
        return Check("W&B", False, "wandb not installed", "pip install wandb, or logger=none")
    from sarl.runtime.runs import wandb_key_available

    key = wandb_key_available(environ)
    mode = environ.get("WANDB_MODE") or ("online" if key else "offline")
    if mode == "online" and not key:
        return Check("W&B", False, "WANDB_MODE=online but no API key", "wandb login (or export WANDB_API_KEY)")
    entity = cfg.logger.entity or environ.get("WANDB_ENTITY")
    detail = f"mode {mode}, key {'found' if key else 'none (logs stay in the run directory; wandb sync later)'}"
    return Check("W&B", True, detail + (f", entity {entity}" if entity else ""))


def check_model_files(cfg: DictConfig, reward_cfg: dict, allow_download: bool = True) -> Check:
    """The policy (and the embedding model of a started server) resolvable: local, cached or from the Hub."""
    names = [("model.path", str(cfg.model.path))]
    if _embedding_server_utilization(cfg, reward_cfg) is not None:
        names.append(("embedding_server.model", str(cfg.embedding_server.model)))
    missing = [f"{k}={v}" for k, v in names if find_model_config(v, allow_download) is None]
    if missing:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        return Check(
            "models",
            False,
            f"not found locally{'' if offline else ' nor on the Hub'}: {', '.join(missing)}",
            "hf download NAME on a node with network (HF_HOME shared with the GPU nodes)",
        )
    return Check("models", True, ", ".join(v for _, v in names))


def check_embedding_server(cfg: DictConfig, reward_cfg: dict) -> Check:
    """The embedding server starts with the configured budget and answers one request (url auto), or the
    configured endpoint answers one request."""
    embedder = dict(reward_cfg.get("embedder") or {})
    if embedder.get("_target_") != "sarl.serving.http.HTTPEmbedder":
        return Check("embedding server", True, "not used by this reward")
    from hydra.utils import instantiate

    from sarl.serving.auto import planned_embedding_server

    if embedder.get("url") == "auto":
        try:
            import torch

            has_gpu = torch.cuda.is_available()
        except ImportError:
            has_gpu = False
        if not has_gpu or _version("vllm") is None:
            return Check(
                "embedding server",
                False,
                "not started: needs a CUDA GPU and vLLM",
                "run the preflight on the GPU node after pip install -e .[gpu]",
            )
    rc = copy.deepcopy(reward_cfg)
    try:
        server = planned_embedding_server(cfg, rc)
        if server is not None:
            server.start()
        try:
            vectors = instantiate(rc["embedder"]).embed(["Check the sum: 17 + 25 = 42."])
        finally:
            if server is not None:
                server.stop()
    except Exception as err:
        return Check(
            "embedding server",
            False,
            f"{type(err).__name__}: {str(err).splitlines()[0][:300]}",
            "read the server log named above; lower embedding_server.max_model_len or raise its budget",
        )
    v = vectors[0]
    return Check("embedding server", True, f"{rc['embedder']['url']} answered: one {len(v)}-dimensional vector")


# -- driving them ------------------------------------------------------------------------------


def cheap_checks(cfg: DictConfig, verl_cfg: DictConfig, run_dir: Path, reward_cfg: dict) -> list[Check]:
    """What sarl.train checks before launch: no network, no GPU, seconds."""
    return [
        check_data(cfg),
        check_run_dir(cfg, verl_cfg, run_dir),
        *check_memory_plan(cfg, verl_cfg, reward_cfg, skip_missing=True),  # where the configs are at hand
        *sandbox_checks(reward_cfg),
    ]


def run_cheap_checks(cfg: DictConfig, verl_cfg: DictConfig, run_dir: Path) -> None:
    """Raise PreflightError naming every failed cheap check and its fix."""
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    raise_failed(cheap_checks(cfg, verl_cfg, run_dir, reward_cfg))


def run_trl_cheap_checks(cfg: DictConfig) -> None:
    """What sarl.train checks before a TRL run: the GPUs its processes need and the DPO memory plan against
    `backend.gpu_memory_gib` (measuring the GPU would leave a CUDA context in sarl.train's process, on the GPU
    of rank 0). Raise PreflightError naming every failure and its fix."""
    from sarl.backends.trl import memory as trl_memory
    from sarl.backends.trl.distributed import check_devices

    gib, source = gpu_gib(cfg, measure=False)
    raise_failed([*check_devices(cfg), *trl_memory.check_memory_plan(cfg, gib, source, skip_missing=True)])


def trl_preflight(cfg: DictConfig) -> list[Check]:
    """Every check for a TRL row: what TRL refuses, the training file, the GPUs (one per process), the model, the
    memory plan (DPO), W&B."""
    from sarl.backends.trl import memory as trl_memory
    from sarl.backends.trl.distributed import processes
    from sarl.backends.trl.run import row_checks

    checks = [*row_checks(cfg), *([] if cfg.backend.use_cpu else [check_gpus(cfg, processes(cfg))])]
    if cfg.model.get("path"):
        checks.append(check_model_files(cfg, {}))
    return [*checks, *trl_memory.check_memory_plan(cfg, *gpu_gib(cfg), allow_download=True), check_wandb(cfg)]


def preflight(cfg: DictConfig, choices: dict[str, Any]) -> list[Check]:
    """Every check for the composed config of a verl row."""
    from sarl.backends.verl.attention import check_attention
    from sarl.backends.verl.config import build_verl_config
    from sarl.runtime.runs import experiment_name, resolve_run_dir
    from sarl.serving.auto import check_reward_endpoints

    experiment = experiment_name(choices)
    run_dir = resolve_run_dir(cfg, experiment)
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    checks: list[Check] = [check_gpus(cfg), *check_stack(), check_attention(str(cfg.backend.attn_implementation))]
    try:
        check_reward_endpoints(cfg, reward_cfg)
        verl_cfg = build_verl_config(cfg, copy.deepcopy(reward_cfg), str(run_dir), experiment)
    except Exception as err:
        checks.append(Check("verl config", False, str(err), "fix the override named above"))
        return checks
    checks.append(Check("verl config", True, f"{experiment}: composed against verl {cfg.backend.version}'s schema"))
    steps: list[Callable[[], Check | list[Check]]] = [
        lambda: check_model_files(cfg, reward_cfg),
        lambda: check_memory_plan(cfg, verl_cfg, reward_cfg, allow_download=True),
        lambda: check_embedding_server(cfg, reward_cfg),
        lambda: check_data(cfg),
        lambda: check_run_dir(cfg, verl_cfg, run_dir, allow_download=True),
        lambda: check_wandb(cfg),
        lambda: sandbox_checks(reward_cfg),
    ]
    for step in steps:
        result = step()
        checks.extend(result if isinstance(result, list) else [result])
    return checks


def print_table(checks: list[Check], title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("", "check", "result", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row("[green]✓[/]" if c.ok else "[red]✗[/]", escape(c.name), escape(c.detail), escape(c.fix))
    Console(width=max(120, shutil.get_terminal_size().columns)).print(table)


@report_user_errors("sarl.preflight")  # a misspelt key or option, an invalid value: one line, exit 2
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="[%(name)s] %(message)s")
    offline_if_unreachable()  # a Hub that cannot be reached: the model checks read the local cache, no retries
    from sarl.launch.compose import compose_user_config
    from sarl.runtime.runs import experiment_name

    cfg, choices = compose_user_config(list(sys.argv[1:] if argv is None else argv))
    checks = trl_preflight(cfg) if cfg.backend.name == "trl" else preflight(cfg, choices)
    print_table(checks, f"preflight: {experiment_name(choices)}")
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed" + (": fix the ✗ rows first" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
