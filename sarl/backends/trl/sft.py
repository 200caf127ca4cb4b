"""algorithm=sft on backend=trl: TRL's SFTTrainer on (prompt, completion) traces.

The traces (`data.sft_files`, TRL jsonl) are read as conversational prompt-completion rows: a row
{"prompt": [...], "completion": [...]} as it is, a row {"messages": [...]} split before its last
message (the target, an assistant turn). TRL then tokenizes `prompt` with the generation prompt and
`prompt + completion` as a whole, and its `completion_mask` marks the tokens after their common prefix:
with `completion_only_loss=True` the labels of the prompt tokens are -100, so the cross-entropy is the
mean over completion tokens only (GRP Sec. 3.1.3 and Structured Reasoning Eq. 1 train on the response).

Batch mapping (verl's SFT trainer counts sequences): `train.train_batch_size` sequences per optimiser
step = micro_batch_size_per_gpu x gradient_accumulation_steps (x processes).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sarl.backends.trl.common import common_args
from sarl.data.sft import sft_max_length, sft_rows
from sarl.runtime.errors import UserError
from sarl.runtime.files import resolve_path

log = logging.getLogger("sarl.train.trl")


def sft_dataset(cfg: DictConfig, tokenizer: Any):
    """The SFT traces as a `datasets.Dataset`; a trace longer than the max length stops the run
    (`algorithm.truncation: error`) or is cut at its end by TRL (`right`), counted either way."""
    from datasets import Dataset

    if not cfg.data.get("sft_files"):
        raise UserError(f"data={cfg.data.name} has no sft_files: algorithm=sft needs an SFT data group (data=sft_*)")
    path = resolve_path(str(cfg.data.sft_files))
    rows = sft_rows(path)
    limit = sft_max_length(cfg)
    too_long = [i + 1 for i, r in enumerate(rows) if _length(tokenizer, r) > limit]
    if too_long:
        if cfg.algorithm.truncation == "error":
            raise UserError(
                f"{len(too_long)} traces of {path} exceed algorithm.max_length={limit} tokens (lines {too_long[:10]}); "
                "raise train.max_response_length / algorithm.max_length, or algorithm.truncation=right to cut them"
            )
        log.warning(
            "%d/%d traces longer than %d tokens are cut at the end (lines %s)",
            len(too_long),
            len(rows),
            limit,
            too_long[:10],
        )
    log.info("SFT traces: %d (%s), max length %d tokens", len(rows), path, limit)
    return Dataset.from_list(rows)


def _length(tokenizer: Any, row: dict) -> int:
    ids = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def sft_batch_plan(train: DictConfig, n_processes: int = 1) -> dict[str, int]:
    batch, micro = int(train.train_batch_size), int(train.micro_batch_size_per_gpu)
    if batch % (micro * n_processes):
        raise UserError(
            f"train.train_batch_size={batch} (sequences per SFT step) must be a multiple of "
            f"train.micro_batch_size_per_gpu x processes = {micro * n_processes}"
        )
    return {"per_device_train_batch_size": micro, "gradient_accumulation_steps": batch // (micro * n_processes)}


def sft_args(cfg: DictConfig, run_dir: Path):
    from trl import SFTConfig

    return SFTConfig(
        **common_args(cfg, run_dir),
        **sft_batch_plan(cfg.train),
        max_length=sft_max_length(cfg),
        packing=bool(cfg.algorithm.packing),
        completion_only_loss=True,  # labels of prompt tokens are -100: loss on the response only
        assistant_only_loss=False,
        loss_type="nll",
        shuffle_dataset=bool(cfg.train.shuffle),
    )
