"""The GPU memory plan and the embedding server's budget, from the real config.json of the paper's models
(shipped in tests/fixtures/models/: Qwen3-4B and Qwen3-Embedding-0.6B; the other backbones' architecture
fields below, checked against their model cards' parameter counts)."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from testkit import stage_overrides, verl_config_for, verl_paper_rows

pytest.importorskip("verl")

from baselines.maxflow.preflight import maxflow_gpu_items, maxflow_nodes  # noqa: E402
from sarl import preflight  # noqa: E402
from sarl.backends.verl import memory  # noqa: E402
from sarl.backends.verl import preflight as verl_preflight  # noqa: E402
from sarl.launch.compose import compose_train_config
from sarl.runtime import memory as runtime_memory  # noqa: E402
from sarl.runtime.models import find_model_config  # noqa: E402
from sarl.runtime.rows import experiments  # noqa: E402
from sarl.serving.auto import planned_embedding_server

MODELS = Path(__file__).resolve().parents[2] / "fixtures" / "models"
QWEN3_4B = MODELS / "qwen3_4b"
EMBEDDER = MODELS / "qwen3_embedding_0.6b"
H100 = 79.6  # GiB
GIB = 2**30
N_4B = 4_022_468_096


def config(path):
    return json.loads((path / "config.json").read_text())


# Qwen3-8B(-Base): Qwen3-4B's layout, wider, with an untied LM head; R1-Distill-Qwen-1.5B/7B: Qwen2.5-Math's.
QWEN3_8B = {**config(QWEN3_4B), "hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False}
R1_1_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
R1_7B = {
    **R1_1_5B,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
}
R1_7B["vocab_size"] = 152064
HUB = {  # conf/model/*.yaml paths -> architecture
    "Qwen/Qwen3-4B": config(QWEN3_4B),
    "Qwen/Qwen3-4B-Base": config(QWEN3_4B),
    "Qwen/Qwen3-8B-Base": QWEN3_8B,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": R1_1_5B,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": R1_7B,
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A directory with the config.json of each model a row names (no weights), by its Hub id."""
    out = {}
    for repo, cfg in HUB.items():
        d = tmp_path_factory.mktemp(repo.replace("/", "_"))
        (d / "config.json").write_text(json.dumps(cfg))
        out[repo] = d
    return out


def row(exp, tmp_path, *extra, model=QWEN3_4B):
    """(cfg, reward config, verl config) of `+exp=<exp>` and `extra` on the policy `model` (its config.json)."""
    cfg, v = verl_config_for([f"+exp={exp}", *extra], tmp_path, model, validate=False)
    return cfg, OmegaConf.to_container(cfg.reward, resolve=True), v


def rl_stage(exp, tmp_path, model_dirs, *extra):
    """A row's RL run as sarl.train launches it (a pipeline's `rl` stage), on its own model's config."""
    model = model_dirs[compose_train_config([f"+exp={exp}", *extra])[0].model.path]
    return row(exp, tmp_path, *stage_overrides(exp, "rl"), *extra, f"embedding.model={EMBEDDER}", model=model)


def plan_of(cfg, reward_cfg, v, policy=None):
    items, problems = maxflow_gpu_items(reward_cfg, *verl_preflight.reward_processes(v))
    assert not problems
    gpu, shared = verl_preflight.shared_gpu_items(cfg, reward_cfg, H100, items)
    return gpu, shared, memory.gpu_memory_plan(v, policy or config(Path(cfg.model.path)), H100, shared)


def test_parameter_counts_and_kv_cache_of_the_real_architectures():
    assert runtime_memory.parameter_count(config(QWEN3_4B)) == N_4B  # "4.0B" on the model card
    assert runtime_memory.parameter_count(config(EMBEDDER)) == 595_776_512  # "0.6B"
    # critic: the same trunk with a one-label head instead of the tied LM head: 2,560 weights + 1 bias more
    assert runtime_memory.parameter_count(config(QWEN3_4B), head="critic") == N_4B + 2_561
    assert runtime_memory.parameter_count(config(QWEN3_4B), head="base") == N_4B  # tied: the head adds no parameter
    assert runtime_memory.parameter_count(QWEN3_8B) == 8_190_735_360  # "8.2B"
    assert runtime_memory.parameter_count(R1_1_5B) == 1_777_088_000  # "1.78B"
    assert runtime_memory.parameter_count(R1_1_5B, head="base") == 1_777_088_000 - 151_936 * 1536  # no LM head
    assert runtime_memory.parameter_count(R1_7B) == 7_615_616_512  # "7.62B"
    # 2 (K, V) x 28 layers x 8 KV heads x 128 x 2 bytes = 114,688 bytes = 112 KiB per token
    assert memory.kv_bytes_per_token(config(EMBEDDER), "bfloat16") == 114_688


def test_dtypes_are_spelt_as_verl_and_config_json_spell_them():
    assert runtime_memory.dtype_bytes("fp32") == runtime_memory.dtype_bytes("float32") == 4
    assert (
        runtime_memory.dtype_bytes("bf16")
        == runtime_memory.dtype_bytes("bfloat16")
        == runtime_memory.dtype_bytes("fp16")
        == 2
    )
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        runtime_memory.dtype_bytes("int4")
    assert runtime_memory.config_dtype(config(QWEN3_4B)) == "bfloat16" and runtime_memory.config_dtype({}) == "float32"


def test_the_embedding_models_whole_context_does_not_fit_five_percent_of_an_h100():
    """vLLM's start-up check: one request of max_model_len tokens must fit beside the weights."""
    whole = memory.embedding_budget(config(EMBEDDER), 0.05, H100, None, "bfloat16")
    assert whole.max_model_len == 32768 and whole.kv_gib == pytest.approx(3.5)
    assert whole.budget_gib == pytest.approx(3.98) and not whole.ok
    capped = memory.embedding_budget(config(EMBEDDER), 0.05, H100, 8192, "bfloat16")
    assert capped.ok and capped.kv_gib == pytest.approx(0.875)
    assert capped.weights_gib == pytest.approx(595_776_512 * 2 / 2**30)
    assert 8192 < capped.max_len_that_fits < 32768


# The embedding models the rows name -> architecture. Qwen3-Embedding-4B (evol_rl_paper, EVOL-RL App. C.5) is Qwen3-4B's
# trunk: the model card's 4B parameters, 36 layers and 2,560 dimensions.
EMBEDDERS = {"Qwen/Qwen3-Embedding-0.6B": config(EMBEDDER), "Qwen/Qwen3-Embedding-4B": config(QWEN3_4B)}
SHARES = {"Qwen/Qwen3-Embedding-0.6B": 0.05, "Qwen/Qwen3-Embedding-4B": 0.13}  # SARL App. B.2's 5%; the 4B's 13%


@pytest.mark.parametrize("exp", verl_paper_rows())
def test_every_rows_embedding_server_fits_its_budget(exp, tmp_path):
    """Each row's own embedding model, at the share its row gives it, on an 80 GB H100."""
    cfg, reward_cfg, _ = row(exp, tmp_path)
    server = planned_embedding_server(cfg, reward_cfg)
    if server is None:  # a reward without the HTTP embedder (ground truth, TTRL, EMPO)
        assert not reward_cfg.get("embedder")
        return
    s = cfg.embedding_server
    b = memory.embedding_budget(EMBEDDERS[s.model], s.gpu_memory_utilization, H100, s.max_model_len, s.dtype)
    assert b.ok, b.summary()
    cmd = server.command()
    assert cmd[cmd.index("--model") + 1] == s.model == cfg.embedding.model
    assert cmd[cmd.index("--max-model-len") + 1] == str(s.max_model_len)
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == str(SHARES[s.model])
    assert server.env["CUDA_VISIBLE_DEVICES"] == "0"  # pinned: the GPU the plan charges


def test_the_4b_embedder_does_not_fit_the_0_6bs_share():
    """Why evol_rl_paper gives Qwen3-Embedding-4B 13% of the GPU: 7.5 GiB of weights alone exceed 5% (4.0 GiB)."""
    assert not memory.embedding_budget(EMBEDDERS["Qwen/Qwen3-Embedding-4B"], 0.05, H100, 8192, "bfloat16").ok
    assert not memory.embedding_budget(EMBEDDERS["Qwen/Qwen3-Embedding-4B"], 0.12, H100, 8192, "bfloat16").ok


def test_the_embedding_server_follows_the_visible_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    cfg, reward_cfg, _ = row("grpo_sarl_math", tmp_path, "embedding_server.gpu=3")
    assert planned_embedding_server(cfg, reward_cfg).env["CUDA_VISIBLE_DEVICES"] == "7"


VERL_EXPS = [
    e
    for e in experiments()
    if compose_train_config([f"+exp={e}"])[0].backend.name == "verl"
    and compose_train_config([f"+exp={e}"])[0].algorithm.name != "sft"
]
# The rows that commit a smaller rollout share than the 0.7 of conf/backend/verl.yaml (the largest share within the
# 90% target, each with its reason in its conf/exp file): beside Qwen3-4B's MaxFlow attention model on GPU 0, the
# PPO critic with the embedding server, R1-Distill-Qwen-7B's actor on 4 GPUs (and its attention model); EVOL-RL's
# 4B embedder.
SMALLER_SHARE = {
    "grpo_maxflow_math": 0.61,
    "grpo_lcs_maxflow_math": 0.61,
    "ppo_sarl_math": 0.65,
    "ppo_sarl_open": 0.65,
    "dr_grpo_paper": 0.6,
    "maxflow_freeform_paper": 0.35,
}


@pytest.mark.parametrize("exp", VERL_EXPS)
def test_every_rows_plan_fits_90_percent_of_an_h100_at_its_committed_settings(exp, tmp_path, model_dirs):
    """Each verl row (a pipeline: its RL stage) on its own model's config, every term counted; a row that commits
    a smaller share commits the largest that fits (0.01 more does not)."""
    cfg, reward_cfg, v = rl_stage(exp, tmp_path, model_dirs)
    (check, *_) = verl_preflight.check_memory_plan(cfg, v, reward_cfg)
    assert check.name == "memory plan" and check.detail.startswith("GPU 0: ")
    _, _, plan = plan_of(cfg, reward_cfg, v)
    assert plan.peak.name == "generation"
    assert {"log-probs", "update"} <= {p.name for p in plan.phases}
    assert check.ok and plan.fraction <= 0.90, check.detail
    share = float(v.actor_rollout_ref.rollout.gpu_memory_utilization)
    if exp in SMALLER_SHARE:
        assert share == SMALLER_SHARE[exp]
        more = f"backend.rollout_gpu_memory_utilization={share + 0.01:.2f}"
        cfg2, reward_cfg2, v2 = rl_stage(exp, tmp_path, model_dirs, more)
        (bigger, *_) = verl_preflight.check_memory_plan(cfg2, v2, reward_cfg2)
        named = f"backend.rollout_gpu_memory_utilization={share} (now {share + 0.01:.2f})"
        assert not bigger.ok and named in bigger.fix
    else:
        assert share in (0.7, 0.65), exp  # conf/backend/verl.yaml's 0.7; evol_rl rows' 0.65 (decisions §2.4)


def test_worked_plan_of_ppo_with_the_structure_reward(tmp_path):
    """PPO + SARL on 8 GPUs: float32 actor and critic shards with Adam (model_dtype fp32 in verl's config), the
    reference's float32 shard on the host, vLLM at the row's 0.65, the embedding server at 0.05, four CUDA contexts
    (trainer, critic, vLLM, embedding server) and two NCCL communicators (the actor's and the critic's FSDP)."""
    cfg, reward_cfg, v = row("ppo_sarl_math", tmp_path, f"embedding.model={EMBEDDER}")
    gpu, shared, plan = plan_of(cfg, reward_cfg, v)
    assert gpu == 0 and [i.name for i in shared] == ["embedding server"]
    items = {i.name: i for i in plan.phase("generation").items}
    c = N_4B + 2_561
    assert items["actor parameters"].gib == pytest.approx(N_4B * 4 / 8 / GIB)
    assert items["actor optimizer"].gib == pytest.approx(N_4B * 8 / 8 / GIB)
    assert items["reference parameters"].gib == 0.0
    assert items["reference parameters"].note == "fp32 shard of 1.9 GiB on the host (forward-only: CPU offload)"
    assert items["critic parameters"].gib == pytest.approx(c * 4 / 8 / GIB)
    assert items["vLLM rollout"].gib == pytest.approx(0.65 * H100)
    assert items["embedding server"].gib == pytest.approx(0.05 * H100)
    assert items["CUDA contexts"].gib == pytest.approx(4 * 0.5)
    assert items["NCCL buffers"].gib == pytest.approx(2 * runtime_memory.nccl_gib(8)) == pytest.approx(2.22, abs=0.01)
    assert "vLLM CUDA graphs" not in items  # inside its share while it generates
    total = 0.70 * H100 + (N_4B + c) * (4 + 8) / 8 / GIB + 2.0 + 2 * runtime_memory.nccl_gib(8)  # = 71.18 GiB
    assert plan.peak.gib == pytest.approx(total) and plan.fraction == pytest.approx(0.894, abs=0.001)
    update = {i.name: i for i in plan.phase("update").items}
    assert {"actor gradients", "critic gradients", "actor logits"} <= set(update) and "vLLM rollout" not in update
    assert update["vLLM CUDA graphs"].gib == memory.VLLM_CUDA_GRAPH_GIB  # its graph pool stays while it sleeps


def test_the_logits_of_one_micro_batch(tmp_path):
    """16,384 tokens (use_dynamic_bsz's ppo_max_token_len_per_gpu) x Qwen3's 151,936 words x 4 bytes = 9.27 GiB,
    in each phase that runs the policy's forward pass."""
    assert memory.logits_gib(16384, 151936) == pytest.approx(16384 * 151936 * 4 / GIB) == pytest.approx(9.27, abs=0.01)
    cfg, reward_cfg, v = row("grpo_gt_math", tmp_path)
    _, _, plan = plan_of(cfg, reward_cfg, v)
    assert [p.name for p in plan.phases] == ["generation", "log-probs", "reference", "update"]
    logits = {p.name: [i.gib for i in p.items if i.name.endswith("logits")] for p in plan.phases}
    assert logits["generation"] == []  # vLLM's own logits are inside its share
    for name in ("log-probs", "reference", "update"):
        assert logits[name] == [pytest.approx(9.27, abs=0.01)]
    update = plan.phase("update")  # 1.87 + 3.75 + 1.87 (gradients) + 9.27 + 1.0 (two contexts) + NCCL + vLLM's graphs
    assert update.gib == pytest.approx(N_4B * 16 / 8 / GIB + 9.27 + 1.0 + 1.11 + 1.0, abs=0.01)
    # the budget of each phase: the reference's and the recompute's follow the actor's unless set
    actor_budget = "+backend.overrides={actor_rollout_ref.actor.ppo_max_token_len_per_gpu: 8192}"
    _, _, half = plan_of(*row("grpo_gt_math", tmp_path, actor_budget))
    assert [i.gib for p in half.phases for i in p.items if i.name.endswith("logits")] == [pytest.approx(4.64, 0.01)] * 3
    recompute = "+backend.overrides={actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu: 8192}"
    _, _, own = plan_of(*row("grpo_gt_math", tmp_path, recompute))
    assert [i.gib for p in own.phases for i in p.items if i.name.endswith("logits")] == [
        pytest.approx(4.64, 0.01),
        pytest.approx(9.27, 0.01),
        pytest.approx(9.27, 0.01),
    ]
    # without use_dynamic_bsz: micro_batch_size_per_gpu whole sequences of prompt + response tokens
    assert memory.micro_batch_tokens(False, 16384, 4, 1024 + 8192) == 4 * 9216
    cfg, reward_cfg, v = row("grpo_gt_math", tmp_path, "backend.use_dynamic_bsz=false")
    _, _, fixed = plan_of(cfg, reward_cfg, v)
    assert not fixed.ok and fixed.peak.name == "update"  # 32 x 9,216 tokens of logits: 167 GiB
    assert "a smaller token budget per micro-batch" in verl_preflight.memory_plan_fix(fixed, v, [])
    # verl's fused kernels compute log-probs without the full-vocabulary logits
    fused = "+backend.overrides={actor_rollout_ref.model.use_fused_kernels: true}"
    _, _, f = plan_of(*row("grpo_gt_math", tmp_path, fused))
    assert all(i.gib == 0.0 for p in f.phases for i in p.items if i.name.endswith("logits"))


def test_dtypes_are_read_from_the_verl_config(tmp_path):
    """model_dtype sets the shards, gradients and Adam moments; a reference that is not forward-only keeps its
    shard (in its model_dtype) on the GPU."""
    bf16 = "+backend.overrides={actor_rollout_ref.actor.fsdp_config.model_dtype: bf16}"
    _, _, plan = plan_of(*row("grpo_gt_math", tmp_path, bf16))
    items = {i.name: i for i in plan.phase("update").items}
    assert items["actor parameters"].gib == pytest.approx(N_4B * 2 / 8 / GIB) and items["actor parameters"].note == (
        "bf16 FSDP shard"
    )
    assert items["actor optimizer"].gib == pytest.approx(N_4B * 4 / 8 / GIB)
    resident = "+backend.overrides={actor_rollout_ref.ref.fsdp_config.forward_only: false}"
    _, _, plan = plan_of(*row("grpo_gt_math", tmp_path, resident))
    ref = next(i for i in plan.phase("generation").items if i.name == "reference parameters")
    assert ref.gib == pytest.approx(N_4B * 4 / 8 / GIB) and ref.note == "fp32 FSDP shard"


def test_eight_b_grpo_with_the_structure_reward(tmp_path):
    """Qwen3-8B-Base, GRPO + SARL on 8 GPUs: 55.7 (vLLM) + 3.8 + 7.6 (fp32 actor shard, Adam) + 4.0 (embedding
    server) + 1.5 (contexts) + 1.1 (NCCL) = 73.8 GiB (93%), above the 90% target: 0.67 fits. Its reference is
    float32 (3.8 GiB a GPU) but on the host; kept on the GPU, the plan would be 97% and 0.62 would fit."""
    cfg, reward_cfg, v = row("grpo_sarl_math", tmp_path, f"embedding.model={EMBEDDER}")
    n = 8_190_735_360
    gpu, shared, plan = plan_of(cfg, reward_cfg, v, QWEN3_8B)
    assert not plan.ok and plan.peak.name == "generation"
    assert plan.peak.gib == pytest.approx(0.75 * H100 + n * 12 / 8 / GIB + 1.5 + runtime_memory.nccl_gib(8))
    assert plan.fraction == pytest.approx(0.927, abs=0.001)
    assert "backend.rollout_gpu_memory_utilization=0.67 (now 0.7)" in verl_preflight.memory_plan_fix(plan, v, shared)
    assert plan.phase("update").gib == pytest.approx(n * 16 / 8 / GIB + 9.27 + 0.05 * H100 + 1.5 + 2.11, abs=0.01)
    resident = "+backend.overrides={actor_rollout_ref.ref.fsdp_config.forward_only: false}"
    cfg, reward_cfg, v = row("grpo_sarl_math", tmp_path, f"embedding.model={EMBEDDER}", resident)
    _, shared, on_gpu = plan_of(cfg, reward_cfg, v, QWEN3_8B)
    assert not on_gpu.ok and on_gpu.fraction == pytest.approx(0.974, abs=0.001)
    fix = verl_preflight.memory_plan_fix(on_gpu, v, shared)
    assert "backend.rollout_gpu_memory_utilization=0.62 (now 0.7)" in fix


def test_an_overfull_plan_fails_and_says_which_share_fits(tmp_path):
    cfg, reward_cfg, v = row("ppo_sarl_math", tmp_path, "backend.rollout_gpu_memory_utilization=0.8")
    _, _, plan = plan_of(cfg, reward_cfg, v)
    assert not plan.ok and plan.fraction > runtime_memory.LIMIT == 0.90
    fits = memory.rollout_utilization_that_fits(plan, 0.8)
    assert fits == 0.65  # the share ppo_sarl_math commits
    assert plan_of(*row("ppo_sarl_math", tmp_path, f"backend.rollout_gpu_memory_utilization={fits}"))[2].ok


def test_offloading_takes_the_shards_off_the_gpu_between_their_phases(tmp_path):
    offload = "+backend.overrides={actor_rollout_ref.actor.fsdp_config.optimizer_offload: true}"
    _, _, plan = plan_of(*row("grpo_sarl_math", tmp_path, offload))
    generation = {i.name: i.gib for i in plan.phase("generation").items}
    assert generation["actor optimizer"] == 0.0 and generation["actor parameters"] > 0
    update = {i.name: i.gib for i in plan.phase("update").items}  # loaded back for the optimizer step
    assert update["actor optimizer"] == pytest.approx(N_4B * 8 / 8 / GIB)
    policy = "+backend.overrides={actor_rollout_ref.actor.fsdp_config.offload_policy: true}"
    _, _, plan = plan_of(*row("grpo_sarl_math", tmp_path, policy))  # FSDP2's CPUOffloadPolicy: on the host throughout
    assert all(
        i.gib == 0.0 for p in plan.phases for i in p.items if i.name.startswith("actor ") and "logits" not in i.name
    )


# -- the MaxFlow reward's attention model --------------------------------------------------------


def test_the_maxflow_attention_model_is_counted_once_on_gpu_0(tmp_path):
    """grpo_maxflow_math: one reward worker loads Qwen3-4B's base model in bfloat16 (7.49 GiB) on GPU 0 and runs
    one eager pass over 1,024 + 4,096 tokens: 32 heads x 5,120^2 x (2 + 4 + 2) bytes of one layer's attention
    weights (6.25 GiB), the causal mask and the activations (4 h + 3 i a token)."""
    from baselines.maxflow.attention import eager_pass_bytes

    cfg, reward_cfg, v = row("grpo_maxflow_math", tmp_path)
    assert v.reward.num_workers == 1
    gpu, shared, plan = plan_of(cfg, reward_cfg, v)
    model, attention_pass = shared
    t = 5120
    assert gpu == 0 and model.name == "MaxFlow attention model x1" and model.processes == 1
    assert model.gib == pytest.approx(N_4B * 2 / GIB) and model.note == "bfloat16, in a reward worker"
    pass_bytes = 32 * t * t * 8 + t * t * 2 + t * (4 * 2560 + 3 * 9728) * 2
    assert eager_pass_bytes(config(QWEN3_4B), t, 2) == pass_bytes
    assert attention_pass.gib == pytest.approx(pass_bytes / GIB) == pytest.approx(6.7, abs=0.05)
    generation = plan.phase("generation")
    assert {"MaxFlow attention model x1", "MaxFlow attention pass x1"} <= {i.name for i in generation.items}
    assert next(i for i in generation.items if i.name == "CUDA contexts").gib == 1.5  # + the reward worker
    assert all(model in p.items and attention_pass in p.items for p in plan.phases)  # resident for the whole run
    # at the row's 0.61: 48.6 + 5.6 + 14.2 + 1.5 + 1.1 (NCCL) = 71.0 GiB
    assert plan.peak.gib == pytest.approx(0.61 * H100 + N_4B * 12 / 8 / GIB + 14.2 + 1.5 + 1.11, abs=0.05)


def test_every_reward_worker_loads_its_own_copy(tmp_path):
    cfg, reward_cfg, v = row("grpo_maxflow_math", tmp_path, "backend.reward_num_workers=8")
    _, shared, plan = plan_of(cfg, reward_cfg, v)
    assert shared[0].name == "MaxFlow attention model x8" and shared[0].gib == pytest.approx(8 * N_4B * 2 / GIB)
    assert not plan.ok
    assert verl_preflight.memory_plan_fix(plan, v, shared).startswith("set backend.reward_num_workers=1")
    (check, *_) = verl_preflight.check_memory_plan(cfg, v, reward_cfg)
    assert not check.ok and "backend.reward_num_workers=1" in check.fix


def test_the_joint_reward_loads_it_in_the_trainer(tmp_path):
    """FLOW:LCS is a group reward: no reward workers, one copy in verl's trainer."""
    cfg, reward_cfg, v = row("grpo_lcs_maxflow_math", tmp_path)
    assert v.reward.num_workers == 0
    (node,) = maxflow_nodes(reward_cfg)
    assert node is reward_cfg["components"]["maxflow"]
    _, shared, _ = plan_of(cfg, reward_cfg, v)
    assert shared[0].name == "MaxFlow attention model x1" and shared[0].note == "bfloat16, in the trainer"


def test_the_attention_model_is_charged_to_its_own_device(tmp_path):
    cfg, reward_cfg, v = row("grpo_maxflow_math", tmp_path, "reward.device=cuda:3")
    gpu, shared, _ = plan_of(cfg, reward_cfg, v)
    assert gpu == 3 and len(shared) == 2
    cfg, reward_cfg, v = row("grpo_maxflow_math", tmp_path, "reward.device=cpu")
    assert plan_of(cfg, reward_cfg, v)[:2] == (0, [])
    cfg, reward_cfg, v = row("grpo_maxflow_math", tmp_path, "reward.dtype=float32")
    _, shared, _ = plan_of(cfg, reward_cfg, v)
    assert shared[0].gib == pytest.approx(N_4B * 4 / GIB)


def test_the_paper_rows_of_maxflow_fit_and_the_7b_one_does_not(tmp_path, model_dirs):
    """maxflow_paper: R1-Distill-Qwen-1.5B on 4 GPUs, its base model (1.54 B parameters, bfloat16) and a pass
    over 5,120 tokens with 12 heads: 68.8 GiB (86%). The 7B backbone (model=r1_distill_qwen_7b) does not fit."""
    cfg, reward_cfg, v = rl_stage("maxflow_paper", tmp_path, model_dirs)
    assert int(v.trainer.n_gpus_per_node) == 4 and v.reward.num_workers == 1
    _, shared, plan = plan_of(cfg, reward_cfg, v)
    base = 1_777_088_000 - 151_936 * 1536
    assert shared[0].gib == pytest.approx(base * 2 / GIB) and plan.ok
    assert plan.peak.gib == pytest.approx(68.8, abs=0.05)
    cfg, reward_cfg, v = rl_stage("maxflow_paper", tmp_path, model_dirs, "model=r1_distill_qwen_7b")
    (check, *_) = verl_preflight.check_memory_plan(cfg, v, reward_cfg)
    assert not check.ok and "backend.rollout_gpu_memory_utilization=" in check.fix


def test_a_missing_attention_model_config_fails_the_check_or_is_skipped(tmp_path):
    cfg, reward_cfg, v = row("grpo_maxflow_math", tmp_path)
    reward_cfg["model"] = str(tmp_path / "nowhere")
    checks = verl_preflight.check_memory_plan(cfg, v, reward_cfg)
    assert [c.ok for c in checks if c.name == "memory plan"] == [False, True]
    assert "MaxFlow reward's model" in checks[0].detail
    assert all(c.ok for c in verl_preflight.check_memory_plan(cfg, v, reward_cfg, skip_missing=True))


def test_model_configs_are_found_locally_or_in_the_cache_only_without_download(tmp_path, monkeypatch):
    assert find_model_config(str(QWEN3_4B))["hidden_size"] == 2560
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert find_model_config("Qwen/Qwen3-4B") is None  # nothing cached, no download asked for


# -- NCCL and vLLM's CUDA graphs -----------------------------------------------------------------


def test_nccl_buffers_of_one_communicator():
    """NCCL's defaults: per channel 3 connections (ring 1, tree 2) of Simple 4 MiB + LL128 4.69 MiB + LL 0.5 MiB,
    32 channels; NVLink SHARP above two GPUs of a node (16 channels x 2 x 1 MiB per rank of the node); none on one."""
    mib = 2**20
    rings = 32 * 3 * (4 * mib + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16)
    assert runtime_memory.nccl_gib(1) == 0.0
    assert runtime_memory.nccl_gib(2) == pytest.approx(rings / GIB) == pytest.approx(0.86, abs=0.005)  # no NVLS
    assert runtime_memory.nccl_gib(8) == pytest.approx((rings + 8 * 32 * mib) / GIB) == pytest.approx(1.11, abs=0.005)
    assert runtime_memory.nccl_gib(4, nodes=2) == pytest.approx((rings + 4 * 32 * mib) / GIB)
    assert runtime_memory.nccl_item(2, 8).gib == pytest.approx(2 * runtime_memory.nccl_gib(8))


def test_one_gpu_has_no_nccl_and_an_eager_rollout_no_cuda_graphs(tmp_path):
    cfg, reward_cfg, v = row("grpo_gt_math", tmp_path)
    _, _, plan = plan_of(cfg, reward_cfg, v)
    for phase in plan.phases:  # 8 GPUs: one communicator (the actor's) in every phase
        assert next(i for i in phase.items if i.name == "NCCL buffers").gib == pytest.approx(1.11, abs=0.005)
    graphs = {p.name: [i.gib for i in p.items if i.name == "vLLM CUDA graphs"] for p in plan.phases}
    assert graphs == {"generation": [], "log-probs": [1.0], "reference": [1.0], "update": [1.0]}
    eager = "+backend.overrides={actor_rollout_ref.rollout.enforce_eager: true}"
    _, _, plan = plan_of(*row("grpo_gt_math", tmp_path, "train.n_gpus_per_node=1", eager))
    assert all(i.gib == 0.0 for p in plan.phases for i in p.items if i.name in ("NCCL buffers", "vLLM CUDA graphs"))


# -- the SFT stages ------------------------------------------------------------------------------


def sft_stage(exp, tmp_path, model_dirs, monkeypatch, *extra):
    """(cfg, verl SFT config) of a pipeline row's `sft` stage on its own model's config (no tokenizer read)."""
    from sarl.backends.verl import sft

    monkeypatch.setattr(sft, "sft_chat_template", lambda cfg: None)
    overrides = [f"+exp={exp}", *stage_overrides(exp, "sft"), *extra]
    model = model_dirs[compose_train_config(overrides)[0].model.path]
    cfg, _ = compose_train_config([*overrides, f"model.path={model}", "logger=none"])
    return cfg, sft.build_verl_sft_config(cfg, str(tmp_path), exp)


SFT_EXPS = [  # the verl pipelines with an `sft` stage (grp_cot_sft_paper: that stage alone)
    e
    for e in experiments()
    if compose_train_config([f"+exp={e}"])[0].backend.name == "verl"
    and "sft" in [s.get("name") for s in compose_train_config([f"+exp={e}"])[0].get("pipeline") or []]
]


@pytest.mark.parametrize("exp", SFT_EXPS)
def test_every_sft_stage_fits_90_percent_of_an_h100(exp, tmp_path, model_dirs, monkeypatch):
    """verl's SFT trainer: the float32 parameters, gradients and Adam moments of the whole model over the stage's
    GPUs, the float32 logits of one micro-batch, a context, NCCL where it has several GPUs."""
    assert len(SFT_EXPS) >= 12
    cfg, sft_cfg = sft_stage(exp, tmp_path, model_dirs, monkeypatch)
    assert cfg.algorithm.name == "sft"
    (check,) = verl_preflight.check_sft_memory_plan(cfg, sft_cfg)
    assert check.name == "SFT memory plan" and check.ok and check.fix == "", check.detail
    policy = config(Path(cfg.model.path))
    plan = memory.sft_memory_plan(sft_cfg, policy, H100)
    gpus = int(cfg.train.n_gpus_per_node)
    n = runtime_memory.parameter_count(policy)
    items = {i.name: i.gib for i in plan.phase("update").items}
    assert items["model parameters"] == pytest.approx(n * 4 / gpus / GIB)  # model_dtype fp32 (engine/fsdp.yaml)
    assert items["model optimizer"] == pytest.approx(2 * items["model parameters"]) == 2 * items["model gradients"]
    tokens = int(sft_cfg.data.max_token_len_per_gpu) if sft_cfg.data.use_dynamic_bsz else None
    assert items["logits"] == pytest.approx(memory.logits_gib(tokens, policy["vocab_size"]))
    assert items["NCCL buffers"] == runtime_memory.nccl_gib(gpus)
    assert plan.fraction <= runtime_memory.LIMIT


def test_an_sft_stage_that_does_not_fit_fails_with_its_stage_overrides(tmp_path, model_dirs, monkeypatch):
    """lcs_paper's SFT stage is R1-Distill-Qwen-7B on one GPU (App. A.4.4: "micro-batch 1 on a single A100"): 16
    bytes a parameter of float32 training state alone is 113 GiB, so it names more GPUs and the offload."""
    cfg, sft_cfg = sft_stage("lcs_paper", tmp_path, model_dirs, monkeypatch, "model=r1_distill_qwen_7b")
    (check,) = verl_preflight.check_sft_memory_plan(cfg, sft_cfg, "sft")
    assert not check.ok and check.detail.startswith("1 GPU(s): ")
    assert "sft:train.n_gpus_per_node" in check.fix
    assert "sft:backend.sft_overrides.engine.optimizer_offload" in check.fix
    big = "+backend.sft_overrides={data: {max_token_len_per_gpu: 262144}}"
    cfg, sft_cfg = sft_stage("lcs_paper", tmp_path, model_dirs, monkeypatch, big)
    (check,) = verl_preflight.check_sft_memory_plan(cfg, sft_cfg)
    assert not check.ok and check.fix.startswith("set a smaller token budget per micro-batch (backend.sft_overrides")
    assert verl_preflight.check_sft_memory_plan(cfg, sft_cfg, skip_missing=True)  # the config is at hand
    cfg, _ = compose_train_config(["+exp=lcs_paper", "model.path=/nowhere", *stage_overrides("lcs_paper", "sft")])
    assert verl_preflight.check_sft_memory_plan(cfg, sft_cfg, skip_missing=True) == []
    assert not verl_preflight.check_sft_memory_plan(cfg, sft_cfg)[0].ok


def test_the_preflight_plans_a_pipelines_sft_stage_with_its_own_overrides(tmp_path, model_dirs, monkeypatch):
    from sarl.backends.verl import sft

    monkeypatch.setattr(sft, "sft_chat_template", lambda cfg: None)
    model = model_dirs["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]
    args = ["+exp=lcs_paper", f"model.path={model}", "logger=none"]
    cfg, _ = compose_train_config(args)
    (check,) = preflight.sft_stage_checks(cfg, args, tmp_path, "lcs_paper", allow_download=False)
    assert check.name == "SFT memory plan" and check.ok and check.detail.startswith("1 GPU(s): 36.8 of 79.6 GiB")
    big = "sft:+backend.sft_overrides={data: {max_token_len_per_gpu: 262144}}"
    (bad,) = preflight.sft_stage_checks(cfg, [*args, big], tmp_path, "lcs_paper", allow_download=False)
    assert not bad.ok and "(sft:backend.sft_overrides.data.max_token_len_per_gpu)" in bad.fix
    assert preflight.sft_stage_checks(*row("grpo_gt_math", tmp_path)[:1], [], tmp_path, "x") == []  # no pipeline


def test_sarl_train_stops_an_sft_stage_whose_plan_does_not_fit(tmp_path, model_dirs, monkeypatch):
    """run_verl_sft checks the plan before it writes or launches anything (where the model's config.json is at
    hand): R1-Distill-Qwen-7B's float32 training state on lcs_paper's one SFT GPU."""
    from sarl.backends.verl import sft
    from sarl.runtime.checks import PreflightError

    monkeypatch.setattr(sft, "sft_chat_template", lambda cfg: None)
    monkeypatch.setattr(sft, "validate_verl_sft_config", lambda config: None)  # loads the tokenizer of a directory
    model = model_dirs["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"]
    overrides = [*stage_overrides("lcs_paper", "sft"), "model=r1_distill_qwen_7b", f"model.path={model}"]
    cfg, _ = compose_train_config(["+exp=lcs_paper", *overrides, "logger=none"])
    run_dir = tmp_path / "run"
    with pytest.raises(PreflightError, match="SFT memory plan") as err:
        sft.run_verl_sft(cfg, {}, "lcs_paper/sft", run_dir)
    assert "sft:train.n_gpus_per_node" in str(err.value)
    assert not (run_dir / sft.SFT_DATA_FILE).exists()


def test_the_preflight_of_an_sft_row_plans_its_stage(tmp_path, model_dirs, monkeypatch):
    """grp_cot_sft_paper is its SFT stage alone: the preflight plans it (Qwen3-8B-Base on 8 GPUs), no RL checks."""
    from sarl.backends.verl import sft

    monkeypatch.setattr(sft, "sft_chat_template", lambda cfg: None)
    args = ["+exp=grp_cot_sft_paper", f"model.path={model_dirs['Qwen/Qwen3-8B-Base']}", f"paths.root={tmp_path}"]
    cfg, choices = compose_train_config(args)
    checks = {c.name: c for c in preflight.preflight(cfg, choices, args)}
    assert checks["SFT memory plan"].ok and checks["SFT memory plan"].detail.startswith("8 GPU(s): 22.1 of")
    assert "memory plan" not in checks and "verl config" not in checks
