"""The tables of EVOL-RL, GRP and Structured Reasoning rebuilt from `eval.run` results of their protocols, each run
beside the paper's own numbers (notebooks/reported/<protocol>.yaml, typed from the cited table).

Results layout: `RESULTS/<row id>/results.json` or `RESULTS/<row id>/<date>_<time>/results.json`
(`_paper.find_results`), where the row ids are those of the reported file
(`python -m eval.run ckpt=... protocol=evol_rl name=<row id>`). A table lists each reported row as
"<label> (paper)" and, when that row has results, "<label> (ours)" under it; a cell of several metrics prints
them as `a/b` (EVOL-RL's pass@1/pass@16), a mean ± std as `m±s`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _paper as paper
import pandas as pd
import yaml

REPORTED = Path(__file__).resolve().parent / "reported"
PROTOCOLS = ("evol_rl", "grp", "structured", "structured_temperature")


def reported(protocol: str) -> dict[str, Any]:
    """notebooks/reported/<protocol>.yaml: the paper's table (title, columns, cell metrics, rows)."""
    return yaml.safe_load((REPORTED / f"{protocol}.yaml").read_text(encoding="utf-8"))


def _metric(metrics: dict[str, Any], name: str) -> float | None:
    if name == "avg@k":  # avg@<n>: n is the protocol's
        return next((v for k, v in metrics.items() if k.startswith("avg@")), None)
    return metrics.get(name)


def _cell(values: list[float | None], decimals: int) -> str:
    if any(v is None for v in values):
        return "-"
    return "/".join(f"{paper.printed(v, decimals):.{decimals}f}" for v in values)


def ours_cells(spec: dict[str, Any], results: dict[str, Any], sweep_value: Any = None) -> list[list[float | None]]:
    """A run's numbers in the table's columns: its benchmarks' metrics (at one sweep value), or for the
    temperature table the mean and std of its sweep."""
    math = results.get("math") or {}
    out = []
    for bench in spec["columns"]:
        if spec["cell"] == ["mean", "std"]:
            s = (math.get("sweep") or {}).get(bench) or {}
            out.append([s.get("mean"), s.get("std")])
            continue
        label = bench if sweep_value is None else f"{bench}/{spec['sweep']}={sweep_value}"
        metrics = ((math.get("benchmarks") or {}).get(label) or {}).get("metrics") or {}
        out.append([_metric(metrics, m) for m in spec["cell"]])
    return out


def _printed(values: list[list[float | None]], spec: dict[str, Any]) -> list[str]:
    if spec["cell"] == ["mean", "std"]:
        return ["-" if None in v else "±".join(f"{paper.printed(x, 2):.2f}" for x in v) for v in values]
    return [_cell(v, int(spec.get("decimals", 2))) for v in values]


def protocol_table(protocol: str, results_dir: str | Path) -> pd.DataFrame:
    """The paper's table with each row's results beside it; `attrs["values"]` holds our numbers by row."""
    spec = reported(protocol)
    rows = [r["id"] for r in spec["rows"]]
    results = paper.load_results(results_dir, rows)
    for row, r in results.items():
        if (r.get("protocol") or {}).get("name", "sarl") != protocol:
            raise ValueError(f"{row}: results of protocol {r.get('protocol', {}).get('name')}, not {protocol}")
    table = paper.new_table(protocol, spec["title"], ["Model", *spec["columns"].values()])
    table.attrs["missing"] = [f"{row} (no results.json)" for row in rows if row not in results]
    sweep_values = list(spec["rows"][0]["values"]) if spec.get("sweep") else [None]
    group = None
    for value in sweep_values:
        if value is not None:
            paper.append_row(table, [f"*{spec['sweep']} {value}*"] + [""] * len(spec["columns"]))
        for r in spec["rows"]:
            if r.get("group") and r["group"] != group and value is None:
                group = r["group"]
                paper.append_row(table, [f"*{group}*"] + [""] * len(spec["columns"]))
            reported_values = r["values"][value] if value is not None else r["values"]
            paper.append_row(table, [f"{r['label']} (paper)", *_printed(reported_values, spec)])
            if r["id"] in results:
                ours = ours_cells(spec, results[r["id"]], value)
                paper.append_row(table, [f"{r['label']} (ours)", *_printed(ours, spec)])
                key = r["id"] if value is None else f"{r['id']}@{value}"
                table.attrs["values"][key] = {b: v[0] for b, v in zip(spec["columns"], ours)}
    return table
