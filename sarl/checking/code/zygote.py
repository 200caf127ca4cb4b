"""The runners' fork server (`sarl.checking.code.spawner.Zygote`): trusted, one per process that judges code.

Run as `python -I -S -c <BOOT>` (spawner.py: it reads this source and its config from its socket, then runs this
with the config as `config`); never imported by the project. Started once (as root, in the
host's user namespace; as any other uid, in a user namespace of its own that maps only that uid and gid, where it
may mount as bubblewrap does for such a caller), it makes a mount namespace whose root is a read-only tmpfs holding
only what bubblewrap's runner had: /usr and its links read-only, the interpreter and its prefix's lib, a minimal
/dev; it keeps the host's /proc open for its children, imports what the runner imports and compiles the runner
once. Then, for each program, on request over its socket (descriptor 0: the request and the runner's pipes):

- C (a fork of this process) leads a session of its own, becomes the slot's uid (as root; else it is the caller's)
  and, as bubblewrap's runner does, makes a user namespace owned by that uid and mapping only it (no process in it
  can make another), with fresh mount, pid, network, IPC and UTS namespaces; it mounts a tmpfs sized in bytes and
  inodes on /tmp and /dev/shm owned by that uid and a devpts of its own, brings up its loopback, starts R, drops
  every capability and waits for R; it exits as R did (and says so on its status pipe);
- R, pid 1 of the new pid namespace, leads a session of its own, joins the program's cgroup and a cgroup namespace,
  sets no_new_privs, drops every capability (the bounding set too), installs the programs' seccomp filter (no
  keyrings, nothing that reaches pid 1: sarl.checking.code.seccomp), starts P, reaps orphans and exits as P did
  (the kernel ends every process left in the namespace before R's exit is reported);
- P, pid 2, holds only its stdin, stdout/stderr and the judge's two pipes, and runs the runner's code as a fresh
  interpreter's `__main__` would, then ends without the interpreter's finalisation.

Nothing of a program ever runs here: P is a fresh fork for every program, and this process only forks. C and R
die with their parent (PR_SET_PDEATHSIG); this process ends when its socket closes.
"""

import _json  # noqa: F401 (the runner's imports, made once here)
import builtins
import ctypes
import fcntl
import gc
import io  # noqa: F401
import marshal
import os
import resource  # noqa: F401
import select
import signal
import socket
import struct
import sys

SOCK = socket.socket(fileno=0)
CONFIG = marshal.loads(globals().pop("config"))  # read by spawner.BOOT with this source
RUNNER = None
FILTER = b""  # the programs' seccomp filter (sarl.checking.code.seccomp), from the config
LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_PRIVATE, MS_RELATIME = 1024, 2048, 1 << 18, 1 << 21
ST_TO_MS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC))
ST_TO_MS += ((os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_READ, PR_CAPBSET_DROP = 1, 4, 23, 24
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # the system call's number per machine
ZYGOTE = os.getpid()
ZYGOTE_ROOT = os.geteuid() == 0  # root: each runner becomes its slot's uid; else all run as the caller's uid
PROC = -1  # the host's /proc, for C's own maps


def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def mount(source, target, fstype, flags, data=None):
    check(
        LIBC.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        "mount %s" % target,
    )


def remount_ro(path, extra=0):
    """Read-only, keeping the flags a mount from outside this user namespace is locked with."""
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | extra
    held = os.statvfs(path).f_flag
    for st, ms in ST_TO_MS:
        if held & st:
            flags |= ms
    mount(None, path, None, flags)


def write_file(path, text):
    """Write `text` to `path` under the host's /proc (kept open from before the pivot: C's own maps and limits)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC, dir_fd=PROC)
    try:
        os.write(fd, text.encode())  # one write: the kernel takes an id map whole or not at all
    finally:
        os.close(fd)


def map_only(uid, gid):
    """The user namespace this process has just made maps `uid` and `gid` to themselves, nothing else; no
    supplementary group can be set in it."""
    write_file("self/setgroups", "deny")
    write_file("self/uid_map", "%d %d 1\n" % (uid, uid))
    write_file("self/gid_map", "%d %d 1\n" % (gid, gid))


def own_user_namespace():
    """Not root: a user namespace of this process's own (its uid and gid mapped to themselves), in which it may
    mount its read-only root and its forks may make each program's namespaces, as bubblewrap does unprivileged."""
    uid, gid = os.geteuid(), os.getegid()
    check(LIBC.unshare(CLONE_NEWUSER), "unshare(user)")
    map_only(uid, gid)


def build_root(binds, links, python_dir):
    """A fresh mount namespace whose root is a read-only tmpfs: `binds` read-only, `links`, a minimal /dev, empty
    /tmp and /dev/shm for each program's own tmpfs."""
    check(LIBC.unshare(CLONE_NEWNS), "unshare(mount)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    new = "/tmp"
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for src, dst in binds:
        target = new + dst
        if os.path.isdir(src):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o444))
        mount(src, target, None, MS_BIND | MS_REC)
        for point in mount_points(target):  # the bind and every mount under it, as bubblewrap's --ro-bind
            remount_ro(point, MS_NOSUID | MS_NODEV)
    for target, link in links:
        os.symlink(target, new + link)
    dev = new + "/dev"
    os.mkdir(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for node in ("null", "zero", "full", "random", "urandom", "tty"):
        os.close(os.open(dev + "/" + node, os.O_CREAT | os.O_WRONLY, 0o666))
        mount("/dev/" + node, dev + "/" + node, None, MS_BIND)
        remount_ro(dev + "/" + node, MS_NOSUID | MS_NOEXEC)  # the device still reads and writes; its inode is the
        # host's, shared by every program: read-only, no program can change its times (a channel to the next one)
    for sub in ("shm", "pts"):
        os.mkdir(dev + "/" + sub)
    os.symlink("pts/ptmx", dev + "/ptmx")  # each program's own devpts instance (C mounts it)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink("/proc/self/fd/%d" % i, dev + "/" + name)
    os.symlink("/proc/self/fd", dev + "/fd")
    os.mkdir(new + "/tmp")
    os.mkdir(new + "/.old")
    check(LIBC.syscall(PIVOT_ROOT, new.encode(), (new + "/.old").encode()), "pivot_root")
    os.chdir("/")
    check(LIBC.umount2(b"/.old", 2), "umount /.old")  # MNT_DETACH
    os.rmdir("/.old")
    remount_ro("/dev")
    remount_ro("/")
    if not os.access(python_dir, os.X_OK):
        raise OSError("the interpreter's directory %s is not in the runner's root" % python_dir)


def mount_points(top):
    """`top` and the mount points under it (this namespace's mountinfo), outermost first."""
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            point = line.split(b" ")[4].decode("unicode_escape")  # octal escapes: \040 is a space
            if point == top or point.startswith(top + "/"):
                points.append(point)
    return sorted(set(points), key=len)


def loopback_up():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack_from("H", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0)), 16)[0]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def drop_privileges():
    """No new privileges, no capability in any set (bounding, ambient, inheritable, permitted, effective) of the
    program's user namespace, where the slot's uid held them all as its creator."""
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    cap = 0
    while LIBC.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0:
        check(LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop capability %d" % cap)
        cap += 1
    check(LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    check(LIBC.capset(struct.pack("Ii", 0x20080522, 0), bytes(24)), "capset")  # _LINUX_CAPABILITY_VERSION_3


def install_filter(code):
    """The seccomp filter `code` (sarl.checking.code.seccomp's, built by the parent; after no_new_privs; inherited,
    never removable): no keyrings, nothing that reaches pid 1, no other ABI."""
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxQ", len(code) // 8, ctypes.addressof(buf))
    check(LIBC.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0), "seccomp")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def die_with_parent():
    check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")


def exit_status(status):
    """As bubblewrap reports its child: the exit code, or 128 + the signal that killed it."""
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def start(request, fds):
    """C: the program's namespaces, then R and P. Returns only in P, with the runner's argument."""
    stdin_r, out_w, req_r, rep_w, status_w = fds[:5]
    SOCK.close()
    os.setsid()
    uid, gid = request["uid"], request["gid"]
    enter_namespaces(uid, gid)
    check(LIBC.sethostname(b"sandbox", 7), "sethostname")
    for path, size in (("/tmp", request["tmp_bytes"]), ("/dev/shm", request["shm_bytes"])):
        # an inode per 16 KB of its size: files and directories cost kernel memory that no block count holds
        options = "size=%d,nr_inodes=%d,mode=0755,uid=%d,gid=%d" % (size, max(64, size >> 14), uid, gid)
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620,max=64")
    loopback_up()
    os.chdir("/tmp")
    alive_r, alive_w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(alive_w)
        os.close(status_w)
        return be_init(alive_r, fds[5:], (stdin_r, out_w, req_r, rep_w), request["limits"])
    for fd in (alive_r, stdin_r, out_w, req_r, rep_w, *fds[5:]):
        os.close(fd)
    drop_privileges()
    die_with_parent()
    if os.getppid() != ZYGOTE:
        os._exit(125)
    status = exit_status(os.waitpid(init, 0)[1])
    os.write(status_w, b"%d" % status)
    os._exit(status)


def enter_namespaces(uid, gid):
    """As bubblewrap's runner: become the slot's uid (as root; any other caller already is the uid its programs
    run as), then make a user namespace (owned by that uid, so the kernel's per-user counts, inotify instances,
    queued signals, message queues, land on the slot as they would for bubblewrap, not on root) mapping only it,
    with fresh mount, pid, network, IPC and UTS namespaces in it; no process in it can make another user
    namespace. Entered, C holds no capability in this process's namespace."""
    if ZYGOTE_ROOT:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # from root: every capability of the host's namespace is gone
    check(LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")  # its own /proc files are its own again
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWPID
    check(LIBC.unshare(flags), "unshare")
    map_only(uid, gid)
    write_file("sys/user/max_user_namespaces", "0")
    check(LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")


def be_init(alive_r, cgroup, pipes, limits):
    """R, pid 1: a session of its own (none of the program's signals to a group or session reaches C), joins the
    program's cgroup (`cgroup.procs` files the parent opened) and a cgroup namespace rooted there, drops every
    capability, starts P and reaps; it exits as P did, and the kernel ends what is left."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as pid 1 it then ignores the program's SIGINT, as bwrap's does
    for fd in cgroup:
        os.write(fd, b"0")
        os.close(fd)
    check(LIBC.unshare(CLONE_NEWCGROUP), "unshare(cgroup)")
    drop_privileges()
    install_filter(FILTER)
    die_with_parent()
    if select.select([alive_r], [], [], 0)[0]:  # C ended before the line above
        os._exit(125)
    os.close(alive_r)
    # R is not dumpable (from C): the program, of the same uid, cannot ptrace pid 1 to unset its parent-death signal
    # and outlive its run. P is, as a fresh interpreter: its own processes are its own to trace.
    program = os.fork()
    if program == 0:
        check(LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
        return be_program(*pipes, limits)
    os.closerange(0, 1 << 16)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(125)
        if pid == program:
            os._exit(exit_status(status))


def be_program(stdin_r, out_w, req_r, rep_w, limits):
    """P: descriptors 0 (its stdin), 1 and 2 (its output), 3 and 4 (the judge's pipes), nothing else."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (stdin_r, out_w, out_w, req_r, rep_w)]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(5, 1 << 16)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a fresh interpreter's (R set the default action)
    return limits


def reap(*_):
    """Every child that has ended: the Cs (their parent reads how from their status pipe) and, as this process is
    their subreaper, the Rs whose C was killed."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def serve():
    """Answer requests until the socket closes. Returns only in a program's process (P)."""
    check(LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
    signal.signal(signal.SIGCHLD, reap)
    while True:
        message, fds, _, _ = socket.recv_fds(SOCK, 1 << 16, 16)
        if not message:
            os._exit(0)
        child = -1
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])  # not reaped before its pidfd is open
        try:
            request = marshal.loads(message)
            child = os.fork()
            if child == 0:
                break
            pidfd = os.pidfd_open(child)
            try:
                socket.send_fds(SOCK, [marshal.dumps({"pid": child})], [pidfd])
            finally:
                os.close(pidfd)
        except (OSError, ValueError, EOFError, TypeError) as err:
            SOCK.send(marshal.dumps({"error": "%s: %s" % (type(err).__name__, err)}))
        finally:
            if child != 0:
                for fd in fds:
                    os.close(fd)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
    try:
        return start(request, fds)
    except BaseException as err:
        try:
            os.write(2, ("sandbox zygote: %s: %s\n" % (type(err).__name__, err)).encode()[:2000])
        finally:
            os._exit(125)


def setup():
    global PIVOT_ROOT, RUNNER, PROC, FILTER
    if os.uname().machine not in PIVOT_ROOT or not CONFIG["seccomp"]:
        raise OSError("no fork server on %s (x86_64 and aarch64 only)" % os.uname().machine)
    PIVOT_ROOT, FILTER = PIVOT_ROOT[os.uname().machine], CONFIG["seccomp"]
    RUNNER = compile(CONFIG["runner"], "runner", "exec")
    PROC = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if not ZYGOTE_ROOT:
        own_user_namespace()
    build_root(CONFIG["binds"], CONFIG["links"], os.path.dirname(sys.executable))
    os.chdir("/tmp")
    SOCK.send(marshal.dumps({"ready": True}))


try:
    setup()
except BaseException as err:
    SOCK.send(marshal.dumps({"error": "%s: %s" % (type(err).__name__, err)}))
    raise SystemExit(1)
gc.freeze()  # this process's objects out of the collector's sight: a fork's collections do not copy their pages
_limits = serve()
CONFIG.clear()  # the runner's source and the server's settings: nothing the program needs
sys.argv[:] = ["-c", _limits]
_main = type(sys)("__main__")
_main.__dict__.update({"__builtins__": builtins, "_SANDBOX_FDS": [3, 4]})
sys.modules["__main__"] = _main
_status = 0
try:
    exec(RUNNER, _main.__dict__)
except SystemExit as _exit:  # as the interpreter ends on it
    _status = _exit.code if isinstance(_exit.code, int) else int(_exit.code is not None)
    if _exit.code is not None and not isinstance(_exit.code, int):
        print(_exit.code, file=sys.stderr)
except BaseException:
    sys.excepthook(*sys.exc_info())
    _status = 1
# The verdict is given: end without the interpreter's finalisation, which would write to every page this process
# shares with the fork server (5-10 ms a program); no atexit handler of the program runs, no thread is waited for.
for _stream in (sys.stdout, sys.stderr):
    try:
        _stream.flush()
    except BaseException:
        pass
os._exit(_status & 0xFF)
