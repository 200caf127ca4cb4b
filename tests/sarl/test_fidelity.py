"""docs/fidelity.md is what `python notebooks/fidelity.py` writes from the paper rows' configs now, and every paper
row's `paper.fidelity` block gives each setting a location in its paper and each deviation the paper's value and a
reason (notebooks/_fidelity.py)."""

import difflib
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "notebooks"))
import _fidelity as fidelity  # noqa: E402


@pytest.mark.slow
def test_every_paper_rows_block_is_complete():
    assert fidelity.paper_rows(), "no conf/exp/*_paper.yaml row"
    found = fidelity.problems()
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_the_committed_page_is_the_generated_one():
    committed = fidelity.DOC.read_text(encoding="utf-8")
    generated = fidelity.render()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), generated.splitlines(True), "committed", "now"))
    assert committed == generated, f"docs/fidelity.md is stale: run `python notebooks/fidelity.py`\n{diff[:4000]}"
    for row in fidelity.paper_rows():
        assert f"## `{row}` (" in committed, row


@pytest.mark.slow
def test_the_page_shows_the_composed_values_and_the_papers_locations():
    """Values come from the composed row, not from the block: lcs_paper's 500 steps (Sec. 5) and its 7B-free lr; the
    Qwen3-8B-Base of a GRP Table 2 row; a deviation with its reason."""
    page = fidelity.render()
    assert '| `train.total_training_steps` | 500 | Sec. 5 "Models"' in page
    assert "| `train.actor_lr` | 2e-06 | App. A.4.4" in page
    assert "| `sft:train.actor_lr` | 1e-05 | App. A.4.4 |" in page
    section = page.split("## `grp_no_reach_paper`")[1].split("## ")[0]
    assert ": as `grp_math_paper`, except" in page.split("## `grp_no_reach_paper`")[1].splitlines()[0]
    assert "| `model.path` | Qwen/Qwen3-8B-Base | Table 2 (Qwen3-8B-Base) |" in section
    assert "R_reach 0.0" in section and "**≠**" in section and "decisions §4" in section
    assert "| `embedding` | vllm_server_4b | App. C.5" in page


def test_a_block_without_locations_or_reasons_is_reported(tmp_path, monkeypatch):
    """A setting without a paper location, a deviation without the paper's value or reason, a key the row does not
    have, no source, and keys the row file sets that its own block does not list: each is one line."""
    block = {
        "settings": {"train.rollout_n": "", "train.actor_lr": "from the paper", "train.no_such_key": "App. A.4.4"},
        "deviations": {"train.save_freq": {"paper": "not stated"}},
    }
    raw = {
        "defaults": [{"override /reward": "lcs"}],
        "train": {"rollout_n": 6, "temperature": 0.6},
        "paper": {"tables": [], "note": "a test row", "fidelity": block},
    }
    (tmp_path / "broken_paper.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    cfg, choices = fidelity.compose("lcs_paper")
    cfg = cfg.copy()
    OmegaConf.update(cfg, "paper.fidelity", block, merge=False)
    monkeypatch.setattr(fidelity, "compose", lambda row, stage=None: (cfg, choices))
    _, entries, found = fidelity.row_entries("broken_paper", tmp_path)
    text = "\n".join(found)
    assert "no `source`" in text
    assert "train.rollout_n='' names no section" in text
    assert "train.actor_lr='from the paper' names no section" in text
    assert "train.no_such_key is no key of the composed row" in text
    assert "train.save_freq needs both `paper`" in text
    assert "reward is set by the row but not in its own block" in text
    assert "train.temperature is set by the row but not in its own block" in text
    assert "train.rollout_n is set by the row" not in text  # listed, if without a location
    assert {e.key: e.value for e in entries}["train.rollout_n"] == "6"  # the composed value


def test_a_listed_key_covers_the_keys_below_it_and_a_group_its_keys():
    assert fidelity._covered("reward.weights.R_fmt", {"reward.weights"})
    assert fidelity._covered("model", {"model.path"})
    assert fidelity._covered("sft:train.actor_lr", {"sft:train.actor_lr"})
    assert not fidelity._covered("sft:train.actor_lr", {"train.actor_lr"})
    assert not fidelity._covered("train.temperature", {"train.val_temperature"})


SARL_ROWS = [
    "dpo_open",
    "grpo_empo_math",
    "grpo_empo_open",
    "grpo_gt_math",
    "grpo_sarl_c_only_math",
    "grpo_sarl_l_only_math",
    "grpo_sarl_math",
    "grpo_sarl_open",
    "grpo_ttrl_math",
    "ppo_gt_math",
    "ppo_sarl_math",
    "ppo_sarl_open",
]


def test_every_row_naming_a_paper_table_is_on_the_page():
    """Not only the `*_paper` rows: every conf/exp/ row whose file names a paper table (SARL's own rows) is a row of
    the page and of the checks."""
    named = []
    for path in sorted(fidelity.EXP_DIR.glob("*.yaml")):
        tables = ((yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("paper") or {}).get("tables")
        if tables:
            named.append(path.stem)
    rows = fidelity.paper_rows()
    assert set(named) <= set(rows) and set(SARL_ROWS) <= set(rows)
    assert not [r for r in rows if r not in named and not r.endswith("_paper")]
    page = fidelity.DOC.read_text(encoding="utf-8")
    for row in named:
        assert f"## `{row}` (" in page, row
    for row in SARL_ROWS:
        assert f"## `{row}` (SARL)" in page, row


def _section(page: str, row: str) -> str:
    return page.split(f"## `{row}` (")[1].split("\n## ")[0]


@pytest.mark.slow
def test_the_sarl_rows_cite_table_6_or_7_and_their_deviations():
    """The shared settings (conf/fidelity/) cite the row's table and column; ppo_sarl_*'s rollout share is a
    deviation from Table 6's 0.7; each SARL row's block lists its own keys."""
    page = fidelity.render()
    _, entries, found = fidelity.row_entries("grpo_sarl_math")
    assert not found
    by_key = {e.key: e for e in entries}
    rollouts = by_key["train.rollout_n"]
    assert rollouts.value == "8" and rollouts.where == "Table 7 (Math: Rollouts per prompt (N))"
    assert by_key["reward.clustering"].where.startswith("Table 7 (Math: Clustering method)")
    assert "| `train.rollout_n` | 8 | Table 7 (Math: Rollouts per prompt (N)) |" in page
    assert "| `train.max_response_length` | 4096 | Table 7 (Open-Ended: Max response length) |" in page
    assert "| `train.critic_lr` | 1e-05 | Table 6 (Math: Critic learning rate) |" in page
    for row in ("ppo_sarl_math", "ppo_sarl_open"):
        line = next(x for x in _section(page, row).splitlines() if "`backend.rollout_gpu_memory_utilization`" in x)
        assert line.startswith("| `backend.rollout_gpu_memory_utilization` | 0.65 | **≠** 0.7 (Table 6); ")
        assert "memory plan" in line and "decisions §7" in line
    for row in SARL_ROWS:
        source, entries, found = fidelity.row_entries(row)
        assert source == "SARL" and not found, (row, found)
        assert {e.key for e in entries} >= {"model.path", "algorithm", "data"}, row


@pytest.mark.slow
def test_a_childs_own_setting_beats_its_parents_deviation_on_the_page():
    """evol_rl_rlvr_paper cites App. D.4's two epochs in its own settings; its parent lists train.total_epochs as a
    deviation: the page shows the child's location, not the parent's deviation."""
    section = _section(fidelity.render(), "evol_rl_rlvr_paper")
    assert '| `train.total_epochs` | 2 | App. D.4 ("for two epochs") |' in section
    assert "EPISODE=3" not in section


def test_the_rows_own_entry_wins_over_an_inherited_one_of_the_same_key(tmp_path, monkeypatch):
    """Hydra merges a parent's block into the child's, so a key can be in both `settings` and `deviations`: the row's
    own block decides which it is; a key only inherited in both stays a deviation."""
    parent = {
        "settings": {"train.actor_lr": "App. X (the parent's)"},
        "deviations": {
            "train.total_epochs": {"paper": "not stated", "reason": "the parent's"},
            "train.save_freq": {"paper": "not stated", "reason": "the parent's"},
        },
    }
    child = {
        "source": "EVOL-RL",
        "settings": {"train.total_epochs": "App. D.4 (the child's)", "train.save_freq": "App. Y (inherited both)"},
        "deviations": {"train.actor_lr": {"paper": "1e-6 (Table 2)", "reason": "the child's"}},
    }
    own = {"source": "EVOL-RL", "settings": {"train.total_epochs": child["settings"]["train.total_epochs"]}}
    own["deviations"] = child["deviations"]
    raw = {"defaults": ["parent_paper", "_self_"], "train": {"total_epochs": 2}, "paper": {"fidelity": own}}
    (tmp_path / "parent_paper.yaml").write_text(yaml.safe_dump({"paper": {"fidelity": parent}}), encoding="utf-8")
    (tmp_path / "child_paper.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    cfg, choices = fidelity.compose("lcs_paper")
    cfg = cfg.copy()
    merged = OmegaConf.merge(parent, child)  # as Hydra merges the parent's block with the child's
    OmegaConf.update(cfg, "paper.fidelity", merged, merge=False)
    monkeypatch.setattr(fidelity, "compose", lambda row, stage=None: (cfg, choices))
    _, entries, found = fidelity.row_entries("child_paper", tmp_path)
    assert not found, found
    by_key = {e.key: e for e in entries}
    assert by_key["train.total_epochs"].where == "App. D.4 (the child's)" and not by_key["train.total_epochs"].deviation
    assert by_key["train.actor_lr"].deviation and by_key["train.actor_lr"].reason == "the child's"
    assert by_key["train.save_freq"].deviation and by_key["train.save_freq"].reason == "the parent's"
    assert len(entries) == 3


def test_a_shared_block_whose_interpolation_the_row_does_not_feed_is_reported(monkeypatch):
    """A conf/fidelity/ file cites `${paper.fidelity.column}`: a row that takes it without naming its column gets one
    line, not a traceback."""
    cfg, choices = fidelity.compose("lcs_paper")
    cfg = cfg.copy()
    block = {"source": "SARL", "settings": {"train.rollout_n": "Table 7 (${paper.fidelity.column}: N)"}}
    OmegaConf.update(cfg, "paper.fidelity", block, merge=False)
    monkeypatch.setattr(fidelity, "compose", lambda row, stage=None: (cfg, choices))
    _, entries, found = fidelity.row_entries("lcs_paper")
    assert entries == [] and len(found) == 1 and "does not resolve" in found[0]
