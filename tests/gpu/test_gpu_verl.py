"""Two verl steps of the tiny Qwen3 policy on one GPU, launched as a user launches a run
(`python -m sarl.train +exp=ROW ...`, gpu_runs.train_overrides): vLLM rollouts, FSDP2 actor, the reference
policy for the KL loss, a checkpoint and a validation pass at the last step.

- grpo_sarl: GRPO with the SARL structure reward streamed through verl's reward workers;
- grpo_ttrl: GRPO with TTRL, a group reward that SarlTrainer scores on whole groups (4 votes, 2 trained);
- ppo_sarl: PPO with a critic (GAE) and the SARL reward.

Each run's step timings go to `gpu_test_timing.json` in its run directory and are printed (`pytest -rA`)."""

from __future__ import annotations

import json
import time

import pytest
from gpu_runs import (
    COMMON_METRICS,
    METRICS_FILE,
    PROMPTS_PER_STEP,
    ROLLOUTS,
    ROWS,
    SMOKE_NAME,
    STEPS,
    TIMING_FILE,
    child_env,
    gpu_device,
    gpu_name,
    missing_metrics,
    read_step_metrics,
    run_train,
    step_timing,
    train_overrides,
)

RUN_TIMEOUT_S = 1800


@pytest.mark.gpu
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_two_verl_steps_on_one_gpu(row, tiny_policy, smoke_parquet, tmp_path):
    run_dir = tmp_path / row.name
    log_path = tmp_path / f"{row.name}.log"
    env = child_env(VERL_FILE_LOGGER_PATH=str(run_dir / METRICS_FILE))
    started = time.monotonic()
    rc = run_train(train_overrides(row, tiny_policy, smoke_parquet, tmp_path), env, log_path, RUN_TIMEOUT_S)
    wall_s = time.monotonic() - started
    assert rc == 0, f"sarl.train exited with {rc}; log {log_path}, its tail:\n{log_path.read_text()[-8000:]}"

    steps = read_step_metrics(run_dir / METRICS_FILE)
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps logged: {sorted(steps)}"
    device = gpu_device()
    timing = {
        "row": row.name,
        "experiment": row.exp,
        "gpu": gpu_name(device),
        "responses_per_step": PROMPTS_PER_STEP * ROLLOUTS,
        "wall_s": round(wall_s, 1),
        "steps": step_timing(steps),
        "versions": json.loads((run_dir / "meta.json").read_text())["versions"],
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

    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
    last = checkpoints / f"global_step_{STEPS}"
    assert (last / "data.pt").is_file()
    for role in ("actor", "critic") if row.critic else ("actor",):
        assert (last / role).is_dir() and any((last / role).iterdir()), f"no {role} checkpoint in {last}"
    if not row.critic:
        assert not (last / "critic").exists()
