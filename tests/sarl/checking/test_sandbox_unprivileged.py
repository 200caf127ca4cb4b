"""The code sandbox for a caller that is not root (most cluster users): every program runs as the caller's uid, in
user namespaces the caller makes, without a cgroup; its runner from a fork server of the caller's own (the
default) or through bubblewrap. CI runs as root: each test runs a `Sandbox` in a helper process as an unprivileged
uid of its own (`sarl.bench.unprivileged.AsUser`) and tries, as a policy would, what such a program could use that a
root caller's slots do not give it: the caller's own uid on the host (its files, its processes, its signals), the
user namespace it runs in, the helper's fork server. A program scores only if its attack worked (it then defines a
right `add`): every one below must fail, and nothing of the uid may be left once the helper has ended."""

import os
import platform
import signal
import socket
import subprocess
import time

import pytest

from sarl.bench.unprivileged import AsUser, python_for_others, unprivileged_uid
from sarl.checking.code.process import live_processes
from sarl.checking.code.seccomp import NUMBERS as SECCOMP_NUMBERS

TESTS = "assert add(1, 2) == 3\nassert add(2, 2) == 4\n"
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
GRACE_S = 2.0

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or python_for_others() is None,
    reason="runs the sandbox as another uid: needs root and a python3 other uids can run",
)


def scores_if(condition: str, setup: str = "") -> str:
    """A program that defines a right `add` only if `condition` (evaluated after `setup`) holds."""
    return f"{setup}\nworked = bool({condition})\ndef add(a, b):\n    return a + b if worked else a - b\n"


def left_of(uid: int, grace_s: float = GRACE_S) -> list[int]:
    deadline = time.monotonic() + grace_s
    while live_processes(range(uid, uid + 1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid, _, _ in live_processes(range(uid, uid + 1))]


@pytest.fixture(scope="module", params=[True, False], ids=["fork server", "bubblewrap"])
def as_user(request):
    uid = unprivileged_uid(1)  # this test process's own
    helper = AsUser(uid, {"timeout_s": 3.0, "memory_mb": 512, "disk_mb": 16, "fork_server": request.param})
    assert helper.info["ready"] is None, helper.info
    assert helper.info["fork_server"] == request.param, helper.info  # the fork server starts for a non-root caller
    assert helper.info["uid"] == uid and f"uid {uid} (the caller's)" in helper.info["isolation"], helper.info
    yield helper
    helper.close()
    assert left_of(uid) == [], "a process of the caller's uid outlived the helper"


def in_other_pid_namespaces(uid: int) -> list[int]:
    """Live processes of `uid` outside this process's pid namespace: a program's (its runner's pid 1 and below)."""
    ours = os.readlink("/proc/self/ns/pid")
    found = []
    for pid, _, _ in live_processes(range(uid, uid + 1)):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != ours:
                found.append(pid)
        except OSError:
            continue
    return found


def test_right_and_wrong_programs(as_user):
    right, wrong = as_user.run_many([(RIGHT, TESTS), (WRONG, TESTS)], 2)
    assert (right.outcome, wrong.outcome, wrong.passed, wrong.asserts) == ("passed", "failed", 0, 2), (right, wrong)


def test_attacks_with_the_callers_uid_fail(as_user):
    """Each attack in one batch, two at a time; afterwards the helper still answers and no program's process is
    left."""
    with socket.socket() as server, socket.socket(socket.AF_UNIX) as abstract:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        name = f"sarl-probe-{os.getpid()}"
        abstract.bind("\0" + name)
        abstract.listen(8)
        port = server.getsockname()[1]
        helper_pid = as_user.proc.pid
        add_key, keyctl = (SECCOMP_NUMBERS[platform.machine()][call] for call in ("add_key", "keyctl"))
        libc = "import ctypes, os, signal\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        attacks = {
            "a user namespace": scores_if("libc.unshare(0x10000000) == 0", libc),
            "a mount namespace": scores_if("libc.unshare(0x20000) == 0", libc),
            "mount a tmpfs over /usr": scores_if("libc.mount(b'x', b'/usr', b'tmpfs', 0, None) == 0", libc),
            "remount / read-write": scores_if("libc.mount(None, b'/', None, 32 | 4096, None) == 0", libc),
            "write into / and /usr and /dev": scores_if(
                "ok",
                "ok = False\nfor p in ('/x', '/usr/x', '/dev/x', '/dev/null2'):\n    try:\n"
                "        open(p, 'w').close()\n        ok = True\n    except OSError:\n        pass\n",
            ),
            "a capability": scores_if(
                "any(struct.unpack('6I', data.raw))",
                libc + "import struct\nhead = struct.pack('Ii', 0x20080522, 0)\n"
                "data = ctypes.create_string_buffer(24)\nlibc.capget(head, data)\n",
            ),
            "ptrace pid 1": scores_if("libc.ptrace(16, 1, 0, 0) == 0", libc),
            "a pidfd of pid 1": scores_if("libc.syscall(434, 1, 0) >= 0", libc),
            "the host's files": scores_if(
                "any(os.path.exists(p) for p in paths)",
                f"import os\npaths = ['/etc/passwd', '/proc/1/status', '/root', {as_user.home!r}, '/home', '/work']\n",
            ),
            "signal the helper and the test": scores_if(
                "hit",
                libc + "hit = False\n"
                f"for pid in ({helper_pid}, {os.getpid()}, os.getppid() or 1):\n"
                "    try:\n        os.kill(pid, 0) if pid == 1 else os.kill(pid, signal.SIGKILL)\n"
                "        hit = hit or pid != 1\n    except OSError:\n        pass\n",
            ),
            "kill -1": scores_if(
                "False", "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
            ),
            "the host's loopback": scores_if(
                "ok",
                f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
                "    ok = True\nexcept OSError:\n    ok = False\n",
            ),
            "the host's abstract sockets": scores_if(
                "ok",
                f"import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0{name}')\n    ok = True\n"
                "except OSError:\n    ok = False\n",
            ),
            "a keyring key for the next program": scores_if(
                "False", libc + f"libc.syscall({add_key}, b'user', b'sarl-probe', b'x', 1, -4)\n"
            ),
            "a key left by another program": scores_if(
                f"libc.syscall({keyctl}, 10, -4, b'user', b'sarl-probe', 0) > 0",
                libc + "import time\ntime.sleep(0.3)\n",
            ),
            "a file for the next program": scores_if(
                "False", "for p in ('/tmp/mark', '/dev/shm/mark'):\n    open(p, 'w').write('x')\n"
            ),
            "a file left by another program": scores_if(
                "any(os.path.exists(p) for p in ('/tmp/mark', '/dev/shm/mark'))", "import os, time\ntime.sleep(0.3)\n"
            ),
            "a daemon": scores_if(
                "False",
                "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                "        time.sleep(30)\n    os._exit(0)\ntime.sleep(0.2)\n",
            ),
        }
        results = as_user.run_many([(program, TESTS) for program in attacks.values()], 2)
        with pytest.raises(BlockingIOError):  # nothing came in
            server.setblocking(False)
            server.accept()
    wrong = {
        kind: (r.outcome, r.detail[:120])
        for kind, r in zip(attacks, results)
        if r.outcome in ("passed", "sandbox_error")
    }
    assert wrong == {}, wrong
    assert as_user.proc.poll() is None and as_user.run(RIGHT, TESTS).outcome == "passed"
    assert left_of_programs(as_user.uid) == []


def left_of_programs(uid: int) -> list[int]:
    deadline = time.monotonic() + GRACE_S
    while in_other_pid_namespaces(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return in_other_pid_namespaces(uid)


def test_limits_hold_without_a_cgroup(as_user):
    """No cgroup for a caller that is not root: memory is bounded per process, processes per user namespace."""
    big = "x = bytearray(4 * 1024 ** 3)\n" + RIGHT
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        break\n" + WRONG
    disk = "open('/tmp/f', 'wb').write(b'x' * (64 << 20))\n" + RIGHT
    results = as_user.run_many([(big, TESTS), (bomb, TESTS), (disk, TESTS)], 1)
    assert [r.outcome for r in results] == ["memory", "failed", "failed"], [(r.outcome, r.detail) for r in results]
    assert left_of_programs(as_user.uid) == []


def test_nothing_is_left_when_the_helper_is_killed_mid_run(tmp_path):
    """The caller killed while its program runs: the fork server's socket closes, it ends, and its runners die with
    their parents (and each pid namespace with its pid 1)."""
    uid = unprivileged_uid(2)
    helper = AsUser(uid, {"timeout_s": 20.0, "fork_server": True})
    try:
        assert helper.info["fork_server"], helper.info
        sleeper = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\ntime.sleep(60)\n" + RIGHT
        helper.send([(sleeper, TESTS)])  # its results are never read: the helper is killed first
        deadline = time.monotonic() + 10
        while len(in_other_pid_namespaces(uid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(in_other_pid_namespaces(uid)) >= 3  # its pid 1, the program and its child
        helper.proc.send_signal(signal.SIGKILL)
        helper.proc.wait()
        assert left_of(uid, 5.0) == [], subprocess.run(
            ["ps", "-o", "pid,ppid,stat,comm", "-u", str(uid)], text=True, capture_output=True
        ).stdout
    finally:
        helper.close()
