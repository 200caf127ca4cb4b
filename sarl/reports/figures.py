"""The tables and figures of the SARL paper, shared by the notebooks (notebooks/) and the smoke comparison
(`python -m sarl.train +exp=smoke_compare`, sarl/reports/compare.py): one implementation of each.

Tables are pandas DataFrames of the printed cells (columns: the header), with `attrs` holding the file name
(`name`), `title`, the numbers behind the cells (`values`: row -> column -> number) and the rows that had no
results (`missing`). Figures:

- `plot_structure_bars`: SARL Fig. 2a, mean structure reward SR before and after training per category
  (benchmarks in the paper, rewards in the smoke comparison), annotated with the relative change.
- `plot_training_dynamics`: SARL Fig. 3, one panel per metric (KL to the reference, policy entropy, response
  length), one curve per run, from each run's history (`read_metrics_history` reads a local metrics.jsonl).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

# SARL Fig. 3's panels: the metric of each, the TRL back end's name first, then verl's (KL is verl's kl_loss).
FIG3_PANELS = (
    ("KL to the reference", ("actor/kl", "actor/kl_loss")),
    ("policy entropy", ("actor/entropy",)),
    ("response length (tokens)", ("response_length/mean",)),
)


# -- tables --------------------------------------------------------------------------------------------


def new_table(name: str, title: str, header: Sequence[str], rows: Sequence[Sequence[str]] = ()) -> pd.DataFrame:
    """A table: the printed cells as a DataFrame (columns `header`), its file name, title, the numbers behind the
    cells and what was missing in `attrs`."""
    t = pd.DataFrame([list(r) for r in rows], columns=list(header), dtype=object)
    t.attrs.update(name=name, title=title, values={}, missing=[])
    return t


def append_row(table: pd.DataFrame, cells: Sequence[str]) -> None:
    """Add one printed row at the end of `table` (in place)."""
    table.loc[len(table)] = list(cells)


def values_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The numbers behind a table's cells: one row per run, one column per quantity."""
    return pd.DataFrame.from_dict(table.attrs["values"], orient="index")


def markdown(table: pd.DataFrame) -> str:
    """The table as the paper prints it: a `###` title, a pipe table of the printed cells, and a line listing
    what was not available."""
    header = list(table.columns)
    lines = [f"### {table.attrs['title']}", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in table.itertuples(index=False)]
    if table.attrs["missing"]:
        lines += ["", "Not available (shown as -): " + "; ".join(table.attrs["missing"]) + "."]
    return "\n".join(lines) + "\n"


def write(table: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """`<name>.md` (markdown(table)) and `<name>.csv` (the printed cells, header first) in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, csv_path = out_dir / f"{table.attrs['name']}.md", out_dir / f"{table.attrs['name']}.csv"
    md.write_text(markdown(table), encoding="utf-8")
    table.to_csv(csv_path, index=False, lineterminator="\r\n", encoding="utf-8")
    return [md, csv_path]


# -- figures -------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_structure_bars(
    bars: dict[str, dict[str, Any]],
    out_png: str | Path,
    labels: tuple[str, str] = ("Base", "SARL"),
    title: str = "Structure reward before and after SARL training",
) -> None:
    """SARL Fig. 2a: for each category (x axis) the mean SR before (`bars[c]["base"]`) and after
    (`bars[c]["trained"]`) training, side by side, the after bar annotated with `bars[c]["change_pct"]`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.6 * len(bars) + 2, 3.6))
    xs = range(len(bars))
    ax.bar([x - 0.2 for x in xs], [v["base"] for v in bars.values()], 0.4, label=labels[0], color="#b0b0b0")
    ax.bar([x + 0.2 for x in xs], [v["trained"] for v in bars.values()], 0.4, label=labels[1], color="#4c72b0")
    for x, v in zip(xs, bars.values()):
        ax.annotate(f"{v['change_pct']:+.0f}%", (x + 0.2, v["trained"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), list(bars))
    ax.set_ylabel("mean structure reward SR")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def change_pct(before: float, after: float) -> float:
    """SARL Fig. 2a's annotation: the change of SR after training, relative to before, in percent."""
    return (after - before) / before * 100.0


# in a run directory: every back end's per-step records (TRL's recorder, verl's file logger)
METRICS_FILE = "metrics.jsonl"


def read_metrics_history(path: str | Path) -> list[dict]:
    """Rows of a metrics.jsonl (or of a run directory's), in step order, flat (`{"step", metric: value}`) whichever
    back end wrote it: TRL's lines are flat, verl's file logger writes `{"step", "data": {metric: value}}`, and
    verl logs a step's validation apart from its training metrics, so the records of one step are merged, a later
    record's value winning (a resumed run's repeated step keeps its last values). ValueError (naming the file and
    line) if it is missing or not JSON lines."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist: give a run directory with metrics.jsonl or the file itself")
    by_step = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {n}: not valid JSON ({err})") from err
            if isinstance(row.get("data"), dict):  # verl's file logger
                row = {"step": row["step"], **row["data"]}
            step = int(row["step"])
            by_step[step] = {**by_step.get(step, {}), **row}
    return [by_step[s] for s in sorted(by_step)]


def plot_training_dynamics(
    histories: dict[str, list[dict]],
    out_png: str | Path,
    title: str = "Training dynamics under GRPO (SARL Fig. 3)",
    panels=FIG3_PANELS,
) -> tuple[dict[str, dict[str, dict]], list[str]]:
    """SARL Fig. 3: one panel per metric, one curve per run (`histories`: label -> rows with `step`). Returns the
    plotted series (panel -> label -> {key, steps, values}) and a line for each run left out of a panel (its
    history has none of the panel's metric names)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6))
    series: dict[str, dict[str, dict]] = {}
    left_out = []
    for ax, (panel, names) in zip(axes, panels):
        for label, rows in histories.items():
            key = next((k for k in names if any(r.get(k) is not None for r in rows)), None)
            if key is None:
                left_out.append(f"{label}: no {' or '.join(names)} in its history; left out of '{panel}'")
                continue
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label)
            series.setdefault(panel, {})[label] = {
                "key": key,
                "steps": [p[0] for p in pts],
                "values": [p[1] for p in pts],
            }
        ax.set_title(panel)
        ax.set_xlabel("training step")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return series, left_out
