"""Checks of the node a run starts on, whatever its back end: the GPUs (visible, free, their size), the NVIDIA
driver against the CUDA the installed torch was built for, W&B. `sarl.preflight` and `sarl.train` run them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib import metadata

from omegaconf import DictConfig

from sarl.runtime import memory
from sarl.runtime.checks import Check
from sarl.runtime.network import reachable, route_address
from sarl.runtime.runs import wandb_key_available, wandb_url

# The oldest Linux driver each CUDA major version runs on: NVIDIA's CUDA Toolkit Release Notes, "CUDA minor version
# compatibility" table. `.[gpu]`'s torch 2.11 wheels are CUDA 13 builds.
MIN_DRIVER = {13: "580.65.06", 12: "525.60.13", 11: "450.80.02"}
DRIVER_FIX = (
    "update the driver, or install a torch built for the node's CUDA "
    "(pip install torch --index-url https://download.pytorch.org/whl/cu12X)"
)


def installed_version(pkg: str) -> str | None:
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


def version_numbers(version: str | None) -> tuple[int, ...]:
    """The numbers of a dotted version ("580.65.06" -> (580, 65, 6)), to compare numerically."""
    return tuple(int(n) for n in re.findall(r"\d+", version or ""))


def driver_problem(cuda: str | None, driver: str | None) -> str | None:
    """What is wrong with NVIDIA driver `driver` for a torch built for CUDA `cuda` (one line), or None where it is
    new enough, where either is unknown, or where `MIN_DRIVER` has no minimum for that CUDA major version."""
    major, have = version_numbers(cuda)[:1], version_numbers(driver)
    need = MIN_DRIVER.get(major[0]) if major and have else None
    if need is None or have >= version_numbers(need):
        return None
    return f"torch built for CUDA {cuda} needs NVIDIA driver >= {need}; this node has {driver}"


def driver_version() -> str | None:
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


def check_wandb(cfg: DictConfig, environ: dict[str, str] | None = None) -> Check:
    environ = os.environ if environ is None else environ
    if "wandb" not in cfg.logger.backends:
        return Check("W&B", True, "not used (logger=none)")
    if installed_version("wandb") is None:
        return Check("W&B", False, "wandb not installed", "pip install wandb, or logger=none")
    key = wandb_key_available(environ)
    mode = environ.get("WANDB_MODE") or ("online" if key else "offline")
    if mode == "online" and not key:
        return Check("W&B", False, "WANDB_MODE=online but no API key", "wandb login (or export WANDB_API_KEY)")
    entity = cfg.logger.entity or environ.get("WANDB_ENTITY")
    detail = f"mode {mode}, key {'found' if key else 'none (logs stay in the run directory; wandb sync later)'}"
    if key and "WANDB_MODE" not in environ and not reachable(wandb_url(environ)):
        host, port = route_address(wandb_url(environ))
        detail = f"mode offline: {host}:{port} cannot be reached from this node (key found; wandb sync the run later)"
    elif mode == "online" and not reachable(wandb_url(environ)):
        host, port = route_address(wandb_url(environ))
        return Check(
            "W&B",
            False,
            f"WANDB_MODE=online but {host}:{port} cannot be reached from this node (wandb.init would wait 90 s, raise)",
            "unset WANDB_MODE (the run then goes offline by itself) or WANDB_MODE=offline",
        )
    return Check("W&B", True, detail + (f", entity {entity}" if entity else ""))
