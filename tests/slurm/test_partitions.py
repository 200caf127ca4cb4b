"""The resources `launcher=slurm_h100` leaves to the cluster (slurm/partitions.py): the default partition and its
time limit from `sinfo`, and one-line errors for a partition the cluster does not have."""

import subprocess

import pytest

from sarl.runtime.errors import UserError
from slurm.launcher import SlurmSettings
from slurm.partitions import UNLIMITED_TIME_MIN, Partition, cluster_partitions, parse_sinfo, parse_time_limit, resolve


@pytest.mark.parametrize(
    "text,minutes",
    [
        ("infinite", None),
        ("UNLIMITED", None),
        ("30", 30),
        ("30:00", 30),
        ("30:01", 31),  # seconds round up
        ("1:00:00", 60),
        ("2-00:00:00", 2880),
        ("1-12", 2160),
        ("1-12:30", 2190),
    ],
)
def test_slurm_time_limits_in_minutes(text, minutes):
    assert parse_time_limit(text) == minutes


def test_a_time_limit_slurm_would_not_print_is_refused():
    with pytest.raises(ValueError, match="not a SLURM time limit"):
        parse_time_limit("two days")


SINFO = "cpu|1:00:00\nh100*|2-00:00:00\nh100*|2-00:00:00\nh100-preempt|infinite\n"  # one line per partition and state


def test_sinfo_lines_become_one_partition_each():
    assert parse_sinfo(SINFO) == [
        Partition("cpu", False, 60),
        Partition("h100", True, 2880),
        Partition("h100-preempt", False, None),
    ]


def test_left_to_the_cluster_the_default_partition_and_its_limit():
    parts = parse_sinfo(SINFO)
    s = resolve(SlurmSettings(), parts)
    assert (s.partition, s.time_min) == ("h100", 2880)
    s = resolve(SlurmSettings(partition="h100-preempt"), parts)
    assert (s.partition, s.time_min) == ("h100-preempt", UNLIMITED_TIME_MIN)
    s = resolve(SlurmSettings(partition="cpu", time_min=45), parts)
    assert (s.partition, s.time_min) == ("cpu", 45)  # the user's, within the limit


def test_a_partition_or_time_the_cluster_cannot_give_is_one_line_naming_the_key():
    parts = parse_sinfo(SINFO)
    with pytest.raises(UserError, match=r"partition=h200: this cluster has no such partition \(sinfo: cpu, h100\*"):
        resolve(SlurmSettings(partition="h200"), parts)
    with pytest.raises(UserError, match="launcher.time_min=90 is over partition cpu's limit of 60 minutes"):
        resolve(SlurmSettings(partition="cpu", time_min=90), parts)
    with pytest.raises(UserError, match="no default partition"):
        resolve(SlurmSettings(), [Partition("a", False, 60)])


def test_sinfo_failing_says_what_to_set():
    def failing(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, "", "slurm_load_partitions: Unable to contact slurm controller")

    with pytest.raises(UserError, match="set launcher.partition and launcher.time_min yourself"):
        cluster_partitions(run=failing)


def test_the_local_clusters_sinfo_is_read(slurm_cluster):
    (debug,) = cluster_partitions()
    assert debug == Partition("debug", True, None)  # slurm.local_cluster: Default=YES MaxTime=INFINITE
