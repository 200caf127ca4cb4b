"""The seccomp filter every program runs under, from either kind of runner (bubblewrap's `--seccomp`, the fork
server's pid 1 before it starts the program): what the namespaces leave a program that it could use against the
run itself or the next program. Each denied call fails with EPERM; every other call is allowed.

- The keyrings (add_key, request_key, keyctl): the kernel keeps them per uid and user namespace, which programs of
  one slot share (as root), or of one caller (not root): a key one program left would be read by the next.
- Reaching the runner's pid 1 (ptrace, process_vm_readv/writev, pidfd_open on pid 1): through bubblewrap, its pid 1
  runs as the program's uid and may be traced; a program that traced it could unset its parent-death signal and
  outlive its run. (The fork server's pid 1 is not dumpable, which denies the same; this holds for both.) A
  program's own processes stay its own to trace.
- System calls of another ABI (x32, i386), which would bypass the numbers above.

`seccomp_filter()` is the compiled program (`struct sock_filter` array) for this machine, or None on a machine
this module has no numbers for (then none is installed, and the start-up line says so).
"""

from __future__ import annotations

import os
import struct

EPERM = 0x00050001  # SECCOMP_RET_ERRNO | EPERM
ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
X32_BIT = 0x40000000
# per machine: the audit arch seccomp reports; add_key, request_key, keyctl; (number, index of its pid argument) of
# ptrace, process_vm_readv, process_vm_writev, pidfd_open
ARCH = {
    "x86_64": (0xC000003E, (248, 249, 250), ((101, 1), (310, 0), (311, 0), (434, 0))),
    "aarch64": (0xC00000B7, (217, 218, 219), ((117, 1), (270, 0), (271, 0), (434, 0))),
}
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one) as the kernel takes it, or None where there are no numbers."""
    numbers = ARCH.get(machine or os.uname().machine)
    if numbers is None:
        return None
    audit_arch, keyrings, on_pid = numbers
    ops: list[tuple[int, int, str | None, str | None]] = []  # (code, k, label if true, label if false; None: next)
    marks: dict[str, int] = {}
    ops += [(LD_W_ABS, 4, None, None), (JEQ_K, audit_arch, None, "deny")]  # seccomp_data.arch: this ABI's only
    ops += [(LD_W_ABS, 0, None, None), (JGE_K, X32_BIT, "deny", None)]  # seccomp_data.nr; an x32 number
    ops += [(JEQ_K, nr, "deny", None) for nr in keyrings]
    for nr, arg in on_pid:  # pid_t: the low 32 bits of seccomp_data.args[arg] (at 16 + 8 * arg, little-endian)
        ops += [(JEQ_K, nr, None, f"not {nr}"), (LD_W_ABS, 16 + 8 * arg, None, None), (JEQ_K, 1, "deny", "allow")]
        marks[f"not {nr}"] = len(ops)  # a failed comparison leaves the number loaded for the next rule
    marks["allow"] = len(ops)
    ops.append((RET_K, ALLOW, None, None))
    marks["deny"] = len(ops)
    ops.append((RET_K, EPERM, None, None))

    def jump(at: int, label: str | None) -> int:
        return 0 if label is None else marks[label] - at - 1  # forward only, and well under BPF's 255

    return b"".join(struct.pack("HBBI", code, jump(i, t), jump(i, f), k) for i, (code, k, t, f) in enumerate(ops))
