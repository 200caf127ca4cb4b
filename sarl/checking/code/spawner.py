"""Runners started by a fork server (`zygote.py`) instead of bubblewrap.

A runner through bubblewrap costs `sh` (the cgroup), `setpriv` (the uid), bubblewrap (namespaces, mounts) and a
fresh interpreter: about 12 ms of CPU before the program's first line. The zygote, started once per process, sets
up what never changes (the read-only root) and imports the runner once; per program it forks, and the fork makes
the program's own user and other namespaces, tmpfs, cgroup and uid (zygote.py says how): about 4 ms. Every runner
is still a fresh process that runs exactly one program.

`Zygote.get(box, runner_source)` is this process's fork server for a sandbox's settings (started on first use,
again after it died; None where it cannot start, with the reason in `Zygote.note`: the runners then go through
bubblewrap).
`Zygote.spawn()` starts one runner and returns a `Spawned`, the part of a Popen that `Runner` uses.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import marshal
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from sarl.checking.code.seccomp import seccomp_filter

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
ZYGOTE_SOURCE = (_HERE / "zygote.py").read_text()
# the server's command line: it reads its source from its socket (a short line in `ps`, not 40 KB of source)
# and its config (both read before either runs: a server that ends leaves nothing unread, which would reset the
# socket before its reply is read)
BOOT = "import socket\ns = socket.socket(fileno=0)\nsource, config = s.recv(1 << 20), s.recv(1 << 20)\ns.detach()\n"
BOOT += "exec(compile(source.decode(), 'sarl-zygote', 'exec'))\n"
RUNNER_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PWD": "/tmp"}  # as bwrap


class Spawned:
    """A runner the zygote started, seen through its pidfd: `pid`, `stdin`, `stdout`, `poll`, `wait`,
    `returncode` (C's status, as bubblewrap's: the program's exit code or 128 + its signal; -SIGKILL when it was
    killed before it could say) and `kill` (the whole runner: its pid 1 and so its namespace die with C)."""

    stderr = None

    def __init__(self, pid: int, pidfd: int, stdin_w: int, out_r: int, status_r: int) -> None:
        self.pid, self.pidfd, self.status_r = pid, pidfd, status_r
        self.stdin = open(stdin_w, "wb", buffering=0)
        self.stdout = open(out_r, "rb", buffering=0)
        self.returncode: int | None = None

    def _ended(self, timeout_s: float | None) -> bool:
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000))))

    def _collect(self) -> None:
        try:
            said = os.read(self.status_r, 16)
        except OSError:
            said = b""
        self.returncode = int(said) if said.strip().isdigit() else -signal.SIGKILL
        for fd in (self.pidfd, self.status_r):
            os.close(fd)

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0):
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._ended(timeout):
                raise subprocess.TimeoutExpired("sandbox runner", timeout or 0)
            self._collect()
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __del__(self) -> None:
        if getattr(self, "returncode", 0) is None:
            for fd in (self.pidfd, self.status_r):
                try:
                    os.close(fd)
                except OSError:
                    pass


class Zygote:
    """This process's fork server for one set of sandbox settings (interpreter, uid range, file system)."""

    _lock = threading.Lock()
    _live: dict[tuple, Zygote] = {}
    note = ""  # why the last start failed ("" when none did)

    def __init__(self, box: Any, runner_source: str) -> None:
        binds, links = [], []
        args = list(box._mounts)
        while args:
            kind, src, dst, *args = args
            (binds if kind == "--ro-bind" else links).append((src, dst))
        config = {"binds": binds, "links": links, "runner": runner_source, "seccomp": seccomp_filter()}
        self.owner, self.lock = os.getpid(), threading.Lock()
        self.err = tempfile.TemporaryFile()
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [box.python, "-I", "-S", "-c", BOOT],
                stdin=theirs,
                stdout=subprocess.DEVNULL,
                stderr=self.err,
                cwd="/",
                env=RUNNER_ENV,
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.sock.settimeout(30.0)
        try:
            with contextlib.suppress(OSError):  # a server that already ended has said why: its reply is read next
                self.sock.send(ZYGOTE_SOURCE.encode())
                self.sock.send(marshal.dumps(config))
            reply = self._receive()[0]
        except BaseException:
            self.close()
            raise
        if not reply.get("ready"):
            self.close()
            raise OSError(f"the sandbox's fork server did not start: {reply.get('error')}")

    @classmethod
    def get(cls, box: Any, runner_source: str) -> Zygote | None:
        key = (os.getpid(), box.python, tuple(box._mounts))
        with cls._lock:
            zygote = cls._live.get(key)
            if zygote is not None and zygote.proc.poll() is None:
                return zygote
            if zygote is not None:
                zygote.close()
            try:
                zygote = cls._live[key] = cls(box, runner_source)
            except OSError as err:
                cls._live.pop(key, None)
                if not cls.note:
                    log.warning("sandbox: no fork server (%s); runners start through bubblewrap", err)
                cls.note = str(err)
                return None
            cls.note = ""
            return zygote

    def _receive(self) -> tuple[dict, list[int]]:
        try:
            message, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 1)
        except OSError as err:  # a timeout too: a late answer would be taken for the next request's, so it is ended
            self.close()
            raise OSError(f"the sandbox's fork server did not answer: {err}") from None
        if not message:
            raise OSError(f"the sandbox's fork server ended: {self.err_tail()!r}")
        return marshal.loads(message), fds

    def err_tail(self) -> bytes:
        self.err.seek(0, os.SEEK_END)
        self.err.seek(max(0, self.err.tell() - 2048))
        return self.err.read()

    def spawn(
        self, uid: int, gid: int, tmp_bytes: int, shm_bytes: int, limits: str, pipes: tuple[int, int], cgroup
    ) -> Spawned:
        """Start one runner as `uid` and `gid` (a slot's, as root; else this process's own), with its own tmpfs
        sizes, the runner's limits, the judge's two pipe ends `pipes` and the `cgroup.procs` files it joins."""
        request = {"uid": uid, "gid": gid, "tmp_bytes": tmp_bytes, "shm_bytes": shm_bytes, "limits": limits}
        ours: list[int] = []
        theirs: list[int] = []
        try:
            for _ in range(3):  # stdin, stdout + stderr, C's status
                r, w = os.pipe()
                ours.append(w if not theirs else r)
                theirs.append(r if not theirs else w)
            theirs[2:2] = pipes
            theirs += [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in cgroup]
            with self.lock:
                socket.send_fds(self.sock, [marshal.dumps(request)], theirs)
                reply, fds = self._receive()
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                if fd not in pipes:
                    os.close(fd)
        if "pid" not in reply or len(fds) != 1:
            for fd in ours + fds:
                os.close(fd)
            raise OSError(f"the sandbox's fork server could not start a runner: {reply.get('error')}")
        return Spawned(reply["pid"], fds[0], *ours)

    def close(self) -> None:
        if self.owner != os.getpid() or self.err.closed:
            return
        self.sock.close()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        self.err.close()


@atexit.register
def close_zygotes() -> None:
    for zygote in list(Zygote._live.values()):
        zygote.close()
