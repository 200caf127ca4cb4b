"""The paper rows: which `conf/exp/` file is which row of which paper table, read from the file's own `paper:` block,
the one place that says it (the notebooks, the tests and the README table read it from here).

    paper:
      tables:                       # every table this run is a row of, in the paper's layout
        - {table: SARL Table 2, position: 6, group: "GRPO", label: "w/ SARL (Ours)"}

`position` orders the rows of a table (the base model, which is not a `conf/exp/` run, comes first in SARL's
tables); `group` is the heading the row sits under ("" for none); `label` is the row's text as the paper prints it.
A run that is no row of a paper table says so: `tables: []` and a `note` saying what it is instead.

The block is composed into the training config as `paper` (the exp files are `@package _global_`); no back end
reads it. A file without a well-formed block is left out of `paper_rows()` and reported by `metadata_problems()`
(a test asserts there are none), so that one new row without metadata does not stop the notebooks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from sarl.runtime.files import CONF_DIR

EXP_DIR = CONF_DIR / "exp"
ENTRY_KEYS = ("table", "position", "group", "label")


@dataclass(frozen=True)
class PaperRow:
    """One row of one paper table: the run `exp` (a conf/exp/ name) printed as `label` under `group`."""

    exp: str
    table: str
    position: int
    group: str
    label: str


def experiments(exp_dir: str | Path = EXP_DIR) -> list[str]:
    """Every conf/exp/ name, sorted."""
    return sorted(p.stem for p in Path(exp_dir).glob("*.yaml"))


def _entries(path: Path) -> tuple[list[PaperRow], str | None]:
    """The rows of one exp file and, if its `paper:` block is missing or malformed, what is wrong with it."""
    fix = "add `paper: {tables: [{table: ..., position: ..., group: ..., label: ...}]}` (see sarl/runtime/rows.py)"
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    paper = data.get("paper")
    if not isinstance(paper, dict) or not isinstance(paper.get("tables"), list):
        return [], f"{path}: no `paper.tables` list; {fix}, or `tables: []` with a `note` if it is in no paper table"
    tables = paper["tables"]
    if not tables and not str(paper.get("note") or "").strip():
        return [], f"{path}: `paper.tables` is empty and there is no `paper.note` saying why the run is in no table"
    rows = []
    for i, entry in enumerate(tables):
        where = f"{path}: paper.tables[{i}]"
        if not isinstance(entry, dict) or set(entry) != set(ENTRY_KEYS):
            keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            return [], f"{where} has {keys}; it needs exactly {list(ENTRY_KEYS)}"
        if not isinstance(entry["position"], int) or isinstance(entry["position"], bool) or entry["position"] < 1:
            return [], f"{where}.position={entry['position']!r}: must be an integer >= 1"
        if not str(entry["table"]).strip() or not str(entry["label"]).strip():
            return [], f"{where}: `table` and `label` must not be empty"
        table, group, label = str(entry["table"]), str(entry["group"]), str(entry["label"])
        rows.append(PaperRow(path.stem, table, entry["position"], group, label))
    return rows, None


def _scan(exp_dir: str | Path) -> tuple[list[PaperRow], list[str]]:
    rows, problems = [], []
    for name in experiments(exp_dir):
        found, problem = _entries(Path(exp_dir) / f"{name}.yaml")
        rows += found
        if problem:
            problems.append(problem)
    seen: dict[tuple[str, int], str] = {}
    for r in rows:
        other = seen.setdefault((r.table, r.position), r.exp)
        if other != r.exp:
            problems.append(f"{r.table} position {r.position}: both {other} and {r.exp}; give each row its own")
    return sorted(rows, key=lambda r: (_natural(r.table), r.position)), problems


def _natural(text: str) -> list:
    """Sort key that puts "SARL Table 9" before "SARL Table 10"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def paper_rows(table: str | None = None, exp_dir: str | Path = EXP_DIR) -> list[PaperRow]:
    """Every paper row (of `table` only, when given, e.g. "SARL Table 2"), ordered by table and position; files
    with a missing or malformed `paper:` block are left out (see `metadata_problems`)."""
    rows, _ = _scan(exp_dir)
    return [r for r in rows if table is None or r.table == table]


def paper_experiments(exp_dir: str | Path = EXP_DIR) -> list[str]:
    """The conf/exp/ runs that are a row of at least one paper table, sorted."""
    return sorted({r.exp for r in paper_rows(exp_dir=exp_dir)})


def paper_tables(exp_dir: str | Path = EXP_DIR) -> list[str]:
    """The tables the rows name, in order ("SARL Table 2" before "SARL Table 10")."""
    return list(dict.fromkeys(r.table for r in paper_rows(exp_dir=exp_dir)))


def metadata_problems(exp_dir: str | Path = EXP_DIR) -> list[str]:
    """One line per conf/exp/ file whose `paper:` block is missing or malformed, and per table position claimed
    twice; empty when all is well."""
    return _scan(exp_dir)[1]
