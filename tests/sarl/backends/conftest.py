"""Fixtures shared by the TRL back-end tests."""

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def policy_cache(tmp_path_factory):
    """The smoke policy (tokenizer + warm start on the shipped traces), built once for the session."""
    from sarl.backends.trl.run import policy_path
    from sarl.train import compose_train_config

    cache = tmp_path_factory.mktemp("policies")
    cfg, _ = compose_train_config(["+exp=smoke", f"model.build.cache_dir={cache}"])
    path = policy_path(cfg)
    info = json.loads((Path(path) / "policy.json").read_text())
    assert info["warm_start_loss_last"] < 0.25 * info["warm_start_loss_first"]  # the warm start did learn
    return cache
