"""verl's config checks (validate_verl_config) when the policy is not on this machine: a stand-in model lets
them run offline; a model that is here (a directory, or a Hub id in the cache) is checked itself."""

import json
import logging
import shutil

import pytest
from huggingface_hub import constants
from omegaconf import OmegaConf
from testkit import verl_config_for

pytest.importorskip("verl")
from sarl.backends.verl.config import unresolved_model_paths, validate_verl_config  # noqa: E402


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of this test's own."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def ppo_verl_config(tmp_path, model_path):
    """PPO (a critic: verl's checks build its model config) on the given policy."""
    return verl_config_for(["+exp=ppo_sarl_math"], tmp_path, model_path, validate=False)[1]


def test_a_model_that_is_not_here_is_validated_on_a_stand_in_and_said_so(tmp_path, hub_cache, caplog):
    vcfg = ppo_verl_config(tmp_path, "sarl-test/not-on-this-machine")
    with caplog.at_level(logging.WARNING, logger="sarl.backends.verl.config"):
        validate_verl_config(vcfg)  # offline (tests/conftest.py): loading it would fail
    (record,) = caplog.records
    message = record.getMessage()
    assert "critic.model.path=sarl-test/not-on-this-machine" in message and str(hub_cache) in message
    assert "stand-in" in message and "\n" not in message
    assert vcfg.critic.model.path == "sarl-test/not-on-this-machine"  # checked on a copy
    # verl's batch checks still run, the critic's included
    OmegaConf.update(vcfg, "critic.use_dynamic_bsz", False)
    OmegaConf.update(vcfg, "critic.ppo_mini_batch_size", 512)
    with pytest.raises(ValueError, match=r"train_batch_size \(256\) must be >= critic.ppo_mini_batch_size \(512\)"):
        validate_verl_config(vcfg)


def test_a_local_model_is_checked_itself(tmp_path, hub_cache, tiny_qwen3_dir, caplog):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen3_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "architectures": ["A", "B"]}))
    with pytest.raises(Exception, match="Expect only one architecture"):  # verl's HFModelConfig read it
        validate_verl_config(ppo_verl_config(tmp_path, broken))
    with caplog.at_level(logging.WARNING, logger="sarl.backends.verl.config"):
        validate_verl_config(ppo_verl_config(tmp_path, tiny_qwen3_dir))
    assert not caplog.records


def test_a_hub_id_in_the_cache_counts_as_here(tmp_path, hub_cache, tiny_qwen3_dir):
    revision = "0" * 40
    repo = hub_cache / "models--sarl-test--cached"
    shutil.copytree(tiny_qwen3_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    model = ppo_verl_config(tmp_path, "sarl-test/cached").critic.model
    assert unresolved_model_paths(model) == []
    OmegaConf.update(model, "tokenizer_path", "sarl-test/other")
    assert unresolved_model_paths(model) == ["critic.model.tokenizer_path=sarl-test/other"]
    OmegaConf.update(model, "path", "/no/such/dir")
    assert unresolved_model_paths(model)[0] == "critic.model.path=/no/such/dir"
