"""CPU checks of the GPU suite, up to the GPU: which tests `pytest -m gpu` selects and why they skip here,
the one-GPU environment of its child processes, the exact `sarl.train` command lines of its verl runs
(dry run: the verl config they would launch, stage by stage for a pipeline), the parquet its fixture writes
read by verl's own dataset code, the reward metrics its runs expect, and the reader of the runs'
metrics.jsonl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_runs import (
    MAX_PROMPT_LENGTH,
    MAX_RESPONSE_LENGTH,
    NODE_ROWS,
    REPO,
    RL_STAGE,
    ROLLOUTS,
    ROWS,
    SFT_BATCH,
    SFT_STAGE,
    SMOKE_NAME,
    STEPS,
    VAL_PROMPTS,
    child_env,
    embedding_dim,
    embedding_model,
    embedding_server,
    gpu_device,
    gpu_devices,
    http_embedder,
    missing_metrics,
    missing_paper_inputs,
    paper_data_dir,
    read_step_metrics,
    rl_run_dir,
    smoke_rows,
    train_overrides,
    why_no_gpu,
)

GPU_TESTS = {
    "tests/gpu/test_gpu_embedding.py::test_embedding_server_answers_one_request_at_the_configured_budget",
    *(f"tests/gpu/test_gpu_verl.py::test_two_verl_steps_on_one_gpu[{row.name}]" for row in ROWS),
    *(f"tests/gpu/test_gpu_verl.py::test_verl_steps_on_several_gpus[{row.name}]" for row in NODE_ROWS),
}
SESSION_SCRIPT = REPO / "scripts" / "gpu_session.sh"

# -- selection, skipping, the GPU of a child process -----------------------------------------------


def pytest_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_pytest_m_gpu_selects_the_gpu_suite():
    """Every test of this directory that needs a GPU, and nothing else here. (Collecting this directory only: the
    whole tree's collection, which `pytest -m gpu` also does, is the suite's own and took minutes here.)"""
    proc = pytest_run("-m", "gpu", "--collect-only", "-q", "tests/gpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {line for line in proc.stdout.splitlines() if line.startswith("tests/gpu/")} == GPU_TESTS


def test_without_a_gpu_the_suite_is_skipped_with_the_reason():
    why = why_no_gpu()
    if why is None:
        pytest.skip("this machine has a CUDA GPU and vLLM: the GPU suite runs here")
    proc = pytest_run("-m", "gpu", "-rs", "tests/gpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(GPU_TESTS)} skipped" in proc.stdout and "passed" not in proc.stdout
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED [")]  # -rs, one per location
    assert skipped and all(line.endswith(why) for line in skipped), skipped
    assert sum(int(line.split("[")[1].split("]")[0]) for line in skipped) == len(GPU_TESTS)


def test_child_processes_get_one_gpu_and_their_own_ray(monkeypatch):
    monkeypatch.delenv("SARL_GPU_TEST_DEVICE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_device() == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # e.g. SLURM's allocation: its first GPU
    assert gpu_device() == "3"
    monkeypatch.setenv("SARL_GPU_TEST_DEVICE", "5")
    env = child_env(HF_HUB_OFFLINE="0")  # e.g. SARL_GPU_EMBED_MODEL from the hub
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["RAY_ADDRESS"] == "local"
    assert env["PYTHONPATH"].split(":")[0] == str(REPO) and env["HF_HUB_OFFLINE"] == "0"


def test_a_several_gpu_test_gets_its_first_gpus(monkeypatch):
    for name in ("SARL_GPU_TEST_DEVICES", "CUDA_VISIBLE_DEVICES", "SARL_GPU_TEST_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    assert gpu_devices(2) == "0,1" and gpu_devices(1) == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")  # SLURM's allocation
    assert gpu_devices(2) == "4,5" and child_env(gpu_devices(2))["CUDA_VISIBLE_DEVICES"] == "4,5"
    monkeypatch.setenv("SARL_GPU_TEST_DEVICES", "GPU-a, GPU-b")
    assert gpu_devices(2) == "GPU-a,GPU-b"


def test_the_gpu_session_script_runs_the_suite_and_the_several_gpu_runs():
    """scripts/gpu_session.sh (docs/gpu.md names it, with its expected time): valid bash; it installs the GPU lock;
    its step 2 fetches exactly the row's inputs (sarl.launch.inputs: the paper row's policy and embedding model by
    their exact ids, its train and validation sets); its `-k` split gives the one-GPU tests to step 5 and exactly
    the several-GPU runs to step 6. tests/slurm/test_gpu_session.py runs its steps 1-4."""
    text = SESSION_SCRIPT.read_text()
    assert subprocess.run(["bash", "-n", str(SESSION_SCRIPT)], capture_output=True).returncode == 0
    several = {t for t in GPU_TESTS if "several_gpus" in t}
    assert several == {f"tests/gpu/test_gpu_verl.py::test_verl_steps_on_several_gpus[{r.name}]" for r in NODE_ROWS}
    assert '-k "not several_gpus"' in text and "-k several_gpus" in text
    assert "LOCK=${LOCK:-requirements/gpu.lock}" in text and 'pip install -q -r "$LOCK"' in text  # CI's versions
    assert "-m sarl.launch.inputs --download" in text and "-m sarl.preflight" in text
    assert "ROW=${ROW:-grpo_sarl_math}" in text
    from sarl.launch.compose import compose_train_config
    from sarl.launch.inputs import row_inputs

    for row in (r for r in NODE_ROWS if r.paper_models):
        cfg = compose_train_config([f"+exp={row.exp}", "paths.data_dir=/data"])[0]
        needs = row_inputs(cfg)
        assert [n.name for n in needs if n.kind == "model"] == ["Qwen/Qwen3-4B", "Qwen/Qwen3-Embedding-0.6B"]
        assert [n.fetch for n in needs if n.kind == "data"] == [
            f"python -m sarl.data.prepare dataset={name} paths.data_dir=/data" for name in ("aime_1983_2024", "aime25")
        ]
    assert "scripts/gpu_session.sh" in (REPO / "docs" / "gpu.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("row", NODE_ROWS, ids=lambda r: r.name)
def test_the_several_gpu_runs_compose_for_their_gpus(row, tiny_policy_layout, smoke_parquet, tmp_path, monkeypatch):
    """The dry run of each several-GPU run: its GPUs, its rollout's tensor parallelism, and (the paper row) the
    paper's policy and embedding server, the row's own batch; a missing input is named with its command."""
    monkeypatch.setenv("SARL_GPU_TEST_DATA_DIR", str(tmp_path / "data"))
    assert paper_data_dir() == tmp_path / "data"
    v, command = dry_run(row, tiny_policy_layout, smoke_parquet, tmp_path)
    trainer, rollout = v["trainer"], v["actor_rollout_ref"]["rollout"]
    assert trainer["n_gpus_per_node"] == row.gpus and trainer["total_training_steps"] == STEPS
    assert rollout["tensor_model_parallel_size"] == (row.tensor_parallel or 2)  # verl's default on a node
    if not row.paper_models:
        assert v["actor_rollout_ref"]["model"]["path"] == str(tiny_policy_layout)
        return
    from sarl.launch.compose import compose_train_config

    own = compose_train_config([f"+exp={row.exp}"])[0]
    assert v["actor_rollout_ref"]["model"]["path"] == str(own.model.path)
    assert v["data"]["train_batch_size"] == own.train.train_batch_size
    assert v["data"]["train_files"] == str(tmp_path / "data" / own.data.name / "train.parquet")
    embedder = v["reward"]["custom_reward_function"]["reward_kwargs"]["reward"]["embedder"]
    assert embedder["model"] == own.embedding.model == "Qwen/Qwen3-Embedding-0.6B"  # SARL App. B.2
    why = missing_paper_inputs(row)
    assert why and f"python -m sarl.data.prepare dataset={own.data.name}" in why


# -- what the embedding test launches --------------------------------------------------------------


@pytest.mark.slow
def test_the_embedding_server_gets_the_configured_budget_and_one_gpu(tmp_path, monkeypatch):
    from sarl.launch.compose import compose_train_config
    from sarl.serving.http import HTTPEmbedder
    from sarl.structure.embed.local import bundled_minilm_path

    monkeypatch.delenv("SARL_GPU_EMBED_MODEL", raising=False)
    monkeypatch.setenv("SARL_GPU_TEST_DEVICE", "1")
    model = embedding_model()
    assert model == bundled_minilm_path()
    budget = compose_train_config([])[0].embedding_server
    server, dim = embedding_server(model, tmp_path / "server.log")
    cmd = server.command()
    assert dim == 384 and server.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert cmd[:3] == [budget.python or sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == model and cmd[cmd.index("--runner") + 1] == "pooling"
    assert float(cmd[cmd.index("--gpu-memory-utilization") + 1]) == budget.gpu_memory_utilization
    assert cmd[cmd.index("--dtype") + 1] == budget.dtype
    extra = list(budget.extra_args)
    assert cmd[len(cmd) - len(extra) :] == extra
    for length, served in ((8192, "512"), (256, "256")):  # cut to MiniLM's 512 positions
        server, _ = embedding_server(model, tmp_path / "server.log", f"embedding_server.max_model_len={length}")
        assert server.command()[server.command().index("--max-model-len") + 1] == served

    embedder = http_embedder("http://127.0.0.1:8000", model, dim)
    assert isinstance(embedder, HTTPEmbedder) and embedder.endpoint == "http://127.0.0.1:8000/v1/embeddings"
    assert embedder.model == model and embedder.dim == dim and embedder.extra_body == {"truncate_prompt_tokens": -1}


# -- what the verl runs launch ----------------------------------------------------------------------


def dry_run(row, policy, data, root) -> tuple[dict, str]:
    """`python -m sarl.train <the GPU test's overrides> train.dry_run=true`: verl's config (resolved) and
    the launch command."""
    from omegaconf import OmegaConf

    proc = subprocess.run(
        [sys.executable, "-m", "sarl.train", *train_overrides(row, policy, data, root), "train.dry_run=true"],
        cwd=root,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return OmegaConf.to_container(OmegaConf.create(proc.stdout), resolve=True), proc.stderr.strip().splitlines()[-1]


def pipeline_dry_run(row, policy, data, root, run_stage) -> None:
    """`run_stage(cfg, choices, overrides)` on every stage of the dry run of a pipeline row, each composed as
    `python -m sarl.train <the GPU test's overrides> train.dry_run=true` composes it (sarl.launch.pipeline)."""
    from sarl.launch.compose import compose_user_config
    from sarl.launch.pipeline import run_pipeline, split_stage_overrides
    from sarl.runtime.runs import experiment_name

    common, per_stage = split_stage_overrides([*train_overrides(row, policy, data, root), "train.dry_run=true"])
    cfg, choices = compose_user_config(common)
    assert run_pipeline(cfg, experiment_name(choices), common, per_stage, root / row.name, run_stage) == 0


def stage_dry_runs(row, policy, data, root, capsys) -> dict[str, tuple[dict, str]]:
    """What the dry run prints for each run it would launch, by stage (RL_STAGE alone unless the row is a
    pipeline): verl's config (resolved) and the launch command."""
    from omegaconf import OmegaConf

    from sarl.train import run

    if not row.pipeline:
        return {RL_STAGE: dry_run(row, policy, data, root)}
    printed = {}

    def dry_run_stage(cfg, choices, overrides) -> int:
        capsys.readouterr()
        rc = run(cfg, choices, overrides)
        out, err = capsys.readouterr()
        config = OmegaConf.to_container(OmegaConf.create(out), resolve=True)
        printed[Path(cfg.run_dir).name] = config, err.strip().splitlines()[-1]
        return rc

    pipeline_dry_run(row, policy, data, root, dry_run_stage)
    return printed


def rl_config(row, policy, data, root):
    """The composed config of the row's RL run (a pipeline's RL stage)."""
    from sarl.launch.compose import compose_train_config

    if not row.pipeline:
        return compose_train_config(train_overrides(row, policy, data, root))[0]
    stages = {}

    def keep(cfg, choices, overrides) -> int:
        stages[Path(cfg.run_dir).name] = cfg
        return 0

    pipeline_dry_run(row, policy, data, root, keep)
    return stages[RL_STAGE]


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_the_verl_runs_compose_and_pass_verls_checks_for_one_gpu(
    row, tiny_policy_layout, smoke_parquet, tmp_path, capsys
):
    from transformers import AutoConfig

    from sarl.launch.compose import compose_train_config

    runs = stage_dry_runs(row, tiny_policy_layout, smoke_parquet, tmp_path, capsys)
    v, command = runs[RL_STAGE]
    trainer, rollout, actor = v["trainer"], v["actor_rollout_ref"]["rollout"], v["actor_rollout_ref"]["actor"]
    run_dir = rl_run_dir(row, tmp_path)
    assert f"-m sarl.backends.verl.main --config-path {run_dir} --config-name verl_trainer" in command
    assert not (tmp_path / row.name).exists()  # a dry run writes nothing
    # one GPU: the trainer's, the rollout's and vLLM's tensor parallelism
    assert trainer["nnodes"] == 1 and trainer["n_gpus_per_node"] == 1
    assert rollout["n_gpus_per_node"] == 1 and rollout["tensor_model_parallel_size"] == 1
    # two steps, a checkpoint and a validation at the last, metrics in the run's metrics.jsonl (verl's file logger)
    assert trainer["total_training_steps"] == STEPS and trainer["val_before_train"] is False
    assert trainer["save_freq"] == STEPS and trainer["test_freq"] == STEPS
    assert trainer["logger"] == ["console", "file"] and trainer["default_local_dir"] == f"{run_dir}/checkpoints"
    assert trainer["use_v1"] is True and trainer["v1"]["trainer_mode"] == "sarl"
    # the policy (a pipeline's RL stage: the SFT stage's checkpoint), the data, vLLM rollouts
    start = tmp_path / row.name / SFT_STAGE / "final"  # every finished stage's model (sarl.runtime.checkpoints)
    assert v["actor_rollout_ref"]["model"]["path"] == str(start if row.pipeline else tiny_policy_layout)
    assert v["data"]["train_files"] == str(smoke_parquet["train"])
    assert v["data"]["val_files"] == str(smoke_parquet["test"])
    assert rollout["name"] == "vllm" and rollout["prompt_length"] == MAX_PROMPT_LENGTH
    assert rollout["response_length"] == MAX_RESPONSE_LENGTH
    assert rollout["n"] == row.n_trained and trainer["v1"]["sarl"]["n_votes"] == ROLLOUTS
    assert actor["use_kl_loss"] is True  # actor/kl_loss is logged
    # the algorithm, the memory share of the rollout
    assert v["critic"]["enable"] is row.critic
    assert v["algorithm"]["adv_estimator"] == ("gae" if row.critic else "grpo")
    own = compose_train_config([f"+exp={row.exp}"])[0]  # the row as its exp file has it
    share = own.backend.rollout_gpu_memory_utilization if row.rollout_share is None else row.rollout_share
    assert rollout["gpu_memory_utilization"] == share
    # the reward: on whole groups in the trainer, or per response in verl's reward workers
    function = v["reward"]["custom_reward_function"]
    reward = function["reward_kwargs"]["reward"]
    assert reward["_target_"] == own.reward._target_
    if row.group_reward:
        assert function["path"] is None and v["reward"]["num_workers"] == 0
    else:
        assert function["path"] == "pkg://sarl.backends.verl.reward"
        workers = own.backend.reward_num_workers if row.reward_workers is None else row.reward_workers
        assert v["reward"]["num_workers"] == workers
    embedder = reward.get("embedder")
    if row.embedding == "vllm_server":  # the server sarl.train starts on this node, its URL planned
        model = embedding_model()
        assert embedder["_target_"] == "sarl.serving.http.HTTPEmbedder"
        assert embedder["url"].startswith("http://127.0.0.1:")
        assert embedder["model"] == model and embedder["dim"] == embedding_dim(model)
    elif embedder is not None:
        assert embedder["_target_"] == "sarl.structure.embed.local.SentenceTransformerEmbedder"
    if "layers" in reward:  # an attention reward reads layers the policy has
        n_layers = AutoConfig.from_pretrained(tiny_policy_layout).num_hidden_layers
        assert reward["model"] == str(tiny_policy_layout) and all(-n_layers <= i < n_layers for i in reward["layers"])

    if row.pipeline:  # the SFT stage: verl's SFT trainer under torchrun on the GPU, its checkpoint for the RL stage
        sft, sft_command = runs[SFT_STAGE]
        sft_dir = tmp_path / row.name / SFT_STAGE
        assert f"--nproc_per_node=1 -m verl.trainer.sft_trainer --config-path {sft_dir} " in sft_command
        assert sft["model"]["path"] == str(tiny_policy_layout)
        assert sft["trainer"]["nnodes"] == 1 and sft["trainer"]["n_gpus_per_node"] == 1
        assert sft["trainer"]["total_training_steps"] == STEPS and sft["data"]["train_batch_size"] == SFT_BATCH
        assert "file" in sft["trainer"]["logger"] and sft["trainer"]["default_local_dir"] == f"{sft_dir}/checkpoints"
        assert "hf_model" in sft["checkpoint"]["save_contents"]


@pytest.mark.slow
def test_the_embedding_server_of_a_run_shares_its_gpu(tiny_policy_layout, smoke_parquet, tmp_path, monkeypatch):
    """The server sarl.train starts for the server row: on the first GPU the run sees (the one its rollout uses
    first), at the configured budget."""
    from omegaconf import OmegaConf

    from sarl.serving.auto import planned_embedding_server

    (row,) = [r for r in ROWS if r.embedding == "vllm_server"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # child_env gives the run one GPU
    cfg = rl_config(row, tiny_policy_layout, smoke_parquet, tmp_path)
    server = planned_embedding_server(cfg, OmegaConf.to_container(cfg.reward, resolve=True))
    cmd = server.command()
    assert server.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert float(cmd[cmd.index("--gpu-memory-utilization") + 1]) == cfg.embedding_server.gpu_memory_utilization


@pytest.mark.slow
def test_the_parquet_loads_with_verls_dataset_and_renders_the_smoke_prompts(
    tiny_policy_layout, smoke_parquet, tmp_path
):
    """The trainer's own path (trainer/ppo/v1/trainer_base.py `_init_tokenizer`, `_init_dataloader`): the model
    config's tokenizer, `create_rl_dataset` on verl's `data` config, then the prompt rendered by the agent
    loop's continuous-token builder (experimental/agent_loop/agent_loop.py)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from sarl.backends.verl.config import build_verl_config
    from sarl.launch.compose import compose_train_config

    cfg, _ = compose_train_config(train_overrides(ROWS[0], tiny_policy_layout, smoke_parquet, tmp_path))
    v = build_verl_config(cfg, OmegaConf.to_container(cfg.reward, resolve=True), str(tmp_path), ROWS[0].exp)
    OmegaConf.resolve(v)
    model = omega_conf_to_dataclass(v.actor_rollout_ref.model)
    builder = create_continuous_token_builder(model.tokenizer, hf_model_type=model.hf_config.model_type)
    rows = smoke_rows()
    for files, is_train, expected in (
        (v.data.train_files, True, rows[:-VAL_PROMPTS]),
        (v.data.val_files, False, rows[-VAL_PROMPTS:]),
    ):
        dataset = create_rl_dataset(files, v.data, model.tokenizer, model.processor, is_train=is_train)
        assert isinstance(dataset, RLHFDataset) and len(dataset) == len(expected)  # no prompt filtered out
        for i, row in enumerate(expected):
            item = dataset[i]
            assert item["raw_prompt"] == row["prompt"] and item["data_source"] == SMOKE_NAME
            assert item["reward_model"]["ground_truth"] == [row["ground_truth"]]
            ids = builder.build_initial_tokens(item["raw_prompt"])
            chat = f"<|im_start|>user\n{row['prompt'][0]['content']}<|im_end|>\n<|im_start|>assistant\n"
            assert ids == model.tokenizer(chat, add_special_tokens=False)["input_ids"]
            assert model.tokenizer.decode(ids) == chat and len(ids) <= MAX_PROMPT_LENGTH


def with_tokenizer(reward_cfg, path: str):
    """`reward_cfg` with every `tokenizer` key (the reward's and its components') set to `path`."""
    if isinstance(reward_cfg, dict):
        return {k: path if k == "tokenizer" and v else with_tokenizer(v, path) for k, v in reward_cfg.items()}
    return reward_cfg


@pytest.mark.slow
@pytest.mark.parametrize("row", [r for r in ROWS if r.embedding == "local"], ids=lambda r: r.name)
def test_the_runs_reward_logs_the_metrics_the_test_expects(row, tiny_policy_layout, smoke_parquet, tmp_path):
    """The row's reward, built from its composed config (of its RL stage), on one group of shipped reasoning
    traces: its `reward/*/mean` metrics (sarl.contract.metrics.row_metrics, what SarlTrainer logs) include
    the ones the GPU test asserts. (The server row's reward is grpo_sarl's with the HTTP client of the server
    that only its GPU run starts.)"""
    from omegaconf import OmegaConf

    from sarl.backends.verl.reward import reward_from_config
    from sarl.contract.metrics import row_metrics, score_rollouts
    from sarl.contract.reward import RolloutBatch
    from sarl.smoke import DATA_DIR

    cfg = rl_config(row, tiny_policy_layout, smoke_parquet, tmp_path)
    traces = [json.loads(line) for line in (DATA_DIR / "traces.jsonl").read_text().splitlines()[:ROLLOUTS]]
    batch = RolloutBatch(
        prompts=[t["prompt"][0]["content"] for t in traces],
        responses=[t["completion"][0]["content"] for t in traces],
        group_ids=["g"] * ROLLOUTS,
        ground_truths=[[t["ground_truth"]] for t in traces],  # correct: MaxFlow's graph is of correct responses
        data_sources=[SMOKE_NAME] * ROLLOUTS,
        extra_info=[{}] * ROLLOUTS,
    )
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    if row.pipeline:  # the RL stage's policy is the SFT stage's checkpoint, planned, not written: the tiny policy's
        reward_cfg = with_tokenizer(reward_cfg, str(tiny_policy_layout))  # tokenizer stands in for its own
    _, infos = score_rollouts(reward_from_config(reward_cfg), batch)
    metrics = row_metrics(infos)
    expected = tuple(m for m in row.metrics if m.startswith("reward/") and m.endswith("/mean"))
    assert expected and missing_metrics(metrics, expected) == []
    assert metrics["reward/failed"] == 0


@pytest.mark.slow
def test_the_metrics_reader_merges_the_lines_of_a_step(tmp_path, monkeypatch):
    """verl's file logger as a run writes it (sarl.backends.verl.config.process_env: the run directory's
    metrics.jsonl): a step's training and validation metrics on two lines, read as one step."""
    from verl.utils.tracking import Tracking

    from sarl.backends.verl.config import METRICS_FILE

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / METRICS_FILE))
    tracking = Tracking(project_name="sarl", experiment_name="gpu", default_backend=["file"])
    for step in (1, 2):
        tracking.log({"actor/kl_loss": 0.01 * step, "timing_s/step": 3.5, "reward/sr/mean": float("nan")}, step=step)
    tracking.log({f"val-core/{SMOKE_NAME}/acc/mean@1": 0.25}, step=2)
    tracking.finish()
    assert len((tmp_path / METRICS_FILE).read_text().splitlines()) == 3
    steps = read_step_metrics(tmp_path)
    assert sorted(steps) == [1, 2] and steps[2]["actor/kl_loss"] == pytest.approx(0.02)
    assert steps[2][f"val-core/{SMOKE_NAME}/acc/mean@1"] == 0.25
    assert missing_metrics(steps[1], ("actor/kl_loss", "timing_s/step")) == []
    # NaN is written as null (orjson); an absent metric reads as None too
    assert missing_metrics(steps[1], ("reward/sr/mean", "actor/entropy")) == [
        "reward/sr/mean=None",
        "actor/entropy=None",
    ]


def test_the_node_runs_own_timeout_fires_before_pytests():
    """pytest's timeout (pyproject: 1,200 s) is below a GPU run's own (1,800 s): each GPU run test carries a pytest
    timeout above its run's timeout plus the grace, so that the run's timeout fires first and stops the run."""
    import ast

    source = (Path(__file__).parent / "test_gpu_verl.py").read_text()
    tree = ast.parse(source)
    run_timeout = next(
        n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "RUN_TIMEOUT_S"
    )
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    runs = [t for t in tests if "run_and_check" in ast.unparse(t)]
    assert runs
    for test in runs:
        marks = [ast.unparse(d) for d in test.decorator_list if "timeout" in ast.unparse(d)]
        assert marks == ["pytest.mark.timeout(RUN_TIMEOUT_S + 300)"], (test.name, marks)
    assert run_timeout + 300 > run_timeout + 120  # the grace run_train gives the run after its SIGINT


def test_a_run_whose_wait_is_interrupted_leaves_no_process_behind(tmp_path, monkeypatch):
    """pytest-timeout's exception (or Ctrl-C) raised while run_train waits: the run's whole process group is
    stopped before the exception goes on (it held all 8 GPUs of the node before)."""
    import signal
    import subprocess
    import sys

    from gpu_runs import run_train

    pids = tmp_path / "pids"
    fake = tmp_path / "python"  # stands for `python -m sarl.train`: ignores SIGINT, and a child holds on too
    fake.write_text(f"#!/bin/sh\ntrap '' INT\nsleep 600 &\necho $$ $! > {pids}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))

    class Timeout(Exception):
        pass

    def fire(signum, frame):
        raise Timeout("pytest-timeout")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(2)
    try:
        with pytest.raises(Timeout):
            run_train([], {"PATH": "/usr/bin:/bin"}, tmp_path / "run.log", timeout_s=600, grace_s=1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    for pid in map(int, pids.read_text().split()):
        state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
        assert state in ("", "Z"), f"process {pid} still there ({state})"


def test_a_paper_input_with_a_config_but_no_weights_is_missing(tmp_path, monkeypatch):
    """A cached config.json is not a model: the node run would start offline with no weights."""
    from sarl.runtime.weights import weights_cached

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert not weights_cached(str(model))
    (model / "model.safetensors").write_bytes(b"x")
    assert weights_cached(str(model))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "models--org--m" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "models--org--m" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--m" / "refs" / "main").write_text("abc")
    (snapshot / "config.json").write_text("{}")
    assert not weights_cached("org/m")
    (snapshot / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}'
    )
    (snapshot / "s1.safetensors").write_bytes(b"x")
    assert not weights_cached("org/m")  # a shard is missing
    (snapshot / "s2.safetensors").write_bytes(b"x")
    assert weights_cached("org/m")


@pytest.mark.parametrize("found", ["none", "3.10"])
def test_the_session_checks_its_python_first_and_says_how_to_get_3_11(found, tmp_path):
    """The lock is resolved for Python 3.11: without it (RHEL 9 has 3.9, Ubuntu 22.04 3.10) step 1 stops at once,
    with one line naming how to get it, before anything is written."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "STEPS": "1"}
    if found == "3.10":
        fake = tmp_path / "python3.10"
        fake.write_text("#!/bin/sh\necho 3.10\n")
        fake.chmod(0o755)
        env["SARL_PYTHON"] = str(fake)
    else:
        env["SARL_PYTHON"] = "python3.11-not-here"
    before = set((REPO / "runs").glob("gpu_session/*")) if (REPO / "runs").exists() else set()
    proc = subprocess.run(["bash", str(SESSION_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and line.startswith("gpu_session.sh: ") and "python/3.11" in line, proc.stderr
    assert ("is Python 3.10" in line) if found == "3.10" else ("no Python 3.11 here" in line)
    after = set((REPO / "runs").glob("gpu_session/*")) if (REPO / "runs").exists() else set()
    assert after == before  # nothing written
