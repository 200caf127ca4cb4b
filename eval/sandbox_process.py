"""One program's run (`eval.sandbox`): its two processes, the pipes between them, the loop that feeds, reads and
times them, and their end. The runner goes through bubblewrap (the argv `Sandbox` builds), the judge runs as a plain
`python -I -S`; both drop to their uid through util-linux's `setpriv` when the caller is root. `ProgramRun.finish()`
returns how the run ended; `eval.sandbox` turns that into an outcome.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

from eval.sandbox_wire import WireError, wire_frame, wire_loads

log = logging.getLogger(__name__)

JUDGE_UID = 65534  # nobody: the judge's uid when the caller is root
_HERE = Path(__file__).parent
_WIRE = (_HERE / "sandbox_wire.py").read_text()
RUNNER_SOURCE = _WIRE + "\n" + (_HERE / "sandbox_runner.py").read_text()
JUDGE_SOURCE = _WIRE + "\n" + (_HERE / "sandbox_judge.py").read_text()
SETPRIV = shutil.which("setpriv") or ("/usr/bin/setpriv" if os.path.exists("/usr/bin/setpriv") else None)


class Finished(NamedTuple):
    """How a run ended: `why` ("" when the judge finished, else "timeout" or "output_limit"), the first bytes of
    the runner's own output, the judge's verdict (None: it gave none), the judge's stderr head, the runner's
    exit status when it had ended by itself (None otherwise) and the judge's (negative: the signal that ended it)."""

    why: str
    output: bytes
    verdict: dict | None
    judge_err: bytes
    runner_status: int | None
    judge_status: int | None = None
    oom_killed: bool = False  # the kernel killed a process of the program's cgroup for memory


def tasks_of(uid: int) -> int:
    """Live tasks (processes and threads, not zombies) whose real uid is `uid`. 0 without /proc."""
    total = 0
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in Path(entry.path, "status").read_text().splitlines())
            if int(fields["Uid"].split()[0]) == uid and fields["State"].split()[0] not in ("Z", "X"):
                total += int(fields["Threads"])
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return total


class ProgramRun:
    """One program's two processes, their pipes and the loop that feeds, reads and times them."""

    def __init__(self, box: Any, program: str, problem: Any, slot: int, judge_dir: str) -> None:
        self.box = box
        self.runner_uid = box.uid_base + slot if box.as_root else None
        req_r, req_w = os.pipe()  # judge -> runner: requests
        rep_r, rep_w = os.pipe()  # runner -> judge: replies
        ver_r, ver_w = os.pipe()  # judge -> this process: the verdict
        self.verdict_fd = ver_r
        self.runner = self.judge = None
        groups = box.cgroups()
        self.cgroup = groups.slot(slot, (box.memory_mb + box.disk_mb) << 20, box.max_processes + 3) if groups else None
        self.oom_before = self.cgroup.oom_kills() if self.cgroup else 0
        try:
            runner_fds = json.dumps([req_r, rep_w])
            self.runner = self._popen(
                [*box._bwrap_argv(), box.python, "-I", "-S", "-c", with_fds(RUNNER_SOURCE, runner_fds)],
                box._limits(runner=True),
                (req_r, rep_w),
                self.runner_uid,
                cwd="/",
                stderr=subprocess.STDOUT,
                join=self.cgroup.join_argv if self.cgroup else None,
            )
            judge_fds = json.dumps([req_w, rep_r, ver_w])
            self.judge = self._popen(
                [box.python, "-I", "-S", "-c", with_fds(JUDGE_SOURCE, judge_fds)],
                box._limits(runner=False),
                (req_w, rep_r, ver_w),
                JUDGE_UID if box.as_root else None,
                cwd=judge_dir,
                stderr=subprocess.PIPE,
                env={"HOME": judge_dir, "TMPDIR": judge_dir},
            )
        except BaseException:
            self._stop()
            os.close(ver_r)
            raise
        finally:
            for fd in (req_r, req_w, rep_r, rep_w, ver_w):
                os.close(fd)
        self.inputs = {
            self.runner.stdin: wire_frame({"program": program, "prelude": problem.prelude, "script": problem.stdin}),
            self.judge.stdin: wire_frame({"tests": problem.tests, "prelude": problem.prelude, "script": problem.stdin}),
        }

    @staticmethod
    def _popen(argv, limits, fds, uid, cwd, stderr, env=None, join=None) -> subprocess.Popen:
        """Start one side as `uid` (None: the caller's). util-linux's `setpriv` drops the uid after the exec, so
        the parent starts it with vfork; Popen's own `user=` forks the whole parent first (15 ms in a process
        that holds torch, measured), the fallback where setpriv is missing. `join`: wraps the whole command so
        that it starts inside the program's cgroup (as root, before the uid is dropped)."""
        user: dict = {}
        if uid is not None and SETPRIV:
            argv = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
        elif uid is not None:
            user = {"user": uid, "group": uid, "extra_groups": []}
        argv = [*argv, limits]
        return subprocess.Popen(
            join(argv) if join else argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if stderr is subprocess.STDOUT else subprocess.DEVNULL,
            stderr=stderr,
            cwd=cwd,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})},
            start_new_session=True,
            pass_fds=fds,
            **user,
        )

    def finish(self) -> Finished:
        """Feed, read and time both sides until the judge's verdict, the timeout or the output cap; then stop
        both and say how the run ended."""
        why = "harness"
        try:
            why, output, verdict_bytes, judge_err = self._loop()
            verdict = parse_verdict(verdict_bytes)
            runner_status = self._runner_status(verdict)
        finally:
            self._stop(finished=not why)
            os.close(self.verdict_fd)
        judge_status = self.judge.returncode if self.judge is not None else None
        oom = self.cgroup is not None and self.cgroup.oom_kills() > self.oom_before
        if self.cgroup is not None:
            self.cgroup.remove()
        return Finished(why, output, verdict, judge_err, runner_status, judge_status, oom)

    def _loop(self) -> tuple[str, bytes, bytes, bytes]:
        box, deadline = self.box, time.monotonic() + self.box.timeout_s
        head, seen, verdict, judge_err = bytearray(), 0, bytearray(), bytearray()
        with selectors.DefaultSelector() as sel:
            for pipe, data in self.inputs.items():
                os.set_blocking(pipe.fileno(), False)
                sel.register(pipe, selectors.EVENT_WRITE, memoryview(data))
            sel.register(self.runner.stdout, selectors.EVENT_READ, "out")
            sel.register(self.judge.stderr, selectors.EVENT_READ, "judge_err")
            sel.register(self.verdict_fd, selectors.EVENT_READ, "verdict")
            while any(k.data == "verdict" for k in sel.get_map().values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout", bytes(head), bytes(verdict), bytes(judge_err)
                for key, _ in sel.select(left):
                    if isinstance(key.data, memoryview):  # feeding a side its input
                        try:
                            written = os.write(key.fd, key.data[: 1 << 16])
                        except BlockingIOError:
                            continue
                        except OSError:  # it died before reading all of it: its exit tells why
                            written = len(key.data)
                        rest = key.data[written:]
                        if rest:
                            sel.modify(key.fileobj, selectors.EVENT_WRITE, rest)
                        else:
                            sel.unregister(key.fileobj)
                            key.fileobj.close()
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.data == "out":
                        seen += len(chunk)
                        head += chunk[: max(0, 4096 - len(head))]
                        if seen > box.max_output_bytes:
                            return "output_limit", bytes(head), bytes(verdict), bytes(judge_err)
                    elif key.data == "verdict":
                        verdict += chunk[: max(0, (1 << 16) - len(verdict))]
                    else:
                        judge_err += chunk[: max(0, 4096 - len(judge_err))]
        return "", bytes(head), bytes(verdict), bytes(judge_err)

    def _runner_status(self, verdict: dict | None) -> int | None:
        """The runner's exit status when the judge found it gone (it exits only then or when the judge closes
        the wire); None while it still runs."""
        if verdict is not None and verdict.get("gone") is True:
            try:
                return self.runner.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                return None
        return self.runner.poll() if self.runner is not None else None

    def _stop(self, finished: bool = False) -> None:
        """Kill both sides. After a finished judge the runner, whose wire is closed, exits by itself in a few
        ms; its exit (bwrap's, after the pid namespace is torn down) means no process of it is left. A runner
        that had to be killed is waited for by its uid (root) until none of its processes is left."""
        killed = False
        for proc in (self.judge, self.runner):
            if proc is None:
                continue
            if finished and proc is self.runner:
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            if proc.poll() is None:
                killed |= proc is self.runner
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session (start_new_session): group id = its pid
                except (ProcessLookupError, PermissionError):
                    pass
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None and not pipe.closed:
                    pipe.close()
        if killed and self.runner_uid is not None:
            wait_uid_gone(self.runner_uid)


def with_fds(source: str, fds: str) -> str:
    return f"_SANDBOX_FDS = {fds}\n{source}"


def wait_uid_gone(uid: int, limit_s: float = 2.0) -> None:
    """Wait (at most `limit_s`) until no live process of the runner's uid is left (the pid namespace's teardown
    after bwrap is killed is asynchronous), so none outlives the run."""
    deadline = time.monotonic() + limit_s
    while tasks_of(uid):
        if time.monotonic() > deadline:
            log.warning("sandbox: uid %d still had processes %.1f s after SIGKILL", uid, limit_s)
            return
        time.sleep(0.005)


def parse_verdict(data: bytes) -> dict | None:
    """The judge's verdict frame as a dict with its required fields, or None (no verdict: the judge failed)."""
    try:
        size = int.from_bytes(data[:4], "big")
        verdict = wire_loads(data[4 : 4 + size].decode("ascii"))
        int(verdict["passed"]), int(verdict["asserts"]), str(verdict["kind"]), bool(verdict["all_ran"])
        return verdict
    except (WireError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
