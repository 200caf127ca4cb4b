"""Termination signals as an exception, so that a terminated run cleans up like a failed one.

The default action of SIGTERM and SIGHUP ends the process at once: no `finally`, no `__exit__`, so the
children a run started in their own sessions (verl, the embedding server) would keep running. Inside
`signals_as_exceptions()` the first such signal raises `Terminated` in the main thread instead; every
context manager and `except BaseException` on the way out then stops its child by its process group.
A second signal while that clean-up runs is logged and otherwise ignored, so the clean-up finishes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Callable, Iterator, Sequence

log = logging.getLogger(__name__)

TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """A termination signal arrived. A BaseException (like KeyboardInterrupt), so that `except Exception`
    does not swallow it; `exit_code` is the shell's convention for a process ended by that signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"received {signal.Signals(signum).name}")


@contextlib.contextmanager
def signals_as_exceptions(signums: tuple[int, ...] = TERMINATING_SIGNALS) -> Iterator[None]:
    """Within the block, the first of `signums` raises `Terminated`; the previous handlers come back after
    it. Call from the main thread (Python runs signal handlers there only)."""
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if received:
            log.warning(
                "%s while stopping after %s: still stopping",
                signal.Signals(signum).name,
                signal.Signals(received[0]).name,
            )
            return
        received.append(signum)
        raise Terminated(signum)

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def stop_process_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM the process group that `proc` leads (started with start_new_session=True), SIGKILL after
    `grace_s`: that child and whatever it started, nothing else. Members still in the group after the leader
    exited (workers it did not wait for) are killed too, and this returns only once none is left running
    (a signalled process is not gone at once: under load it can take a while to exit)."""
    pgid = proc.pid  # start_new_session=True: the child leads its own group
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    try:  # reap any worker still in the group after the leader exited
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _wait_group_gone(pgid, timeout_s=10.0)


def _group_members_running(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (Linux: read from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Wait until no member of group `pgid` is running; log the ones still there after `timeout_s`."""
    if not os.path.isdir("/proc"):
        return
    deadline = time.monotonic() + timeout_s
    while members := _group_members_running(pgid):
        if time.monotonic() > deadline:
            log.warning("process group %d: %s still running after SIGKILL", pgid, members)
            return
        time.sleep(0.05)


def run_in_own_group(
    cmd: list[str],
    cwd: str | Path,
    env: dict[str, str],
    grace_s: float = 60,
    *,
    output: Path | None = None,
    poll: Callable[[], None] | None = None,
    poll_s: float = 2.0,
) -> int:
    """Run `cmd` as the leader of a new session and wait for its exit code; on any exception here (Ctrl-C, a
    SIGTERM turned into an exception, ...) its whole process group is stopped (`stop_process_group`), so a
    launcher (verl's Ray driver, torchrun) never outlives the command that started it. With `output`, the
    command's stdout and stderr are appended to that file; `poll()` is called every `poll_s` seconds while it runs
    and once after it ended (a progress report)."""
    out = open(output, "ab") if output is not None else None  # noqa: SIM115 (closed below, after the child)
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT if out else None
        )
        try:
            while True:
                try:
                    rc = proc.wait(timeout=poll_s if poll else None)
                    break
                except subprocess.TimeoutExpired:
                    poll()
            if poll:
                poll()
            return rc
        except BaseException:
            stop_process_group(proc, grace_s=grace_s)  # SIGTERM to the child's group, SIGKILL if it is still there
            raise
    finally:
        if out is not None:
            out.close()


def torchrun_args(n_processes: int, module: str, args: Sequence[str]) -> list[str]:
    """torchrun's arguments for `n_processes` ranks of `python -m module args` on this node (one node, a standalone
    rendezvous)."""
    return ["--standalone", "--nnodes=1", f"--nproc_per_node={n_processes}", "-m", module, *args]


def torchrun_command(n_processes: int, module: str, args: Sequence[str]) -> list[str]:
    """torchrun (`python -m torch.distributed.run`, this interpreter) with `torchrun_args`: what
    `run_in_own_group` starts for a back end's processes on one node."""
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args(n_processes, module, args)]
