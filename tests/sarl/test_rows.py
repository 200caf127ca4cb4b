"""sarl.runtime.rows: the paper rows read from the `paper:` blocks of conf/exp/, the one place that says which run is
which row of which table; a missing or malformed block is named with its file and what to write."""

import re
import shutil
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from testkit import verl_config_for

from sarl.launch.compose import compose_train_config
from sarl.reports import rows_doc
from sarl.runtime.errors import UserError
from sarl.runtime.rows import PaperRow, experiments, metadata_problems, paper_experiments, paper_rows, paper_tables

ROOT = Path(__file__).resolve().parents[2]
REPORTED = ROOT / "notebooks" / "reported"
README_LINE = "  readme: {data: d, reward: r, algorithm: a}\n"


def test_the_tables_in_number_order_and_the_runs_in_none_say_what_they_are():
    sarl_tables = [t for t in paper_tables() if t.startswith("SARL ")]
    assert sarl_tables[:2] == ["SARL Table 2", "SARL Table 3"]  # numbers in order: 9 before 10
    assert sarl_tables.index("SARL Table 9") < sarl_tables.index("SARL Table 10")
    assert set(paper_experiments()) < set(experiments())  # the smoke run and the comparison rows are in no table
    assert "smoke" not in paper_experiments() and "grpo_sarl_open" in paper_experiments()
    # the code rows: GRP's code pipeline (its stages are GRP Table 1's code rows) and its GRPO baseline, each with
    # a note saying what it is instead
    for exp in ("grp_code_paper", "grpo_code_exec"):
        cfg, _ = compose_train_config([f"+exp={exp}"])
        assert exp in experiments() and exp not in paper_experiments() and "code" in cfg.paper.note


def typed_tables() -> dict[str, list[dict]]:
    """{paper table: its rows as typed in notebooks/reported/}."""
    out = {}
    for path in sorted(REPORTED.glob("*.yaml")):
        typed = yaml.safe_load(path.read_text(encoding="utf-8"))
        out[typed["table"]] = typed["rows"]
    return out


def test_each_position_is_its_line_of_the_paper_table():
    """The order of a table's rows is their `position`s, said once in the `paper:` blocks: unique (metadata_problems),
    and each the row's line of the table as typed in notebooks/reported/ (the same label; in a table of checkpoints,
    Structured Reasoning Table 11, the row's label heads a block of lines, and `position` is the block's); a table not
    typed there (SARL's, rebuilt by notebooks/tables.py) has positions 1..n."""
    typed = typed_tables()
    assert metadata_problems() == []
    for table in paper_tables():
        rows = paper_rows(table)
        positions = [r.position for r in rows]
        assert positions == sorted(set(positions)), table
        if table in typed:
            lines = typed[table]
            for r in rows:
                assert r.position <= len(lines), (r, f"{table} has {len(lines)} typed lines")
                blocks = list(dict.fromkeys(line.get("group") for line in lines))
                if r.label in blocks and lines[r.position - 1]["label"] != r.label:
                    assert blocks.index(r.label) + 1 == r.position, (r, blocks)
                else:
                    assert lines[r.position - 1]["label"] == r.label, (r, lines[r.position - 1])
        else:
            assert positions == list(range(1, len(rows) + 1)), (table, positions)


def test_evol_rl_rows_point_at_their_cells_of_the_typed_tables():
    """Each EVOL-RL row's position is its row of the table typed from the paper (notebooks/reported/): the same label
    and the evaluation id that fills it (Table 4: `<the training set's w/EVOL-RL id>_no_<ablation>`, decisions
    §3.2), and in Table 4 the same training-set group."""
    reported = REPORTED
    ids = {"evol_rl_ttrl_paper": "qwen3_4b_base_ttrl", "evol_rl_paper": "qwen3_4b_base_evol_rl"}
    for table, name in (("EVOL-RL Table 1", "evol_rl"), ("EVOL-RL Table 4", "evol_rl_ablation")):
        typed = yaml.safe_load((reported / f"{name}.yaml").read_text())["rows"]
        for r in paper_rows(table):
            cell = typed[r.position - 1]
            expected = ids.get(r.exp, "qwen3_4b_base_" + r.exp.removesuffix("_paper"))
            assert (cell["label"], cell["id"]) == (r.label, expected), r
            assert table == "EVOL-RL Table 1" or cell["group"] == r.group, r


def test_the_block_reaches_the_composed_config_but_not_the_backend(tmp_path):
    cfg, v = verl_config_for(["+exp=grpo_sarl_math"], tmp_path, validate=False)
    assert cfg.paper.tables[0] == {"table": "SARL Table 2", "position": 6, "group": "GRPO", "label": "w/ SARL (Ours)"}
    assert "paper" not in OmegaConf.to_yaml(v)
    smoke, _ = compose_train_config(["+exp=smoke"])
    assert list(smoke.paper.tables) == [] and smoke.paper.note.startswith("not a row of a paper table")


def write(d, name, text, readme=README_LINE):
    """conf/exp/<name>.yaml in `d`: `text`, with a well-formed README line in its `paper:` block unless told."""
    (d / f"{name}.yaml").write_text("# @package _global_\n" + text + (readme if "paper:" in text else ""))


@pytest.mark.parametrize(
    "block,problem",
    [
        ("", "no `paper.tables` list; add `paper: {tables: [{table: ..., position: ..., group: ..., label: ...}]}`"),
        ("paper:\n  tables: []\n", "`paper.tables` is empty and there is no `paper.note`"),
        ("paper:\n  tables:\n    - {table: T, position: 1, label: x}\n", "paper.tables[0] has ['label', 'position', "),
        ("paper:\n  tables:\n    - {table: T, position: 0, group: '', label: x}\n", "position=0: must be an integer"),
        ("paper:\n  tables:\n    - {table: T, position: 1, group: '', label: ''}\n", "must not be empty"),
    ],
)
def test_a_missing_or_malformed_block_is_named_and_left_out(tmp_path, block, problem):
    write(tmp_path, "good", "paper:\n  tables:\n    - {table: T, position: 1, group: G, label: good}\n")
    write(tmp_path, "bad", block)
    messages = metadata_problems(tmp_path)
    assert messages and all(m.startswith(str(tmp_path / "bad.yaml")) for m in messages)
    assert problem in messages[0]
    assert paper_rows(exp_dir=tmp_path) == [PaperRow("good", "T", 1, "G", "good")]  # the others still read


NOTE = "paper:\n  tables: []\n  note: a run in no table\n"


@pytest.mark.parametrize(
    "readme,problem",
    [
        ("", "paper.readme is missing; write `readme: {data: ..., reward: ..., algorithm: ...}`"),
        ("  readme: {data: d, reward: r}\n", "all of ['data', 'reward', 'algorithm'], or only `line`"),
        ("  readme: {data: d, reward: r, algorithm: a, colour: blue}\n", "keys among ['line', 'source', 'data'"),
        ("  readme: {data: d, reward: '', algorithm: a}\n", "each a non-empty string"),
        ("  readme: {source: s}\n", "or only `line` to join another's line"),
    ],
)
def test_a_missing_or_malformed_readme_line_is_named(tmp_path, readme, problem):
    write(tmp_path, "bad", NOTE, readme)
    (message,) = metadata_problems(tmp_path)
    assert message.startswith(str(tmp_path / "bad.yaml")) and problem in message, message


def test_a_shared_readme_line_is_said_by_exactly_the_runs_its_pattern_matches(tmp_path):
    share = "  readme: {line: fam_*}\n"
    write(tmp_path, "fam_a", NOTE, "  readme: {line: fam_*, data: d, reward: r, algorithm: a}\n")
    write(tmp_path, "fam_b", NOTE, share)
    assert metadata_problems(tmp_path) == []
    write(tmp_path, "fam_c", NOTE)  # matched by the pattern, on a line of its own
    assert metadata_problems(tmp_path) == [
        "README line 'fam_*' matches ['fam_a', 'fam_b', 'fam_c'] but is said by ['fam_a', 'fam_b']"
    ]
    write(tmp_path, "fam_c", NOTE, share)
    write(tmp_path, "fam_a", NOTE, share)  # then no run gives the line's cells
    assert metadata_problems(tmp_path) == [
        "README line 'fam_*': exactly one of ['fam_a', 'fam_b', 'fam_c'] gives its cells"
    ]
    table = rows_doc.readme_table(tmp_path)  # ...and the generator refuses nothing, but lists no line for them
    assert table == rows_doc.README_HEADER


def test_two_rows_at_one_position_of_a_table_are_a_problem(tmp_path):
    write(tmp_path, "a", "paper:\n  tables:\n    - {table: T, position: 1, group: '', label: a}\n")
    write(tmp_path, "b", "paper:\n  tables:\n    - {table: T, position: 1, group: '', label: b}\n")
    assert metadata_problems(tmp_path) == ["T position 1: both a and b; give each row its own"]


def test_the_readme_and_reproduce_rows_are_the_ones_the_paper_blocks_give():
    """README.md's rows table and docs/reproduce.md's rows are `python -m sarl.reports.rows_doc --write`'s output,
    byte for byte between their markers; after a run of the generator, each conf/exp/ file is on exactly one README
    line (its own, or a pattern like `evol_rl_*_paper` matching the runs that share it)."""
    assert rows_doc.stale() == [], "run python -m sarl.reports.rows_doc --write"
    assert rows_doc.main(["--check"]) == 0
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Paper rows") : readme.index("## Where things are")]
    listed = re.findall(r"^\| `([a-z0-9_*]+)` \|", section, re.M)
    assert len(listed) == len(set(listed)), "a row is listed twice"
    names = [n for n in listed if "*" not in n]
    for pattern in (n for n in listed if "*" in n):
        family = [e for e in experiments() if fnmatchcase(e, pattern)]
        assert len(family) >= 2, f"README's `{pattern}` names {family}: list a single row by its name"
        names += family
    assert sorted(names) == sorted(experiments()), "README's paper-rows table and conf/exp/ differ"
    reproduce = (ROOT / "docs" / "reproduce.md").read_text()
    assert all(f"| `+exp={r.exp}` |" in reproduce for r in paper_rows())


def test_the_generator_names_a_stale_line_and_rewrites_only_between_the_markers(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    shutil.copytree(ROOT / "conf" / "exp", tmp_path / "conf" / "exp")
    for rel in ("README.md", "docs/reproduce.md"):
        shutil.copy(ROOT / rel, tmp_path / rel)
    readme = tmp_path / "README.md"
    text = readme.read_text()
    edited = text.replace("| `smoke` | none: the CPU default |", "| `smoke` | none: the default |")
    edited = edited.replace("## Quick start", "## Quick start, by hand")
    readme.write_text(edited)
    line = edited[: edited.index("| `smoke` |")].count("\n") + 1
    (stale,) = rows_doc.stale(tmp_path)
    assert stale.startswith(f"README.md:{line}: has '| `smoke` | none: the default |")
    assert rows_doc.write_docs(tmp_path) == [readme] and rows_doc.stale(tmp_path) == []
    assert readme.read_text() == text.replace("## Quick start", "## Quick start, by hand")  # the prose is kept
    readme.write_text(text.replace("<!-- rows:end -->", ""))
    with pytest.raises(UserError, match="needs one `<!-- rows:begin -->` line and one `<!-- rows:end -->`"):
        rows_doc.stale(tmp_path)
    write(tmp_path / "conf" / "exp", "smoke", NOTE, "")
    with pytest.raises(UserError, match="paper block.s. to fix first: .*smoke.yaml: paper.readme is missing"):
        rows_doc.write_docs(tmp_path)
