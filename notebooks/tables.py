# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # SARL Tables 2, 3, 4, 5, 8, 9 and 10 from evaluation results
#
# Reads the `results.json` that `python -m eval.run ckpt=...` writes, one directory per row (eval.run names a run after
# the row that trained its checkpoint; `name=ROW` for another):
# `RESULTS/base/` (the base model on the math benchmarks and WildBench) and `RESULTS/<exp>/` for each `conf/exp/`
# row (`grpo_sarl_math`, `ppo_sarl_open`, ...), each either holding `results.json` or `eval.run`'s
# `<date>_<time>/results.json` (the newest complete one is used). Which run is which row comes from the `paper:`
# block of each conf/exp/ file. Every table is a pandas DataFrame of the printed cells (`table.attrs` holds its
# title, the numbers behind it and what was missing; `paper.values_frame(table)` gives the numbers as a DataFrame);
# `tableN.md` and `tableN.csv` are written from them to `OUT`.
#
#     python notebooks/tables.py --results runs/eval --out runs/paper
#     python notebooks/tables.py --results runs/eval --out runs/paper --protocol smoke   # the smoke rows' miniature
#
# In Jupyter: `jupytext --to notebook notebooks/tables.py`, then set `SARL_RESULTS` / `SARL_OUT` (environment)
# or edit the next cell. A row without results is printed as `-` and listed under its table.

# %%
import sys
from pathlib import Path

sys.path.insert(0, str(Path("notebooks").resolve()) if Path("notebooks/_paper.py").exists() else ".")
import _paper as paper  # noqa: E402

SETTINGS = paper.settings(
    "SARL Tables 2-5 and 8-10 from eval.run's results.json, written as Markdown and CSV.",
    results=("runs/eval", "eval.run's results: a folder per row (eval.run names a run after its training row)"),
    out=("runs/paper", "where the tables are written"),
    protocol=("sarl", "sarl: the paper's tables; smoke: Table 2 in miniature from smoke_compare's runs"),
)
RESULTS, OUT, PROTOCOL = SETTINGS["results"], Path(SETTINGS["out"]), SETTINGS["protocol"]

# %% [markdown]
# With `--protocol smoke`: SARL Table 2 in miniature, by the same code, from the smoke rows (`python -m sarl.train
# +exp=smoke_compare`; each stage, and the untrained policy as `name=base`, evaluated with `python -m eval.run
# ckpt=<stage run dir> protocol=smoke`): `table2_smoke.md` / `.csv`, then the notebook stops.

# %%
if PROTOCOL not in ("sarl", "smoke"):
    paper.fail(f"--protocol {PROTOCOL}: choose sarl (SARL's tables) or smoke (Table 2 in miniature)")
if PROTOCOL == "smoke":
    smoke = paper.smoke_table(
        paper.results_or_exit(RESULTS, [r for _, _, r in paper.smoke_rows()], "smoke", "the miniature")
    )
    print(paper.markdown(smoke))
    written = paper.write(smoke, OUT)
    print(f"wrote {len(written)} files to {OUT}")
    raise SystemExit(0)
results = paper.results_or_exit(RESULTS, paper.all_rows(), "sarl", "SARL's tables")

# %% [markdown]
# ## Table 2: math reasoning, avg@8 (Avg = mean of the four benchmarks, Δ% against the base model)

# %%
table2 = paper.accuracy_table("table2", "SARL Table 2: math reasoning, avg@k", paper.TABLE2_ROWS, results)
print(paper.markdown(table2))

# %% [markdown]
# ## Table 3: WildBench (WB Score = weighted category macro average, Δ% against the base model)

# %%
table3 = paper.wildbench_table(results)
print(paper.markdown(table3))

# %% [markdown]
# ## Tables 4, 8 and 9: response length in tokens

# %%
table4, table8, table9 = paper.length_tables(results)
for t in (table4, table8, table9):
    print(paper.markdown(t))

# %% [markdown]
# ## Tables 5 and 10: the structure-reward terms (C only, L only, C + L) under GRPO on math

# %%
table10 = paper.accuracy_table(
    "table10", "SARL Table 10: structure-reward terms per benchmark (GRPO, math)", paper.ABLATION_ROWS, results
)
table5 = paper.ablation_summary_table(results)
for t in (table5, table10):
    print(paper.markdown(t))

# %%
import json  # noqa: E402

tables = [table2, table3, table4, table5, table8, table9, table10]
written = [p for t in tables for p in paper.write(t, OUT)]
summary = {t.attrs["name"]: {"values": t.attrs["values"], "missing": t.attrs["missing"]} for t in tables}
(OUT / "tables.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
(OUT / "tables.md").write_text("\n".join(paper.markdown(t) for t in tables), encoding="utf-8")
print(f"wrote {len(written) + 2} files to {OUT}")
