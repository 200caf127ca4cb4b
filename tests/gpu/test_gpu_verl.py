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
    PROMPTS_PER_STEP,
    ROLLOUTS,
    ROWS,
    SFT_METRICS,
    SFT_STAGE,
    SMOKE_NAME,
    STEPS,
    TIMING_FILE,
    child_env,
    gpu_device,
    gpu_name,
    missing_metrics,
    read_step_metrics,
    rl_run_dir,
    run_train,
    step_timing,
    train_overrides,
)

RUN_TIMEOUT_S = 1800


@pytest.mark.gpu
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_two_verl_steps_on_one_gpu(row, tiny_policy, smoke_parquet, tmp_path):
    run_dir = tmp_path / row.name
    rl_dir = rl_run_dir(row, tmp_path)
    log_path = tmp_path / f"{row.name}.log"
    started = time.monotonic()
    rc = run_train(train_overrides(row, tiny_policy, smoke_parquet, tmp_path), child_env(), log_path, RUN_TIMEOUT_S)
    wall_s = time.monotonic() - started
    assert rc == 0, f"sarl.train exited with {rc}; log {log_path}, its tail:\n{log_path.read_text()[-8000:]}"

    steps = read_step_metrics(rl_dir)
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps logged: {sorted(steps)}"
    device = gpu_device()
    timing = {
        "row": row.name,
        "experiment": row.exp,
        "gpu": gpu_name(device),
        "responses_per_step": PROMPTS_PER_STEP * ROLLOUTS,
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
    validated = [k for k in steps[STEPS] if k.startswith(f"val-core/{SMOKE_NAME}/")]
    assert validated, f"no validation metrics at step {STEPS}: {sorted(steps[STEPS])}"

    checkpoints = rl_dir / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
    last = checkpoints / f"global_step_{STEPS}"
    assert (last / "data.pt").is_file()
    for role in ("actor", "critic") if row.critic else ("actor",):
        assert (last / role).is_dir() and any((last / role).iterdir()), f"no {role} checkpoint in {last}"
    if not row.critic:
        assert not (last / "critic").exists()

    if row.pipeline:  # the SFT stage trained STEPS steps, and the RL stage started from its checkpoint
        from omegaconf import OmegaConf

        from sarl.launch.pipeline import DONE_MARKER

        sft = read_step_metrics(run_dir / SFT_STAGE)
        assert sorted(sft) == list(range(1, STEPS + 1)), f"SFT steps logged: {sorted(sft)}"
        for step, metrics in sft.items():
            assert missing_metrics(metrics, SFT_METRICS) == [], f"SFT step {step}"
        start = json.loads((run_dir / "pipeline.json").read_text())["stages"][SFT_STAGE]
        assert start == str(run_dir / SFT_STAGE / "checkpoints" / f"global_step_{STEPS}" / "huggingface"), start
        assert (run_dir / SFT_STAGE / DONE_MARKER).is_file()
        model = OmegaConf.load(rl_dir / "verl_trainer.yaml").actor_rollout_ref.model
        assert model.path == start and model.tokenizer_path == start, model
