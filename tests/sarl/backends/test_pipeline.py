"""sarl.launch.pipeline: SFT then RL from one command on CPU (backend=trl, shipped data), the RL stage starting from the
SFT stage's final checkpoint, each stage in its own run directory, a rerun skipping finished stages."""

import json
import shutil

import pytest
import yaml

from sarl.launch.compose import compose_train_config
from sarl.launch.pipeline import finished, split_stage_overrides, stages_of
from sarl.runtime.errors import UserError
from sarl.train import main

pytest.importorskip("trl")


def pipeline_overrides(root, policy, run_dir, *extra):
    return [
        "+exp=smoke_pipeline",
        "logger=none",
        f"paths.root={root}",
        f"model.path={policy}",
        f"run_dir={run_dir}",
        "backend.max_steps=2",
        "train.rollout_n=2",
        "train.train_batch_size=2",
        "train.ppo_mini_batch_size=2",
        "train.micro_batch_size_per_gpu=4",
        "data.max_response_length=24",
        "sft:train.train_batch_size=4",
        "sft:train.micro_batch_size_per_gpu=4",
        "sft:algorithm.truncation=right",
        *extra,
    ]


def test_stage_overrides_are_split_from_hydra_overrides():
    common, per_stage = split_stage_overrides(["+exp=x", "sft:train.actor_lr=1e-5", "rl:data=smoke", "a.b=c:d"])
    assert common == ["+exp=x", "a.b=c:d"] and per_stage == {"sft": ["train.actor_lr=1e-5"], "rl": ["data=smoke"]}


def test_stage_lists_are_checked():
    cfg, _ = compose_train_config(["+exp=smoke_pipeline"])
    assert [(s["name"], s["init_from"]) for s in stages_of(cfg)] == [("sft", None), ("rl", "sft")]
    for bad, match in (
        ("[{name: rl, init_from: sft}]", "must name an earlier stage"),
        ("[{name: a},{name: a}]", "unique word"),
        ("[{name: a, extra: 1}]", "name, overrides, init_from only"),
    ):
        cfg, _ = compose_train_config(["+exp=smoke_pipeline", f"pipeline={bad}"])
        with pytest.raises(UserError, match=match):
            stages_of(cfg)
    assert main(["+exp=smoke", "sft:train.actor_lr=1"]) == 2  # stage overrides without a pipeline


def test_sft_then_grpo_from_its_checkpoint_and_a_rerun_skips_finished_stages(tmp_path, chat_policy_dir, caplog):
    run_dir = tmp_path / "pipe"
    assert main(pipeline_overrides(tmp_path, chat_policy_dir, run_dir)) == 0
    sft, rl = run_dir / "sft", run_dir / "rl"
    assert finished(sft) == sft / "final" and finished(rl) == rl / "final"
    sft_cfg = yaml.safe_load((sft / "config.yaml").read_text())
    rl_cfg = yaml.safe_load((rl / "config.yaml").read_text())
    assert sft_cfg["algorithm"]["name"] == "sft" and sft_cfg["data"]["name"] == "sft_smoke"
    assert sft_cfg["train"]["train_batch_size"] == 4  # the stage's own override beats the stage list's
    assert sft_cfg["model"]["path"] == chat_policy_dir
    assert rl_cfg["algorithm"]["name"] == "grpo" and rl_cfg["data"]["name"] == "smoke"
    assert rl_cfg["model"]["path"] == str(sft / "final") and rl_cfg["model"]["tokenizer_path"] == str(sft / "final")
    for stage in (sft, rl):
        steps = [json.loads(x)["step"] for x in (stage / "metrics.jsonl").read_text().splitlines()]
        assert max(steps) == 2 and (stage / "checkpoints").is_dir()
    assert json.loads((run_dir / "pipeline.json").read_text())["stages"] == {
        "sft": str(sft / "final"),
        "rl": str(rl / "final"),
    }

    # a rerun skips both finished stages: nothing is trained again
    before = {
        p: p.stat().st_mtime_ns for p in (sft / "final" / "model.safetensors", rl / "final" / "model.safetensors")
    }
    caplog.set_level("INFO", logger="sarl.launch.pipeline")
    assert main(pipeline_overrides(tmp_path, chat_policy_dir, run_dir)) == 0
    assert "stage sft: finished earlier" in caplog.text and "stage rl: finished earlier" in caplog.text
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())

    # without its done marker, the RL stage runs again (and resumes from its own last checkpoint)
    (rl / "stage_done.json").unlink()
    caplog.clear()
    assert main(pipeline_overrides(tmp_path, chat_policy_dir, run_dir)) == 0
    assert "stage sft: finished earlier" in caplog.text and "stage rl: finished earlier" not in caplog.text
    assert finished(rl) == rl / "final"


def test_pipeline_dry_run_prints_each_stage_with_the_planned_checkpoint(tmp_path, chat_policy_dir, capsys):
    run_dir = tmp_path / "dry"
    assert main([*pipeline_overrides(tmp_path, chat_policy_dir, run_dir), "train.dry_run=true"]) == 0
    out, _ = capsys.readouterr()
    docs = [d for d in yaml.safe_load_all(out.replace("trainer: GRPOTrainer", "---\ntrainer: GRPOTrainer")) if d]
    assert [d["trainer"] for d in docs] == ["SFTTrainer", "GRPOTrainer"]
    assert docs[1]["model"] == str(run_dir / "sft" / "final")
    assert not run_dir.exists()


def test_a_stage_is_finished_only_with_its_marker_and_its_checkpoint(tmp_path):
    from sarl.launch.pipeline import final_checkpoint, mark_done

    verl_rl, _ = compose_train_config(["+exp=grpo_sarl_math"])
    assert final_checkpoint(verl_rl, tmp_path) is None
    final = tmp_path / "final"
    final.mkdir()
    assert final_checkpoint(verl_rl, tmp_path) is None  # no weights yet
    (final / "model.safetensors").write_bytes(b"x")
    assert final_checkpoint(verl_rl, tmp_path) == final  # every back end's finished run: final/
    assert finished(tmp_path) is None  # no marker yet
    mark_done(tmp_path, "rl", final)
    assert finished(tmp_path) == final
    shutil.rmtree(final)
    assert finished(tmp_path) is None  # the marker names a checkpoint that is gone
