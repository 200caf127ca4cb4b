"""The test SLURM cluster's own helpers (slurm.local_cluster), against scripted `scontrol` answers."""

import math

import pytest

from slurm import local_cluster
from slurm.local_cluster import LocalSlurm, LocalSlurmError


class Clock:
    """The module's clock: starts mid-second; sleeping moves it on, and so does each reading (by 10 ms)."""

    def __init__(self):
        self.now = 1_000.3

    def time(self):
        self.now += 0.01
        return self.now

    monotonic = time

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(local_cluster, "time", clock)
    return clock


class Scripted(LocalSlurm):
    """`scontrol show job` answers from a list (the last repeats); every other command is recorded."""

    def __init__(self, tmp_path, shown):
        super().__init__(tmp_path)
        self.shown = list(shown)
        self.sent = []  # (the clock's time, the command)
        self.pending_seen_at = None

    def command(self, *args, check=True, timeout=30):
        if args[:3] == ("scontrol", "show", "job"):
            answer = self.shown.pop(0) if len(self.shown) > 1 else self.shown[0]
            if "JobState=PENDING" in answer and self.pending_seen_at is None:
                self.pending_seen_at = local_cluster.time.now
            return answer
        self.sent.append((local_cluster.time.now, args))
        return ""

    def log_tail(self, chars=3000):
        return "--- slurmctld.log"


def job(state, reason="None", priority=4294901759):
    return f"JobId=7 JobName=x\n   Priority={priority} JobState={state} Reason={reason} Dependency=(null)\n"


def test_a_requeued_job_is_started_in_the_second_after_it_is_pending_again_and_waited_for(tmp_path):
    pending = job("PENDING", "BeginTime")
    states = [job("RUNNING"), job("COMPLETING"), pending, pending, job("RUNNING")]
    cluster = Scripted(tmp_path, states)
    assert "JobState=RUNNING" in cluster.start_requeued_now("7")
    ((at, sent),) = cluster.sent  # once
    assert sent == ("scontrol", "update", "JobId=7", "StartTime=now")
    # in a later second than the one the job was seen pending in: slurmd refuses a launch credential issued in the
    # second of its revocation (before the job was pending again)
    assert math.floor(at) > math.floor(cluster.pending_seen_at) and at - cluster.pending_seen_at < 1.1


@pytest.mark.parametrize("held", [job("PENDING", "launch_failed_requeued_held", 0), job("PENDING", "JobHeldAdmin", 0)])
def test_a_requeued_job_left_held_is_an_error_with_what_slurm_says(tmp_path, held):
    cluster = Scripted(tmp_path, [job("COMPLETING"), held])
    with pytest.raises(LocalSlurmError, match="(?s)requeued job 7 is held: .*Reason=.*slurmctld.log"):
        cluster.start_requeued_now("7")


def test_waiting_on_a_job_ends_with_slurms_view_of_it_not_a_hang(tmp_path):
    cluster = Scripted(tmp_path, [job("PENDING", "BeginTime")])
    with pytest.raises(LocalSlurmError, match=r"(?s)the run did not finish within 5 s; job 7: .*Reason=BeginTime"):
        cluster.wait_until("7", lambda: False, 5, "the run did not finish")
    cluster.wait_until("7", lambda: True, 5, "never")
