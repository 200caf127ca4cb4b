"""Shared by the notebooks: where the runs' results are, which run is which row of SARL's tables, and the tables.

Results layout (what `python -m eval.run ckpt=... name=ROW` writes under runs/eval/): `RESULTS/<row>/results.json`
or `RESULTS/<row>/<date>_<time>/results.json` (the newest complete one is used), where <row> is `base` (the base
model, evaluated on the math benchmarks and WildBench) or a `conf/exp/` name (`grpo_sarl_math`, `dpo_open`, ...).
The numbers come from the results files; the Avg and Δ columns are computed with eval/results.py's own helpers.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from eval.results import benchmark_average, mean, with_delta

log = logging.getLogger("notebooks")

MATH_BENCHMARKS = (("aime25", "AIME25"), ("amc23", "AMC23"), ("math500", "MATH500"), ("minerva_math", "Minerva"))
WILDBENCH = "wildbench_v2"
WB_CATEGORIES = (
    ("Creative Tasks", "Creative"),
    ("Planning & Reasoning", "Planning"),
    ("Math & Data Analysis", "Math"),
    ("Information/Advice seeking", "Info"),
    ("Coding & Debugging", "Code"),
)

# (group, label, row) per table, in the paper's order.
TABLE2_ROWS = (
    ("", "Base", "base"),
    ("PPO", "w/ Ground-Truth †", "ppo_gt_math"),
    ("PPO", "w/ SARL (Ours)", "ppo_sarl_math"),
    ("GRPO", "w/ Ground-Truth †", "grpo_gt_math"),
    ("GRPO", "w/ EMPO", "grpo_empo_math"),
    ("GRPO", "w/ TTRL", "grpo_ttrl_math"),
    ("GRPO", "w/ SARL (Ours)", "grpo_sarl_math"),
)
TABLE3_ROWS = (
    ("", "Base", "base"),
    ("DPO", "w/ preference labels †", "dpo_open"),
    ("PPO", "w/ SARL (Ours)", "ppo_sarl_open"),
    ("GRPO", "w/ EMPO", "grpo_empo_open"),
    ("GRPO", "w/ SARL (Ours)", "grpo_sarl_open"),
)
TABLE4_MATH = (("", "Base", "base"), ("", "PPO w/ SARL", "ppo_sarl_math"), ("", "GRPO w/ SARL", "grpo_sarl_math"))
TABLE4_OPEN = (("", "Base", "base"), ("", "PPO w/ SARL", "ppo_sarl_open"), ("", "GRPO w/ SARL", "grpo_sarl_open"))
ABLATION_ROWS = (  # Tables 5 and 10
    ("", "Base", "base"),
    ("", "SARL w/ L only", "grpo_sarl_l_only_math"),
    ("", "SARL w/ C only", "grpo_sarl_c_only_math"),
    ("", "SARL w/ C + L", "grpo_sarl_math"),
)
TABLE8_ROWS = tuple(
    ("", f"{g} {label.replace(' †', '').replace(' (Ours)', '')}" if g else label, row) for g, label, row in TABLE2_ROWS
)
TABLE9_ROWS = (
    ("", "Base", "base"),
    ("", "DPO", "dpo_open"),
    ("", "EMPO", "grpo_empo_open"),
    ("", "PPO w/ SARL", "ppo_sarl_open"),
    ("", "GRPO w/ SARL", "grpo_sarl_open"),
)


def setting(name: str, default: str, argv_flag: str | None = None) -> str:
    """A notebook parameter: `--flag VALUE` on the command line, else the environment variable, else the default
    (inside Jupyter, set the environment variable or edit the cell)."""
    import sys

    flag = argv_flag or "--" + name.lower().removeprefix("sarl_").replace("_", "-")
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return os.environ.get(name, default)


def find_results(results_dir: str | Path, row: str) -> Path | None:
    """The results.json of a row: `<dir>/<row>/results.json`, else the newest complete `<dir>/<row>/*/results.json`
    (the newest incomplete one, with a warning, when none is complete); None when the row has none."""
    root = Path(results_dir) / row
    if (root / "results.json").is_file():
        return root / "results.json"
    found = sorted(root.glob("*/results.json"))
    if not found:
        return None
    complete = [p for p in found if json.loads(p.read_text(encoding="utf-8")).get("complete", True)]
    if not complete:
        log.warning("%s: no complete evaluation; using the incomplete %s", row, found[-1])
        return found[-1]
    return complete[-1]


def load_results(results_dir: str | Path, rows: Sequence[str]) -> dict[str, dict]:
    """results.json of every row that has one."""
    out = {}
    for row in dict.fromkeys(rows):
        path = find_results(results_dir, row)
        if path is not None:
            out[row] = json.loads(path.read_text(encoding="utf-8"))
    return out


def _math(results: dict | None) -> dict[str, dict]:
    return (((results or {}).get("math") or {}).get("benchmarks")) or {}


def _wb(results: dict | None) -> dict | None:
    return (((results or {}).get("wildbench") or {}).get("benchmarks") or {}).get(WILDBENCH)


def _f(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


@dataclass
class PaperTable:
    """A rebuilt table: header, rows of printed cells, the numbers behind them, and what was missing."""

    name: str
    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    values: dict[str, dict[str, float | None]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.header) + " |", "|---" * len(self.header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        if self.missing:
            lines += ["", "Not available (shown as -): " + "; ".join(self.missing) + "."]
        return "\n".join(lines) + "\n"

    def write(self, out_dir: str | Path) -> list[Path]:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        md, csv_path = out_dir / f"{self.name}.md", out_dir / f"{self.name}.csv"
        md.write_text(self.markdown(), encoding="utf-8")
        with csv_path.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(self.header)
            w.writerows(self.rows)
        return [md, csv_path]


def _grouped(table: PaperTable, spec, cells_of) -> None:
    """Append rows in the paper's layout: an italic group line (PPO, GRPO, ...) before each group's rows."""
    group = None
    for g, label, row in spec:
        if g and g != group:
            table.rows.append([f"*{g}*"] + [""] * (len(table.header) - 1))
        group = g
        table.rows.append([label] + cells_of(row))


def accuracy_table(name: str, title: str, spec, results: dict[str, dict]) -> PaperTable:
    """SARL Tables 2 and 10: avg@k per math benchmark and `Avg (Δ%)`, Avg the unweighted mean of the four
    benchmarks (SARL Table 2; decisions §3) and Δ% against the base row (eval.results.with_delta)."""
    t = PaperTable(name, title, ["Method"] + [c for _, c in MATH_BENCHMARKS] + ["Avg (Δ%)"])
    base = _math(results.get("base"))
    base_avg = _avg(base, "base", t)

    def cells(row):
        b = _math(results.get(row))
        if row not in results:
            t.missing.append(f"{row} (no results.json)")
        accs = {k: (b.get(k) or {}).get("avg_at_k") for k, _ in MATH_BENCHMARKS}
        avg = base_avg if row == "base" else _avg(b, row, t)
        t.values[row] = {**accs, "avg": avg}
        last = _f(avg) if row == "base" else with_delta(avg, base_avg)
        return [_f(accs[k]) for k, _ in MATH_BENCHMARKS] + [last]

    _grouped(t, spec, cells)
    return t


def _avg(benchmarks: dict[str, dict], row: str, t: PaperTable) -> float | None:
    lacking = [k for k, _ in MATH_BENCHMARKS if (benchmarks.get(k) or {}).get("avg_at_k") is None]
    if lacking and benchmarks:
        t.missing.append(f"{row}: no Avg without {', '.join(lacking)}")
    if lacking:
        return None
    return benchmark_average({k: benchmarks[k]["avg_at_k"] for k, _ in MATH_BENCHMARKS})


def ablation_summary_table(results: dict[str, dict]) -> PaperTable:
    """SARL Table 5: the ablation's `Avg (Δ%)` only (the columns of Table 10 averaged)."""
    full = accuracy_table("table10", "", ABLATION_ROWS, results)
    t = PaperTable(
        "table5",
        "SARL Table 5: structure-reward terms, avg over the math benchmarks",
        ["Reward variant", "Avg (Δ%)"],
        missing=full.missing,
    )
    for r in full.rows:
        t.rows.append([r[0], r[-1]])
    t.values = {row: {"avg": v["avg"]} for row, v in full.values.items()}
    return t


def wildbench_table(results: dict[str, dict]) -> PaperTable:
    """SARL Table 3: WildBench category scores and `WB Score (Δ%)` against the base row."""
    t = PaperTable(
        "table3",
        "SARL Table 3: WildBench (open-ended reasoning)",
        ["Method"] + [s for _, s in WB_CATEGORIES] + ["WB Score (Δ%)"],
    )
    base_wb = (_wb(results.get("base")) or {}).get("wb_score")

    def cells(row):
        wb = _wb(results.get(row))
        if wb is None:
            t.missing.append(f"{row} (no WildBench results)")
            wb = {}
        cats = wb.get("categories") or {}
        t.values[row] = {s: cats.get(c) for c, s in WB_CATEGORIES} | {"wb_score": wb.get("wb_score")}
        last = _f(wb.get("wb_score")) if row == "base" else with_delta(wb.get("wb_score"), base_wb)
        return [_f(cats.get(c)) for c, _ in WB_CATEGORIES] + [last]

    _grouped(t, TABLE3_ROWS, cells)
    return t


def printed(value: float | None, places: int) -> float | None:
    """A mean as SARL's length tables print it: rounded half up (Table 8, PPO w/ Ground-Truth: the mean of
    7047.7, 4634.7, 3124.9 and 4021.7 is 4707.25, printed 4707.3; its Δ, -1029.3, is of the printed values)."""
    from decimal import ROUND_HALF_UP, Decimal

    if value is None:
        return None
    return float(Decimal(repr(round(value, 9))).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def math_tokens(results: dict | None) -> tuple[dict[str, float | None], float | None]:
    """Per-benchmark mean tokens and their unweighted mean (SARL Table 8's Avg)."""
    b = _math(results)
    per = {k: (b.get(k) or {}).get("mean_tokens") for k, _ in MATH_BENCHMARKS}
    return per, (None if any(v is None for v in per.values()) else printed(mean(list(per.values())), 1))


def length_tables(results: dict[str, dict]) -> tuple[PaperTable, PaperTable, PaperTable]:
    """SARL Tables 8 (math, per benchmark), 9 (WildBench) and 4 (both, SARL rows): mean response tokens and the
    difference to the base model."""
    t8 = PaperTable(
        "table8",
        "SARL Table 8: response length on the math benchmarks (tokens)",
        ["Method"] + [c for _, c in MATH_BENCHMARKS] + ["Avg", "Δ vs. Base"],
    )
    _, base_math = math_tokens(results.get("base"))  # Δ of the printed (rounded) averages, as SARL Table 8

    def cells8(row):
        per, avg = math_tokens(results.get(row))
        if avg is None:
            t8.missing.append(f"{row} (no token counts)")
        delta = None if avg is None or base_math is None else printed(avg - base_math, 1)
        t8.values[row] = {**per, "avg": avg, "delta": delta}
        return [_f(per[k], ".1f") for k, _ in MATH_BENCHMARKS] + [
            _f(avg, ".1f"),
            _f(delta, ".1f" if row == "base" else "+.1f"),
        ]

    _grouped(t8, TABLE8_ROWS, cells8)

    t9 = PaperTable(
        "table9", "SARL Table 9: response length on WildBench (tokens)", ["Method", "Avg Tokens", "Δ vs. Base"]
    )
    base_open = (_wb(results.get("base")) or {}).get("mean_tokens")

    def cells9(row):
        tok = (_wb(results.get(row)) or {}).get("mean_tokens")
        if tok is None:
            t9.missing.append(f"{row} (no WildBench token counts)")
        delta = None if tok is None or base_open is None else printed(tok - base_open, 2)
        t9.values[row] = {"avg": tok, "delta": delta}
        return [_f(tok), _f(delta, ".2f" if row == "base" else "+.2f")]

    _grouped(t9, TABLE9_ROWS, cells9)

    t4 = PaperTable("table4", "SARL Table 4: response length comparison", ["Method", "Avg Tokens", "Δ vs. Base"])
    t4.rows.append(["*Verifiable reasoning (Math).*", "", ""])
    for _, label, row in TABLE4_MATH:
        v = t8.values[row]
        t4.values[f"math/{row}"] = {"avg": v["avg"], "delta": v["delta"]}
        t4.rows.append([label, _f(v["avg"], ".1f"), _f(v["delta"], ".1f" if row == "base" else "+.1f")])
    t4.rows.append(["*Non-verifiable reasoning (Open-ended).*", "", ""])
    for _, label, row in TABLE4_OPEN:
        v = t9.values[row]
        t4.values[f"open/{row}"] = {"avg": v["avg"], "delta": v["delta"]}
        t4.rows.append([label, _f(v["avg"]), _f(v["delta"], ".2f" if row == "base" else "+.2f")])
    t4.missing = sorted(
        set(t8.missing + t9.missing) & {f"{r} (no token counts)" for _, _, r in TABLE4_MATH}
        | set(t9.missing) & {f"{r} (no WildBench token counts)" for _, _, r in TABLE4_OPEN}
    )
    return t4, t8, t9


def all_rows() -> list[str]:
    specs = (TABLE2_ROWS, TABLE3_ROWS, ABLATION_ROWS, TABLE9_ROWS)
    return list(dict.fromkeys(row for spec in specs for _, _, row in spec))
