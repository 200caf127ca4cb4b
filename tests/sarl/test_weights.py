"""No run ends without its weights (sarl/runtime/weights.py): a saved Hugging Face directory must hold weight files
that load and equal the trained tensors (tied ones once); verl's FSDP actor checkpoint must hold every rank's shard.
Each failure is one line naming what is missing. The back ends' own use: tests/sarl/backends/test_trl_faults.py
(a TRL run that saves no weights exits 1), the verl_cpu runs (their checkpoints pass the check)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from sarl.runtime.weights import trained_state, verl_actor_problem, weights_problem


def tiny(tied=True):
    config = Qwen3Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("tied", [True, False])
def test_saved_weights_equal_the_trained_ones(tmp_path, tied):
    model = tiny(tied)
    model.save_pretrained(tmp_path)
    state, numel = trained_state(model)
    assert weights_problem(tmp_path, state, numel) is None
    with torch.no_grad():  # training went on after the save: the file is stale
        model.model.layers[0].mlp.up_proj.weight.add_(1.0)
    assert "1 of" in weights_problem(tmp_path, *trained_state(model)) and "differ from the trained ones" in (
        weights_problem(tmp_path, *trained_state(model))
    )


def test_a_directory_with_the_tokenizer_only_has_no_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    problem = weights_problem(tmp_path)
    assert "has no model weights" in problem and "tokenizer.json" in problem and "\n" not in problem
    assert "does not exist" in weights_problem(tmp_path / "nope")


def test_truncated_missing_shard_and_wrong_size_are_named(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path / "ok")
    data = (tmp_path / "ok" / "model.safetensors").read_bytes()
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "do not load" in weights_problem(tmp_path / "cut")
    (tmp_path / "idx").mkdir()
    index = {"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (tmp_path / "idx" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "names 1 missing file(s)" in weights_problem(tmp_path / "idx")
    assert "the trained model 7" in weights_problem(tmp_path / "ok", numel=7)  # a sharded model: the count


def test_verl_actor_checkpoint_needs_every_ranks_shard(tmp_path):
    (tmp_path / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 2}))
    for rank in range(2):
        torch.save({"w": torch.ones(2)}, tmp_path / f"model_world_size_2_rank_{rank}.pt")
    assert verl_actor_problem(tmp_path) is None
    (tmp_path / "model_world_size_2_rank_1.pt").write_bytes(b"not an archive")
    assert "is not a torch archive" in verl_actor_problem(tmp_path)
    (tmp_path / "model_world_size_2_rank_1.pt").unlink()
    assert "rank 1 of 2 is missing" in verl_actor_problem(tmp_path)
    assert "has no model shards" in verl_actor_problem(tmp_path / "empty")
