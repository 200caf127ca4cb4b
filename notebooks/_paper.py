"""Shared by the notebooks: where the runs' results are, which run is which row of SARL's tables, and the tables.

Results layout (what `python -m eval.run ckpt=...` writes under runs/eval/, naming the run after the row that trained
the checkpoint, or `name=ROW`): `RESULTS/<row>/results.json`
or `RESULTS/<row>/<date>_<time>/results.json` (the newest complete one is used), where <row> is `base` (the base
model, evaluated on the math benchmarks and WildBench) or a `conf/exp/` name (`grpo_sarl_math`, `dpo_open`, ...).
The numbers come from the results files; the Avg and Δ columns are computed with eval/results.py's own helpers.

Which run is which row of which table comes from the `paper:` block of each conf/exp/ file (sarl.runtime.rows). Every
table is a pandas DataFrame of the printed cells (columns: the paper's header; an italic group line before each
group, as the paper prints them), with `attrs` holding its file name (`name`), `title`, the rows that had no
results (`missing`) and the numbers behind the cells (`values`: row -> column -> number; `values_frame(table)` gives
them as a DataFrame). `markdown(table)` and `write(table, out_dir)` print it and write `<name>.md` and `<name>.csv`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from eval.cache import safe_name
from eval.results import benchmark_average, mean, with_delta
from sarl.reports.figures import append_row, markdown, new_table, values_frame, write  # noqa: F401 (the notebooks' API)
from sarl.runtime.rows import paper_rows

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

BASE = ("", "Base", "base")  # the base model: the first row of every SARL table (not a conf/exp/ run)


def table_spec(table: str, group: str | None = None) -> tuple[tuple[str, str, str], ...]:
    """(group, label, row) of a paper table in its order, the base model first: the conf/exp/ files' `paper:`
    entries for `table` (only those under `group`, when given; their group heading then left out)."""
    rows = [r for r in paper_rows(table) if group is None or r.group == group]
    return (BASE, *(("" if group is not None else r.group, r.label, r.exp) for r in rows))


def table_groups(table: str) -> list[str]:
    """The group headings of a paper table, in order."""
    return list(dict.fromkeys(r.group for r in paper_rows(table)))


TABLE2_ROWS = table_spec("SARL Table 2")
TABLE3_ROWS = table_spec("SARL Table 3")
TABLE4_SECTIONS = {g: table_spec("SARL Table 4", g) for g in table_groups("SARL Table 4")}  # math, then open-ended
ABLATION_ROWS = table_spec("SARL Table 10")  # Tables 5 and 10
# SARL Table 8 has Table 2's rows, each label prefixed with its group and without the † and (Ours) marks
TABLE8_ROWS = tuple(
    ("", f"{g} {label.replace(' †', '').replace(' (Ours)', '')}" if g else label, row) for g, label, row in TABLE2_ROWS
)
TABLE9_ROWS = table_spec("SARL Table 9")


def settings(about: str, **options: tuple[str, str]) -> dict[str, str]:
    """The notebook's parameters, `name=(default, what it is)`: `--name VALUE` on the command line, else the
    environment variable `SARL_<NAME>`, else the default. Run as a script, the command line is parsed strictly:
    `--help` lists the flags, an unknown flag (a misspelt `--result` included) or one without its value is one line
    naming it and the nearest flag, exit 2. Inside Jupyter (whose kernel has argv of its own) only the environment
    counts."""
    import argparse
    import difflib
    import sys

    class Strict(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # one line, not argparse's usage block
            flags = [a for a in sys.argv[1:] if a.startswith("-")]
            near = [m for f in flags for m in difflib.get_close_matches(f.split("=")[0], known, n=1) if m != f]
            hint = f" (did you mean {near[0]}?)" if near else ""
            self.exit(2, f"{self.prog}: {message}{hint}; `{self.prog} --help` lists its flags\n")

    parser = Strict(prog=Path(sys.argv[0]).name, description=about, allow_abbrev=False)
    known = []
    for name, (default, what) in options.items():
        env, flag = f"SARL_{name.upper()}", "--" + name.replace("_", "-")
        known.append(flag)
        parser.add_argument(
            flag,
            dest=name,
            metavar="VALUE",
            default=os.environ.get(env, default),
            help=f"{what} (environment: {env}; default: {default or 'none'})",
        )
    return vars(parser.parse_args([] if "ipykernel" in sys.modules else sys.argv[1:]))


def result_protocol(results: dict) -> str:
    """The protocol a results.json was evaluated by (results before protocols existed: SARL's)."""
    return str((results.get("protocol") or {}).get("name") or "sarl")


def _runs_of(results_dir: str | Path, row: str) -> list[tuple[Path, dict]]:
    """(path, results) of every results.json of a row, oldest first: `<dir>/<row>/results.json`, then
    `<dir>/<row>/*/results.json` (the row as eval.run names its folder: `safe_name`, so `smoke_compare/SARL` works)."""
    root = Path(results_dir) / safe_name(row)
    paths = ([root / "results.json"] if (root / "results.json").is_file() else []) + sorted(root.glob("*/results.json"))
    out = []
    for path in paths:
        try:
            out.append((path, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            log.warning("%s: not readable as results.json; skipped", path)
    return out


def find_results(results_dir: str | Path, row: str, protocol: str = "sarl") -> Path | None:
    """The results.json of a row evaluated by `protocol`: the newest complete one (the newest incomplete one, with a
    warning, when none is complete); None when the row has none of that protocol."""
    found = [(p, r) for p, r in _runs_of(results_dir, row) if result_protocol(r) == protocol]
    if not found:
        return None
    complete = [p for p, r in found if r.get("complete", True)]
    if not complete:
        log.warning("%s: no complete evaluation; using the incomplete %s", row, found[-1][0])
        return found[-1][0]
    return complete[-1]


def load_results(results_dir: str | Path, rows: Sequence[str], protocol: str = "sarl") -> dict[str, dict]:
    """results.json of every row that has one of `protocol`."""
    out = {}
    for row in dict.fromkeys(rows):
        path = find_results(results_dir, row, protocol)
        if path is not None:
            out[row] = json.loads(path.read_text(encoding="utf-8"))
    return out


def other_protocols(results_dir: str | Path, rows: Sequence[str], protocol: str) -> dict[str, list[str]]:
    """Rows with results of other protocols only: row -> those protocols (what a table that needs `protocol`
    cannot use, said rather than silently missing)."""
    out = {}
    for row in dict.fromkeys(rows):
        found = list(dict.fromkeys(result_protocol(r) for _, r in _runs_of(results_dir, row)))
        if found and protocol not in found:
            out[row] = found
    return out


def how_to_evaluate(protocol: str = "sarl") -> str:
    """The command that produces a row's results for a table of `protocol`."""
    flag = "" if protocol == "sarl" else f" protocol={protocol}"
    return (
        f"evaluate each row's training run with `python -m eval.run ckpt=runs/<row>/<date>_<time>{flag}` (its final "
        "model; `select=paper` picks the checkpoint the paper reports; the results are named after the row, "
        "`name=ROW` names another checkpoint, `name=base` the base model)"
    )


HOW_TO_EVALUATE = how_to_evaluate()


def protocol_lines(results_dir: str | Path, rows: Sequence[str], protocol: str, table: str) -> list[str]:
    """One line per row whose results are of another protocol than the table needs, naming both and the command."""
    flag = "" if protocol == "sarl" else f" protocol={protocol}"
    return [
        f"{row}: results of protocol {', '.join(found)} only; {table} needs protocol {protocol}: "
        f"python -m eval.run ckpt=<the training run dir of {row}>{flag}"
        for row, found in other_protocols(results_dir, rows, protocol).items()
    ]


def results_or_exit(
    results_dir: str | Path, rows: Sequence[str], protocol: str = "sarl", table: str = "SARL's tables"
) -> dict[str, dict]:
    """load_results of `protocol`, saying which rows have results, which are missing, which have results of another
    protocol only (naming both and the command that produces the right ones); with no row's results at all, that is
    said and the notebook stops with exit 2 (a user error, as every command) without writing anything."""
    root = Path(results_dir)
    check_results_dir(root, protocol)
    results = load_results(root, rows, protocol)
    absent = [r for r in dict.fromkeys(rows) if r not in results]
    wrong = other_protocols(root, absent, protocol)
    known = {safe_name(r) for r in rows}
    others = sorted(d.name for d in root.iterdir() if d.is_dir() and d.name not in known and d.name != "cache")
    found = ", ".join(results) if results else "none"
    lines = [f"{len(results)} of {len(dict.fromkeys(rows))} rows have protocol-{protocol} results in {root}: {found}"]
    lines += protocol_lines(root, list(wrong), protocol, table)
    missing = [r for r in absent if r not in wrong]
    if missing:
        lines.append(f"missing (printed as -): {', '.join(missing)}: {how_to_evaluate(protocol)}")
    if others:
        lines.append(f"{root} also holds {', '.join(others)}: not rows of these tables (eval.run name=ROW names a run)")
    if not results:
        fail("\n".join(lines))
    print("\n".join(lines))
    return results


def fail(message: str) -> None:
    """A user error of a notebook run as a script: the message on stderr, exit 2 (as every command of the project)."""
    sys.stderr.write(message.rstrip("\n") + "\n")
    raise SystemExit(2)


def check_results_dir(root: str | Path, protocol: str = "sarl") -> None:
    if not Path(root).is_dir():
        fail(f"results directory {root} does not exist: {how_to_evaluate(protocol)}; or pass --results DIR")


def _math(results: dict | None) -> dict[str, dict]:
    return (((results or {}).get("math") or {}).get("benchmarks")) or {}


def _wb(results: dict | None) -> dict | None:
    return (((results or {}).get("wildbench") or {}).get("benchmarks") or {}).get(WILDBENCH)


def _f(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _grouped(table: pd.DataFrame, spec, cells_of) -> None:
    """Append rows in the paper's layout: an italic group line (PPO, GRPO, ...) before each group's rows."""
    group = None
    for g, label, row in spec:
        if g and g != group:
            append_row(table, [f"*{g}*"] + [""] * (len(table.columns) - 1))
        group = g
        append_row(table, [label] + cells_of(row))


def accuracy_table(
    name: str, title: str, spec, results: dict[str, dict], benchmarks: Sequence[tuple[str, str]] = MATH_BENCHMARKS
) -> pd.DataFrame:
    """SARL Tables 2 and 10: avg@k per math benchmark and `Avg (Δ%)`, Avg the unweighted mean of the benchmarks
    (SARL Table 2; decisions §3) and Δ% against the base row (eval.results.with_delta). `benchmarks`: (results key,
    column) pairs, SARL's four by default (the smoke rows' miniature: the held-out prompts)."""
    t = new_table(name, title, ["Method"] + [c for _, c in benchmarks] + ["Avg (Δ%)"])
    values, missing = t.attrs["values"], t.attrs["missing"]
    base = _math(results.get("base"))
    base_avg = _avg(base, "base", missing, benchmarks)

    def cells(row):
        b = _math(results.get(row))
        if row not in results:
            missing.append(f"{row} (no results.json)")
        accs = {k: (b.get(k) or {}).get("avg_at_k") for k, _ in benchmarks}
        avg = base_avg if row == "base" else _avg(b, row, missing, benchmarks)
        values[row] = {**accs, "avg": avg}
        last = _f(avg) if row == "base" else with_delta(avg, base_avg)
        return [_f(accs[k]) for k, _ in benchmarks] + [last]

    _grouped(t, spec, cells)
    return t


def _avg(
    benchmarks: dict[str, dict], row: str, missing: list[str], columns: Sequence[tuple[str, str]] = MATH_BENCHMARKS
) -> float | None:
    lacking = [k for k, _ in columns if (benchmarks.get(k) or {}).get("avg_at_k") is None]
    if lacking and benchmarks:
        missing.append(f"{row}: no Avg without {', '.join(lacking)}")
    if lacking:
        return None
    return benchmark_average({k: benchmarks[k]["avg_at_k"] for k, _ in columns})


def ablation_summary_table(results: dict[str, dict]) -> pd.DataFrame:
    """SARL Table 5: the ablation's `Avg (Δ%)` only (the columns of Table 10 averaged)."""
    full = accuracy_table("table10", "", ABLATION_ROWS, results)
    t = full.iloc[:, [0, -1]].set_axis(["Reward variant", "Avg (Δ%)"], axis=1).reset_index(drop=True)
    t.attrs = {
        "name": "table5",
        "title": "SARL Table 5: structure-reward terms, avg over the math benchmarks",
        "values": {row: {"avg": v["avg"]} for row, v in full.attrs["values"].items()},
        "missing": full.attrs["missing"],
    }
    return t


def wildbench_table(results: dict[str, dict]) -> pd.DataFrame:
    """SARL Table 3: WildBench category scores and `WB Score (Δ%)` against the base row."""
    t = new_table(
        "table3",
        "SARL Table 3: WildBench (open-ended reasoning)",
        ["Method"] + [s for _, s in WB_CATEGORIES] + ["WB Score (Δ%)"],
    )
    base_wb = (_wb(results.get("base")) or {}).get("wb_score")

    def cells(row):
        wb = _wb(results.get(row))
        if wb is None:
            t.attrs["missing"].append(f"{row} (no WildBench results)")
            wb = {}
        cats = wb.get("categories") or {}
        t.attrs["values"][row] = {s: cats.get(c) for c, s in WB_CATEGORIES} | {"wb_score": wb.get("wb_score")}
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


def length_tables(results: dict[str, dict]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """SARL Tables 8 (math, per benchmark), 9 (WildBench) and 4 (both, SARL rows): mean response tokens and the
    difference to the base model."""
    t8 = new_table(
        "table8",
        "SARL Table 8: response length on the math benchmarks (tokens)",
        ["Method"] + [c for _, c in MATH_BENCHMARKS] + ["Avg", "Δ vs. Base"],
    )
    _, base_math = math_tokens(results.get("base"))  # Δ of the printed (rounded) averages, as SARL Table 8

    def cells8(row):
        per, avg = math_tokens(results.get(row))
        if avg is None:
            t8.attrs["missing"].append(f"{row} (no token counts)")
        delta = None if avg is None or base_math is None else printed(avg - base_math, 1)
        t8.attrs["values"][row] = {**per, "avg": avg, "delta": delta}
        return [_f(per[k], ".1f") for k, _ in MATH_BENCHMARKS] + [
            _f(avg, ".1f"),
            _f(delta, ".1f" if row == "base" else "+.1f"),
        ]

    _grouped(t8, TABLE8_ROWS, cells8)

    t9 = new_table(
        "table9", "SARL Table 9: response length on WildBench (tokens)", ["Method", "Avg Tokens", "Δ vs. Base"]
    )
    base_open = (_wb(results.get("base")) or {}).get("mean_tokens")

    def cells9(row):
        tok = (_wb(results.get(row)) or {}).get("mean_tokens")
        if tok is None:
            t9.attrs["missing"].append(f"{row} (no WildBench token counts)")
        delta = None if tok is None or base_open is None else printed(tok - base_open, 2)
        t9.attrs["values"][row] = {"avg": tok, "delta": delta}
        return [_f(tok), _f(delta, ".2f" if row == "base" else "+.2f")]

    _grouped(t9, TABLE9_ROWS, cells9)

    # SARL Table 4: a section per setting, each opened by an italic line and starting with the base model; a math
    # section (its rows are Table 8's) takes Table 8's numbers, an open-ended one Table 9's
    t4 = new_table("table4", "SARL Table 4: response length comparison", ["Method", "Avg Tokens", "Δ vs. Base"])
    math_rows = {row for _, _, row in TABLE8_ROWS}
    wanted = set()
    for section, spec in TABLE4_SECTIONS.items():
        is_math = all(row in math_rows for _, _, row in spec)
        prefix, source, places = ("math", t8, 1) if is_math else ("open", t9, 2)
        lacking = "{} (no token counts)" if is_math else "{} (no WildBench token counts)"
        append_row(t4, [f"*{section}.*", "", ""])
        for _, label, row in spec:
            v = source.attrs["values"][row]
            t4.attrs["values"][f"{prefix}/{row}"] = {"avg": v["avg"], "delta": v["delta"]}
            sign = f".{places}f" if row == "base" else f"+.{places}f"
            append_row(t4, [label, _f(v["avg"], f".{places}f"), _f(v["delta"], sign)])
            wanted.add(lacking.format(row))
    t4.attrs["missing"] = sorted(set(t8.attrs["missing"] + t9.attrs["missing"]) & wanted)
    return t4, t8, t9


def all_rows() -> list[str]:
    specs = (TABLE2_ROWS, TABLE3_ROWS, ABLATION_ROWS, TABLE9_ROWS)
    return list(dict.fromkeys(row for spec in specs for _, _, row in spec))


# The smoke rows: smoke_compare's stages (one tiny policy trained once per reward), evaluated with protocol=smoke, as
# SARL Table 2 in miniature: avg@k on the held-out prompts and Δ% against the untrained policy (row `base`)
SMOKE_EXP = "smoke_compare"
SMOKE_BENCHMARKS = (("smoke_heldout", "Held-out"),)


def smoke_rows() -> tuple[tuple[str, str, str], ...]:
    """(group, label, row) of the miniature: the base policy, each stage of conf/exp/smoke_compare.yaml in order (the
    row is the stage's training run, `smoke_compare/<stage>`, as eval.run names its results), then `make main`'s run
    (row `smoke`)."""
    import yaml

    from sarl.runtime.files import CONF_DIR

    exp = yaml.safe_load((CONF_DIR / "exp" / f"{SMOKE_EXP}.yaml").read_text(encoding="utf-8"))
    stages = tuple(("", f"GRPO w/ {s['name']}", f"{SMOKE_EXP}/{s['name']}") for s in exp["pipeline"])
    return (BASE, *stages, ("", "GRPO w/ SARL (`make main`)", "smoke"))  # the embedded default's run, if evaluated


def smoke_table(results: dict[str, dict]) -> pd.DataFrame:
    """SARL Table 2 in miniature from the smoke rows' protocol-smoke results, by `accuracy_table`."""
    title = "SARL Table 2 in miniature: the tiny policy per training reward, avg@k on the held-out prompts"
    return accuracy_table("table2_smoke", title, smoke_rows(), results, SMOKE_BENCHMARKS)
