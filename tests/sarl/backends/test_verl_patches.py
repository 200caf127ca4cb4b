"""sarl.backends.verl.patches, as verl's own processes get it: through `VERL_USE_EXTERNAL_MODULES` (each test runs a
fresh interpreter, as a Ray worker or torchrun rank starts). Without the module the breakers are real: every verl
model build stops at trl 1.16's missing value head, and the critic's loader asks for flash_attention_2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sarl.backends.verl.config import PATCH_MODULE

BUILD_ACTOR = """
import torch, verl
from transformers import AutoConfig, Qwen3ForCausalLM
from verl.models.transformers.monkey_patch import apply_monkey_patch
model = Qwen3ForCausalLM(AutoConfig.from_pretrained({path!r}))
apply_monkey_patch(model)  # what verl's FSDP engine does for every actor and reference model
print("BUILT")
"""

FILE_LOGGER = """
import verl
from verl.utils.tracking import FileLogger
for step in (1, 2):  # a run, then its resume: each opens the file anew
    log = FileLogger("p", "e")
    log.log({"actor/pg_loss": 0.5}, step)
    log.finish()
"""

CRITIC_LOADER = """
import verl, verl.utils.model as m
print("LOADER", m.load_valuehead_model.__module__)
"""


def run_python(code: str, patched: bool, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"} | extra_env
    if patched:
        env["VERL_USE_EXTERNAL_MODULES"] = PATCH_MODULE
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_verl_builds_a_model_with_trl_1_16_only_with_the_patch(tiny_qwen3_dir):
    plain = run_python(BUILD_ACTOR.format(path=tiny_qwen3_dir), patched=False)
    assert plain.returncode != 0 and "AutoModelForCausalLMWithValueHead" in plain.stderr, plain.stderr[-2000:]
    patched = run_python(BUILD_ACTOR.format(path=tiny_qwen3_dir), patched=True)
    assert patched.returncode == 0 and "BUILT" in patched.stdout, patched.stderr[-2000:]


@pytest.mark.slow
def test_every_verl_process_loads_the_critic_with_the_configured_attention():
    """verl's critic loader is replaced in any process that imports verl (a Ray worker never builds the critic's
    HFModelConfig, so `critic.model.external_lib` alone does not reach it)."""
    plain = run_python(CRITIC_LOADER, patched=False)
    assert "LOADER verl.utils.model" in plain.stdout, plain.stderr[-2000:]
    patched = run_python(CRITIC_LOADER, patched=True)
    assert "LOADER sarl.backends.verl.attention" in patched.stdout, patched.stderr[-2000:]


@pytest.mark.slow
def test_a_resumed_run_appends_to_metrics_jsonl(tmp_path):
    """verl's file logger truncates its file when it opens it; a resumed run (SFT or RL) would erase the steps
    logged before the stop."""
    path = tmp_path / "metrics.jsonl"
    plain = run_python(FILE_LOGGER, patched=False, VERL_FILE_LOGGER_PATH=str(path))
    assert plain.returncode == 0 and len(path.read_text().splitlines()) == 1, plain.stderr[-2000:]
    path.unlink()
    patched = run_python(FILE_LOGGER, patched=True, VERL_FILE_LOGGER_PATH=str(path))
    assert patched.returncode == 0, patched.stderr[-2000:]
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]


def test_the_value_head_stand_in_refuses_to_build_a_model():
    from sarl.backends.verl.patches import AutoModelForCausalLMWithValueHead

    with pytest.raises(RuntimeError, match="trl 1.16"):
        AutoModelForCausalLMWithValueHead.from_pretrained("any")


def test_every_verl_run_gets_the_patches_and_a_metrics_file(tmp_path):
    from sarl.backends.verl.config import process_env
    from sarl.launch.compose import compose_train_config

    gpu, _ = compose_train_config(["+exp=grpo_sarl_math"])
    env = process_env(gpu, tmp_path)
    assert env["VERL_USE_EXTERNAL_MODULES"] == PATCH_MODULE  # nothing of the CPU plugin in a GPU run
    assert env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "metrics.jsonl")
    assert "VERL_PLATFORM" not in env
    cpu, _ = compose_train_config(["+exp=grpo_sarl_math", "backend=verl_cpu"])
    env = process_env(cpu, tmp_path)
    assert env["VERL_USE_EXTERNAL_MODULES"].split(",") == [PATCH_MODULE, "sarl.backends.verl.cpu.plugin"]
    assert env["VERL_PLATFORM"] == "cpu"
