"""The paper rows: which `conf/exp/` file is which row of which paper table, read from the file's own `paper:` block,
the one place that says it (the notebooks, the tests, the README's rows table and docs/reproduce.md's rows read it
from here).

    paper:
      tables:                       # every table this run is a row of, in the paper's layout
        - {table: SARL Table 2, position: 6, group: "GRPO", label: "w/ SARL (Ours)"}

`position` orders the rows of a table, said here only: in a table typed in notebooks/reported/, the row's line there
(in SARL's untyped tables 1..n; their base model, no `conf/exp/` run, is printed first); `group` is the heading the
row sits under ("" for none); `label` is the row's text as the paper prints it.
A run that is no row of a paper table says so: `tables: []` and a `note` saying what it is instead.

Every run also gives its line of the README's paper-rows table (written by `python -m sarl.reports.rows_doc`):

      readme: {data: aime_1983_2024, reward: sarl (KMeans), algorithm: GRPO}   # source: optional, see below

`source` is the "paper, table" cell; without it the cell is the run's table and label, or its tables ("SARL
Tables 2, 4, 10"). Runs that
each change one setting of another row may share one line: each says `readme: {line: "evol_rl_*_paper"}`, a pattern
that matches exactly the runs saying it, and one of them also gives the line's cells.

The block is composed into the training config as `paper` (the exp files are `@package _global_`); no back end
reads it. The protocols that evaluate a run (`row_protocols`: conf/eval/protocol/ files whose `paper` its tables, or
its note, name) are read from it too (the held-out sets `python -m sarl.launch.inputs` lists). A file without a
well-formed block is left out of `paper_rows()` and reported by `metadata_problems()` (a test asserts there are
none), so that one new row without metadata does not stop the notebooks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml

from sarl.runtime.files import CONF_DIR

EXP_DIR = CONF_DIR / "exp"
PROTOCOL_DIR = CONF_DIR / "eval" / "protocol"  # the papers' evaluation protocols (eval.run protocol=NAME)
ENTRY_KEYS = ("table", "position", "group", "label")
CELL_KEYS = ("data", "reward", "algorithm")  # the README cells every line gives; `source` and `line` are optional
README_KEYS = ("line", "source", *CELL_KEYS)


@dataclass(frozen=True)
class ReadmeLine:
    """A run's line of the README's paper-rows table: `line` (the run's name, or the pattern of the runs sharing the
    line), and its cells, None for a run whose shared line another run gives."""

    exp: str
    line: str
    source: str | None
    cells: dict[str, str] | None


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


def _paper_block(path: Path) -> dict | None:
    paper = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("paper")
    return paper if isinstance(paper, dict) else None


def _readme(path: Path, paper: dict) -> tuple[ReadmeLine | None, str | None]:
    """The run's README line from `paper.readme` and, if it is missing or malformed, what is wrong with it."""
    block, where = paper.get("readme"), f"{path}: paper.readme"
    fix = "write `readme: {data: ..., reward: ..., algorithm: ...}` (optional `source`, `line`; sarl/runtime/rows.py)"
    if not isinstance(block, dict):
        return None, f"{where} is missing; {fix}"
    if set(block) - set(README_KEYS) or any(not isinstance(v, str) or not v.strip() for v in block.values()):
        return None, f"{where} has {sorted(block)}: keys among {list(README_KEYS)}, each a non-empty string; {fix}"
    given = [k for k in CELL_KEYS if k in block]
    if given and len(given) < len(CELL_KEYS) or not given and ("line" not in block or "source" in block):
        return None, f"{where} gives {sorted(block)}: all of {list(CELL_KEYS)}, or only `line` to join another's line"
    cells = {k: block[k] for k in CELL_KEYS} if given else None
    return ReadmeLine(path.stem, block.get("line", path.stem), block.get("source"), cells), None


def _entries(path: Path) -> tuple[list[PaperRow], str | None]:
    """The rows of one exp file and, if its `paper:` block is missing or malformed, what is wrong with it."""
    fix = "add `paper: {tables: [{table: ..., position: ..., group: ..., label: ...}]}` (see sarl/runtime/rows.py)"
    paper = _paper_block(path)
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


def readme_lines(exp_dir: str | Path = EXP_DIR) -> tuple[list[ReadmeLine], list[str]]:
    """Every run's README line (sorted by run) and the problems: a missing or malformed `paper.readme`, a shared
    line whose pattern does not match exactly the runs saying it, or that none or two of them give the cells of."""
    lines, problems = [], []
    for name in experiments(exp_dir):
        path = Path(exp_dir) / f"{name}.yaml"
        line, problem = _readme(path, _paper_block(path) or {})
        lines += [line] if line else []
        problems += [problem] if problem else []
    names = experiments(exp_dir)
    for pattern in sorted({r.line for r in lines if r.line != r.exp}):
        members = [r for r in lines if r.line == pattern]
        matched = [n for n in names if fnmatchcase(n, pattern)]
        if [r.exp for r in members] != matched:
            problems.append(f"README line {pattern!r} matches {matched} but is said by {[r.exp for r in members]}")
        if sum(r.cells is not None for r in members) != 1:
            problems.append(f"README line {pattern!r}: exactly one of {[r.exp for r in members]} gives its cells")
    for r in lines:
        if r.line == r.exp and r.cells is None:
            problems.append(f"conf/exp/{r.exp}.yaml: paper.readme gives no cells and shares no line")
    return lines, problems


def metadata_problems(exp_dir: str | Path = EXP_DIR) -> list[str]:
    """One line per conf/exp/ file whose `paper:` block is missing or malformed (its tables or its README line),
    and per table position claimed twice; empty when all is well."""
    return _scan(exp_dir)[1] + readme_lines(exp_dir)[1]


def protocol_papers(protocol_dir: str | Path = PROTOCOL_DIR) -> dict[str, list[str]]:
    """paper -> the protocols (conf/eval/protocol/*.yaml `paper`) that evaluate its tables."""
    out: dict[str, list[str]] = {}
    for path in sorted(Path(protocol_dir).glob("*.yaml")):
        paper = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("paper")
        out.setdefault(str(paper), []).append(path.stem)
    return out


def protocols_of_table(text: str) -> list[str]:
    """The protocols that evaluate a paper table ("EVOL-RL Table 1"), or a row described by its note: those of the
    paper the text names first (of the protocols' papers; the longer name where two start at one place)."""
    papers = protocol_papers()
    found = [(m.start(), -len(p), p) for p in papers for m in [re.search(rf"(?<!\w){re.escape(p)}(?!\w)", text)] if m]
    return papers[min(found)[2]] if found else []


def row_protocols(paper: Any) -> list[str]:
    """The protocols that evaluate a run from its `paper:` block (a mapping, as composed or as read): those of its
    tables' papers, or, a run of no table, of the paper its note names first; [] for a run of no paper's (the
    smoke run's note names none)."""
    paper = paper or {}
    texts = [str(t["table"]) for t in paper.get("tables") or []] or [str(paper.get("note") or "")]
    return list(dict.fromkeys(p for text in texts for p in protocols_of_table(text)))
