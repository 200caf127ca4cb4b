"""Run an untrusted Python program against its tests in a separate, limited process (decisions §8).

One program -> one child process: `python -I -S -c <eval/sandbox_child.py>` (isolated mode, no site: the
child imports neither the project nor site-packages), in a private temporary directory that is its cwd, HOME
and TMPDIR and is removed afterwards, with stdin /dev/null and an environment of PATH and LANG only.

Layers, each bounding what the one before may miss:

1. Namespaces (`namespaces="auto"`: used when `unshare --user --net --pid --fork` works for the child's uid,
   probed once per process): no network but a loopback that is down; a fresh PID namespace, so no process
   outside the sandbox can be named or signalled (the parent included) and every process of the sandbox dies
   with its first one.
2. The uid: a parent running as root starts the child as `user` (default 65534, nobody), since the kernel
   enforces RLIMIT_NPROC only for a non-root uid and nobody can read root's files.
3. Resource limits, set in the child before the program runs: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_NPROC
   (tasks of the uid: the uid's current tasks plus `max_processes` per concurrent program, so a fork bomb is
   bounded and the parent's own limit is untouched), RLIMIT_FSIZE, RLIMIT_NOFILE, no core files.
4. The parent: a wall-clock timeout after which the child's whole process group is killed (`start_new_session`
   + `os.killpg`; the group is killed after every run, finished or not), and at most `max_output_bytes` of
   stdout + stderr read (the child is killed when it writes more; nothing larger is ever buffered).
5. An audit hook (`sys.addaudithook`) in the child that refuses processes (`os.system`, `subprocess`,
   `os.exec*`, `os.fork`, `os.posix_spawn`), signals, sockets, ctypes, frames (`sys._getframe` except from
   standard-library modules that keep the frame to themselves; `tb_frame`, `gi_frame`), the garbage
   collector's object lists, reads outside the sandbox directory and the standard library, and writes,
   removals and renames outside the sandbox directory. A refused operation ends as `blocked` (score 0). The
   hook binds everything it uses before the program runs, so patching `builtins` or `os` does not change it.

Not guaranteed: an audit hook is not a security boundary: native code (a C extension, ctypes reached some way
the hook missed) passes it, and the verdict is written by the process that ran the program, so code that
reads the interpreter's memory could forge it; the boundaries are layers 1-4. Without namespaces (unshare
missing or user namespaces disabled; `isolation` says which) the network and, for a non-root caller whose
child keeps its uid, the caller's processes are reachable by such code. The file system is not
namespaced: past the hook the child reads and writes what its uid may (as nobody: world-readable files and
world-writable directories such as /tmp). Disk use is bounded per file (RLIMIT_FSIZE), not in total.
Processes that die with the namespace may linger as zombies until the machine's init reaps them. The tests
are trusted: a program that returns an object equal to everything passes an `==` assert. Timing: a
timed-out program holds its worker for the timeout plus the kill (under 0.1 s measured).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

OUTCOMES = ("passed", "failed", "syntax_error", "timeout", "memory", "output_limit", "blocked", "sandbox_error")
SCORE_MODES = ("all_pass", "pass_fraction")
UNSHARE = ("unshare", "--user", "--net", "--pid", "--fork", "--kill-child")
UNPRIVILEGED_UID = 65534  # nobody
_CHILD_SOURCE = (Path(__file__).with_name("sandbox_child.py")).read_text()
_FENCE = re.compile(r"^```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
PYTHON_TAGS = ("", "python", "py", "python3")
DENIED_EVENTS = (
    "os.system",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "os.symlink",
    "os.link",
    "os.chmod",
    "os.chown",
    "os.startfile",
    "pty.spawn",
    "signal.pthread_kill",
    "subprocess.Popen",
    "resource.setrlimit",
    "resource.prlimit",
    "sys.addaudithook",
    "sys._current_frames",
    "sys._current_exceptions",
    "sys.setprofile",
    "sys.settrace",
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "urllib.Request",
    "webbrowser.open",
)
DENIED_PREFIXES = ("os.exec", "os.posix_spawn", "os.spawn", "socket.", "ctypes.", "_posixsubprocess")
DENIED_IMPORTS = ("ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing")


def last_code_block(text: str) -> str | None:
    """The body of the last closed fenced code block (```python ... ``` or ``` ... ```; also py, python3) in
    `text`, or None. A block tagged with another language is skipped; an unclosed fence is not a block."""
    if not isinstance(text, str):
        return None
    bodies = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in PYTHON_TAGS]
    return bodies[-1] if bodies else None


@dataclass(frozen=True)
class RunResult:
    """One program's run: `outcome` (one of OUTCOMES), the top-level asserts of the tests that passed out of
    `asserts`, whether every test statement ran without raising (`all_ran`), the wall time, the first bytes
    of its output and a detail (the blocked operation, the exit status or the harness error)."""

    outcome: str
    passed: int = 0
    asserts: int = 0
    all_ran: bool = False
    wall_s: float = 0.0
    output: bytes = b""
    detail: str = ""

    def score(self, mode: str = "all_pass") -> float:
        """all_pass: 1.0 when every test statement ran without raising, else 0.0. pass_fraction: passed asserts
        / asserts, or with no top-level assert the whole tests as one test (decisions §8). Every outcome other
        than passed and failed scores 0 in both modes."""
        if self.outcome == "passed":
            return 1.0
        if self.outcome != "failed" or mode == "all_pass":
            return 0.0
        return self.passed / self.asserts if self.asserts else 0.0


def check_tests(tests: object) -> str | None:
    """Why `tests` cannot be handed to the sandbox (not a str, or not Python), None when it can."""
    if not isinstance(tests, str) or not tests.strip():
        return f"tests must be non-empty Python source, got {type(tests).__name__}"
    try:
        ast.parse(tests)
    except (SyntaxError, ValueError) as err:
        return f"tests do not parse: {err}"
    return None


def _runnable_by_others(path: str) -> bool:
    """True when every directory on the way to `path` is searchable and `path` readable and executable by a uid
    that is neither its owner nor in its group (the unprivileged uid a root parent drops to)."""
    real = Path(os.path.realpath(path))
    try:
        if (real.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH)) != (stat.S_IROTH | stat.S_IXOTH):
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)
    except OSError:
        return False


def _tasks_of(uid: int) -> int:
    """Tasks (processes and threads) whose real uid is `uid`: what RLIMIT_NPROC counts. 0 without /proc."""
    total = 0
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in Path(entry.path, "status").read_text().splitlines())
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return total


class Sandbox:
    """Runs programs against tests in the limited child process described in the module docstring.

    `timeout_s`: wall time per program (tests included); `cpu_s`: RLIMIT_CPU (default: timeout_s rounded
    up); `memory_mb`: RLIMIT_AS; `max_processes`: tasks per program beyond those the uid has; `max_file_mb`:
    RLIMIT_FSIZE; `max_output_bytes`: stdout + stderr read per program; `namespaces`: "auto" | "on" (refuse to
    run without) | "off"; `python`: the child's interpreter (None: this one, or when a root parent drops to
    `user` and that uid cannot run it, the first `python3` on PATH it can); `audit`: the audit hook (off only
    to test the layers under it).
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        cpu_s: int | None = None,
        memory_mb: int = 1024,
        max_processes: int = 8,
        max_file_mb: int = 16,
        max_output_bytes: int = 1 << 20,
        namespaces: str = "auto",
        user: int = UNPRIVILEGED_UID,
        python: str | None = None,
        audit: bool = True,
    ) -> None:
        if namespaces not in ("auto", "on", "off"):
            raise ValueError(f"sandbox namespaces={namespaces!r} is not valid; choose one of: auto, on, off")
        for key, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb), ("max_output_bytes", max_output_bytes)):
            if not value > 0:
                raise ValueError(f"sandbox {key}={value!r} must be positive")
        self.timeout_s = float(timeout_s)
        self.cpu_s = int(cpu_s) if cpu_s is not None else max(1, int(-(-self.timeout_s // 1)))
        self.memory_mb, self.max_processes, self.max_file_mb = int(memory_mb), int(max_processes), int(max_file_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.drop_to = int(user) if os.geteuid() == 0 else None
        self.python = python or self._default_python()
        self.audit = bool(audit)
        self.namespaces = namespaces
        self._use_namespaces: bool | None = None
        self._lock = threading.Lock()

    # ---- set-up -------------------------------------------------------------------------------------------

    def _default_python(self) -> str:
        if self.drop_to is None or _runnable_by_others(sys.executable):
            return sys.executable
        found = [p for p in (shutil.which("python3"), "/usr/bin/python3") if p and _runnable_by_others(p)]
        return found[0] if found else sys.executable  # check_ready reports the failure

    def _popen_user(self) -> dict:
        if self.drop_to is None:
            return {}
        return {"user": self.drop_to, "group": self.drop_to, "extra_groups": []}

    def uses_namespaces(self) -> bool:
        """Whether children run in fresh user, network and PID namespaces (probed once: `unshare ... true`)."""
        with self._lock:
            if self._use_namespaces is None:
                ok = False
                if self.namespaces != "off" and shutil.which(UNSHARE[0]):
                    try:
                        probe = subprocess.run(
                            [*UNSHARE, "true"], capture_output=True, timeout=10, **self._popen_user()
                        )
                        ok = probe.returncode == 0
                    except (OSError, subprocess.SubprocessError):
                        ok = False
                self._use_namespaces = ok
            return self._use_namespaces

    @property
    def isolation(self) -> str:
        """What bounds a child here, in words (printed by the benchmark and logged by the reward)."""
        parts = ["namespaces (user, net, pid)" if self.uses_namespaces() else "no namespaces"]
        parts.append(f"uid {self.drop_to}" if self.drop_to is not None else f"uid {os.getuid()} (the caller's)")
        parts.append("rlimits, wall timeout, output cap" + (", audit hook" if self.audit else ""))
        return "; ".join(parts)

    def check_ready(self) -> str | None:
        """None when a trivial program passes its trivial test here, else what is wrong and what to do."""
        if self.namespaces == "on" and not self.uses_namespaces():
            return (
                f"sandbox namespaces=on but `{' '.join(UNSHARE)} true` fails here; enable unprivileged user "
                "namespaces or set namespaces=auto"
            )
        result = self.run("def f():\n    return 1\n", "assert f() == 1\n")
        if result.outcome != "passed":
            return (
                f"the code sandbox cannot run a trivial program ({result.outcome}: {result.detail}) with "
                f"python={self.python}; set python= to an interpreter uid {self.drop_to or os.getuid()} can run"
            )
        return None

    # ---- running ------------------------------------------------------------------------------------------

    def _limits(self, nproc_base: int, slots: int) -> dict:
        return {
            "rlimits": {
                "RLIMIT_CPU": self.cpu_s,
                "RLIMIT_AS": self.memory_mb << 20,
                "RLIMIT_NPROC": nproc_base + self.max_processes * max(1, slots),
                "RLIMIT_FSIZE": self.max_file_mb << 20,
                "RLIMIT_NOFILE": 64,
                "RLIMIT_CORE": 0,
            },
            "audit": self.audit,
            "denied_events": DENIED_EVENTS,
            "denied_prefixes": DENIED_PREFIXES,
            "denied_imports": DENIED_IMPORTS,
        }

    def _nproc_base(self) -> int:
        return _tasks_of(self.drop_to if self.drop_to is not None else os.getuid())

    def run(self, program: str, tests: str) -> RunResult:
        """Run `program`, then `tests` in its namespace; never raises on what the program does (a broken
        harness gives `sandbox_error`)."""
        return self._run(program, tests, self._limits(self._nproc_base(), 1))

    def run_many(self, jobs: Sequence[tuple[str, str]], max_workers: int | None = None) -> list[RunResult]:
        """`run` of every (program, tests), at most `max_workers` at once (default min(8, cores)), in order."""
        if not jobs:
            return []
        workers = max(1, min(max_workers or min(8, os.cpu_count() or 1), len(jobs)))
        limits = self._limits(self._nproc_base(), workers)
        if workers == 1:
            return [self._run(p, t, limits) for p, t in jobs]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
            return list(pool.map(lambda job: self._run(job[0], job[1], limits), jobs))

    def _run(self, program: str, tests: str, limits: dict) -> RunResult:
        start = time.perf_counter()
        try:
            workdir = tempfile.mkdtemp(prefix="sandbox-")
        except OSError as err:
            return RunResult("sandbox_error", detail=f"temporary directory: {err}")
        try:
            Path(workdir, "program.py").write_text(program, encoding="utf-8", errors="replace")
            Path(workdir, "tests.py").write_text(tests, encoding="utf-8", errors="replace")
            if self.drop_to is not None:
                for p in (workdir, *(os.path.join(workdir, f) for f in ("program.py", "tests.py"))):
                    os.chown(p, self.drop_to, self.drop_to)
            result = self._spawn(workdir, limits)
        except OSError as err:
            result = RunResult("sandbox_error", detail=f"{type(err).__name__}: {err}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return RunResult(**{**result.__dict__, "wall_s": time.perf_counter() - start})

    def _spawn(self, workdir: str, limits: dict) -> RunResult:
        nonce = secrets.token_hex(16)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        verdict_r, verdict_w = os.pipe()
        argv = [self.python, "-I", "-S", "-c", _CHILD_SOURCE, json.dumps(limits), str(verdict_w)]
        if self.uses_namespaces():
            argv = [*UNSHARE, *argv]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                start_new_session=True,
                pass_fds=(verdict_w,),
                **self._popen_user(),
            )
        except (OSError, subprocess.SubprocessError) as err:
            os.close(verdict_r)
            os.close(verdict_w)
            return RunResult("sandbox_error", detail=f"cannot start {self.python}: {err}")
        os.close(verdict_w)
        try:
            proc.stdin.write(f"{nonce}\n".encode())
            proc.stdin.close()
        except OSError:
            pass  # the child died before reading: its exit status tells why
        try:
            output, verdict, why = self._collect(proc, verdict_r)
        finally:
            _kill_group(proc)
            os.close(verdict_r)
            proc.wait()
            proc.stdout.close()
            _wait_group_gone(proc.pid)
        return _result(why, verdict, nonce, proc.returncode, output)

    def _collect(self, proc: subprocess.Popen, verdict_fd: int) -> tuple[bytes, bytes, str]:
        """Read stdout+stderr (up to the cap, keeping the first 4 KiB) and the verdict until both close, the
        wall time runs out ("timeout") or the output passes the cap ("output_limit")."""
        deadline = time.monotonic() + self.timeout_s
        head, seen, verdict = bytearray(), 0, bytearray()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, "out")
            sel.register(verdict_fd, selectors.EVENT_READ, "verdict")
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    return bytes(head), bytes(verdict), "timeout"
                for key, _ in sel.select(left):
                    fd = key.fd
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.data == "out":
                        seen += len(chunk)
                        head += chunk[: max(0, 4096 - len(head))]
                        if seen > self.max_output_bytes:
                            return bytes(head), bytes(verdict), "output_limit"
                    elif len(verdict) < 4096:
                        verdict += chunk
        try:
            proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return bytes(head), bytes(verdict), "timeout"
        return bytes(head), bytes(verdict), ""


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (its session, from start_new_session) before it is reaped, so the
    group id cannot have been reused."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _live_members(pgid: int) -> int:
    """Processes of group `pgid` that are not zombies (a killed process whose parent, the pid namespace's or
    the machine's init, has not reaped it yet is dead: it runs nothing)."""
    live = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(entry.path, "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            live += len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X")
    return live


def _wait_group_gone(pgid: int, limit_s: float = 2.0) -> None:
    """Wait (at most `limit_s`) until the killed group has no live process left, so none outlives the run."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if not os.path.isdir("/proc") or not _live_members(pgid):
            return
        time.sleep(0.01)
    log.warning("sandbox: process group %d still had processes %.1f s after SIGKILL", pgid, limit_s)


def _result(why: str, verdict: bytes, nonce: str, returncode: int, output: bytes) -> RunResult:
    """The outcome from how the run ended, the verdict lines (only lines carrying the nonce count) and the exit
    status. No `start` line: the harness broke before the program ran (`sandbox_error`). SIGXCPU (RLIMIT_CPU)
    counts as timeout, SIGXFSZ (RLIMIT_FSIZE) as output_limit."""
    lines = [ln.split() for ln in verdict.decode("ascii", "replace").splitlines()]
    if [nonce, "start"] not in lines:
        tail = output[-300:].decode("utf-8", "replace").strip()
        return RunResult("sandbox_error", output=output, detail=f"{why or f'exit status {returncode}'}: {tail}")
    if why:
        return RunResult(why, output=output, detail=why)
    fields = next((f for f in lines if len(f) == 6 and f[0] == nonce), None)
    if fields is None:
        if returncode == -signal.SIGXCPU:
            return RunResult("timeout", output=output, detail="CPU time limit")
        if returncode == -signal.SIGXFSZ:
            return RunResult("output_limit", output=output, detail="file size limit")
        if b"MemoryError" in output:
            return RunResult("memory", output=output, detail="MemoryError before the verdict")
        return RunResult("failed", output=output, detail=f"no verdict, exit status {returncode}")
    _, kind, passed, asserts, all_ran, blocked = fields
    detail = blocked if kind == "blocked" else kind
    if kind in ("syntax_error", "memory", "blocked"):
        return RunResult(kind, int(passed), int(asserts), False, output=output, detail=detail)
    ran = all_ran == "1"
    return RunResult("passed" if ran else "failed", int(passed), int(asserts), ran, output=output, detail=detail)
