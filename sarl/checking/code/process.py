"""One program's run (`sarl.checking.code.sandbox`): its runner process, the pipes between it and a judge, the loop that
feeds, reads and times them, and their end. The runner, fresh for every program, is a fork of the fork server
(`sarl.checking.code.spawner`) as root, else goes through bubblewrap (the argv `Sandbox` builds); the judge (`Judge`)
is a plain `python -I -S`, long-lived, one per worker thread of this process, and gets each program's pipe ends over a
Unix socket. A bubblewrap runner and the judge drop to their uid through util-linux's `setpriv` when the caller is
root. `ProgramRun.finish()` returns how the run ended; `sarl.checking.code.sandbox` turns that into an outcome.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, NamedTuple

from sarl.checking.code.seccomp import seccomp_filter
from sarl.checking.code.spawner import Spawned
from sarl.checking.code.wire import WireError, wire_frame, wire_loads

log = logging.getLogger(__name__)

JUDGE_UID = 65534  # nobody: the judge's uid when the caller is root
_HERE = Path(__file__).parent
_WIRE = (_HERE / "wire.py").read_text()
RUNNER_SOURCE = _WIRE + "\n" + (_HERE / "runner.py").read_text()
JUDGE_SOURCE = _WIRE + "\n" + (_HERE / "judge.py").read_text()
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
    return sum(threads for _, _, threads in live_processes(range(uid, uid + 1)))


def live_processes(uids: range) -> list[tuple[int, int, int]]:
    """(pid, real uid, threads) of each live process (not a zombie) whose real uid is in `uids`."""
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = _status(entry.name)
            uid = int(fields["Uid"].split()[0])
            if uid in uids and fields["State"].split()[0] not in ("Z", "X"):
                found.append((int(entry.name), uid, int(fields["Threads"])))
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return found


def _status(pid: int | str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())


def kill_uid(uid: int) -> None:
    """SIGKILL every live process of `uid` (a killed runner's uid: no process of it may outlive its run, even one
    that was made to survive its namespace's teardown). Each through a pidfd opened before its uid is checked, so
    a pid that ended and was reused by another process in between is never signalled."""
    for pid, _, _ in live_processes(range(uid, uid + 1)):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if int(_status(pid)["Uid"].split()[0]) == uid:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except (OSError, KeyError, ValueError, IndexError):
            pass
        finally:
            os.close(pidfd)


_JUDGES: weakref.WeakSet = weakref.WeakSet()


class Judge:
    """A long-lived judge process (judge.py) of one worker thread: a private directory as its cwd and HOME
    (emptied after every job), a Unix socket to this process, its stderr in an unnamed file. Trusted: no program
    ever runs in it; a judge that died, timed out or gave no verdict is closed and the next job gets a new one."""

    def __init__(self, box: Any) -> None:
        self.owner = os.getpid()
        self.dir = tempfile.mkdtemp(prefix="sarl-judge-")
        self.proc: Session | None = None
        self.sock: socket.socket | None = None
        self.err = tempfile.TemporaryFile()
        try:
            if box.as_root:
                fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    os.fchown(fd, JUDGE_UID, JUDGE_UID)
                finally:
                    os.close(fd)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.proc = start_side(
                    [box.python, "-I", "-S", "-c", JUDGE_SOURCE],
                    box._limits(runner=False),
                    (),
                    JUDGE_UID if box.as_root else None,
                    cwd=self.dir,
                    stderr=self.err,
                    env={"HOME": self.dir, "TMPDIR": self.dir, "LANG": "C.UTF-8"},
                    stdin=theirs,
                )
            finally:
                theirs.close()
            self.sock = ours
        except BaseException:
            self.close()
            raise
        _JUDGES.add(self)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.sock is not None

    def send(self, req_w: int, rep_r: int, job: dict) -> None:
        """One job: its two pipe ends (SCM_RIGHTS, with one byte), then its frame."""
        assert self.sock is not None
        socket.send_fds(self.sock, [b"J"], [req_w, rep_r])
        self.sock.sendall(wire_frame(job))

    def err_tail(self) -> bytes:
        if self.err.closed:
            return b""
        self.err.seek(0, os.SEEK_END)
        size = self.err.tell()
        self.err.seek(max(0, size - 4096))
        return self.err.read()

    def tidy(self) -> None:
        """Empty its directory after a job (the tests' own files; the program never reaches it)."""
        for entry in os.scandir(self.dir):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass

    def close(self) -> int | None:
        """Stop it (its exit status: negative, the signal that ended it) and remove its directory."""
        status = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            self.proc.kill()  # its session: the judge and anything it started
            status = self.proc.wait()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
        if not self.err.closed:
            self.err.close()
        return status

    def __del__(self) -> None:  # a worker thread's judge when the thread ends
        try:
            if self.owner == os.getpid():
                self.close()
        except Exception:
            pass


def close_judges() -> None:
    """Stop every judge of this process (at exit: a judge would end by itself on its closed socket, later)."""
    for judge in list(_JUDGES):
        if judge.owner == os.getpid():  # a forked child's copy is not its to stop
            judge.close()


atexit.register(close_judges)


def seccomp_pipe() -> int | None:
    """The read end of a pipe holding the programs' seccomp filter (sarl.checking.code.seccomp), for bubblewrap's
    `--seccomp`; None on a machine the filter has no numbers for."""
    code = seccomp_filter()
    if code is None:
        return None
    r, w = os.pipe()
    try:
        os.write(w, code)  # a few hundred bytes: well within a pipe's buffer
    finally:
        os.close(w)
    return r


class Session(subprocess.Popen):
    """A side started in a session of its own (`start_side`), with what `Runner` needs of a runner as the fork
    server's (`Spawned`) has it: `kill` ends the whole session (bubblewrap and the program, the judge and its
    children), and `wait(timeout)` is woken by the kernel when the process exits (a pidfd), where Popen's polls with
    sleeps that double from 0.5 ms: a runner that takes 1.6 ms to end would be seen at 3.5 ms."""

    def kill(self) -> None:
        if self.returncode is None:  # once reaped, its group id may be another's
            try:
                os.killpg(self.pid, signal.SIGKILL)  # its own session: group id = its pid
            except (ProcessLookupError, PermissionError):
                pass

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None or self.poll() is not None:
            return super().wait(timeout)
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:  # before Linux 5.3, or already reaped
            return super().wait(timeout)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(pidfd, selectors.EVENT_READ)
                sel.select(timeout)
        finally:
            os.close(pidfd)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


def start_side(argv, limits, fds, uid, cwd, stderr, env=None, join=None, stdin=subprocess.PIPE) -> Session:
    """Start one side as `uid` (None: the caller's). util-linux's `setpriv` drops the uid after the exec, so the
    parent starts it with vfork; Popen's own `user=` forks the whole parent first (15 ms in a process that holds
    torch, measured), the fallback where setpriv is missing. `join`: wraps the whole command so that it starts
    inside the program's cgroup (as root, before the uid is dropped)."""
    user: dict = {}
    if uid is not None and SETPRIV:
        argv = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    elif uid is not None:
        user = {"user": uid, "group": uid, "extra_groups": []}
    argv = [*argv, limits]
    return Session(
        join(argv) if join else argv,
        stdin=stdin,
        stdout=subprocess.PIPE if stderr is subprocess.STDOUT else subprocess.DEVNULL,
        stderr=stderr,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", **(env or {})},  # no LANG: setpriv's locale files cost 0.4 ms a start
        start_new_session=True,
        pass_fds=fds,
        **user,
    )


class Runner:
    """One program's untrusted process: runner.py in bubblewrap as the uid of a slot of its own, in a cgroup of its
    own, with its two pipes to a judge. It may be started before its program is known (`Sandbox.run_many` starts a
    worker's next runner while the worker's current program runs), waiting for the program on its stdin with no
    code of anyone's run yet; it then serves exactly one program (`ProgramRun`) and is stopped. A runner given no
    program is stopped the same way: none is ever reused."""

    def __init__(self, box: Any, slots: Any) -> None:
        self.box, self.slots, self.owner = box, slots, os.getpid()
        self.slot: int | None = slots.take()
        self.uid = box.uid_base + self.slot if box.as_root else None
        self.proc: Session | Spawned | None = None
        self.cgroup = None
        self.oom_before, self.oom_killed = 0, False
        self.deferred = False  # handed to a `stop_later` after its verdict (ProgramRun.finish)
        req_r, req_w = os.pipe()  # judge -> runner: requests
        rep_r, rep_w = os.pipe()  # runner -> judge: replies
        self.judge_fds: tuple[int, ...] = (req_w, rep_r)  # the judge's ends, until `hand_to`
        rules = None
        try:
            groups = box.cgroups()
            if groups:
                self.cgroup = groups.slot(self.slot, (box.memory_mb + box.disk_mb) << 20, box.max_processes + 3)
                self.oom_before = self.cgroup.oom_kills()
            zygote = box.zygote()
            if zygote is not None:
                tmp = (box.disk_mb << 20) - box.shm_bytes
                procs = self.cgroup.procs if self.cgroup else ()
                ids = (self.uid, self.uid) if self.uid is not None else (os.getuid(), os.getgid())
                limits = box._limits(True, own=3)
                self.proc = zygote.spawn(*ids, tmp, box.shm_bytes, limits, (req_r, rep_w), procs)
            else:
                boot = with_fds(RUNNER_BOOT, json.dumps([req_r, rep_w]))
                rules = seccomp_pipe()  # bubblewrap reads it whole before it starts the runner
                seccomp = ("--seccomp", str(rules)) if rules is not None else ()
                self.proc = start_side(
                    [*box._bwrap_argv()[:-1], *seccomp, "--", box.python, "-I", "-S", "-c", boot],
                    box._limits(runner=True),
                    (req_r, rep_w) if rules is None else (req_r, rep_w, rules),
                    self.uid,
                    cwd="/",
                    stderr=subprocess.STDOUT,
                    join=self.cgroup.join_argv if self.cgroup else None,
                )
        except BaseException:
            self.stop()
            raise
        finally:
            for fd in (req_r, rep_w) if rules is None else (req_r, rep_w, rules):
                os.close(fd)

    def oom_now(self) -> bool:
        """Whether the kernel has killed a process of its cgroup for memory since it started."""
        return self.cgroup is not None and self.cgroup.oom_kills() > self.oom_before

    def ready(self) -> bool:
        """Started by this process, still running, and given no program yet."""
        return self.owner == os.getpid() and bool(self.judge_fds) and self.proc is not None and self.proc.poll() is None

    def hand_to(self, judge: Judge, job: dict) -> None:
        """Give the judge this runner's pipe ends and the job (the runner's program goes on its stdin)."""
        try:
            judge.send(*self.judge_fds, job)
        finally:
            self._close_judge_fds()

    def _close_judge_fds(self) -> None:
        fds, self.judge_fds = self.judge_fds, ()
        for fd in fds:
            os.close(fd)

    def stop(self, finished: bool = False) -> None:
        """End it (idempotent). After a finished judge the runner, whose wire is closed, exits by itself in a few ms;
        its exit (bwrap's, after the pid namespace is torn down) means no process of it is left. A runner that had
        to be killed is waited for by its uid (root) until none of its processes is left. Then its OOM kills are
        read, its cgroup released (removed once the kernel has emptied it) and its slot given back."""
        self._close_judge_fds()
        killed = False
        proc = self.proc
        if proc is not None and proc.returncode is None:
            if finished:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.2)
            if proc.poll() is None:
                killed = True
                proc.kill()  # the whole runner: its pid 1, and so its namespace, die with it
            proc.wait()
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None and not pipe.closed:
                    pipe.close()
        if killed and self.uid is not None:
            wait_uid_gone(self.uid)
        if self.cgroup is not None:
            self.oom_killed = self.oom_killed or self.oom_now()
            self.box.cgroups().release(self.cgroup)
            self.cgroup = None
        if self.slot is not None:
            self.slots.give(self.slot)
            self.slot = None

    def __del__(self) -> None:  # a spare nobody took (its worker ended)
        try:
            if self.owner == os.getpid():
                self.stop()
        except Exception:
            pass


class ProgramRun:
    """One program on its runner: the job handed to the judge, and the loop that feeds, reads and times them."""

    def __init__(self, box: Any, program: str, problem: Any, runner: Runner, judge: Judge) -> None:
        self.box, self.judge, self.runner = box, judge, runner
        assert runner.proc is not None
        self.proc = runner.proc
        job = {"tests": problem.tests, "prelude": problem.prelude, "script": problem.stdin, "cpu_s": box.cpu_s + 1}
        runner.hand_to(judge, job)
        self.inputs = {
            self.proc.stdin: wire_frame({"program": program, "prelude": problem.prelude, "script": problem.stdin}),
        }

    def finish(self, stop_later: Callable[[Runner], object] | None = None) -> Finished:
        """Feed, read and time the runner and the judge until the judge's verdict, the timeout or the output cap;
        then stop the runner and say how the run ended. A judge that gave no verdict is stopped too (its exit
        status is kept: SIGXCPU is the tests' CPU time); the caller replaces a judge that is not `alive`.

        `stop_later`: after a verdict on a runner that is still there (its wire closed, it is exiting), hand it to
        this instead of waiting the 2 ms of its namespaces' teardown here; its OOM kills are read first (a kill
        during the run is counted before the judge can see its effect). Every other run is stopped here."""
        why, output, verdict_bytes = "harness", b"", b""
        verdict, judge_err, judge_status = None, b"", None
        later = False
        try:
            why, output, verdict_bytes = self._loop()
            verdict = read_verdict(verdict_bytes) if not why else None
        finally:
            if verdict is None:  # no verdict (timeout, output cap, a judge that died): this judge is done
                judge_err = self.judge.err_tail()
                judge_status = self.judge.close()
            later = stop_later is not None and verdict is not None and verdict.get("gone") is not True
            if later:
                self.runner.deferred = True
                self.runner.oom_killed = self.runner.oom_now()
                stop_later(self.runner)
            else:
                self.runner.stop(finished=verdict is not None)
        # a stopped runner has been waited for: its status is how it ended (read only when the judge found it gone)
        runner_status = None if later else self.proc.returncode
        return Finished(why, output, verdict, judge_err, runner_status, judge_status, self.runner.oom_killed)

    def _loop(self) -> tuple[str, bytes, bytes]:
        box, deadline = self.box, time.monotonic() + self.box.timeout_s
        head, seen, verdict = bytearray(), 0, bytearray()
        with selectors.DefaultSelector() as sel:
            for pipe, data in self.inputs.items():
                os.set_blocking(pipe.fileno(), False)
                sel.register(pipe, selectors.EVENT_WRITE, memoryview(data))
            sel.register(self.proc.stdout, selectors.EVENT_READ, "out")
            sel.register(self.judge.sock, selectors.EVENT_READ, "verdict")
            while not _whole_frame(verdict):
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout", bytes(head), bytes(verdict)
                for key, _ in sel.select(left):
                    if isinstance(key.data, memoryview):  # feeding the runner its input
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
                        if key.data == "verdict":  # the judge is gone without a whole verdict
                            return "", bytes(head), bytes(verdict)
                    elif key.data == "out":
                        seen += len(chunk)
                        head += chunk[: max(0, 4096 - len(head))]
                        if seen > box.max_output_bytes:
                            return "output_limit", bytes(head), bytes(verdict)
                    else:
                        verdict += chunk
                        if len(verdict) > (1 << 16) + 4:  # a verdict is small: this is no judge of ours
                            return "", bytes(head), b""
        return "", bytes(head), bytes(verdict)


def _whole_frame(data: bytearray) -> bool:
    return len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big")


RUNNER_CODE = "/sandbox-runner"  # where the runner's compiled code is, read-only, inside the sandbox
RUNNER_BOOT = f"import marshal\nexec(marshal.loads(open({RUNNER_CODE!r}, 'rb').read()))\n"
_RUNNER_CODE: dict[str, str] = {}
_RUNNER_LOCK = threading.Lock()


def runner_code(python: str) -> str:
    """A file holding RUNNER_SOURCE compiled by `python` itself (marshal's format is the interpreter's), made once
    per interpreter in a root-owned directory others can read but not write, removed at exit."""
    with _RUNNER_LOCK:
        if python not in _RUNNER_CODE:
            compiled = subprocess.run(
                [python, "-I", "-S", "-c", COMPILE],
                input=RUNNER_SOURCE.encode(),
                capture_output=True,
                check=True,
            ).stdout
            folder = tempfile.mkdtemp(prefix="sarl-runner-")
            os.chmod(folder, 0o755)
            path = os.path.join(folder, "runner.marshal")
            with open(path, "wb") as f:
                f.write(compiled)
            os.chmod(path, 0o444)
            atexit.register(shutil.rmtree, folder, True)
            _RUNNER_CODE[python] = path
        return _RUNNER_CODE[python]


COMPILE = "import marshal, sys\nsys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(), 'runner', 'exec')))"


def with_fds(source: str, fds: str) -> str:
    return f"_SANDBOX_FDS = {fds}\n{source}"


def wait_uid_gone(uid: int, limit_s: float = 2.0) -> None:
    """Wait (at most `limit_s`) until no live process of the runner's uid is left: the pid namespace's teardown
    after its runner is killed is asynchronous, and a process of the program that escaped it (its pid 1 traced
    and changed) is killed here, by its uid, so none outlives the run."""
    deadline = time.monotonic() + limit_s
    while tasks_of(uid):
        if time.monotonic() > deadline:
            log.warning("sandbox: uid %d still had processes %.1f s after SIGKILL", uid, limit_s)
            return
        kill_uid(uid)
        time.sleep(0.005)


def read_verdict(data: bytes) -> dict | None:
    """The judge's verdict frame as a dict with its required fields, or None (no verdict: the judge failed)."""
    try:
        size = int.from_bytes(data[:4], "big")
        verdict = wire_loads(data[4 : 4 + size].decode("ascii"))
        int(verdict["passed"]), int(verdict["asserts"]), str(verdict["kind"]), bool(verdict["all_ran"])
        return verdict
    except (WireError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
