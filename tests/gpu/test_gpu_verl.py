"""Two verl steps of the tiny Qwen3 policy on one GPU, launched as a user launches a run
(`python -m sarl.train +exp=ROW ...`, gpu_runs.train_overrides): vLLM rollouts, FSDP2 actor, the reference
policy for the KL loss, a checkpoint and a validation pass at the last step, every step in the run's
metrics.jsonl.

- grpo_sarl: GRPO with the SARL structure reward streamed through verl's reward workers;
- grpo_ttrl: GRPO with TTRL, a group reward that SarlTrainer scores on whole groups (4 votes, 2 trained);
- ppo_sarl: PPO with a critic (GAE) and the SARL reward;
- grpo_sarl_server: grpo_sarl with the vLLM embedding server that sarl.train starts on the same GPU, beside
  verl's vLLM rollout, each at the row's memory share;
- grpo_maxflow: the MaxFlow reward, its attention model on the GPU beside the rollout as the row places it;
- lcs_paper: the pipeline, verl's SFT trainer (torchrun, NCCL) then GRPO with LCS from the SFT checkpoint.

Each run's step timings go to `gpu_test_timing.json` in its run directory and are printed (`pytest -rA`)."""

from __future__ import annotations

import json
import time

import pytest
from gpu_runs import (
    COMMON_METRICS,
    NODE_ROWS,
    PROMPTS_PER_STEP,
    ROLLOUTS,
    ROWS,
    SFT_METRICS,
    SFT_STAGE,
    SMOKE_NAME,
    STEPS,
    TIMING_FILE,
    child_env,
    gpu_devices,
    gpu_name,
    missing_metrics,
    missing_paper_inputs,
    read_step_metrics,
    rl_run_dir,
    run_train,
    step_timing,
    train_overrides,
    why_fewer_gpus,
)

RUN_TIMEOUT_S = 1800


def run_and_check(row, policy, data, tmp_path) -> dict:
    """Run `row` (`python -m sarl.train`, gpu_runs.train_overrides) on its GPUs and check what it did: every
    step logged with its metrics, no failure counted, a validation and a checkpoint at the last step, a
    pipeline's SFT stage; its step timings written and printed. Returns the RL run's verl config."""
    from omegaconf import OmegaConf

    run_dir = tmp_path / row.name
    rl_dir = rl_run_dir(row, tmp_path)
    log_path = tmp_path / f"{row.name}.log"
    started = time.monotonic()
    devices = gpu_devices(row.gpus)
    rc = run_train(train_overrides(row, policy, data, tmp_path), child_env(devices), log_path, RUN_TIMEOUT_S)
    wall_s = time.monotonic() - started
    assert rc == 0, f"sarl.train exited with {rc}; log {log_path}, its tail:\n{log_path.read_text()[-8000:]}"

    steps = read_step_metrics(rl_dir)
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps logged: {sorted(steps)}"
    timing = {
        "row": row.name,
        "experiment": row.exp,
        "gpu": gpu_name(devices.split(",")[0]),
        "gpus": row.gpus,
        "responses_per_step": PROMPTS_PER_STEP * ROLLOUTS if not row.paper_models else None,  # a paper row's own
        "wall_s": round(wall_s, 1),
        "steps": step_timing(steps),
        "versions": json.loads((rl_dir / "meta.json").read_text())["versions"],
    }
    (run_dir / TIMING_FILE).write_text(json.dumps(timing, indent=2))
    per_step = ", ".join(f"{t.get('timing_s/step', float('nan')):.1f}" for t in timing["steps"].values())
    print(f"{row.name} on {timing['gpu']}: timing_s/step {per_step} s, run {wall_s:.0f} s ({run_dir / TIMING_FILE})")

    for step, metrics in steps.items():
        assert missing_metrics(metrics, COMMON_METRICS + row.metrics) == [], f"step {step}"
        assert metrics["training/global_step"] == step
        assert metrics["response_length/mean"] > 0, f"step {step}: empty responses"
        for name in row.zeros:
            assert metrics.get(name) == 0, f"step {step}: {name} = {metrics.get(name)!r}"
        if row.n_trained < ROLLOUTS:  # every vote scored, the seeded subset trained on
            assert metrics["reward/voted_sessions"] == PROMPTS_PER_STEP * ROLLOUTS, f"step {step}"
            assert metrics["reward/trained_sessions"] == PROMPTS_PER_STEP * row.n_trained, f"step {step}"
    validated = [k for k in steps[STEPS] if k.startswith(f"val-core/{'' if row.paper_models else SMOKE_NAME + '/'}")]
    assert validated, f"no validation metrics at step {STEPS}: {sorted(steps[STEPS])}"

    checkpoints = rl_dir / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
    last = checkpoints / f"global_step_{STEPS}"
    assert (last / "data.pt").is_file()
    for role in ("actor", "critic") if row.critic else ("actor",):
        assert (last / role).is_dir() and any((last / role).iterdir()), f"no {role} checkpoint in {last}"
    if not row.critic:
        assert not (last / "critic").exists()
    # the run's model: the last checkpoint's shards merged by verl's model merger, holding the trained tensors
    from sarl.runtime.checkpoints import export_problem

    assert export_problem(last / "actor", rl_dir / "final") is None

    if row.pipeline:  # the SFT stage trained STEPS steps, and the RL stage started from its checkpoint
        from sarl.launch.pipeline import DONE_MARKER

        sft = read_step_metrics(run_dir / SFT_STAGE)
        assert sorted(sft) == list(range(1, STEPS + 1)), f"SFT steps logged: {sorted(sft)}"
        for step, metrics in sft.items():
            assert missing_metrics(metrics, SFT_METRICS) == [], f"SFT step {step}"
        start = json.loads((run_dir / "pipeline.json").read_text())["stages"][SFT_STAGE]
        assert start == str(run_dir / SFT_STAGE / "final"), start  # the SFT stage's last Hugging Face save, linked
        assert (run_dir / SFT_STAGE / DONE_MARKER).is_file()
        model = OmegaConf.load(rl_dir / "verl_trainer.yaml").actor_rollout_ref.model
        assert model.path == start and model.tokenizer_path == start, model
    return OmegaConf.to_container(OmegaConf.load(rl_dir / "verl_trainer.yaml"), resolve=True)


@pytest.mark.gpu
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)  # the run's own timeout fires first and stops its process group
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_two_verl_steps_on_one_gpu(row, tiny_policy, smoke_parquet, tmp_path):
    run_and_check(row, tiny_policy, smoke_parquet, tmp_path)


@pytest.mark.gpu
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)  # the run's own timeout fires first and stops its process group
@pytest.mark.parametrize("row", NODE_ROWS, ids=lambda r: r.name)
def test_verl_steps_on_several_gpus(row, tmp_path, request):
    """grpo_sarl_tp2: a tensor-parallel-2 rollout and a 2-rank FSDP actor; grpo_sarl_node: grpo_sarl_math on 8
    GPUs as the paper runs it, with the embedding server at the paper's model. Skipped, with the reason, on a
    node with fewer GPUs or (paper row) without the prepared data and the models in the cache."""
    if why := why_fewer_gpus(row.gpus) or (missing_paper_inputs(row) if row.paper_models else None):
        pytest.skip(why)
    policy = data = None
    if not row.paper_models:
        policy, data = request.getfixturevalue("tiny_policy"), request.getfixturevalue("smoke_parquet")
    v = run_and_check(row, policy, data, tmp_path)
    trainer, rollout = v["trainer"], v["actor_rollout_ref"]["rollout"]
    assert trainer["n_gpus_per_node"] == row.gpus
    if row.tensor_parallel:
        assert rollout["tensor_model_parallel_size"] == row.tensor_parallel
    if row.paper_models:
        from sarl.launch.compose import compose_train_config

        own = compose_train_config([f"+exp={row.exp}"])[0]
        assert v["actor_rollout_ref"]["model"]["path"] == str(own.model.path)
        embedder = v["reward"]["custom_reward_function"]["reward_kwargs"]["reward"]["embedder"]
        assert embedder["_target_"] == "sarl.serving.http.HTTPEmbedder" and embedder["model"] == own.embedding.model
