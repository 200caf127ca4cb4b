"""The notebooks (jupytext percent files) run as scripts on the shipped fixture results and rebuild SARL's tables
(the fixtures hold the paper's own numbers, so the rebuilt tables must print the paper's cells) and figures; the
one-response reasoning-map viewer works from Python and from the scoring CLI."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from testkit import run_module, run_python

from sarl.runtime.rows import paper_rows
from sarl.structure.reward import StructureReward
from sarl.structure.viz import step_table, view_response

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
FIXTURES = ROOT / "tests" / "fixtures" / "notebooks"
NOTEBOOK_FILES = sorted(p.name for p in NOTEBOOKS.glob("*.py") if not p.name.startswith("_"))

sys.path.insert(0, str(NOTEBOOKS))
import _paper  # noqa: E402


def run_notebook(name, *args, timeout=300, env=None):
    proc = run_python(NOTEBOOKS / name, *args, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def assert_png(path):
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def table_lines(path):
    return [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.startswith("| ")]


def test_every_notebook_is_a_jupytext_percent_notebook():
    jupytext = pytest.importorskip("jupytext")
    assert {"tables.py", "fig2_structure.py", "fig3_training.py", "protocol_tables.py"} <= set(NOTEBOOK_FILES)
    for name in NOTEBOOK_FILES:
        nb = jupytext.read(NOTEBOOKS / name)
        kinds = [c.cell_type for c in nb.cells]
        assert kinds.count("markdown") >= 2 and kinds.count("code") >= 2, name
        assert json.loads(jupytext.writes(nb, fmt="ipynb"))["cells"]  # converts to a real .ipynb


def test_tables_notebook_prints_the_papers_tables(tmp_path):
    run_notebook("tables.py", "--results", FIXTURES / "results", "--out", tmp_path)
    for n in (2, 3, 4, 5, 8, 9, 10):
        assert (tmp_path / f"table{n}.md").is_file() and (tmp_path / f"table{n}.csv").is_file()
    t2 = table_lines(tmp_path / "table2.md")
    # SARL Table 2, as printed (Avg and Δ% computed here from the four benchmark scores)
    assert "| Base | 31.67 | 82.81 | 90.10 | 53.45 | 64.51 |" in t2
    assert "| w/ Ground-Truth † | 41.67 | 86.56 | 92.75 | 59.74 | 70.18 (+8.8%) |" in t2
    assert "| w/ SARL (Ours) | 42.92 | 85.00 | 92.53 | 61.08 | 70.38 (+9.1%) |" in t2
    assert "| w/ TTRL | 42.91 | 86.56 | 93.15 | 61.86 | 71.12 (+10.2%) |" in t2
    assert t2[-1] == "| w/ SARL (Ours) | 45.83 | 87.50 | 93.30 | 61.99 | 72.16 (+11.9%) |"
    t3 = table_lines(tmp_path / "table3.md")
    assert "| w/ SARL (Ours) | 57.05 | 45.87 | 27.70 | 53.47 | 30.05 | 40.26 (+34.6%) |" in t3
    assert "| w/ EMPO | 51.01 | 36.11 | 17.62 | 45.69 | 12.92 | 29.20 (-2.4%) |" in t3
    t4 = table_lines(tmp_path / "table4.md")
    for row in ("| PPO w/ SARL | 5075.6 | -661.0 |", "| GRPO w/ SARL | 4587.8 | -1148.8 |"):
        assert row in t4
    assert "| GRPO w/ SARL | 2285.87 | -392.04 |" in t4
    assert table_lines(tmp_path / "table5.md")[1:] == [
        "| Base | 64.51 |",
        "| SARL w/ L only | 70.96 (+10.0%) |",
        "| SARL w/ C only | 71.97 (+11.6%) |",
        "| SARL w/ C + L | 72.16 (+11.9%) |",
    ]
    t8 = table_lines(tmp_path / "table8.md")
    assert "| PPO w/ Ground-Truth | 7047.7 | 4634.7 | 3124.9 | 4021.7 | 4707.3 | -1029.3 |" in t8
    assert "| GRPO w/ TTRL | 6635.0 | 4057.8 | 2663.5 | 3258.5 | 4153.7 | -1582.9 |" in t8
    assert "| EMPO | 2731.92 | +54.01 |" in table_lines(tmp_path / "table9.md")
    assert "| SARL w/ L only | 40.42 | 87.81 | 92.92 | 62.68 | 70.96 (+10.0%) |" in table_lines(tmp_path / "table10.md")
    values = json.loads((tmp_path / "tables.json").read_text())
    assert values["table2"]["values"]["grpo_sarl_math"]["avg"] == pytest.approx(72.155)
    assert all(not t["missing"] for t in values.values())


def test_tables_are_dataframes_of_the_printed_cells_with_their_numbers():
    """Each table is a pandas DataFrame (the printed cells, the paper's header as columns); its numbers come as a
    DataFrame too (one row per run), in the order of the conf/exp/ `paper:` blocks."""
    import pandas as pd

    results = _paper.load_results(FIXTURES / "results", _paper.all_rows())
    t2 = _paper.accuracy_table("table2", "SARL Table 2", _paper.TABLE2_ROWS, results)
    assert isinstance(t2, pd.DataFrame)
    assert list(t2.columns) == ["Method", "AIME25", "AMC23", "MATH500", "Minerva", "Avg (Δ%)"]
    assert t2.loc[t2["Method"] == "Base", "AIME25"].item() == "31.67"
    assert list(t2["Method"][:3]) == ["Base", "*PPO*", "w/ Ground-Truth †"]  # the group line before its rows
    numbers = _paper.values_frame(t2)
    assert list(numbers.index) == ["base", *(r.exp for r in paper_rows("SARL Table 2"))]
    assert numbers.loc["grpo_sarl_math", "avg"] == pytest.approx(72.155)
    assert numbers["aime25"].max() == pytest.approx(46.67)  # sliceable: GRPO w/ Ground-Truth's AIME25
    assert _paper.markdown(t2).splitlines()[:3] == ["### SARL Table 2", "", "| " + " | ".join(t2.columns) + " |"]


def test_a_row_without_results_is_a_dash_and_is_listed(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURES / "results", results)
    shutil.rmtree(results / "grpo_ttrl_math")
    run_notebook("tables.py", "--results", results, "--out", tmp_path / "out")
    text = (tmp_path / "out" / "table2.md").read_text()
    assert "| w/ TTRL | - | - | - | - | - |" in text
    assert "grpo_ttrl_math (no results.json)" in text
    # the other rows are unchanged
    assert "| w/ SARL (Ours) | 45.83 | 87.50 | 93.30 | 61.99 | 72.16 (+11.9%) |" in text


def test_tables_parses_its_flags_strictly_and_says_what_is_missing_and_how(tmp_path):
    out = tmp_path / "out"
    shown = run_python(NOTEBOOKS / "tables.py", "--help", timeout=120)
    assert shown.returncode == 0 and "--results VALUE" in shown.stdout and "SARL_OUT" in shown.stdout
    for args, said in (
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--result", "runs/eval"], "(did you mean --results?)"),
        (["--out", out, "--results"], "argument --results: expected one argument"),
    ):
        proc = run_python(NOTEBOOKS / "tables.py", *args, timeout=120)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    results = tmp_path / "eval"
    (results / "smoke" / "2026-01-01_00-00-00").mkdir(parents=True)  # a run that is no row of the tables
    proc = run_python(NOTEBOOKS / "tables.py", "--results", results, "--out", out, timeout=120)
    assert proc.returncode == 2, proc.stderr  # a user error, as every command
    assert f"0 of {len(_paper.all_rows())} rows have protocol-sarl results in {results}: none" in proc.stderr
    assert "missing (printed as -): base, " in proc.stderr and "python -m eval.run ckpt=runs/<row>/" in proc.stderr
    assert f"{results} also holds smoke: not rows of these tables" in proc.stderr
    assert not out.exists()  # nothing written
    proc = run_python(NOTEBOOKS / "tables.py", "--results", results, "--protocol", "sarll", timeout=120)
    assert proc.returncode == 2 and "--protocol sarll: choose sarl" in proc.stderr, proc.stderr


def test_tables_name_the_protocol_they_found_and_the_one_they_need(tmp_path):
    """Results of the smoke protocol where SARL's tables need `sarl`: each such row is named with both protocols and
    the command that produces the right results (not `no Avg without aime25, ...`), exit 2; `--protocol smoke`
    builds SARL Table 2 in miniature from them by the same code."""
    from eval.cache import safe_name

    results = tmp_path / "eval"
    for row, value in (("base", 25.0), ("smoke_compare/SARL", 37.5)):
        folder = results / safe_name(row) / "2026-01-01_00-00-00"  # where eval.run writes a row's results
        folder.mkdir(parents=True)
        smoke = {"run": {"name": row}, "complete": True, "protocol": {"name": "smoke", "paper": "", "benchmarks": []}}
        smoke["math"] = {"benchmarks": {"smoke_heldout": {"avg_at_k": value}}}
        (folder / "results.json").write_text(json.dumps(smoke), encoding="utf-8")
    proc = run_python(NOTEBOOKS / "tables.py", "--results", results, "--out", tmp_path / "out", timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    said = [x for x in proc.stderr.splitlines() if x.startswith("base: ")]
    assert said == [
        "base: results of protocol smoke only; SARL's tables needs protocol sarl: "
        "python -m eval.run ckpt=<the training run dir of base>"
    ], proc.stderr
    assert "no Avg without" not in proc.stdout + proc.stderr
    proc = run_notebook("tables.py", "--results", results, "--out", tmp_path / "out", "--protocol", "smoke")
    text = (tmp_path / "out" / "table2_smoke.md").read_text()
    assert "| Base | 25.00 | 25.00 |" in text and "| GRPO w/ SARL | 37.50 | 37.50 (+50.0%) |" in text, text
    assert "| GRPO w/ Ground-Truth | - | - |" in text and "smoke_compare/Ground-Truth (no results.json)" in text, text


def test_newest_complete_evaluation_is_used(tmp_path):
    src = FIXTURES / "results" / "base" / "2026-01-01_00-00-00" / "results.json"
    for stamp, complete in (("2026-01-01_00-00-00", True), ("2026-02-01_00-00-00", True), ("2026-03-01", False)):
        d = tmp_path / "base" / stamp
        d.mkdir(parents=True)
        data = json.loads(src.read_text())
        data["complete"] = complete
        (d / "results.json").write_text(json.dumps(data))
    assert _paper.find_results(tmp_path, "base").parent.name == "2026-02-01_00-00-00"
    assert _paper.find_results(tmp_path, "grpo_sarl_math") is None


def test_printed_rounding_is_half_up():
    # SARL Table 8: mean(7047.7, 4634.7, 3124.9, 4021.7) = 4707.25 is printed 4707.3
    assert _paper.printed(4707.25, 1) == 4707.3
    assert _paper.printed(4707.25 - 1e-11, 1) == 4707.3  # float noise of the mean
    assert _paper.printed(-1029.35, 1) == -1029.4
    assert _paper.printed(2.675, 2) == 2.68
    assert _paper.printed(None, 1) is None


def test_protocol_tables_notebook_prints_each_papers_table_beside_ours(tmp_path):
    """EVOL-RL Tables 1 and 4, GRP Table 1 and Structured Reasoning Tables 2, 3, 4 and 10 from results of their
    protocols (the fixtures hold the paper's numbers in eval.run's results layout, so each "(ours)" row prints the
    paper's; the Avg. column is computed, decisions §3.2)."""
    import _protocols

    run_notebook("protocol_tables.py", "--results", FIXTURES / "protocols", "--out", tmp_path)
    for name in _protocols.TABLES:
        assert (tmp_path / f"{name}.md").is_file() and (tmp_path / f"{name}.csv").is_file()
    evol = table_lines(tmp_path / "evol_rl.md")
    paper_row = "| w/EVOL-RL (paper) | 80.0/93.3 | 20.7/47.6 | 17.5/39.9 | 51.4/80.3 | 37.2/88.7 |"
    assert paper_row in evol and evol[evol.index(paper_row) + 1] == paper_row.replace("(paper)", "(ours)")
    assert "| Base Model (paper) | 63.6/91.5 | 12.0/39.4 | 8.2/30.8 | 38.7/77.6 | 34.9/88.0 |" in evol  # 8B
    grp = table_lines(tmp_path / "grp.md")
    assert (
        "| + PASC-GRPO (Qwen3-8B-Base) (paper) | 95.37 | 91.20 | 82.50 | 46.67 | 38.79 | 77.49 | 65.24 | 88.43 |"
        in ("\n".join(grp))
    )
    ours = "| + PASC-GRPO (Qwen3-8B-Base) (ours) | 95.37 | 91.20 | 82.50 | 46.67 | 38.79 | 77.49 | 65.24 | 88.43 |"
    assert ours + " 83.98 | 56.12 |" in grp  # the code benchmarks too (eval/code.py)
    assert "| Qwen3-8B (GRP Table 3) (paper) | - | - | - | - | - | 76.70 | 65.10 | - | - | 57.29 |" in grp
    structured = table_lines(tmp_path / "structured.md")
    assert structured[0] == (
        "| Model | AIME'24 | AIME'25 | AMC | MATH500 | Minerva | Olympiad | DROP | LSAT-AR | MMLU-ALL | Avg. |"
    )
    at_8k = structured.index("| *max_tokens 8192* |  |  |  |  |  |  |  |  |  |  |")
    maxflow = "| Ours(MaxFlow) (ours) | 36.67 | 27.78 | 77.83 | 85.33 | 34.22 | 54.81 | 42.53 | 31.26 | 49.60 | 48.89 |"
    assert structured[-1] == maxflow and at_8k < len(structured) - 1
    at_1k = "| Ours(MaxFlow) (ours) | 2.22 | 1.11 | 23.33 | 44.67 | 14.95 | 14.42 | 34.65 | 22.32 | 42.04 | 22.19 |"
    assert structured.index(at_1k) < at_8k
    # Table 10 reads the same run at the 8K cap (the fixture's stds are 1.0)
    table10 = table_lines(tmp_path / "structured_table10.md")
    paper_row = "| MAX-FLOW (paper) | 36.7±8.9 | 27.0±8.2 | 77.8±6.6 | 85.3±1.6 | 34.2±2.9 | 54.9±1.9 | 52.6±5.0 |"
    assert table10[-2] == paper_row + " 58.1±2.1 |"
    ours = "| MAX-FLOW (ours) | 36.7±1.0 | 27.8±1.0 | 77.8±1.0 | 85.3±1.0 | 34.2±1.0 | 54.8±1.0 | 52.8±1.0 |"
    assert table10[-1] == ours + " 58.1±1.0 |"
    temperature = table_lines(tmp_path / "structured_temperature.md")
    assert "| Ours(MaxFlow) (ours) | 85.08±0.53 | 54.28±0.29 | 31.35±0.47 |" in temperature
    assert "| Light-R1 (paper) | 89.47±1.12 | 59.56±0.57 | 50.00±3.37 |" in temperature
    assert "temp_grpo_7b (no results.json)" in (tmp_path / "structured_temperature.md").read_text()


def write_protocol_results(root, row, protocol, benchmarks):
    """A results.json of eval.run for `row`: {label: metrics} as `math.benchmarks`."""
    results = {
        "run": {"name": row},
        "complete": True,
        "math": {"benchmarks": {label: {"metrics": metrics} for label, metrics in benchmarks.items()}},
        "protocol": {"name": protocol, "paper": "", "benchmarks": []},
    }
    (root / row).mkdir(parents=True)
    (root / row / "results.json").write_text(json.dumps(results), encoding="utf-8")


def test_structured_tables_3_and_10_and_evol_rl_table_4_from_results(tmp_path):
    """Structured Reasoning Table 3 (7B, per cap, Avg. computed), Table 10 (mean ± std at the 8K cap, Avg. and Large
    Avg. each the mean of the printed means and of the printed stds) and EVOL-RL Table 4 (ablations, pass@1/pass@16)
    from results holding the paper's numbers: each "(ours)" row prints the paper's."""
    import _protocols

    t3, t10, t4 = (_protocols.reported(n) for n in ("structured_7b", "structured_table10", "evol_rl_ablation"))
    maxflow_7b = next(r for r in t3["rows"] if r["id"] == "maxflow_7b")
    write_protocol_results(
        tmp_path,
        "maxflow_7b",
        "structured",
        {
            f"{b}/max_tokens={cap}": {"pass@1_mean": v[0], "pass@1_std": 0.5}
            for cap, values in maxflow_7b["values"].items()
            for b, v in zip(t3["columns"], values)
        },
    )
    r1 = next(r for r in t10["rows"] if r["label"] == "R1-Distill")
    cells = dict(zip(t10["columns"], r1["values"]))
    write_protocol_results(
        tmp_path,
        r1["id"],
        "structured",
        {f"{b}/max_tokens=8192": {"pass@1_mean": m, "pass@1_std": s} for b, (m, s) in cells.items()},
    )
    ablation = next(r for r in t4["rows"] if r["id"] == "qwen3_4b_base_evol_rl_aime24_no_ent")
    cells = dict(zip(t4["columns"], ablation["values"]))
    write_protocol_results(
        tmp_path, ablation["id"], "evol_rl", {b: {"pass@1": a, "pass@16": b16} for b, (a, b16) in cells.items()}
    )

    lines = _paper.markdown(_protocols.protocol_table("structured_7b", tmp_path)).splitlines()
    at_8k = "| Ours(MaxFlow) (ours) | 53.78 | 41.00 | 91.25 | 92.67 | 41.54 | 61.78 | 53.03 | 52.74 | 62.77 | 61.17 |"
    assert lines[lines.index(at_8k) - 1] == at_8k.replace("(ours)", "(paper)")
    assert "| Light-R1 (paper) | 3.33 | 3.33 | 25.00 | 38.33 | 17.65 | 11.95 | 43.27 | 23.04 | 54.50 | 24.49 |" in lines

    t = _protocols.protocol_table("structured_table10", tmp_path)
    row = "| R1-Distill (ours) | 28.7±4.8 | 22.3±5.2 | 71.5±3.9 | 84.9±0.3 | 30.5±1.0 | 52.4±0.4 | 48.4±2.6 |"
    assert row + " 55.9±0.6 |" in _paper.markdown(t).splitlines()
    assert t.attrs["values"]["ds_distill_qwen_1_5b"]["large_avg"] == 55.9
    assert "| *Ours Based on: Deepseek-R1-Distill-Qwen-1.5B (RL)* |" in _paper.markdown(t)

    lines = _paper.markdown(_protocols.protocol_table("evol_rl_ablation", tmp_path)).splitlines()
    ours = "| -Ent (ours) | 66.7/89.8 | 10.0/31.4 | 6.6/27.8 | 38.7/74.2 | 34.0/86.2 |"
    assert lines[lines.index(ours) - 1] == ours.replace("(ours)", "(paper)")
    assert lines.index("| *AIME24* |  |  |  |  |  |") < lines.index(ours)


def test_the_average_columns_rule_gives_the_papers_own_averages():
    """Structured Reasoning's "Avg." and "Large Avg." are the mean of the printed cells, printed half up (decisions
    §3.2): it gives every such cell of Tables 2, 3 and 10 but these eight, where the paper's printed average is not
    the mean of its printed cells (Table 2: 24.07, 32.29 and 32.79 from its cells; Table 3: 34.80 and 32.46; Table
    10: 35.4, 48.0 and 52.7)."""
    import _protocols

    off = {
        ("structured", "lcs_1_5b", 1024, "avg"),
        ("structured", "grpo_1_5b", 2048, "avg"),
        ("structured", "maxflow_1_5b", 2048, "avg"),
        ("structured_7b", "lcs_7b", 1024, "avg"),
        ("structured_7b", "maxflow_7b", 1024, "avg"),
        ("structured_table10", "oat_zero_1_5b", None, "avg"),
        ("structured_table10", "l1_exact_1_5b", None, "avg"),
        ("structured_table10", "maxflow_1_5b", None, "avg"),
    }
    found, checked = set(), 0
    for name in ("structured", "structured_7b", "structured_table10"):
        spec = _protocols.reported(name)
        n = len(spec["columns"])
        for r in spec["rows"]:
            blocks = r["values"].items() if spec.get("sweep") else [(None, r["values"])]
            for cap, values in blocks:
                computed = _protocols.averages(spec, values[:n])
                for avg, got, printed in zip(spec["averages"], computed, values[n:], strict=True):
                    checked += 1
                    if got[0] != printed[0]:
                        found.add((name, r["id"], cap, avg["key"]))
                    if len(got) > 1:  # Table 10's std: the mean of the printed stds, every row
                        assert got[1] == printed[1], (name, r["id"], avg["key"])
    assert found == off and checked == 24 + 20 + 28


def test_protocol_table_leaves_out_results_of_another_protocol_and_says_so(tmp_path):
    import _protocols

    results = tmp_path / "results"
    shutil.copytree(FIXTURES / "protocols" / "maxflow_1_5b", results / "temp_maxflow_1_5b")
    table = _protocols.protocol_table("structured_temperature", results)
    assert (
        "temp_maxflow_1_5b (results of protocol structured only; needs protocol structured_temperature)"
        in (table.attrs["missing"])
    )
    assert "temp_maxflow_1_5b" not in table.attrs["values"]
    proc = run_python(NOTEBOOKS / "protocol_tables.py", "--results", results, "--out", tmp_path / "out", timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        "Structured Reasoning Table 4: 0 of" in proc.stderr and "needs protocol structured_temperature" in proc.stderr
    )


def test_fig2a_structure_reward_before_and_after(tmp_path):
    proc = run_notebook("fig2_structure.py", "--results", FIXTURES / "results", "--out", tmp_path)
    assert "Fig. 2b skipped" in proc.stdout
    assert_png(tmp_path / "fig2a_structure_reward.png")
    fig2a = json.loads((tmp_path / "fig2a.json").read_text())
    assert list(fig2a["benchmarks"]) == ["AIME25", "AMC23", "MATH500", "Minerva", "WildBench"]
    # SARL Sec. 4.4: AIME25's SR rises by 179% (fixture: 0.200 -> 0.558)
    assert fig2a["benchmarks"]["AIME25"]["change_pct"] == pytest.approx(179.0)
    assert fig2a["benchmarks"]["WildBench"]["row"] == "grpo_sarl_open"


@pytest.mark.slow
def test_fig2b_reasoning_maps_with_minilm(tmp_path):
    responses = FIXTURES / "fig2b_responses.jsonl"
    run_notebook("fig2_structure.py", "--results", FIXTURES / "results", "--responses", responses, "--out", tmp_path)
    for name in ("fig2b_before.png", "fig2b_after.png", "fig2b_reasoning_maps.png"):
        assert_png(tmp_path / name)
    fig2b = json.loads((tmp_path / "fig2b.json").read_text())
    assert fig2b["before"]["n_steps"] == 11 and fig2b["after"]["n_steps"] == 9
    assert 0.0 <= fig2b["before"]["sr"] <= 1.5


def test_fig3_training_dynamics_from_metrics_jsonl(tmp_path):
    run_notebook("fig3_training.py", "--training", FIXTURES / "training", "--out", tmp_path)
    assert_png(tmp_path / "fig3_training_dynamics.png")
    series = json.loads((tmp_path / "fig3.json").read_text())
    assert set(series) == {"KL to the reference", "policy entropy", "response length (tokens)"}
    kl = series["KL to the reference"]
    assert set(kl) == {"Ground-Truth", "TTRL", "EMPO", "SARL"}
    assert kl["SARL"]["key"] == "actor/kl" and kl["SARL"]["steps"] == list(range(1, 21))
    assert kl["SARL"]["values"][-1] == pytest.approx(0.02)


def test_fig3_reads_verl_names_and_keeps_the_last_record_of_a_repeated_step(tmp_path):
    rows = [
        {"step": 1, "actor/kl_loss": 0.1, "actor/entropy": 0.5, "response_length/mean": 100.0},
        {"step": 2, "actor/kl_loss": 0.9, "actor/entropy": 0.4, "response_length/mean": 90.0},
        {"step": 2, "actor/kl_loss": 0.2, "actor/entropy": 0.4, "response_length/mean": 90.0},  # resumed run
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_notebook("fig3_training.py", "--runs", f"verl={run_dir}", "--out", tmp_path / "out")
    kl = json.loads((tmp_path / "out" / "fig3.json").read_text())["KL to the reference"]["verl"]
    assert kl == {"key": "actor/kl_loss", "steps": [1, 2], "values": [0.1, 0.2]}


def test_fig3_reads_the_metrics_jsonl_of_verls_file_logger(tmp_path):
    """verl's file logger writes `{"step", "data": {...}}` lines, a step's validation on a line of its own."""
    lines = [
        {"step": 0, "data": {"val-core/smoke/acc/mean@1": 0.5}},
        {"step": 1, "data": {"actor/kl_loss": 0.1, "actor/entropy": 0.5, "response_length/mean": 100.0}},
        {"step": 2, "data": {"actor/kl_loss": 0.3, "actor/entropy": 0.4, "response_length/mean": 90.0}},
        {"step": 2, "data": {"val-core/smoke/acc/mean@1": 0.6}},
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    run_notebook("fig3_training.py", "--runs", f"verl={run_dir}", "--out", tmp_path / "out")
    series = json.loads((tmp_path / "out" / "fig3.json").read_text())
    assert series["KL to the reference"]["verl"] == {"key": "actor/kl_loss", "steps": [1, 2], "values": [0.1, 0.3]}
    assert series["response length (tokens)"]["verl"]["values"] == [100.0, 90.0]


FAKE_WANDB = """
import json, os


class _Run:
    def __init__(self, path):
        self.path = path

    def scan_history(self):
        # W&B's public API: one dict per logged step, `_step` plus the keys logged at that step
        with open(os.environ["FAKE_WANDB_HISTORY"]) as f:
            yield from json.load(f)[self.path]


class Api:
    def run(self, path):
        with open(os.environ["FAKE_WANDB_HISTORY"]) as f:
            if path not in json.load(f):
                raise ValueError(f"Could not find run {path}")
        return _Run(path)
"""


def test_fig3_reads_wandb_history_through_the_public_api(tmp_path):
    """The `wandb:ENTITY/PROJECT/RUN_ID` source through `wandb.Api().run(...).scan_history()` (a stand-in module with
    that API: no W&B server here): rows without any panel metric (system rows) are skipped, W&B's `_step` is the
    step, and verl's and TRL's names both land in their panels."""
    history = {
        "me/sarl/verl1": [
            {"_step": 0, "_runtime": 1.0, "system/gpu": 3},
            {"_step": 1, "actor/kl_loss": 0.1, "actor/entropy": 0.5, "response_length/mean": 100.0},
            {"_step": 2, "actor/kl_loss": 0.2, "actor/entropy": 0.4, "response_length/mean": None},
        ],
        "me/sarl/trl1": [{"_step": 5, "actor/kl": 0.3, "actor/entropy": 0.6, "response_length/mean": 80.0}],
    }
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "wandb.py").write_text(FAKE_WANDB)
    (tmp_path / "history.json").write_text(json.dumps(history))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")]),
        "FAKE_WANDB_HISTORY": str(tmp_path / "history.json"),
    }
    runs = "verl=wandb:me/sarl/verl1,trl=wandb:me/sarl/trl1"
    run_notebook("fig3_training.py", "--runs", runs, "--out", tmp_path / "out", env=env)
    assert_png(tmp_path / "out" / "fig3_training_dynamics.png")
    series = json.loads((tmp_path / "out" / "fig3.json").read_text())
    assert series["KL to the reference"]["verl"] == {"key": "actor/kl_loss", "steps": [1, 2], "values": [0.1, 0.2]}
    assert series["KL to the reference"]["trl"] == {"key": "actor/kl", "steps": [5], "values": [0.3]}
    assert series["response length (tokens)"]["verl"]["steps"] == [1]
    proc = run_python(NOTEBOOKS / "fig3_training.py", "--runs", "x=wandb:me/sarl/nope", "--out", tmp_path, env=env)
    assert proc.returncode != 0 and "Could not find run me/sarl/nope" in proc.stderr


def test_view_response_draws_one_map_and_lists_steps_by_function(tmp_path, keyword_embedder):
    reward = StructureReward(keyword_embedder, variant="sarl", clustering="kmeans")
    text = "<think>plan it\n\ncalc one\n\ncheck one\n\ncalc two\n\ncheck two\n\nanswer</think> 3"
    png, analysis = view_response(text, reward, tmp_path / "map.png")
    assert_png(png)
    rows = step_table(analysis)
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0][1] == "F1"
    # the same cluster is the same function, numbered by first appearance as in the map
    by_text = {r[2]: r[1] for r in rows}
    assert (by_text["calc one"] == by_text["calc two"]) == (analysis.labels[1] == analysis.labels[3])


def test_view_response_reports_a_failed_reward(tmp_path, keyword_embedder):
    from fakes import KeywordEmbedder

    reward = StructureReward(KeywordEmbedder(bad={"calc one": [float("nan")] * 16}), clustering="kmeans")
    with pytest.raises(ValueError, match="could not be computed"):
        view_response("<think>plan\n\ncalc one\n\ncheck</think>", reward, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow
def test_score_cli_view_one_response(tmp_path):
    proc = run_module("sarl.score", f"hydra.run.dir={tmp_path}/run", "view=aime-loop", f"plot_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_png(tmp_path / "aime-loop.png")
    assert "function" in proc.stdout and "F1" in proc.stdout
    bad = run_module("sarl.score", f"hydra.run.dir={tmp_path}/run2", "view=nope")
    assert bad.returncode != 0 and "no response with that id" in bad.stderr
