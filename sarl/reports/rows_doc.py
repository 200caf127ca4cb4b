"""The paper rows as the documentation lists them, written from the `paper:` blocks of conf/exp/ (sarl/runtime/rows.py):
the README's paper-rows table (one line per run, or per family of runs sharing one) and docs/reproduce.md's rows of
each paper table, each between `<!-- rows:begin -->` and `<!-- rows:end -->` so that the prose around them is kept.

    python -m sarl.reports.rows_doc            # print both blocks
    python -m sarl.reports.rows_doc --write    # rewrite README.md and docs/reproduce.md between the markers
    python -m sarl.reports.rows_doc --check    # exit 1 naming the first stale line (what tests/sarl/test_rows.py runs)

The README lists the rows of SARL's tables first, then EVOL-RL's, GRP's and Structured Reasoning's (each in table
and position order, a run in none of a paper's tables after them by name: its paper is its `paper.fidelity.source`),
then the runs of no paper by name.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from sarl.runtime.errors import UserError
from sarl.runtime.files import REPO_ROOT
from sarl.runtime.rows import ReadmeLine, metadata_problems, paper_rows, readme_lines

BEGIN, END = "<!-- rows:begin -->", "<!-- rows:end -->"
PAPERS = ("SARL", "SARL draft", "EVOL-RL", "GRP", "Structured Reasoning")  # the README's order of the papers
README_HEADER = ["| row | paper, table | data | reward | algorithm |", "|---|---|---|---|---|"]
REPRODUCE_HEADER = ["| table | position | group | label | row |", "|---|---|---|---|---|"]


def _natural(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _paper_of(table: str) -> str:
    return table.rsplit(" Table ", 1)[0]


def readme_table(exp_dir: str | Path) -> list[str]:
    """The README's paper-rows table, one line per run or shared line, in the papers' order."""
    rows = paper_rows(exp_dir=exp_dir)
    lines, _ = readme_lines(exp_dir)

    def key(line: ReadmeLine) -> tuple:
        own = [r for r in rows if r.exp == line.exp]
        if own:
            paper, table, position = _paper_of(own[0].table), _natural(own[0].table), own[0].position
        else:  # after the paper's table rows
            block = yaml.safe_load((Path(exp_dir) / f"{line.exp}.yaml").read_text(encoding="utf-8"))["paper"]
            paper, table, position = str((block.get("fidelity") or {}).get("source") or ""), None, 0
        rank = PAPERS.index(paper) if paper in PAPERS else len(PAPERS)
        return rank, table is None, table or [], position, line.exp

    out = list(README_HEADER)
    for line in sorted((r for r in lines if r.cells is not None), key=key):
        source = line.source or _tables_cell([r for r in rows if r.exp == line.exp])
        cells = [f"`{line.line}`", source, *line.cells.values()]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def _tables_cell(rows: list) -> str:
    """The "paper, table" cell of a run that gives none: its one table and label, or its tables by paper."""
    if len(rows) == 1:
        return f'{rows[0].table} "{rows[0].label}"'
    by_paper: dict[str, list[str]] = {}
    for r in rows:
        by_paper.setdefault(_paper_of(r.table), []).append(r.table.rsplit(" ", 1)[1])
    return "; ".join(f"{paper} Tables {', '.join(numbers)}" for paper, numbers in by_paper.items())


def reproduce_table(exp_dir: str | Path) -> list[str]:
    """docs/reproduce.md's rows: one line per row of a paper table, by table and position."""
    out = list(REPRODUCE_HEADER)
    rank = {paper: i for i, paper in enumerate(PAPERS)}
    for r in sorted(paper_rows(exp_dir=exp_dir), key=lambda r: rank.get(_paper_of(r.table), len(PAPERS))):
        cells = [r.table, str(r.position), r.group, r.label, f"`+exp={r.exp}`"]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def documents(root: str | Path = REPO_ROOT, exp_dir: str | Path | None = None) -> dict[Path, list[str]]:
    """{document: its generated block} for README.md and docs/reproduce.md under `root`."""
    exp_dir = Path(exp_dir) if exp_dir is not None else Path(root) / "conf" / "exp"
    problems = metadata_problems(exp_dir)
    if problems:
        raise UserError(f"{len(problems)} conf/exp/ paper block(s) to fix first: {problems[0]}")
    return {
        Path(root) / "README.md": readme_table(exp_dir),
        Path(root) / "docs" / "reproduce.md": reproduce_table(exp_dir),
    }


def replaced(text: str, block: list[str], where: Path) -> str:
    """`text` with the lines between its markers replaced by `block`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise UserError(f"{where}: needs one `{BEGIN}` line and one `{END}` line after it, around the generated rows")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return head + BEGIN + "\n" + "\n".join(block) + "\n" + END + tail


def stale(root: str | Path = REPO_ROOT, exp_dir: str | Path | None = None) -> list[str]:
    """One line per document whose committed rows differ from the generated: its first differing line."""
    out = []
    for path, block in documents(root, exp_dir).items():
        text = path.read_text(encoding="utf-8")
        want = replaced(text, block, path)
        if want != text:
            old, new = text.splitlines(), want.splitlines()
            i = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
            found = old[i] if i < len(old) else "(end of file)"
            expected = new[i] if i < len(new) else "(end of file)"
            out.append(f"{path.name}:{i + 1}: has {found[:80]!r}, the paper: blocks give {expected[:80]!r}")
    return out


def write_docs(root: str | Path = REPO_ROOT, exp_dir: str | Path | None = None) -> list[Path]:
    """Rewrite the documents' generated rows; the documents that changed."""
    changed = []
    for path, block in documents(root, exp_dir).items():
        text = path.read_text(encoding="utf-8")
        new = replaced(text, block, path)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sarl.reports.rows_doc",
        description="The README's paper-rows table and docs/reproduce.md's rows, from the paper: blocks of conf/exp/.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the documents between their markers")
    mode.add_argument("--check", action="store_true", help="exit 1 if a document differs from the generated")
    args = parser.parse_args(argv)
    try:
        if args.write:
            for path in write_docs():
                print(f"wrote {path.relative_to(REPO_ROOT)}")
            return 0
        if args.check:
            problems = stale()
            for line in problems:
                print(f"{line}; run python -m sarl.reports.rows_doc --write", file=sys.stderr)
            return 1 if problems else 0
        for path, block in documents().items():
            print(f"{path.relative_to(REPO_ROOT)}:\n" + "\n".join(block))
        return 0
    except UserError as err:
        sys.stderr.write(f"sarl.reports.rows_doc: {err}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
