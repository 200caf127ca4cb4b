"""The GPU suite (`pytest -m gpu`): every `gpu`-marked test is skipped, with the reason, where this interpreter
has no CUDA GPU or no vLLM; on a GPU node each uses one GPU (gpu_runs.gpu_device). The CPU tests of this
directory (test_gpu_configs.py) check what the GPU tests launch, up to the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_runs import MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH, build_tiny_policy, why_no_gpu, write_smoke_parquet


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    why = why_no_gpu()
    if why:
        skip = pytest.mark.skip(reason=why)
        for item in gpu_items:
            item.add_marker(skip)


def checked_policy(path: Path) -> Path:
    """`path` if it is a policy vLLM and verl can serve: Qwen3 with head_dim >= 64, room for prompt + response,
    and a Qwen3 chat template (verl applies it to the `prompt` messages)."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "qwen3" and config.head_dim >= 64, config
    assert config.max_position_embeddings >= MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH, config
    chat = AutoTokenizer.from_pretrained(path).apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n", chat
    return path


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conf/model/tiny_qwen3.yaml's policy, warm-started on the shipped traces (so that it writes steps), built
    once per session: the policy of the GPU runs."""
    return checked_policy(build_tiny_policy(tmp_path_factory.mktemp("policies")))


@pytest.fixture(scope="session")
def tiny_policy_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same policy without its warm start, built in seconds: the same config and tokenizer (the warm start
    changes only the weights), for the CPU checks of what the GPU runs launch."""
    return checked_policy(build_tiny_policy(tmp_path_factory.mktemp("policies"), "model.build.warm_start.steps=0"))


@pytest.fixture(scope="session")
def smoke_parquet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The smoke prompts as verl parquet: {"train": ..., "test": ...}."""
    return write_smoke_parquet(tmp_path_factory.mktemp("smoke_data"))
