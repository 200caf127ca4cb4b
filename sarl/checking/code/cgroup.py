"""One control group per running program (`sarl.checking.code.sandbox`): memory and processes bounded for all of a
program's processes together, where the machine lets this process make cgroups.

RLIMIT_AS and RLIMIT_NPROC bound each process (and each uid); a program that forks eight children of `memory_mb`
each holds eight times that. A cgroup bounds their sum: `memory_mb + disk_mb` of memory (the tmpfs pages the
program writes are charged to it too) and `max_processes + 2` tasks (bubblewrap's reaper and the interpreter).
The runner joins its run's group before bubblewrap starts (a `sh` that writes its own pid into the group's
`cgroup.procs` and then execs), so every process of the program is born inside it. When the kernel kills a process
of the group for memory, the run's outcome is `memory`.

Made where this process is root and finds, in order: cgroup v2 with the memory and pids controllers delegated to
a group it may create children in; cgroup v1's `memory` and `pids` hierarchies (this process's own group in each,
as /proc/self/cgroup names it). Elsewhere `Cgroups.find()` returns None with the reason, which the sandbox says
at start-up; the bound that then holds is RLIMIT_AS times the process limit (docs/sandbox.md).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_LOCK = threading.Lock()
_FOUND: dict = {}


def _own_path(controller: str, cgroup_file: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's group in `controller`'s v1 hierarchy ("" for v2's unified line when controller is "")."""
    try:
        lines = cgroup_file.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or (controller == "" and controllers == ""):
            return path
    return None


def _write(path: Path, value: str) -> None:
    path.write_text(value)


@dataclass(frozen=True)
class Slot:
    """The groups of one run: the files the runner's pid is written into, how to read its OOM kills, its tasks and
    its memory, and the limits written into it."""

    procs: tuple[Path, ...]
    events: Path  # v2 memory.events / v1 memory.oom_control: its `oom_kill N` line
    tasks: Path  # pids.current
    usage: Path  # v2 memory.current / v1 memory.usage_in_bytes
    limits: tuple[int, int]  # (memory bytes, tasks)

    def quiet(self) -> bool:
        """No task of any run is left in it and what memory is still charged to it (page cache its last run read)
        is at most an eighth of its limit: a next run may start in it."""
        try:
            return int(self.tasks.read_text()) == 0 and int(self.usage.read_text()) <= self.limits[0] // 8
        except (OSError, ValueError):
            return False

    def join_argv(self, argv: list[str]) -> list[str]:
        """`argv` started inside the slot's groups: a shell writes its pid into each, then execs (exit 97 if not)."""
        writes = " && ".join(f"echo $$ > {shlex.quote(str(p))}" for p in self.procs)
        return ["/bin/sh", "-c", f'{writes} || exit 97; exec "$@"', "sh", *argv]

    def try_remove(self) -> bool:
        """Remove the run's groups if they are empty (True when none is left). A group empties only once the kernel
        has torn down its last process, a few ms after bubblewrap exits: `Cgroups.release` leaves it for later."""
        left = False
        for procs in self.procs:
            try:
                procs.parent.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left = True
        return not left

    def oom_kills(self) -> int:
        try:
            for line in self.events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0


class Cgroups:
    """The parent groups this process makes its runs' groups under. A run's group is reused by a later run with the
    same limits once it is `quiet` (no task left: a group with a dying task of its last run is never handed on,
    its count would fall on the next program); making and removing a pair of v1 groups costs about 1 ms of the
    kernel's time a run (measured: docs/results.md). Nobody waits for the kernel's teardown of a finished run:
    a group that is not quiet yet waits in `idle`. Groups beyond `IDLE_MAX` are removed once empty (`sweep`), and
    every group at exit. OOM kills are counted per run from the group's counter before the run."""

    IDLE_MAX = 64

    def __init__(self, version: int, parents: dict[str, Path]) -> None:
        self.version, self.parents = version, parents
        self.made: dict[int, Slot] = {}
        self.idle: list[Slot] = []  # released, for the next run with the same limits
        self.pending: list[Slot] = []  # to remove, not yet empty
        self._runs = itertools.count()
        self._lock = threading.Lock()
        atexit.register(self.remove)

    def release(self, run: Slot) -> None:
        """The run is over: its groups wait for a next run (or are removed once empty, past IDLE_MAX)."""
        with self._lock:
            if len(self.idle) < self.IDLE_MAX:
                self.idle.append(run)
                return
        if not run.try_remove():
            with self._lock:
                self.pending.append(run)

    def sweep(self, wait_s: float = 0.0, idle: bool = False) -> bool:
        """Remove the groups waiting to be removed (with `idle`, the idle ones too) that have emptied, trying for at
        most `wait_s` (True when none is left)."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            if idle:
                self.pending, self.idle = self.pending + self.idle, []
        while True:
            with self._lock:
                self.pending = [run for run in self.pending if not run.try_remove()]
                if not self.pending:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)

    @classmethod
    def find(cls) -> tuple[Cgroups | None, str]:
        """(this process's cgroups, "") or (None, why there are none here): found once per process, shared by all
        its sandboxes and threads (one parent, one run counter)."""
        with _LOCK:
            if _FOUND.get("pid") != os.getpid():
                _FOUND.update(pid=os.getpid(), found=cls._find())
            return _FOUND["found"]

    @classmethod
    def _find(cls) -> tuple[Cgroups | None, str]:
        if os.geteuid() != 0:
            return None, "not root: no cgroup can be made"
        name = f"sarl-sandbox-{os.getpid()}"
        unified = CGROUP_ROOT / "cgroup.controllers"
        if unified.is_file() and {"memory", "pids"} <= set(unified.read_text().split()):
            own = _own_path("")
            parent = CGROUP_ROOT / (own or "/").lstrip("/") / name
            try:
                parent.mkdir(exist_ok=True)
                _write(parent / "cgroup.subtree_control", "+memory +pids")
                return cls(2, {"": parent}), ""
            except OSError as err:
                return None, f"cgroup v2 has no delegated memory and pids controllers here ({err.strerror})"
        parents = {}
        for controller in ("memory", "pids"):
            own = _own_path(controller)
            base = CGROUP_ROOT / controller
            if own is None or not base.is_dir():
                return None, f"no cgroup v1 {controller} hierarchy (/sys/fs/cgroup/{controller})"
            parents[controller] = base / own.lstrip("/") / name
            try:
                parents[controller].mkdir(exist_ok=True)
            except OSError as err:
                return None, f"cannot make a cgroup under {base / own.lstrip('/')} ({err.strerror})"
        return cls(1, parents), ""

    def slot(self, slot: int, memory_bytes: int, tasks: int) -> Slot:
        """A group for a run of slot `slot`: a quiet idle one with these limits, else a new one with them written."""
        with self._lock:
            for i, run in enumerate(self.idle):
                if run.limits == (memory_bytes, tasks) and run.quiet():
                    del self.idle[i]
                    self.made[slot] = run
                    return run
        if self.pending:
            self.sweep()
        name = f"run-{next(self._runs)}"
        if self.version == 2:
            group = self.parents[""] / name
            group.mkdir()
            _write(group / "memory.max", str(memory_bytes))
            if (group / "memory.swap.max").exists():
                _write(group / "memory.swap.max", "0")
            _write(group / "pids.max", str(tasks))
            limits = (memory_bytes, tasks)
            made = Slot(
                (group / "cgroup.procs",),
                group / "memory.events",
                group / "pids.current",
                group / "memory.current",
                limits,
            )
        else:
            memory, pids = self.parents["memory"] / name, self.parents["pids"] / name
            memory.mkdir()
            pids.mkdir()
            _write(memory / "memory.limit_in_bytes", str(memory_bytes))
            swap = memory / "memory.memsw.limit_in_bytes"  # present where swap accounting is on: no swap either
            if swap.exists():
                try:
                    _write(swap, str(memory_bytes))
                except OSError:
                    pass
            _write(pids / "pids.max", str(tasks))
            procs = (memory / "cgroup.procs", pids / "cgroup.procs")
            usage = memory / "memory.usage_in_bytes"
            made = Slot(procs, memory / "memory.oom_control", pids / "pids.current", usage, (memory_bytes, tasks))
        self.made[slot] = made
        return made

    def remove(self) -> None:
        """Remove the runs' groups left and the parents (empty once their programs are gone)."""
        self.sweep(0.5, idle=True)
        for parent in self.parents.values():
            for group in parent.glob("run-*"):
                try:
                    group.rmdir()
                except OSError:
                    pass
        for parent in self.parents.values():
            try:
                parent.rmdir()
            except OSError:
                pass
        self.made = {}
