"""The documentation stands on its own: every relative link in README.md, CONTRIBUTING.md and docs/**/*.md
resolves to a file of the repository (and, for a link to a heading of a markdown file, to that heading or
an `<a id=...>` anchor), and no tracked text file cites a design document that is not in the repository."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini"}

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")

# The documents that used to be cited live outside the repository; their names are assembled so that this
# file does not match itself.
SPEC_WORD = "".join(("S", "PEC"))
ARCH_DOC = "".join(("ARCHI", "TECTURE.md"))
OUTSIDE = re.compile(rf"\b{SPEC_WORD}\b|\b[Ss]eed[- ]?00\d\b|{re.escape(ARCH_DOC)}")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code removed."""
    out, fenced = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((i, INLINE_CODE.sub("", line)))
    return out


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    text = md.read_text(encoding="utf-8")
    for _, line in prose_lines(text):
        found.update(HTML_ANCHOR.findall(line))
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            slug = github_slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(md: Path) -> list[tuple[int, str]]:
    out = []
    for i, line in prose_lines(md.read_text(encoding="utf-8")):
        out += [(i, m.group(1)) for m in LINK.finditer(line)]
        out += [(i, m.group(1)) for m in IMAGE.finditer(line)]
    return out


def broken_links(md: Path) -> list[str]:
    problems = []
    for line, target in links(md):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        where = f"{md.relative_to(ROOT)}:{line}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif ROOT not in dest.parents and dest != ROOT:
            problems.append(f"{where} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where} (no heading or anchor #{anchor} in {dest.relative_to(ROOT)})")
    return problems


def test_the_documents_exist():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "CONTRIBUTING.md", "docs/decisions.md", "docs/references.md", "docs/design.md"} <= names


@pytest.mark.parametrize("md", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(md):
    assert broken_links(md) == []


def test_the_link_check_catches_a_missing_file_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "b.md").write_text('# A title, with `code`\n\n<a id="s1"></a>\n## 1. Steps\n', encoding="utf-8")
    good = "[x](b.md) [y](b.md#a-title-with-code) [z](b.md#s1) [w](b.md#1-steps) [u](https://example.org/q)"
    bad = "[x](missing.md) [y](b.md#nowhere)\n```\n[in code](ignored.md)\n```\n`[inline](ignored.md)`"
    (tmp_path / "a.md").write_text(good + "\n" + bad + "\n", encoding="utf-8")
    problems = broken_links(tmp_path / "a.md")
    assert len(problems) == 2
    assert "missing.md (no such file)" in problems[0] and "#nowhere" in problems[1]


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
        names = [n for n in out.stdout.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but environments and runs
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()]
        names = [n for n in names if not n.startswith((".git/", "runs/"))]
    files = []
    for name in names:
        if name.startswith(".venv") or "/.venv" in name:
            continue
        p = ROOT / name
        if (p.suffix in TEXT_SUFFIXES or p.name == "Makefile") and p.is_file():
            files.append(p)
    return files


def test_no_file_cites_a_document_outside_the_repository():
    hits = []
    for p in tracked_text_files():
        for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert hits == [], "cite docs/decisions.md (decisions §N) or a paper by its short name (docs/references.md)"


def test_the_citation_pattern_matches_the_old_forms_only():
    seed, number = "seed", "003"
    old = [
        f"{SPEC_WORD} section 1",
        f"({SPEC_WORD} 2)",
        f"{seed} {number} Eq. 1",
        f"Seed {number} App. A",
        f"{seed}-{number} notes",
        f"see {ARCH_DOC}",
    ]
    assert all(OUTSIDE.search(s) for s in old)
    assert not any(OUTSIDE.search(s) for s in ["SPECIALS = [...]", "decisions §1.3", "seed: 0", "seeds 0-3"])


README_MAX_LINES = 150
README_MAX_CHARS = 120  # a line of prose (or of a code block)
README_MAX_ROW_CHARS = 200  # a table row


def test_the_readme_stays_short():
    """The README is the front page: the two set-up commands, the user commands, the rows, design and measured
    figures, at most README_MAX_LINES lines of readable length; details belong in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    long = [
        f"line {i}: {len(line)} characters"
        for i, line in enumerate(lines, 1)
        if len(line) > (README_MAX_ROW_CHARS if line.startswith("|") else README_MAX_CHARS)
    ]
    assert not long, f"README.md lines over {README_MAX_CHARS} characters ({README_MAX_ROW_CHARS} in a table): {long}"
