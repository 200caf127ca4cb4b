"""The GPU memory plan and the embedding server's budget, from the real config.json of the paper's models
(shipped in tests/fixtures/models/: Qwen3-4B and Qwen3-Embedding-0.6B)."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip("verl")
from test_verl_attention import VERL_ROWS  # noqa: E402

from sarl.backends.verl import memory  # noqa: E402
from sarl.backends.verl.config import build_verl_config  # noqa: E402
from sarl.train import compose_train_config, experiment_name, planned_embedding_server  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "fixtures" / "models"
QWEN3_4B = MODELS / "qwen3_4b"
EMBEDDER = MODELS / "qwen3_embedding_0.6b"
H100 = 79.6  # GiB


def config(path):
    return json.loads((path / "config.json").read_text())


def row(exp, tmp_path, *extra):
    cfg, choices = compose_train_config([f"+exp={exp}", f"model.path={QWEN3_4B}", *extra])
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    return cfg, reward_cfg, build_verl_config(cfg, dict(reward_cfg), str(tmp_path), experiment_name(choices))


def test_parameter_counts_and_kv_cache_of_the_real_architectures():
    assert memory.parameter_count(config(QWEN3_4B)) == 4_022_468_096  # "4.0B" on the model card
    assert memory.parameter_count(config(EMBEDDER)) == 595_776_512  # "0.6B"
    # critic: the same trunk with a one-label head instead of the tied LM head: 2,560 weights + 1 bias more
    assert memory.parameter_count(config(QWEN3_4B), head="critic") == 4_022_468_096 + 2_561
    # 2 (K, V) x 28 layers x 8 KV heads x 128 x 2 bytes = 114,688 bytes = 112 KiB per token
    assert memory.kv_bytes_per_token(config(EMBEDDER), "bfloat16") == 114_688


def test_the_embedding_models_whole_context_does_not_fit_five_percent_of_an_h100():
    """vLLM's start-up check: one request of max_model_len tokens must fit beside the weights."""
    whole = memory.embedding_budget(config(EMBEDDER), 0.05, H100, None, "bfloat16")
    assert whole.max_model_len == 32768 and whole.kv_gib == pytest.approx(3.5)
    assert whole.budget_gib == pytest.approx(3.98) and not whole.ok
    capped = memory.embedding_budget(config(EMBEDDER), 0.05, H100, 8192, "bfloat16")
    assert capped.ok and capped.kv_gib == pytest.approx(0.875)
    assert capped.weights_gib == pytest.approx(595_776_512 * 2 / 2**30)
    assert 8192 < capped.max_len_that_fits < 32768


@pytest.mark.parametrize("exp", VERL_ROWS)
def test_every_rows_embedding_server_fits_its_budget(exp, tmp_path):
    cfg, reward_cfg, _ = row(exp, tmp_path, f"embedding.model={EMBEDDER}")
    server = planned_embedding_server(cfg, reward_cfg)
    if server is None:  # a reward without the HTTP embedder (ground truth, TTRL, EMPO)
        assert not reward_cfg.get("embedder")
        return
    s = cfg.embedding_server
    b = memory.embedding_budget(config(EMBEDDER), s.gpu_memory_utilization, H100, s.max_model_len, s.dtype)
    assert b.ok, b.summary()
    cmd = server.command()
    assert cmd[cmd.index("--max-model-len") + 1] == str(s.max_model_len)
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.05"
    assert server.env["CUDA_VISIBLE_DEVICES"] == "0"  # pinned: the GPU the plan charges


def test_the_embedding_server_follows_the_visible_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    cfg, reward_cfg, _ = row("grpo_sarl_math", tmp_path, "embedding_server.gpu=3")
    assert planned_embedding_server(cfg, reward_cfg).env["CUDA_VISIBLE_DEVICES"] == "7"


@pytest.mark.parametrize("exp", VERL_ROWS)
def test_every_rows_plan_fits_an_h100(exp, tmp_path):
    cfg, reward_cfg, v = row(exp, tmp_path)
    emb = cfg.embedding_server.gpu_memory_utilization if planned_embedding_server(cfg, reward_cfg) else None
    plan = memory.gpu_memory_plan(v, config(QWEN3_4B), H100, emb)
    assert plan.ok, plan.summary()
    assert plan.peak.name == "generation"


def test_worked_plan_of_ppo_with_the_structure_reward(tmp_path):
    """PPO + SARL on 8 GPUs: float32 actor and critic shards with Adam, a bfloat16 reference, vLLM at 0.7,
    the embedding server at 0.05 and four CUDA contexts (trainer, critic, vLLM, embedding server)."""
    cfg, reward_cfg, v = row("ppo_sarl_math", tmp_path)
    plan = memory.gpu_memory_plan(v, config(QWEN3_4B), H100, 0.05)
    items = {i.name: i.gib for i in plan.phases[0].items}
    n, c, gib = 4_022_468_096, 4_022_470_657, 2**30
    assert items["actor parameters"] == pytest.approx(n * 4 / 8 / gib)
    assert items["actor optimizer"] == pytest.approx(n * 8 / 8 / gib)
    assert items["reference parameters"] == pytest.approx(n * 2 / 8 / gib)
    assert items["critic parameters"] == pytest.approx(c * 4 / 8 / gib)
    assert items["vLLM rollout"] == pytest.approx(0.7 * H100)
    assert items["embedding server"] == pytest.approx(0.05 * H100)
    assert items["CUDA contexts"] == pytest.approx(4 * 0.5)
    total = 0.75 * H100 + (n * (4 + 8 + 2) + c * (4 + 8)) / 8 / gib + 2.0  # = 73.88 GiB
    assert plan.peak.gib == pytest.approx(total) and plan.fraction == pytest.approx(0.928, abs=0.001)
    grads = {i.name for i in plan.phases[1].items}
    assert {"actor gradients", "critic gradients"} <= grads and "vLLM rollout" not in grads


def test_an_overfull_plan_fails_and_says_which_share_fits(tmp_path):
    cfg, reward_cfg, v = row("ppo_sarl_math", tmp_path, "backend.rollout_gpu_memory_utilization=0.8")
    plan = memory.gpu_memory_plan(v, config(QWEN3_4B), H100, 0.05)
    assert not plan.ok and plan.fraction > memory.LIMIT
    fits = memory.rollout_utilization_that_fits(plan, 0.8)
    assert 0.7 < fits < 0.8
    _, _, v2 = row("ppo_sarl_math", tmp_path, f"backend.rollout_gpu_memory_utilization={fits}")
    assert memory.gpu_memory_plan(v2, config(QWEN3_4B), H100, 0.05).ok


def test_offloading_takes_the_shards_off_the_gpu(tmp_path):
    offload = "+backend.overrides={actor_rollout_ref.actor.fsdp_config.optimizer_offload: true}"
    _, _, v = row("grpo_sarl_math", tmp_path, offload)
    items = {i.name: i.gib for i in memory.gpu_memory_plan(v, config(QWEN3_4B), H100, 0.05).phases[0].items}
    assert items["actor optimizer"] == 0.0 and items["actor parameters"] > 0


def test_model_configs_are_found_locally_or_in_the_cache_only_without_download(tmp_path, monkeypatch):
    assert memory.find_model_config(str(QWEN3_4B))["hidden_size"] == 2560
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert memory.find_model_config("Qwen/Qwen3-4B") is None  # nothing cached, no download asked for
