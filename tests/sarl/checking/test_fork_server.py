"""The runners' fork server (`sarl.checking.code.spawner`, `zygote.py`), tried as a policy would: what a runner from it
can see and do is what a bubblewrap runner could (the probe below, in both), nothing a program does reaches the next
program (keyrings its slot's uid would share in the server's user namespace, ptys, module state), and the server
itself fails loudly (it is replaced when it dies, ends with its process, and leaves runners to bubblewrap where it
cannot start). test_sandbox.py runs every attack on both kinds of runner. Root only (as CI): the fork server is."""

import json
import os
import platform
import signal
import subprocess
import sys
import time

import pytest

from sarl.checking.code.process import live_processes
from sarl.checking.code.sandbox import SLOTS_PER_PROCESS, Sandbox
from sarl.checking.code.spawner import Zygote

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the fork server runs where the caller is root (as CI)")

TESTS = "assert add(1, 2) == 3\nassert add(2, 2) == 4\n"
RIGHT = "def add(a, b):\n    return a + b\n"
KEYS = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine())  # add_key, keyctl

PROBE = """
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
seen = {}
def tried(name, result):
    seen[name] = [result, ctypes.get_errno() if result == -1 else 0]
tried("unshare a user namespace", libc.unshare(0x10000000))
tried("unshare a network namespace", libc.unshare(0x40000000))
tried("sethostname", libc.sethostname(b"x", 1))
tried("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
tried("chroot", libc.chroot(b"/tmp"))
seen["no_new_privs"] = libc.prctl(39, 0, 0, 0, 0)
seen["bounding set"] = [c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1]
header, data = ctypes.create_string_buffer(bytes.fromhex("2205082000000000")), ctypes.create_string_buffer(24)
libc.capget(header, data)
seen["capabilities"] = data.raw.hex()
seen["ids"] = [list(os.getresuid()), list(os.getresgid()), os.getgroups()]
seen["hostname"] = socket.gethostname()
seen["read-only"] = {p: bool(os.statvfs(p).f_flag & 1) for p in ("/", "/dev", "/usr", "/tmp", "/dev/shm")}
seen["root"] = sorted(os.listdir("/"))
seen["env"] = {k: v for k, v in os.environ.items() if k != "PWD"}
seen["cwd"] = os.getcwd()
fds = []
for fd in range(1024):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
seen["descriptors"] = fds
try:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    socket.create_connection(server.getsockname()).close()
    seen["loopback"] = "up"
except OSError as err:
    seen["loopback"] = repr(err)
try:
    socket.create_connection(("192.0.2.1", 80), timeout=1)
    seen["network"] = "reached"
except OSError as err:
    seen["network"] = err.errno
os.write(1, ("PROBE" + __import__("json").dumps(seen) + "END").encode())
"""


def probe(box):
    result = box.run(PROBE + "def add(a, b):\n    return 0\n", TESTS)
    text = result.output.decode()
    assert "PROBE" in text, result
    return json.loads(text.split("PROBE", 1)[1].split("END", 1)[0])


@pytest.fixture(scope="module")
def server():
    box = Sandbox(timeout_s=3.0, memory_mb=512, disk_mb=16)
    assert box.zygote() is not None, Zygote.note
    return box


def test_a_runner_from_the_fork_server_can_do_what_a_bubblewrap_runner_could_and_no_more(server):
    """The same probe in both: no new namespace, hostname, mount or chroot (EPERM, or ENOSPC for a user namespace),
    no_new_privs, no capability in any set, the slot's uid only, / /dev /usr read-only, its own writable /tmp and
    /dev/shm, its own loopback and no other network, the same environment, no descriptor beyond the runner's."""
    forked = probe(server)
    wrapped = probe(Sandbox(timeout_s=3.0, memory_mb=512, disk_mb=16, fork_server=False))
    for name in ("unshare a user namespace", "unshare a network namespace", "sethostname", "mount", "chroot"):
        assert forked[name][0] == -1 and forked[name][1] in (1, 28), (name, forked[name])  # EPERM / ENOSPC
        assert wrapped[name][0] == -1, (name, wrapped[name])
    uid = forked["ids"][0][0]
    assert server.uid_base <= uid < server.uid_base + SLOTS_PER_PROCESS
    assert forked["ids"] == [[uid] * 3, [uid] * 3, []]
    assert forked["no_new_privs"] == 1 and forked["bounding set"] == [] and set(forked["capabilities"]) == {"0"}
    assert forked["read-only"] == {"/": True, "/dev": True, "/usr": True, "/tmp": False, "/dev/shm": False}
    assert forked["read-only"] == wrapped["read-only"]
    assert forked["root"] == [name for name in wrapped["root"] if name != "sandbox-runner"]  # bwrap's runner code
    for key in ("hostname", "env", "cwd", "loopback", "network", "bounding set", "capabilities", "no_new_privs"):
        assert forked[key] == wrapped[key], key
    assert forked["loopback"] == "up" and forked["network"] == 101  # ENETUNREACH
    assert forked["descriptors"] == [0, 1, 2, 3, 4, 5]  # stdin, output x2, the judge's pipes, the runner's /dev/null


@pytest.mark.skipif(KEYS is None, reason="keyring system call numbers known for x86_64 and aarch64")
@pytest.mark.parametrize("fork_server", [True, False], ids=["fork server", "bubblewrap"])
def test_no_key_a_program_leaves_in_a_keyring_reaches_a_later_program(fork_server):
    """The kernel keeps keyrings per uid and user namespace: programs of one slot share both in the fork server, so
    there the keyring calls fail (seccomp); a bubblewrap runner's namespace is its own. Writers leave a key in the
    user, user-session and persistent keyrings; the readers after them, on the same slots, find none."""
    add_key, keyctl = KEYS
    writer = (
        f"import ctypes\nlibc = ctypes.CDLL(None)\nfor ring in (-4, -5, libc.syscall({keyctl}, 22, -1, -4)):\n"
        f"    libc.syscall({add_key}, b'user', b'sarl-probe', b'left', 4, ring)\n" + RIGHT
    )
    reader = (
        f"import ctypes\nlibc = ctypes.CDLL(None)\nrings = (-4, -5, libc.syscall({keyctl}, 22, -1, 0))\n"
        f"found = any(libc.syscall({keyctl}, 10, ring, b'user', b'sarl-probe', 0) > 0 for ring in rings)\n"
        "def add(a, b):\n    return 0 if found else a + b\n"
    )
    box = Sandbox(timeout_s=3.0, memory_mb=512, disk_mb=16, fork_server=fork_server)
    results = box.run_many([(writer, TESTS)] * 4 + [(reader, TESTS)] * 4, max_workers=1)
    assert [r.outcome for r in results] == ["passed"] * 8, [(r.outcome, r.detail) for r in results]


@pytest.mark.parametrize("fork_server", [True, False], ids=["fork server", "bubblewrap"])
def test_programs_running_at_once_do_not_see_each_others_ptys(fork_server):
    """Each runner has a devpts instance of its own: a pty one program holds is not in another's /dev/pts."""
    holder = "import os, time\nheld = os.openpty()\ntime.sleep(1.0)\n" + RIGHT
    looker = (
        "import os, time\ntime.sleep(0.4)\nothers = sorted(set(os.listdir('/dev/pts')) - {'ptmx'})\n"
        "def add(a, b):\n    return 0 if others else a + b\n"
    )
    box = Sandbox(timeout_s=5.0, memory_mb=512, disk_mb=16, fork_server=fork_server)
    results = box.run_many([(holder, TESTS), (looker, TESTS)] * 2, max_workers=2)
    assert [r.outcome for r in results] == ["passed"] * 4, [(r.outcome, r.detail) for r in results]


# Three children (a process may hold few descriptors) each open up to 60 and hold them until all three have counted:
# a child that exited early would give its instances back to the next one, and the count would depend on timing.
INOTIFY_COUNT = (
    "import ctypes, os\nlibc = ctypes.CDLL(None)\ngo_r, go_w = os.pipe()\nreads = []\nfor _ in range(3):\n"
    "    r, w = os.pipe()\n    if os.fork() == 0:\n        os.close(go_w)\n        n = 0\n"
    "        while n < 60 and libc.inotify_init1(0) >= 0:\n            n += 1\n"
    "        os.write(w, b'%d ' % n)\n        os.read(go_r, 1)\n        os._exit(0)\n"
    "    os.close(w)\n    reads.append(r)\n"
    "total = sum(int(os.read(r, 16)) for r in reads)\nos.close(go_w)\nfor _ in reads:\n    os.wait()\n"
    "os.write(1, b'COUNT%dEND' % total)\n" + RIGHT
)


@pytest.mark.parametrize("fork_server", [True, False], ids=["fork server", "bubblewrap"])
def test_a_per_user_kernel_count_is_the_slots_own(fork_server):
    """The kernel counts inotify instances (and queued signals, message queue bytes) per user up the user
    namespaces: a runner's namespace is made by its slot's uid, so what one program holds is charged to that uid,
    never to root or to a uid other programs share. A program counts the instances it can open alone, then beside
    one that holds 50: the same number (with a namespace made by root, 50 fewer: a channel between programs, and
    root's own inotify gone on the host)."""
    holder = "import ctypes, time\nlibc = ctypes.CDLL(None)\nheld = [libc.inotify_init1(0) for _ in range(50)]\n"
    holder += "time.sleep(1.5)\n" + RIGHT
    counter = "import time\ntime.sleep(0.5)\n" + INOTIFY_COUNT
    box = Sandbox(timeout_s=5.0, memory_mb=512, disk_mb=16, fork_server=fork_server)
    alone = box.run(INOTIFY_COUNT, TESTS)
    beside = box.run_many([(holder, TESTS), (counter, TESTS)], max_workers=2)
    assert alone.outcome == "passed" and [r.outcome for r in beside] == ["passed"] * 2, (alone, beside)
    count = [int(r.output.decode().split("COUNT", 1)[1].split("END")[0]) for r in (alone, beside[1])]
    assert count[0] == count[1] > 50, count


SIGNALS = {
    "SIGINT to its group": "import os, signal\ntry:\n    os.kill(0, signal.SIGINT)\nexcept KeyboardInterrupt:\n"
    "    pass\n",
    "SIGINT to pid 1": "import os, signal\nos.kill(1, signal.SIGINT)\n",
    "SIGKILL to its group from a child": "import os, time\nif os.fork() == 0:\n    os.setpgid(0, 0)\n"
    "    os._exit(0)\ntime.sleep(0.1)\n",
    "an orphaned group with a stopped member (SIGHUP, SIGCONT)": "import os, signal, time\n"
    "signal.signal(signal.SIGHUP, signal.SIG_IGN)\nif os.fork() == 0:\n    if os.fork() == 0:\n"
    "        os.kill(os.getpid(), signal.SIGSTOP)\n        os._exit(0)\n    os.setpgid(0, 0)\n    time.sleep(0.2)\n"
    "    os._exit(0)\ntime.sleep(0.6)\n",
}


@pytest.mark.parametrize("fork_server", [True, False], ids=["fork server", "bubblewrap"])
@pytest.mark.parametrize("program", SIGNALS.values(), ids=SIGNALS.keys())
def test_signals_a_right_program_sends_to_its_group_or_pid_1_cost_it_nothing(program, fork_server):
    """The runner's pid 1 leads a session of its own and handles no signal (so, as a namespace's init, it ignores
    those from inside); the process outside the namespace that waits for it is in no group the program can name.
    Before: SIGINT ended the fork server's pid 1 (`failed`), an orphaned group's SIGHUP ended its waiter (`crashed`)."""
    box = Sandbox(timeout_s=5.0, memory_mb=512, disk_mb=16, fork_server=fork_server)
    result = box.run(program + RIGHT, TESTS)
    assert result.outcome == "passed", result


def test_nothing_of_a_program_stays_in_the_fork_server(server):
    """A runner is a fresh fork: what a program changes in its interpreter (a module's attribute, a builtin, the
    import system) is not in the next program's, which is forked from the untouched server."""
    tamper = (
        "import builtins, marshal, sys\nmarshal.sarl_left = 1\nbuiltins.sarl_left = 1\n"
        "sys.modules['sarl_left'] = marshal\n" + RIGHT
    )
    check = (
        "import builtins, marshal, sys\nleft = [hasattr(marshal, 'sarl_left'), hasattr(builtins, 'sarl_left'), "
        "'sarl_left' in sys.modules]\ndef add(a, b):\n    return 0 if any(left) else a + b\n"
    )
    results = server.run_many([(tamper, TESTS), (check, TESTS)] * 3, max_workers=1)
    assert [r.outcome for r in results] == ["passed"] * 6, [(r.outcome, r.detail) for r in results]


def test_a_fork_server_that_died_is_replaced_and_costs_no_program_its_score():
    box = Sandbox(timeout_s=3.0, memory_mb=512, disk_mb=16)
    first = box.zygote()
    assert first is not None and box.run(RIGHT, TESTS).outcome == "passed"
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    results = box.run_many([(RIGHT, TESTS)] * 3, max_workers=1)
    assert [r.outcome for r in results] == ["passed"] * 3, [(r.outcome, r.detail) for r in results]
    assert box.zygote() is not first and box.zygote().proc.poll() is None


def test_the_fork_server_ends_with_the_process_that_started_it(tmp_path):
    """Killed outright, the judging process leaves nothing: its fork server sees its socket close and exits, and a
    runner waiting for a program dies with it (parent-death signals down to the runner's pid 1)."""
    script = (
        "import os, sys\nfrom sarl.checking.code.sandbox import Sandbox, _SLOTS\n"
        "from sarl.checking.code.process import Runner\n"
        "box = Sandbox(timeout_s=3.0, memory_mb=512, disk_mb=16)\n"
        "assert box.run('def add(a, b):\\n    return a + b\\n', 'assert add(1, 2) == 3\\n').outcome == 'passed'\n"
        "waiting = Runner(box, _SLOTS)\n"
        "assert b'started' in os.read(waiting.judge_fds[1], 4096)  # its interpreter is up, waiting for a program\n"
        "print(box.zygote().proc.pid, waiting.proc.pid, waiting.uid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    zygote, runner, uid = (int(x) for x in done.stdout.split())
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and (alive(zygote) or alive(runner) or uid_tasks(uid)):
        time.sleep(0.05)
    assert not alive(zygote) and not alive(runner) and uid_tasks(uid) == []


def test_a_runner_killed_at_its_timeout_takes_its_whole_namespace_with_it(server):
    """At the timeout the parent kills C (through its pidfd); R, pid 1, gets its parent-death SIGKILL (C keeps
    CAP_KILL for it alone: the kernel checks the dying parent's rights) and the kernel ends the namespace: a program
    asleep, with a sleeping child, is gone when `run` returns, not when its sleep ends."""
    sleeper = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)\n" + RIGHT
    result = server.run(sleeper, TESTS)
    assert result.outcome == "timeout", result
    first, last = server.uid_base, server.uid_base + SLOTS_PER_PROCESS
    assert live_processes(range(first, last)) == []


HIJACK_PID_1 = """
import ctypes, os, struct, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
PEEK, GETREGS, SETREGS, ATTACH, DETACH, STEP = 1, 12, 13, 16, 17, 9
RAX, RDI, RSI, ORIG, RIP = 10, 14, 13, 15, 16
def regs():
    buf = ctypes.create_string_buffer(27 * 8)
    assert libc.ptrace(GETREGS, 1, None, buf) == 0
    return list(struct.unpack("27Q", buf.raw))
def setregs(r):
    assert libc.ptrace(SETREGS, 1, None, ctypes.create_string_buffer(struct.pack("27Q", *r), 27 * 8)) == 0
attached = libc.ptrace(ATTACH, 1, None, None) == 0
os.write(1, b"ATTACHED" if attached else b"REFUSED")
if attached:  # pid 1 sits in wait4: run prctl(PR_SET_PDEATHSIG, 0) through its syscall instruction
    os.waitpid(1, 0x40000000)
    saved = regs()
    r = list(saved)
    r[RIP], r[RAX], r[RDI], r[RSI], r[ORIG] = saved[RIP] - 2, 157, 1, 0, (1 << 64) - 1
    setregs(r)
    libc.ptrace(STEP, 1, None, None)
    os.waitpid(1, 0x40000000)
    setregs(saved)
    libc.ptrace(DETACH, 1, None, None)
if os.fork() == 0:
    time.sleep(60)
time.sleep(60)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the hijack's registers are x86_64's")
@pytest.mark.parametrize("fork_server", [True, False], ids=["fork server", "bubblewrap"])
def test_a_program_that_unsets_its_pid_1s_parent_death_signal_still_ends_with_its_run(fork_server):
    """A program would trace its namespace's pid 1 (same uid) and unset its parent-death signal, so that killing
    the runner no longer ended the namespace, then sleep with a child. The seccomp filter denies ptrace of pid 1 in
    both kinds of runner (and the fork server's pid 1 is not dumpable); had it worked, what survived the kill would
    be killed by its uid before `run` returns (as root)."""
    box = Sandbox(timeout_s=2.0, memory_mb=512, disk_mb=16, fork_server=fork_server)
    result = box.run(HIJACK_PID_1 + RIGHT, TESTS)
    assert result.outcome in ("timeout", "failed") and result.score() == 0.0, result
    assert b"REFUSED" in result.output, result.output
    first, last = box.uid_base, box.uid_base + SLOTS_PER_PROCESS
    assert live_processes(range(first, last)) == []


def test_files_and_directories_are_bounded_in_number_not_only_in_bytes():
    """An empty file or directory costs no block of a tmpfs but an inode and a dentry of kernel memory (about 1 KB):
    sized by bytes alone, /tmp would hold millions (half the machine's pages). The fork server's tmpfs have an inode
    per 16 KB of their size: 12 MB of /tmp, 768."""
    many = (
        "import os\nmade = 0\ntry:\n    while made < 100000:\n        os.mkdir('/tmp/d%d' % made)\n"
        "        made += 1\nexcept OSError:\n    pass\nprint('MADE', made)\n"
        "def add(a, b):\n    return a + b if made > 1000 else 0\n"
    )
    box = Sandbox(timeout_s=5.0, memory_mb=512, disk_mb=16)
    result = box.run(many, TESTS)
    assert result.outcome == "failed", result


def test_a_device_node_the_host_shares_keeps_no_mark_of_a_program():
    """/dev's nodes are the host's inodes, shared by every program: in the fork server's runner they are read-only
    binds (the device itself still reads and writes), so no program can set their times for the next one to read."""
    box = Sandbox(timeout_s=3.0, memory_mb=512, disk_mb=16)
    touch = (
        "import errno, os\ntry:\n    os.utime('/dev/full')\n    refused = False\nexcept OSError as err:\n"
        "    refused = err.errno == errno.EROFS\nwith open('/dev/null', 'wb') as f:\n    f.write(b'x')\n"
        "assert open('/dev/zero', 'rb').read(4) == bytes(4)\ndef add(a, b):\n    return a + b if refused else 0\n"
    )
    assert box.run(touch, TESTS).outcome == "passed"


def test_where_the_fork_server_cannot_start_runners_go_through_bubblewrap(monkeypatch):
    """A fork server that cannot set up (here: its source raises) is said once, in `Zygote.note` and a warning; the
    runners then start through bubblewrap and the programs are judged as before."""
    monkeypatch.setattr(
        "sarl.checking.code.spawner.ZYGOTE_SOURCE",
        "import marshal, os\nos.write(0, marshal.dumps({'error': 'OSError: set-up refused'}))\n",
    )
    monkeypatch.setattr(Zygote, "_live", {})  # this process's running server is not asked
    box = Sandbox(timeout_s=3.0, memory_mb=512, disk_mb=16)
    assert box.zygote() is None and "set-up refused" in Zygote.note
    assert box.run(RIGHT, TESTS).outcome == "passed"
    assert "bubblewrap" in box.isolation


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def uid_tasks(uid: int) -> list[int]:
    return [pid for pid, _, _ in live_processes(range(uid, uid + 1))]
