"""A real single-node SLURM cluster on this machine (Debian's `slurm-wlm` and `munge`), for tests and
for trying `launcher=slurm_h100` without a cluster:

    with LocalSlurm(tmp_dir) as cluster:      # as root; writes slurm.conf, starts munged, slurmctld, slurmd
        os.environ.update(cluster.env)        # SLURM_CONF: sbatch/squeue/scontrol talk to this cluster
        ...

Everything lives in `tmp_dir` (config, state, spool, logs, pid files, its own munge socket), on ports
chosen free, so it does not touch a system SLURM or munge. The daemons are stopped by their pid files.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sarl.runtime.network import free_port

DAEMONS = ("slurmd", "slurmctld", "munged")  # stop order


class LocalSlurmError(RuntimeError):
    """The local cluster could not be set up (missing packages, not root, a daemon did not start)."""


def why_unusable() -> str | None:
    """Why a local cluster cannot be started here (None if it can, possibly after `apt-get install`)."""
    if os.geteuid() != 0:
        return "needs root (munged/slurmd/slurmctld are started as system daemons)"
    if shutil.which("slurmctld") and shutil.which("munged"):
        return None
    if not shutil.which("apt-get"):
        return "slurmctld/munged are not installed and apt-get is not available"
    return None


def install_packages(timeout_s: float = 900) -> None:
    """`apt-get install slurm-wlm munge` when slurmctld or munged is missing."""
    if shutil.which("slurmctld") and shutil.which("munged") and shutil.which("slurmd"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "slurm-wlm", "munge"]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise LocalSlurmError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")


def node_memory_mb() -> int:
    """90% of MemTotal (slurmd refuses a node that declares more memory than it has)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(int(line.split()[1]) / 1024 * 0.9)
    raise LocalSlurmError("no MemTotal in /proc/meminfo")


def slurm_conf(root: Path, host: str, cpus: int, mem_mb: int, ctld_port: int, slurmd_port: int, munge_socket: Path):
    """slurm.conf for one node that is also the controller: no accounting, no cgroups."""
    return "\n".join(
        [
            "ClusterName=sarltest",
            f"SlurmctldHost={host}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket}",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobRequeue=1",
            "KillWait=5",
            "MinJobAge=600",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            f"NodeName={host} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


class LocalSlurm:
    """Start munged (as the munge user), slurmctld and slurmd on this machine; stop them by pid file."""

    def __init__(self, root: str | Path, cpus: int = 2, startup_timeout_s: float = 60, partition: str = "debug"):
        self.root = Path(root).resolve()
        self.cpus = cpus
        self.startup_timeout_s = startup_timeout_s
        self.partition = partition
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        # munged runs as the munge user, which cannot enter a private (0700) temp dir such as pytest's:
        # its files live in a directory of its own directly under the system temp dir, removed at stop().
        self.munge_dir: Path | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "LocalSlurm":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        why = why_unusable()
        if why:
            raise LocalSlurmError(why)
        install_packages()
        for sub in ("state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge_dir = self.munge_dir = Path(tempfile.mkdtemp(prefix="sarl-munge-"))
        shutil.chown(munge_dir, "munge", "munge")
        munge_dir.chmod(0o700)
        key = munge_dir / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}", "--force"], check=True, capture_output=True)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o600)
        sock = munge_dir / "munge.socket"
        self.conf.write_text(
            slurm_conf(self.root, self.host, self.cpus, node_memory_mb(), free_port(), free_port(), sock)
        )
        self._run(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                "munged",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--log-file={munge_dir / 'munged.log'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
                "--force",
            ]
        )
        self._wait_for(lambda: sock.exists(), "munged socket")
        self._run(["slurmctld", "-f", str(self.conf)])
        self._run(["slurmd", "-f", str(self.conf)])
        self._wait_for(self.node_idle, f"node {self.host} idle in sinfo")

    def stop(self) -> list[str]:
        """SIGTERM each daemon by its pid file (then SIGKILL after 10 s); return the ones stopped."""
        stopped = []
        for name in DAEMONS:
            pid = self._pid(name)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
            stopped.append(name)
        if self.munge_dir is not None:
            shutil.rmtree(self.munge_dir, ignore_errors=True)
        return stopped

    # -- queries -----------------------------------------------------------------------------

    def command(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        """Run a SLURM client command (sinfo, squeue, scontrol, ...) against this cluster."""
        proc = subprocess.run(
            list(args), env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise LocalSlurmError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def node_idle(self) -> bool:
        out = self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return any(line.split()[1:] == ["idle"] for line in out.splitlines() if line.strip())

    def job_state(self, job_id: str) -> str:
        return _field(self.command("scontrol", "show", "job", job_id, check=False), "JobState") or "UNKNOWN"

    def start_requeued_now(self, job_id: str, timeout_s: float = 120) -> str:
        """Let a requeued job start again without SLURM's hold. SLURM holds a requeued batch job back before it is
        eligible again (it sets the job's begin time ahead: `Reason=BeginTime`, about 2 minutes), which a cluster of
        one test need not sit out. Waits until the job is pending again, then, in the next wall-clock second, sets
        its StartTime to now, and waits until it runs; returns what `scontrol show job` said of it then (the requeue
        itself is SLURM's, untouched).

        Why the next second: the requeue revoked the job's launch credential, and slurmd refuses a credential issued
        in the second of the revocation or earlier; a launch refused that way leaves the job held for good (`launch
        failed requeued held`, the failure SLURM's own hold is there to avoid). The revocation happened before the
        job was pending again, so a credential from a later second is accepted. Raises if the job is held."""
        deadline = time.monotonic() + timeout_s
        updated = False
        while time.monotonic() < deadline:
            shown = self.command("scontrol", "show", "job", job_id, check=False)
            state = _field(shown, "JobState")
            if "held" in _field(shown, "Reason").lower() or _field(shown, "Priority") == "0":
                raise LocalSlurmError(f"requeued job {job_id} is held: {shown.strip()}\n{self.log_tail()}")
            if state == "PENDING" and not updated:
                now = time.time()
                time.sleep(math.floor(now) + 1.05 - now)  # slurmctld and slurmd share this machine's clock
                self.command("scontrol", "update", f"JobId={job_id}", "StartTime=now")
                updated = True
                continue
            if updated and state != "PENDING":
                return shown
            time.sleep(0.5)
        state = self.job_state(job_id)
        raise LocalSlurmError(f"requeued job {job_id} did not start again within {timeout_s} s: {state}")

    def wait_until(self, job_id: str, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll `done()` each second; after `timeout_s`, raise with what SLURM says of the job and its daemons' logs
        (a test waits through this rather than block on a job that will not run again)."""
        if _poll(done, timeout_s, 1.0):
            return
        shown = self.command("scontrol", "show", "job", job_id, check=False).strip()
        raise LocalSlurmError(f"{what} within {timeout_s} s; job {job_id}: {shown}\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = (self.munge_dir or self.root) / name if name == "munged.log" else self.root / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    # -- helpers -----------------------------------------------------------------------------

    def _pid(self, name: str) -> int | None:
        if name == "munged" and self.munge_dir is None:
            return None
        path = self.munge_dir / "munged.pid" if name == "munged" else self.root / f"{name}.pid"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def _run(self, cmd: list[str]) -> None:
        proc = subprocess.run(cmd, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise LocalSlurmError(f"{cmd[0] if cmd[0] != 'runuser' else cmd[4]} did not start: {proc.stderr.strip()}")

    def _wait_for(self, ready, what: str) -> None:
        if not _poll(ready, self.startup_timeout_s, 0.5):
            raise LocalSlurmError(f"timed out waiting for {what}\n{self.log_tail()}")


def _poll(ready: Callable[[], bool], timeout_s: float, interval_s: float) -> bool:
    """Whether `ready()` came true within `timeout_s`, asked every `interval_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(interval_s)
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie of ours counts as stopped
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _field(shown: str, key: str) -> str:
    """The value of `key` in `scontrol show job` output ("" if absent)."""
    for token in shown.split():
        if token.startswith(f"{key}="):
            return token.split("=", 1)[1]
    return ""
