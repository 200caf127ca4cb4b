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
