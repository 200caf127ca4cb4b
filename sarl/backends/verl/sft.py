"""algorithm=sft on backend=verl: verl 0.9.1's SFT trainer (`verl.trainer.sft_trainer`, engine-based, FSDP2),
launched with torchrun.

verl's packaged `sft_trainer_engine` config is the schema, as `ppo_trainer` is for the RL rows
(sarl.backends.verl.config): it is composed, our values are written into it in struct mode (a removed or
misspelt key fails here) and its typed sections (engine, optim, checkpoint) are built into verl's own
dataclasses before anything is launched.

Data: verl's `MultiTurnSFTDataset` reads a parquet with a `messages` column and puts loss only on the
assistant turns (its `loss_mask`), i.e. on the response; the run writes that parquet from the data group's
`sft_files` (the TRL jsonl the TRL back end reads) into the run directory, so both back ends train on one
file. `data.pad_mode: no_padding` (verl's default) trains on unpadded, packed rows: the packing of this back end.
A set of fewer traces than `train.train_batch_size` is refused before launch, dry run included (verl's loader
drops the incomplete batch and would have no step).

Chat template: the dataset renders every message with the model's chat template, and the templates of
DeepSeek-R1-Distill and Qwen3 drop the reasoning of an assistant turn (everything up to `</think>`), so the
tagged reasoning would get no loss. Where the model's own template does not render a trace whole,
`model.custom_chat_template` is set to the template of its family that does, with the same prompts
(`sft_chat_template`; decisions §7.1).

Checkpoints: `checkpoints/global_step_N/` (FSDP shards, optimiser, data loader state, resumed automatically)
with a Hugging Face copy under `huggingface/` (save_contents `hf_model`), linked into the run's `final/` at the end
(sarl.runtime.checkpoints.export_final), which the next pipeline stage loads.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sarl.backends.verl.attention import resolve_attn_implementation
from sarl.backends.verl.config import _flatten, process_env, verl_config_with
from sarl.backends.verl.preflight import check_sft_memory_plan
from sarl.backends.verl.process import run_verl_process
from sarl.data.sft import sft_max_length, sft_rows
from sarl.runtime.checkpoints import CHECKPOINT_SUBDIR
from sarl.runtime.checks import raise_failed
from sarl.runtime.errors import UserError
from sarl.runtime.files import resolve_path
from sarl.runtime.runs import dry_run_command, run_record, wandb_record
from sarl.runtime.signals import torchrun_command

VERL_SFT_CONFIG_NAME = "verl_sft_trainer"
SFT_ENTRY_MODULE = "verl.trainer.sft_trainer"
SFT_DATA_FILE = "sft_data/train.parquet"

log = logging.getLogger("sarl.train.verl")

# Chat templates that render an assistant turn as written, each with the layout of a model family's own template
# for system and user turns and the generation prompt (decisions §7.1). SFT traces carry no tool calls: another
# role is refused.
# DeepSeek-R1-Distill (Qwen and Llama): its own template keeps `content.split('</think>')[-1]` of an assistant turn
R1_DISTILL_SFT_TEMPLATE = (
    "{%- set ns = namespace(system_prompt='') -%}"
    "{%- for message in messages if message['role'] == 'system' -%}{%- set ns.system_prompt = message['content'] -%}"
    "{%- endfor -%}"
    "{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{%- elif message['role'] != 'system' -%}{{ raise_exception('SFT traces have system, user and assistant turns') }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<｜Assistant｜><think>\\n' }}{%- endif -%}"
)
# Qwen3 (ChatML): its own template renders an assistant turn's reasoning only after the conversation's last user turn
QWEN3_SFT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ('system', 'user', 'assistant') -%}"
    "{{ raise_exception('SFT traces have system, user and assistant turns') }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{%- endif -%}"
)
SFT_CHAT_TEMPLATES = {"DeepSeek-R1-Distill": R1_DISTILL_SFT_TEMPLATE, "Qwen3": QWEN3_SFT_TEMPLATE}
# What the checks render: an assistant turn in the traces' layout, and prompts with and without a system turn
PROBE_TRACE = "<think>\n<known> probe step\n</think>\n\n<answer>probe answer</answer>"
PROBE_PROMPTS = (
    [{"role": "user", "content": "probe question"}],
    [{"role": "system", "content": "probe system"}, {"role": "user", "content": "probe question"}],
)


def verl_sft_values(cfg: DictConfig, run_dir: str, experiment: str) -> dict[str, Any]:
    """Our config in the keys of verl's `sft_trainer_engine` (train.* as for the RL rows)."""
    t, b = cfg.train, cfg.backend
    if cfg.algorithm.truncation not in ("error", "right"):
        raise UserError(f"algorithm.truncation={cfg.algorithm.truncation!r}: must be error or right")
    n_gpus = int(t.nnodes) * int(t.n_gpus_per_node)
    if int(t.train_batch_size) % n_gpus:
        raise UserError(
            f"train.train_batch_size={t.train_batch_size} (sequences per SFT step) must be a multiple of the "
            f"{n_gpus} GPUs (train.nnodes x train.n_gpus_per_node): verl splits it evenly over data-parallel ranks"
        )
    max_length = sft_max_length(cfg)
    values: dict[str, Any] = {
        "data.train_files": f"{run_dir}/{SFT_DATA_FILE}",
        "data.val_files": None,
        "data.messages_key": "messages",
        "data.train_batch_size": t.train_batch_size,
        "data.micro_batch_size_per_gpu": t.micro_batch_size_per_gpu,
        "data.use_dynamic_bsz": b.use_dynamic_bsz,
        "data.max_token_len_per_gpu": max(max_length, int(t.micro_batch_size_per_gpu) * max_length),
        "data.max_length": max_length,
        "data.truncation": cfg.algorithm.truncation,
        "data.pad_mode": "no_padding",  # packed rows, no padding tokens
        "model.path": cfg.model.path,
        "model.enable_gradient_checkpointing": b.enable_gradient_checkpointing,
        "model.enable_activation_offload": b.enable_activation_offload,
        "engine.strategy": b.strategy,
        "engine.seed": cfg.seed,
        "optim.lr": t.actor_lr,
        "optim.weight_decay": t.weight_decay,
        "optim.lr_scheduler_type": t.lr_schedule,
        "optim.min_lr_ratio": t.min_lr_ratio,
        "optim.lr_warmup_steps_ratio": t.lr_warmup_ratio,
        "checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
        "checkpoint.load_contents": ["model", "optimizer", "extra"],
        "trainer.default_local_dir": f"{run_dir}/{CHECKPOINT_SUBDIR}",
        "trainer.project_name": cfg.logger.project,
        "trainer.experiment_name": experiment,
        "trainer.total_epochs": t.total_epochs,
        "trainer.total_training_steps": t.get("total_training_steps"),
        # verl's file logger writes metrics.jsonl ({"step", "data"} per line; VERL_FILE_LOGGER_PATH, run_verl_sft)
        "trainer.logger": ["console", "file", *[x for x in cfg.logger.backends if x not in ("console", "file")]],
        "trainer.seed": cfg.seed,
        "trainer.save_freq": t.save_freq,
        "trainer.test_freq": -1,
        "trainer.resume_mode": "auto",
        "trainer.nnodes": t.nnodes,
        "trainer.n_gpus_per_node": t.n_gpus_per_node,
    }
    if cfg.model.get("tokenizer_path"):
        values["model.tokenizer_path"] = cfg.model.tokenizer_path
    chat_template = sft_chat_template(cfg)
    if chat_template is not None:
        values["model.custom_chat_template"] = chat_template

    values["model.override_config"] = {"attn_implementation": resolve_attn_implementation(b.attn_implementation)}
    if b.get("cpu", False):  # backend=verl_cpu: verl's SFT trainer puts its batches on `trainer.device` (cuda)
        values["trainer.device"] = "cpu"
    values.update(_flatten(OmegaConf.to_container(b.sft_overrides, resolve=True)))
    return values


def sft_chat_template(cfg: DictConfig) -> str | None:
    """`model.custom_chat_template` of the SFT stage: None where the model's own chat template renders a trace whole
    (the tiny policy's) or `backend.sft_overrides` sets one; else the template of SFT_CHAT_TEMPLATES that renders the
    model's prompts exactly as its own does (decisions §7.1). A dry run reads the tokenizer offline only (a directory
    or the local Hugging Face cache); where it is not there, the run decides when it starts."""
    if not cfg.model.path or OmegaConf.select(cfg.backend.sft_overrides, "model.custom_chat_template") is not None:
        return None
    name = str(cfg.model.get("tokenizer_path") or cfg.model.path)
    tokenizer = model_tokenizer(name, offline=bool(cfg.train.dry_run))
    if tokenizer is None:
        log.warning(
            "%s: tokenizer not in the local Hugging Face cache; whether its chat template renders the SFT traces "
            "whole (model.custom_chat_template) is decided when the run starts",
            name,
        )
        return None
    own = tokenizer.chat_template
    if not isinstance(own, str) or renders_trace_whole(tokenizer, own):
        return None
    for family, template in SFT_CHAT_TEMPLATES.items():
        if renders_prompts_alike(tokenizer, template, own):
            log.info(
                "%s: its chat template drops the reasoning of an assistant turn; SFT uses the %s one that keeps it",
                name,
                family,
            )
            return template
    raise UserError(
        f"the chat template of {name} does not render an assistant turn as written (it drops the reasoning before "
        f"</think>), so verl's SFT would not train on the whole trace, and its prompts match none of the "
        f"{', '.join(SFT_CHAT_TEMPLATES)} layouts; give a template that does as "
        "backend.sft_overrides.model.custom_chat_template"
    )


def model_tokenizer(name: str, offline: bool) -> Any:
    """The tokenizer of a model directory or Hub id; offline: None where neither the directory nor the local Hugging
    Face cache has it."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=offline)
    except (OSError, ValueError):
        if not offline:
            raise
        return None


def _render(tokenizer: Any, template: str, messages: list[dict], **kwargs: Any) -> str | None:
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)
    except TemplateError:  # a template may refuse a conversation, e.g. one that does not start with a user turn
        return None


def renders_trace_whole(tokenizer: Any, template: str) -> bool:
    """An assistant turn appears as written both alone and after its prompt: verl's dataset renders each message
    alone and checks the concatenation against the whole conversation."""
    turn = {"role": "assistant", "content": PROBE_TRACE}
    return all(
        PROBE_TRACE in (_render(tokenizer, template, messages) or "")
        for messages in ([turn], [*PROBE_PROMPTS[0], turn])
    )


def renders_prompts_alike(tokenizer: Any, template: str, own: str) -> bool:
    """`template` renders prompts (with and without a system turn, thinking on and off) as `own` does: the policy
    sees the same prompts after SFT as before."""
    return all(
        _render(tokenizer, template, prompt, add_generation_prompt=True, **kwargs)
        == _render(tokenizer, own, prompt, add_generation_prompt=True, **kwargs)
        for prompt in PROBE_PROMPTS
        for kwargs in ({}, {"enable_thinking": False})
    )


def build_verl_sft_config(cfg: DictConfig, run_dir: str, experiment: str) -> DictConfig:
    return verl_config_with(
        "sft_trainer_engine",
        verl_sft_values(cfg, run_dir, experiment),
        f"verl {cfg.backend.version}'s SFT trainer",
        "fix backend.sft_overrides or sarl/backends/verl/sft.py",
    )


def validate_verl_sft_config(config: DictConfig) -> None:
    """verl's typed sections of the SFT config built as its trainer builds them (`SFTTrainer._build_config`):
    the engine, optimiser and checkpoint dataclasses run their own checks. The model section loads the model's
    config and tokenizer, so it is built only when the model is a local directory."""
    from verl.utils.config import omega_conf_to_dataclass

    for section in ("engine", "optim", "checkpoint"):
        omega_conf_to_dataclass(config[section])
    if Path(str(config.model.path)).is_dir():
        omega_conf_to_dataclass(config.model)


def sft_traces(cfg: DictConfig) -> tuple[Path, list[dict]]:
    """The data group's `sft_files` and its traces as prompt-completion rows (sarl.data.sft.sft_rows)."""
    if not cfg.data.get("sft_files"):
        raise UserError(f"data={cfg.data.name} has no sft_files: algorithm=sft needs an SFT data group (data=sft_*)")
    path = resolve_path(str(cfg.data.sft_files))
    return path, sft_rows(path)


def check_enough_traces(cfg: DictConfig, experiment: str) -> None:
    """Refuse a set of fewer traces than `train.train_batch_size`. verl's loader gives each data-parallel rank
    floor(N / ranks) traces and batches them by train_batch_size / ranks, both with drop_last (verl 0.9.1
    trainer/sft_trainer.py:236-252): floor(N / train_batch_size) steps per epoch. With none, verl sets zero steps
    per epoch (:187) and divides by them (:341): a ZeroDivisionError. A dry run plans with the stage's own batch
    and says in one line what a real run needs (the shipped sample sets are smaller than a paper's batch).
    `experiment` is `ROW/STAGE` inside a pipeline: the fixes named are then that stage's overrides."""
    path, rows = sft_traces(cfg)
    batch = int(cfg.train.train_batch_size)
    if len(rows) >= batch:
        return
    stage = experiment.partition("/")[2]
    key = f"{stage}:" if stage else ""
    ranks = int(cfg.train.n_gpus_per_node) * int(cfg.train.nnodes)
    smaller = len(rows) // ranks * ranks  # the batch must split evenly over the data-parallel ranks
    fixes = [f"give a set of at least {batch} traces with {key}data.sft_files=FILE"]
    if smaller:
        fixes.append(f"set {key}train.train_batch_size={smaller} (a multiple of the {ranks} ranks)")
    problem = (
        f"data.sft_files={path} holds {len(rows)} traces, fewer than train.train_batch_size={batch} (traces per "
        f"SFT step): verl's SFT trainer drops an incomplete batch, so no step would run; {' or '.join(fixes)}"
    )
    if not cfg.train.dry_run:
        raise UserError(problem)
    log.warning("dry run only: %s", problem)


def write_sft_parquet(cfg: DictConfig, run_dir: Path) -> Path:
    """`data.sft_files` (TRL jsonl) as the `messages` parquet verl's SFT dataset reads; returns its path."""
    import pandas as pd

    _, rows = sft_traces(cfg)
    out = run_dir / SFT_DATA_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    # messages as a list of {role, content} structs: what MultiTurnSFTDataset reads (pandas -> pyarrow)
    pd.DataFrame({"messages": [r["prompt"] + r["completion"] for r in rows]}).to_parquet(out, index=False)
    return out


def sft_launch_command(cfg: DictConfig, run_dir: Path) -> list[str]:
    """torchrun on this node's GPUs with verl's SFT entry point on the config this run wrote. Several nodes need
    torchrun started on every node (a rendezvous): not done by sarl.train, which refuses nnodes > 1 here."""
    if int(cfg.train.nnodes) != 1:
        raise UserError(
            f"algorithm=sft on backend=verl with train.nnodes={cfg.train.nnodes}: sarl.train starts torchrun on one "
            "node only; SFT of the seed papers' sets fits one node (train.nnodes=1)"
        )
    return torchrun_command(
        int(cfg.train.n_gpus_per_node),
        SFT_ENTRY_MODULE,
        [
            *("--config-path", str(run_dir), "--config-name", VERL_SFT_CONFIG_NAME),
            *(f"hydra.run.dir={run_dir}", "hydra.output_subdir=verl_hydra"),
        ],
    )


def run_verl_sft(cfg: DictConfig, choices: dict[str, Any], experiment: str, run_dir: Path) -> int:
    """Write verl's SFT config and the traces' parquet into the run directory and launch torchrun on them;
    `train.dry_run=true` prints the config and the command only."""

    check_enough_traces(cfg, experiment)
    config = build_verl_sft_config(cfg, str(run_dir), experiment)
    validate_verl_sft_config(config)
    cmd = sft_launch_command(cfg, run_dir)
    if cfg.train.dry_run:
        sys.stdout.write(OmegaConf.to_yaml(config))
        sys.stderr.write(dry_run_command(cmd, [run_dir / f"{VERL_SFT_CONFIG_NAME}.yaml", run_dir / SFT_DATA_FILE]))
        return 0

    # the plan of one GPU, where the model's config.json is at hand (sarl/backends/verl/memory.py: sft_memory_plan)
    raise_failed(check_sft_memory_plan(cfg, config, experiment.partition("/")[2], skip_missing=True))
    meta, env = run_record(cfg, choices, experiment, run_dir)  # env: W&B offline without a key, stable run id
    env.update(process_env(cfg, run_dir))  # our patches in every rank; metrics.jsonl (appended to on a resume)
    write_sft_parquet(cfg, run_dir)
    (run_dir / f"{VERL_SFT_CONFIG_NAME}.yaml").write_text(OmegaConf.to_yaml(config))
    if "wandb" in cfg.logger.backends:
        wandb_record(cfg, meta, run_dir, env)
    return run_verl_process(cmd, run_dir, env, config.trainer.get("total_training_steps"))
