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
# # SARL Fig. 3: GRPO training dynamics (KL to the reference, policy entropy, response length)
#
# One curve per method, from each run's local `metrics.jsonl` (the TRL back end writes it in the run directory) or
# from its W&B history. Runs are named `LABEL=SOURCE`, comma-separated, where SOURCE is a run directory or a
# `metrics.jsonl` file, or `wandb:ENTITY/PROJECT/RUN_ID`:
#
#     python notebooks/fig3_training.py --out runs/paper \
#         --runs "SARL=runs/grpo_sarl_math/2026-01-01_00-00-00,TTRL=wandb:me/sarl/abc123"
#
# Without `--runs`, every `TRAINING/<row>/metrics.jsonl` of the four GRPO rows of Fig. 3 is used (`--training DIR`).

# %%
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path("notebooks").resolve()) if Path("notebooks/_paper.py").exists() else ".")
import _paper as paper  # noqa: E402

from sarl.reports import figures  # noqa: E402

SETTINGS = paper.settings(
    "SARL Fig. 3: KL, entropy and response length of GRPO runs, from metrics.jsonl or W&B.",
    runs=("", "LABEL=SOURCE,... (SOURCE: a run directory, a metrics.jsonl or wandb:ENTITY/PROJECT/RUN_ID)"),
    training=("runs", "where the rows' training runs are (used when --runs is not given)"),
    out=("runs/paper", "where the figure is written"),
)
RUNS, TRAINING, OUT = SETTINGS["runs"], SETTINGS["training"], Path(SETTINGS["out"])
OUT.mkdir(parents=True, exist_ok=True)
FIG3_ROWS = {
    "grpo_gt_math": "Ground-Truth",
    "grpo_ttrl_math": "TTRL",
    "grpo_empo_math": "EMPO",
    "grpo_sarl_math": "SARL",
}

PANELS = figures.FIG3_PANELS  # the metric of each panel: TRL's name first, then verl's


# %% [markdown]
# ## Load each run's history (local metrics.jsonl or W&B)


# %%
def local_history(path: Path) -> list[dict]:
    """Rows of a metrics.jsonl (a run directory holds it at its top level), the last record of a repeated step."""
    try:
        return figures.read_metrics_history(path)
    except ValueError as err:
        raise SystemExit(str(err)) from err


def wandb_history(run_path: str) -> list[dict]:
    """A W&B run's full history (needs network access and a W&B login)."""
    import wandb

    keys = [k for _, names in PANELS for k in names]
    run = wandb.Api().run(run_path)
    rows = []
    for row in run.scan_history():
        step = row.get("_step", row.get("step"))
        if step is not None and any(row.get(k) is not None for k in keys):
            rows.append({"step": int(step), **{k: row[k] for k in keys if row.get(k) is not None}})
    return rows


if RUNS:
    sources = dict(item.split("=", 1) for item in RUNS.split(",") if item.strip())
else:
    sources = {
        label: str(Path(TRAINING) / row / "metrics.jsonl")
        for row, label in FIG3_ROWS.items()
        if (Path(TRAINING) / row / "metrics.jsonl").is_file()
    }
if not sources:
    raise SystemExit(f"no runs: give --runs LABEL=SOURCE,... or put <row>/metrics.jsonl under {TRAINING}")
histories = {
    label: wandb_history(src.removeprefix("wandb:")) if src.startswith("wandb:") else local_history(Path(src))
    for label, src in sources.items()
}

# %% [markdown]
# ## Plot: one panel per metric, one curve per method

# %%
series, left_out = figures.plot_training_dynamics(histories, OUT / "fig3_training_dynamics.png", panels=PANELS)
for line in left_out:
    print(line)
(OUT / "fig3.json").write_text(json.dumps(series, indent=1), encoding="utf-8")
for title, by_label in series.items():
    print(
        title + ": " + ", ".join(f"{lab} {v['values'][-1]:.4g} at step {v['steps'][-1]}" for lab, v in by_label.items())
    )
