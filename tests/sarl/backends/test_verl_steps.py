"""How long each verl row trains (sarl/backends/verl/steps.py): verl's own counting (drop_last batches, epochs,
total_training_steps), and every verl paper row's number of training steps and optimiser updates, which the dry
run prints. A change of a row's length must be a decision: it shows here."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from sarl.backends.verl.steps import StepPlan, step_plan
from sarl.launch.compose import compose_train_config
from sarl.launch.pipeline import stages_of

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "sarl"))
from test_dry_run_configs import dry_run  # noqa: E402

# row (or row:stage) -> (training steps, optimiser updates), as verl will count them on the prepared data.
EXPECTED = {
    # EVOL-RL: 3 epochs of each training set, batch 8 prompts, 8 mini-batches of 1 prompt a step (the authors'
    # released script; AIME24 written 16 times over: 480 rows, 60 steps an epoch; decisions §2.4).
    "evol_rl_paper": (2811, 22488),  # MATH-TRAIN: 7,500 // 8 = 937 a epoch
    "evol_rl_ttrl_paper": (2811, 22488),
    "evol_rl_rlvr_paper": (1874, 14992),  # App. D.4: "for two epochs"
    **{f"evol_rl_aime24_{a}_paper": (180, 1440) for a in ("no_cliphigh_ent", "no_cliphigh", "no_ent", "no_novelty")},
    **{f"evol_rl_math500_{a}_paper": (186, 1488) for a in ("no_cliphigh_ent", "no_cliphigh", "no_ent", "no_novelty")},
    # SARL Tables 6-7: batch 256 = mini-batch 256; AIME 1983-2024's 933 prompts: 3 a epoch x 15; OpenRubrics 5 epochs.
    **dict.fromkeys(
        (
            "grpo_sarl_math",
            "grpo_sarl_c_only_math",
            "grpo_sarl_l_only_math",
            "grpo_gt_math",
            "grpo_empo_math",
            "grpo_ttrl_math",
            "ppo_sarl_math",
            "ppo_gt_math",
        ),
        (45, 45),
    ),
    **dict.fromkeys(("grpo_sarl_open", "grpo_empo_open", "ppo_sarl_open"), (60, 60)),
    # Structured Reasoning Sec. 5 "Models": 500 RL steps (train.total_training_steps) after SFT.
    **dict.fromkeys(
        ("lcs_paper:rl", "maxflow_paper:rl", "lcs_maxflow_paper:rl", "grpo_structured_paper:rl"), (500, 500)
    ),
    **dict.fromkeys(("dr_grpo_paper", "maxflow_freeform_paper"), (500, 500)),
    # GRP: one epoch of its RL sets, batch 256.
    **dict.fromkeys(
        (
            "grp_math_paper:rl",
            "grp_grpo_paper:rl",
            "grp_no_conn_ers_paper:rl",
            "grp_no_conn_paper:rl",
            "grp_no_reach_paper:rl",
            "grp_no_reach_rev_paper:rl",
            "grp_no_scae_paper:rl",
        ),
        (19, 19),
    ),
    "grp_code_paper:rl": (39, 39),
}


def _rl_configs(row: str):
    """(name, config) of each RL stage of a row on verl: the row, or each `rl` stage of its pipeline."""
    cfg, _ = compose_train_config([f"+exp={row}"])
    if not cfg.get("pipeline"):
        return [(row, cfg)]
    out = []
    for stage in stages_of(cfg):
        staged, _ = compose_train_config([f"+exp={row}", *stage["overrides"], "pipeline=null"])
        out.append((f"{row}:{stage['name']}", staged))
    return out


def _plan(**train) -> StepPlan:
    cfg = OmegaConf.create(
        {
            "data": {"name": "d", "train_files": "/nonexistent.parquet", "expected_count": 30, **train.pop("data", {})},
            "train": {"train_batch_size": 8, "ppo_mini_batch_size": 1, "total_epochs": 1, **train},
        }
    )
    return step_plan(cfg)


def test_an_epoch_is_the_full_batches_and_the_rest_is_left_out():
    """30 prompts, batch 8: 3 steps an epoch and 6 prompts left out (verl's drop_last), 8 updates a step."""
    plan = _plan(total_epochs=80)
    assert (plan.per_epoch, plan.left_out, plan.steps, plan.updates) == (3, 6, 240, 1920)
    assert "6 left out each epoch" in plan.describe() and "the same ones" not in plan.describe()
    assert "the same ones: train.shuffle=false" in _plan(shuffle=False).describe()


def test_repeat_and_total_training_steps():
    """repeat 16: 480 prompts, 60 steps an epoch, none left out; total_training_steps caps the steps."""
    plan = _plan(total_epochs=3, data={"repeat": 16})
    assert (plan.prompts, plan.per_epoch, plan.left_out, plan.steps) == (480, 60, 0, 180)
    assert "expected_count x repeat 16" in plan.describe()
    assert _plan(total_epochs=3, total_training_steps=100, data={"repeat": 16}).steps == 100
    assert _plan(total_epochs=1, total_training_steps=100).steps == 3  # the loop still ends with the epochs


def test_a_prepared_file_counts_over_the_config(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [str(i) for i in range(17)]}), path)
    plan = _plan(data={"train_files": str(path)})
    assert (plan.prompts, plan.counted_from, plan.steps) == (17, "the prepared file", 2)
    assert _plan(data={"expected_count": None}) is None


@pytest.mark.slow
def test_every_verl_rows_length():
    """Each verl RL row (or pipeline RL stage) trains the number of steps and updates EXPECTED says."""
    got = {}
    for path in sorted((ROOT / "conf" / "exp").glob("*.yaml")):
        for name, cfg in _rl_configs(path.stem):
            if cfg.backend.name == "verl" and cfg.algorithm.name not in ("sft", "dpo"):
                plan = step_plan(cfg)
                got[name] = (plan.steps, plan.updates) if plan else None
    missing = sorted(set(got) - set(EXPECTED) - {r for r in got if not r.endswith("_paper") and ":" not in r})
    assert not missing, f"verl paper rows without an expected length: {missing}"
    wrong = {name: (got.get(name), want) for name, want in EXPECTED.items() if got.get(name) != want}
    assert not wrong, f"row: (now, expected): {wrong}"


def test_the_dry_run_prints_the_length(tmp_path):
    code, _, err = dry_run("evol_rl_aime24_no_ent_paper", tmp_path)
    assert code == 0
    line = next(x for x in err.splitlines() if x.startswith("# training length:"))
    assert "180 training steps (480 prompts" in line and "x 3 epoch(s)" in line and "1,440 updates" in line
