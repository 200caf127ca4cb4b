"""A real single-node SLURM cluster (Debian's slurm-wlm + munge) for the launcher tests, started once per
session in a temporary directory and stopped by its pid files (slurm.local_cluster)."""

import os

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
def launch_policy_cache(policy_cache):
    """The smoke policy built once (tests/conftest.py): the jobs read it from this cache instead of each building it."""
    return policy_cache
