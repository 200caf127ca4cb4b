"""torch's threads chosen on purpose (sarl/runtime/torch_threads.py): the CPUs this process may use less the busy
ones (at least 2 where 2 are usable), an integer taken as it is, the OpenMP wait set only where the user left it."""

import os

import pytest

from sarl.runtime import torch_threads as tt
from sarl.runtime.errors import UserError


def test_auto_is_the_usable_cpus_that_are_not_busy():
    def auto(cpus, busy, quota=None, **env):
        return tt.choose("auto", affinity=set(range(cpus)), quota=quota, busy=busy, environ=env).intra

    assert auto(8, 0.1) == 8 and auto(8, 3.2) == 5 and auto(8, 7.9) == 2  # free CPUs, at least 2
    assert auto(2, 0.1) == 2 and auto(2, 2.0) == 2  # 2 usable: 2 threads whatever the load (decisions §7.9)
    assert auto(1, 0.9) == 1
    assert auto(8, 0.0, LOCAL_WORLD_SIZE="4") == 2  # a node's ranks share its CPUs
    assert auto(8, 0.0, OMP_NUM_THREADS="3") == 3  # set by the user or torchrun: taken as it is
    choice = tt.choose("auto", affinity={0, 1, 2, 3}, quota=None, busy=1.0, environ={})
    assert (choice.intra, choice.interop, choice.usable, choice.busy) == (3, 1, 4, 1.0)


def test_a_cgroup_quota_caps_the_affinity(tmp_path):
    assert tt.choose("auto", affinity=set(range(8)), quota=2.5, busy=0.0, environ={}).intra == 3
    assert tt.choose("auto", affinity=set(range(8)), quota=1.0, busy=7.0, environ={}).intra == 1
    assert tt.usable_cpus({0, 1, 2, 3}, quota=1.5) == 2
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert tt.cgroup_cpus(v2) == 1.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert tt.cgroup_cpus(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert tt.cgroup_cpus(v1) == 2.0
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert tt.cgroup_cpus(v1) is None
    assert tt.cgroup_cpus(tmp_path / "none") is None


def test_busy_cpus_counts_the_affinity_only():
    samples = iter(
        [
            {0: (1000, 500), 1: (1000, 500), 2: (1000, 500)},
            {0: (1100, 500), 1: (1100, 600), 2: (1100, 500)},  # cpu 0 all busy, cpu 1 idle, cpu 2 not ours
        ]
    )
    assert tt.busy_cpus({0, 1}, sample=lambda: next(samples), interval_s=0) == 1.0


def test_proc_stat_is_read_per_cpu(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 0 10 100 5 0 0 0 0 0\ncpu0 4 0 6 50 2 0 0 1 0 0\ncpu1 6 0 4 50 3 0 0 0 0 0\nintr 1\n")
    assert tt.read_proc_stat(str(stat)) == {0: (63, 52), 1: (63, 53)}


def test_an_integer_is_exactly_that_many_and_null_is_torchs_default():
    assert tt.choose(3, affinity={0}, quota=None, busy=1.0, environ={"OMP_NUM_THREADS": "1"}).intra == 3
    assert tt.choose("4").intra == 4
    none = tt.choose(None)
    assert none.intra is None and "default" in none.describe({})


@pytest.mark.parametrize("bad", [0, -1, "many", 1.5, True])
def test_a_bad_setting_is_one_line_naming_the_key(bad):
    with pytest.raises(UserError) as err:
        tt.choose(bad)
    assert "backend.torch_threads" in str(err.value) and "\n" not in str(err.value)


def test_the_wait_is_set_only_where_the_user_left_it():
    env = {}
    assert tt.wait_policy_env(env) == {"GOMP_SPINCOUNT": "1000"} and env == {"GOMP_SPINCOUNT": "1000"}
    for mine in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        env = dict(mine)
        assert tt.wait_policy_env(env) == {} and env == mine


def test_the_line_says_what_and_why():
    choice = tt.choose("auto", affinity={0, 1, 2, 3}, quota=None, busy=1.0, environ={})
    line = choice.describe({"GOMP_SPINCOUNT": "1000"})
    assert line == "torch: 3 intra-op threads of 4 usable CPUs (1.0 busy), 1 inter-op, GOMP_SPINCOUNT=1000"
    assert tt.choose(1).describe({}) == "torch: 1 intra-op thread (torch_threads=1), 1 inter-op, libgomp's default wait"
    assert "(torch_threads=auto, OMP_NUM_THREADS=1)" in tt.choose("auto", environ={"OMP_NUM_THREADS": "1"}).describe()


def test_apply_sets_torchs_threads():
    import torch

    before = torch.get_num_threads()
    lines = []
    try:
        choice = tt.apply(1, say=lines.append)
        assert torch.get_num_threads() == 1 and choice.intra == 1
        assert lines == [choice.describe()]
    finally:
        torch.set_num_threads(before)


def test_sarl_train_sets_the_openmp_wait(monkeypatch, capsys):
    from sarl import train

    for key in tt.WAIT_KEYS:
        monkeypatch.setenv(key, "x")  # recorded, so that the test's changes are undone
        monkeypatch.delenv(key)
    assert train.main(["+exp=smoke", "train.dry_run=true"]) == 0
    assert os.environ["GOMP_SPINCOUNT"] == "1000"
