"""backend=trl: GRPO (TRL's GRPOTrainer), DPO (TRL's DPOTrainer) and SFT (TRL's SFTTrainer,
sarl.backends.trl.sft) on a CPU or one GPU; DPO also over the GPUs of a node, one process per GPU with FSDP
(`backend.distributed: fsdp`, sarl.backends.trl.distributed).

The same conf/ groups as verl: `train.*` (SARL Tables 6-7 names) are mapped onto TRL's
arguments here, the reward object comes from `conf/reward/*` unchanged, and the run writes
`metrics.jsonl`, checkpoints (`checkpoints/checkpoint-N`, resumed automatically when the run
directory is reused), the final Hugging Face checkpoint (`final/`), `curves.png` and a
per-step table.

Batch mapping (verl counts prompts for the batch sizes and sequences for the micro batch):
    num_generations             = train.rollout_n
    per_device_train_batch_size = train.micro_batch_size_per_gpu                    (sequences)
    gradient_accumulation_steps = ppo_mini_batch_size * rollout_n / micro_batch     (one optimiser step per mini batch)
    steps_per_generation        = accumulation * train_batch_size / ppo_mini_batch_size
so one generation batch is `train_batch_size` prompts x `rollout_n` rollouts, consumed in
`train_batch_size / ppo_mini_batch_size` optimiser steps, as in verl with ppo_epochs = 1.
KL: TRL's `beta` with its k3 estimator (verl's low_var_kl is k3 clipped to [-10, 10]).
Loss aggregation: TRL's "dapo" = token mean over the accumulated batch (verl's token-mean).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

from sarl.backends.trl import distributed
from sarl.backends.trl.common import OUTPUT_SUBDIR, common_args
from sarl.backends.trl.rewards import TRLReward
from sarl.backends.trl.sft import sft_args, sft_dataset
from sarl.contract.reward import RewardsFailedError, build_reward
from sarl.reports.curves import CURVES_FILE, plot_curves
from sarl.reports.figures import METRICS_FILE
from sarl.reports.heldout import HeldOut, log_heldout, table
from sarl.runtime import torch_threads
from sarl.runtime.checkpoints import FINAL_SUBDIR, evaluate_hint, readable_as_umask
from sarl.runtime.checks import Check
from sarl.runtime.files import read_jsonl, resolve_path
from sarl.runtime.runs import wandb_init
from sarl.runtime.weights import WEIGHT_FILES, weights_problem
from sarl.smoke.policy import policy_path

log = logging.getLogger("sarl.train.trl")


def unsupported(cfg: DictConfig) -> str | None:
    """Why this config cannot run on backend=trl (None if it can)."""
    algorithm = cfg.algorithm.name
    if algorithm == "ppo":
        return (
            "algorithm=ppo runs on backend=verl: TRL's PPO needs a reward *model* (an nn.Module scoring token "
            "sequences), not a reward function such as the structure reward; use backend=verl for the PPO rows"
        )
    if algorithm not in ("grpo", "dpo", "sft"):
        return f"algorithm={algorithm} has no TRL trainer here (grpo, dpo and sft do)"
    if algorithm == "grpo" and int(cfg.train.n_trained) != int(cfg.train.rollout_n):
        return (
            f"train.n_trained={cfg.train.n_trained} < train.rollout_n={cfg.train.rollout_n} (vote on more rollouts "
            "than are trained on) needs the verl trainer hook; TRL's GRPOTrainer trains on every rollout it scores"
        )
    if int(cfg.train.get("nnodes", 1)) > 1:
        return "backend=trl runs on one machine; multi-node runs use backend=verl"
    why = distributed.distributed_problem(cfg)
    if why:
        return why
    if algorithm == "grpo":
        try:
            batch_plan(cfg.train)
        except ValueError as err:  # before the policy is built, not a traceback at the first step
            return f"{err}: change train.micro_batch_size_per_gpu or the batch sizes"
    return None


def row_checks(cfg: DictConfig) -> list[Check]:
    """The preflight's checks of a TRL row's config: what TRL refuses (`unsupported`), the training file."""
    why = unsupported(cfg)
    out = [Check("TRL config", why is None, why or f"{cfg.algorithm.name}, {distributed.processes(cfg)} process(es)")]
    key = TRAIN_FILE_KEYS[cfg.algorithm.name]
    path = resolve_path(str(cfg.data.get(key)))
    if path.is_file():
        return [*out, Check("data", True, f"data.{key} = {path}")]
    fix = f"python -m sarl.data.prepare dataset={cfg.data.name}"
    return [*out, Check("data", False, f"data.{key} = {path} does not exist", fix)]


def prompt_dataset(cfg: DictConfig, tokenizer: Any):
    """The GRPO prompts as a `datasets.Dataset`: `prompt` (chat messages) plus the reward's columns
    (`ground_truth_json`, `data_source`, `extra_info_json`; JSON so that mixed types survive Arrow).
    Overlong prompts are dropped and counted (`train.filter_overlong_prompts`), or raise
    (`train.truncation: error`)."""
    from datasets import Dataset

    path = resolve_path(str(cfg.data.trl_train_files))
    rows = read_jsonl(path, "data.trl_train_files")
    limit = int(cfg.train.max_prompt_length)
    kept, too_long = [], []
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt)):
            raise ValueError(f"{path}:{i + 1}: 'prompt' must be a non-empty list of chat messages")
        ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        if len(ids) > limit:
            too_long.append(i + 1)
            continue
        kept.append(
            {
                "prompt": prompt,
                "ground_truth_json": json.dumps(row.get("ground_truth")),
                "data_source": str(row.get("data_source", cfg.data.name)),
                "extra_info_json": json.dumps(row.get("extra_info") or {"index": i}),
            }
        )
    if too_long:
        if cfg.train.filter_overlong_prompts:
            log.warning(
                "dropped %d/%d prompts longer than %d tokens (lines %s)", len(too_long), len(rows), limit, too_long[:10]
            )
        elif cfg.train.truncation == "error":
            raise ValueError(
                f"{len(too_long)} prompts exceed train.max_prompt_length={limit} tokens (lines {too_long[:10]})"
            )
    if not kept:
        raise ValueError(f"no prompt of {path} fits train.max_prompt_length={limit}")
    log.info("prompts: %d read, %d overlong dropped, %d kept (%s)", len(rows), len(too_long), len(kept), path)
    return Dataset.from_list(kept)


def preference_dataset(cfg: DictConfig):
    from datasets import Dataset

    if not cfg.data.get("dpo_files"):
        raise ValueError(f"data '{cfg.data.name}' has no dpo_files: DPO needs preference pairs")
    path = resolve_path(str(cfg.data.dpo_files))
    rows = read_jsonl(path, "data.dpo_files")
    for i, row in enumerate(rows):
        for key in ("prompt", "chosen", "rejected"):
            if not isinstance(row.get(key), list) or not row[key]:
                raise ValueError(f"{path}:{i + 1}: '{key}' must be a non-empty list of chat messages")
    log.info("preference pairs: %d (%s)", len(rows), path)
    return Dataset.from_list([{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows])


def batch_plan(train: DictConfig, n_processes: int = 1) -> dict[str, int]:
    """TRL's batch arguments from verl's (module docstring); ValueError when they do not divide."""
    n, prompts, mini, micro = (
        int(train.rollout_n),
        int(train.train_batch_size),
        int(train.ppo_mini_batch_size),
        int(train.micro_batch_size_per_gpu),
    )
    if prompts % mini:
        raise ValueError(f"train.train_batch_size={prompts} must be a multiple of train.ppo_mini_batch_size={mini}")
    if (mini * n) % (micro * n_processes):
        raise ValueError(
            f"ppo_mini_batch_size x rollout_n = {mini * n} sequences must be a multiple of "
            f"micro_batch_size_per_gpu x processes = {micro * n_processes}"
        )
    accumulation = mini * n // (micro * n_processes)
    return {
        "num_generations": n,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accumulation,
        "steps_per_generation": accumulation * (prompts // mini),
    }


def grpo_args(cfg: DictConfig, run_dir: Path):
    from trl import GRPOConfig

    t, b = cfg.train, cfg.backend
    return GRPOConfig(
        **common_args(cfg, run_dir),
        **batch_plan(t),
        max_completion_length=int(t.max_response_length),
        temperature=float(t.temperature),
        top_p=float(b.top_p),
        top_k=int(b.top_k),
        beta=float(t.kl_loss_coef) if t.use_kl_loss else 0.0,
        epsilon=float(t.clip_ratio_low),
        epsilon_high=float(t.clip_ratio_high),
        entropy_coef=float(t.entropy_coeff),
        num_iterations=1,
        loss_type=b.loss_type,
        scale_rewards="group",  # GRPO: (r - mean) / std within the prompt's group
        mask_truncated_completions=bool(t.mask_truncated),  # reward and gradient of capped responses dropped
        shuffle_dataset=bool(t.shuffle),
        use_vllm=bool(b.use_vllm),
        log_completions=False,
    )


def dpo_args(cfg: DictConfig, run_dir: Path):
    """`train.ppo_mini_batch_size` pairs per optimiser step = micro-batch x accumulation x processes; several
    processes shard the models with FSDP (sarl.backends.trl.distributed)."""
    from trl import DPOConfig

    t = cfg.train
    micro = int(t.micro_batch_size_per_gpu)
    return DPOConfig(
        **common_args(cfg, run_dir),
        **distributed.fsdp_args(cfg),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=max(1, int(t.ppo_mini_batch_size) // (micro * distributed.processes(cfg))),
        beta=float(cfg.algorithm.beta),
        max_length=int(t.max_prompt_length) + int(t.max_response_length),
    )


def trainer_args(cfg: DictConfig, run_dir: Path):
    if cfg.algorithm.name == "sft":
        return sft_args(cfg, run_dir)
    return grpo_args(cfg, run_dir) if cfg.algorithm.name == "grpo" else dpo_args(cfg, run_dir)


TRAINERS = {"grpo": "GRPOTrainer", "dpo": "DPOTrainer", "sft": "SFTTrainer"}
TRAIN_FILE_KEYS = {"grpo": "trl_train_files", "dpo": "dpo_files", "sft": "sft_files"}


def dry_run_config(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """What `train.dry_run=true` prints for backend=trl: the trainer, its arguments and the inputs; for several
    processes, how they are started (`launch`: torchrun's arguments; sarl.train prints the whole command, with the
    interpreter, on stderr)."""
    with bf16_as_on_the_gpu_node(cfg):
        args = trainer_args(cfg, run_dir)
    keys = sorted(k for k in vars(type(args)).get("__dataclass_fields__", {}) if not k.startswith("_"))
    values = {k: getattr(args, k) for k in keys}
    out = {
        "trainer": TRAINERS[cfg.algorithm.name],
        "model": cfg.model.path or {"build": OmegaConf.to_container(cfg.model.build, resolve=True)},
        "train_file": str(cfg.data.get(TRAIN_FILE_KEYS[cfg.algorithm.name])),
        "reward": OmegaConf.to_container(cfg.reward, resolve=True) if cfg.algorithm.name == "grpo" else None,
        "args": json.loads(json.dumps(values, default=str)),
    }
    n = distributed.processes(cfg)
    if n > 1:
        out["launch"] = {"processes": n, "torchrun": distributed.worker_torchrun_args(run_dir, n)}
    return out


@contextlib.contextmanager
def bf16_as_on_the_gpu_node(cfg: DictConfig) -> Iterator[None]:
    """TrainingArguments refuse `bf16` on a machine without a bf16 GPU (transformers training_args.py:1706-1712); a
    dry run describes the run on its GPU node, where the preflight and sarl.train check the GPUs, so within this
    block that check sees one. Nothing changes for a row without bf16 or on the CPU (`backend.use_cpu`)."""
    if not cfg.backend.bf16 or cfg.backend.use_cpu:
        yield
        return
    from unittest import mock

    with mock.patch("transformers.training_args.is_torch_bf16_gpu_available", return_value=True):
        yield


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` cannot be resumed from (None if it can): a kill while it was written leaves it without
    a readable `trainer_state.json` or without model weights."""
    state = path / "trainer_state.json"
    try:
        json.loads(state.read_text())["global_step"]
    except FileNotFoundError:
        return "no trainer_state.json"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable trainer_state.json ({type(err).__name__}: {err})"
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        return f"no model weights ({' / '.join(WEIGHT_FILES)})"
    return None


def resume_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete `checkpoints/checkpoint-N` of the run (None if there is none); an incomplete newer
    one is named in a warning and skipped."""
    out = run_dir / OUTPUT_SUBDIR
    if not out.is_dir():
        return None
    found = []
    for path in out.iterdir():
        prefix, _, number = path.name.partition("-")
        if path.is_dir() and prefix == "checkpoint" and number.isdigit():
            found.append((int(number), path))
    for _, path in sorted(found, reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        log.warning(
            "checkpoint %s is incomplete (%s; interrupted while saving?): resuming from an older one", path, problem
        )
    return None


def failed_rewards_before(metrics_path: Path, last_step: int) -> int:
    """The failed rewards logged in `metrics.jsonl` up to `last_step` (the resumed run's earlier total)."""
    from sarl.backends.trl.metrics import read_metrics  # deferred: imports torch and transformers

    return int(
        round(sum(r.get("reward/failed") or 0.0 for r in read_metrics(metrics_path) if r.get("step", 0) <= last_step))
    )


def _wandb_run(cfg: DictConfig, meta: dict, run_dir: Path, env: dict[str, str]):
    if "wandb" not in cfg.logger.backends:
        return None

    return wandb_init(cfg, meta, run_dir, env)


def reference_model(cfg: DictConfig, model_path: Path | str):
    """DPO's reference model in bfloat16 where the run computes in it (`backend.bf16`): forward-only, it computes
    with the same bf16 weights that autocast would cast a float32 copy to, in half the memory (decisions §7.5).
    None otherwise: TRL then loads it like the policy (trl dpo_trainer.py:916-927)."""
    if not cfg.backend.bf16:
        return None
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)


def _heldout(cfg: DictConfig, run_dir: Path, reward_node: dict, model: Any, tokenizer: Any) -> tuple[Any, Any]:
    """The run's held-out evaluation (`heldout` node): SR by the structure reward on the run's embedder; and that
    embedder (built once: a training reward with an `embedder` uses the same one). For the live policy embedder
    (embedding=policy_hidden), SR is measured on a frozen copy of the starting policy `model` instead
    (sarl.backends.trl.live.frozen_copy)."""
    from hydra.utils import instantiate

    # deferred (both): import numba and scipy (sarl.structure's kernels)
    from sarl.backends.trl.live import frozen_copy
    from sarl.structure.embed.hidden import asks_for_live_policy

    node = reward_node.get("embedder") or OmegaConf.to_container(cfg.embedding, resolve=True)
    embedder = frozen_copy(node, model, tokenizer) if asks_for_live_policy(node) else instantiate(node)
    structure = instantiate(OmegaConf.to_container(cfg.heldout.structure, resolve=True), embedder=embedder)
    train_file = cfg.data.get("trl_train_files")  # held-out prompts must not be training prompts
    train_rows = read_jsonl(resolve_path(str(train_file)), "data.trl_train_files") if train_file else None
    return HeldOut(cfg.heldout, run_dir, structure, train_rows), embedder


def train(cfg: DictConfig, run_dir: Path, meta: dict, env: dict[str, str], reward_cfg: dict | None = None) -> int:
    """Run GRPO or DPO with TRL in this process; returns 0 on success. `reward_cfg`: the resolved
    reward node (with a started embedding server's URL filled in), default `cfg.reward`."""
    import torch
    from rich.console import Console
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # deferred: imports torch and transformers
    from sarl.backends.trl.metrics import MetricsRecorder, read_metrics, summary_table, truncate_metrics

    torch_threads.apply(cfg.backend.get("torch_threads", "auto"))  # the policy's build, sampling and training
    model_path = policy_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.get("tokenizer_path") or model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    main = distributed.is_main_process()  # rank 0 writes the run's files and logs (one process: this one)
    resume = resume_checkpoint(run_dir)
    metrics_path = run_dir / METRICS_FILE
    failed_before = 0
    if resume is not None:
        state = json.loads((resume / "trainer_state.json").read_text())
        dropped = truncate_metrics(metrics_path, int(state["global_step"])) if main else 0
        failed_before = failed_rewards_before(metrics_path, int(state["global_step"]))
        log.info("resuming from %s (step %d; %d later metric records dropped)", resume, state["global_step"], dropped)
    os.environ.update(distributed.fsdp_environment(cfg))  # before the Trainer builds accelerate's FSDP plugin
    args = trainer_args(cfg, run_dir)
    heldout, heldout_before, embedder = None, None, None
    reward_node = reward_cfg or OmegaConf.to_container(cfg.reward, resolve=True)
    live = None  # embedding=policy_hidden: the reward embeds with the policy being trained (sarl.backends.trl.live)
    if cfg.algorithm.name == "grpo":
        # deferred: imports numba and scipy (sarl.structure's kernels)
        from sarl.backends.trl.live import live_policy_embedding

        live = live_policy_embedding(reward_node, model, tokenizer)
    if cfg.get("heldout") and cfg.algorithm.name == "sft":
        log.info("heldout: not evaluated for algorithm=sft (the held-out before/after is for the RL runs)")
    elif cfg.get("heldout"):
        heldout, embedder = _heldout(cfg, run_dir, reward_node, model, tokenizer)
        heldout_before = heldout.before(model, tokenizer)
    wandb_run = _wandb_run(cfg, meta, run_dir, env) if main else None
    recorder = MetricsRecorder(metrics_path, wandb_run)
    try:
        if cfg.algorithm.name == "grpo":
            from sarl.backends.trl.trainer import SarlGRPOTrainer  # deferred: imports trl and torch

            shared = {"embedder": embedder} if embedder is not None and reward_node.get("embedder") else {}
            if live is not None:
                shared = {"embedder": live.embedder}
            reward_obj = build_reward(reward_node, **shared)  # one embedder for reward and held-out
            problem = reward_obj.check_ready()
            if problem is not None:
                log.error("the reward cannot run, stopping before step 1: %s", problem)
                return 1
            max_failed = cfg.train.get("max_failed_steps")
            reward = TRLReward(
                reward_obj,
                num_generations=args.num_generations,
                tokenizer=tokenizer,
                name=str(cfg.get("reward_name") or "reward"),
                max_failed_steps=int(max_failed) if max_failed is not None else None,
                extra_metrics=live.metrics if live is not None else None,
            )
            reward.failed_total = failed_before
            trainer = SarlGRPOTrainer(
                model=model,
                reward_funcs=[reward],
                args=args,
                train_dataset=prompt_dataset(cfg, tokenizer),
                processing_class=tokenizer,
                callbacks=[recorder],
                resample_tags_seed=int(cfg.seed) if cfg.train.resample_tags else None,
            )
            if live is not None:
                live.follow(trainer)
        elif cfg.algorithm.name == "sft":
            from trl import SFTTrainer

            trainer = SFTTrainer(
                model=model,
                args=args,
                train_dataset=sft_dataset(cfg, tokenizer),
                processing_class=tokenizer,
                callbacks=[recorder],
            )
        else:
            from trl import DPOTrainer

            trainer = DPOTrainer(
                model=model,
                ref_model=reference_model(cfg, model_path),
                args=args,
                train_dataset=preference_dataset(cfg),
                processing_class=tokenizer,
                callbacks=[recorder],
            )
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # the recorder prints one line per step instead of the raw dict
        distributed.watch_sharding(trainer, cfg, run_dir)  # several processes: sharded by FSDP, or stop
        try:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        except RewardsFailedError as err:
            log.error("training stopped: %s", err)
            stopped = {"steps": trainer.state.global_step, "failed_rewards": reward.failed_total, "stopped": str(err)}
            (run_dir / "summary.json").write_text(json.dumps(stopped, indent=2))  # no final checkpoint
            return 1
        final = run_dir / FINAL_SUBDIR
        state, numel = distributed.save_final(trainer, final)  # every rank: FSDP gathers the model, rank 0 writes it
        if not main:
            return 0
        tokenizer.save_pretrained(str(final))
        readable_as_umask(final)  # as the user's other files: the group can read the model (0600 otherwise)
        problem = weights_problem(final, state, numel)  # no run ends without its weights
        if problem:
            log.error("the run saved no usable model: %s", problem)
            stopped = {"steps": trainer.state.global_step, "stopped": f"final checkpoint: {problem}"}
            (run_dir / "summary.json").write_text(json.dumps(stopped, indent=2))
            return 1
        if state is not None:
            log.info("%s: every saved tensor equals its trained one", final)
        heldout_block = heldout.report(heldout_before, heldout.after(trainer.model, tokenizer)) if heldout else None
        if heldout_block is not None and wandb_run is not None:
            log_heldout(wandb_run, heldout_block)  # beside the curves: a sweep's runs compare in the W&B UI
    finally:
        if wandb_run is not None:
            wandb_run.finish()
    rows = read_metrics(metrics_path)
    console = Console(file=sys.stdout, width=160)
    console.print(summary_table(rows))
    title = f"{meta.get('experiment', '')} ({run_dir.name})"
    png = plot_curves(rows, run_dir / CURVES_FILE, title=title, heldout=heldout_block)
    summary = {  # paths relative to the run directory: the record stays true when the directory is moved
        "final_checkpoint": FINAL_SUBDIR,
        "metrics": os.path.relpath(metrics_path, run_dir),
        "curves": os.path.relpath(png, run_dir),
        "steps": trainer.state.global_step,
        "resumed_from": os.path.relpath(resume, run_dir) if resume else None,
    }
    if cfg.algorithm.name == "grpo":
        summary["failed_rewards"] = reward.failed_total
    if heldout_block is not None:
        summary["heldout"] = heldout_block
        console.print(table(heldout_block))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"final checkpoint: {run_dir / FINAL_SUBDIR}\ncurves: {png}\nmetrics: {metrics_path}")
    console.print(evaluate_hint(run_dir, bool(cfg.model.get("build"))), soft_wrap=True)
    return 0
