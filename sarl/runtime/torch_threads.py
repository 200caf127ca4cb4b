"""The threads torch computes with, chosen on purpose (as `sarl.contract.threads` chooses a reward's BLAS threads).

A policy built, sampled or trained on the CPU (the smoke rows, `backend=trl`) runs torch's intra-op pool: OpenMP
threads (libgomp in torch's CPU wheel) that meet at a barrier after every operator, thousands of times a second on
a tiny model. libgomp's default wait is a spin of 300,000 iterations (milliseconds on this machine) before a
waiting thread sleeps: beside busy processes, the waiting thread spins on a core while the thread it waits for
has none. Measured on 2 cores (`python -m sarl.bench suite=smoke`, docs/results.md, decisions §7.9): with 2 threads
and that default, the policy's build, sampling and a training step took 4.0-5.3x their idle time beside 2 busy
processes and 11-21x beside 5 (fair shares: 2x and 3.5x). A short spin (GOMP_SPINCOUNT=1000, then sleep) brought
them to 2.1-2.4x and 4.4-4.9x, at a cost idle of 4-9% (build, training step) and 16-24% (sampling); a passive
wait (OMP_WAIT_POLICY=PASSIVE, no spin) did as well loaded but cost 6-77% idle; one thread instead of two (the free
CPUs) left the wait out of it but took 2.7-2.8x at load 2 and 5.6-5.7x at load 5 for the build and the training
step (the scheduler shares cores per thread: one thread beside 2 busy ones gets 2/3 of a core, two get one core).
So the wait is what matters, and two threads are kept on two cores.

`choose(setting)`: `auto` (the default, conf/backend/trl.yaml) is the CPUs this process may use (its affinity,
capped by a cgroup CPU quota) that are not busy right now (/proc/stat sampled over `SAMPLE_S`), but never fewer
than 2 where 2 are usable (the measurement above: two threads with a short spin keep their share on 2 busy
cores); an integer is exactly that many; None leaves torch's default. Under `auto`, OMP_NUM_THREADS set (by the
user, or by torchrun for several ranks) is taken as it is, and a node's ranks share its CPUs. Inter-op threads: 1
(eager mode runs no inter-op work). The choice is made once, when the run starts.

`wait_policy_env()` sets GOMP_SPINCOUNT=1000 in this process's environment unless the user set it or
OMP_WAIT_POLICY. libgomp reads it when it loads, so `sarl.train`'s main calls it before anything imports torch;
the TRL ranks and the other processes a run starts inherit it. Intel OpenMP's KMP_BLOCKTIME is left alone: torch's
CPU wheel does not use Intel OpenMP, so nothing here measured it.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping

from sarl.runtime.errors import UserError

log = logging.getLogger(__name__)

WAIT_ENV = {"GOMP_SPINCOUNT": "1000"}  # spins before a waiting libgomp thread sleeps (default 300,000)
WAIT_KEYS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")  # the user set either: their choice stands
SAMPLE_S = 0.15  # how long /proc/stat is sampled to count the busy CPUs
CGROUP = Path("/sys/fs/cgroup")


def wait_policy_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """GOMP_SPINCOUNT=1000 in `environ` (default: this process's) unless GOMP_SPINCOUNT or OMP_WAIT_POLICY is set
    there. Returns what it set."""
    env = os.environ if environ is None else environ
    added = {} if any(k in env for k in WAIT_KEYS) else dict(WAIT_ENV)
    env.update(added)
    return added


def cgroup_cpus(root: Path = CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
    `cpu.cfs_period_us`), None where there is none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def read_proc_stat(path: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """Per CPU: (all jiffies, idle + iowait jiffies) since boot."""
    out = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
                out[int(name[3:])] = (sum(ticks), ticks[3] + ticks[4])
    return out


def busy_cpus(
    cpus: set[int],
    sample: Callable[[], Mapping[int, tuple[int, int]]] = read_proc_stat,
    interval_s: float = SAMPLE_S,
) -> float:
    """How many of `cpus` other work keeps busy: the busy share of each, summed, over `interval_s` (steal time
    counts as busy: the hypervisor gave the core to someone else). 0.0 where /proc/stat cannot be read."""
    try:
        first = sample()
        time.sleep(interval_s)
        second = sample()
    except OSError:
        return 0.0
    busy = 0.0
    for cpu in cpus:
        if cpu in first and cpu in second:
            total = second[cpu][0] - first[cpu][0]
            idle = second[cpu][1] - first[cpu][1]
            if total > 0:
                busy += min(1.0, max(0.0, (total - idle) / total))
    return busy


@dataclass(frozen=True)
class Choice:
    """What `choose` decided: intra-op threads (None: torch's default), inter-op threads, and why."""

    intra: int | None
    interop: int | None
    setting: Any
    usable: int | None = None
    busy: float | None = None
    ranks: int = 1

    def describe(self, environ: Mapping[str, str] | None = None) -> str:
        env = os.environ if environ is None else environ
        wait = ", ".join(f"{k}={env[k]}" for k in WAIT_KEYS if k in env) or "libgomp's default wait"
        if self.intra is None:
            return f"torch: its default threads (torch_threads=null), {wait}"
        s = "" if self.intra == 1 else "s"
        if self.setting == "auto":
            shared = f", shared by {self.ranks} ranks" if self.ranks > 1 else ""
            why = f"of {self.usable} usable CPUs ({self.busy:.1f} busy{shared})"
        else:
            why = f"(torch_threads={self.setting})"
        return f"torch: {self.intra} intra-op thread{s} {why}, {self.interop} inter-op, {wait}"


def check_setting(setting: Any, key: str = "backend.torch_threads") -> Any:
    """`auto`, None or a positive integer; anything else is a one-line UserError naming `key`."""
    if setting is None or setting == "auto":
        return setting
    if isinstance(setting, bool) or not isinstance(setting, (int, str)) or not str(setting).isdigit():
        raise UserError(f"{key}={setting!r}: use auto (the free CPUs), null (torch's default) or a number >= 1")
    if int(setting) < 1:
        raise UserError(f"{key}={setting}: use auto (the free CPUs), null (torch's default) or a number >= 1")
    return int(setting)


def usable_cpus(affinity: set[int] | None = None, quota: float | None | str = "read") -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup quota (rounded up), at least 1."""
    cpus = len(affinity if affinity is not None else os.sched_getaffinity(0))
    limit = cgroup_cpus() if quota == "read" else quota
    if limit is not None:
        cpus = min(cpus, math.ceil(float(limit)))
    return max(1, cpus)


def choose(
    setting: Any,
    affinity: set[int] | None = None,
    quota: float | None | str = "read",
    busy: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> Choice:
    """The threads for `setting` (see the module's docstring). `affinity`, `quota`, `busy` and `environ` are this
    process's (read here) unless given. Under `auto`, OMP_NUM_THREADS set (by the user, or torchrun for several
    ranks) is taken as it is, and the ranks of a node (LOCAL_WORLD_SIZE) share its free CPUs."""
    setting = check_setting(setting)
    env = os.environ if environ is None else environ
    if setting is None:
        return Choice(None, None, None)
    if setting != "auto":
        return Choice(setting, 1, setting)
    omp = env.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) >= 1:
        return Choice(int(omp), 1, f"auto, OMP_NUM_THREADS={omp}")
    cpus = set(affinity if affinity is not None else os.sched_getaffinity(0))
    usable = usable_cpus(cpus, quota)
    taken = busy_cpus(cpus) if busy is None else float(busy)
    free = max(min(usable, len(cpus) - round(taken)), min(2, usable))
    ranks = max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1))
    return Choice(max(1, free // ranks), 1, "auto", usable=usable, busy=taken, ranks=ranks)


def apply(setting: Any, say: Callable[[str], None] | None = None) -> Choice:
    """Choose (`choose`) and set torch's intra-op and inter-op threads; one line says what and why."""
    import torch  # deferred: imports torch (~2 s); callers are about to use it

    choice = choose(setting)
    if choice.intra is not None:
        torch.set_num_threads(choice.intra)
        try:
            torch.set_num_interop_threads(choice.interop)
        except RuntimeError:  # settable once, before any inter-op work: a second call in one process keeps the first
            pass
    (say or log.info)(choice.describe())
    return choice
