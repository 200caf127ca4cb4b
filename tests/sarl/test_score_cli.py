"""`python -m sarl.score` on the shipped samples and on a user file."""

import json

import pytest
from testkit import run_module

from sarl.score import read_responses


def run_cli(tmp_path, *overrides):
    proc = run_module("sarl.score", f"hydra.run.dir={tmp_path}/run", *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_scores_shipped_samples_with_plots(tmp_path):
    out = tmp_path / "out.jsonl"
    proc = run_cli(tmp_path, f"output={out}", "plot=true", f"plot_dir={tmp_path}/maps")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in read_responses(None)]
    for r in rows:
        assert set(r) >= {
            "id",
            "score",
            "SR",
            "C",
            "L",
            "n_steps",
            "n_nodes",
            "n_edges",
            "no_think",
            "truncated",
            "steps_capped",
            "failed",
        }
        assert 0.0 <= r["score"] <= 1.0 and r["failed"] is None
    by_id = {r["id"]: r for r in rows}
    assert by_id["no-think"]["no_think"] and by_id["truncated"]["truncated"]
    assert by_id["aime-loop"]["n_steps"] > 15
    pngs = sorted(p.name for p in (tmp_path / "maps").glob("*.png"))
    assert pngs == sorted(f"{r['id']}.png" for r in rows)
    assert all((tmp_path / "maps" / p).stat().st_size > 5000 for p in pngs)
    assert "Structure reward" in proc.stdout and "mean score" in proc.stdout


@pytest.mark.slow
def test_user_file_with_ablation_and_hdbscan(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps({"id": "a", "response": "<think>x\n\ny\n\nz</think>"}) + "\n\n" + json.dumps({"response": ""}) + "\n"
    )
    out = tmp_path / "o.jsonl"
    run_cli(tmp_path, f"input={src}", f"output={out}", "reward=sarl_l_only", "reward.clustering=hdbscan")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "3"]
    assert rows[1]["score"] == 0.0 and rows[1]["n_steps"] == 0


@pytest.mark.parametrize(
    "text,error",
    [('{"response": "ok"}\n{"text": "no response field"}\n', "line 2"), ("not json\n", "line 1: not valid JSON")],
)
def test_bad_input_file_names_the_line(tmp_path, text, error):
    src = tmp_path / "bad.jsonl"
    src.write_text(text)
    with pytest.raises(ValueError, match=error):
        read_responses(src)
