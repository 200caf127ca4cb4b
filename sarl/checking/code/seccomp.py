"""The seccomp filter every program runs under, from either kind of runner (bubblewrap's `--seccomp`, the fork
server's pid 1 before it starts the program): what the namespaces leave a program that it could use against the
run itself, the next program or the caller. Each denied call fails with EPERM; every other call is allowed.

- The keyrings (add_key, request_key, keyctl): the kernel keeps them per uid and user namespace, which programs of
  one slot share (as root), or of one caller (not root): a key one program left would be read by the next.
- memfd_create: a memfd's pages, written and never mapped, are outside RLIMIT_AS (16 MB a file under
  RLIMIT_FSIZE, one per descriptor: about 0.9 GB a process); where no cgroup bounds the program (a caller that is
  not root) that is memory no limit holds.
- Reaching the runner's pid 1 (ptrace, process_vm_readv/writev, pidfd_open, prlimit64, get_robust_list, kcmp,
  move_pages, migrate_pages on pid 1): through bubblewrap its pid 1 runs as the program's uid and may be traced; a
  program that traced it could unset its parent-death signal and outlive its run. (The fork server's pid 1 is not
  dumpable, which denies the tracing; this holds for both.) A program's own processes stay its own to trace.
- A lease on a file (fcntl F_SETLEASE): for a caller that is not root the interpreter's files may be the caller's
  own, so the program owns them; a lease makes every other process that opens one wait (up to 45 s), other
  programs, their judges and the caller included.
- System calls of another ABI (x32, i386), which would bypass the numbers above.

`seccomp_filter()` is the compiled program (`struct sock_filter` array) for this machine, or None on a machine
this module has no numbers for (then none is installed, and the start-up line says so).
"""

from __future__ import annotations

import functools
import os
import struct

EPERM = 0x00050001  # SECCOMP_RET_ERRNO | EPERM
ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
X32_BIT = 0x40000000
F_SETLEASE = 1024
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # what seccomp reports for this machine's own ABI
NUMBERS = {  # the system calls named below, per machine
    "x86_64": {
        **{"add_key": 248, "request_key": 249, "keyctl": 250, "memfd_create": 319, "ptrace": 101, "fcntl": 72},
        **{"process_vm_readv": 310, "process_vm_writev": 311, "pidfd_open": 434, "prlimit64": 302, "kcmp": 312},
        **{"get_robust_list": 274, "move_pages": 279, "migrate_pages": 256},
    },
    "aarch64": {
        **{"add_key": 217, "request_key": 218, "keyctl": 219, "memfd_create": 279, "ptrace": 117, "fcntl": 25},
        **{"process_vm_readv": 270, "process_vm_writev": 271, "pidfd_open": 434, "prlimit64": 261, "kcmp": 272},
        **{"get_robust_list": 100, "move_pages": 239, "migrate_pages": 238},
    },
}
DENIED = ("add_key", "request_key", "keyctl", "memfd_create")
ON_PID_1 = ("ptrace", 1), ("process_vm_readv", 0), ("process_vm_writev", 0), ("pidfd_open", 0), ("prlimit64", 0)
ON_PID_1 += ("get_robust_list", 0), ("kcmp", 0), ("kcmp", 1), ("move_pages", 0), ("migrate_pages", 0)
# (call, index of an argument, value): denied when the argument's low 32 bits (a pid_t, an int) are the value
DENIED_WITH = tuple((call, arg, 1) for call, arg in ON_PID_1) + (("fcntl", 1, F_SETLEASE),)
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one) as the kernel takes it, or None where there are no numbers.
    Built once per machine (every bubblewrap runner passes it)."""
    return _compiled(machine or os.uname().machine)


@functools.cache
def _compiled(machine: str) -> bytes | None:
    if machine not in NUMBERS:
        return None
    nr = NUMBERS[machine]
    ops: list[tuple[int, int, str | None, str | None]] = []  # (code, k, label if true, label if false; None: next)
    marks: dict[str, int] = {}
    ops += [(LD_W_ABS, 4, None, None), (JEQ_K, AUDIT_ARCH[machine], None, "deny")]  # seccomp_data.arch: ours only
    ops += [(LD_W_ABS, 0, None, None), (JGE_K, X32_BIT, "deny", None)]  # seccomp_data.nr; an x32 number
    ops += [(JEQ_K, nr[call], "deny", None) for call in DENIED]
    for i, (call, arg, value) in enumerate(DENIED_WITH):  # seccomp_data.args[arg] at 16 + 8 * arg, little-endian
        ops += [(JEQ_K, nr[call], None, f"rule {i + 1}"), (LD_W_ABS, 16 + 8 * arg, None, None)]
        ops += [(JEQ_K, value, "deny", None), (LD_W_ABS, 0, None, None)]  # the number again, for the next rule
        marks[f"rule {i + 1}"] = len(ops)
    marks["allow"] = len(ops)
    ops.append((RET_K, ALLOW, None, None))
    marks["deny"] = len(ops)
    ops.append((RET_K, EPERM, None, None))

    def jump(at: int, label: str | None) -> int:
        offset = 0 if label is None else marks[label] - at - 1
        if not 0 <= offset < 256:  # BPF's jumps are forward, at most 255
            raise ValueError(f"seccomp filter: a jump of {offset}")
        return offset

    return b"".join(struct.pack("HBBI", code, jump(i, t), jump(i, f), k) for i, (code, k, t, f) in enumerate(ops))
