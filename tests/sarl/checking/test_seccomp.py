"""`sarl.checking.code.seccomp`: the filter every program runs under, read by a small BPF interpreter (the kernel's
semantics for the few instructions it uses) on the calls it must deny and those it must leave alone, per machine."""

import struct

import pytest

from sarl.checking.code.seccomp import ALLOW, ARCH, EPERM, seccomp_filter


def verdict(code: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel returns for the call: seccomp_data is nr (u32), arch (u32), ip (u64), args (6 x u64)."""
    data = struct.pack("<IIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    ops = [struct.unpack("HBBI", code[i : i + 8]) for i in range(0, len(code), 8)]
    acc, pc = 0, 0
    while True:
        op, jt, jf, k = ops[pc]
        if op == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += jt if acc == k else jf
        elif op == 0x35:  # BPF_JMP | BPF_JGE | BPF_K
            pc += jt if acc >= k else jf
        elif op == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"an instruction the interpreter does not know: {op:#x}")
        pc += 1


@pytest.mark.parametrize("machine", sorted(ARCH))
def test_denies_keyrings_other_abis_and_pid_1_and_allows_the_rest(machine):
    code = seccomp_filter(machine)
    arch, keyrings, on_pid = ARCH[machine]
    assert len(code) % 8 == 0 and len(code) // 8 < 64
    for nr in keyrings:
        assert verdict(code, arch, nr) == EPERM
    for nr, arg in on_pid:
        pid_is = lambda pid: tuple(pid if i == arg else 7 for i in range(6))  # noqa: E731
        assert verdict(code, arch, nr, pid_is(1)) == EPERM, (nr, arg)
        assert verdict(code, arch, nr, pid_is(1 + (1 << 32))) == EPERM  # pid_t: the argument's low 32 bits
        assert verdict(code, arch, nr, pid_is(2)) == ALLOW  # a program's own processes stay its own to trace
        assert verdict(code, arch, nr, pid_is(0x10001)) == ALLOW
    for nr in (0, 1, 2, 3, 56, 57, 59, 60, 231, 435):  # read, write, open, close, clone, fork, execve, exit...
        if nr not in keyrings and nr not in dict(on_pid):
            assert verdict(code, arch, nr, (1, 1, 1, 1, 1, 1)) == ALLOW, nr
    assert verdict(code, arch, 0x40000000 | 0) == EPERM  # x32's read
    assert verdict(code, 0x40000003, 3) == EPERM  # i386's close: another audit arch


def test_no_filter_where_there_are_no_numbers():
    assert seccomp_filter("riscv64") is None
