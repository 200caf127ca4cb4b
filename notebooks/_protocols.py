"""The tables of EVOL-RL, GRP and Structured Reasoning rebuilt from `eval.run` results of their protocols, each run
beside the paper's own numbers (notebooks/reported/<table>.yaml, typed from the cited table; its `protocol` names the
evaluation protocol whose results fill it).

Results layout: `RESULTS/<row id>/results.json` or `RESULTS/<row id>/<date>_<time>/results.json`
(`_paper.find_results`), where the row ids are those of the reported file
(`python -m eval.run ckpt=... protocol=evol_rl name=<row id>`); a model in several tables of one protocol has one id,
so that one evaluation fills them all. A table lists each reported row as "<label> (paper)" and, when that row has
results, "<label> (ours)" under it; a cell of several metrics prints them as `a/b` (EVOL-RL's pass@1/pass@16) or
joined by the file's `join` (`m±s`, a mean ± std). A table of a swept protocol prints one block per sweep value
(`sweep`) or reads one of them (`at`). `averages` are computed columns (Structured Reasoning's "Avg." and "Large
Avg."): per metric, the mean of the named columns' printed values, printed half up (decisions §3.2); the reported
rows carry the paper's own, typed after the benchmark cells. `extras` are per-row columns after them (Structured
Reasoning Table 11's Steps and Tokens), typed in each row's `extras`; ours is the mean over the columns of the
benchmarks' `mean_of` field of results.json, or "-" where it has none. A `gain_over` table (Structured Reasoning
Table 15) has one column per sweep value of another reported table: a cell is the row's `average` there minus the
baseline row's. `decimals` is one number or one per cell metric, and a row may print the paper's with its own; a row
with `id: null` is a paper row this project does not reproduce (printed alone); `train` and `stage` name the
`python -m sarl.train` overrides and pipeline stage that train its checkpoint (docs/reproduce.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _paper as paper
import pandas as pd
import yaml

REPORTED = Path(__file__).resolve().parent / "reported"
PROTOCOLS = ("evol_rl", "grp", "structured", "structured_temperature")
# notebooks/reported/<name>.yaml, in the order protocol_tables.py prints them
TABLES = (
    "evol_rl",
    "evol_rl_ablation",
    "grp",
    "structured",
    "structured_7b",
    "structured_table10",
    "structured_temperature",
    "grp_ablation",
    "grp_length",
    "structured_table11",
    "structured_table15",
)


def reported(name: str) -> dict[str, Any]:
    """notebooks/reported/<name>.yaml: the paper's table (protocol, title, columns, cell metrics, rows)."""
    return yaml.safe_load((REPORTED / f"{name}.yaml").read_text(encoding="utf-8"))


def _metric(summary: dict[str, Any], name: str) -> float | None:
    """A benchmark's metric (`summary["metrics"]`), or a field of its summary (`mean_tokens`: GRP Table 4's Length)."""
    metrics = summary.get("metrics") or {}
    if name == "avg@k":  # avg@<n>: n is the protocol's
        return next((v for k, v in metrics.items() if k.startswith("avg@")), None)
    return summary.get(name) if name == "mean_tokens" else metrics.get(name)


def decimals_of(spec: dict[str, Any], row: dict[str, Any] | None = None) -> list[int]:
    """The printed decimals per cell metric: the row's own (a paper row printed otherwise), else the table's."""
    d = (row or {}).get("decimals", spec.get("decimals", 2))
    return [int(x) for x in d] if isinstance(d, list) else [int(d)] * len(spec["cell"])


def _label(bench: str, spec: dict[str, Any], sweep_value: Any) -> str:
    """The benchmark's label in results.json: `bench`, or `bench/<key>=<value>` for a value of a sweep."""
    if sweep_value is not None:
        return f"{bench}/{spec['sweep']}={sweep_value}"
    at = spec.get("at") or {}
    return bench + "".join(f"/{k}={v}" for k, v in at.items())


def ours_cells(spec: dict[str, Any], results: dict[str, Any], sweep_value: Any = None) -> list[list[float | None]]:
    """A run's numbers in the table's columns: its benchmarks' metrics (at one sweep value, or at the table's `at`),
    or for the temperature table the mean and std of its sweep; then the table's averages."""
    math = results.get("math") or {}
    out = []
    for bench in spec["columns"]:
        if spec["cell"] == ["mean", "std"]:
            s = (math.get("sweep") or {}).get(bench) or {}
            out.append([s.get("mean"), s.get("std")])
            continue
        summary = (math.get("benchmarks") or {}).get(_label(bench, spec, sweep_value)) or {}
        out.append([_metric(summary, m) for m in spec["cell"]])
    return out + averages(spec, out)


def extras(spec: dict[str, Any], results: dict[str, Any]) -> list[float | None]:
    """The table's `extras` of one run: per extra, the mean over the columns of the benchmarks' `mean_of` field
    (Structured Reasoning Table 11's Tokens: mean response tokens), None where it has none or no field is named."""
    benchmarks = (results.get("math") or {}).get("benchmarks") or {}
    out = []
    for extra in spec.get("extras") or []:
        field = extra.get("mean_of")
        values = (
            [((benchmarks.get(_label(b, spec, None)) or {}).get(field)) for b in spec["columns"]] if field else [None]
        )
        out.append(None if any(v is None for v in values) else sum(values) / len(values))
    return out


def gain_cells(spec: dict[str, Any], results: dict[str, dict[str, Any]], row: str) -> list[list[float | None]]:
    """A `gain_over` table's cells for one run: per sweep value, the run's `average` in the other table minus the
    baseline run's, each as printed, the difference printed half up (Structured Reasoning Table 15: Table 3's "Avg."
    differences); then the table's averages."""
    gain = spec["gain_over"]
    other = reported(gain["table"])
    at = [a["key"] for a in other["averages"]].index(gain["average"])
    decimals = decimals_of(spec)[0]

    def avg(run: str, value: Any) -> float | None:
        if run not in results:
            return None
        return ours_cells(other, results[run], value)[len(other["columns"]) + at][0]

    out = []
    for value in spec["columns"]:
        mine, base = avg(row, value), avg(gain["row"], value)
        out.append([None if mine is None or base is None else paper.printed(mine - base, decimals)])
    return out + averages(spec, out)


def averages(spec: dict[str, Any], cells: list[list[float | None]]) -> list[list[float | None]]:
    """The table's `averages` of one row's benchmark cells: per metric, the mean of the named columns' values as
    printed (rounded half up to the table's decimals), itself rounded so; None where a column has none (decisions
    §3.2; Structured Reasoning Tables 2-3 "Avg.", Table 10 "Avg." and "Large Avg.")."""
    decimals = decimals_of(spec)
    by_bench = dict(zip(spec["columns"], cells))
    out = []
    for avg in spec.get("averages") or []:
        columns = [by_bench[b] for b in avg["of"]]
        row = []
        for i in range(len(spec["cell"])):
            values = [c[i] for c in columns]
            if any(v is None for v in values):
                row.append(None)
                continue
            printed = [paper.printed(v, decimals[i]) for v in values]
            row.append(paper.printed(sum(printed) / len(printed), decimals[i]))
        out.append(row)
    return out


def _cell(values: list[float | None], decimals: list[int], join: str, sign: bool = False) -> str:
    if any(v is None for v in values):
        return "-"
    return join.join(f"{paper.printed(v, d):{'+' if sign and v else ''}.{d}f}" for v, d in zip(values, decimals))


def _printed(values: list[list[float | None]], spec: dict[str, Any], row: dict[str, Any] | None = None) -> list[str]:
    if spec["cell"] == ["mean", "std"]:
        return ["-" if None in v else "±".join(f"{paper.printed(x, 2):.2f}" for x in v) for v in values]
    decimals = decimals_of(spec, row)
    return [_cell(v, decimals, spec.get("join", "/"), bool(spec.get("sign"))) for v in values]


def _printed_extras(values: list[float | None], spec: dict[str, Any]) -> list[str]:
    return [_cell([v], [int(e["decimals"])], "") for v, e in zip(values, spec.get("extras") or [])]


def protocol_table(name: str, results_dir: str | Path) -> pd.DataFrame:
    """The paper's table notebooks/reported/<name>.yaml with each row's results beside it; `attrs["values"]` holds
    our numbers by row (`<row>@<sweep value>` in a swept table), the averages under their `key`."""
    spec = reported(name)
    protocol = spec.get("protocol", name)
    rows = list(dict.fromkeys(r["id"] for r in spec["rows"] if r["id"] is not None))  # null: not reproduced
    results = paper.load_results(results_dir, rows, protocol)  # results of another protocol are not this table's
    avg_specs, extra_specs = spec.get("averages") or [], spec.get("extras") or []
    header = [
        "Model",
        *spec["columns"].values(),
        *(a["header"] for a in avg_specs),
        *(e["header"] for e in extra_specs),
    ]
    table = paper.new_table(name, spec["title"], header)
    wrong = paper.other_protocols(results_dir, [r for r in rows if r not in results], protocol)
    table.attrs["missing"] = [
        f"{row} (results of protocol {', '.join(wrong[row])} only; needs protocol {protocol})"
        if row in wrong
        else f"{row} (no results.json)"
        for row in rows
        if row not in results
    ]
    keys = [*spec["columns"], *(a["key"] for a in avg_specs), *(e["key"] for e in extra_specs)]
    sweep_values = list(spec["rows"][0]["values"]) if spec.get("sweep") else [None]
    blank = [""] * (len(header) - 1)
    group = None
    for value in sweep_values:
        if value is not None:
            paper.append_row(table, [f"*{spec['sweep']} {value}*", *blank])
        for r in spec["rows"]:
            if r.get("group") and r["group"] != group and value is None:
                group = r["group"]
                paper.append_row(table, [f"*{group}*", *blank])
            reported_values = r["values"][value] if value is not None else r["values"]
            typed = [*_printed(reported_values, spec, r), *_printed_extras(r.get("extras") or [], spec)]
            paper.append_row(table, [f"{r['label']} (paper)", *typed])
            if r["id"] in results:
                if spec.get("gain_over"):
                    ours = gain_cells(spec, results, r["id"])
                else:
                    ours = ours_cells(spec, results[r["id"]], value)
                more = extras(spec, results[r["id"]])
                paper.append_row(table, [f"{r['label']} (ours)", *_printed(ours, spec), *_printed_extras(more, spec)])
                key = r["id"] if value is None else f"{r['id']}@{value}"
                table.attrs["values"][key] = {k: v for k, v in zip(keys, [c[0] for c in ours] + more)}
    return table


def say_what_is_found(results_dir: str | Path) -> None:
    """Per table, the protocol it needs and the rows whose results are of another protocol only (with the command
    that produces the right ones); with no row of any table evaluated by its protocol, exit 2."""
    lines, any_found = [], False
    for name in TABLES:
        spec = reported(name)
        protocol = spec.get("protocol", name)
        rows = list(dict.fromkeys(r["id"] for r in spec["rows"] if r["id"] is not None))
        found = paper.load_results(results_dir, rows, protocol)
        any_found = any_found or bool(found)
        lines.append(f"{spec['table']}: {len(found)} of {len(rows)} rows have protocol-{protocol} results")
        lines += ["  " + line for line in paper.protocol_lines(results_dir, rows, protocol, spec["table"])]
    if not any_found:
        paper.fail(
            "\n".join([*lines, f"no row of any table has results in {results_dir}: {paper.how_to_evaluate('P')}"])
        )
    print("\n".join(lines))
