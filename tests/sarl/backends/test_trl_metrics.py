"""The TRL run's records: metrics.jsonl holds each value once (verl's names), and curves.png draws each curve once
on a grid instead of a strip."""

import json
from types import SimpleNamespace

import matplotlib.image
import pytest

from sarl.backends.trl.metrics import MetricsRecorder, read_metrics, verl_style
from sarl.reports.curves import panels, plot_curves, run_curves, smoothed

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
    two = verl_style({**TRL_LOG, "rewards/format/mean": 1.0, "rewards/format/std": 0.0})
    assert two["rewards/reward/mean"] == 0.5 and two["rewards/format/mean"] == 1.0
    assert json.dumps(verl_style({"rewards/chosen": 1.0, "loss": 0.3})) == '{"rewards/chosen": 1.0, "loss": 0.3}'


def test_curves_are_a_grid_and_sr_is_not_drawn_twice(tmp_path):
    rows = [{"step": s, **verl_style({**TRL_LOG, "reward": 0.1 * s, "reward/sr/mean": 0.1 * s})} for s in (1, 2, 3)]
    drawn, missing = panels(rows)
    titles = [p["title"] for p in drawn]
    assert titles[0] == "reward = structure reward SR = C/2 + 1/(1+L)"  # SARL: the reward is SR, one panel
    assert not any(t == "structure reward SR = C/2 + 1/(1+L)" for t in titles)
    assert "reasoning steps" in missing and "failed rewards (left out of the advantage)" in missing
    height, width, _ = matplotlib.image.imread(plot_curves(rows, tmp_path / "same.png")).shape
    assert width < 2 * height  # 4 panels, 2 x 2 (was a 2200 x 352 strip of 5)
    rows[1]["reward/sr/mean"] = 0.9  # SR differs from the reward (another reward around it): its own panel
    assert len(panels(rows)[0]) == 5
    height5, width5, _ = matplotlib.image.imread(plot_curves(rows, tmp_path / "apart.png")).shape
    assert width5 > width and height5 == height  # 5 panels, 3 x 2, the sixth slot removed


def test_curves_smooth_the_noise_and_keep_the_raw_series():
    noisy = [0.5 + (0.2 if i % 2 else -0.2) for i in range(60)]
    smooth = smoothed(noisy)
    assert max(smooth[10:]) - min(smooth[10:]) < 0.2 * (max(noisy) - min(noisy))  # the zig-zag averaged away
    assert smoothed([3.0] * 40) == pytest.approx([3.0] * 40)  # debiased: the first points are not pulled to 0
    assert smoothed([1.0, 2.0]) == [1.0, 2.0]  # too short to smooth


def test_a_verl_run_directory_gets_its_curves_with_the_held_out_marks(tmp_path):
    """`python -m sarl.reports.curves RUN_DIR` on verl's metrics.jsonl (records nested under `data`, a step's
    validation apart) and summary.json's held-out block: SR with C and L, steps, length, KL (verl's kl_loss),
    entropy and failed rewards, each once."""
    import json

    from testkit import run_module

    lines = []
    for step in range(1, 31):
        data = {"reward/score/mean": 0.4 + 0.01 * step, "reward/sr/mean": 0.4 + 0.01 * step, "reward/C/mean": 0.2}
        data |= {"reward/L/mean": 1.5, "reward/n_steps/mean": 7.0, "response_length/mean": 100.0 + step}
        data |= {"actor/kl_loss": 0.001 * step, "actor/entropy": 0.05, "reward/failed": 0.0}
        lines.append(json.dumps({"step": step, "data": data}))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    heldout = {"before": {"sr_mean": 0.41, "length": 101.0}, "after": {"sr_mean": 0.68, "length": 129.0}}
    (tmp_path / "summary.json").write_text(json.dumps({"heldout": heldout}))
    drawn, missing = panels(read_metrics_history_of(tmp_path))
    assert [p["title"] for p in drawn] == [
        "reward = structure reward SR = C/2 + 1/(1+L)",
        "reasoning steps",
        "response length (tokens)",
        "KL to the reference",
        "policy entropy",
        "failed rewards (left out of the advantage)",
    ] and missing == []
    assert drawn[0]["L"] is not None and [label for label, _ in drawn[0]["series"]] == ["SR", "C"]
    assert drawn[0]["mark"] == "sr_mean" and drawn[2]["mark"] == "length"
    png = run_curves(tmp_path)
    assert png == tmp_path / "curves.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    proc = run_module("sarl.reports.curves", tmp_path, "--out", tmp_path / "again.png")
    assert proc.returncode == 0 and (tmp_path / "again.png").is_file(), proc.stderr
    proc = run_module("sarl.reports.curves", tmp_path / "nope")
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def read_metrics_history_of(run_dir):
    from sarl.reports.figures import read_metrics_history

    return read_metrics_history(run_dir)
