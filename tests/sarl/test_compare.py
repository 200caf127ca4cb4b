"""The reward comparison's report (sarl.reports.compare): SARL Table 2, Fig. 3 and Fig. 2a in miniature from the stages'
summaries and metrics, and the pipeline hook that calls it."""

import json

import pytest

from sarl.launch.pipeline import pipeline_report
from sarl.reports import compare
from sarl.runtime.errors import UserError


def block(acc_before, acc_after, sr_before, sr_after):
    side = lambda acc, sr: {"accuracy": acc, "sr_mean": sr, "sr_se": 0.01, "boxed": 0.98, "truncated": 0.0}  # noqa: E731
    return {
        "prompts": 32,
        "samples_per_prompt": 16,
        "before": side(acc_before, sr_before),
        "after": side(acc_after, sr_after),
        "delta": {
            "accuracy": acc_after - acc_before,
            "accuracy_delta_ci95": [-0.03, 0.04],
            "sr_mean": sr_after - sr_before,
            "sr_delta_ci95": [0.06, 0.14],
        },
    }


def stage(tmp_path, name, heldout, steps=3):
    d = tmp_path / name
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"steps": steps, "heldout": heldout}))
    rows = [
        {"step": s, "actor/kl": 0.01 * s, "actor/entropy": 0.5, "response_length/mean": 100.0 + s}
        for s in range(1, steps + 1)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_report_writes_the_table_and_both_figures(tmp_path, capsys):
    stages = {
        "SARL": stage(tmp_path, "SARL", block(0.342, 0.340, 0.550, 0.651)),
        "Ground-Truth": stage(tmp_path, "Ground-Truth", block(0.342, 0.500, 0.550, 0.560)),
    }
    compare.report(tmp_path, stages)
    out = capsys.readouterr().out
    assert "SARL Table 2 in miniature" in out
    lines = [line for line in (tmp_path / "table2_mini.md").read_text().splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| Reward | Acc. before | Acc. after |")
    assert lines[1] == (
        "| SARL | 0.342 | 0.340 | -0.002 [-0.030, +0.040] | 0.5500 ± 0.0100 | 0.6510 ± 0.0100 "
        "| +0.1010 [+0.0600, +0.1400] | 0.980 | 0.000 |"
    )
    assert lines[2].startswith("| Ground-Truth | 0.342 | 0.500 | +0.158 ")
    fig2a = json.loads((tmp_path / "fig2a.json").read_text())
    assert fig2a["SARL"]["change_pct"] == pytest.approx((0.651 - 0.550) / 0.550 * 100)
    fig3 = json.loads((tmp_path / "fig3.json").read_text())
    assert fig3["KL to the reference"]["SARL"] == {"key": "actor/kl", "steps": [1, 2, 3], "values": [0.01, 0.02, 0.03]}
    for name in ("fig3_training_dynamics.png", "fig2a_structure_reward.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(json.loads((tmp_path / "compare.json").read_text())) == {"SARL", "Ground-Truth"}


def test_a_stage_without_heldout_figures_is_named(tmp_path):
    d = stage(tmp_path, "TTRL", None)
    with pytest.raises(UserError, match=r"TTRL/summary.json: no 'heldout' block"):
        compare.report(tmp_path, {"TTRL": d})


def test_pipeline_report_must_name_an_importable_function():
    assert pipeline_report("sarl.reports.compare.report") is compare.report
    for bad in ("sarl.reports.compare.nope", "nomodule.report", "report", "sarl.reports.compare.TABLE_HEADER"):
        with pytest.raises(UserError, match="not an importable function"):
            pipeline_report(bad)
