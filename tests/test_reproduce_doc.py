"""docs/reproduce.md accounts for every numbered table of the five papers, one line each: the command that rebuilds
it or why it is out of scope. The expected table numbers are written here once, counted from the captions ("Table N:")
of the papers' texts, which are not in the repository: SARL 1-10, SARL draft 1-8, EVOL-RL 1-5, GRP 1-4, Structured
Reasoning 1-21. Every file a line names exists; a table that conf/exp rows list in their `paper:` blocks is rebuilt
from "its rows" (the generated list) or names them; every typed table of notebooks/reported/ is named on its table's
line."""

import re
from pathlib import Path

import yaml

from sarl.runtime.rows import paper_rows

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reproduce.md"

# Counted from each paper's "Table N:" captions (docs/references.md names the papers)
TABLES = {
    "SARL": range(1, 11),
    "SARL draft": range(1, 9),
    "EVOL-RL": range(1, 6),
    "GRP": range(1, 5),
    "Structured Reasoning": range(1, 22),
}
ITEM = re.compile(r"^- \*\*Table (\d+)\*\*: (.*)$")
OUT_OF_SCOPE = "out of scope: "
ROWS_LINK = "its [rows](#rows)"  # the rows listed from the `paper:` blocks (sarl/reports/rows_doc.py)


def entries(text: str) -> dict[str, dict[int, str]]:
    """{paper: {table number: its line}} from `## <paper>` sections of `- **Table N**: ...` items (an item's wrapped
    continuation lines joined to it)."""
    out: dict[str, dict[int, str]] = {}
    paper, last = None, None
    for line in text.splitlines():
        if line.startswith("## "):
            paper, last = line[3:].strip(), None
            assert paper not in out, f"section {paper} twice"
            out[paper] = {}
        elif paper and (m := ITEM.match(line)):
            last = int(m.group(1))
            assert last not in out[paper], f"{paper} Table {last} twice"
            out[paper][last] = m.group(2)
        elif paper and last is not None and line.startswith("  "):
            out[paper][last] += " " + line.strip()
        else:
            last = None
    return out


def problems(text: str) -> list[str]:
    """What is wrong with a reproduce.md text: missing or extra tables, a line neither rebuilding nor out of scope
    with a reason, a file it names that does not exist."""
    found, out = entries(text), []
    if set(found) != set(TABLES):
        out.append(f"sections {sorted(found)}, expected {sorted(TABLES)}")
    for paper, numbers in TABLES.items():
        got = found.get(paper, {})
        if sorted(got) != list(numbers):
            out.append(f"{paper}: tables {sorted(got)}, expected {list(numbers)}")
        for n, line in got.items():
            where = f"{paper} Table {n}"
            if line.startswith(OUT_OF_SCOPE):
                if len(line[len(OUT_OF_SCOPE) :].split()) < 5:
                    out.append(f"{where}: out of scope without a reason")
            elif not re.search(r"notebooks/\w+\.py", line) or "protocol=" not in line:
                out.append(f"{where}: neither a rebuild (a protocol and a notebook) nor out of scope")
            for row in re.findall(r"\+exp=(\w+)", line):
                if not (ROOT / "conf" / "exp" / f"{row}.yaml").is_file():
                    out.append(f"{where}: conf/exp/{row}.yaml does not exist")
            for protocol in re.findall(r"protocol=(\w+)", line):
                if not (ROOT / "conf" / "eval" / "protocol" / f"{protocol}.yaml").is_file():
                    out.append(f"{where}: conf/eval/protocol/{protocol}.yaml does not exist")
            for path in re.findall(r"`((?:notebooks|conf)/[\w/.-]+\.(?:py|yaml))`", line):
                if not (ROOT / path).is_file():
                    out.append(f"{where}: {path} does not exist")
    return out


def test_reproduce_doc_accounts_for_every_table_of_the_five_papers():
    assert problems(DOC.read_text(encoding="utf-8")) == []


def test_the_check_catches_a_missing_table_a_bare_out_of_scope_and_a_missing_file():
    text = DOC.read_text(encoding="utf-8")
    assert any("GRP: tables [1, 2, 3]" in p for p in problems(text.replace("- **Table 4**: train `+exp=grp_math", "x")))
    bare = text.replace(
        "- **Table 7**: out of scope: timings of the MaxFlow reward on the authors' hardware.",
        "- **Table 7**: out of scope: timings.",
    )
    assert problems(bare) == ["Structured Reasoning Table 7: out of scope without a reason"]
    gone = text.replace("`+exp=grp_code_paper model=qwen3_8b_base`", "`+exp=grp_code_papr model=qwen3_8b_base`")
    assert problems(gone) == ["GRP Table 3: conf/exp/grp_code_papr.yaml does not exist"]
    vague = text.replace("evaluate with `protocol=grp`\n  (Length", "evaluate\n  (Length")
    assert problems(vague) == ["GRP Table 4: neither a rebuild (a protocol and a notebook) nor out of scope"]


def test_each_tables_rows_and_typed_numbers_are_named_on_its_line():
    """A table whose conf/exp rows name it in their `paper:` block is rebuilt, and its line trains "its [rows](#rows)",
    the list that `python -m sarl.reports.rows_doc` writes from the blocks above the sections (tests/sarl/test_rows.py
    holds it equal to them), or names each of them; a line that says "its rows" has some. The notebooks/reported/ file
    typed from a table is named on its line."""
    found = entries(DOC.read_text(encoding="utf-8"))
    for paper, numbers in TABLES.items():
        for n in numbers:
            line, rows = found[paper][n], {r.exp for r in paper_rows(f"{paper} Table {n}")}
            listed = ROWS_LINK in line
            assert listed == bool(rows) or not listed and rows <= set(re.findall(r"\+exp=(\w+)", line)), (paper, n)
            assert not rows or not line.startswith(OUT_OF_SCOPE), (paper, n, "has rows but is out of scope")
    typed = sorted((ROOT / "notebooks" / "reported").glob("*.yaml"))
    assert len(typed) >= 11
    for path in typed:
        table = yaml.safe_load(path.read_text(encoding="utf-8"))["table"]
        paper, n = re.fullmatch(r"(.+) Table (\d+)", table).groups()
        assert f"`notebooks/reported/{path.name}`" in found[paper][int(n)], (table, path.name)
