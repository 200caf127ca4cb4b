"""`backend=verl_cpu` as a config: what it changes in a row, what it leaves alone, and the verl settings it adds.
The runs themselves are in test_verl_cpu.py."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from sarl.backends.verl import config as verl_config
from sarl.backends.verl import cpu
from sarl.launch.compose import compose_user_config
from sarl.runtime.errors import UserError
from sarl.runtime.files import CONF_DIR
from sarl.runtime.overrides import merged_overrides

ROWS = sorted(p.stem for p in (CONF_DIR / "exp").glob("*.yaml"))


def compose(*overrides: str):
    return compose_user_config(list(overrides))


@pytest.mark.parametrize("row", ROWS)
def test_every_row_composes_for_the_cpu(row):
    cfg, choices = compose(f"+exp={row}", "backend=verl_cpu")
    assert cfg.backend.name == "verl" and cfg.backend.cpu and cfg.backend.rollout_engine == "hf"
    if cfg.get("pipeline"):
        return  # each stage is made small when it is composed (sarl.launch.pipeline)
    assert choices["model"] == cpu.TINY_POLICIES[cpu.output_format(cfg)]
    assert cfg.train.total_training_steps == 2 and cfg.train.n_gpus_per_node == 1


@pytest.mark.parametrize(
    ("row", "policy", "response_tokens"),
    [
        ("grpo_sarl_math", "tiny_qwen3", 192),
        ("grpo_lcs_maxflow_math", "tiny_qwen3_tagged", 256),  # the rewards read step tags
        ("pasc_grpo_grp_math", "tiny_qwen3_graph", 400),  # the rewards parse GRP graphs
        ("grpo_grp_math", "tiny_qwen3_graph", 400),
    ],
)
def test_each_row_gets_the_tiny_policy_that_writes_its_format(row, policy, response_tokens):
    cfg, choices = compose(f"+exp={row}", "backend=verl_cpu")
    assert choices["model"] == policy and cfg.train.max_response_length == response_tokens
    named, _ = compose(f"+exp={row}", "backend=verl_cpu", "model=tiny_qwen3", "data.max_response_length=100")
    assert named.model.build.traces.endswith("/traces.jsonl") and named.train.max_response_length == 100


def test_a_row_is_made_small_and_keeps_its_algorithm_and_reward():
    cfg, choices = compose("+exp=grpo_ttrl64_math", "backend=verl_cpu")
    assert choices["algorithm"] == "grpo" and choices["reward"] == "ttrl" and choices["data"] == "smoke"
    assert (cfg.train.rollout_n, cfg.train.n_trained) == (4, 2)  # 64 votes / 32 trained: the ratio kept
    assert cfg.reward.n_votes == 4 and cfg.reward.n_samples == 2
    assert cfg.train.train_batch_size == 4 and cfg.train.max_response_length == 192
    assert choices["logger"] == "none"


def test_what_the_command_line_names_is_kept():
    cfg, choices = compose(
        "+exp=grpo_sarl_math", "backend=verl_cpu", "train.total_training_steps=5", "embedding=vllm_server", "seed=3"
    )
    assert cfg.train.total_training_steps == 5
    assert choices["embedding"] == "vllm_server"
    cfg, choices = compose("+exp=grpo_sarl_math", "backend=verl_cpu")
    assert choices["embedding"] == "local"  # no hub model on a laptop: the MiniLM the package carries


def test_tagged_rows_train_on_tagged_smoke_prompts_and_read_the_last_two_layers():
    cfg, choices = compose("+exp=grpo_lcs_maxflow_math", "backend=verl_cpu")
    assert choices["data"] == "smoke_structured" and cfg.data.prompt_style == "structured"
    assert list(cfg.reward.components.maxflow.layers) == [-2, -1]  # the tiny policy has 2 layers
    assert cfg.train.mask_truncated and cfg.train.resample_tags  # the row's own settings
    cfg, _ = compose("+exp=grpo_maxflow_math", "backend=verl_cpu")
    assert list(cfg.reward.layers) == [-2, -1]


def test_the_grp_format_check_runs_but_does_not_stop_the_tiny_policy():
    cfg, _ = compose("+exp=pasc_grpo_grp_math", "backend=verl_cpu")
    assert cfg.format_check.parser and cfg.format_check.min_share == 0.0


def test_sft_stages_keep_their_shipped_traces():
    cfg, choices = compose(
        "+exp=lcs_paper", "backend=verl_cpu", "algorithm=sft", "data=sft_structured", "pipeline=null"
    )
    assert choices["data"] == "sft_structured" and cfg.train.train_batch_size == 2
    assert choices["model"] == "tiny_qwen3_tagged"  # the traces' format (trace_format: tagged)
    cfg, choices = compose(
        "+exp=grp_math_paper", "backend=verl_cpu", "algorithm=sft", "data=sft_grp_math", "pipeline=null"
    )
    assert choices["model"] == "tiny_qwen3_graph"
    cfg, choices = compose("+exp=grpo_gt_math", "backend=verl_cpu", "algorithm=sft", "data=s1k", "pipeline=null")
    # a named data group is kept; a stage's own (not named on the command line) is replaced by the smoke traces
    assert choices["data"] == "s1k"


def test_the_verl_settings_of_a_cpu_run():
    cfg, _ = compose("+exp=grpo_gt_math", "backend=verl_cpu")
    values = cpu.cpu_verl_values(cfg)
    assert values["actor_rollout_ref.actor.strategy"] == "fsdp2"
    assert values["transfer_queue.backend.SimpleStorage.num_data_storage_units"] == 1
    assert values["actor_rollout_ref.rollout.max_model_len"] == 320 + 192
    # the rollout's tensor parallelism is the row's backend.rollout_tensor_parallel_size (verl_cpu.yaml: 1), taken by
    # sarl.backends.verl.config as on a GPU; the CPU values leave it alone (decisions §7.7)
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size" not in values

    def tp(*overrides: str) -> int:
        composed = compose("+exp=grpo_gt_math", "backend=verl_cpu", *overrides)[0]
        return verl_config.verl_values(composed, "/tmp/run", "grpo_gt_math")[
            "actor_rollout_ref.rollout.tensor_model_parallel_size"
        ]

    assert tp() == 1
    assert tp("train.n_gpus_per_node=2", "backend.rollout_tensor_parallel_size=2") == 2

    def ray_init(gpus: int, nodes: int) -> dict:
        verl = {"ray_kwargs": {"ray_init": {"num_cpus": None}}, "trainer": {"n_gpus_per_node": gpus, "nnodes": nodes}}
        verl = OmegaConf.create(verl)
        OmegaConf.set_struct(verl, True)
        return OmegaConf.to_container(cpu.with_cpu_settings(verl).ray_kwargs.ray_init)

    assert ray_init(1, 1) == {"num_cpus": 16, "num_gpus": 1, "include_dashboard": False}
    assert ray_init(2, 1)["num_gpus"] == 2  # a logical GPU per rank
    # several nodes join the job's cluster, whose nodes declared their resources (ray.init refuses them there)
    assert ray_init(1, 2) == {"num_cpus": None, "include_dashboard": False}


def test_merged_overrides_drop_the_earlier_value_of_a_key():
    merged = merged_overrides(["+exp=x", "data=sft_structured", "train.x=1"], ["data=sft_smoke"])
    assert merged == ["+exp=x", "train.x=1", "data=sft_smoke"]


def test_a_recompose_that_names_no_function_is_one_line_naming_the_key():
    with pytest.raises(UserError, match=r"^backend.recompose=.sarl.backends.verl.cpu.nope.: not an importable"):
        compose_user_config(["+exp=grpo_gt_math", "backend=verl_cpu", "backend.recompose=sarl.backends.verl.cpu.nope"])


def test_code_rows_train_on_the_shipped_code_prompts_with_tests(tmp_path):
    """Rows whose data is `setting: code` get conf/data/smoke_code.yaml (prompts with tests, not the arithmetic
    smoke prompts); each shipped problem's reference solution passes its tests in the sandbox, a wrong one fails."""
    from baselines.code_exec import CodeExecReward
    from sarl.contract.reward import RolloutBatch
    from sarl.runtime.files import read_jsonl, resolve_path

    plain, choices = compose("+exp=grpo_code_exec", "backend=verl_cpu")
    assert choices["data"] == "smoke_code" and choices["reward"] == "code_exec" and choices["model"] == "tiny_qwen3"
    rl, choices = compose("+exp=grp_code_paper", "backend=verl_cpu", "pipeline=null")  # the rl stage
    assert choices["data"] == "smoke_code" and choices["model"] == "tiny_qwen3_graph"
    assert rl.reward.outcome == "code_exec" and rl.reward.combine == "scae" and rl.format_check.min_share == 0.0
    sft, choices = compose(
        "+exp=grp_code_paper", "backend=verl_cpu", "algorithm=sft", "data=sft_grp_code", "pipeline=null"
    )
    assert choices["model"] == "tiny_qwen3_graph" and sft.data.sft_files.endswith("/grp_code.jsonl")
    assert compose("+exp=grpo_gt_math", "backend=verl_cpu")[1]["data"] == "smoke"  # math rows unchanged

    train, val = cpu.write_smoke_parquet(plain, tmp_path)
    files = (plain.data.trl_train_files, plain.data.trl_val_files)
    rows = [row for f in files for row in read_jsonl(resolve_path(f), "data")]
    assert len(rows) == 24 and val
    solutions = [f"```python\n{r['extra_info']['solution']}\n```" for r in rows]
    batch = RolloutBatch(
        prompts=[""] * 48,
        responses=solutions + ["```python\nx = 1\n```"] * 24,
        ground_truths=[r["ground_truth"] for r in rows] * 2,
    )
    scores = [o.score for o in CodeExecReward(sandbox={"timeout_s": 5.0})(batch)]
    assert scores == [1.0] * 24 + [0.0] * 24
    import pandas as pd

    written = pd.read_parquet(train)
    assert len(written) == 16 and written.reward_model[0]["ground_truth"]["tests"].startswith("assert add(1, 2)")


@pytest.mark.parametrize("first", ["sarl.backends.verl.cpu.rollout", "sarl.backends.verl.reward", "verl"])
def test_every_module_a_verl_process_loads_imports_under_verls_external_modules(first, tmp_path):
    """`import verl` imports the modules of VERL_USE_EXTERNAL_MODULES (our patches, the CPU plugin) in every process
    of a run, so an import of ours that reaches verl at the top of a module can close a cycle through verl that the
    project's own import graph cannot see (the plugin's rollout import did: every verl CPU run failed in its Ray
    actors). Each module a Ray worker imports first, under the run's environment, in a fresh interpreter."""
    import os
    import subprocess
    import sys

    from sarl.backends.verl.config import process_env

    env = {**os.environ, **process_env(compose("+exp=smoke", "backend=verl_cpu")[0], tmp_path)}
    code = f"import {first}; from sarl.backends.verl.cpu.plugin import _replica; _replica()"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_verls_no_accelerator_notice_stays_off_a_cpu_runs_console_whatever_level_verl_sets(caplog, monkeypatch):
    """verl's platform manager sets its logger's level when imported (after sarl.train quiets it) and then warns
    "No supported accelerator detected ... Falling back to 'nvidia'": on `backend=verl_cpu` only its errors pass."""
    import logging

    from sarl.backends.verl.process import quiet_verl_notices

    logger = logging.getLogger("verl.plugin.platform.platform_manager")
    monkeypatch.setattr(logger, "filters", [])
    quiet_verl_notices(cpu=True)
    logger.setLevel("INFO")  # what verl/plugin/platform/platform_manager.py:24 does at import
    with caplog.at_level(logging.INFO):
        logger.warning("No supported accelerator detected. Falling back to 'nvidia'.")
        logger.error("a platform error")
    assert [r.getMessage() for r in caplog.records if r.name == logger.name] == ["a platform error"]
    monkeypatch.setattr(logger, "filters", [])
    quiet_verl_notices(cpu=False)  # on a GPU node the notice matters
    assert logger.filters == []
