"""Per-step metrics of a TRL run: `metrics.jsonl` in the run directory, W&B, a console table (the curves:
sarl.reports.curves).

TRL's trainers hand every logged dict to the callbacks' `on_log`. The recorder writes each value once, under the
name the verl runs use where there is one, so that notebooks read both backends alike:

    reward/mean, reward/std        <- reward, reward_std (GRPO)
    actor/kl                       <- kl (k3 estimator, TRL)
    actor/entropy                  <- entropy
    response_length/mean           <- completions/mean_length
    reward/zero_std_frac           <- frac_reward_zero_std (groups whose rewards are all equal)

TRL's per-function `rewards/<function>/mean` and `/std` are left out when the run has one reward function (they are
`reward/mean` and `reward/std` again); with several they are kept, one pair per function.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)

ALIASES = {
    "reward": "reward/mean",
    "reward_std": "reward/std",
    "kl": "actor/kl",
    "entropy": "actor/entropy",
    "completions/mean_length": "response_length/mean",
    "frac_reward_zero_std": "reward/zero_std_frac",
}
TABLE = [
    ("step", "step"),
    ("reward", "reward/mean"),
    ("std", "reward/std"),
    ("SR", "reward/sr/mean"),
    ("C", "reward/C/mean"),
    ("L", "reward/L/mean"),
    ("steps", "reward/n_steps/mean"),
    ("KL", "actor/kl"),
    ("entropy", "actor/entropy"),
    ("length", "response_length/mean"),
    ("zero-std", "reward/zero_std_frac"),
    ("failed", "reward/failed"),
    ("loss", "loss"),
]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_metrics(path: str | Path, last_step: int) -> int:
    """Drop the records after `last_step` (a resumed run logs those steps again). Returns how many."""
    rows = read_metrics(path)
    keep = [r for r in rows if r.get("step", 0) <= last_step]
    if len(keep) != len(rows):
        tmp = Path(str(path) + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        tmp.replace(path)
    return len(rows) - len(keep)


def verl_style(row: dict[str, Any]) -> dict[str, Any]:
    """Each value once (module docstring): TRL's names renamed to verl's, a lone reward function's copy dropped."""
    out = {ALIASES.get(k, k): v for k, v in row.items()}
    functions = {k.split("/")[1] for k in out if k.startswith("rewards/") and k.endswith("/mean") and k.count("/") == 2}
    if len(functions) == 1:
        (name,) = functions
        out.pop(f"rewards/{name}/mean", None)
        out.pop(f"rewards/{name}/std", None)
    return out


class MetricsRecorder(TrainerCallback):
    """Writes each training log as one JSON line (`step` + metrics) and forwards it to W&B."""

    def __init__(self, path: str | Path, wandb_run: Any = None) -> None:
        self.path = Path(path)
        self.wandb_run = wandb_run

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001 (TrainerCallback signature)
        if not logs or not state.is_world_process_zero:
            return
        if any(k.startswith("train_") for k in logs) and "loss" not in logs:
            return  # the end-of-training summary (train_runtime, ...), not a step
        row: dict[str, Any] = {"step": int(state.global_step)}
        for key, value in logs.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[key] = float(value)
            elif value is None:
                row[key] = None
        row = verl_style(row)
        with self.path.open("a") as f:
            f.write(
                json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()})
                + "\n"
            )
            f.flush()
            os.fsync(f.fileno())
        log.info("step %d  %s", row["step"], metrics_step_line(row))
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=row["step"])


def metrics_step_line(row: dict[str, Any]) -> str:
    """`reward=0.53 SR=0.53 KL=0.002 ...`: the table's columns present in one record."""
    cells = [f"{title}={row[key]:.4g}" for title, key in TABLE[1:] if row.get(key) is not None]
    return " ".join(cells)


def summary_table(rows: list[dict[str, Any]]) -> Any:
    """A rich table of the per-step metrics (columns that no row has are left out)."""
    from rich.table import Table

    cols = [(title, key) for title, key in TABLE if any(r.get(key) is not None for r in rows)]
    table = Table(title="per-step metrics")
    for title, _ in cols:
        table.add_column(title, justify="right")
    for r in rows:
        cells = []
        for _, key in cols:
            v = r.get(key)
            cells.append("" if v is None else (str(int(v)) if key == "step" else f"{v:.4g}"))
        table.add_row(*cells)
    return table
