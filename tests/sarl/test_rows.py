"""sarl.runtime.rows: the paper rows read from the `paper:` blocks of conf/exp/, the one place that says which run is
which row of which table; a missing or malformed block is named with its file and what to write."""

import pytest
from omegaconf import OmegaConf
from testkit import verl_config_for

from sarl.launch.compose import compose_train_config
from sarl.runtime.rows import PaperRow, experiments, metadata_problems, paper_experiments, paper_rows, paper_tables


def test_sarl_table_2_in_the_papers_order():
    assert [(r.group, r.label, r.exp) for r in paper_rows("SARL Table 2")] == [
        ("PPO", "w/ Ground-Truth †", "ppo_gt_math"),
        ("PPO", "w/ SARL (Ours)", "ppo_sarl_math"),
        ("GRPO", "w/ Ground-Truth †", "grpo_gt_math"),
        ("GRPO", "w/ EMPO", "grpo_empo_math"),
        ("GRPO", "w/ TTRL", "grpo_ttrl_math"),
        ("GRPO", "w/ SARL (Ours)", "grpo_sarl_math"),
    ]
    assert [r.exp for r in paper_rows("SARL Table 10")] == [
        "grpo_sarl_l_only_math",
        "grpo_sarl_c_only_math",
        "grpo_sarl_math",
    ]
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


def test_the_other_papers_tables_in_their_order():
    """GRP Tables 2 and 4 (Table 2's positions 1, 2 and 4, the base model and the GRP-SFT and PASC-GRPO rows, and
    Table 4's first, PASC-GRPO again, are grp_math_paper's stages with the 8B override) and Structured Reasoning
    Tables 11 and 15, as the papers print their labels."""
    assert [(r.position, r.label, r.exp) for r in paper_rows("GRP Table 2")] == [
        (3, "SFT", "grp_cot_sft_paper"),
        (5, "GRPO", "grp_grpo_paper"),
        (6, "w/o Reachability", "grp_no_reach_paper"),
        (7, "w/o Reach. & RSR", "grp_no_reach_rev_paper"),
        (8, "w/o SCAE", "grp_no_scae_paper"),
    ]
    assert [(r.position, r.label, r.exp) for r in paper_rows("GRP Table 4")] == [
        (2, "w/o Connectivity", "grp_no_conn_paper"),
        (3, "w/o Conn. & ERS Ratio", "grp_no_conn_ers_paper"),
    ]
    assert [(r.label, r.exp) for r in paper_rows("Structured Reasoning Table 11")] == [
        ("GRPO", "grpo_structured_paper"),
        ("MAX-FLOW", "maxflow_paper"),
        ("LCS", "lcs_paper"),
        ("FLOW+LCS 1:1", "lcs_maxflow_paper"),
    ]
    assert [(r.position, r.group, r.label, r.exp) for r in paper_rows("EVOL-RL Table 1")] == [
        (2, "Qwen3-4B-Base, MATH-TRAIN", "w/TTRL", "evol_rl_ttrl_paper"),
        (3, "Qwen3-4B-Base, MATH-TRAIN", "w/EVOL-RL", "evol_rl_paper"),
    ]
    ablations = [(s, a) for s in ("math500", "aime24") for a in ("cliphigh", "ent", "cliphigh_ent", "novelty")]
    assert [r.exp for r in paper_rows("EVOL-RL Table 4")] == [f"evol_rl_{s}_no_{a}_paper" for s, a in ablations]
    assert [(r.position, r.group, r.label, r.exp) for r in paper_rows("Structured Reasoning Table 15")] == [
        (4, "Isolated Component Training", "+ MaxFlow (free-form)", "maxflow_freeform_paper"),
        (6, "Isolated Component Training", "+ Dr.GRPO", "dr_grpo_paper"),
    ]


def test_evol_rl_rows_point_at_their_cells_of_the_typed_tables():
    """Each EVOL-RL row's position is its row of the table typed from the paper (notebooks/reported/): the same label
    and the evaluation id that fills it (Table 4: `<the training set's w/EVOL-RL id>_no_<ablation>`, decisions
    §3.2), and in Table 4 the same training-set group."""
    from pathlib import Path

    import yaml

    reported = Path(__file__).resolve().parents[2] / "notebooks" / "reported"
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


def write(d, name, text):
    (d / f"{name}.yaml").write_text("# @package _global_\n" + text)


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
    (message,) = metadata_problems(tmp_path)
    assert message.startswith(str(tmp_path / "bad.yaml")) and problem in message
    assert paper_rows(exp_dir=tmp_path) == [PaperRow("good", "T", 1, "G", "good")]  # the others still read


def test_two_rows_at_one_position_of_a_table_are_a_problem(tmp_path):
    write(tmp_path, "a", "paper:\n  tables:\n    - {table: T, position: 1, group: '', label: a}\n")
    write(tmp_path, "b", "paper:\n  tables:\n    - {table: T, position: 1, group: '', label: b}\n")
    assert metadata_problems(tmp_path) == ["T position 1: both a and b; give each row its own"]


def test_the_readme_paper_rows_table_lists_every_exp_file():
    """The README's table is written by hand; this keeps it to the conf/exp/ files, one line each or, for a family of
    rows that each change one setting of a listed row (EVOL-RL's ablations), one line naming them by a pattern
    (`evol_rl_*_paper`) that matches at least two files; every file is matched by exactly one line."""
    import re
    from fnmatch import fnmatchcase
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Paper rows") : readme.index("## Where things are")]
    listed = re.findall(r"^\| `([a-z0-9_*]+)` \|", section, re.M)
    assert len(listed) == len(set(listed)), "a row is listed twice"
    names = [n for n in listed if "*" not in n]
    for pattern in (n for n in listed if "*" in n):
        family = [e for e in experiments() if fnmatchcase(e, pattern)]
        assert len(family) >= 2, f"README's `{pattern}` names {family}: list a single row by its name"
        names += family
    assert sorted(names) == sorted(experiments()), "README's paper-rows table and conf/exp/ differ"
