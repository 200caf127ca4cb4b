"""A real single-node SLURM cluster (Debian's slurm-wlm + munge) for the launcher tests, started once per
session in a temporary directory and stopped by its pid files (slurm.local_cluster)."""

import os
from pathlib import Path

import pytest

from slurm.local_cluster import LocalSlurm, LocalSlurmError, why_unusable


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    why = why_unusable()
    if why:
        pytest.skip(f"no local SLURM cluster: {why}")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except LocalSlurmError as err:
        cluster.stop()
        pytest.fail(f"the local SLURM cluster did not start: {err}")
    saved = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env)
    try:
        yield cluster
    finally:
        stopped = cluster.stop()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        assert "slurmctld" in stopped and "slurmd" in stopped


@pytest.fixture(scope="session")
def launch_policy_cache(tmp_path_factory):
    """The smoke policy built once (the jobs read it from this cache instead of each building it)."""
    from sarl.backends.trl.run import policy_path
    from sarl.train import compose_train_config

    cache = tmp_path_factory.mktemp("launch_policies")
    cfg, _ = compose_train_config(["+exp=smoke", f"model.build.cache_dir={cache}"])
    assert (Path(policy_path(cfg)) / "policy.json").exists()
    return cache
