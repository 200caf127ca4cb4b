"""A run's training curves as a researcher would keep them: `curves.png` in the run directory, for either back end.

    python -m sarl.reports.curves RUN_DIR [--out PNG]

One panel per distinct signal, each drawn only when the run logged it: the reward; the structure reward SR with its
terms C and L (SARL Eq. 6, L on its own axis); reasoning steps; response length; KL to the reference; policy entropy;
failed rewards. A panel that would repeat another's curve step for step (a SARL run's reward is its SR) is left out
and the other's title says so. Every series is drawn raw and faint with a smoothed line over it (an exponential
moving average, debiased at the start, over about a fifth of the run). Where the run measured held-out prompts before
and after training (`summary.json` `heldout`), their SR and length are marked at the first and last step. The
metrics are read from `metrics.jsonl` as either back end writes it (sarl.reports.figures.read_metrics_history).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from sarl.reports.figures import METRICS_FILE, read_metrics_history

CURVES_FILE = "curves.png"
# (panel title, [(series label, candidate keys: the first one logged is drawn)]); the first series is the panel's
PANELS: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = (
    ("reward", (("reward", ("reward/mean", "reward/score/mean", "critic/score/mean", "rewards/chosen", "loss")),)),
    ("structure reward SR = C/2 + 1/(1+L)", (("SR", ("reward/sr/mean",)), ("C", ("reward/C/mean",)))),
    ("reasoning steps", (("steps", ("reward/n_steps/mean",)),)),
    ("response length (tokens)", (("length", ("response_length/mean",)),)),
    ("KL to the reference", (("KL", ("actor/kl", "actor/kl_loss")),)),
    ("policy entropy", (("entropy", ("actor/entropy",)),)),
    ("failed rewards (left out of the advantage)", (("failed", ("reward/failed",)),)),
)
L_KEYS = ("reward/L/mean",)  # drawn on the SR panel's second axis: a path length, not in [0, 1]
HELDOUT_MARKS = {"structure reward SR = C/2 + 1/(1+L)": "sr_mean", "response length (tokens)": "length"}


def series(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> tuple[str, list[int], list[float]] | None:
    """(key, steps, values) of the first of `keys` that some row logged (finite values only), else None."""
    for key in keys:
        points = [(int(r["step"]), float(r[key])) for r in rows if _finite(r.get(key))]
        if points:
            return key, [p[0] for p in points], [p[1] for p in points]
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def smoothed(values: Sequence[float], span: int | None = None) -> list[float]:
    """An exponential moving average over about `span` points (default a fifth of the series, at least 1), debiased
    as TensorBoard's smoothing is, so the first points are not pulled towards 0."""
    n = len(values)
    span = span or max(1, n // 5)
    if span <= 1:
        return list(values)
    weight = 1.0 - 2.0 / (span + 1)
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**i))
    return out


def panels(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The panels to draw (title, its series, the L series on the SR panel) and the signals not logged. A panel whose
    first series equals an earlier panel's step for step is merged into that one (its title then names both)."""
    drawn: list[dict[str, Any]] = []
    missing: list[str] = []
    for title, specs in PANELS:
        found = [(label, s) for label, keys in specs if (s := series(rows, keys)) is not None]
        if not found:
            missing.append(title)
            continue
        panel = {
            "title": title,
            "series": found,
            "L": series(rows, L_KEYS) if found[0][0] == "SR" else None,
            "mark": HELDOUT_MARKS.get(title),
        }
        same = next((p for p in drawn if p["series"][0][1][1:] == found[0][1][1:]), None)
        if same is not None:  # the same curve twice (SARL: the reward is SR): one panel, both names
            panel["title"] = f"{same['title']} = {title}"
            panel["mark"] = panel["mark"] or same["mark"]
            drawn[drawn.index(same)] = panel
            continue
        drawn.append(panel)
    return drawn, missing


def plot_curves(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "", heldout: dict | None = None) -> Path:
    """Draw the run's curves (module docstring) into `path` (PNG); `heldout`: summary.json's block, marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn, missing = panels(rows)
    if not drawn:
        raise ValueError("no training signal was logged (no reward, SR, length, KL or entropy in any step)")
    cols = min(3, len(drawn)) if len(drawn) != 4 else 2
    n_rows = math.ceil(len(drawn) / cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.4 * cols, 3.2 * n_rows), squeeze=False)
    for ax in axes.flat[len(drawn) :]:
        ax.remove()  # no empty slot
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes.flat, drawn):
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        handles = []
        for i, (label, (key, steps, values)) in enumerate(panel["series"]):
            colour = colours[i % len(colours)]
            ax.plot(steps, values, color=colour, alpha=0.25, linewidth=1)
            (line,) = ax.plot(steps, smoothed(values), color=colour, linewidth=1.8, label=label)
            handles.append(line)
        if panel["title"].startswith("failed rewards"):  # a count: from 0, and a run without failures reads as 0
            top = max(v for _, (_, _, values) in panel["series"] for v in values)
            ax.set_ylim(bottom=0, top=max(1.0, 1.1 * top))
        if panel["L"] is not None:
            _, steps, values = panel["L"]
            twin = ax.twinx()
            colour = colours[len(panel["series"]) % len(colours)]
            twin.plot(steps, values, color=colour, alpha=0.25, linewidth=1)
            (line,) = twin.plot(steps, smoothed(values), color=colour, linewidth=1.8, linestyle="--", label="L")
            twin.set_ylabel("L (mean path length)", fontsize=8)
            handles.append(line)
        mark = panel["mark"]
        if heldout and mark and mark in heldout.get("before", {}):
            first, last = panel["series"][0][1][1][0], panel["series"][0][1][1][-1]
            before, after = heldout["before"][mark], heldout["after"][mark]
            handles.append(ax.scatter([first], [before], marker="v", color="black", zorder=5, label="held-out before"))
            handles.append(ax.scatter([last], [after], marker="^", color="black", zorder=5, label="held-out after"))
        if len(handles) > 1:
            ax.legend(handles=handles, fontsize=7, loc="best")
    caption = f"not logged: {', '.join(missing)}" if missing else ""
    fig.suptitle(title + ("\n" + caption if caption else ""), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_curves(run_dir: Path, out: Path | None = None) -> Path:
    """curves.png of a run directory (its metrics.jsonl and, when present, summary.json's held-out block)."""
    rows = read_metrics_history(run_dir)
    heldout = None
    try:
        heldout = json.loads((run_dir / "summary.json").read_text(encoding="utf-8")).get("heldout")
    except (OSError, ValueError, AttributeError):
        heldout = None
    try:
        experiment = json.loads((run_dir / "meta.json").read_text(encoding="utf-8")).get("experiment", "")
    except (OSError, ValueError, AttributeError):
        experiment = ""
    return plot_curves(rows, out or run_dir / CURVES_FILE, title=f"{experiment} ({run_dir.name})", heldout=heldout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sarl.reports.curves",
        description="A run's training curves (curves.png): reward, SR with C and L, steps, length, KL, entropy, "
        "failed rewards; raw and smoothed; the held-out before/after marked. Either back end's run directory.",
    )
    parser.add_argument("run_dir", help=f"a run directory with {METRICS_FILE}")
    parser.add_argument("--out", default=None, help="the PNG to write (default: RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    try:
        path = run_curves(Path(args.run_dir), Path(args.out) if args.out else None)
    except ValueError as err:
        sys.stderr.write(f"sarl.reports.curves: {err}\n")
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
