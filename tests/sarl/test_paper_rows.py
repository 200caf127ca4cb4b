"""The paper-faithful pipeline rows (conf/exp/*_paper.yaml): every stage composes, passes verl's schema, and its
values equal what the paper states (Structured Reasoning Sec. 5 and App. A.4.4; GRP Sec. 4.1 and App. E)."""

import pytest
import yaml
from testkit import pipeline_rows, stage_overrides, verl_config_for

from sarl.launch.compose import compose_train_config
from sarl.launch.pipeline import stages_of
from sarl.runtime.rows import paper_rows
from sarl.train import check_supported, main

pytest.importorskip("verl")
from sarl.backends.verl.sft import build_verl_sft_config, validate_verl_sft_config  # noqa: E402

# Structured Reasoning Table 11's reward rows (its "GRPO" row, the baseline, is tested on its own below) and the
# reward group (conf/reward/) each one's RL stage trains with
STRUCTURED_REWARD_ROWS = [r.exp for r in paper_rows("Structured Reasoning Table 11") if r.label != "GRPO"]
STRUCTURED_REWARD = {"lcs_paper": "lcs", "maxflow_paper": "maxflow", "lcs_maxflow_paper": "lcs_maxflow"}


def stage_config(row, name, model_dir):
    """The composed config of one stage of a row with the policy at `model_dir`, as sarl.launch.pipeline
    composes it, checked as sarl.train checks it."""
    cfg, choices = compose_train_config([f"+exp={row}", *stage_overrides(row, name), f"model.path={model_dir}"])
    check_supported(cfg, choices)
    return cfg


def rl_stage(row, tmp_path, model_dir):
    """(cfg, verl config validated by verl) of a row's RL stage with the policy at `model_dir`."""
    return verl_config_for([f"+exp={row}", *stage_overrides(row, "rl")], tmp_path, model_dir)


SFT_ONLY_ROWS = ["grp_cot_sft_paper"]  # GRP Table 2 "SFT": the SFT stage is the row, no RL after it


@pytest.mark.parametrize("row", pipeline_rows())
def test_paper_rows_are_sft_then_rl_from_the_sft_checkpoint(row):
    top, _ = compose_train_config([f"+exp={row}"])
    expected = [("sft", None)] if row in SFT_ONLY_ROWS else [("sft", None), ("rl", "sft")]
    assert [(s["name"], s["init_from"]) for s in stages_of(top)] == expected


@pytest.mark.parametrize("row", STRUCTURED_REWARD_ROWS)
def test_structured_reasoning_rl_stage_has_the_papers_values(row, tmp_path, tiny_qwen3_dir):
    """App. A.4.4: 6 completions at T=0.6 (same for evaluation), lr 2e-6 (1.5B), cosine with a 0.1x floor,
    weight decay 1e-4, effective batch 24 (per-device 6 x accumulation 4), 4 GPUs (Table 8), KL beta 1e-3,
    truncated completions masked, vLLM at 70% memory; Sec. 5: R1-Distill-Qwen-1.5B, 500 steps;
    Sec. 5.1: DeepScaleR-Preview, 4k responses."""
    cfg, v = rl_stage(row, tmp_path, tiny_qwen3_dir)
    assert compose_train_config([f"+exp={row}"])[0].model.path == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    assert cfg.data.name == "deepscaler_structured" and cfg.data.prompt_style == "structured"
    assert cfg.reward._target_ == compose_train_config([f"reward={STRUCTURED_REWARD[row]}"])[0].reward._target_
    a, r, d = v.actor_rollout_ref.actor, v.actor_rollout_ref.rollout, v.data
    assert r.n == 6 and r.temperature == 0.6 and r.val_kwargs.temperature == 0.6 and r.val_kwargs.do_sample
    assert d.max_response_length == 4096 and r.gpu_memory_utilization == 0.7
    assert a.optim.lr == 2e-6 and a.optim.lr_scheduler_type == "cosine" and a.optim.min_lr_ratio == 0.1
    assert a.optim.weight_decay == 1e-4 and a.optim.lr_warmup_steps_ratio == 0.0
    assert d.train_batch_size * r.n == 24 and a.ppo_mini_batch_size == d.train_batch_size  # one update of 24
    assert d.train_batch_size * r.n // v.trainer.n_gpus_per_node == 6 and v.trainer.n_gpus_per_node == 4
    assert a.use_kl_loss and a.kl_loss_coef == 1e-3 and v.algorithm.adv_estimator == "grpo"
    assert v.trainer.total_training_steps == 500 and v.trainer.v1.sarl.mask_truncated is True
    assert v.trainer.v1.sarl.resample_tags is True  # App. A.4 "Tag Randomization for Robustness"
    assert v.actor_rollout_ref.model.enable_gradient_checkpointing is True
    # the 7B row: model=r1_distill_qwen_7b with lr 1e-6 ("1e-6 for 7B")
    cfg7, _ = compose_train_config([f"+exp={row}", "model=r1_distill_qwen_7b", "train.actor_lr=1.0e-6"])
    assert cfg7.model.path == "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B" and cfg7.train.actor_lr == 1e-6


@pytest.mark.parametrize("row", STRUCTURED_REWARD_ROWS)
def test_structured_reasoning_sft_stage_has_the_papers_values(row, tmp_path, tiny_qwen3_dir):
    """App. A.4.4: "2 epochs, learning rate 1e-5, cosine schedule without floor, weight decay 1e-4, micro-batch 1
    on a single A100"; Sec. 5.1: the 500 structured S1K traces."""
    cfg = stage_config(row, "sft", tiny_qwen3_dir)
    assert cfg.algorithm.name == "sft" and cfg.data.name == "sft_structured"
    v = build_verl_sft_config(cfg, str(tmp_path), row)
    validate_verl_sft_config(v)
    assert v.trainer.total_epochs == 2 and v.trainer.total_training_steps is None
    assert v.optim.lr == 1e-5 and v.optim.lr_scheduler_type == "cosine" and v.optim.min_lr_ratio == 0.0
    assert v.optim.weight_decay == 1e-4
    assert v.data.micro_batch_size_per_gpu == 1 and v.trainer.n_gpus_per_node == 1 and v.trainer.nnodes == 1
    assert v.data.max_length == 1024 + 16384


def test_grp_paper_row_is_pasc_grpo_from_grp_sft_on_qwen3_base(tmp_path, tiny_qwen3_dir):
    """GRP Sec. 4.1: Qwen3-4B-Base / 8B-Base; Sec. 3.2: PASC-GRPO with the graph rewards; App. E.1-E.2:
    DeepScaleR problems; SFT on the graph-structured set (Sec. 3.1.3)."""
    top, _ = compose_train_config(["+exp=grp_math_paper"])
    assert top.model.path == "Qwen/Qwen3-4B-Base"
    assert compose_train_config(["+exp=grp_math_paper", "model=qwen3_8b_base"])[0].model.path == "Qwen/Qwen3-8B-Base"
    rl, _ = rl_stage("grp_math_paper", tmp_path, tiny_qwen3_dir)
    assert rl.algorithm.adv_estimator == "scae" and rl.reward._target_.startswith("baselines.grp")
    assert rl.data.name == "grp_math_rl_5k"  # App. E.2: the stratified 5,000
    sft = stage_config("grp_math_paper", "sft", tiny_qwen3_dir)
    assert sft.algorithm.name == "sft" and sft.data.name == "sft_grp_math"
    validate_verl_sft_config(build_verl_sft_config(sft, str(tmp_path), "grp_math_paper"))


def test_grp_code_paper_row_is_pasc_grpo_with_the_execution_outcome_from_grp_sft(tmp_path, tiny_qwen3_dir):
    """GRP Sec. 4.1: Qwen3-4B-Base (Table 1; the 8B of Tables 1 and 3 by one override); App. E.1: GRP-SFT on the
    graph code traces; App. E.2: KodCode-Light-RL-10K; Sec. 3.2: PASC-GRPO, r_acc of Eq. (14) the execution
    outcome (all tests pass) and R_graph from the graph blocks, GRP's format check as in the math row."""
    top, _ = compose_train_config(["+exp=grp_code_paper"])
    assert top.model.path == "Qwen/Qwen3-4B-Base"
    assert compose_train_config(["+exp=grp_code_paper", "model=qwen3_8b_base"])[0].model.path == "Qwen/Qwen3-8B-Base"
    rl, v = rl_stage("grp_code_paper", tmp_path, tiny_qwen3_dir)
    assert rl.algorithm.adv_estimator == "scae" and rl.reward._target_ == "baselines.grp.GRPReward"
    assert rl.reward.outcome == "code_exec" and rl.reward.combine == "scae" and rl.reward.code_exec.score == "all_pass"
    assert rl.data.name == "grp_code_rl" and rl.data.setting == "code" and rl.data.max_response_length == 8192
    assert rl.format_check.parser == "sarl.formats.graph.parse_graph"
    assert rl.reward.tokenizer == tiny_qwen3_dir  # I(v) of Eq. (9) in the policy's tokens
    assert v.reward.custom_reward_function.reward_kwargs.reward.outcome == "code_exec"
    sft = stage_config("grp_code_paper", "sft", tiny_qwen3_dir)
    assert sft.algorithm.name == "sft" and sft.data.name == "sft_grp_code" and sft.data.trace_format == "graph"
    math_sft = stage_config("grp_math_paper", "sft", tiny_qwen3_dir)
    assert sft.train == math_sft.train  # the SFT stage's settings are grp_math_paper's
    validate_verl_sft_config(build_verl_sft_config(sft, str(tmp_path), "grp_code_paper"))


@pytest.mark.slow
def test_a_paper_row_dry_runs_both_stages_on_verl(tmp_path, tiny_qwen3_dir, capsys):
    run_dir = tmp_path / "lcs"
    rc = main(["+exp=lcs_paper", f"model.path={tiny_qwen3_dir}", f"run_dir={run_dir}", "train.dry_run=true"])
    assert rc == 0
    out, err = capsys.readouterr()
    sft, rl = [d for d in yaml.safe_load_all(out.replace("\nmodel_engine:", "\n---\nmodel_engine:", 1)) if d]
    assert sft["optim"]["lr"] == 1e-5 and sft["trainer"]["default_local_dir"] == f"{run_dir}/sft/checkpoints"
    planned = f"{run_dir}/sft/final"  # where the SFT stage leaves its model (every finished run: final/)
    assert rl["actor_rollout_ref"]["model"]["path"] == planned
    assert "verl.trainer.sft_trainer" in err and "sarl.backends.verl.main" in err
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "row", [r.exp for t in ("GRP Table 2", "GRP Table 4") for r in paper_rows(t) if r.exp not in SFT_ONLY_ROWS]
)
def test_grp_table_2_rows_are_grp_sft_then_their_rl_on_qwen3_8b_base(row, tmp_path, tiny_qwen3_dir):
    """GRP Table 2 (Qwen3-8B-Base, every RL row from the GRP-SFT baseline, Sec. 4.3): "GRPO" the accuracy reward
    under GRPO; "w/o SCAE" GRP's rewards under GRPO; "w/o Reachability" / "w/o Reach. & RSR" PASC-GRPO without
    R_reach / without R_reach and R_rev, the rest equal (decisions §4). GRP Table 4 (its PASC-GRPO row is Table 2's;
    App. F, "starting from the GRP-SFT baseline"): "w/o Connectivity" / "w/o Conn. & ERS Ratio" PASC-GRPO without
    R_conn / without R_conn and R_ers, the rest equal (decisions §4.1)."""
    top, _ = compose_train_config([f"+exp={row}"])
    assert top.model.path == "Qwen/Qwen3-8B-Base"
    expected = {
        "grp_grpo_paper": ("grpo", "baselines.ground_truth.GroundTruthReward", None),
        "grp_no_scae_paper": ("grpo", "baselines.grp.GRPReward", [0.2] * 5),
        "grp_no_reach_paper": ("scae", "baselines.grp.GRPReward", [0.25, 0.25, 0.25, 0.0, 0.25]),
        "grp_no_reach_rev_paper": ("scae", "baselines.grp.GRPReward", [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]),
        "grp_no_conn_paper": ("scae", "baselines.grp.GRPReward", [0.25, 0.0, 0.25, 0.25, 0.25]),
        "grp_no_conn_ers_paper": ("scae", "baselines.grp.GRPReward", [1 / 3, 0.0, 0.0, 1 / 3, 1 / 3]),
    }
    assert row in expected, f"GRP Table 2 row {row}: add the RL stage the paper gives it here"
    rl, _ = rl_stage(row, tmp_path, tiny_qwen3_dir)
    weights = rl.reward.get("weights")
    got = [weights[k] for k in ("R_fmt", "R_conn", "R_ers", "R_reach", "R_rev")] if weights else None
    estimator, target, weighted = expected[row]
    assert (rl.algorithm.adv_estimator, rl.reward._target_) == (estimator, target) and got == pytest.approx(weighted)
    if weights:
        assert rl.reward.combine == ("scae" if estimator == "scae" else "sum")
        assert rl.reward.tokenizer == tiny_qwen3_dir  # I(v) of Eq. (9) in the policy's tokens
    assert rl.data.name == "grp_math_rl_5k"
    sft = stage_config(row, "sft", tiny_qwen3_dir)
    assert sft.algorithm.name == "sft" and sft.data.name == "sft_grp_math"


def test_grp_table_2_sft_row_is_grp_sft_on_plain_cot_traces_and_nothing_after(tmp_path, tiny_qwen3_dir):
    """GRP Table 2 "SFT" (Sec. 4.3: "the same data as GRP-SFT but replace graph-structured reasoning with standard
    chain-of-thought"): one SFT stage of Qwen3-8B-Base with GRP-SFT's settings on plain CoT traces, no RL; the shipped
    default is GRP-SFT's six sample problems as CoT, the same prompts and answers without graph blocks."""
    import json

    from sarl.checking.grading.extract import extract_answer
    from sarl.formats.graph import parse_graph
    from sarl.runtime.files import resolve_path

    top, _ = compose_train_config(["+exp=grp_cot_sft_paper"])
    assert top.model.path == "Qwen/Qwen3-8B-Base"
    sft = stage_config("grp_cot_sft_paper", "sft", tiny_qwen3_dir)
    grp_sft = stage_config("grp_math_paper", "sft", tiny_qwen3_dir)
    assert sft.algorithm.name == "sft" and sft.data.name == "sft_grp_math" and sft.data.trace_format == "plain"
    assert sft.train == grp_sft.train  # GRP-SFT's settings
    assert sft.data.sft_files == "pkg://sarl.samples/sft/grp_math_cot.jsonl"
    validate_verl_sft_config(build_verl_sft_config(sft, str(tmp_path), "grp_cot_sft_paper"))

    def rows(data):
        return [json.loads(line) for line in resolve_path(data.sft_files).read_text().splitlines()]

    cot, graph = rows(sft.data), rows(grp_sft.data)
    assert [r["prompt"] for r in cot] == [r["prompt"] for r in graph]
    for c, g in zip(cot, graph):
        text = c["completion"][0]["content"]
        assert parse_graph(text).error is not None and "<known>" not in text  # no graph blocks
        assert extract_answer(text) == extract_answer("</think>" + parse_graph(g["completion"][0]["content"]).answer)


def test_structured_reasoning_table_11_and_15_rows(tmp_path, tiny_qwen3_dir):
    """Table 11 "GRPO" (ACC, with the format score of App. A.4.4) from the structured SFT checkpoint; Table 15
    "+ MaxFlow (free-form)": the 7B model, steps split on blank lines, the plain prompt, no SFT stage."""
    rl, _ = rl_stage("grpo_structured_paper", tmp_path, tiny_qwen3_dir)
    assert rl.reward._target_ == "baselines.combine.WeightedSumReward" and dict(rl.reward.weights) == {
        "accuracy": 1.0,
        "format": 1.0,
    }
    assert rl.reward.components.format.lcs_weight == 0.0 and rl.data.name == "deepscaler_structured"
    free, _ = verl_config_for(["+exp=maxflow_freeform_paper"], tmp_path, tiny_qwen3_dir)
    assert compose_train_config(["+exp=maxflow_freeform_paper"])[0].model.path.endswith("R1-Distill-Qwen-7B")
    assert free.pipeline is None and free.reward.step_mode == "paragraphs" and free.data.name == "deepscaler"
    assert free.data.get("prompt_style") in (None, "plain") and free.train.resample_tags is False
    assert free.train.max_response_length == 4096 and free.train.actor_lr == 1e-6 and free.train.rollout_n == 6
