"""The attention every verl model (actor, reference, critic) loads with, given the installed packages.

verl 0.9.1 defaults to flash_attention_2 (HFModelConfig) and hard-codes it for the critic
(load_valuehead_model); without flash-attn both stop at start-up. These tests build verl's own model
configs from the composed config of every verl paper row and load the models the way verl's FSDP engine
does (verl/workers/engine/fsdp/transformer_impl.py, `_build_module`)."""

import pytest
import torch
from testkit import tiny_qwen3, verl_config_for, verl_paper_rows

pytest.importorskip("verl")
from transformers import AutoModelForCausalLM  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from sarl.backends.verl.attention import flash_attn_usable, resolve_attn_implementation  # noqa: E402


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, byte_tokenizer):
    """A tiny Qwen3 checkpoint with weights (verl's loaders read weights, not only the config)."""
    path = tmp_path_factory.mktemp("tiny_ckpt")
    tiny_qwen3(byte_tokenizer, path, weights=True, max_position_embeddings=512)
    return str(path)


def verl_cfg(exp, model_dir, tmp_path, *extra):
    """The row's verl config as verl's workers get it (not validated here: the tests load its models)."""
    return verl_config_for([f"+exp={exp}", *extra], tmp_path, model_dir, validate=False)[1]


def test_auto_takes_flash_attention_only_where_it_can_run():
    assert resolve_attn_implementation("auto", flash_available=True) == "flash_attention_2"
    assert resolve_attn_implementation("auto", flash_available=False) == "sdpa"
    assert resolve_attn_implementation("sdpa", flash_available=True) == "sdpa"
    with pytest.raises(ValueError, match="pip install flash-attn.*backend.attn_implementation=auto"):
        resolve_attn_implementation("flash_attention_2", flash_available=False)
    with pytest.raises(ValueError, match="choose one of: auto, flash_attention_2, sdpa, eager"):
        resolve_attn_implementation("flash")


@pytest.mark.parametrize("exp", verl_paper_rows())
def test_every_verl_model_of_every_row_loads_with_an_attention_that_exists_here(exp, tiny_checkpoint, tmp_path):
    """The actor/reference and (PPO) critic model configs verl builds from the row's config, as verl's
    workers build them (HFModelConfig through omega_conf_to_dataclass), load on this machine."""
    expected = "flash_attention_2" if flash_attn_usable() else "sdpa"
    v = verl_cfg(exp, tiny_checkpoint, tmp_path)
    actor = omega_conf_to_dataclass(v.actor_rollout_ref.model)
    assert actor.hf_config._attn_implementation == expected
    model = AutoModelForCausalLM.from_config(actor.hf_config)  # verl's actor and reference
    assert model.config._attn_implementation == expected
    if v.critic.enable:
        critic = omega_conf_to_dataclass(v.critic.model)  # imports critic.model.external_lib: the patch
        assert critic.hf_config._attn_implementation == expected
        import verl.utils.model as verl_model

        critic.hf_config.num_labels = 1  # as verl's engine sets it before loading the value model
        value = verl_model.load_valuehead_model(tiny_checkpoint, torch.float32, critic.hf_config, False)
        assert value.config._attn_implementation == expected and value.config.num_labels == 1
        assert value(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 1)  # one value per token


def test_explicit_choice_reaches_every_model(tiny_checkpoint, tmp_path):
    v = verl_cfg("ppo_sarl_math", tiny_checkpoint, tmp_path, "backend.attn_implementation=eager")
    assert v.actor_rollout_ref.model.override_config.attn_implementation == "eager"
    assert v.critic.model.override_config.attn_implementation == "eager"
    assert omega_conf_to_dataclass(v.critic.model).hf_config._attn_implementation == "eager"
