"""`python -m sarl.bench suite=smoke_effect`: the embedded default's effect on held-out prompts, seed by seed.

Runs `python -m sarl.train +exp=smoke seed=S` once per seed (a fresh process each, one after another), each with
a fresh policy cache when `fresh_policy` is true, so that the wall time is what a user waits for from a fresh
clone (policy build, held-out evaluation before and after, training; set-up excluded). Reads each run's
`summary.json` `heldout` block (sarl/reports/heldout.py) and prints, per seed: held-out SR before and after with the
95% paired bootstrap interval of the difference, accuracy before and after with its interval, the health
signals (boxed answers, truncation, repeated tags) before and after, and the wall time. Two verdicts per seed:
`SR up` (the SR interval lies above zero) and `acc. holds` (the accuracy difference is no larger a fall than
its interval's half width, i.e. the interval reaches zero or above).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from sarl.reports.compare import heldout_block
from sarl.reports.heldout import before_after_cells
from sarl.runtime.errors import UserError


def run_seed(section: DictConfig, seed: int, root: Path, cache_dir: Path) -> dict:
    """One training run in its own process; its `heldout` block, steps and wall time."""
    root.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "sarl.train",
        f"+exp={section.exp}",
        f"seed={seed}",
        f"paths.root={root}",
        f"model.build.cache_dir={cache_dir}",
        "logger=none",
        *section.overrides,
    ]
    log = root / "train.log"
    start = time.monotonic()
    with log.open("w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - start
    if rc != 0:
        raise UserError(f"seed {seed}: `{' '.join(cmd[1:])}` exited {rc}; see {log}")
    summaries = sorted((root / "runs" / str(section.exp)).glob("*/summary.json"))
    if not summaries:
        raise UserError(f"seed {seed}: the run wrote no summary.json under {root / 'runs'}; see {log}")
    steps = json.loads(summaries[-1].read_text())["steps"]
    return {"seed": seed, "wall_s": round(wall, 1), "steps": steps, "heldout": heldout_block(summaries[-1].parent)}


def verdicts(heldout: dict) -> dict[str, bool]:
    d = heldout["delta"]
    lo, hi = d["accuracy_delta_ci95"]
    return {"sr_up": d["sr_delta_ci95"][0] > 0, "accuracy_holds": hi >= 0 or -d["accuracy"] <= (hi - lo) / 2}


def seeds_table(rows: list[dict]) -> Table:
    t = Table(title="held-out effect of the embedded default, per seed")
    for col in ("seed", "wall s", "SR before", "SR after", "ΔSR [95% CI]", "acc. before", "acc. after"):
        t.add_column(col, justify="right")
    for col in ("Δacc. [95% CI]", "boxed", "truncated", "repeated tags", "SR up", "acc. holds"):
        t.add_column(col, justify="right")
    for r in rows:
        b, a = r["heldout"]["before"], r["heldout"]["after"]
        v = r["verdicts"]
        t.add_row(
            str(r["seed"]),
            f"{r['wall_s']:.0f}",
            *before_after_cells(r["heldout"], "sr_mean"),
            *before_after_cells(r["heldout"], "accuracy"),
            f"{b['boxed']:.3f} -> {a['boxed']:.3f}",
            f"{b['truncated']:.3f} -> {a['truncated']:.3f}",
            f"{b['repeated_tags']:.3f} -> {a['repeated_tags']:.3f}",
            "yes" if v["sr_up"] else "NO",
            "yes" if v["accuracy_holds"] else "NO",
        )
    return t


def run_smoke_effect(section: DictConfig, console: Console, out_dir: Path | None = None) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="sarl-smoke-effect-") as tmp:
        base = Path(out_dir) if out_dir is not None else Path(tmp)
        for seed in section.seeds:
            cache = Path(tmp) / f"policies-{seed}" if section.fresh_policy else Path(str(section.cache_dir))
            console.print(f"seed {seed}: training ({'fresh policy build' if section.fresh_policy else cache})")
            row = run_seed(section, int(seed), base / f"seed{seed}", cache)
            row["verdicts"] = verdicts(row["heldout"])
            rows.append(row)
    console.print(seeds_table(rows))
    return {"seeds": rows}
