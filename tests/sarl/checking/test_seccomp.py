"""`sarl.checking.code.seccomp`: the filter every program runs under, read by a small BPF interpreter (the kernel's
semantics for the few instructions it uses) on the calls it must deny and those it must leave alone, per machine."""

import struct

import pytest

from sarl.checking.code.seccomp import ALLOW, AUDIT_ARCH, EPERM, NUMBERS, ON_PID_1, seccomp_filter


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


@pytest.mark.parametrize("machine", sorted(NUMBERS))
def test_denies_what_it_lists_and_allows_the_rest(machine):
    code = seccomp_filter(machine)
    arch, nr = AUDIT_ARCH[machine], NUMBERS[machine]
    assert len(code) % 8 == 0 and len(code) // 8 < 128
    for call in ("add_key", "request_key", "keyctl", "memfd_create"):
        assert verdict(code, arch, nr[call]) == EPERM, call
    for call, arg in ON_PID_1:

        def pid_is(pid, call=call, arg=arg):
            return tuple(pid if i == arg else 7 for i in range(6))

        assert verdict(code, arch, nr[call], pid_is(1)) == EPERM, (call, arg)
        assert verdict(code, arch, nr[call], pid_is(1 + (1 << 32))) == EPERM  # pid_t: the argument's low 32 bits
        if call != "kcmp":  # kcmp is denied with pid 1 in either place (7 stands for the other)
            assert verdict(code, arch, nr[call], pid_is(2)) == ALLOW, call  # a program's own processes
            assert verdict(code, arch, nr[call], pid_is(0x10001)) == ALLOW, call
    assert verdict(code, arch, nr["kcmp"], (2, 3, 0, 0, 0, 0)) == ALLOW
    assert verdict(code, arch, nr["fcntl"], (5, 1024, 1)) == EPERM  # F_SETLEASE
    for cmd in (0, 1, 2, 3, 4, 5, 6, 7, 1025, 1026, 1031):  # F_DUPFD ... F_SETLK(W), F_GETLEASE, F_NOTIFY, F_SETPIPE_SZ
        assert verdict(code, arch, nr["fcntl"], (5, cmd, 1)) == ALLOW, cmd
    listed = {*nr.values()}
    for number in range(0, 460):  # every other call of this ABI is allowed, whatever its arguments
        if number not in listed:
            assert verdict(code, arch, number, (1, 1, 1, 1, 1, 1)) == ALLOW, number
    assert verdict(code, arch, 0x40000000 | 0) == EPERM  # x32's read
    assert verdict(code, 0x40000003, 3) == EPERM  # i386's close: another audit arch


def test_no_filter_where_there_are_no_numbers():
    assert seccomp_filter("riscv64") is None
