"""The verl back end's preflight checks: the stack verl was released with, the memory plan of the fullest GPU (with
what the rewards load beside it, through their `gpu_memory_items` hook), the run directory's disk, and the cheap
ones sarl.train runs before a launch (`verl_cheap_checks`, the rewards' own `preflight_checks` included). The verl
back end (sarl/backends/verl/backend.py) puts them with the node's checks into `python -m sarl.preflight`'s table.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omegaconf import DictConfig

from sarl.backends.verl import memory as verl_memory
from sarl.backends.verl.steps import step_plan
from sarl.contract.reward import reward_hooks
from sarl.data.checks import check_data
from sarl.runtime import memory, stack
from sarl.runtime.checks import Check
from sarl.runtime.models import find_model_config
from sarl.runtime.node_checks import (
    DRIVER_FIX,
    MIN_DRIVER,
    driver_problem,
    driver_version,
    gpu_gib,
    installed_version,
    version_numbers,
)
from sarl.serving.checks import embedding_server_utilization

# What the pinned verl was released against (verl 0.9.1's `vllm` extra: vllm==0.24.0, torch==2.11.0).
STACK = {"verl": "0.9.1", "vllm": "0.24.", "torch": "2.11."}
CHECKPOINT_BYTES_PER_PARAM = 4 + 8  # verl saves the float32 FSDP shards and Adam's two moments


def check_stack() -> list[Check]:
    """torch with CUDA and a driver new enough for its CUDA, vLLM, verl, flash-attn: importable and the versions verl
    was released with; an installed flash-attn whose compiled extension does not import fails."""
    out = []
    torch_v = installed_version("torch")
    try:
        import torch

        cuda, driver = torch.version.cuda, driver_version()
        ok = bool(cuda) and torch.cuda.is_available() and bool(torch_v and torch_v.startswith(STACK["torch"]))
        detail = f"torch {torch_v}, CUDA {cuda or 'none (CPU build)'}, driver {driver or 'none'}"
        fix = (
            ""
            if ok
            else f"pip install -r requirements/gpu.lock (torch {STACK['torch']}x, CUDA) on a node with an NVIDIA driver"
        )
        if problem := driver_problem(cuda, driver):
            ok, detail, fix = False, problem, DRIVER_FIX
        elif driver and (major := version_numbers(cuda)[:1]) and major[0] not in MIN_DRIVER:
            detail += f" (driver not checked: no known minimum for CUDA {cuda})"
    except ImportError:
        ok, detail, fix = False, "torch not importable", "pip install -r requirements/gpu.lock"
    out.append(Check("torch / CUDA / driver", ok, detail, fix))
    for pkg in ("vllm", "verl"):
        v = installed_version(pkg)
        ok = v is not None and v.startswith(STACK[pkg])
        fix = "" if ok else f"pip install -r requirements/gpu.lock (verl {STACK['verl']} wants {pkg} {STACK[pkg]}x)"
        out.append(Check(pkg, ok, f"{pkg} {v}" if v else f"{pkg} not installed", fix))
    from sarl.backends.verl.attention import check_flash_attn  # deferred: imports verl (seconds)

    out.append(check_flash_attn(installed_version("flash-attn") or installed_version("flash_attn")))
    out.append(check_lock())
    return out


def check_cpu_stack() -> list[Check]:
    """`backend=verl_cpu`: verl at the version the project runs and every package of the lock this environment was
    made from at its version: requirements/cpu.lock (torch's CPU build, no vLLM), or gpu.lock where vLLM is
    installed (a GPU node's environment; the run needs no CUDA, vLLM or flash-attn: it samples with Hugging Face
    and trains with gloo)."""
    v = installed_version("verl")
    ok = v is not None and v.startswith(STACK["verl"])
    fix = "" if ok else f"bash scripts/setup.sh (verl {STACK['verl']}x from requirements/cpu.lock)"
    lock = stack.GPU_LOCK if installed_version("vllm") else stack.CPU_LOCK
    return [Check("verl", ok, f"verl {v}" if v else "verl not installed", fix), check_lock(lock)]


def check_lock(lock_path: Path = stack.GPU_LOCK) -> Check:
    """Every package of the lock (requirements/gpu.lock; cpu.lock for `backend=verl_cpu`) installed at the lock's
    version (a local build label aside: a torch built for the node's CUDA passes), so the run uses the versions CI
    tested (decisions §7.6)."""
    name = f"stack = requirements/{lock_path.name}"
    if not lock_path.is_file():
        return Check(name, True, f"{lock_path} absent (not an editable install): not checked", "")
    lock = stack.read_lock(lock_path)
    diffs = stack.diverging(lock)
    if not diffs:
        return Check(name, True, f"{len(lock)} packages at the lock's versions", "")
    return Check(name, False, stack.describe(diffs), f"pip install -r {lock_path} in this venv")


def reward_processes(verl_cfg: DictConfig) -> tuple[int, str, int]:
    """Where a reward that loads a model on a GPU holds it under this config: (copies, where, longest sequence).
    One per reward worker (`reward.num_workers`, verl's per-response path), one in the trainer for a group reward;
    the longest sequence is prompt + response."""
    per_sample = bool(verl_cfg.reward.custom_reward_function.path)
    copies = max(1, int(verl_cfg.reward.num_workers)) if per_sample else 1
    where = f"{copies} reward workers" if copies > 1 else ("a reward worker" if per_sample else "the trainer")
    return copies, where, int(verl_cfg.data.max_prompt_length) + int(verl_cfg.data.max_response_length)


def shared_gpu_items(
    cfg: DictConfig, reward_cfg: dict, gib: float, reward_items: dict[int, list[memory.Item]]
) -> tuple[int, list[memory.Item]]:
    """What runs beside verl's workers, on the GPU that holds most of it (its index among the node's visible
    GPUs, its items): the embedding server (`embedding_server.gpu`) and the rewards' own models (`reward_items`,
    by GPU)."""
    by_gpu = {gpu: list(items) for gpu, items in reward_items.items()}
    emb_util = embedding_server_utilization(cfg, reward_cfg)
    if emb_util is not None:
        item = verl_memory.embedding_server_item(emb_util, gib)
        by_gpu.setdefault(int(cfg.embedding_server.gpu), []).insert(0, item)
    if not by_gpu:
        return 0, []
    fullest = max(sorted(by_gpu), key=lambda g: sum(i.gib for i in by_gpu[g]))
    return fullest, by_gpu[fullest]


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


def check_verl_memory_plan(
    cfg: DictConfig,
    verl_cfg: DictConfig,
    reward_cfg: dict,
    reward_items: tuple[dict[int, list[memory.Item]], list[Check]] = ({}, []),
    allow_download: bool = False,
    skip_missing: bool = False,
) -> list[Check]:
    """The plan of the fullest GPU (model config.json, dtypes, FSDP/offload settings, micro-batch token budgets,
    vLLM's share, the embedding server, the rewards' models: `reward_items` = their items by GPU and the checks
    of models that could not be had) and the embedding server's own budget. A model whose config.json cannot be
    had fails its check, or (skip_missing) gives none."""
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
        items, problems = reward_items
        gpu, shared = shared_gpu_items(cfg, reward_cfg, gib, items)
        out += problems
        plan = verl_memory.gpu_memory_plan(verl_cfg, policy, gib, shared)
        fix = "" if plan.ok else memory_plan_fix(plan, verl_cfg, shared)
        out.append(Check("memory plan", plan.ok, f"GPU {gpu}: {plan.summary()} [GPU size: {source}]", fix))
    if embedding_server_utilization(cfg, reward_cfg) is not None:
        out += _embedding_budget(cfg, gib, allow_download, skip_missing)
    return out


def sft_memory_plan_fix(plan: memory.MemoryPlan, stage: str = "") -> str:
    """What to change when an SFT run's plan does not fit (the overrides of pipeline stage `stage`, if one): fewer
    tokens per micro-batch where the logits are the largest term, more GPUs to shard over, the optimizer offloaded."""
    key = f"{stage}:" if stage else ""
    items = {i.name: i.gib for i in plan.peak.items}
    fixes = [f"more GPUs to shard over ({key}train.n_gpus_per_node)"]
    if items.get("logits", 0.0) >= max(items.values()):
        budget = f"{key}backend.sft_overrides.data.max_token_len_per_gpu"
        fixes.insert(0, f"a smaller token budget per micro-batch ({budget})")
    fixes.append(f"offload ({key}backend.sft_overrides.engine.optimizer_offload=true)")
    return "set " + ", or ".join(fixes)


def check_sft_memory_plan(
    cfg: DictConfig, sft_cfg: DictConfig, stage: str = "", allow_download: bool = False, skip_missing: bool = False
) -> list[Check]:
    """The plan of one GPU of an SFT run (verl's SFT trainer config `sft_cfg`; `stage`: its pipeline stage, if one);
    a model whose config.json cannot be had fails the check, or (skip_missing) gives none."""
    if cfg.backend.get("cpu", False):
        return []  # backend=verl_cpu: no GPU to plan
    gib, source = gpu_gib(cfg)
    policy = find_model_config(str(cfg.model.path), allow_download)
    if policy is None:
        if skip_missing:
            return []
        detail = f"config.json of model.path={cfg.model.path} not found"
        return [Check("SFT memory plan", False, detail, "download the model (hf download) or set model.path")]
    plan = verl_memory.sft_memory_plan(sft_cfg, policy, gib)
    gpus = int(sft_cfg.trainer.n_gpus_per_node) * int(sft_cfg.trainer.nnodes)
    fix = "" if plan.ok else sft_memory_plan_fix(plan, stage)
    return [Check("SFT memory plan", plan.ok, f"{gpus} GPU(s): {plan.summary()} [GPU size: {source}]", fix)]


def _embedding_budget(cfg: DictConfig, gib: float, allow_download: bool, skip_missing: bool) -> list[Check]:
    """The embedding server's own budget: its model's weights and the cache of `max_model_len` in its share."""
    s = cfg.embedding_server
    emb = find_model_config(str(s.model), allow_download)
    if emb is None:
        detail = f"config.json of embedding_server.model={s.model} not found"
        fix = "download it or point embedding.model at a local directory"
        return [] if skip_missing else [Check("embedding server budget", False, detail, fix)]
    b = verl_memory.embedding_budget(emb, float(s.gpu_memory_utilization), gib, s.max_model_len, str(s.dtype))
    fix = (
        f"set embedding_server.max_model_len<={b.max_len_that_fits} or raise embedding_server.gpu_memory_utilization"
        if not b.ok
        else ""
    )
    return [Check("embedding server budget", b.ok, b.summary(), fix)]


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
    plan = step_plan(cfg)
    steps = plan.steps if plan is not None else int(t.save_freq)  # no data yet: one checkpoint at least
    saves = max(1, steps // max(1, int(t.save_freq)))
    keep = t.get("max_actor_ckpt_to_keep")
    return min(saves, int(keep)) if keep else saves


def reward_gpu_items(
    reward_cfg: dict, copies: int, where: str, seq: int, allow_download: bool = False, skip_missing: bool = False
) -> tuple[dict[int, list[memory.Item]], list[Check]]:
    """What the rewards of `reward_cfg` load on the node's GPUs (each reward class's `gpu_memory_items`, e.g. the
    MaxFlow attention model), by GPU, and the checks of the models that could not be had."""
    by_gpu: dict[int, list[memory.Item]] = {}
    problems: list[Check] = []
    for hook in reward_hooks(reward_cfg, "gpu_memory_items"):
        items, failed = hook(reward_cfg, copies, where, seq, allow_download, skip_missing)
        for gpu, listed in items.items():
            by_gpu.setdefault(gpu, []).extend(listed)
        problems += failed
    return by_gpu, problems


def reward_checks(reward_cfg: dict) -> list[Check]:
    """The rewards' own checks of this machine (each reward class's `preflight_checks`, e.g. the code sandbox)."""
    return [check for hook in reward_hooks(reward_cfg, "preflight_checks") for check in hook(reward_cfg)]


def check_memory_plan(
    cfg: DictConfig, verl_cfg: DictConfig, reward_cfg: dict, allow_download: bool = False, skip_missing: bool = False
) -> list[Check]:
    """verl's memory plan of the fullest GPU with what the rewards load beside it (the MaxFlow attention model,
    once per process that builds the reward)."""
    if cfg.backend.get("cpu", False):
        return []  # backend=verl_cpu: no GPU to plan
    copies, where, seq = reward_processes(verl_cfg)
    beside = reward_gpu_items(reward_cfg, copies, where, seq, allow_download, skip_missing)
    return check_verl_memory_plan(cfg, verl_cfg, reward_cfg, beside, allow_download, skip_missing)


def verl_cheap_checks(cfg: DictConfig, verl_cfg: DictConfig, run_dir: Path, reward_cfg: dict) -> list[Check]:
    """What sarl.train checks before a verl launch: no network, no GPU, seconds."""
    return [
        check_data(cfg),
        check_run_dir(cfg, verl_cfg, run_dir),
        *check_memory_plan(cfg, verl_cfg, reward_cfg, skip_missing=True),  # where the configs are at hand
        *reward_checks(reward_cfg),
    ]
