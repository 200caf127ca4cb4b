"""What the TRL back end's trainers share: paths and JSONL inputs from config, and the `TrainingArguments`
common to GRPO, DPO and SFT (imported by sarl.backends.trl.run and sarl.backends.trl.sft)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

OUTPUT_SUBDIR = "checkpoints"


def common_args(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    b, t = cfg.backend, cfg.train
    args = {
        "output_dir": str(run_dir / OUTPUT_SUBDIR),
        "learning_rate": float(t.actor_lr),
        "num_train_epochs": float(t.total_epochs),
        # backend.max_steps (a TRL-only cap, smoke runs), else train.total_training_steps, else the epochs
        "max_steps": int(b.max_steps or t.get("total_training_steps") or -1),
        "save_strategy": "steps" if int(t.save_freq) > 0 else "no",  # train.save_freq=-1: the final model only
        "save_steps": max(1, int(t.save_freq)),
        "save_total_limit": b.save_total_limit,
        "logging_steps": 1,
        "report_to": "none",  # sarl.backends.trl.metrics logs to W&B and metrics.jsonl itself
        "seed": int(cfg.seed),
        "data_seed": int(cfg.seed),
        "bf16": bool(b.bf16),
        "use_cpu": bool(b.use_cpu),
        "gradient_checkpointing": bool(b.gradient_checkpointing),
        "disable_tqdm": not bool(b.progress_bar),
        # train.lr_schedule: constant, or cosine down to train.min_lr_ratio x lr (verl's cosine with a floor)
        "lr_scheduler_type": "cosine_with_min_lr" if t.lr_schedule == "cosine" else "constant",
        "lr_scheduler_kwargs": {"min_lr_rate": float(t.min_lr_ratio)} if t.lr_schedule == "cosine" else {},
        "warmup_steps": float(t.lr_warmup_ratio),  # transformers 5: a float below 1 is a share of the steps
        "weight_decay": float(t.weight_decay),  # AdamW's decoupled weight decay (verl's optim.weight_decay)
        "max_grad_norm": float(b.max_grad_norm),
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": _has_cuda(),
    }
    return args


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
