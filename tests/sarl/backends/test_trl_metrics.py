"""The TRL run's records: metrics.jsonl holds each value once (verl's names), and curves.png draws each curve once
on a grid instead of a strip."""

import json
from types import SimpleNamespace

import matplotlib.image

from sarl.backends.trl.metrics import MetricsRecorder, canonical, plot_curves, read_metrics

# one GRPO log of the smoke run, as TRL hands it to on_log (one reward function, named "reward")
TRL_LOG = {
    "loss": 0.0,
    "completions/mean_length": 48.0,
    "rewards/reward/mean": 0.5,
    "rewards/reward/std": 0.1,
    "reward": 0.5,
    "reward_std": 0.1,
    "frac_reward_zero_std": 1.0,
    "reward/sr/mean": 0.5,
    "kl": 0.002,
    "entropy": 0.04,
}


def test_each_value_is_recorded_once_under_verls_name(tmp_path):
    recorder = MetricsRecorder(tmp_path / "metrics.jsonl")
    state = SimpleNamespace(is_world_process_zero=True, global_step=1)
    recorder.on_log(None, state, None, logs=dict(TRL_LOG))
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert row == {
        "step": 1,
        "loss": 0.0,
        "response_length/mean": 48.0,
        "reward/mean": 0.5,
        "reward/std": 0.1,
        "reward/zero_std_frac": 1.0,
        "reward/sr/mean": 0.5,
        "actor/kl": 0.002,
        "actor/entropy": 0.04,
    }
    # several reward functions: each keeps its own pair (they are not the total again)
    two = canonical({**TRL_LOG, "rewards/format/mean": 1.0, "rewards/format/std": 0.0})
    assert two["rewards/reward/mean"] == 0.5 and two["rewards/format/mean"] == 1.0
    assert json.dumps(canonical({"rewards/chosen": 1.0, "loss": 0.3})) == '{"rewards/chosen": 1.0, "loss": 0.3}'


def test_curves_are_a_grid_and_sr_is_not_drawn_twice(tmp_path):
    rows = [{"step": s, **canonical({**TRL_LOG, "reward": 0.1 * s, "reward/sr/mean": 0.1 * s})} for s in (1, 2, 3)]
    height, width, _ = matplotlib.image.imread(plot_curves(rows, tmp_path / "same.png")).shape
    assert width < 2 * height  # 4 panels, 2 x 2 (was a 2200 x 352 strip of 5)
    rows[1]["reward/sr/mean"] = 0.9  # SR differs from the reward (another reward around it): its own panel
    height5, width5, _ = matplotlib.image.imread(plot_curves(rows, tmp_path / "apart.png")).shape
    assert width5 > width and height5 == height  # 5 panels, 3 x 2
