"""The report of a reward comparison: SARL's Table 2, Fig. 3 and Fig. 2a in miniature, from the stages of a pipeline.

`python -m sarl.train +exp=smoke_compare` trains the same tiny policy once per reward (one pipeline stage each,
the stage's name the reward's label: SARL, Ground-Truth, TTRL), each run measuring its held-out prompts before
and after training (sarl/reports/heldout.py). When every stage has finished, the pipeline calls `report`, which writes
into the pipeline's run directory:

- `table2_mini.md` / `.csv`: per reward, held-out accuracy and SR (SARL Eq. 6) before and after training, the
  difference with its 95% paired bootstrap interval, and the health signals after training (SARL Table 2 in
  miniature: the paper reports accuracy per reward; SR is what the structure reward trains);
- `fig3_training_dynamics.png` / `fig3.json`: KL to the reference, policy entropy and response length per
  training step, one curve per reward (SARL Fig. 3);
- `fig2a_structure_reward.png` / `fig2a.json`: held-out SR before and after training per reward (SARL Fig. 2a,
  whose categories are benchmarks; here they are the rewards);
- `compare.json`: each stage's `heldout` block.

The tables and figures are drawn by sarl/reports/figures.py, the code the notebooks use for the paper's own.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sarl.reports import figures
from sarl.reports.heldout import before_after_cells
from sarl.runtime.errors import UserError

log = logging.getLogger("sarl.reports.compare")

TABLE_HEADER = (
    "Reward",
    "Acc. before",
    "Acc. after",
    "Δ Acc. [95% CI]",
    "SR before",
    "SR after",
    "Δ SR [95% CI]",
    "Boxed after",
    "Truncated after",
)


def heldout_block(stage_dir: Path) -> dict:
    """A finished run's `summary.json` `heldout` block (UserError if the run measured none)."""
    path = stage_dir / "summary.json"
    try:
        block = json.loads(path.read_text(encoding="utf-8")).get("heldout")
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot read the stage's summary ({err})") from err
    if not block:
        raise UserError(f"{path}: no 'heldout' block; the run measured no held-out prompts (heldout.files unset?)")
    return block


def comparison_table(blocks: dict[str, dict]):
    """SARL Table 2 in miniature: one row per reward (label -> its `heldout` block)."""
    table = figures.new_table(
        "table2_mini", "SARL Table 2 in miniature: held-out accuracy and SR per training reward", TABLE_HEADER
    )
    for label, block in blocks.items():
        b, a, d = block["before"], block["after"], block["delta"]
        figures.append_row(
            table,
            [
                label,
                *before_after_cells(block, "accuracy"),
                *before_after_cells(block, "sr_mean", with_se=True),
                f"{a['boxed']:.3f}",
                f"{a['truncated']:.3f}",
            ],
        )
        table.attrs["values"][label] = {
            "accuracy_before": b["accuracy"],
            "accuracy_after": a["accuracy"],
            "accuracy_delta": d["accuracy"],
            "sr_before": b["sr_mean"],
            "sr_after": a["sr_mean"],
            "sr_delta": d["sr_mean"],
            "sr_delta_ci95_low": d["sr_delta_ci95"][0],
            "sr_delta_ci95_high": d["sr_delta_ci95"][1],
        }
    return table


def report(run_dir: Path, stage_dirs: dict[str, Path]) -> None:
    """Write the comparison's table and figures into `run_dir` (module docstring) and print the table."""
    run_dir = Path(run_dir)
    blocks = {label: heldout_block(Path(d)) for label, d in stage_dirs.items()}
    table = comparison_table(blocks)
    written = figures.write(table, run_dir)
    print(figures.markdown(table))

    try:
        histories = {label: figures.read_metrics_history(Path(d)) for label, d in stage_dirs.items()}
    except ValueError as err:
        raise UserError(str(err)) from err
    fig3_png = run_dir / "fig3_training_dynamics.png"
    series, left_out = figures.plot_training_dynamics(
        histories, fig3_png, title="Training dynamics per reward (SARL Fig. 3 in miniature)"
    )
    for line in left_out:
        log.warning("%s", line)
    (run_dir / "fig3.json").write_text(json.dumps(series, indent=1), encoding="utf-8")

    bars = {
        label: {
            "base": block["before"]["sr_mean"],
            "trained": block["after"]["sr_mean"],
            "change_pct": figures.change_pct(block["before"]["sr_mean"], block["after"]["sr_mean"]),
        }
        for label, block in blocks.items()
    }
    fig2a_png = run_dir / "fig2a_structure_reward.png"
    figures.plot_structure_bars(
        bars, fig2a_png, labels=("before", "after"), title="Held-out SR before and after training, per reward"
    )
    (run_dir / "fig2a.json").write_text(json.dumps(bars, indent=1), encoding="utf-8")
    (run_dir / "compare.json").write_text(json.dumps(blocks, indent=1), encoding="utf-8")
    for path in (*written, fig3_png, fig2a_png):
        print(f"written: {path}")
