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
# # EVOL-RL Tables 1 and 4, GRP Tables 1, 2 and 4, Structured Reasoning Tables 2, 3, 4, 10, 11 and 15 from results
#
# Reads the `results.json` that `python -m eval.run ckpt=... protocol=<protocol> name=<row id>` writes, one
# directory per row under `RESULTS` (the row ids are those of `notebooks/reported/<table>.yaml`, which holds
# the paper's own numbers, typed from the cited table, and names the protocol). Each table prints the paper's row
# and, under it, ours. `<table>.md` and `<table>.csv` are written to `OUT`. EVOL-RL Table 5 is not here
# (docs/evaluation.md says why).
#
#     python notebooks/protocol_tables.py --results runs/eval --out runs/paper
#
# In Jupyter: `jupytext --to notebook notebooks/protocol_tables.py`, then set `SARL_RESULTS` / `SARL_OUT`.

# %%
import sys
from pathlib import Path

sys.path.insert(0, str(Path("notebooks").resolve()) if Path("notebooks/_paper.py").exists() else ".")
import _paper as paper  # noqa: E402
import _protocols as protocols  # noqa: E402

SETTINGS = paper.settings(
    "The peer papers' tables (EVOL-RL, GRP, Structured Reasoning) beside ours, from eval.run's results.json.",
    results=("runs/eval", "eval.run's results: a folder per row"),
    out=("runs/paper", "where the tables are written"),
)
RESULTS, OUT = SETTINGS["results"], Path(SETTINGS["out"])
paper.check_results_dir(RESULTS, "evol_rl, grp, structured or structured_temperature")
protocols.say_what_is_found(RESULTS)  # per table: the protocol it needs, the rows of another protocol, the command

# %% [markdown]
# ## EVOL-RL Table 1 and Table 4 (the ablations): pass@1 / pass@16 of 32 rollouts (protocol `evol_rl`)

# %%
evol_rl = protocols.protocol_table("evol_rl", RESULTS)
evol_rl_ablation = protocols.protocol_table("evol_rl_ablation", RESULTS)
for t in (evol_rl, evol_rl_ablation):
    print(paper.markdown(t))

# %% [markdown]
# ## GRP Table 1: avg@3 / avg@16, 32K tokens on AIME and 8K elsewhere (protocol `grp`); Table 2 (ablations) and
# Table 4 (length-reducing rewards: accuracy / mean response tokens) on Qwen3-8B-Base, the same evaluation

# %%
grp = protocols.protocol_table("grp", RESULTS)
grp_ablation = protocols.protocol_table("grp_ablation", RESULTS)
grp_length = protocols.protocol_table("grp_length", RESULTS)
for t in (grp, grp_ablation, grp_length):
    print(paper.markdown(t))

# %% [markdown]
# ## Structured Reasoning Tables 2-3 (Pass@1 per maximum response length, 1.5B and 7B, with Avg.), Table 10
# (mean ± std at 8K, with Avg. and Large Avg.) and Table 4 (over temperatures)

# %%
structured = protocols.protocol_table("structured", RESULTS)
structured_7b = protocols.protocol_table("structured_7b", RESULTS)
table10 = protocols.protocol_table("structured_table10", RESULTS)
temperature = protocols.protocol_table("structured_temperature", RESULTS)
for t in (structured, structured_7b, table10, temperature):
    print(paper.markdown(t))

# %% [markdown]
# ## Structured Reasoning Table 11 (GRPO from step 0 to 500 under four rewards, at 8K) and Table 15 (each ablation's
# Avg. minus DS-Distill-Qwen-7B's, per maximum response length; rows with `id: null` are not reproduced)

# %%
table11 = protocols.protocol_table("structured_table11", RESULTS)
table15 = protocols.protocol_table("structured_table15", RESULTS)
for t in (table11, table15):
    print(paper.markdown(t))

# %%
tables = [evol_rl, evol_rl_ablation, grp, grp_ablation, grp_length, structured, structured_7b, table10, temperature]
tables += [table11, table15]
written = [p for t in tables for p in paper.write(t, OUT)]
print(f"wrote {len(written)} files to {OUT}")
