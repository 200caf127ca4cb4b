"""`backend=verl_cpu`: any row's verl trainer, for real, on a CPU-only machine (a laptop, CI).

`python -m sarl.train +exp=ROW backend=verl_cpu` runs the row's own verl 0.9.1 trainer (its algorithm, reward,
trainer class, hooks and pipeline stages) with the pieces that let verl run without an accelerator:

- a verl platform plugin ("cpu": sarl.backends.verl.cpu.platform) and the "hf" rollout server back end
  (sarl.backends.verl.cpu.rollout), loaded in every process of the run by verl's own `VERL_USE_EXTERNAL_MODULES`
  and selected by `VERL_PLATFORM=cpu` (`cpu_process_env`);
- the settings that fit a 2-core machine (`cpu_verl_values`): Ray with a logical GPU and 16 logical CPUs (verl's pools
  ask for a GPU per worker and 3 CPUs per bundle; TransferQueue's controller and storage units 1 CPU each: on
  2 real cores the defaults wait forever), one TransferQueue storage unit, FSDP2 (FSDP1's
  `sync_module_states` refuses CPU parameters), sdpa attention, no torch.compile, one GPU's worth of workers
  (a logical GPU per rank: `train.n_gpus_per_node`, `train.nnodes` and `backend.rollout_tensor_parallel_size`
  named on the command line run several, decisions §7.7);
- the row made small (`cpu_overrides`): a tiny Qwen3 policy that writes the row's output format
  (`model=tiny_qwen3`, or `tiny_qwen3_tagged` / `tiny_qwen3_graph` for rows whose rewards read step tags or GRP
  graphs: `output_format`), the shipped smoke prompts (tagged ones for rows whose data is tagged, code ones with
  tests for rows whose data is code; the shipped traces for SFT stages), 2 optimiser steps, 4 prompts x 4
  rollouts (a row that votes on more rollouts than it trains keeps its ratio), short responses (longer for the
  tagged and graph formats), the local MiniLM embedder for structure rewards, a format check that reports
  without stopping (the tiny policy's graphs often fail to parse), no W&B. A key or group named on the command
  line is never changed.

What differs from the GPU run is written in README ("Try a row on CPU") and docs/gpu.md: the model, data,
batch and lengths above, the HF sampler instead of vLLM (the same sampling parameters, batch by batch instead
of continuous batching), gloo instead of NCCL, fp32 everywhere. Nothing here is active in a GPU run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig

PLUGIN_MODULE = "sarl.backends.verl.cpu.plugin"
PLATFORM = "cpu"
PARQUET_SUBDIR = "verl_cpu_data"  # in the run directory: the smoke prompts as verl parquet
SYNC_LOG = "rollout_sync.jsonl"  # in the run directory: one line per weight sync (sarl.backends.verl.cpu.rollout)
SYNC_RANKS_LOG = "rollout_sync_ranks.jsonl"  # one line per actor rank and weight sync (the same module)

ROLLOUT_N = 4
TRAIN = {
    "train.total_training_steps": 2,
    "train.train_batch_size": 4,
    "train.ppo_mini_batch_size": 4,
    "train.micro_batch_size_per_gpu": 8,
    "train.max_prompt_length": 320,
    "train.max_response_length": "${data.max_response_length}",  # the smoke set's 192 (rows set up to 8k)
    "train.nnodes": 1,
    "train.n_gpus_per_node": 1,
    "train.save_freq": 2,  # the last step: a pipeline stage hands its final checkpoint on
    "train.test_freq": -1,
}
SFT_TRAIN = {
    "train.total_training_steps": 2,
    "train.total_epochs": 2,
    "train.train_batch_size": 2,
    "train.micro_batch_size_per_gpu": 1,
    "train.nnodes": 1,
    "train.n_gpus_per_node": 1,
}
# The tiny policy of each output format (output_format): warm-started on the smoke traces written in that format,
# so that its responses score differently under the row's reward (conf/model/tiny_qwen3*.yaml)
TINY_POLICIES = {"plain": "tiny_qwen3", "tagged": "tiny_qwen3_tagged", "graph": "tiny_qwen3_graph"}
GRAPH_PARSER = "sarl.formats.graph.parse_graph"
# responses of the tagged and graph smoke traces run to ~230 and ~390 tokens (the plain ones fit the smoke set's 192)
RESPONSE_TOKENS = {"tagged": 256, "graph": 400}
SMOKE_VAL_PROMPTS = 8  # validation set: the first held-out smoke prompts


def is_cpu(cfg: DictConfig) -> bool:
    return bool(cfg.backend.get("cpu", False))


def cpu_overrides(cfg: DictConfig, named: Iterable[str]) -> list[str]:
    """Hydra overrides that make the composed row `cfg` a CPU run (module docstring), leaving out every key or group
    in `named` (what the command line names) and every key below a named one."""
    from sarl.runtime.overrides import named_keys  # deferred: a package __init__ imports no project module at its top

    named = named_keys(named)

    def free(key: str) -> bool:
        return not any(key == n or key.startswith(n + ".") for n in named)

    sft = cfg.algorithm.name == "sft"
    fmt = output_format(cfg)
    out: dict[str, Any] = {"model": TINY_POLICIES[fmt]}
    if sft:
        shipped = str(cfg.data.get("sft_files") or "").startswith("pkg://")
        out["data"] = None if shipped else "sft_smoke"  # a row's shipped traces (tagged, graph) stay
        out.update(SFT_TRAIN)
    else:
        style = str(cfg.data.get("prompt_style") or "plain")
        out["data"] = "smoke_structured" if style.startswith("structured") else "smoke"
        if cfg.data.get("setting") == "code":  # code rows: prompts with tests (conf/data/smoke_code.yaml)
            out["data"] = "smoke_code"
        out.update(TRAIN)
        votes, trained = int(cfg.train.rollout_n), int(cfg.train.n_trained)
        if votes > ROLLOUT_N:
            out["train.rollout_n"] = ROLLOUT_N
            if trained != votes:  # keep the row's votes : trained ratio, at least 2 trained (a group baseline)
                out["train.n_trained"] = max(2, math.floor(ROLLOUT_N * trained / votes))
        for path in _attention_rewards(cfg.reward):  # MaxFlow's layers: the paper's last five; the tiny policy has 2
            out[f"{path}.layers"] = "[-2,-1]"
        out["data.max_response_length"] = RESPONSE_TOKENS.get(fmt)  # the smoke set's 192 for plain responses
        if (cfg.get("format_check") or {}).get("parser"):  # the tiny policy's graphs often fail: check, report, go on
            out["format_check.min_share"] = 0.0
            out["format_check.max_new_tokens"] = "${data.max_response_length}"  # what the rollout may write
        if cfg.reward.get("embedder") is not None and "embedding" in named:
            pass  # the command's embedder (e.g. the vLLM server) stays
        elif cfg.reward.get("embedder") is not None:
            out["embedding"] = "local"
    out["logger"] = "none"
    return [f"{k}={_value(v)}" for k, v in out.items() if v is not None and free(k)]


def output_format(cfg: DictConfig) -> str:
    """What the row's policy must write for its reward to tell responses apart: "tagged" (Structured Reasoning's
    step tags: data with the tagged-step prompt, or SFT traces marked `trace_format: tagged`), "graph" (GRP's graph
    blocks: a row whose format check parses them, or SFT traces marked `trace_format: graph`), else "plain"."""
    if cfg.algorithm.name == "sft":
        return str(cfg.data.get("trace_format") or "plain")
    if str(cfg.data.get("prompt_style") or "plain").startswith("structured"):
        return "tagged"
    if str((cfg.get("format_check") or {}).get("parser") or "") == GRAPH_PARSER:
        return "graph"
    return "plain"


def _attention_rewards(reward: DictConfig, path: str = "reward") -> list[str]:
    """The config paths of the rewards in `reward` (itself or its `components`) that read attention layers."""
    found = [path] if "layers" in reward else []
    for name, part in (reward.get("components") or {}).items():
        found += _attention_rewards(part, f"{path}.components.{name}")
    return found


def _value(v: Any) -> str:
    return "null" if v is None else str(v)


# -- the verl config and environment of a CPU run ----------------------------------------------------------------


def cpu_verl_values(cfg: DictConfig) -> dict[str, Any]:
    """verl keys of a CPU run, applied after the row's (module docstring); Ray's resources are set by
    `ray_init_values`, outside verl's schema."""
    response = int(cfg.train.max_response_length)
    prompt = int(cfg.train.max_prompt_length)
    budget = max(2048, (prompt + response) * int(cfg.train.micro_batch_size_per_gpu))
    values = {
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "critic.strategy": "fsdp2",
        "actor_rollout_ref.actor.use_torch_compile": False,
        "actor_rollout_ref.rollout.max_model_len": prompt + response,
        "actor_rollout_ref.rollout.max_num_seqs": 64,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": budget,
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": budget,
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": budget,
        "critic.ppo_max_token_len_per_gpu": budget,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        "data.dataloader_num_workers": 0,  # 8 loader processes for 64 prompts cost memory and die noisily at exit
        # one agent-loop process, not verl's 8: each is a Ray actor that imports torch and verl (about 10 s of CPU on
        # this machine) and one serves the 16 rollouts of a step as well as 8 do
        "actor_rollout_ref.rollout.agent.num_workers": 1,
    }
    return values


# num_cpus, num_gpus: logical (module docstring); no dashboard: its nine head processes and their imports cost a CPU
# run seconds of both cores at start-up, and nothing reads it
RAY_INIT = {"num_cpus": 16, "num_gpus": 1, "include_dashboard": False}


def cpu_process_env(run_dir: Path) -> dict[str, str]:
    """What the CPU run's processes need in their environment (beside sarl.backends.verl.config.process_env's)."""
    return {
        "VERL_PLATFORM": PLATFORM,
        "SARL_ROLLOUT_SYNC_LOG": str(Path(run_dir) / SYNC_LOG),
        "SARL_ROLLOUT_SYNC_RANKS_LOG": str(Path(run_dir) / SYNC_RANKS_LOG),
        "TOKENIZERS_PARALLELISM": "false",
    }


def write_smoke_parquet(cfg: DictConfig, run_dir: Path) -> tuple[str, str]:
    """The data group's TRL prompts (the shipped smoke prompts) as verl's parquet layout in the run directory:
    train (every prompt) and val (the first `SMOKE_VAL_PROMPTS` held-out ones), with the group's prompt style."""
    import pandas as pd

    # deferred (both): a package's __init__ imports nothing of the project at module level (no re-exports)
    from sarl.data.build import math_prompt, record
    from sarl.runtime.files import read_jsonl, resolve_path

    out = Path(run_dir) / PARQUET_SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    style = {
        "name": cfg.data.name,
        "prompt_style": cfg.data.get("prompt_style"),
        "prompt_seed": cfg.data.get("prompt_seed") or 0,
    }
    prompt_of = math_prompt(style)
    paths = {"train": str(cfg.data.trl_train_files), "val": str(cfg.data.get("trl_val_files") or "")}
    files = {}
    for split, source in paths.items():
        if not source:
            continue
        rows = read_jsonl(resolve_path(source), f"data.trl_{split}_files")
        if split == "val":
            rows = rows[:SMOKE_VAL_PROMPTS]
        records = []
        for i, row in enumerate(rows):
            question = next(m["content"] for m in reversed(row["prompt"]) if m["role"] == "user")
            info = {**(row.get("extra_info") or {}), "index": i, "id": f"{split}-{i}"}
            prompt = [{"role": "user", "content": prompt_of(question, info["id"])}]
            rec = record(str(row.get("data_source", cfg.data.name)), split, "math", prompt, row["ground_truth"], info)
            rec["extra_info"] = json.loads(json.dumps(rec["extra_info"]))
            records.append(rec)
        path = out / f"{split}.parquet"
        pd.DataFrame(records).to_parquet(path)
        files[split] = str(path)
    return files["train"], files.get("val", "")


def with_cpu_settings(verl_cfg: DictConfig) -> DictConfig:
    """Ray's logical resources and no dashboard (RAY_INIT, a logical GPU per rank of the node; not in verl's schema:
    the keys are opened for them)."""
    from omegaconf import open_dict, read_write

    ray_init = verl_cfg.ray_kwargs.ray_init
    # one logical GPU per rank of this node (train.n_gpus_per_node): verl's pools ask for a GPU per worker. Several
    # nodes join the job's running cluster, whose nodes declared their resources when they started (`ray start
    # --num-cpus --num-gpus`, slurm.launcher); ray.init refuses resources when it connects to a cluster.
    values = {**RAY_INIT, "num_gpus": int(verl_cfg.trainer.n_gpus_per_node)}
    if int(verl_cfg.trainer.nnodes) > 1:
        values = {k: v for k, v in values.items() if k not in ("num_cpus", "num_gpus")}
    with read_write(ray_init), open_dict(ray_init):
        for key, value in values.items():
            ray_init[key] = value
    return verl_cfg


def sync_records(run_dir: Path, log: str = SYNC_LOG) -> list[dict[str, Any]]:
    """The weight syncs a CPU run's rollout logged (`SYNC_LOG`; `SYNC_RANKS_LOG`: each actor rank's part), in order."""
    path = Path(run_dir) / log
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
